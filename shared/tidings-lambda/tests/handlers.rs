//! The Lambda handlers, fed real event JSON (the shapes Lambda delivers), on the embedded
//! backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use serde_json::json;
use tidings_core::dev::{DevProvider, FaultConfig, FaultMode, NullProvider, list_sends};
use tidings_core::keys;
use tidings_core::ports::{Channel, Clock, Cond, Item, Provider, Queues, SystemClock, Table, attrs_of};
use tidings_core::{Deps, Providers, TenantId};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

struct Fixture {
    deps: Deps,
    store: EmbeddedStore,
    email: Arc<DevProvider>,
}

fn fixture() -> Fixture {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
    let table: Arc<dyn Table> = Arc::new(store.clone());
    let dev =
        |c| Arc::new(DevProvider::new(c, Arc::new(NullProvider) as Arc<dyn Provider>, table.clone(), clock.clone()));
    let (email, sms, push) = (dev(Channel::Email), dev(Channel::Sms), dev(Channel::Push));
    let tw = TestWorld::builder()
        .system_clock()
        .store(store)
        .queues(tidings_lambda::ALL_QUEUES, 5)
        .providers(Providers { email: email.clone(), sms, push })
        .build();
    Fixture { deps: tw.deps, store: tw.store, email }
}

fn load<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test]
async fn stream_event_relays_new_notifications_only() {
    let f = fixture();
    let event: DynamoDbEvent = load("dynamodb-stream-notification.json");
    let response = tidings_lambda::handle_stream_event(&f.deps, &tidings_core::inbox::live::NoLive, event).await;
    assert!(response.batch_item_failures.is_empty());
    let got = f.deps.queues.receive("requests-high", 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1, "one request for the one new notification; the profile change is ignored");
    let body: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(body, json!({"tenant": "acme", "notification_id": "n1"}));
}

#[tokio::test]
async fn stream_records_round_trip_through_the_lambda_shape() {
    let event: DynamoDbEvent = load("dynamodb-stream-notification.json");
    for record in &event.records {
        let change = tidings_lambda::change_record_of(record).unwrap();
        let back = tidings_lambda::event_record_of(&change).unwrap();
        assert_eq!(tidings_lambda::change_record_of(&back).unwrap(), change);
    }
    let modify = tidings_lambda::change_record_of(&event.records[1]).unwrap();
    assert_eq!(modify.old.as_ref().unwrap().get("email"), None);
    assert_eq!(modify.new.as_ref().unwrap()["email"], "a@b.co");
    assert!(!modify.new.as_ref().unwrap().contains_key("pk"), "the key is not an attribute");
}

async fn pending_delivery(f: &Fixture) {
    let t = TenantId::parse("acme").unwrap();
    let d = json!({"user_id": "u1", "channel": "email", "status": "pending", "attempts": 0,
                   "category": "transactional", "updated_at": "2026-11-29T12:00:00Z"});
    let key = keys::delivery(&t, "n1", "u1", Channel::Email);
    f.deps.table.put(Item::new(key, attrs_of(&d).unwrap()), Cond::Always).await.unwrap();
}

#[tokio::test]
async fn sqs_batch_sends_and_rejects_malformed_messages_to_the_dlq() {
    let f = fixture();
    pending_delivery(&f).await;
    let event: SqsEvent = load("sqs-channel-tasks.json");
    let response = tidings_lambda::handle_sqs_batch(&f.deps, "tidings-", event).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let sends = list_sends(f.deps.table.as_ref(), Some("u1"), Some(Channel::Email)).await.unwrap();
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].to, "alice@example.com");
    let stats = f.store.stats("email-high").await.unwrap();
    assert_eq!(stats.dlq_depth, 1, "the malformed message went to the DLQ");
    let dead = f.store.peek_dlq("email-high", 10).await.unwrap();
    assert!(dead[0].body.contains("malformed channel task"), "{}", dead[0].body);
    assert!(dead[0].body.contains("this is not a channel task"), "the original body is kept");
}

#[tokio::test]
async fn sqs_batch_reports_transient_failures_as_batch_item_failures() {
    let f = fixture();
    pending_delivery(&f).await;
    f.email.configure(FaultConfig {
        mode: FaultMode::Fail5xx,
        retry_after_s: None,
        fail_first_n: None,
        delay_ms: None,
    });
    let mut event: SqsEvent = load("sqs-channel-tasks.json");
    event.records.truncate(1);
    let response = tidings_lambda::handle_sqs_batch(&f.deps, "tidings-", event.clone()).await;
    let ids: Vec<_> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
    assert_eq!(ids, vec!["m-good".to_string()]);
    // A duplicate of an already sent message is acknowledged without a second send.
    f.email.configure(FaultConfig::default());
    let response = tidings_lambda::handle_sqs_batch(&f.deps, "tidings-", event.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    let response = tidings_lambda::handle_sqs_batch(&f.deps, "tidings-", event).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(list_sends(f.deps.table.as_ref(), None, None).await.unwrap().len(), 1);
}

#[test]
fn queue_names_come_from_arns_and_urls() {
    assert_eq!(
        tidings_lambda::logical_queue_name("arn:aws:sqs:eu-west-1:1:tidings-email-high", "tidings-"),
        "email-high"
    );
    assert_eq!(
        tidings_lambda::logical_queue_name("https://sqs.eu-west-1.amazonaws.com/1/prod-requests-low", "prod-"),
        "requests-low"
    );
}

#[tokio::test]
async fn a_function_with_two_triggers_tells_a_schedule_from_a_queue_batch() {
    let f = fixture();
    pending_delivery(&f).await;
    let schedule: serde_json::Value = load("eventbridge-schedule.json");
    let ran = tidings_lambda::handle_queue_or_schedule(f.deps.clone(), "tidings-", schedule, |_deps| async {
        Ok(json!({"job": "ran"}))
    })
    .await
    .unwrap();
    assert_eq!(ran, json!({"job": "ran"}), "a scheduled event runs the job");

    let batch: serde_json::Value = load("sqs-channel-tasks.json");
    let answer = tidings_lambda::handle_queue_or_schedule(f.deps.clone(), "tidings-", batch, |_deps| async {
        panic!("a queue batch must not run the scheduled job")
    })
    .await
    .unwrap();
    assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    assert_eq!(list_sends(f.deps.table.as_ref(), None, None).await.unwrap().len(), 1);
}
