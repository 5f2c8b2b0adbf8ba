//! `tidings bench` beside its peer: the peer's figure read from its script's line, the ratio
//! Tidings computes from it and its own measured figure, a peer that cannot run reported as
//! skipped (Tidings' figure still reported), and `--runs` with the spread. The peer scripts
//! here are stand-ins that print a fixed figure at once (no PostgreSQL, no Redis): what is
//! checked is what Tidings makes of their line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

struct Run {
    stdout: String,
    stderr: String,
}

fn tidings(args: &[&str], data_dir: &Path) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .env("TIDINGS_DATA_DIR", data_dir)
        .env("TIDINGS_BACKEND", "embedded")
        .env("TIDINGS_LOG", "warn")
        .env_remove("TIDINGS_BENCH_PEERS")
        .output()
        .expect("the tidings binary runs");
    let run = Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(out.status.success(), "tidings {args:?} failed:\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    run
}

fn report(stdout: &str) -> Value {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<Value>()
        .next()
        .unwrap_or_else(|| panic!("no JSON on stdout:\n{stdout}"))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"))
}

/// A peer directory with `script`, which appends its arguments to `calls` and runs `body`.
fn peer_dir(script: &str, body: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = dir.path().join("calls");
    let text = format!("#!/usr/bin/env bash\necho \"$@\" >> {}\n{body}\n", calls.display());
    std::fs::write(dir.path().join(script), text).expect("write the peer script");
    dir
}

fn calls(dir: &tempfile::TempDir) -> Vec<String> {
    std::fs::read_to_string(dir.path().join("calls")).unwrap_or_default().lines().map(str::to_owned).collect()
}

fn ratio_of(tidings: f64, peer: f64) -> f64 {
    (tidings / peer * 1000.0).round() / 1000.0
}

const QUEUE_LINE: &str = "echo 'postgres-skip-locked-queue tasks/s: 1250 (300 tasks in 0.2s, 0 left)'";

#[test]
fn campaign_reports_the_queue_peer_figure_and_its_own_ratio_to_it() {
    let peers = peer_dir("queue-peer.sh", QUEUE_LINE);
    let data = tempfile::tempdir().expect("tempdir");
    let dir = peers.path().to_str().unwrap();
    let run = tidings(&["bench", "campaign", "--recipients", "300", "--peer-dir", dir], data.path());
    // The peer ran once, before the campaign, with as many tasks and 8 workers.
    assert_eq!(calls(&peers), ["300 8"]);
    let r = report(&run.stdout);
    assert_eq!(r["delivered_once"], 300, "{r}");
    assert_eq!(r["peer"], serde_json::json!({"name": "postgres-skip-locked-queue", "per_s": 1250.0}), "{r}");
    let own = r["sends_per_s"].as_f64().unwrap();
    assert!(own > 0.0, "{r}");
    assert_eq!(r["ratio"].as_f64(), Some(ratio_of(own, 1250.0)), "{r}");
    let summary = run.stderr.lines().last().unwrap_or_default();
    assert!(summary.starts_with("campaign: 300 of 300 recipients sent once in "), "{}", run.stderr);
    assert!(
        summary.ends_with(&format!("; peer postgres-skip-locked-queue 1250/s, ratio {:.3}×", ratio_of(own, 1250.0))),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("peer: postgres-skip-locked-queue 1250/s in "), "{}", run.stderr);
}

#[test]
fn campaign_without_the_peer_script_says_why_and_still_reports_its_own_figure() {
    let empty = tempfile::tempdir().expect("tempdir");
    let data = tempfile::tempdir().expect("tempdir");
    let dir = empty.path().to_str().unwrap();
    let run = tidings(&["bench", "campaign", "--recipients", "200", "--peer-dir", dir], data.path());
    let r = report(&run.stdout);
    assert_eq!(r["delivered_once"], 200, "{r}");
    assert!(r["sends_per_s"].as_f64().is_some_and(|s| s > 0.0), "{r}");
    let why = r["peer"]["skipped"].as_str().unwrap_or_else(|| panic!("not skipped: {r}"));
    assert_eq!(why, format!("no queue-peer.sh in {dir}"));
    assert!(r["ratio"].is_null(), "{r}");
    assert!(
        run.stderr
            .lines()
            .last()
            .unwrap_or_default()
            .contains("; peer postgres-skip-locked-queue skipped: no queue-peer.sh in ")
    );
}

