//! One world for tests (feature `test-support`, turned on by dev-dependencies only, so no
//! production build carries it): an in-memory embedded store as table and queues, a manual or
//! the system clock, fake providers, and a configuration, assembled into the core's [`Deps`]
//! through [`Deps::new`].
//!
//! ```
//! use std::sync::Arc;
//! use tidings_core::dev::NullProvider;
//! use tidings_core::ports::Clock;
//! use tidings_embedded::test_world::TestWorld;
//!
//! let w = TestWorld::builder().start_at("2026-11-29T00:00:00Z").all_queues(5).email(Arc::new(NullProvider)).build();
//! assert_eq!(w.clock().now().to_rfc3339(), "2026-11-29T00:00:00+00:00");
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a broken set-up should fail loudly

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tidings_core::dev::NullProvider;
use tidings_core::messages::ALL_QUEUES;
use tidings_core::ports::{
    Clock, Cond, Item, Key, ManualClock, OutMessage, OutboundMessage, Page, Provider, ProviderError, ProviderReceipt,
    QueryOpts, QueueError, QueueStats, Queues, Received, StoreError, SystemClock, Update, Write,
};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::{EmbeddedChangeFeed, EmbeddedStore, QueueConfig};

/// Where a manual clock starts unless [`TestWorldBuilder::start_at`] says otherwise.
pub const DEFAULT_START: &str = "2026-12-01T10:00:00Z";

/// The core's dependencies over one in-memory embedded store, with the handles a test drives.
pub struct TestWorld {
    pub deps: Deps,
    /// The store behind `deps.table` and `deps.queues`.
    pub store: EmbeddedStore,
    /// The manual clock (`None` on the system clock).
    pub manual_clock: Option<Arc<ManualClock>>,
}

impl TestWorld {
    pub fn builder() -> TestWorldBuilder {
        TestWorldBuilder::default()
    }

    /// The manual clock; a world built with [`TestWorldBuilder::system_clock`] has none.
    pub fn clock(&self) -> Arc<ManualClock> {
        self.manual_clock.clone().expect("this test world runs on the system clock")
    }

    /// A change feed of the store, read as `consumer`.
    pub fn feed(&self, consumer: &str) -> EmbeddedChangeFeed {
        self.store.change_feed(consumer)
    }
}

/// Runs the relay over `feed` and every consumed queue until nothing is visible, as the local
/// runtime does: each change relayed and committed, each message dispatched to its lane's
/// handler and settled. Work delayed on the clock (a retry's backoff) waits for the clock.
pub async fn drain(deps: &Deps, feed: &EmbeddedChangeFeed) {
    while pass(deps, feed, |_| true).await > 0 {}
}

/// One pass of [`drain`] over the queues `take` names: the visible changes relayed and committed,
/// then up to 10 visible messages of each consumed queue dispatched and settled one at a time.
/// Returns how many changes and messages it handled (0: nothing was visible).
pub async fn pass(deps: &Deps, feed: &EmbeddedChangeFeed, take: impl Fn(&str) -> bool) -> usize {
    use tidings_core::ports::ChangeFeed;
    let mut did = 0;
    let records = feed.next_batch(1000).await.unwrap();
    if !records.is_empty() {
        tidings_core::notify::relay::handle_changes(deps, &records).await.unwrap();
        feed.commit(&records).await.unwrap();
        did += records.len();
    }
    for q in ALL_QUEUES.iter().filter(|q| tidings_core::messages::is_consumed(q) && take(q)) {
        let got =
            deps.queues.receive(q, 10, std::time::Duration::from_secs(60), std::time::Duration::ZERO).await.unwrap();
        for m in &got {
            let outcome = tidings_core::messages::dispatch(deps, q, m).await;
            tidings_core::messages::settle(deps.queues.as_ref(), q, m, &outcome, deps.clock.now(), true).await.unwrap();
        }
        did += got.len();
    }
    did
}

/// The webhook events of type `kind` that were put in the outbox since `feed` last read (each
/// put once is read once), as `(data.notification_id, data.status)`, in the order written.
pub async fn told(feed: &EmbeddedChangeFeed, kind: &str) -> Vec<(String, String)> {
    use tidings_core::ports::ChangeFeed;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    feed.next_batch(10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.key.sk == tidings_core::webhooks::EVENT_SK && r.is_insert())
        .filter_map(|r| r.new.and_then(|n| n.get("event").cloned()))
        .filter(|e| e["type"] == kind)
        .map(|e| (text(&e["data"]["notification_id"]), text(&e["data"]["status"])))
        .collect()
}

