//! The local runtime: stands in for Lambda's event source mappings and EventBridge schedules.
//! It reads the change stream and the queues, builds the same `DynamoDbEvent` / `SqsEvent`
//! values Lambda would, and calls the very handlers the Lambda functions call.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use tidings_core::Deps;
use tidings_core::ports::ChangeFeed;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, warn};

/// Workers per queue (bounded concurrency: one of the three gates).
pub const WORKERS_PER_QUEUE: usize = 2;

/// Starts the relay and the queue workers; they stop when `stop` turns true.
pub fn start(
    deps: Deps,
    feed: Arc<dyn ChangeFeed>,
    queues: Vec<String>,
    arn_prefix: String,
    stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    set.spawn(relay_loop(deps.clone(), feed, stop.clone()));
    for queue in queues.into_iter().filter(|q| tidings_core::messages::is_consumed(q)) {
        for _ in 0..WORKERS_PER_QUEUE {
            set.spawn(queue_loop(deps.clone(), queue.clone(), format!("{arn_prefix}{queue}"), stop.clone()));
        }
    }
    set
}

async fn relay_loop(deps: Deps, feed: Arc<dyn ChangeFeed>, stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let records = match feed.next_batch(100).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "reading the change stream failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if records.is_empty() {
            continue;
        }
        let mut event = DynamoDbEvent::default();
        for r in &records {
            match tidings_lambda::event_record_of(r) {
                Ok(rec) => event.records.push(rec),
                Err(e) => error!(error = %e, "unconvertible change record skipped"),
            }
        }
        let response = tidings_lambda::handle_stream_event(&deps, event).await;
        if response.batch_item_failures.is_empty() {
            if let Err(e) = feed.commit(&records).await {
                warn!(error = %e, "committing the stream position failed; records will come again");
            }
        } else {
            // Not committed: the same records come again (at least once), after a pause.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn queue_loop(deps: Deps, queue: String, arn: String, stop: watch::Receiver<bool>) {
    let visibility = deps.config.visibility;
    while !*stop.borrow() {
        let received = match deps.queues.receive(&queue, 10, visibility, Duration::from_secs(1)).await {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, queue, "receive failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if received.is_empty() {
            continue;
        }
        let mut event = SqsEvent::default();
        event.records = received.iter().map(|r| tidings_lambda::sqs_message_of(r, &arn)).collect();
        let response = tidings_lambda::handle_sqs_event(&deps, &queue, event).await;
        // What Lambda's event source mapping does: delete what did not fail.
        for r in &received {
            if response.batch_item_failures.iter().any(|f| f.item_identifier == r.message_id) {
                continue;
            }
            if let Err(e) = deps.queues.delete(&queue, &r.receipt).await {
                warn!(error = %e, queue, "delete failed; the message will come again");
            }
        }
    }
}
