//! [`SqsQueues`]: the [`Queues`] port on SQS.
//!
//! Logical queue `requests-high` is the real queue `{prefix}requests-high` and its DLQ
//! `{prefix}requests-high-dlq` (or the explicit URLs of the configuration). The DLQ move after
//! `maxReceiveCount` receives is SQS's own, through the queue's redrive policy (see
//! [`crate::bootstrap`]).
//!
//! Differences from the embedded backend, all SQS's:
//! - `stats().oldest_age_s` is always 0: SQS has no such queue attribute; on AWS the source is
//!   the CloudWatch metric `ApproximateAgeOfOldestMessage`. The depths are approximate.
//! - `peek_dlq` receives from the DLQ with a visibility timeout of 0, which counts as a receive
//!   there (the receive count of a DLQ message grows; the DLQ has no redrive policy, so nothing
//!   moves).
//! - Stale receipts: SQS documents that a delete with an older receipt handle "succeeds but
//!   does not delete", and emulators (moto) even delete or re-show the message. So the adapter
//!   remembers the receipts it handed out itself (the last [`RECEIPT_LOG`] receives) and
//!   refuses, as `StaleReceipt`, a delete or visibility change with a receipt that is no longer
//!   the latest of its message, or of a message it deleted. Receipts it did not hand out (a
//!   Lambda event's) go to SQS as they are, and only SQS's `ReceiptHandleIsInvalid` is
//!   `StaleReceipt` then.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry,
};
use tidings_core::ports::{OutMessage, QueueError, QueueStats, Queues, Received};
use tokio::sync::RwLock;

use crate::config::{AwsConfig, RedriveMode};
use crate::error::{Kind, classify};

/// SQS's limits.
const MAX_BATCH: usize = 10;
const MAX_WAIT_S: u64 = 20;
const MAX_VISIBILITY_S: u64 = 12 * 60 * 60;
const MAX_DELAY_S: u64 = 15 * 60;
/// How long a `StartMessageMoveTask` redrive is waited for.
const MOVE_TASK_WAIT: Duration = Duration::from_secs(300);
const MOVE_TASK_POLL: Duration = Duration::from_secs(1);

/// How many receives the adapter remembers to recognise stale receipts.
pub const RECEIPT_LOG: usize = 10_000;

/// The receipts this adapter handed out: receipt -> message, and the latest receipt of each
/// message (`None` once deleted).
#[derive(Debug, Default)]
struct ReceiptLog {
    message_of: HashMap<String, String>,
    latest: HashMap<String, Option<String>>,
    order: VecDeque<String>,
}

impl ReceiptLog {
    fn received(&mut self, message_id: &str, receipt: &str) {
        if message_id.is_empty() || receipt.is_empty() {
            return;
        }
        self.message_of.insert(receipt.to_string(), message_id.to_string());
        self.latest.insert(message_id.to_string(), Some(receipt.to_string()));
        self.order.push_back(receipt.to_string());
        while self.order.len() > RECEIPT_LOG {
            if let Some(old) = self.order.pop_front()
                && let Some(id) = self.message_of.remove(&old)
                && self.latest.get(&id).is_some_and(|l| l.as_deref() == Some(old.as_str()) || l.is_none())
            {
                self.latest.remove(&id);
            }
        }
    }

    /// Whether the receipt is known to be stale.
    fn is_stale(&self, receipt: &str) -> bool {
        match self.message_of.get(receipt).and_then(|id| self.latest.get(id)) {
            Some(latest) => latest.as_deref() != Some(receipt),
            None => false,
        }
    }

    fn deleted(&mut self, receipt: &str) {
        if let Some(id) = self.message_of.get(receipt) {
            self.latest.insert(id.clone(), None);
        }
    }
}

