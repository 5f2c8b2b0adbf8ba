//! The orchestrator: one request message → per user and channel, the policy checks (see
//! [`super::policy`]), a delivery record and a rendered channel task (in-app goes straight to
//! the inbox). Idempotent: a delivery is created by a conditional put, so a repeated request
//! message creates nothing twice; deliveries still `pending` are queued again (the channel
//! worker deduplicates). Quiet hours defer a delivery through a timer
//! ([`resume_deferred`]); scheduled sends start through one (`crate::timers::schedule`).

use std::collections::BTreeMap;

use tracing::{info, instrument};

use super::api::load;
use super::batch;
use super::campaign;
use super::model::{ChannelMessage, ChannelTask, Delivery, DeliveryStatus, Notification, NotificationStatus};
use super::policy::{self, Recipient, Verdict};
use super::progress;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::inbox;
use crate::keys;
use crate::people::users::{self, User};
use crate::people::{devices, preferences};
use crate::ports::{Channel, Cond, Item, Key, OutMessage, StoreError, Update, Updating, Write, attrs_of};
use crate::templates::{self, Template};
use crate::timers::task::{self as timer, TimerTask};
use crate::tracking::LinkHosts;

/// `accepted` or `scheduled` → `processing` (once; a lost race is fine).
pub(crate) async fn start_processing(deps: &Deps, t: &TenantId, n: &Notification) -> CoreResult<()> {
    if !matches!(n.status, NotificationStatus::Accepted | NotificationStatus::Scheduled) {
        return Ok(());
    }
    let r = deps
        .table
        .update(
            &keys::notification(t, &n.notification_id),
            vec![Update::set("status", "processing")],
            Cond::is_in("status", ["accepted", "scheduled"]),
        )
        .await;
    match r {
        Ok(_) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How many users of a page are planned at once (their reads overlap; on DynamoDB a page of
/// sequential reads would take seconds).
const PLAN_CONCURRENCY: usize = 32;

/// Plans and queues the deliveries of one page of users of a template send, whether they came
/// from a `user_ids` list or a segment cursor (a workflow send's page starts runs instead:
/// [`super::requests::orchestrate_page`]). The deliveries' creations are held back and written in a few
/// large transactions with the page's progress counters ([`campaign::PageWriter`]); then the
/// tasks go out.
pub(crate) async fn orchestrate_page(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    page: u64,
    users: &[(String, Option<User>)],
) -> CoreResult<()> {
    // A page that may make send batches is planned by one run at a time (`batch::PageLease`);
    // a second run at the same time waits for the message's retry.
    let lease = if batch::needs_page_lease(n) {
        let hold = i64::try_from(deps.config.visibility.as_millis()).unwrap_or(i64::MAX);
        let now = deps.clock.now_ms();
        match batch::lease_page(deps.table.as_ref(), t, &n.notification_id, page, now, hold).await? {
            Some(lease) => Some(lease),
            None => return Err(CoreError::conflict("page_leased", "another run of this page is planning it")),
        }
    } else {
        None
    };
    let planned = plan_page(deps, t, n, page, users, lease.as_ref()).await;
    if let Some(lease) = &lease {
        lease.release(deps.table.as_ref()).await;
    }
    planned
}

/// [`orchestrate_page`] under its lease, if it needs one.
async fn plan_page(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    page: u64,
    users: &[(String, Option<User>)],
    lease: Option<&batch::PageLease>,
) -> CoreResult<()> {
    use futures::{StreamExt, TryStreamExt};
    let template = templates::get_template(deps, t, &n.request.template_id).await?;
    let hosts = crate::tracking::link_hosts_for(deps, t, template.as_ref()).await?;
    let hosts = &hosts;
    let writer = std::sync::Arc::new(campaign::PageWriter::new(
        deps.table.clone(),
        t,
        &n.notification_id,
        page,
        deps.clock.now_ms(),
    ));
    writer.prefetch(prefetch_keys(deps, t, n, users)).await?;
    // The users' devices in one read, when push may be used (`devices_if_push`).
    if may_push(n) {
        let queries = users.iter().map(|(user_id, _)| devices::query_of(t, user_id)).collect();
        writer.prefetch_queries(queries, devices::QUERY_LIMIT).await?;
    }
    // The send batches an earlier run of this page made (docs/delivery.md, "Send batches").
    let made = batch::page_batches(deps.table.as_ref(), t, &n.notification_id, page).await?;
    let page_deps = Deps { table: writer.clone(), ..deps.clone() };
    let template = template.as_ref();
    let made_ref = &made;
    type Planning<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = CoreResult<Vec<Planned>>> + Send + 'a>>;
    let plans: Vec<Planning<'_>> = users
        .iter()
        .map(|(user_id, user)| -> Planning<'_> {
            Box::pin(plan_user(&page_deps, t, n, user_id, user.as_ref(), template, hosts, Some(made_ref)))
        })
        .collect();
    let made_plans: Vec<Vec<Planned>> =
        futures::stream::iter(plans).buffer_unordered(PLAN_CONCURRENCY).try_collect().await?;
    // The batched sends' caps, counted for the whole page at once (a full one's suppressed
    // delivery is held by the writer, so before its flush).
    let (mut planned, mut gated) = (Vec::new(), Vec::new());
    for p in made_plans.into_iter().flatten() {
        match p {
            Planned::Gated(g) => gated.push(*g),
            other => planned.push(other),
        }
    }
    planned.extend(count_gates(&page_deps, t, n, gated).await?);
    let skip = writer.flush().await?;
    let mut tasks: BTreeMap<String, Vec<OutMessage>> = BTreeMap::new();
    let mut batched: BTreeMap<String, Vec<ChannelTask>> = BTreeMap::new();
    let mut requeued: BTreeMap<Key, (String, Vec<ChannelTask>)> = BTreeMap::new();
    for planned in planned {
        match planned {
            Planned::Task(queue, task) => {
                if skip.contains(&keys::delivery(t, &task.notification_id, &task.user_id, task.channel)) {
                    continue;
                }
                let body = serde_json::to_string(&task).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                tasks.entry(queue).or_default().push(OutMessage::new(body));
            }
            Planned::Batch(queue, task) => batched.entry(queue).or_default().push(task),
            Planned::Requeue(key, queue, task) => {
                requeued.entry(key).or_insert_with(|| (queue, Vec::new())).1.push(task)
            }
            Planned::Defer(_) | Planned::Gated(_) => {}
        }
    }
    // The page's new send batches, created with their counters; the pending ones of an earlier
    // run queued again.
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut next = made.next;
    for (queue, sends) in batched {
        let Some(lease) = lease else {
            return Err(StoreError::Invalid("send batches planned without the page's lease".into()).into());
        };
        let packed = batch::pack(t, n, page, next, sends, &now);
        next += packed.len() as u32;
        let messages =
            batch::write_batches(deps.table.as_ref(), t, &n.notification_id, deps.clock.now_ms(), lease, packed)
                .await?;
        for m in messages {
            let body =
                serde_json::to_string(&ChannelMessage::Batch(m)).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tasks.entry(queue.clone()).or_default().push(OutMessage::new(body));
        }
    }
    for (key, (queue, sends)) in requeued {
        let Some(existing) = made.batches.get(&key) else { continue };
        let m = batch::requeued(t, n, &key, existing, sends);
        let body = serde_json::to_string(&ChannelMessage::Batch(m)).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        tasks.entry(queue).or_default().push(OutMessage::new(body));
    }
    crate::crash::point("orchestrator.mid_fanout");
    let queued: usize = tasks.values().map(Vec::len).sum();
    for (queue, messages) in tasks {
        // Each in its tenant's turn on the shared lane (docs/delivery.md, "Fair lanes").
        let messages = messages.into_iter().map(|m| m.for_tenant(t)).collect();
        deps.queues.send_batch(&queue, messages).await?;
    }
    info!(notification_id = %n.notification_id, page, users = users.len(), queued, "orchestrated");
    Ok(())
}

/// What planning a page will read, item by item: each user's preferences, and per channel the
/// delivery, the address's suppression and the frequency counter of the day (not for a
/// batched send: [`count_gates`] counts it; a transactional SMS: its number's counters).
fn prefetch_keys(deps: &Deps, t: &TenantId, n: &Notification, users: &[(String, Option<User>)]) -> Vec<Key> {
    let channels: Vec<Channel> = match &n.request.channels {
        Some(c) => c.clone(),
        None => Channel::ALL.to_vec(),
    };
    let now = deps.clock.now();
    let marketing = n.request.category() != super::model::Category::Transactional;
    let mut keys = Vec::with_capacity(users.len() * (1 + 3 * channels.len()));
    let no_prefs = preferences::Preferences::default();
    for (user_id, user) in users {
        keys.push(keys::preferences(t, user_id));
        keys.push(keys::erasure(t, user_id));
        // Addresses and zone as the policy reads them (devices are not read ahead: push has no
        // suppression list).
        let r = Recipient { user_id, user: user.as_ref(), prefs: &no_prefs, devices: &[] };
        for &channel in &channels {
            keys.push(keys::delivery(t, &n.notification_id, user_id, channel));
            if matches!(channel, Channel::Email | Channel::Sms)
                && let Some(address) = r.address(channel)
            {
                keys.push(crate::people::suppression::key_of(t, channel, &address));
            }
            // A cap is read ahead only for a send that counts it in the delivery's transaction
            // (`PageWriter::transact` decides a full one on what was read); a batched send's cap
            // is counted by its own conditional update (`count_gates`), which reads nothing.
            if marketing && channel != Channel::Inapp && !batch::batchable(n.request.category(), channel) {
                keys.push(policy::cap_key(t, user_id, r.zone(), channel, now));
            }
            // A transactional SMS counts against its number's limits instead (none configured:
            // no writes, nothing to read).
            if !marketing
                && channel == Channel::Sms
                && let Some(address) = r.address(channel)
            {
                keys.extend(deps.config.abuse.number_keys(t, &address, now));
            }
        }
    }
    keys
}

/// What planning made of one user and channel, to queue.
enum Planned {
    /// A task of its own (its delivery is a `D#` item).
    Task(String, ChannelTask),
    /// A marketing send for the page's new send batches (`super::batch`); its cap is counted.
    Batch(String, ChannelTask),
    /// A marketing send for the page's new send batches whose gates (its frequency cap) are
    /// still to be counted: the page counts them all at once ([`count_gates`]).
    Gated(Box<Gated>),
    /// A member of a send batch an earlier run made, still `pending`: rendered again for the
    /// batch's message.
    Requeue(Key, String, ChannelTask),
    /// A workflow's send held back (quiet hours, `local_time`) until then: the run waits.
    Defer(chrono::DateTime<chrono::Utc>),
}

/// The per-user code: policy, channels, one delivery per channel.
#[allow(clippy::too_many_arguments)]
async fn plan_user(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    user_id: &str,
    user: Option<&User>,
    template: Option<&Template>,
    hosts: &LinkHosts,
    batches: Option<&batch::PageBatches>,
) -> CoreResult<Vec<Planned>> {
    let prefs = preferences::get(deps, t, user_id).await?;
    let devices = devices_if_push(deps, t, n, user_id).await?;
    let r = Recipient { user_id, user, prefs: &prefs, devices: &devices };
    let mut out = Vec::new();
    for channel in channels_for(n, &r, template) {
        if let Some(planned) =
            plan_delivery(&Planning { deps, t, n, r: &r, template, hosts, channel, batches, step: None }).await?
        {
            out.push(planned);
        }
    }
    Ok(out)
}

/// A delivery deferred by quiet hours, due now: checked again from the start (preferences may
/// have changed; the cap counts on the day it is sent) and queued.
#[instrument(skip(deps, t), fields(tenant = %t))]
pub async fn resume_deferred(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    user_id: &str,
    channel: Channel,
) -> CoreResult<()> {
    let Some(n) = load(deps, t, notification_id).await? else { return Ok(()) };
    if n.status == NotificationStatus::Cancelled {
        let key = keys::delivery(t, notification_id, user_id, channel);
        let Some(item) = deps.table.get(&key).await? else { return Ok(()) };
        let page = progress::page_of(&item);
        progress::transition(deps, cancelled_transition(deps, t, &n, user_id, page, &key)).await?;
        return Ok(());
    }
    let (template, hosts) = content_sources(deps, t, &n, channel).await?;
    let user = users::get_user(deps, t, user_id).await?;
    let prefs = preferences::get(deps, t, user_id).await?;
    let devices = devices_if_push(deps, t, &n, user_id).await?;
    let r = Recipient { user_id, user: user.as_ref(), prefs: &prefs, devices: &devices };
    let planning = Planning {
        deps,
        t,
        n: &n,
        r: &r,
        template: template.as_ref(),
        hosts: &hosts,
        channel,
        batches: None,
        step: None,
    };
    if let Some(Planned::Task(queue, task) | Planned::Batch(queue, task) | Planned::Requeue(_, queue, task)) =
        plan_delivery(&planning).await?
    {
        queue_one(deps, t, &queue, &task).await?;
    }
    Ok(())
}

/// A cancelled notification's `pending` delivery (deferred or never queued) closed
/// `suppressed` (`cancelled`), with its counters.
fn cancelled_transition<'a>(
    deps: &Deps,
    t: &'a TenantId,
    n: &'a Notification,
    user_id: &'a str,
    page: u64,
    key: &'a Key,
) -> progress::Transition<'a> {
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    progress::Transition {
        t,
        notification_id: &n.notification_id,
        user_id,
        page,
        key,
        from: DeliveryStatus::Pending,
        to: DeliveryStatus::Suppressed,
        also: None,
        updates: vec![
            Update::set("reason", "cancelled"),
            Update::Remove("deferred_until".into()),
            Update::set("updated_at", now),
        ],
    }
}

