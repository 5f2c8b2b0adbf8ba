//! Routes a queue's messages to the handler of its lane: the one place that knows which
//! feature handles which queue.

use std::time::Duration;

use crate::deps::Deps;
use crate::lanes::Lane;
use crate::notify::channel::ChannelSend;
use crate::notify::orchestrator::Orchestrate;
use crate::outcome::Outcome;
use crate::ports::Received;
use crate::restock::StockEventStep;
use crate::tasks::{handle, handle_batch};
use crate::timers::TimerStep;
use crate::webhooks::WebhookStep;

/// Routes a batch of messages of one queue: channel tasks are handled as a batch
/// ([`crate::notify::worker::handle_channel_batch`]), the others one by one. One outcome per
/// message, in order.
pub async fn dispatch_batch(deps: &Deps, queue: &str, messages: &[Received]) -> Vec<Outcome> {
    dispatch_batch_until(deps, queue, messages, None).await
}

/// [`dispatch_batch`] that starts no provider call it could not finish by `deadline` (a
/// Lambda invocation's end, a visibility timeout): the sends not started are handed back
/// (`pending`, their messages sent again: [`Outcome::HandBack`]) instead of being cut off
/// mid-way by the end of the invocation. Queues handled one message at a time (requests,
/// timers, stock events) hand back the messages that the slowest so far says would not end
/// before it.
pub async fn dispatch_batch_until(
    deps: &Deps,
    queue: &str,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    match Lane::from_name(queue) {
        Some(lane) => route_batch(deps, lane, messages, deadline).await,
        None => messages.iter().map(|_| unknown(queue)).collect(),
    }
}

fn unknown(queue: &str) -> Outcome {
    Outcome::Reject(format!("no handler for queue {queue}"))
}

/// [`dispatch_batch_until`] for a lane.
pub async fn route_batch(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    if let Lane::Channel(..) = lane {
        return handle_batch::<ChannelSend>(deps, messages, deadline).await;
    }
    // One by one (requests, timers, stock events). After the first, which always runs so a
    // batch always makes progress, a message is not started when the longest one so far would
    // not end before the deadline: it is handed back, so the invocation is not cut off with a
    // campaign page half written (and every message of its batch charged a receive).
    // A message still running `CUT_OFF_AFTER` past the deadline (one far slower than those
    // before it, or a first one too long for the invocation) is stopped there and retried, so the
    // invocation still answers: cut off by Lambda instead, its environment would be killed and
    // every message of the batch would wait out its visibility timeout.
    let mut outcomes = Vec::with_capacity(messages.len());
    let mut longest = std::time::Duration::ZERO;
    for (i, message) in messages.iter().enumerate() {
        if i > 0 && deadline.is_some_and(|d| std::time::Instant::now() + longest >= d) {
            outcomes.push(Outcome::HandBack);
            continue;
        }
        let started = std::time::Instant::now();
        let outcome = match deadline {
            Some(d) => {
                let cut_off = tokio::time::Instant::from_std(d + CUT_OFF_AFTER);
                match tokio::time::timeout_at(cut_off, route(deps, lane, message)).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        tracing::warn!(
                            queue = lane.name(),
                            message_id = %message.message_id,
                            ran_ms = started.elapsed().as_millis() as u64,
                            "cut off at the invocation's deadline; retried"
                        );
                        Outcome::Retry(Duration::ZERO)
                    }
                }
            }
            None => route(deps, lane, message).await,
        };
        outcomes.push(outcome);
        longest = longest.max(started.elapsed());
    }
    outcomes
}

/// How long past its deadline a message handled one by one may still run before it is cut off
/// and retried: half of the room the Lambda handler keeps after the deadline (5 s,
/// `tidings_lambda::DEADLINE_ROOM`), the other half left to settle the batch and answer.
/// Stopping a handler there is what a crash at that point would be, and every handler is
/// written for that: a retried request message creates nothing twice
/// (docs/delivery.md, "Deadlines").
pub const CUT_OFF_AFTER: Duration = Duration::from_millis(2_500);

/// Routes a message to the handler of its queue.
pub async fn dispatch(deps: &Deps, queue: &str, message: &Received) -> Outcome {
    match Lane::from_name(queue) {
        Some(lane) => route(deps, lane, message).await,
        None => unknown(queue),
    }
}

/// Routes a message to the handler of its lane.
pub async fn route(deps: &Deps, lane: Lane, message: &Received) -> Outcome {
    match lane {
        Lane::Requests(_) => handle::<Orchestrate>(deps, message).await,
        Lane::Channel(..) => {
            let one = handle_batch::<ChannelSend>(deps, std::slice::from_ref(message), None).await;
            one.into_iter().next().unwrap_or(Outcome::Retry(Duration::ZERO))
        }
        Lane::StockEvents => handle::<StockEventStep>(deps, message).await,
        Lane::Timers => handle::<TimerStep>(deps, message).await,
        Lane::Webhooks => handle::<WebhookStep>(deps, message).await,
        Lane::InventoryReview | Lane::StreamFailures | Lane::ScheduleFailures => {
            Outcome::Reject(format!("nothing handles queue {lane}"))
        }
    }
}
