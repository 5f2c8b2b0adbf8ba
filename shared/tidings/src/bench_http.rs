//! `tidings bench reserve --http`: `POST /v1/orders` of a real `tidings serve` (this binary,
//! embedded backend, a fresh data directory) driven over loopback by `wrk` with its Lua script
//! (`orders.lua` of the peer directory: single-unit orders with unique ids on one SKU), one wrk
//! run per connection count, the peers just before in the same run.
//!
//! After each wrk run the server is killed (`SIGKILL`, no shutdown of any kind) and the run reads
//! its database in process: every order wrk saw answered `201` must be there (an answer is given
//! only once its order is on disk), at most one more per connection (requests still in flight
//! when wrk stopped), nothing oversold (available + reserved + sold = on hand), no refusal while
//! units were left, and the SKU's counters equal to its ledger (reconciliation finds nothing).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tidings_core::inventory::{self, WarmUpRequest};
use tidings_core::ports::SystemClock;
use tidings_core::{Deps, TenantId};

use crate::bench_peer::{self, PeerFigure};
use crate::bench_reserve::ReserveArgs;
use crate::progress::Progress;
use crate::{BackendArgs, BackendKind};

/// The SKU the orders go to (the name `orders.lua` is told through `SKU`).
const SKU: &str = "HOT";
/// How long a started server has to answer its first request.
const READY_WITHIN: Duration = Duration::from_secs(60);

#[derive(clap::Args, Clone, Debug)]
pub struct HttpArgs {
    /// With `--http`: wrk's connections, one wrk run for each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub connections: Vec<u64>,
    /// With `--http`: seconds of each wrk run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// With `--http`: wrk's threads.
    #[arg(long, default_value_t = 2)]
    pub wrk_threads: u64,
    /// With `--http`: the load generator (`apt-get install wrk`).
    #[arg(long, default_value = "wrk")]
    pub wrk: PathBuf,
    /// With `--http`: wrk's Lua script (default: `orders.lua` in the peer directory).
    #[arg(long)]
    pub wrk_script: Option<PathBuf>,
    /// With `--http`: skip the floor, the same wrk run against `GET /healthz` (the server's
    /// cheapest answer: no key, no store), measured after each connection count's orders.
    #[arg(long)]
    pub no_floor: bool,
}

/// What plain `wrk --latency` (no script) prints of a run: its rate and its 50th and 99th
/// percentiles (`Requests/sec:`, and the `50%` and `99%` lines of its latency distribution).
#[derive(Clone, Debug, PartialEq)]
pub struct PlainWrk {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Answers that were not 2xx or 3xx (`Non-2xx or 3xx responses:`), and socket errors.
    pub failed: u64,
}

impl PlainWrk {
    pub fn parse(output: &str) -> Option<Self> {
        let mut rps = None;
        let (mut p50, mut p99) = (None, None);
        let mut failed = 0u64;
        for line in output.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["Requests/sec:", n] => rps = n.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0),
                ["50%", t] => p50 = millis(t),
                ["99%", t] => p99 = millis(t),
                ["Non-2xx", "or", "3xx", "responses:", n] => failed += n.parse::<u64>().ok()?,
                ["Socket", "errors:", rest @ ..] => {
                    // `Socket errors: connect 0, read 0, write 0, timeout 0`
                    failed += rest.iter().filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok()).sum::<u64>();
                }
                _ => {}
            }
        }
        Some(PlainWrk { rps: rps?, p50_ms: p50?, p99_ms: p99?, failed })
    }

    /// What share of this floor a rate of `rps` is.
    pub fn share(&self, rps: f64) -> f64 {
        rps / self.rps.max(1.0)
    }
}

/// wrk's durations (`812.00us`, `1.93ms`, `1.20s`) in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    number.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).map(|v| v * scale)
}

/// What `orders.lua` prints when wrk is done:
/// `created N refused N other N p50_ms X p99_ms Y rps Z`.
#[derive(Clone, Debug, PartialEq)]
pub struct WrkFigures {
    pub created: u64,
    pub refused: u64,
    pub other: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rps: f64,
}

