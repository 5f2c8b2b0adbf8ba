//! The channel worker: sends rendered channel tasks through their providers, under the rule of
//! once (docs/delivery.md, "Send: the rule of once").
//!
//! One algorithm in four steps, each a function below. A single task is a batch of one
//! ([`deliver`]); in a batch, the plain marketing sends go through the same steps together
//! ([`deliver_batch`]) and everything else goes alone.
//!
//! 1. **Select** ([`stopped`], [`select_batch`]): a task of a cancelled notification, or of a user
//!    erased since it was accepted, is not sent; its delivery is closed as `suppressed`. Together
//!    go only marketing tasks whose delivery is plainly `pending`; anything unusual (transactional,
//!    a redriven dead delivery, a task seen twice, an erased user) goes alone, which knows every
//!    case.
//! 2. **Claim** ([`claim_one`], [`claim_batch`]): before any provider call, the delivery moves to
//!    `sending` with a lease, by a conditional write ([`claim_of`]); only the worker whose write
//!    won sends. Transactional: claimable from `pending`, or from `sending` once the lease ran out
//!    (its worker stopped). Marketing: from `pending` only, so it is sent at most once; an expired
//!    marketing claim is closed as `failed` (`outcome_unknown`), never sent again
//!    ([`already_claimed`]).
//! 3. **Send** ([`send_all`]): each claimed delivery's provider call, with the delivery key as its
//!    idempotency key and within the provider timeout, a few at a time through the rate gates; a
//!    call that could outlast the batch's deadline is not started (its claim is given back).
//!    Right before each call the notification's status is read fresh ([`super::fence`]): a
//!    cancelled one's delivery is closed as `suppressed` (`cancelled`), not sent; the caller
//!    holds a [`super::fence::Guard`] from before the send to after the record, which a cancel
//!    waits for before it answers.
//! 4. **Record** ([`record_all`]): the provider's answer moves the delivery out of `sending`
//!    (`sent`, `failed`, back to `pending` for a retry, or `dead`) with its progress counters and
//!    receipt, in one transaction.
//!
//! A crash between send and record leaves the claim, and the delivery key resolves it when the
//! task comes back: transactional, sent again once the lease ran out (at most one duplicate,
//! nothing lost); marketing, closed without a second send.

use std::time::Duration;

use futures::StreamExt;

use tracing::{debug, info, instrument, warn};

use super::model::{Category, ChannelTask, Delivery, DeliveryStatus, NotificationStatus};
use super::progress;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::{TenantId, mask_address};
use crate::keys;
use crate::outcome::Outcome;
use crate::ports::{
    Channel, Cond, Item, Key, OutboundMessage, ProviderError, ProviderReceipt, StoreError, Update, Write,
};
use crate::retry::backoff;
use crate::tasks::Task;

/// Handles one channel task.
pub async fn handle_channel_message(deps: &Deps, task: &Task<ChannelTask>) -> Outcome {
    let result = deliver(deps, &task.body.tenant, &task.body, task.receive_count).await;
    crate::tasks::classify(deps, "channel task", task.receive_count, result)
}

/// Handles a batch of channel task messages (what one receive or one Lambda event holds), one
/// outcome per message in order. Marketing sends, a campaign's bulk, go through together: the
/// deliveries read at once, each claimed by its own conditional write (a few at a time), sent
/// concurrently (through the rate gates), and recorded in transactions with their progress
/// counters and receipts. Anything unusual (a cancelled campaign, a redriven dead
/// delivery, a claim lost to another worker, a task seen twice in the batch) takes the path of
/// a single message, which knows every case.
pub async fn handle_channel_batch(deps: &Deps, tasks: &[Task<ChannelTask>]) -> Vec<Outcome> {
    handle_channel_batch_until(deps, tasks, None).await
}

/// [`handle_channel_batch`] with a deadline: a claimed send whose provider call could not end
/// before it (`now + provider timeout > deadline`) is not started, unless it is in the first
/// wave of [`SEND_CONCURRENCY`] (progress is always made); its delivery goes back to `pending`
/// and its message is handed back ([`Outcome::HandBack`]). Messages handled one by one
/// (transactional ones) stop the same way after the first. Callers leave themselves room after
/// the deadline for the gates' wait and the record.
pub async fn handle_channel_batch_until(
    deps: &Deps,
    tasks: &[Task<ChannelTask>],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; tasks.len()];
    if tasks.len() > 1 {
        match deliver_batch(deps, tasks, deadline).await {
            Ok(done) => {
                for (i, outcome) in done {
                    outcomes[i] = Some(outcome);
                }
            }
            Err(e) => warn!(error = %e, "batch bookkeeping failed; each message on its own"),
        }
    }
    // The rest one by one (transactional messages, and what the batch path left), as long as
    // another provider call can end before the deadline; after the first, the others are
    // handed back untouched.
    let mut handled = 0usize;
    for (i, task) in tasks.iter().enumerate() {
        if outcomes[i].is_none() {
            if handled > 0 && too_late(deps, deadline) {
                outcomes[i] = Some(Outcome::HandBack);
                continue;
            }
            outcomes[i] = Some(handle_channel_message(deps, task).await);
            handled += 1;
        }
    }
    outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Done)).collect()
}

