//! The relay's watch entries: the accept transaction puts one in the minute of the
//! notification's acceptance ([`watch_write`]), sharded so a busy minute is not one hot
//! partition; the relay's safety net ([`super::sweep`]) reads each minute's entries once it is
//! old enough.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | watch entry | `RELAY#WATCH#{yyyyMMddHHmm}#{shard}` | the notification's pk |

use crate::ids::TenantId;
use crate::keys;
use crate::ports::{Cond, Item, Key, Write};

/// Partitions of a minute's watch entries.
pub const WATCH_SHARDS: u32 = 4;
/// Watch entries are kept a week (DynamoDB TTL); a sweep reads them long before.
const KEEP_S: i64 = 7 * 24 * 3600;

fn shard_of(notification_id: &str) -> u32 {
    keys::stable_shard(notification_id, WATCH_SHARDS)
}

pub(crate) fn watch_pk(minute_ms: i64, shard: u32) -> String {
    format!("RELAY#WATCH#{}#{shard}", crate::timers::bucket_of(minute_ms))
}

/// The watch entry of a notification accepted at `created_ms`, for the accept transaction.
pub fn watch_write(t: &TenantId, notification_id: &str, created_ms: i64) -> Write {
    let minute = crate::timers::minute_of(created_ms);
    let key = Key::new(watch_pk(minute, shard_of(notification_id)), keys::notification_pk(t, notification_id));
    let mut attrs = crate::ports::Attrs::new();
    attrs.insert("ttl".into(), (created_ms / 1000 + KEEP_S).into());
    Write::Put { item: Item::new(key, attrs), cond: Cond::Always }
}
