//! `tidings bench digest`: the digest benchmark of docs/workflows.md, "Cost and rate". A
//! workflow `[digest window W, send email]`, `--users` users, `--per-user` triggers each
//! (100,000 into 10,000 users' digests by default), on the embedded backend (a fresh SQLite file)
//! or with `--backend aws` on the DynamoDB and SQS of the environment (the emulators), through
//! the real relay, request lanes, engine, timers and channel workers, with a fake email
//! provider that keeps each digest's body.
//!
//! The triggers go out as a shop sends them: each event (a price drop, a new review of a
//! watched product) is one notification to the users it concerns, up to `--per-request` of
//! them (1,000 by default, the most a `user_ids` list holds; `--per-request 1` sends one
//! notification per trigger). A user's triggers are in different notifications, accepted
//! together and started by the request lanes' workers at once, so they reach the user's window
//! interleaved and concurrently. The clock is a manual one: every trigger is in before the
//! window closes, whatever the machine's speed; the bench then moves it past the window and runs
//! the tick, as EventBridge would a minute later.
//!
//! It checks itself: exactly one digest per user, each with its `count` and the rounds of its
//! user's triggers, each once; every run ended (`completed`, the leaders `digested`, the others
//! `merged`). It reports triggers per second into the digests, the time to flush them, and the
//! store and queue calls per trigger, counted at the ports ([`CountingTable`],
//! [`CountingQueues`]) as DynamoDB on-demand and SQS bill them, with a dollar figure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;
use tidings_core::gates::{self, GateStore};
use tidings_core::notify::api;
use tidings_core::ports::{
    Cond, Item, Key, ManualClock, OutMessage, OutboundMessage, Page, Provider, ProviderError, ProviderReceipt,
    QueryOpts, QueueError, QueueStats, Queues, Received, StoreError, Table, Update, Write,
};
use tidings_core::workflows::run::{self, RunStatus};
use tidings_core::{Deps, Providers, TenantId, sizes, templates, workflows};

use crate::backend::{Backend, StoreUse};
use crate::progress::Progress;
use crate::{BackendArgs, BackendKind};

#[derive(clap::Args, Clone, Debug)]
pub struct DigestArgs {
    /// Users, each with a digest.
    #[arg(long, default_value_t = 10_000)]
    pub users: u64,
    /// Triggers per user (each a different event, so each its own notification).
    #[arg(long, default_value_t = 10)]
    pub per_user: u64,
    /// Recipients per notification: an event sent to the users it concerns, up to 1,000 (the
    /// most a `user_ids` list holds); 1 sends one notification per trigger.
    #[arg(long, default_value_t = 1000)]
    pub per_request: u64,
    /// Notifications accepted at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// The digest's window (at least 15 minutes: its close is a timer bucket the tick fires,
    /// which the manual clock reaches on every backend).
    #[arg(long, default_value = "20m")]
    pub window: String,
    /// The embedded backend (a fresh database), or the AWS backend of the environment
    /// (`AWS_ENDPOINT_URL_DYNAMODB`, `TIDINGS_TABLE`...; a build with `--features aws`).
    #[arg(long, value_enum, default_value = "embedded")]
    pub backend: BackendKind,
    /// With `--backend aws`: create the table and queues first where they are missing.
    #[arg(long)]
    pub bootstrap: bool,
    /// Where to put the database (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Give up after this many seconds (each of the two phases).
    #[arg(long, default_value_t = 3600)]
    pub timeout_s: u64,
}

/// On-demand list prices in us-east-1 (DynamoDB since November 2024), in dollars per million.
pub const PRICE_WRITE_UNITS: f64 = 0.625;
pub const PRICE_READ_UNITS: f64 = 0.125;
pub const PRICE_SQS_REQUESTS: f64 = 0.40;

fn user_id(i: u64) -> String {
    format!("b{i:08}")
}

/// The digest email's text: `count|r,r,r,` (the rounds of its events, oldest first).
const BODY: &str = "{{ count }}|{% for e in events %}{{ e.round }},{% endfor %}";

/// The fake email provider: every body each user of this run's tenant was sent.
///
/// The workers and the tick serve the whole table and its queues, not one tenant: on the AWS
/// backend's table, which outlives a run (`TIDINGS_TABLE`), what an earlier run left (a run
/// stopped before its windows closed: their timers, its messages still queued) is done by this
/// one, and its digests go to users with the same ids (`b00000000`...) in that run's tenant.
/// Those are not this run's digests: they are counted apart (`other_tenants_sends`), never as a
/// second digest of a user of this run.
struct DigestProvider {
    tenant: String,
    bodies: Mutex<HashMap<String, Vec<String>>>,
    sent: AtomicU64,
    /// Sends for another tenant's users.
    others: AtomicU64,
}

impl DigestProvider {
    fn new(t: &TenantId) -> Self {
        Self {
            tenant: t.as_str().to_owned(),
            bodies: Mutex::default(),
            sent: AtomicU64::new(0),
            others: AtomicU64::new(0),
        }
    }
}

