//! Merged messages and retries (docs/restock.md, "Merge per buyer", "Retries and manual resend").
//!
//! A user's notices wait in a window (default 60 s) opened by the first one, a digest of the
//! workflow engine (`crate::workflows::digest`: the notice enters it in its own transaction,
//! `rounds::claim`); when it closes,
//! every SKU in it whose subscription was not cancelled meanwhile goes out as **one** notification (template `restock`) through the normal
//! notification path, with an idempotency key made from the window, so a flush that runs twice
//! creates it once. Channels are the user's (the orchestrator chooses them from the user's
//! contacts and preferences).
//!
//! After each send a check looks at the deliveries: sent → SENT; only permanent failures (no
//! address, closed channel, unsubscribed) → UNREACHABLE, never retried; transient failures →
//! retried 1, 5, 30 minutes after the failure, then MANUAL, which an operator resends per
//! `batch_no`, idempotently, skipping cancelled users. The messages are sent with one attempt
//! per channel (`api::accept_one_attempt`): the channel worker closes a transient failure at
//! once instead of retrying on its own first, so these delays are the only retries and run from
//! the failure itself.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::info;

use super::keys;
use super::model::{MessageItem, MessageStatus, Notice, NoticeStatus, RestockMessage, SubscriptionStatus};
use super::subscriptions::{self, now_text};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::notify::api;
use crate::notify::model::DeliveryStatus;
use crate::notify::model::NotificationRequest;
use crate::ports::{Channel, Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::templates::LocaleContent;
use crate::timers::task::{self as timer, TimerTask};
use crate::workflows::digest;

pub use super::model::RESTOCK_TEMPLATE;

fn later(deps: &Deps, by: Duration) -> chrono::DateTime<chrono::Utc> {
    deps.clock.now() + chrono::Duration::from_std(by).unwrap_or(chrono::Duration::minutes(1))
}

/// When a window opened now closes.
pub(crate) fn window_close(deps: &Deps) -> chrono::DateTime<chrono::Utc> {
    later(deps, deps.config.restock.merge_window)
}

/// The flush of a window: a durable timer written in the transaction that writes the window (so
/// no crash can leave a window that never closes), and [`schedule_flush`] once it has committed
/// (so the flush, on time, always finds the window it closes: one sent before the window was
/// written could run first on a slow store, find nothing, and leave the window open).
pub(crate) async fn durable_flush(
    deps: &Deps,
    t: &TenantId,
    window_id: &str,
    closes: chrono::DateTime<chrono::Utc>,
) -> CoreResult<Write> {
    timer::durable_timer(deps, closes, &flush_task(t, window_id)).await
}

/// The flush of a window that has been written, on time. A queue that does not take it leaves
/// the flush to the durable timer ([`durable_flush`]), minutes later.
pub(crate) async fn schedule_flush(deps: &Deps, t: &TenantId, window_id: &str, closes: chrono::DateTime<chrono::Utc>) {
    if let Err(e) = timer::schedule(deps, closes, flush_task(t, window_id)).await {
        tracing::warn!(tenant = %t, window_id, error = %e, "the window is flushed by its durable timer");
    }
}

fn flush_task(t: &TenantId, window_id: &str) -> TimerTask {
    TimerTask::RestockFlush { tenant: t.clone(), window_id: window_id.to_owned() }
}

/// The message of a window the notice opens, put in the notice's transaction.
pub(crate) fn message_write(
    deps: &Deps,
    t: &TenantId,
    user: &str,
    window_id: &str,
    closes: chrono::DateTime<chrono::Utc>,
) -> CoreResult<Write> {
    let message = RestockMessage {
        window_id: window_id.to_owned(),
        user_id: user.to_owned(),
        start_ms: deps.clock.now_ms(),
        closes_ms: closes.timestamp_millis(),
        status: MessageStatus::Open,
        attempt: 0,
        notification_id: None,
        items: Vec::new(),
        updated_at: now_text(deps),
    };
    Ok(Write::Put { item: Item::new(keys::message(t, window_id), attrs_of(&message)?), cond: Cond::NotExists })
}

/// Closes a window and reads its SKUs, in `batch_no` order. A window of the digest (every window
/// opened since the merge became one) closes as every digest does: its head deleted while it
/// names the window, then its events read. A window opened before (its id `{ms}-{user}`, never a
/// digest's) closes from the items it was written with.
async fn close_window(deps: &Deps, t: &TenantId, message: &RestockMessage) -> CoreResult<Vec<MessageItem>> {
    let window_id = message.window_id.as_str();
    let mut items: Vec<MessageItem> = Vec::new();
    if window_id.contains('-') {
        match deps.table.delete(&keys::open_window(t, &message.user_id), Cond::eq("window_id", window_id)).await {
            Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let mut cursor = None;
        loop {
            let opts = QueryOpts { limit: 100, cursor, descending: false };
            let page = deps.table.query(&keys::message_pk(t, window_id), keys::ENTRY_PREFIX, opts).await?;
            for item in &page.items {
                items.push(item.parse()?);
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
    } else {
        let pk = keys::merge_partition(t, &message.user_id);
        let (events, _) = digest::close(deps, &pk, window_id, usize::MAX).await?;
        for event in events {
            items.push(serde_json::from_value(event)?);
        }
        items.sort_by(|a, b| a.batch_no.cmp(&b.batch_no));
    }
    Ok(items)
}

async fn load_message(deps: &Deps, t: &TenantId, window_id: &str) -> CoreResult<Option<RestockMessage>> {
    Ok(deps.table.get(&keys::message(t, window_id)).await?.map(|i| i.parse()).transpose()?)
}

/// The built-in `restock` template, written for the tenant once (never over theirs).
async fn ensure_template(deps: &Deps, t: &TenantId) -> CoreResult<()> {
    let key = crate::keys::template(t, RESTOCK_TEMPLATE);
    if deps.table.get(&key).await?.is_some() {
        return Ok(());
    }
    let en = LocaleContent {
        email_subject: Some("Back in stock: {{ sku_list }}".into()),
        email_body: Some(
            "Good news: {{ sku_list }} {% if count > 1 %}are{% else %}is{% endif %} back in stock.".into(),
        ),
        email_html: None,
        sms: Some("Back in stock: {{ sku_list }}".into()),
        push_title: Some("Back in stock".into()),
        push_body: Some("{{ sku_list }}".into()),
        inapp_title: Some("Back in stock".into()),
        inapp_body: Some("Back in stock: {{ sku_list }}".into()),
    };
    let zh = LocaleContent {
        email_subject: Some("到货通知：{{ sku_list }}".into()),
        email_body: Some("您关注的 {{ count }} 件商品已到货：{{ sku_list }}".into()),
        email_html: None,
        sms: Some("您关注的商品已到货：{{ sku_list }}".into()),
        push_title: Some("到货通知".into()),
        push_body: Some("{{ sku_list }}".into()),
        inapp_title: Some("到货通知".into()),
        inapp_body: Some("您关注的商品已到货：{{ sku_list }}".into()),
    };
    crate::templates::put_builtin(deps, t, RESTOCK_TEMPLATE, en, zh).await
}

/// A deterministic idempotency key (hashed: ids may be long).
fn idempotency_key(parts: &[&str]) -> String {
    format!("restock-{}", &hex::encode(Sha256::digest(parts.join("\n").as_bytes()))[..40])
}

/// Creates the notification of a list of SKUs for a user, once per key.
/// `channels`: only these (a retry goes again only where it failed); `None`: the user's.
async fn send(
    deps: &Deps,
    t: &TenantId,
    user: &str,
    items: &[MessageItem],
    key: String,
    channels: Option<&[Channel]>,
) -> CoreResult<String> {
    ensure_template(deps, t).await?;
    let skus: Vec<&str> = items.iter().map(|i| i.sku_id.as_str()).collect();
    let mut request = json!({
        "idempotency_key": key,
        "recipients": {"user_ids": [user]},
        "template_id": RESTOCK_TEMPLATE,
        "params": {"sku_ids": skus, "sku_list": skus.join(", "), "count": skus.len()},
        "category": "transactional",
        "priority": "normal",
    });
    if let (Some(channels), Some(map)) = (channels, request.as_object_mut()) {
        map.insert("channels".into(), serde_json::to_value(channels)?);
    }
    let request: NotificationRequest = serde_json::from_value(request)?;
    Ok(api::accept_one_attempt(deps, t, request).await?.notification_id)
}

async fn set_notices(
    deps: &Deps,
    t: &TenantId,
    user: &str,
    items: &[MessageItem],
    status: NoticeStatus,
    extra: &[(&str, Value)],
) -> CoreResult<()> {
    for item in items {
        let key = keys::notice(t, &item.batch_no, user);
        // The notice and its entry in the index of its status move together, from the status
        // read (a concurrent move makes the transaction fail: read again).
        let mut moved = false;
        for _ in 0..5 {
            let Some(current) = deps.table.get(&key).await? else {
                return Err(StoreError::ConditionFailed { index: 0 }.into());
            };
            let from = current.str("status").unwrap_or_default().to_owned();
            let mut updates = vec![Update::set("status", status.as_str()), Update::set("updated_at", now_text(deps))];
            updates.extend(extra.iter().map(|(k, v)| Update::Set((*k).to_owned(), v.clone())));
            let mut writes = vec![Write::Update { key: key.clone(), updates, cond: Cond::eq("status", from.as_str()) }];
            if from != status.as_str() {
                writes.push(Write::Delete {
                    key: keys::status_entry(t, &from, &item.batch_no, user),
                    cond: Cond::Always,
                });
                writes.push(status_entry_write(t, status, &item.batch_no, user));
            }
            match deps.table.transact(writes).await {
                Ok(()) => {
                    moved = true;
                    break;
                }
                Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if !moved {
            return Err(StoreError::Conflict.into());
        }
    }
    Ok(())
}

/// The entry of a notice in the index of `status` (`list_notices`).
pub(crate) fn status_entry_write(t: &TenantId, status: NoticeStatus, batch_no: &str, user: &str) -> Write {
    let mut attrs = serde_json::Map::new();
    attrs.insert("batch_no".into(), json!(batch_no));
    attrs.insert("user_id".into(), json!(user));
    Write::Put { item: Item::new(keys::status_entry(t, status.as_str(), batch_no, user), attrs), cond: Cond::Always }
}

/// Closes a window and sends its message (attempt 1). Idempotent.
pub async fn flush(deps: &Deps, t: &TenantId, window_id: &str) -> CoreResult<()> {
    let Some(message) = load_message(deps, t, window_id).await? else { return Ok(()) };
    if message.attempt > 0 || message.status != MessageStatus::Open {
        return Ok(());
    }
    // Close first: a claim racing with this either committed before (and is read below) or
    // fails its check on the window and opens the next one.
    let items = close_window(deps, t, &message).await?;
    // A subscription cancelled while its SKU waited in the window is left out; a window whose
    // every SKU was cancelled sends nothing (docs/restock.md, "Merge per buyer").
    let (items, cancelled) = split_cancelled(deps, t, &items).await?;
    set_notices(deps, t, &message.user_id, &cancelled, NoticeStatus::Cancelled, &[]).await?;
    if items.is_empty() && !cancelled.is_empty() {
        let r = deps
            .table
            .update(
                &keys::message(t, window_id),
                vec![Update::set("status", "CANCELLED"), Update::set("updated_at", now_text(deps))],
                Cond::eq("attempt", 0),
            )
            .await;
        info!(tenant = %t, window_id, skus = cancelled.len(), "restock message not sent: every SKU's subscription was cancelled");
        return match r {
            Ok(_) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    if items.is_empty() {
        let r = deps
            .table
            .update(&keys::message(t, window_id), vec![Update::set("status", "EMPTY")], Cond::eq("attempt", 0))
            .await;
        return match r {
            Ok(_) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    let key = idempotency_key(&[t.as_str(), window_id, "1"]);
    let notification_id = send(deps, t, &message.user_id, &items, key, None).await?;
    let updates = vec![
        Update::set("status", "SENDING"),
        Update::set("attempt", 1),
        Update::set("notification_id", notification_id.as_str()),
        Update::Set("items".into(), serde_json::to_value(&items)?),
        Update::set("updated_at", now_text(deps)),
    ];
    match deps.table.update(&keys::message(t, window_id), updates, Cond::eq("attempt", 0)).await {
        Ok(_) => {}
        Err(StoreError::ConditionFailed { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    set_notices(
        deps,
        t,
        &message.user_id,
        &items,
        NoticeStatus::Sending,
        &[("attempts", json!(1)), ("notification_id", json!(notification_id))],
    )
    .await?;
    info!(tenant = %t, window_id, skus = items.len(), "restock message sent");
    schedule_check(deps, t, window_id, 1).await
}

/// The wait after attempt `n` before it is judged (and retried): the n-th retry delay.
fn delay_after(deps: &Deps, attempt: u32) -> Duration {
    let delays = &deps.config.restock.retry_delays;
    let i = usize::try_from(attempt.saturating_sub(1)).unwrap_or(0);
    delays.get(i).or(delays.last()).copied().unwrap_or(Duration::from_secs(60))
}

async fn schedule_check(deps: &Deps, t: &TenantId, window_id: &str, attempt: u32) -> CoreResult<()> {
    schedule_check_at(deps, t, window_id, attempt, later(deps, delay_after(deps, attempt))).await
}

async fn schedule_check_at(
    deps: &Deps,
    t: &TenantId,
    window_id: &str,
    attempt: u32,
    at: chrono::DateTime<chrono::Utc>,
) -> CoreResult<()> {
    let task = TimerTask::RestockCheck { tenant: t.clone(), window_id: window_id.to_owned(), attempt };
    timer::schedule(deps, at, task).await
}

enum Verdict {
    Sent,
    Open,
    /// Failed for now on these channels, the last of them at this time: try them again later.
    Transient(Vec<Channel>, Option<chrono::DateTime<chrono::Utc>>),
    Permanent,
}

/// The outcome of one send. The external channels (email, sms, push) decide when there are any:
/// an in-app copy alone does not make a failed email "sent".
async fn judge(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<Verdict> {
    let orchestrated = api::load(deps, t, notification_id).await?.is_some_and(|n| n.orchestrated);
    let mut deliveries = Vec::new();
    let mut cursor = None;
    loop {
        let Some(page) = api::list_deliveries(deps, t, notification_id, 100, cursor).await? else {
            return Ok(Verdict::Permanent);
        };
        deliveries.extend(page.items);
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    if !orchestrated || deliveries.iter().any(|d| d.status.is_open()) {
        return Ok(Verdict::Open);
    }
    let external: Vec<_> = deliveries.iter().filter(|d| d.channel != Channel::Inapp).collect();
    let deciding: Vec<_> = if external.is_empty() { deliveries.iter().collect() } else { external };
    let delivered = |s: DeliveryStatus| {
        matches!(s, DeliveryStatus::Sent | DeliveryStatus::Delivered | DeliveryStatus::Opened | DeliveryStatus::Clicked)
    };
    if deciding.iter().any(|d| delivered(d.status)) {
        return Ok(Verdict::Sent);
    }
    let dead: Vec<_> = deciding.iter().filter(|d| d.status == DeliveryStatus::Dead).collect();
    let failed_at = dead
        .iter()
        .filter_map(|d| chrono::DateTime::parse_from_rfc3339(&d.updated_at).ok())
        .map(|at| at.with_timezone(&chrono::Utc))
        .max();
    let channels: Vec<Channel> = dead.iter().map(|d| d.channel).collect();
    if channels.is_empty() { Ok(Verdict::Permanent) } else { Ok(Verdict::Transient(channels, failed_at)) }
}

/// Judges attempt `attempt` of a message, and retries, gives up to MANUAL, or marks it.
pub async fn check(deps: &Deps, t: &TenantId, window_id: &str, attempt: u32) -> CoreResult<()> {
    let Some(message) = load_message(deps, t, window_id).await? else { return Ok(()) };
    if message.attempt != attempt || message.status != MessageStatus::Sending {
        return Ok(());
    }
    let Some(notification_id) = message.notification_id.clone() else { return Ok(()) };
    let user = message.user_id.as_str();
    let message_key = keys::message(t, window_id);
    let set_message = |status: &'static str| {
        deps.table.update(
            &message_key,
            vec![Update::set("status", status), Update::set("updated_at", now_text(deps))],
            Cond::And(vec![Cond::eq("attempt", i64::from(attempt)), Cond::eq("status", "SENDING")]),
        )
    };
    match judge(deps, t, &notification_id).await? {
        Verdict::Sent => {
            set_message("SENT").await?;
            set_notices(deps, t, user, &message.items, NoticeStatus::Sent, &[("sent_at", json!(now_text(deps)))]).await
        }
        // Still on its way (the channel worker retries on its own first): look again later.
        Verdict::Open => schedule_check(deps, t, window_id, attempt).await,
        Verdict::Permanent => {
            set_message("UNREACHABLE").await?;
            set_notices(deps, t, user, &message.items, NoticeStatus::Unreachable, &[]).await
        }
        Verdict::Transient(channels, failed_at) => {
            let retries = u32::try_from(deps.config.restock.retry_delays.len()).unwrap_or(u32::MAX);
            if attempt > retries {
                set_message("MANUAL").await?;
                info!(tenant = %t, window_id, attempt, "restock message retries exhausted: MANUAL");
                return set_notices(deps, t, user, &message.items, NoticeStatus::Manual, &[]).await;
            }
            // The retry comes its delay after the failure, not after the send: a send that
            // failed late (after waiting in its queue) is not retried early.
            if let Some(failed_at) = failed_at {
                let due = failed_at + chrono::Duration::from_std(delay_after(deps, attempt)).unwrap_or_default();
                if due > deps.clock.now() {
                    return schedule_check_at(deps, t, window_id, attempt, due).await;
                }
            }
            // Users who cancelled since are not retried: they asked for nothing more.
            let (keep, cancelled) = split_cancelled(deps, t, &message.items).await?;
            set_notices(deps, t, user, &cancelled, NoticeStatus::Cancelled, &[]).await?;
            if keep.is_empty() {
                set_message("CANCELLED").await?;
                return Ok(());
            }
            let next = attempt + 1;
            let key = idempotency_key(&[t.as_str(), window_id, &next.to_string()]);
            let id = send(deps, t, user, &keep, key, Some(&channels)).await?;
            let updates = vec![
                Update::set("attempt", i64::from(next)),
                Update::set("notification_id", id.as_str()),
                Update::Set("items".into(), serde_json::to_value(&keep)?),
                Update::set("updated_at", now_text(deps)),
            ];
            match deps
                .table
                .update(&keys::message(t, window_id), updates, Cond::eq("attempt", i64::from(attempt)))
                .await
            {
                Ok(_) => {}
                Err(StoreError::ConditionFailed { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            set_notices(
                deps,
                t,
                user,
                &keep,
                NoticeStatus::Failed,
                &[("attempts", json!(next)), ("notification_id", json!(id))],
            )
            .await?;
            info!(tenant = %t, window_id, attempt = next, "restock message retried");
            schedule_check(deps, t, window_id, next).await
        }
    }
}

async fn split_cancelled(
    deps: &Deps,
    t: &TenantId,
    items: &[MessageItem],
) -> CoreResult<(Vec<MessageItem>, Vec<MessageItem>)> {
    let mut keep = Vec::new();
    let mut cancelled = Vec::new();
    for item in items {
        let sub = subscriptions::get(deps, t, &item.subscription_id).await?;
        if sub.is_some_and(|s| s.status == SubscriptionStatus::Cancelled) {
            cancelled.push(item.clone());
        } else {
            keep.push(item.clone());
        }
    }
    Ok((keep, cancelled))
}

/// One page of notices in one status.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct NoticePage {
    pub items: Vec<Notice>,
    pub next_cursor: Option<String>,
}

/// Notices by status (every status is indexed: `MANUAL` for operators to resend, `UNREACHABLE`,
/// `FAILED`, `SENT`, ... to see what became of an alert), oldest batch first.
pub async fn list_notices(
    deps: &Deps,
    t: &TenantId,
    status: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<NoticePage> {
    let Some(status) = NoticeStatus::ALL.into_iter().find(|s| s.as_str() == status) else {
        let names: Vec<&str> = NoticeStatus::ALL.iter().map(|s| s.as_str()).collect();
        return Err(CoreError::invalid("status", format!("must be one of {}", names.join(", "))));
    };
    let pk = keys::status_pk(t, status.as_str());
    let page = deps.table.query(&pk, "", QueryOpts { limit, cursor, descending: false }).await;
    let page = page.map_err(CoreError::of_page_query)?;
    let keys: Vec<_> = page
        .items
        .iter()
        .filter_map(|entry| Some(keys::notice(t, entry.str("batch_no")?, entry.str("user_id")?)))
        .collect();
    let mut items = Vec::with_capacity(keys.len());
    for notice in deps.table.get_many(&keys).await?.into_iter().flatten() {
        let notice: Notice = notice.parse()?;
        if notice.status == status {
            items.push(notice);
        }
    }
    Ok(NoticePage { items, next_cursor: page.next_cursor })
}

/// What a resend did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ResendReport {
    pub batch_no: String,
    pub resent: u64,
    pub skipped_cancelled: u64,
}

/// Resends a batch's MANUAL notices, once per (batch, user): a repeat finds them RESENT. Users
/// who cancelled are skipped (and marked CANCELLED).
pub async fn resend(deps: &Deps, t: &TenantId, batch_no: &str) -> CoreResult<ResendReport> {
    check_id("batch_no", batch_no)?;
    let mut report = ResendReport { batch_no: batch_no.to_owned(), ..Default::default() };
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(&keys::notice_pk(t, batch_no), "", QueryOpts { limit: 100, cursor, descending: false })
            .await?;
        for item in &page.items {
            let notice: Notice = item.parse()?;
            if notice.status != NoticeStatus::Manual {
                continue;
            }
            let one = [MessageItem {
                sku_id: notice.sku_id.clone(),
                batch_no: notice.batch_no.clone(),
                subscription_id: notice.subscription_id.clone(),
            }];
            let (keep, cancelled) = split_cancelled(deps, t, &one).await?;
            if !cancelled.is_empty() {
                set_notices(deps, t, &notice.user_id, &cancelled, NoticeStatus::Cancelled, &[]).await?;
                report.skipped_cancelled += 1;
                continue;
            }
            let key = idempotency_key(&[t.as_str(), "resend", batch_no, &notice.user_id]);
            let id = send(deps, t, &notice.user_id, &keep, key, None).await?;
            set_notices(deps, t, &notice.user_id, &keep, NoticeStatus::Resent, &[("notification_id", json!(id))])
                .await?;
            report.resent += 1;
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    if report.resent == 0 && report.skipped_cancelled == 0 && !batch_exists(deps, t, batch_no).await? {
        return Err(CoreError::NotFound { what: "batch" });
    }
    Ok(report)
}

async fn batch_exists(deps: &Deps, t: &TenantId, batch_no: &str) -> CoreResult<bool> {
    let page = deps
        .table
        .query(&keys::notice_pk(t, batch_no), "", QueryOpts { limit: 1, cursor: None, descending: false })
        .await?;
    Ok(!page.items.is_empty())
}

/// A notice, for tests and tools.
pub async fn get_notice(deps: &Deps, t: &TenantId, batch_no: &str, user: &str) -> CoreResult<Option<Notice>> {
    Ok(deps.table.get(&keys::notice(t, batch_no, user)).await?.map(|i| i.parse()).transpose()?)
}
