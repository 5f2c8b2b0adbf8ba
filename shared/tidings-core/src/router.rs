//! Routes a queue's messages to the handler of its lane: the one place that knows which
//! feature handles which queue.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::attempts::{ALONE_WAIT, KEEP_S, Marker};
use crate::deps::Deps;
use crate::keys;
use crate::lanes::Lane;
use crate::notify::channel::ChannelSend;
use crate::notify::requests::Orchestrate;
use crate::outcome::Outcome;
use crate::ports::{Cond, Item, Key, Received, StoreError, attrs_of};
use crate::restock::StockEventStep;
use crate::tasks::{handle, handle_batch};
use crate::timers::TimerStep;
use crate::webhooks::WebhookStep;

/// The lanes whose handlers a build links. A Lambda function names its own at compile time
/// ([`Handlers`]), so that its link drops the handlers of every lane it never serves (the
/// channel worker has no campaign planning, the tick no sending; docs/deploy.md, "The
/// functions' size"); the local runtime and the tests link them all ([`Every`]). A message of
/// a lane whose handler is not linked is refused to its dead letters with the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneHandlers {
    pub requests: bool,
    pub channel: bool,
    pub webhooks: bool,
    pub timers: bool,
    pub stock_events: bool,
}

impl LaneHandlers {
    pub const ALL: Self = Self { requests: true, channel: true, webhooks: true, timers: true, stock_events: true };
    pub const NONE: Self =
        Self { requests: false, channel: false, webhooks: false, timers: false, stock_events: false };

    /// Whether `lane`'s handler is linked.
    pub const fn has(self, lane: Lane) -> bool {
        match lane {
            Lane::Requests(_) => self.requests,
            Lane::Channel(..) => self.channel,
            Lane::Webhooks => self.webhooks,
            Lane::Timers => self.timers,
            Lane::StockEvents => self.stock_events,
            Lane::InventoryReview | Lane::StreamFailures | Lane::ScheduleFailures => false,
        }
    }
}

/// A build's [`LaneHandlers`], as a type: a constant the compiler folds, so that the handlers
/// left out are not reached, and not linked.
pub trait Handlers: Send + Sync + 'static {
    const LINKED: LaneHandlers;
}

/// Every lane's handler: the local runtime, the tests.
#[derive(Debug)]
pub enum Every {}

impl Handlers for Every {
    const LINKED: LaneHandlers = LaneHandlers::ALL;
}

/// The handlers of each function that consumes lanes: those of the lanes [`Lane::consumer`]
/// gives it. The local runtime handles each queue with its consumer's, as Lambda does.
pub mod consumers {
    use super::{Handlers, LaneHandlers};

    /// The orchestrator: requests (sends, campaigns, restock rounds planned).
    #[derive(Debug)]
    pub enum Orchestrator {}
    impl Handlers for Orchestrator {
        const LINKED: LaneHandlers = LaneHandlers { requests: true, ..LaneHandlers::NONE };
    }

    /// The channel worker: the channel lanes' sends and the webhooks' deliveries.
    #[derive(Debug)]
    pub enum ChannelWorker {}
    impl Handlers for ChannelWorker {
        const LINKED: LaneHandlers = LaneHandlers { channel: true, webhooks: true, ..LaneHandlers::NONE };
    }

    /// The tick: the timers.
    #[derive(Debug)]
    pub enum Tick {}
    impl Handlers for Tick {
        const LINKED: LaneHandlers = LaneHandlers { timers: true, ..LaneHandlers::NONE };
    }

    /// Restock-scan: the stock events.
    #[derive(Debug)]
    pub enum RestockScan {}
    impl Handlers for RestockScan {
        const LINKED: LaneHandlers = LaneHandlers { stock_events: true, ..LaneHandlers::NONE };
    }

    #[cfg(test)]
    mod tests {
        use super::{ChannelWorker, Handlers, LaneHandlers, Orchestrator, RestockScan, Tick};
        use crate::lanes::Lane;

        /// The handlers of the function named `function`, if it consumes lanes.
        fn of(function: &str) -> Option<LaneHandlers> {
            use crate::lanes::{CHANNEL_WORKER, ORCHESTRATOR, RESTOCK_SCAN, TICK};
            match function {
                ORCHESTRATOR => Some(Orchestrator::LINKED),
                CHANNEL_WORKER => Some(ChannelWorker::LINKED),
                TICK => Some(Tick::LINKED),
                RESTOCK_SCAN => Some(RestockScan::LINKED),
                _ => None,
            }
        }

