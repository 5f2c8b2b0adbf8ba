//! Metrics, through the `metrics` facade (what shows a system falling behind: oldest pending age,
//! sends per second, 429 ratio, retry and dead-letter ratios, accepted → provider latency per
//! channel and priority, worker concurrency).
//!
//! The core only emits (`metrics::counter!(..)`); what records them is the wiring's choice:
//! [`LocalRecorder`] keeps them in process, for `GET /v1/ops/metrics` under `tidings serve`, and
//! writes the CloudWatch embedded metric format ([`LocalRecorder::emf`]) that a Lambda function
//! prints at the end of an invocation: one document per label set, the labels as dimensions
//! beside a `function` dimension. `tidings serve` also hands every metric to a second recorder
//! (Prometheus, [`install_with`]) whose text [`exposition`] serves at `GET /metrics`.
//!
//! The embedded format is written here rather than by the `metrics_cloudwatch_embedded` crate:
//! that crate must be the process's only recorder (its builder installs itself), so the API's
//! own figures could not be read beside it, and it drops histogram values past 100 a flush.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use serde::Serialize;

/// Provider calls, labels `channel`, `provider`, `result` (`ok`, `throttled`, `transient`,
/// `permanent`, `open`: refused by an open circuit breaker).
pub const PROVIDER_CALLS: &str = "tidings_provider_calls";
/// Channel tasks put back for a retry, label `channel`.
pub const RETRIES: &str = "tidings_retries";
/// Deliveries that ran out of retries (their messages go to the DLQ), label `channel`.
pub const DEAD_LETTERS: &str = "tidings_dead_letters";
/// From a notification's acceptance to the provider's acceptance of one of its sends, in
/// milliseconds, labels `channel` and `priority` (histogram).
pub const DELIVERY_LATENCY_MS: &str = "tidings_delivery_latency_ms";
/// Messages being handled right now, label `queue` (gauge; the local runtime's pools).
pub const WORKERS_BUSY: &str = "tidings_workers_busy";
/// Time spent handling a queue's batches in milliseconds, label `queue` (counter): over a
/// period, its sum divided by the period is the concurrency in use (on Lambda too, where each
/// environment handles one batch at a time).
pub const WORKER_BUSY_MS: &str = "tidings_worker_busy_ms";
/// Age of the oldest message of a queue in seconds, label `queue` (gauge).
pub const QUEUE_OLDEST_AGE: &str = "tidings_queue_oldest_age_s";
/// Requests made to AWS by the adapters, labels `service` and `operation` (one per attempt).
pub const AWS_REQUESTS: &str = "tidings_aws_requests";
/// Receives that found no message (idle polling), label `queue`.
pub const EMPTY_RECEIVES: &str = "tidings_empty_receives";
/// Waits at a rate gate in milliseconds, label `gate` (histogram: count and sum).
pub const GATE_WAIT_MS: &str = "tidings_gate_wait_ms";
/// Environments started (counter, 1 at a Lambda function's cold start, in its first flush).
pub const COLD_STARTS: &str = "tidings_cold_starts";
/// How long each call to the store took to answer, from the caller's side, in milliseconds,
/// label `op` (`read`, `query`, `write`, `transact`; histogram). On the embedded backend a
/// write's is mostly its wait for the writer thread (the queue in front of it and the group
/// commit), the store's connection-pool wait; on DynamoDB, the request's round trip.
pub const STORE_WAIT_MS: &str = "tidings_store_wait_ms";

/// Workflow steps a run went through, labels `type` (`send`, `delay`, `digest`, …) and `status`
/// (`queued`, `skipped`, `merged`, `fell_back`, …: docs/workflows.md, "Runs").
pub const WORKFLOW_STEPS: &str = "tidings_workflow_steps";
/// Runs that began to wait, label `for` (`delay`, `deferred`, `digest`, `send`).
pub const WORKFLOW_WAITS: &str = "tidings_workflow_waits";
/// Runs that ended, label `status` (`completed`, `failed`, `throttled`, `cancelled`).
pub const WORKFLOW_RUNS_ENDED: &str = "tidings_workflow_runs_ended";

/// The CloudWatch namespace of the embedded metrics.
pub const NAMESPACE: &str = "Tidings";

/// Every metric name the code emits, for the dashboard's test and the docs.
pub const ALL: &[&str] = &[
    PROVIDER_CALLS,
    RETRIES,
    DEAD_LETTERS,
    DELIVERY_LATENCY_MS,
    WORKERS_BUSY,
    WORKER_BUSY_MS,
    QUEUE_OLDEST_AGE,
    AWS_REQUESTS,
    EMPTY_RECEIVES,
    GATE_WAIT_MS,
    COLD_STARTS,
    STORE_WAIT_MS,
    WORKFLOW_STEPS,
    WORKFLOW_WAITS,
    WORKFLOW_RUNS_ENDED,
];

/// Counts this environment's start (once: a Lambda function's first flush carries it).
pub fn cold_start() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| metrics::counter!(COLD_STARTS).increment(1));
}

