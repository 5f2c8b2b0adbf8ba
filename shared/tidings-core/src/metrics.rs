//! Metrics, through the `metrics` facade (seed 003, "上线后看什么": oldest pending age, sends per
//! second, 429 ratio, retries and dead letters, worker concurrency).
//!
//! The core only emits (`metrics::counter!(..)`); what records them is the wiring's choice:
//! [`LocalRecorder`] keeps them in process, for `GET /v1/ops/metrics` under `tidings serve` and
//! for the CloudWatch embedded metric format ([`LocalRecorder::emf`]) that a Lambda function
//! prints at the end of an invocation.

use std::collections::{BTreeMap, VecDeque};
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
/// Messages being handled right now, label `queue` (gauge).
pub const WORKERS_BUSY: &str = "tidings_workers_busy";
/// Age of the oldest message of a queue in seconds, label `queue` (gauge).
pub const QUEUE_OLDEST_AGE: &str = "tidings_queue_oldest_age_s";
/// Requests made to AWS by the adapters, labels `service` and `operation` (one per attempt).
pub const AWS_REQUESTS: &str = "tidings_aws_requests";
/// Receives that found no message (idle polling), label `queue`.
pub const EMPTY_RECEIVES: &str = "tidings_empty_receives";
/// Waits at a rate gate in milliseconds, label `gate` (histogram: count and sum).
pub const GATE_WAIT_MS: &str = "tidings_gate_wait_ms";

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

/// A histogram kept as count, sum and max (enough for a mean and a worst case).
#[derive(Debug, Default)]
struct HistogramCell {
    count: AtomicU64,
    sum_bits: AtomicU64,
    max_bits: AtomicU64,
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
    }
}

#[derive(Default)]
struct Cells {
    counters: BTreeMap<MetricKey, Arc<AtomicU64>>,
    gauges: BTreeMap<MetricKey, Arc<GaugeCell>>,
    histograms: BTreeMap<MetricKey, Arc<HistogramCell>>,
}

/// An in-process recorder: atomics per metric, read by snapshots.
#[derive(Default)]
pub struct LocalRecorder {
    cells: Mutex<Cells>,
    /// Counter totals at recent reads, for rates over the last few seconds.
    samples: Mutex<VecDeque<(Instant, BTreeMap<MetricKey, u64>)>>,
    /// Counter totals at the last EMF flush.
    flushed: Mutex<BTreeMap<MetricKey, u64>>,
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
        Counter::from_arc(cells.counters.entry(key_of(key)).or_default().clone())
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        Gauge::from_arc(cells.gauges.entry(key_of(key)).or_default().clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        Histogram::from_arc(cells.histograms.entry(key_of(key)).or_default().clone())
    }
}

static GLOBAL: OnceLock<Arc<LocalRecorder>> = OnceLock::new();

/// A recorder shared through an `Arc` (the facade takes ownership of what it is given).
struct Shared(Arc<LocalRecorder>);

impl Recorder for Shared {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}

/// Installs the process's recorder (once; later calls return the same one).
pub fn install() -> Arc<LocalRecorder> {
    GLOBAL
        .get_or_init(|| {
            let recorder = Arc::new(LocalRecorder::default());
            // Fails only when another recorder was installed first; then this one stays empty.
            let _ = metrics::set_global_recorder(Shared(recorder.clone()));
            recorder
        })
        .clone()
}

/// The installed recorder, if any.
pub fn installed() -> Option<Arc<LocalRecorder>> {
    GLOBAL.get().cloned()
}

/// One read of every metric.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    pub counters: Vec<(MetricKey, u64)>,
    pub gauges: Vec<(MetricKey, f64)>,
    /// `(count, sum, max)`.
    pub histograms: Vec<(MetricKey, (u64, f64, f64))>,
}

/// What `GET /v1/ops/metrics` shows.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Report {
    /// Accepted sends per second per channel, over the last few seconds.
    pub sends_per_s: BTreeMap<String, f64>,
    /// Accepted sends per channel since the process started.
    pub sends_total: BTreeMap<String, u64>,
    /// Share of provider calls answered 429, per channel (0 when there were none).
    pub throttled_ratio: BTreeMap<String, f64>,
    /// Calls refused by an open circuit breaker, per provider.
    pub breaker_refusals: BTreeMap<String, u64>,
    pub retries: u64,
    pub dead_letters: u64,
    /// Messages being handled now, per queue.
    pub worker_concurrency: BTreeMap<String, f64>,
    /// Age of the oldest message per queue, seconds.
    pub oldest_age_s: BTreeMap<String, f64>,
    /// Time spent waiting at each rate gate: `{count, mean_ms, max_ms}`.
    pub gate_waits: BTreeMap<String, serde_json::Value>,
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

