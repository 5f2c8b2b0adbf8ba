//! The long commands' progress with stderr not a terminal (as in CI and logs): plain progress
//! lines and a closing summary on stderr, and stdout's reports as they were (JSON that parses,
//! no progress in it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use tidings_core::ports::{OutMessage, Queues};

fn tidings(args: &[&str], data_dir: &Path) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .env("TIDINGS_DATA_DIR", data_dir)
        .env("TIDINGS_BACKEND", "embedded")
        .env("TIDINGS_LOG", "warn")
        .output()
        .expect("the tidings binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tidings {args:?} failed:\nstdout:\n{stdout}\nstderr:\n{stderr}");
    (out, stdout, stderr)
}

/// The first JSON document of stdout (a report may be followed by plain lines).
fn first_json(stdout: &str) -> serde_json::Value {
    serde_json::Deserializer::from_str(stdout)
        .into_iter::<serde_json::Value>()
        .next()
        .unwrap_or_else(|| panic!("no JSON on stdout:\n{stdout}"))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"))
}

fn assert_no_progress_on_stdout(stdout: &str) {
    for word in ["seeding:", "campaign:", "bootstrap:", "replay:", "reserve:"] {
        assert!(!stdout.contains(word), "progress ({word}) leaked to stdout:\n{stdout}");
    }
}

#[test]
fn bootstrap_tells_each_resource_and_what_it_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (_, stdout, stderr) = tidings(&["keys", "list", "--bootstrap"], &data);
    assert!(stderr.contains("bootstrap: database "), "{stderr}");
    assert!(stderr.contains("tidings.db: created"), "{stderr}");
    for q in tidings_core::messages::ALL_QUEUES.iter().chain([&"stream-failures"]) {
        assert!(stderr.contains(&format!("bootstrap: queue {q}: declared\n")), "no line for {q}:\n{stderr}");
    }
    let queues = tidings_core::messages::ALL_QUEUES.len() + 1;
    assert!(stderr.contains(&format!("bootstrap: database created and {queues} queues ready in ")), "{stderr}");
    assert!(stderr.contains("keys: listed 0 key(s) in "), "{stderr}");
    assert_eq!(first_json(&stdout), serde_json::json!({"keys": []}));
    assert_no_progress_on_stdout(&stdout);

    // Again: everything is there.
    let (_, _, stderr) = tidings(&["keys", "list", "--bootstrap"], &data);
    assert!(stderr.contains("tidings.db: found"), "{stderr}");
    assert!(stderr.contains(&format!("bootstrap: database found and {queues} queues ready in ")), "{stderr}");

    // Without --bootstrap, nothing is said of it.
    let (_, _, stderr) = tidings(&["keys", "list"], &data);
    assert!(!stderr.contains("bootstrap"), "{stderr}");
}

#[test]
fn a_small_campaign_bench_shows_seeding_and_drain_and_sums_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, stdout, stderr) =
        tidings(&["bench", "campaign", "--recipients", "200", "--otp-every-ms", "50", "--no-peer"], dir.path());
    assert!(stderr.contains("seeding: 0/200 users"), "{stderr}");
    assert!(stderr.contains("seeding: seeded 200 users in "), "{stderr}");
    // A drain line: sent of total, rate, queued, RSS.
    let drain = stderr
        .lines()
        .find(|l| l.starts_with("campaign: ") && l.contains("/200 sent, "))
        .unwrap_or_else(|| panic!("no drain line:\n{stderr}"));
    assert!(drain.contains("/s, ") && drain.contains(" queued, peak RSS "), "{drain}");
    let summary = stderr.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("campaign: 200 of 200 recipients sent once in ")
            && summary.contains("0 more than once, 0 missing"),
        "the last line is not the summary:\n{stderr}"
    );
    let report = first_json(&stdout);
    assert_eq!(report["recipients"], 200);
    assert_eq!(report["delivered_once"], 200);
    assert_no_progress_on_stdout(&stdout);
}