/// Closes a cancelled notification's deliveries of `page` for `user_ids` still `pending` (never
/// queued, or deferred) as `suppressed` (`cancelled`), with their counters. How many it closed.
pub(crate) async fn close_pending(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    page: u64,
    user_ids: &[&str],
) -> CoreResult<usize> {
    let channels = n.request.channels.as_deref().unwrap_or(&Channel::ALL[..]);
    let mut closed = 0;
    // 25 users of up to 4 channels: one read of at most 100 items.
    for chunk in user_ids.chunks(25) {
        let wanted: Vec<(&str, Key)> = chunk
            .iter()
            .flat_map(|u| channels.iter().map(move |&c| (*u, keys::delivery(t, &n.notification_id, u, c))))
            .collect();
        let keys: Vec<Key> = wanted.iter().map(|(_, k)| k.clone()).collect();
        let items = deps.table.get_many(&keys).await?;
        let open: Vec<(&str, &Key)> = wanted
            .iter()
            .zip(&items)
            .filter(|(_, item)| {
                item.as_ref().is_some_and(|i| {
                    progress::page_of(i) == page
                        && i.parse::<Delivery>().is_ok_and(|d| d.status == DeliveryStatus::Pending)
                })
            })
            .map(|((u, k), _)| (*u, k))
            .collect();
        for part in open.chunks(30) {
            let trs = part.iter().map(|(u, k)| cancelled_transition(deps, t, n, u, page, k)).collect();
            closed += progress::transition_many(deps, trs, Vec::new()).await?.into_iter().filter(|&c| c).count();
        }
    }
    Ok(closed)
}

