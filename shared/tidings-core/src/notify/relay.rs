//! The outbox relay: committed notification items, read from the change stream, become request
//! messages. It may deliver twice (the stream is at least once); the orchestrator is idempotent.
//!
//! Records are relayed in order, and a batch says which record failed first
//! ([`RelayReport::failed`]): everything before it is done, so the event source mapping retries
//! (and bisects) from that record on and never past it. A record that can never be relayed (it
//! does not parse) is a poison record ([`RelayReport::poison`]): the caller records it on the
//! [`STREAM_FAILURES_QUEUE`] with its key ([`StreamFailure`]) and the batch goes on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::model::{Notification, NotificationStatus, RequestMessage};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys::{self, NOTIFICATION_SK};
use crate::lanes::Lane;
use crate::ports::{ChangeRecord, Item, Key, OutMessage, StoreError};

/// Where stream records that were not relayed are recorded: the on-failure destination of the
/// stream's event source mapping (`template.yaml` StreamFailuresQueue, which records the
/// positions of what it gave up on), and the relay's own record of each poison record, with its
/// key. Read by operators (`tidings ops stream-failures`), never by a worker.
pub const STREAM_FAILURES_QUEUE: &str = "stream-failures";

/// Whether the relay (with the live feed and back-in-stock rounds) acts on changes of the item
/// `key`: new notifications (`N`), campaign page tasks (`P#`), stock items (`STOCK`), inbox
/// messages (`M#`) and webhook events (`WHEVT`). The same filter as the event source mapping's `FilterCriteria` in
/// `template.yaml`; the embedded store records only these changes (a campaign's deliveries,
/// counters and receipts are most of its writes and nobody reads their changes).
pub fn streamed(key: &crate::ports::Key) -> bool {
    let sk = key.sk.as_str();
    sk == NOTIFICATION_SK
        || sk == crate::webhooks::EVENT_SK
        || sk == crate::inventory::keys::STOCK_SK
        || sk.starts_with(keys::PAGE_PREFIX)
        || sk.starts_with(keys::INBOX_MESSAGE_PREFIX)
}

/// [`streamed`], narrowed by what changed: a stock item's change counts only when its
/// `restock_round` grew (or the item is new), the one change of a stock item anything acts on
/// ([`crate::restock::on_stock_changes`]). Every order moves its SKU's counters on that item, so
/// recording those changes cost each order two JSON encodings of the item and the relay a
/// record to read and drop. The embedded store records what this accepts; on AWS the stream
/// has every change and the relay drops the same records (an event filter cannot compare the
/// old image with the new).
pub fn streamed_change(
    key: &crate::ports::Key,
    old: Option<&crate::ports::Attrs>,
    new: Option<&crate::ports::Attrs>,
) -> bool {
    if key.sk != crate::inventory::keys::STOCK_SK {
        return streamed(key);
    }
    let round = |a: Option<&crate::ports::Attrs>| a.and_then(|a| a.get("restock_round")).and_then(|v| v.as_i64());
    match (old, new) {
        (None, Some(_)) => true,
        (_, None) => false,
        (Some(_), Some(_)) => round(new).unwrap_or(0) > round(old).unwrap_or(0),
    }
}

/// What the relay made of a batch of change records.
#[derive(Debug, Default)]
pub struct RelayReport {
    /// Records that can never be relayed, by index in the batch, with why. Only records before
    /// [`RelayReport::failed`] are listed (the others come again).
    pub poison: Vec<(usize, String)>,
    /// The first record that failed (a retryable error), by index, with the error: every record
    /// before it is done; it and those after it are to come again.
    pub failed: Option<(usize, CoreError)>,
}

/// What one record asks of the relay.
enum Step {
    Nothing,
    Poison(String),
    Send(String, OutMessage),
    Scheduled(TenantId, Box<Notification>),
    Stock,
}

