//! seawall-stream: not written yet.
