//! Incoming stock (docs/inventory.md, "Incoming stock"): units on their way to a location, with
//! the date they are expected. `POST /v1/inventory/{sku_id}/incoming` records them (by the
//! shop's `ref`, its purchase order's number: the same `ref` again is the same shipment, its date
//! or quantity updated while it is on its way), `GET /v1/inventory/{sku_id}` lists what is on its
//! way, and the arrival closes it: an adjustment `{source: "purchase_order", ref}` marks it
//! `RECEIVED` in the adjustment's own transaction, so stock and shipment never disagree.
//!
//! Subscribers who asked to hear the date (`notify_incoming`) are told, once per shipment and
//! date ([`crate::restock::incoming`]).

use super::keys;
use super::model::MAX_UNITS;
pub use super::model::{Incoming, IncomingRequest, IncomingStatus};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};
use tracing::warn;

/// How far ahead a shipment may be expected.
const MAX_AHEAD_DAYS: i64 = 5 * 366;
/// The most shipments on their way a SKU's view lists (the soonest first).
pub const MAX_LISTED: usize = 100;

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
/// subscribers who asked told of the date: a durable timer written with the shipment (so no
/// crash loses the telling) and a task at once; a user hears a date once whatever runs twice.
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
    if !super::locations::exists(deps, t, &req.location_id).await? {
        return Err(CoreError::NotFoundAt { field: "location_id".into(), what: "location" });
    }
    let key = keys::incoming(t, sku_id, &req.reference);
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
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
            let put = Write::Put { item: Item::new(key.clone(), attrs_of(&incoming)?), cond: Cond::NotExists };
            let told = durable_tell(deps, t, &incoming).await?;
            match deps.table.transact(vec![put, open_copy(t, &incoming)?, told]).await {
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
                incoming.location_id.clone_from(&req.location_id);
                incoming.qty = req.qty;
                incoming.expected_at = expected_at;
                incoming.updated_at = now;
                let told = durable_tell(deps, t, &incoming).await?;
                let writes = vec![Write::Update { key: key.clone(), updates, cond }, open_copy(t, &incoming)?, told];
                match deps.table.transact(writes).await {
                    Ok(()) => {}
                    Err(StoreError::ConditionFailed { .. }) => return Err(StoreError::Conflict.into()),
                    Err(e) => return Err(e.into()),
                }
                (incoming, Recorded::Updated)
            }
        }
    };
    // At once as well, unless the shipment was told already (a retry); a queue that does not
    // take it leaves the telling to the durable timer, minutes later.
    if recorded != Recorded::Unchanged
        && let Err(e) = timer::schedule(deps, deps.clock.now(), tell_task(t, &incoming)).await
    {
        warn!(sku_id, reference = %incoming.reference, error = %e, "the date is told by its durable timer");
    }
    Ok((incoming, recorded))
}

/// The shipments of a SKU on their way, the soonest first (at most [`MAX_LISTED`]).
pub async fn on_the_way(deps: &Deps, t: &TenantId, sku_id: &str) -> CoreResult<Vec<Incoming>> {
    let page = deps
        .table
        .query(&keys::incoming_open_pk(t, sku_id), "", QueryOpts { limit: 1000, cursor: None, descending: false })
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

/// The copy of a shipment on its way ([`keys::incoming_open`]), written with it.
fn open_copy(t: &TenantId, incoming: &Incoming) -> CoreResult<Write> {
    let key = keys::incoming_open(t, &incoming.sku_id, &incoming.reference);
    Ok(Write::Put { item: Item::new(key, attrs_of(incoming)?), cond: Cond::Always })
}

/// The writes that close shipment `reference` with an arrival of `qty` units at `location`, for
/// the adjustment's transaction: the shipment (conditioned on it still being on its way, to
/// there: the first write) and its copy among those on their way, removed.
pub(crate) fn arrival_writes(
    t: &TenantId,
    sku_id: &str,
    reference: &str,
    location: &str,
    qty: i64,
    at: &str,
) -> [Write; 2] {
    [
        Write::Update {
            key: keys::incoming(t, sku_id, reference),
            updates: vec![
                Update::set("status", "RECEIVED"),
                Update::set("received_at", at),
                Update::set("received_qty", qty),
                Update::set("updated_at", at),
            ],
            cond: Cond::And(vec![Cond::eq("status", "EXPECTED"), Cond::eq("location_id", location)]),
        },
        Write::Delete { key: keys::incoming_open(t, sku_id, reference), cond: Cond::Always },
    ]
}

/// Why an arrival's condition failed: no such shipment, one on its way to another location, or
/// one that arrived already.
pub(crate) async fn arrival_refused(
    deps: &Deps,
    t: &TenantId,
    sku_id: &str,
    reference: &str,
    location: &str,
) -> CoreResult<CoreError> {
    let found = deps.table.get(&keys::incoming(t, sku_id, reference)).await?;
    let shipment = found.map(|item| item.parse::<Incoming>()).transpose()?;
    Ok(match shipment {
        None => {
            CoreError::invalid("ref", format!("no incoming stock of sku {sku_id} has ref {reference}: record it first"))
        }
        Some(s) if s.status == IncomingStatus::Expected && s.location_id != location => CoreError::invalid(
            "location_id",
            format!("the shipment {reference} is on its way to {}: record its arrival there", s.location_id),
        ),
        Some(_) => CoreError::conflict(
            "incoming_received",
            format!("the shipment {reference} has arrived already (each arrival closes its shipment once)"),
        ),
    })
}

/// The task that tells the SKU's subscribers who asked of `incoming`'s date.
fn tell_task(t: &TenantId, incoming: &Incoming) -> TimerTask {
    TimerTask::RestockIncoming {
        tenant: t.clone(),
        sku_id: incoming.sku_id.clone(),
        reference: incoming.reference.clone(),
        expected_at: incoming.expected_at.clone(),
        market: None,
        cursor: None,
    }
}

/// The durable timer of [`tell_task`], written with the shipment (it fires a few minutes on: a
/// crash before the task's message, or a queue that refused it, still tells everyone).
async fn durable_tell(deps: &Deps, t: &TenantId, incoming: &Incoming) -> CoreResult<Write> {
    timer::durable_timer(deps, deps.clock.now(), &tell_task(t, incoming)).await
}