/// The window over which rates are computed.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl LocalRecorder {
    pub fn snapshot(&self) -> Snapshot {
        let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        Snapshot {
            counters: cells.counters.iter().map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed))).collect(),
            gauges: cells
                .gauges
                .iter()
                .map(|(k, v)| (k.clone(), f64::from_bits(v.0.load(Ordering::Relaxed))))
                .collect(),
            histograms: cells
                .histograms
                .iter()
                .map(|(k, h)| {
                    let v = (
                        h.count.load(Ordering::Relaxed),
                        f64::from_bits(h.sum_bits.load(Ordering::Relaxed)),
                        f64::from_bits(h.max_bits.load(Ordering::Relaxed)),
                    );
                    (k.clone(), v)
                })
                .collect(),
        }
    }

    /// The operators' report; rates are over the last [`RATE_WINDOW`] of reads (the first read
    /// after a quiet spell gives the rate since the previous one).
    pub fn report(&self) -> Report {
        let snap = self.snapshot();
        let now = Instant::now();
        let totals: BTreeMap<MetricKey, u64> = snap.counters.iter().cloned().collect();
        let (base_at, base) = {
            let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            while samples.len() > 1 && samples.get(1).is_some_and(|(at, _)| now.duration_since(*at) >= RATE_WINDOW) {
                samples.pop_front();
            }
            let base = samples.front().cloned();
            samples.push_back((now, totals.clone()));
            base.unwrap_or((now, BTreeMap::new()))
        };
        let secs = now.duration_since(base_at).as_secs_f64();
        let mut r = Report::default();
        let mut calls: BTreeMap<String, u64> = BTreeMap::new();
        let mut throttled: BTreeMap<String, u64> = BTreeMap::new();
        for (k, v) in &totals {
            let channel = k.label("channel").unwrap_or("-").to_owned();
            match k.name.as_str() {
                PROVIDER_CALLS => {
                    let result = k.label("result").unwrap_or("");
                    if result != "open" {
                        *calls.entry(channel.clone()).or_default() += v;
                    }
                    match result {
                        "ok" => {
                            *r.sends_total.entry(channel.clone()).or_default() += v;
                            let before = base.get(k).copied().unwrap_or(0);
                            let rate = if secs > 0.0 { v.saturating_sub(before) as f64 / secs } else { 0.0 };
                            *r.sends_per_s.entry(channel).or_default() += rate;
                        }
                        "throttled" => *throttled.entry(channel).or_default() += v,
                        "open" => {
                            *r.breaker_refusals.entry(k.label("provider").unwrap_or("-").to_owned()).or_default() += v
                        }
                        _ => {}
                    }
                }
                RETRIES => r.retries += v,
                DEAD_LETTERS => r.dead_letters += v,
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
        for (channel, n) in calls {
            let t = throttled.get(&channel).copied().unwrap_or(0);
            r.throttled_ratio.insert(channel, if n == 0 { 0.0 } else { t as f64 / n as f64 });
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
        for (k, (count, sum, max)) in &snap.histograms {
            if k.name == GATE_WAIT_MS {
                let mean = if *count == 0 { 0.0 } else { sum / *count as f64 };
                r.gate_waits.insert(
                    k.label("gate").unwrap_or("-").to_owned(),
                    serde_json::json!({"count": count, "mean_ms": mean, "max_ms": max}),
                );
            }
        }
        r
    }

    /// The counters' increase since the last flush and the gauges' values, as one CloudWatch
    /// embedded-metric-format line (`None` when nothing changed): printed on stdout by a Lambda
    /// function, CloudWatch Logs turns it into metrics without any API call.
    pub fn emf(&self, namespace: &str, timestamp_ms: i64) -> Option<String> {
        let snap = self.snapshot();
        let mut flushed = self.flushed.lock().unwrap_or_else(|p| p.into_inner());
        let mut doc = serde_json::Map::new();
        let mut defs = Vec::new();
        for (k, v) in &snap.counters {
            let before = flushed.insert(k.clone(), *v).unwrap_or(0);
            let delta = v.saturating_sub(before);
            if delta == 0 {
                continue;
            }
            let name = emf_name(k);
            doc.insert(name.clone(), delta.into());
            defs.push(serde_json::json!({"Name": name, "Unit": "Count"}));
        }
        for (k, v) in &snap.gauges {
            let name = emf_name(k);
            doc.insert(name.clone(), serde_json::json!(v));
            defs.push(serde_json::json!({"Name": name, "Unit": "None"}));
        }
        if defs.is_empty() {
            return None;
        }
        doc.insert(
            "_aws".into(),
            serde_json::json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{"Namespace": namespace, "Dimensions": [[]], "Metrics": defs}],
            }),
        );
        serde_json::to_string(&serde_json::Value::Object(doc)).ok()
    }
}

/// A flat metric name with its labels (`tidings_provider_calls.channel=email.result=ok`).
fn emf_name(k: &MetricKey) -> String {
    let mut s = k.name.clone();
    for (l, v) in &k.labels {
        s.push('.');
        s.push_str(l);
        s.push('=');
        s.push_str(v);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_counts_sends_and_throttles() {
        let r = LocalRecorder::default();
        metrics::with_local_recorder(&r, || {
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "result" => "ok").increment(3);
            metrics::counter!(PROVIDER_CALLS, "channel" => "email", "result" => "throttled").increment(1);
            metrics::counter!(RETRIES, "channel" => "email").increment(2);
            metrics::gauge!(WORKERS_BUSY, "queue" => "email-low").set(4.0);
        });
        let rep = r.report();
        assert_eq!(rep.sends_total.get("email"), Some(&3));
        assert_eq!(rep.throttled_ratio.get("email"), Some(&0.25));
        assert_eq!(rep.retries, 2);
        assert_eq!(rep.worker_concurrency.get("email-low"), Some(&4.0));
        let emf = r.emf("Tidings", 1).unwrap();
        assert!(emf.contains("\"CloudWatchMetrics\""), "{emf}");
        assert!(emf.contains("tidings_provider_calls.channel=email.result=ok\":3"), "{emf}");
    }
}