/// What one delivery's content is rendered from: the notification's template, and for an email
/// the tenant's link hosts (`crate::tracking`).
async fn content_sources(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    channel: Channel,
) -> CoreResult<(Option<Template>, LinkHosts)> {
    let template = templates::get_template(deps, t, &n.request.template_id).await?;
    let hosts = match channel {
        Channel::Email => crate::tracking::link_hosts_for(deps, t, template.as_ref()).await?,
        _ => LinkHosts::default(),
    };
    Ok((template, hosts))
}

/// Queues one planned task on its lane, in its tenant's turn.
async fn queue_one(deps: &Deps, t: &TenantId, queue: &str, task: &ChannelTask) -> CoreResult<()> {
    let body = serde_json::to_string(task).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    deps.queues.send_batch(queue, vec![OutMessage::new(body).for_tenant(t)]).await?;
    Ok(())
}

/// What a workflow's send step made of one channel ([`plan_step_send`]).
#[derive(Clone, Debug, PartialEq)]
pub enum StepSend {
    /// Queued for its channel worker (or still on its way from an earlier drive).
    Queued,
    /// Sent already (an in-app message is at once).
    Sent,
    /// Not sent: the reason (`no_address`, `channel_off`, `workflow_off`, …).
    Suppressed(String),
    /// Cannot be sent (a render error), or failed for good: the error, and whether it failed at
    /// the provider (after a send was tried, so an earlier drive of the step queued it).
    Failed(String, bool),
    /// Held back until then (quiet hours, `local_time`).
    Deferred(chrono::DateTime<chrono::Utc>),
}

