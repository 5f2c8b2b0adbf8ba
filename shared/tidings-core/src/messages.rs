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
            resolved = handed_back(hand_back(queues, queue, &[(message, Duration::ZERO)]).await, Duration::ZERO);
            &resolved
        }
        Outcome::HandBackAfter(delay) => {
            resolved = handed_back(hand_back(queues, queue, &[(message, *delay)]).await, *delay);
            &resolved
        }
        other => other,
    };
    match outcome {
        Outcome::Done | Outcome::HandBack | Outcome::HandBackAfter(_) => {
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

/// The longest delay a copy handed back can have (SQS's 15 minutes).
const MAX_HAND_BACK_DELAY: Duration = Duration::from_secs(900);

/// Sends copies of messages not started (see [`Outcome::HandBack`], [`Outcome::HandBackAfter`]),
/// each after its delay, in as few calls as the queue allows. `false`: not sent (the messages
/// are retried instead).
async fn hand_back(queues: &dyn Queues, queue: &str, messages: &[(&Received, Duration)]) -> bool {
    if messages.is_empty() {
        return true;
    }
    // Each copy in its message's group: handed back, it keeps its tenant's turn.
    let copies = messages
        .iter()
        .map(|(m, delay)| {
            OutMessage::delayed(m.body.clone(), (*delay).min(MAX_HAND_BACK_DELAY)).in_group(m.group.clone())
        })
        .collect();
    match queues.send_batch(queue, copies).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, queue, "could not hand messages back; they are retried");
            false
        }
    }
}

/// What a message handed back becomes: done once its copy is sent, else retried after `delay`.
fn handed_back(sent: bool, delay: Duration) -> Outcome {
    if sent { Outcome::Done } else { Outcome::Retry(delay) }
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
    let back: Vec<(&Received, Duration)> = messages
        .iter()
        .zip(&outcomes)
        .filter_map(|(m, o)| match o {
            Outcome::HandBack => Some((m, Duration::ZERO)),
            Outcome::HandBackAfter(delay) => Some((m, *delay)),
            _ => None,
        })
        .collect();
    let handed = hand_back(queues, queue, &back).await;
    let mut processed = Vec::with_capacity(messages.len());
    for (message, outcome) in messages.iter().zip(outcomes) {
        let outcome = match outcome {
            Outcome::HandBack => handed_back(handed, Duration::ZERO),
            Outcome::HandBackAfter(delay) => handed_back(handed, delay),
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

pub use crate::lanes::ALL_QUEUES;
pub use crate::router::{dispatch, dispatch_batch, dispatch_batch_until};

/// Whether a queue has a worker (see [`crate::lanes::Lane::consumer`]).
pub fn is_consumed(queue: &str) -> bool {
    // A name that is no lane of the system (a queue of the backends' conformance suite) is
    // treated as consumed: it gets a DLQ and its redrive policy.
    crate::lanes::Lane::from_name(queue).is_none_or(crate::lanes::Lane::is_consumed)
}

/// Whether a queue has a DLQ: only a consumed one (see [`crate::lanes::Lane::dlq`]).
pub fn has_dlq(queue: &str) -> bool {
    is_consumed(queue)
}
