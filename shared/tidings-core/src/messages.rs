//! Queue message handling shared by every worker: what became of one message.

use std::time::Duration;

pub use crate::outcome::Outcome;

/// The body put on a DLQ for a rejected message: what an operator needs to judge it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub rejected: String,
    pub queue: String,
    pub at: String,
    pub receive_count: u32,
    /// The body as received, cut (at a character boundary) when keeping it whole would make the
    /// dead letter larger than a queue message may be.
    pub original_body: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub original_truncated: bool,
}

/// The largest dead letter written: under the 256 KiB message limit, with room for the wrapper.
const MAX_DEAD_LETTER_BYTES: usize = 250 * 1024;

impl Rejected {
    /// The dead letter's body, cutting the original body until it fits: an oversized message
    /// must still leave the queue, or it would come back forever.
    fn into_body(mut self) -> Result<String, QueueError> {
        loop {
            let body = serde_json::to_string(&self).map_err(|e| QueueError::Invalid(e.to_string()))?;
            if body.len() <= MAX_DEAD_LETTER_BYTES || self.original_body.is_empty() {
                return Ok(body);
            }
            let mut keep = self.original_body.len() / 2;
            while !self.original_body.is_char_boundary(keep) {
                keep -= 1;
            }
            self.original_body.truncate(keep);
            self.original_truncated = true;
        }
    }
}

use crate::ports::{OutMessage, QueueError, Queues, Received};

/// Applies an outcome to the queue: a retry sets the message's visibility to its delay, a
/// rejection puts it on the DLQ with the reason. `delete_done`: the local runtime deletes
/// finished messages itself; on Lambda the event source mapping does.
///
/// Returns whether the message counts as processed (false: a batch item failure).
pub async fn settle(
    queues: &dyn Queues,
    queue: &str,
    message: &Received,
    outcome: &Outcome,
    now: chrono::DateTime<chrono::Utc>,
    delete_done: bool,
) -> Result<bool, QueueError> {
    let resolved;
    let outcome = match outcome {
        Outcome::HandBack => {
            resolved = handed_back(hand_back(queues, queue, &[message]).await);
            &resolved
        }
        other => other,
    };
    match outcome {
        Outcome::Done | Outcome::HandBack => {
            if delete_done {
                match queues.delete(queue, &message.receipt).await {
                    Ok(()) | Err(QueueError::StaleReceipt) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(true)
        }
        Outcome::Retry(delay) => {
            match queues.change_visibility(queue, &message.receipt, *delay).await {
                Ok(()) | Err(QueueError::StaleReceipt) => {}
                Err(e) => return Err(e),
            }
            Ok(false)
        }
        Outcome::Reject(reason) => {
            tracing::warn!(queue, message_id = %message.message_id, %reason, "rejected message sent to the DLQ");
            let rejected = Rejected {
                rejected: reason.clone(),
                queue: queue.to_owned(),
                at: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                receive_count: message.receive_count,
                original_body: message.body.clone(),
                original_truncated: false,
            };
            let body = rejected.into_body()?;
            queues.send_to_dlq(queue, body).await?;
            if delete_done {
                match queues.delete(queue, &message.receipt).await {
                    Ok(()) | Err(QueueError::StaleReceipt) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(true)
        }
    }
}

/// Sends copies of messages not started (see [`Outcome::HandBack`]), in as few calls as the
/// queue allows. `false`: not sent (the messages are retried instead).
async fn hand_back(queues: &dyn Queues, queue: &str, messages: &[&Received]) -> bool {
    if messages.is_empty() {
        return true;
    }
    let copies = messages.iter().map(|m| OutMessage::new(m.body.clone())).collect();
    match queues.send_batch(queue, copies).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, queue, "could not hand messages back; they are retried");
            false
        }
    }
}

/// What a message handed back becomes: done once its copy is sent, else retried at once.
fn handed_back(sent: bool) -> Outcome {
    if sent { Outcome::Done } else { Outcome::Retry(Duration::ZERO) }
}

/// [`settle`] for a whole batch, in order: the messages handed back are copied in one
/// [`Queues::send_batch`] rather than one call each. Returns, per message, whether it counts
/// as processed (an error settling one counts as not processed: it comes again).
pub async fn settle_batch(
    queues: &dyn Queues,
    queue: &str,
    messages: &[Received],
    outcomes: Vec<Outcome>,
    now: chrono::DateTime<chrono::Utc>,
    delete_done: bool,
) -> Vec<bool> {
    let back: Vec<&Received> =
        messages.iter().zip(&outcomes).filter(|(_, o)| matches!(o, Outcome::HandBack)).map(|(m, _)| m).collect();
    let handed = hand_back(queues, queue, &back).await;
    let mut processed = Vec::with_capacity(messages.len());
    for (message, outcome) in messages.iter().zip(outcomes) {
        let outcome = match outcome {
            Outcome::HandBack => handed_back(handed),
            other => other,
        };
        processed.push(match settle(queues, queue, message, &outcome, now, delete_done).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, queue, "could not settle a message; it will come back");
                false
            }
        });
    }
    processed
}

