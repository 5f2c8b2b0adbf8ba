//! The single table's key layout, in one place. Every tenant-owned key starts with `T#{tenant}#`,
//! so no query can reach another tenant's items.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | API key | `KEY#{sha256(key)}` | `KEY` |
//! | user | `T#t#U#{user}` | `PROFILE` |
//! | preferences | `T#t#U#{user}` | `PREFS` |
//! | inbox counter | `T#t#U#{user}` | `INBOX#COUNT` |
//! | inbox message | `T#t#INBOX#{user}` | `M#{message_id}` |
//! | template | `T#t#TPL#{id}` | `TPL` |
//! | idempotency record | `T#t#IDEM#{scope}#{key}` | `IDEM` |
//! | notification (the outbox) | `T#t#N#{id}` | `N` |
//! | delivery | `T#t#N#{id}` | `D#{user}#{channel}` |
//! | fake provider send (dev) | `DEV#SENDS` | `{at_ms:015}#{id}` |

use crate::ids::TenantId;
use crate::ports::{Channel, Key};

/// The sort key of a notification item (the change stream filter matches on it).
pub const NOTIFICATION_SK: &str = "N";

pub fn api_key(hash_hex: &str) -> Key {
    Key::new(format!("KEY#{hash_hex}"), "KEY")
}

pub fn user(t: &TenantId, user_id: &str) -> Key {
    Key::new(format!("T#{t}#U#{user_id}"), "PROFILE")
}

pub fn preferences(t: &TenantId, user_id: &str) -> Key {
    Key::new(format!("T#{t}#U#{user_id}"), "PREFS")
}

pub fn inbox_counter(t: &TenantId, user_id: &str) -> Key {
    Key::new(format!("T#{t}#U#{user_id}"), "INBOX#COUNT")
}

pub fn inbox_pk(t: &TenantId, user_id: &str) -> String {
    format!("T#{t}#INBOX#{user_id}")
}

pub fn inbox_message(t: &TenantId, user_id: &str, message_id: &str) -> Key {
    Key::new(inbox_pk(t, user_id), format!("M#{message_id}"))
}

pub fn template(t: &TenantId, template_id: &str) -> Key {
    Key::new(format!("T#{t}#TPL#{template_id}"), "TPL")
}

pub fn idempotency(t: &TenantId, scope: &str, key: &str) -> Key {
    Key::new(format!("T#{t}#IDEM#{scope}#{key}"), "IDEM")
}

pub fn notification_pk(t: &TenantId, id: &str) -> String {
    format!("T#{t}#N#{id}")
}

pub fn notification(t: &TenantId, id: &str) -> Key {
    Key::new(notification_pk(t, id), NOTIFICATION_SK)
}

pub fn delivery(t: &TenantId, notification_id: &str, user_id: &str, channel: Channel) -> Key {
    Key::new(notification_pk(t, notification_id), format!("D#{user_id}#{channel}"))
}

pub const DEV_SENDS_PK: &str = "DEV#SENDS";

/// Splits a tenant-owned pk `T#{tenant}#...` into the tenant and the rest.
pub fn tenant_of(pk: &str) -> Option<(TenantId, &str)> {
    let rest = pk.strip_prefix("T#")?;
    let (tenant, rest) = rest.split_once('#')?;
    Some((TenantId::parse(tenant).ok()?, rest))
}
