//! Reconciliation (docs/inventory.md, "Reconciliation"): every SKU's ledger is summed, per SKU and
//! per shard, and compared with its counters. A difference is recorded as a finding for a person
//! ([`super::findings`]: one record per difference, a message on [`super::REVIEW_QUEUE`] when it is new)
//! and reported; it is never "fixed" here, because a silent fix hides exactly the errors (a lost
//! write, a release applied twice) that reconciliation exists to surface. An operator settles
//! a finding, with a corrective entry or by accepting it.

use serde::{Deserialize, Serialize};

use super::compare::{Discrepancy, reconcile_sku};
use super::findings;
use super::keys;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::ports::QueryOpts;

/// The answer of a reconciliation run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReconcileReport {
    /// SKUs compared.
    pub checked: u64,
    pub discrepancies: Vec<Discrepancy>,
    /// Findings this run opened (a difference already open, or accepted, opens none).
    #[serde(default)]
    pub opened: u64,
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
                    for (mut d, version) in found {
                        let noted = findings::note(deps, t, &d, version).await?;
                        report.opened += u64::from(noted.opened);
                        d.finding_id = noted.finding_id;
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
