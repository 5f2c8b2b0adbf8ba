//! Erasing a user (`DELETE /v1/users/{id}`): the user's contacts, tag memberships and users
//! list entry, devices (and their push endpoints), preferences, frequency counters, inbox,
//! stock subscriptions and open merge window go. What counts many users stays: a campaign's
//! counters, the stock ledger, the deliveries of notifications (user id, channel, status: no
//! address, no content), the restock notice log, the suppression list (hashed addresses).
//!
//! An erasure record (`keys::erasure`) stays in the user's partition, with when. Work queued
//! before the erasure reads it and does not send: the orchestrator suppresses the user's
//! deliveries with reason [`REASON`] (of a notification accepted before the erasure, or of one
//! accepted after it while the user has not been written again), and the channel worker
//! suppresses a queued task of a notification accepted before the erasure instead of sending
//! it to the address the task carries. Writing the user again (`PUT /v1/users/{id}`) makes
//! them a recipient again for notifications accepted from then on.
//!
//! Idempotent: erasing again finds nothing more to delete and answers the same.

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::notify::model::{ChannelTask, Notification};
use crate::people::users::User;
use crate::ports::table::MAX_TRANSACTION_WRITES;
use crate::ports::{Cond, Key, QueryOpts, StoreError, Update, Write};
use crate::restock;

/// The `reason` of a delivery suppressed because its user was erased.
pub const REASON: &str = "erased";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Erasure {
    erased_ms: i64,
    erased_at: String,
}

