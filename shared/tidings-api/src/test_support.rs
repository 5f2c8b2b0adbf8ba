//! What the route tests share: a whole `Deps` over one in-memory embedded store.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use tidings_core::dev::NullProvider;
use tidings_core::ports::{Provider, SystemClock};
use tidings_core::{CoreConfig, Deps, Providers};
use tidings_embedded::EmbeddedStore;

/// `store` as table and queues, providers that accept everything, the system clock and the
/// default configuration.
pub fn deps_over(store: EmbeddedStore) -> Deps {
    let null: Arc<dyn Provider> = Arc::new(NullProvider);
    Deps {
        table: Arc::new(store.clone()),
        queues: Arc::new(store),
        clock: Arc::new(SystemClock),
        providers: Providers { email: null.clone(), sms: null.clone(), push: null },
        config: Arc::new(CoreConfig::default()),
    }
}

/// [`deps_over`] a fresh in-memory store.
pub fn memory_deps() -> Deps {
    deps_over(EmbeddedStore::in_memory().unwrap())
}
