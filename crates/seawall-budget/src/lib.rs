//! seawall-budget: not written yet.
