//! Lambda event shapes to and from the core. The Lambda functions call these, and so does the
//! local runtime, which builds the same `SqsEvent` / `DynamoDbEvent` values from what the
//! embedded backend or the emulator returns: one code path in both places.

pub mod ws;

use aws_lambda_events::dynamodb::{Event as DynamoDbEvent, EventRecord};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use serde_json::Value;
use tidings_core::Deps;
use tidings_core::inbox::live::LivePush;
use tidings_core::lanes::Lane;
use tidings_core::messages::settle_batch;
use tidings_core::notify::relay;
use tidings_core::ports::table::stored;
use tidings_core::ports::{Attrs, ChangeRecord, Clock, Key, OutMessage, Received, SystemClock};
use tidings_core::router::{Every, Handlers, dispatch_batch_with};
use tracing::{error, warn};

/// Every queue of a deployment, by logical name.
pub const ALL_QUEUES: &[&str] = tidings_core::messages::ALL_QUEUES;

/// One tracing set-up for every function: JSON lines (CloudWatch), level from `TIDINGS_LOG`.
pub fn init_tracing() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Targets and levels (`info,tidings_core=debug`), not `EnvFilter`'s span and field
    // matchers: those need a regex engine in every function (docs/deploy.md, "The functions'
    // size").
    let filter = std::env::var("TIDINGS_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO));
    let format = tracing_subscriber::fmt::layer().json().with_current_span(false).without_time();
    tracing_subscriber::registry().with(format).with(filter).init();
    tidings_core::metrics::install();
}

/// The `function` dimension of this process's metrics.
static FUNCTION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names this process's function in its metrics: Lambda's name for it
/// (`AWS_LAMBDA_FUNCTION_NAME`, what the dashboard's `!Ref`s give), else `role` (the binary's
/// name); and counts the environment's start ([`tidings_core::metrics::COLD_STARTS`]).
pub fn init_metrics(role: &str) {
    let name = std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok().filter(|v| !v.is_empty());
    let _ = FUNCTION.set(name.unwrap_or_else(|| role.to_owned()));
    tidings_core::metrics::cold_start();
}

/// The metrics gathered since the last flush, as CloudWatch embedded-metric-format documents.
pub fn metrics_documents() -> Vec<String> {
    let function = FUNCTION.get().map_or("unknown", String::as_str);
    tidings_core::metrics::installed()
        .map(|r| r.emf(tidings_core::metrics::NAMESPACE, function, SystemClock.now_ms()))
        .unwrap_or_default()
}

/// Writes the metrics gathered since the last flush as CloudWatch embedded-metric-format
/// lines on stdout, where Lambda's log stream turns them into metrics (namespace `Tidings`)
/// with no API call. Called at the end of every invocation.
pub fn flush_metrics() {
    for line in metrics_documents() {
        // EMF is read from stdout by design; this is not logging.
        #[allow(clippy::print_stdout)]
        {
            println!("{line}");
        }
    }
}

/// The logical queue name of an SQS ARN or URL: the last path segment without the deployment
/// prefix (`arn:aws:sqs:eu-west-1:1:tidings-email-high` → `email-high`).
pub fn logical_queue_name(source: &str, prefix: &str) -> String {
    let last = source.rsplit([':', '/']).next().unwrap_or(source);
    last.strip_prefix(prefix).unwrap_or(last).to_owned()
}

/// The core's view of an SQS record.
pub fn received_of(m: &SqsMessage) -> Received {
    let attr = |name: &str| m.attributes.get(name).cloned().unwrap_or_default();
    Received {
        message_id: m.message_id.clone().unwrap_or_default(),
        receipt: m.receipt_handle.clone().unwrap_or_default(),
        body: m.body.clone().unwrap_or_default(),
        receive_count: attr("ApproximateReceiveCount").parse().unwrap_or(1),
        sent_at_ms: attr("SentTimestamp").parse().unwrap_or(0),
        // A fair queue's message carries its tenant (docs/delivery.md, "Priorities").
        group: m.attributes.get("MessageGroupId").cloned(),
    }
}