fn now_str(deps: &Deps) -> String {
    deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// One task through the four steps: a batch of one, with every case a batch leaves alone.
#[instrument(skip(deps, t, task), fields(tenant = %t, notification_id = %task.notification_id, channel = %task.channel))]
async fn deliver(deps: &Deps, t: &TenantId, task: &ChannelTask, receive_count: u32) -> CoreResult<Outcome> {
    let key = task.delivery_key();
    let now_ms = deps.clock.now_ms();
    if let Some(reason) = stopped(deps, t, task).await? {
        return close_stopped(deps, t, task, &key, reason, now_ms).await;
    }
    let claimed = match claim_one(deps, t, task, receive_count, key, now_ms).await? {
        Ok(claimed) => [claimed],
        Err(not_ours) => return Ok(not_ours),
    };
    let sending = super::fence::enter([(t, task.notification_id.as_str())]);
    let attempts = send_all(deps, &claimed, None).await;
    let outcomes = record_all(deps, &claimed, attempts).await;
    drop(sending);
    Ok(outcomes.into_iter().next().unwrap_or(Outcome::Retry(Duration::ZERO)))
}

/// The plain marketing sends of a batch through the four steps together: one read and a
/// recording transaction for the whole batch instead of per task. Returns the outcomes of the
/// tasks it handled; the others are left to [`deliver`]. Nothing is claimed when this fails
/// before the claim.
async fn deliver_batch(
    deps: &Deps,
    tasks: &[Task<ChannelTask>],
    deadline: Option<std::time::Instant>,
) -> CoreResult<Vec<(usize, Outcome)>> {
    let selected = select_batch(deps, tasks).await?;
    let claimed = claim_batch(deps, selected).await?;
    if claimed.is_empty() {
        return Ok(Vec::new());
    }
    let sending = super::fence::enter(claimed.iter().map(|c| (c.t, c.task.notification_id.as_str())));
    let attempts = send_all(deps, &claimed, deadline).await;
    let outcomes = record_all(deps, &claimed, attempts).await;
    drop(sending);
    Ok(claimed.iter().map(|c| c.index).zip(outcomes).collect())
}

// Step 1: select.

/// Why a task is not sent at all: its notification was cancelled, or its user erased since it
/// was accepted (`crate::people::erasure`; the task's address is from before).
async fn stopped(deps: &Deps, t: &TenantId, task: &ChannelTask) -> CoreResult<Option<&'static str>> {
    Ok(if super::campaign::status(deps, t, &task.notification_id).await? == Some(NotificationStatus::Cancelled) {
        Some("cancelled")
    } else if crate::people::erasure::stops_send(deps, t, task).await? {
        Some(crate::people::erasure::REASON)
    } else {
        None
    })
}

/// Closes the delivery of a stopped task without a send: `pending` or `dead`, as `suppressed`
/// (`reason`). A claim (`sending`) whose lease still runs is its worker's: the task comes back
/// once the lease has run out. A claim whose lease ran out belonged to a worker that stopped
/// between its claim and its record (a crash, a cut-off at an invocation's deadline), so
/// nothing else would ever end it: an erased user's is closed `suppressed`; a cancelled
/// notification's, whose worker may have passed the cancel fence and called the provider before
/// the cancel, `failed` (`outcome_unknown`), never sent again.
async fn close_stopped(
    deps: &Deps,
    t: &TenantId,
    task: &ChannelTask,
    key: &Key,
    reason: &str,
    now_ms: i64,
) -> CoreResult<Outcome> {
    let Some(item) = deps.table.get(key).await? else { return Ok(Outcome::Done) };
    let d: Delivery = item.parse()?;
    let page = Some(progress::page_of(&item));
    let (to, updates) = match d.status {
        DeliveryStatus::Pending | DeliveryStatus::Dead => {
            (DeliveryStatus::Suppressed, vec![Update::set("reason", reason), Update::set("updated_at", now_str(deps))])
        }
        DeliveryStatus::Sending => {
            if let Some(left) = lease_left(&d, now_ms) {
                return Ok(Outcome::Retry(left + LEASE_SLACK));
            }
            if reason == "cancelled" {
                let why = "the worker stopped after claiming, before the cancel; not sent again";
                (DeliveryStatus::Failed, outcome_unknown(deps, why))
            } else {
                let updates = vec![
                    Update::set("reason", reason),
                    Update::set("updated_at", now_str(deps)),
                    Update::Remove("lease_until_ms".into()),
                ];
                (DeliveryStatus::Suppressed, updates)
            }
        }
        _ => return Ok(Outcome::Done),
    };
    move_delivery(deps, t, task, key, page, d.status, to, updates).await?;
    Ok(Outcome::Done)
}

