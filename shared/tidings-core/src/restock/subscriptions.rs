//! Subscriptions (docs/restock.md, "Subscriptions"): at most one WAITING per (tenant, sku, user),
//! enforced by a conditional put of a lock item; a repeat returns the WAITING one. Leaving WAITING
//! is one transaction that updates both copies, drops the lock and the index entry, so the lock,
//! the index and the status never disagree.

use serde::Serialize;
use serde_json::{Value, json};

use super::keys;
use super::model::{Subscription, SubscriptionRequest, SubscriptionStatus, WaitingEntry};
use super::waiting::waiting_buckets;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id, new_id};
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};

const ATTEMPTS: usize = 5;

pub(crate) fn now_text(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Writes a small marker item once (read first: a shared item in every transaction would make
/// them conflict).
pub(crate) async fn mark_once(deps: &Deps, key: crate::ports::Key, name: &str, value: &str) -> CoreResult<()> {
    if deps.table.get(&key).await?.is_none() {
        deps.table.update(&key, vec![Update::SetIfAbsent(name.into(), Value::from(value))], Cond::Always).await?;
    }
    Ok(())
}

/// Subscribes; `(subscription, created)`. A WAITING one for the same (sku, user) is returned as is.
pub async fn subscribe(deps: &Deps, t: &TenantId, req: &SubscriptionRequest) -> CoreResult<(Subscription, bool)> {
    check_id("user_id", &req.user_id)?;
    check_id("sku_id", &req.sku_id)?;
    if let Some(spu) = &req.spu_id {
        check_id("spu_id", spu)?;
    }
    let market = req.market.as_deref();
    if let Some(m) = market {
        crate::inventory::locations::check_market("market", m)?;
    }
    mark_once(deps, keys::tenant_entry(t), "tenant", t.as_str()).await?;
    mark_once(deps, keys::watched_sku(t, &req.sku_id), "sku_id", &req.sku_id).await?;
    if let Some(m) = market {
        mark_once(deps, keys::waiting_market(t, &req.sku_id, m), "market", m).await?;
    }
    let lock = keys::waiting_lock(t, &req.sku_id, &req.user_id);
    for _ in 0..ATTEMPTS {
        let now = deps.clock.now();
        let id = new_id();
        let created_ms = now.timestamp_millis();
        let sort = format!("{:015}#{id}", created_ms.max(0));
        let at = now_text(deps);
        let sub = Subscription {
            subscription_id: id.clone(),
            sku_id: req.sku_id.clone(),
            spu_id: req.spu_id.clone(),
            user_id: req.user_id.clone(),
            status: SubscriptionStatus::Waiting,
            created_at: at.clone(),
            created_ms,
            updated_at: at,
            notified_at: None,
            batch_no: None,
            sort: sort.clone(),
            notify_incoming: req.notify_incoming,
            market: req.market.clone(),
        };
        let entry = WaitingEntry {
            subscription_id: id.clone(),
            user_id: req.user_id.clone(),
            created_ms,
            notify_incoming: req.notify_incoming,
            market: req.market.clone(),
        };
        let mut lock_attrs = serde_json::Map::new();
        lock_attrs.insert("subscription_id".into(), json!(id));
        let writes = vec![
            Write::Put { item: Item::new(lock.clone(), lock_attrs), cond: Cond::NotExists },
            Write::Put { item: Item::new(keys::subscription(t, &id), attrs_of(&sub)?), cond: Cond::NotExists },
            Write::Put {
                item: Item::new(keys::user_subscription(t, &req.user_id, &sort), attrs_of(&sub)?),
                cond: Cond::NotExists,
            },
            Write::Put {
                item: Item::new(keys::waiting_entry(t, &req.sku_id, market, &sort), attrs_of(&entry)?),
                cond: Cond::NotExists,
            },
            // The SKU's WAITING count (docs/restock.md, "What alerts earn"), in this transaction.
            super::analytics::waiting_write(t, &req.sku_id, &req.user_id, 1),
        ];
        match deps.table.transact(writes).await {
            Ok(()) => {
                super::incoming::tell_subscriber(deps, t, &sub).await?;
                return Ok((sub, true));
            }
            Err(StoreError::ConditionFailed { index: 0 }) => {
                let Some(existing) = deps.table.get(&lock).await? else { continue };
                let Some(existing_id) = existing.str("subscription_id") else { continue };
                if let Some(sub) = get(deps, t, existing_id).await? {
                    // A retry after a crash past the subscription's write tells it now.
                    super::incoming::tell_subscriber(deps, t, &sub).await?;
                    return Ok((sub, false));
                }
            }
            Err(StoreError::Conflict) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

pub async fn get(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Option<Subscription>> {
    check_id("subscription_id", id)?;
    Ok(deps.table.get(&keys::subscription(t, id)).await?.map(|i| i.parse()).transpose()?)
}

/// The writes that move a WAITING subscription to `to`, conditioned on it being WAITING (writes
/// 0 to 2 fail otherwise); the last one takes it off the SKU's WAITING count.
#[allow(clippy::too_many_arguments)]
pub(crate) fn leave_waiting_writes(
    t: &TenantId,
    sub_id: &str,
    user_id: &str,
    sku_id: &str,
    market: Option<&str>,
    sort: &str,
    to: SubscriptionStatus,
    at: &str,
    batch_no: Option<&str>,
) -> Vec<Write> {
    let mut updates = vec![Update::set("status", to.as_str()), Update::set("updated_at", at)];
    if let Some(b) = batch_no {
        updates.push(Update::set("batch_no", b));
        updates.push(Update::set("notified_at", at));
    }
    let waiting = Cond::eq("status", SubscriptionStatus::Waiting.as_str());
    vec![
        Write::Update { key: keys::subscription(t, sub_id), updates: updates.clone(), cond: waiting.clone() },
        Write::Update { key: keys::user_subscription(t, user_id, sort), updates, cond: waiting },
        Write::Delete { key: keys::waiting_lock(t, sku_id, user_id), cond: Cond::eq("subscription_id", sub_id) },
        Write::Delete { key: keys::waiting_entry(t, sku_id, market, sort), cond: Cond::Always },
        super::analytics::waiting_write(t, sku_id, user_id, -1),
    ]
}

/// Cancels: the record stays, CANCELLED. A NOTIFIED one may be cancelled too (its retries and
/// resends then skip it). EXPIRED cannot be (409).
pub async fn cancel(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Subscription> {
    for _ in 0..ATTEMPTS {
        let Some(sub) = get(deps, t, id).await? else { return Err(CoreError::NotFound { what: "subscription" }) };
        let at = now_text(deps);
        let writes = match sub.status {
            SubscriptionStatus::Cancelled => return Ok(sub),
            SubscriptionStatus::Expired => {
                return Err(CoreError::conflict("invalid_state", "the subscription has expired"));
            }
            SubscriptionStatus::Waiting => leave_waiting_writes(
                t,
                id,
                &sub.user_id,
                &sub.sku_id,
                sub.market.as_deref(),
                &sub.sort,
                SubscriptionStatus::Cancelled,
                &at,
                None,
            ),
            SubscriptionStatus::Notified => {
                let updates = vec![Update::set("status", "CANCELLED"), Update::set("updated_at", at.as_str())];
                let cond = Cond::eq("status", "NOTIFIED");
                vec![
                    Write::Update { key: keys::subscription(t, id), updates: updates.clone(), cond: cond.clone() },
                    Write::Update { key: keys::user_subscription(t, &sub.user_id, &sub.sort), updates, cond },
                ]
            }
        };
        match deps.table.transact(writes).await {
            Ok(()) => return get(deps, t, id).await?.ok_or(CoreError::NotFound { what: "subscription" }),
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// One page of a user's subscriptions, newest first.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SubscriptionPage {
    pub items: Vec<Subscription>,
    pub next_cursor: Option<String>,
}

pub async fn list_for_user(
    deps: &Deps,
    t: &TenantId,
    user_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<SubscriptionPage> {
    check_id("user_id", user_id)?;
    let page = deps
        .table
        .query(&keys::user_subscriptions_pk(t, user_id), "", QueryOpts { limit, cursor, descending: true })
        .await
        .map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<Subscription>, _>>()?;
    Ok(SubscriptionPage { items, next_cursor: page.next_cursor })
}

/// Expires the SKU's WAITING subscriptions created before `cutoff_ms`, in each of its indexes
/// (oldest first, so each walk stops at the first younger one). Returns how many expired.
pub(crate) async fn expire_old(deps: &Deps, t: &TenantId, sku_id: &str, cutoff_ms: i64) -> CoreResult<u64> {
    let mut expired = 0;
    for market in waiting_buckets(deps, t, sku_id).await? {
        expired += expire_old_in(deps, t, sku_id, market.as_deref(), cutoff_ms).await?;
    }
    Ok(expired)
}

async fn expire_old_in(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    market: Option<&str>,
    cutoff_ms: i64,
) -> CoreResult<u64> {
    let mut expired = 0;
    loop {
        let page = deps
            .table
            .query(&keys::waiting_pk(t, sku_id, market), "", QueryOpts { limit: 100, cursor: None, descending: false })
            .await?;
        let mut any = false;
        for item in &page.items {
            let entry: WaitingEntry = item.parse()?;
            if entry.created_ms >= cutoff_ms {
                return Ok(expired);
            }
            any = true;
            let at = now_text(deps);
            let writes = leave_waiting_writes(
                t,
                &entry.subscription_id,
                &entry.user_id,
                sku_id,
                market,
                &item.key.sk,
                SubscriptionStatus::Expired,
                &at,
                None,
            );
            match deps.table.transact(writes).await {
                Ok(()) => expired += 1,
                // Notified or cancelled meanwhile: its index entry is gone with it. A stray entry
                // (no WAITING subscription behind it) is dropped so it cannot stall the walk.
                Err(StoreError::ConditionFailed { .. }) => {
                    deps.table.delete(&item.key, Cond::Always).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !any || page.next_cursor.is_none() {
            return Ok(expired);
        }
    }
}