#[async_trait]
impl Provider for DigestProvider {
    fn name(&self) -> &str {
        "bench-digest"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        if m.tenant != self.tenant {
            self.others.fetch_add(1, Ordering::Relaxed);
        } else {
            self.bodies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(m.user_id.clone())
                .or_default()
                .push(m.body.clone());
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ProviderReceipt { provider_message_id: m.idempotency_key.clone() })
    }
}

/// The rounds (0 … per_user − 1) in which each user is a recipient, one notification per
/// (round, group): in each round every user is in exactly one group, and the groups mix
/// differently from one round to the next, so no two of a user's notifications have the same
/// recipients. Returns each notification's round and users.
pub fn plan(users: u64, per_user: u64, per_request: u64) -> Vec<(u64, Vec<u64>)> {
    let per_request = per_request.clamp(1, api_max());
    let mut out = Vec::new();
    for round in 0..per_user {
        // A permutation of the users for this round: stride `k` coprime with `users`.
        let stride = coprime_stride(users, round);
        let order: Vec<u64> = (0..users).map(|i| (i * stride + round) % users.max(1)).collect();
        for chunk in order.chunks(per_request as usize) {
            out.push((round, chunk.to_vec()));
        }
    }
    // Rounds interleaved: the i-th notification of each round, then the (i+1)-th...
    let per_round = out.len() / per_user.max(1) as usize;
    let mut mixed = Vec::with_capacity(out.len());
    for i in 0..per_round.max(1) {
        for r in 0..per_user as usize {
            if let Some(n) = out.get(r * per_round + i) {
                mixed.push(n.clone());
            }
        }
    }
    mixed
}

fn api_max() -> u64 {
    tidings_core::notify::model::MAX_USER_IDS as u64
}

/// A stride that visits every one of `n` users once: the first odd number from `2·round + 1`
/// that shares no factor with `n`.
fn coprime_stride(n: u64, round: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let mut k = 2 * round + 1;
    while n > 1 && gcd(k, n) != 1 {
        k += 2;
    }
    k
}

/// What one user's digests must be: exactly one, `count` = `per_user`, every round once.
pub fn check_bodies(bodies: &HashMap<String, Vec<String>>, users: u64, per_user: u64) -> Result<(), String> {
    let expected: BTreeSet<u64> = (0..per_user).collect();
    let mut problems = Vec::new();
    for i in 0..users {
        let id = user_id(i);
        let got = bodies.get(&id).map(Vec::as_slice).unwrap_or_default();
        let [body] = got else {
            problems.push(format!("{id}: {} digests", got.len()));
            continue;
        };
        let (count, rounds) = body.split_once('|').unwrap_or(("", ""));
        let rounds: Vec<u64> = rounds.split(',').filter(|r| !r.is_empty()).filter_map(|r| r.parse().ok()).collect();
        let distinct: BTreeSet<u64> = rounds.iter().copied().collect();
        if count.trim() != per_user.to_string() || rounds.len() as u64 != per_user || distinct != expected {
            problems.push(format!("{id}: digest `{body}`, expected count {per_user} and rounds 0..{per_user} once"));
        }
    }
    let strangers =
        bodies.keys().filter(|k| k.strip_prefix('b').and_then(|n| n.parse::<u64>().ok()).is_none_or(|n| n >= users));
    problems.extend(strangers.map(|k| format!("{k}: not a bench user")));
    match problems.len() {
        0 => Ok(()),
        n => Err(format!("{n} users' digests wrong, the first: {}", problems[..n.min(5)].join("; "))),
    }
}

/// Calls to the store, as DynamoDB on-demand bills them: a write one unit per KB of its item,
/// two in a transaction (checks included); a read one unit per 4 KB (every read here is
/// strongly consistent), a query per 4 KB of what it returned; a missing item one unit.
#[derive(Default)]
pub struct Counts {
    pub reads: AtomicU64,
    pub queries: AtomicU64,
    pub writes: AtomicU64,
    pub transactions: AtomicU64,
    pub transaction_items: AtomicU64,
    /// Hundredths of a unit are not needed: units are whole.
    pub read_units: AtomicU64,
    pub write_units: AtomicU64,
    /// SQS requests: a send batch (10 messages), a receive that got messages, a delete batch,
    /// a visibility change.
    pub sqs_sends: AtomicU64,
    pub sqs_messages: AtomicU64,
    pub sqs_receives: AtomicU64,
    pub sqs_deletes: AtomicU64,
    pub sqs_other: AtomicU64,
    /// Transactions the store refused for a conflict (after the adapter's own retries), by
    /// what they wrote ([`shape`]): where the triggers meet.
    pub conflicts: Mutex<BTreeMap<String, u64>>,
}

