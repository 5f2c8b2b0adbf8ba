//! The engine: a run per (notification, recipient) that advances step by step, on the request
//! lanes (its start), the timers (delays, digests, waits of a fallback) and the channel workers'
//! ends of its sends (docs/workflows.md, "The engine").
//!
//! A run is one item in its notification's partition (`R#{user}`), written once each time it
//! stops (it waits, or it ends), on the condition that nobody wrote it since it was read
//! (`seq`). Everything a step does before that write is idempotent on its own: a send is its
//! delivery (`D#{user}#{channel}#{step}`, created once, the channel worker's rules), a digest
//! entry its membership, a throttle's count its mark, a timer finds the run past its step and
//! does nothing. So a step that is redelivered, or whose process dies at any point, runs once:
//! what drove it (the request message, the timer) comes again and finds the effects made.
//!
//! The run counts in its page's progress counters (`running`) from its creation to its end, so
//! the notification is not `completed` while any run waits.

use chrono::{DateTime, Datelike, Duration as ChronoDuration, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use tracing::{info, warn};

use super::conditions;
use super::definition::{self, Every, Node, StepDef};
use super::digest::{self, Entered};
pub use super::model::{Run, RunStatus, StepRecord, Wait};
use super::{Workflow, WorkflowRef};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys;
use crate::notify::model::{Notification, NotificationStatus};
use crate::notify::orchestrator::{self, StepSend};
use crate::notify::progress;
use crate::people::users::{self, User};
use crate::people::zones::Zone;
use crate::ports::{Channel, Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::timers::task::{self as timer, TimerTask};
use crate::webhooks::{Event, EventType};

/// A run as `GET /v1/notifications/{id}/runs` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RunView {
    pub user_id: String,
    pub workflow_id: String,
    pub version: u32,
    pub status: RunStatus,
    /// The steps it went through, and the one it waits at.
    pub steps: Vec<StepRecord>,
    /// When it is next due (a delay's end, a digest's close, a fallback's deadline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<String>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RunPage {
    pub items: Vec<RunView>,
    pub next_cursor: Option<String>,
}

/// What woke a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Wake {
    /// Its start, or its start again (the request message redelivered).
    Start,
    /// A timer or an end of a send, for step `node`; `check`: the fallback's scheduled check.
    Resume { node: u32, check: bool },
    /// The digest it leads closed with these events.
    Digest { node: u32, window: String },
}

/// Everything a run's steps need, read once per wake.
struct Ctx<'a> {
    deps: &'a Deps,
    t: &'a TenantId,
    n: &'a Notification,
    wf: &'a Workflow,
    /// The workflow laid out ([`definition::layout`]), once for a page of runs.
    nodes: &'a [Node],
    user: Option<User>,
}

fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// How many runs of a page start at once.
const START_CONCURRENCY: usize = 32;

/// Starts (or drives again) the runs of one page of a workflow notification's users.
pub async fn start_page(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    wref: &WorkflowRef,
    page: u64,
    users: &[(String, Option<User>)],
) -> CoreResult<()> {
    use futures::StreamExt;
    let Some(wf) = super::get_version(deps, t, &wref.workflow_id, wref.version).await? else {
        warn!(workflow_id = %wref.workflow_id, version = wref.version, "workflow version not found; runs not started");
        return Ok(());
    };
    let (wf, nodes) = (&wf, &definition::layout(&wf.steps)[..]);
    type Starting<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = CoreResult<()>> + Send + 'a>>;
    let starts: Vec<Starting<'_>> = users
        .iter()
        .map(|(user_id, user)| -> Starting<'_> {
            Box::pin(start(deps, t, n, (wf, nodes), page, user_id, user.clone()))
        })
        .collect();
    // Every run of the page is tried, whatever another's answer: the first failure (a
    // transaction conflict past the store's retries, where a page's runs meet at its progress
    // counters and a user's triggers at its digest's head) fails the page once they all have
    // been, so that its message comes again for the runs that failed only (the others, made
    // now, are no-ops then). Stopping at the first failure dropped the page's other runs each
    // time, and a large page whose every delivery met a conflict went to the dead letters with
    // most of its runs never started.
    let results: Vec<CoreResult<()>> =
        futures::stream::iter(starts).buffer_unordered(START_CONCURRENCY).collect().await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    match results.into_iter().find_map(Result::err) {
        Some(e) => {
            warn!(notification_id = %n.notification_id, page, failed, of = users.len(), error = %e, "runs not started; the page comes again");
            Err(e)
        }
        None => Ok(()),
    }
}

