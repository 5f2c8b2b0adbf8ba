//! The relay's stream batches: the first record that failed is the one reported (so the event
//! source mapping retries, and bisects, from it and never drops what follows it), and a poison
//! record is recorded alone on the stream-failures queue, with its keys, while every other
//! record of its batch is relayed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use serde_json::{Value, json};
use tidings_core::Deps;
use tidings_core::inbox::live::NoLive;
use tidings_core::notify::relay::{POISON_CONDITION, STREAM_FAILURES_QUEUE, StreamFailure};
use tidings_embedded::test_world::TestWorld;

/// The embedded backend with only these queues declared (a send to another one fails).
fn fixture(queues: &[&'static str]) -> Deps {
    TestWorld::builder().system_clock().queues(queues, 5).build().deps
}

fn keys(id: &str) -> Value {
    json!({"pk": {"S": format!("T#acme#N#{id}")}, "sk": {"S": "N"}})
}

/// A new notification's stream record (`priority` picks its request queue).
fn notification(id: &str, priority: &str, seq: &str) -> Value {
    let mut image = keys(id);
    let fields = json!({
        "notification_id": {"S": id}, "status": {"S": "accepted"}, "priority": {"S": priority},
        "body_hash": {"S": "abc"}, "created_at": {"S": "2026-11-29T12:00:00.000Z"},
        "created_ms": {"N": "1764417600000"},
        "request": {"M": {"recipients": {"M": {"user_ids": {"L": [{"S": "u1"}]}}}, "template_id": {"S": "t"},
            "params": {"M": {}}, "category": {"S": "transactional"}}}
    });
    image.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
    record(keys(id), Some(image), seq)
}

fn record(keys: Value, new: Option<Value>, seq: &str) -> Value {
    let mut change = json!({"ApproximateCreationDateTime": 1764400000, "Keys": keys, "SequenceNumber": seq,
        "SizeBytes": 300, "StreamViewType": "NEW_AND_OLD_IMAGES"});
    if let Some(new) = new {
        change["NewImage"] = new;
    }
    json!({
        "eventID": seq, "eventName": "INSERT", "eventVersion": "1.1", "eventSource": "aws:dynamodb",
        "awsRegion": "eu-west-1", "dynamodb": change,
        "eventSourceARN": "arn:aws:dynamodb:eu-west-1:123456789012:table/tidings/stream/2026-11-29T00:00:00.000"
    })
}

fn event(records: Vec<Value>) -> DynamoDbEvent {
    serde_json::from_value(json!({"Records": records})).unwrap()
}

async fn relayed(deps: &Deps, queue: &str) -> Vec<String> {
    let got = deps.queues.receive(queue, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    got.iter()
        .map(|m| serde_json::from_str::<Value>(&m.body).unwrap()["notification_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn failures(deps: &Deps) -> Vec<StreamFailure> {
    let got = deps.queues.receive(STREAM_FAILURES_QUEUE, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    got.iter().map(|m| serde_json::from_str(&m.body).unwrap()).collect()
}

#[tokio::test]
async fn the_first_record_that_failed_is_reported_not_the_batchs_first() {
    // requests-normal is missing: n2's send fails, n1's and n3's do not.
    let deps = fixture(&["requests-high", STREAM_FAILURES_QUEUE]);
    let batch = event(vec![
        notification("n1", "high", "100"),
        notification("n2", "normal", "200"),
        notification("n3", "high", "300"),
    ]);
    let response = tidings_lambda::handle_stream_event(&deps, &NoLive, batch).await;
    let failed: Vec<_> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone().unwrap()).collect();
    assert_eq!(failed, ["200"], "the mapping is to retry from n2, with n1 done");
    assert!(relayed(&deps, "requests-high").await.contains(&"n1".to_owned()), "n1, before the failure, is relayed");
}

#[tokio::test]
async fn a_poison_record_is_recorded_alone_with_its_keys_and_the_rest_relayed() {
    let deps = fixture(&["requests-high", STREAM_FAILURES_QUEUE]);
    let batch = event(vec![
        notification("n1", "high", "100"),
        // An insert of a notification item that does not parse: it can never be relayed.
        record(keys("bad"), Some(json!({"pk": {"S": "T#acme#N#bad"}, "sk": {"S": "N"}, "status": {"N": "7"}})), "200"),
        notification("n3", "high", "300"),
    ]);
    let response = tidings_lambda::handle_stream_event(&deps, &NoLive, batch).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let mut ids = relayed(&deps, "requests-high").await;
    ids.sort();
    assert_eq!(ids, ["n1", "n3"], "every other record of the batch is relayed");
    let failures = failures(&deps).await;
    assert_eq!(failures.len(), 1, "the poison record alone: {failures:?}");
    let f = &failures[0];
    assert_eq!(f.context.condition, POISON_CONDITION);
    assert!(f.context.reason.as_deref().unwrap().contains("unreadable notification"), "{:?}", f.context.reason);
    assert_eq!((f.batch.batch_size, f.batch.start_sequence_number.as_deref()), (1, Some("200")));
    assert_eq!(f.batch.end_sequence_number.as_deref(), Some("200"));
    let key = f.key().unwrap();
    assert_eq!((key.pk.as_str(), key.sk.as_str()), ("T#acme#N#bad", "N"));
}

#[tokio::test]
async fn a_poison_record_not_recorded_is_the_first_failure() {
    // No stream-failures queue: the poison record cannot be set aside, so it comes again.
    let deps = fixture(&["requests-high"]);
    let batch = event(vec![
        notification("n1", "high", "100"),
        record(json!({"pk": {"N": "1"}}), None, "200"),
        notification("n3", "high", "300"),
    ]);
    let response = tidings_lambda::handle_stream_event(&deps, &NoLive, batch).await;
    let failed: Vec<_> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone().unwrap()).collect();
    assert_eq!(failed, ["200"]);
    assert!(relayed(&deps, "requests-high").await.contains(&"n1".to_owned()));
}