/// Records the busy time of one batch of `queue` (see [`WORKER_BUSY_MS`]).
pub fn record_busy(queue: &str, busy: Duration) {
    metrics::counter!(WORKER_BUSY_MS, "queue" => queue.to_owned()).increment(busy.as_millis() as u64);
}

/// Records the accepted → provider latency of one send accepted by its provider.
pub fn record_delivery_latency(channel: &str, priority: &str, accepted_ms: i64, now_ms: i64) {
    let ms = now_ms.saturating_sub(accepted_ms).max(0) as f64;
    metrics::histogram!(DELIVERY_LATENCY_MS, "channel" => channel.to_owned(), "priority" => priority.to_owned())
        .record(ms);
}

fn render(key: &Key) -> (String, Vec<(String, String)>) {
    let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
    (key.name().to_owned(), labels)
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct MetricKey {
    pub name: String,
    pub labels: Vec<(String, String)>,
}

impl MetricKey {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A counter: its total, and how much it grew in each of the last seconds (for rates over a
/// fixed recent window, whenever they are read).
#[derive(Debug)]
struct CounterCell {
    total: AtomicU64,
    /// The recorder's start: seconds are counted from it.
    epoch: Instant,
    /// (second since `epoch`, increase in it), oldest first, at most [`RATE_SECONDS`] + 1.
    seconds: Mutex<VecDeque<(u64, u64)>>,
}

/// Seconds kept per counter: the rate window and the second under way.
const RATE_SECONDS: u64 = 10;

impl CounterCell {
    fn new(epoch: Instant) -> Self {
        Self { total: AtomicU64::new(0), epoch, seconds: Mutex::new(VecDeque::new()) }
    }

    fn load(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The increase over the whole seconds `[now - window, now)` since the epoch.
    fn increase_in(&self, from_s: u64, to_s: u64) -> u64 {
        let seconds = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        seconds.iter().filter(|(s, _)| *s >= from_s && *s < to_s).map(|(_, n)| n).sum()
    }
}

impl metrics::CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
        let now_s = self.epoch.elapsed().as_secs();
        let mut seconds = self.seconds.lock().unwrap_or_else(|p| p.into_inner());
        match seconds.back_mut() {
            Some((s, n)) if *s == now_s => *n += value,
            _ => seconds.push_back((now_s, value)),
        }
        while seconds.front().is_some_and(|(s, _)| *s + RATE_SECONDS < now_s) {
            seconds.pop_front();
        }
    }
    fn absolute(&self, value: u64) {
        self.total.store(value, Ordering::Relaxed);
    }
}

/// A gauge's value (f64 bits in an atomic).
#[derive(Debug, Default)]
struct GaugeCell(AtomicU64);

impl metrics::GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        let _ =
            self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((f64::from_bits(b) + value).to_bits()));
    }
    fn decrement(&self, value: f64) {
        self.increment(-value);
    }
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

/// The values a histogram keeps for its quantiles (the most recent ones).
const RECENT_VALUES: usize = 1024;
/// The values a histogram keeps for the next EMF flush: a Lambda invocation records at most a
/// batch's worth (100); past this the oldest are dropped.
const UNFLUSHED_VALUES: usize = 1000;
/// CloudWatch takes at most 100 values of one metric in one EMF document.
const EMF_MAX_VALUES: usize = 100;
/// CloudWatch takes at most 100 metrics in one EMF document.
const EMF_MAX_METRICS: usize = 100;
/// CloudWatch takes at most 30 dimensions in one dimension set.
const EMF_MAX_DIMENSIONS: usize = 30;

/// A histogram: count, sum and max since the start, the recent values (quantiles), and the
/// values not yet flushed as EMF.
#[derive(Debug, Default)]
struct HistogramCell {
    count: AtomicU64,
    sum_bits: AtomicU64,
    max_bits: AtomicU64,
    recent: Mutex<VecDeque<f64>>,
    unflushed: Mutex<VecDeque<f64>>,
}

fn push_bounded(q: &Mutex<VecDeque<f64>>, value: f64, cap: usize) {
    let mut q = q.lock().unwrap_or_else(|p| p.into_inner());
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(value);
}

impl metrics::HistogramFn for HistogramCell {
    fn record(&self, value: f64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((f64::from_bits(b) + value).to_bits()));
        let _ = self.max_bits.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            (value > f64::from_bits(b)).then_some(value.to_bits())
        });
        push_bounded(&self.recent, value, RECENT_VALUES);
        push_bounded(&self.unflushed, value, UNFLUSHED_VALUES);
    }
}

/// The nearest-rank `q` quantile of `values` (0 when empty).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Default)]
struct Cells {
    counters: BTreeMap<MetricKey, Arc<CounterCell>>,
    gauges: BTreeMap<MetricKey, Arc<GaugeCell>>,
    histograms: BTreeMap<MetricKey, Arc<HistogramCell>>,
    /// The same cells by the `metrics` crate's own key. Every `counter!` or `histogram!` call
    /// registers its metric again; this finds the cell without rendering the key into strings
    /// (which was an allocation per label under this lock, several times per request).
    seen: Seen,
}