/// The tasks of a batch that can be claimed together: marketing, of a notification not
/// cancelled, the first task for its delivery, whose user has no erasure record and whose
/// delivery is `pending`. Fewer than two: none (the single path is as cheap).
async fn select_batch<'a>(deps: &Deps, tasks: &'a [Task<ChannelTask>]) -> CoreResult<Vec<Claimed<'a>>> {
    let mut candidates = Vec::with_capacity(tasks.len());
    let mut seen = std::collections::HashSet::new();
    let mut status: std::collections::HashMap<&str, Option<NotificationStatus>> = Default::default();
    for (i, Task { body: task, .. }) in tasks.iter().enumerate() {
        let t = &task.tenant;
        let key = task.delivery_key();
        // Transactional messages one by one: a crash after a provider call then costs at most
        // the one duplicate the two-phase send promises, not one per message of the batch.
        if task.category == Category::Transactional || !seen.insert(key.clone()) {
            continue;
        }
        let s = match status.get(task.notification_id.as_str()) {
            Some(s) => *s,
            None => {
                let s = super::campaign::status(deps, t, &task.notification_id).await?;
                status.insert(&task.notification_id, s);
                s
            }
        };
        if s != Some(NotificationStatus::Cancelled) {
            candidates.push((i, t, task, key));
        }
    }
    if candidates.len() < 2 {
        return Ok(Vec::new());
    }
    // The deliveries, and their users' erasure records in the same read.
    let mut keys: Vec<Key> = candidates.iter().map(|c| c.3.clone()).collect();
    keys.extend(candidates.iter().map(|c| keys::erasure(c.1, &c.2.user_id)));
    let mut items = deps.table.get_many(&keys).await?;
    let erased = items.split_off(candidates.len().min(items.len()));
    let mut selected = Vec::with_capacity(candidates.len());
    for (((index, t, task, key), item), erased) in candidates.into_iter().zip(items).zip(erased) {
        // An erased user's task: the single path decides (`crate::people::erasure`).
        if erased.is_some() {
            continue;
        }
        let Some(item) = item else { continue };
        let Ok(d) = item.parse::<Delivery>() else { continue };
        if d.status != DeliveryStatus::Pending {
            continue;
        }
        let receive_count = tasks.get(index).map_or(1, |m| m.receive_count);
        let page = progress::page_of(&item);
        selected.push(Claimed {
            index,
            t,
            task,
            receive_count,
            key,
            page,
            attempts: d.attempts.saturating_add(1),
            devices: None,
        });
    }
    Ok(selected)
}

// Step 2: claim.

/// A claimed delivery: this worker's to send and to record.
pub(super) struct Claimed<'a> {
    /// Its task's place in the batch (0 for a batch of one).
    pub(super) index: usize,
    pub(super) t: &'a TenantId,
    pub(super) task: &'a ChannelTask,
    pub(super) receive_count: u32,
    pub(super) key: Key,
    /// The expansion page that created it (its progress counters).
    pub(super) page: u64,
    /// Its attempts, this one included.
    pub(super) attempts: u32,
    /// A push's devices, read after the claim with the other sends of its batch (`None`: read
    /// right before its provider call).
    pub(super) devices: Option<&'a [crate::people::devices::Device]>,
}

impl Claimed<'_> {
    /// Its move out of `sending`, with the progress counters.
    fn moved_to(&self, to: DeliveryStatus, updates: Vec<Update>) -> progress::Transition<'_> {
        progress::Transition {
            t: self.t,
            notification_id: &self.task.notification_id,
            user_id: &self.task.user_id,
            page: self.page,
            key: &self.key,
            from: DeliveryStatus::Sending,
            to,
            also: None,
            updates,
        }
    }
}

/// The claim of a delivery (phase one): its updates and condition. Both carry a lease; a
/// transactional delivery may be claimed again once it ran out, a marketing one only from
/// `pending` (at most once: an expired marketing claim is closed, see [`already_claimed`]).
fn claim_of(deps: &Deps, transactional: bool, now_ms: i64) -> (Vec<Update>, Cond) {
    let claimable = Cond::And(vec![Cond::Exists, Cond::eq("status", "pending")]);
    let cond = if transactional {
        Cond::Or(vec![claimable, Cond::And(vec![Cond::eq("status", "sending"), Cond::lt("lease_until_ms", now_ms)])])
    } else {
        claimable
    };
    let lease = if transactional { deps.config.delivery_lease } else { deps.config.marketing_lease };
    let updates = vec![
        Update::set("status", "sending"),
        Update::add("attempts", 1),
        Update::set("updated_at", now_str(deps)),
        Update::set("lease_until_ms", now_ms + lease.as_millis() as i64),
    ];
    (updates, cond)
}

