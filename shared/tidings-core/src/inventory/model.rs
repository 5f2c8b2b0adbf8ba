//! The shop's words as records: stock counters, shards, ledger entries, orders and holds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;

/// The counters of a SKU (or of one of its cells: a shard, a location). `available` can be sold
/// now, `reserved` is held by PENDING orders, `sold` was paid for, `safety` is a location's safety
/// stock: on hand, never sold (docs/inventory.md, "Locations and markets"; absent when 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Counters {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub safety: i64,
    /// Units on hand set aside for backordered and pre-ordered orders, not yet moved into them
    /// (docs/inventory.md, "Backorders and pre-orders"; absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allotted: i64,
    /// The SKU's units promised to backordered and pre-ordered orders and not yet in them (kept
    /// on the SKU's stock item; a cell other than the `default` location's first has none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub backordered: i64,
    /// Of `backordered`, the units no arrival has set aside yet (`backordered - allotted`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unfilled: i64,
}

pub(crate) fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The location every shop has: its cells are the SKU's stock item and shards.
pub const DEFAULT_LOCATION: &str = "default";

pub(crate) fn default_location() -> String {
    DEFAULT_LOCATION.to_owned()
}

pub(crate) fn is_default_location(l: &str) -> bool {
    l == DEFAULT_LOCATION
}

/// One counter cell of a SKU: a shard of a location (shard 0 when the location is unsharded;
/// only `default` may be sharded).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellId {
    pub location: String,
    pub shard: u32,
}

impl CellId {
    pub fn default_shard(shard: u32) -> Self {
        Self { location: default_location(), shard }
    }

    pub fn at(location: &str) -> Self {
        Self { location: location.to_owned(), shard: 0 }
    }

    pub fn is_default(&self) -> bool {
        is_default_location(&self.location)
    }
}

impl Counters {
    pub const fn new(available: i64, reserved: i64, sold: i64) -> Self {
        Self { available, reserved, sold, safety: 0, allotted: 0, backordered: 0, unfilled: 0 }
    }

    pub fn plus(self, other: Counters) -> Counters {
        Counters {
            available: self.available.saturating_add(other.available),
            reserved: self.reserved.saturating_add(other.reserved),
            sold: self.sold.saturating_add(other.sold),
            safety: self.safety.saturating_add(other.safety),
            allotted: self.allotted.saturating_add(other.allotted),
            backordered: self.backordered.saturating_add(other.backordered),
            unfilled: self.unfilled.saturating_add(other.unfilled),
        }
    }

    /// Units on hand: available, held, set aside for backorders and safety stock (sold units
    /// have left).
    pub fn on_hand(self) -> i64 {
        self.available.saturating_add(self.reserved).saturating_add(self.safety).saturating_add(self.allotted)
    }

    /// A reservation of `qty`: available → reserved.
    pub const fn reserve(qty: i64) -> Counters {
        Counters::new(-qty, qty, 0)
    }

    /// A sale of held units: reserved → sold.
    pub const fn sell(qty: i64) -> Counters {
        Counters::new(0, -qty, qty)
    }

    /// A release of held units: reserved → available.
    pub const fn release(qty: i64) -> Counters {
        Counters::new(qty, -qty, 0)
    }
}

/// The SKU's stock item (`STOCK`). Unsharded, it carries the counters itself; sharded
/// (`shards >= 2`), the counters live in the shard items and this item keeps the rest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct SkuRecord {
    pub sku_id: String,
    /// 0 or 1: unsharded; N >= 2: N shard items.
    #[serde(default)]
    pub shards: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Incremented in the same transaction whenever the SKU's available goes from 0 to more.
    #[serde(default)]
    pub restock_round: i64,
    /// The locations other than `default` that hold a cell of this SKU, in the order added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<String>,
    /// Bumped whenever a location's cell is added (a "was 0" decision is conditioned on it, so a
    /// cell added since the observation fails it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<i64>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sold: Option<i64>,
    /// The default location's safety stock (unsharded SKUs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<i64>,
    /// Bumped by every change of the counters (reconciliation uses it to see a quiet moment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// The default location's units set aside for backorders (unsharded SKUs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allotted: Option<i64>,
    /// Units promised to backordered and pre-ordered orders and not yet in them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backordered: Option<i64>,
    /// Of `backordered`, the units no arrival has set aside yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfilled: Option<i64>,
    /// The policy (docs/inventory.md, "Backorders and pre-orders"): how many units may be
    /// backordered, and a pre-order window with its own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backorder_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preorder_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preorder_limit: Option<i64>,
}

