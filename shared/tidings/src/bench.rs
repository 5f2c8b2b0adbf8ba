//! `tidings bench campaign --recipients N`: a campaign to N users on the embedded backend (a
//! fresh SQLite file in a temporary directory), through the real relay, orchestrator, channel
//! workers and gates, with a fake provider that answers at once. Meanwhile a transactional
//! message (an OTP) is accepted every 100 ms; its latency from accepted to the provider is the
//! priority-isolation figure. At the end every recipient must have been sent exactly one
//! message.
//!
//! `--flood`: the audit's neighbour instead of a campaign (docs/delivery.md, "Fair lanes"). The
//! recipients' tenant sends them transactional notifications of 1,000 users each, asking for
//! `high`, all at once; the OTPs alternate between another tenant and the flooding one itself.
//! Their accepted → provider p99 is the figure: neither may wait for the flood.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_trait::async_trait;
use serde_json::json;
use tidings_core::gates::{self, GateStore};
use tidings_core::keys;
use tidings_core::lanes::{Lane, Urgency};
use tidings_core::notify::api;
use tidings_core::people::devices::{self, Device};
use tidings_core::people::users::User;
use tidings_core::ports::{
    Channel, Cond, Item, OutboundMessage, Platform, Provider, ProviderError, ProviderReceipt, SystemClock, Table,
    Write, attrs_of,
};
use tidings_core::{CoreConfig, Deps, Providers, TenantId, templates};

use crate::bench_peer::{self, PeerArgs, PeerFigure, QUEUE_PEER};
use crate::progress::Progress;

#[derive(clap::Args, Clone, Debug)]
pub struct CampaignArgs {
    /// Users in the segment.
    #[arg(long, default_value_t = 100_000)]
    pub recipients: u64,
    /// Where to put the database (default: a temporary directory, removed afterwards).
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Workers per low-priority queue (default: TIDINGS_WORKERS_LOW or 16).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Milliseconds between two transactional messages sent while the campaign drains.
    #[arg(long, default_value_t = 100)]
    pub otp_every_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_s: u64,
    /// The campaign's channel: `email` (a delivery item per recipient) or `push` (each user
    /// with one iOS device; marketing push goes out in send batches of up to 25).
    #[arg(long, value_enum, default_value = "email")]
    pub channel: BenchChannel,
    /// A neighbour's flood instead of a campaign: transactional sends of 1,000 recipients each
    /// asking for `high`, with OTPs of another tenant and of the flooding one meanwhile.
    #[arg(long)]
    pub flood: bool,
    #[command(flatten)]
    pub peer: PeerArgs,
}

/// Recipients per request of a `--flood` (the most a `user_ids` list may hold).
const FLOOD_SEND: u64 = 1000;

const TAG: &str = "bench";

/// The channels a bench campaign can go out on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchChannel {
    Email,
    Push,
}

impl BenchChannel {
    fn channel(self) -> Channel {
        match self {
            BenchChannel::Email => Channel::Email,
            BenchChannel::Push => Channel::Push,
        }
    }
}

/// The fake provider: one byte per campaign recipient (how many times it was sent), and the
/// accepted → provider latency of each transactional message.
struct BenchProvider {
    sends: Vec<AtomicU8>,
    delivered: AtomicU64,
    otp: Mutex<OtpBook>,
}

fn user_id(i: u64) -> String {
    format!("b{i:08}")
}

#[async_trait]
impl Provider for BenchProvider {
    fn name(&self) -> &str {
        "bench"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        if let Some(i) = m.user_id.strip_prefix('b').and_then(|n| n.parse::<usize>().ok())
            && let Some(slot) = self.sends.get(i)
        {
            slot.fetch_add(1, Ordering::Relaxed);
            self.delivered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.otp.lock().unwrap_or_else(|p| p.into_inner()).sent(&m.notification_id);
        }
        Ok(ProviderReceipt { provider_message_id: m.idempotency_key.clone() })
    }
}

/// The transactional messages sent while a campaign drains: when each was accepted, and its
/// accepted → provider latency once it reached the provider. One that reaches the provider
/// before the bench has noted its acceptance (its task resumed late, on cores a campaign keeps
/// busy) is kept in `sent_early` until it is noted: left out, it was neither counted nor waited
/// for.
#[derive(Default)]
struct OtpBook {
    accepted: HashMap<String, Instant>,
    sent_early: HashMap<String, Instant>,
    latencies_ms: Vec<f64>,
}

