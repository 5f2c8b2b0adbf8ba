//! The peers a bench is measured against: what a shop would run instead of Tidings, as scripts
//! in a directory of their own (`--peer-dir`, else `TIDINGS_BENCH_PEERS`, else `../shared/bench`
//! beside the repository when it is there). Absolute figures move 2–4× from one machine to the
//! next, so a peer runs in the same command as Tidings, one after the other (never at the same
//! time: both would share the cores), and the report gives the ratio. A peer that cannot run
//! (no script, no PostgreSQL or Redis) is reported as skipped, with the reason, and Tidings' own
//! figure is still reported.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::progress::Progress;

#[derive(clap::Args, Clone, Debug)]
pub struct PeerArgs {
    /// Directory of the peer scripts (default: TIDINGS_BENCH_PEERS, else `../shared/bench`
    /// beside the repository when it exists).
    #[arg(long)]
    pub peer_dir: Option<PathBuf>,
    /// Measure Tidings alone, without its peer.
    #[arg(long, conflicts_with = "peer_dir")]
    pub no_peer: bool,
    /// Runs of the peer and of Tidings, one after the other; the report gives each run and the
    /// spread (min, median, max).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
}

/// A peer script and what it prints.
pub struct PeerScript {
    pub script: &'static str,
    /// The names of the figures it prints, `NAME <unit>/s: N ...`, one a line.
    pub figures: &'static [&'static str],
    /// What it runs, to say which one is missing when it fails.
    pub tools: &'static [&'static str],
}

/// `queue-peer.sh TASKS WORKERS`: a PostgreSQL task table drained with `FOR UPDATE SKIP LOCKED`.
pub const QUEUE_PEER: PeerScript = PeerScript {
    script: "queue-peer.sh",
    figures: &["postgres-skip-locked-queue"],
    tools: &[
        "bash",
        "python3",
        "psql",
        "pgbench",
        "/usr/lib/postgresql/15/bin/initdb",
        "/usr/lib/postgresql/15/bin/pg_ctl",
    ],
};

/// `reserve-peers.sh SECONDS CLIENTS`: the Redis Lua gate, and PostgreSQL's conditional UPDATE
/// with a ledger row (its bare UPDATE is printed too but is not what Tidings does).
pub const RESERVE_PEERS: PeerScript = PeerScript {
    script: "reserve-peers.sh",
    figures: &["redis-lua-gate", "postgres-conditional-update-ledger"],
    tools: &[
        "bash",
        "python3",
        "redis-server",
        "redis-cli",
        "redis-benchmark",
        "psql",
        "pgbench",
        "/usr/lib/postgresql/15/bin/initdb",
        "/usr/lib/postgresql/15/bin/pg_ctl",
    ],
};

/// `redis-durable-gate.sh SECONDS CLIENTS` (this repository's `infra/bench`, carried in the
/// binary): the Redis Lua gate with its append-only file synced before each answer, the
/// durability an order has here; the Redis gate of `reserve-peers.sh` keeps nothing.
pub const DURABLE_REDIS: PeerScript = PeerScript {
    script: "redis-durable-gate.sh",
    figures: &["redis-lua-gate-fsync-always"],
    tools: &["bash", "python3", "redis-server", "redis-cli", "redis-benchmark"],
};
const DURABLE_REDIS_TEXT: &str = include_str!("../../../infra/bench/redis-durable-gate.sh");

/// The figures [`measure_reserve`] returns, in its order.
pub fn reserve_figures() -> Vec<&'static str> {
    RESERVE_PEERS.figures.iter().chain(DURABLE_REDIS.figures).copied().collect()
}

/// The reservation peers of `dir` (`reserve-peers.sh`), then the durable Redis gate, with the
/// same arguments: its script from `dir` when it has one (a stand-in), else the copy this binary
/// carries; skipped like the others with `--no-peer`.
pub async fn measure_reserve(dir: Result<PathBuf, String>, args: Vec<String>) -> Vec<PeerFigure> {
    let mut figures = measure(dir.clone(), &RESERVE_PEERS, args.clone()).await;
    let own = tempfile::tempdir().map_err(|e| format!("a directory for {}: {e}", DURABLE_REDIS.script));
    let own_dir = match (&dir, &own) {
        (Err(why), _) => Err(why.clone()),
        (Ok(dir), _) if dir.join(DURABLE_REDIS.script).is_file() => Ok(dir.clone()),
        (Ok(_), Err(why)) => Err(why.clone()),
        (Ok(_), Ok(tmp)) => std::fs::write(tmp.path().join(DURABLE_REDIS.script), DURABLE_REDIS_TEXT)
            .map(|()| tmp.path().to_path_buf())
            .map_err(|e| format!("writing {}: {e}", DURABLE_REDIS.script)),
    };
    figures.extend(measure(own_dir, &DURABLE_REDIS, args).await);
    drop(own);
    figures
}

