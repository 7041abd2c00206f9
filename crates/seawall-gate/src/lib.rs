//! seawall-gate: not written yet.
