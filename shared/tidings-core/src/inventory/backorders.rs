//! Backorders and pre-orders (docs/inventory.md, "Backorders and pre-orders").
//!
//! A SKU's policy (`backorder_limit`, a pre-order window with its `limit`) lives on its stock
//! item. Only an order the stock cannot fill reads it ([`super::orders::place_order`]): the
//! units that exist are held as usual and the shortfall is promised, counted on the stock item as
//! `backordered` (and `unfilled`, the promised units nothing has set aside yet) under the
//! condition `backordered <= limit - n` checked at commit, so concurrent orders never promise
//! more than the limit. Such an order is BACKORDERED (PREORDERED while the window is open),
//! does not expire, and has an index item per waiting line (`T#t#BACKORDERS#{sku}` /
//! `{created_at}#{order_id}`: oldest first).
//!
//! Stock that grows while units are unfilled (an adjustment, a released hold) is set aside
//! first: up to `unfilled` of it goes to the cell's `allotted` counter instead of `available`,
//! in the change's own transaction, so only the units beyond the promises can lift `available`
//! from 0 and open a back-in-stock round. [`fill`] then moves the set-aside units into the
//! waiting orders, oldest first, one order per transaction (`allotted` → the order's `reserved`,
//! or `sold` when it was paid, `backordered` down, one `fill` ledger entry): a filled order is
//! PENDING with a fresh hold (PAID when it was paid). The change that set units aside queues
//! the fill at once (`inventory.fill` on the timers queue, [`super::promises::fill_soon`]), with
//! a durable timer as its backstop: the order and stock paths (below this module) never call it.
//!
//! Invariant: the SKU's `allotted` (over its cells) + `unfilled` = `backordered`; every move
//! of them is in the ledger (`delta_allotted`, `delta_backordered`, `delta_unfilled`), so
//! reconciliation checks them like the other counters.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tracing::warn;

use super::keys;
use super::model::{Allocation, CellId, Counters, LedgerKind, MAX_UNITS, OrderStatus, StockPolicy, StockView};
use super::orders::{load_order, send_expiry_message};
use super::promises::WaitingOrder;
use super::stock::{Cell, StockChange, get_stock, now_text, read_sku};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};

/// The most orders one call of [`fill`] fills before it leaves the rest to its task.
const FILLS_PER_CALL: usize = 200;
/// How far ahead a pre-order window may end (five years).
const MAX_WINDOW_DAYS: i64 = 5 * 366;

/// `PUT /v1/inventory/{sku_id}/policy`: sets the SKU's policy whole (an absent field clears
/// it). Lowering a limit below what is promised promises nothing more; nothing promised is
/// taken back.
pub async fn put_policy(deps: &Deps, t: &TenantId, sku_id: &str, req: &StockPolicy) -> CoreResult<StockView> {
    check_id("sku_id", sku_id)?;
    if let Some(l) = req.backorder_limit
        && !(0..=MAX_UNITS).contains(&l)
    {
        return Err(CoreError::invalid("backorder_limit", format!("must be 0 to {MAX_UNITS}")));
    }
    let mut updates = Vec::new();
    match req.backorder_limit {
        Some(l) => updates.push(Update::set("backorder_limit", l)),
        None => updates.push(Update::Remove("backorder_limit".into())),
    }
    match &req.preorder {
        Some(p) => {
            if !(0..=MAX_UNITS).contains(&p.limit) {
                return Err(CoreError::invalid("preorder.limit", format!("must be 0 to {MAX_UNITS}")));
            }
            let until = DateTime::parse_from_rfc3339(&p.until)
                .map_err(|_| {
                    CoreError::invalid("preorder.until", "must be an RFC 3339 time, e.g. 2026-12-24T09:00:00Z")
                })?
                .with_timezone(&Utc);
            let now = deps.clock.now();
            if until <= now {
                return Err(CoreError::invalid("preorder.until", "must be in the future"));
            }
            if until > now + chrono::Duration::days(MAX_WINDOW_DAYS) {
                return Err(CoreError::invalid("preorder.until", "must be within five years"));
            }
            updates.push(Update::set("preorder_until", until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)));
            updates.push(Update::set("preorder_limit", p.limit));
        }
        None => {
            updates.push(Update::Remove("preorder_until".into()));
            updates.push(Update::Remove("preorder_limit".into()));
        }
    }
    updates.push(Update::set("updated_at", now_text(deps)));
    match deps.table.update(&keys::stock(t, sku_id), updates, Cond::Exists).await {
        Ok(_) => {}
        Err(StoreError::ConditionFailed { .. }) => return Err(CoreError::NotFound { what: "sku" }),
        Err(e) => return Err(e.into()),
    }
    get_stock(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" })
}

