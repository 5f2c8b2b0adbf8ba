//! The single table's key layout, in one place. Every tenant-owned key starts with `T#{tenant}#`,
//! so no query can reach another tenant's items.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | API key (what a request is authenticated by) | `KEY#{sha256(key)}` | `KEY` |
//! | API key index (what operators list and revoke by) | `KEYS` | `{key_id}` |
//! | user | `T#t#U#{user}` | `PROFILE` |
//! | preferences | `T#t#U#{user}` | `PREFS` |
//! | inbox counter | `T#t#U#{user}` | `INBOX#COUNT` |
//! | inbox message | `T#t#INBOX#{user}` | `M#{message_id}` |
//! | template | `T#t#TPL#{id}` | `TPL` |
//! | idempotency record | `T#t#IDEM#{scope}#{key}` | `IDEM` |
//! | notification (the outbox) | `T#t#N#{id}` | `N` |
//! | a notification's cancel (read by the cancel fence before each send) | `T#t#N#{id}` | `CANCELLED` |
//! | delivery | `T#t#N#{id}` | `D#{user}#{channel}` |
//! | progress counters of a notification | `T#t#N#{id}` | `C#{page:08}#{shard}` |
//! | campaign page task (an outbox entry) | `T#t#N#{id}` | `P#{page:08}` |
//! | segment (tag) membership | `T#t#TAG#{tag}` | `{user}` |
//! | frequency counter (with `ttl`) | `T#t#U#{user}` | `CAP#{yyyyMMdd}#{channel}` |
//! | device (push token) | `T#t#U#{user}` | `DEV#{sha256(token)}` |
//! | device token index | `T#t#DEVICE#{sha256(token)}` | `DEVICE` |
//! | suppressed address | `T#t#SUPPRESS#{channel}#{sha256(address)}` | `SUPPRESS` |
//! | provider message → delivery | `PMSG#{provider}#{provider_message_id}` | `PMSG` |
//! | push endpoint → device (SNS events name only the endpoint) | `PUSHEP#{sha256(address)}` | `PUSHEP` |
//! | a registration of a push endpoint (deleted with the last one) | `PUSHEP#{sha256(address)}` | `HOLDER#{tenant}#{user}` |
//! | fake provider send (dev) | `DEV#SENDS` | `{at_ms:015}#{id}` |
//! | a user erased (`crate::people::erasure`) | `T#t#U#{user}` | `ERASED` |
//! | users list entry (`crate::lists`) | `T#t#USERS` | `U#{user}` |
//! | templates list entry | `T#t#TPLS` | `TPL#{id}` |
//! | notifications list entry, by time | `T#t#NLIST` | `{created_ms:015}#{id}` |
//! | attempt at a redelivered queue message (`crate::attempts`, with `ttl`) | `ATTEMPT#{queue}#{message_id}` | `ATTEMPT` |

use crate::ids::TenantId;
use crate::ports::{Channel, Key};

/// The sort key of a notification item (the change stream filter matches on it).
pub const NOTIFICATION_SK: &str = "N";

/// A stable shard of `id` among `shards` (FNV-1a: the same on every instance, every run and
/// every version, so an item's shard never moves).
pub fn stable_shard(id: &str, shards: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % shards.max(1)
}

pub fn api_key(hash_hex: &str) -> Key {
    Key::new(format!("KEY#{hash_hex}"), "KEY")
}

/// The partition of every key's index item: keys are few, and only operators list them.
pub const API_KEY_INDEX_PK: &str = "KEYS";

