//! The queue port, with SQS's semantics: per-message delay, visibility timeout, a receive
//! count, and a dead-letter queue that takes a message received more than `max_receives`
//! times. Queues are named logically (`requests-high`, `email-low`, ...); each backend maps
//! the name to a real queue and its DLQ.
//!
//! A message may carry a *group*, the tenant whose work it is: a queue that tenants share hands
//! out the groups' messages in turn, not in the order they were sent, so one tenant's backlog
//! never holds another's messages behind it (SQS fair queues: `MessageGroupId`; the embedded
//! queues: a dequeue by group in turn). Within a group, the order is the queue's as before
//! (docs/delivery.md, "Fair lanes").

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A message to send.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutMessage {
    pub body: String,
    /// Delay before the message becomes visible (SQS allows up to 15 minutes).
    pub delay: Duration,
    /// Its fairness group: the tenant whose work it is (`None`: the queue's common group;
    /// `crate::lanes`' `OutMessage::for_tenant` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl OutMessage {
    pub fn new(body: impl Into<String>) -> Self {
        Self { body: body.into(), delay: Duration::ZERO, group: None }
    }
    pub fn delayed(body: impl Into<String>, delay: Duration) -> Self {
        Self { body: body.into(), delay, group: None }
    }
    /// The message in `group` (a received message's, for a copy of it).
    pub fn in_group(self, group: Option<String>) -> Self {
        Self { group, ..self }
    }
}

/// A received message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Received {
    pub message_id: String,
    /// Handle for `delete` and `change_visibility` (valid for this receive only).
    pub receipt: String,
    pub body: String,
    /// How many times the message has been received, this time included (1 the first time).
    pub receive_count: u32,
    /// When the message was first sent (milliseconds since the epoch).
    pub sent_at_ms: i64,
    /// Its fairness group ([`OutMessage::group`]), so a copy of it stays in its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Depths of one queue and its DLQ.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueStats {
    pub name: String,
    pub visible: u64,
    pub in_flight: u64,
    pub delayed: u64,
    /// Age of the oldest message in seconds (0 when empty).
    pub oldest_age_s: u64,
    pub dlq_depth: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("unknown queue {0}")]
    UnknownQueue(String),
    /// The receipt is no longer valid (the visibility ran out and someone else received it).
    #[error("receipt is stale")]
    StaleReceipt,
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    #[error("invalid queue request: {0}")]
    Invalid(String),
}

impl QueueError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, QueueError::Unavailable(_))
    }
}

/// The longest delay a message may carry (SQS's limit); longer waits use timers.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);

#[async_trait]
pub trait Queues: Send + Sync + 'static {
    /// Sends messages (any number; backends split into batches of 10 as SQS needs).
    async fn send_batch(&self, queue: &str, messages: Vec<OutMessage>) -> Result<(), QueueError>;

    /// Receives up to `max` visible messages, hiding them for `visibility`. May wait up to
    /// `wait` for one to arrive (long polling). A message already received `max_receives`
    /// times moves to the DLQ instead of being returned.
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, QueueError>;

    /// Makes a received message visible again after `visibility` (0: at once).
    async fn change_visibility(&self, queue: &str, receipt: &str, visibility: Duration) -> Result<(), QueueError>;

    async fn delete(&self, queue: &str, receipt: &str) -> Result<(), QueueError>;

    /// Deletes several received messages (SQS `DeleteMessageBatch`, 10 a call). A receipt that
    /// is no longer valid is skipped, as [`Queues::delete`] would report it stale: the message
    /// comes again and its handler is idempotent.
    async fn delete_batch(&self, queue: &str, receipts: &[String]) -> Result<(), QueueError> {
        for receipt in receipts {
            match self.delete(queue, receipt).await {
                Ok(()) | Err(QueueError::StaleReceipt) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Depths of the queue and its DLQ.
    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError>;

    /// Moves every message of the queue's DLQ back to the queue, as new messages (receive
    /// count starts again). Returns how many moved.
    async fn redrive(&self, queue: &str) -> Result<u64, QueueError>;

    /// Up to `max` messages of the queue's DLQ, without removing them (for operators).
    async fn peek_dlq(&self, queue: &str, max: usize) -> Result<Vec<Received>, QueueError>;

    /// Puts a message straight on the queue's DLQ (a message that can never be processed,
    /// such as a malformed one, with the reason in its body).
    async fn send_to_dlq(&self, queue: &str, body: String) -> Result<(), QueueError>;
}