/// An SQS record for a received message (used by the local runtime).
pub fn sqs_message_of(r: &Received, queue_arn: &str) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(r.message_id.clone());
    m.receipt_handle = Some(r.receipt.clone());
    m.body = Some(r.body.clone());
    m.attributes.insert("ApproximateReceiveCount".into(), r.receive_count.to_string());
    m.attributes.insert("SentTimestamp".into(), r.sent_at_ms.to_string());
    m.event_source = Some("aws:sqs".into());
    m.event_source_arn = Some(queue_arn.to_owned());
    m
}

/// Handles an SQS batch for the queue `queue`: each message is dispatched to its handler; a
/// retry sets the message's visibility to its backoff and is reported in `batchItemFailures`;
/// a malformed message goes to the DLQ with its reason and the batch goes on.
pub async fn handle_sqs_event(deps: &Deps, queue: &str, event: SqsEvent) -> SqsBatchResponse {
    handle_sqs_event_until::<Every>(deps, queue, event, None).await
}

/// [`handle_sqs_event`] that starts no provider call it could not finish by `deadline` (see
/// [`tidings_core::router::dispatch_batch_until`]): those messages are handed back, not cut
/// off. Only the handlers of `H` are linked ([`tidings_core::router::Handlers`]).
pub async fn handle_sqs_event_until<H: Handlers>(
    deps: &Deps,
    queue: &str,
    event: SqsEvent,
    deadline: Option<std::time::Instant>,
) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    let started = std::time::Instant::now();
    let messages: Vec<Received> = event.records.iter().map(received_of).collect();
    let outcomes = dispatch_batch_with::<H>(deps, queue, &messages, deadline).await;
    let processed = settle_batch(deps.queues.as_ref(), queue, &messages, outcomes, deps.clock.now(), false).await;
    tidings_core::metrics::record_busy(queue, started.elapsed());
    response.batch_item_failures.extend(failures_of(&messages, processed));
    response
}

/// The `batchItemFailures` of a settled batch: each message that was not processed.
fn failures_of(messages: &[Received], processed: Vec<bool>) -> impl Iterator<Item = BatchItemFailure> + '_ {
    messages.iter().zip(processed).filter(|(_, processed)| !processed).map(|(message, _)| {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = message.message_id.clone();
        failure
    })
}

/// Handles an SQS batch as a Lambda function receives it: each record's queue is named by its
/// `eventSourceARN` (physical name = `prefix` + logical name).
pub async fn handle_sqs_batch(deps: &Deps, prefix: &str, event: SqsEvent) -> SqsBatchResponse {
    handle_sqs_batch_until::<Every>(deps, prefix, event, None).await
}

/// Room kept at the end of an invocation for what follows the last provider call: a gate's
/// wait before it (at most 2 s by default), the record of the batch, the answer.
pub const DEADLINE_ROOM: std::time::Duration = std::time::Duration::from_secs(5);

/// When the sends of an invocation ending at `deadline_ms` (Lambda's context, milliseconds
/// since the epoch) must have ended: [`DEADLINE_ROOM`] before it.
pub fn send_deadline(deadline_ms: u64) -> std::time::Instant {
    let now_ms = u64::try_from(SystemClock.now_ms()).unwrap_or(0);
    let left = std::time::Duration::from_millis(deadline_ms.saturating_sub(now_ms));
    std::time::Instant::now() + left.saturating_sub(DEADLINE_ROOM)
}

/// [`handle_sqs_batch`] with a deadline for its provider calls and the handlers of `H`.
pub async fn handle_sqs_batch_until<H: Handlers>(
    deps: &Deps,
    prefix: &str,
    event: SqsEvent,
    deadline: Option<std::time::Instant>,
) -> SqsBatchResponse {
    let mut by_queue: std::collections::BTreeMap<String, SqsEvent> = Default::default();
    for record in event.records {
        let queue = logical_queue_name(record.event_source_arn.as_deref().unwrap_or_default(), prefix);
        by_queue.entry(queue).or_default().records.push(record);
    }
    let mut response = SqsBatchResponse::default();
    for (queue, event) in by_queue {
        response
            .batch_item_failures
            .extend(handle_sqs_event_until::<H>(deps, &queue, event, deadline).await.batch_item_failures);
    }
    response
}

