//! What a use-case needs from the world, assembled once by the wiring (a Lambda `main` or the
//! local runtime).

use std::sync::Arc;

pub use crate::config::CoreConfig;
pub use crate::ports::Providers;
use crate::ports::{Clock, Queues, Table};

/// Everything the core uses.
#[derive(Clone)]
pub struct Deps {
    pub table: Arc<dyn Table>,
    pub queues: Arc<dyn Queues>,
    pub clock: Arc<dyn Clock>,
    pub providers: Providers,
    pub config: Arc<CoreConfig>,
    /// The API keys this instance read lately (shared by its clones; [`crate::ops::tenants`]).
    pub keys: Arc<crate::ops::key_cache::KeyCache>,
    /// The timer buckets this instance saw open (shared by its clones; [`crate::timers::task::durable_timer`]).
    pub open_buckets: Arc<crate::timers::open_buckets::OpenBuckets>,
    /// The HTTP client of webhook posts and the name lookup it pins each post's addresses with
    /// (the system's, one per process; tests give theirs).
    pub webhook_client: Arc<crate::webhook_targets::WebhookClient>,
    /// The queue messages this process is handling (shared by its clones; [`crate::attempts`]).
    pub attempts: Arc<crate::attempts::Attempts>,
}

impl Deps {
    /// The one place `Deps` is assembled: by the wiring of each backend and by the tests' world
    /// alike. `config` is a `CoreConfig` or an `Arc` of one already shared.
    pub fn new(
        table: Arc<dyn Table>,
        queues: Arc<dyn Queues>,
        clock: Arc<dyn Clock>,
        providers: Providers,
        config: impl Into<Arc<CoreConfig>>,
    ) -> Self {
        Self {
            table,
            queues,
            clock,
            providers,
            config: config.into(),
            keys: Arc::default(),
            open_buckets: Arc::default(),
            webhook_client: crate::webhook_targets::WebhookClient::system(),
            attempts: Arc::default(),
        }
    }
}
