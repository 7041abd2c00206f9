//! seawall-fallback: not written yet.
