//! A SKU's WAITING indexes (docs/restock.md, "Markets"): the one of no market, and one per
//! market a subscription named.

use super::keys;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::ports::QueryOpts;

/// The SKU's WAITING indexes: the one of no market first, then each market a subscription ever
/// named (docs/restock.md, "Markets").
pub(crate) async fn waiting_buckets(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Vec<Option<String>>> {
    let mut buckets = vec![None];
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(&keys::waiting_markets_pk(t, sku_id), "", QueryOpts { limit: 100, cursor, descending: false })
            .await?;
        buckets.extend(page.items.iter().map(|i| Some(i.key.sk.clone())));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(buckets),
        }
    }
}
