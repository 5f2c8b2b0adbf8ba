//! The back-in-stock key layout, in one place (table-wide convention: [`crate::keys`]).
//!
//! | item | pk | sk |
//! |---|---|---|
//! | subscription | `T#t#RSUB#{id}` | `SUB` |
//! | the user's copy (listing) | `T#t#RSUBU#{user}` | `{created_ms:015}#{id}` |
//! | the one-WAITING lock of (sku, user) | `T#t#RLOCK#{sku}#{user}` | `WAITING` |
//! | WAITING index of a SKU, oldest first | `T#t#RWAIT#{sku}` | `{created_ms:015}#{id}` |
//! | SKUs that have had subscribers (the scan walks them) | `T#t#RSKUS` | `{sku}` |
//! | tenants with subscriptions | `RESTOCK#TENANTS` | `{tenant}` |
//! | restock round (waves, counts) | `T#t#RROUND#{sku}` | `{round:012}` |
//! | notice log `(sku, user, batch_no)` | `T#t#RNOTICE#{batch_no}` | `{user}` |
//! | notices index by status (`MANUAL`, `UNREACHABLE`, ...) | `T#t#R{STATUS}` | `{batch_no}#{user}` |
//! | a user's merge window: the workflow engine's digest (`crate::workflows::digest`) | `T#t#DG#~restock#{user}#0#{hash}` | `HEAD`, `E#{window}#{ms}#{batch_no}` |
//! | merged message (one per window) | `T#t#RMSG#{window_id}` | `MSG` |
//! | before the merge was a digest: a user's open window, one SKU in it | `T#t#RWIN#{user}`, `T#t#RMSG#{window_id}` | `OPEN`, `E#{batch_no}` |
//! | what alerts earn: WAITING count of a SKU, in shards by user | `T#t#RSTAT#{sku}` | `W#{shard}` |
//! | what alerts earn: notices and clicks of a SKU on a UTC day | `T#t#RSTAT#{sku}` | `D#{yyyy-mm-dd}` |
//! | an order attributed to an alert about the SKU | `T#t#RATTR#{sku}` | `{order_created_ms:015}#{order_id}` |
//! | a click on an alert counted for a SKU (once per message, user, SKU) | `T#t#RCLICK#{notification_id}` | `{sku}#{user hash}` |
//!
//! The notice log's key is `(batch_no, user)`, and `batch_no` names the SKU: one notice per
//! `(sku, user, batch_no)` (docs/restock.md, "Rounds").

use sha2::{Digest, Sha256};

use crate::ids::TenantId;
use crate::ports::Key;

pub const TENANTS_PK: &str = "RESTOCK#TENANTS";
pub const MESSAGE_SK: &str = "MSG";
pub const ENTRY_PREFIX: &str = "E#";

pub fn subscription(t: &TenantId, id: &str) -> Key {
    Key::new(format!("T#{t}#RSUB#{id}"), "SUB")
}

pub fn user_subscriptions_pk(t: &TenantId, user: &str) -> String {
    format!("T#{t}#RSUBU#{user}")
}

pub fn user_subscription(t: &TenantId, user: &str, user_sk: &str) -> Key {
    Key::new(user_subscriptions_pk(t, user), user_sk)
}

pub fn waiting_lock(t: &TenantId, sku: &str, user: &str) -> Key {
    Key::new(format!("T#{t}#RLOCK#{sku}#{user}"), "WAITING")
}

/// The WAITING index of a SKU's subscriptions for `market` (`None`: those that named none),
/// oldest first (docs/restock.md, "Markets"). A SKU id never holds `#`, so the two never meet.
pub fn waiting_pk(t: &TenantId, sku: &str, market: Option<&str>) -> String {
    match market {
        None => format!("T#{t}#RWAIT#{sku}"),
        Some(m) => format!("T#{t}#RWAIT#{sku}#M#{m}"),
    }
}

pub fn waiting_entry(t: &TenantId, sku: &str, market: Option<&str>, sort: &str) -> Key {
    Key::new(waiting_pk(t, sku, market), sort)
}

/// The markets a SKU's subscriptions ever named, one item each (written once, never removed):
/// the WAITING indexes a round walks besides the one of no market.
pub fn waiting_markets_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#RMKTS#{sku}")
}

