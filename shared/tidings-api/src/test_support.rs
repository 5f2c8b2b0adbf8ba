//! What the route tests share: a whole `Deps` over one in-memory embedded store.

#![allow(clippy::unwrap_used)]

use tidings_core::Deps;
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

/// `store` as table and queues, providers that accept everything, the system clock and the
/// default configuration.
pub fn deps_over(store: EmbeddedStore) -> Deps {
    TestWorld::builder().system_clock().store(store).build().deps
}

/// [`deps_over`] a fresh in-memory store.
pub fn memory_deps() -> Deps {
    deps_over(EmbeddedStore::in_memory().unwrap())
}