impl SkuRecord {
    /// A new SKU's stock item: `shards` shard items (0 or 1: unsharded, the counters here, with
    /// `on_hand` available), nothing else set yet.
    pub fn new(sku_id: &str, shards: u32, category: Option<String>, on_hand: i64, created_at: String) -> Self {
        let sharded = shards >= 2;
        Self {
            sku_id: sku_id.to_owned(),
            shards: if sharded { shards } else { 0 },
            category,
            restock_round: 0,
            locations: Vec::new(),
            layout: None,
            created_at,
            available: (!sharded).then_some(on_hand),
            reserved: (!sharded).then_some(0),
            sold: (!sharded).then_some(0),
            safety: None,
            version: (!sharded).then_some(1),
            allotted: None,
            backordered: None,
            unfilled: None,
            backorder_limit: None,
            preorder_until: None,
            preorder_limit: None,
        }
    }

    pub fn is_sharded(&self) -> bool {
        self.shards >= 2
    }

    /// How many counter cells the `default` location has (1 when unsharded).
    pub fn cell_count(&self) -> u32 {
        if self.is_sharded() { self.shards } else { 1 }
    }

    /// Every counter cell of the SKU: the default location's, then one per other location.
    pub fn cell_ids(&self) -> Vec<CellId> {
        let mut out: Vec<CellId> = (0..self.cell_count()).map(CellId::default_shard).collect();
        out.extend(self.locations.iter().map(|l| CellId::at(l)));
        out
    }

    /// Whether the SKU has a cell at `location`.
    pub fn has_location(&self, location: &str) -> bool {
        is_default_location(location) || self.locations.iter().any(|l| l == location)
    }
}

/// A location's cell of a SKU (any location but `default`, whose cells are the stock item and
/// its shards): `T#t#SKU#{sku}#L#{location}` / `CELL`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct LocationCellRecord {
    pub sku_id: String,
    pub location: String,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    #[serde(default)]
    pub safety: i64,
    #[serde(default)]
    pub allotted: i64,
    pub version: i64,
}

/// One shard of a sharded SKU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ShardRecord {
    pub sku_id: String,
    pub shard: u32,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    #[serde(default)]
    pub allotted: i64,
    pub version: i64,
}

/// One location's counters of a SKU, as `GET /v1/inventory/{sku_id}` lists them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LocationStockView {
    pub location_id: String,
    /// Sellable now (safety stock is not in it).
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    /// Units kept back, never sold.
    pub safety_stock: i64,
    /// Units arrived here and set aside for backordered orders, not yet in them (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allotted: i64,
    /// available + reserved + safety_stock + allotted.
    pub on_hand: i64,
}

/// What `GET /v1/inventory/{sku_id}` answers: the sums over the SKU's locations, and (when it
/// has locations besides `default`) each location's counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StockView {
    pub sku_id: String,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub restock_round: i64,
    pub shards: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The safety stock summed over the locations (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub safety_stock: i64,
    /// Each location's counters, `default` first (absent for a SKU held at `default` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<LocationStockView>,
    /// Stock on its way, the soonest first (docs/inventory.md, "Incoming stock"); absent when
    /// nothing is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incoming: Vec<Incoming>,
    /// Units promised to backordered and pre-ordered orders, not yet in them (docs/inventory.md,
    /// "Backorders and pre-orders"); shown when the SKU has a policy or promised units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backordered: Option<i64>,
    /// Of those, units that have arrived and are being moved into their orders (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allotted: i64,
    /// The backorder and pre-order policy (absent: none, orders past the stock are refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<StockPolicy>,
}

impl StockView {
    pub fn counters(&self) -> Counters {
        Counters {
            safety: self.safety_stock,
            allotted: self.allotted,
            backordered: self.backordered.unwrap_or(0),
            ..Counters::new(self.available, self.reserved, self.sold)
        }
    }
}

/// A SKU's backorder and pre-order policy: the body of `PUT /v1/inventory/{sku_id}/policy`, and
/// what `GET /v1/inventory/{sku_id}` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StockPolicy {
    /// How many units may be backordered at once (absent or 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backorder_limit: Option<i64>,
    /// A pre-order window: until `until`, orders past the stock are PREORDERED, up to `limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preorder: Option<Preorder>,
}

/// A pre-order window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Preorder {
    /// The end of the window (RFC 3339, in the future when set).
    pub until: String,
    /// How many units may be pre-ordered at once.
    pub limit: i64,
}