/// One peer's figure in one run, or why there is none.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerFigure {
    Measured { name: String, per_s: f64 },
    Skipped { name: String, why: String },
}

impl PeerFigure {
    pub fn name(&self) -> &str {
        match self {
            PeerFigure::Measured { name, .. } | PeerFigure::Skipped { name, .. } => name,
        }
    }

    pub fn per_s(&self) -> Option<f64> {
        match self {
            PeerFigure::Measured { per_s, .. } => Some(*per_s),
            PeerFigure::Skipped { .. } => None,
        }
    }

    /// Tidings' figure over the peer's, as reported (three decimals); none when skipped.
    pub fn ratio(&self, tidings_per_s: f64) -> Option<f64> {
        self.per_s().filter(|p| *p > 0.0).map(|p| (tidings_per_s / p * 1000.0).round() / 1000.0)
    }

    /// `{name, per_s}` or `{name, skipped: why}`.
    pub fn json(&self) -> Value {
        match self {
            PeerFigure::Measured { name, per_s } => json!({"name": name, "per_s": per_s}),
            PeerFigure::Skipped { name, why } => json!({"name": name, "skipped": why}),
        }
    }

    /// `peer postgres-skip-locked-queue 65518/s, ratio 0.229×`, or `peer NAME skipped: why`.
    pub fn summary(&self, tidings_per_s: f64) -> String {
        match (self, self.ratio(tidings_per_s)) {
            (PeerFigure::Measured { name, per_s }, Some(r)) => format!("peer {name} {per_s:.0}/s, ratio {r:.3}×"),
            (PeerFigure::Measured { name, per_s }, None) => format!("peer {name} {per_s:.0}/s"),
            (PeerFigure::Skipped { name, why }, _) => format!("peer {name} skipped: {why}"),
        }
    }
}

/// Where the peers are: `--peer-dir`, `TIDINGS_BENCH_PEERS`, or `../shared/bench` beside the
/// repository (when it exists). `None`: `--no-peer`, or nowhere to look.
pub fn peer_dir(args: &PeerArgs) -> Result<PathBuf, String> {
    if args.no_peer {
        return Err("not run (--no-peer)".into());
    }
    if let Some(dir) = &args.peer_dir {
        return Ok(dir.clone());
    }
    if let Some(dir) = crate::settings().get("TIDINGS_BENCH_PEERS") {
        return Ok(PathBuf::from(dir));
    }
    // This crate is shared/tidings in the repository.
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench");
    if beside.is_dir() {
        return Ok(beside);
    }
    Err(format!("no peer directory (--peer-dir, TIDINGS_BENCH_PEERS, or {})", beside.display()))
}

/// The figure `name` prints in `output`: the number after `: ` on the line `NAME <unit>/s: N ...`.
pub fn parse_figure(output: &str, name: &str) -> Option<f64> {
    output.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(name)?.strip_prefix(' ')?;
        let (unit, value) = rest.split_once(": ")?;
        if !unit.ends_with("/s") || unit.contains(' ') {
            return None;
        }
        value.split_whitespace().next()?.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
    })
}