/// Creates a user's run (once: a conditional put, counted in its page's `running`) and drives it.
async fn start(
    deps: &Deps,
    t: &TenantId,
    n: &Notification,
    (wf, nodes): (&Workflow, &[Node]),
    page: u64,
    user_id: &str,
    user: Option<User>,
) -> CoreResult<()> {
    let key = keys::run(t, &n.notification_id, user_id);
    let run = match deps.table.get(&key).await? {
        Some(item) => item.parse::<Run>()?,
        None => {
            let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let run = Run {
                user_id: user_id.to_owned(),
                workflow_id: wf.workflow_id.clone(),
                version: wf.version,
                status: RunStatus::Running,
                at: Some(0),
                wait: None,
                params: n.request.params.clone(),
                steps: Vec::new(),
                page,
                seq: 0,
                since_ms: None,
                created_at: now.clone(),
                updated_at: now,
                failed: false,
            };
            let counter = progress::counter_write(
                progress::counter_key(t, &n.notification_id, page, user_id),
                &[("running", 1)],
                deps.clock.now_ms(),
            );
            let put = Write::Put { item: Item::new(key.clone(), attrs_of(&run)?), cond: Cond::NotExists };
            match deps.table.transact(vec![put, counter]).await {
                Ok(()) => run,
                Err(StoreError::ConditionFailed { .. }) => match deps.table.get(&key).await? {
                    Some(item) => item.parse::<Run>()?,
                    None => return Ok(()),
                },
                Err(e) => return Err(e.into()),
            }
        }
    };
    crate::crash::point("workflow.run_created");
    let ctx = Ctx { deps, t, n, wf, nodes, user };
    drive(&ctx, run, Wake::Start).await
}

/// A run's timer or the end of one of its sends: loads what the run needs and drives it.
pub async fn wake(deps: &Deps, t: &TenantId, notification_id: &str, user_id: &str, wake: Wake) -> CoreResult<()> {
    let Some(item) = deps.table.get(&keys::run(t, notification_id, user_id)).await? else { return Ok(()) };
    let run: Run = item.parse()?;
    if run.status.ended() {
        return Ok(());
    }
    let Some(n) = crate::notify::api::load(deps, t, notification_id).await? else { return Ok(()) };
    let Some(wf) = super::get_version(deps, t, &run.workflow_id, run.version).await? else {
        return Err(CoreError::invalid(
            "workflow_id",
            format!("version {} of {} is gone", run.version, run.workflow_id),
        ));
    };
    let user = users::get_user(deps, t, user_id).await?;
    let nodes = definition::layout(&wf.steps);
    let ctx = Ctx { deps, t, n: &n, wf: &wf, nodes: &nodes, user };
    drive(&ctx, run, wake).await
}

/// Wakes the run of a workflow send that ended (its step's fallback may go on).
pub async fn wake_soon(deps: &Deps, task: &crate::notify::model::ChannelTask) -> CoreResult<()> {
    let Some(node) = task.step else { return Ok(()) };
    let wake = TimerTask::WorkflowResume {
        tenant: task.tenant.clone(),
        notification_id: task.notification_id.clone(),
        user_id: task.user_id.clone(),
        node,
        check: false,
    };
    timer::schedule(deps, deps.clock.now(), wake).await
}

/// Where a step's work leaves the run.
enum Next {
    /// Go on at this node (none: the end).
    Go(Option<usize>),
    /// Wait (its timer is set).
    Wait(Wait),
    /// End with this status.
    End(RunStatus),
}