/// What made a ledger entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LedgerKind {
    WarmUp,
    Adjustment,
    Reserve,
    Sell,
    Release,
    /// Written alone (no counter moves) when an operator settles a reconciliation finding with
    /// a corrective entry: it makes the ledger agree with the counters.
    Correction,
    /// A location's safety stock set: units moved between `available` and `safety`.
    SafetyStock,
    /// Units set aside for backorders moved into a waiting order (docs/inventory.md,
    /// "Backorders and pre-orders").
    Fill,
}

/// Where an adjustment's stock came from or went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AdjustmentSource {
    PurchaseOrder,
    Return,
    Transfer,
    Manual,
    Damage,
}

impl AdjustmentSource {
    pub fn parse(value: &str) -> Result<Self, CoreError> {
        match value {
            "purchase_order" => Ok(Self::PurchaseOrder),
            "return" => Ok(Self::Return),
            "transfer" => Ok(Self::Transfer),
            "manual" => Ok(Self::Manual),
            "damage" => Ok(Self::Damage),
            _ => Err(CoreError::invalid("source", "must be purchase_order, return, transfer, manual or damage")),
        }
    }
}

/// The part of a ledger entry that touched one cell (a shard, or a location's cell).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShardDelta {
    /// The location (absent: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub shard: u32,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub safety: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allotted: i64,
}

impl ShardDelta {
    pub fn of(cell: &CellId, d: Counters) -> Self {
        ShardDelta {
            location: (!cell.is_default()).then(|| cell.location.clone()),
            shard: cell.shard,
            available: d.available,
            reserved: d.reserved,
            sold: d.sold,
            safety: d.safety,
            allotted: d.allotted,
        }
    }

    pub fn cell(&self) -> CellId {
        CellId { location: self.location.clone().unwrap_or_else(default_location), shard: self.shard }
    }

    pub fn delta(&self) -> Counters {
        Counters {
            safety: self.safety,
            allotted: self.allotted,
            ..Counters::new(self.available, self.reserved, self.sold)
        }
    }
}

/// One line of the stock ledger (docs/inventory.md, "The ledger"): written in the same transaction
/// as the counter change it records, so the sums of an SKU's deltas always equal its counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerEntry {
    pub entry_id: String,
    pub sku_id: String,
    pub delta_available: i64,
    pub delta_reserved: i64,
    pub delta_sold: i64,
    /// Units moved into (or out of) safety stock (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delta_safety: i64,
    /// Units set aside for backorders (absent when 0; per cell in `shards` when split).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delta_allotted: i64,
    /// The SKU's units promised to backordered orders (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delta_backordered: i64,
    /// Of those, the units not yet set aside (absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delta_unfilled: i64,
    /// The location the change touched, when it touched one location other than `default`
    /// (a change over several locations names each in `shards`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub kind: LedgerKind,
    #[serde(rename = "ref")]
    pub reference: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<AdjustmentSource>,
    /// For releases: `cancel` or `expiry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Per-cell split, for sharded SKUs and for changes at a location other than `default`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardDelta>,
    pub at: String,
}

impl LedgerEntry {
    pub fn delta(&self) -> Counters {
        Counters {
            safety: self.delta_safety,
            allotted: self.delta_allotted,
            backordered: self.delta_backordered,
            unfilled: self.delta_unfilled,
            ..Counters::new(self.delta_available, self.delta_reserved, self.delta_sold)
        }
    }

    /// The entry's deltas per counter cell (the default location's cell 0 for an unsharded SKU).
    /// The SKU's `backordered` and `unfilled` count on the default location's cell 0 (the stock
    /// item holds them).
    pub fn cell_deltas(&self) -> Vec<(CellId, Counters)> {
        let mut out: Vec<(CellId, Counters)> = if self.shards.is_empty() {
            let cell = self.location.as_deref().map_or_else(|| CellId::default_shard(0), CellId::at);
            vec![(cell, Counters { backordered: 0, unfilled: 0, ..self.delta() })]
        } else {
            self.shards.iter().map(|s| (s.cell(), s.delta())).collect()
        };
        if self.delta_backordered != 0 || self.delta_unfilled != 0 {
            let promised =
                Counters { backordered: self.delta_backordered, unfilled: self.delta_unfilled, ..Counters::default() };
            out.push((CellId::default_shard(0), promised));
        }
        out
    }
}

/// An order's state: PENDING holds stock, PAID sold it, CANCELLED released it; BACKORDERED and
/// PREORDERED wait for units past the stock (docs/inventory.md, "Backorders and pre-orders").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    Pending,
    Paid,
    Cancelled,
    Backordered,
    Preordered,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "PENDING",
            OrderStatus::Paid => "PAID",
            OrderStatus::Cancelled => "CANCELLED",
            OrderStatus::Backordered => "BACKORDERED",
            OrderStatus::Preordered => "PREORDERED",
        }
    }

    /// Whether the order waits for units to arrive.
    pub fn is_waiting(self) -> bool {
        matches!(self, OrderStatus::Backordered | OrderStatus::Preordered)
    }
}