/// Runs `peer` in `dir` with `args` and returns one figure per name it prints (skipped, with
/// the reason, when the directory, the script or one of its tools is missing or it fails).
pub fn run(dir: Result<PathBuf, String>, peer: &PeerScript, args: &[String]) -> Vec<PeerFigure> {
    let skipped = |why: String| {
        let skip = |name: &&str| PeerFigure::Skipped { name: (*name).into(), why: why.clone() };
        peer.figures.iter().map(skip).collect()
    };
    let dir = match dir {
        Ok(dir) => dir,
        Err(why) => return skipped(why),
    };
    let script = dir.join(peer.script);
    if !script.is_file() {
        return skipped(format!("no {} in {}", peer.script, dir.display()));
    }
    let out = match Command::new("bash").arg(&script).args(args).output() {
        Ok(out) => out,
        Err(e) => return skipped(format!("{} did not start: {e}", script.display())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failed = |name: &str| {
        if let Some(tool) = peer.tools.iter().find(|t| !on_path(t)) {
            return format!("{tool} not found ({} needs it)", peer.script);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        if out.status.success() {
            format!("{} printed no figure for {name}", peer.script)
        } else {
            format!("{} failed ({}): {last}", peer.script, out.status)
        }
    };
    peer.figures
        .iter()
        .map(|name| match parse_figure(&stdout, name) {
            Some(per_s) => PeerFigure::Measured { name: (*name).into(), per_s },
            None => PeerFigure::Skipped { name: (*name).into(), why: failed(name) },
        })
        .collect()
}

/// [`run`] off the runtime's threads, with a line on stderr for what it ran and found.
pub async fn measure(dir: Result<PathBuf, String>, peer: &'static PeerScript, args: Vec<String>) -> Vec<PeerFigure> {
    let progress = Progress::spinner("peer");
    progress.step(format!("{} {}", peer.script, args.join(" ")));
    let figures = tokio::task::spawn_blocking(move || run(dir, peer, &args)).await.unwrap_or_else(|e| {
        let skip = |name: &&str| PeerFigure::Skipped { name: (*name).into(), why: format!("the peer's thread: {e}") };
        peer.figures.iter().map(skip).collect()
    });
    let said: Vec<String> = figures
        .iter()
        .map(|f| match f {
            PeerFigure::Measured { name, per_s } => format!("{name} {per_s:.0}/s"),
            PeerFigure::Skipped { name, why } => format!("{name} skipped: {why}"),
        })
        .collect();
    progress.finish(format!("{} in {:.1} s", said.join(", "), progress.elapsed_s()));
    figures
}

/// An absolute path that exists, or a name found in `PATH`.
fn on_path(tool: &str) -> bool {
    let tool = Path::new(tool);
    if tool.is_absolute() {
        return tool.exists();
    }
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()))
}

/// The [`spread`] of some figures as a report line says it: `min A / median B / max C`.
pub fn spread_text(values: &[f64]) -> String {
    let v = spread(values);
    format!("min {} / median {} / max {}", v["min"], v["median"], v["max"])
}

/// `{min, median, max}` of some figures (the median of an even count: the mean of the middle two).
pub fn spread(values: &[f64]) -> Value {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({"min": r(v[0]), "median": r(median), "max": r(v[v.len() - 1])})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_of_an_even_count_takes_the_middle_two() {
        assert_eq!(spread(&[3.0, 1.0, 2.0, 10.0]), json!({"min": 1.0, "median": 2.5, "max": 10.0}));
        assert_eq!(spread(&[2.0]), json!({"min": 2.0, "median": 2.0, "max": 2.0}));
        assert_eq!(spread(&[]), Value::Null);
    }

    #[test]
    fn a_figure_is_read_from_its_own_line_only() {
        let queue = "postgres-skip-locked-queue tasks/s: 65518 (1000000 tasks in 15.3s, 0 left)\n";
        assert_eq!(parse_figure(queue, "postgres-skip-locked-queue"), Some(65518.0));
        let reserve = "redis-lua-gate ops/s: 80160.00\npostgres-conditional-update-bare ops/s: 2301.5\n\
                       postgres-conditional-update-ledger ops/s: 1725.123456\n";
        assert_eq!(parse_figure(reserve, "redis-lua-gate"), Some(80160.0));
        assert_eq!(parse_figure(reserve, "postgres-conditional-update-ledger"), Some(1725.123456));
        // A prefix of another name, an empty figure, a figure that is not a number: none.
        assert_eq!(parse_figure(reserve, "postgres-conditional-update"), None);
        assert_eq!(parse_figure("redis-lua-gate ops/s: \n", "redis-lua-gate"), None);
        assert_eq!(parse_figure("redis-lua-gate ops/s: fast\n", "redis-lua-gate"), None);
        assert_eq!(parse_figure("redis-lua-gate: 5\n", "redis-lua-gate"), None);
    }

    #[test]
    fn the_ratio_is_tidings_over_the_peer() {
        let peer = PeerFigure::Measured { name: "p".into(), per_s: 4000.0 };
        assert_eq!(peer.ratio(1000.0), Some(0.25));
        assert_eq!(peer.summary(1000.0), "peer p 4000/s, ratio 0.250×");
        assert_eq!(PeerFigure::Measured { name: "p".into(), per_s: 0.0 }.ratio(1000.0), None);
        let skipped = PeerFigure::Skipped { name: "p".into(), why: "no script".into() };
        assert_eq!(skipped.ratio(1000.0), None);
        assert_eq!(skipped.json(), json!({"name": "p", "skipped": "no script"}));
    }
}