impl WrkFigures {
    pub fn parse(output: &str) -> Option<Self> {
        output.lines().find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let field = |name: &str| words.iter().position(|w| *w == name).and_then(|i| words.get(i + 1));
            let int = |name: &str| field(name)?.parse::<u64>().ok();
            let num = |name: &str| field(name)?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
            Some(WrkFigures {
                created: int("created")?,
                refused: int("refused")?,
                other: int("other")?,
                p50_ms: num("p50_ms")?,
                p99_ms: num("p99_ms")?,
                rps: num("rps")?,
            })
        })
    }
}

/// `--runs` times: the peers (`reserve-peers.sh SECONDS C`, C the first connection count, and
/// the durable Redis gate of `infra/bench`), then
/// a wrk run for each connection count on one database; each run's figures and ratios, and with
/// more than one run their spread per connection count.
pub async fn reserve(args: ReserveArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.backend == BackendKind::Embedded, "--http runs `tidings serve` on the embedded backend");
    let http = &args.http_args;
    anyhow::ensure!(!http.connections.is_empty(), "--connections: at least one");
    anyhow::ensure!(
        http.connections.iter().all(|c| *c >= http.wrk_threads.max(1)),
        "--connections: each at least --wrk-threads ({})",
        http.wrk_threads
    );
    let script = wrk_script(&args)?;
    let runs = args.peer.runs;
    let levels = http.connections.len();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); levels];
    // [level][peer] → ratios; [peer] → the peer's figures.
    let names = bench_peer::reserve_figures();
    let mut ratios: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); names.len()]; levels];
    let mut peer_rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    // [level] → the floor's rates, and the orders' share of it.
    let mut floors: Vec<Vec<f64>> = vec![Vec::new(); levels];
    let mut shares: Vec<Vec<f64>> = vec![Vec::new(); levels];
    let mut floor_ratios: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); names.len()]; levels];
    for run in 1..=runs {
        let clients = http.connections[0].to_string();
        let peer_args = vec![args.peer_seconds.max(1).to_string(), clients];
        let peers = bench_peer::measure_reserve(bench_peer::peer_dir(&args.peer), peer_args).await;
        if runs > 1 {
            println!("run {run} of {runs}");
        }
        let figures = once(&args, &script, run, &peers).await?;
        for (level, (f, floor)) in figures.iter().enumerate() {
            rates[level].push(f.rps);
            for (i, peer) in peers.iter().enumerate() {
                ratios[level][i].extend(peer.ratio(f.rps));
            }
            if let Some(floor) = floor {
                floors[level].push(floor.rps);
                shares[level].push(floor.share(f.rps));
                for (i, peer) in peers.iter().enumerate() {
                    floor_ratios[level][i].extend(peer.ratio(floor.rps));
                }
            }
        }
        for (i, peer) in peers.iter().enumerate() {
            peer_rates[i].extend(peer.per_s());
        }
    }
    if runs > 1 {
        for (i, name) in names.iter().enumerate() {
            if !peer_rates[i].is_empty() {
                println!("spread over {runs} runs: {name} ops/s {}", bench_peer::spread_text(&peer_rates[i]));
            }
        }
        for (level, c) in http.connections.iter().enumerate() {
            println!("spread over {runs} runs, {c} connections: orders/s {}", bench_peer::spread_text(&rates[level]));
            for (i, name) in names.iter().enumerate() {
                if !ratios[level][i].is_empty() {
                    println!("  ratio to {name}: {}", bench_peer::spread_text(&ratios[level][i]));
                }
            }
            if !floors[level].is_empty() {
                println!("  floor GET /healthz/s: {}", bench_peer::spread_text(&floors[level]));
                println!("  orders' share of the floor: {}", bench_peer::spread_text(&shares[level]));
                for (i, name) in names.iter().enumerate() {
                    if !floor_ratios[level][i].is_empty() {
                        println!("  floor's ratio to {name}: {}", bench_peer::spread_text(&floor_ratios[level][i]));
                    }
                }
            }
        }
    }
    Ok(())
}