#[derive(Default)]
struct Seen {
    counters: HashMap<Key, Arc<CounterCell>>,
    gauges: HashMap<Key, Arc<GaugeCell>>,
    histograms: HashMap<Key, Arc<HistogramCell>>,
}

/// The cell of `key`: found by the crate's key, else made (or found) by its rendered name.
fn cell_of<C>(
    seen: &mut HashMap<Key, Arc<C>>,
    cells: &mut BTreeMap<MetricKey, Arc<C>>,
    key: &Key,
    make: impl FnOnce() -> Arc<C>,
) -> Arc<C> {
    if let Some(cell) = seen.get(key) {
        return cell.clone();
    }
    let cell = cells.entry(key_of(key)).or_insert_with(make).clone();
    seen.insert(key.clone(), cell.clone());
    cell
}

/// An in-process recorder: atomics per metric, read by snapshots.
pub struct LocalRecorder {
    cells: Mutex<Cells>,
    /// When it started: rates are over whole seconds since.
    started: Instant,
    /// Counter totals at the last EMF flush.
    flushed: Mutex<BTreeMap<MetricKey, u64>>,
}

impl Default for LocalRecorder {
    fn default() -> Self {
        Self::started_at(Instant::now())
    }
}

impl LocalRecorder {
    /// A recorder whose rates count from `started` (tests: one that has been running a while).
    pub fn started_at(started: Instant) -> Self {
        Self { cells: Mutex::default(), started, flushed: Mutex::default() }
    }
}

fn key_of(key: &Key) -> MetricKey {
    let (name, labels) = render(key);
    MetricKey { name, labels }
}

impl Recorder for LocalRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let started = self.started;
        let Cells { counters, seen, .. } = &mut *cells;
        Counter::from_arc(cell_of(&mut seen.counters, counters, key, || Arc::new(CounterCell::new(started))))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let Cells { gauges, seen, .. } = &mut *cells;
        Gauge::from_arc(cell_of(&mut seen.gauges, gauges, key, Arc::default))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let Cells { histograms, seen, .. } = &mut *cells;
        Histogram::from_arc(cell_of(&mut seen.histograms, histograms, key, Arc::default))
    }
}

static GLOBAL: OnceLock<Arc<LocalRecorder>> = OnceLock::new();

/// Another recorder every metric also goes to (Prometheus under `tidings serve`).
pub type Also = Box<dyn Recorder + Send + Sync>;

/// The process's recorder: the [`LocalRecorder`] (shared through an `Arc`: the facade takes
/// ownership of what it is given) and, when given, another one beside it.
struct Shared {
    local: Arc<LocalRecorder>,
    also: Option<Also>,
}

/// A handle that updates two recorders' handles.
struct Both<T>(T, T);

impl metrics::CounterFn for Both<Counter> {
    fn increment(&self, value: u64) {
        self.0.increment(value);
        self.1.increment(value);
    }
    fn absolute(&self, value: u64) {
        self.0.absolute(value);
        self.1.absolute(value);
    }
}

impl metrics::GaugeFn for Both<Gauge> {
    fn increment(&self, value: f64) {
        self.0.increment(value);
        self.1.increment(value);
    }
    fn decrement(&self, value: f64) {
        self.0.decrement(value);
        self.1.decrement(value);
    }
    fn set(&self, value: f64) {
        self.0.set(value);
        self.1.set(value);
    }
}

impl metrics::HistogramFn for Both<Histogram> {
    fn record(&self, value: f64) {
        self.0.record(value);
        self.1.record(value);
    }
}

impl Recorder for Shared {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        if let Some(also) = &self.also {
            also.describe_counter(k.clone(), u, d.clone());
        }
        self.local.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        if let Some(also) = &self.also {
            also.describe_gauge(k.clone(), u, d.clone());
        }
        self.local.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        if let Some(also) = &self.also {
            also.describe_histogram(k.clone(), u, d.clone());
        }
        self.local.describe_histogram(k, u, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        let local = self.local.register_counter(key, m);
        match &self.also {
            Some(also) => Counter::from_arc(Arc::new(Both(local, also.register_counter(key, m)))),
            None => local,
        }
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        let local = self.local.register_gauge(key, m);
        match &self.also {
            Some(also) => Gauge::from_arc(Arc::new(Both(local, also.register_gauge(key, m)))),
            None => local,
        }
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        let local = self.local.register_histogram(key, m);
        match &self.also {
            Some(also) => Histogram::from_arc(Arc::new(Both(local, also.register_histogram(key, m)))),
            None => local,
        }
    }
}

/// Installs the process's recorder (once; later calls return the same one).
pub fn install() -> Arc<LocalRecorder> {
    install_with(None)
}

/// [`install`], every metric also going to `also` (only the first call's is kept).
pub fn install_with(also: Option<Also>) -> Arc<LocalRecorder> {
    GLOBAL
        .get_or_init(|| {
            let recorder = Arc::new(LocalRecorder::default());
            // Fails only when another recorder was installed first; then this one stays empty.
            let _ = metrics::set_global_recorder(Shared { local: recorder.clone(), also });
            recorder
        })
        .clone()
}

