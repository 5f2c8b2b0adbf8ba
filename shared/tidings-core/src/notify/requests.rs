//! The request lanes' step: one request message → its notification's page of users, each
//! planned by the orchestrator ([`super::orchestrator`]: a template send's deliveries) or
//! started as a workflow run ([`crate::workflows::run`]). Here, above both, so neither imports
//! the other's caller.

use tracing::{instrument, warn};

use super::api::load;
use super::model::{DeliveryStatus, Notification, NotificationStatus, RequestMessage};
use super::orchestrator::{self, start_processing};
use super::{batch, campaign, send_batch};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::outcome::Outcome;
use crate::people::users::{self, User};
use crate::tasks::{Step, Task};

/// The request lanes' step: one request task ([`orchestrate_task`]).
pub struct Orchestrate;

impl Step for Orchestrate {
    type Body = RequestMessage;
    const WHAT: &'static str = "request message";
    async fn run(deps: &Deps, task: &Task<RequestMessage>) -> CoreResult<Outcome> {
        orchestrate_task(deps, &task.body.tenant, &task.body).await.map(|()| Outcome::Done)
    }
}

/// Orchestrates a whole notification from its first task (a `user_ids` list, or a campaign's
/// first page, which queues the next).
pub async fn orchestrate(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<()> {
    orchestrate_task(deps, t, &RequestMessage::first(t, notification_id)).await
}

/// One request task: a `user_ids` notification (one page, 0), or one page of a campaign read
/// from the segment's index with the task's cursor (see [`super::campaign`]). Both go through
/// the same per-user code ([`orchestrate_page`]). A page done already does nothing, so a
/// retried or redriven task creates nothing twice.
#[instrument(skip(deps, t, task), fields(tenant = %t, notification_id = %task.notification_id, page = task.page))]
pub async fn orchestrate_task(deps: &Deps, t: &TenantId, task: &RequestMessage) -> CoreResult<()> {
    let Some(n) = load(deps, t, &task.notification_id).await? else {
        warn!("notification not found; nothing to do");
        return Ok(());
    };
    // A scheduled notification is started by its timer (`schedule::fire`), never early.
    if n.status == NotificationStatus::Scheduled {
        return Ok(());
    }
    // Accepted before page markers existed: done once orchestrated.
    if (!n.counted && n.orchestrated) || campaign::page_done(deps, t, &n.notification_id, task.page).await? {
        return Ok(());
    }
    if n.status == NotificationStatus::Cancelled {
        return close_cancelled_page(deps, t, &n, task).await;
    }
    start_processing(deps, t, &n).await?;
    let (users, next) = page_users(deps, t, &n, task).await?;
    // The next page before this one's work, so pages overlap; its item is the outbox entry
    // that queues it, put once whatever happens to this task.
    if let Some(cursor) = &next {
        campaign::queue_page(deps, t, &n, task.page + 1, cursor.clone()).await?;
    }
    orchestrate_page(deps, t, &n, task.page, &users).await?;
    // The last page is recorded before the page is marked done: a task cut off between the two
    // (a crash, an invocation's deadline) finds its page not done when it comes again, and does
    // both. The other way round, the retry found the page done and returned, and a notification
    // whose last page was never recorded stayed `processing` for ever.
    if next.is_none() {
        campaign::set_last_page(deps, t, &n.notification_id, task.page).await?;
    }
    campaign::finish_page(deps, t, &n.notification_id, task.page, users.len()).await?;
    Ok(())
}

/// The users of a request task's page, and the cursor of the next page (a campaign's).
async fn page_users(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    task: &RequestMessage,
) -> CoreResult<(Vec<(String, Option<User>)>, Option<String>)> {
    Ok(match n.segment() {
        Some(tag) => {
            let (users, next) =
                users::segment_page(deps, t, tag, deps.config.campaign_page_size, task.cursor.clone()).await?;
            (users.into_iter().map(|u| (u.user_id.clone(), Some(u))).collect(), next)
        }
        None => (users::get_users(deps, t, n.request.user_ids()).await?, None),
    })
}

/// A page task of a cancelled template send whose page is not done: an earlier run of it may
/// have been stopped (a crash, an invocation's deadline) after writing its deliveries and
/// before queueing their tasks, and no worker would ever see them. Its deliveries still
/// `pending` and its send batches still open are closed `suppressed` (`cancelled`), with their
/// counters, so a cancelled notification's every delivery ends (docs/delivery.md, "Cancel").
/// A page that counted nothing queued (never started, the common case) costs one query. A
/// workflow's runs are ended by the cancel's own sweep.
async fn close_cancelled_page(deps: &Deps, t: &TenantId, n: &Notification, task: &RequestMessage) -> CoreResult<()> {
    if n.workflow.is_some() || campaign::page_queued(deps, t, &n.notification_id, task.page).await? == 0 {
        return Ok(());
    }
    let (users, _) = page_users(deps, t, n, task).await?;
    let ids: Vec<&str> = users.iter().map(|(id, _)| id.as_str()).collect();
    let mut closed = orchestrator::close_pending(deps, t, n, task.page, &ids).await?;
    let made = batch::page_batches(deps.table.as_ref(), t, &n.notification_id, task.page).await?;
    for (key, b) in &made.batches {
        if matches!(b.status, batch::BatchStatus::Pending | batch::BatchStatus::Dead) {
            let close = send_batch::Close { to: DeliveryStatus::Suppressed, reason: "cancelled", last_error: None };
            if send_batch::close_open(deps, t, key, b, close).await? {
                closed += b.entries.iter().filter(|e| e.is_open()).count();
            }
        }
    }
    if closed > 0 {
        warn!(closed, "closed a cancelled page's deliveries that were never queued");
    }
    Ok(())
}

/// One page of users: a workflow send's runs, or a template send's deliveries.
pub(crate) async fn orchestrate_page(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    page: u64,
    users: &[(String, Option<User>)],
) -> CoreResult<()> {
    match &n.workflow {
        Some(wref) => crate::workflows::run::start_page(deps, t, n, wref, page, users).await,
        None => orchestrator::orchestrate_page(deps, t, n, page, users).await,
    }
}