/// Drives a run from where it is: resolves what it waited for (if `wake` resolves it), then runs
/// steps until one waits or the run ends, and writes the run once.
async fn drive(ctx: &Ctx<'_>, mut run: Run, wake: Wake) -> CoreResult<()> {
    if run.status.ended() {
        return Ok(());
    }
    let seq = run.seq;
    let now_ms = ctx.deps.clock.now_ms();
    if ctx.n.status == NotificationStatus::Cancelled {
        // A digest window it leads ends with it (else its head would stay, and every later
        // trigger of that key would join a window nobody closes).
        if let Some(Wait::Digest { pk, window, .. }) = &run.wait {
            digest::abandon(ctx.deps, pk, window).await?;
        }
        if let Some(at) = run.at {
            record(ctx, &mut run, at as usize, "cancelled", None, None);
        }
        return save(ctx, run, seq, Next::End(RunStatus::Cancelled)).await;
    }
    let at = run.at.map(|a| a as usize);
    // What it waits for, resolved (or not) by this wake.
    if run.status == RunStatus::Waiting {
        let Some(node_at) = at else { return Ok(()) };
        let wait = run.wait.clone();
        let woken_here = match &wake {
            Wake::Start => false,
            Wake::Resume { node, .. } | Wake::Digest { node, .. } => *node as usize == node_at,
        };
        if !woken_here {
            return Ok(());
        }
        // What the wait resolved to; a wait that holds returns here. Resolved, the run's time
        // counts from now (`Run::since_ms`: a later delay or digest window starts here).
        let next = match (wait, &wake) {
            (Some(Wait::Delay { due_ms }), _) => {
                if due_ms > now_ms + 1_000 {
                    return Ok(());
                }
                record(ctx, &mut run, node_at, "done", None, None);
                Next::Go(ctx.nodes.get(node_at).and_then(|n| n.next))
            }
            (Some(Wait::Deferred { due_ms, channel_index }), _) => {
                if due_ms > now_ms + 1_000 {
                    return Ok(());
                }
                send(ctx, &mut run, node_at, channel_index as usize).await?
            }
            (Some(Wait::Digest { pk, window, .. }), Wake::Digest { window: woke, .. }) if *woke == window => {
                let max = match ctx.nodes.get(node_at).map(|n| &n.step) {
                    Some(StepDef::Digest { max, .. }) => max.unwrap_or(definition::DEFAULT_DIGEST_EVENTS),
                    _ => definition::DEFAULT_DIGEST_EVENTS,
                };
                let (events, count) = digest::close(ctx.deps, &pk, &window, max as usize).await?;
                if let Value::Object(map) = &mut run.params {
                    map.insert("events".into(), Value::Array(events));
                    map.insert("count".into(), json!(count));
                }
                record(ctx, &mut run, node_at, "digested", None, Some(format!("{count} events")));
                Next::Go(ctx.nodes.get(node_at).and_then(|n| n.next))
            }
            (Some(Wait::Digest { .. }), _) => return Ok(()),
            (Some(Wait::Send { channel_index, deadline_ms, checks }), Wake::Resume { check, .. }) => {
                match judge_send(ctx, &mut run, node_at, channel_index as usize, deadline_ms).await? {
                    Judged::Done(next) => next,
                    Judged::NextChannel => send(ctx, &mut run, node_at, channel_index as usize + 1).await?,
                    Judged::Pending => {
                        // Still on its way: a scheduled check sets the next one.
                        if *check {
                            let due = next_check(now_ms, deadline_ms, checks + 1);
                            schedule_resume(ctx, &run, node_at, due, true).await?;
                            run.wait = Some(Wait::Send { channel_index, deadline_ms, checks: checks + 1 });
                            return write(ctx, run, seq, false).await;
                        }
                        return Ok(());
                    }
                }
            }
            (Some(Wait::Send { .. }), _) | (None, _) => return Ok(()),
        };
        run.since_ms = Some(now_ms);
        run.status = RunStatus::Running;
        run.wait = None;
        return continue_from(ctx, run, seq, next).await;
    }
    continue_from(ctx, run, seq, Next::Go(at)).await
}

/// Runs steps from `next` until one waits or the run ends, then writes the run.
async fn continue_from(ctx: &Ctx<'_>, mut run: Run, seq: u64, mut next: Next) -> CoreResult<()> {
    for _ in 0..=definition::MAX_NODES {
        match next {
            Next::Go(None) => {
                let status = if run.failed { RunStatus::Failed } else { RunStatus::Completed };
                return save(ctx, run, seq, Next::End(status)).await;
            }
            Next::Go(Some(i)) => {
                run.at = Some(i as u32);
                next = step(ctx, &mut run, i).await?;
            }
            other => return save(ctx, run, seq, other).await,
        }
    }
    Err(CoreError::invalid("steps", "the run did not end within its steps"))
}

