//! Incoming stock (docs/inventory.md, "Incoming stock"): units on their way to a location, with
//! the date they are expected. `POST /v1/inventory/{sku_id}/incoming` records them (by the
//! shop's `ref`, its purchase order's number: the same `ref` again is the same shipment, its date
//! or quantity updated while it is on its way), `GET /v1/inventory/{sku_id}` lists what is on its
//! way, and the arrival closes it: an adjustment `{source: "purchase_order", ref}` marks it
//! `RECEIVED` in the adjustment's own transaction, so stock and shipment never disagree.
//!
//! Subscribers who asked to hear the date (`notify_incoming`) are told, once per shipment and
//! date ([`crate::restock::incoming`]).

use serde::{Deserialize, Serialize};

use super::keys;
use super::stock::{MAX_UNITS, now_text};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};

/// How far ahead a shipment may be expected.
const MAX_AHEAD_DAYS: i64 = 5 * 366;
/// The most shipments on their way a SKU's view lists (the soonest first).
pub const MAX_LISTED: usize = 100;

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

fn default_location() -> String {
    "default".to_owned()
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

/// What [`expect`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// A new shipment.
    Created,
    /// The same shipment with a new date or quantity.
    Updated,
    /// The same shipment as recorded (a retry).
    Unchanged,
}

/// Records stock on its way (or updates its date or quantity while it is), and has the SKU's
/// subscribers who asked told of the date: scheduled on every answer but a shipment already
/// told, so a retry after a crash between the record and the schedule tells them (each is told
/// once per shipment and date whatever runs twice).
pub async fn expect(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    req: &IncomingRequest,
) -> CoreResult<(Incoming, Recorded)> {
    check_id("sku_id", sku_id)?;
    check_id("ref", &req.reference)?;
    check_id("location_id", &req.location_id)?;
    if !(1..=MAX_UNITS).contains(&req.qty) {
        return Err(CoreError::invalid("qty", format!("must be 1 to {MAX_UNITS}")));
    }
    let expected = chrono::DateTime::parse_from_rfc3339(&req.expected_at)
        .map_err(|_| CoreError::invalid("expected_at", "must be an RFC 3339 time, e.g. 2026-12-24T09:00:00Z"))?
        .with_timezone(&chrono::Utc);
    if expected > deps.clock.now() + chrono::Duration::days(MAX_AHEAD_DAYS) {
        return Err(CoreError::invalid("expected_at", "must be within five years"));
    }
    let expected_at = expected.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    if deps.table.get(&keys::stock(t, sku_id)).await?.is_none() {
        return Err(CoreError::NotFound { what: "sku" });
    }
    let key = keys::incoming(t, sku_id, &req.reference);
    let now = now_text(deps);
    let (incoming, recorded) = match deps.table.get(&key).await? {
        None => {
            let incoming = Incoming {
                reference: req.reference.clone(),
                sku_id: sku_id.to_owned(),
                location_id: req.location_id.clone(),
                qty: req.qty,
                expected_at,
                status: IncomingStatus::Expected,
                created_at: now.clone(),
                updated_at: now,
                received_at: None,
                received_qty: None,
            };
            match deps.table.put(Item::new(key.clone(), attrs_of(&incoming)?), Cond::NotExists).await {
                Ok(()) => (incoming, Recorded::Created),
                // Recorded meanwhile by the same request's twin: answer as a retry would.
                Err(StoreError::ConditionFailed { .. }) => return Err(StoreError::Conflict.into()),
                Err(e) => return Err(e.into()),
            }
        }
        Some(item) => {
            let mut incoming: Incoming = item.parse()?;
            if incoming.status == IncomingStatus::Received {
                return Err(CoreError::conflict(
                    "incoming_received",
                    format!("the shipment {} has arrived already; record a new one with another ref", req.reference),
                ));
            }
            let same = incoming.location_id == req.location_id
                && incoming.qty == req.qty
                && incoming.expected_at == expected_at;
            if same {
                (incoming, Recorded::Unchanged)
            } else {
                let updates = vec![
                    Update::set("location_id", req.location_id.as_str()),
                    Update::set("qty", req.qty),
                    Update::set("expected_at", expected_at.as_str()),
                    Update::set("updated_at", now.as_str()),
                ];
                let cond = Cond::And(vec![
                    Cond::eq("status", "EXPECTED"),
                    Cond::eq("updated_at", incoming.updated_at.as_str()),
                ]);
                match deps.table.update(&key, updates, cond).await {
                    Ok(_) => {}
                    Err(StoreError::ConditionFailed { .. }) => return Err(StoreError::Conflict.into()),
                    Err(e) => return Err(e.into()),
                }
                incoming.location_id.clone_from(&req.location_id);
                incoming.qty = req.qty;
                incoming.expected_at = expected_at;
                incoming.updated_at = now;
                (incoming, Recorded::Updated)
            }
        }
    };
    crate::restock::incoming::schedule(deps, t, &incoming).await?;
    Ok((incoming, recorded))
}

/// The shipments of a SKU on their way, the soonest first (at most [`MAX_LISTED`]).
pub async fn on_the_way(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Vec<Incoming>> {
    let page = deps
        .table
        .query(&keys::incoming_pk(t, sku_id), "", QueryOpts { limit: 1000, cursor: None, descending: false })
        .await?;
    let mut out = Vec::new();
    for item in &page.items {
        let incoming: Incoming = item.parse()?;
        if incoming.status == IncomingStatus::Expected {
            out.push(incoming);
        }
    }
    out.sort_by(|a, b| a.expected_at.cmp(&b.expected_at).then_with(|| a.reference.cmp(&b.reference)));
    out.truncate(MAX_LISTED);
    Ok(out)
}

/// The write that closes shipment `reference` with an arrival of `qty` units, for the
/// adjustment's transaction (conditioned on the shipment still being on its way).
pub(crate) fn arrival_write(t: &TenantId, sku_id: &str, reference: &str, qty: i64, at: &str) -> Write {
    Write::Update {
        key: keys::incoming(t, sku_id, reference),
        updates: vec![
            Update::set("status", "RECEIVED"),
            Update::set("received_at", at),
            Update::set("received_qty", qty),
            Update::set("updated_at", at),
        ],
        cond: Cond::eq("status", "EXPECTED"),
    }
}

/// Why an arrival's condition failed: no such shipment, or it arrived already.
pub(crate) async fn arrival_refused(deps: &Deps, t: &TenantId, sku_id: &str, reference: &str) -> CoreResult<CoreError> {
    Ok(match deps.table.get(&keys::incoming(t, sku_id, reference)).await? {
        None => {
            CoreError::invalid("ref", format!("no incoming stock of sku {sku_id} has ref {reference}: record it first"))
        }
        Some(_) => CoreError::conflict(
            "incoming_received",
            format!("the shipment {reference} has arrived already (each arrival closes its shipment once)"),
        ),
    })
}
