//! The conformance suite (`tidings-conformance`) against the embedded backend, each case on a
//! fresh store in a temporary file; plus what only the embedded backend promises: a manual
//! clock drives its queues, strict stale receipts, and durability across a reopen and a
//! `kill -9`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tidings_conformance::{CONFORMANCE_QUEUES, MAX_RECEIVES, attrs, queue, stream, table};
use tidings_core::ports::{
    ChangeFeed, Cond, Item, Key, ManualClock, OutMessage, QueueError, Queues, Table, Update, Write,
};
use tidings_embedded::{EmbeddedStore, QueueConfig};

/// A store in a fresh temporary directory (removed when dropped), with the conformance queues.
struct Env {
    dir: tempfile::TempDir,
    store: EmbeddedStore,
}

fn declare_conformance_queues(store: &EmbeddedStore) {
    for name in CONFORMANCE_QUEUES {
        store.declare_queue(QueueConfig::new(name, MAX_RECEIVES)).unwrap();
    }
}

fn fresh() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("tidings.db")).unwrap();
    declare_conformance_queues(&store);
    Env { dir, store }
}

macro_rules! table_case {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let env = fresh();
            table::$name(&env.store).await;
        }
    };
}

macro_rules! stream_case {
    ($name:ident) => {
        #[tokio::test]
        async fn $name() {
            let env = fresh();
            let feed = env.store.change_feed("conformance");
            stream::$name(&env.store, &feed).await;
        }
    };
}

macro_rules! queue_case {
    ($name:ident, $queue:literal) => {
        #[tokio::test]
        async fn $name() {
            let env = fresh();
            queue::$name(&env.store, $queue).await;
        }
    };
}

table_case!(item_round_trip);
table_case!(get_many_in_order);
table_case!(query_many_in_order);
table_case!(update_each_alone);
table_case!(null_attributes_are_not_stored);
table_case!(conditional_put_conflict);
table_case!(update_upsert_and_add);
table_case!(conditions_semantics);
table_case!(transact_reports_failing_index);
table_case!(transact_rejects_invalid);
table_case!(query_prefix_and_pagination);
table_case!(query_range_and_pagination);
table_case!(item_and_transaction_sizes);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_all_or_nothing() {
    let env = fresh();
    table::transactions_all_or_nothing(Arc::new(env.store.clone())).await;
}

stream_case!(change_stream_delivers_every_committed_write_in_order);
stream_case!(change_stream_skips_unchanged_writes);
stream_case!(change_stream_resumes_after_commit);

queue_case!(queue_send_receive_delete, "conf-a");
queue_case!(queue_send_many, "conf-b");
queue_case!(queue_delay, "conf-c");
queue_case!(queue_visibility_timeout, "conf-d");
queue_case!(queue_change_visibility, "conf-e");
queue_case!(queue_stale_receipt, "conf-f");
queue_case!(queue_max_receives_then_dlq, "conf-g");
queue_case!(queue_redrive, "conf-h");
queue_case!(queue_stats, "conf-i");
queue_case!(queue_long_poll, "conf-j");
queue_case!(queue_size_limits, "conf-k");
queue_case!(queue_groups, "conf-l");

/// All table and stream cases on one shared in-memory store, concurrently (the cases must not
/// step on each other), and the queue cases through `queue::ALL`, as a harness that shares one
/// store would run them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_suite_on_one_shared_store() {
    let store = EmbeddedStore::in_memory().unwrap();
    declare_conformance_queues(&store);
    let s = &store;
    tokio::join!(
        table::item_round_trip(s),
        table::conditional_put_conflict(s),
        table::update_upsert_and_add(s),
        table::conditions_semantics(s),
        table::transact_reports_failing_index(s),
        table::transact_rejects_invalid(s),
        table::query_prefix_and_pagination(s),
        table::transactions_all_or_nothing(Arc::new(store.clone())),
    );
    let feed = store.change_feed("shared");
    stream::change_stream_delivers_every_committed_write_in_order(s, &feed).await;
    let mut cases = Vec::new();
    for (_, name, case) in queue::ALL {
        cases.push(case(s, name));
    }
    futures::future::join_all(cases).await;
}

// ---------------------------------------------------------------------------------------------
// Embedded-only promises.