/// The claim of one task's delivery ([`claim_of`]); a dead delivery redriven is claimed with
/// its counters (`dead` → `sending`). `Err(outcome)`: the delivery is not this worker's to send
/// ([`already_claimed`]).
async fn claim_one<'a>(
    deps: &Deps,
    t: &'a TenantId,
    task: &'a ChannelTask,
    receive_count: u32,
    key: Key,
    now_ms: i64,
) -> CoreResult<Result<Claimed<'a>, Outcome>> {
    let (updates, cond) = claim_of(deps, task.category == Category::Transactional, now_ms);
    let item = match deps.table.update(&key, updates.clone(), cond).await {
        Ok(item) => item,
        Err(StoreError::ConditionFailed { .. }) => {
            let redriven =
                move_delivery(deps, t, task, &key, None, DeliveryStatus::Dead, DeliveryStatus::Sending, updates)
                    .await?;
            if !redriven {
                return Ok(Err(already_claimed(deps, t, task, &key, now_ms).await?));
            }
            match deps.table.get(&key).await? {
                Some(item) => item,
                None => return Ok(Err(Outcome::Done)),
            }
        }
        Err(e) => return Err(e.into()),
    };
    let page = progress::page_of(&item);
    let d: Delivery = item.parse()?;
    Ok(Ok(Claimed { index: 0, t, task, receive_count, key, page, attempts: d.attempts, devices: None }))
}

/// The claims of a batch's selected deliveries: the ones claimed. Each claim is a conditional
/// write of its own delivery, a few at a time, not one transaction for the batch: a claim
/// needs no other item changed with it (`sending` counts as `queued`), and on DynamoDB a
/// single write costs half a transactional one (docs/delivery.md, "What a delivery costs on AWS").
/// A claim that fails (someone else moved the delivery) goes the single way, message by
/// message.
async fn claim_batch<'a>(deps: &Deps, selected: Vec<Claimed<'a>>) -> CoreResult<Vec<Claimed<'a>>> {
    let now_ms = deps.clock.now_ms();
    type Claiming<'k> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Item, StoreError>> + Send + 'k>>;
    let claims: Vec<Claiming<'_>> = selected
        .iter()
        .map(|c| -> Claiming<'_> {
            let (updates, cond) = claim_of(deps, false, now_ms);
            Box::pin(deps.table.update(&c.key, updates, cond))
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(claims).buffered(SEND_CONCURRENCY).collect().await;
    let answers: Vec<_> = selected.into_iter().zip(results).collect();
    let mut kept = Vec::with_capacity(answers.len());
    let mut failed = None;
    for (c, result) in answers {
        match result {
            Ok(_) => kept.push(c),
            Err(StoreError::ConditionFailed { .. }) | Err(StoreError::Conflict) => {}
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) if kept.is_empty() => Err(e.into()),
        Some(e) => {
            warn!(error = %e, "claiming part of a batch failed; those go one by one");
            Ok(kept)
        }
        None => Ok(kept),
    }
}

/// The reason of a marketing delivery closed after its claim's lease ran out, or after its
/// provider call timed out.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

/// The updates that close a claimed marketing delivery as `failed` (`outcome_unknown`).
fn outcome_unknown(deps: &Deps, why: &str) -> Vec<Update> {
    vec![
        Update::set("reason", OUTCOME_UNKNOWN),
        Update::set("last_error", why),
        Update::set("updated_at", now_str(deps)),
        Update::Remove("lease_until_ms".into()),
    ]
}

/// How long the claim of a `sending` delivery still runs; `None` once its lease has run out.
/// Claims made before marketing claims had a lease count as run out.
fn lease_left(d: &Delivery, now_ms: i64) -> Option<Duration> {
    let until = d.lease_until_ms.unwrap_or(now_ms);
    (until > now_ms).then(|| Duration::from_millis((until - now_ms) as u64))
}

/// How long after a claim's lease a task waiting for it comes back.
const LEASE_SLACK: Duration = Duration::from_millis(500);

