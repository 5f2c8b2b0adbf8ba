//! The channel worker: sends one rendered task through its provider.
//!
//! Transactional: two phases on the delivery key (seed 004 §5.2). Claim `sending` with a short
//! lease, call the provider, then `sent`. A crash before the call lets the lease run out and the
//! send happen later (nothing lost); a crash after the provider accepted but before `sent` is
//! written causes at most one duplicate. Marketing: one write before sending (at most once): a
//! crash after the claim loses that send rather than risk a second one.

use std::time::Duration;

use tracing::{info, instrument, warn};

use super::model::{Category, ChannelTask, Delivery, DeliveryStatus, NotificationStatus};
use super::progress;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::{TenantId, mask_address};
use crate::keys;
use crate::messages::Outcome;
use crate::ports::{Cond, OutboundMessage, ProviderError, Received, StoreError, Update};
use crate::retry::backoff;

/// Handles one channel task message.
pub async fn handle_channel_message(deps: &Deps, message: &Received) -> Outcome {
    let task: ChannelTask = match serde_json::from_str(&message.body) {
        Ok(t) => t,
        Err(e) => return Outcome::Reject(format!("malformed channel task: {e}")),
    };
    let Ok(tenant) = TenantId::parse(&task.tenant) else {
        return Outcome::Reject("channel task with an invalid tenant".into());
    };
    match deliver(deps, &tenant, &task, message.receive_count).await {
        Ok(outcome) => outcome,
        Err(e) => {
            warn!(error = %e, "delivery bookkeeping failed; will retry");
            Outcome::Retry(backoff(message.receive_count, deps.config.retry_base, deps.config.retry_cap, None))
        }
    }
}

