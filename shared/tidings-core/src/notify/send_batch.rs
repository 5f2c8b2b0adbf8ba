//! The channel worker's path for a send batch (`super::batch`; docs/delivery.md, "Send
//! batches"): the four steps of `super::worker` for up to 25 marketing deliveries recorded in
//! one item.
//!
//! 1. **Select**: a batch of a cancelled notification is closed, its open entries `suppressed`
//!    (`cancelled`); entries of users erased since the notification was accepted are closed
//!    `suppressed` (`erased`) when the batch is claimed.
//! 2. **Claim**: one conditional update of the batch item, `pending` (or `dead`, redriven) →
//!    `sending` with a lease and the claim's number. A second worker's claim fails and does not
//!    send. A claimed batch whose lease ran out is closed: every open entry `failed`
//!    (`outcome_unknown`), never sent again (marketing is at most once).
//! 3. **Send**: the open entries' provider calls, as `super::worker` makes them.
//! 4. **Record**: one transaction writes every entry's outcome into the batch item (conditional
//!    on this worker's claim) with the progress counters and webhook events they move. Entries a
//!    provider answered with a retryable error stay `pending` in the item, and the message comes
//!    back for them; the others are final and never sent again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::Value;
use tracing::{info, warn};

use super::batch::{BatchEntry, BatchStatus, SendBatch, SendBatchTask};
use super::model::{ChannelTask, DeliveryStatus, NotificationStatus};
use super::progress;
use super::worker::{self, Attempt, Claimed, OUTCOME_UNKNOWN};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::outcome::Outcome;
use crate::ports::{Channel, Cond, Key, StoreError, Update, Write};
use crate::retry::backoff;
use crate::tasks::Task;

/// What a batch message is called in a rejection or a log line.
pub const WHAT: &str = "send batch";

/// Handles one send batch message.
pub async fn handle(deps: &Deps, task: &Task<SendBatchTask>, deadline: Option<std::time::Instant>) -> Outcome {
    let result = deliver(deps, &task.body, task.receive_count, deadline).await;
    crate::tasks::classify(deps, WHAT, task.receive_count, result)
}