#[test]
fn a_peer_script_that_fails_is_skipped_with_its_reason() {
    let peers = peer_dir("queue-peer.sh", "echo 'initdb: cannot be run as root' >&2\nexit 3");
    let data = tempfile::tempdir().expect("tempdir");
    let dir = peers.path().to_str().unwrap();
    let run = tidings(&["bench", "campaign", "--recipients", "200", "--peer-dir", dir], data.path());
    let r = report(&run.stdout);
    assert_eq!(r["delivered_once"], 200, "{r}");
    let why = r["peer"]["skipped"].as_str().unwrap_or_else(|| panic!("not skipped: {r}"));
    // Its last words, or the tool it needs that this machine lacks.
    assert!(
        why == "queue-peer.sh failed (exit status: 3): initdb: cannot be run as root"
            || (why.contains(" not found (queue-peer.sh needs it)")),
        "{why}"
    );
}

#[test]
fn campaign_runs_three_times_with_the_spread_of_each_figure() {
    let peers = peer_dir("queue-peer.sh", QUEUE_LINE);
    let data = tempfile::tempdir().expect("tempdir");
    let dir = peers.path().to_str().unwrap();
    let run = tidings(&["bench", "campaign", "--recipients", "200", "--runs", "3", "--peer-dir", dir], data.path());
    assert_eq!(calls(&peers), ["200 8", "200 8", "200 8"]);
    let r = report(&run.stdout);
    let runs = r["runs"].as_array().unwrap_or_else(|| panic!("no runs: {r}"));
    assert_eq!(runs.len(), 3, "{r}");
    let mut own: Vec<f64> = runs.iter().map(|run| run["sends_per_s"].as_f64().unwrap()).collect();
    for run in runs {
        assert_eq!(run["delivered_once"], 200, "{run}");
        assert_eq!(run["ratio"].as_f64(), Some(ratio_of(run["sends_per_s"].as_f64().unwrap(), 1250.0)), "{run}");
    }
    own.sort_by(f64::total_cmp);
    let spread = &r["spread"];
    assert_eq!(spread["sends_per_s"], serde_json::json!({"min": own[0], "median": own[1], "max": own[2]}), "{r}");
    assert_eq!(spread["peer_per_s"], serde_json::json!({"min": 1250.0, "median": 1250.0, "max": 1250.0}), "{r}");
    assert_eq!(spread["ratio"]["median"].as_f64(), Some(ratio_of(own[1], 1250.0)), "{r}");
    for i in 1..=3 {
        assert!(
            run.stderr.contains(&format!("campaign: run {i} of 3: 200 of 200 recipients sent once")),
            "{}",
            run.stderr
        );
    }
    assert!(run.stderr.lines().last().unwrap_or_default().starts_with("campaign: 3 runs: "), "{}", run.stderr);
}

/// The number before ` orders/s` on the `time:` line of `bench reserve`.
fn orders_per_s(stdout: &str) -> f64 {
    let line = stdout.lines().find(|l| l.starts_with("time: ")).unwrap_or_else(|| panic!("no time line:\n{stdout}"));
    let figure = line.trim_end_matches(" orders/s").rsplit(' ').next().unwrap_or_default();
    figure.parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn reserve_reports_both_gates_and_its_ratio_to_each() {
    let peers = peer_dir(
        "reserve-peers.sh",
        "echo 'redis-lua-gate ops/s: 80000.00'\necho 'postgres-conditional-update-bare ops/s: 3000.5'\n\
         echo 'postgres-conditional-update-ledger ops/s: 1600.25'",
    );
    // The durable Redis gate's stand-in, in the same directory (the binary's own copy otherwise).
    let durable = format!(
        "#!/usr/bin/env bash\necho \"durable $@\" >> {}\necho 'redis-lua-gate-fsync-always ops/s: 20000.0'\n",
        peers.path().join("calls").display()
    );
    std::fs::write(peers.path().join("redis-durable-gate.sh"), durable).expect("write the stand-in");
    let data = tempfile::tempdir().expect("tempdir");
    let dir = peers.path().to_str().unwrap();
    let args = ["bench", "reserve", "--orders", "300", "--units", "100", "--concurrency", "4", "--peer-seconds", "2"];
    let run = tidings(&[&args[..], &["--peer-dir", dir]].concat(), data.path());
    assert_eq!(calls(&peers), ["2 4", "durable 2 4"]);
    let own = orders_per_s(&run.stdout);
    let redis = format!("peer redis-lua-gate 80000/s, ratio {:.3}×", ratio_of(own, 80000.0));
    let ledger = format!("peer postgres-conditional-update-ledger 1600/s, ratio {:.3}×", ratio_of(own, 1600.25));
    let synced = format!("peer redis-lua-gate-fsync-always 20000/s, ratio {:.3}×", ratio_of(own, 20000.0));
    assert!(run.stdout.lines().any(|l| l == redis), "{redis}:\n{}", run.stdout);
    assert!(run.stdout.lines().any(|l| l == ledger), "{ledger}:\n{}", run.stdout);
    assert!(run.stdout.lines().any(|l| l == synced), "{synced}:\n{}", run.stdout);
    let summary = run.stderr.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("reserve: placed 300 orders in ")
            && summary.ends_with(&format!("; {redis}; {ledger}; {synced}")),
        "{summary}"
    );
}