#[test]
fn reserve_bench_shows_orders_and_sums_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, stdout, stderr) = tidings(
        &["bench", "reserve", "--orders", "300", "--units", "100", "--concurrency", "4", "--no-peer"],
        dir.path(),
    );
    assert!(
        stderr.lines().any(|l| l.starts_with("reserve: ") && l.contains("/300 orders, ") && l.contains(" accepted, ")),
        "{stderr}"
    );
    assert!(
        stderr.lines().last().unwrap_or_default().starts_with("reserve: placed 300 orders in ")
            && stderr.contains("100 accepted, 200 refused, never oversold"),
        "{stderr}"
    );
    // stdout keeps its report.
    assert!(stdout.contains("accepted 100, refused 200 (0 while stock remained)"), "{stdout}");
    assert!(stdout.contains("invariants hold"), "{stdout}");
    assert_no_progress_on_stdout(&stdout);
}

#[tokio::test]
async fn stream_failure_replay_counts_entries_replayed_and_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // Makes the database and its queues.
    tidings(&["keys", "list", "--bootstrap"], &data);
    {
        let store = tidings_embedded::EmbeddedStore::open(&data.join("tidings.db")).expect("open");
        store
            .declare_queue(tidings_embedded::QueueConfig::new(tidings_core::notify::relay::STREAM_FAILURES_QUEUE, 1000))
            .expect("declare");
        let poison = serde_json::json!({
            "requestContext": {"condition": "PoisonRecord", "reason": "unparsable"},
            "DDBStreamBatchInfo": {},
            "keys": {"pk": {"S": "T#shop#N#gone"}, "sk": {"S": "N"}},
        });
        store
            .send_batch(
                tidings_core::notify::relay::STREAM_FAILURES_QUEUE,
                vec![OutMessage::new(poison.to_string()), OutMessage::new("not a record")],
            )
            .await
            .expect("send");
    }
    let (_, stdout, stderr) = tidings(&["ops", "stream-failures", "replay"], &data);
    assert!(stderr.contains("replay: 0/2 entries"), "{stderr}");
    let summary = stderr.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("replay: replayed 1 of 2 entries in ")
            && summary.ends_with("(1 records, 0 queued again), 1 kept"),
        "{stderr}"
    );
    let report = first_json(&stdout);
    assert_eq!(report["replayed"].as_array().map(Vec::len), Some(1), "{report}");
    assert_eq!(report["kept"].as_array().map(Vec::len), Some(1), "{report}");
    assert_no_progress_on_stdout(&stdout);
}

/// A campaign's sends are not logged one line each: without `TIDINGS_LOG` a bench logs
/// warnings only, and with `TIDINGS_LOG=info` (as `serve` runs) a send is a debug event. The
/// progress and the summary are what stderr holds (before: one INFO line per recipient).
#[test]
fn a_campaign_bench_logs_no_line_per_send() {
    for log in [None, Some("info")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
        command
            .args(["bench", "campaign", "--recipients", "300", "--otp-every-ms", "50", "--no-peer"])
            .env("TIDINGS_DATA_DIR", dir.path())
            .env("TIDINGS_BACKEND", "embedded")
            .env_remove("TIDINGS_LOG");
        if let Some(log) = log {
            command.env("TIDINGS_LOG", log);
        }
        let out = command.output().expect("the tidings binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "TIDINGS_LOG={log:?}:\n{stderr}");
        let lines = stderr.lines().count();
        assert!(lines < 50, "TIDINGS_LOG={log:?}: {lines} lines on stderr for 300 recipients:\n{stderr}");
        assert!(!stderr.contains(" sent to="), "TIDINGS_LOG={log:?}: a send logged:\n{stderr}");
        assert!(stderr.contains("seeding: seeded 300 users in "), "{stderr}");
        let summary = stderr.lines().last().unwrap_or_default();
        assert!(summary.starts_with("campaign: 300 of 300 recipients sent once in "), "no summary last:\n{stderr}");
        assert_eq!(first_json(&String::from_utf8_lossy(&out.stdout))["delivered_once"], 300);
    }
}