fn now_str(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn deliver(
    deps: &Deps,
    b: &SendBatchTask,
    receive_count: u32,
    deadline: Option<std::time::Instant>,
) -> CoreResult<Outcome> {
    let t = &b.tenant;
    let key = super::batch::key_of(b)?;
    let now_ms = deps.clock.now_ms();
    // Step 1: a cancelled campaign's batch is closed without a send.
    if super::campaign::status(deps, t, &b.notification_id).await? == Some(NotificationStatus::Cancelled) {
        let Some(item) = deps.table.get(&key).await? else { return Ok(missing(&key.sk)) };
        let seen: SendBatch = item.parse()?;
        return match seen.status {
            BatchStatus::Done => Ok(Outcome::Done),
            BatchStatus::Sending => already_claimed(deps, t, &key, now_ms).await,
            BatchStatus::Pending | BatchStatus::Dead => {
                let close = Close { to: DeliveryStatus::Suppressed, reason: "cancelled", last_error: None };
                close_open(deps, t, &key, &seen, close).await?;
                Ok(Outcome::Done)
            }
        };
    }
    // Step 2: the claim, without reading the batch first: the claim's answer is the batch, and
    // a claim that fails reads it to say why (done, claimed elsewhere, or missing).
    let lease = deps.config.marketing_lease.as_millis() as i64;
    let claim = vec![
        Update::set("status", BatchStatus::Sending.as_str()),
        Update::add("claims", 1),
        Update::set("lease_until_ms", now_ms + lease),
        Update::set("updated_at", now_str(deps)),
    ];
    let cond = Cond::And(vec![
        Cond::Exists,
        Cond::is_in("status", [BatchStatus::Pending.as_str(), BatchStatus::Dead.as_str()]),
    ]);
    let batch: SendBatch = match deps.table.update(&key, claim, cond).await {
        Ok(item) => item.parse()?,
        Err(StoreError::ConditionFailed { .. }) => return already_claimed(deps, t, &key, now_ms).await,
        Err(e) => return Err(e.into()),
    };
    let erased = erased_users(deps, t, &b.notification_id, &batch).await?;
    let sends: HashMap<&str, &super::batch::BatchSend> = b.entries.iter().map(|s| (s.user_id.as_str(), s)).collect();
    let mut entries = batch.entries.clone();
    // Open entries that are not sent: their users erased, or (a page queued again that could
    // no longer render them) not in the message.
    let mut to_send: Vec<(usize, ChannelTask)> = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        if !e.is_open() {
            continue;
        }
        if erased.contains(&e.user_id) {
            e.status = DeliveryStatus::Suppressed;
            e.reason = Some(crate::people::erasure::REASON.into());
            continue;
        }
        match sends.get(e.user_id.as_str()) {
            Some(send) => to_send.push((i, b.task_of(send))),
            None => {
                e.status = DeliveryStatus::Failed;
                e.reason = Some(OUTCOME_UNKNOWN.into());
                e.last_error = Some("not in the batch message; not sent".into());
            }
        }
    }
    // Step 3: the sends. A push batch's devices are read at once after the claim (one read of
    // the batch's users, not one each); a failed read leaves each send to read its own.
    let devices = match b.channel {
        Channel::Push => {
            let users: Vec<&str> = to_send.iter().map(|(_, task)| task.user_id.as_str()).collect();
            crate::people::devices::list_many(deps, t, &users)
                .await
                .inspect_err(|e| warn!(error = %e, "a send batch's devices could not be read at once"))
                .ok()
        }
        _ => None,
    };
    let claimed: Vec<Claimed<'_>> = to_send
        .iter()
        .enumerate()
        .map(|(n, (i, task))| Claimed {
            index: *i,
            t,
            task,
            receive_count,
            key: key.clone(),
            page: batch.page,
            attempts: entries.get(*i).map_or(1, |e| e.attempts.saturating_add(1)),
            devices: devices.as_ref().and_then(|d| d.get(n)).map(Vec::as_slice),
        })
        .collect();
    let sending = super::fence::enter([(t, b.notification_id.as_str())]);
    let attempts = worker::send_all(deps, &claimed, deadline).await;
    // Step 4: the record.
    let mut retry: Option<Duration> = None;
    let mut released = 0usize;
    // Entries a rate gate held back: they stay pending, unattempted, and come back after this.
    let mut gated: Option<Duration> = None;
    let mut rejected = None;
    let mut sent = 0usize;
    for (c, attempt) in claimed.iter().zip(attempts) {
        // A send stopped by the cancel fence was not tried: its entry keeps its attempts.
        let tried = if matches!(attempt, Attempt::Cancelled) { c.attempts.saturating_sub(1) } else { c.attempts };
        let settled = match attempt {
            Attempt::Called(provider, result) => {
                worker::settle(deps, c.task, &provider, c.attempts, receive_count, result)
            }
            Attempt::TimedOut(provider) => worker::timed_out(deps, c.task, &provider, c.attempts, receive_count),
            Attempt::Cancelled => worker::cancelled(deps),
            Attempt::NoProvider => {
                rejected = Some(format!("channel {} has no provider", c.task.channel));
                continue;
            }
            Attempt::Released => {
                released += 1;
                continue;
            }
            Attempt::Gated(wait) => {
                gated = Some(gated.map_or(wait, |g| g.max(wait)));
                continue;
            }
        };
        let Some(entry) = entries.get_mut(c.index) else { continue };
        *entry = applied(entry, settled.to, tried, &settled.updates)?;
        if settled.to == DeliveryStatus::Sent {
            sent += 1;
        }
        if let Outcome::Retry(d) = settled.outcome {
            retry = Some(retry.map_or(d, |r| r.max(d)));
        }
    }
    if released > 0 {
        info!(released, "the batch's deadline was near: sends not started stay pending");
    }
    let status = status_of(&entries);
    let recorded = record(deps, t, &key, &batch, entries, status).await;
    drop(sending);
    match recorded {
        Ok(true) => {
            for _ in 0..sent {
                crate::crash::point("worker.after_sent");
            }
        }
        // The claim is no longer this worker's (its lease ran out and the batch was closed).
        Ok(false) => return Ok(Outcome::Done),
        Err(e) => {
            // Sent but not recorded: the message comes back, finds the batch claimed and, once
            // the lease ran out, closes what is open without a second send.
            warn!(error = %e, "recording a send batch failed; will retry");
            return Ok(Outcome::Retry(backoff(receive_count, deps.config.retry_base, deps.config.retry_cap, None)));
        }
    }
    Ok(match (rejected, retry) {
        (Some(why), _) => Outcome::Reject(why),
        (None, Some(d)) => Outcome::Retry(d.max(gated.unwrap_or_default())),
        (None, None) if let Some(wait) = gated => Outcome::HandBackAfter(wait),
        (None, None) if released > 0 => Outcome::HandBack,
        (None, None) => Outcome::Done,
    })
}

