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
//!
//! The notice log's key is `(batch_no, user)`, and `batch_no` names the SKU: one notice per
//! `(sku, user, batch_no)` (docs/restock.md, "Rounds").

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

pub fn waiting_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#RWAIT#{sku}")
}

pub fn waiting_entry(t: &TenantId, sku: &str, sort: &str) -> Key {
    Key::new(waiting_pk(t, sku), sort)
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