/// The claim failed: someone sent it already, it is final, or a lease is running. A marketing
/// claim whose lease ran out belonged to a worker that stopped between its claim and its record
/// (a crash, or a record that failed): it is closed as `failed` (`outcome_unknown`), not sent.
async fn already_claimed(
    deps: &Deps,
    t: &TenantId,
    task: &ChannelTask,
    key: &crate::ports::Key,
    now_ms: i64,
) -> CoreResult<Outcome> {
    let Some(item) = deps.table.get(key).await? else {
        warn!("channel task without a delivery record; dropped");
        return Ok(Outcome::Done);
    };
    let d: Delivery = item.parse()?;
    if d.status != DeliveryStatus::Sending {
        return Ok(Outcome::Done);
    }
    if let Some(left) = lease_left(&d, now_ms) {
        return Ok(Outcome::Retry(left + LEASE_SLACK));
    }
    if d.category == Category::Transactional {
        return Ok(Outcome::Retry(LEASE_SLACK));
    }
    warn!(
        to = %mask_address(&task.to),
        "a marketing claim outlived its lease: closed as failed (outcome unknown), not sent again"
    );
    let updates =
        outcome_unknown(deps, "the worker stopped after claiming; not sent again (marketing is at most once)");
    let page = progress::page_of(&item);
    move_delivery(deps, t, task, key, Some(page), DeliveryStatus::Sending, DeliveryStatus::Failed, updates).await?;
    Ok(Outcome::Done)
}

// Step 3: send.

/// Sends in flight at once for one batch.
const SEND_CONCURRENCY: usize = 16;

/// What became of one claimed send.
pub(super) enum Attempt {
    /// The provider was called (and answered, or failed within the provider timeout).
    Called(String, Result<ProviderReceipt, ProviderError>),
    /// The provider was called and did not answer within the provider timeout: it may have
    /// taken the message.
    TimedOut(String),
    /// Not sent: a rate gate (or the provider's `Retry-After` hold) said to come back after
    /// this long. The provider never saw it: no attempt is counted.
    Gated(Duration),
    /// No provider for the channel.
    NoProvider,
    /// Not started: the batch's deadline was too near (or its cancel check could not be read).
    Released,
    /// Not started: the notification was cancelled ([`super::fence`]).
    Cancelled,
}

/// What a send stopped by its notification's cancel makes of its claimed delivery: `suppressed`
/// (`cancelled`), its claim's attempt given back.
pub(super) fn cancelled(deps: &Deps) -> Settled {
    let updates = vec![
        Update::set("reason", "cancelled"),
        Update::add("attempts", -1),
        Update::set("updated_at", now_str(deps)),
        Update::Remove("lease_until_ms".into()),
    ];
    Settled { to: DeliveryStatus::Suppressed, updates, outcome: Outcome::Done, receipt: None }
}

/// Whether a provider call started now could outlast `deadline`.
pub(super) fn too_late(deps: &Deps, deadline: Option<std::time::Instant>) -> bool {
    deadline.is_some_and(|d| std::time::Instant::now() + deps.config.provider_timeout > d)
}

/// The provider calls of claimed deliveries, one attempt each, in order. A few at a time: the
/// gates in front of the providers pace them, and a batch of a hundred waiting at once for a
/// slow gate would outwait it (`GATE_REFUSAL`, a retry). The first wave always goes (so a batch
/// always makes progress, however short the time); a later send is not started when its
/// provider call could outlast the deadline.
pub(super) async fn send_all(
    deps: &Deps,
    claimed: &[Claimed<'_>],
    deadline: Option<std::time::Instant>,
) -> Vec<Attempt> {
    type Sending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Attempt> + Send + 'a>>;
    let sends: Vec<Sending<'_>> = claimed
        .iter()
        .enumerate()
        .map(|(i, c)| -> Sending<'_> {
            Box::pin(async move {
                if i >= SEND_CONCURRENCY && too_late(deps, deadline) {
                    return Attempt::Released;
                }
                // The cancel fence: read fresh, after the claim and any earlier wave.
                match super::fence::cancelled(deps, c.t, &c.task.notification_id).await {
                    Ok(false) => {}
                    Ok(true) => return Attempt::Cancelled,
                    Err(e) => {
                        warn!(error = %e, "the cancel check failed; the send is handed back");
                        return Attempt::Released;
                    }
                }
                match deps.providers.for_channel(c.task.channel) {
                    Some(provider) => match call_provider(deps, c, provider.as_ref()).await {
                        Ok(Err(e)) if let Some(wait) = crate::gates::gate_refusal(&e) => Attempt::Gated(wait),
                        Ok(result) => Attempt::Called(provider.name().to_owned(), result),
                        Err(crate::gates::Elapsed::AtGate) => Attempt::Gated(Duration::from_secs(1)),
                        Err(crate::gates::Elapsed::InCall) => Attempt::TimedOut(provider.name().to_owned()),
                    },
                    None => Attempt::NoProvider,
                }
            })
        })
        .collect();
    futures::stream::iter(sends).buffered(SEND_CONCURRENCY).collect().await
}

