//! Stock: warm-up, adjustments, reads, and [`StockChange`], the one way any counter moves.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::keys;
use super::model::{
    AdjustmentRequest, AdjustmentSource, CellId, Counters, LedgerEntry, LedgerKind, LocationCellRecord,
    LocationStockRequest, LocationStockView, ShardDelta, ShardRecord, SkuRecord, StockView, WarmUpRequest,
    is_default_location,
};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id, new_id};
use crate::ports::{Cond, Item, Key, QueryOpts, StoreError, Update, Write, attrs_of};

/// The most shards a hot SKU may have (each sharded SKU in an order costs `shards + 2` writes
/// of DynamoDB's 100 per transaction when its hold is released).
pub const MAX_SHARDS: u32 = 16;
pub use super::model::MAX_UNITS;
/// How often a change is re-planned after a condition on a stale observation failed.
pub(crate) const MAX_ATTEMPTS: usize = 16;
/// How long one call keeps re-planning. Each write already retries DynamoDB's transaction
/// conflicts for up to its own budget (`ConflictRetry`, 3 s), so the attempts of a hot SKU
/// could otherwise add up to more than the 29 s API Gateway gives a request: past this the
/// caller gets 409 `write_conflict` with `Retry-After` while there is time left to answer.
pub(crate) const REPLAN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The attempts of one change: at most [`MAX_ATTEMPTS`], none started after [`REPLAN_DEADLINE`].
pub(crate) struct Attempts {
    started: std::time::Instant,
    deadline: std::time::Duration,
    made: usize,
}

impl Attempts {
    pub(crate) fn new() -> Self {
        Self::within(REPLAN_DEADLINE)
    }

    fn within(deadline: std::time::Duration) -> Self {
        Self { started: std::time::Instant::now(), deadline, made: 0 }
    }

    /// Whether another attempt may start (the first always does).
    pub(crate) fn another(&mut self) -> bool {
        let go = self.made == 0 || (self.made < MAX_ATTEMPTS && self.started.elapsed() < self.deadline);
        self.made += 1;
        go
    }
}

pub(crate) fn now_text(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// One counter cell of a SKU: the stock item itself when unsharded, else one shard item; or a
/// location's cell.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cell {
    pub id: CellId,
    pub key: Key,
    pub counters: Counters,
    pub version: i64,
}

/// A SKU as read: its stock item and (when asked for) its cells.
#[derive(Clone, Debug)]
pub(crate) struct Sku {
    pub record: SkuRecord,
    pub cells: Vec<Cell>,
}

impl Sku {
    pub fn total(&self) -> Counters {
        self.cells.iter().fold(Counters::default(), |acc, c| acc.plus(c.counters))
    }

    /// The counters of one location's cells.
    pub fn at(&self, location: &str) -> Counters {
        self.cells.iter().filter(|c| c.id.location == location).fold(Counters::default(), |acc, c| acc.plus(c.counters))
    }

    pub fn view(&self) -> StockView {
        let total = self.total();
        let mut locations = Vec::new();
        if !self.record.locations.is_empty() {
            let names =
                std::iter::once(super::model::DEFAULT_LOCATION).chain(self.record.locations.iter().map(String::as_str));
            for l in names {
                let c = self.at(l);
                locations.push(LocationStockView {
                    location_id: l.to_owned(),
                    available: c.available,
                    reserved: c.reserved,
                    sold: c.sold,
                    safety_stock: c.safety,
                    allotted: c.allotted,
                    on_hand: c.on_hand(),
                });
            }
        }
        let policy = super::promises::policy_of(&self.record);
        StockView {
            sku_id: self.record.sku_id.clone(),
            available: total.available,
            reserved: total.reserved,
            sold: total.sold,
            restock_round: self.record.restock_round,
            shards: self.record.cell_count(),
            category: self.record.category.clone(),
            safety_stock: total.safety,
            locations,
            incoming: Vec::new(),
            backordered: (policy.is_some() || total.backordered != 0).then_some(total.backordered),
            allotted: total.allotted,
            policy,
        }
    }
}

/// The key of a cell of a SKU.
pub(crate) fn cell_key(t: &TenantId, record: &SkuRecord, cell: &CellId) -> Key {
    if !cell.is_default() {
        keys::location_cell(t, &record.sku_id, &cell.location)
    } else if record.is_sharded() {
        keys::shard(t, &record.sku_id, cell.shard)
    } else {
        keys::stock(t, &record.sku_id)
    }
}

/// A condition that a number attribute equals `n`, where a missing attribute counts as 0.
pub(crate) fn number_is(name: &str, n: i64) -> Cond {
    if n == 0 { Cond::Or(vec![Cond::AttrNotExists(name.into()), Cond::eq(name, 0)]) } else { Cond::eq(name, n) }
}