/// How a [`TestWorld`] is made; every part has a default: a manual clock at [`DEFAULT_START`],
/// providers that accept everything ([`NullProvider`]), [`CoreConfig::default`], no queue
/// declared.
pub struct TestWorldBuilder {
    start: DateTime<Utc>,
    system_clock: bool,
    manual_clock: Option<Arc<ManualClock>>,
    store: Option<EmbeddedStore>,
    email: Option<Arc<dyn Provider>>,
    sms: Option<Arc<dyn Provider>>,
    push: Option<Arc<dyn Provider>>,
    providers: Option<Providers>,
    config: CoreConfig,
    queues: Vec<(&'static str, u32)>,
}

impl Default for TestWorldBuilder {
    fn default() -> Self {
        Self {
            start: parse_start(DEFAULT_START),
            system_clock: false,
            manual_clock: None,
            store: None,
            email: None,
            sms: None,
            push: None,
            providers: None,
            config: CoreConfig::default(),
            queues: Vec::new(),
        }
    }
}

fn parse_start(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339).expect("an RFC 3339 start").with_timezone(&Utc)
}

impl TestWorldBuilder {
    /// The manual clock starts at `rfc3339`.
    pub fn start_at(mut self, rfc3339: &str) -> Self {
        self.start = parse_start(rfc3339);
        self
    }

    /// The system clock instead of a manual one.
    pub fn system_clock(mut self) -> Self {
        self.system_clock = true;
        self
    }

    /// This manual clock (e.g. the one a store opened from a file runs on) instead of a new one.
    pub fn manual_clock(mut self, clock: Arc<ManualClock>) -> Self {
        self.manual_clock = Some(clock);
        self
    }

    /// This store instead of a fresh in-memory one: the store keeps its own clock, so give the
    /// world the same ([`Self::manual_clock`] or [`Self::system_clock`]).
    pub fn store(mut self, store: EmbeddedStore) -> Self {
        self.store = Some(store);
        self
    }

    pub fn email(mut self, provider: Arc<dyn Provider>) -> Self {
        self.email = Some(provider);
        self
    }

    pub fn sms(mut self, provider: Arc<dyn Provider>) -> Self {
        self.sms = Some(provider);
        self
    }

    pub fn push(mut self, provider: Arc<dyn Provider>) -> Self {
        self.push = Some(provider);
        self
    }

    /// All three providers at once (e.g. already behind the gates); wins over
    /// [`Self::email`], [`Self::sms`] and [`Self::push`].
    pub fn providers(mut self, providers: Providers) -> Self {
        self.providers = Some(providers);
        self
    }

    pub fn config(mut self, config: CoreConfig) -> Self {
        self.config = config;
        self
    }

    /// Declares these queues, each with `max_receives` receives before its DLQ.
    pub fn queues(mut self, names: &[&'static str], max_receives: u32) -> Self {
        self.queues.extend(names.iter().map(|q| (*q, max_receives)));
        self
    }

    /// Declares every queue of the system ([`ALL_QUEUES`]).
    pub fn all_queues(self, max_receives: u32) -> Self {
        self.queues(ALL_QUEUES, max_receives)
    }

    pub fn build(self) -> TestWorld {
        let start = self.start;
        let manual_clock =
            (!self.system_clock).then(|| self.manual_clock.unwrap_or_else(|| Arc::new(ManualClock::new(start))));
        let clock: Arc<dyn Clock> = match &manual_clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        };
        let store = match self.store {
            Some(store) => store,
            None => EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap(),
        };
        for (q, max_receives) in &self.queues {
            store.declare_queue(QueueConfig::new(*q, *max_receives)).unwrap();
        }
        let null = || -> Arc<dyn Provider> { Arc::new(NullProvider) };
        let providers = self.providers.unwrap_or_else(|| Providers {
            email: self.email.unwrap_or_else(null),
            sms: self.sms.unwrap_or_else(null),
            push: self.push.unwrap_or_else(null),
        });
        let deps = Deps::new(Arc::new(store.clone()), Arc::new(store.clone()), clock, providers, self.config);
        TestWorld { deps, store, manual_clock }
    }
}

/// A fake provider that accepts every send and records it; its message ids are `pm-1`,
/// `pm-2`, ...
#[derive(Default)]
pub struct Recorder {
    pub sent: Mutex<Vec<OutboundMessage>>,
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.push(message.clone());
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", sent.len()) })
    }
}