/// The [`Queues`] port on SQS.
#[derive(Debug)]
pub struct SqsQueues {
    client: Client,
    prefix: String,
    explicit: HashMap<String, String>,
    redrive_mode: RedriveMode,
    /// Real queue name -> URL.
    urls: RwLock<HashMap<String, String>>,
    /// Queue URL -> ARN.
    arns: RwLock<HashMap<String, String>>,
    move_task_wait: Duration,
    receipts: Mutex<ReceiptLog>,
}

/// Whole seconds, rounded up, at most `cap`.
fn secs_up(d: Duration, cap: u64) -> i32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(s.min(cap)).unwrap_or(i32::MAX)
}

fn queue_error<E>(err: SdkError<E, HttpResponse>) -> QueueError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let c = classify(&err);
    match c.code() {
        "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue" => return QueueError::UnknownQueue(c.message),
        "ReceiptHandleIsInvalid"
        | "InvalidIdFormat"
        | "MessageNotInflight"
        | "AWS.SimpleQueueService.MessageNotInflight" => {
            return QueueError::StaleReceipt;
        }
        _ => {}
    }
    match c.kind {
        Kind::Transient => QueueError::Unavailable(c.message),
        Kind::Service | Kind::Construction => QueueError::Invalid(c.message),
    }
}

fn invalid(e: impl std::fmt::Display) -> QueueError {
    QueueError::Invalid(e.to_string())
}

fn received(m: &aws_sdk_sqs::types::Message) -> Received {
    let attr = |name: MessageSystemAttributeName| m.attributes().and_then(|a| a.get(&name)).map(String::as_str);
    Received {
        message_id: m.message_id().unwrap_or_default().to_string(),
        receipt: m.receipt_handle().unwrap_or_default().to_string(),
        body: m.body().unwrap_or_default().to_string(),
        receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1),
        sent_at_ms: attr(MessageSystemAttributeName::SentTimestamp).and_then(|s| s.parse().ok()).unwrap_or(0),
        group: attr(MessageSystemAttributeName::MessageGroupId).map(str::to_owned),
    }
}

impl SqsQueues {
    /// Queues named by the configuration's prefix and explicit URLs.
    pub fn new(client: Client, config: &AwsConfig) -> Self {
        Self {
            client,
            prefix: config.queue_prefix.clone(),
            explicit: config.queue_urls.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            redrive_mode: config.redrive_mode,
            urls: RwLock::new(HashMap::new()),
            arns: RwLock::new(HashMap::new()),
            move_task_wait: MOVE_TASK_WAIT,
            receipts: Mutex::new(ReceiptLog::default()),
        }
    }