/// The installed recorder, if any.
pub fn installed() -> Option<Arc<LocalRecorder>> {
    GLOBAL.get().cloned()
}

/// What renders the metrics in the Prometheus text format, when the process has it.
type Exposition = Box<dyn Fn() -> String + Send + Sync>;
static EXPOSITION: OnceLock<Exposition> = OnceLock::new();

/// Sets the Prometheus rendering (`tidings serve`; once).
pub fn set_exposition(render: Exposition) {
    let _ = EXPOSITION.set(render);
}

/// Every metric in the Prometheus text format; `None` in a process without it (Lambda).
pub fn exposition() -> Option<String> {
    EXPOSITION.get().map(|render| render())
}

/// One read of every metric.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    pub counters: Vec<(MetricKey, u64)>,
    pub gauges: Vec<(MetricKey, f64)>,
    /// `(count, sum, max)`.
    pub histograms: Vec<(MetricKey, (u64, f64, f64))>,
    /// The recent values of each histogram, sorted.
    #[serde(skip)]
    pub recent: Vec<(MetricKey, Vec<f64>)>,
}

/// A distribution of times: the accepted → provider latency of the sends of one channel and
/// priority, or the store's answers to one kind of call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Latency {
    /// Values measured since the process started (sends, or store calls).
    pub count: u64,
    /// Median of the last 1,024 values, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile of the last 1,024 values, milliseconds.
    pub p99_ms: f64,
    /// The longest since the process started, milliseconds.
    pub max_ms: f64,
}

/// What `GET /v1/ops/metrics` shows. The rates, ratios and latencies are this process's
/// (`tidings serve`: the whole system; a Lambda API function: only what it did itself, the
/// rest is in CloudWatch); the queue ages are read from the queues.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// Sends the providers accepted per second per channel, over the last 10 whole seconds
    /// (fewer just after the start), whenever it is read.
    pub sends_per_s: BTreeMap<String, f64>,
    /// Accepted sends per channel since the process started.
    pub sends_total: BTreeMap<String, u64>,
    /// Share of provider calls answered 429, per channel (0 when there were none), in [0, 1].
    pub throttled_ratio: BTreeMap<String, f64>,
    /// Share of settled send attempts put back for a retry, per channel, in [0, 1].
    pub retry_ratio: BTreeMap<String, f64>,
    /// Share of finished deliveries (sent, failed or dead) that ran out of retries and went to
    /// the dead-letter queue, per channel, in [0, 1].
    pub dead_letter_ratio: BTreeMap<String, f64>,
    /// Accepted → provider latency, per channel, then per priority.
    pub latency_ms: BTreeMap<String, BTreeMap<String, Latency>>,
    /// Calls refused by an open circuit breaker, per provider.
    pub breaker_refusals: BTreeMap<String, u64>,
    /// Channel tasks put back for a retry since the process started.
    pub retries: u64,
    /// Deliveries that went to a dead-letter queue since the process started.
    pub dead_letters: u64,
    /// Messages being handled now, per queue.
    pub worker_concurrency: BTreeMap<String, f64>,
    /// Age of the oldest message per queue, seconds.
    pub oldest_age_s: BTreeMap<String, f64>,
    /// Time spent waiting at each rate gate: `{count, mean_ms, max_ms}`.
    pub gate_waits: BTreeMap<String, serde_json::Value>,
    /// Time waiting on the store, per kind of call (`read`, `query`, `write`, `transact`): how
    /// long each call took to answer, from the caller's side (embedded backend: mostly a
    /// write's wait for the writer thread and its group commit; DynamoDB: the round trip).
    /// `count` since the process started; quantiles of the last 1,024 calls.
    pub store_wait_ms: BTreeMap<String, Latency>,
    /// Requests to AWS since the process started, by `Service.Operation` (AWS backend only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aws_requests: BTreeMap<String, u64>,
    /// The same, by the function they were made for (see [`crate::roles`]); an SQS request's
    /// name ends with `@` and its queue.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub aws_requests_by_function: BTreeMap<String, BTreeMap<String, u64>>,
    /// Receives that found nothing (idle polling), since the process started.
    pub empty_receives: u64,
}

/// The window over which rates are computed: the last [`RATE_SECONDS`] whole seconds.
pub const RATE_WINDOW: Duration = Duration::from_secs(RATE_SECONDS);

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { (part as f64 / whole as f64).clamp(0.0, 1.0) }
}

/// Per channel: provider calls by result, retries and dead letters.
#[derive(Default)]
struct ChannelCounts {
    ok: u64,
    throttled: u64,
    transient: u64,
    permanent: u64,
    retries: u64,
    dead: u64,
}

/// One metric value of an EMF document.
struct EmfValue {
    name: String,
    value: serde_json::Value,
    unit: &'static str,
}

