//! What an operator is shown of a dead letter (`GET /v1/ops/dlq/{queue}`, `tidings ops dlq
//! list`): why it died, from its body and, for a channel task, from its delivery record. A
//! message's text is never shown (it may carry a one-time code): only whom it was for, what
//! the provider last answered, and how often it was tried.

use serde::Serialize;

use crate::deps::Deps;
use crate::messages::Rejected;
use crate::notify::model::{ChannelMessage, ChannelTask, Delivery};
use crate::ports::Received;

/// One dead letter, explained.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DeadLetter {
    pub message_id: String,
    /// How many times it was received, on its queue and since on the DLQ.
    pub receive_count: u32,
    /// When it was first sent to its queue (RFC 3339), if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
    /// `rejected` (a message that could never be handled), `channel_task` (a send that ran out
    /// of retries), `send_batch` (a send batch with deliveries that ran out of retries: its
    /// status and entries' counts are in `reason`) or `unknown` (not a Tidings message).
    #[schema(example = "channel_task")]
    pub kind: String,
    /// Why it is here, in a sentence.
    #[schema(
        example = "sms to alice of notification 01J...: status dead, 1 attempt(s), last error \"provider answered 503\""
    )]
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notification_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The delivery's status now (a redriven letter may since have been sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// What the provider last answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl DeadLetter {
    fn new(m: &Received, kind: &str, reason: String) -> Self {
        Self {
            message_id: m.message_id.clone(),
            receive_count: m.receive_count,
            sent_at: chrono::DateTime::from_timestamp_millis(m.sent_at_ms)
                .filter(|_| m.sent_at_ms > 0)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            kind: kind.into(),
            reason,
            tenant: None,
            notification_id: None,
            user_id: None,
            channel: None,
            delivery_status: None,
            attempts: None,
            last_error: None,
        }
    }
}

/// Why `m` is on a DLQ. Reads the delivery record of a channel task; a failed read is said in
/// the reason, not returned: the other letters are still worth showing.
pub async fn explain(deps: &Deps, m: &Received) -> DeadLetter {
    if let Ok(r) = serde_json::from_str::<Rejected>(&m.body) {
        let reason = format!("rejected: {} (at {}, received {} times)", r.rejected, r.at, r.receive_count);
        return DeadLetter::new(m, "rejected", reason);
    }
    if let Ok(ChannelMessage::Batch(batch)) = serde_json::from_str::<ChannelMessage>(&m.body) {
        let (reason, record) = crate::notify::batch::explain(deps.table.as_ref(), &batch).await;
        let mut letter = DeadLetter::new(m, "send_batch", reason);
        letter.tenant = Some(batch.tenant.to_string());
        letter.notification_id = Some(batch.notification_id.clone());
        letter.channel = Some(batch.channel.to_string());
        if let Some(b) = record {
            letter.delivery_status = Some(b.status.as_str().to_owned());
            letter.attempts = b.entries.iter().map(|e| e.attempts).max();
            letter.last_error = b.entries.iter().rev().find_map(|e| e.last_error.clone());
        }
        return letter;
    }
    let Ok(task) = serde_json::from_str::<ChannelTask>(&m.body) else {
        return DeadLetter::new(m, "unknown", "not a Tidings message (see its body with the queue's tools)".into());
    };
    let about = format!("{} to {} of notification {}", task.channel, task.user_id, task.notification_id);
    let mut letter = DeadLetter::new(m, "channel_task", String::new());
    letter.tenant = Some(task.tenant.to_string());
    letter.notification_id = Some(task.notification_id.clone());
    letter.user_id = Some(task.user_id.clone());
    letter.channel = Some(task.channel.to_string());
    let key = task.delivery_key();
    letter.reason = match deps.table.get(&key).await.map(|i| i.map(|i| i.parse::<Delivery>())) {
        Ok(Some(Ok(d))) => {
            let reason = format!(
                "{about}: status {}, {} attempt(s), last error {:?}, first failure {}",
                d.status.as_str(),
                d.attempts,
                d.last_error.clone().unwrap_or_default(),
                d.first_failed_at.as_deref().unwrap_or("-"),
            );
            letter.delivery_status = Some(d.status.as_str().to_owned());
            letter.attempts = Some(d.attempts);
            letter.last_error = d.last_error;
            reason
        }
        Ok(Some(Err(e))) => format!("{about}: its delivery record cannot be read ({e})"),
        Ok(None) => format!("{about}: no delivery record"),
        Err(e) => format!("{about}: its delivery record was not read ({e})"),
    };
    letter
}
