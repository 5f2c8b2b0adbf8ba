//! The notification use-cases behind the HTTP API: accept (idempotent), read, cancel.

use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::model::{
    Delivery, DeliveryStatus, Notification, NotificationRequest, NotificationStatus, Priority, PriorityLowered,
};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id, new_id};
use crate::keys;
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};

/// The answer to an accepted request.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    pub notification_id: String,
    pub status: NotificationStatus,
    /// The priority granted: the lanes it is sent on. `high` only for a transactional send to at
    /// most 10 users.
    pub priority: Priority,
    /// The priority asked for, when it was not granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_requested: Option<Priority>,
    /// Why the priority asked for was not granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_lowered: Option<PriorityLowered>,
    /// False when this is the answer to a repeated request.
    #[serde(skip)]
    pub created: bool,
}

#[derive(Clone, Debug, serde::Deserialize, Serialize)]
struct IdempotencyRecord {
    body_hash: String,
    notification_id: String,
    created_at: String,
}

/// The entry of a notification in its tenant's list ([`crate::lists::notifications`]), written
/// by [`accept`] with the notification.
#[derive(Clone, Debug, serde::Deserialize, Serialize)]
pub(crate) struct NotificationEntry {
    pub(crate) notification_id: String,
    pub(crate) created_ms: i64,
}

fn entry_write(t: &TenantId, n: &Notification) -> CoreResult<Write> {
    let entry = NotificationEntry { notification_id: n.notification_id.clone(), created_ms: n.created_ms };
    Ok(Write::Put {
        item: Item::new(keys::notification_entry(t, n.created_ms, &n.notification_id), attrs_of(&entry)?),
        cond: Cond::Always,
    })
}

/// A request refused by what it names (its template or workflow, since changed or removed): a
/// repeat of an accepted key still answers as the repeat; anything else is refused.
async fn refused_unless_repeat(
    deps: &Deps,
    t: &TenantId,
    req: &NotificationRequest,
    hash: &str,
    refused: CoreError,
) -> CoreResult<Accepted> {
    if let Some(key) = req.idempotency_key.as_deref()
        && let Some(earlier) = repeat_of(deps, t, key, hash, req).await?
    {
        return Ok(earlier);
    }
    Err(refused)
}

/// Hash of the request as parsed (so whitespace and key order do not matter).
fn body_hash(req: &NotificationRequest) -> CoreResult<String> {
    let canonical = serde_json::to_vec(req).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(hex::encode(Sha256::digest(&canonical)))
}

/// Accepts a notification: one transaction writes the idempotency record and the notification
/// item. The notification item is the outbox entry: its change-stream record makes the relay
/// queue it, so "accepted but never queued" cannot happen.
pub async fn accept(deps: &Deps, t: &TenantId, req: NotificationRequest) -> CoreResult<Accepted> {
    accept_as(deps, t, req, false).await
}

/// [`accept`] of a notification whose sends get one attempt on their channel: its creator
/// retries on its own schedule ([`Notification::one_attempt`]; `crate::restock::merge`).
pub async fn accept_one_attempt(deps: &Deps, t: &TenantId, req: NotificationRequest) -> CoreResult<Accepted> {
    accept_as(deps, t, req, true).await
}

