//! Inventory without overselling (issue 4; docs/inventory.md).
//!
//! # The model
//!
//! Each SKU has three counters, `available`, `reserved` (held by PENDING orders) and `sold`
//! (and `safety` per location, see "Locations and markets" below), and a ledger. There is one
//! store only (no cache in front of the database to drift from it: a counter and its record
//! cannot part), and every change is **one transaction** that
//!
//! - moves the counters by increments (`ADD`), never by writing a computed value (which would
//!   overwrite other changes), each decrement guarded by a condition `counter >= amount`
//!   evaluated by the store at commit (there is no read-then-write window to oversell in);
//! - writes the ledger entry for that change (so the sums of a SKU's ledger deltas equal its
//!   counters, always, warm-up included);
//! - for orders, is conditioned on the order's status, so pay, cancel and expiry that race on
//!   one order commit exactly once between them, and a hold is released at most once;
//! - when it lifts `available` from 0 to more (adjustment, cancel, expiry), increments the
//!   SKU's `restock_round` on its stock item (`T#t#SKU#{sku}` / `STOCK`). The back-in-stock
//!   feature reads the change stream: a stock item whose `restock_round` grew opened a new
//!   round (unsharded SKUs also show `available` going from 0 to more in the same record).
//!   "Was 0" is not guessed: it is a condition of the transaction (every cell still at 0), and
//!   so is "was not 0" (one cell still above 0); a stale guess fails and is re-planned.
//!
//! # Locations and markets
//!
//! A counter cell is a (location, shard) ([`model::CellId`]). The `default` location's cells are
//! the items above (the stock item, or its shards), so a shop without locations, and all data
//! from before them, is the `default` location's; any other location's cell of a SKU is an item
//! of its own (`T#t#SKU#{sku}#L#{location}` / `CELL`, unsharded: only `default` shards), listed
//! on the stock item with a `layout` number bumped when one is added ([`locations`] holds the
//! locations themselves: markets and priority). Every rule above holds per cell, so per
//! location: the reservation's condition, releases by increment, the ledger entry (its split
//! names each location), expiry, pay and cancel moving exactly the cells an [`Allocation`]
//! names, reconciliation per cell. Safety stock is a `safety` counter of the location's cell,
//! outside `available`, so no reservation reaches it. An order for a market holds each line at
//! the locations serving it in priority order, split when one is short, in one transaction
//! ([`orders::place_order`]); "was 0" for the restock round is over every cell of every
//! location and conditioned on the `layout` it saw. An order whose release could need more than
//! a transaction's 100 writes (per line: every cell of its SKU, the stock item, the ledger entry)
//! is refused, 422 naming `items` (docs/inventory.md, "Locations and markets").
//!
//! # Backorders and pre-orders
//!
//! A per-SKU policy lets an order past the stock wait (BACKORDERED, or PREORDERED in a window)
//! for units promised under a limit checked at commit; stock that grows while units are promised
//! is set aside for them (`allotted`) before `available`, so only units beyond them can open a
//! restock round, and [`backorders::fill`] moves them into the waiting orders, oldest first, one
//! order per transaction ([`backorders`]; docs/inventory.md, "Backorders and pre-orders").
//!
//! Holds expire through [`crate::timers`] (not DynamoDB TTL, which can be days late): the order
//! transaction also writes a durable timer for `expires_at`, and a hold of 15 minutes or less
//! also gets a delayed message on the timers queue so it expires on time. Hold times come from
//! [`HoldTimes`] per category (not one global value), `hold_seconds` overrides.
//!
//! [`reconcile`] re-sums every SKU's ledger per SKU and per shard (totals alone hide errors that
//! cancel out), records each difference as a finding ([`findings`]: one record per difference,
//! never queued twice) and reports it, without fixing it; an operator settles the finding.
//!
//! # Hot SKUs: sharded counters
//!
//! A single DynamoDB item (and partition) takes about 1,000 writes per second; a flash-sale
//! SKU can need more. Warm-up may split a SKU's counters over `shards` (2 to [`MAX_SHARDS`])
//! shard items, each in its own partition (`T#t#SKU#{sku}#S{i}`), with the stock spread evenly.
//!
//! - **Reserve** takes the whole line from one random shard (a blind conditional write, no read);
//!   if that shard is short, it reads all shards and retries with a shard that has enough, or a
//!   split over the fullest shards; only when the shards together are short is the order
//!   refused. Every shard write carries its own `available >= qty` condition, so the SKU can
//!   never oversell, whatever the split.
//! - The order remembers which shards hold its units ([`Allocation`]); pay and release touch
//!   exactly those.
//! - Adjustments spread increases evenly and take decreases from the fullest shards.
//! - The ledger entry of a sharded SKU carries the per-shard split, so reconciliation checks
//!   each shard as well as the total.
//!
//! Limits, by design:
//! - The ledger of a SKU is one partition (`T#t#LEDGER#{sku}`), written once per change, so a
//!   sharded SKU's throughput is still bounded by that partition's write rate (about 1,000
//!   entries/s on DynamoDB; each entry is a new item, which is cheaper than contended updates
//!   of one item, and conflicts are avoided, but it is a ceiling).
//! - Going from 0 to more on a sharded SKU (rare: a sold-out SKU being restocked) needs a
//!   condition on every shard, so a release then costs `shards + 2` writes; an order with
//!   sharded SKUs therefore takes fewer SKUs than [`MAX_ORDER_SKUS`] (checked, 422).
//! - A line may end up split when shards run low; near sell-out, reservations fall back to
//!   reading all shards, so the last units of a hot SKU are slower to sell than the first.
//! - `GET /v1/inventory/{sku}` sums the shards with separate reads: it is a moment's view, not a
//!   snapshot (reconciliation waits for a quiet moment instead, see `reconcile`).
//! - The number of shards is fixed at warm-up.
//!
//! # Entry points for the runtime
//!
//! - [`reconcile`]`(deps, None)` on the daily schedule (and `POST /v1/ops/reconcile` for one
//!   tenant); findings go to the table ([`findings`]) and, when new, to the [`REVIEW_QUEUE`]
//!   queue. `GET /v1/ops/inventory-findings` lists them, `POST .../{id}/settle` settles one.
//! - Expiry runs from [`crate::timers::TimerStep`] on queue
//!   [`crate::timers::TIMERS_QUEUE`], fed by [`crate::timers::tick`] every minute.