fn body_of(message: &RequestMessage) -> CoreResult<String> {
    serde_json::to_string(message).map_err(|e| CoreError::Store(StoreError::Corrupt(e.to_string())))
}

/// What `record` asks for, without any I/O.
fn step_of(record: &ChangeRecord) -> CoreResult<Step> {
    // A campaign's next page (an outbox entry put by the page before it).
    if record.key.sk.starts_with(keys::PAGE_PREFIX) {
        if !record.is_insert() {
            return Ok(Step::Nothing);
        }
        return Ok(match record.new.as_ref().and_then(super::campaign::page_task) {
            Some((queue, message)) => {
                Step::Send(queue, OutMessage::new(body_of(&message)?).for_tenant(&message.tenant))
            }
            None => Step::Poison("unreadable campaign page task".into()),
        });
    }
    if record.key.sk == crate::inventory::keys::STOCK_SK {
        return Ok(Step::Stock);
    }
    // A webhook event (an outbox entry put beside its fact).
    if record.key.sk == crate::webhooks::EVENT_SK {
        if !record.is_insert() {
            return Ok(Step::Nothing);
        }
        return Ok(match record.new.as_ref().and_then(|new| crate::webhooks::relayed(&record.key, new)) {
            Some(body) => Step::Send(crate::webhooks::WEBHOOKS_QUEUE.to_owned(), OutMessage::new(body)),
            None => Step::Poison("unreadable webhook event".into()),
        });
    }
    if record.key.sk != NOTIFICATION_SK || !record.is_insert() {
        return Ok(Step::Nothing);
    }
    let Some((tenant, _)) = keys::tenant_of(&record.key.pk) else {
        return Ok(Step::Poison("notification record without a tenant in its key".into()));
    };
    let Some(new) = &record.new else {
        return Ok(Step::Poison("notification insert without its new image".into()));
    };
    let notification: Notification = match Item::new(record.key.clone(), new.clone()).parse() {
        Ok(n) => n,
        Err(e) => return Ok(Step::Poison(format!("unreadable notification record: {e}"))),
    };
    Ok(match notification.status {
        NotificationStatus::Scheduled => Step::Scheduled(tenant, Box::new(notification)),
        NotificationStatus::Accepted => {
            let message = RequestMessage::first(&tenant, &notification.notification_id);
            debug!(notification_id = %message.notification_id, "relaying");
            // In its tenant's turn on the lane (docs/delivery.md, "Fair lanes").
            let out = OutMessage::new(body_of(&message)?).for_tenant(&tenant);
            Step::Send(Lane::requests(notification.priority).name().to_owned(), out)
        }
        _ => Step::Nothing,
    })
}

