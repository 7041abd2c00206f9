//! seawall-classify: not written yet.