/// [`handle_sqs_batch_until`] for a function that serves only `lanes`: a record from any other
/// queue is refused, to that queue's DLQ with the reason (a mapping that should not exist).
pub async fn handle_lanes_batch_until<H: Handlers>(
    deps: &Deps,
    prefix: &str,
    lanes: &[Lane],
    event: SqsEvent,
    deadline: Option<std::time::Instant>,
) -> SqsBatchResponse {
    let mut served = SqsEvent::default();
    let mut refused: std::collections::BTreeMap<String, Vec<Received>> = Default::default();
    for record in event.records {
        let queue = logical_queue_name(record.event_source_arn.as_deref().unwrap_or_default(), prefix);
        if Lane::from_name(&queue).is_some_and(|l| lanes.contains(&l)) {
            served.records.push(record);
        } else {
            refused.entry(queue).or_default().push(received_of(&record));
        }
    }
    let mut response = handle_sqs_batch_until::<H>(deps, prefix, served, deadline).await;
    for (queue, messages) in refused {
        let reason = format!("this function does not serve queue {queue}");
        let outcomes = messages.iter().map(|_| tidings_core::outcome::Outcome::Reject(reason.clone())).collect();
        let processed = settle_batch(deps.queues.as_ref(), &queue, &messages, outcomes, deps.clock.now(), false).await;
        response.batch_item_failures.extend(failures_of(&messages, processed));
    }
    response
}