/// Plans one delivery of a workflow's send step `step` on `channel` (the same checks, content,
/// delivery record and task as a template send, the delivery `D#{user}#{channel}#{step}`,
/// counted in the run's page) and queues its task; what it made of it, from the delivery. A
/// second call for the same step finds the delivery and queues nothing new (a still pending one
/// again: the worker deduplicates).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn plan_step_send(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    page: u64,
    user_id: &str,
    user: Option<&User>,
    channel: Channel,
    (step, wake): (u32, bool),
) -> CoreResult<StepSend> {
    let (template, hosts) = content_sources(deps, t, n, channel).await?;
    let prefs = preferences::get(deps, t, user_id).await?;
    // The step's notification names its one channel: devices are read for a push only.
    let devices = devices_if_push(deps, t, n, user_id).await?;
    let r = Recipient { user_id, user, prefs: &prefs, devices: &devices };
    let writer = std::sync::Arc::new(campaign::PageWriter::new(
        deps.table.clone(),
        t,
        &n.notification_id,
        page,
        deps.clock.now_ms(),
    ));
    let page_deps = Deps { table: writer.clone(), ..deps.clone() };
    let planning = Planning {
        deps: &page_deps,
        t,
        n,
        r: &r,
        template: template.as_ref(),
        hosts: &hosts,
        channel,
        batches: None,
        step: Some(step),
    };
    let planned = plan_delivery(&planning).await?;
    let skip = writer.flush().await?;
    let key = keys::delivery_at(t, &n.notification_id, user_id, channel, Some(step));
    match planned {
        Some(Planned::Defer(until)) => return Ok(StepSend::Deferred(until)),
        Some(Planned::Task(queue, task) | Planned::Batch(queue, task) | Planned::Requeue(_, queue, task))
            if !skip.contains(&key) =>
        {
            queue_one(deps, t, &queue, &ChannelTask { wake, ..task }).await?;
        }
        _ => {}
    }
    let Some(item) = deps.table.get(&key).await? else {
        return Err(StoreError::Invalid("a step's delivery was not written".into()).into());
    };
    let d: Delivery = item.parse()?;
    Ok(match d.status {
        DeliveryStatus::Pending | DeliveryStatus::Sending => StepSend::Queued,
        DeliveryStatus::Sent | DeliveryStatus::Delivered | DeliveryStatus::Opened | DeliveryStatus::Clicked => {
            StepSend::Sent
        }
        DeliveryStatus::Suppressed => StepSend::Suppressed(d.reason.unwrap_or_default()),
        DeliveryStatus::Failed | DeliveryStatus::Dead => {
            StepSend::Failed(d.last_error.unwrap_or_default(), d.attempts > 0)
        }
    })
}