        #[test]
        fn each_function_links_the_handlers_of_the_lanes_it_consumes_and_no_other() {
            let lanes = Lane::ALL;
            for function in ["orchestrator", "channel-worker", "tick", "restock-scan"] {
                let linked = of(function).expect(function);
                for lane in lanes {
                    assert_eq!(linked.has(lane), lane.consumer() == Some(function), "{function}, {lane}");
                }
            }
            assert_eq!(of("api"), None);
        }
    }
}

/// Routes a batch of messages of one queue: channel tasks are handled as a batch
/// ([`crate::notify::worker::handle_channel_batch`]), the others one by one. One outcome per
/// message, in order.
pub async fn dispatch_batch(deps: &Deps, queue: &str, messages: &[Received]) -> Vec<Outcome> {
    dispatch_batch_until(deps, queue, messages, None).await
}

/// [`dispatch_batch`] that starts no provider call it could not finish by `deadline` (a
/// Lambda invocation's end, a visibility timeout): the sends not started are handed back
/// (`pending`, their messages sent again: [`Outcome::HandBack`]) instead of being cut off
/// mid-way by the end of the invocation. Queues handled one message at a time (requests,
/// timers, stock events) hand back the messages that the slowest so far says would not end
/// before it.
pub async fn dispatch_batch_until(
    deps: &Deps,
    queue: &str,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    dispatch_batch_with::<Every>(deps, queue, messages, deadline).await
}

/// [`dispatch_batch_until`] with only the handlers of `H` linked.
pub async fn dispatch_batch_with<H: Handlers>(
    deps: &Deps,
    queue: &str,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    match Lane::from_name(queue) {
        Some(lane) => route_batch_with::<H>(deps, lane, messages, deadline).await,
        None => messages.iter().map(|_| unknown(queue)).collect(),
    }
}

fn unknown(queue: &str) -> Outcome {
    Outcome::Reject(format!("no handler for queue {queue}"))
}

/// [`dispatch_batch_until`] for a lane. A redelivered message is handled under an attempt
/// marker, and one whose earlier handling ended the process is set aside ([`guarded`]).
pub async fn route_batch(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    route_batch_with::<Every>(deps, lane, messages, deadline).await
}

/// [`route_batch`] with only the handlers of `H` linked.
pub async fn route_batch_with<H: Handlers>(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    if let Lane::Channel(..) = lane {
        return guarded::<H>(deps, lane, messages, deadline).await;
    }
    // One by one (requests, timers, stock events). After the first, which always runs so a
    // batch always makes progress, a message is not started when the longest one so far would
    // not end before the deadline: it is handed back, so the invocation is not cut off with a
    // campaign page half written (and every message of its batch charged a receive).
    let mut outcomes = Vec::with_capacity(messages.len());
    let mut longest = std::time::Duration::ZERO;
    for (i, message) in messages.iter().enumerate() {
        if i > 0 && deadline.is_some_and(|d| std::time::Instant::now() + longest >= d) {
            outcomes.push(Outcome::HandBack);
            continue;
        }
        let started = std::time::Instant::now();
        outcomes.push(one_of(guarded::<H>(deps, lane, std::slice::from_ref(message), deadline).await));
        longest = longest.max(started.elapsed());
    }
    outcomes
}

/// The one outcome of a one-message batch.
fn one_of(outcomes: Vec<Outcome>) -> Outcome {
    outcomes.into_iter().next().unwrap_or(Outcome::Retry(Duration::ZERO))
}

