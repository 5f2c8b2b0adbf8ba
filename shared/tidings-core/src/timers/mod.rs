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
//! - The step [`TimerStep`] sends a message that is still early back with a new delay (SQS
//!   delays stop at 15 minutes), then runs the task.
//!
//! The task and its scheduling are in [`task`], which the features that set timers import; this
//! module holds what fires them and the step that runs them (and so imports those features).
//!
//! A bucket only takes timers while it is at least [`WRITE_AHEAD_MINUTES`] in the future, and
//! ticks fire it from 1 minute before, so no timer lands in a bucket that was already fired
//! (as long as clocks agree within 2 minutes). Everything is at least once: a timer can fire
//! twice (a tick that dies between sending and deleting), so every task is idempotent (expiry
//! is conditioned on the order being PENDING and past due).

pub mod open_buckets;
pub mod schedule;
pub mod task;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::new_id;
use crate::inventory::{self, Settlement};
use crate::outcome::Outcome;
use crate::ports::{Cond, Key, OutMessage, QueryOpts, StoreError, Update};
use crate::tasks::{Step, Task};
pub use task::{
    MINUTE_MS, OPEN_BUCKETS_PK, TIMERS_QUEUE, TimerMessage, TimerTask, WRITE_AHEAD_MINUTES, bucket_of, durable_timer,
    fits_queue_delay, minute_of, schedule,
};
use task::{TimerItem, delay_until, send_message};

/// How long a tick holds a bucket while it fires it.
pub const BUCKET_LEASE: Duration = Duration::from_secs(120);
/// A message this early (or less) counts as due.
const EARLY_SLACK_MS: i64 = 1_000;

/// What a tick did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TickReport {
    pub buckets_fired: u64,
    pub timers_sent: u64,
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
    deps.open_buckets.forget(bucket);
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

/// The timers lane's step: a message still early goes back with the rest of its delay, a due
/// one runs its task.
pub struct TimerStep;

impl Step for TimerStep {
    type Body = TimerMessage;
    const WHAT: &'static str = "timer message";
    async fn run(deps: &Deps, task: &Task<TimerMessage>) -> CoreResult<Outcome> {
        let timer = &task.body;
        if timer.due_ms > deps.clock.now_ms() + EARLY_SLACK_MS {
            send_message(deps, timer.due_ms, timer.task.clone()).await?;
        } else {
            run(deps, &timer.task).await?;
        }
        Ok(Outcome::Done)
    }
}

/// Runs a due task.
async fn run(deps: &Deps, task: &TimerTask) -> CoreResult<()> {
    match task {
        TimerTask::OrderExpire { tenant, order_id } => {
            match inventory::expire_order(deps, tenant, order_id).await? {
                // Early (a clock ahead of ours, or a re-delay that fell short): again later.
                Settlement::NotDue { expires_ms } => {
                    let due = DateTime::<Utc>::from_timestamp_millis(expires_ms).unwrap_or_default();
                    task::schedule(deps, due, task.clone()).await
                }
                Settlement::Settled(_) => {
                    info!(%tenant, order_id, "hold expired and released");
                    Ok(())
                }
                Settlement::Already(_) | Settlement::NotPending(_) => Ok(()),
            }
        }
        TimerTask::BackorderFill { tenant, sku_id } => inventory::fill(deps, tenant, sku_id).await.map(|_| ()),
        TimerTask::RestockWave { tenant, sku_id, round, wave } => {
            crate::restock::run_round(deps, tenant, sku_id, *round, Some(*wave)).await.map(|_| ())
        }
        TimerTask::RestockFlush { tenant, window_id } => crate::restock::merge::flush(deps, tenant, window_id).await,
        TimerTask::RestockCheck { tenant, window_id, attempt } => {
            crate::restock::merge::check(deps, tenant, window_id, *attempt).await
        }
        TimerTask::ScheduledSend { tenant, notification_id, users, group, groups } => {
            schedule::fire(deps, tenant, notification_id, users.clone(), *group, *groups).await
        }
        TimerTask::DeferredDelivery { tenant, notification_id, user_id, channel } => {
            crate::notify::orchestrator::resume_deferred(deps, tenant, notification_id, user_id, *channel).await
        }
        TimerTask::WorkflowResume { tenant, notification_id, user_id, node, check } => {
            let wake = crate::workflows::run::Wake::Resume { node: *node, check: *check };
            crate::workflows::run::wake(deps, tenant, notification_id, user_id, wake).await
        }
        TimerTask::WorkflowDigest { tenant, notification_id, user_id, node, window } => {
            let wake = crate::workflows::run::Wake::Digest { node: *node, window: window.clone() };
            crate::workflows::run::wake(deps, tenant, notification_id, user_id, wake).await
        }
        TimerTask::WorkflowCancel { tenant, notification_id, cursor } => {
            crate::workflows::run::cancel_page(deps, tenant, notification_id, cursor.clone()).await
        }
        TimerTask::RestockIncoming { tenant, sku_id, reference, expected_at, market, cursor } => {
            let page = crate::restock::incoming::Page { market: market.clone(), cursor: cursor.clone() };
            crate::restock::incoming::tell_page(deps, tenant, sku_id, reference, expected_at, page).await
        }
        TimerTask::Tracked { claims, at_ms } => crate::tracking::apply(deps, claims, *at_ms).await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_time_falls_in_the_minute_that_starts_at_or_before_it() {
        assert_eq!(minute_of(0), 0);
        assert_eq!(minute_of(59_999), 0);
        assert_eq!(minute_of(60_000), 60_000);
        assert_eq!(minute_of(1_764_999_123_456), 1_764_999_120_000);
        assert_eq!(minute_of(-1), -60_000, "before 1970, still the minute's start");
    }

    #[test]
    fn buckets_are_minutes_that_sort_as_time() {
        let a = DateTime::parse_from_rfc3339("2026-11-29T09:05:59.999Z").unwrap().timestamp_millis();
        let b = DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().timestamp_millis();
        assert_eq!(bucket_of(a), "202611290905");
        assert!(bucket_of(a) < bucket_of(b));
    }

    #[test]
    fn timer_messages_round_trip_with_a_kind() {
        let m = TimerMessage {
            due_ms: 5,
            task: TimerTask::OrderExpire { tenant: "t".to_owned().try_into().unwrap(), order_id: "o".into() },
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""kind":"order.expire""#), "{json}");
        assert_eq!(serde_json::from_str::<TimerMessage>(&json).unwrap(), m);
    }
}