/// The user's devices, read only when push may be used (one query less per user otherwise).
async fn devices_if_push(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    user_id: &str,
) -> CoreResult<Vec<devices::Device>> {
    if !may_push(n) {
        return Ok(Vec::new());
    }
    devices::list(deps, t, user_id).await
}

/// Whether the notification may go by push: it names no channels, or push among them.
fn may_push(n: &Notification) -> bool {
    n.request.channels.as_ref().is_none_or(|c| c.contains(&Channel::Push))
}

/// The channels to try for a user: the request's, else what the user can receive (an address
/// or a device), that the template has content for, and that the user has not turned off.
fn channels_for(n: &Notification, r: &Recipient<'_>, template: Option<&Template>) -> Vec<Channel> {
    if let Some(channels) = &n.request.channels {
        let mut seen = Vec::new();
        for c in channels {
            if !seen.contains(c) {
                seen.push(*c);
            }
        }
        return seen;
    }
    let Some(template) = template else { return vec![Channel::Inapp] };
    let locale = r.user.and_then(|u| u.locale.as_deref());
    Channel::ALL
        .into_iter()
        .filter(|c| r.address(*c).is_some() && template.has_channel(*c, locale) && r.prefs.channel_on(*c))
        .collect()
}

fn new_delivery(n: &Notification, user_id: &str, channel: Channel, now: &str) -> Delivery {
    Delivery {
        user_id: user_id.to_owned(),
        channel,
        status: DeliveryStatus::Pending,
        attempts: 0,
        last_error: None,
        reason: None,
        sent_at: None,
        first_failed_at: None,
        lease_until_ms: None,
        provider_message_id: None,
        deferred_until: None,
        category: n.request.category(),
        updated_at: now.to_owned(),
        step: None,
    }
}

/// Writes a delivery that ends here (suppressed, failed); a lost race means someone else did.
/// A deferred delivery exists already: it moves with its progress counters.
async fn write_final(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    key: Key,
    delivery: &Delivery,
    deferred: Option<u64>,
) -> CoreResult<()> {
    let Some(page) = deferred else {
        return match deps.table.put(Item::new(key, attrs_of(delivery)?), Cond::NotExists).await {
            Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        };
    };
    let mut updates =
        vec![Update::Remove("deferred_until".into()), Update::set("updated_at", delivery.updated_at.clone())];
    updates.push(match &delivery.reason {
        Some(r) => Update::set("reason", r.clone()),
        None => Update::Remove("reason".into()),
    });
    if let Some(e) = &delivery.last_error {
        updates.push(Update::set("last_error", e.clone()));
    }
    progress::transition(
        deps,
        progress::Transition {
            t,
            notification_id: &n.notification_id,
            user_id: &delivery.user_id,
            page,
            key: &key,
            from: DeliveryStatus::Pending,
            to: delivery.status,
            also: Some(Cond::AttrExists("deferred_until".into())),
            updates,
        },
    )
    .await?;
    Ok(())
}

/// One delivery being planned: the notification, its recipient and channel, and what its
/// content is rendered from (the template, the tenant's link hosts).
#[derive(Clone, Copy)]
struct Planning<'a> {
    deps: &'a Deps,
    t: &'a TenantId,
    n: &'a Notification,
    r: &'a Recipient<'a>,
    template: Option<&'a Template>,
    hosts: &'a LinkHosts,
    channel: Channel,
    /// In a page: its send batches made already (a marketing push or SMS is sent through one).
    batches: Option<&'a batch::PageBatches>,
    /// A workflow's send step: its own delivery (`keys::delivery_at`), and a deferral handed back
    /// to the run ([`Planned::Defer`]) instead of a deferred delivery.
    step: Option<u32>,
}

impl Planning<'_> {
    /// Whether this delivery goes through a send batch (docs/delivery.md, "Send batches").
    fn batched(&self) -> bool {
        self.batches.is_some() && batch::batchable(self.n.request.category(), self.channel)
    }
}