/// Every queue of a deployment, by logical name (each has a DLQ `{name}-dlq`).
pub const ALL_QUEUES: &[&str] = &[
    "requests-high",
    "requests-normal",
    "requests-low",
    "email-high",
    "email-low",
    "sms-high",
    "sms-low",
    "push-high",
    "push-low",
    "timers",
    "inventory-review",
    "stock-events",
    crate::webhooks::WEBHOOKS_QUEUE,
];

/// Whether a queue has a worker. `inventory-review` and `stream-failures` are read by
/// operators, not by code.
pub fn is_consumed(queue: &str) -> bool {
    queue != crate::inventory::REVIEW_QUEUE && queue != crate::notify::relay::STREAM_FAILURES_QUEUE
}

/// Whether a queue has a DLQ: only a consumed one (nothing dead-letters from a queue nobody
/// receives from; `template.yaml` gives `inventory-review` none).
pub fn has_dlq(queue: &str) -> bool {
    is_consumed(queue)
}

/// Routes a batch of messages of one queue: channel tasks are handled as a batch
/// ([`crate::notify::worker::handle_channel_batch`]), the others one by one. One outcome per
/// message, in order.
pub async fn dispatch_batch(deps: &crate::Deps, queue: &str, messages: &[Received]) -> Vec<Outcome> {
    dispatch_batch_until(deps, queue, messages, None).await
}

/// [`dispatch_batch`] that starts no provider call it could not finish by `deadline` (a
/// Lambda invocation's end, a visibility timeout): the sends not started are handed back
/// (`pending`, their messages sent again: [`Outcome::HandBack`]) instead of being cut off
/// mid-way by the end of the invocation. Queues handled one message at a time (requests,
/// timers, stock events) hand back the messages that the slowest so far says would not end
/// before it.
pub async fn dispatch_batch_until(
    deps: &crate::Deps,
    queue: &str,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    if ["email-", "sms-", "push-"].iter().any(|p| queue.starts_with(p)) {
        return crate::tasks::handle_batch::<crate::notify::worker::ChannelSend>(deps, messages, deadline).await;
    }
    // One by one (requests, timers, stock events). After the first, which always runs so a
    // batch always makes progress, a message is not started when the longest one so far would
    // not end before the deadline: it is handed back, so the invocation is not cut off with a
    // campaign page half written (and every message of its batch charged a receive).
    let mut outcomes = Vec::with_capacity(messages.len());
    let mut longest = std::time::Duration::ZERO;
    for (i, message) in messages.iter().enumerate() {
        if i > 0 && deadline.is_some_and(|d| std::time::Instant::now() + longest >= d) {
            outcomes.push(Outcome::HandBack);
            continue;
        }
        let started = std::time::Instant::now();
        outcomes.push(dispatch(deps, queue, message).await);
        longest = longest.max(started.elapsed());
    }
    outcomes
}

/// Routes a message to the handler of its queue.
pub async fn dispatch(deps: &crate::Deps, queue: &str, message: &Received) -> Outcome {
    if queue.starts_with("requests-") {
        crate::notify::orchestrator::handle_request_message(deps, message).await
    } else if ["email-", "sms-", "push-"].iter().any(|p| queue.starts_with(p)) {
        let one =
            crate::tasks::handle_batch::<crate::notify::worker::ChannelSend>(deps, std::slice::from_ref(message), None);
        one.await.into_iter().next().unwrap_or(Outcome::Retry(Duration::ZERO))
    } else if queue == crate::restock::STOCK_EVENTS_QUEUE {
        crate::restock::handle_stock_event_message(deps, message).await
    } else if queue == crate::timers::TIMERS_QUEUE {
        crate::timers::handle_timer_message(deps, message).await
    } else if queue == crate::webhooks::WEBHOOKS_QUEUE {
        crate::webhooks::handle_webhook_message(deps, message).await
    } else {
        Outcome::Reject(format!("no handler for queue {queue}"))
    }
}
