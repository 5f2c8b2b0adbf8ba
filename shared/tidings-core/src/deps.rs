//! What a use-case needs from the world, assembled once by the wiring (a Lambda `main` or the
//! local runtime).

use std::sync::Arc;

pub use crate::config::CoreConfig;
pub use crate::ports::Providers;
use crate::ports::{Clock, Cond, Item, Key, Page, QueryOpts, Queues, StoreError, Table, Update, Updating, Write};

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
            table: Arc::new(Timed(table)),
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

/// The store as the core sees it: each call's time to answer is recorded
/// ([`crate::metrics::STORE_WAIT_MS`], the operators' `store_wait_ms`), the time a use-case
/// waits on the store.
struct Timed(Arc<dyn Table>);

async fn timed<T>(op: &'static str, call: impl std::future::Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = call.await;
    metrics::histogram!(crate::metrics::STORE_WAIT_MS, "op" => op).record(started.elapsed().as_secs_f64() * 1000.0);
    out
}

#[async_trait::async_trait]
impl Table for Timed {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        timed("read", self.0.get(key)).await
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        timed("read", self.0.get_many(keys)).await
    }
    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        timed("write", self.0.put(item, cond)).await
    }
    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        timed("write", self.0.update(key, updates, cond)).await
    }
    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        timed("write", self.0.delete(key, cond)).await
    }
    async fn update_each(&self, updates: Vec<Updating>) -> Result<Vec<Result<Item, StoreError>>, StoreError> {
        timed("write", self.0.update_each(updates)).await
    }
    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        timed("transact", self.0.transact(writes)).await
    }
    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        timed("query", self.0.query(pk, sk_prefix, opts)).await
    }
    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        timed("query", self.0.query_range(pk, from, to, opts)).await
    }
    async fn query_many(&self, queries: &[(String, String)], limit: usize) -> Result<Vec<Page>, StoreError> {
        timed("query", self.0.query_many(queries, limit)).await
    }
}
