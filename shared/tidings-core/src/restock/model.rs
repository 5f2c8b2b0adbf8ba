//! Back-in-stock records: subscriptions, rounds, notices, merged messages, and the stock event.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::ids::TenantId;

/// A subscription's life (docs/restock.md, "Subscriptions"): WAITING → NOTIFIED / CANCELLED /
/// EXPIRED. Rows are never deleted. A NOTIFIED one may still be cancelled (that stops its retries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SubscriptionStatus {
    Waiting,
    Notified,
    Cancelled,
    Expired,
}

impl SubscriptionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "WAITING",
            Self::Notified => "NOTIFIED",
            Self::Cancelled => "CANCELLED",
            Self::Expired => "EXPIRED",
        }
    }
}

/// One subscription (stored twice: by id, and in the user's listing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Subscription {
    pub subscription_id: String,
    pub sku_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spu_id: Option<String>,
    pub user_id: String,
    pub status: SubscriptionStatus,
    pub created_at: String,
    pub created_ms: i64,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notified_at: Option<String>,
    /// The batch that notified it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_no: Option<String>,
    /// Sort key of the user's copy and of the WAITING index entry.
    pub sort: String,
    /// Told the expected date of stock on its way (docs/inventory.md, "Incoming stock").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_incoming: bool,
    /// The market the user buys in: only stock at locations serving it alerts them
    /// (docs/restock.md, "Markets").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Z]{2}$", example = "US")]
    pub market: Option<String>,
}

/// The body of `POST /v1/stock-subscriptions`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionRequest {
    pub user_id: String,
    pub sku_id: String,
    #[serde(default)]
    pub spu_id: Option<String>,
    /// Also tell the user when stock is on its way, and the date it is expected.
    #[serde(default)]
    pub notify_incoming: bool,
    /// The market the user buys in (ISO 3166-1 alpha-2, upper case): stock arriving at a location
    /// that does not serve it alerts nobody in it, and the waves count only the units it can buy.
    /// Absent: every location's stock counts.
    #[serde(default)]
    #[schema(pattern = "^[A-Z]{2}$", example = "US")]
    pub market: Option<String>,
}

impl SubscriptionRequest {
    /// `user_id` waiting for `sku_id`, in any market, not told of stock on its way.
    pub fn new(user_id: impl Into<String>, sku_id: impl Into<String>) -> Self {
        SubscriptionRequest {
            user_id: user_id.into(),
            sku_id: sku_id.into(),
            spu_id: None,
            notify_incoming: false,
            market: None,
        }
    }
}

/// An entry of a SKU's WAITING index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct WaitingEntry {
    pub subscription_id: String,
    pub user_id: String,
    pub created_ms: i64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_incoming: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
}

/// A restock round of one SKU: its waves and how many were notified.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RestockRound {
    pub sku_id: String,
    pub round: i64,
    pub batch_no: String,
    /// The wave running or last run (1-based; 0 before the first).
    #[serde(default)]
    pub wave: u32,
    /// Notices allowed up to the end of the current wave (cumulative).
    #[serde(default)]
    pub target: i64,
    #[serde(default)]
    pub notified: i64,
    #[serde(default)]
    pub wave_started_ms: i64,
    /// The next wave a timer has been scheduled for.
    #[serde(default)]
    pub scheduled_wave: u32,
    #[serde(default)]
    pub next_wave_ms: i64,
}

/// What became of one notice (docs/restock.md, "Retries and manual resend").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NoticeStatus {
    /// Claimed; waiting in the user's merge window.
    Pending,
    /// Handed to the notification path; outcome not known yet.
    Sending,
    Sent,
    /// The last attempt failed on the channel; a retry is scheduled.
    Failed,
    /// Retries are exhausted: an operator may resend.
    Manual,
    /// Permanent failure (no address, closed channel, unsubscribed): never retried.
    Unreachable,
    /// The user cancelled before it went out: never retried or resent.
    Cancelled,
    /// Resent by an operator.
    Resent,
}

impl NoticeStatus {
    /// Every status, in the order of a notice's life.
    pub const ALL: [NoticeStatus; 8] = [
        Self::Pending,
        Self::Sending,
        Self::Sent,
        Self::Failed,
        Self::Manual,
        Self::Unreachable,
        Self::Cancelled,
        Self::Resent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Sending => "SENDING",
            Self::Sent => "SENT",
            Self::Failed => "FAILED",
            Self::Manual => "MANUAL",
            Self::Unreachable => "UNREACHABLE",
            Self::Cancelled => "CANCELLED",
            Self::Resent => "RESENT",
        }
    }
}

/// One row of the notice log: `(sku, user, batch_no)`, claimed once by a conditional put.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Notice {
    pub batch_no: String,
    pub sku_id: String,
    pub user_id: String,
    pub round: i64,
    pub subscription_id: String,
    pub status: NoticeStatus,
    pub window_id: String,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// A SKU in a merged message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageItem {
    pub sku_id: String,
    pub batch_no: String,
    pub subscription_id: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MessageStatus {
    /// The window is collecting SKUs.
    Open,
    Sending,
    Sent,
    Manual,
    Unreachable,
    Cancelled,
    /// Closed with nothing in it.
    Empty,
}