pub(crate) async fn read_record(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<SkuRecord>> {
    match deps.table.get(&keys::stock(t, sku_id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

/// Reads a SKU with the current value of every cell.
pub(crate) async fn read_sku(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<Sku>> {
    let Some(record) = read_record(deps, t, sku_id).await? else { return Ok(None) };
    let cells = read_cells(deps, t, &record).await?;
    Ok(Some(Sku { record, cells }))
}

/// Reads every cell of the SKU as `record` knows them (the default location's, then each other
/// location's).
pub(crate) async fn read_cells(deps: &Deps, t: &TenantId, record: &SkuRecord) -> CoreResult<Vec<Cell>> {
    let ids = record.cell_ids();
    let reads = ids.into_iter().map(|id| {
        let key = cell_key(t, record, &id);
        async move {
            let got = deps.table.get(&key).await;
            (id, key, got)
        }
    });
    let mut cells = Vec::new();
    for (id, key, got) in futures::future::join_all(reads).await {
        let Some(item) = got? else {
            if id.is_default() && !record.is_sharded() {
                return Err(CoreError::NotFound { what: "sku" });
            }
            return Err(StoreError::Corrupt(format!("{}/{}: cell missing", key.pk, key.sk)).into());
        };
        let (counters, version) = if !id.is_default() {
            let c: LocationCellRecord = item.parse()?;
            let counters = Counters::new(c.available, c.reserved, c.sold);
            (Counters { safety: c.safety, allotted: c.allotted, ..counters }, c.version)
        } else if record.is_sharded() {
            let s: ShardRecord = item.parse()?;
            (Counters { allotted: s.allotted, ..Counters::new(s.available, s.reserved, s.sold) }, s.version)
        } else {
            // Read again: the caller's record may be older than this moment.
            let r: SkuRecord = item.parse()?;
            let c = Counters::new(r.available.unwrap_or(0), r.reserved.unwrap_or(0), r.sold.unwrap_or(0));
            let c = Counters {
                safety: r.safety.unwrap_or(0),
                allotted: r.allotted.unwrap_or(0),
                backordered: r.backordered.unwrap_or(0),
                unfilled: r.unfilled.unwrap_or(0),
                ..c
            };
            (c, r.version.unwrap_or(0))
        };
        cells.push(Cell { id, key, counters, version });
    }
    // A sharded SKU's promised units live on its stock item (as `record` has it): they count
    // on cell 0.
    if record.is_sharded()
        && let Some(first) = cells.first_mut()
    {
        first.counters.backordered = record.backordered.unwrap_or(0);
        first.counters.unfilled = record.unfilled.unwrap_or(0);
    }
    Ok(cells)
}

/// One change to one SKU's counters, as a list of transaction writes: every touched cell is
/// updated by increments (`Add`, never a `Set` of a computed value, which would overwrite
/// other orders' changes), each decrement is guarded by a `>=` condition checked at commit (no
/// read-then-write window to oversell in), the ledger entry goes in the same transaction (so
/// counter and ledger cannot drift apart; docs/inventory.md, "Never oversell"), and a change that
/// lifts available from 0 increments `restock_round` in that transaction too.
pub(crate) struct StockChange<'a> {
    pub tenant: &'a TenantId,
    pub record: &'a SkuRecord,
    /// The cells as last read, needed when available grows (to know whether it was 0).
    pub observed: Option<&'a [Cell]>,
    pub deltas: BTreeMap<CellId, Counters>,
    pub kind: LedgerKind,
    pub reference: String,
    pub source: Option<AdjustmentSource>,
    pub reason: Option<String>,
    pub at: String,
    /// A location's cell this change creates: put whole, its delta as its first counters.
    pub created: Option<CellId>,
    /// More conditions on cells (a safety stock change is conditioned on the safety it saw).
    pub cell_conds: Vec<(CellId, Cond)>,
    /// More updates and conditions of the SKU's stock item (a location added to its layout).
    pub header: Vec<Update>,
    pub header_conds: Vec<Cond>,
    /// Whether growing stock decides the restock round (true but for a release too large for
    /// one transaction otherwise, see `orders::settle`).
    pub rounds: bool,
    /// For each market a location this change adds to serves, the locations serving it
    /// (`locations::market_groups`): a market that had none available opens a round too, though
    /// the SKU had some elsewhere (docs/restock.md, "Markets").
    pub markets: Vec<Vec<String>>,
    /// The change of the SKU's promised units (`backordered`) and of those not yet set aside
    /// (`unfilled`), both on the stock item (docs/inventory.md, "Backorders and pre-orders").
    pub backordered: i64,
    pub unfilled: i64,
}

impl<'a> StockChange<'a> {
    /// A change with no observation, no deltas yet, nothing created and nothing more on the
    /// stock item.
    pub fn new(tenant: &'a TenantId, record: &'a SkuRecord, kind: LedgerKind, reference: String, at: String) -> Self {
        StockChange {
            tenant,
            record,
            observed: None,
            deltas: BTreeMap::new(),
            kind,
            reference,
            source: None,
            reason: None,
            at,
            created: None,
            cell_conds: Vec::new(),
            header: Vec::new(),
            header_conds: Vec::new(),
            rounds: true,
            markets: Vec::new(),
            backordered: 0,
            unfilled: 0,
        }
    }

    /// Sets aside up to `want` of the units this change adds to `available` for the SKU's
    /// backorders: they go to `allotted` instead (in the same cells), and `unfilled` goes down
    /// by as many (conditioned at commit: never more than are promised). Returns how many.
    pub fn allot(&mut self, want: i64) -> i64 {
        let mut left = want.max(0);
        let mut taken = 0;
        for d in self.deltas.values_mut() {
            if left == 0 {
                break;
            }
            let n = left.min(d.available.max(0));
            d.available -= n;
            d.allotted += n;
            left -= n;
            taken += n;
        }
        self.unfilled -= taken;
        taken
    }

    pub fn total(&self) -> Counters {
        self.deltas.values().fold(Counters::default(), |acc, d| acc.plus(*d))
    }

    /// The most writes a release of this SKU can take: a condition on each of its cells (all
    /// locations' shards, to know its available was 0), the stock item and the ledger entry
    /// (see [`MAX_SHARDS`] and docs/inventory.md, "Locations and markets").
    pub fn release_budget(record: &SkuRecord) -> usize {
        if record.is_sharded() || !record.locations.is_empty() { record.cell_ids().len() + 2 } else { 2 }
    }

    pub fn ledger_entry(&self) -> LedgerEntry {
        let total = self.total();
        let one_plain_cell = self.deltas.len() == 1
            && self.deltas.keys().all(|c| c.shard == 0 && (!c.is_default() || !self.record.is_sharded()));
        let shards =
            if one_plain_cell { Vec::new() } else { self.deltas.iter().map(|(c, d)| ShardDelta::of(c, *d)).collect() };
        let mut places = self.deltas.keys().map(|c| c.location.as_str());
        let first = places.next();
        let location = first.filter(|l| !is_default_location(l) && places.all(|p| p == *l)).map(str::to_owned);
        LedgerEntry {
            entry_id: new_id(),
            sku_id: self.record.sku_id.clone(),
            delta_available: total.available,
            delta_reserved: total.reserved,
            delta_sold: total.sold,
            delta_safety: total.safety,
            delta_allotted: total.allotted,
            delta_backordered: self.backordered,
            delta_unfilled: self.unfilled,
            location,
            kind: self.kind,
            reference: self.reference.clone(),
            source: self.source,
            reason: self.reason.clone(),
            shards,
            at: self.at.clone(),
        }
    }

    /// The writes of this change. Whether the restock round moves is decided from the
    /// observation and made true by conditions: "was 0" holds only if every cell still has 0
    /// available when the transaction commits, "was not 0" only if the chosen cell still has
    /// some. A stale observation fails the transaction, and the caller reads and tries again.
    pub fn writes(&self) -> CoreResult<Vec<Write>> {
        let mut cells: BTreeMap<CellId, (Vec<Update>, Vec<Cond>)> = BTreeMap::new();
        for (id, d) in &self.deltas {
            if self.created.as_ref() == Some(id) {
                continue;
            }
            let (updates, conds) = cells.entry(id.clone()).or_default();
            conds.push(Cond::Exists);
            for (name, delta) in [
                ("available", d.available),
                ("reserved", d.reserved),
                ("sold", d.sold),
                ("safety", d.safety),
                ("allotted", d.allotted),
            ] {
                if delta != 0 {
                    updates.push(Update::add(name, delta));
                }
                if delta < 0 {
                    conds.push(Cond::ge(name, -delta));
                }
            }
            updates.push(Update::add("version", 1));
            updates.push(Update::set("updated_at", self.at.clone()));
        }
        for (id, cond) in &self.cell_conds {
            cells.entry(id.clone()).or_default().1.push(cond.clone());
        }
        let mut restock = false;
        if self.rounds && self.total().available > 0 {
            let observed =
                self.observed.ok_or_else(|| StoreError::Invalid("stock grows without an observation".into()))?;
            let was_empty = observed.iter().all(|c| c.counters.available <= 0);
            if was_empty {
                restock = true;
                for c in observed {
                    cells.entry(c.id.clone()).or_default().1.push(Cond::eq("available", 0));
                }
            } else {
                let touched = observed.iter().find(|c| c.counters.available > 0 && self.deltas.contains_key(&c.id));
                let witness = touched.or_else(|| observed.iter().find(|c| c.counters.available > 0));
                if let Some(c) = witness {
                    cells.entry(c.id.clone()).or_default().1.push(Cond::ge("available", 1));
                }
                // A market this change adds to that had none available: a round opens for its
                // subscribers; made true by the same kind of conditions, per market.
                for group in &self.markets {
                    let in_group: Vec<&Cell> = observed.iter().filter(|c| group.contains(&c.id.location)).collect();
                    // No cell yet (a location's first stock): the market had none either.
                    if in_group.iter().all(|c| c.counters.available <= 0) {
                        restock = true;
                        for c in in_group {
                            cells.entry(c.id.clone()).or_default().1.push(Cond::eq("available", 0));
                        }
                    } else if let Some(c) = in_group.iter().find(|c| c.counters.available > 0) {
                        cells.entry(c.id.clone()).or_default().1.push(Cond::ge("available", 1));
                    }
                }
            }
        }
        // What the stock item gets besides its counters: the round, and the layout (the set of
        // locations) the "was 0" decision saw, so a location's cell added since fails it.
        let mut header = self.header.clone();
        let mut header_conds = self.header_conds.clone();
        for (name, delta) in [("backordered", self.backordered), ("unfilled", self.unfilled)] {
            if delta != 0 {
                header.push(Update::add(name, delta));
            }
            if delta < 0 {
                header_conds.push(Cond::ge(name, -delta));
            }
        }
        let stock_is_cell = !self.record.is_sharded() && self.deltas.contains_key(&CellId::default_shard(0));
        if (self.backordered != 0 || self.unfilled != 0) && !self.record.is_sharded() && !stock_is_cell {
            // The stock item is the default cell: its version marks the change for reconciliation.
            header.push(Update::add("version", 1));
        }
        if restock {
            header.push(Update::add("restock_round", 1));
            let layout = number_is("layout", self.record.layout.unwrap_or(0));
            if !header_conds.contains(&layout) {
                header_conds.push(layout);
            }
        }
        let mut writes = Vec::with_capacity(cells.len() + 3);
        let stock_key = keys::stock(self.tenant, &self.record.sku_id);
        let mut header_written = false;
        for (id, (mut updates, mut conds)) in cells {
            let key = cell_key(self.tenant, self.record, &id);
            if key == stock_key {
                updates.append(&mut header);
                conds.append(&mut header_conds);
                header_written = true;
            }
            let cond = Cond::And(conds);
            writes.push(if updates.is_empty() {
                Write::Check { key, cond }
            } else {
                Write::Update { key, updates, cond }
            });
        }
        if !header_written && (!header.is_empty() || !header_conds.is_empty()) {
            header.push(Update::set("updated_at", self.at.clone()));
            header_conds.insert(0, Cond::Exists);
            writes.push(Write::Update { key: stock_key, updates: header, cond: Cond::And(header_conds) });
        }
        if let Some(id) = &self.created {
            let d = self.deltas.get(id).copied().unwrap_or_default();
            let cell = LocationCellRecord {
                sku_id: self.record.sku_id.clone(),
                location: id.location.clone(),
                available: d.available,
                reserved: d.reserved,
                sold: d.sold,
                safety: d.safety,
                allotted: d.allotted,
                version: 1,
            };
            writes.push(Write::Put {
                item: Item::new(cell_key(self.tenant, self.record, id), attrs_of(&cell)?),
                cond: Cond::NotExists,
            });
        }
        let entry = self.ledger_entry();
        writes.push(Write::Put {
            item: Item::new(keys::ledger_entry(self.tenant, &self.record.sku_id, &entry.entry_id), attrs_of(&entry)?),
            cond: Cond::NotExists,
        });
        Ok(writes)
    }
}

/// Splits `units` over `n` cells as evenly as possible (cells that would get 0 are left out).
pub(crate) fn spread(units: i64, n: u32) -> BTreeMap<u32, i64> {
    let n = n.max(1);
    let base = units / i64::from(n);
    let rest = units % i64::from(n);
    (0..n).map(|i| (i, base + i64::from(i64::from(i) < rest))).filter(|(_, u)| *u != 0).collect()
}

/// Takes `units` from the cells with the most available first; `None` when they hold too few.
pub(crate) fn take_from<'c>(cells: impl IntoIterator<Item = &'c Cell>, units: i64) -> Option<BTreeMap<CellId, i64>> {
    let mut by_most: Vec<&Cell> = cells.into_iter().filter(|c| c.counters.available > 0).collect();
    by_most.sort_by_key(|c| std::cmp::Reverse(c.counters.available));
    let mut left = units;
    let mut out = BTreeMap::new();
    for c in by_most {
        if left == 0 {
            break;
        }
        let take = left.min(c.counters.available);
        out.insert(c.id.clone(), take);
        left -= take;
    }
    (left == 0).then_some(out)
}

fn check_category(category: Option<&str>) -> CoreResult<()> {
    match category {
        Some(c) => check_id("category", c),
        None => Ok(()),
    }
}

/// Warm-up: creates the SKU with `on_hand` available, once. A repeat never
/// overwrites, so an adjustment made since is never lost; it answers the stock as it is and
/// `false`. The stock item, its shards, the `warm_up` ledger entry and the catalogue entry are
/// one transaction.
pub async fn warm_up(deps: &Deps, t: &TenantId, sku_id: &str, req: &WarmUpRequest) -> CoreResult<(StockView, bool)> {
    check_id("sku_id", sku_id)?;
    if !(0..=MAX_UNITS).contains(&req.on_hand) {
        return Err(CoreError::invalid("on_hand", format!("must be 0 to {MAX_UNITS}")));
    }
    let shards = req.shards.unwrap_or(1);
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(CoreError::invalid("shards", format!("must be 1 to {MAX_SHARDS}")));
    }
    check_category(req.category.as_deref())?;
    let at = now_text(deps);
    let sharded = shards >= 2;
    let record = SkuRecord::new(sku_id, shards, req.category.clone(), req.on_hand, at.clone());
    let mut writes =
        vec![Write::Put { item: Item::new(keys::stock(t, sku_id), attrs_of(&record)?), cond: Cond::NotExists }];
    let split = spread(req.on_hand, record.cell_count());
    if sharded {
        for shard in 0..shards {
            let available = split.get(&shard).copied().unwrap_or(0);
            let s = ShardRecord {
                sku_id: sku_id.to_owned(),
                shard,
                available,
                reserved: 0,
                sold: 0,
                allotted: 0,
                version: 1,
            };
            writes.push(Write::Put {
                item: Item::new(keys::shard(t, sku_id, shard), attrs_of(&s)?),
                cond: Cond::NotExists,
            });
        }
    }
    let mut change = StockChange::new(t, &record, LedgerKind::WarmUp, format!("warm_up:{sku_id}"), at.clone());
    change.deltas = split.iter().map(|(&i, &u)| (CellId::default_shard(i), Counters::new(u, 0, 0))).collect();
    let entry = change.ledger_entry();
    writes.push(Write::Put {
        item: Item::new(keys::ledger_entry(t, sku_id, &entry.entry_id), attrs_of(&entry)?),
        cond: Cond::NotExists,
    });
    let mut listed = serde_json::Map::new();
    listed.insert("sku_id".into(), Value::from(sku_id));
    writes.push(Write::Put { item: Item::new(keys::catalogue_entry(t, sku_id), listed), cond: Cond::Always });
    let mut tenant = serde_json::Map::new();
    tenant.insert("tenant".into(), Value::from(t.as_str()));
    writes.push(Write::Put { item: Item::new(keys::tenant_entry(t), tenant), cond: Cond::Always });
    match deps.table.transact(writes).await {
        Ok(()) => {}
        Err(StoreError::ConditionFailed { .. }) => {
            let sku = read_sku(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" })?;
            return Ok((sku.view(), false));
        }
        Err(e) => return Err(e.into()),
    }
    let sku = read_sku(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" })?;
    Ok((sku.view(), true))
}

/// The current stock of a SKU (summed over its shards).
pub async fn get_stock(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<StockView>> {
    let Some(mut view) = stock_counters(deps, t, sku_id).await? else { return Ok(None) };
    view.incoming = super::incoming::on_the_way(deps, t, sku_id).await?;
    Ok(Some(view))
}

/// [`get_stock`] without the shipments on their way (one read fewer): what the restock rounds
/// read before every batch.
pub async fn stock_counters(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<StockView>> {
    check_id("sku_id", sku_id)?;
    Ok(read_sku(deps, t, sku_id).await?.map(|sku| sku.view()))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct AdjustmentRecord {
    body_hash: String,
    sku_id: String,
    created_at: String,
}

fn adjustment_hash(sku_id: &str, location: &str, req: &AdjustmentRequest) -> String {
    let mut canonical = format!("{sku_id}\n{}\n{}\n{}", req.delta, req.source, req.idempotency_key);
    if let Some(reference) = &req.reference {
        canonical.push_str(&format!("\nref\n{reference}"));
    }
    if !is_default_location(location) {
        canonical.push_str(&format!("\n@{location}"));
    }
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// An adjustment (purchase order, return, transfer, manual, damage), applied once per
/// idempotency key: the idempotency record is a write of the same transaction. Available never
/// goes below 0: a decrease larger than what is available is refused (409 `insufficient_stock`).
/// At the request's `location_id` (absent: `default`), which must hold a cell of the SKU.
pub async fn adjust(deps: &Deps, t: &TenantId, sku_id: &str, req: &AdjustmentRequest) -> CoreResult<StockView> {
    check_id("sku_id", sku_id)?;
    let location = req.location_id.as_deref().unwrap_or(super::model::DEFAULT_LOCATION);
    check_id("location_id", location)?;
    check_id("idempotency_key", &req.idempotency_key)?;
    let source = AdjustmentSource::parse(&req.source)?;
    if req.delta == 0 || req.delta.abs() > MAX_UNITS {
        return Err(CoreError::invalid("delta", format!("must be non-zero and at most {MAX_UNITS} either way")));
    }
    // An arrival closes its shipment in the same transaction (written second: a failed
    // condition there names it).
    let arrival = match &req.reference {
        Some(reference) => {
            check_id("ref", reference)?;
            if source != AdjustmentSource::PurchaseOrder || req.delta < 0 {
                return Err(CoreError::invalid(
                    "ref",
                    "names a shipment: only a purchase_order's arrival (a positive delta) has one",
                ));
            }
            Some(reference.as_str())
        }
        None => None,
    };
    let hash = adjustment_hash(sku_id, location, req);
    let idem_key = crate::keys::idempotency(t, "adjustment", &req.idempotency_key);
    let mut markets = super::locations::MarketsOf::new(deps, t, location);
    let mut attempts = Attempts::new();
    while attempts.another() {
        let Some(sku) = read_sku(deps, t, sku_id).await? else { return Err(CoreError::NotFound { what: "sku" }) };
        if !sku.record.has_location(location) {
            return Err(CoreError::NotFoundAt { field: "location_id".into(), what: "stock at this location" });
        }
        let units: BTreeMap<CellId, i64> = if req.delta > 0 {
            if is_default_location(location) {
                spread(req.delta, sku.record.cell_count())
                    .into_iter()
                    .map(|(i, u)| (CellId::default_shard(i), u))
                    .collect()
            } else {
                BTreeMap::from([(CellId::at(location), req.delta)])
            }
        } else {
            let here = sku.cells.iter().filter(|c| c.id.location == location);
            take_from(here, -req.delta)
                .map(|m| m.into_iter().map(|(i, u)| (i, -u)).collect())
                .ok_or_else(|| insufficient(sku_id, sku.at(location).available, -req.delta))?
        };
        let at = now_text(deps);
        let reference = format!("{}:{}", req.source, req.idempotency_key);
        let mut change = StockChange::new(t, &sku.record, LedgerKind::Adjustment, reference, at.clone());
        change.observed = Some(&sku.cells);
        if req.delta > 0 && !sku.record.locations.is_empty() {
            change.markets = markets.get().await?;
        }
        change.deltas = units.into_iter().map(|(i, u)| (i, Counters::new(u, 0, 0))).collect();
        change.source = Some(source);
        // Units promised to backorders and not yet set aside take the arrival first: only the
        // units beyond them reach `available` (docs/inventory.md, "Backorders and pre-orders").
        let allotted = change.allot(sku.total().unfilled);
        let record = AdjustmentRecord { body_hash: hash.clone(), sku_id: sku_id.to_owned(), created_at: at };
        let mut writes =
            vec![Write::Put { item: Item::new(idem_key.clone(), attrs_of(&record)?), cond: Cond::NotExists }];
        if let Some(reference) = arrival {
            writes.extend(super::incoming::arrival_writes(
                t,
                sku_id,
                reference,
                location,
                req.delta,
                &record.created_at,
            ));
        }
        writes.extend(change.writes()?);
        if allotted > 0 {
            writes.push(super::promises::fill_timer(deps, t, sku_id).await?);
        }
        match deps.table.transact(writes).await {
            Ok(()) => {
                if allotted > 0 {
                    super::promises::fill_soon(deps, t, sku_id).await;
                }
                return get_stock(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" });
            }
            Err(StoreError::ConditionFailed { index: 0 }) => {
                return replayed_adjustment(deps, t, sku_id, &idem_key, &hash).await;
            }
            Err(StoreError::ConditionFailed { index: 1 }) if arrival.is_some() => {
                let reference = arrival.unwrap_or_default();
                return Err(super::incoming::arrival_refused(deps, t, sku_id, reference, location).await?);
            }
            // The stock moved since it was read: read again and re-plan.
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

async fn replayed_adjustment(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    idem_key: &Key,
    hash: &str,
) -> CoreResult<StockView> {
    let Some(item) = deps.table.get(idem_key).await? else { return Err(StoreError::Conflict.into()) };
    let record: AdjustmentRecord = item.parse()?;
    if record.body_hash != hash {
        return Err(CoreError::conflict(
            "idempotency_conflict",
            "this idempotency_key was used with a different adjustment",
        ));
    }
    get_stock(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" })
}

/// `PUT /v1/inventory/{sku_id}/locations/{location_id}`: the SKU's stock at a location.
///
/// A location without a cell of the SKU gets one with `on_hand` (of which `safety_stock` is kept
/// back), in one transaction with its `warm_up` ledger entry and the SKU's layout (201, `true`);
/// the SKU itself is warmed up first when it is new (with `on_hand` at `default`, else 0). A cell
/// that exists keeps its stock (adjustments move it, so none is lost: 200, `false`), and a given
/// `safety_stock` is set: the difference moves between `available` and `safety` (409
/// `insufficient_stock` when fewer units are available than it keeps back).
pub async fn put_location_stock(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    location: &str,
    req: &LocationStockRequest,
) -> CoreResult<(StockView, bool)> {
    check_id("sku_id", sku_id)?;
    check_id("location_id", location)?;
    if !(0..=MAX_UNITS).contains(&req.on_hand) {
        return Err(CoreError::invalid("on_hand", format!("must be 0 to {MAX_UNITS}")));
    }
    if let Some(s) = req.safety_stock
        && !(0..=MAX_UNITS).contains(&s)
    {
        return Err(CoreError::invalid("safety_stock", format!("must be 0 to {MAX_UNITS}")));
    }
    if req.safety_stock.is_some_and(|s| s > req.on_hand) {
        return Err(CoreError::invalid("safety_stock", "must be at most on_hand"));
    }
    if !super::locations::exists(deps, t, location).await? {
        return Err(CoreError::NotFoundAt { field: "location_id".into(), what: "location" });
    }
    let default = is_default_location(location);
    let mut created = false;
    let mut markets = super::locations::MarketsOf::new(deps, t, location);
    let mut attempts = Attempts::new();
    while attempts.another() {
        let Some(sku) = read_sku(deps, t, sku_id).await? else {
            let on_hand = if default { req.on_hand } else { 0 };
            let warm = WarmUpRequest { on_hand, shards: None, category: None };
            let (_, new) = warm_up(deps, t, sku_id, &warm).await?;
            created |= new && default;
            continue;
        };
        let at = now_text(deps);
        let cell = CellId::at(location);
        if sku.record.has_location(location) {
            let Some(target) = req.safety_stock else { return Ok((sku.view(), created)) };
            if default && sku.record.is_sharded() {
                return Err(CoreError::invalid(
                    "safety_stock",
                    "a sharded SKU keeps no safety stock at default (set it at another location)",
                ));
            }
            let now = sku.at(location);
            let d = target - now.safety;
            if d == 0 {
                return Ok((sku.view(), created));
            }
            if d > now.available {
                return Err(insufficient(sku_id, now.available, d));
            }
            let reference = format!("safety_stock:{location}");
            let mut change = StockChange::new(t, &sku.record, LedgerKind::SafetyStock, reference, at);
            change.observed = Some(&sku.cells);
            if d < 0 && !default {
                // Units freed from safety stock reach the markets the location serves.
                change.markets = markets.get().await?;
            }
            change.deltas = BTreeMap::from([(cell.clone(), Counters { safety: d, ..Counters::new(-d, 0, 0) })]);
            change.cell_conds = vec![(cell, number_is("safety", now.safety))];
            match deps.table.transact(change.writes()?).await {
                Ok(()) => {}
                Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            }
        } else {
            let safety = req.safety_stock.unwrap_or(0);
            let mut locations = sku.record.locations.clone();
            locations.push(location.to_owned());
            let layout = sku.record.layout.unwrap_or(0);
            let reference = format!("warm_up:{sku_id}@{location}");
            let mut change = StockChange::new(t, &sku.record, LedgerKind::WarmUp, reference, at);
            change.observed = Some(&sku.cells);
            if req.on_hand > safety && !default {
                change.markets = markets.get().await?;
            }
            change.deltas =
                BTreeMap::from([(cell.clone(), Counters { safety, ..Counters::new(req.on_hand - safety, 0, 0) })]);
            change.created = Some(cell);
            change.header = vec![Update::set("locations", serde_json::json!(locations)), Update::add("layout", 1)];
            change.header_conds = vec![number_is("layout", layout)];
            match deps.table.transact(change.writes()?).await {
                Ok(()) => created = true,
                Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let view = get_stock(deps, t, sku_id).await?.ok_or(CoreError::NotFound { what: "sku" })?;
        return Ok((view, created));
    }
    Err(StoreError::Conflict.into())
}

pub(crate) fn insufficient(sku_id: &str, available: i64, requested: i64) -> CoreError {
    CoreError::conflict(
        "insufficient_stock",
        format!("insufficient stock for sku {sku_id}: {available} available, {requested} requested"),
    )
}

/// One page of a SKU's ledger, oldest first.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LedgerPage {
    pub items: Vec<LedgerEntry>,
    pub next_cursor: Option<String>,
}

pub async fn ledger(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<Option<LedgerPage>> {
    check_id("sku_id", sku_id)?;
    if read_record(deps, t, sku_id).await?.is_none() {
        return Ok(None);
    }
    let opts = QueryOpts { limit, cursor, descending: false };
    let page = deps.table.query(&keys::ledger_pk(t, sku_id), keys::LEDGER_PREFIX, opts).await.map_err(|e| match e {
        StoreError::Invalid(_) => CoreError::invalid("cursor", "not a cursor this list gave"),
        e => e.into(),
    })?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<LedgerEntry>, _>>()?;
    Ok(Some(LedgerPage { items, next_cursor: page.next_cursor }))
}

/// Every ledger entry of a SKU (for reconciliation and tests).
pub async fn all_ledger_entries(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Vec<LedgerEntry>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let opts = QueryOpts { limit: 1000, cursor, descending: false };
        let page = deps.table.query(&keys::ledger_pk(t, sku_id), keys::LEDGER_PREFIX, opts).await?;
        for item in &page.items {
            out.push(item.parse()?);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn cell(index: u32, available: i64) -> Cell {
        Cell {
            id: CellId::default_shard(index),
            key: Key::new("p", index.to_string()),
            counters: Counters::new(available, 0, 0),
            version: 0,
        }
    }

    #[test]
    fn attempts_stop_at_their_count_and_at_their_deadline() {
        let mut a = Attempts::new();
        assert_eq!((0..MAX_ATTEMPTS + 4).filter(|_| a.another()).count(), MAX_ATTEMPTS);
        // Past the deadline the first attempt still runs (a call is always tried once), no other.
        let mut late = Attempts::within(std::time::Duration::ZERO);
        assert!(late.another());
        assert!(!late.another());
    }

    /// A "was 0" decision holds only for the set of locations it saw: the stock item's write
    /// carries the layout as a condition, which a location's cell added since makes false (it
    /// would otherwise open a second round for the same 0 → more).
    #[test]
    fn a_restock_decision_is_conditioned_on_the_locations_it_saw() {
        let t = TenantId::parse("t").unwrap();
        let record = SkuRecord { reserved: Some(1), ..SkuRecord::new("s", 0, None, 0, String::new()) };
        let observed = [cell(0, 0)];
        let mut change = StockChange::new(&t, &record, LedgerKind::Release, "order:o".into(), "now".into());
        change.observed = Some(&observed);
        change.deltas = BTreeMap::from([(CellId::default_shard(0), Counters::release(1))]);
        let writes = change.writes().unwrap();
        let Some(Write::Update { key, updates, cond }) = writes.first() else { panic!("{writes:?}") };
        assert_eq!(key, &keys::stock(&t, "s"));
        assert!(updates.contains(&Update::add("restock_round", 1)), "{updates:?}");
        let mut item = attrs_of(&record).unwrap();
        assert!(cond.holds(Some(&item)), "as observed: {cond:?}");
        item.insert("layout".into(), serde_json::json!(1));
        item.insert("locations".into(), serde_json::json!(["east"]));
        assert!(!cond.holds(Some(&item)), "a location added since: {cond:?}");
    }

    #[test]
    fn spreads_evenly() {
        assert_eq!(spread(10, 4), BTreeMap::from([(0, 3), (1, 3), (2, 2), (3, 2)]));
        assert_eq!(spread(2, 4), BTreeMap::from([(0, 1), (1, 1)]));
        assert_eq!(spread(5, 1), BTreeMap::from([(0, 5)]));
        assert!(spread(0, 3).is_empty());
    }

    #[test]
    fn takes_from_the_fullest_cells() {
        let cells = [cell(0, 1), cell(1, 5), cell(2, 0)];
        let c = CellId::default_shard;
        assert_eq!(take_from(&cells, 6), Some(BTreeMap::from([(c(1), 5), (c(0), 1)])));
        assert_eq!(take_from(&cells, 3), Some(BTreeMap::from([(c(1), 3)])));
        assert_eq!(take_from(&cells, 7), None);
    }
}
