//! Reconciliation findings as records (docs/inventory.md, "Findings"): one record per difference
//! a person has to look at, listed by operators and settled by one with a reason.
//!
//! A finding belongs to one counter cell of a SKU (the SKU itself, or one shard of a sharded
//! SKU): the key is (tenant, sku, shard). Its *difference* is the counters minus the ledger sums
//! (`actual - expected`); a legitimate change moves both by the same amount, so the difference
//! of one error stays the same while the shop keeps selling, and that is what "the same
//! finding" means.
//!
//! What a run does with a cell that differs (see [`note`]):
//! - an **open** finding of the cell is updated (`last_seen`, `times_seen`, the latest counters
//!   and ledger sums, and the difference if it changed): never a second record, never a second
//!   message on the review queue;
//! - a finding settled **`accepted`** with the same difference is left as it is (the decision
//!   stands); with another difference, a new finding is opened;
//! - a finding settled with a **`corrective_entry`** made the ledger agree, so any difference
//!   seen after it is new: a new finding is opened (one seen by a run that read the cell before
//!   the correction is ignored: the correction bumped the cell's `version`);
//! - no finding yet: a new one is opened, and only then is a message sent to
//!   [`super::REVIEW_QUEUE`].
//!
//! A finding whose difference has gone by itself stays open until someone settles it
//! (`accepted`, since a corrective entry would now make a difference instead of ending one).
//!
//! Settling ([`settle`]): `corrective_entry` writes one ledger entry (kind `correction`, the
//! finding's difference as its delta, the cell's split for a sharded SKU) and **no counter**, in
//! the transaction that settles the record, after checking that the cell still differs by exactly
//! the finding's difference (else 409 `finding_changed`: look again). `accepted` records the
//! decision only. A reason is required; settling a settled finding is 409 `already_settled`.
//!
//! Layout: the records are the operators' (operators are not tenants, and list every tenant's):
//! `INV#FINDINGS` / `OPEN#{id}` or `SETTLED#{id}` (the id is a UUID v7, so each list is oldest
//! first); settling moves the record from one to the other in one transaction. Each cell's
//! latest finding is pointed at from the tenant's partition, `T#t#INVFINDING` / `{sku}#{shard}`,
//! which is what a run reads to decide.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;

use super::compare::{Discrepancy, reconcile_sku};
use super::keys;
use super::model::{CellId, Counters, DEFAULT_LOCATION, LedgerEntry, LedgerKind, ShardDelta};
use super::stock::{now_text, read_record};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id, new_id};
use crate::ports::{Cond, Item, Key, OutMessage, QueryOpts, StoreError, Update, Write, attrs_of};

/// The queue an operator reads new reconciliation findings from (the runtime declares it).
pub const REVIEW_QUEUE: &str = "inventory-review";
/// How often a run re-reads a cell's pointer after another writer changed it.
const NOTE_ATTEMPTS: usize = 5;
/// The longest reason an operator may give.
pub const MAX_REASON: usize = 1000;

/// Whether a finding still waits for a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FindingStatus {
    Open,
    Settled,
}

impl FindingStatus {
    pub fn parse(value: &str) -> CoreResult<Self> {
        match value {
            "open" => Ok(Self::Open),
            "settled" => Ok(Self::Settled),
            _ => Err(CoreError::invalid("status", "must be open or settled")),
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Open => "OPEN#",
            Self::Settled => "SETTLED#",
        }
    }
}

/// How a finding was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SettlementKind {
    /// A ledger entry (kind `correction`) made the ledger agree with the counters.
    CorrectiveEntry,
    /// The difference is known and accepted; the same difference is not reported again.
    Accepted,
}

impl SettlementKind {
    pub fn parse(value: &str) -> CoreResult<Self> {
        match value {
            "corrective_entry" => Ok(Self::CorrectiveEntry),
            "accepted" => Ok(Self::Accepted),
            _ => Err(CoreError::invalid("kind", "must be corrective_entry or accepted")),
        }
    }
}