/// Moves the SKU's set-aside units into its waiting orders, oldest first, one order per
/// transaction, until none are set aside or none wait. Returns how many fills committed.
/// Safe to run any number of times, concurrently too (each fill is conditioned on the order's
/// `waiting` and the cells' `allotted` it saw).
pub async fn fill(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<u64> {
    check_id("sku_id", sku_id)?;
    let mut filled = 0;
    let mut retries = 0;
    for _ in 0..FILLS_PER_CALL {
        match fill_one(deps, t, sku_id).await? {
            Step::Filled => filled += 1,
            Step::Idle => return Ok(filled),
            Step::Again => {
                retries += 1;
                if retries > FILLS_PER_CALL {
                    break;
                }
            }
        }
    }
    // More to do than one call takes: the rest in a task of its own.
    let task = TimerTask::BackorderFill { tenant: t.clone(), sku_id: sku_id.to_owned() };
    timer::schedule(deps, deps.clock.now(), task).await?;
    Ok(filled)
}

enum Step {
    Filled,
    Idle,
    Again,
}

/// Takes `units` of set-aside stock from the cells holding the most.
fn take_allotted(cells: &[Cell], units: i64) -> BTreeMap<CellId, i64> {
    let mut by_most: Vec<&Cell> = cells.iter().filter(|c| c.counters.allotted > 0).collect();
    by_most.sort_by_key(|c| std::cmp::Reverse(c.counters.allotted));
    let mut left = units;
    let mut out = BTreeMap::new();
    for c in by_most {
        if left == 0 {
            break;
        }
        let n = left.min(c.counters.allotted);
        out.insert(c.id.clone(), n);
        left -= n;
    }
    out
}

async fn fill_one(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Step> {
    let Some(sku) = read_sku(deps, t, sku_id).await? else { return Ok(Step::Idle) };
    let pool = sku.total().allotted;
    if pool <= 0 {
        return Ok(Step::Idle);
    }
    let opts = QueryOpts { limit: 1, cursor: None, descending: false };
    let page = deps.table.query(&keys::backorders_pk(t, sku_id), "", opts).await?;
    let Some(item) = page.items.first() else {
        warn!(tenant = %t, sku_id, pool, "units set aside for backorders but no order waits");
        return Ok(Step::Idle);
    };
    let entry: WaitingOrder = item.parse()?;
    let order = load_order(deps, t, &entry.order_id).await?;
    let line = order.as_ref().and_then(|o| {
        o.items.iter().position(|i| i.sku_id == sku_id && i.backordered > 0).filter(|_| o.status.is_waiting())
    });
    let (Some(mut order), Some(line)) = (order, line) else {
        // Filled or cancelled meanwhile: the index item is stale.
        deps.table.transact(vec![Write::Delete { key: item.key.clone(), cond: Cond::Always }]).await?;
        return Ok(Step::Again);
    };
    let before = (order.status, order.waiting);
    let n = order.items[line].backordered.min(pool);
    let paid = order.paid_at.is_some();
    let at = now_text(deps);
    let take = take_allotted(&sku.cells, n);
    let mut change =
        StockChange::new(t, &sku.record, LedgerKind::Fill, format!("order:{}", order.order_id), at.clone());
    change.deltas = take
        .iter()
        .map(|(c, &u)| {
            let into = if paid { Counters::new(0, 0, u) } else { Counters::new(0, u, 0) };
            (c.clone(), Counters { allotted: -u, ..into })
        })
        .collect();
    change.backordered = -n;
    let it = &mut order.items[line];
    it.backordered -= n;
    let line_done = it.backordered == 0;
    for (c, &u) in &take {
        match it.allocations.iter_mut().find(|a| a.cell() == *c) {
            Some(a) => a.qty += u,
            None => it.allocations.push(Allocation { location: c.location.clone(), shard: c.shard, qty: u }),
        }
    }
    order.waiting -= n;
    order.updated_at = at.clone();
    let mut expiry = None;
    if order.waiting == 0 {
        if paid {
            order.status = OrderStatus::Paid;
        } else {
            // A fresh hold from now: the buyer is asked to pay for units that are there.
            order.status = OrderStatus::Pending;
            let expires = deps.clock.now() + chrono::Duration::seconds(order.hold_seconds.max(1));
            order.expires_at = expires.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            order.expires_ms = expires.timestamp_millis();
            expiry = Some(expires);
        }
    }
    let order_cond =
        Cond::And(vec![Cond::eq("status", before.0.as_str()), super::stock::number_is("waiting", before.1)]);
    let mut writes =
        vec![Write::Put { item: Item::new(keys::order(t, &order.order_id), attrs_of(&order)?), cond: order_cond }];
    if line_done {
        writes.push(Write::Delete { key: item.key.clone(), cond: Cond::Exists });
    }
    writes.extend(change.writes()?);
    let task = TimerTask::OrderExpire { tenant: t.clone(), order_id: order.order_id.clone() };
    if let Some(expires) = expiry {
        writes.push(timer::durable_timer(deps, expires, &task).await?);
    }
    match deps.table.transact(writes).await {
        Ok(()) => {
            if let Some(expires) = expiry {
                send_expiry_message(deps, expires, &task).await;
            }
            Ok(Step::Filled)
        }
        Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => Ok(Step::Again),
        Err(e) => Err(e.into()),
    }
}