pub fn api_key_index(key_id: &str) -> Key {
    Key::new(API_KEY_INDEX_PK, key_id)
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

/// The sort-key prefix of inbox messages.
pub const INBOX_MESSAGE_PREFIX: &str = "M#";

pub fn inbox_message(t: &TenantId, user_id: &str, message_id: &str) -> Key {
    Key::new(inbox_pk(t, user_id), format!("{INBOX_MESSAGE_PREFIX}{message_id}"))
}

pub fn template(t: &TenantId, template_id: &str) -> Key {
    Key::new(format!("T#{t}#TPL#{template_id}"), "TPL")
}

/// The origins whose pages may call the tenant's `/v1/me` routes (`site::AllowedOrigins`).
pub fn allowed_origins(t: &TenantId) -> Key {
    Key::new(format!("T#{t}#SETTINGS"), "ORIGINS")
}

/// The hosts a tenant's tracked links may lead to (`tracking::LinkHosts`).
pub fn link_hosts(t: &TenantId) -> Key {
    Key::new(format!("T#{t}#SETTINGS"), "LINKHOSTS")
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

/// The mark a cancel writes with the notification's `cancelled` status, in one transaction: the
/// cancel fence reads this small item before each send instead of the notification record
/// (`crate::notify::fence`).
pub fn cancel_mark(t: &TenantId, id: &str) -> Key {
    Key::new(notification_pk(t, id), "CANCELLED")
}

pub fn delivery(t: &TenantId, notification_id: &str, user_id: &str, channel: Channel) -> Key {
    delivery_at(t, notification_id, user_id, channel, None)
}

/// A delivery of a workflow's send step `step` (`None`: a template send's delivery): a
/// workflow may send on one channel in several steps.
pub fn delivery_at(t: &TenantId, notification_id: &str, user_id: &str, channel: Channel, step: Option<u32>) -> Key {
    match step {
        None => Key::new(notification_pk(t, notification_id), format!("D#{user_id}#{channel}")),
        Some(s) => Key::new(notification_pk(t, notification_id), format!("D#{user_id}#{channel}#{s}")),
    }
}

/// A workflow run: one per (notification, recipient) (`crate::workflows::run`).
pub fn run(t: &TenantId, notification_id: &str, user_id: &str) -> Key {
    Key::new(notification_pk(t, notification_id), format!("{RUN_PREFIX}{user_id}"))
}

/// The sort-key prefix of a notification's runs.
pub const RUN_PREFIX: &str = "R#";

/// The sort-key prefix of a notification's send batches (`crate::notify::batch`).
pub const SEND_BATCH_PREFIX: &str = "B#";

/// The sort-key prefix of one expansion page's send batches.
pub fn send_batch_page_prefix(page: u64) -> String {
    format!("{SEND_BATCH_PREFIX}{page:08}#")
}

/// Send batch `n` of expansion page `page`: up to 25 marketing deliveries recorded in one item.
pub fn send_batch(t: &TenantId, notification_id: &str, page: u64, n: u32) -> Key {
    Key::new(notification_pk(t, notification_id), format!("{}{n:04}", send_batch_page_prefix(page)))
}

/// The planning lease of page `page` of a notification ([`crate::notify::batch::PageLease`]):
/// one run of a page plans it at a time, so that two runs cannot pack a member into two send
/// batches.
pub fn page_lease(t: &TenantId, notification_id: &str, page: u64) -> Key {
    Key::new(notification_pk(t, notification_id), format!("L#{page:08}"))
}

/// The sort-key prefix of a notification's progress counters.
pub const COUNTER_PREFIX: &str = "C#";

/// One progress counter item of a notification: per expansion page and shard, so that no
/// single item takes every status change of a large campaign (a hot key on DynamoDB).
pub fn progress_counter(t: &TenantId, notification_id: &str, page: u64, shard: u32) -> Key {
    Key::new(notification_pk(t, notification_id), format!("{COUNTER_PREFIX}{page:08}#{shard}"))
}

/// The sort-key prefix of a campaign's page tasks (the relay queues each new one).
pub const PAGE_PREFIX: &str = "P#";

/// Hourly verification counts of a template's user-triggered notifications
/// (`crate::notify::verification`), under this partition, sort key `H#YYYYMMDDHH#{shard:02}`:
/// each hour is counted over several shard items, summed when read.
pub fn verification_pk(t: &TenantId, template_id: &str) -> String {
    format!("T#{t}#VSTAT#{template_id}")
}

pub const VERIFICATION_HOUR_PREFIX: &str = "H#";

pub fn verification_hour(t: &TenantId, template_id: &str, hour: &str, shard: u32) -> Key {
    Key::new(verification_pk(t, template_id), format!("{VERIFICATION_HOUR_PREFIX}{hour}#{shard:02}"))
}

/// A campaign's page task: its insert, through the change stream, queues the page.
pub fn campaign_page(t: &TenantId, notification_id: &str, page: u64) -> Key {
    Key::new(notification_pk(t, notification_id), format!("{PAGE_PREFIX}{page:08}"))
}

/// The partition of a tag's members (a segment), sorted by user id.
pub fn tag_pk(t: &TenantId, tag: &str) -> String {
    format!("T#{t}#TAG#{tag}")
}

/// A user's membership of a tag: written in the same transaction as the user.
pub fn tag_member(t: &TenantId, tag: &str, user_id: &str) -> Key {
    Key::new(tag_pk(t, tag), user_id)
}

pub fn frequency_counter(t: &TenantId, user_id: &str, day: &str, channel: Channel) -> Key {
    Key::new(format!("T#{t}#U#{user_id}"), format!("CAP#{day}#{channel}"))
}

/// Device items of a user sort under this prefix.
pub const DEVICE_SK_PREFIX: &str = "DEV#";

pub fn user_pk(t: &TenantId, user_id: &str) -> String {
    format!("T#{t}#U#{user_id}")
}

pub fn device(t: &TenantId, user_id: &str, token_hash: &str) -> Key {
    Key::new(user_pk(t, user_id), format!("{DEVICE_SK_PREFIX}{token_hash}"))
}

pub fn device_token(t: &TenantId, token_hash: &str) -> Key {
    Key::new(format!("T#{t}#DEVICE#{token_hash}"), "DEVICE")
}

pub fn suppression(t: &TenantId, channel: Channel, address_hash: &str) -> Key {
    Key::new(format!("T#{t}#SUPPRESS#{channel}#{address_hash}"), "SUPPRESS")
}

/// Receipts name the provider's message id only; this finds the delivery (and its tenant).
/// Which tenant's device a push address (an SNS endpoint ARN) is: SNS's application events name
/// only the endpoint.
pub fn push_endpoint(address_hash: &str) -> Key {
    Key::new(push_endpoint_pk(address_hash), "PUSHEP")
}

pub fn push_endpoint_pk(address_hash: &str) -> String {
    format!("PUSHEP#{address_hash}")
}

/// One registration of a push address, per (tenant, user): the push service gives one token one
/// endpoint, and it is deleted only when no registration is left (docs/people.md, "Devices").
pub fn push_endpoint_holder(address_hash: &str, t: &TenantId, user_id: &str) -> Key {
    Key::new(push_endpoint_pk(address_hash), format!("{PUSH_HOLDER_SK_PREFIX}{t}#{user_id}"))
}

pub const PUSH_HOLDER_SK_PREFIX: &str = "HOLDER#";

pub fn provider_message(provider: &str, provider_message_id: &str) -> Key {
    Key::new(format!("PMSG#{provider}#{provider_message_id}"), "PMSG")
}

/// An SNS `MessageId` a callback applied (remembered for the event window, to ignore repeats).
pub fn sns_message(message_id: &str) -> Key {
    Key::new(format!("SNSMSG#{message_id}"), "SNSMSG")
}

pub const DEV_SENDS_PK: &str = "DEV#SENDS";

/// The record that a user was erased, kept in the user's partition when the rest goes
/// (`crate::people::erasure`): work queued before the erasure checks it and does not send.
pub fn erasure(t: &TenantId, user_id: &str) -> Key {
    Key::new(user_pk(t, user_id), "ERASED")
}

/// The partition of a tenant's users list (`crate::lists`), one entry per user in user-id order.
pub fn users_list_pk(t: &TenantId) -> String {
    format!("T#{t}#USERS")
}

/// The sort-key prefix of users list entries (never `N`, `P#`, `M#` or `STOCK`: not streamed).
pub const USER_ENTRY_PREFIX: &str = "U#";

pub fn user_entry(t: &TenantId, user_id: &str) -> Key {
    Key::new(users_list_pk(t), format!("{USER_ENTRY_PREFIX}{user_id}"))
}

pub fn templates_list_pk(t: &TenantId) -> String {
    format!("T#{t}#TPLS")
}

pub const TEMPLATE_ENTRY_PREFIX: &str = "TPL#";

pub fn template_entry(t: &TenantId, template_id: &str) -> Key {
    Key::new(templates_list_pk(t), format!("{TEMPLATE_ENTRY_PREFIX}{template_id}"))
}

/// The partition of a tenant's notifications list, sorted by acceptance time.
pub fn notifications_list_pk(t: &TenantId) -> String {
    format!("T#{t}#NLIST")
}

pub fn notification_entry(t: &TenantId, created_ms: i64, notification_id: &str) -> Key {
    Key::new(notifications_list_pk(t), format!("{:015}#{notification_id}", created_ms.max(0)))
}
/// The marker of an attempt at a redelivered message of `queue` ([`crate::attempts::Marker`]):
/// a partition per message, so that a burst of redeliveries writes no hot key.
pub fn attempt(queue: &str, message_id: &str) -> Key {
    Key::new(format!("ATTEMPT#{queue}#{message_id}"), "ATTEMPT")
}

/// `--manual-clock`'s time, kept with the data so that a restart resumes it (dev.rs).
pub const DEV_CLOCK_PK: &str = "DEV#CLOCK";

/// Splits a tenant-owned pk `T#{tenant}#...` into the tenant and the rest.
pub fn tenant_of(pk: &str) -> Option<(TenantId, &str)> {
    let rest = pk.strip_prefix("T#")?;
    let (tenant, rest) = rest.split_once('#')?;
    Some((TenantId::parse(tenant).ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::stable_shard;

    /// Stored items carry their shard in their keys: the hash may never change, or counters and
    /// watch entries written before an upgrade would be looked for in the wrong shard. The
    /// values are FNV-1a (32-bit) as any implementation computes it.
    #[test]
    fn the_shard_of_an_id_never_moves() {
        assert_eq!(stable_shard("u1", 4), 3);
        assert_eq!(stable_shard("01a234dc034a756eab0b7ecce16fe48f", 16), 14);
        assert_eq!(stable_shard("user-42", 8), 3);
        assert_eq!(stable_shard("", 4), 1);
        assert_eq!(stable_shard("anything", 0), 0, "no shards is one shard");
    }
}