/// Who settled a finding, how, why and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FindingSettlement {
    pub kind: SettlementKind,
    pub reason: String,
    /// The operator: the id of the key that settled it (or what the CLI was told).
    pub by: String,
    pub at: String,
    /// The ledger entry written, for `corrective_entry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_id: Option<String>,
}

/// A reconciliation finding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Finding {
    #[schema(example = "0193a4e8c1f07c2a9d6b3e5f7a8b9c0d")]
    pub id: String,
    #[schema(value_type = String, example = "acme")]
    pub tenant: TenantId,
    pub sku_id: String,
    /// The location that differs, when it is not `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The shard that differs, for a sharded SKU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// What the ledger summed to when last seen.
    pub expected: Counters,
    /// What the counters said when last seen.
    pub actual: Counters,
    /// `actual - expected`: what a corrective entry adds to the ledger.
    pub difference: Counters,
    pub first_seen: String,
    pub last_seen: String,
    /// Runs that saw it.
    pub times_seen: i64,
    pub status: FindingStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settlement: Option<FindingSettlement>,
}

/// One page of findings.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FindingPage {
    pub items: Vec<Finding>,
    pub next_cursor: Option<String>,
}

/// The body of `POST /v1/ops/inventory-findings/{id}/settle`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"kind": "corrective_entry", "reason": "shelf count 2026-12-01: the counters are right"}))]
pub struct SettleRequest {
    /// `corrective_entry` (a ledger entry alone makes the ledger agree with the counters) or
    /// `accepted` (the difference is known; it is not reported again).
    #[serde(default)]
    #[schema(value_type = SettlementKind, required = true)]
    pub kind: String,
    /// Why (required, at most 1000 characters, not blank): what was found, who was asked.
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 1000, pattern = r"[^\s\u0085\u001c-\u001f\ufeff]")]
    pub reason: String,
}

/// Whether `text` says nothing: only characters that some regular-expression dialect calls
/// space (Unicode's White_Space, and U+FEFF and U+001C–U+001F, which ECMAScript's and Python's
/// `\s` add). The document's pattern for `reason` names the same set, so a reason a client's
/// schema takes is never refused as blank, whichever dialect checks it.
fn blank(text: &str) -> bool {
    text.chars().all(|c| c.is_whitespace() || c == '\u{feff}' || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// A cell's latest finding, kept in the tenant's partition for the runs to decide by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct CellPointer {
    finding_id: String,
    open: bool,
    difference: Counters,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled: Option<SettlementKind>,
    /// The cell's `version` once a corrective entry was written: a run that read the cell
    /// before it (a lower version) saw the difference the entry ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settled_version: Option<i64>,
}

/// What a run did with one difference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Noted {
    pub finding_id: Option<String>,
    pub opened: bool,
}

fn difference(d: &Discrepancy) -> Counters {
    Counters {
        safety: d.actual.safety.saturating_sub(d.expected.safety),
        allotted: d.actual.allotted.saturating_sub(d.expected.allotted),
        backordered: d.actual.backordered.saturating_sub(d.expected.backordered),
        unfilled: d.actual.unfilled.saturating_sub(d.expected.unfilled),
        ..Counters::new(
            d.actual.available.saturating_sub(d.expected.available),
            d.actual.reserved.saturating_sub(d.expected.reserved),
            d.actual.sold.saturating_sub(d.expected.sold),
        )
    }
}

fn counters_value(c: Counters) -> Value {
    let mut v = serde_json::json!({"available": c.available, "reserved": c.reserved, "sold": c.sold});
    for (name, n) in
        [("safety", c.safety), ("allotted", c.allotted), ("backordered", c.backordered), ("unfilled", c.unfilled)]
    {
        if n != 0 {
            v[name] = n.into();
        }
    }
    v
}

