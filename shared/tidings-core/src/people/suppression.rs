//! The suppression list: addresses that must not be sent to again (hard bounces and
//! complaints), per tenant and channel. Checked by the orchestrator as part of "is the channel
//! available" (check 3 of `crate::notify::policy`); written by the receipts of `POST
//! /v1/callbacks/{provider}`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::ports::{Channel, Cond, Update};

/// Why an address is suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuppressionReason {
    HardBounce,
    Complaint,
}

impl SuppressionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressionReason::HardBounce => "hard_bounce",
            SuppressionReason::Complaint => "complaint",
        }
    }
}

/// Addresses are compared case-insensitively and stored only as hashes.
pub fn address_hash(address: &str) -> String {
    hex::encode(Sha256::digest(address.trim().to_lowercase().as_bytes()))
}

pub async fn is_suppressed(deps: &Deps, t: &TenantId, channel: Channel, address: &str) -> CoreResult<bool> {
    Ok(deps.table.get(&key_of(t, channel, address)).await?.is_some())
}

/// The item that puts an address on the list.
pub fn key_of(t: &TenantId, channel: Channel, address: &str) -> crate::ports::Key {
    keys::suppression(t, channel, &address_hash(address))
}

/// Puts an address on the list (idempotent: the first reason and time stay).
pub async fn suppress(
    deps: &Deps,
    t: &TenantId,
    channel: Channel,
    address: &str,
    reason: SuppressionReason,
) -> CoreResult<()> {
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    deps.table
        .update(
            &keys::suppression(t, channel, &address_hash(address)),
            vec![
                Update::SetIfAbsent("reason".into(), reason.as_str().into()),
                Update::SetIfAbsent("at".into(), now.into()),
                Update::set("channel", channel.as_str()),
            ],
            Cond::Always,
        )
        .await?;
    Ok(())
}