/// Units of one order line held in one counter cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The location (orders stored before locations existed read as `default`).
    #[serde(default = "default_location", skip_serializing_if = "is_default_str")]
    pub location: String,
    pub shard: u32,
    pub qty: i64,
}

fn is_default_str(l: &str) -> bool {
    is_default_location(l)
}

impl Allocation {
    pub fn cell(&self) -> CellId {
        CellId { location: self.location.clone(), shard: self.shard }
    }
}

/// One line of an order, with where its hold sits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrderItem {
    pub sku_id: String,
    pub qty: i64,
    /// The price of one unit, an exact decimal ("19.99"): what back-in-stock alerts earned is
    /// summed from it (docs/restock.md, "What alerts earn").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_price: Option<String>,
    /// The cells the units are held in (one entry, shard 0, when unsharded).
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    /// Units of the line still waiting to arrive (backordered or pre-ordered; absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub backordered: i64,
}

/// The stored order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub user_id: String,
    pub status: OrderStatus,
    pub items: Vec<OrderItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// The market the order was held for (absent: any location).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
    pub hold_seconds: i64,
    pub created_at: String,
    pub expires_at: String,
    pub expires_ms: i64,
    pub request_hash: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<String>,
    /// `cancel` or `expiry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// The units of all lines still waiting to arrive (each fill lowers it: a fill or cancel
    /// is conditioned on the value it saw).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waiting: i64,
}

/// Units of an order line held at one location.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LocationAllocationView {
    pub location_id: String,
    pub qty: i64,
}

/// One line of an order as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderLineView {
    pub sku_id: String,
    pub qty: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_price: Option<String>,
    /// Where the line's units are held (or were sold from), per location.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<LocationAllocationView>,
    /// Units still waiting to arrive (backordered or pre-ordered; absent when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub backordered: i64,
}

impl From<&OrderItem> for OrderLineView {
    fn from(i: &OrderItem) -> Self {
        let mut allocations: Vec<LocationAllocationView> = Vec::new();
        for a in &i.allocations {
            match allocations.iter_mut().find(|v| v.location_id == a.location) {
                Some(v) => v.qty += a.qty,
                None => allocations.push(LocationAllocationView { location_id: a.location.clone(), qty: a.qty }),
            }
        }
        OrderLineView {
            sku_id: i.sku_id.clone(),
            qty: i.qty,
            unit_price: i.unit_price.clone(),
            allocations,
            backordered: i.backordered,
        }
    }
}

/// What `GET /v1/orders/{order_id}` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderView {
    pub order_id: String,
    pub user_id: String,
    pub status: OrderStatus,
    pub items: Vec<OrderLineView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
    pub hold_seconds: i64,
    pub created_at: String,
    pub expires_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
}

impl From<&Order> for OrderView {
    fn from(o: &Order) -> Self {
        OrderView {
            order_id: o.order_id.clone(),
            user_id: o.user_id.clone(),
            status: o.status,
            items: o.items.iter().map(OrderLineView::from).collect(),
            market: o.market.clone(),
            hold_seconds: o.hold_seconds,
            created_at: o.created_at.clone(),
            expires_at: o.expires_at.clone(),
            paid_at: o.paid_at.clone(),
            cancelled_at: o.cancelled_at.clone(),
            cancel_reason: o.cancel_reason.clone(),
        }
    }
}

/// The body of `PUT /v1/inventory/{sku_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmUpRequest {
    pub on_hand: i64,
    /// Shard the counter over this many items (2..=16) for a hot SKU; absent or 1: one item.
    #[serde(default)]
    pub shards: Option<u32>,
    /// The SKU's category, which chooses its hold time (e.g. `promotion`).
    #[serde(default)]
    pub category: Option<String>,
}

/// The body of `POST /v1/inventory/{sku_id}/adjustments`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdjustmentRequest {
    pub delta: i64,
    pub source: String,
    /// Required, here or as the `Idempotency-Key` header.
    #[serde(default)]
    pub idempotency_key: String,
    /// With `source: purchase_order`: the incoming shipment this is the arrival of, which it
    /// closes (`POST /v1/inventory/{sku_id}/incoming`).
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The location whose stock moves (absent: `default`); it must hold a cell of the SKU
    /// (`PUT /v1/inventory/{sku_id}/locations/{location_id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_id: Option<String>,
}