impl OtpBook {
    /// The provider got `notification_id`'s message now.
    fn sent(&mut self, notification_id: &str) {
        match self.accepted.remove(notification_id) {
            Some(at) => self.latencies_ms.push(at.elapsed().as_secs_f64() * 1000.0),
            None => {
                self.sent_early.insert(notification_id.to_owned(), Instant::now());
            }
        }
    }

    /// `notification_id` was accepted at `at` (its answer came back now).
    fn accepted(&mut self, notification_id: String, at: Instant) {
        match self.sent_early.remove(&notification_id) {
            Some(sent) => self.latencies_ms.push(sent.duration_since(at).as_secs_f64() * 1000.0),
            None => {
                self.accepted.insert(notification_id, at);
            }
        }
    }
}

/// Peak resident set size of this process (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Writes the users and their tag memberships directly (with a push campaign, each user's
/// device too), 100 writes or fewer per transaction.
pub(crate) async fn seed_users(
    table: &dyn Table,
    t: &TenantId,
    n: u64,
    channel: BenchChannel,
    progress: &Progress,
) -> anyhow::Result<()> {
    progress.set(0, "");
    let mut writes = Vec::with_capacity(100);
    for i in 0..n {
        let id = user_id(i);
        let user = User {
            user_id: id.clone(),
            email: Some(format!("{id}@example.com")),
            tags: vec![TAG.into()],
            updated_at: "2026-01-01T00:00:00.000Z".into(),
            ..Default::default()
        };
        let attrs = attrs_of(&user)?;
        let mut profile = attrs.clone();
        profile.insert("rev".into(), 1.into());
        writes.push(Write::Put { item: Item::new(keys::user(t, &id), profile), cond: Cond::Always });
        writes.push(Write::Put { item: Item::new(keys::tag_member(t, TAG, &id), attrs), cond: Cond::Always });
        if channel == BenchChannel::Push {
            // The device as `POST /v1/devices` keeps it (the provider's address: the token itself).
            let token = format!("bench-token-{id}");
            let device = Device {
                user_id: id.clone(),
                platform: Platform::Ios,
                address: token.clone(),
                token: token.clone(),
                created_at: "2026-01-01T00:00:00.000Z".into(),
            };
            let key = keys::device(t, &id, &devices::token_hash(&token));
            writes.push(Write::Put { item: Item::new(key, attrs_of(&device)?), cond: Cond::Always });
        }
        if writes.len() >= 99 {
            table.transact(std::mem::take(&mut writes)).await?;
            progress.set(i + 1, "");
        }
    }
    if !writes.is_empty() {
        table.transact(writes).await?;
    }
    progress.set(n, "");
    Ok(())
}

