//! Timers (docs/timers.md): one mechanism for everything that must happen later, each a
//! [`TimerTask`] kind: hold expiry, scheduled sends, quiet-hours resumes, restock waves, flushes
//! and checks, and the tracking routes' opens and clicks.
//!
//! - Due within 15 minutes: a message on the [`TIMERS_QUEUE`] with that SQS delay.
//! - Later: a timer item in a minute bucket, and the bucket in a small index of open buckets:
//!
//!   | item | pk | sk |
//!   |---|---|---|
//!   | timer | `TIMER#{yyyyMMddHHmm}` | `{due_ms:015}#{id}` |
//!   | open bucket (lease while firing) | `TIMERS#OPEN` | `{yyyyMMddHHmm}` |
//!
//!   [`tick`] (every minute, on a schedule) fires every open bucket up to the next minute: it
//!   claims the bucket with a lease (a conditional update, so two ticks never both fire it; an
//!   expired lease can be claimed again), sends each timer to the queue with the rest of its
//!   delay, deletes what it sent, and deletes the bucket's index entry.
//! - The handler [`handle_timer_message`] sends a message that is still early back with a new
//!   delay (SQS delays stop at 15 minutes), then runs the task.
//!
//! A bucket only takes timers while it is at least [`WRITE_AHEAD_MINUTES`] in the future, and
//! ticks fire it from 1 minute before, so no timer lands in a bucket that was already fired
//! (as long as clocks agree within 2 minutes). Everything is at least once: a timer can fire
//! twice (a tick that dies between sending and deleting), so every task is idempotent (expiry
//! is conditioned on the order being PENDING and past due).

pub mod schedule;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, new_id};
use crate::inventory::{self, Settlement};
use crate::outcome::Outcome;
use crate::ports::queue::MAX_DELAY;
use crate::ports::{Cond, Item, Key, OutMessage, QueryOpts, Received, StoreError, Update, Write, attrs_of};
use crate::retry::backoff;

/// The queue timers are delivered on (the runtime declares it and polls it with
/// [`handle_timer_message`]).
pub const TIMERS_QUEUE: &str = "timers";
/// The partition of the open-bucket index.
pub const OPEN_BUCKETS_PK: &str = "TIMERS#OPEN";
/// A bucket takes timers only while it is at least this many minutes ahead.
pub const WRITE_AHEAD_MINUTES: i64 = 3;
/// How long a tick holds a bucket while it fires it.
pub const BUCKET_LEASE: Duration = Duration::from_secs(120);
const MINUTE_MS: i64 = 60_000;
/// A message this early (or less) counts as due.
const EARLY_SLACK_MS: i64 = 1_000;

/// What a timer does when it fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum TimerTask {
    /// Expire an order's hold if it is still PENDING and past `expires_at`.
    #[serde(rename = "order.expire")]
    OrderExpire { tenant: String, order_id: String },
    /// Run the next wave of a restock round (waves paced by stock: docs/restock.md, "Waves").
    #[serde(rename = "restock.wave")]
    RestockWave { tenant: String, sku_id: String, round: i64, wave: u32 },
    /// Close a user's restock merge window and send its message.
    #[serde(rename = "restock.flush")]
    RestockFlush { tenant: String, window_id: String },
    /// Judge a restock message's attempt: sent, retry (1/5/30 min), MANUAL or unreachable.
    #[serde(rename = "restock.check")]
    RestockCheck { tenant: String, window_id: String, attempt: u32 },
    /// Start a scheduled notification (`send_at`): all its users, or with `local_time` the
    /// `users` of one zone (group `group` of `groups`).
    #[serde(rename = "notification.send")]
    ScheduledSend {
        tenant: String,
        notification_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        users: Option<Vec<String>>,
        #[serde(default)]
        group: u32,
        #[serde(default = "one")]
        groups: u32,
    },
    /// A marketing delivery held back by the user's quiet hours: plan it again.
    #[serde(rename = "delivery.resume")]
    DeferredDelivery { tenant: String, notification_id: String, user_id: String, channel: crate::ports::Channel },
    /// An open or a click, queued by the tracking routes before they answer (in Lambda an
    /// environment is frozen once it has answered, so nothing may be left to do after it).
    #[serde(rename = "tracking.event")]
    Tracked { claims: crate::tracking::Claims, at_ms: i64 },
}

fn one() -> u32 {
    1
}

/// The body of a message on the timers queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerMessage {
    pub due_ms: i64,
    pub task: TimerTask,
}

/// A stored timer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct TimerItem {
    due_ms: i64,
    task: TimerTask,
    /// Epoch seconds for DynamoDB TTL: a timer nobody fired is cleaned up a week late.
    ttl: i64,
}

/// What a tick did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TickReport {
    pub buckets_fired: u64,
    pub timers_sent: u64,
}

