//! A campaign's end, told to the shop once: the `campaign.completed` webhook event.
//!
//! A campaign has ended when every expansion page is done and none of its deliveries is
//! still queued — a fact of counters spread over many shards (`super::progress`), which no
//! single write makes true, so no write can emit the event in its own transaction. Instead:
//! - when its last page is known ([`super::campaign::set_last_page`]), a counted notification
//!   (a campaign) is put in the open list:
//!
//!   | item | pk | sk |
//!   |---|---|---|
//!   | open campaign | `CAMPAIGNS#OPEN` | `{tenant}#{notification_id}` |
//!
//! - every minute the tick ([`crate::schedules::every_minute`]) reads the open list and, for each
//!   campaign whose every delivery has ended (`GET /v1/notifications/{id}` reads `completed`,
//!   `completed_with_failures` or `failed`), writes the event, with that `status`, to the webhook
//!   outbox and takes the campaign off the list. A cancelled or deleted one is taken off without
//!   an event.
//!
//! The event's id is derived from the tenant and the notification, and its outbox item is put
//! only when absent: two ticks at once, or a tick that dies between the write and the removal,
//! write it once. It is told within a minute of the last delivery's end. The open list is one
//! partition: campaigns are few at a time (each holds a million deliveries), and a tick reads at
//! most [`MAX_PER_TICK`] of them. Where a tick stopped is kept (`CAMPAIGNS#OPEN#CURSOR`), and the
//! next tick goes on from there, back to the front once it reaches the end: with more open
//! campaigns than a tick reads, every one is still looked at within a few ticks, not only the
//! first ones of the list.

use serde::Serialize;
use serde_json::json;
use tracing::warn;

use super::model::NotificationStatus;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::ports::{Cond, Item, Key, QueryOpts, StoreError, Write};
use crate::webhooks::{Event, EventType};

const OPEN_PK: &str = "CAMPAIGNS#OPEN";
/// Where the last tick stopped in the open list (its own partition, so the list's reads never
/// see it).
const CURSOR_PK: &str = "CAMPAIGNS#OPEN#CURSOR";
const CURSOR_SK: &str = "cursor";

/// The most open campaigns one tick looks at (the rest wait for the next).
pub const MAX_PER_TICK: usize = 200;

fn open_key(t: &TenantId, notification_id: &str) -> Key {
    Key::new(OPEN_PK, format!("{t}#{notification_id}"))
}

/// Puts a campaign in the open list (again is harmless).
pub async fn watch(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<()> {
    let mut item = Item::new(open_key(t, notification_id), Default::default());
    item.attrs.insert("tenant".into(), t.as_str().into());
    item.attrs.insert("notification_id".into(), notification_id.into());
    deps.table.put(item, Cond::Always).await?;
    Ok(())
}

/// What a tick did with the open campaigns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CompletionReport {
    /// Open campaigns looked at.
    pub checked: u64,
    /// Campaigns found ended, whatever their outcome (their event written, if any endpoint
    /// subscribes).
    pub completed: u64,
}

/// Looks at the open campaigns: each ended one gets its `campaign.completed` event and
/// leaves the list. At most [`MAX_PER_TICK`], from where the last tick stopped.
pub async fn check_open(deps: &Deps) -> CoreResult<CompletionReport> {
    check_open_at_most(deps, MAX_PER_TICK).await
}

/// [`check_open`] looking at no more than `limit` open campaigns.
pub async fn check_open_at_most(deps: &Deps, limit: usize) -> CoreResult<CompletionReport> {
    let mut report = CompletionReport::default();
    let cursor_key = Key::new(CURSOR_PK, CURSOR_SK);
    let mut cursor = deps
        .table
        .get(&cursor_key)
        .await?
        .and_then(|item| item.attrs.get("after").and_then(|v| v.as_str()).map(str::to_owned));
    let resumed = cursor.is_some();
    let limit = limit.max(1);
    loop {
        let want = (limit - report.checked as usize).min(100);
        let page = deps.table.query(OPEN_PK, "", QueryOpts { limit: want, cursor, descending: false }).await?;
        for entry in &page.items {
            report.checked += 1;
            match check_one(deps, entry).await {
                Ok(true) => report.completed += 1,
                Ok(false) => {}
                // One campaign's trouble does not hold the others back; it is looked at again.
                Err(e) => warn!(sk = %entry.key.sk, error = %e, "open campaign not checked"),
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() || report.checked as usize >= limit {
            break;
        }
    }
    // The next tick goes on after the last campaign looked at, or from the front.
    match cursor {
        Some(after) => {
            let mut item = Item::new(cursor_key, Default::default());
            item.attrs.insert("after".into(), after.into());
            deps.table.put(item, Cond::Always).await?;
        }
        None if resumed => deps.table.delete(&cursor_key, Cond::Always).await?,
        None => {}
    }
    Ok(report)
}

/// `true` when the campaign was found ended (and its event written).
async fn check_one(deps: &Deps, entry: &Item) -> CoreResult<bool> {
    let text = |name: &str| entry.attrs.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let (tenant, id) = (text("tenant"), text("notification_id"));
    let Ok(t) = TenantId::parse(&tenant) else {
        deps.table.delete(&entry.key, Cond::Always).await?;
        return Ok(false);
    };
    let Some(n) = super::api::load(deps, &t, &id).await? else {
        deps.table.delete(&entry.key, Cond::Always).await?;
        return Ok(false);
    };
    let view = super::api::view_of(deps, &t, n).await?;
    match view.status {
        // Ended, however it went: the event says how (`status`), as `GET /v1/notifications/{id}`.
        NotificationStatus::Completed | NotificationStatus::CompletedWithFailures | NotificationStatus::Failed => {
            let data = json!({
                "notification_id": view.notification_id,
                "status": view.status,
                "template_id": view.template_id,
                "segment": view.segment,
                "expanded": view.expanded,
                "counts": view.counts,
            });
            let event = Event::of(deps, &t, EventType::CampaignCompleted, &[&id], data);
            for write in crate::webhooks::event_writes(deps, &t, vec![event]).await? {
                let Write::Put { item, .. } = write else { continue };
                match deps.table.put(item, Cond::NotExists).await {
                    Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            deps.table.delete(&entry.key, Cond::Always).await?;
            Ok(true)
        }
        NotificationStatus::Cancelled => {
            deps.table.delete(&entry.key, Cond::Always).await?;
            Ok(false)
        }
        _ => Ok(false),
    }
}