/// Handles `messages` (one, or a channel lane's batch) under the attempt markers of the
/// redelivered ones (docs/delivery.md, "A message that ends the process"): a first receipt
/// writes nothing; a redelivered message is marked before it runs and unmarked after, whatever
/// the outcome (a cut-off included: only the end of the process leaves a marker); a marker
/// left by an earlier receive sets the message aside when that attempt had nothing beside it,
/// and else gets it one more attempt alone. A marker that cannot be written costs nothing but
/// the guard: the message is handled as if first received. A message received again while an
/// earlier receive of it still runs in this process (its visibility ran out under a slow store)
/// is not handled beside it, nor its marker judged: it comes back after [`RUNNING_AGAIN_AFTER`].
async fn guarded<H: Handlers>(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    let ids: Vec<(&str, &str)> = messages.iter().map(|m| (m.message_id.as_str(), m.receipt.as_str())).collect();
    let (_running, already) = deps.attempts.running(lane.name(), &ids);
    if already.contains(&true) {
        // Shown again while an earlier receive still runs here (its visibility ran out): that
        // receive's marker is no sign of an end of the process. Back once it has had its time.
        let (again, rest): (Vec<_>, Vec<_>) = (0..messages.len()).partition(|&i| already[i]);
        for &i in &again {
            tracing::warn!(queue = lane.name(), message_id = %messages[i].message_id,
                "received again while its earlier receive still runs here; retried later");
        }
        let batch: Vec<Received> = rest.iter().map(|&i| messages[i].clone()).collect();
        let done = if batch.is_empty() { Vec::new() } else { under_markers::<H>(deps, lane, &batch, deadline).await };
        let mut outcomes = vec![Outcome::Retry(RUNNING_AGAIN_AFTER); messages.len()];
        for (i, outcome) in rest.into_iter().zip(done) {
            outcomes[i] = outcome;
        }
        return outcomes;
    }
    under_markers::<H>(deps, lane, messages, deadline).await
}

/// [`guarded`]'s markers, for messages no other receive of which runs in this process.
async fn under_markers<H: Handlers>(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    let table = deps.table.as_ref();
    if messages.iter().all(|m| m.receive_count < 2) {
        let _entry = deps.attempts.enter(table, messages.len()).await;
        return run::<H>(deps, lane, messages, deadline).await;
    }
    let mut outcomes: Vec<Option<Outcome>> = vec![None; messages.len()];
    let mut alone = Vec::new();
    {
        let mut entry = deps.attempts.enter(table, messages.len()).await;
        let beside = entry.beside();
        let mut go = Vec::with_capacity(messages.len());
        let mut marked = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if message.receive_count < 2 {
                go.push(i);
                continue;
            }
            match mark(deps, lane, message, beside, Mode::First).await {
                Verdict::Marked(key) => {
                    if beside == 0 {
                        deps.attempts.written_alone(table, &mut entry, &key).await;
                    }
                    marked.push((i, key));
                    go.push(i);
                }
                Verdict::Unmarked => go.push(i),
                Verdict::SetAside(reason) => outcomes[i] = Some(Outcome::Reject(reason)),
                Verdict::Alone => alone.push(i),
            }
        }
        if !go.is_empty() {
            let batch: Vec<Received> = go.iter().map(|&i| messages[i].clone()).collect();
            let done = run::<H>(deps, lane, &batch, deadline).await;
            for (&i, outcome) in go.iter().zip(done) {
                outcomes[i] = Some(outcome);
            }
        }
        drop(entry);
        for (i, key) in marked {
            unmark(deps, &key, messages[i].receive_count).await;
        }
    }
    // Each after the others, so that its marker can say it ran with nothing beside it.
    for i in alone {
        let message = &messages[i];
        let wait = match deadline {
            Some(d) => ALONE_WAIT.min(d.saturating_duration_since(std::time::Instant::now())),
            None => ALONE_WAIT,
        };
        let mut entry = deps.attempts.enter_alone(table, wait).await;
        let beside = entry.beside();
        let mode = if entry.is_alone() { Mode::Alone } else { Mode::Again };
        let marked = match mark(deps, lane, message, beside, mode).await {
            Verdict::Marked(key) => {
                if beside == 0 {
                    deps.attempts.written_alone(table, &mut entry, &key).await;
                }
                Some(key)
            }
            _ => None,
        };
        outcomes[i] = Some(one_of(run::<H>(deps, lane, std::slice::from_ref(message), deadline).await));
        drop(entry);
        if let Some(key) = marked {
            unmark(deps, &key, message.receive_count).await;
        }
    }
    outcomes.into_iter().map(|o| o.unwrap_or(Outcome::Retry(Duration::ZERO))).collect()
}

/// How long a message received again while its earlier receive still runs in this process is
/// kept out of sight: longer than that receive can still run past its deadline.
pub const RUNNING_AGAIN_AFTER: Duration = Duration::from_secs(5);

/// What the marker of a redelivered message decided.
enum Verdict {
    /// Marked: handle it, then unmark it.
    Marked(Key),
    /// The marker could not be written: handle it as if first received.
    Unmarked,
    /// Its handling ended the process, alone: to its DLQ with this reason, not handled.
    SetAside(String),
    /// Its handling ended the process beside others: one more attempt, alone.
    Alone,
}