fn record_key(status: FindingStatus, id: &str) -> Key {
    Key::new(keys::FINDINGS_PK, format!("{}{id}", status.prefix()))
}

/// Records one difference seen by a run (`version`: the cell's version as read, `None` for an
/// entry of a cell the SKU does not have): updates the cell's open finding, leaves an accepted
/// one alone, or opens a new one (and queues it for review).
pub(crate) async fn note(deps: &Deps, t: &TenantId, d: &Discrepancy, version: Option<i64>) -> CoreResult<Noted> {
    let diff = difference(d);
    let pointer_key = keys::finding_cell(t, &d.sku_id, d.location.as_deref(), d.shard);
    let now = now_text(deps);
    for _ in 0..NOTE_ATTEMPTS {
        let pointer: Option<CellPointer> = match deps.table.get(&pointer_key).await? {
            Some(item) => Some(item.parse()?),
            None => None,
        };
        if let Some(p) = &pointer {
            if p.open {
                let updates = vec![
                    Update::set("expected", counters_value(d.expected)),
                    Update::set("actual", counters_value(d.actual)),
                    Update::set("difference", counters_value(diff)),
                    Update::set("last_seen", now.clone()),
                    Update::add("times_seen", 1),
                ];
                let mut writes = vec![Write::Update {
                    key: record_key(FindingStatus::Open, &p.finding_id),
                    updates,
                    cond: Cond::Exists,
                }];
                if p.difference != diff {
                    writes.push(Write::Update {
                        key: pointer_key.clone(),
                        updates: vec![Update::set("difference", counters_value(diff))],
                        cond: Cond::eq("finding_id", p.finding_id.clone()),
                    });
                }
                match deps.table.transact(writes).await {
                    Ok(()) => return Ok(Noted { finding_id: Some(p.finding_id.clone()), opened: false }),
                    // Settled (or changed) meanwhile: read the pointer again.
                    Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            if p.settled_version.is_some_and(|v| version.is_some_and(|seen| seen < v)) {
                // Read before the correction that settled it: not a difference any more.
                return Ok(Noted { finding_id: Some(p.finding_id.clone()), opened: false });
            }
            if p.settled == Some(SettlementKind::Accepted) && p.difference == diff {
                return Ok(Noted { finding_id: Some(p.finding_id.clone()), opened: false });
            }
        }
        let finding = Finding {
            id: new_id(),
            tenant: t.clone(),
            sku_id: d.sku_id.clone(),
            location: d.location.clone(),
            shard: d.shard,
            expected: d.expected,
            actual: d.actual,
            difference: diff,
            first_seen: now.clone(),
            last_seen: now.clone(),
            times_seen: 1,
            status: FindingStatus::Open,
            settlement: None,
        };
        let next = CellPointer {
            finding_id: finding.id.clone(),
            open: true,
            difference: diff,
            settled: None,
            settled_version: None,
        };
        let pointer_cond = match &pointer {
            None => Cond::NotExists,
            Some(p) => Cond::eq("finding_id", p.finding_id.clone()),
        };
        let writes = vec![
            Write::Put { item: Item::new(pointer_key.clone(), attrs_of(&next)?), cond: pointer_cond },
            Write::Put {
                item: Item::new(record_key(FindingStatus::Open, &finding.id), attrs_of(&finding)?),
                cond: Cond::NotExists,
            },
        ];
        match deps.table.transact(writes).await {
            Ok(()) => {}
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
        queue_for_review(deps, &finding).await;
        return Ok(Noted { finding_id: Some(finding.id), opened: true });
    }
    warn!(tenant = %t, sku_id = %d.sku_id, "the finding's cell kept changing; noted on the next run");
    Ok(Noted { finding_id: None, opened: false })
}

/// A message on the review queue for a new finding (the operator's inbox; a failed send is
/// logged, the record is what counts).
async fn queue_for_review(deps: &Deps, finding: &Finding) {
    let body = match serde_json::to_string(finding) {
        Ok(body) => body,
        Err(e) => return warn!(error = %e, "finding not serializable"),
    };
    if let Err(e) = deps.queues.send_batch(REVIEW_QUEUE, vec![OutMessage::new(body)]).await {
        warn!(error = %e, finding = %finding.id, "reconciliation finding not queued; it is recorded in the table");
    }
}

/// One page of findings in `status`, every tenant's, oldest first.
pub async fn list(deps: &Deps, status: FindingStatus, limit: usize, cursor: Option<String>) -> CoreResult<FindingPage> {
    let opts = QueryOpts { limit, cursor, descending: false };
    let page = deps.table.query(keys::FINDINGS_PK, status.prefix(), opts).await.map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<Finding>, _>>()?;
    Ok(FindingPage { items, next_cursor: page.next_cursor })
}

/// Every finding in `status` (tests and the CLI's summary).
pub async fn all(deps: &Deps, status: FindingStatus) -> CoreResult<Vec<Finding>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = list(deps, status, 500, cursor).await?;
        out.extend(page.items);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

/// Settles an open finding (see the module's documentation); `by` is the operator.
pub async fn settle(deps: &Deps, id: &str, req: &SettleRequest, by: &str) -> CoreResult<Finding> {
    check_id("id", id)?;
    let kind = SettlementKind::parse(&req.kind)?;
    let reason = req.reason.trim();
    if blank(reason) {
        return Err(CoreError::invalid("reason", "required: say why the finding is settled"));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(CoreError::invalid("reason", format!("at most {MAX_REASON} characters")));
    }
    for _ in 0..NOTE_ATTEMPTS {
        let Some(item) = deps.table.get(&record_key(FindingStatus::Open, id)).await? else {
            return Err(not_open(deps, id).await);
        };
        let mut finding: Finding = item.parse()?;
        let at = now_text(deps);
        let mut settlement =
            FindingSettlement { kind, reason: reason.to_owned(), by: by.to_owned(), at: at.clone(), entry_id: None };
        let mut pointer_updates = vec![Update::set("open", false), Update::set("settled", settlement_kind_text(kind))];
        let mut writes = vec![Write::Delete { key: record_key(FindingStatus::Open, id), cond: Cond::Exists }];
        if kind == SettlementKind::CorrectiveEntry {
            let Some((entry, cell, version)) = correction(deps, &finding, reason, &at).await? else { continue };
            settlement.entry_id = Some(entry.entry_id.clone());
            writes.push(Write::Put {
                item: Item::new(
                    keys::ledger_entry(&finding.tenant, &finding.sku_id, &entry.entry_id),
                    attrs_of(&entry)?,
                ),
                cond: Cond::NotExists,
            });
            if let (Some(cell), Some(version)) = (cell, version) {
                // The version only (never a counter): a run that read the cell before this
                // entry sees a change and reads again, or, past its read, is told by the pointer.
                writes.push(Write::Update {
                    key: cell,
                    updates: vec![Update::add("version", 1)],
                    cond: Cond::eq("version", version),
                });
                pointer_updates.push(Update::set("settled_version", version + 1));
            }
        }
        finding.status = FindingStatus::Settled;
        finding.settlement = Some(settlement);
        writes.push(Write::Put {
            item: Item::new(record_key(FindingStatus::Settled, id), attrs_of(&finding)?),
            cond: Cond::NotExists,
        });
        writes.push(Write::Update {
            key: keys::finding_cell(&finding.tenant, &finding.sku_id, finding.location.as_deref(), finding.shard),
            updates: pointer_updates,
            cond: Cond::eq("finding_id", id.to_owned()),
        });
        match deps.table.transact(writes).await {
            Ok(()) => return Ok(finding),
            Err(StoreError::ConditionFailed { index: 0 }) => return Err(not_open(deps, id).await),
            // The cell moved between the check and the commit: check again.
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CoreError::conflict("write_conflict", "the SKU kept changing while the finding was settled: try again"))
}

fn settlement_kind_text(kind: SettlementKind) -> &'static str {
    match kind {
        SettlementKind::CorrectiveEntry => "corrective_entry",
        SettlementKind::Accepted => "accepted",
    }
}

/// Why finding `id` is not open: settled already (409), or no such finding (404).
async fn not_open(deps: &Deps, id: &str) -> CoreError {
    match deps.table.get(&record_key(FindingStatus::Settled, id)).await {
        Ok(Some(_)) => CoreError::conflict("already_settled", format!("finding {id} is settled already")),
        Ok(None) => CoreError::NotFound { what: "finding" },
        Err(e) => e.into(),
    }
}

/// The corrective entry of an open finding, checked against the cell as it is now: the entry,
/// the cell's key and its version (`None` for a cell the SKU does not have). `Ok(None)` when the
/// SKU kept changing while it was read.
async fn correction(
    deps: &Deps,
    f: &Finding,
    reason: &str,
    at: &str,
) -> CoreResult<Option<(LedgerEntry, Option<Key>, Option<i64>)>> {
    let t = &f.tenant;
    let Some(record) = read_record(deps, t, &f.sku_id).await? else { return Err(CoreError::NotFound { what: "sku" }) };
    let Some(found) = reconcile_sku(deps, t, &f.sku_id).await? else { return Ok(None) };
    let now = found.iter().find(|(d, _)| d.shard == f.shard && d.location == f.location);
    let current = now.map(|(d, _)| difference(d)).unwrap_or_default();
    if current != f.difference {
        return Err(CoreError::conflict(
            "finding_changed",
            format!(
                "the cell differs by {} now, the finding says {}: run the reconciliation again and settle what it finds \
                 (a difference that is gone is settled as accepted)",
                show(current),
                show(f.difference)
            ),
        ));
    }
    let version = now.and_then(|(_, v)| *v);
    let id = CellId {
        location: f.location.clone().unwrap_or_else(|| DEFAULT_LOCATION.to_owned()),
        shard: f.shard.unwrap_or(0),
    };
    let cell = version.map(|_| super::stock::cell_key(t, &record, &id));
    let d = f.difference;
    let shards = match f.shard {
        Some(shard) if record.is_sharded() || shard > 0 || f.location.is_some() => {
            vec![ShardDelta::of(&CellId { shard, ..id.clone() }, d)]
        }
        _ => Vec::new(),
    };
    let entry = LedgerEntry {
        entry_id: new_id(),
        sku_id: f.sku_id.clone(),
        delta_available: d.available,
        delta_reserved: d.reserved,
        delta_sold: d.sold,
        delta_safety: d.safety,
        delta_allotted: d.allotted,
        delta_backordered: d.backordered,
        delta_unfilled: d.unfilled,
        location: f.location.clone(),
        kind: LedgerKind::Correction,
        reference: format!("finding:{}", f.id),
        source: None,
        reason: Some(reason.to_owned()),
        shards,
        at: at.to_owned(),
    };
    Ok(Some((entry, cell, version)))
}

fn show(c: Counters) -> String {
    format!("available {:+}, reserved {:+}, sold {:+}", c.available, c.reserved, c.sold)
}

#[cfg(test)]
mod tests {
    use super::blank;

    /// A reason is blank when every character is space in some dialect's `\s` (what the
    /// document's pattern refuses), and not otherwise.
    #[test]
    fn a_blank_reason_is_what_the_documents_pattern_refuses() {
        for text in ["", " ", "\t\n", "\u{85}", "\u{a0}\u{3000}", "\u{feff}", "\u{1c}\u{1f}"] {
            assert!(blank(text), "{text:?}");
        }
        for text in ["x", " shelf count ", "\u{feff}a", "盘点"] {
            assert!(!blank(text), "{text:?}");
        }
    }
}