fn emf_unit(name: &str, counter: bool) -> &'static str {
    match name {
        DELIVERY_LATENCY_MS | GATE_WAIT_MS | WORKER_BUSY_MS | STORE_WAIT_MS => "Milliseconds",
        QUEUE_OLDEST_AGE => "Seconds",
        _ if counter => "Count",
        _ => "None",
    }
}

/// The labels that also get a dimension set without `function` (summed over the functions).
const ROLLUP_DIMENSIONS: &[&str] = &["channel", "result", "queue", "priority"];

impl LocalRecorder {
    pub fn snapshot(&self) -> Snapshot {
        let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        let mut recent = Vec::new();
        let histograms = cells
            .histograms
            .iter()
            .map(|(k, h)| {
                let mut values: Vec<f64> = h.recent.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
                values.sort_by(f64::total_cmp);
                recent.push((k.clone(), values));
                let v = (
                    h.count.load(Ordering::Relaxed),
                    f64::from_bits(h.sum_bits.load(Ordering::Relaxed)),
                    f64::from_bits(h.max_bits.load(Ordering::Relaxed)),
                );
                (k.clone(), v)
            })
            .collect();
        Snapshot {
            counters: cells.counters.iter().map(|(k, v)| (k.clone(), v.load())).collect(),
            gauges: cells
                .gauges
                .iter()
                .map(|(k, v)| (k.clone(), f64::from_bits(v.0.load(Ordering::Relaxed))))
                .collect(),
            histograms,
            recent,
        }
    }

    /// The operators' report; rates are over the last [`RATE_WINDOW`] (whole seconds, whatever
    /// the reads), ratios since the start.
    pub fn report(&self) -> Report {
        self.report_at(Instant::now())
    }

    /// [`LocalRecorder::report`] as of `now`.
    pub fn report_at(&self, now: Instant) -> Report {
        let snap = self.snapshot();
        let totals: BTreeMap<MetricKey, u64> = snap.counters.iter().cloned().collect();
        // The last whole seconds: `[to - window, to)`, fewer just after the start.
        let to_s = now.saturating_duration_since(self.started).as_secs();
        let from_s = to_s.saturating_sub(RATE_SECONDS);
        let secs = (to_s - from_s) as f64;
        let increase = |k: &MetricKey| -> u64 {
            let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            cells.counters.get(k).map_or(0, |c| c.increase_in(from_s, to_s))
        };
        let mut r = Report::default();
        let mut channels: BTreeMap<String, ChannelCounts> = BTreeMap::new();
        for (k, v) in &totals {
            let channel = k.label("channel").unwrap_or("-").to_owned();
            match k.name.as_str() {
                PROVIDER_CALLS => {
                    let c = channels.entry(channel.clone()).or_default();
                    match k.label("result").unwrap_or("") {
                        "ok" => {
                            c.ok += v;
                            *r.sends_total.entry(channel.clone()).or_default() += v;
                            let rate = if secs > 0.0 { increase(k) as f64 / secs } else { 0.0 };
                            *r.sends_per_s.entry(channel).or_default() += rate;
                        }
                        "throttled" => c.throttled += v,
                        "transient" => c.transient += v,
                        "permanent" => c.permanent += v,
                        "open" => {
                            *r.breaker_refusals.entry(k.label("provider").unwrap_or("-").to_owned()).or_default() += v
                        }
                        _ => {}
                    }
                }
                RETRIES => {
                    r.retries += v;
                    channels.entry(channel).or_default().retries += v;
                }
                DEAD_LETTERS => {
                    r.dead_letters += v;
                    channels.entry(channel).or_default().dead += v;
                }
                AWS_REQUESTS => {
                    let name = format!("{}.{}", k.label("service").unwrap_or("-"), k.label("operation").unwrap_or("-"));
                    let function = k.label("function").unwrap_or("unattributed").to_owned();
                    // By function, an SQS request also names its queue: `SQS.SendMessageBatch@email-high`.
                    let named = match k.label("queue") {
                        Some(queue) => format!("{name}@{queue}"),
                        None => name.clone(),
                    };
                    *r.aws_requests_by_function.entry(function).or_default().entry(named).or_default() += v;
                    *r.aws_requests.entry(name).or_default() += v;
                }
                EMPTY_RECEIVES => r.empty_receives += v,
                _ => {}
            }
        }
        for (channel, c) in channels {
            let calls = c.ok + c.throttled + c.transient + c.permanent;
            let finished = c.ok + c.permanent + c.dead;
            r.throttled_ratio.insert(channel.clone(), ratio(c.throttled, calls));
            r.retry_ratio.insert(channel.clone(), ratio(c.retries, c.retries + finished));
            r.dead_letter_ratio.insert(channel, ratio(c.dead, finished));
        }
        for (k, v) in &snap.gauges {
            let queue = k.label("queue").unwrap_or("-").to_owned();
            match k.name.as_str() {
                WORKERS_BUSY => {
                    r.worker_concurrency.insert(queue, *v);
                }
                QUEUE_OLDEST_AGE => {
                    r.oldest_age_s.insert(queue, *v);
                }
                _ => {}
            }
        }
        let recent: BTreeMap<&MetricKey, &Vec<f64>> = snap.recent.iter().map(|(k, v)| (k, v)).collect();
        for (k, (count, sum, max)) in &snap.histograms {
            match k.name.as_str() {
                GATE_WAIT_MS => {
                    let mean = if *count == 0 { 0.0 } else { sum / *count as f64 };
                    r.gate_waits.insert(
                        k.label("gate").unwrap_or("-").to_owned(),
                        serde_json::json!({"count": count, "mean_ms": mean, "max_ms": max}),
                    );
                }
                STORE_WAIT_MS => {
                    let values = recent.get(k).map(|v| v.as_slice()).unwrap_or_default();
                    let op = k.label("op").unwrap_or("-").to_owned();
                    r.store_wait_ms.insert(
                        op,
                        Latency {
                            count: *count,
                            p50_ms: quantile(values, 0.5),
                            p99_ms: quantile(values, 0.99),
                            max_ms: *max,
                        },
                    );
                }
                DELIVERY_LATENCY_MS => {
                    let values = recent.get(k).map(|v| v.as_slice()).unwrap_or_default();
                    r.latency_ms.entry(k.label("channel").unwrap_or("-").to_owned()).or_default().insert(
                        k.label("priority").unwrap_or("-").to_owned(),
                        Latency {
                            count: *count,
                            p50_ms: quantile(values, 0.5),
                            p99_ms: quantile(values, 0.99),
                            max_ms: *max,
                        },
                    );
                }
                _ => {}
            }
        }
        r
    }