/// Which attempt [`mark`] marks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The first at this receive: an earlier receive's marker is judged.
    First,
    /// The attempt alone after an ambiguous end: the earlier marker is replaced.
    Alone,
    /// The attempt alone that could not wait for the process to be free of other messages: the
    /// earlier marker is replaced, and the new one says it was not alone (`beside`).
    Again,
}

/// Marks an attempt at `message`, at its receive, `beside` other messages in flight; reads the
/// marker an earlier receive left, if any, unless the attempt is the one alone (which
/// replaces it).
async fn mark(deps: &Deps, lane: Lane, message: &Received, beside: u32, mode: Mode) -> Verdict {
    let key = keys::attempt(lane.name(), &message.message_id);
    let alone = mode == Mode::Alone;
    let marker = Marker {
        receive: message.receive_count,
        beside,
        alone,
        crashes: 0,
        ttl: deps.clock.now().timestamp() + KEEP_S,
    };
    let put = |cond, crashes| {
        let key = key.clone();
        let marker = Marker { crashes, ..marker.clone() };
        async move {
            let attrs = attrs_of(&marker)?;
            deps.table.put(Item::new(key, attrs), cond).await
        }
    };
    let refused = |e: StoreError| {
        tracing::warn!(error = %e, queue = lane.name(), message_id = %message.message_id,
            "could not mark an attempt at a redelivered message; handled unguarded");
        Verdict::Unmarked
    };
    let cond = if mode == Mode::First { Cond::NotExists } else { Cond::Always };
    match put(cond, 0).await {
        Ok(()) => return Verdict::Marked(key),
        Err(e) if !e.is_condition_failed() => return refused(e),
        Err(_) => {}
    }
    let earlier = match deps.table.get(&key).await {
        Ok(item) => item.and_then(|item| item.parse::<Marker>().ok()),
        Err(e) => return refused(e),
    };
    match earlier {
        Some(earlier) if earlier.receive < message.receive_count => {
            let crashes = earlier.crashes.saturating_add(1);
            if earlier.beside > 0 {
                Verdict::Alone
            } else if crashes >= deps.config.set_aside_after_crashes {
                Verdict::SetAside(set_aside_reason(&earlier))
            } else {
                // Allowed more ends than this one (`TIDINGS_SET_ASIDE_AFTER_CRASHES`): handled
                // again, the count carried.
                match put(Cond::Always, crashes).await {
                    Ok(()) => Verdict::Marked(key),
                    Err(e) => refused(e),
                }
            }
        }
        // Of this receive or a later one (a duplicate delivery), or unreadable: no verdict on it.
        _ => match put(Cond::Always, 0).await {
            Ok(()) => Verdict::Marked(key),
            Err(e) => refused(e),
        },
    }
}

/// What an operator reads on the dead letter of a message set aside.
fn set_aside_reason(earlier: &Marker) -> String {
    let how =
        if earlier.alone { "handled alone after an earlier ambiguous end" } else { "with no other message in flight" };
    format!(
        "set aside: the process ended while handling this message at receive {} ({how}); handling it again \
         could end it again. Redrive it once the cause is fixed (docs/delivery.md, \"A message that ends the process\")",
        earlier.receive
    )
}

/// Deletes the marker of an attempt that returned (if it is still this receive's).
async fn unmark(deps: &Deps, key: &Key, receive: u32) {
    match deps.table.delete(key, Cond::eq("receive", receive)).await {
        Ok(()) => {}
        Err(e) if e.is_condition_failed() => {}
        // Left behind, it would set the message aside were it to come again alone: only after
        // a retry, and only if its next attempt is also left unfinished by an end of the process.
        Err(e) => tracing::warn!(error = %e, "could not delete an attempt marker"),
    }
}

/// Runs the handler of `lane` on `messages` (one, or a channel lane's batch).
async fn run<H: Handlers>(
    deps: &Deps,
    lane: Lane,
    messages: &[Received],
    deadline: Option<std::time::Instant>,
) -> Vec<Outcome> {
    if let Lane::Channel(..) = lane {
        return channel_batch::<H>(deps, lane, messages, deadline).await;
    }
    let mut outcomes = Vec::with_capacity(messages.len());
    for message in messages {
        outcomes.push(cut_off_at::<H>(deps, lane, message, deadline).await);
    }
    outcomes
}

