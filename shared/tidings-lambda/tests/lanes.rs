//! A function serves only the lanes its `main` names: a record of another queue is refused to
//! that queue's DLQ with the reason, and the batch goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use aws_lambda_events::event::sqs::SqsEvent;
use tidings_core::lanes::Lane;
use tidings_core::notify::model::Priority;
use tidings_core::ports::Queues;
use tidings_core::router::consumers::Orchestrator;
use tidings_embedded::test_world::TestWorld;

fn record(queue: &str, id: &str, body: &str) -> aws_lambda_events::event::sqs::SqsMessage {
    let mut m = aws_lambda_events::event::sqs::SqsMessage::default();
    m.message_id = Some(id.into());
    m.receipt_handle = Some(format!("r-{id}"));
    m.body = Some(body.into());
    m.event_source_arn = Some(format!("arn:aws:sqs:us-east-1:123456789012:tidings-{queue}"));
    m
}

#[tokio::test]
async fn a_record_of_a_lane_the_function_does_not_serve_is_refused_to_its_dlq() {
    let tw = TestWorld::builder().system_clock().queues(tidings_lambda::ALL_QUEUES, 5).build();
    let mut event = SqsEvent::default();
    // A timer on the orchestrator's mapping, and a request it does serve (malformed: rejected
    // by its handler, not refused).
    event.records = vec![record("timers", "m1", r#"{"due_ms": 0}"#), record("requests-high", "m2", "not json")];
    let lanes = [Lane::Requests(Priority::High), Lane::Requests(Priority::Normal), Lane::Requests(Priority::Low)];
    let response =
        tidings_lambda::handle_lanes_batch_until::<Orchestrator>(&tw.deps, "tidings-", &lanes, event, None).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let refused = tw.store.peek_dlq("timers", 10).await.unwrap();
    assert_eq!(refused.len(), 1);
    assert!(refused[0].body.contains("does not serve queue timers"), "{}", refused[0].body);
    let rejected = tw.store.peek_dlq("requests-high", 10).await.unwrap();
    assert!(rejected[0].body.contains("malformed request message"), "{}", rejected[0].body);
    assert_eq!(tw.deps.queues.stats("timers").await.unwrap().dlq_depth, 1);
}

#[tokio::test]
async fn a_record_of_a_lane_whose_handler_the_function_does_not_link_is_refused_to_its_dlq() {
    // A mapping and a `main` that both name the timers, in a function built with the
    // orchestrator's handlers only: the timer is not run by a handler that is not there.
    let tw = TestWorld::builder().system_clock().queues(tidings_lambda::ALL_QUEUES, 5).build();
    let mut event = SqsEvent::default();
    event.records = vec![record("timers", "m1", r#"{"due_ms": 0}"#)];
    let lanes = [Lane::Timers];
    let response =
        tidings_lambda::handle_lanes_batch_until::<Orchestrator>(&tw.deps, "tidings-", &lanes, event, None).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    let refused = tw.store.peek_dlq("timers", 10).await.unwrap();
    assert_eq!(refused.len(), 1);
    assert!(refused[0].body.contains("does not handle queue timers"), "{}", refused[0].body);
}