/// The embedded backend reports every stale receipt as `StaleReceipt` (SQS may not).
#[tokio::test]
async fn embedded_stale_receipts_are_errors() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let store = EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
    store.declare_queue(QueueConfig::new("q", 3)).unwrap();
    store.send_batch("q", vec![OutMessage::new("m")]).await.unwrap();
    let first = store.receive("q", 1, Duration::from_secs(10), Duration::ZERO).await.unwrap().remove(0);
    clock.advance(chrono::Duration::seconds(11));
    let second = store.receive("q", 1, Duration::from_secs(10), Duration::ZERO).await.unwrap().remove(0);
    assert!(matches!(Queues::delete(&store, "q", &first.receipt).await, Err(QueueError::StaleReceipt)));
    assert!(matches!(
        store.change_visibility("q", &first.receipt, Duration::ZERO).await,
        Err(QueueError::StaleReceipt)
    ));
    Queues::delete(&store, "q", &second.receipt).await.unwrap();
    assert!(matches!(Queues::delete(&store, "q", &second.receipt).await, Err(QueueError::StaleReceipt)));
    assert!(matches!(store.receive("nope", 1, Duration::ZERO, Duration::ZERO).await, Err(QueueError::UnknownQueue(_))));
    assert!(matches!(store.redrive("q-dlq").await, Err(QueueError::Invalid(_))), "a DLQ has no DLQ");
    assert!(matches!(
        store.send_batch("q", vec![OutMessage::delayed("x", Duration::from_secs(16 * 60))]).await,
        Err(QueueError::Invalid(_))
    ));
}

/// Delays, visibility, redrive to the DLQ and ages follow the store's clock, here a manual one;
/// a long poll notices the clock moving.
#[tokio::test]
async fn embedded_queues_follow_a_manual_clock() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let store = EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
    store.declare_queue(QueueConfig::new("q", 2)).unwrap();
    let secs = Duration::from_secs;
    let advance = |s: i64| {
        clock.advance(chrono::Duration::seconds(s));
    };

    store.send_batch("q", vec![OutMessage::delayed("later", secs(600))]).await.unwrap();
    assert!(store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap().is_empty(), "delayed");
    let s = store.stats("q").await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed), (0, 0, 1));
    advance(599);
    assert!(store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap().is_empty(), "still delayed");
    advance(1);
    let m = store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(m.len(), 1, "visible once the manual clock passed the delay");
    assert_eq!(m[0].receive_count, 1);
    let s = store.stats("q").await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed, s.oldest_age_s), (0, 1, 0, 600));

    // Visibility follows the clock.
    advance(29);
    assert!(store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap().is_empty(), "in flight");
    advance(1);
    let m = store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(m[0].receive_count, 2);

    // A third receive moves it to the DLQ.
    advance(30);
    assert!(store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap().is_empty(), "moved, not returned");
    let s = store.stats("q").await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed, s.dlq_depth), (0, 0, 0, 1));
    let dead = store.peek_dlq("q", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].body, "later");
    assert_eq!(store.redrive("q").await.unwrap(), 1);

    // A long poll (real time) returns when the manual clock makes a message visible.
    let m = store.receive("q", 10, secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(m[0].receive_count, 1, "redriven messages start again");
    let start = std::time::Instant::now();
    let poll = store.receive("q", 10, secs(30), secs(5));
    let mover = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        advance(31);
    };
    let (got, ()) = tokio::join!(poll, mover);
    assert_eq!(got.unwrap().len(), 1, "the long poll saw the message come back");
    assert!(start.elapsed() < secs(2), "and returned soon after the clock moved ({:?})", start.elapsed());
}

/// The change feed keeps a durable checkpoint per consumer, and old records can be trimmed.
#[tokio::test]
async fn embedded_feed_checkpoints_per_consumer_and_trim() {
    let env = fresh();
    let t = &env.store;
    for i in 0..3 {
        t.put(Item::new(Key::new("p", format!("k{i}")), attrs(json!({"i": i}))), Cond::Always).await.unwrap();
    }
    let a = t.change_feed("a");
    let b = t.change_feed("b");
    let batch = a.next_batch(2).await.unwrap();
    assert_eq!(batch.len(), 2, "max is honoured");
    a.commit(&batch).await.unwrap();
    assert_eq!(a.next_batch(10).await.unwrap().len(), 1, "a resumes after its checkpoint");
    assert_eq!(b.next_batch(10).await.unwrap().len(), 3, "b has its own checkpoint");
    // Committing an older batch does not move the checkpoint back.
    a.commit(&batch[..1]).await.unwrap();
    assert_eq!(a.next_batch(10).await.unwrap().len(), 1);
    assert_eq!(t.min_checkpoint().await.unwrap(), 2);
    assert_eq!(t.trim_changes(2).await.unwrap(), 2);
    assert_eq!(a.next_batch(10).await.unwrap().len(), 1);
    // A waiting reader wakes up when a write commits.
    let last = a.next_batch(10).await.unwrap();
    a.commit(&last).await.unwrap();
    let (got, ()) = tokio::join!(a.next_batch(10), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        t.put(Item::new(Key::new("p", "late"), attrs(json!({}))), Cond::Always).await.unwrap();
    });
    assert_eq!(got.unwrap().len(), 1, "the write made while waiting is delivered");
    // (Without the wake-up, next_batch would have returned empty after its 200 ms wait.)
}