/// One merged message: every SKU restocked for a user within one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestockMessage {
    pub window_id: String,
    pub user_id: String,
    pub start_ms: i64,
    pub closes_ms: i64,
    pub status: MessageStatus,
    /// Sends made (1 = the first; each retry adds one).
    #[serde(default)]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_id: Option<String>,
    #[serde(default)]
    pub items: Vec<MessageItem>,
    pub updated_at: String,
}

/// The upstream stock event: `{"event":"stock.in","skuId":1001,"qty":50,
/// "source":"purchase_order"}`. `skuId` may be a number or a string. On the `stock-events` queue
/// the message also names its `tenant`; through the API the key does. `eventId` (the upstream's
/// id of the event, required for `stock.in`) makes the idempotency key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StockEvent {
    pub event: String,
    #[serde(rename = "skuId", alias = "sku_id", deserialize_with = "id_text")]
    pub sku_id: String,
    #[serde(default)]
    pub qty: i64,
    #[serde(default)]
    pub source: String,
    /// The upstream's id of this event: required for `stock.in` (422 naming `eventId` without it).
    #[serde(rename = "eventId", alias = "event_id", default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

fn id_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(serde::de::Error::custom("skuId must be a string or a number")),
    }
}

/// The internal job on the `stock-events` queue: run (a wave of) a restock round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundJob {
    pub event: String,
    pub tenant: TenantId,
    #[serde(rename = "skuId")]
    pub sku_id: String,
    pub round: i64,
    /// A given wave (timers); absent: start or continue whatever is due (stream, scan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<u32>,
}

/// The built-in template's id; a tenant may replace it with `PUT /v1/templates/restock`.
pub const RESTOCK_TEMPLATE: &str = "restock";

pub const ROUND_EVENT: &str = "restock.round";
pub const STOCK_IN_EVENT: &str = "stock.in";

/// A message of the `stock-events` queue, told apart by its `event`: a round job, or an
/// upstream `stock.in` that names its tenant (through the API the key does, so [`StockEvent`]'s
/// own `tenant` is optional; on the queue it is required and checked as the message parses).
#[derive(Clone, Debug, PartialEq)]
pub enum StockLaneMessage {
    Round(RoundJob),
    StockIn { tenant: TenantId, event: StockEvent },
}

impl<'de> Deserialize<'de> for StockLaneMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = Value::deserialize(d)?;
        match value.get("event").and_then(Value::as_str) {
            Some(ROUND_EVENT) => serde_json::from_value(value).map(Self::Round).map_err(D::Error::custom),
            Some(STOCK_IN_EVENT) => {
                let event: StockEvent = serde_json::from_value(value).map_err(D::Error::custom)?;
                let tenant = event.tenant.clone().ok_or_else(|| D::Error::missing_field("tenant"))?;
                let tenant = TenantId::try_from(tenant).map_err(D::Error::custom)?;
                Ok(Self::StockIn { tenant, event })
            }
            other => Err(D::Error::custom(format!("unknown stock event {other:?}"))),
        }
    }
}

/// Tunables of the feature, read once from the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct RestockConfig {
    /// Notices per batch (`TIDINGS_RESTOCK_BATCH_SIZE`, default 100).
    pub batch_size: usize,
    /// Pause between batches (`TIDINGS_RESTOCK_BATCH_PAUSE_MS`, default 500).
    pub batch_pause: Duration,
    /// Per-user merge window (`TIDINGS_RESTOCK_MERGE_WINDOW_MS`, default 60 s).
    pub merge_window: Duration,
    /// Notices per wave per available unit (`TIDINGS_RESTOCK_WAVE_FACTOR`, default 3; 0: one
    /// wave for everyone).
    pub wave_factor: i64,
    /// Time between waves (`TIDINGS_RESTOCK_WAVE_INTERVAL_MS`, default 10 min).
    pub wave_interval: Duration,
    /// Retry delays after a failed send (`TIDINGS_RESTOCK_RETRY_DELAYS_MS`, default
    /// 60000,300000,1800000); after the last, MANUAL.
    pub retry_delays: Vec<Duration>,
    /// WAITING subscriptions older than this expire in the scan (`TIDINGS_RESTOCK_MAX_AGE_S`,
    /// default 90 days).
    pub max_age: Duration,
}

impl Default for RestockConfig {
    fn default() -> Self {
        Self {
            batch_size: 100,
            batch_pause: Duration::from_millis(500),
            merge_window: Duration::from_secs(60),
            wave_factor: 3,
            wave_interval: Duration::from_secs(600),
            retry_delays: vec![Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(1800)],
            max_age: Duration::from_secs(90 * 24 * 3600),
        }
    }
}
