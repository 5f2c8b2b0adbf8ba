//! The timer task: what a timer does when it fires ([`TimerTask`]), the message that carries it
//! on the [`TIMERS_QUEUE`], and how a feature schedules one ([`schedule`], [`durable_timer`]).
//! Features that set timers import this module only; the step that runs a due task (and so
//! imports those features) is [`super::TimerStep`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::{TenantId, new_id};
use crate::ports::queue::MAX_DELAY;
use crate::ports::{Cond, Item, Key, OutMessage, StoreError, Update, Write, attrs_of};

/// The queue timers are delivered on (the runtime declares it and serves it with
/// [`super::TimerStep`]).
pub const TIMERS_QUEUE: &str = "timers";
/// The partition of the open-bucket index.
pub const OPEN_BUCKETS_PK: &str = "TIMERS#OPEN";
/// A bucket takes timers only while it is at least this many minutes ahead.
pub const WRITE_AHEAD_MINUTES: i64 = 3;
/// A minute, in milliseconds: the width of a timer bucket and of a relay watch partition.
pub const MINUTE_MS: i64 = 60_000;

/// What a timer does when it fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum TimerTask {
    /// Expire an order's hold if it is still PENDING and past `expires_at`.
    #[serde(rename = "order.expire")]
    OrderExpire { tenant: TenantId, order_id: String },
    /// Run the next wave of a restock round (waves paced by stock: docs/restock.md, "Waves").
    #[serde(rename = "restock.wave")]
    RestockWave { tenant: TenantId, sku_id: String, round: i64, wave: u32 },
    /// Close a user's restock merge window and send its message.
    #[serde(rename = "restock.flush")]
    RestockFlush { tenant: TenantId, window_id: String },
    /// Judge a restock message's attempt: sent, retry (1/5/30 min), MANUAL or unreachable.
    #[serde(rename = "restock.check")]
    RestockCheck { tenant: TenantId, window_id: String, attempt: u32 },
    /// Start a scheduled notification (`send_at`): all its users, or with `local_time` the
    /// `users` of one zone (group `group` of `groups`).
    #[serde(rename = "notification.send")]
    ScheduledSend {
        tenant: TenantId,
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
    DeferredDelivery { tenant: TenantId, notification_id: String, user_id: String, channel: crate::ports::Channel },
    /// A workflow run's step is due: a delay's end, a deferred send, a fallback's check
    /// (`check`), or the end of one of its sends (`crate::workflows::run`).
    #[serde(rename = "workflow.resume")]
    WorkflowResume { tenant: TenantId, notification_id: String, user_id: String, node: u32, check: bool },
    /// A digest window's close: the run that leads it goes on with its events.
    #[serde(rename = "workflow.digest")]
    WorkflowDigest { tenant: TenantId, notification_id: String, user_id: String, node: u32, window: String },
    /// A cancelled workflow notification: its runs that wait end now (one page of them, then
    /// the next page's sweep), not when their timers fire (`crate::workflows::run::cancel_page`).
    #[serde(rename = "workflow.cancel")]
    WorkflowCancel {
        tenant: TenantId,
        notification_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<String>,
    },
    /// Tell a page of a SKU's subscribers who asked that a shipment is on its way, expected
    /// then (`crate::restock::incoming`), then the next page's task.
    #[serde(rename = "restock.incoming")]
    RestockIncoming {
        tenant: TenantId,
        sku_id: String,
        reference: String,
        expected_at: String,
        /// The WAITING index being told: a market's, or (absent) that of no market.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        market: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<String>,
    },
    /// Move a SKU's units set aside for backorders into its waiting orders, oldest first
    /// (`crate::inventory::backorders::fill`).
    #[serde(rename = "inventory.fill")]
    BackorderFill { tenant: TenantId, sku_id: String },
    /// An open or a click, queued by the tracking routes before they answer (in Lambda an
    /// environment is frozen once it has answered, so nothing may be left to do after it).
    #[serde(rename = "tracking.event")]
    Tracked { claims: crate::tracking::claims::Claims, at_ms: i64 },
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
pub(super) struct TimerItem {
    pub(super) due_ms: i64,
    pub(super) task: TimerTask,
    /// Epoch seconds for DynamoDB TTL: a timer nobody fired is cleaned up a week late.
    pub(super) ttl: i64,
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

/// The start of the minute `ms` falls in (milliseconds since the epoch, before 1970 too).
pub fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(MINUTE_MS) * MINUTE_MS
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
///
/// An instance remembers the buckets it saw open ([`super::open_buckets::OpenBuckets`]), so the orders of one minute
/// read the index once, not once each.
pub async fn durable_timer(deps: &Deps, due_at: DateTime<Utc>, task: &TimerTask) -> CoreResult<Write> {
    let due_ms = due_at.timestamp_millis();
    let now_ms = deps.clock.now_ms();
    let now_minute = minute_of(now_ms);
    let bucket = bucket_of(due_ms.max(now_minute + WRITE_AHEAD_MINUTES * MINUTE_MS));
    if !deps.open_buckets.holds(&bucket, now_ms) {
        let index = Key::new(OPEN_BUCKETS_PK, bucket.clone());
        if deps.table.get(&index).await?.is_none() {
            deps.table
                .update(&index, vec![Update::SetIfAbsent("bucket".into(), bucket.clone().into())], Cond::Always)
                .await?;
        }
        deps.open_buckets.saw(&bucket, now_ms);
    }
    let item = TimerItem { due_ms, task: task.clone(), ttl: due_ms / 1000 + 7 * 24 * 3600 };
    let key = Key::new(format!("TIMER#{bucket}"), format!("{:015}#{}", due_ms.max(0), new_id()));
    Ok(Write::Put { item: Item::new(key, attrs_of(&item)?), cond: Cond::NotExists })
}

/// Sends the task to the timers queue, delayed until it is due (at most 15 minutes; the handler
/// delays it again if needed).
pub(super) async fn send_message(deps: &Deps, due_ms: i64, task: TimerTask) -> CoreResult<()> {
    let body = serde_json::to_string(&TimerMessage { due_ms, task }).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    deps.queues.send_batch(TIMERS_QUEUE, vec![OutMessage::delayed(body, delay_until(deps, due_ms))]).await?;
    Ok(())
}

/// The queue delay until `due_ms`, in whole seconds (as SQS takes it), rounded up, at most 15
/// minutes.
pub(super) fn delay_until(deps: &Deps, due_ms: i64) -> Duration {
    let ms = (due_ms - deps.clock.now_ms()).max(0);
    let secs = u64::try_from((ms + 999) / 1000).unwrap_or(0);
    Duration::from_secs(secs).min(MAX_DELAY)
}