pub fn waiting_market(t: &TenantId, sku: &str, market: &str) -> Key {
    Key::new(waiting_markets_pk(t, sku), market)
}

pub fn watched_pk(t: &TenantId) -> String {
    format!("T#{t}#RSKUS")
}

pub fn watched_sku(t: &TenantId, sku: &str) -> Key {
    Key::new(watched_pk(t), sku)
}

pub fn tenant_entry(t: &TenantId) -> Key {
    Key::new(TENANTS_PK, t.as_str())
}

pub fn round(t: &TenantId, sku: &str, round: i64) -> Key {
    Key::new(format!("T#{t}#RROUND#{sku}"), format!("{:012}", round.max(0)))
}

pub fn notice_pk(t: &TenantId, batch_no: &str) -> String {
    format!("T#{t}#RNOTICE#{batch_no}")
}

pub fn notice(t: &TenantId, batch_no: &str, user: &str) -> Key {
    Key::new(notice_pk(t, batch_no), user)
}

/// The index of the notices in `status` (`T#t#RMANUAL` for MANUAL, as it always was).
pub fn status_pk(t: &TenantId, status: &str) -> String {
    format!("T#{t}#R{status}")
}

pub fn status_entry(t: &TenantId, status: &str, batch_no: &str, user: &str) -> Key {
    Key::new(status_pk(t, status), format!("{batch_no}#{user}"))
}

/// The digest partition of a user's merge window. No workflow id can be `~restock` (`~` is not
/// an id character), so no tenant's workflow shares it.
pub fn merge_partition(t: &TenantId, user: &str) -> String {
    crate::workflows::digest::partition(t, "~restock", user, 0, "")
}

/// The open window of a window opened before the merge was a digest (its id `{ms}-{user}`):
/// only its flush still reads it.
pub fn open_window(t: &TenantId, user: &str) -> Key {
    Key::new(format!("T#{t}#RWIN#{user}"), "OPEN")
}

pub fn message_pk(t: &TenantId, window_id: &str) -> String {
    format!("T#{t}#RMSG#{window_id}")
}

pub fn message(t: &TenantId, window_id: &str) -> Key {
    Key::new(message_pk(t, window_id), MESSAGE_SK)
}

/// Shards of a SKU's WAITING counter: a subscription's shard comes from its user, so its +1 and
/// its -1 land on the same item, and concurrent subscribers of one SKU rarely share one.
pub const WAITING_SHARDS: u64 = 8;
pub const WAITING_SHARD_PREFIX: &str = "W#";
pub const DAY_PREFIX: &str = "D#";

pub fn stats_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#RSTAT#{sku}")
}

pub fn waiting_shard(t: &TenantId, sku: &str, user: &str) -> Key {
    let h = Sha256::digest(user.as_bytes());
    let n = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]) % WAITING_SHARDS;
    Key::new(stats_pk(t, sku), format!("{WAITING_SHARD_PREFIX}{n}"))
}

/// The day bucket of `ms` (UTC).
pub fn day_bucket(t: &TenantId, sku: &str, ms: i64) -> Key {
    Key::new(stats_pk(t, sku), day_sk(ms))
}

pub fn day_sk(ms: i64) -> String {
    let day = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms).unwrap_or_default();
    format!("{DAY_PREFIX}{}", day.format("%Y-%m-%d"))
}

pub fn attribution_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#RATTR#{sku}")
}

pub fn attribution_sort(order_created_ms: i64) -> String {
    format!("{:015}", order_created_ms.max(0))
}

pub fn attribution(t: &TenantId, sku: &str, order_created_ms: i64, order_id: &str) -> Key {
    Key::new(attribution_pk(t, sku), format!("{}#{order_id}", attribution_sort(order_created_ms)))
}

/// The user's id is hashed: the marker only has to be unique, and erasing a user then has
/// nothing of theirs to find here.
pub fn click_marker(t: &TenantId, notification_id: &str, sku: &str, user: &str) -> Key {
    let h = Sha256::digest(user.as_bytes());
    Key::new(format!("T#{t}#RCLICK#{notification_id}"), format!("{sku}#{}", hex::encode(&h[..16])))
}
