//! `tidings bench reserve`: many concurrent single-unit orders against one SKU, plain or sharded,
//! on the embedded backend (a fresh SQLite file) or with `--backend aws` on the DynamoDB of the
//! environment (DynamoDB Local on this machine; a fresh SKU each run). Reports orders per second
//! and latency, the refusals and the orders tried again, and checks the invariants at the end:
//! exactly the stock is sold, counters equal the ledger, and reconciliation finds nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tidings_core::dev::NullProvider;
use tidings_core::inventory::{self, OrderLine, OrderRequest, WarmUpRequest};
use tidings_core::ports::{Provider, SystemClock};
use tidings_core::{CoreError, Deps, Providers, TenantId};

use crate::BackendKind;
use crate::bench_peer::{self, PeerArgs, PeerFigure};
use crate::progress::Progress;

/// How often one order is tried again after the store answered that it is busy (a transaction
/// conflict `place_order` did not absorb itself, or a throttle): what a shop's client does with
/// a 503, with the same order id, so a retry never holds twice.
const MAX_TRIES: u32 = 20;

#[derive(clap::Args, Clone, Debug)]
pub struct ReserveArgs {
    /// Orders to place (one unit each).
    #[arg(long, default_value_t = 20_000)]
    pub orders: u64,
    /// Units in stock.
    #[arg(long, default_value_t = 10_000)]
    pub units: i64,
    /// Orders in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: u64,
    /// Shards of the SKU's counter (1: unsharded).
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// Where the orders go: a fresh embedded database, or the AWS backend of the environment
    /// (`AWS_ENDPOINT_URL_DYNAMODB` and `TIDINGS_TABLE`; a build with `--features aws`).
    #[arg(long, value_enum, default_value = "embedded")]
    pub backend: BackendKind,
    /// With `--backend aws`: create the table and queues first where they are missing.
    #[arg(long)]
    pub bootstrap: bool,
    /// Seconds each peer runs (`reserve-peers.sh SECONDS CLIENTS`, clients: `--concurrency`).
    #[arg(long, default_value_t = 10)]
    pub peer_seconds: u64,
    /// Drive `POST /v1/orders` of a `tidings serve` started for the run (embedded backend) over
    /// loopback with `wrk`, instead of calling the core in process (`--connections`, `--seconds`).
    #[arg(long)]
    pub http: bool,
    #[command(flatten)]
    pub http_args: crate::bench_http::HttpArgs,
    #[command(flatten)]
    pub peer: PeerArgs,
}

/// `--runs` times: the peers (`reserve-peers.sh`: the Redis Lua gate and PostgreSQL's
/// conditional UPDATE with a ledger row, as many clients as orders in flight here), then the
/// orders, each on its own; each run's figures and ratios, and with more than one run their
/// spread.
pub async fn reserve(args: ReserveArgs) -> anyhow::Result<()> {
    if args.http {
        return crate::bench_http::reserve(args).await;
    }
    let dir = bench_peer::peer_dir(&args.peer);
    let runs = args.peer.runs;
    let mut rates = Vec::new();
    let names = bench_peer::reserve_figures();
    let mut ratios: Vec<Vec<f64>> = names.iter().map(|_| Vec::new()).collect();
    let mut peer_rates: Vec<Vec<f64>> = ratios.clone();
    for run in 1..=runs {
        let peer_args = vec![args.peer_seconds.max(1).to_string(), args.concurrency.max(1).to_string()];
        let peers = bench_peer::measure_reserve(dir.clone(), peer_args).await;
        if runs > 1 {
            println!("run {run} of {runs}");
        }
        let rate = reserve_once(&args, &peers).await?;
        for (i, peer) in peers.iter().enumerate() {
            ratios[i].extend(peer.ratio(rate));
            peer_rates[i].extend(peer.per_s());
        }
        rates.push(rate);
    }
    if runs > 1 {
        println!("spread over {runs} runs: orders/s {}", bench_peer::spread_text(&rates));
        for (i, name) in names.iter().enumerate() {
            if ratios[i].is_empty() {
                println!("  {name}: skipped");
            } else {
                let (rate, ratio) = (bench_peer::spread_text(&peer_rates[i]), bench_peer::spread_text(&ratios[i]));
                println!("  {name}: ops/s {rate}, ratio {ratio}");
            }
        }
    }
    Ok(())
}