/// Creates the delivery record (once) after the policy checks, and returns the task to queue,
/// if any. In order: where the delivery stands ([`start_of`]), the erasure and policy checks,
/// the content ([`content_of`]), then one transaction with the gates' writes
/// ([`write_planned`]). A delivery that ends here is written final ([`write_final`]).
async fn plan_delivery(p: &Planning<'_>) -> CoreResult<Option<Planned>> {
    let Planning { deps, t, n, r, channel, .. } = *p;
    let user_id = r.user_id;
    let key = keys::delivery_at(t, &n.notification_id, user_id, channel, p.step);
    // A member of a batch made already: fixed there (queued again while it is pending).
    if p.batched()
        && let Some((batch_key, pending)) = p.batches.and_then(|b| b.by_user.get(user_id))
    {
        return Ok(if *pending {
            requeue(p).map(|(q, task)| Planned::Requeue(batch_key.clone(), q, task))
        } else {
            None
        });
    }
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let deferred = match start_of(deps.table.get(&key).await?.as_ref())? {
        Start::New => None,
        Start::Resume(page) => Some(page),
        Start::Requeue => return Ok(requeue(p).map(|(q, task)| Planned::Task(q, task))),
        Start::Planned => return Ok(None),
    };
    let mut delivery = new_delivery(n, user_id, channel, &now);
    delivery.step = p.step;
    // An erased user gets nothing (`crate::people::erasure`).
    if crate::people::erasure::stops_planning(deps, t, n, user_id, r.user).await? {
        delivery.status = DeliveryStatus::Suppressed;
        delivery.reason = Some(crate::people::erasure::REASON.into());
        write_final(deps, t, n, key, &delivery, deferred).await?;
        return Ok(None);
    }
    let (to, writes) = match policy::check(deps, t, n, r, channel).await? {
        Verdict::Suppress(reason) => {
            delivery.status = DeliveryStatus::Suppressed;
            delivery.reason = Some(reason.as_str().into());
            write_final(deps, t, n, key, &delivery, deferred).await?;
            return Ok(None);
        }
        Verdict::Defer(until, _) if p.step.is_some() => return Ok(Some(Planned::Defer(until))),
        Verdict::Defer(until, why) => {
            defer(deps, t, n, key, &mut delivery, deferred, until, why).await?;
            return Ok(None);
        }
        Verdict::Send { to, writes } => (to, writes),
    };
    let content = match content_of(p, to) {
        Ok(content) => content,
        Err(last_error) => {
            delivery.status = DeliveryStatus::Failed;
            delivery.last_error = Some(last_error);
            write_final(deps, t, n, key, &delivery, deferred).await?;
            return Ok(None);
        }
    };
    if p.batched()
        && deferred.is_none()
        && let Content::Task(queue, task) = content
    {
        return batch_planned(key, delivery, writes, queue, task).map(Some);
    }
    Ok(write_planned(deps, t, n, key, delivery, deferred, writes, content)
        .await?
        .map(|(q, task)| Planned::Task(q, task)))
}

/// A marketing send for the page's send batches, its gates (the frequency cap) to count.
struct Gated {
    key: Key,
    delivery: Delivery,
    /// The gates not counted yet, in order, each with the reason a full one gives.
    gates: std::collections::VecDeque<(Updating, policy::SuppressReason)>,
    queue: String,
    task: ChannelTask,
}

/// A marketing send for the page's send batches: its gates are counted by the page
/// ([`count_gates`]), not in the page's transaction (docs/delivery.md, "Send batches").
fn batch_planned(
    key: Key,
    delivery: Delivery,
    writes: Vec<Write>,
    queue: String,
    task: ChannelTask,
) -> CoreResult<Planned> {
    let mut gates = std::collections::VecDeque::with_capacity(writes.len());
    for gate in writes {
        let reason = policy::gate_reason(&gate);
        let Write::Update { key, updates, cond } = gate else {
            return Err(StoreError::Invalid("a gate that is not an update".into()).into());
        };
        gates.push_back((Updating { key, updates, cond }, reason));
    }
    Ok(Planned::Gated(Box::new(Gated { key, delivery, gates, queue, task })))
}

