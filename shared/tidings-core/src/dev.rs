//! Local development: providers that record what they accepted and can be told to fail
//! (`PUT /dev/providers/{channel}`), on either backend. Never wired into Lambda.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{CoreError, CoreResult};
use crate::ids::new_id;
use crate::keys::{DEV_CLOCK_PK, DEV_SENDS_PK};
use crate::ports::{
    Channel, Clock, Cond, Item, Key, OutboundMessage, PermanentCode, Platform, Provider, ProviderError,
    ProviderReceipt, QueryOpts, SystemClock, Table, attrs_of,
};

/// How a dev provider behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    #[default]
    Ok,
    #[serde(rename = "fail_5xx")]
    Fail5xx,
    #[serde(rename = "throttle_429")]
    Throttle429,
    Timeout,
    Permanent,
}

/// The body of `PUT /dev/providers/{channel}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    pub mode: FaultMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// Fail only the next n sends, then behave as `ok`. Absent: fail every send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_first_n: Option<u32>,
    /// A slow provider: every send waits this long before it is answered (in any mode), at
    /// most 60 000 ms. The provider timeout still applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 60000, example = 1500)]
    pub delay_ms: Option<u64>,
}

/// The longest [`FaultConfig::delay_ms`].
pub const MAX_DELAY_MS: u64 = 60_000;

/// One accepted send, as `GET /dev/deliveries` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecordedSend {
    pub channel: Channel,
    pub tenant: String,
    pub user_id: String,
    pub to: String,
    #[serde(default)]
    pub subject: Option<String>,
    /// The message; for an email, its text part.
    pub body: String,
    /// An email's HTML part (absent on the other channels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    pub notification_id: String,
    pub attempt: u32,
    pub at: String,
    #[serde(default)]
    pub provider_message_id: String,
    /// (name, value) pairs, each a two-string array (no tuple schema: client generators refuse it).
    #[serde(default)]
    #[schema(value_type = Vec<Vec<String>>)]
    pub headers: Vec<(String, String)>,
    /// Push: the APNs collapse id / FCM tag (`devices::collapse_id` of the delivery key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_id: Option<String>,
    /// The provider that took it (`sns-sms`, `end-user-messaging`, `null`, `fake-secondary`):
    /// which side of an SMS failover sent it.
    #[serde(default)]
    pub provider: String,
}

/// How long a recorded send is kept: the table's TTL removes it on AWS (emulators included),
/// and [`list_sends`] neither lists nor keeps one past it on any backend. Wall-clock time, even
/// under a manual clock: it is about storage, not about the system's time.
pub const RECORD_TTL_S: i64 = 3 * 86_400;

/// Push tokens starting with this are registered, and then answered as gone (APNs 410, FCM
/// `UNREGISTERED`) on every send: how tests and demos show a dead token being removed.
pub const INVALID_TOKEN_PREFIX: &str = "invalid-";

/// A provider that accepts everything (the embedded backend's stand-in for SES and SNS).
#[derive(Debug, Default)]
pub struct NullProvider;

#[async_trait]
impl Provider for NullProvider {
    fn name(&self) -> &str {
        "null"
    }
    async fn send(&self, _message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        Ok(ProviderReceipt { provider_message_id: new_id() })
    }
}

/// The embedded backend's second SMS provider (`TIDINGS_SMS_SECONDARY=fake`): accepts
/// everything, under a name of its own, so the record of sends shows which side of a failover
/// took each message.
#[derive(Debug, Default)]
pub struct FakeSecondarySms;

#[async_trait]
impl Provider for FakeSecondarySms {
    fn name(&self) -> &str {
        "fake-secondary"
    }
    async fn send(&self, _message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        Ok(ProviderReceipt { provider_message_id: new_id() })
    }
}

struct FaultState {
    config: FaultConfig,
    failed: u32,
}

/// Wraps a provider: injects the configured fault, and records every accepted send durably in
/// the table (so the record survives a restart like everything else).
pub struct DevProvider {
    channel: Channel,
    inner: Arc<dyn Provider>,
    table: Arc<dyn Table>,
    clock: Arc<dyn Clock>,
    state: Mutex<FaultState>,
}

impl DevProvider {
    pub fn new(channel: Channel, inner: Arc<dyn Provider>, table: Arc<dyn Table>, clock: Arc<dyn Clock>) -> Self {
        Self {
            channel,
            inner,
            table,
            clock,
            state: Mutex::new(FaultState { config: FaultConfig::default(), failed: 0 }),
        }
    }

    pub fn configure(&self, config: FaultConfig) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.config = config;
        s.failed = 0;
    }

    pub fn config(&self) -> FaultConfig {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).config.clone()
    }

    /// How long a send waits before it is answered.
    fn delay(&self) -> Option<Duration> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.config.delay_ms.filter(|&ms| ms > 0).map(|ms| Duration::from_millis(ms.min(MAX_DELAY_MS)))
    }

    /// The fault to inject for this send, if any.
    fn next_fault(&self) -> Option<(FaultMode, Option<u64>)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.config.mode == FaultMode::Ok {
            return None;
        }
        if let Some(n) = s.config.fail_first_n
            && s.failed >= n
        {
            return None;
        }
        s.failed += 1;
        Some((s.config.mode, s.config.retry_after_s))
    }
}