pub mod backorders;
pub mod compare;
pub mod findings;
pub mod incoming;
pub mod keys;
pub mod locations;
pub mod model;
pub mod orders;
pub mod promises;
pub mod reconcile;
pub mod stock;

pub use backorders::{fill, put_policy};
pub use compare::Discrepancy;
pub use findings::REVIEW_QUEUE;
pub use findings::{Finding, FindingPage, FindingSettlement, FindingStatus, SettleRequest, SettlementKind};
pub use locations::{Location, LocationList, LocationRequest};
pub use model::{
    AdjustmentRequest, AdjustmentSource, Allocation, CellId, Counters, DEFAULT_LOCATION, HoldTimes, Incoming,
    IncomingRequest, IncomingStatus, LedgerEntry, LedgerKind, LocationAllocationView, LocationStockRequest,
    LocationStockView, Order, OrderItem, OrderLine, OrderLineView, OrderRequest, OrderStatus, OrderView, Preorder,
    ShardDelta, StockPolicy, StockView, WarmUpRequest,
};
pub use orders::{MAX_ORDER_SKUS, MAX_QTY, PlacedOrder, Settlement, cancel, expire_order, get_order, pay, place_order};
pub use reconcile::{ReconcileReport, reconcile};
pub use stock::{
    LedgerPage, MAX_SHARDS, adjust, all_ledger_entries, get_stock, ledger, put_location_stock, stock_counters, warm_up,
};
