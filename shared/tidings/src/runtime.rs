//! The local runtime: stands in for Lambda's event source mappings and EventBridge schedules.
//! It reads the change stream and the queues, builds the same `DynamoDbEvent` / `SqsEvent`
//! values Lambda would, and calls the very handlers the Lambda functions call.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use tidings_core::Deps;
use tidings_core::inbox::live::LivePush;
use tidings_core::lanes::{Lane, Urgency};
use tidings_core::ports::ChangeFeed;
use tidings_core::roles;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, warn};

/// The worker pools. High-priority queues (`requests-high`, `*-high`) run on a runtime of
/// their own, with their own threads (and blocking pool), so a campaign draining the low
/// queues never takes the threads an OTP needs (docs/delivery.md, "Priorities").
/// Sizes are fixed: a 429 slows the rate gates down, it never adds workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pools {
    /// Workers per high-priority queue (`TIDINGS_WORKERS_HIGH`).
    pub high: usize,
    /// Workers per other queue (`TIDINGS_WORKERS_LOW`).
    pub low: usize,
    /// Threads of the high-priority runtime (`TIDINGS_HIGH_THREADS`).
    pub high_threads: usize,
}

impl Pools {
    /// The sizes the process's settings give.
    pub fn configured() -> Self {
        let s = crate::settings();
        let n = |name: &str| (s.number(name) as usize).clamp(1, 256);
        Self { high: n("TIDINGS_WORKERS_HIGH"), low: n("TIDINGS_WORKERS_LOW"), high_threads: n("TIDINGS_HIGH_THREADS") }
    }
}

/// Whether a queue carries high-priority work ([`Lane::is_high`]).
pub fn is_high(queue: &str) -> bool {
    Lane::from_name(queue).is_some_and(Lane::is_high)
}

/// The runtime of the high-priority pool, made once and kept for the life of the process.
fn high_runtime(threads: usize) -> Option<tokio::runtime::Handle> {
    static HIGH: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();
    HIGH.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("tidings-high")
            .enable_all()
            .build()
            .map_err(|e| warn!(error = %e, "no separate runtime for high priority; sharing the main one"))
            .ok()
    })
    .as_ref()
    .map(|rt| rt.handle().clone())
}

/// Spawns `work` on the high-priority runtime when there is one (else beside the rest).
fn spawn_high<F>(set: &mut JoinSet<()>, high: Option<&tokio::runtime::Handle>, work: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match high {
        Some(handle) => set.spawn_on(work, handle),
        None => set.spawn(work),
    };
}

/// Starts the relay and the queue workers; they stop when `stop` turns true.
pub fn start(
    deps: Deps,
    live: Arc<dyn LivePush>,
    feed: Arc<dyn ChangeFeed>,
    queues: Vec<String>,
    arn_prefix: String,
    stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    start_with(deps, live, feed, queues, arn_prefix, stop, Pools::configured())
}

/// [`start`] with the given pools.
pub fn start_with(
    deps: Deps,
    live: Arc<dyn LivePush>,
    feed: Arc<dyn ChangeFeed>,
    queues: Vec<String>,
    arn_prefix: String,
    stop: watch::Receiver<bool>,
    pools: Pools,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let high = high_runtime(pools.high_threads);
    // The relay carries every transactional notification to its queue: on the high-priority
    // runtime, so that its wake-ups do not wait behind the low queues' workers.
    spawn_high(&mut set, high.as_ref(), relay_loop(deps.clone(), live, feed, stop.clone()));
    for queue in queues.into_iter().filter(|q| tidings_core::messages::is_consumed(q)) {
        let workers = if is_high(&queue) { pools.high } else { pools.low };
        for _ in 0..workers {
            let worker = queue_loop(deps.clone(), queue.clone(), format!("{arn_prefix}{queue}"), stop.clone());
            if is_high(&queue) {
                spawn_high(&mut set, high.as_ref(), worker);
            } else {
                // The other queues' work is bulk work: the embedded store's writer lets every
                // other write go first (`tidings_core::lanes::bulk`).
                set.spawn(tidings_core::lanes::bulk(worker));
            }
        }
        set.spawn(queue_age_loop(deps.clone(), queue, stop.clone()));
    }
    set
}