/// One step of the run at node `i`.
async fn step(ctx: &Ctx<'_>, run: &mut Run, i: usize) -> CoreResult<Next> {
    let Some(node) = ctx.nodes.get(i) else { return Ok(Next::Go(None)) };
    if let Some(c) = node.step.when()
        && !conditions::holds(ctx.deps, ctx.t, ctx.n, run, ctx.user.as_ref(), c).await?
    {
        record(ctx, run, i, "skipped", None, None);
        return Ok(Next::Go(node.next));
    }
    let now_ms = ctx.deps.clock.now_ms();
    // Where the run's time stands: its trigger's, or its last wait's end (`Run::since_ms`).
    let trigger_ms = ctx.n.request.send_at.map_or(0, |a| a.timestamp_millis()).max(ctx.n.created_ms);
    let base_ms = run.since_ms.unwrap_or(trigger_ms).min(now_ms);
    match &node.step {
        StepDef::Branch { when, .. } => {
            let holds = conditions::holds(ctx.deps, ctx.t, ctx.n, run, ctx.user.as_ref(), when).await?;
            record(ctx, run, i, if holds { "then" } else { "else" }, None, None);
            Ok(Next::Go(if holds { node.then.or(node.next) } else { node.otherwise.or(node.next) }))
        }
        StepDef::Delay { duration, until, .. } => {
            let due = match (duration, until) {
                (Some(d), _) => base_ms.saturating_add(definition::duration_ms(d).unwrap_or(0)),
                (None, Some(u)) => next_wall_time(ctx, u, None, now_ms),
                (None, None) => now_ms,
            };
            if due <= now_ms {
                record(ctx, run, i, "done", None, None);
                return Ok(Next::Go(node.next));
            }
            schedule_resume(ctx, run, i, due, false).await?;
            Ok(Next::Wait(Wait::Delay { due_ms: due }))
        }
        StepDef::Throttle { limit, per, key, .. } => {
            let key = render_key(key.as_deref(), &run.params)?;
            if throttle_pass(ctx, run, i, &key, *limit, per).await? {
                record(ctx, run, i, "done", None, None);
                Ok(Next::Go(node.next))
            } else {
                record(ctx, run, i, "throttled", None, None);
                Ok(Next::End(RunStatus::Throttled))
            }
        }
        StepDef::Digest { window, schedule, key, .. } => {
            let key = render_key(key.as_deref(), &run.params)?;
            let due = match (window, schedule) {
                (Some(w), _) => base_ms.saturating_add(definition::duration_ms(w).unwrap_or(0)),
                (None, Some(s)) => {
                    let on = match s.every {
                        Every::Day => None,
                        Every::Week => {
                            Some(s.on.as_deref().and_then(definition::parse_weekday).unwrap_or(chrono::Weekday::Mon))
                        }
                    };
                    next_wall_time(ctx, &s.at, on, now_ms)
                }
                (None, None) => now_ms,
            };
            let pk = digest::partition(ctx.t, &ctx.wf.workflow_id, &run.user_id, i as u32, &key);
            match digest::enter(ctx.deps, &pk, &ctx.n.notification_id, &run.params, base_ms, due).await? {
                Entered::Leader { window, flush_ms } => {
                    let task = TimerTask::WorkflowDigest {
                        tenant: ctx.t.clone(),
                        notification_id: ctx.n.notification_id.clone(),
                        user_id: run.user_id.clone(),
                        node: i as u32,
                        window: window.clone(),
                    };
                    timer::schedule(ctx.deps, DateTime::from_timestamp_millis(flush_ms).unwrap_or_default(), task)
                        .await?;
                    Ok(Next::Wait(Wait::Digest { pk, window, due_ms: flush_ms }))
                }
                Entered::Joined { leader, .. } => {
                    record(ctx, run, i, "merged", None, Some(format!("into notification {leader}")));
                    Ok(Next::End(RunStatus::Completed))
                }
            }
        }
        StepDef::Send { .. } => send(ctx, run, i, 0).await,
    }
}

