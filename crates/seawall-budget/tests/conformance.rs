//! The in-process store passes the conformance tests every budget store shares (the Redis
//! store runs the same ones), so a budget means the same thing wherever its counters live.

use seawall_budget::MemoryStore;

seawall_test_support::budget_store_conformance!(async { (MemoryStore::new(), ()) });
