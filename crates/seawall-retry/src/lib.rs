//! seawall-retry: not written yet.