    /// How long `redrive` waits for a message move task to finish (default 5 minutes).
    pub fn with_move_task_wait(mut self, wait: Duration) -> Self {
        self.move_task_wait = wait;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn receipt_log(&self) -> std::sync::MutexGuard<'_, ReceiptLog> {
        self.receipts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn redrive_mode(&self) -> RedriveMode {
        self.redrive_mode
    }

    /// The URL of a queue by its suffix (`requests-high` or `requests-high-dlq`).
    async fn url_of(&self, suffix: &str) -> Result<String, QueueError> {
        if let Some(url) = self.explicit.get(suffix) {
            return Ok(url.clone());
        }
        let name = format!("{}{suffix}", self.prefix);
        if let Some(url) = self.urls.read().await.get(&name) {
            return Ok(url.clone());
        }
        let out = self.client.get_queue_url().queue_name(&name).send().await.map_err(|e| match queue_error(e) {
            QueueError::UnknownQueue(_) => QueueError::UnknownQueue(name.clone()),
            other => other,
        })?;
        let url = out.queue_url.ok_or_else(|| QueueError::UnknownQueue(name.clone()))?;
        self.urls.write().await.insert(name, url.clone());
        Ok(url)
    }

    /// The URL of a logical queue.
    pub async fn queue_url(&self, queue: &str) -> Result<String, QueueError> {
        self.url_of(queue).await
    }

    /// The URL of a logical queue's DLQ.
    pub async fn dlq_url(&self, queue: &str) -> Result<String, QueueError> {
        self.url_of(&format!("{queue}-dlq")).await
    }

    async fn arn_of(&self, url: &str) -> Result<String, QueueError> {
        if let Some(arn) = self.arns.read().await.get(url) {
            return Ok(arn.clone());
        }
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(queue_error)?;
        let arn = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .ok_or_else(|| QueueError::Invalid(format!("no QueueArn for {url}")))?;
        self.arns.write().await.insert(url.to_string(), arn.clone());
        Ok(arn)
    }

    async fn depths(&self, url: &str) -> Result<(u64, u64, u64), QueueError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(queue_error)?;
        let get = |name: QueueAttributeName| -> u64 {
            out.attributes().and_then(|a| a.get(&name)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
            get(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
        ))
    }

    /// `SendMessageBatch` calls split by count and by bytes ([`tidings_core::sizes::send_batches`]):
    /// ten large emails are more than one call may carry. A message too large for any queue
    /// refuses the whole send before any of it is sent.
    async fn send_to_url(&self, url: &str, messages: Vec<OutMessage>) -> Result<(), QueueError> {
        for chunk in tidings_core::sizes::send_batches(&messages)? {
            let mut entries = Vec::with_capacity(chunk.len());
            for (i, m) in chunk.iter().enumerate() {
                entries.push(
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(&m.body)
                        .delay_seconds(secs_up(m.delay, MAX_DELAY_S))
                        // A fair queue's tenant: SQS serves a quiet tenant's messages ahead of a
                        // noisy one's backlog (docs/delivery.md, "Fair lanes").
                        .set_message_group_id(m.group.clone())
                        .build()
                        .map_err(invalid)?,
                );
            }
            let out = self
                .client
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(queue_error)?;
            if let Some(first) = out.failed().first() {
                let reason = format!(
                    "{} of {} messages not sent: {}: {}",
                    out.failed().len(),
                    chunk.len(),
                    first.code(),
                    first.message().unwrap_or_default()
                );
                return Err(if out.failed().iter().any(|f| f.sender_fault()) {
                    QueueError::Invalid(reason)
                } else {
                    QueueError::Unavailable(reason)
                });
            }
        }
        Ok(())
    }

    async fn receive_from_url(
        &self,
        url: &str,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, QueueError> {
        let out = self
            .client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(i32::try_from(max.clamp(1, MAX_BATCH)).unwrap_or(1))
            .visibility_timeout(secs_up(visibility, MAX_VISIBILITY_S))
            .wait_time_seconds(secs_up(wait, MAX_WAIT_S))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .map_err(queue_error)?;
        Ok(out.messages().iter().map(received).collect())
    }

    /// `DeleteMessageBatch`, 10 at a time. With `skip_stale`, a receipt no longer valid is
    /// skipped (its message comes again); any other failure is an error, and the whole batch may
    /// be deleted again (deletes are idempotent).
    async fn delete_batch_at(&self, url: &str, receipts: &[String], skip_stale: bool) -> Result<(), QueueError> {
        for chunk in receipts.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| DeleteMessageBatchRequestEntry::builder().id(i.to_string()).receipt_handle(r).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(invalid)?;
            let out = self
                .client
                .delete_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(queue_error)?;
            let stale =
                |code: &str| matches!(code, "ReceiptHandleIsInvalid" | "InvalidIdFormat" | "MessageNotInflight");
            if let Some(f) = out.failed().iter().find(|f| !(skip_stale && stale(f.code()))) {
                return Err(QueueError::Unavailable(format!(
                    "delete failed: {}: {}",
                    f.code(),
                    f.message().unwrap_or_default()
                )));
            }
            let mut log = self.receipt_log();
            for r in chunk {
                log.deleted(r);
            }
        }
        Ok(())
    }

    async fn redrive_by_move_task(&self, queue: &str) -> Result<u64, QueueError> {
        let source = self.arn_of(&self.dlq_url(queue).await?).await?;
        let destination = self.arn_of(&self.queue_url(queue).await?).await?;
        let (visible, _, _) = self.depths(&self.dlq_url(queue).await?).await?;
        if visible == 0 {
            return Ok(0);
        }
        let started = self
            .client
            .start_message_move_task()
            .source_arn(&source)
            .destination_arn(&destination)
            .send()
            .await
            .map_err(queue_error)?;
        let handle = started.task_handle().map(str::to_string);
        let deadline = tokio::time::Instant::now() + self.move_task_wait;
        loop {
            let tasks = self
                .client
                .list_message_move_tasks()
                .source_arn(&source)
                .max_results(10)
                .send()
                .await
                .map_err(queue_error)?;
            let task = tasks
                .results()
                .iter()
                .find(|t| handle.is_some() && t.task_handle() == handle.as_deref())
                .or_else(|| tasks.results().first());
            if let Some(task) = task {
                let moved = u64::try_from(task.approximate_number_of_messages_moved()).unwrap_or(0);
                match task.status() {
                    Some("COMPLETED") => return Ok(moved),
                    Some("FAILED") | Some("CANCELLED") => {
                        return Err(QueueError::Unavailable(format!(
                            "message move task {}: {}",
                            task.status().unwrap_or_default(),
                            task.failure_reason().unwrap_or("no reason given")
                        )));
                    }
                    _ => {
                        if tokio::time::Instant::now() >= deadline {
                            tracing::warn!(queue, moved, "message move task still running; returning the count so far");
                            return Ok(moved);
                        }
                    }
                }
            } else if tokio::time::Instant::now() >= deadline {
                return Ok(visible);
            }
            tokio::time::sleep(MOVE_TASK_POLL).await;
        }
    }

    async fn redrive_by_resending(&self, queue: &str) -> Result<u64, QueueError> {
        let dlq = self.dlq_url(queue).await?;
        let target = self.queue_url(queue).await?;
        let mut moved = 0u64;
        loop {
            let batch = self.receive_from_url(&dlq, MAX_BATCH, Duration::from_secs(60), Duration::ZERO).await?;
            if batch.is_empty() {
                return Ok(moved);
            }
            let copies = batch.iter().map(|m| OutMessage::new(m.body.clone()).in_group(m.group.clone())).collect();
            self.send_to_url(&target, copies).await?;
            let receipts: Vec<String> = batch.iter().map(|m| m.receipt.clone()).collect();
            self.delete_batch_at(&dlq, &receipts, false).await?;
            moved += batch.len() as u64;
        }
    }
}

#[async_trait]
impl Queues for SqsQueues {
    async fn send_batch(&self, queue: &str, messages: Vec<OutMessage>) -> Result<(), QueueError> {
        if messages.is_empty() {
            return Ok(());
        }
        let url = self.queue_url(queue).await?;
        self.send_to_url(&url, messages).await
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let url = self.queue_url(queue).await?;
        let got = self.receive_from_url(&url, max, visibility, wait).await?;
        if got.is_empty() {
            // Idle polling: a cost of waiting workers, not of what they carry.
            metrics::counter!(tidings_core::metrics::EMPTY_RECEIVES, "queue" => queue.to_owned()).increment(1);
        }
        let mut log = self.receipt_log();
        for m in &got {
            log.received(&m.message_id, &m.receipt);
        }
        Ok(got)
    }

