//! Change-stream cases.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tidings_core::ports::{ChangeFeed, ChangeRecord, Cond, Item, Key, StoreError, Table, Update, Write};

use crate::{attrs, run_id};

/// How long a case waits for its records (emulated streams can be slow).
const STREAM_DEADLINE: Duration = Duration::from_secs(30);
/// How long a case keeps reading after it has everything, to catch records that should not be.
const QUIET: Duration = Duration::from_millis(1500);

/// Compares two stream sequence numbers (decimal strings, possibly of different lengths).
pub fn cmp_seq(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

type Image = (Option<Value>, Option<Value>);

fn image(r: &ChangeRecord) -> Image {
    (r.old.clone().map(Value::Object), r.new.clone().map(Value::Object))
}

/// Reads the feed, committing every batch, until `expected` records whose partition key is
/// `pk` have arrived (then keeps reading for a short quiet period). Returns them grouped by
/// sort key, in stream order. Checks at-least-once on the first batch that holds one of ours:
/// read again without committing, it comes back.
async fn drain(feed: &dyn ChangeFeed, pk: &str, expected: usize) -> BTreeMap<String, Vec<ChangeRecord>> {
    let mut ours: Vec<ChangeRecord> = Vec::new();
    let mut checked_redelivery = false;
    let deadline = tokio::time::Instant::now() + STREAM_DEADLINE;
    let mut quiet_until: Option<tokio::time::Instant> = None;
    loop {
        let now = tokio::time::Instant::now();
        if let Some(q) = quiet_until {
            if now >= q {
                break;
            }
        } else if now >= deadline {
            break;
        }
        let batch = feed.next_batch(100).await.unwrap();
        let mine: Vec<&ChangeRecord> = batch.iter().filter(|r| r.key.pk == pk).collect();
        if !mine.is_empty() && !checked_redelivery {
            checked_redelivery = true;
            let first = mine[0].clone();
            // Not committed: the same record must come again (at least once).
            let mut again = Vec::new();
            let until = tokio::time::Instant::now() + STREAM_DEADLINE;
            while tokio::time::Instant::now() < until {
                again = feed.next_batch(100).await.unwrap();
                if !again.is_empty() {
                    break;
                }
            }
            assert!(
                again.iter().any(|r| r.seq == first.seq && r.key == first.key),
                "a record that was not committed is delivered again (first {first:?}, again {again:?})"
            );
            // Continue from the redelivered batch (it may hold more than the first).
            let again_mine: Vec<ChangeRecord> = again.iter().filter(|r| r.key.pk == pk).cloned().collect();
            ours.extend(again_mine);
            feed.commit(&again).await.unwrap();
        } else {
            ours.extend(mine.into_iter().cloned());
            feed.commit(&batch).await.unwrap();
        }
        if ours.len() >= expected && quiet_until.is_none() {
            quiet_until = Some(tokio::time::Instant::now() + QUIET);
        }
    }
    let mut by_key: BTreeMap<String, Vec<ChangeRecord>> = BTreeMap::new();
    for r in ours {
        by_key.entry(r.key.sk.clone()).or_default().push(r);
    }
    for (sk, records) in &by_key {
        for pair in records.windows(2) {
            assert_eq!(
                cmp_seq(&pair[0].seq, &pair[1].seq),
                Ordering::Less,
                "{sk}: sequence numbers increase per key ({} then {})",
                pair[0].seq,
                pair[1].seq
            );
        }
    }
    by_key
}

fn assert_images(by_key: &BTreeMap<String, Vec<ChangeRecord>>, sk: &str, expected: &[Image]) {
    let got: Vec<Image> = by_key.get(sk).map(|rs| rs.iter().map(image).collect()).unwrap_or_default();
    assert_eq!(got, expected, "{sk}: the change records (old, new), in commit order");
}

/// Every committed write (put, update, delete, inside transactions too) appears once, in order
/// per key, with the right old and new images; failed writes, `Check`s and deletes of missing
/// items produce nothing; a batch that was not committed comes again.
pub async fn change_stream_delivers_every_committed_write_in_order(t: &dyn Table, feed: &dyn ChangeFeed) {
    let pk = format!("cs-{}", run_id());
    let k = |sk: &str| Key::new(&pk, sk);
    let it = |sk: &str, v: Value| Item::new(k(sk), attrs(v));

    t.put(it("k1", json!({"v": 1})), Cond::NotExists).await.unwrap();
    assert!(t.put(it("k1", json!({"v": 9})), Cond::NotExists).await.is_err(), "create-only put fails");
    t.update(&k("k1"), vec![Update::add("v", 1)], Cond::Always).await.unwrap();
    assert!(t.update(&k("k1"), vec![Update::add("v", 1)], Cond::eq("v", 100)).await.is_err(), "guarded update fails");
    t.put(it("k2", json!({"w": "x"})), Cond::Always).await.unwrap();
    t.delete(&k("k2"), Cond::Always).await.unwrap();
    t.delete(&k("k3"), Cond::Always).await.unwrap(); // missing: no record
    assert!(t.delete(&k("k1"), Cond::eq("v", 1)).await.is_err(), "guarded delete fails");
    t.transact(vec![
        Write::Put { item: it("k3", json!({"z": 1})), cond: Cond::NotExists },
        Write::Update { key: k("k1"), updates: vec![Update::set("v", 3)], cond: Cond::eq("v", 2) },
        Write::Check { key: k("k2"), cond: Cond::NotExists },
    ])
    .await
    .unwrap();
    let failed = t
        .transact(vec![
            Write::Put { item: it("k4", json!({"never": true})), cond: Cond::Always },
            Write::Check { key: k("k1"), cond: Cond::eq("v", 999) },
        ])
        .await;
    assert!(matches!(failed, Err(StoreError::ConditionFailed { index: 1 })), "failing transaction: {failed:?}");
    t.delete(&k("k1"), Cond::eq("v", 3)).await.unwrap();

    let by_key = drain(feed, &pk, 7).await;
    assert_images(
        &by_key,
        "k1",
        &[
            (None, Some(json!({"v": 1}))),
            (Some(json!({"v": 1})), Some(json!({"v": 2}))),
            (Some(json!({"v": 2})), Some(json!({"v": 3}))),
            (Some(json!({"v": 3})), None),
        ],
    );
    assert_images(&by_key, "k2", &[(None, Some(json!({"w": "x"}))), (Some(json!({"w": "x"})), None)]);
    assert_images(&by_key, "k3", &[(None, Some(json!({"z": 1})))]);
    assert_images(&by_key, "k4", &[]);
    assert_eq!(by_key.len(), 3, "records only for k1, k2, k3: {:?}", by_key.keys().collect::<Vec<_>>());
    assert!(by_key["k1"][0].is_insert() && !by_key["k1"][1].is_insert(), "is_insert");
}

/// A write that leaves the item as it was (an identical put, an update that changes nothing)
/// produces no record, as in DynamoDB Streams.
pub async fn change_stream_skips_unchanged_writes(t: &dyn Table, feed: &dyn ChangeFeed) {
    let pk = format!("cs-same-{}", run_id());
    let k = Key::new(&pk, "k");
    t.put(Item::new(k.clone(), attrs(json!({"v": 1, "s": "a"}))), Cond::Always).await.unwrap();
    t.put(Item::new(k.clone(), attrs(json!({"s": "a", "v": 1}))), Cond::Always).await.unwrap();
    t.update(&k, vec![Update::set("v", 1), Update::SetIfAbsent("s".into(), json!("b"))], Cond::Always).await.unwrap();
    t.update(&k, vec![Update::add("v", 1)], Cond::Always).await.unwrap();
    let by_key = drain(feed, &pk, 2).await;
    assert_images(
        &by_key,
        "k",
        &[(None, Some(json!({"v": 1, "s": "a"}))), (Some(json!({"v": 1, "s": "a"})), Some(json!({"v": 2, "s": "a"})))],
    );
}

/// After a commit, the committed records do not come again, and later writes do.
pub async fn change_stream_resumes_after_commit(t: &dyn Table, feed: &dyn ChangeFeed) {
    let pk = format!("cs-resume-{}", run_id());
    for i in 0..5 {
        t.put(Item::new(Key::new(&pk, format!("k{i}")), attrs(json!({"i": i}))), Cond::Always).await.unwrap();
    }
    let first = drain(feed, &pk, 5).await;
    assert_eq!(first.len(), 5, "five inserts: {first:?}");
    for i in 5..8 {
        t.put(Item::new(Key::new(&pk, format!("k{i}")), attrs(json!({"i": i}))), Cond::Always).await.unwrap();
    }
    let second = drain(feed, &pk, 3).await;
    let keys: Vec<&String> = second.keys().collect();
    assert_eq!(keys, ["k5", "k6", "k7"], "only the records after the commit come");
}
