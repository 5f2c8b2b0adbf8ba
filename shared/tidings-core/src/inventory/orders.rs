//! Orders and their holds: place (reserve every line in one transaction), pay, cancel, expire.
//!
//! Every state change is one transaction conditioned on the order being `PENDING`, so when
//! pay, cancel and expiry race on one order exactly one of them commits, and a hold is released
//! at most once (PENDING → PAID / CANCELLED, each through the ledger: docs/inventory.md, "Holds
//! expire").

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::keys;
use super::locations;
use super::model::{
    Allocation, CellId, Counters, LedgerKind, MAX_HOLD_SECONDS, Order, OrderItem, OrderRequest, OrderStatus, OrderView,
    SkuRecord, is_default_location,
};
use super::stock::{Attempts, Cell, StockChange, insufficient, now_text, read_cells, read_record, read_sku, take_from};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::table::MAX_TRANSACTION_WRITES;
use crate::ports::{CmpOp, Cond, Item, StoreError, Update, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};

/// The most units of one SKU in one order line.
pub const MAX_QTY: i64 = 1_000_000;
/// The most distinct SKUs in one order: placing it is one transaction of at most 100 writes
/// (DynamoDB's limit): the order, its expiry timer, and per unsharded SKU its counter and its
/// ledger entry: 2 + 2 × 49 = 100. Sharded SKUs cost more (see
/// [`StockChange::release_budget`]), which is checked once their shard counts are known.
pub const MAX_ORDER_SKUS: usize = (MAX_TRANSACTION_WRITES - 2) / 2;

/// The answer to `POST /v1/orders`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlacedOrder {
    #[serde(flatten)]
    pub order: OrderView,
    /// False when this answers a repeated request (the order was already placed).
    #[serde(skip)]
    pub created: bool,
}

fn validate(req: &OrderRequest) -> CoreResult<()> {
    check_id("order_id", &req.order_id)?;
    check_id("user_id", &req.user_id)?;
    if req.items.is_empty() {
        return Err(CoreError::invalid("items", "an order needs at least one item"));
    }
    if req.items.len() > MAX_ORDER_SKUS {
        return Err(CoreError::invalid("items", format!("at most {MAX_ORDER_SKUS} distinct SKUs per order")));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, line) in req.items.iter().enumerate() {
        check_id(&format!("items[{i}].sku_id"), &line.sku_id)?;
        if !(1..=MAX_QTY).contains(&line.qty) {
            return Err(CoreError::invalid(format!("items[{i}].qty"), format!("must be 1 to {MAX_QTY}")));
        }
        if let Some(p) = &line.unit_price {
            crate::money::Amount::parse(&format!("items[{i}].unit_price"), p)?;
        }
        if !seen.insert(line.sku_id.as_str()) {
            return Err(CoreError::invalid(format!("items[{i}].sku_id"), "each SKU may appear once"));
        }
    }
    if let Some(s) = req.hold_seconds
        && !(1..=MAX_HOLD_SECONDS).contains(&s)
    {
        return Err(CoreError::invalid("hold_seconds", format!("must be 1 to {MAX_HOLD_SECONDS}")));
    }
    if let Some(c) = &req.category {
        check_id("category", c)?;
    }
    Ok(())
}

/// The order's body, hashed as it was before `market` was one of its fields (an order placed
/// then and again now is the same order): the body without it, then the market.
fn request_hash(req: &OrderRequest) -> CoreResult<String> {
    let without = OrderRequest { market: None, ..req.clone() };
    let mut canonical = serde_json::to_vec(&without).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if let Some(m) = &req.market {
        canonical.extend_from_slice(format!("\nmarket={m}").as_bytes());
    }
    Ok(hex::encode(Sha256::digest(&canonical)))
}