    async fn change_visibility(&self, queue: &str, receipt: &str, visibility: Duration) -> Result<(), QueueError> {
        let url = self.queue_url(queue).await?;
        if self.receipt_log().is_stale(receipt) {
            return Err(QueueError::StaleReceipt);
        }
        self.client
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(receipt)
            .visibility_timeout(secs_up(visibility, MAX_VISIBILITY_S))
            .send()
            .await
            .map_err(queue_error)?;
        Ok(())
    }

    async fn delete(&self, queue: &str, receipt: &str) -> Result<(), QueueError> {
        let url = self.queue_url(queue).await?;
        if self.receipt_log().is_stale(receipt) {
            return Err(QueueError::StaleReceipt);
        }
        self.client.delete_message().queue_url(url).receipt_handle(receipt).send().await.map_err(queue_error)?;
        self.receipt_log().deleted(receipt);
        Ok(())
    }

    async fn delete_batch(&self, queue: &str, receipts: &[String]) -> Result<(), QueueError> {
        let url = self.queue_url(queue).await?;
        let live: Vec<String> = {
            let log = self.receipt_log();
            receipts.iter().filter(|r| !log.is_stale(r)).cloned().collect()
        };
        self.delete_batch_at(&url, &live, true).await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let (visible, in_flight, delayed) = self.depths(&self.queue_url(queue).await?).await?;
        let (dv, di, dd) = match tidings_core::messages::has_dlq(queue) {
            true => self.depths(&self.dlq_url(queue).await?).await?,
            false => (0, 0, 0),
        };
        Ok(QueueStats {
            name: queue.to_string(),
            visible,
            in_flight,
            delayed,
            // Not a queue attribute: CloudWatch's ApproximateAgeOfOldestMessage on AWS.
            oldest_age_s: 0,
            dlq_depth: dv + di + dd,
        })
    }