/// One call of the [`Table`](tidings_core::ports::Table) a [`Wrapped`] table passes on, as an
/// [`Around`] sees it.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    Get(&'a Key),
    GetMany(&'a [Key]),
    Put(&'a Item, &'a Cond),
    Update(&'a Key),
    Delete(&'a Key),
    Transact(&'a [Write]),
    /// A query's partition and its prefix (a range query's: its lower bound).
    Query(&'a str, &'a str),
    /// The partitions and prefixes of a `query_many`.
    QueryMany(&'a [(String, String)]),
}

impl Call<'_> {
    /// Whether it writes.
    pub fn writes(&self) -> bool {
        matches!(self, Call::Put(..) | Call::Update(_) | Call::Delete(_) | Call::Transact(_))
    }
}

/// What a test double does around the calls of the table it wraps: fail one (`before` answers
/// an error, and the call never reaches the table), race it, count it, delay it. Both default to
/// doing nothing, so a double names only what it changes.
#[async_trait]
pub trait Around: Send + Sync {
    /// Before the call reaches the table; an error is the call's answer.
    async fn before(&self, _call: Call<'_>) -> Result<(), StoreError> {
        Ok(())
    }
    /// After the table answered (whatever it answered).
    async fn after(&self, _call: Call<'_>) {}
}

/// A table that passes every call on to `inner`, with `around` before and after each: the one
/// delegating table the tests' doubles share.
pub struct Wrapped<A> {
    pub inner: Arc<dyn tidings_core::ports::Table>,
    pub around: A,
}

impl<A: Around> Wrapped<A> {
    pub fn new(inner: Arc<dyn tidings_core::ports::Table>, around: A) -> Self {
        Self { inner, around }
    }
}

#[async_trait]
impl<A: Around + 'static> tidings_core::ports::Table for Wrapped<A> {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        self.around.before(Call::Get(key)).await?;
        let got = self.inner.get(key).await;
        self.around.after(Call::Get(key)).await;
        got
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        self.around.before(Call::GetMany(keys)).await?;
        let got = self.inner.get_many(keys).await;
        self.around.after(Call::GetMany(keys)).await;
        got
    }
    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        self.around.before(Call::Put(&item, &cond)).await?;
        let (copy, copy_cond) = (item.clone(), cond.clone());
        let done = self.inner.put(item, cond).await;
        self.around.after(Call::Put(&copy, &copy_cond)).await;
        done
    }
    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        self.around.before(Call::Update(key)).await?;
        let done = self.inner.update(key, updates, cond).await;
        self.around.after(Call::Update(key)).await;
        done
    }
    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        self.around.before(Call::Delete(key)).await?;
        let done = self.inner.delete(key, cond).await;
        self.around.after(Call::Delete(key)).await;
        done
    }
    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.around.before(Call::Transact(&writes)).await?;
        let copy = writes.clone();
        let done = self.inner.transact(writes).await;
        self.around.after(Call::Transact(&copy)).await;
        done
    }
    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        self.around.before(Call::Query(pk, sk_prefix)).await?;
        let got = self.inner.query(pk, sk_prefix, opts).await;
        self.around.after(Call::Query(pk, sk_prefix)).await;
        got
    }
    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        self.around.before(Call::Query(pk, from)).await?;
        let got = self.inner.query_range(pk, from, to, opts).await;
        self.around.after(Call::Query(pk, from)).await;
        got
    }
    async fn query_many(&self, queries: &[(String, String)], limit: usize) -> Result<Vec<Page>, StoreError> {
        self.around.before(Call::QueryMany(queries)).await?;
        let got = self.inner.query_many(queries, limit).await;
        self.around.after(Call::QueryMany(queries)).await;
        got
    }
}

/// What [`HookedSends`] asks before each send: `Ok` lets it through (after any wait the hook
/// makes), an error refuses it.
pub type SendHook = Arc<
    dyn Fn(&str) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), QueueError>> + Send>> + Send + Sync,
>;

/// Queues whose sends pass a hook first, which may hold a queue's sends or refuse them (a lane
/// that is down, a timer held back); everything else is the inner queues'.
pub struct HookedSends {
    inner: Arc<dyn Queues>,
    hook: SendHook,
}

impl HookedSends {
    pub fn new(inner: Arc<dyn Queues>, hook: SendHook) -> Arc<Self> {
        Arc::new(Self { inner, hook })
    }
}

#[async_trait]
impl Queues for HookedSends {
    async fn send_batch(&self, queue: &str, messages: Vec<OutMessage>) -> Result<(), QueueError> {
        (self.hook)(queue).await?;
        self.inner.send_batch(queue, messages).await
    }
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        visibility: std::time::Duration,
        wait: std::time::Duration,
    ) -> Result<Vec<Received>, QueueError> {
        self.inner.receive(queue, max, visibility, wait).await
    }
    async fn change_visibility(
        &self,
        queue: &str,
        receipt: &str,
        visibility: std::time::Duration,
    ) -> Result<(), QueueError> {
        self.inner.change_visibility(queue, receipt, visibility).await
    }
    async fn delete(&self, queue: &str, receipt: &str) -> Result<(), QueueError> {
        self.inner.delete(queue, receipt).await
    }
    async fn delete_batch(&self, queue: &str, receipts: &[String]) -> Result<(), QueueError> {
        self.inner.delete_batch(queue, receipts).await
    }
    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        self.inner.stats(queue).await
    }
    async fn redrive(&self, queue: &str) -> Result<u64, QueueError> {
        self.inner.redrive(queue).await
    }
    async fn peek_dlq(&self, queue: &str, max: usize) -> Result<Vec<Received>, QueueError> {
        self.inner.peek_dlq(queue, max).await
    }
    async fn send_to_dlq(&self, queue: &str, body: String) -> Result<(), QueueError> {
        self.inner.send_to_dlq(queue, body).await
    }
}