/// Samples the age of a queue's oldest message for the metrics, every few seconds.
async fn queue_age_loop(deps: Deps, queue: String, stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if let Ok(stats) = roles::acting_as(roles::LOCAL_RUNTIME, deps.queues.stats(&queue)).await {
            metrics::gauge!(tidings_core::metrics::QUEUE_OLDEST_AGE, "queue" => queue.clone())
                .set(stats.oldest_age_s as f64);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn relay_loop(deps: Deps, live: Arc<dyn LivePush>, feed: Arc<dyn ChangeFeed>, stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let records = match roles::acting_as(roles::EVENT_SOURCE, feed.next_batch(1000)).await {
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
        // As the event source mapping's filter does on AWS (deliveries, counters and receipts,
        // most of a campaign's writes, are of no interest to the relay or the live feed).
        for r in records.iter().filter(|r| tidings_core::notify::relay::streamed(&r.key)) {
            match tidings_lambda::event_record_of(r) {
                Ok(rec) => event.records.push(rec),
                Err(e) => error!(error = %e, "unconvertible change record skipped"),
            }
        }
        let response =
            roles::acting_as("outbox-relay", tidings_lambda::handle_stream_event(&deps, live.as_ref(), event)).await;
        // As the event source mapping does: the position moves to just before the first
        // record that failed (all of them when none did).
        let failed = response.batch_item_failures.first().and_then(|f| f.item_identifier.clone());
        let done = match &failed {
            Some(seq) => records.iter().position(|r| &r.seq == seq).unwrap_or(0),
            None => records.len(),
        };
        if done > 0
            && let Err(e) = roles::acting_as(roles::EVENT_SOURCE, feed.commit(&records[..done])).await
        {
            warn!(error = %e, "committing the stream position failed; records will come again");
        }
        if failed.is_some() {
            // The failed record and those after it come again (at least once), after a pause.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The batch size of a queue's event source mapping (as `template.yaml` sets it): 100 for the
/// low-priority channel queues, where a campaign's sends are (`TIDINGS_BATCH_LOW`), 10
/// elsewhere (a transactional message is not held back to fill a batch).
pub fn batch_size(queue: &str) -> usize {
    let bulk = matches!(Lane::from_name(queue), Some(Lane::Channel(_, Urgency::Low)));
    if !bulk {
        return 10;
    }
    (crate::settings().number("TIDINGS_BATCH_LOW") as usize).clamp(1, 1000)
}

/// One batch, as a Lambda poller assembles it: the first receive long-polls (up to 1 s), the
/// next ones take what is there at once, until the batch is full or the queue has no more.
async fn receive_batch(
    deps: &Deps,
    queue: &str,
    size: usize,
    visibility: Duration,
) -> Result<Vec<tidings_core::ports::Received>, tidings_core::ports::QueueError> {
    let mut batch = deps.queues.receive(queue, size, visibility, Duration::from_secs(1)).await?;
    while !batch.is_empty() && batch.len() < size {
        let more = deps.queues.receive(queue, size - batch.len(), visibility, Duration::ZERO).await?;
        if more.is_empty() {
            break;
        }
        batch.extend(more);
    }
    Ok(batch)
}

async fn queue_loop(deps: Deps, queue: String, arn: String, stop: watch::Receiver<bool>) {
    let visibility = deps.config.visibility;
    let size = batch_size(&queue);
    while !*stop.borrow() {
        let received = match roles::acting_as(roles::EVENT_SOURCE, receive_batch(&deps, &queue, size, visibility)).await
        {
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
        // The messages' visibility runs from about now.
        let received_at = std::time::Instant::now();
        let mut event = SqsEvent::default();
        event.records = received.iter().map(|r| tidings_lambda::sqs_message_of(r, &arn)).collect();
        let busy = metrics::gauge!(tidings_core::metrics::WORKERS_BUSY, "queue" => queue.clone());
        busy.increment(1.0);
        // As on Lambda: no provider call started that could outlast the messages' visibility.
        // No room kept after it: a record made late only lets a message show again early, and
        // its delivery's claim turns the second receive away.
        let deadline = received_at + visibility;
        // As its consumer's Lambda function, with that function's handlers only.
        let function = roles::consumer_of(&queue);
        let response = roles::acting_as(function, async {
            use tidings_core::router::{Every, consumers};
            use tidings_lambda::handle_sqs_event_until as handle;
            let deadline = Some(deadline);
            match function {
                tidings_core::lanes::ORCHESTRATOR => {
                    handle::<consumers::Orchestrator>(&deps, &queue, event, deadline).await
                }
                tidings_core::lanes::CHANNEL_WORKER => {
                    handle::<consumers::ChannelWorker>(&deps, &queue, event, deadline).await
                }
                tidings_core::lanes::TICK => handle::<consumers::Tick>(&deps, &queue, event, deadline).await,
                tidings_core::lanes::RESTOCK_SCAN => {
                    handle::<consumers::RestockScan>(&deps, &queue, event, deadline).await
                }
                _ => handle::<Every>(&deps, &queue, event, deadline).await,
            }
        })
        .await;
        busy.decrement(1.0);
        // What Lambda's event source mapping does: delete what did not fail. A message shown
        // again while this receive still ran is deleted by the latest receipt, the only one
        // the queue still honours (by the older one it would stay and come back).
        let done: Vec<String> = received
            .iter()
            .filter(|r| !response.batch_item_failures.iter().any(|f| f.item_identifier == r.message_id))
            .map(|r| deps.attempts.newest_receipt(&queue, &r.message_id).unwrap_or_else(|| r.receipt.clone()))
            .collect();
        if let Err(e) = roles::acting_as(roles::EVENT_SOURCE, deps.queues.delete_batch(&queue, &done)).await {
            warn!(error = %e, queue, "delete failed; the messages will come again");
        }
    }
}
