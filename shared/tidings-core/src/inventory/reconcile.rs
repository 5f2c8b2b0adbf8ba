//! Reconciliation (docs/inventory.md, "Reconciliation"): every SKU's ledger is summed, per SKU and
//! per shard, and compared with its counters. A difference is recorded for review (an item under
//! `T#t#INVREVIEW` and a message on [`REVIEW_QUEUE`]) and reported; it is never "fixed" here,
//! because a silent fix hides exactly the errors (a lost write, a release applied twice) that
//! reconciliation exists to surface.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::keys;
use super::model::Counters;
use super::stock::{Cell, all_ledger_entries, now_text, read_cells, read_record};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::ports::{Cond, Item, OutMessage, QueryOpts, StoreError, attrs_of};

/// The queue an operator reads reconciliation findings from (the runtime declares it).
pub const REVIEW_QUEUE: &str = "inventory-review";
/// How often one SKU is re-read when it keeps changing while its ledger is summed.
const SETTLE_ATTEMPTS: usize = 5;

/// A difference between a SKU's ledger and its counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Discrepancy {
    pub sku_id: String,
    /// The shard that differs, for a sharded SKU (its shards may differ even when the SKU's
    /// totals agree, which a totals-only check would miss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// What the ledger sums to.
    pub expected: Counters,
    /// What the counters say.
    pub actual: Counters,
}

/// A finding as recorded for review.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReviewItem {
    pub tenant: TenantId,
    #[serde(flatten)]
    pub discrepancy: Discrepancy,
    pub found_at: String,
    /// `OPEN` until an operator settles it.
    pub status: String,
}

/// The answer of a reconciliation run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReconcileReport {
    /// SKUs compared.
    pub checked: u64,
    pub discrepancies: Vec<Discrepancy>,
    /// SKUs that changed during every attempt to read them still (checked on the next run).
    pub skipped: Vec<String>,
}

/// Reconciles one tenant's SKUs, or every tenant's (`None`: the daily schedule).
pub async fn reconcile(deps: &Deps, tenant: Option<&TenantId>) -> CoreResult<ReconcileReport> {
    let tenants = match tenant {
        Some(t) => vec![t.clone()],
        None => inventory_tenants(deps).await?,
    };
    let mut report = ReconcileReport::default();
    for t in &tenants {
        for sku_id in catalogue(deps, t).await? {
            match reconcile_sku(deps, t, &sku_id).await? {
                None => report.skipped.push(sku_id),
                Some(found) => {
                    report.checked += 1;
                    for d in found {
                        record_for_review(deps, t, &d).await?;
                        report.discrepancies.push(d);
                    }
                }
            }
        }
    }
    Ok(report)
}

async fn all_sort_keys(deps: &Deps, pk: &str) -> CoreResult<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = deps.table.query(pk, "", QueryOpts { limit: 1000, cursor, descending: false }).await?;
        out.extend(page.items.into_iter().map(|i| i.key.sk));
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

async fn inventory_tenants(deps: &Deps) -> CoreResult<Vec<TenantId>> {
    Ok(all_sort_keys(deps, keys::TENANTS_PK).await?.iter().filter_map(|t| TenantId::parse(t).ok()).collect())
}

async fn catalogue(deps: &Deps, t: &TenantId) -> CoreResult<Vec<String>> {
    all_sort_keys(deps, &keys::catalogue_pk(t)).await
}

/// Compares one SKU's ledger with its counters, cell by cell; `None` when the SKU kept changing
/// while it was read. A moment counts as quiet when every cell's `version` (bumped by every
/// change, in the ledger entry's transaction) is the same before and after the ledger is read.
async fn reconcile_sku(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<Vec<Discrepancy>>> {
    let Some(record) = read_record(deps, t, sku_id).await? else { return Ok(Some(Vec::new())) };
    for _ in 0..SETTLE_ATTEMPTS {
        let before = read_cells(deps, t, &record).await?;
        let mut expected: BTreeMap<u32, Counters> = BTreeMap::new();
        for entry in all_ledger_entries(deps, t, sku_id).await? {
            for (cell, delta) in entry.cell_deltas() {
                let sum = expected.entry(cell).or_default();
                *sum = sum.plus(delta);
            }
        }
        let after = read_cells(deps, t, &record).await?;
        if !same_versions(&before, &after) {
            continue;
        }
        return Ok(Some(compare(sku_id, record.is_sharded(), &expected, &after)));
    }
    warn!(tenant = %t, sku_id, "sku kept changing during reconciliation; skipped this run");
    Ok(None)
}

fn same_versions(a: &[Cell], b: &[Cell]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.version == y.version && x.counters == y.counters)
}

/// The cells whose ledger sums differ from their counters (an entry for a cell the SKU does
/// not have counts as a difference too).
fn compare(sku_id: &str, sharded: bool, expected: &BTreeMap<u32, Counters>, cells: &[Cell]) -> Vec<Discrepancy> {
    let mut out = Vec::new();
    for c in cells {
        let want = expected.get(&c.index).copied().unwrap_or_default();
        if want != c.counters {
            out.push(Discrepancy {
                sku_id: sku_id.to_owned(),
                shard: sharded.then_some(c.index),
                expected: want,
                actual: c.counters,
            });
        }
    }
    for (&index, &want) in expected {
        if !cells.iter().any(|c| c.index == index) {
            out.push(Discrepancy {
                sku_id: sku_id.to_owned(),
                shard: Some(index),
                expected: want,
                actual: Counters::default(),
            });
        }
    }
    out
}

/// Records a finding: an item to review (the durable record) and a message on the review queue
/// (the operator's inbox; a failed send is logged, the item is what counts).
async fn record_for_review(deps: &Deps, t: &TenantId, d: &Discrepancy) -> CoreResult<()> {
    let item =
        ReviewItem { tenant: t.clone(), discrepancy: d.clone(), found_at: now_text(deps), status: "OPEN".into() };
    let key = keys::review_entry(t, deps.clock.now_ms(), &d.sku_id, d.shard);
    deps.table.put(Item::new(key, attrs_of(&item)?), Cond::Always).await?;
    let body = serde_json::to_string(&item).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if let Err(e) = deps.queues.send_batch(REVIEW_QUEUE, vec![OutMessage::new(body)]).await {
        warn!(error = %e, sku_id = %d.sku_id, "reconciliation finding not queued; it is recorded in the table");
    }
    Ok(())
}

/// The findings recorded for review, oldest first.
pub async fn review_items(deps: &Deps, t: &TenantId) -> CoreResult<Vec<ReviewItem>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page =
            deps.table.query(&keys::review_pk(t), "", QueryOpts { limit: 1000, cursor, descending: false }).await?;
        for item in &page.items {
            out.push(item.parse()?);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}