/// Where one run places its orders: the ports, the SKU and the prefix of its order ids.
struct Target {
    deps: Deps,
    sku: String,
    orders: String,
}

/// A fresh SQLite file in `tmp`, or the AWS backend with a SKU of its own for this run.
async fn target(args: &ReserveArgs, tmp: &tempfile::TempDir) -> anyhow::Result<Target> {
    let clock = Arc::new(SystemClock);
    if args.backend == BackendKind::Aws {
        let backend_args = crate::BackendArgs {
            data_dir: tmp.path().to_path_buf(),
            backend: BackendKind::Aws,
            bootstrap: args.bootstrap,
            data_dir_from: None,
        };
        // The signing key in the run's temporary directory.
        let store = crate::backend::StoreUse::MakeWhenMissing;
        let backend = crate::backend::Backend::open_for(&backend_args, clock, false, store, None).await?;
        let run = format!("{:x}", chrono::Utc::now().timestamp_micros());
        return Ok(Target { deps: backend.deps, sku: format!("hot-{run}"), orders: format!("{run}-o") });
    }
    let path = tmp.path().join("bench.db");
    let store = tidings_embedded::EmbeddedStore::open_with_clock(&path, clock.clone())
        .with_context(|| format!("opening {}", path.display()))?;
    // What `tidings serve` records of the changes (the relay's filter).
    store.set_stream_filter(tidings_core::notify::relay::streamed_change);
    store.declare_queue(tidings_embedded::QueueConfig::new("timers", 5))?;
    let null: Arc<dyn Provider> = Arc::new(NullProvider);
    let providers = Providers { email: null.clone(), sms: null.clone(), push: null };
    let deps = Deps::new(Arc::new(store.clone()), Arc::new(store), clock, providers, crate::settings().core());
    Ok(Target { deps, sku: "hot".into(), orders: "o".into() })
}

/// One order, tried again (same id) while the store answers that it is busy: whether it was
/// accepted, and how many times it was tried again.
async fn place(deps: &Deps, t: &TenantId, req: &OrderRequest) -> anyhow::Result<(bool, u32)> {
    let mut retried = 0;
    loop {
        match inventory::place_order(deps, t, req).await {
            Ok(_) => return Ok((true, retried)),
            Err(CoreError::Conflict { code: "insufficient_stock", .. }) => return Ok((false, retried)),
            Err(e) if e.is_retryable() && retried + 1 < MAX_TRIES => {
                retried += 1;
                tokio::time::sleep(Duration::from_millis(u64::from(retried.min(10)) * 5)).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("order {} after {retried} retries", req.order_id)));
            }
        }
    }
}