    /// What changed since the last flush, as CloudWatch embedded-metric-format documents (one
    /// JSON line each; none when nothing changed): the counters' increase, the gauges' values
    /// and the histograms' new values. Printed on stdout by a Lambda function, CloudWatch Logs
    /// turns them into metrics without any API call.
    ///
    /// Each label set is a document of its own: the metric name without labels, the label
    /// values as top-level members, and two dimension sets: `function` with every label, and
    /// the labels of [`ROLLUP_DIMENSIONS`] alone (summed over the functions, what the
    /// dashboard reads). CloudWatch's limits are kept: at most 30 dimensions in a set, 100
    /// metrics in a document and 100 values of a metric (more go to another document).
    pub fn emf(&self, namespace: &str, function: &str, timestamp_ms: i64) -> Vec<String> {
        let mut by_labels: BTreeMap<Vec<(String, String)>, Vec<EmfValue>> = BTreeMap::new();
        {
            let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            let mut flushed = self.flushed.lock().unwrap_or_else(|p| p.into_inner());
            for (k, v) in &cells.counters {
                let v = v.load();
                let before = flushed.insert(k.clone(), v).unwrap_or(0);
                let delta = v.saturating_sub(before);
                if delta > 0 {
                    let unit = emf_unit(&k.name, true);
                    by_labels.entry(k.labels.clone()).or_default().push(EmfValue {
                        name: k.name.clone(),
                        value: delta.into(),
                        unit,
                    });
                }
            }
            for (k, g) in &cells.gauges {
                let v = f64::from_bits(g.0.load(Ordering::Relaxed));
                let unit = emf_unit(&k.name, false);
                by_labels.entry(k.labels.clone()).or_default().push(EmfValue {
                    name: k.name.clone(),
                    value: serde_json::json!(v),
                    unit,
                });
            }
            for (k, h) in &cells.histograms {
                let values: Vec<f64> = h.unflushed.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
                for chunk in values.chunks(EMF_MAX_VALUES) {
                    let unit = emf_unit(&k.name, false);
                    by_labels.entry(k.labels.clone()).or_default().push(EmfValue {
                        name: k.name.clone(),
                        value: serde_json::json!(chunk),
                        unit,
                    });
                }
            }
        }
        let mut documents = Vec::new();
        for (labels, values) in by_labels {
            // A name appears once in a document: a second chunk of a histogram's values, or a
            // hundred-and-first metric, starts another document of the same labels.
            let mut docs: Vec<Vec<EmfValue>> = Vec::new();
            for value in values {
                let free =
                    docs.iter_mut().find(|d| d.len() < EMF_MAX_METRICS && d.iter().all(|v| v.name != value.name));
                match free {
                    Some(doc) => doc.push(value),
                    None => docs.push(vec![value]),
                }
            }
            for doc in docs {
                if let Some(line) = emf_document(namespace, function, timestamp_ms, &labels, doc) {
                    documents.push(line);
                }
            }
        }
        documents
    }
}