impl AdjustmentRequest {
    /// An adjustment of `delta` units at `default`, from `source`, applied once per `idempotency_key`.
    pub fn new(delta: i64, source: &str, idempotency_key: &str) -> Self {
        Self {
            delta,
            source: source.to_owned(),
            idempotency_key: idempotency_key.to_owned(),
            reference: None,
            location_id: None,
        }
    }
}

/// One line of `POST /v1/orders`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderLine {
    pub sku_id: String,
    pub qty: i64,
    /// The price of one unit as a decimal string, at most 9 digits before the point and 4
    /// after it ("19.99"); optional. Summed exactly into what alerts earned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_price: Option<String>,
}

/// The body of `POST /v1/orders`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    pub order_id: String,
    pub user_id: String,
    pub items: Vec<OrderLine>,
    #[serde(default)]
    pub hold_seconds: Option<i64>,
    /// Overrides the SKUs' categories for the hold time.
    #[serde(default)]
    pub category: Option<String>,
    /// The market (ISO 3166-1 alpha-2, e.g. `US`): each line is held at the locations serving
    /// it, in their priority order (absent: any location, `default` first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub market: Option<String>,
}

/// The body of `PUT /v1/inventory/{sku_id}/locations/{location_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocationStockRequest {
    /// Units on hand at the location when its cell is created (available + safety stock); a
    /// cell that exists keeps its stock (adjustments move it).
    pub on_hand: i64,
    /// Units kept back at the location, never sold: moved out of (or back into) `available`.
    #[serde(default)]
    pub safety_stock: Option<i64>,
}

/// How long an unpaid order holds its stock, per category: promotion items 15 minutes, ordinary
/// ones 30; one global value would cancel slow payers (docs/inventory.md, "Holds expire").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldTimes {
    pub default: Duration,
    pub by_category: BTreeMap<String, Duration>,
}

impl Default for HoldTimes {
    fn default() -> Self {
        Self {
            default: Duration::from_secs(30 * 60),
            by_category: BTreeMap::from([("promotion".to_owned(), Duration::from_secs(15 * 60))]),
        }
    }
}

impl HoldTimes {
    /// Parses `default=1800,promotion=900` (seconds per category; `default` for the rest).
    pub fn parse(spec: &str) -> Result<Self, CoreError> {
        let mut out = HoldTimes { default: HoldTimes::default().default, by_category: BTreeMap::new() };
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, secs)) = part.split_once('=') else {
                return Err(CoreError::invalid("hold_times", format!("{part:?} is not category=seconds")));
            };
            let secs: u64 =
                secs.trim().parse().ok().filter(|s| (1..=MAX_HOLD_SECONDS as u64).contains(s)).ok_or_else(|| {
                    CoreError::invalid("hold_times", format!("{part:?}: seconds must be 1 to {MAX_HOLD_SECONDS}"))
                })?;
            let name = name.trim();
            if name == "default" {
                out.default = Duration::from_secs(secs);
            } else {
                out.by_category.insert(name.to_owned(), Duration::from_secs(secs));
            }
        }
        Ok(out)
    }

    pub fn for_category(&self, category: Option<&str>) -> Duration {
        category.and_then(|c| self.by_category.get(c)).copied().unwrap_or(self.default)
    }
}

/// The largest stock figure accepted (on hand, an adjustment's delta, a shipment).
pub const MAX_UNITS: i64 = 1_000_000_000_000;

/// The longest hold an order may ask for (7 days).
pub const MAX_HOLD_SECONDS: i64 = 7 * 24 * 3600;

/// A shipment's state: on its way, or arrived (closed by its purchase order's adjustment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum IncomingStatus {
    Expected,
    Received,
}

/// The body of `POST /v1/inventory/{sku_id}/incoming`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingRequest {
    /// Where the units will arrive (`default` when the shop has no locations).
    #[serde(default = "default_location")]
    pub location_id: String,
    pub qty: i64,
    /// When they are expected (RFC 3339).
    pub expected_at: String,
    /// The shop's reference of the shipment (its purchase order): the arrival's adjustment names it.
    #[serde(rename = "ref")]
    pub reference: String,
}

/// Stock on its way, as stored and shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Incoming {
    #[serde(rename = "ref")]
    pub reference: String,
    pub sku_id: String,
    pub location_id: String,
    pub qty: i64,
    pub expected_at: String,
    pub status: IncomingStatus,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<String>,
    /// The units the arrival's adjustment added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_qty: Option<i64>,
}