/// A send step from its channel `from` on: the first channel that gets the message ends it; one
/// that cannot (no address, opted out, a render error) gives way to the next at once; with
/// several channels, one whose send is queued is waited for ([`judge_send`]).
async fn send(ctx: &Ctx<'_>, run: &mut Run, i: usize, from: usize) -> CoreResult<Next> {
    let Some(node) = ctx.nodes.get(i) else { return Ok(Next::Go(None)) };
    let StepDef::Send { template_id, wait, .. } = &node.step else { return Ok(Next::Go(node.next)) };
    let channels = node.step.send_channels();
    let fallback = channels.len() > 1;
    let now_ms = ctx.deps.clock.now_ms();
    let mut step_n = step_notification(ctx, run, template_id);
    for (k, &channel) in channels.iter().enumerate().skip(from) {
        step_n.request.channels = Some(vec![channel]);
        let outcome = orchestrator::plan_step_send(
            ctx.deps,
            ctx.t,
            &step_n,
            run.page,
            &run.user_id,
            ctx.user.as_ref(),
            channel,
            (i as u32, fallback),
        )
        .await?;
        crate::crash::point("workflow.send_planned");
        match outcome {
            StepSend::Deferred(until) => {
                let due = until.timestamp_millis();
                schedule_resume(ctx, run, i, due, false).await?;
                return Ok(Next::Wait(Wait::Deferred { due_ms: due, channel_index: k as u32 }));
            }
            StepSend::Suppressed(reason) => {
                record(ctx, run, i, "suppressed", Some(channel), Some(reason));
            }
            // A one-channel send is not waited for: one that failed at the provider was queued
            // by an earlier drive of this step, cut off before it went on; its failure is the
            // delivery's, as it would have been had that drive gone on.
            StepSend::Failed(_, true) if !fallback => {
                record(ctx, run, i, "queued", Some(channel), None);
                return Ok(Next::Go(node.next));
            }
            // The same with channels left: judged as that drive would have (`fell_back`).
            StepSend::Failed(_, true) => {
                record(ctx, run, i, "queued", Some(channel), None);
                match judge_send(ctx, run, i, k, None).await? {
                    Judged::Done(next) => return Ok(next),
                    Judged::NextChannel => continue,
                    Judged::Pending => return wait_for_send(ctx, run, i, k, wait.as_deref(), now_ms).await,
                }
            }
            StepSend::Failed(error, _) => {
                record(ctx, run, i, "failed", Some(channel), Some(error));
                if !fallback {
                    run.failed = true;
                }
            }
            StepSend::Sent => {
                record(ctx, run, i, "sent", Some(channel), None);
                if !fallback {
                    return Ok(Next::Go(node.next));
                }
                match judge_send(ctx, run, i, k, None).await? {
                    Judged::Done(next) => return Ok(next),
                    Judged::NextChannel => continue,
                    Judged::Pending => return wait_for_send(ctx, run, i, k, wait.as_deref(), now_ms).await,
                }
            }
            StepSend::Queued => {
                record(ctx, run, i, "queued", Some(channel), None);
                if !fallback {
                    return Ok(Next::Go(node.next));
                }
                return wait_for_send(ctx, run, i, k, wait.as_deref(), now_ms).await;
            }
        }
    }
    if fallback && run.steps.iter().rev().take_while(|r| r.index == i as u32).all(|r| r.status == "failed") {
        run.failed = true;
    }
    Ok(Next::Go(node.next))
}

/// A fallback's channel `k` is on its way: wait for it (until `wait` ends, or until its send
/// ends), checked by a timer and woken by the send's end.
async fn wait_for_send(
    ctx: &Ctx<'_>,
    run: &Run,
    i: usize,
    k: usize,
    wait: Option<&str>,
    now_ms: i64,
) -> CoreResult<Next> {
    let deadline_ms = wait.and_then(definition::duration_ms).map(|d| now_ms.saturating_add(d));
    let due = next_check(now_ms, deadline_ms, 0);
    schedule_resume(ctx, run, i, due, true).await?;
    Ok(Next::Wait(Wait::Send { channel_index: k as u32, deadline_ms, checks: 0 }))
}

/// When a fallback's send is next checked: at its deadline, or (none) 30 s, then doubling to 15
/// minutes, while the send has not ended (the send's end wakes the run at once as well).
fn next_check(now_ms: i64, deadline_ms: Option<i64>, checks: u32) -> i64 {
    let poll = 30_000i64.saturating_mul(1i64 << checks.min(5)).min(15 * 60_000);
    match deadline_ms {
        Some(d) => d.min(now_ms + poll).max(now_ms),
        None => now_ms + poll,
    }
}

/// What a fallback's channel reached, judged.
enum Judged {
    /// Decided: go on there.
    Done(Next),
    /// Failed for good, or not in time: the next channel.
    NextChannel,
    /// Still on its way.
    Pending,
}