/// What a transaction writes, by the kinds of its items' sort keys (`R` a run, `C` a progress
/// counter, `HEAD` a digest's window, `M` and `E` its membership and event...).
pub fn shape(writes: &[Write]) -> String {
    let kinds: BTreeSet<&str> = writes
        .iter()
        .map(|w| {
            let key = match w {
                Write::Put { item, .. } => &item.key,
                Write::Update { key, .. } | Write::Delete { key, .. } | Write::Check { key, .. } => key,
            };
            key.sk.split('#').next().unwrap_or_default()
        })
        .collect();
    kinds.into_iter().collect::<Vec<_>>().join("+")
}

/// A copy of the counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    pub reads: u64,
    pub queries: u64,
    pub writes: u64,
    pub transactions: u64,
    pub transaction_items: u64,
    pub read_units: u64,
    pub write_units: u64,
    pub sqs_sends: u64,
    pub sqs_messages: u64,
    pub sqs_receives: u64,
    pub sqs_deletes: u64,
    pub sqs_other: u64,
}

impl Counts {
    pub fn tally(&self) -> Tally {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Tally {
            reads: l(&self.reads),
            queries: l(&self.queries),
            writes: l(&self.writes),
            transactions: l(&self.transactions),
            transaction_items: l(&self.transaction_items),
            read_units: l(&self.read_units),
            write_units: l(&self.write_units),
            sqs_sends: l(&self.sqs_sends),
            sqs_messages: l(&self.sqs_messages),
            sqs_receives: l(&self.sqs_receives),
            sqs_deletes: l(&self.sqs_deletes),
            sqs_other: l(&self.sqs_other),
        }
    }
}

impl Tally {
    pub fn minus(&self, o: &Tally) -> Tally {
        Tally {
            reads: self.reads - o.reads,
            queries: self.queries - o.queries,
            writes: self.writes - o.writes,
            transactions: self.transactions - o.transactions,
            transaction_items: self.transaction_items - o.transaction_items,
            read_units: self.read_units - o.read_units,
            write_units: self.write_units - o.write_units,
            sqs_sends: self.sqs_sends - o.sqs_sends,
            sqs_messages: self.sqs_messages - o.sqs_messages,
            sqs_receives: self.sqs_receives - o.sqs_receives,
            sqs_deletes: self.sqs_deletes - o.sqs_deletes,
            sqs_other: self.sqs_other - o.sqs_other,
        }
    }

    pub fn sqs_requests(&self) -> u64 {
        self.sqs_sends + self.sqs_receives + self.sqs_deletes + self.sqs_other
    }

    /// Dollars per million of `per` (triggers): DynamoDB writes, reads, SQS.
    pub fn dollars_per_million(&self, per: u64) -> (f64, f64, f64) {
        let per = per.max(1) as f64;
        (
            self.write_units as f64 / per * PRICE_WRITE_UNITS,
            self.read_units as f64 / per * PRICE_READ_UNITS,
            self.sqs_requests() as f64 / per * PRICE_SQS_REQUESTS,
        )
    }

    /// Per `per` (triggers), rounded to 3 places, and the dollars per million of them.
    pub fn per(&self, per: u64) -> serde_json::Value {
        let p = per.max(1) as f64;
        let r = |v: u64| (v as f64 / p * 1000.0).round() / 1000.0;
        let (w, rd, q) = self.dollars_per_million(per);
        let cents = |v: f64| (v * 100.0).round() / 100.0;
        json!({
            "store_reads": r(self.reads),
            "store_queries": r(self.queries),
            "store_writes": r(self.writes),
            "store_transactions": r(self.transactions),
            "store_transaction_items": r(self.transaction_items),
            "write_units": r(self.write_units),
            "read_units": r(self.read_units),
            "sqs_requests": r(self.sqs_requests()),
            "sqs_messages_sent": r(self.sqs_messages),
            "dollars_per_million": {"dynamodb_writes": cents(w), "dynamodb_reads": cents(rd), "sqs": cents(q),
                "total": cents(w + rd + q)},
        })
    }
}

fn write_units(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(1024).max(1)
}

fn read_units(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4096).max(1)
}

/// The store, counted ([`Counts`]).
pub struct CountingTable {
    pub inner: Arc<dyn Table>,
    pub counts: Arc<Counts>,
}

impl CountingTable {
    fn read(&self, item: Option<&Item>) {
        self.counts.reads.fetch_add(1, Ordering::Relaxed);
        let bytes = item.map_or(0, |i| sizes::item_size(&i.key, &i.attrs));
        self.counts.read_units.fetch_add(read_units(bytes), Ordering::Relaxed);
    }
    fn wrote(&self, bytes: usize) {
        self.counts.writes.fetch_add(1, Ordering::Relaxed);
        self.counts.write_units.fetch_add(write_units(bytes), Ordering::Relaxed);
    }
    fn page(&self, page: &Page) {
        self.counts.queries.fetch_add(1, Ordering::Relaxed);
        let bytes: usize = page.items.iter().map(|i| sizes::item_size(&i.key, &i.attrs)).sum();
        self.counts.read_units.fetch_add(read_units(bytes), Ordering::Relaxed);
    }
}