/// Runs one message's handler. A message still running `CUT_OFF_AFTER` past the deadline (one
/// far slower than those before it, or a first one too long for the invocation) is stopped
/// there and retried, so the invocation still answers: cut off by Lambda instead, its
/// environment would be killed and every message of the batch would wait out its visibility
/// timeout.
async fn cut_off_at<H: Handlers>(
    deps: &Deps,
    lane: Lane,
    message: &Received,
    deadline: Option<std::time::Instant>,
) -> Outcome {
    let Some(d) = deadline else {
        return handle_one::<H>(deps, lane, message).await;
    };
    let started = std::time::Instant::now();
    let cut_off = tokio::time::Instant::from_std(d + CUT_OFF_AFTER);
    match tokio::time::timeout_at(cut_off, handle_one::<H>(deps, lane, message)).await {
        Ok(outcome) => outcome,
        Err(_) => {
            tracing::warn!(
                queue = lane.name(),
                message_id = %message.message_id,
                ran_ms = started.elapsed().as_millis() as u64,
                "cut off at the invocation's deadline; retried"
            );
            Outcome::Retry(Duration::ZERO)
        }
    }
}

/// How long past its deadline a message handled one by one may still run before it is cut off
/// and retried: half of the room the Lambda handler keeps after the deadline (5 s,
/// `tidings_lambda::DEADLINE_ROOM`), the other half left to settle the batch and answer.
/// Stopping a handler there is what a crash at that point would be, and every handler is
/// written for that: a retried request message creates nothing twice
/// (docs/delivery.md, "Deadlines").
pub const CUT_OFF_AFTER: Duration = Duration::from_millis(2_500);

/// Routes a message to the handler of its queue.
pub async fn dispatch(deps: &Deps, queue: &str, message: &Received) -> Outcome {
    match Lane::from_name(queue) {
        Some(lane) => route(deps, lane, message).await,
        None => unknown(queue),
    }
}

/// Routes a message to the handler of its lane, under its attempt marker if it is a redelivery
/// ([`guarded`]).
pub async fn route(deps: &Deps, lane: Lane, message: &Received) -> Outcome {
    one_of(guarded::<Every>(deps, lane, std::slice::from_ref(message), None).await)
}

/// A channel lane's batch, sent if `H` links the channel handler. Not an `async fn`: an
/// `async fn`'s state machine keeps every future it could await, reachable or not, so the
/// choice is made here, before any future is made, where the compiler folds `H`'s constant and
/// drops the branch not taken with everything only it reaches (the same for [`handle_one`]).
fn channel_batch<'a, H: Handlers>(
    deps: &'a Deps,
    lane: Lane,
    messages: &'a [Received],
    deadline: Option<std::time::Instant>,
) -> BoxFuture<'a, Vec<Outcome>> {
    if H::LINKED.channel {
        Box::pin(handle_batch::<ChannelSend>(deps, messages, deadline))
    } else {
        Box::pin(std::future::ready(messages.iter().map(|_| not_linked(lane)).collect()))
    }
}

/// A message's handler, unguarded. Each arm's guard is a constant of `H`: an arm it leaves out
/// is not reached, so its handler is not linked ([`channel_batch`] says why this is not an
/// `async fn`).
fn handle_one<'a, H: Handlers>(deps: &'a Deps, lane: Lane, message: &'a Received) -> BoxFuture<'a, Outcome> {
    match lane {
        Lane::Requests(_) if H::LINKED.requests => Box::pin(handle::<Orchestrate>(deps, message)),
        // `channel_batch` is the guard: it refuses the lane when `H` does not link its handler.
        Lane::Channel(..) => {
            Box::pin(async move { one_of(channel_batch::<H>(deps, lane, std::slice::from_ref(message), None).await) })
        }
        Lane::StockEvents if H::LINKED.stock_events => Box::pin(handle::<StockEventStep>(deps, message)),
        Lane::Timers if H::LINKED.timers => Box::pin(handle::<TimerStep>(deps, message)),
        Lane::Webhooks if H::LINKED.webhooks => Box::pin(handle::<WebhookStep>(deps, message)),
        Lane::InventoryReview | Lane::StreamFailures | Lane::ScheduleFailures => {
            Box::pin(std::future::ready(Outcome::Reject(format!("nothing handles queue {lane}"))))
        }
        _ => Box::pin(std::future::ready(not_linked(lane))),
    }
}

/// The outcome of a message whose lane's handler this build does not link: to the dead
/// letters, with the reason (a mapping that should not exist).
fn not_linked(lane: Lane) -> Outcome {
    Outcome::Reject(format!("this function does not handle queue {lane}"))
}