/// Everything committed is there after closing and reopening the file: items, change records,
/// feed checkpoints, queue declarations and messages (with their receive counts).
#[tokio::test]
async fn embedded_survives_reopen() {
    let env = fresh();
    let path = env.dir.path().join("tidings.db");
    {
        let s = &env.store;
        s.put(Item::new(Key::new("d", "put"), attrs(json!({"v": 1}))), Cond::NotExists).await.unwrap();
        s.transact(vec![
            Write::Put { item: Item::new(Key::new("d", "tx1"), attrs(json!({"a": 1}))), cond: Cond::NotExists },
            Write::Update { key: Key::new("d", "tx2"), updates: vec![Update::add("n", 7)], cond: Cond::Always },
        ])
        .await
        .unwrap();
        s.send_batch("conf-a", vec![OutMessage::new("one"), OutMessage::new("two")]).await.unwrap();
        let got = s.receive("conf-a", 1, Duration::from_secs(3600), Duration::ZERO).await.unwrap();
        assert_eq!(got.len(), 1);
        s.send_to_dlq("conf-a", "dead".into()).await.unwrap();
        let feed = s.change_feed("relay");
        let batch = feed.next_batch(1).await.unwrap();
        feed.commit(&batch).await.unwrap();
    }
    let Env { dir, store } = env;
    drop(store);

    let store = EmbeddedStore::open(&path).unwrap();
    assert_eq!(store.get(&Key::new("d", "put")).await.unwrap().unwrap().attrs, attrs(json!({"v": 1})));
    assert_eq!(store.get(&Key::new("d", "tx1")).await.unwrap().unwrap().attrs, attrs(json!({"a": 1})));
    assert_eq!(store.get(&Key::new("d", "tx2")).await.unwrap().unwrap().attrs, attrs(json!({"n": 7})));
    let rest = store.change_feed("relay").next_batch(10).await.unwrap();
    assert_eq!(rest.len(), 2, "the feed resumes after its durable checkpoint");
    assert!(store.queue_names().contains(&"conf-a-dlq".to_string()), "declarations are stored");
    let s = store.stats("conf-a").await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.dlq_depth), (1, 1, 1), "messages survive: {s:?}");
    drop(store);
    drop(dir);
}

/// A process killed with SIGKILL right after its writes returned loses none of them. The test
/// runs this very test binary again as the writer (`sigkill_child_writer`), reads what it
/// reports as committed, kills it with SIGKILL mid-stream, and reopens the file.
#[cfg(unix)]
#[test]
fn embedded_survives_sigkill() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("killed.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["sigkill_child_writer", "--exact", "--nocapture", "--test-threads", "1"])
        .env("TIDINGS_KILL_TEST_DB", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut committed: i64 = -1;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("COMMITTED ") {
            committed = n.trim().parse().unwrap();
            if committed >= 200 {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let _ = child.wait();
    assert!(committed >= 200, "the writer reported {committed} commits");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = EmbeddedStore::open(&path).unwrap();
        for i in 0..=committed {
            let item = store.get(&Key::new("k", format!("{i:06}"))).await.unwrap();
            assert!(item.is_some(), "write {i} (of {committed} reported committed) survived SIGKILL");
        }
        let counter = store.get(&Key::new("counter", "c")).await.unwrap().unwrap();
        assert!(counter.i64("n").unwrap() > committed, "the transactional counter survived");
        let s = store.stats("killq").await.unwrap();
        assert!(s.visible as i64 > committed, "queue messages survived: {s:?}");
        let feed = store.change_feed("after-kill");
        let mut records = 0;
        loop {
            let b = feed.next_batch(1000).await.unwrap();
            if b.is_empty() {
                break;
            }
            records += b.len();
            feed.commit(&b).await.unwrap();
        }
        assert!(records as i64 >= 2 * (committed + 1), "change records survived ({records})");
    });
}

/// The writer side of `embedded_survives_sigkill`. Run on its own (without the variable that
/// names its database) it returns at once: it only writes when the parent test starts it.
#[test]
fn sigkill_child_writer() {
    let Some(path) = std::env::var_os("TIDINGS_KILL_TEST_DB") else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let store = EmbeddedStore::open(Path::new(&path)).unwrap();
        store.declare_queue(QueueConfig::new("killq", 5)).unwrap();
        for i in 0.. {
            store
                .transact(vec![
                    Write::Put {
                        item: Item::new(Key::new("k", format!("{i:06}")), attrs(json!({"i": i}))),
                        cond: Cond::NotExists,
                    },
                    Write::Update {
                        key: Key::new("counter", "c"),
                        updates: vec![Update::add("n", 1)],
                        cond: Cond::Always,
                    },
                ])
                .await
                .unwrap();
            store.send_batch("killq", vec![OutMessage::new(format!("m{i}"))]).await.unwrap();
            println!("COMMITTED {i}");
        }
    });
}