/// Judges a fallback's channel `k` by what its send reached.
async fn judge_send(ctx: &Ctx<'_>, run: &mut Run, i: usize, k: usize, deadline_ms: Option<i64>) -> CoreResult<Judged> {
    let Some(node) = ctx.nodes.get(i) else { return Ok(Judged::Done(Next::Go(None))) };
    let StepDef::Send { until, .. } = &node.step else { return Ok(Judged::Done(Next::Go(node.next))) };
    let channels = node.step.send_channels();
    let Some(&channel) = channels.get(k) else { return Ok(Judged::Done(Next::Go(node.next))) };
    let r = conditions::reached(ctx.deps, ctx.t, ctx.n, &run.user_id, i as u32, channel).await?;
    use crate::notify::model::DeliveryStatus as S;
    let ended_badly = matches!(r.status, Some(S::Failed | S::Dead | S::Suppressed) | None);
    let done = match until {
        Some(reach) => r.reaches(*reach),
        None => r.reaches(definition::Reach::Sent),
    };
    if done {
        record(ctx, run, i, "done", Some(channel), until.map(|u| format!("reached {}", u.as_str())));
        return Ok(Judged::Done(Next::Go(node.next)));
    }
    let out_of_time = deadline_ms.is_some_and(|d| ctx.deps.clock.now_ms() + 1_000 >= d);
    if ended_badly || out_of_time {
        let why = if ended_badly { "failed for good" } else { "not reached in time" };
        record(ctx, run, i, "fell_back", Some(channel), Some(why.into()));
        if k + 1 >= channels.len() {
            if ended_badly && r.status != Some(S::Suppressed) {
                run.failed = true;
            }
            return Ok(Judged::Done(Next::Go(node.next)));
        }
        return Ok(Judged::NextChannel);
    }
    Ok(Judged::Pending)
}

/// The notification a send step plans its deliveries as: the workflow's category, the step's
/// template, the run's params (the caller names the channel).
fn step_notification(ctx: &Ctx<'_>, run: &Run, template_id: &str) -> Notification {
    let mut n = ctx.n.clone();
    n.request.template_id = template_id.to_owned();
    n.request.category = Some(ctx.wf.category);
    n.request.params = run.params.clone();
    n
}

/// A step's `key`, rendered with the run's params (none: one key for all).
fn render_key(template: Option<&str>, params: &Value) -> CoreResult<String> {
    let Some(template) = template else { return Ok(String::new()) };
    crate::templates::render_fragment(template, params).map_err(|e| CoreError::invalid("key", e.to_string()))
}

/// The next `at` (`HH:MM`) in the user's zone after now (on weekday `on`, if given).
fn next_wall_time(ctx: &Ctx<'_>, at: &str, on: Option<chrono::Weekday>, now_ms: i64) -> i64 {
    let Some(time) = definition::parse_wall_time(at) else { return now_ms };
    let tz = Zone::of(ctx.user.as_ref().and_then(|u| u.timezone.as_deref()));
    let now = DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap_or_default();
    let today = tz.local(now).date();
    for days in 0..=8 {
        let date = today + ChronoDuration::days(days);
        if on.is_some_and(|w| date.weekday() != w) {
            continue;
        }
        let due = tz.instant(date, time);
        if due > now {
            return due.timestamp_millis();
        }
    }
    now_ms
}