/// Runs a Lambda function that consumes SQS batches of `lanes` (the orchestrator, the channel
/// worker): every record goes to its lane's handler, failures are reported as
/// `batchItemFailures`, a record of another lane is refused ([`handle_lanes_batch_until`]). Only
/// the handlers of `H` are linked.
pub async fn serve_lanes<H: Handlers>(
    deps: Deps,
    prefix: String,
    lanes: &'static [Lane],
) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(lambda_runtime::service_fn(|event: lambda_runtime::LambdaEvent<SqsEvent>| {
        let (deps, prefix) = (deps.clone(), prefix.clone());
        async move {
            let deadline = send_deadline(event.context.deadline);
            let response = handle_lanes_batch_until::<H>(&deps, &prefix, lanes, event.payload, Some(deadline)).await;
            flush_metrics();
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}

/// One event of a function with two triggers: an SQS batch (it has `Records`) is handled like
/// [`serve_lanes`]; anything else is its EventBridge schedule and runs `on_schedule`.
pub async fn handle_queue_or_schedule<F, Fut>(
    deps: Deps,
    prefix: &str,
    payload: Value,
    on_schedule: F,
) -> Result<Value, lambda_runtime::Error>
where
    F: FnOnce(Deps) -> Fut,
    Fut: std::future::Future<Output = Result<Value, lambda_runtime::Error>>,
{
    handle_queue_or_schedule_until::<Every, _, _>(deps, prefix, payload, None, on_schedule).await
}

/// [`handle_queue_or_schedule`] whose SQS batches keep to `deadline` (see
/// [`handle_sqs_batch_until`]): what would not end before it is handed back. Only the handlers
/// of `H` are linked.
pub async fn handle_queue_or_schedule_until<H: Handlers, F, Fut>(
    deps: Deps,
    prefix: &str,
    payload: Value,
    deadline: Option<std::time::Instant>,
    on_schedule: F,
) -> Result<Value, lambda_runtime::Error>
where
    F: FnOnce(Deps) -> Fut,
    Fut: std::future::Future<Output = Result<Value, lambda_runtime::Error>>,
{
    if payload.get("Records").is_some() {
        let batch: SqsEvent = serde_json::from_value(payload)?;
        return Ok(serde_json::to_value(handle_sqs_batch_until::<H>(&deps, prefix, batch, deadline).await)?);
    }
    on_schedule(deps).await
}

/// Runs a Lambda function with two triggers (see [`handle_queue_or_schedule`]), with the
/// handlers of `H`.
pub async fn serve_queue_and_schedule<H: Handlers, F, Fut>(
    deps: Deps,
    prefix: String,
    on_schedule: F,
) -> Result<(), lambda_runtime::Error>
where
    F: Fn(Deps) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, lambda_runtime::Error>> + Send,
{
    lambda_runtime::run(lambda_runtime::service_fn(|event: lambda_runtime::LambdaEvent<Value>| {
        let (deps, prefix, on_schedule) = (deps.clone(), prefix.clone(), on_schedule.clone());
        async move {
            let deadline = send_deadline(event.context.deadline);
            let answer =
                handle_queue_or_schedule_until::<H, _, _>(deps, &prefix, event.payload, Some(deadline), on_schedule)
                    .await;
            flush_metrics();
            answer
        }
    }))
    .await
}

/// Converts a DynamoDB stream image to attributes, splitting out the key.
fn image_of(item: &serde_dynamo::Item) -> Result<(Option<Key>, Attrs), serde_dynamo::Error> {
    if item.is_empty() {
        return Ok((None, Attrs::new()));
    }
    let stored: Attrs = serde_dynamo::from_item(item.clone())?;
    let key = match (stored.get(stored::PK), stored.get(stored::SK)) {
        (Some(Value::String(pk)), Some(Value::String(sk))) => Some(Key { pk: pk.clone(), sk: sk.clone() }),
        _ => None,
    };
    Ok((key, stored::attrs_from_stored(stored)))
}

/// The core's view of a stream record; `None` for records that are not Tidings items.
pub fn change_record_of(r: &EventRecord) -> Option<ChangeRecord> {
    read_change_record(r).ok()
}

/// The core's view of a stream record, or why it cannot be read (a poison record).
pub fn read_change_record(r: &EventRecord) -> Result<ChangeRecord, String> {
    let (key, _) = image_of(&r.change.keys).map_err(|e| format!("unreadable keys: {e}"))?;
    let key = key.ok_or_else(|| "keys without a string pk and sk".to_owned())?;
    let (_, old) = image_of(&r.change.old_image).map_err(|e| format!("unreadable old image: {e}"))?;
    let (_, new) = image_of(&r.change.new_image).map_err(|e| format!("unreadable new image: {e}"))?;
    let is_remove = r.event_name == "REMOVE";
    let is_insert = r.event_name == "INSERT";
    Ok(ChangeRecord {
        seq: r.change.sequence_number.clone().unwrap_or_default(),
        key,
        old: if is_insert || r.change.old_image.is_empty() { None } else { Some(old) },
        new: if is_remove || r.change.new_image.is_empty() { None } else { Some(new) },
    })
}

/// A stream record for a change (used by the local runtime).
pub fn event_record_of(c: &ChangeRecord) -> Result<EventRecord, serde_dynamo::Error> {
    let with_key = |attrs: &Attrs| -> Result<serde_dynamo::Item, serde_dynamo::Error> {
        let mut a: Attrs = attrs.iter().map(|(k, v)| (stored::stored_attr_name(k).into_owned(), v.clone())).collect();
        a.insert("pk".into(), Value::String(c.key.pk.clone()));
        a.insert("sk".into(), Value::String(c.key.sk.clone()));
        serde_dynamo::to_item(a)
    };
    let mut keys = Attrs::new();
    keys.insert("pk".into(), Value::String(c.key.pk.clone()));
    keys.insert("sk".into(), Value::String(c.key.sk.clone()));
    let mut r = EventRecord::default();
    r.event_name = match (&c.old, &c.new) {
        (None, Some(_)) => "INSERT",
        (Some(_), None) => "REMOVE",
        _ => "MODIFY",
    }
    .into();
    r.event_source = Some("aws:dynamodb".into());
    r.change.keys = serde_dynamo::to_item(keys)?;
    r.change.sequence_number = Some(c.seq.clone());
    if let Some(old) = &c.old {
        r.change.old_image = with_key(old)?;
    }
    if let Some(new) = &c.new {
        r.change.new_image = with_key(new)?;
    }
    Ok(r)
}

/// Handles a DynamoDB stream batch (the outbox relay), record by record in order. A poison
/// record (one that can never be relayed: unreadable, or an unreadable notification) is
/// recorded alone on the stream-failures queue with its keys ([`relay::StreamFailure`]) and the
/// batch goes on. On a retryable failure the first record that failed is reported (its
/// sequence number in `batchItemFailures`): the records before it are done, and the event
/// source mapping retries, and bisects, from it. The records done are then pushed to live
/// connections (best effort: never fails the batch).
pub async fn handle_stream_event(deps: &Deps, live: &dyn LivePush, event: DynamoDbEvent) -> DynamoDbEventResponse {
    let mut readable: Vec<(usize, ChangeRecord)> = Vec::with_capacity(event.records.len());
    let mut poison: Vec<(usize, String)> = Vec::new();
    for (i, r) in event.records.iter().enumerate() {
        match read_change_record(r) {
            Ok(c) => readable.push((i, c)),
            Err(why) => poison.push((i, why)),
        }
    }
    let changes: Vec<ChangeRecord> = readable.iter().map(|(_, c)| c.clone()).collect();
    let report = relay::relay_changes(deps, &changes).await;
    let position = |i: usize| readable.get(i).map_or(0, |(at, _)| *at);
    let mut failed_at = report.failed.as_ref().map(|(i, e)| {
        error!(error = %e, "relay failed; the batch is retried from this record");
        position(*i)
    });
    poison.extend(report.poison.iter().map(|(i, why)| (position(*i), why.clone())));
    poison.retain(|(i, _)| failed_at.is_none_or(|f| *i < f));
    poison.sort_by_key(|(i, _)| *i);
    if let Some(&(first, _)) = poison.first() {
        let mut messages = Vec::with_capacity(poison.len());
        for (i, why) in &poison {
            let Some(r) = event.records.get(*i) else { continue };
            let keys = serde_json::to_value(&r.change.keys).unwrap_or(Value::Null);
            let failure =
                relay::StreamFailure::poison(r.change.sequence_number.clone(), r.event_source_arn.clone(), keys, why);
            warn!(sequence_number = ?r.change.sequence_number, reason = %why, "poison stream record recorded on stream-failures");
            match serde_json::to_string(&failure) {
                Ok(body) => messages.push(OutMessage::new(body)),
                Err(e) => error!(error = %e, "a stream failure that does not serialize"),
            }
        }
        if let Err(e) = deps.queues.send_batch(relay::STREAM_FAILURES_QUEUE, messages).await {
            error!(error = %e, "poison records not recorded; the batch is retried from the first");
            failed_at = Some(failed_at.map_or(first, |f| f.min(first)));
        }
    }
    let done: Vec<ChangeRecord> =
        readable.into_iter().filter(|(i, _)| failed_at.is_none_or(|f| *i < f)).map(|(_, c)| c).collect();
    tidings_core::inbox::live::handle_changes(deps, live, &done).await;
    let mut response = DynamoDbEventResponse::default();
    if let Some(record) = failed_at.and_then(|f| event.records.get(f)) {
        let mut failure = DynamoDbBatchItemFailure::default();
        failure.item_identifier = record.change.sequence_number.clone();
        response.batch_item_failures.push(failure);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tidings_core::ports::{Clock, SystemClock};

    use super::{DEADLINE_ROOM, send_deadline};

    fn now_ms() -> u64 {
        SystemClock.now_ms() as u64
    }

    #[test]
    fn the_send_deadline_keeps_room_before_the_invocation_ends() {
        let before = Instant::now();
        let d = send_deadline(now_ms() + 30_000);
        let left = d.saturating_duration_since(before);
        let expected = Duration::from_secs(30) - DEADLINE_ROOM;
        assert!(left <= expected + Duration::from_millis(50) && left + Duration::from_secs(1) >= expected, "{left:?}");
        // An invocation already (nearly) over: the deadline is now, not in the past's underflow.
        let d = send_deadline(now_ms() + 1_000);
        assert!(d.saturating_duration_since(Instant::now()) < Duration::from_millis(50));
        let d = send_deadline(0);
        assert!(d.saturating_duration_since(Instant::now()) < Duration::from_millis(50));
    }
}
