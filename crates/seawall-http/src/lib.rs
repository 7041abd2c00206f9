//! seawall-http: not written yet.