/// The provider call of a claimed delivery, within the provider timeout counted outside the
/// rate gates ([`crate::gates::within`]): `Err(InCall)` when the call did not end in time (its
/// outcome is unknown: the provider may have taken the message), `Err(AtGate)` when it never
/// got past the gates.
async fn call_provider(
    deps: &Deps,
    c: &Claimed<'_>,
    provider: &dyn crate::ports::Provider,
) -> Result<Result<ProviderReceipt, ProviderError>, crate::gates::Elapsed> {
    let (t, task, attempt) = (c.t, c.task, c.attempts);
    // Every provider is called from here: header fields are made one line here, once, whatever
    // rendered them (docs/templates.md, "Header fields").
    let message = OutboundMessage {
        channel: task.channel,
        to: task.to.clone(),
        subject: task.subject.as_deref().map(crate::ports::one_line),
        body: task.body.clone(),
        html: task.html.clone(),
        headers: task
            .headers
            .iter()
            .map(|(name, value)| (crate::ports::one_line(name), crate::ports::one_line(value)))
            .collect(),
        idempotency_key: format!("{}:{}:{}", task.notification_id, task.user_id, task.channel),
        marketing: task.category == Category::Marketing,
        tenant: t.as_str().to_owned(),
        notification_id: task.notification_id.clone(),
        user_id: task.user_id.clone(),
        attempt,
    };
    crate::crash::point("worker.before_provider");
    // Push goes to every device of the user (`devices::send_to_devices`).
    // The gates bound their own waits (`TIDINGS_GATE_MAX_WAIT_MS`); the rest is the provider's.
    let gate_limit = gate_limit(&deps.config, task.category);
    let result = crate::gates::within(
        deps.config.provider_timeout,
        gate_limit,
        crate::people::devices::send(deps, t, provider, &message, c.devices),
    )
    .await?;
    if result.is_ok()
        && let Some(accepted_ms) = task.accepted_ms
    {
        let priority = task.priority().as_str();
        crate::metrics::record_delivery_latency(task.channel.as_str(), priority, accepted_ms, deps.clock.now_ms());
    }
    Ok(result)
}

/// Beyond the gates' own limit, how long a send may still be at a gate (a shared bucket's
/// store slow to answer) before it is given up there, unsent.
const GATE_SLACK: Duration = Duration::from_secs(5);

/// How long a claimed send may be at its gates: their own limit (`max_wait` + [`GATE_SLACK`]),
/// but never so long that the gates and the provider timeout together outlast the claim's
/// lease (1 s kept for the claim's own reads). A transactional delivery whose lease ran out may
/// be claimed by a second worker (its message seen again), which would call the provider while
/// this one still does: a duplicate without any crash. A lease at its floor (the provider
/// timeout + 1 s) leaves no time at the gates: a send that has to wait there is handed back
/// unsent.
fn gate_limit(config: &crate::config::CoreConfig, category: Category) -> Duration {
    let lease = if category == Category::Transactional { config.delivery_lease } else { config.marketing_lease };
    let within_lease = lease.saturating_sub(config.provider_timeout + Duration::from_secs(1));
    (config.gates.max_wait + GATE_SLACK).min(within_lease)
}

/// What a provider call that timed out settles as. A transactional send is tried again (a
/// duplicate is the documented trade-off, never a loss); a marketing send is closed as `failed`
/// (`outcome_unknown`), never sent again: the provider may have taken it, and marketing is at
/// most once.
pub(super) fn timed_out(deps: &Deps, task: &ChannelTask, provider: &str, attempts: u32, receive_count: u32) -> Settled {
    if task.category != Category::Marketing {
        return settle(deps, task, provider, attempts, receive_count, Err(ProviderError::transient("timeout")));
    }
    warn!(
        to = %mask_address(&task.to),
        provider,
        "a marketing send timed out: closed as failed (outcome unknown), not sent again"
    );
    let updates =
        outcome_unknown(deps, "the provider did not answer in time; not sent again (marketing is at most once)");
    Settled { to: DeliveryStatus::Failed, updates, outcome: Outcome::Done, receipt: None }
}

// Step 4: record.

/// Deliveries recorded in one transaction: each with its receipt and counters, well under the
/// 100 writes of a transaction.
const RECORD_CHUNK: usize = 25;

/// What a provider's answer makes of a claimed delivery.
pub(super) struct Settled {
    pub(super) to: DeliveryStatus,
    pub(super) updates: Vec<Update>,
    pub(super) outcome: Outcome,
    /// The provider's message id, when it accepted.
    receipt: Option<String>,
}