async fn erasure_of(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Option<Erasure>> {
    Ok(deps.table.get(&keys::erasure(t, user_id)).await?.map(|i| i.parse()).transpose()?)
}

/// Whether the orchestrator must not deliver `n` to the user: erased after `n` was accepted,
/// or erased and not written since (`user` is the user as read for this notification).
pub async fn stops_planning(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    user_id: &str,
    user: Option<&User>,
) -> CoreResult<bool> {
    Ok(match erasure_of(deps, t, user_id).await? {
        None => false,
        Some(e) => n.created_ms <= e.erased_ms || user.is_none(),
    })
}

/// Whether the channel worker must not send a queued task: its user was erased after its
/// notification was accepted (the task's address is from before). One read when the user was
/// never erased.
pub async fn stops_send(deps: &Deps, t: &TenantId, task: &ChannelTask) -> CoreResult<bool> {
    let Some(e) = erasure_of(deps, t, &task.user_id).await? else { return Ok(false) };
    Ok(match crate::notify::api::load(deps, t, &task.notification_id).await? {
        Some(n) => n.created_ms <= e.erased_ms,
        None => true,
    })
}

/// Whether a signed link (one-click unsubscribe) of `notification_id` must change nothing: its
/// user was erased after that notification was accepted, or was erased and not written since.
/// Such a link would write the erased user's preferences again: data back after the erasure
/// (docs/people.md, "Erasure"). One read when the user was never erased.
pub async fn stops_link(deps: &Deps, t: &TenantId, user_id: &str, notification_id: &str) -> CoreResult<bool> {
    let Some(e) = erasure_of(deps, t, user_id).await? else { return Ok(false) };
    if crate::people::users::get_user(deps, t, user_id).await?.is_none() {
        return Ok(true);
    }
    Ok(match crate::notify::api::load(deps, t, notification_id).await? {
        Some(n) => n.created_ms <= e.erased_ms,
        None => true,
    })
}

/// Deletes every item of the partition under `prefix`, but `keep`, a transaction of up to 100
/// at a time. Returns how many.
async fn delete_all(deps: &Deps, pk: &str, prefix: &str, keep: Option<&Key>) -> CoreResult<usize> {
    let mut deleted = 0;
    loop {
        // From the start each time: what was deleted is gone from the next page.
        let page = deps
            .table
            .query(pk, prefix, QueryOpts { limit: MAX_TRANSACTION_WRITES, cursor: None, descending: false })
            .await?;
        let writes: Vec<Write> = page
            .items
            .iter()
            .filter(|i| Some(&i.key) != keep)
            .map(|i| Write::Delete { key: i.key.clone(), cond: Cond::Always })
            .collect();
        if writes.is_empty() {
            return Ok(deleted);
        }
        deleted += writes.len();
        deps.table.transact(writes).await?;
    }
}

/// Whether the user was erased and not written since: what was theirs (preferences, devices,
/// inbox, stock subscriptions) reads as absent, 404, until `PUT /v1/users/{id}` writes the user
/// again, as the user itself does. One read when the user was never erased.
pub async fn is_erased(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<bool> {
    check_id("user_id", user_id)?;
    if erasure_of(deps, t, user_id).await?.is_none() {
        return Ok(false);
    }
    Ok(deps.table.get(&keys::user(t, user_id)).await?.is_none())
}

/// Erases the user (module documentation).
pub async fn erase(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<()> {
    check_id("user_id", user_id)?;
    // The record first: work that reads it from now on does not send.
    let now = deps.clock.now();
    let marker = keys::erasure(t, user_id);
    let at = now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    deps.table
        .update(
            &marker,
            vec![Update::set("erased_ms", now.timestamp_millis()), Update::set("erased_at", at)],
            Cond::Always,
        )
        .await?;

    // The contacts, with their tag memberships and users list entry.
    if let Some(item) = deps.table.get(&keys::user(t, user_id)).await? {
        let user: User = item.parse()?;
        let mut writes = vec![
            Write::Delete { key: keys::user(t, user_id), cond: Cond::Always },
            Write::Delete { key: keys::user_entry(t, user_id), cond: Cond::Always },
        ];
        writes.extend(
            user.tags.iter().map(|tag| Write::Delete { key: keys::tag_member(t, tag, user_id), cond: Cond::Always }),
        );
        for chunk in writes.chunks(MAX_TRANSACTION_WRITES) {
            deps.table.transact(chunk.to_vec()).await?;
        }
    }
    deps.table.delete(&keys::user_entry(t, user_id), Cond::Always).await?;

    // Devices, through the devices' own path (their token index and push endpoint go too).
    loop {
        let page = deps
            .table
            .query(&keys::user_pk(t, user_id), keys::DEVICE_SK_PREFIX, QueryOpts { limit: 100, ..Default::default() })
            .await?;
        if page.items.is_empty() {
            break;
        }
        for item in &page.items {
            if let Ok(device) = item.parse::<crate::people::devices::Device>() {
                crate::people::devices::unregister(deps, t, &device.token).await?;
            }
            // A device whose token index names another user is this user's no more; gone too.
            deps.table.delete(&item.key, Cond::Always).await?;
        }
    }

    // Preferences, the inbox counter, frequency counters: the rest of the user's partition.
    let rest = delete_all(deps, &keys::user_pk(t, user_id), "", Some(&marker)).await?;
    let inbox = delete_all(deps, &keys::inbox_pk(t, user_id), "", None).await?;

    // Stock subscriptions: the record, the user's copy, a WAITING one's lock and index entry.
    let mut subscriptions = 0;
    loop {
        let page = restock::subscriptions::list_for_user(deps, t, user_id, 100, None).await?;
        if page.items.is_empty() {
            break;
        }
        for sub in &page.items {
            let id = &sub.subscription_id;
            // A WAITING one leaves its SKU's WAITING count in the same transaction, on the
            // condition that it is still WAITING (else it was counted out already: read again).
            let waiting = sub.status == restock::SubscriptionStatus::Waiting;
            let cond = if waiting { Cond::eq("status", sub.status.as_str()) } else { Cond::Always };
            let mut writes = vec![
                Write::Delete { key: restock::keys::subscription(t, id), cond },
                Write::Delete { key: restock::keys::user_subscription(t, user_id, &sub.sort), cond: Cond::Always },
                Write::Delete {
                    key: restock::keys::waiting_entry(t, &sub.sku_id, sub.market.as_deref(), &sub.sort),
                    cond: Cond::Always,
                },
            ];
            if waiting {
                writes.push(restock::analytics::waiting_write(t, &sub.sku_id, user_id, -1));
            }
            match deps.table.transact(writes).await {
                Ok(()) => {}
                Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            }
            let lock = restock::keys::waiting_lock(t, &sub.sku_id, user_id);
            match deps.table.delete(&lock, Cond::eq("subscription_id", id.clone())).await {
                Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            subscriptions += 1;
        }
    }
    // The user's open merge window (the digest's head), so no later notice joins it.
    let head = crate::ports::Key::new(restock::keys::merge_partition(t, user_id), "HEAD");
    deps.table.delete(&head, Cond::Always).await?;
    info!(tenant = %t, rest, inbox, subscriptions, "user erased");
    Ok(())
}
