//! seawall-mock: not written yet.