    async fn redrive(&self, queue: &str) -> Result<u64, QueueError> {
        if !tidings_core::messages::has_dlq(queue) {
            return Ok(0);
        }
        match self.redrive_mode {
            RedriveMode::MessageMoveTask => self.redrive_by_move_task(queue).await,
            RedriveMode::ReceiveAndResend => self.redrive_by_resending(queue).await,
        }
    }

    async fn peek_dlq(&self, queue: &str, max: usize) -> Result<Vec<Received>, QueueError> {
        if !tidings_core::messages::has_dlq(queue) {
            return Ok(Vec::new());
        }
        let dlq = self.dlq_url(queue).await?;
        let mut out: Vec<Received> = Vec::new();
        // With a visibility of 0 the same messages may come again: stop when a receive brings
        // nothing new.
        while out.len() < max {
            let batch = self.receive_from_url(&dlq, max - out.len(), Duration::ZERO, Duration::ZERO).await?;
            let before = out.len();
            for m in batch {
                if out.len() < max && !out.iter().any(|o| o.message_id == m.message_id) {
                    out.push(m);
                }
            }
            if out.len() == before {
                break;
            }
        }
        Ok(out)
    }

    async fn send_to_dlq(&self, queue: &str, body: String) -> Result<(), QueueError> {
        tidings_core::sizes::check_message(&OutMessage::new(body.as_str()))?;
        let dlq = self.dlq_url(queue).await?;
        self.client.send_message().queue_url(dlq).message_body(body).send().await.map_err(queue_error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_log_knows_stale_receipts() {
        let mut log = ReceiptLog::default();
        assert!(!log.is_stale("unknown"));
        log.received("m1", "r1");
        assert!(!log.is_stale("r1"));
        log.received("m1", "r2");
        assert!(log.is_stale("r1"));
        assert!(!log.is_stale("r2"));
        log.deleted("r2");
        assert!(log.is_stale("r2"));
        for i in 0..RECEIPT_LOG + 5 {
            log.received(&format!("x{i}"), &format!("rx{i}"));
        }
        assert!(!log.is_stale("r1"), "forgotten");
        assert!(log.message_of.len() <= RECEIPT_LOG && log.latest.len() <= RECEIPT_LOG + 1);
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(secs_up(Duration::ZERO, 900), 0);
        assert_eq!(secs_up(Duration::from_millis(1), 900), 1);
        assert_eq!(secs_up(Duration::from_millis(1500), 900), 2);
        assert_eq!(secs_up(Duration::from_secs(2000), 900), 900);
    }
}
