//! seawall-observe: not written yet.