/// One run: orders/s (rounded), the invariants checked, beside `peers`.
async fn reserve_once(args: &ReserveArgs, peers: &[PeerFigure]) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir()?;
    let Target { deps, sku, orders: prefix } = target(args, &tmp).await?;
    let t = TenantId::parse("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let shards = (args.shards > 1).then_some(args.shards);
    inventory::warm_up(&deps, &t, &sku, &WarmUpRequest { on_hand: args.units, shards, category: None }).await?;

    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (deps, t, next, accepted, refused, retries) =
            (deps.clone(), t.clone(), next.clone(), accepted.clone(), refused.clone(), retries.clone());
        let (total, sku, prefix) = (args.orders, sku.clone(), prefix.clone());
        workers.spawn(async move {
            let mut timings = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(timings);
                }
                let req = OrderRequest {
                    order_id: format!("{prefix}{i}"),
                    user_id: format!("u{i}"),
                    items: vec![OrderLine { sku_id: sku.clone(), qty: 1, unit_price: None }],
                    hold_seconds: None,
                    category: None,
                    market: None,
                };
                let at = Instant::now();
                let (ok, retried) = place(&deps, &t, &req).await?;
                retries.fetch_add(u64::from(retried), Ordering::Relaxed);
                if ok { &accepted } else { &refused }.fetch_add(1, Ordering::Relaxed);
                timings.push(Timing { started: at, ended: Instant::now(), accepted: ok });
            }
        });
    }
    let progress = Arc::new(Progress::bar("reserve", args.orders, "orders"));
    let report_progress = |progress: &Progress| {
        let (a, r) = (accepted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
        progress.set(a + r, format!("{a} accepted, {r} refused"));
    };
    let ticker = {
        let (progress, accepted, refused) = (progress.clone(), accepted.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let (a, r) = (accepted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
                progress.set(a + r, format!("{a} accepted, {r} refused"));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut timings = Vec::new();
    let joined = async {
        while let Some(done) = workers.join_next().await {
            timings.extend(done??);
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    ticker.abort();
    joined?;
    let elapsed = started.elapsed().as_secs_f64();
    report_progress(&progress);
    // A refusal that ended before the last accepted order began was refused while a unit was
    // still there to sell: what a sharded counter must not do (a short shard is not a short SKU).
    let last_sale = timings.iter().filter(|o| o.accepted).map(|o| o.started).max();
    let early = timings.iter().filter(|o| !o.accepted && last_sale.is_some_and(|l| o.ended < l)).count();
    let mut latencies: Vec<f64> =
        timings.iter().map(|o| o.ended.duration_since(o.started).as_secs_f64() * 1000.0).collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);

    let stock = inventory::get_stock(&deps, &t, &sku).await?.context("the SKU is gone")?;
    let report = inventory::reconcile(&deps, Some(&t)).await?;
    let discrepancies: Vec<_> = report.discrepancies.iter().filter(|d| d.sku_id == sku).collect();
    let (accepted, refused) = (accepted.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    let want = args.orders.min(u64::try_from(args.units).unwrap_or(0));
    println!(
        "orders: {} placed by {} at once, {} unit(s) in stock, {} shard(s), SKU {sku} of tenant {t} on the {} backend",
        args.orders,
        args.concurrency,
        args.units,
        args.shards,
        if args.backend == BackendKind::Aws { "aws" } else { "embedded" }
    );
    let rate = (args.orders as f64 / elapsed).round();
    println!("time: {elapsed:.1} s, {rate:.0} orders/s");
    println!("latency: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", pct(0.5), pct(0.99), pct(1.0));
    println!(
        "accepted {accepted}, refused {refused} ({early} while stock remained), tried again {}; stock available {}, reserved {}; reconcile: {} discrepancies",
        retries.load(Ordering::Relaxed),
        stock.available,
        stock.reserved,
        discrepancies.len()
    );
    anyhow::ensure!(accepted == want, "accepted {accepted}, expected exactly {want}");
    anyhow::ensure!(stock.reserved == i64::try_from(want)?, "reserved {} != {want}", stock.reserved);
    anyhow::ensure!(discrepancies.is_empty(), "reconcile found {discrepancies:?}");
    anyhow::ensure!(early == 0, "{early} order(s) refused while stock remained");
    println!("invariants hold: never oversold, counters = ledger");
    let beside: Vec<String> = peers.iter().map(|p| p.summary(rate)).collect();
    for line in &beside {
        println!("{line}");
    }
    progress.finish(format!(
        "placed {} orders in {elapsed:.1} s ({rate:.0}/s): {accepted} accepted, {refused} refused, never oversold; {}",
        args.orders,
        beside.join("; ")
    ));
    Ok(rate)
}

/// When one order began and ended, and whether it was accepted.
struct Timing {
    started: Instant,
    ended: Instant,
    accepted: bool,
}