/// `--wrk-script`, else `orders.lua` in the peer directory (looked for even with `--no-peer`).
fn wrk_script(args: &ReserveArgs) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.http_args.wrk_script {
        anyhow::ensure!(path.is_file(), "--wrk-script {}: no such file", path.display());
        return Ok(path.clone());
    }
    let mut peer = args.peer.clone();
    peer.no_peer = false;
    let dir = bench_peer::peer_dir(&peer).map_err(|why| anyhow::anyhow!("no wrk script: --wrk-script, or {why}"))?;
    let path = dir.join("orders.lua");
    anyhow::ensure!(path.is_file(), "no wrk script: --wrk-script, or orders.lua in {}", dir.display());
    Ok(path)
}

/// The embedded backend of `dir`, as `tidings serve` opens it.
async fn open(dir: &Path) -> anyhow::Result<Deps> {
    let args = BackendArgs {
        data_dir: dir.to_path_buf(),
        backend: BackendKind::Embedded,
        bootstrap: false,
        data_dir_from: None,
    };
    let store = crate::backend::StoreUse::MakeWhenMissing;
    Ok(crate::backend::Backend::open_for(&args, Arc::new(SystemClock), false, store, None).await?.deps)
}

/// One run: the SKU warmed up in a fresh data directory, then for each connection count a
/// server started, wrk run against it, the server killed and the database checked.
async fn once(
    args: &ReserveArgs,
    script: &Path,
    run: u32,
    peers: &[PeerFigure],
) -> anyhow::Result<Vec<(WrkFigures, Option<PlainWrk>)>> {
    let http = &args.http_args;
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let t = TenantId::parse("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let shards = (args.shards > 1).then_some(args.shards);
    {
        let deps = open(&dir).await?;
        inventory::warm_up(&deps, &t, SKU, &WarmUpRequest { on_hand: args.units, shards, category: None }).await?;
    }
    let key = tidings_core::ops::tenants::generate_key();
    let mut before = 0i64;
    let mut all = Vec::new();
    for &c in &http.connections {
        let progress = Progress::spinner("reserve");
        let log = tmp.path().join(format!("serve-{c}.log"));
        let (mut server, port) = start_server(&dir, &key, &log).await?;
        progress.step(format!("tidings serve on 127.0.0.1:{port}"));
        progress.step(format!("wrk -t{} -c{c} -d{}s", http.wrk_threads, http.seconds));
        let script_args = [OsString::from("-s"), script.as_os_str().to_owned()];
        let env = [("KEY", key.clone()), ("SKU", SKU.to_owned()), ("RUN", format!("r{run}c{c}"))];
        // No shutdown: what was answered must already be on disk.
        let stdout = run_wrk(http, c, &mut server, &script_args, &env, format!("http://127.0.0.1:{port}")).await?;
        let wrk_name = http.wrk.display().to_string();
        let f = WrkFigures::parse(&stdout).with_context(|| format!("{wrk_name} printed no figures: {stdout}"))?;

        let deps = open(&dir).await?;
        let stock = inventory::get_stock(&deps, &t, SKU).await?.context("the SKU is gone")?;
        let report = inventory::reconcile(&deps, Some(&t)).await?;
        let discrepancies: Vec<_> = report.discrepancies.iter().filter(|d| d.sku_id == SKU).collect();
        drop(deps);
        let held = stock.reserved - before;
        before = stock.reserved;
        let secs = http.seconds.max(1);
        println!(
            "http: {c} connections, {secs} s: {:.0} orders/s, latency p50 {:.1} ms, p99 {:.1} ms",
            f.rps, f.p50_ms, f.p99_ms
        );
        println!(
            "  answered 201 {}, 409 {}, other {}; after kill -9: {held} held by this run, available {}, reserved {}, sold {}; reconcile: {} discrepancies",
            f.created,
            f.refused,
            f.other,
            stock.available,
            stock.reserved,
            stock.sold,
            discrepancies.len()
        );
        anyhow::ensure!(f.other == 0, "{} answers were neither 201 nor 409 (see {})", f.other, log.display());
        let created = i64::try_from(f.created)?;
        anyhow::ensure!(held >= created, "{created} orders answered 201 but {held} on disk after kill -9");
        anyhow::ensure!(
            held <= created + i64::try_from(c)?,
            "{held} orders on disk, more than the {created} answered 201 and {c} in flight"
        );
        anyhow::ensure!(
            stock.available + stock.reserved + stock.sold == args.units && stock.available >= 0,
            "oversold: available {} + reserved {} + sold {} != on hand {}",
            stock.available,
            stock.reserved,
            stock.sold,
            args.units
        );
        anyhow::ensure!(
            f.refused == 0 || stock.available == 0,
            "{} orders refused while {} units were left",
            f.refused,
            stock.available
        );
        anyhow::ensure!(discrepancies.is_empty(), "reconcile found {discrepancies:?}");
        let beside: Vec<String> = peers.iter().map(|p| p.summary(f.rps)).collect();
        println!("  invariants hold: every 201 on disk, never oversold, counters = ledger");
        for line in &beside {
            println!("  {line}");
        }
        let floor = if http.no_floor {
            None
        } else {
            progress.step(format!("floor: wrk -c{c} GET /healthz"));
            let floor = floor(http, c, &dir, &key, &tmp.path().join(format!("floor-{c}.log"))).await?;
            println!(
                "  floor: GET /healthz {:.0}/s, p50 {:.2} ms, p99 {:.2} ms (no key, no store: the most this server answers at {c} connections); orders {:.3} of it",
                floor.rps,
                floor.p50_ms,
                floor.p99_ms,
                floor.share(f.rps)
            );
            for p in peers {
                if let Some(r) = p.ratio(floor.rps) {
                    println!("  floor beside peer {}: ratio {r:.3}×", p.name());
                }
            }
            Some(floor)
        };
        progress.finish(format!(
            "{c} connections: {:.0} orders/s, p99 {:.1} ms; {}{}",
            f.rps,
            f.p99_ms,
            beside.join("; "),
            floor.as_ref().map(|fl| format!("; floor {:.0}/s", fl.rps)).unwrap_or_default()
        ));
        all.push((f, floor));
    }
    Ok(all)
}

/// `tidings serve` (this binary) on the embedded backend of `dir`, on a free loopback port,
/// once it answers; its log in `log`.
async fn start_server(dir: &Path, key: &str, log: &Path) -> anyhow::Result<(Server, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut server = Server(
        Command::new(std::env::current_exe().context("this binary's path")?)
            .args(["serve", "--backend", "embedded", "--addr", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir)
            .env("TIDINGS_API_RATES", "off")
            .env("TIDINGS_API_KEYS", format!("bench:{key}"))
            .env("TIDINGS_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("starting tidings serve")?,
    );
    let (ready_key, ready_log) = (key.to_owned(), log.to_path_buf());
    let server = tokio::task::spawn_blocking(move || {
        let ready = wait_ready(&mut server, port, &ready_key, &ready_log);
        ready.map(|()| server)
    })
    .await??;
    Ok((server, port))
}

/// The floor at `c` connections: plain wrk (no script) against `GET /healthz` of a server on the
/// same database, as long as the orders' run. No order can be answered faster than the route that
/// reads no key and no store, so this is what any change to the order path can at most reach
/// on this machine, wrk included.
async fn floor(http: &HttpArgs, c: u64, dir: &Path, key: &str, log: &Path) -> anyhow::Result<PlainWrk> {
    let (mut server, port) = start_server(dir, key, log).await?;
    let args = [OsString::from("--latency")];
    let stdout = run_wrk(http, c, &mut server, &args, &[], format!("http://127.0.0.1:{port}/healthz")).await?;
    let wrk_name = http.wrk.display().to_string();
    let floor = PlainWrk::parse(&stdout).with_context(|| format!("{wrk_name} printed no figures: {stdout}"))?;
    anyhow::ensure!(floor.failed == 0, "{} /healthz requests failed (see {})", floor.failed, log.display());
    Ok(floor)
}

/// Runs wrk (the threads and seconds of `http`, `c` connections) with `args` and `env` against
/// `url`, then kills `server`; wrk's stdout, or why wrk failed.
async fn run_wrk(
    http: &HttpArgs,
    c: u64,
    server: &mut Server,
    args: &[OsString],
    env: &[(&str, String)],
    url: String,
) -> anyhow::Result<String> {
    let mut wrk = Command::new(&http.wrk);
    wrk.arg(format!("-t{}", http.wrk_threads.max(1)))
        .arg(format!("-c{c}"))
        .arg(format!("-d{}s", http.seconds.max(1)))
        .args(["--timeout", "10s"])
        .args(args)
        .arg(&url)
        .envs(env.iter().map(|(k, v)| (k, v)));
    let wrk_name = http.wrk.display().to_string();
    let out = tokio::task::spawn_blocking(move || wrk.output())
        .await?
        .with_context(|| format!("{wrk_name} did not start (Debian: apt-get install wrk)"))?;
    server.kill();
    anyhow::ensure!(
        out.status.success(),
        "{wrk_name} failed on {url} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A started `tidings serve`, killed when dropped (an error on the way must not leave it).
struct Server(Child);

impl Server {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Until the server answers `GET /v1/inventory/HOT` with this key `200` (it has opened the
/// database and loaded the keys), or it exits, or [`READY_WITHIN`] passes.
fn wait_ready(server: &mut Server, port: u16, key: &str, log: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let request = format!(
        "GET /v1/inventory/{SKU} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let tail =
        || std::fs::read_to_string(log).unwrap_or_default().lines().rev().take(5).collect::<Vec<_>>().join(" | ");
    loop {
        if let Some(status) = server.0.try_wait()? {
            anyhow::bail!("tidings serve exited ({status}): {}", tail());
        }
        let answer = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(request.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        });
        if let Ok(answer) = answer {
            let status = answer.split_whitespace().nth(1).unwrap_or_default().to_owned();
            anyhow::ensure!(
                status == "200",
                "tidings serve answered GET /v1/inventory/{SKU} with {status}: {}",
                tail()
            );
            return Ok(());
        }
        anyhow::ensure!(started.elapsed() < READY_WITHIN, "tidings serve did not answer within 60 s: {}", tail());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn wrk_figures_are_read_from_the_scripts_line() {
        let out = "Running 10s test @ http://127.0.0.1:1\n  2 threads and 16 connections\n\
                   created 7379 refused 12 other 0 p50_ms 1.93 p99_ms 9.50 rps 7391\n";
        let f = WrkFigures::parse(out).expect("the line is read");
        assert_eq!((f.created, f.refused, f.other), (7379, 12, 0));
        assert_eq!((f.p50_ms, f.p99_ms, f.rps), (1.93, 9.5, 7391.0));
        assert_eq!(WrkFigures::parse("created 1 refused 2 other x p50_ms 1 p99_ms 2 rps 3"), None);
        assert_eq!(WrkFigures::parse("Requests/sec: 7391.00"), None);
    }

    #[test]
    fn plain_wrk_figures_are_read_from_its_summary() {
        let out = "Running 8s test @ http://127.0.0.1:18080/healthz\n  2 threads and 16 connections\n\
                   \x20 Thread Stats   Avg      Stdev     Max   +/- Stdev\n\
                   \x20   Latency   181.67us  367.29us  11.50ms   93.44%\n\
                   \x20 Latency Distribution\n     50%   98.00us\n     75%  139.00us\n     90%  290.00us\n\
                   \x20    99%    1.65ms\n  775112 requests in 8.00s, 78.35MB read\n\
                   Requests/sec:  96845.98\nTransfer/sec:      9.79MB\n";
        let f = PlainWrk::parse(out).expect("the summary is read");
        assert_eq!(f, PlainWrk { rps: 96845.98, p50_ms: 0.098, p99_ms: 1.65, failed: 0 });
        let failing =
            format!("{out}  Socket errors: connect 2, read 1, write 0, timeout 3\n  Non-2xx or 3xx responses: 4\n");
        assert_eq!(PlainWrk::parse(&failing).map(|f| f.failed), Some(10));
        let slow = out.replace("1.65ms", "1.20s");
        assert_eq!(PlainWrk::parse(&slow).map(|f| f.p99_ms), Some(1200.0));
        // An orders.lua line is not a plain summary, nor is a summary without its percentiles.
        assert_eq!(PlainWrk::parse("created 1 refused 2 other 0 p50_ms 1 p99_ms 2 rps 3"), None);
        assert_eq!(PlainWrk::parse("Requests/sec:  96845.98\n"), None);
    }
}