pub(super) fn settle(
    deps: &Deps,
    task: &ChannelTask,
    provider: &str,
    attempts: u32,
    receive_count: u32,
    result: Result<ProviderReceipt, ProviderError>,
) -> Settled {
    match result {
        Ok(receipt) => {
            crate::crash::point("worker.after_provider");
            // One line per send is a campaign's size in lines (and drowned a bench's progress):
            // debug. The delivery record and the sends metric keep what was sent; failures warn.
            debug!(to = %mask_address(&task.to), attempt = attempts, provider, "sent");
            let updates = vec![
                Update::set("sent_at", now_str(deps)),
                Update::set("provider_message_id", receipt.provider_message_id.clone()),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            Settled {
                to: DeliveryStatus::Sent,
                updates,
                outcome: Outcome::Done,
                receipt: Some(receipt.provider_message_id),
            }
        }
        Err(ProviderError::Permanent { reason, code }) => {
            warn!(to = %mask_address(&task.to), %reason, ?code, "permanent failure; not retried");
            let updates = vec![
                Update::set("last_error", reason),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            Settled { to: DeliveryStatus::Failed, updates, outcome: Outcome::Done, receipt: None }
        }
        Err(ProviderError::Transient { reason, retry_after }) => {
            let last = receive_count >= deps.config.max_receives;
            warn!(%reason, attempt = attempts, last, "transient failure");
            if task.one_attempt {
                // Its creator retries on its own schedule, from now (back-in-stock alerts:
                // 1/5/30 minutes after the failure): closed `dead` at once, the message done.
                let updates = vec![
                    Update::set("last_error", reason),
                    Update::SetIfAbsent("first_failed_at".into(), now_str(deps).into()),
                    Update::set("updated_at", now_str(deps)),
                    Update::set("dead_at", now_str(deps)),
                    Update::Remove("lease_until_ms".into()),
                ];
                return Settled { to: DeliveryStatus::Dead, updates, outcome: Outcome::Done, receipt: None };
            }
            let mut updates = vec![
                Update::set("last_error", reason),
                Update::SetIfAbsent("first_failed_at".into(), now_str(deps).into()),
                Update::set("updated_at", now_str(deps)),
                Update::Remove("lease_until_ms".into()),
            ];
            if last {
                updates.push(Update::set("dead_at", now_str(deps)));
                metrics::counter!(crate::metrics::DEAD_LETTERS, "channel" => task.channel.as_str()).increment(1);
                // Visible again at once, so the queue moves it to the DLQ on the next receive.
                return Settled {
                    to: DeliveryStatus::Dead,
                    updates,
                    outcome: Outcome::Retry(Duration::ZERO),
                    receipt: None,
                };
            }
            metrics::counter!(crate::metrics::RETRIES, "channel" => task.channel.as_str()).increment(1);
            let delay = backoff(attempts, deps.config.retry_base, deps.config.retry_cap, retry_after);
            Settled { to: DeliveryStatus::Pending, updates, outcome: Outcome::Retry(delay), receipt: None }
        }
    }
}

/// What each attempt makes of its claimed delivery ([`settle`]), recorded in transactions of up
/// to [`RECORD_CHUNK`] deliveries with their progress counters and receipts: one outcome per
/// claimed delivery, in order. A send not started goes back to `pending` as if never claimed;
/// one without a provider is left claimed.
async fn record_all(deps: &Deps, claimed: &[Claimed<'_>], attempts: Vec<Attempt>) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(claimed.len());
    let mut transitions = Vec::with_capacity(claimed.len());
    let mut receipts = Vec::new();
    let mut sent = 0usize;
    let mut released = 0usize;
    // Workflow sends that ended here: their runs are woken once recorded.
    let mut ended_steps: Vec<&ChannelTask> = Vec::new();
    for (c, attempt) in claimed.iter().zip(attempts) {
        let settled = match attempt {
            Attempt::Called(provider, result) => settle(deps, c.task, &provider, c.attempts, c.receive_count, result),
            Attempt::TimedOut(provider) => timed_out(deps, c.task, &provider, c.attempts, c.receive_count),
            Attempt::Cancelled => cancelled(deps),
            Attempt::NoProvider => {
                outcomes.push(Outcome::Reject(format!("channel {} has no provider", c.task.channel)));
                continue;
            }
            Attempt::Released | Attempt::Gated(_) => {
                let outcome = match attempt {
                    Attempt::Gated(wait) => Outcome::HandBackAfter(wait),
                    _ => {
                        released += 1;
                        Outcome::HandBack
                    }
                };
                transitions.push(c.moved_to(
                    DeliveryStatus::Pending,
                    vec![
                        Update::add("attempts", -1),
                        Update::set("updated_at", now_str(deps)),
                        Update::Remove("lease_until_ms".into()),
                    ],
                ));
                outcomes.push(outcome);
                continue;
            }
        };
        if let Some(id) = &settled.receipt {
            sent += 1;
            if c.task.channel == Channel::Email {
                match crate::tracking::receipts::remember_write(deps, c.task.channel.as_str(), id, c.t, c.task) {
                    Ok(Some(w)) => receipts.push(w),
                    Ok(None) => {}
                    Err(e) => warn!(error = %e, "provider message id not recorded; its receipts will be ignored"),
                }
            }
        }
        if c.task.wake && !settled.to.is_open() {
            ended_steps.push(c.task);
        }
        transitions.push(c.moved_to(settled.to, settled.updates));
        outcomes.push(settled.outcome);
    }
    if released > 0 {
        info!(released, "the batch's deadline was near: sends not started were handed back");
    }
    let mut recorded = Ok(());
    let mut receipts = receipts.into_iter().peekable();
    let mut transitions = transitions.into_iter().peekable();
    while transitions.peek().is_some() {
        let part: Vec<progress::Transition<'_>> = transitions.by_ref().take(RECORD_CHUNK).collect();
        let users: std::collections::HashSet<&str> = part.iter().map(|tr| tr.user_id).collect();
        let mut extra = Vec::new();
        while let Some(w) = receipts.next_if(|w| receipt_user(w).is_some_and(|u| users.contains(u.as_str()))) {
            extra.push(w);
        }
        if let Err(e) = progress::transition_many(deps, part, extra).await {
            recorded = Err(e);
        }
    }
    match recorded {
        Ok(()) => {
            for _ in 0..sent {
                crate::crash::point("worker.after_sent");
            }
            // A lost wake costs only time: the run's own check finds the end.
            for task in ended_steps {
                if let Err(e) = crate::workflows::run::wake_soon(deps, task).await {
                    warn!(error = %e, "the run of a workflow send was not woken; its check will find the end");
                }
            }
        }
        Err(e) => {
            // Sent but not recorded: the task comes again and finds the delivery claimed
            // (marketing: done; transactional: after the lease, at most one duplicate).
            warn!(error = %e, "recording sends failed; will retry");
            for (c, outcome) in claimed.iter().zip(&mut outcomes) {
                if matches!(outcome, Outcome::Done) {
                    *outcome =
                        Outcome::Retry(backoff(c.receive_count, deps.config.retry_base, deps.config.retry_cap, None));
                }
            }
        }
    }
    outcomes
}

/// The user a receipt write names.
fn receipt_user(w: &Write) -> Option<String> {
    match w {
        Write::Put { item, .. } => item.str("user_id").map(str::to_owned),
        _ => None,
    }
}

/// A status change with the notification's progress counters (see [`progress::transition`]);
/// `false` when the delivery was no longer in `from`. `page` unknown: read from the delivery.
#[allow(clippy::too_many_arguments)]
async fn move_delivery(
    deps: &Deps,
    t: &TenantId,
    task: &ChannelTask,
    key: &crate::ports::Key,
    page: Option<u64>,
    from: DeliveryStatus,
    to: DeliveryStatus,
    updates: Vec<Update>,
) -> CoreResult<bool> {
    let page = match page {
        Some(p) => p,
        None => deps.table.get(key).await?.as_ref().map_or(0, progress::page_of),
    };
    let tr = progress::Transition {
        t,
        notification_id: &task.notification_id,
        user_id: &task.user_id,
        page,
        key,
        from,
        to,
        also: None,
        updates,
    };
    Ok(progress::transition(deps, tr).await?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{GATE_SLACK, gate_limit};
    use crate::config::CoreConfig;
    use crate::notify::model::Category;

    /// A claimed send (its gates, then the provider within its timeout) ends before its claim's
    /// lease runs out, whatever the lease (down to its floor, the provider timeout + 1 s), so
    /// no second worker can claim it while the first is still sending. With the gates' own
    /// limit alone, a lease at its floor ran out 7 s before a send waiting at a gate ended.
    #[test]
    fn a_claimed_send_ends_within_its_lease() {
        let mut c = CoreConfig::default();
        for lease_s in [11u64, 12, 15, 18, 60] {
            c.delivery_lease = Duration::from_secs(lease_s);
            let longest = gate_limit(&c, Category::Transactional) + c.provider_timeout;
            assert!(
                longest + Duration::from_secs(1) <= c.delivery_lease,
                "lease {lease_s} s: a send lasts {longest:?}"
            );
        }
        // A lease long enough leaves the gates their own limit.
        c.delivery_lease = Duration::from_secs(60);
        assert_eq!(gate_limit(&c, Category::Transactional), c.gates.max_wait + GATE_SLACK);
        assert_eq!(gate_limit(&c, Category::Marketing), c.gates.max_wait + GATE_SLACK);
    }
}