#[async_trait]
impl Table for CountingTable {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        let out = self.inner.get(key).await?;
        self.read(out.as_ref());
        Ok(out)
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        let out = self.inner.get_many(keys).await?;
        for item in &out {
            self.read(item.as_ref());
        }
        Ok(out)
    }
    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        let bytes = sizes::item_size(&item.key, &item.attrs);
        let out = self.inner.put(item, cond).await;
        // A refused conditional write is billed too.
        self.wrote(bytes);
        out
    }
    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        let out = self.inner.update(key, updates, cond).await;
        // Billed on the item's size after the update (ours only grow).
        let bytes = out.as_ref().map_or(sizes::key_size(key), |i| sizes::item_size(&i.key, &i.attrs));
        self.wrote(bytes);
        out
    }
    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        let out = self.inner.delete(key, cond).await;
        self.wrote(sizes::key_size(key));
        out
    }
    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        let units: u64 = writes.iter().map(|w| 2 * write_units(sizes::write_size(w))).sum();
        let n = writes.len() as u64;
        let what = shape(&writes);
        let out = self.inner.transact(writes).await;
        if let Err(StoreError::Conflict) = &out {
            *self.counts.conflicts.lock().unwrap_or_else(|p| p.into_inner()).entry(what).or_default() += 1;
        }
        self.counts.transactions.fetch_add(1, Ordering::Relaxed);
        self.counts.transaction_items.fetch_add(n, Ordering::Relaxed);
        self.counts.write_units.fetch_add(units, Ordering::Relaxed);
        out
    }
    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let page = self.inner.query(pk, sk_prefix, opts).await?;
        self.page(&page);
        Ok(page)
    }
    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let page = self.inner.query_range(pk, from, to, opts).await?;
        self.page(&page);
        Ok(page)
    }
}

/// The queues, counted as SQS bills them ([`Counts`]); a receive that found nothing is left
/// out (the idle polling of a watched queue), and so are the depth reads (metrics only).
pub struct CountingQueues {
    pub inner: Arc<dyn Queues>,
    pub counts: Arc<Counts>,
}

#[async_trait]
impl Queues for CountingQueues {
    async fn send_batch(&self, queue: &str, messages: Vec<OutMessage>) -> Result<(), QueueError> {
        let batches = sizes::send_batches(&messages).map(|b| b.len() as u64).unwrap_or(1);
        let n = messages.len() as u64;
        let out = self.inner.send_batch(queue, messages).await;
        self.counts.sqs_sends.fetch_add(batches, Ordering::Relaxed);
        self.counts.sqs_messages.fetch_add(n, Ordering::Relaxed);
        out
    }
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, QueueError> {
        let got = self.inner.receive(queue, max, visibility, wait).await?;
        if !got.is_empty() {
            self.counts.sqs_receives.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got)
    }
    async fn change_visibility(&self, queue: &str, receipt: &str, visibility: Duration) -> Result<(), QueueError> {
        self.counts.sqs_other.fetch_add(1, Ordering::Relaxed);
        self.inner.change_visibility(queue, receipt, visibility).await
    }
    async fn delete(&self, queue: &str, receipt: &str) -> Result<(), QueueError> {
        self.counts.sqs_deletes.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(queue, receipt).await
    }
    async fn delete_batch(&self, queue: &str, receipts: &[String]) -> Result<(), QueueError> {
        self.counts.sqs_deletes.fetch_add((receipts.len() as u64).div_ceil(10), Ordering::Relaxed);
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
        self.counts.sqs_other.fetch_add(1, Ordering::Relaxed);
        self.inner.send_to_dlq(queue, body).await
    }
}

/// The messages on each queue's dead-letter queue (none, when the engine kept up).
async fn dead_letters(deps: &Deps, queues: &[String]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for q in queues {
        if let Ok(s) = deps.queues.stats(q).await
            && s.dlq_depth > 0
        {
            out.insert(q.clone(), s.dlq_depth);
        }
    }
    out
}

/// What the store and queues hold before the run starts (none on a fresh table): messages on
/// each queue (visible, in flight or delayed) and open timer buckets (`timers::tick` fires
/// every one, whoever's).
async fn leftover(deps: &Deps, queues: &[String]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for q in queues {
        if let Ok(s) = deps.queues.stats(q).await {
            let n = s.visible + s.in_flight + s.delayed;
            if n > 0 {
                out.insert(format!("queue {q}"), n);
            }
        }
    }
    // Accepted and not yet relayed (a run stopped before its relay ran): the outbox, not a queue.
    if let Ok(n) = tidings_core::notify::sweep::still_accepted(deps, 60).await
        && n > 0
    {
        out.insert("notifications not yet relayed".into(), n);
    }
    let open = QueryOpts { limit: 1000, cursor: None, descending: false };
    if let Ok(page) = deps.table.query(tidings_core::timers::OPEN_BUCKETS_PK, "", open).await
        && !page.items.is_empty()
    {
        out.insert("open timer buckets".into(), page.items.len() as u64);
    }
    out
}