/// Counts the gates of a page's batched sends: each a single conditional update, all of a
/// round in one request ([`crate::ports::Table::update_each`]), the sends' first gates first,
/// then the second gates of those that passed, and so on. The cap remembers the notification
/// it counted: a gate that fails but carries the mark was counted by an earlier run of the
/// page. A gate full without it suppresses the delivery (a `D#` item, held by the page's
/// writer). The sends that pass every gate go to the page's send batches.
async fn count_gates(deps: &Deps, t: &TenantId, n: &Notification, gated: Vec<Gated>) -> CoreResult<Vec<Planned>> {
    let mark = policy::cap_mark(n);
    let mut passed = Vec::with_capacity(gated.len());
    let mut open = gated;
    while !open.is_empty() {
        let mut asked = Vec::with_capacity(open.len());
        let mut counting = Vec::with_capacity(open.len());
        for mut g in open {
            match g.gates.pop_front() {
                Some((gate, reason)) => {
                    counting.push((gate.key.clone(), reason, g));
                    asked.push(gate);
                }
                None => passed.push(Planned::Batch(g.queue, g.task)),
            }
        }
        open = Vec::with_capacity(counting.len());
        let mut full = Vec::new();
        for (answer, counted) in deps.table.update_each(asked).await?.into_iter().zip(counting) {
            match answer {
                Ok(_) => open.push(counted.2),
                Err(StoreError::ConditionFailed { .. }) => full.push(counted),
                Err(e) => return Err(e.into()),
            }
        }
        if full.is_empty() {
            continue;
        }
        // Counted by an earlier run of this page, or full.
        let ours = full
            .iter()
            .map(|(key, ..)| Updating {
                key: key.clone(),
                updates: vec![Update::set(&mark, true)],
                cond: Cond::AttrExists(mark.clone()),
            })
            .collect();
        for (answer, (_, reason, mut g)) in deps.table.update_each(ours).await?.into_iter().zip(full) {
            match answer {
                Ok(_) => open.push(g),
                Err(StoreError::ConditionFailed { .. }) => {
                    g.delivery.status = DeliveryStatus::Suppressed;
                    g.delivery.reason = Some(reason.as_str().into());
                    write_final(deps, t, n, g.key, &g.delivery, None).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(passed)
}

/// Where planning a delivery starts, from its record.
enum Start {
    /// No delivery yet.
    New,
    /// Deferred (quiet hours) and now resumed: the page of its progress counters.
    Resume(u64),
    /// Made by an earlier run and still waiting: queued again (the worker deduplicates).
    Requeue,
    /// Planned already, past `pending`: nothing to do.
    Planned,
}

fn start_of(item: Option<&Item>) -> CoreResult<Start> {
    let Some(item) = item else { return Ok(Start::New) };
    let d: Delivery = item.parse()?;
    Ok(match d.status {
        DeliveryStatus::Pending if d.deferred_until.is_some() => Start::Resume(progress::page_of(item)),
        DeliveryStatus::Pending => Start::Requeue,
        _ => Start::Planned,
    })
}

/// The task of a delivery still `pending` from an earlier run, rendered again ([`content_of`]);
/// none when it can no longer be (no address, no template, a render or size error: the earlier
/// run queued it).
fn requeue(p: &Planning<'_>) -> Option<(String, ChannelTask)> {
    let to = p.r.address(p.channel)?;
    match content_of(p, to) {
        Ok(Content::Task(queue, task)) => Some((queue, task)),
        Ok(Content::Inbox(_)) | Err(_) => None,
    }
}

/// Defers a delivery to `until` (quiet hours): a timer resumes it. The timer first: a crash
/// after it leaves a timer that finds nothing (or plans it then); the other order could leave a
/// deferred delivery that nothing wakes.
#[allow(clippy::too_many_arguments)]
async fn defer(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    key: Key,
    delivery: &mut Delivery,
    deferred: Option<u64>,
    until: chrono::DateTime<chrono::Utc>,
    why: policy::DeferReason,
) -> CoreResult<()> {
    let task = TimerTask::DeferredDelivery {
        tenant: t.clone(),
        notification_id: n.notification_id.clone(),
        user_id: delivery.user_id.clone(),
        channel: delivery.channel,
    };
    timer::schedule(deps, until, task).await?;
    delivery.reason = Some(why.as_str().into());
    let until_s = until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    delivery.deferred_until = Some(until_s.clone());
    let r = match deferred {
        None => deps.table.put(Item::new(key, attrs_of(&*delivery)?), Cond::NotExists).await,
        Some(_) => deps
            .table
            .update(&key, vec![Update::set("deferred_until", until_s)], Cond::eq("status", "pending"))
            .await
            .map(|_| ()),
    };
    match r {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    info!(notification_id = %n.notification_id, channel = %delivery.channel, until = %until, reason = why.as_str(), "deferred");
    Ok(())
}

/// What a planned delivery delivers: a channel task to queue, or an in-app message's content
/// for the inbox.
enum Content {
    Task(String, ChannelTask),
    Inbox(templates::Rendered),
}

/// The content of a delivery, rendered; `Err` with the delivery's `last_error` when it cannot
/// be sent: no template, a render error, or a task too large for a queue message (a long email
/// whose links the tracking made longer still), which fails here, for good, rather than its
/// page being retried until its DLQ.
fn content_of(p: &Planning<'_>, to: String) -> Result<Content, String> {
    let Planning { deps, t, n, r, template, hosts, channel, .. } = *p;
    let Some(template) = template else {
        return Err(format!("template_error: template {} not found", n.request.template_id));
    };
    let params = super::params::params_for(&n.request.params, r.user_id, r.user.and_then(|u| u.locale.as_deref()));
    let rendered =
        template.render(channel, r.user.and_then(|u| u.locale.as_deref()), &params).map_err(|e| e.to_string())?;
    if channel == Channel::Inapp {
        return Ok(Content::Inbox(rendered));
    }
    let (queue, task) = task_of(deps, t, n, (r.user_id, channel, p.step), to, rendered, hosts);
    if p.batched() && !batch::fits(&task) {
        return Err(format!(
            "too_large: the {channel} does not fit a send batch message of at most {} bytes",
            crate::sizes::MAX_MESSAGE_BYTES
        ));
    }
    if let Err(size) = queued_size(&task) {
        return Err(format!(
            "too_large: the {channel} is {size} bytes as a queue message; a queue message holds at most {}",
            crate::sizes::MAX_MESSAGE_BYTES
        ));
    }
    Ok(Content::Task(queue, task))
}

/// Writes a planned delivery in one transaction with the gates' `writes` (an in-app message
/// with its inbox item, `sent` at once), and returns the task to queue. A gate whose condition
/// failed suppresses the delivery instead; a delivery planned by another run is left alone.
#[allow(clippy::too_many_arguments)]
async fn write_planned(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    key: Key,
    mut delivery: Delivery,
    deferred: Option<u64>,
    writes: Vec<Write>,
    content: Content,
) -> CoreResult<Option<(String, ChannelTask)>> {
    let gate_reasons: Vec<policy::SuppressReason> = writes.iter().map(policy::gate_reason).collect();
    let mut all = writes;
    let (task, inbox_content) = match content {
        Content::Task(queue, task) => (Some((queue, task)), None),
        Content::Inbox(rendered) => {
            delivery.status = DeliveryStatus::Sent;
            delivery.attempts = 1;
            delivery.sent_at = Some(delivery.updated_at.clone());
            (None, Some(rendered))
        }
    };
    all.push(match deferred {
        None => Write::Put { item: Item::new(key.clone(), attrs_of(&delivery)?), cond: Cond::NotExists },
        // Resumed after quiet hours: still `pending` (queued), now without the deferral.
        Some(_) => Write::Update {
            key: key.clone(),
            updates: vec![
                Update::Remove("deferred_until".into()),
                Update::Remove("reason".into()),
                Update::set("updated_at", delivery.updated_at.clone()),
            ],
            cond: Cond::And(vec![Cond::eq("status", "pending"), Cond::AttrExists("deferred_until".into())]),
        },
    });
    if let Some(rendered) = inbox_content {
        all.extend(inbox::message_writes(
            t,
            &delivery.user_id,
            n,
            delivery.step,
            rendered.subject.unwrap_or_default(),
            rendered.body,
            &delivery.updated_at,
        )?);
    }
    match deps.table.transact(all).await {
        Ok(()) => {}
        Err(StoreError::ConditionFailed { index }) if index < gate_reasons.len() => {
            delivery.status = DeliveryStatus::Suppressed;
            delivery.reason = gate_reasons.get(index).map(|r| r.as_str().into());
            write_final(deps, t, n, key, &delivery, deferred).await?;
            return Ok(None);
        }
        // Planned by another run.
        Err(StoreError::ConditionFailed { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    Ok(task)
}

/// The size of a task as a queue message, or `Err` with it when no queue message can hold it.
fn queued_size(task: &ChannelTask) -> Result<usize, usize> {
    let size = serde_json::to_vec(task).map(|b| b.len()).unwrap_or(usize::MAX);
    if size <= crate::sizes::MAX_MESSAGE_BYTES { Ok(size) } else { Err(size) }
}

// The delivery's identity (a workflow's send step included: the email's open, click and
// unsubscribe tokens are signed here and must name the step's delivery), its address and
// content, and the tenant's link hosts for the email.
#[allow(clippy::too_many_arguments)]
fn task_of(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    (user_id, channel, step): (&str, Channel, Option<u32>),
    to: String,
    rendered: templates::Rendered,
    hosts: &LinkHosts,
) -> (String, ChannelTask) {
    let mut task = ChannelTask {
        tenant: t.clone(),
        notification_id: n.notification_id.clone(),
        user_id: user_id.to_owned(),
        channel,
        category: n.request.category(),
        to,
        subject: rendered.subject,
        body: rendered.body,
        html: rendered.html,
        headers: Vec::new(),
        accepted_ms: Some(n.created_ms),
        priority: Some(n.priority),
        one_attempt: n.one_attempt,
        step,
        wake: false,
    };
    if channel == Channel::Email {
        crate::tracking::decorate_email(&deps.config, &mut task, deps.clock.now().timestamp(), hosts);
    }
    (crate::lanes::Lane::channel(channel, n.priority).name().to_owned(), task)
}
