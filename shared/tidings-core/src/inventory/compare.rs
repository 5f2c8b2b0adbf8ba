//! One SKU's ledger compared with its counters, cell by cell, at a quiet moment: what a
//! reconciliation run reports and what settling a finding with a corrective entry checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::model::{CellId, Counters};
use super::stock::{Cell, all_ledger_entries, read_cells, read_record};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;

/// How often one SKU is re-read when it keeps changing while its ledger is summed.
const SETTLE_ATTEMPTS: usize = 5;

/// A difference between a SKU's ledger and its counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Discrepancy {
    pub sku_id: String,
    /// The location that differs, when it is not `default` (each location is checked on its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The shard that differs, for a sharded SKU (its shards may differ even when the SKU's
    /// totals agree, which a totals-only check would miss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// What the ledger sums to.
    pub expected: Counters,
    /// What the counters say.
    pub actual: Counters,
    /// The finding that holds this difference (`GET /v1/ops/inventory-findings`): an open one,
    /// or one settled as accepted with the same difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding_id: Option<String>,
}

/// A difference and the `version` of its cell as read (`None`: a cell the SKU does not have).
pub(crate) type Observed = (Discrepancy, Option<i64>);

/// Compares one SKU's ledger with its counters, cell by cell; `None` when the SKU kept changing
/// while it was read. A moment counts as quiet when every cell's `version` (bumped by every
/// change, in the ledger entry's transaction) is the same before and after the ledger is read.
pub(crate) async fn reconcile_sku(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Option<Vec<Observed>>> {
    for _ in 0..SETTLE_ATTEMPTS {
        let Some(record) = read_record(deps, t, sku_id).await? else { return Ok(Some(Vec::new())) };
        let before = read_cells(deps, t, &record).await?;
        let mut expected: BTreeMap<CellId, Counters> = BTreeMap::new();
        for entry in all_ledger_entries(deps, t, sku_id).await? {
            for (cell, delta) in entry.cell_deltas() {
                let sum = expected.entry(cell).or_default();
                *sum = sum.plus(delta);
            }
        }
        let after = read_cells(deps, t, &record).await?;
        // A location added meanwhile has entries its cell list lacks, and promised units moved
        // on the stock item of a sharded SKU show on no shard's version: read again.
        let header = |r: &super::model::SkuRecord| (r.layout, r.backordered, r.unfilled);
        let header_now = read_record(deps, t, sku_id).await?.as_ref().map(header);
        if !same_versions(&before, &after) || header_now != Some(header(&record)) {
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

/// The cells whose ledger sums differ from their counters (entries for a cell the SKU does
/// not have count as a difference too, unless they sum to nothing).
fn compare(sku_id: &str, sharded: bool, expected: &BTreeMap<CellId, Counters>, cells: &[Cell]) -> Vec<Observed> {
    let mut out = Vec::new();
    let location = |c: &CellId| (!c.is_default()).then(|| c.location.clone());
    for c in cells {
        let want = expected.get(&c.id).copied().unwrap_or_default();
        if want != c.counters {
            let d = Discrepancy {
                sku_id: sku_id.to_owned(),
                location: location(&c.id),
                shard: (sharded && c.id.is_default()).then_some(c.id.shard),
                expected: want,
                actual: c.counters,
                finding_id: None,
            };
            out.push((d, Some(c.version)));
        }
    }
    for (index, &want) in expected {
        if !cells.iter().any(|c| &c.id == index) && want != Counters::default() {
            let d = Discrepancy {
                sku_id: sku_id.to_owned(),
                location: location(index),
                shard: Some(index.shard),
                expected: want,
                actual: Counters::default(),
                finding_id: None,
            };
            out.push((d, None));
        }
    }
    out
}