/// A batch message whose batch record is not there: nothing to send by (dropped).
fn missing(batch: &str) -> Outcome {
    warn!(batch, "send batch without a batch record; dropped");
    Outcome::Done
}

/// Users of the batch's open entries erased since the notification was accepted
/// (`crate::people::erasure`): one read of their erasure records.
async fn erased_users(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    batch: &SendBatch,
) -> CoreResult<HashSet<String>> {
    let users: Vec<&str> = batch.entries.iter().filter(|e| e.is_open()).map(|e| e.user_id.as_str()).collect();
    let keys: Vec<Key> = users.iter().map(|u| keys::erasure(t, u)).collect();
    let records = deps.table.get_many(&keys).await?;
    if records.iter().all(Option::is_none) {
        return Ok(HashSet::new());
    }
    let accepted_ms = super::api::load(deps, t, notification_id).await?.map(|n| n.created_ms);
    Ok(users
        .into_iter()
        .zip(records)
        .filter_map(|(u, r)| {
            let erased_ms = r?.i64("erased_ms")?;
            accepted_ms.is_none_or(|a| a <= erased_ms).then(|| u.to_owned())
        })
        .collect())
}

/// An entry after its provider's answer: the worker's updates for a delivery, applied to it.
fn applied(entry: &BatchEntry, to: DeliveryStatus, attempts: u32, updates: &[Update]) -> CoreResult<BatchEntry> {
    let mut map = match serde_json::to_value(entry) {
        Ok(Value::Object(map)) => map,
        _ => return Err(StoreError::Corrupt("a batch entry is not an object".into()).into()),
    };
    for u in updates {
        match u {
            Update::Set(name, v) => {
                map.insert(name.clone(), v.clone());
            }
            Update::SetIfAbsent(name, v) => {
                map.entry(name.clone()).or_insert_with(|| v.clone());
            }
            Update::Remove(name) => {
                map.remove(name);
            }
            Update::Add(..) => {}
        }
    }
    let mut e: BatchEntry =
        serde_json::from_value(Value::Object(map)).map_err(|e| StoreError::Corrupt(format!("batch entry: {e}")))?;
    e.status = to;
    e.attempts = attempts;
    // The batch's own `updated_at` says when: an entry's would only make the item (and every
    // write of it) larger.
    e.updated_at = None;
    Ok(e)
}

/// A batch's status from its entries: `dead` when one ran out of receives, `pending` when one
/// is still to be sent, else `done`.
fn status_of(entries: &[BatchEntry]) -> BatchStatus {
    if entries.iter().any(|e| e.status == DeliveryStatus::Dead) {
        BatchStatus::Dead
    } else if entries.iter().any(BatchEntry::is_open) {
        BatchStatus::Pending
    } else {
        BatchStatus::Done
    }
}