/// Sends the messages held back, one batch per queue. On failure: the first record whose
/// message was not sent.
async fn flush(deps: &Deps, held: &mut Vec<(usize, String, OutMessage)>) -> Result<(), (usize, CoreError)> {
    let mut by_queue: BTreeMap<String, Vec<(usize, OutMessage)>> = BTreeMap::new();
    for (i, queue, message) in held.drain(..) {
        by_queue.entry(queue).or_default().push((i, message));
    }
    let mut failed: Option<(usize, CoreError)> = None;
    for (queue, messages) in by_queue {
        let first = messages.first().map_or(0, |(i, _)| *i);
        let messages = messages.into_iter().map(|(_, m)| m).collect();
        if let Err(e) = deps.queues.send_batch(&queue, messages).await
            && failed.as_ref().is_none_or(|(i, _)| first < *i)
        {
            failed = Some((first, e.into()));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Relays a batch of change records in order (see the module's documentation). Consecutive
/// sends are batched; a record that needs a write of its own (a scheduled notification's
/// timers, a stock item's round) is handled after the sends before it went out.
pub async fn relay_changes(deps: &Deps, records: &[ChangeRecord]) -> RelayReport {
    let mut report = RelayReport::default();
    let mut held: Vec<(usize, String, OutMessage)> = Vec::new();
    let mut relayed = false;
    for (i, record) in records.iter().enumerate() {
        let step = match step_of(record) {
            Ok(s) => s,
            Err(e) => {
                report.failed = Some((i, e));
                break;
            }
        };
        let own_write = match step {
            Step::Nothing => continue,
            Step::Poison(why) => {
                report.poison.push((i, why));
                continue;
            }
            Step::Send(queue, message) => {
                held.push((i, queue, message));
                relayed = true;
                continue;
            }
            own => own,
        };
        if let Err(f) = flush(deps, &mut held).await {
            report.failed = Some(f);
            break;
        }
        let done = match own_write {
            Step::Scheduled(tenant, n) => crate::timers::schedule::on_scheduled(deps, &tenant, &n).await,
            _ => crate::restock::on_stock_changes(deps, std::slice::from_ref(record)).await,
        };
        if let Err(e) = done {
            report.failed = Some((i, e));
            break;
        }
    }
    if report.failed.is_none()
        && let Err(f) = flush(deps, &mut held).await
    {
        report.failed = Some(f);
    }
    if let Some((at, _)) = &report.failed {
        report.poison.retain(|(i, _)| i < at);
    }
    if relayed {
        // Queued, but the stream position is not committed yet: the records come again.
        crate::crash::point("relay.after_send");
    }
    report
}

/// Handles a batch of change records; the first error fails the batch (it is retried). Poison
/// records are logged and skipped: callers that can record them use [`relay_changes`].
pub async fn handle_changes(deps: &Deps, records: &[ChangeRecord]) -> CoreResult<()> {
    let report = relay_changes(deps, records).await;
    for (i, why) in &report.poison {
        if let Some(r) = records.get(*i) {
            warn!(pk = %r.key.pk, sk = %r.key.sk, reason = %why, "poison stream record skipped");
        }
    }
    match report.failed {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// A message on the [`STREAM_FAILURES_QUEUE`]: what the event source mapping writes when it
/// gives up on a batch (`DDBStreamBatchInfo`: shard and sequence numbers only), or what the relay
/// writes for a poison record (the same shape for one record, condition `PoisonRecord`, with
/// the record's `keys`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamFailure {
    #[serde(rename = "requestContext", default)]
    pub context: FailureContext,
    #[serde(rename = "DDBStreamBatchInfo", default)]
    pub batch: StreamBatchInfo,
    /// The record's `Keys` as the stream shows them (DynamoDB JSON: `{"pk": {"S": ...}, ...}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<serde_json::Value>,
}

/// Why the records were not relayed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureContext {
    /// `RetryAttemptsExhausted` (and Lambda's other conditions) or [`POISON_CONDITION`].
    #[serde(default)]
    pub condition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The condition of a poison record's [`StreamFailure`].
pub const POISON_CONDITION: &str = "PoisonRecord";

/// Which records: a shard's range of sequence numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamBatchInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_arn: Option<String>,
    #[serde(default)]
    pub batch_size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_sequence_number: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_sequence_number: Option<String>,
}

impl StreamFailure {
    /// The failure record of one poison record.
    pub fn poison(
        sequence_number: Option<String>,
        stream_arn: Option<String>,
        keys: serde_json::Value,
        why: &str,
    ) -> Self {
        StreamFailure {
            context: FailureContext { condition: POISON_CONDITION.into(), reason: Some(why.to_owned()) },
            batch: StreamBatchInfo {
                shard_id: None,
                stream_arn,
                batch_size: 1,
                start_sequence_number: sequence_number.clone(),
                end_sequence_number: sequence_number,
            },
            keys: Some(keys),
        }
    }

    /// The key the failure names, when it names one it can read (string `pk` and `sk`).
    pub fn key(&self) -> Option<Key> {
        let keys = self.keys.as_ref()?;
        let s = |name: &str| keys.get(name)?.get("S")?.as_str().map(str::to_owned);
        Some(Key::new(s("pk")?, s("sk")?))
    }
}

/// What re-driving a stream record's item did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Redriven {
    /// Its request (or campaign page task) is queued again.
    Queued,
    /// Nothing is waiting on it: the item is gone, past `accepted`, or not an outbox entry (a
    /// stock item's round is caught by the restock scan, an inbox message by the live feed's
    /// `since`).
    NothingToDo,
}

/// Queues again what the item at `key` would have been relayed as, if it still waits: a
/// notification still `accepted`, a campaign page task not done. Idempotent: the orchestrator
/// absorbs a repeated request (see [`super::orchestrator`]). An item that still does not parse
/// is an error (it stays where it was recorded).
pub async fn redrive(deps: &Deps, key: &Key) -> CoreResult<Redriven> {
    if key.sk == crate::webhooks::EVENT_SK {
        return Ok(if crate::webhooks::redrive(deps, key).await? { Redriven::Queued } else { Redriven::NothingToDo });
    }
    let is_page = key.sk.starts_with(keys::PAGE_PREFIX);
    if key.sk != NOTIFICATION_SK && !is_page {
        return Ok(Redriven::NothingToDo);
    }
    let Some(item) = deps.table.get(key).await? else { return Ok(Redriven::NothingToDo) };
    let Some((tenant, _)) = keys::tenant_of(&key.pk) else {
        return Err(StoreError::Corrupt(format!("{}: no tenant in the key", key.pk)).into());
    };
    let (queue, message) = if is_page {
        let Some((queue, message)) = super::campaign::page_task(&item.attrs) else {
            return Err(StoreError::Corrupt(format!("{} {}: unreadable campaign page task", key.pk, key.sk)).into());
        };
        if super::campaign::page_done(deps, &tenant, &message.notification_id, message.page).await? {
            return Ok(Redriven::NothingToDo);
        }
        (queue, message)
    } else {
        let n: Notification = item.parse()?;
        match n.status {
            NotificationStatus::Accepted => {}
            NotificationStatus::Scheduled => {
                crate::timers::schedule::on_scheduled(deps, &tenant, &n).await?;
                return Ok(Redriven::Queued);
            }
            _ => return Ok(Redriven::NothingToDo),
        }
        (Lane::requests(n.priority).name().to_owned(), RequestMessage::first(&tenant, &n.notification_id))
    };
    deps.queues.send_batch(&queue, vec![OutMessage::new(body_of(&message)?).for_tenant(&tenant)]).await?;
    Ok(Redriven::Queued)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use serde_json::json;

    use super::*;
    use crate::ports::{Attrs, Key};

    fn attrs(v: serde_json::Value) -> Attrs {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_stock_change_is_streamed_only_when_its_restock_round_grows() {
        let stock = Key::new("T#t#SKU#hot", crate::inventory::keys::STOCK_SK);
        let before = attrs(json!({"available": 5, "reserved": 0, "restock_round": 2}));
        let reserved = attrs(json!({"available": 4, "reserved": 1, "restock_round": 2}));
        let restocked = attrs(json!({"available": 3, "reserved": 0, "restock_round": 3}));
        assert!(!streamed_change(&stock, Some(&before), Some(&reserved)), "an order's reservation");
        assert!(streamed_change(&stock, Some(&before), Some(&restocked)), "a round opened");
        assert!(streamed_change(&stock, None, Some(&before)), "a new SKU");
        assert!(!streamed_change(&stock, Some(&before), None), "a removed SKU");
        let unstreamed = Key::new("T#t#ORDER#o1", "ORDER");
        assert!(!streamed_change(&unstreamed, None, Some(&before)));
        let notification = Key::new("T#t#NOTIF#n1", NOTIFICATION_SK);
        assert!(streamed_change(&notification, None, Some(&before)), "other keys as `streamed` says");
    }
}
