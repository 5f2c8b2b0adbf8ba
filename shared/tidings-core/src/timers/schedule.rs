//! Scheduled sends (docs/timers.md, "Scheduled sends"): a notification with `send_at` is accepted
//! as `scheduled`; its insert, read from the change stream by the relay ([`on_scheduled`]), sets a
//! timer (the shared mechanism: an SQS delay under 15 minutes, else a minute bucket fired by `tick`
//! under a lease). When the timer fires ([`fire`]) the notification is orchestrated like any other.
//! Cancelling it before then (`scheduled` → `cancelled`) makes the timer find nothing to do.
//!
//! `local_time: true`: `send_at`'s wall-clock time is used in each user's zone, so the users are
//! grouped by zone and each group gets its own timer; each group is one page of the
//! notification (`notify::campaign`'s page markers), so it completes when every group has fired.
//!
//! A segment with `local_time` is expanded page by page when the earliest zone's time comes;
//! each member whose own time is later waits as a deferred delivery with its timer
//! (`reason: local_time`), so memory stays flat whatever the segment's size.
//!
//! Timers are at least once: a group firing twice plans nothing twice (deliveries are created by
//! conditional puts).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use tracing::info;

use super::task::{self as timer, TimerTask};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::notify::api::load;
use crate::notify::model::{Notification, NotificationStatus};
use crate::notify::{campaign, orchestrator, requests};
use crate::people::users;
use crate::people::zones::Zone;

/// The relay's part: sets the timers of a newly accepted scheduled notification.
pub async fn on_scheduled(deps: &Deps, t: &TenantId, n: &Notification) -> CoreResult<()> {
    let Some(send_at) = n.request.send_at else { return Ok(()) };
    let task = |users: Option<Vec<String>>, group: u32, groups: u32| TimerTask::ScheduledSend {
        tenant: t.clone(),
        notification_id: n.notification_id.clone(),
        users,
        group,
        groups,
    };
    if !n.request.local_time {
        return timer::schedule(deps, send_at, task(None, 0, 1)).await;
    }
    if n.segment().is_some() {
        // A segment is not read up front: its pages are expanded when the earliest zone's
        // wall-clock time comes, and each member whose time has not come yet waits for it
        // (a deferred delivery and its timer; `policy::check`).
        let wall = send_at.naive_utc();
        let earliest = Zone::all().map(|tz| tz.instant(wall.date(), wall.time())).min().unwrap_or(send_at);
        return timer::schedule(deps, earliest, task(None, 0, 1)).await;
    }
    let groups = local_groups(deps, t, n, send_at).await?;
    let count = u32::try_from(groups.len()).unwrap_or(u32::MAX);
    for (i, (due, users)) in groups.into_iter().enumerate() {
        timer::schedule(deps, due, task(Some(users), u32::try_from(i).unwrap_or(u32::MAX), count)).await?;
    }
    Ok(())
}

/// The users grouped by when `send_at`'s wall-clock time comes in their zone (users without a
/// zone: UTC).
async fn local_groups(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    send_at: DateTime<Utc>,
) -> CoreResult<Vec<(DateTime<Utc>, Vec<String>)>> {
    let wall = send_at.naive_utc();
    let mut by_due: BTreeMap<DateTime<Utc>, Vec<String>> = BTreeMap::new();
    for user_id in n.request.user_ids() {
        let zone = users::get_user(deps, t, &user_id).await?.and_then(|u| u.timezone);
        let due = Zone::of(zone.as_deref()).instant(wall.date(), wall.time());
        by_due.entry(due).or_default().push(user_id);
    }
    Ok(by_due.into_iter().collect())
}

/// A scheduled notification's timer: orchestrates it like an accepted one (a campaign page by
/// page), or with `local_time` one zone's users as page `group` of `groups`.
pub async fn fire(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    users: Option<Vec<String>>,
    group: u32,
    groups: u32,
) -> CoreResult<()> {
    let Some(n) = load(deps, t, notification_id).await? else { return Ok(()) };
    if n.status == NotificationStatus::Cancelled {
        info!(tenant = %t, notification_id, "scheduled notification cancelled; timer ignored");
        return Ok(());
    }
    orchestrator::start_processing(deps, t, &n).await?;
    let Some(users) = users else {
        return requests::orchestrate(deps, t, notification_id).await;
    };
    let page = u64::from(group);
    if campaign::page_done(deps, t, notification_id, page).await? {
        return Ok(());
    }
    let mut planned = Vec::with_capacity(users.len());
    for user_id in users {
        let user = users::get_user(deps, t, &user_id).await?;
        planned.push((user_id, user));
    }
    requests::orchestrate_page(deps, t, &n, page, &planned).await?;
    // Every group knows the last page; completion waits for all of them (see `get_notification`).
    // Recorded before the group's page is marked done, as `requests::orchestrate_task` does: a
    // timer cut off between the two does both when it comes again.
    campaign::set_last_page(deps, t, notification_id, u64::from(groups.saturating_sub(1))).await?;
    campaign::finish_page(deps, t, notification_id, page, planned.len()).await?;
    Ok(())
}