/// Whether `due_at` is close enough for a queue delay.
pub fn fits_queue_delay(deps: &Deps, due_at: DateTime<Utc>) -> bool {
    due_at.timestamp_millis() - deps.clock.now_ms() <= i64::try_from(MAX_DELAY.as_millis()).unwrap_or(i64::MAX)
}

/// Schedules `task` for `due_at`: within 15 minutes a delayed message, else a bucketed timer.
pub async fn schedule(deps: &Deps, due_at: DateTime<Utc>, task: TimerTask) -> CoreResult<()> {
    if fits_queue_delay(deps, due_at) {
        return send_message(deps, due_at.timestamp_millis(), task).await;
    }
    let write = durable_timer(deps, due_at, &task).await?;
    deps.table.transact(vec![write]).await?;
    Ok(())
}

/// The minute bucket name of a time: `yyyyMMddHHmm`.
pub fn bucket_of(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default().format("%Y%m%d%H%M").to_string()
}

/// Opens the bucket a timer due at `due_at` goes into and returns the timer's write, for the
/// caller to put in its own transaction (an order's hold and its expiry are written together).
/// The bucket is the due minute, but never sooner than [`WRITE_AHEAD_MINUTES`] from now.
///
/// The index entry is written outside the caller's transaction and only when absent (read
/// first): every order of a busy minute shares it, and a shared item in every transaction would
/// make them conflict.
pub async fn durable_timer(deps: &Deps, due_at: DateTime<Utc>, task: &TimerTask) -> CoreResult<Write> {
    let due_ms = due_at.timestamp_millis();
    let now_minute = deps.clock.now_ms().div_euclid(MINUTE_MS) * MINUTE_MS;
    let bucket = bucket_of(due_ms.max(now_minute + WRITE_AHEAD_MINUTES * MINUTE_MS));
    let index = Key::new(OPEN_BUCKETS_PK, bucket.clone());
    if deps.table.get(&index).await?.is_none() {
        deps.table
            .update(&index, vec![Update::SetIfAbsent("bucket".into(), bucket.clone().into())], Cond::Always)
            .await?;
    }
    let item = TimerItem { due_ms, task: task.clone(), ttl: due_ms / 1000 + 7 * 24 * 3600 };
    let key = Key::new(format!("TIMER#{bucket}"), format!("{:015}#{}", due_ms.max(0), new_id()));
    Ok(Write::Put { item: Item::new(key, attrs_of(&item)?), cond: Cond::NotExists })
}

/// Sends the task to the timers queue, delayed until it is due (at most 15 minutes; the handler
/// delays it again if needed).
async fn send_message(deps: &Deps, due_ms: i64, task: TimerTask) -> CoreResult<()> {
    let body = serde_json::to_string(&TimerMessage { due_ms, task }).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    deps.queues.send_batch(TIMERS_QUEUE, vec![OutMessage::delayed(body, delay_until(deps, due_ms))]).await?;
    Ok(())
}

/// The queue delay until `due_ms`, in whole seconds (as SQS takes it), rounded up, at most 15
/// minutes.
fn delay_until(deps: &Deps, due_ms: i64) -> Duration {
    let ms = (due_ms - deps.clock.now_ms()).max(0);
    let secs = u64::try_from((ms + 999) / 1000).unwrap_or(0);
    Duration::from_secs(secs).min(MAX_DELAY)
}