/// `--runs` times: the peer (`queue-peer.sh N 8`, a PostgreSQL queue's claim and mark of as many
/// tasks), then the campaign, each on its own. One run prints its report; more print each run's
/// and the spread of Tidings' figure, the peer's and the ratio.
pub async fn campaign(args: CampaignArgs) -> anyhow::Result<()> {
    let dir = bench_peer::peer_dir(&args.peer);
    let runs = args.peer.runs;
    let mut reports = Vec::new();
    for run in 1..=runs {
        let peer_args = vec![args.recipients.to_string(), "8".into()];
        let peer = bench_peer::measure(dir.clone(), &QUEUE_PEER, peer_args).await.into_iter().next();
        let peer = peer.unwrap_or_else(|| PeerFigure::Skipped { name: "queue-peer".into(), why: "no figure".into() });
        let label = if runs > 1 { format!("run {run} of {runs}: ") } else { String::new() };
        let db = if run == 1 { "bench.db".to_owned() } else { format!("bench-{run}.db") };
        reports.push(campaign_once(&args, &db, &peer, &label).await?);
    }
    if let [report] = reports.as_slice() {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let figure = |key: &str| reports.iter().filter_map(|r| r[key].as_f64()).collect::<Vec<_>>();
    let peers: Vec<f64> = reports.iter().filter_map(|r| r["peer"]["per_s"].as_f64()).collect();
    let (sends, ratios) = (bench_peer::spread(&figure("sends_per_s")), bench_peer::spread(&figure("ratio")));
    eprintln!(
        "campaign: {runs} runs: {}/s median ({} to {}); ratio median {} ({} to {})",
        sends["median"], sends["min"], sends["max"], ratios["median"], ratios["min"], ratios["max"]
    );
    let report = json!({
        "runs": reports,
        "spread": {"sends_per_s": sends, "peer_per_s": bench_peer::spread(&peers), "ratio": ratios},
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// One campaign on a fresh database: its report, with `peer` and `ratio` from `peer`'s figure.
async fn campaign_once(
    args: &CampaignArgs,
    db: &str,
    peer: &PeerFigure,
    label: &str,
) -> anyhow::Result<serde_json::Value> {
    let n = args.recipients;
    let tmp = tempfile::tempdir()?;
    let dir = args.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(db);
    let clock = Arc::new(SystemClock);
    let store = tidings_embedded::EmbeddedStore::open_with_clock(&path, clock.clone())
        .with_context(|| format!("opening {}", path.display()))?;
    // What the relay reads, as the event source mapping filters it on AWS.
    store.set_stream_filter(tidings_core::notify::relay::streamed_change);
    // A campaign is marketing: no frequency cap here (one message per user anyway).
    let config = CoreConfig { frequency_cap: 1_000, ..crate::settings().core() };
    let queue_names = crate::backend::all_queues();
    for q in &queue_names {
        store.declare_queue(tidings_embedded::QueueConfig::new(q.clone(), config.max_receives))?;
    }
    let provider = Arc::new(BenchProvider {
        sends: (0..n).map(|_| AtomicU8::new(0)).collect(),
        delivered: AtomicU64::new(0),
        otp: Mutex::new(OtpBook::default()),
    });
    let p: Arc<dyn Provider> = provider.clone();
    let providers =
        gates::wrap(&Providers { email: p.clone(), sms: p.clone(), push: p }, None, &config.gates, GateStore::Local);
    let table: Arc<dyn Table> = Arc::new(store.clone());
    let deps = Deps::new(table.clone(), Arc::new(store.clone()), clock, providers, config);
    let t = TenantId::parse("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    tidings_core::metrics::install();

    let seeding = Instant::now();
    let progress = Progress::bar("seeding", n, "users");
    seed_users(table.as_ref(), &t, n, args.channel, &progress).await?;
    // The OTPs' tenants: the campaign's own; with `--flood`, another shop's too.
    let neighbour = TenantId::parse("otp-shop").map_err(|e| anyhow::anyhow!("{e}"))?;
    let otp_tenants = if args.flood { vec![neighbour, t.clone()] } else { vec![t.clone()] };
    let template: serde_json::Value = json!({
        "default_locale": "en",
        "locales": {"en": {
            "email_subject": "Sale {{ user_id }}",
            "email_body": "Hello {{ user_id }}, 20% off today",
            "push_title": "Sale {{ user_id }}",
            "push_body": "Hello {{ user_id }}, 20% off today"
        }}
    });
    templates::put_template(&deps, &t, "promo", serde_json::from_value(template.clone())?).await?;
    for ot in &otp_tenants {
        let email = Some("otp@example.com".to_owned());
        let user = tidings_core::people::users::UserInput { email, ..Default::default() };
        tidings_core::people::users::put_user(&deps, ot, "otp-user", user).await?;
        templates::put_template(&deps, ot, "promo", serde_json::from_value(template.clone())?).await?;
    }
    let seeded_s = seeding.elapsed().as_secs_f64();
    progress.finish(format!("seeded {n} users in {seeded_s:.1} s ({})", path.display()));

    let pools = crate::runtime::Pools {
        low: args.workers.unwrap_or_else(|| crate::runtime::Pools::configured().low.max(16)),
        ..crate::runtime::Pools::configured()
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let feed: Arc<dyn tidings_core::ports::ChangeFeed> = Arc::new(store.change_feed("relay"));
    let mut workers = crate::runtime::start_with(
        deps.clone(),
        Arc::new(tidings_core::inbox::live::NoLive),
        feed,
        queue_names.clone(),
        "arn:tidings:embedded:local:0:".into(),
        stop_rx,
        pools,
    );

    let started = Instant::now();
    let watched = if args.flood {
        // The whole flood accepted before the first OTP, as the audit's tenant sent it.
        for first in (0..n).step_by(FLOOD_SEND as usize) {
            let users: Vec<String> = (first..(first + FLOOD_SEND).min(n)).map(user_id).collect();
            let request = serde_json::from_value(json!({
                "idempotency_key": format!("bench-flood-{first}"),
                "recipients": {"user_ids": users},
                "template_id": "promo",
                "category": "transactional",
                "priority": "high",
                "channels": [args.channel.channel().as_str()],
            }))?;
            api::accept(&deps, &t, request).await?;
        }
        None
    } else {
        let request = serde_json::from_value(json!({
            "idempotency_key": "bench-campaign",
            "recipients": {"segment": TAG},
            "template_id": "promo",
            "category": "marketing",
            "channels": [args.channel.channel().as_str()],
        }))?;
        Some(api::accept(&deps, &t, request).await?.notification_id)
    };

    // Transactional messages while the campaign drains.
    let (otp_stop_tx, mut otp_stop_rx) = tokio::sync::watch::channel(false);
    let otp = {
        let (deps, provider) = (deps.clone(), provider.clone());
        let every = Duration::from_millis(args.otp_every_ms.max(1));
        tokio::spawn(async move {
            let mut i = 0u64;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = otp_stop_rx.changed() => return i,
                }
                i += 1;
                let req = serde_json::from_value(json!({
                    "idempotency_key": format!("otp-{i}"),
                    "recipients": {"user_ids": ["otp-user"]},
                    "template_id": "promo",
                    "category": "transactional",
                    "channels": ["email"],
                }));
                let Ok(req) = req else { continue };
                let t = &otp_tenants[(i as usize) % otp_tenants.len()];
                let at = Instant::now();
                match api::accept(&deps, t, req).await {
                    Ok(a) => {
                        provider.otp.lock().unwrap_or_else(|p| p.into_inner()).accepted(a.notification_id, at);
                    }
                    Err(e) => tracing::warn!(error = %e, "otp not accepted"),
                }
            }
        })
    };

    let mut rss_at_100k = None;
    // The rate is over the last 5 s (or less, at the start); a plain line every 5 s, as the
    // drain was always reported.
    let mut window = (Instant::now(), 0u64);
    let deadline = started + Duration::from_secs(args.timeout_s);
    let drain = Progress::bar(if args.flood { "flood" } else { "campaign" }, n, "sent").every(Duration::from_secs(5));
    let (mut depth_read, mut queued): (Option<Instant>, u64) = (None, 0);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let done = provider.delivered.load(Ordering::Relaxed);
        if rss_at_100k.is_none() && done >= n.min(100_000) {
            rss_at_100k = peak_rss_mib();
        }
        let rate = done.saturating_sub(window.1) as f64 / window.0.elapsed().as_secs_f64().max(0.001);
        // The depth only for the progress line, every 5 s: counting the queue reads each of its
        // index entries (half a million while an email campaign drains), and every 500 ms that
        // was the bench's own load on the cores it measures.
        if depth_read.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
            depth_read = Some(Instant::now());
            queued = deps
                .queues
                .stats(Lane::Channel(args.channel.channel(), Urgency::Low).name())
                .await
                .map(|s| s.visible + s.in_flight)
                .unwrap_or(0);
        }
        drain.set(done, format!("{rate:.0}/s, {queued} queued, peak RSS {:.0} MiB", peak_rss_mib().unwrap_or(0.0)));
        if window.0.elapsed() >= Duration::from_secs(5) {
            window = (Instant::now(), done);
        }
        if done >= n || Instant::now() > deadline {
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = otp_stop_tx.send(true);
    let otps = otp.await.unwrap_or(0);
    // The last transactional messages are in flight: give them a moment.
    for _ in 0..40 {
        if provider.otp.lock().unwrap_or_else(|p| p.into_inner()).accepted.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The provider counts a send as it is made, and its delivery is recorded `sent` right after:
    // the campaign's own view is read once those records are in (ten seconds at most), so its
    // counts are the whole campaign's, not a moment inside its last batch.
    let all_sent = provider.delivered.load(Ordering::Relaxed) >= n;
    let view = match &watched {
        Some(id) => {
            let settle_by = Instant::now() + Duration::from_secs(10);
            loop {
                let view = api::get_notification(&deps, &t, id).await?;
                let ended = view.as_ref().is_none_or(|v| !v.status.is_open());
                if ended || !all_sent || Instant::now() >= settle_by {
                    break view;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        None => None,
    };
    let _ = stop_tx.send(true);
    workers.shutdown().await;

    let (mut once, mut dupes, mut missing) = (0u64, 0u64, 0u64);
    for s in &provider.sends {
        match s.load(Ordering::Relaxed) {
            0 => missing += 1,
            1 => once += 1,
            _ => dupes += 1,
        }
    }
    let mut lat = provider.otp.lock().unwrap_or_else(|p| p.into_inner()).latencies_ms.clone();
    lat.sort_by(|a, b| a.total_cmp(b));
    let db_mib = std::fs::metadata(&path).map(|m| m.len() as f64 / 1048576.0).unwrap_or(0.0);
    let sends_per_s = (once as f64 / elapsed).round();
    let report = json!({
        "recipients": n,
        "flood": args.flood,
        "channel": args.channel.channel().as_str(),
        "delivered_once": once,
        "duplicates": dupes,
        "missing": missing,
        "seconds": (elapsed * 10.0).round() / 10.0,
        "sends_per_s": sends_per_s,
        "peer": peer.json(),
        "ratio": peer.ratio(sends_per_s),
        "peak_rss_mib_at_100k": rss_at_100k.map(|v| v.round()),
        "peak_rss_mib_at_end": peak_rss_mib().map(|v| v.round()),
        "transactional": {
            "sent": lat.len(),
            "accepted": otps,
            "p50_ms": (percentile(&lat, 0.50) * 10.0).round() / 10.0,
            "p99_ms": (percentile(&lat, 0.99) * 10.0).round() / 10.0,
            "max_ms": (lat.last().copied().unwrap_or(0.0) * 10.0).round() / 10.0,
        },
        "progress": view.map(|v| json!({"status": v.status, "expanded": v.expanded, "counts": v.counts})),
        "workers_low": pools.low,
        "workers_high": pools.high,
        "database_mib": db_mib.round(),
        "seeding_s": (seeded_s * 10.0).round() / 10.0,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "metrics": tidings_core::metrics::installed().map(|r| r.report()),
    });
    // Queue depths at the end (all should be empty).
    for q in &queue_names {
        let s = deps.queues.stats(q).await?;
        if s.visible + s.in_flight + s.delayed + s.dlq_depth > 0 {
            eprintln!("  queue {q}: {}", serde_json::to_string(&s)?);
        }
    }
    drain.finish(format!(
        "{label}{once} of {n} recipients sent once in {elapsed:.1} s ({sends_per_s:.0}/s), {dupes} more than once, \
         {missing} missing; {} transactional sent meanwhile, p99 {:.1} ms; {}",
        lat.len(),
        percentile(&lat, 0.99),
        peer.summary(sends_per_s),
    ));
    if once != n {
        println!("{}", serde_json::to_string_pretty(&report)?);
        anyhow::bail!("{missing} recipients missing, {dupes} sent more than once");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::OtpBook;

    #[test]
    fn an_otp_sent_before_its_acceptance_was_noted_is_counted_once() {
        let mut book = OtpBook::default();
        let at = Instant::now();
        // The usual order: noted, then sent.
        book.accepted("n1".into(), at);
        book.sent("n1");
        // Sent first (the bench's task resumed late), noted after.
        book.sent("n2");
        let after_send = at.elapsed().as_secs_f64() * 1000.0;
        std::thread::sleep(Duration::from_millis(5));
        book.accepted("n2".into(), at);
        // Noted, never sent: waited for, not counted.
        book.accepted("n3".into(), at);
        assert_eq!(book.latencies_ms.len(), 2);
        assert!(book.sent_early.is_empty());
        assert_eq!(book.accepted.keys().collect::<Vec<_>>(), ["n3"]);
        // n2's latency runs from its acceptance to its send, not to when it was noted.
        assert!(book.latencies_ms[1] <= after_send, "{:?} > {after_send}", book.latencies_ms);
    }
}
