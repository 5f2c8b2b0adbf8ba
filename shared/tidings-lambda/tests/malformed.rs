//! Malformed queue messages and stream records never crash a batch: garbage on every queue goes
//! to that queue's DLQ with a reason (never a panic, never a batch item failure that would bring
//! it back forever), and unreadable stream records are recorded on the stream-failures queue
//! while the rest of the batch is relayed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::{Value, json};
use tidings_core::Deps;
use tidings_core::messages::Rejected;
use tidings_core::ports::Queues;
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

fn fixture() -> (Deps, EmbeddedStore) {
    let tw = TestWorld::builder()
        .system_clock()
        .queues(tidings_lambda::ALL_QUEUES, 5)
        .queues(&[tidings_core::notify::relay::STREAM_FAILURES_QUEUE], 1000)
        .build();
    (tw.deps, tw.store)
}

/// Bodies no queue's handler can read.
fn garbage_bodies() -> Vec<String> {
    vec![
        String::new(),
        "this is not JSON".into(),
        "null".into(),
        "42".into(),
        "[]".into(),
        "\"a string\"".into(),
        "{\"tenant\": 7}".into(),
        "{\"tenant\": \"a#b\", \"notification_id\": []}".into(),
        "{".into(),
        "\u{0}\u{1}\u{7f}".into(),
        // Deeper than serde_json's recursion limit: an error, not a stack overflow.
        format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
        "x".repeat(300_000),
    ]
}

fn sqs_record(queue: &str, i: usize, body: Option<String>) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(format!("m-{queue}-{i}"));
    m.receipt_handle = Some(format!("rh-{queue}-{i}"));
    m.body = body;
    // Unparseable attributes are read as defaults, not errors.
    m.attributes.insert("ApproximateReceiveCount".into(), "many".into());
    m.attributes.insert("SentTimestamp".into(), "-".into());
    m.event_source = Some("aws:sqs".into());
    m.event_source_arn = Some(format!("arn:aws:sqs:eu-west-1:123456789012:tidings-{queue}"));
    m
}

#[tokio::test]
async fn garbage_on_every_queue_goes_to_its_dlq_and_the_batch_goes_on() {
    let (deps, store) = fixture();
    let bodies = garbage_bodies();
    for queue in tidings_lambda::ALL_QUEUES {
        let mut event = SqsEvent::default();
        for (i, body) in bodies.iter().enumerate() {
            event.records.push(sqs_record(queue, i, Some(body.clone())));
        }
        // A record without a body, id or receipt at all.
        event.records.push(sqs_record(queue, bodies.len(), None));
        event.records.last_mut().unwrap().message_id = None;
        let response = tidings_lambda::handle_sqs_batch(&deps, "tidings-", event).await;
        assert!(
            response.batch_item_failures.is_empty(),
            "{queue}: malformed messages must not come back: {:?}",
            response.batch_item_failures
        );
        let stats = store.stats(queue).await.unwrap();
        assert_eq!(stats.dlq_depth as usize, bodies.len() + 1, "{queue}: every malformed message is dead-lettered");
        for dead in store.peek_dlq(queue, 100).await.unwrap() {
            let rejected: Rejected = serde_json::from_str(&dead.body).unwrap();
            assert!(!rejected.rejected.is_empty(), "{queue}: a reason is given");
            assert_eq!(rejected.queue, *queue);
        }
    }
}

/// A stream record shaped like the fixture's, with these keys and new image.
fn stream_record(name: &str, keys: Value, new: Option<Value>, seq: &str) -> Value {
    let path = format!("{}/tests/fixtures/dynamodb-stream-notification.json", env!("CARGO_MANIFEST_DIR"));
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut record = fixture["Records"][0].clone();
    record["eventName"] = json!(name);
    record["eventID"] = json!(seq);
    let change = &mut record["dynamodb"];
    change["Keys"] = keys;
    change["SequenceNumber"] = json!(seq);
    match new {
        Some(new) => change["NewImage"] = new,
        None => {
            change.as_object_mut().unwrap().remove("NewImage");
        }
    }
    record
}

#[tokio::test]
async fn unreadable_stream_records_are_recorded_and_the_rest_relayed() {
    let (deps, _store) = fixture();
    let key = |pk: &str, sk: &str| json!({"pk": {"S": pk}, "sk": {"S": sk}});
    let good = json!({
        "pk": {"S": "T#acme#N#n1"}, "sk": {"S": "N"}, "notification_id": {"S": "n1"},
        "status": {"S": "accepted"}, "priority": {"S": "high"}, "body_hash": {"S": "abc"},
        "created_at": {"S": "2026-11-29T12:00:00.000Z"}, "created_ms": {"N": "1764417600000"},
        "request": {"M": {"recipients": {"M": {"user_ids": {"L": [{"S": "u1"}]}}}, "template_id": {"S": "t"},
            "params": {"M": {}}, "category": {"S": "transactional"}}}
    });
    let records = vec![
        // Not a Tidings item: no key, a numeric key, a key without sk.
        stream_record("INSERT", json!({}), Some(json!({"x": {"S": "y"}})), "1"),
        stream_record("INSERT", json!({"pk": {"N": "1"}, "sk": {"N": "2"}}), None, "2"),
        stream_record("INSERT", json!({"pk": {"S": "T#acme#N#n0"}}), None, "3"),
        // A notification record that does not parse, and one without a tenant in its key.
        stream_record("INSERT", key("T#acme#N#n2", "N"), Some(json!({"status": {"N": "42"}})), "4"),
        stream_record("INSERT", key("nonsense", "N"), Some(good.clone()), "5"),
        // A stock record whose round is not a number.
        stream_record("MODIFY", key("T#acme#SKU#1001", "STOCK"), Some(json!({"restock_round": {"S": "x"}})), "6"),
        // An unknown event name.
        stream_record("EXPLODE", key("T#acme#N#n3", "N"), Some(good.clone()), "7"),
        // The one good record.
        stream_record("INSERT", key("T#acme#N#n1", "N"), Some(good), "8"),
    ];
    let event: DynamoDbEvent = serde_json::from_value(json!({"Records": records})).unwrap();
    let response = tidings_lambda::handle_stream_event(&deps, &tidings_core::inbox::live::NoLive, event).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let got = deps.queues.receive("requests-high", 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    let ids: Vec<Value> =
        got.iter().map(|m| serde_json::from_str::<Value>(&m.body).unwrap()["notification_id"].clone()).collect();
    // The unknown event name carries n1's image without an old image: read as an insert (the
    // orchestrator is idempotent, so a second request for n1 is harmless).
    assert!(!ids.is_empty() && ids.iter().all(|id| id == "n1"), "only the good notification is relayed: {ids:?}");
    // Records 1 to 5 can never be relayed: each is recorded alone, with its sequence number.
    let failures = deps
        .queues
        .receive(tidings_core::notify::relay::STREAM_FAILURES_QUEUE, 10, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let mut seqs: Vec<String> = failures
        .iter()
        .map(|m| {
            let f: tidings_core::notify::relay::StreamFailure = serde_json::from_str(&m.body).unwrap();
            assert_eq!(f.batch.batch_size, 1);
            assert_eq!(f.context.condition, tidings_core::notify::relay::POISON_CONDITION);
            f.batch.start_sequence_number.unwrap()
        })
        .collect();
    seqs.sort();
    assert_eq!(seqs, ["1", "2", "3", "4", "5"]);
}
