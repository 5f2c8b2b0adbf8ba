//! `tidings bench digest` at a tiny scale (50 triggers into 5 users' digests), so that the
//! benchmark of docs/workflows.md, "Cost and rate", keeps working: its self-checks (exactly one
//! digest per user carrying its 10 events, every run ended) pass, in bulk notifications and
//! with one notification per trigger, and its report has the figures the docs quote.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["bench", "digest"])
        .args(args)
        .env("TIDINGS_LOG", "warn")
        .env_remove("TIDINGS_BACKEND")
        .output()
        .expect("the tidings binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tidings bench digest {args:?} failed:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let report =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{stdout}"));
    (report, stderr)
}

fn checks_pass(report: &Value, stderr: &str, notifications: u64) {
    assert_eq!(report["triggers"], 50, "{report}");
    assert_eq!(report["notifications"], notifications, "{report}");
    assert_eq!(report["digests_sent"], 5, "one digest per user: {report}");
    assert_eq!(report["runs"]["digest digested 10 events"], 5, "{report}");
    assert_eq!(report["runs"]["digest merged"], 45, "{report}");
    assert_eq!(report["runs"]["status completed"], 50, "every run ended: {report}");
    assert_eq!(report["runs"].as_object().unwrap().len(), 3, "nothing else: {report}");
    let per = &report["per_trigger"];
    // A trigger writes at least its run and its digest entry; what it reads and queues.
    assert!(per["write_units"].as_f64().unwrap() >= 4.0, "{per}");
    assert!(per["read_units"].as_f64().unwrap() > 0.0, "{per}");
    assert!(per["sqs_requests"].as_f64().unwrap() > 0.0, "{per}");
    assert!(per["dollars_per_million"]["total"].as_f64().unwrap() > 0.0, "{per}");
    assert!(report["triggers_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(stderr.contains("every run ended; checks pass"), "{stderr}");
}

#[test]
fn the_digest_bench_sends_one_digest_per_user_with_its_events_and_ends_every_run() {
    // Bulk: 10 notifications (one per round) of the 5 users.
    let (report, stderr) = bench(&["--users", "5", "--per-user", "10"]);
    checks_pass(&report, &stderr, 10);
    // One notification per trigger.
    let (report, stderr) = bench(&["--users", "5", "--per-user", "10", "--per-request", "1", "--concurrency", "8"]);
    checks_pass(&report, &stderr, 50);
}

/// A run on a store that an earlier run left unfinished (stopped before its windows closed:
/// its request messages still queued, its windows' timers open) does that run's work too, since
/// the workers and the tick serve every tenant; the earlier run's digests go to users with the
/// same ids in its own tenant. They are not this run's: its check still finds one digest per
/// user (they are counted apart, `other_tenants_sends`), and it waits for its own runs, not for
/// a count of every tenant's. Before, they were counted as second digests of this run's users
/// and their runs' ends ended this run's phases early (a user's last trigger then opened a
/// second window): the "7 users sent their digest twice" of docs/performance.md, "Digests".
#[test]
fn a_run_on_a_store_an_earlier_run_left_unfinished_still_sends_one_digest_per_user() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    // Stopped at once: its 500 triggers accepted, not yet in their digests.
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["bench", "digest", "--users", "50", "--per-user", "10", "--timeout-s", "0", "--data-dir", data])
        .env("TIDINGS_LOG", "warn")
        .env_remove("TIDINGS_BACKEND")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("entered its digest in time"), "{stderr}");
    let (report, stderr) = bench(&["--users", "5", "--per-user", "10", "--data-dir", data]);
    checks_pass(&report, &stderr, 10);
    assert!(report["leftover_at_start"].as_object().is_some_and(|m| !m.is_empty()), "{report}");
    assert!(report["other_tenants_sends"].as_u64().unwrap() > 0, "the earlier run's digests went out: {report}");
    assert!(report["runs_ended_counted"].as_u64().unwrap() > 50, "{report}");
}