/// One EMF document of one label set.
fn emf_document(
    namespace: &str,
    function: &str,
    timestamp_ms: i64,
    labels: &[(String, String)],
    values: Vec<EmfValue>,
) -> Option<String> {
    let mut doc = serde_json::Map::new();
    let mut full = vec!["function".to_owned()];
    doc.insert("function".into(), function.into());
    for (name, value) in labels {
        if name == "function" || full.len() == EMF_MAX_DIMENSIONS {
            // The process's own function, or past CloudWatch's limit: kept as a property.
            doc.entry(format!("label_{name}")).or_insert_with(|| value.clone().into());
            continue;
        }
        // A dimension value may not be empty.
        let value = if value.is_empty() { "-" } else { value.as_str() };
        doc.insert(name.clone(), value.into());
        full.push(name.clone());
    }
    let rollup: Vec<String> = full.iter().filter(|d| ROLLUP_DIMENSIONS.contains(&d.as_str())).cloned().collect();
    let mut dimensions = vec![full.clone()];
    if !rollup.is_empty() {
        dimensions.push(rollup);
    }
    let mut defs = Vec::with_capacity(values.len());
    for v in values {
        defs.push(serde_json::json!({"Name": v.name, "Unit": v.unit}));
        doc.insert(v.name, v.value);
    }
    doc.insert(
        "_aws".into(),
        serde_json::json!({
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{"Namespace": namespace, "Dimensions": dimensions, "Metrics": defs}],
        }),
    );
    serde_json::to_string(&serde_json::Value::Object(doc)).ok()
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::Value;

    fn docs(r: &LocalRecorder) -> Vec<Value> {
        r.emf(NAMESPACE, "tidings-ChannelWorker", 1).iter().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn report_counts_sends_throttles_ratios_and_latency() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "result" => "ok").increment(3);
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "result" => "throttled").increment(1);
            metrics::counter!(RETRIES, "channel" => "email").increment(2);
            metrics::counter!(DEAD_LETTERS, "channel" => "email").increment(1);
            metrics::gauge!(WORKERS_BUSY, "queue" => "email-low").set(4.0);
            for ms in 1..=100 {
                record_delivery_latency("email", "high", 0, ms);
            }
        });
        let rep = r.report();
        assert_eq!(rep.sends_total.get("email"), Some(&3));
        assert_eq!(rep.throttled_ratio.get("email"), Some(&0.25));
        assert_eq!(rep.retries, 2);
        // 2 retried of 2 + 4 settled attempts (3 sent, 1 dead); 1 dead of 4 finished.
        assert_eq!(rep.retry_ratio.get("email"), Some(&(2.0 / 6.0)));
        assert_eq!(rep.dead_letter_ratio.get("email"), Some(&0.25));
        assert_eq!(rep.worker_concurrency.get("email-low"), Some(&4.0));
        let l = &rep.latency_ms["email"]["high"];
        assert_eq!((l.count, l.p50_ms, l.p99_ms, l.max_ms), (100, 50.0, 99.0, 100.0));
    }

    /// The send rate is over the last 10 whole seconds, whenever it is read: the first read
    /// of a busy system is not 0 (it was, taken between two reads), and a read a minute later
    /// says what the last 10 s did, not the average since the previous read.
    #[test]
    fn the_send_rate_is_over_a_fixed_recent_window() {
        let Some(started) = Instant::now().checked_sub(Duration::from_secs(60)) else { return };
        let r = LocalRecorder::started_at(started);
        metrics::with_local_recorder(&r, || {
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "result" => "ok").increment(380);
        });
        // A second later: the 380 sends of the last second, spread over the window of 10 s.
        let first = r.report_at(Instant::now() + Duration::from_secs(1));
        assert_eq!(first.sends_per_s.get("email"), Some(&38.0), "the first read says what goes out");
        let again = r.report_at(Instant::now() + Duration::from_secs(1));
        assert_eq!(again.sends_per_s.get("email"), Some(&38.0), "a second read says the same");
        // Out of the window once 10 s have passed without a send.
        let later = r.report_at(Instant::now() + Duration::from_secs(12));
        assert_eq!(later.sends_per_s.get("email"), Some(&0.0));
        assert_eq!(later.sends_total.get("email"), Some(&380));
    }

    /// Each call registers its metric again (found by the crate's key): the counts of one name
    /// and labels add up in one cell, whether the label values are static or made per call,
    /// and other labels are another metric.
    #[test]
    fn a_metric_registered_again_counts_in_the_same_cell() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            for i in 0..10 {
                let channel = if i % 2 == 0 { "email" } else { "sms" };
                metrics::counter!("t_sent", "channel" => channel.to_owned()).increment(1);
                metrics::counter!("t_sent", "channel" => "email").increment(1);
            }
        });
        let counters = r.snapshot().counters;
        let count = |c: &str| counters.iter().find(|(k, _)| k.label("channel") == Some(c)).map(|(_, v)| *v);
        assert_eq!(counters.len(), 2, "{counters:?}");
        assert_eq!((count("email"), count("sms")), (Some(15), Some(5)));
    }

    #[test]
    fn store_waits_are_reported_per_kind_of_call() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            for ms in 1..=100 {
                metrics::histogram!(STORE_WAIT_MS, "op" => "write").record(f64::from(ms));
            }
            metrics::histogram!(STORE_WAIT_MS, "op" => "read").record(2.0);
        });
        let rep = r.report();
        let w = &rep.store_wait_ms["write"];
        assert_eq!((w.count, w.p50_ms, w.p99_ms, w.max_ms), (100, 50.0, 99.0, 100.0));
        assert_eq!(rep.store_wait_ms["read"].count, 1);
    }

    #[test]
    fn emf_names_metrics_without_labels_and_the_labels_as_dimensions() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "provider" => "ses", "result" => "ok").increment(3);
            metrics::counter!(COLD_STARTS).increment(1);
            record_delivery_latency("sms", "low", 1_000, 1_250);
        });
        let docs = docs(&r);
        assert_eq!(docs.len(), 3, "{docs:#?}");
        let calls = docs.iter().find(|d| d.get(PROVIDER_CALLS).is_some()).unwrap();
        assert_eq!(calls[PROVIDER_CALLS], 3);
        assert_eq!(calls["function"], "tidings-ChannelWorker");
        assert_eq!(
            (calls["channel"].as_str(), calls["provider"].as_str(), calls["result"].as_str()),
            (Some("email"), Some("ses"), Some("ok"))
        );
        let directive = &calls["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(
            directive["Dimensions"],
            serde_json::json!([["function", "channel", "provider", "result"], ["channel", "result"]])
        );
        assert_eq!(directive["Metrics"], serde_json::json!([{"Name": PROVIDER_CALLS, "Unit": "Count"}]));
        let cold = docs.iter().find(|d| d.get(COLD_STARTS).is_some()).unwrap();
        assert_eq!(cold["_aws"]["CloudWatchMetrics"][0]["Dimensions"], serde_json::json!([["function"]]));
        let latency = docs.iter().find(|d| d.get(DELIVERY_LATENCY_MS).is_some()).unwrap();
        assert_eq!(latency[DELIVERY_LATENCY_MS], serde_json::json!([250.0]));
        assert_eq!(latency["priority"], "low");
        assert_eq!(latency["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"], "Milliseconds");
        // Counters flush their increase: nothing new, no document (the cold start is not repeated).
        assert!(r.emf(NAMESPACE, "f", 2).is_empty());
    }

    #[test]
    fn emf_keeps_to_cloudwatchs_limits() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            // 250 values of one metric: three documents of at most 100.
            for ms in 0..250 {
                record_delivery_latency("email", "low", 0, ms);
            }
            // 150 metrics of one label set: two documents.
            for i in 0..150 {
                metrics::counter!(format!("tidings_test_{i}"), "queue" => "email-low").increment(1);
            }
            // 40 labels: 30 dimensions, the rest as properties.
            let labels: Vec<metrics::Label> = (0..40).map(|i| metrics::Label::new(format!("l{i:02}"), "v")).collect();
            metrics::counter!("tidings_wide", labels).increment(1);
        });
        let docs = docs(&r);
        let latency: Vec<&Value> = docs.iter().filter(|d| d.get(DELIVERY_LATENCY_MS).is_some()).collect();
        let sizes: Vec<usize> = latency.iter().map(|d| d[DELIVERY_LATENCY_MS].as_array().unwrap().len()).collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        let tests: Vec<&Value> =
            docs.iter().filter(|d| d.get("tidings_test_0").is_some() || d.get("tidings_test_149").is_some()).collect();
        assert!(!tests.is_empty());
        for d in &docs {
            let directive = &d["_aws"]["CloudWatchMetrics"][0];
            let metrics = directive["Metrics"].as_array().unwrap();
            assert!(metrics.len() <= 100, "{} metrics", metrics.len());
            for m in metrics {
                assert!(d.get(m["Name"].as_str().unwrap()).is_some(), "{m} has its value");
            }
            for set in directive["Dimensions"].as_array().unwrap() {
                let set = set.as_array().unwrap();
                assert!(set.len() <= 30, "{} dimensions", set.len());
                for dim in set {
                    assert!(d[dim.as_str().unwrap()].is_string(), "{dim} has its value");
                }
            }
        }
        let counted: usize = docs
            .iter()
            .map(|d| {
                d["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["Name"].as_str().unwrap().starts_with("tidings_test_"))
                    .count()
            })
            .sum();
        assert_eq!(counted, 150);
        let wide = docs.iter().find(|d| d.get("tidings_wide").is_some()).unwrap();
        assert_eq!(wide["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0].as_array().unwrap().len(), 30);
        assert_eq!(wide["label_l39"], "v");
    }

    #[test]
    fn a_second_recorder_sees_every_metric() {
        let (mine, other) = (Arc::new(LocalRecorder::default()), Arc::new(LocalRecorder::default()));
        let both = Shared { local: mine.clone(), also: Some(Box::new(Shared { local: other.clone(), also: None })) };
        metrics::with_local_recorder(&both, || {
            metrics::counter!(RETRIES, "channel" => "sms").increment(2);
            metrics::gauge!(WORKERS_BUSY, "queue" => "sms-low").set(1.0);
            record_delivery_latency("sms", "low", 0, 7);
        });
        for r in [mine, other] {
            let rep = r.report();
            assert_eq!(rep.retries, 2);
            assert_eq!(rep.worker_concurrency.get("sms-low"), Some(&1.0));
            assert_eq!(rep.latency_ms["sms"]["low"].max_ms, 7.0);
        }
    }
}
