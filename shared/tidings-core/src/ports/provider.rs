//! Channel providers: email (SES), SMS and push (SNS), or the embedded fakes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A delivery channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Email,
    Sms,
    Push,
    Inapp,
}

impl Channel {
    pub const ALL: [Channel; 4] = [Channel::Email, Channel::Sms, Channel::Push, Channel::Inapp];
    /// The channels that go through an external provider and a channel queue.
    pub const EXTERNAL: [Channel; 3] = [Channel::Email, Channel::Sms, Channel::Push];

    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Email => "email",
            Channel::Sms => "sms",
            Channel::Push => "push",
            Channel::Inapp => "inapp",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "email" => Some(Channel::Email),
            "sms" => Some(Channel::Sms),
            "push" => Some(Channel::Push),
            "inapp" => Some(Channel::Inapp),
            _ => None,
        }
    }
}

impl std::fmt::Display for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rendered message for one recipient on one channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutboundMessage {
    pub channel: Channel,
    /// Email address, E.164 phone number, or push endpoint / device token.
    pub to: String,
    /// Email subject or push title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The message; for an email, its text part (no markup).
    pub body: String,
    /// An email's HTML part; `None` on the other channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Extra email headers (`List-Unsubscribe`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    /// The delivery key: passed to providers that accept an idempotency key, and used as the
    /// push collapse id / tag so that a duplicate collapses on the device.
    pub idempotency_key: String,
    /// A marketing message, not a transactional one: SMS providers send it as promotional.
    #[serde(default)]
    pub marketing: bool,
    /// For the fake providers' record (never logged): tenant, notification and user.
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub notification_id: String,
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub attempt: u32,
}

/// A header field's text (an email's subject, a header Tidings adds) as one line: every control
/// character, CR and LF among them, and the Unicode line and paragraph separators become a
/// space. A placeholder's value or a tenant's template that brings a line break would otherwise
/// end the header and start one of its own (`Bcc:`) in whatever builds the raw message
/// (docs/templates.md, "Header fields").
pub fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') { ' ' } else { c }).collect()
}

/// What a provider answered when it accepted a message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProviderReceipt {
    pub provider_message_id: String,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Timeouts, 5xx, 429: try again later, no sooner than `retry_after` when given.
    #[error("transient provider error: {reason}")]
    Transient { reason: String, retry_after: Option<Duration> },
    /// Bad address, invalid token, rejected content: never retried.
    #[error("permanent provider error: {reason}")]
    Permanent { reason: String, code: PermanentCode },
}

/// Why a provider refused a message for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermanentCode {
    BadAddress,
    /// The push token is gone (APNs 410, FCM UNREGISTERED, SNS EndpointDisabled).
    InvalidToken,
    Rejected,
}

impl ProviderError {
    pub fn transient(reason: impl Into<String>) -> Self {
        ProviderError::Transient { reason: reason.into(), retry_after: None }
    }
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Transient { .. })
    }
}

/// A push device's platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// APNs.
    Ios,
    /// FCM.
    Android,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Ios => "ios",
            Platform::Android => "android",
        }
    }
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// A short name for logs and metrics (`ses`, `sns-sms`, `fake-email`).
    fn name(&self) -> &str;
    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError>;

    /// Push only: makes a device token sendable and returns the address to send to (an SNS
    /// platform endpoint ARN on AWS; the token itself where the provider takes tokens).
    async fn register_device(&self, _platform: Platform, token: &str) -> Result<String, ProviderError> {
        Ok(token.to_owned())
    }

    /// Push only: forgets an address made by `register_device` (best effort).
    async fn unregister_device(&self, _address: &str) -> Result<(), ProviderError> {
        Ok(())
    }
}

/// The channel providers, one per external channel.
#[derive(Clone)]
pub struct Providers {
    pub email: Arc<dyn Provider>,
    pub sms: Arc<dyn Provider>,
    pub push: Arc<dyn Provider>,
}

impl Providers {
    pub fn for_channel(&self, channel: Channel) -> Option<&Arc<dyn Provider>> {
        match channel {
            Channel::Email => Some(&self.email),
            Channel::Sms => Some(&self.sms),
            Channel::Push => Some(&self.push),
            Channel::Inapp => None,
        }
    }
}
