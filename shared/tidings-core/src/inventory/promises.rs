//! What the order and stock paths need of backorders and pre-orders (docs/inventory.md,
//! "Backorders and pre-orders"): a SKU's policy and the limit it puts on promised units, the
//! index of waiting orders, and the fill's task ([`super::backorders`] fills).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::keys;
use super::model::{Order, Preorder, SkuRecord, StockPolicy};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::ports::{Cond, Item, Key, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};

/// The policy as `GET /v1/inventory/{sku_id}` shows it (`None` when there is none).
pub(crate) fn policy_of(r: &SkuRecord) -> Option<StockPolicy> {
    let preorder = match (&r.preorder_until, r.preorder_limit) {
        (Some(until), Some(limit)) => Some(Preorder { until: until.clone(), limit }),
        _ => None,
    };
    (r.backorder_limit.is_some() || preorder.is_some())
        .then_some(StockPolicy { backorder_limit: r.backorder_limit, preorder })
}

/// What an order past the stock may take now: the limit of promised units, and whether they are
/// pre-ordered (the window is open) rather than backordered. `None`: neither is allowed.
pub(crate) fn limit_now(r: &SkuRecord, now: DateTime<Utc>) -> Option<(i64, bool)> {
    let open = r
        .preorder_until
        .as_deref()
        .and_then(|u| DateTime::parse_from_rfc3339(u).ok())
        .is_some_and(|u| u.with_timezone(&Utc) > now);
    match (open, r.preorder_limit, r.backorder_limit) {
        (true, Some(limit), _) if limit > 0 => Some((limit, true)),
        (true, _, _) => None,
        (false, _, Some(limit)) if limit > 0 => Some((limit, false)),
        _ => None,
    }
}

/// The condition a promise of `n` more units puts on the stock item: `backordered + n <= limit`.
pub(crate) fn within_limit(limit: i64, n: i64) -> Cond {
    let room = limit - n;
    Cond::Or(vec![
        Cond::AttrNotExists("backordered".into()),
        Cond::Cmp("backordered".into(), crate::ports::CmpOp::Le, room.into()),
    ])
}

/// A waiting order's index item, oldest first per SKU.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct WaitingOrder {
    pub order_id: String,
    pub created_at: String,
}

pub(crate) fn waiting_key(t: &TenantId, sku_id: &str, order: &Order) -> Key {
    keys::backorder(t, sku_id, &order.created_at, &order.order_id)
}

/// The index item's write for a line of `order` waiting for `sku_id`.
pub(crate) fn waiting_put(t: &TenantId, sku_id: &str, order: &Order) -> CoreResult<Write> {
    let w = WaitingOrder { order_id: order.order_id.clone(), created_at: order.created_at.clone() };
    Ok(Write::Put { item: Item::new(waiting_key(t, sku_id, order), attrs_of(&w)?), cond: Cond::NotExists })
}

/// The durable backstop of a fill: the task that runs [`fill`] for the SKU (written in the
/// transaction that set units aside).
pub(crate) async fn fill_timer(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Write> {
    let task = TimerTask::BackorderFill { tenant: t.clone(), sku_id: sku_id.to_owned() };
    timer::durable_timer(deps, deps.clock.now(), &task).await
}

/// Has the SKU's waiting orders filled right after a change that set units aside: the fill's
/// task queued at once (`inventory.fill` on the timers queue, [`super::backorders::fill`]); a
/// queue that does not take it leaves the fill to its durable timer ([`fill_timer`]).
pub(crate) async fn fill_soon(deps: &Deps, t: &TenantId, sku_id: &str) {
    let task = TimerTask::BackorderFill { tenant: t.clone(), sku_id: sku_id.to_owned() };
    if let Err(e) = timer::schedule(deps, deps.clock.now(), task).await {
        warn!(tenant = %t, sku_id, error = %e, "backorder fill left to its timer");
    }
}