/// The hold time (per category, not one global value): `hold_seconds` if given, else the order's
/// category, else the shortest hold among its SKUs' categories (scarce promotion stock is not held
/// for long).
fn hold_for(deps: &Deps, req: &OrderRequest, records: &[SkuRecord]) -> Duration {
    if let Some(s) = req.hold_seconds {
        return Duration::from_secs(s.unsigned_abs());
    }
    let holds = &deps.config.hold_times;
    if let Some(c) = &req.category {
        return holds.for_category(Some(c));
    }
    records.iter().map(|r| holds.for_category(r.category.as_deref())).min().unwrap_or(holds.default)
}

pub(crate) async fn load_order(deps: &Deps, t: &TenantId, order_id: &str) -> CoreResult<Option<Order>> {
    match deps.table.get(&keys::order(t, order_id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

pub async fn get_order(deps: &Deps, t: &TenantId, order_id: &str) -> CoreResult<Option<OrderView>> {
    check_id("order_id", order_id)?;
    Ok(load_order(deps, t, order_id).await?.as_ref().map(OrderView::from))
}

fn replay(existing: &Order, hash: &str) -> CoreResult<PlacedOrder> {
    if existing.request_hash != hash {
        return Err(CoreError::conflict("idempotency_conflict", "this order_id was used with a different order"));
    }
    Ok(PlacedOrder { order: OrderView::from(existing), created: false })
}

/// The order's SKUs, read side by side, and checked to fit one transaction.
async fn sku_records(deps: &Deps, t: &TenantId, req: &OrderRequest) -> CoreResult<Vec<SkuRecord>> {
    let reads = req.items.iter().map(|l| read_record(deps, t, &l.sku_id));
    let mut records = Vec::with_capacity(req.items.len());
    for (i, got) in futures::future::join_all(reads).await.into_iter().enumerate() {
        records.push(got?.ok_or_else(|| CoreError::NotFoundAt { field: format!("items[{i}].sku_id"), what: "sku" })?);
    }
    let budget: usize = 2 + records.iter().map(StockChange::release_budget).sum::<usize>();
    if budget > MAX_TRANSACTION_WRITES {
        return Err(CoreError::invalid(
            "items",
            format!("too many SKUs (or shards) for one transaction: {budget} writes, at most {MAX_TRANSACTION_WRITES}"),
        ));
    }
    Ok(records)
}

/// A placement refused with `refusal`: the stored order when this is a repeat of it (answered
/// as the first time, or 409 `idempotency_conflict`), else the refusal.
async fn replay_or(
    deps: &Deps,
    t: &TenantId,
    req: &OrderRequest,
    hash: &str,
    refusal: CoreError,
) -> CoreResult<PlacedOrder> {
    match load_order(deps, t, &req.order_id).await? {
        Some(existing) => replay(&existing, hash),
        None => Err(refusal),
    }
}

/// The locations a line of this SKU may be held at, in the order it is held from them: those
/// serving the order's market (all without one) where the SKU has a cell.
fn places<'a>(record: &SkuRecord, serving: &'a [String]) -> Vec<&'a str> {
    serving.iter().map(String::as_str).filter(|l| record.has_location(l)).collect()
}

/// Where a line's units are held, before any read: all at the first location serving the
/// market (the one cell of an unsharded SKU, a random shard of a sharded `default`, spreading the
/// writes of a hot SKU); re-planned from a read when that cell was short. `None`: no location
/// serving the market holds the SKU.
fn first_plan(record: &SkuRecord, serving: &[String], qty: i64) -> Option<BTreeMap<CellId, i64>> {
    let first = *places(record, serving).first()?;
    if is_default_location(first) && record.is_sharded() {
        return Some(BTreeMap::from([(CellId::default_shard(rand::rng().random_range(0..record.shards)), qty)]));
    }
    Some(BTreeMap::from([(CellId::at(first), qty)]))
}

fn short(record: &SkuRecord, market: Option<&str>, available: i64, qty: i64) -> CoreError {
    match market {
        None => insufficient(&record.sku_id, available, qty),
        Some(m) => CoreError::conflict(
            "insufficient_stock",
            format!(
                "insufficient stock for sku {} in market {m}: {available} available, {qty} requested",
                record.sku_id
            ),
        ),
    }
}

fn plan_over(
    record: &SkuRecord,
    cells: &[Cell],
    serving: &[String],
    market: Option<&str>,
    qty: i64,
) -> CoreResult<BTreeMap<CellId, i64>> {
    let order = places(record, serving);
    let total: i64 =
        cells.iter().filter(|c| order.contains(&c.id.location.as_str())).map(|c| c.counters.available).sum();
    if total < qty {
        return Err(short(record, market, total, qty));
    }
    let mut left = qty;
    let mut plan = BTreeMap::new();
    for l in order {
        if left == 0 {
            break;
        }
        let here: Vec<&Cell> = cells.iter().filter(|c| c.id.location == l).collect();
        let avail: i64 = here.iter().map(|c| c.counters.available).sum();
        let take = left.min(avail);
        if take <= 0 {
            continue;
        }
        let whole: Vec<&CellId> = here.iter().filter(|c| c.counters.available >= take).map(|c| &c.id).collect();
        if whole.is_empty() {
            plan.extend(take_from(here.iter().copied(), take).ok_or_else(|| short(record, market, total, qty))?);
        } else {
            plan.insert(whole[rand::rng().random_range(0..whole.len())].clone(), take);
        }
        left -= take;
    }
    Ok(plan)
}

/// A line's plan from a fresh read: the units held where they are (`plan_over`), and when the
/// locations together are short, the SKU's policy allows and there is room under its limit, the
/// units there are held and the rest promised (`Waits`). Refused otherwise.
async fn plan_line(
    deps: &Deps,
    t: &TenantId,
    record: &mut SkuRecord,
    serving: &[String],
    market: Option<&str>,
    qty: i64,
) -> CoreResult<(BTreeMap<CellId, i64>, Waits)> {
    let cells = read_cells(deps, t, record).await?;
    match plan_over(record, &cells, serving, market, qty) {
        Ok(plan) => Ok((plan, Waits::default())),
        Err(refusal) => {
            // Short: the policy and the promised units, as they are now.
            let Some(sku) = read_sku(deps, t, &record.sku_id).await? else {
                return Err(CoreError::NotFound { what: "sku" });
            };
            *record = sku.record.clone();
            let Some((limit, preorder)) = super::promises::limit_now(record, deps.clock.now()) else {
                return Err(refusal);
            };
            let order = places(record, serving);
            let here: i64 = sku
                .cells
                .iter()
                .filter(|c| order.contains(&c.id.location.as_str()))
                .map(|c| c.counters.available.max(0))
                .sum();
            let units = qty - here;
            let promised = sku.total().backordered;
            if units > limit - promised {
                return Err(refusal);
            }
            let plan = if here > 0 { plan_over(record, &sku.cells, serving, market, here)? } else { BTreeMap::new() };
            Ok((plan, Waits { units, preorder, limit }))
        }
    }
}

/// The units of a line promised past the stock (0: none), whether pre-ordered, and the limit
/// they were promised under.
#[derive(Clone, Copy, Debug, Default)]
struct Waits {
    units: i64,
    preorder: bool,
    limit: i64,
}

/// Places an order: one transaction puts the order (if absent), reserves every line with a
/// condition `available >= qty` on each counter it touches (never read-then-write:
/// docs/inventory.md, "Never oversell"), writes one ledger entry per SKU in the same transaction
/// and the durable expiry timer. Short on any SKU: 409 `insufficient_stock` naming it, and nothing
/// is held. The same order again: the order as it is, nothing held twice.
///
/// With a `market` (docs/inventory.md, "Locations and markets"), each line is held at the
/// locations serving it (any location when `None`: `default` first, then by priority), in
/// their priority order, split across them when one has too few; still one transaction, all or
/// nothing.
pub async fn place_order(deps: &Deps, t: &TenantId, req: &OrderRequest) -> CoreResult<PlacedOrder> {
    let market = req.market.as_deref();
    validate(req)?;
    if let Some(m) = market {
        locations::check_market("market", m)?;
    }
    let hash = request_hash(req)?;
    // The order is not read first: its put is conditioned on its absence, and a repeat fails
    // there (index 0) and is answered from the order as stored. What refuses an order before
    // the transaction (an SKU deleted since, too many writes, short stock) looks for the order
    // first, so a repeat is answered as it was the first time.
    let mut records = match sku_records(deps, t, req).await {
        Ok(records) => records,
        Err(e) => return replay_or(deps, t, req, &hash, e).await,
    };
    let hold = hold_for(deps, req, &records);
    let now = deps.clock.now();
    let expires = now + chrono::Duration::from_std(hold).unwrap_or(chrono::Duration::MAX);
    let any_locations = records.iter().any(|r| !r.locations.is_empty());
    let serving = if any_locations || market.is_some() {
        locations::serving(&locations::all(deps, t).await?, market)
    } else {
        vec![super::model::DEFAULT_LOCATION.to_owned()]
    };
    let mut plans: Vec<BTreeMap<CellId, i64>> = Vec::with_capacity(records.len());
    let mut waits: Vec<Waits> = vec![Waits::default(); records.len()];
    for (i, l) in req.items.iter().enumerate() {
        match first_plan(&records[i], &serving, l.qty) {
            Some(plan) => plans.push(plan),
            None => match plan_line(deps, t, &mut records[i], &serving, market, l.qty).await {
                Ok((plan, w)) => {
                    plans.push(plan);
                    waits[i] = w;
                }
                Err(e) => return replay_or(deps, t, req, &hash, e).await,
            },
        }
    }
    let task = TimerTask::OrderExpire { tenant: t.clone(), order_id: req.order_id.clone() };
    let timer = timer::durable_timer(deps, expires, &task).await?;
    let mut attempts = Attempts::new();
    while attempts.another() {
        let at = now_text(deps);
        let waiting: i64 = waits.iter().map(|w| w.units).sum();
        let status = if waiting == 0 {
            OrderStatus::Pending
        } else if waits.iter().any(|w| w.units > 0 && w.preorder) {
            OrderStatus::Preordered
        } else {
            OrderStatus::Backordered
        };
        let order = Order {
            order_id: req.order_id.clone(),
            user_id: req.user_id.clone(),
            status,
            items: req
                .items
                .iter()
                .zip(&plans)
                .zip(&waits)
                .map(|((l, p), w)| OrderItem {
                    sku_id: l.sku_id.clone(),
                    qty: l.qty,
                    unit_price: l.unit_price.clone(),
                    allocations: p
                        .iter()
                        .map(|(c, &qty)| Allocation { location: c.location.clone(), shard: c.shard, qty })
                        .collect(),
                    backordered: w.units,
                })
                .collect(),
            category: req.category.clone(),
            market: market.map(str::to_owned),
            hold_seconds: i64::try_from(hold.as_secs()).unwrap_or(MAX_HOLD_SECONDS),
            created_at: at.clone(),
            expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            expires_ms: expires.timestamp_millis(),
            request_hash: hash.clone(),
            updated_at: at.clone(),
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            waiting,
        };
        let mut writes = vec![Write::Put {
            item: Item::new(keys::order(t, &req.order_id), attrs_of(&order)?),
            cond: Cond::NotExists,
        }];
        let mut owner: Vec<Option<usize>> = vec![None];
        for (i, (record, plan)) in records.iter().zip(&plans).enumerate() {
            let mut change =
                StockChange::new(t, record, LedgerKind::Reserve, format!("order:{}", req.order_id), at.clone());
            change.deltas = plan.iter().map(|(cell, &qty)| (cell.clone(), Counters::reserve(qty))).collect();
            let wait = waits[i];
            if wait.units > 0 {
                // The units past the stock, promised under the limit (checked at commit).
                change.backordered = wait.units;
                change.unfilled = wait.units;
                change.header_conds.push(super::promises::within_limit(wait.limit, wait.units));
            }
            let mut w = change.writes()?;
            if wait.units > 0 {
                w.push(super::promises::waiting_put(t, &record.sku_id, &order)?);
            }
            owner.extend(std::iter::repeat_n(Some(i), w.len()));
            writes.extend(w);
        }
        writes.push(timer.clone());
        if writes.len() > MAX_TRANSACTION_WRITES {
            let refusal = CoreError::invalid(
                "items",
                format!("too many SKUs waiting for stock for one transaction: at most {MAX_TRANSACTION_WRITES} writes"),
            );
            return replay_or(deps, t, req, &hash, refusal).await;
        }
        match deps.table.transact(writes).await {
            Ok(()) => {
                crate::crash::point("inventory.after_commit");
                if waiting > 0 {
                    // A waiting order does not expire (its timer finds it not PENDING).
                } else if deps.config.detached_expiry_messages {
                    // The order is durable and answered now: its answer does not wait for a
                    // second write (the message's), which on the embedded store is a second
                    // group commit and sync.
                    let deps = deps.clone();
                    crate::roles::spawn_in_role(async move { send_expiry_message(&deps, expires, &task).await });
                } else {
                    send_expiry_message(deps, expires, &task).await;
                }
                return Ok(PlacedOrder { order: OrderView::from(&order), created: true });
            }
            Err(StoreError::ConditionFailed { index: 0 }) => {
                let existing = load_order(deps, t, &req.order_id).await?.ok_or(StoreError::Conflict)?;
                return replay(&existing, &hash);
            }
            Err(StoreError::ConditionFailed { index }) => {
                let Some(Some(i)) = owner.get(index).copied() else {
                    return Err(StoreError::ConditionFailed { index }.into());
                };
                match plan_line(deps, t, &mut records[i], &serving, market, req.items[i].qty).await {
                    Ok((plan, w)) => {
                        plans[i] = plan;
                        waits[i] = w;
                    }
                    Err(e) => return replay_or(deps, t, req, &hash, e).await,
                }
            }
            Err(StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// A short hold also gets a delayed message on the timers queue, so it expires on time; the
/// durable timer written with the order is the backstop if this send fails (logged only).
pub(crate) async fn send_expiry_message(deps: &Deps, expires: chrono::DateTime<chrono::Utc>, task: &TimerTask) {
    if !timer::fits_queue_delay(deps, expires) {
        return;
    }
    if let Err(e) = timer::schedule(deps, expires, task.clone()).await {
        warn!(error = %e, "expiry message not sent; the durable timer will expire the hold");
    }
}

/// What a state change of an order did.
#[derive(Clone, Debug, PartialEq)]
pub enum Settlement {
    /// This call changed the order.
    Settled(Order),
    /// The order was already in the asked state (cancel of a cancelled order).
    Already(Order),
    /// Expiry only: the hold is still running until `expires_ms`.
    NotDue { expires_ms: i64 },
    /// Expiry only: the order is no longer PENDING; nothing to do.
    NotPending(Order),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transition {
    Pay,
    Cancel,
    Expire,
}

fn invalid_state(order: &Order) -> CoreError {
    CoreError::conflict("invalid_state", format!("order {} is {}", order.order_id, order.status.as_str()))
}

/// Pays a PENDING order whose hold has not expired: reserved → sold, one transaction.
/// A paid order is then attributed to the back-in-stock alerts before it (off the reservation
/// path; a repeated pay of a PAID order attributes it again, which counts once).
pub async fn pay(deps: &Deps, t: &TenantId, order_id: &str) -> CoreResult<OrderView> {
    match settle(deps, t, order_id, Transition::Pay).await? {
        Settlement::Settled(o) => {
            attribute(deps, t, &o).await;
            Ok(OrderView::from(&o))
        }
        Settlement::NotPending(o) if o.status == OrderStatus::Paid => {
            attribute(deps, t, &o).await;
            Err(invalid_state(&o))
        }
        Settlement::Already(o) | Settlement::NotPending(o) => Err(invalid_state(&o)),
        Settlement::NotDue { .. } => Err(StoreError::Invalid("pay cannot be not due".into()).into()),
    }
}

/// The paid order's attribution to the alerts about its SKUs (docs/restock.md, "What alerts
/// earn").
async fn attribute(deps: &Deps, t: &TenantId, o: &Order) {
    use crate::restock::analytics::{PaidLine, PaidOrder, on_paid_logged};
    let lines = o
        .items
        .iter()
        .map(|i| PaidLine { sku_id: &i.sku_id, qty: i.qty, unit_price: i.unit_price.as_deref() })
        .collect();
    let paid = PaidOrder { order_id: &o.order_id, user_id: &o.user_id, created_at: &o.created_at, lines };
    on_paid_logged(deps, t, &paid).await;
}

/// Cancels a PENDING order and releases its hold (reserved → available); a cancelled order
/// answers as it is; a paid one is 409 `invalid_state`.
pub async fn cancel(deps: &Deps, t: &TenantId, order_id: &str) -> CoreResult<OrderView> {
    match settle(deps, t, order_id, Transition::Cancel).await? {
        Settlement::Settled(o) | Settlement::Already(o) => Ok(OrderView::from(&o)),
        Settlement::NotPending(o) => Err(invalid_state(&o)),
        Settlement::NotDue { .. } => Err(StoreError::Invalid("cancel cannot be not due".into()).into()),
    }
}

/// Expires a PENDING order whose hold ran out: CANCELLED with reason `expiry`, hold released.
/// Safe to call any number of times, at any time (the timer may fire twice or early).
pub async fn expire_order(deps: &Deps, t: &TenantId, order_id: &str) -> CoreResult<Settlement> {
    check_id("order_id", order_id)?;
    match settle(deps, t, order_id, Transition::Expire).await {
        Err(CoreError::NotFound { .. }) => Ok(Settlement::NotPending(missing_order(order_id))),
        other => other,
    }
}

/// A stand-in for an order that does not exist (an expiry timer outliving its order).
fn missing_order(order_id: &str) -> Order {
    Order {
        order_id: order_id.to_owned(),
        user_id: String::new(),
        status: OrderStatus::Cancelled,
        items: Vec::new(),
        category: None,
        market: None,
        hold_seconds: 0,
        created_at: String::new(),
        expires_at: String::new(),
        expires_ms: 0,
        request_hash: String::new(),
        updated_at: String::new(),
        paid_at: None,
        cancelled_at: None,
        cancel_reason: None,
        waiting: 0,
    }
}

/// The one place an order leaves PENDING.
async fn settle(deps: &Deps, t: &TenantId, order_id: &str, transition: Transition) -> CoreResult<Settlement> {
    check_id("order_id", order_id)?;
    let key = keys::order(t, order_id);
    let mut records: BTreeMap<String, SkuRecord> = BTreeMap::new();
    let mut attempts = Attempts::new();
    while attempts.another() {
        let Some(mut order) = load_order(deps, t, order_id).await? else {
            return Err(CoreError::NotFound { what: "order" });
        };
        let now_ms = deps.clock.now_ms();
        // A waiting order (backordered, pre-ordered) may be paid (once) or cancelled (unpaid);
        // it does not expire.
        let waiting = order.status.is_waiting();
        match (transition, order.status) {
            (_, OrderStatus::Pending) => {}
            (Transition::Pay | Transition::Cancel, s) if s.is_waiting() && order.paid_at.is_none() => {}
            (Transition::Cancel, OrderStatus::Cancelled) => return Ok(Settlement::Already(order)),
            _ => return Ok(Settlement::NotPending(order)),
        }
        let before = order.status;
        let time_cond = match transition {
            _ if waiting => None,
            Transition::Pay if now_ms >= order.expires_ms => {
                return Err(CoreError::conflict(
                    "hold_expired",
                    format!("order {order_id}'s hold expired at {}", order.expires_at),
                ));
            }
            Transition::Expire if now_ms < order.expires_ms => {
                return Ok(Settlement::NotDue { expires_ms: order.expires_ms });
            }
            Transition::Pay => Some(Cond::Cmp("expires_ms".into(), CmpOp::Gt, now_ms.into())),
            Transition::Expire => Some(Cond::Cmp("expires_ms".into(), CmpOp::Le, now_ms.into())),
            Transition::Cancel => None,
        };
        let at = now_text(deps);
        let mut updates = vec![Update::set("updated_at", at.clone())];
        let (status, kind, reason) = match transition {
            Transition::Pay => {
                updates.push(Update::set("paid_at", at.clone()));
                order.paid_at = Some(at.clone());
                (OrderStatus::Paid, LedgerKind::Sell, None)
            }
            Transition::Cancel | Transition::Expire => {
                let reason = if transition == Transition::Cancel { "cancel" } else { "expiry" };
                updates.push(Update::set("cancelled_at", at.clone()));
                updates.push(Update::set("cancel_reason", reason));
                order.cancelled_at = Some(at.clone());
                order.cancel_reason = Some(reason.to_owned());
                (OrderStatus::Cancelled, LedgerKind::Release, Some(reason.to_owned()))
            }
        };
        // A waiting order paid stays waiting (its units sold as they arrive).
        let status = if waiting && transition == Transition::Pay { before } else { status };
        updates.push(Update::set("status", status.as_str()));
        let mut conds = vec![Cond::eq("status", before.as_str())];
        conds.extend(time_cond);
        if waiting {
            conds.push(Cond::AttrNotExists("paid_at".into()));
            conds.push(super::stock::number_is("waiting", order.waiting));
        }
        let order_write = Write::Update { key: key.clone(), updates, cond: Cond::And(conds) };
        let mut lines = Vec::with_capacity(order.items.len());
        for item in &order.items {
            // A release decides "was 0" over every cell of the SKU, so it reads the SKU as it is
            // now (its locations too); a sale reads it once.
            let fresh = if kind == LedgerKind::Release { read_sku(deps, t, &item.sku_id).await? } else { None };
            if let Some(sku) = &fresh {
                records.insert(item.sku_id.clone(), sku.record.clone());
            }
            if !records.contains_key(&item.sku_id) {
                let record = read_record(deps, t, &item.sku_id).await?.ok_or_else(|| {
                    StoreError::Corrupt(format!("order {order_id} holds unknown sku {}", item.sku_id))
                })?;
                records.insert(item.sku_id.clone(), record);
            }
            lines.push((item, fresh));
        }
        // The markets a release gives units back to (docs/restock.md, "Markets").
        let all_locations = if kind == LedgerKind::Release && records.values().any(|r| !r.locations.is_empty()) {
            super::locations::all(deps, t).await?
        } else {
            Vec::new()
        };
        // The changes' writes; `rounds: false` leaves the restock round alone (see below).
        let mut set_aside: Vec<String> = Vec::new();
        let mut line_writes = |rounds: bool| -> CoreResult<Vec<Write>> {
            set_aside.clear();
            let mut writes = vec![order_write.clone()];
            for (item, fresh) in &lines {
                let Some(record) = records.get(&item.sku_id) else {
                    return Err(
                        StoreError::Corrupt(format!("order {order_id} holds unknown sku {}", item.sku_id)).into()
                    );
                };
                let mut change = StockChange::new(t, record, kind, format!("order:{order_id}"), at.clone());
                change.observed = fresh.as_ref().map(|s| s.cells.as_slice());
                change.rounds = rounds;
                if !all_locations.is_empty() && !record.locations.is_empty() {
                    let touched: Vec<&str> = item.allocations.iter().map(|a| a.location.as_str()).collect();
                    change.markets = super::locations::market_groups(&all_locations, &touched);
                }
                change.reason = reason.clone();
                change.deltas = item
                    .allocations
                    .iter()
                    .map(|a| {
                        let d = if kind == LedgerKind::Sell { Counters::sell(a.qty) } else { Counters::release(a.qty) };
                        (a.cell(), d)
                    })
                    .fold(BTreeMap::new(), |mut m: BTreeMap<CellId, Counters>, (c, d)| {
                        let e = m.entry(c).or_default();
                        *e = e.plus(d);
                        m
                    });
                if let Some(sku) = fresh {
                    let promised = sku.total();
                    let mut unfilled = promised.unfilled;
                    if item.backordered > 0 {
                        // The order's promise ends: its units not yet set aside leave
                        // `unfilled`; any set aside for it return to `available`.
                        let n = item.backordered;
                        let still = n.min(unfilled);
                        change.backordered = -n;
                        change.unfilled = -still;
                        unfilled -= still;
                        let mut surplus = n - still;
                        let mut by_most: Vec<&Cell> = sku.cells.iter().filter(|c| c.counters.allotted > 0).collect();
                        by_most.sort_by_key(|c| std::cmp::Reverse(c.counters.allotted));
                        for c in by_most {
                            let u = surplus.min(c.counters.allotted);
                            if u == 0 {
                                break;
                            }
                            let e = change.deltas.entry(c.id.clone()).or_default();
                            *e = e.plus(Counters { allotted: -u, ..Counters::new(u, 0, 0) });
                            surplus -= u;
                        }
                        writes.push(Write::Delete {
                            key: super::promises::waiting_key(t, &item.sku_id, &order),
                            cond: Cond::Always,
                        });
                    }
                    // Released units go to the SKU's other backorders first.
                    if change.allot(unfilled) > 0 {
                        set_aside.push(item.sku_id.clone());
                    }
                }
                writes.extend(change.writes()?);
            }
            Ok(writes)
        };
        let mut writes = line_writes(true)?;
        if writes.len() > MAX_TRANSACTION_WRITES {
            // The order's SKUs gained locations since it was placed, and deciding "was 0" for
            // them all no longer fits one transaction: the hold is released all the same (it
            // must never be stuck), without moving the restock round; the scheduled restock
            // scan serves the SKUs' waiters (docs/inventory.md, "Locations and markets").
            warn!(tenant = %t, order_id, "release too large to decide restock rounds; released without them");
            writes = line_writes(false)?;
        }
        let set_aside = set_aside;
        for sku_id in &set_aside {
            if writes.len() < MAX_TRANSACTION_WRITES {
                writes.push(super::promises::fill_timer(deps, t, sku_id).await?);
            }
        }
        // The `order.expired` webhook event, in the expiry's own transaction (an order at the
        // transaction's limit has no room left for it: it is then not told).
        if transition == Transition::Expire && writes.len() < MAX_TRANSACTION_WRITES {
            let data =
                serde_json::json!({"order_id": order_id, "user_id": order.user_id, "expires_at": order.expires_at});
            let event = crate::webhooks::Event::of(
                deps,
                t,
                crate::webhooks::EventType::OrderExpired,
                &[order_id, &order.created_at],
                data,
            );
            writes.extend(crate::webhooks::event_writes(deps, t, vec![event]).await?);
        }
        match deps.table.transact(writes).await {
            Ok(()) => {
                order.status = status;
                order.updated_at = at;
                for sku_id in &set_aside {
                    super::promises::fill_soon(deps, t, sku_id).await;
                }
                return Ok(Settlement::Settled(order));
            }
            // The order or a counter moved since it was read: read again and decide again.
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}
