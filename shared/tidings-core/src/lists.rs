//! A tenant's lists: notifications (newest first, by status and time), templates, users, and a
//! user's devices.
//!
//! Each list is one query of one partition of the tenant's own (`keys::users_list_pk` and its
//! neighbours), so a cursor can only move within the tenant that asked. The entries of the
//! notifications, templates and users lists are written in the same transaction as the thing
//! they list, by the module that writes it (`notify::api`, `templates`, `people::users`), so a
//! list never misses an item nor shows one that is not there. What was written before the
//! lists existed has no entry (docs/http-api.md, "Lists"): a user or template shows once it is written
//! again; a notification accepted before does not show.

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::notify::api::{NotificationEntry, NotificationView, view_of};
use crate::notify::model::{Notification, NotificationStatus};
use crate::people::devices::Device;
use crate::people::users::User;
use crate::ports::{Item, QueryOpts};
use crate::templates::TemplateSummary;

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct UserPage {
    pub items: Vec<User>,
    pub next_cursor: Option<String>,
}

/// One page of the tenant's users, in user-id order.
pub async fn users(deps: &Deps, t: &TenantId, limit: usize, cursor: Option<String>) -> CoreResult<UserPage> {
    let page = deps
        .table
        .query(&keys::users_list_pk(t), keys::USER_ENTRY_PREFIX, QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<User>, _>>()?;
    Ok(UserPage { items, next_cursor: page.next_cursor })
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct TemplatePage {
    pub items: Vec<TemplateSummary>,
    pub next_cursor: Option<String>,
}

/// One page of the tenant's templates, in template-id order.
pub async fn templates(deps: &Deps, t: &TenantId, limit: usize, cursor: Option<String>) -> CoreResult<TemplatePage> {
    let page = deps
        .table
        .query(&keys::templates_list_pk(t), keys::TEMPLATE_ENTRY_PREFIX, QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<TemplateSummary>, _>>()?;
    Ok(TemplatePage { items, next_cursor: page.next_cursor })
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DevicePage {
    pub items: Vec<Device>,
    pub next_cursor: Option<String>,
}

/// One page of a user's devices (the items push sends to), in token-hash order. A user the
/// shop never wrote may have devices (they are registered on their own): no 404.
pub async fn devices(
    deps: &Deps,
    t: &TenantId,
    user_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<DevicePage> {
    check_id("user_id", user_id)?;
    let page = deps
        .table
        .query(&keys::user_pk(t, user_id), keys::DEVICE_SK_PREFIX, QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<Device>, _>>()?;
    Ok(DevicePage { items, next_cursor: page.next_cursor })
}

/// The filters of the notifications list.
#[derive(Clone, Debug, Default)]
pub struct NotificationFilter {
    /// The status as `GET /v1/notifications/{id}` shows it.
    pub status: Option<NotificationStatus>,
    /// Accepted at or after.
    pub since: Option<DateTime<Utc>>,
    /// Accepted before.
    pub until: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct NotificationPage {
    pub items: Vec<NotificationView>,
    pub next_cursor: Option<String>,
}

/// List entries read for one page of a status-filtered list, at most: a page then holds
/// fewer than `limit` items (maybe none) and a `next_cursor` to go on from.
pub const MAX_ENTRIES_READ: usize = 1000;

/// Notifications read at once while a page is built (each reads its counters).
const VIEW_CONCURRENCY: usize = 16;

/// The millisecond an instant falls in, rounded up: a notification accepted at millisecond `m`
/// is at or after `since` exactly when `m >= ceil_ms(since)`.
fn ceil_ms(at: DateTime<Utc>) -> i64 {
    let ms = at.timestamp_millis();
    if at.timestamp_subsec_nanos().is_multiple_of(1_000_000) { ms } else { ms + 1 }
}

/// One page of the tenant's notifications, newest first. The time range is the query's key
/// condition (`since <= accepted < until`); the status is each notification's, read with its
/// counters, so a page of a status filter holds the matches among the entries it read.
pub async fn notifications(
    deps: &Deps,
    t: &TenantId,
    filter: &NotificationFilter,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<NotificationPage> {
    // An empty window holds no notification: an empty page, as any other window with none.
    if let (Some(since), Some(until)) = (filter.since, filter.until)
        && since > until
    {
        return Ok(NotificationPage { items: Vec::new(), next_cursor: None });
    }
    let pk = keys::notifications_list_pk(t);
    // Entries are `{created_ms:015}#{id}`: `{ms:015}` sorts before every entry of that
    // millisecond and after every earlier one, and `~` after every entry.
    let from = format!("{:015}", filter.since.map_or(0, ceil_ms).max(0));
    let to = match filter.until {
        Some(until) => format!("{:015}", ceil_ms(until).max(0)),
        None => "~".to_owned(),
    };
    let mut items = Vec::new();
    let mut cursor = cursor;
    let mut read = 0;
    loop {
        let want = limit.saturating_sub(items.len()).max(1);
        let page = deps
            .table
            .query_range(&pk, &from, &to, QueryOpts { limit: want, cursor, descending: true })
            .await
            .map_err(CoreError::of_page_query)?;
        read += page.items.len();
        let entries = page.items.iter().map(Item::parse).collect::<Result<Vec<NotificationEntry>, _>>()?;
        let keys: Vec<_> = entries.iter().map(|e| keys::notification(t, &e.notification_id)).collect();
        let found = deps.table.get_many(&keys).await?;
        let notifications = found.iter().flatten().map(Item::parse).collect::<Result<Vec<Notification>, _>>()?;
        let views: Vec<NotificationView> =
            futures::stream::iter(notifications.into_iter().map(|n| view_of(deps, t, n)))
                .buffered(VIEW_CONCURRENCY)
                .try_collect()
                .await?;
        items.extend(views.into_iter().filter(|v| filter.status.is_none_or(|s| v.status == s)));
        cursor = page.next_cursor;
        if cursor.is_none() || items.len() >= limit || read >= MAX_ENTRIES_READ {
            return Ok(NotificationPage { items, next_cursor: cursor });
        }
    }
}