#[test]
fn reserve_without_its_peers_still_checks_and_reports_its_own_runs() {
    // No reserve-peers.sh; a durable gate that fails (as without Redis), so nothing real runs.
    let empty = peer_dir("redis-durable-gate.sh", "echo 'redis-server: not found' >&2; exit 3");
    let data = tempfile::tempdir().expect("tempdir");
    let dir = empty.path().to_str().unwrap();
    let args = ["bench", "reserve", "--orders", "200", "--units", "50", "--concurrency", "4", "--runs", "3"];
    let run = tidings(&[&args[..], &["--peer-dir", dir]].concat(), data.path());
    assert_eq!(run.stdout.matches("invariants hold").count(), 3, "{}", run.stdout);
    let skipped = format!("peer redis-lua-gate skipped: no reserve-peers.sh in {dir}");
    assert_eq!(run.stdout.lines().filter(|l| *l == skipped).count(), 3, "{}", run.stdout);
    let failed = run.stdout.lines().filter(|l| l.starts_with("peer redis-lua-gate-fsync-always skipped: ")).count();
    assert_eq!(failed, 3, "{}", run.stdout);
    assert!(run.stdout.contains("spread over 3 runs: orders/s min "), "{}", run.stdout);
    assert!(run.stdout.contains("  redis-lua-gate: skipped"), "{}", run.stdout);
}

#[test]
fn a_push_campaign_reaches_each_users_device_once() {
    let data = tempfile::tempdir().expect("tempdir");
    let run = tidings(&["bench", "campaign", "--recipients", "300", "--channel", "push", "--no-peer"], data.path());
    let r = report(&run.stdout);
    assert_eq!(r["channel"], "push", "{r}");
    // The provider counted one push per user (none twice, none missing) …
    assert_eq!(
        (r["delivered_once"].as_u64(), r["duplicates"].as_u64(), r["missing"].as_u64()),
        (Some(300), Some(0), Some(0)),
        "{r}"
    );
    // … and the campaign's own progress counted each recorded once, in its send batches.
    assert_eq!(r["progress"]["status"], "completed", "{r}");
    assert_eq!(r["progress"]["counts"]["sent"], 300, "{r}");
}

/// `--flood`: the neighbour's transactional bulk instead of a campaign, every recipient still
/// sent once, and the OTP line (the figure of docs/delivery.md, "Fair lanes") printed with the
/// OTPs of both tenants counted.
#[test]
fn flood_prints_its_otp_line() {
    let data = tempfile::tempdir().expect("tempdir");
    let run = tidings(
        &["bench", "campaign", "--flood", "--recipients", "2500", "--otp-every-ms", "20", "--no-peer"],
        data.path(),
    );
    let r = report(&run.stdout);
    assert_eq!((r["flood"].as_bool(), r["delivered_once"].as_u64()), (Some(true), Some(2500)), "{r}");
    assert!(r["transactional"]["p99_ms"].as_f64().is_some(), "{r}");
    let summary = run.stderr.lines().last().unwrap_or_default();
    assert!(summary.starts_with("flood: 2500 of 2500 recipients sent once in "), "{}", run.stderr);
    assert!(summary.contains(" transactional sent meanwhile, p99 "), "{}", run.stderr);
}