async fn accept_as(deps: &Deps, t: &TenantId, mut req: NotificationRequest, one_attempt: bool) -> CoreResult<Accepted> {
    req.validate()?;
    // The requester is neither stored nor part of the request's identity (a retry seen from
    // another address is the same request).
    let requester = req.requester.take();
    let hash = body_hash(&req)?;
    let now = deps.clock.now();
    req.validate_schedule(now)?;
    // A workflow send: the version its runs follow, and its category (after the hash: the same
    // body repeated is the same request whatever the workflow became).
    let workflow = match &req.workflow_id {
        Some(id) => {
            let Some(wf) = crate::workflows::get_workflow(deps, t, id).await? else {
                let refused = CoreError::invalid(
                    "workflow_id",
                    format!("no workflow {id}: create it with PUT /v1/workflows/{id}"),
                );
                return refused_unless_repeat(deps, t, &req, &hash, refused).await;
            };
            req.category = Some(wf.category);
            Some(crate::workflows::WorkflowRef {
                workflow_id: wf.workflow_id,
                version: wf.version,
                required: wf.required,
            })
        }
        None => None,
    };
    // Per-requester limits, counted in this transaction: a repeat fails on its idempotency
    // record first and counts nothing.
    let limits = match &requester {
        Some(who) => deps.config.abuse.requester_writes(t, who, now),
        None => Vec::new(),
    };
    // The lanes it goes on: bulk never rides the high ones, whatever it asks.
    let (priority, priority_lowered) = req.granted_priority();
    let notification = Notification {
        notification_id: new_id(),
        // A scheduled notification's insert makes the relay set its timers (`crate::timers::schedule`).
        status: if req.is_scheduled(now) { NotificationStatus::Scheduled } else { NotificationStatus::Accepted },
        priority,
        priority_lowered,
        request: req,
        body_hash: hash.clone(),
        created_at: now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        created_ms: now.timestamp_millis(),
        orchestrated: false,
        counted: true,
        last_page: None,
        user_triggered: requester.is_some(),
        verified_at: None,
        one_attempt,
        workflow,
    };
    let mut writes = Vec::with_capacity(2);
    let idem_key = notification.request.idempotency_key.as_deref().map(|k| keys::idempotency(t, "notification", k));
    if let Some(key) = &idem_key {
        let record = IdempotencyRecord {
            body_hash: hash.clone(),
            notification_id: notification.notification_id.clone(),
            created_at: notification.created_at.clone(),
        };
        writes.push(Write::Put { item: Item::new(key.clone(), attrs_of(&record)?), cond: Cond::NotExists });
    }
    let stored = Item::new(keys::notification(t, &notification.notification_id), attrs_of(&notification)?);
    // Too large to store (large params): 422 naming the request's largest field, before
    // anything is written.
    let field = stored.attrs.get("request").and_then(|r| r.as_object()).and_then(crate::sizes::largest_attr);
    crate::sizes::check_stored(field.unwrap_or("params"), &stored)?;
    // What can be checked before answering (docs/delivery.md, "Accept: checked before it
    // answers"): the template, read once, and the placeholders the params must give. A repeat of
    // a request accepted before its template changed answers as a repeat.
    let checked = match notification.workflow {
        Some(_) => Ok(()),
        None => super::params::check_template(deps, t, &notification.request).await.map(|_| ()),
    };
    if let Err(refused) = checked {
        return refused_unless_repeat(deps, t, &notification.request, &hash, refused).await;
    }
    writes.push(Write::Put { item: stored, cond: Cond::NotExists });
    // Its entry in the tenant's notifications list, in the same transaction (`crate::lists`).
    writes.push(entry_write(t, &notification)?);
    // The relay's safety net finds it by this entry if its stream record is lost.
    if notification.status == NotificationStatus::Accepted {
        writes.push(super::watch::watch_write(t, &notification.notification_id, notification.created_ms));
    }
    let first_limit = writes.len();
    writes.extend(limits.iter().map(|l| l.write.clone()));
    if notification.user_triggered {
        writes.push(super::verification::accepted_write(
            t,
            notification.request.sends_what(),
            now,
            &notification.notification_id,
        ));
    }
    match deps.table.transact(writes).await {
        Ok(()) => Ok(Accepted {
            priority_requested: notification.priority_lowered.map(|_| notification.request.priority()),
            priority_lowered: notification.priority_lowered,
            priority: notification.priority,
            notification_id: notification.notification_id,
            status: notification.status,
            created: true,
        }),
        Err(StoreError::ConditionFailed { index: 0 })
            if let Some(key) = notification.request.idempotency_key.as_deref() =>
        {
            // Written and gone again cannot happen (records are kept); a retry will settle it.
            repeat_of(deps, t, key, &hash, &notification.request).await?.ok_or_else(|| StoreError::Conflict.into())
        }
        Err(StoreError::ConditionFailed { index })
            if let Some(limit) = index.checked_sub(first_limit).and_then(|i| limits.get(i)) =>
        {
            Err(CoreError::RateLimited {
                field: limit.field,
                detail: "too many notifications for this requester; try again later".into(),
                retry_after_s: limit.retry_after_s,
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The answer to a repeat of an accepted request with this idempotency key; `None` when the key
/// was not used; 409 `idempotency_conflict` when it was, with another body.
async fn repeat_of(
    deps: &Deps,
    t: &TenantId,
    key: &str,
    hash: &str,
    req: &NotificationRequest,
) -> CoreResult<Option<Accepted>> {
    let Some(existing) = deps.table.get(&keys::idempotency(t, "notification", key)).await? else { return Ok(None) };
    let existing: IdempotencyRecord = existing.parse()?;
    if existing.body_hash != hash {
        return Err(CoreError::conflict(
            "idempotency_conflict",
            "this idempotency_key was used with a different request body",
        ));
    }
    // The same body as the first request: the same priority granted.
    let status = match get_notification(deps, t, &existing.notification_id).await? {
        Some(view) => view.status,
        None => NotificationStatus::Accepted,
    };
    let (priority, priority_lowered) = req.granted_priority();
    Ok(Some(Accepted {
        notification_id: existing.notification_id,
        status,
        priority_requested: priority_lowered.map(|_| req.priority()),
        priority_lowered,
        priority,
        created: false,
    }))
}

pub use super::progress::Counts;

#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct NotificationView {
    pub notification_id: String,
    pub status: NotificationStatus,
    pub category: super::model::Category,
    /// The priority granted: the lanes it is sent on. `high` only for a transactional send to at
    /// most 10 users.
    pub priority: Priority,
    /// The priority asked for, when it was not granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_requested: Option<Priority>,
    /// Why the priority asked for was not granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_lowered: Option<PriorityLowered>,
    /// A template send's template.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub template_id: String,
    /// A workflow send's workflow, and the version its runs follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
    /// A workflow send's runs not yet ended (running or waiting): `GET …/runs` shows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs_open: Option<u64>,
    pub created_at: String,
    pub counts: Counts,
    /// A campaign's segment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    /// Recipients expanded so far (a campaign grows page by page).
    pub expanded: u64,
    /// Age of the oldest delivery still queued, in seconds (0 when none is).
    pub oldest_pending_age_s: u64,
}

pub async fn load(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Option<Notification>> {
    match deps.table.get(&keys::notification(t, id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

pub async fn get_notification(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Option<NotificationView>> {
    check_id("notification_id", id)?;
    let Some(n) = load(deps, t, id).await? else { return Ok(None) };
    Ok(Some(view_of(deps, t, n).await?))
}

/// What `GET /v1/notifications/{id}` shows of a notification item: its status (`completed`
/// once every page is done and nothing is queued) and its counts.
pub async fn view_of(deps: &Deps, t: &TenantId, n: Notification) -> CoreResult<NotificationView> {
    let id = n.notification_id.as_str();
    let mut running = 0;
    let (counts, expanded, oldest_pending_ms, all_pages_done) = if n.counted {
        let p = super::progress::read(deps, t, id).await?;
        // Pages may finish out of order: done when every page up to the last one is.
        let done = n.last_page.is_some_and(|last| p.pages > last);
        running = p.running;
        (p.counts, p.expanded, p.oldest_pending_ms, done)
    } else {
        let counts = count_deliveries(deps, t, id).await?;
        let expanded = n.request.user_ids().len() as u64;
        (counts, expanded, None, n.orchestrated)
    };
    let oldest_pending_age_s =
        oldest_pending_ms.map(|ms| (deps.clock.now_ms().saturating_sub(ms)).max(0) as u64 / 1000).unwrap_or(0);
    let status = match n.status {
        NotificationStatus::Processing if all_pages_done && counts.queued == 0 && running == 0 => {
            NotificationStatus::ended(counts.sent + counts.delivered, counts.failed + counts.dead)
        }
        other => other,
    };
    Ok(NotificationView {
        notification_id: n.notification_id,
        status,
        category: n.request.category(),
        priority: n.priority,
        priority_requested: n.priority_lowered.map(|_| n.request.priority()),
        priority_lowered: n.priority_lowered,
        segment: n.request.recipients.segment.clone(),
        template_id: n.request.template_id,
        workflow_id: n.workflow.as_ref().map(|w| w.workflow_id.clone()),
        workflow_version: n.workflow.as_ref().map(|w| w.version),
        runs_open: n.workflow.as_ref().map(|_| running),
        created_at: n.created_at,
        counts,
        expanded,
        oldest_pending_age_s,
    })
}

/// Counts by reading every delivery: only for notifications accepted before the counters.
async fn count_deliveries(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Counts> {
    let mut counts = Counts::default();
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(&keys::notification_pk(t, id), "D#", QueryOpts { limit: 1000, cursor, descending: false })
            .await?;
        for item in &page.items {
            let d: Delivery = item.parse()?;
            match d.status {
                DeliveryStatus::Pending | DeliveryStatus::Sending => counts.queued += 1,
                DeliveryStatus::Sent => counts.sent += 1,
                DeliveryStatus::Delivered | DeliveryStatus::Opened | DeliveryStatus::Clicked => counts.delivered += 1,
                DeliveryStatus::Failed => counts.failed += 1,
                DeliveryStatus::Suppressed => counts.suppressed += 1,
                DeliveryStatus::Dead => counts.dead += 1,
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(counts);
        }
    }
}

/// One page of a notification's deliveries.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryPage {
    pub items: Vec<Delivery>,
    pub next_cursor: Option<String>,
}

pub async fn list_deliveries(
    deps: &Deps,
    t: &TenantId,
    id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<Option<DeliveryPage>> {
    check_id("notification_id", id)?;
    if deps.table.get(&keys::notification(t, id)).await?.is_none() {
        return Ok(None);
    }
    // With send batches, their entries merged in (docs/delivery.md, "Send batches").
    let pk = keys::notification_pk(t, id);
    if let Some((items, next_cursor)) = super::batch::list(deps.table.as_ref(), &pk, limit, cursor.as_deref()).await? {
        return Ok(Some(DeliveryPage { items, next_cursor }));
    }
    let page =
        deps.table.query(&keys::notification_pk(t, id), "D#", QueryOpts { limit, cursor, descending: false }).await;
    let page = page.map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<Delivery>, _>>()?;
    Ok(Some(DeliveryPage { items, next_cursor: page.next_cursor }))
}

/// Cancels what has not been sent yet (docs/delivery.md, "Cancel"). A notification whose every
/// delivery has ended (`completed`: sent, failed or suppressed, nothing queued) has nothing left
/// to cancel: 409 `already_sent`, and it stays as it was. Otherwise its status becomes
/// `cancelled`, and the answer comes once the sends that had passed their check before that
/// write have ended ([`super::fence`]): nothing of it is sent after the answer.
pub async fn cancel(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<NotificationView> {
    check_id("notification_id", id)?;
    let Some(before) = get_notification(deps, t, id).await? else {
        return Err(CoreError::NotFound { what: "notification" });
    };
    if before.status == NotificationStatus::Completed {
        return Err(CoreError::conflict(
            "already_sent",
            "every delivery of this notification has ended (sent, failed or suppressed): nothing is left to cancel",
        ));
    }
    let key = keys::notification(t, id);
    let cond = Cond::And(vec![Cond::Exists, Cond::is_in("status", ["accepted", "scheduled", "processing"])]);
    // The status and the mark the sends' fence reads, together.
    let mark =
        Item::new(keys::cancel_mark(t, id), attrs_of(&serde_json::json!({ "cancelled_ms": deps.clock.now_ms() }))?);
    let writes = vec![
        Write::Update { key, updates: vec![Update::set("status", "cancelled")], cond },
        Write::Put { item: mark, cond: Cond::Always },
    ];
    // A transaction on a record that moves while a campaign runs may meet a conflict on
    // DynamoDB (where a single update would have waited its turn): tried again.
    match super::progress::transact_retrying(deps.table.as_ref(), writes).await {
        Ok(()) => {}
        Err(StoreError::ConditionFailed { index: 0 }) => {
            let Some(view) = get_notification(deps, t, id).await? else {
                return Err(CoreError::NotFound { what: "notification" });
            };
            if view.status != NotificationStatus::Cancelled {
                return Err(CoreError::conflict("invalid_state", format!("notification is {}", view.status.as_str())));
            }
        }
        Err(e) => return Err(e.into()),
    }
    // A workflow's runs that wait (at a delay, a digest, a fallback's wait) end now, swept by a
    // timer task, not when each one's own timer fires (docs/workflows.md, "Runs").
    if before.workflow_id.is_some() {
        let sweep = TimerTask::WorkflowCancel { tenant: t.clone(), notification_id: id.to_owned(), cursor: None };
        timer::schedule(deps, deps.clock.now(), sweep).await?;
    }
    // Sends that read the status before the write may be at a gate or at the provider: the
    // answer waits for them (they end within the gate wait and the provider timeout).
    let bound = deps.config.gates.max_wait + deps.config.provider_timeout + std::time::Duration::from_secs(2);
    if !super::fence::wait_for_sends(t, id, bound).await {
        warn!(tenant = %t, notification_id = id, "cancelled, but sends begun before it had not ended in time");
    }
    get_notification(deps, t, id).await?.ok_or(CoreError::NotFound { what: "notification" })
}