/// Fires every open bucket up to the next minute. Run it every minute; any number of ticks may
/// run at once.
pub async fn tick(deps: &Deps) -> CoreResult<TickReport> {
    let horizon = bucket_of(deps.clock.now_ms() + MINUTE_MS);
    let mut report = TickReport::default();
    let mut cursor = None;
    loop {
        let page = deps.table.query(OPEN_BUCKETS_PK, "", QueryOpts { limit: 100, cursor, descending: false }).await?;
        for entry in &page.items {
            if entry.key.sk > horizon {
                return Ok(report);
            }
            if let Some(sent) = fire_bucket(deps, &entry.key.sk).await? {
                report.buckets_fired += 1;
                report.timers_sent += sent;
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(report);
        }
    }
}

/// Claims, fires and closes one bucket; `None` when another tick holds it (or closed it).
async fn fire_bucket(deps: &Deps, bucket: &str) -> CoreResult<Option<u64>> {
    let index = Key::new(OPEN_BUCKETS_PK, bucket);
    let owner = new_id();
    let now_ms = deps.clock.now_ms();
    let lease_until = now_ms + i64::try_from(BUCKET_LEASE.as_millis()).unwrap_or(i64::MAX);
    let claim = Cond::And(vec![
        Cond::Exists,
        Cond::Or(vec![Cond::AttrNotExists("lease_until_ms".into()), Cond::lt("lease_until_ms", now_ms)]),
    ]);
    let updates = vec![Update::set("lease_owner", owner.clone()), Update::set("lease_until_ms", lease_until)];
    match deps.table.update(&index, updates, claim).await {
        Ok(_) => {}
        Err(StoreError::ConditionFailed { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let pk = format!("TIMER#{bucket}");
    let mut sent = 0u64;
    loop {
        // What was sent is deleted, so each page starts from the beginning again.
        let page = deps.table.query(&pk, "", QueryOpts { limit: 100, cursor: None, descending: false }).await?;
        if page.items.is_empty() {
            break;
        }
        let mut messages = Vec::with_capacity(page.items.len());
        for item in &page.items {
            match item.parse::<TimerItem>() {
                Ok(t) => {
                    let body = serde_json::to_string(&TimerMessage { due_ms: t.due_ms, task: t.task })
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    messages.push(OutMessage::delayed(body, delay_until(deps, t.due_ms)));
                }
                Err(e) => warn!(error = %e, "unreadable timer dropped"),
            }
        }
        sent += messages.len() as u64;
        deps.queues.send_batch(TIMERS_QUEUE, messages).await?;
        for item in &page.items {
            deps.table.delete(&item.key, Cond::Always).await?;
        }
    }
    match deps.table.delete(&index, Cond::eq("lease_owner", owner)).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    info!(bucket, sent, "timer bucket fired");
    Ok(Some(sent))
}

/// Handles one message of the timers queue.
pub async fn handle_timer_message(deps: &Deps, message: &Received) -> Outcome {
    let timer: TimerMessage = match serde_json::from_str(&message.body) {
        Ok(t) => t,
        Err(e) => return Outcome::Reject(format!("malformed timer message: {e}")),
    };
    let retry = || Outcome::Retry(backoff(message.receive_count, deps.config.retry_base, deps.config.retry_cap, None));
    if timer.due_ms > deps.clock.now_ms() + EARLY_SLACK_MS {
        return match send_message(deps, timer.due_ms, timer.task).await {
            Ok(()) => Outcome::Done,
            Err(e) => {
                warn!(error = %e, "timer not re-delayed; will retry");
                retry()
            }
        };
    }
    match run(deps, &timer.task).await {
        Ok(()) => Outcome::Done,
        Err(CoreError::Invalid { field, detail }) => Outcome::Reject(format!("timer task: {field}: {detail}")),
        Err(e) => {
            warn!(error = %e, task = ?timer.task, "timer task failed; will retry");
            retry()
        }
    }
}

/// Runs a due task.
async fn run(deps: &Deps, task: &TimerTask) -> CoreResult<()> {
    match task {
        TimerTask::OrderExpire { tenant, order_id } => {
            let t = TenantId::parse(tenant)?;
            match inventory::expire_order(deps, &t, order_id).await? {
                // Early (a clock ahead of ours, or a re-delay that fell short): again later.
                Settlement::NotDue { expires_ms } => {
                    let due = DateTime::<Utc>::from_timestamp_millis(expires_ms).unwrap_or_default();
                    schedule(deps, due, task.clone()).await
                }
                Settlement::Settled(_) => {
                    info!(tenant = %t, order_id, "hold expired and released");
                    Ok(())
                }
                Settlement::Already(_) | Settlement::NotPending(_) => Ok(()),
            }
        }
        TimerTask::RestockWave { tenant, sku_id, round, wave } => {
            let t = TenantId::parse(tenant)?;
            crate::restock::run_round(deps, &t, sku_id, *round, Some(*wave)).await.map(|_| ())
        }
        TimerTask::RestockFlush { tenant, window_id } => {
            crate::restock::merge::flush(deps, &TenantId::parse(tenant)?, window_id).await
        }
        TimerTask::RestockCheck { tenant, window_id, attempt } => {
            crate::restock::merge::check(deps, &TenantId::parse(tenant)?, window_id, *attempt).await
        }
        TimerTask::ScheduledSend { tenant, notification_id, users, group, groups } => {
            let t = TenantId::parse(tenant)?;
            crate::timers::schedule::fire(deps, &t, notification_id, users.clone(), *group, *groups).await
        }
        TimerTask::DeferredDelivery { tenant, notification_id, user_id, channel } => {
            let t = TenantId::parse(tenant)?;
            crate::notify::orchestrator::resume_deferred(deps, &t, notification_id, user_id, *channel).await
        }
        TimerTask::Tracked { claims, at_ms } => crate::tracking::apply(deps, claims, *at_ms).await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn buckets_are_minutes_that_sort_as_time() {
        let a = DateTime::parse_from_rfc3339("2026-11-29T09:05:59.999Z").unwrap().timestamp_millis();
        let b = DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().timestamp_millis();
        assert_eq!(bucket_of(a), "202611290905");
        assert!(bucket_of(a) < bucket_of(b));
    }

    #[test]
    fn timer_messages_round_trip_with_a_kind() {
        let m = TimerMessage { due_ms: 5, task: TimerTask::OrderExpire { tenant: "t".into(), order_id: "o".into() } };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""kind":"order.expire""#), "{json}");
        assert_eq!(serde_json::from_str::<TimerMessage>(&json).unwrap(), m);
    }
}