/// Counts the run past a throttle (once: the counter remembers the run) unless `limit` runs of
/// this (recipient, key) passed in the current `per` window.
async fn throttle_pass(ctx: &Ctx<'_>, run: &Run, i: usize, key: &str, limit: u32, per: &str) -> CoreResult<bool> {
    let per_ms = definition::duration_ms(per).unwrap_or(86_400_000);
    let now_ms = ctx.deps.clock.now_ms();
    let window = now_ms.div_euclid(per_ms.max(1));
    let hash = definition::key_hash(key);
    let counter = crate::ports::Key::new(
        format!("T#{}#THR#{}#{}", ctx.t, ctx.wf.workflow_id, run.user_id),
        format!("{i}#{hash}#{window}"),
    );
    let mark = format!("r_{}", ctx.n.notification_id);
    let ttl = (window + 1) * per_ms / 1000 + 86_400;
    let cond = Cond::And(vec![
        Cond::AttrNotExists(mark.clone()),
        Cond::Or(vec![Cond::AttrNotExists("count".into()), Cond::lt("count", i64::from(limit))]),
    ]);
    let updates = vec![Update::add("count", 1), Update::set(&mark, true), Update::set("ttl", ttl)];
    match ctx.deps.table.update(&counter, updates, cond).await {
        Ok(_) => Ok(true),
        Err(StoreError::ConditionFailed { .. }) => {
            // Counted by an earlier drive of this run, or full.
            match ctx.deps.table.update(&counter, vec![], Cond::AttrExists(mark)).await {
                Ok(_) => Ok(true),
                Err(StoreError::ConditionFailed { .. }) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

async fn schedule_resume(ctx: &Ctx<'_>, run: &Run, i: usize, due_ms: i64, check: bool) -> CoreResult<()> {
    let task = TimerTask::WorkflowResume {
        tenant: ctx.t.clone(),
        notification_id: ctx.n.notification_id.clone(),
        user_id: run.user_id.clone(),
        node: i as u32,
        check,
    };
    timer::schedule(ctx.deps, DateTime::from_timestamp_millis(due_ms).unwrap_or_default(), task).await
}

fn record(ctx: &Ctx<'_>, run: &mut Run, i: usize, status: &str, channel: Option<Channel>, detail: Option<String>) {
    let kind = ctx.nodes.get(i).map_or("step", |n| n.step.kind());
    metrics::counter!(crate::metrics::WORKFLOW_STEPS, "type" => kind, "status" => status.to_owned()).increment(1);
    run.steps.push(StepRecord {
        index: i as u32,
        kind: kind.to_owned(),
        status: status.to_owned(),
        at: ctx.deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        channel,
        detail,
    });
}

/// Writes the run where `next` leaves it (waiting, or ended: its page's `running` counted down
/// in the same transaction).
async fn save(ctx: &Ctx<'_>, mut run: Run, seq: u64, next: Next) -> CoreResult<()> {
    let ended = match next {
        Next::Wait(w) => {
            let what = match &w {
                Wait::Delay { .. } => "delay",
                Wait::Deferred { .. } => "deferred",
                Wait::Digest { .. } => "digest",
                Wait::Send { .. } => "send",
            };
            metrics::counter!(crate::metrics::WORKFLOW_WAITS, "for" => what).increment(1);
            run.status = RunStatus::Waiting;
            run.wait = Some(w);
            false
        }
        Next::End(status) => {
            run.status = status;
            run.at = None;
            run.wait = None;
            true
        }
        Next::Go(_) => false,
    };
    write(ctx, run, seq, ended).await
}

async fn write(ctx: &Ctx<'_>, mut run: Run, seq: u64, ended: bool) -> CoreResult<()> {
    run.seq = seq + 1;
    run.updated_at = ctx.deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let key = keys::run(ctx.t, &ctx.n.notification_id, &run.user_id);
    // Digest events too many for one item: the count stays, the newest events are dropped.
    let item = loop {
        let item = Item::new(key.clone(), attrs_of(&run)?);
        if crate::sizes::check_stored("params", &item).is_ok() {
            break item;
        }
        match run.params.get_mut("events") {
            Some(Value::Array(events)) if !events.is_empty() => events.truncate(events.len() / 2),
            _ => return Err(CoreError::invalid("params", "the run is too large to store")),
        }
    };
    let cond = Cond::eq("seq", i64::try_from(seq).unwrap_or(i64::MAX));
    let put = Write::Put { item, cond };
    let mut writes = vec![put];
    if ended {
        writes.push(progress::counter_write(
            progress::counter_key(ctx.t, &ctx.n.notification_id, run.page, &run.user_id),
            &[("running", -1)],
            ctx.deps.clock.now_ms(),
        ));
        // Told to the shop in the same transaction (its outbox): once, whatever drives the end.
        let data = json!({
            "notification_id": ctx.n.notification_id,
            "user_id": run.user_id,
            "workflow_id": run.workflow_id,
            "version": run.version,
            "status": run.status,
            "steps": run.steps.len(),
        });
        let event =
            Event::of(ctx.deps, ctx.t, EventType::WorkflowRunEnded, &[&ctx.n.notification_id, &run.user_id], data);
        writes.extend(crate::webhooks::event_writes(ctx.deps, ctx.t, vec![event]).await?);
    }
    match ctx.deps.table.transact(writes).await {
        Ok(()) => {
            if ended {
                metrics::counter!(crate::metrics::WORKFLOW_RUNS_ENDED, "status" => run.status.as_str()).increment(1);
                info!(notification_id = %ctx.n.notification_id, user_id = %run.user_id, status = ?run.status, "run ended");
            }
            Ok(())
        }
        // Driven meanwhile by another wake: its write stands (the steps' effects are idempotent).
        Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How many runs one cancel sweep ends before it hands the rest to the next.
const CANCEL_PAGE: usize = 100;

/// Ends the runs of a cancelled notification that have not ended, a page at a time (the next
/// page is the next sweep's: a cancel of a million recipients is many short tasks, each
/// redelivered alone if its process dies). Each run ends as its own next wake would end it:
/// a digest window it leads is abandoned, the run `cancelled`, the notification's count of open
/// runs counted down, the `workflow.run_ended` webhook told. A run a step is driving meanwhile
/// loses the race on its `seq` and is ended by this sweep's retry or by its own next wake.
pub async fn cancel_page(deps: &Deps, t: &TenantId, notification_id: &str, cursor: Option<String>) -> CoreResult<()> {
    let pk = keys::notification_pk(t, notification_id);
    let page =
        deps.table.query(&pk, keys::RUN_PREFIX, QueryOpts { limit: CANCEL_PAGE, cursor, descending: false }).await?;
    let Some(n) = crate::notify::api::load(deps, t, notification_id).await? else { return Ok(()) };
    // The notification and its workflow's versions are read once for the page; a cancelled run
    // needs no user (it sends nothing), and the run read by the query is driven as it is (its
    // `seq` condition stops it if a step wrote it meanwhile).
    let mut versions: Vec<(Workflow, Vec<Node>)> = Vec::new();
    for item in &page.items {
        let run: Run = item.parse()?;
        if run.status.ended() {
            continue;
        }
        let at =
            match versions.iter().position(|(wf, _)| wf.workflow_id == run.workflow_id && wf.version == run.version) {
                Some(at) => at,
                None => {
                    let Some(wf) = super::get_version(deps, t, &run.workflow_id, run.version).await? else { continue };
                    let nodes = definition::layout(&wf.steps);
                    versions.push((wf, nodes));
                    versions.len() - 1
                }
            };
        let (wf, nodes) = &versions[at];
        let ctx = Ctx { deps, t, n: &n, wf, nodes, user: None };
        drive(&ctx, run, Wake::Start).await?;
    }
    if let Some(cursor) = page.next_cursor {
        let next = TimerTask::WorkflowCancel {
            tenant: t.clone(),
            notification_id: notification_id.to_owned(),
            cursor: Some(cursor),
        };
        timer::schedule(deps, deps.clock.now(), next).await?;
    }
    Ok(())
}

/// One page of a notification's runs, in user id order.
pub async fn runs(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<Option<RunPage>> {
    crate::ids::check_id("notification_id", notification_id)?;
    if deps.table.get(&keys::notification(t, notification_id)).await?.is_none() {
        return Ok(None);
    }
    let page = deps
        .table
        .query(
            &keys::notification_pk(t, notification_id),
            keys::RUN_PREFIX,
            QueryOpts { limit, cursor, descending: false },
        )
        .await
        .map_err(CoreError::of_page_query)?;
    let mut items = Vec::with_capacity(page.items.len());
    for item in &page.items {
        let run: Run = item.parse()?;
        items.push(view(run));
    }
    Ok(Some(RunPage { items, next_cursor: page.next_cursor }))
}

fn view(run: Run) -> RunView {
    let mut steps = run.steps;
    let due = match &run.wait {
        Some(Wait::Delay { due_ms } | Wait::Deferred { due_ms, .. } | Wait::Digest { due_ms, .. }) => Some(*due_ms),
        Some(Wait::Send { deadline_ms, .. }) => *deadline_ms,
        None => None,
    };
    if run.status == RunStatus::Waiting
        && let Some(at) = run.at
    {
        steps.push(StepRecord {
            index: at,
            kind: match &run.wait {
                Some(Wait::Digest { .. }) => "digest",
                Some(Wait::Delay { .. }) => "delay",
                _ => "send",
            }
            .into(),
            status: "waiting".into(),
            at: run.updated_at.clone(),
            channel: None,
            detail: match &run.wait {
                Some(Wait::Deferred { .. }) => Some("quiet hours".into()),
                _ => None,
            },
        });
    }
    RunView {
        user_id: run.user_id,
        workflow_id: run.workflow_id,
        version: run.version,
        status: run.status,
        steps,
        waiting_until: due.map(rfc3339),
    }
}