/// A counter's total over its label sets that match `labels`.
fn counter(recorder: &tidings_core::metrics::LocalRecorder, name: &str, labels: &[(&str, &str)]) -> u64 {
    recorder
        .snapshot()
        .counters
        .iter()
        .filter(|(k, _)| k.name == name && labels.iter().all(|(l, v)| k.label(l) == Some(*v)))
        .map(|(_, v)| *v)
        .sum()
}

/// Every run of the bench's notifications: how many of each status, and of the digest step's
/// outcomes (`digested` with its count, `merged`).
async fn runs_of(deps: &Deps, t: &TenantId, ids: &[String]) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    for id in ids {
        let mut cursor = None;
        loop {
            let Some(page) = run::runs(deps, t, id, 500, cursor).await? else {
                anyhow::bail!("notification {id} is gone");
            };
            for r in &page.items {
                *tally.entry(format!("status {}", r.status.as_str())).or_default() += 1;
                for s in r.steps.iter().filter(|s| s.kind == "digest") {
                    let what = match &s.detail {
                        Some(d) if s.status == "digested" => format!("digest digested {d}"),
                        _ => format!("digest {}", s.status),
                    };
                    *tally.entry(what).or_default() += 1;
                }
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
    }
    Ok(tally)
}

/// Whether every one of the `triggers` runs is past its start: in its digest (a leader waiting
/// at its window) or ended (`merged`).
fn all_in_digests(tally: &BTreeMap<String, u64>, triggers: u64) -> bool {
    let all: u64 = tally.iter().filter(|(k, _)| k.starts_with("status ")).map(|(_, v)| v).sum();
    all == triggers && tally.get(&format!("status {}", RunStatus::Running.as_str())).copied().unwrap_or(0) == 0
}

/// Whether every one of the `triggers` runs ended.
fn all_ended(tally: &BTreeMap<String, u64>, triggers: u64) -> bool {
    let status = |s: RunStatus| tally.get(&format!("status {}", s.as_str())).copied().unwrap_or(0);
    let all: u64 = tally.iter().filter(|(k, _)| k.starts_with("status ")).map(|(_, v)| v).sum();
    all == triggers && status(RunStatus::Running) == 0 && status(RunStatus::Waiting) == 0
}

/// The runs must be: all completed, one digest of `per_user` events per user, the rest merged.
pub fn check_runs(tally: &BTreeMap<String, u64>, users: u64, per_user: u64) -> Result<(), String> {
    let triggers = users * per_user;
    let completed = tally.get(&format!("status {}", RunStatus::Completed.as_str())).copied().unwrap_or(0);
    let digested = tally.get(&format!("digest digested {per_user} events")).copied().unwrap_or(0);
    let merged = tally.get("digest merged").copied().unwrap_or(0);
    let all: u64 = tally.iter().filter(|(k, _)| k.starts_with("status ")).map(|(_, v)| v).sum();
    if all != triggers || completed != triggers || digested != users || merged != triggers - users {
        return Err(format!(
            "runs: {all} of {triggers}, {completed} completed, {digested} digests of {per_user} (of {users}), \
             {merged} merged (of {}): {tally:?}",
            triggers - users
        ));
    }
    Ok(())
}

pub async fn digest(args: DigestArgs) -> anyhow::Result<()> {
    let (users, per_user) = (args.users.max(1), args.per_user.max(1));
    let triggers = users * per_user;
    let window_ms = tidings_core::workflows::definition::duration_ms(&args.window)
        .ok_or_else(|| anyhow::anyhow!("--window: a duration such as 20m"))?;
    anyhow::ensure!(window_ms >= 15 * 60_000, "--window: at least 15m (its close is a timer bucket the tick fires)");
    let tmp = tempfile::tempdir()?;
    let dir = args.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let backend_args =
        BackendArgs { data_dir: dir.clone(), backend: args.backend, bootstrap: true, data_dir_from: None };
    let backend_args = match args.backend {
        BackendKind::Aws => BackendArgs { bootstrap: args.bootstrap, ..backend_args },
        BackendKind::Embedded => backend_args,
    };
    let backend = Backend::open_for(&backend_args, clock.clone(), false, StoreUse::MakeWhenMissing, None).await?;
    let counts = Arc::new(Counts::default());
    let table: Arc<dyn Table> = Arc::new(CountingTable { inner: backend.deps.table.clone(), counts: counts.clone() });
    let queues: Arc<dyn Queues> =
        Arc::new(CountingQueues { inner: backend.deps.queues.clone(), counts: counts.clone() });
    // A tenant of its own each run: the AWS backend's table outlives it.
    let run_id = format!("{:x}", chrono::Utc::now().timestamp_micros());
    let t = TenantId::parse(&format!("digest-{run_id}"))?;
    let provider = Arc::new(DigestProvider::new(&t));
    let p: Arc<dyn Provider> = provider.clone();
    let config = backend.deps.config.clone();
    let store = if args.backend == BackendKind::Aws { GateStore::Shared(table.clone()) } else { GateStore::Local };
    let providers = gates::wrap(&Providers { email: p.clone(), sms: p.clone(), push: p }, None, &config.gates, store);
    let deps = Deps::new(table.clone(), queues, clock.clone(), providers, config);
    let recorder = tidings_core::metrics::install();
    let leftover = leftover(&deps, &backend.queue_names).await;
    if !leftover.is_empty() {
        eprintln!(
            "digest: the store and queues hold an earlier run's work ({leftover:?}): this run does it too; its sends \
             are counted apart (other_tenants_sends) and its runs' ends in runs_ended_counted"
        );
    }

    let progress = Progress::bar("seeding", users, "users");
    crate::bench::seed_users(deps.table.as_ref(), &t, users, crate::bench::BenchChannel::Email, &progress).await?;
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "{{ count }} price drops", "email_body": BODY}}});
    templates::put_template(&deps, &t, "drops", serde_json::from_value(template)?).await?;
    let workflow = json!({
        "name": "Price drops on your wishlist", "category": "transactional",
        "steps": [
            {"type": "digest", "window": args.window, "max": per_user.min(100)},
            {"type": "send", "channel": "email", "template_id": "drops"}
        ]
    });
    workflows::put_workflow(&deps, &t, "drops", serde_json::from_value(workflow)?).await?;
    progress.finish(format!("seeded {users} users, the template and the workflow in {:.1} s", progress.elapsed_s()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut workers = crate::runtime::start_with(
        deps.clone(),
        Arc::new(tidings_core::inbox::live::NoLive),
        backend.feed.clone(),
        backend.queue_names.clone(),
        backend.queue_arn_prefix.clone(),
        stop_rx,
        crate::runtime::Pools::configured(),
    );
    let queues = &backend.queue_names;
    // This run's runs are read while it goes on (`phases`) through the store itself, not the
    // counted one: the bench's own looks are no part of what a trigger costs.
    let watch = Deps { table: backend.deps.table.clone(), ..deps.clone() };
    let result =
        phases(&args, (&deps, &watch), &t, &clock, &counts, &recorder, &provider, queues, (users, per_user, triggers))
            .await;
    let _ = stop_tx.send(true);
    workers.shutdown().await;
    let mut report = result?;
    report["leftover_at_start"] = json!(leftover);
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Accepts the triggers, waits for them in the digests, moves the clock past the window, waits
/// for the digests, checks: the report.
#[allow(clippy::too_many_arguments)]
async fn phases(
    args: &DigestArgs,
    (deps, watch): (&Deps, &Deps),
    t: &TenantId,
    clock: &ManualClock,
    counts: &Counts,
    recorder: &tidings_core::metrics::LocalRecorder,
    provider: &DigestProvider,
    queues: &[String],
    (users, per_user, triggers): (u64, u64, u64),
) -> anyhow::Result<serde_json::Value> {
    let metrics = tidings_core::metrics::WORKFLOW_STEPS;
    let waits = tidings_core::metrics::WORKFLOW_WAITS;
    let ended = tidings_core::metrics::WORKFLOW_RUNS_ENDED;
    let entered = || {
        counter(recorder, metrics, &[("type", "digest"), ("status", "merged")])
            + counter(recorder, waits, &[("for", "digest")])
    };
    let (entered0, ended0, sent0) = (entered(), counter(recorder, ended, &[]), provider.sent.load(Ordering::Relaxed));
    let notifications = plan(users, per_user, args.per_request);
    let start = counts.tally();
    let started = Instant::now();
    let accepting = Progress::bar("triggers", triggers, "entered").every(Duration::from_secs(5));
    let accepted: Vec<anyhow::Result<String>> = futures::stream::iter(notifications.iter().enumerate())
        .map(|(i, (round, members))| async move {
            let request: tidings_core::notify::model::NotificationRequest = serde_json::from_value(json!({
                "idempotency_key": format!("drop-{i}"),
                "recipients": {"user_ids": members.iter().map(|u| user_id(*u)).collect::<Vec<_>>()},
                "workflow_id": "drops",
                "params": {"round": round, "drop": i},
            }))?;
            let mut tries = 0;
            loop {
                match api::accept(deps, t, request.clone()).await {
                    Ok(a) => return Ok(a.notification_id),
                    Err(e) if tries < 5 && e.is_retryable() => tries += 1,
                    Err(e) => return Err(anyhow::anyhow!("accepting trigger notification {i}: {e}")),
                }
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let ids = accepted.into_iter().collect::<anyhow::Result<Vec<String>>>()?;
    let accepted_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut last_look: Option<Instant> = None;
    loop {
        let n = entered() - entered0;
        accepting.set(n, format!("{:.0}/s", n as f64 / started.elapsed().as_secs_f64().max(0.001)));
        // The metrics count every tenant's runs: this run's are read before its windows close.
        if n >= triggers && last_look.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
            last_look = Some(Instant::now());
            if all_in_digests(&runs_of(watch, t, &ids).await?, triggers) {
                break;
            }
        }
        if Instant::now() >= deadline {
            let dead = dead_letters(deps, queues).await;
            // The metric counts every tenant's runs: this run's are named.
            let own = runs_of(watch, t, &ids).await.unwrap_or_default();
            anyhow::bail!(
                "not every one of the {triggers} triggers entered its digest in time ({n} counted, this run's \
                 runs: {own:?}); dead letters: {dead:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let enter_s = started.elapsed().as_secs_f64();
    let entered_tally = counts.tally().minus(&start);
    let rate = triggers as f64 / enter_s;
    accepting.finish(format!(
        "{triggers} triggers in {} notifications accepted in {accepted_s:.1} s, all in their digests in {enter_s:.1} s ({rate:.0}/s)",
        ids.len()
    ));
    let early = provider.sent.load(Ordering::Relaxed) - sent0;
    anyhow::ensure!(early == 0, "{early} digests went out before their window closed");

    // Past the window: the tick fires its timer buckets (again every second: a bucket the
    // tick found still being written is fired by the next one).
    let window_ms = tidings_core::workflows::definition::duration_ms(&args.window).unwrap_or(0);
    clock.advance(chrono::Duration::milliseconds(window_ms + 2 * 60_000));
    let flushing = Instant::now();
    let flush = Progress::bar("digests", users, "sent").every(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut last_tick: Option<Instant> = None;
    let mut last_look: Option<Instant> = None;
    loop {
        if last_tick.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            last_tick = Some(Instant::now());
            if let Err(e) = crate::schedules::run(deps, "tick").await {
                tracing::warn!(error = %e, "tick failed; it runs again");
            }
        }
        let sent = provider.sent.load(Ordering::Relaxed) - sent0;
        // The metric counts every tenant's runs (an earlier run's left in the table end here
        // too): it only says when to look; this run's runs are read to know they all ended.
        let done = counter(recorder, ended, &[]) - ended0;
        flush.set(sent, format!("{done} of {triggers} runs ended"));
        if sent >= users && done >= triggers && last_look.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
            last_look = Some(Instant::now());
            if all_ended(&runs_of(watch, t, &ids).await?, triggers) {
                break;
            }
        }
        if Instant::now() >= deadline {
            let dead = dead_letters(deps, queues).await;
            let own = runs_of(watch, t, &ids).await.unwrap_or_default();
            anyhow::bail!(
                "only {sent} of {users} digests sent and not every run ended in time ({done} run ends counted, \
                 this run's runs: {own:?}); dead letters: {dead:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let flush_s = flushing.elapsed().as_secs_f64();
    let all = counts.tally().minus(&start);
    let flush_tally = all.minus(&entered_tally);
    flush.finish(format!("{users} digests sent {flush_s:.1} s after the window closed"));
    // A moment for anything late (a second digest would show here).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let runs_ended_counted = counter(recorder, ended, &[]) - ended0;
    let other_tenants_sends = provider.others.load(Ordering::Relaxed);
    let bodies = provider.bodies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sent = bodies.values().map(Vec::len).sum::<usize>();
    // Every check, each failure kept: the report is printed with them (its figures and the
    // conflicts say where to look).
    let mut failed = Vec::new();
    if let Err(e) = check_bodies(&bodies, users, per_user) {
        failed.push(format!("digests: {e}"));
    }
    let tally = runs_of(deps, t, &ids).await?;
    if let Err(e) = check_runs(&tally, users, per_user) {
        failed.push(e);
    }
    let dead = dead_letters(deps, queues).await;
    if !dead.is_empty() {
        failed.push(format!("messages dead-lettered: {dead:?}"));
    }
    let (w, r, q) = all.dollars_per_million(triggers);
    eprintln!(
        "digest: {triggers} triggers into {users} users' digests at {rate:.0}/s, {sent} digests sent (each with its {per_user} \
         events), flushed in {flush_s:.1} s; per trigger {:.2} write units, {:.2} read units, {:.3} SQS requests: \
         ${:.2} per million triggers; {}",
        all.write_units as f64 / triggers as f64,
        all.read_units as f64 / triggers as f64,
        all.sqs_requests() as f64 / triggers as f64,
        w + r + q,
        if failed.is_empty() {
            "every run ended; checks pass".to_owned()
        } else {
            format!("CHECKS FAIL: {}", failed.join("; "))
        }
    );
    let report = json!({
        "backend": match args.backend { BackendKind::Aws => "aws", BackendKind::Embedded => "embedded" },
        "users": users,
        "triggers": triggers,
        "per_request": args.per_request.clamp(1, api_max()),
        "notifications": ids.len(),
        "window": args.window,
        "accepted_s": (accepted_s * 100.0).round() / 100.0,
        "entered_s": (enter_s * 100.0).round() / 100.0,
        "triggers_per_s": rate.round(),
        "flush_s": (flush_s * 100.0).round() / 100.0,
        "digests_sent": sent,
        "runs": tally,
        // Every tenant's (see `DigestProvider`): above `triggers` and 0 only when the table
        // held an earlier run's unfinished work (`leftover_at_start`).
        "runs_ended_counted": runs_ended_counted,
        "other_tenants_sends": other_tenants_sends,
        "per_trigger": all.per(triggers),
        "per_trigger_entering": entered_tally.per(triggers),
        "per_digest_flush": flush_tally.per(users),
        "prices": {"dynamodb_write_units_per_million": PRICE_WRITE_UNITS, "dynamodb_read_units_per_million": PRICE_READ_UNITS,
            "sqs_requests_per_million": PRICE_SQS_REQUESTS, "region": "us-east-1, on-demand"},
        "peak_rss_mib": crate::bench::peak_rss_mib().map(f64::round),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        // DynamoDB's transaction conflicts the table adapter tried again, and those it gave up
        // on (the message came again): where many triggers of one user meet.
        "store_conflict_retries": counter(recorder, "tidings_store_conflict_retries_total", &[]),
        "store_conflicts_given_up": counter(recorder, "tidings_store_conflicts_given_up_total", &[]),
        "conflicted_transactions": counts.conflicts.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        // Every request the AWS SDK made since the start (seeding and the checks included).
        "aws_requests": recorder.report().aws_requests,
        "failed_checks": failed,
    });
    if !failed.is_empty() {
        println!("{}", serde_json::to_string_pretty(&report)?);
        anyhow::bail!("{}", failed.join("; "));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::{BTreeMap, HashMap};

    use super::{check_bodies, check_runs, plan, user_id};

    /// Every user is in exactly `per_user` notifications, one per round, and no notification
    /// has more recipients than asked (nor the same recipients as another).
    #[test]
    fn the_plan_puts_each_user_in_one_notification_per_round() {
        for (users, per_user, per_request) in [(10_000, 10, 1000), (5, 10, 1000), (7, 3, 2), (12, 4, 1)] {
            let p = plan(users, per_user, per_request);
            let mut rounds: HashMap<u64, Vec<u64>> = HashMap::new();
            for (round, members) in &p {
                assert!(!members.is_empty() && members.len() as u64 <= per_request);
                for u in members {
                    rounds.entry(*u).or_default().push(*round);
                }
            }
            assert_eq!(rounds.len() as u64, users);
            for (u, mut r) in rounds {
                r.sort();
                assert_eq!(r, (0..per_user).collect::<Vec<_>>(), "user {u} of {users}");
            }
        }
        // Rounds interleaved: the first notifications are of different rounds.
        let p = plan(10_000, 10, 1000);
        assert_eq!(p.iter().take(10).map(|(r, _)| *r).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
        let (a, b) = (&p[0].1, &p[10].1);
        assert_ne!(a, b, "two notifications of one position in two rounds have other recipients");
    }

    /// The self-check refuses a second digest, a missing one, a digest short of an event, one
    /// with an event twice, and a digest to someone else.
    #[test]
    fn the_digest_check_refuses_what_is_not_one_digest_of_every_event() {
        let good = |users: u64| -> HashMap<String, Vec<String>> {
            (0..users).map(|i| (user_id(i), vec!["3|2,0,1,".to_owned()])).collect()
        };
        assert_eq!(check_bodies(&good(4), 4, 3), Ok(()));
        let mut twice = good(4);
        twice.get_mut(&user_id(1)).unwrap().push("3|0,1,2,".into());
        let mut missing = good(4);
        missing.remove(&user_id(3));
        let mut short = good(4);
        short.insert(user_id(2), vec!["2|0,1,".into()]);
        let mut repeated = good(4);
        repeated.insert(user_id(0), vec!["3|0,0,1,".into()]);
        let mut stranger = good(4);
        stranger.insert("someone".into(), vec!["3|0,1,2,".into()]);
        for (what, bodies) in
            [("twice", twice), ("missing", missing), ("short", short), ("repeated", repeated), ("stranger", stranger)]
        {
            assert!(check_bodies(&bodies, 4, 3).is_err(), "{what} passed");
        }
    }

    #[test]
    fn the_runs_check_wants_every_run_completed_and_one_digest_per_user() {
        let tally = |completed: u64, waiting: u64, digested: u64, merged: u64| -> BTreeMap<String, u64> {
            let mut t = BTreeMap::from([
                ("status completed".to_owned(), completed),
                ("digest digested 3 events".to_owned(), digested),
                ("digest merged".to_owned(), merged),
            ]);
            if waiting > 0 {
                t.insert("status waiting".into(), waiting);
            }
            t
        };
        assert_eq!(check_runs(&tally(12, 0, 4, 8), 4, 3), Ok(()));
        assert!(check_runs(&tally(11, 1, 4, 8), 4, 3).is_err(), "a run still waiting");
        assert!(check_runs(&tally(12, 0, 5, 7), 4, 3).is_err(), "a digest too many");
        assert!(check_runs(&tally(11, 0, 4, 7), 4, 3).is_err(), "a run missing");
    }
}
