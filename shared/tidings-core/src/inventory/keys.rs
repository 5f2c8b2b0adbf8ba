//! The inventory's key layout, in one place (the table-wide convention is in
//! [`crate::keys`]: every tenant-owned key starts with `T#{tenant}#`).
//!
//! | item | pk | sk |
//! |---|---|---|
//! | SKU stock (header; the counters too when unsharded) | `T#t#SKU#{sku}` | `STOCK` |
//! | stock shard `i` of a sharded SKU | `T#t#SKU#{sku}#S{i}` | `CELL` |
//! | a SKU's cell at a location other than `default` | `T#t#SKU#{sku}#L#{location}` | `CELL` |
//! | location | `T#t#LOCATIONS` | `{location}` |
//! | ledger entry | `T#t#LEDGER#{sku}` | `E#{entry_id}` (UUID v7: oldest first) |
//! | SKU catalogue (what reconciliation walks) | `T#t#SKUS` | `{sku}` |
//! | order | `T#t#ORDER#{order_id}` | `ORDER` |
//! | reconciliation finding (every tenant's: operators list them) | `INV#FINDINGS` | `OPEN#{id}` or `SETTLED#{id}` |
//! | a cell's latest finding (what a run decides by) | `T#t#INVFINDING` | `{sku}#{shard}` (`-` unsharded; `{sku}#L#{location}#-` at a location) |
//! | adjustment idempotency record | `T#t#IDEM#adjustment#{key}` | `IDEM` ([`crate::keys::idempotency`]) |
//! | tenants that hold inventory | `INV#TENANTS` | `{tenant}` |
//! | stock on its way ([`super::incoming`]) | `T#t#INCOMING#{sku}` | `{ref}` |
//! | an order waiting for a SKU ([`super::backorders`]) | `T#t#BACKORDERS#{sku}` | `{created_at}#{order_id}` (oldest first) |
//!
//! Shards live in partitions of their own (`...#S{i}`), not as sort keys under the SKU's
//! partition: DynamoDB's per-partition write limit (about 1,000 writes/s) is what sharding
//! spreads out, so the shards must not share a partition.

use crate::ids::TenantId;
use crate::ports::Key;

/// The sort key of a SKU's stock item; the back-in-stock stream consumer filters on it.
pub const STOCK_SK: &str = "STOCK";
/// The sort key of a stock shard.
pub const CELL_SK: &str = "CELL";
/// The partition listing every tenant that has warmed up a SKU (for the scheduled reconcile).
pub const TENANTS_PK: &str = "INV#TENANTS";
/// Prefix of ledger entry sort keys.
pub const LEDGER_PREFIX: &str = "E#";

pub fn stock(t: &TenantId, sku: &str) -> Key {
    Key::new(format!("T#{t}#SKU#{sku}"), STOCK_SK)
}

pub fn shard(t: &TenantId, sku: &str, index: u32) -> Key {
    Key::new(format!("T#{t}#SKU#{sku}#S{index}"), CELL_SK)
}

/// A SKU's cell at a location other than `default` (whose cells are [`stock`] and [`shard`]).
pub fn location_cell(t: &TenantId, sku: &str, location: &str) -> Key {
    Key::new(format!("T#{t}#SKU#{sku}#L#{location}"), CELL_SK)
}

pub fn locations_pk(t: &TenantId) -> String {
    format!("T#{t}#LOCATIONS")
}

pub fn location(t: &TenantId, location: &str) -> Key {
    Key::new(locations_pk(t), location)
}

pub fn ledger_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#LEDGER#{sku}")
}

pub fn ledger_entry(t: &TenantId, sku: &str, entry_id: &str) -> Key {
    Key::new(ledger_pk(t, sku), format!("{LEDGER_PREFIX}{entry_id}"))
}

pub fn catalogue_pk(t: &TenantId) -> String {
    format!("T#{t}#SKUS")
}

pub fn catalogue_entry(t: &TenantId, sku: &str) -> Key {
    Key::new(catalogue_pk(t), sku)
}

pub fn order(t: &TenantId, order_id: &str) -> Key {
    Key::new(format!("T#{t}#ORDER#{order_id}"), "ORDER")
}

/// The partition of every reconciliation finding ([`super::findings`]).
pub const FINDINGS_PK: &str = "INV#FINDINGS";

pub fn finding_cell(t: &TenantId, sku: &str, location: Option<&str>, shard: Option<u32>) -> Key {
    let shard = shard.map_or_else(|| "-".to_owned(), |s| s.to_string());
    match location {
        Some(l) => Key::new(format!("T#{t}#INVFINDING"), format!("{sku}#L#{l}#{shard}")),
        None => Key::new(format!("T#{t}#INVFINDING"), format!("{sku}#{shard}")),
    }
}

pub fn incoming_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#INCOMING#{sku}")
}

pub fn incoming(t: &TenantId, sku: &str, reference: &str) -> Key {
    Key::new(incoming_pk(t, sku), reference)
}

/// A copy of each shipment still on its way, removed by its arrival: what a SKU's view reads, so
/// that the shipments received over the years are never read again.
pub fn incoming_open_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#INCOMING_OPEN#{sku}")
}

pub fn incoming_open(t: &TenantId, sku: &str, reference: &str) -> Key {
    Key::new(incoming_open_pk(t, sku), reference)
}

pub fn backorders_pk(t: &TenantId, sku: &str) -> String {
    format!("T#{t}#BACKORDERS#{sku}")
}

pub fn backorder(t: &TenantId, sku: &str, created_at: &str, order_id: &str) -> Key {
    Key::new(backorders_pk(t, sku), format!("{created_at}#{order_id}"))
}

pub fn tenant_entry(t: &TenantId) -> Key {
    Key::new(TENANTS_PK, t.as_str())
}
