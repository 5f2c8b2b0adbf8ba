//! What a tracking or unsubscribe token says. Its own module: the timers' task carries the
//! claims of an open or a click ([`crate::timers::task::TimerTask::Tracked`]), and the rest of
//! tracking sets that timer. The tenant is checked as the claims deserialize: a token naming an
//! invalid one is malformed.

use serde::{Deserialize, Serialize};

use crate::ids::TenantId;
use crate::ports::Channel;

/// What a token is for (its purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenKind {
    #[serde(rename = "o")]
    Open,
    #[serde(rename = "c")]
    Click,
    #[serde(rename = "u")]
    Unsubscribe,
    /// The hosted preferences page (`GET|POST /p/{token}`; docs/site.md).
    #[serde(rename = "p")]
    Preferences,
}

impl TokenKind {
    pub fn purpose(self) -> &'static str {
        match self {
            TokenKind::Open => "track.open",
            TokenKind::Click => "track.click",
            TokenKind::Unsubscribe => "unsubscribe",
            TokenKind::Preferences => "preferences",
        }
    }
}

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub k: TokenKind,
    /// Tenant, notification, user, channel.
    pub t: TenantId,
    pub n: String,
    pub u: String,
    pub c: Channel,
    /// The click's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A workflow's send step (its delivery's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<u32>,
}