fn now_str(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[instrument(skip(deps, t, task), fields(tenant = %t, notification_id = %task.notification_id, channel = %task.channel))]
async fn deliver(deps: &Deps, t: &TenantId, task: &ChannelTask, receive_count: u32) -> CoreResult<Outcome> {
    let key = keys::delivery(t, &task.notification_id, &task.user_id, task.channel);
    let now_ms = deps.clock.now_ms();

    if super::campaign::status(deps, t, &task.notification_id).await? == Some(NotificationStatus::Cancelled) {
        if let Some(item) = deps.table.get(&key).await? {
            let d: Delivery = item.parse()?;
            if matches!(d.status, DeliveryStatus::Pending | DeliveryStatus::Dead) {
                let updates = vec![Update::set("reason", "cancelled"), Update::set("updated_at", now_str(deps))];
                move_delivery(
                    deps,
                    t,
                    task,
                    &key,
                    Some(page_of(&item).unwrap_or(0)),
                    d.status,
                    DeliveryStatus::Suppressed,
                    updates,
                )
                .await?;
            }
        }
        return Ok(Outcome::Done);
    }

    // Phase one: claim the delivery.
    let lease = deps.config.delivery_lease;
    let transactional = task.category == Category::Transactional;
    let claimable = Cond::And(vec![Cond::Exists, Cond::eq("status", "pending")]);
    let cond = if transactional {
        Cond::Or(vec![claimable, Cond::And(vec![Cond::eq("status", "sending"), Cond::lt("lease_until_ms", now_ms)])])
    } else {
        claimable
    };
    let mut updates =
        vec![Update::set("status", "sending"), Update::add("attempts", 1), Update::set("updated_at", now_str(deps))];
    if transactional {
        updates.push(Update::set("lease_until_ms", now_ms + lease.as_millis() as i64));
    }
    let claimed_item = match deps.table.update(&key, updates.clone(), cond).await {
        Ok(item) => item,
        // A dead delivery redriven: claimed with its counters (dead → queued).
        Err(StoreError::ConditionFailed { .. }) => {
            match move_delivery(deps, t, task, &key, None, DeliveryStatus::Dead, DeliveryStatus::Sending, updates)
                .await?
            {
                true => match deps.table.get(&key).await? {
                    Some(item) => item,
                    None => return Ok(Outcome::Done),
                },
                false => return already_claimed(deps, &key, now_ms).await,
            }
        }
        Err(e) => return Err(e.into()),
    };
    let page = Some(page_of(&claimed_item).unwrap_or(0));
    let claimed: Delivery = claimed_item.parse()?;

    // The provider call.
    let Some(provider) = deps.providers.for_channel(task.channel) else {
        return Ok(Outcome::Reject(format!("channel {} has no provider", task.channel)));
    };
    let message = OutboundMessage {
        channel: task.channel,
        to: task.to.clone(),
        subject: task.subject.clone(),
        body: task.body.clone(),
        headers: task.headers.clone(),
        idempotency_key: format!("{}:{}:{}", task.notification_id, task.user_id, task.channel),
        tenant: t.as_str().to_owned(),
        notification_id: task.notification_id.clone(),
        user_id: task.user_id.clone(),
        attempt: claimed.attempts,
    };
    crate::crash::point("worker.before_provider");
    // Push goes to every device of the user (`devices::send_to_devices`).
    let result = match tokio::time::timeout(
        deps.config.provider_timeout,
        crate::devices::send(deps, t, provider.as_ref(), &message),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(ProviderError::transient("timeout")),
    };

    // Phase two: record what happened.
    match result {
        Ok(receipt) => {
            crate::crash::point("worker.after_provider");
            info!(to = %mask_address(&task.to), attempt = claimed.attempts, provider = provider.name(), "sent");
            crate::receipts::remember_sent(deps, provider.name(), &receipt.provider_message_id, t, task).await;
            let updates = vec![
                Update::set("sent_at", now_str(deps)),
                Update::set("provider_message_id", receipt.provider_message_id),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            move_delivery(deps, t, task, &key, page, DeliveryStatus::Sending, DeliveryStatus::Sent, updates).await?;
            crate::crash::point("worker.after_sent");
            Ok(Outcome::Done)
        }
        Err(ProviderError::Permanent { reason, code }) => {
            warn!(to = %mask_address(&task.to), %reason, ?code, "permanent failure; not retried");
            let updates = vec![
                Update::set("last_error", reason),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            move_delivery(deps, t, task, &key, page, DeliveryStatus::Sending, DeliveryStatus::Failed, updates).await?;
            Ok(Outcome::Done)
        }
        Err(ProviderError::Transient { reason, retry_after }) => {
            let last = receive_count >= deps.config.max_receives;
            warn!(%reason, attempt = claimed.attempts, last, "transient failure");
            let mut updates = vec![
                Update::set("last_error", reason),
                Update::SetIfAbsent("first_failed_at".into(), now_str(deps).into()),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            if last {
                updates.push(Update::set("dead_at", now_str(deps)));
            }
            let to = if last { DeliveryStatus::Dead } else { DeliveryStatus::Pending };
            move_delivery(deps, t, task, &key, page, DeliveryStatus::Sending, to, updates).await?;
            if last {
                metrics::counter!(crate::metrics::DEAD_LETTERS, "channel" => task.channel.as_str()).increment(1);
                // Visible again at once, so the queue moves it to the DLQ on the next receive.
                return Ok(Outcome::Retry(Duration::ZERO));
            }
            metrics::counter!(crate::metrics::RETRIES, "channel" => task.channel.as_str()).increment(1);
            Ok(Outcome::Retry(backoff(claimed.attempts, deps.config.retry_base, deps.config.retry_cap, retry_after)))
        }
    }
}

/// The expansion page a delivery was created by (its progress counters).
fn page_of(item: &crate::ports::Item) -> Option<u64> {
    item.i64(progress::PAGE_ATTR).map(|p| p.max(0) as u64)
}

/// A status change with the notification's progress counters (see [`progress::transition`]);
/// `false` when the delivery was no longer in `from`. `page` unknown: read from the delivery.
#[allow(clippy::too_many_arguments)]
async fn move_delivery(
    deps: &Deps,
    t: &TenantId,
    task: &ChannelTask,
    key: &crate::ports::Key,
    page: Option<u64>,
    from: DeliveryStatus,
    to: DeliveryStatus,
    updates: Vec<Update>,
) -> CoreResult<bool> {
    let page = match page {
        Some(p) => p,
        None => deps.table.get(key).await?.as_ref().and_then(page_of).unwrap_or(0),
    };
    let tr = progress::Transition {
        t,
        notification_id: &task.notification_id,
        user_id: &task.user_id,
        page,
        key,
        from,
        to,
        also: None,
        updates,
    };
    Ok(progress::transition(deps, tr).await?)
}

/// The claim failed: someone sent it already, it is final, or a lease is running.
async fn already_claimed(deps: &Deps, key: &crate::ports::Key, now_ms: i64) -> CoreResult<Outcome> {
    let Some(item) = deps.table.get(key).await? else {
        warn!("channel task without a delivery record; dropped");
        return Ok(Outcome::Done);
    };
    let d: Delivery = item.parse()?;
    match d.status {
        DeliveryStatus::Sending if d.category == Category::Transactional => {
            let wait_ms = d.lease_until_ms.unwrap_or(now_ms).saturating_sub(now_ms).max(0) as u64;
            Ok(Outcome::Retry(Duration::from_millis(wait_ms + 500)))
        }
        _ => Ok(Outcome::Done),
    }
}