/// Writes the batch's entries as `entries`, conditional on the batch being as `was` (its
/// status and claim), with the counters and webhook events of every entry that moved, in one
/// transaction. `Ok(false)`: the batch was no longer as `was`.
async fn record(
    deps: &Deps,
    t: &TenantId,
    key: &Key,
    was: &SendBatch,
    entries: Vec<BatchEntry>,
    status: BatchStatus,
) -> CoreResult<bool> {
    let mut changes = Vec::new();
    let mut events = Vec::new();
    for (before, after) in was.entries.iter().zip(&entries) {
        if before.status == after.status {
            continue;
        }
        let (from, to) = (progress::bucket(before.status), progress::bucket(after.status));
        if from != to {
            let counter = progress::counter_key(t, &was.notification_id, was.page, &after.user_id);
            changes.push((counter.clone(), from, -1));
            changes.push((counter, to, 1));
        }
        if crate::webhooks::delivery_event_type(before.status, after.status).is_some() {
            events.push(crate::webhooks::DeliveryChange {
                notification_id: &was.notification_id,
                user_id: &after.user_id,
                delivery_sk: keys::delivery(t, &was.notification_id, &after.user_id, was.channel).sk,
                from: before.status,
                to: after.status,
            });
        }
    }
    let entries = serde_json::to_value(&entries).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let updates = vec![
        Update::Set("entries".into(), entries),
        Update::set("status", status.as_str()),
        Update::set("updated_at", now_str(deps)),
        Update::Remove("lease_until_ms".into()),
    ];
    let cond = Cond::And(vec![Cond::eq("status", was.status.as_str()), Cond::eq("claims", i64::from(was.claims))]);
    let mut writes = vec![Write::Update { key: key.clone(), updates, cond }];
    writes.extend(progress::counter_writes(changes, deps.clock.now_ms()));
    writes.extend(crate::webhooks::delivery_event_writes(deps, t, events).await?);
    match progress::transact_retrying(deps.table.as_ref(), writes).await {
        Ok(()) => Ok(true),
        Err(StoreError::ConditionFailed { index: 0 }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How a batch's open entries are closed without a send.
pub(super) struct Close {
    pub to: DeliveryStatus,
    pub reason: &'static str,
    pub last_error: Option<&'static str>,
}

/// Closes the open entries of `batch` (as read) without a send, with their counters.
pub(super) async fn close_open(
    deps: &Deps,
    t: &TenantId,
    key: &Key,
    batch: &SendBatch,
    close: Close,
) -> CoreResult<bool> {
    let entries: Vec<BatchEntry> = batch
        .entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            if e.is_open() {
                e.status = close.to;
                e.reason = Some(close.reason.into());
                if let Some(why) = close.last_error {
                    e.last_error = Some(why.into());
                }
            }
            e
        })
        .collect();
    record(deps, t, key, batch, entries, BatchStatus::Done).await
}

/// The claim failed: another worker holds the batch, or it is final. A claim whose lease ran
/// out belonged to a worker that stopped between its claim and its record: its open entries
/// are closed `failed` (`outcome_unknown`), not sent (marketing is at most once).
async fn already_claimed(deps: &Deps, t: &TenantId, key: &Key, now_ms: i64) -> CoreResult<Outcome> {
    let Some(item) = deps.table.get(key).await? else { return Ok(missing(&key.sk)) };
    let batch: SendBatch = item.parse()?;
    match batch.status {
        BatchStatus::Done => Ok(Outcome::Done),
        // Recorded for a retry meanwhile: claimed again when the message comes back.
        BatchStatus::Pending | BatchStatus::Dead => Ok(Outcome::Retry(Duration::from_millis(500))),
        BatchStatus::Sending => {
            let lease_until = batch.lease_until_ms.unwrap_or(now_ms);
            if lease_until > now_ms {
                let wait_ms = lease_until.saturating_sub(now_ms).max(0) as u64;
                return Ok(Outcome::Retry(Duration::from_millis(wait_ms + 500)));
            }
            warn!(
                batch = %key.sk,
                "a send batch's claim outlived its lease: open entries closed as failed (outcome unknown), not sent again"
            );
            let close = Close {
                to: DeliveryStatus::Failed,
                reason: OUTCOME_UNKNOWN,
                last_error: Some("the worker stopped after claiming; not sent again (marketing is at most once)"),
            };
            close_open(deps, t, key, &batch, close).await?;
            Ok(Outcome::Done)
        }
    }
}