#[async_trait]
impl Provider for DevProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn register_device(&self, platform: Platform, token: &str) -> Result<String, ProviderError> {
        if token.starts_with(INVALID_TOKEN_PREFIX) {
            return Ok(token.to_owned());
        }
        self.inner.register_device(platform, token).await
    }

    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        if address.starts_with(INVALID_TOKEN_PREFIX) {
            return Ok(());
        }
        self.inner.unregister_device(address).await
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        if self.channel == Channel::Push && message.to.starts_with(INVALID_TOKEN_PREFIX) {
            return Err(ProviderError::Permanent {
                reason: "the push service answered 410 Unregistered".into(),
                code: PermanentCode::InvalidToken,
            });
        }
        if let Some(delay) = self.delay() {
            tokio::time::sleep(delay).await;
        }
        if let Some((mode, retry_after_s)) = self.next_fault() {
            return Err(match mode {
                FaultMode::Ok => return Err(ProviderError::transient("unreachable")),
                FaultMode::Fail5xx => ProviderError::transient("provider answered 503"),
                FaultMode::Throttle429 => ProviderError::Transient {
                    reason: "provider answered 429".into(),
                    retry_after: retry_after_s.map(Duration::from_secs),
                },
                FaultMode::Timeout => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    ProviderError::transient("timeout")
                }
                FaultMode::Permanent => ProviderError::Permanent {
                    reason: "provider rejected the address".into(),
                    code: PermanentCode::BadAddress,
                },
            });
        }
        // The provider's clock: when the call reached it (its answer may come much later).
        let now = self.clock.now();
        let receipt = self.inner.send(message).await?;
        let record = RecordedSend {
            channel: self.channel,
            tenant: message.tenant.clone(),
            user_id: message.user_id.clone(),
            to: message.to.clone(),
            subject: message.subject.clone(),
            body: message.body.clone(),
            html: message.html.clone(),
            notification_id: message.notification_id.clone(),
            attempt: message.attempt,
            at: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            provider_message_id: receipt.provider_message_id.clone(),
            headers: message.headers.clone(),
            collapse_id: (self.channel == Channel::Push)
                .then(|| crate::people::devices::collapse_id(&message.idempotency_key)),
            provider: self.inner.name().to_owned(),
        };
        // Ordered by a sequence that survives restarts and clock jumps: wall time + id.
        let sk = format!("{:015}#{}", now.timestamp_millis().max(0), new_id());
        let mut attrs = attrs_of(&record).map_err(|e| ProviderError::transient(format!("recording failed: {e}")))?;
        attrs.insert("ttl".into(), (SystemClock.now().timestamp() + RECORD_TTL_S).into());
        self.table
            .put(Item::new(Key::new(DEV_SENDS_PK, sk), attrs), Cond::Always)
            .await
            .map_err(|e| ProviderError::transient(format!("recording failed: {e}")))?;
        Ok(receipt)
    }
}

/// The dev providers of the three external channels.
#[derive(Clone)]
pub struct DevProviders {
    pub email: Arc<DevProvider>,
    pub sms: Arc<DevProvider>,
    pub push: Arc<DevProvider>,
}

impl DevProviders {
    pub fn get(&self, channel: Channel) -> Option<&Arc<DevProvider>> {
        match channel {
            Channel::Email => Some(&self.email),
            Channel::Sms => Some(&self.sms),
            Channel::Push => Some(&self.push),
            Channel::Inapp => None,
        }
    }
}

const DEV_CLOCK_SK: &str = "manual";

/// The time `--manual-clock` last stood at on this data, if it ever ran on it. A restart resumes
/// from it: started from the wall clock instead, everything scheduled or held against the
/// advanced time would be in the future again and never come due.
pub async fn stored_manual_clock(table: &dyn Table) -> CoreResult<Option<chrono::DateTime<chrono::Utc>>> {
    let item = table.get(&Key::new(DEV_CLOCK_PK, DEV_CLOCK_SK)).await?;
    Ok(item.and_then(|i| i.i64("now_ms")).and_then(chrono::DateTime::from_timestamp_millis))
}

/// Keeps the manual clock's time with the data, before the move is answered. Never backwards:
/// of two moves written out of order the later time stays.
pub async fn store_manual_clock(table: &dyn Table, now: chrono::DateTime<chrono::Utc>) -> CoreResult<()> {
    let ms = now.timestamp_millis();
    let key = Key::new(DEV_CLOCK_PK, DEV_CLOCK_SK);
    let not_later = Cond::Or(vec![
        Cond::AttrNotExists("now_ms".into()),
        Cond::Cmp("now_ms".into(), crate::ports::CmpOp::Lt, ms.into()),
    ]);
    match table.update(&key, vec![crate::ports::Update::set("now_ms", ms)], not_later).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_condition_failed() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Accepted sends, oldest first, optionally for one user and/or channel. Records past their
/// `ttl` are left out and deleted (the embedded store has no TTL of its own; DynamoDB's removes
/// expired items only within a day or two).
pub async fn list_sends(
    table: &dyn Table,
    user_id: Option<&str>,
    channel: Option<Channel>,
) -> CoreResult<Vec<RecordedSend>> {
    let now = SystemClock.now().timestamp();
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = table.query(DEV_SENDS_PK, "", QueryOpts { limit: 1000, cursor, descending: false }).await?;
        for item in &page.items {
            if item.i64("ttl").is_some_and(|ttl| ttl <= now) {
                table.delete(&item.key, Cond::Always).await?;
                continue;
            }
            let s: RecordedSend = item.parse().map_err(CoreError::from)?;
            if user_id.is_some_and(|u| u != s.user_id) || channel.is_some_and(|c| c != s.channel) {
                continue;
            }
            out.push(s);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}
