//! Crash injection (the `crash-points` build of `tidings`): the server aborts at a named step,
//! is started again, crashes again, several times; then runs clean. The delivery promises must
//! hold across every crash: transactional — nothing lost, at most one duplicate per crash;
//! marketing — never a duplicate; a step repeated after a crash (the relay's send, a fan-out
//! page) is absorbed by the delivery's claim; reservations — held once.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const CRASHES: usize = 3;
const USERS: [&str; 4] = ["c1", "c2", "c3", "c4"];

async fn setup(s: &Server) -> anyhow::Result<()> {
    for u in USERS {
        let (st, _) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        assert_eq!(st, 200);
    }
    let (st, _) = s
        .call(
            "PUT",
            "/v1/templates/crash",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "S", "email_body": "B {{ n }}"}}})),
        )
        .await?;
    assert_eq!(st, 200);
    Ok(())
}

/// Sends one notification to every user, lets the server crash at `point` `CRASHES` times (each
/// restart crashes again at the first hit), then runs clean until every delivery is final.
/// Returns the sends per user and the final deliveries.
async fn run(backend: Backend, point: &str, category: &str) -> anyhow::Result<(BTreeMap<String, usize>, Vec<Value>)> {
    let (per_user, deliveries, _) = run_with_sends(backend, point, category, Options::default()).await?;
    Ok((per_user, deliveries))
}

/// [`run`] with one worker per queue. The process dies as a whole: with two workers, the other
/// one can be between its provider call and its record when the first reaches the point, and
/// that delivery is sent again after its lease (the transactional trade-off, tested on its own
/// above). The exactly-once claims of the points before the provider call and after the record
/// are about the point itself, so those runs have no second worker to cut off.
async fn run_one_worker(
    backend: Backend,
    point: &str,
    category: &str,
) -> anyhow::Result<(BTreeMap<String, usize>, Vec<Value>)> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_WORKERS_HIGH", "1".into()));
    opts.env.push(("TIDINGS_WORKERS_LOW", "1".into()));
    let (per_user, deliveries, _) = run_with_sends(backend, point, category, opts).await?;
    Ok((per_user, deliveries))
}

/// [`run`], also returning every send of the notification (with its attempt number).
async fn run_with_sends(
    backend: Backend,
    point: &str,
    category: &str,
    mut opts: Options,
) -> anyhow::Result<(BTreeMap<String, usize>, Vec<Value>, Vec<Value>)> {
    opts.env.push(("TIDINGS_CRASH_AT", point.into()));
    // Each crash costs every message then in flight one receive, and the server crashes
    // `CRASHES + 1` times: the DLQ's threshold is raised above that, so that what is tested is
    // recovery, not how many crashes a message survives.
    opts.env.push(("TIDINGS_MAX_RECEIVES", "12".into()));
    // The same for the rule that sets aside a message whose handling ended the process
    // (docs/delivery.md, "A message that ends the process"): here every end is the test's.
    opts.env.push(("TIDINGS_SET_ASIDE_AFTER_CRASHES", "12".into()));
    let mut s = Server::start(backend, opts).await?;
    setup(&s).await?;
    let request = json!({"idempotency_key": format!("crash-{point}"), "recipients": {"user_ids": USERS},
                         "template_id": "crash", "params": {"n": 1}, "category": category, "channels": ["email"]});
    // The accept commits before it answers, and a step after it (the relay) may reach the point
    // and end the process before the answer is written: that is the first crash, and the id is
    // asked for again, with the same idempotency key, once the server runs clean.
    let mut id = match s.call("POST", "/v1/notifications", Some(request.clone())).await {
        Ok((st, v)) => {
            assert_eq!(st, 202, "{v}");
            Some(v["notification_id"].as_str().unwrap_or_default().to_owned())
        }
        Err(e) => {
            anyhow::ensure!(
                s.exited_within(Duration::from_secs(30)).await?,
                "the accept was cut off but the server runs on: {e}"
            );
            None
        }
    };
    // Marketing sends after the provider call are at most once: a batch claimed before the
    // crash is never sent again, so the point may not be reached again after the first crash.
    let may_run_dry = category == "marketing" && point == "worker.after_provider";
    for crash in 0..=CRASHES {
        let exited = if crash == 0 && id.is_none() {
            true
        } else {
            match next_crash(&mut s, id.as_deref(), crash, may_run_dry).await? {
                Wait::Crashed => true,
                Wait::RanDry => break,
                Wait::NotReached => false,
            }
        };
        if !exited {
            let id = id.as_deref().unwrap_or_default();
            let (_, deliveries) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            let (_, queues) = s.ops("GET", "/v1/ops/queues", None).await?;
            anyhow::bail!(
                "crash {crash}: the server did not reach {point} (is `tidings` built with --features \
                 crash-points?)\ndeliveries: {deliveries}\nqueues: {queues}"
            );
        }
        if crash < CRASHES {
            s.restart_with_crash_at(Some(point)).await?;
        }
    }
    // Stops a server still running (one that ran dry) and starts it clean.
    s.restart_with_crash_at(None).await?;
    let id = match id.take() {
        Some(id) => id,
        None => {
            let (st, v) = s.call("POST", "/v1/notifications", Some(request)).await?;
            assert_eq!(st, 202, "the repeated key answers the accepted notification: {v}");
            v["notification_id"].as_str().unwrap_or_default().to_owned()
        }
    };
    let settled = s
        .eventually(Duration::from_secs(240), "every delivery final", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            // A transactional send claimed before a crash is retried when its lease runs out; a
            // marketing one is closed as failed (outcome unknown), never sent again.
            let settled = |d: &Value| d["status"] != "pending" && d["status"] != "sending";
            Ok((items.len() == USERS.len() && items.iter().all(settled)).then_some(items))
        })
        .await;
    let deliveries = match settled {
        Ok(items) => items,
        Err(e) => {
            // What was left, so that a failure explains itself: the deliveries and the queues.
            let (_, deliveries) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            let (_, queues) = s.ops("GET", "/v1/ops/queues", None).await?;
            anyhow::bail!("{e}\ndeliveries: {deliveries}\nqueues: {queues}");
        }
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sends = s.sends(&id).await?;
    let mut per_user: BTreeMap<String, usize> = BTreeMap::new();
    for send in &sends {
        *per_user.entry(send["user_id"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    Ok((per_user, deliveries, sends))
}

/// For a crash outside the worker (the relay, the fan-out): each user got the message, and
/// the messages those steps repeat after a crash were absorbed by the delivery's claim. No
/// user got two sends of one attempt. The process dies as a whole, though, so a crash can also
/// cut off a worker between its provider call and its record; that delivery is claimed again
/// when its lease runs out (a later attempt), the transactional trade-off: at most one such
/// resend per crash.
fn assert_repeats_absorbed(per_user: &BTreeMap<String, usize>, sends: &[Value]) {
    assert_eq!(per_user.len(), USERS.len(), "every user got the message: {per_user:?}");
    let mut attempts: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for send in sends {
        let user = send["user_id"].as_str().unwrap_or_default().to_owned();
        *attempts.entry((user, send["attempt"].as_u64().unwrap_or(0))).or_default() += 1;
    }
    assert!(attempts.values().all(|n| *n == 1), "a repeated message sent again within one claim: {attempts:?}");
    let resends = total(per_user) - USERS.len();
    assert!(resends <= CRASHES + 1, "at most one resend per crash: {attempts:?}");
}

enum Wait {
    Crashed,
    /// Nothing is left that could bring the point round again.
    RanDry,
    NotReached,
}

/// Waits for the server to reach its crash point. After the first crash it may run dry: every
/// delivery final (two workers can each pass the point before the process dies, so a crash can
/// take two sends with it), or a marketing batch claimed before a crash (never sent again) given
/// 30 s to prove it. Otherwise as long as a busy emulator may need to bring the point round
/// again.
async fn next_crash(s: &mut Server, id: Option<&str>, crash: usize, may_run_dry: bool) -> anyhow::Result<Wait> {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        if s.exited_within(Duration::from_secs(2)).await? {
            return Ok(Wait::Crashed);
        }
        let Some(id) = id.filter(|_| crash > 0) else { continue };
        if may_run_dry && start.elapsed() >= Duration::from_secs(30) {
            return Ok(Wait::RanDry);
        }
        // The server may die while it answers: the next wait sees it.
        if let Ok((200, v)) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await {
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let open = |d: &Value| d["status"] == "pending" || d["status"] == "sending";
            if items.len() == USERS.len() && !items.iter().any(open) {
                return Ok(Wait::RanDry);
            }
        }
    }
    Ok(Wait::NotReached)
}

fn total(per_user: &BTreeMap<String, usize>) -> usize {
    per_user.values().sum()
}

pub async fn transactional_crash_after_provider_loses_nothing_and_duplicates_at_most_once_per_crash(
    backend: Backend,
) -> anyhow::Result<()> {
    let (per_user, deliveries) = run(backend, "worker.after_provider", "transactional").await?;
    assert_eq!(per_user.len(), USERS.len(), "every user got the message: {per_user:?}");
    assert!(deliveries.iter().all(|d| d["status"] == "sent"), "{deliveries:?}");
    let duplicates = total(&per_user) - USERS.len();
    // The process dies as a whole: besides the send at the crash point, the other worker of the
    // email-high pool (TIDINGS_WORKERS_HIGH, 2) may be between its provider call and its record
    // (see `run_one_worker`). So at most one duplicate per worker and crash.
    let workers = 2;
    assert!(
        duplicates <= (CRASHES + 1) * workers,
        "at most one duplicate per worker per crash ({} crashes, {workers} workers): {per_user:?}",
        CRASHES + 1
    );
    assert!(duplicates >= 1, "a crash after the provider accepted does cause a resend (the documented trade-off)");
    Ok(())
}

pub async fn transactional_crash_before_provider_sends_each_exactly_once(backend: Backend) -> anyhow::Result<()> {
    let (per_user, deliveries) = run_one_worker(backend, "worker.before_provider", "transactional").await?;
    assert!(deliveries.iter().all(|d| d["status"] == "sent"), "{deliveries:?}");
    assert_eq!(per_user.len(), USERS.len(), "{per_user:?}");
    assert!(per_user.values().all(|n| *n == 1), "no duplicates: {per_user:?}");
    Ok(())
}

pub async fn crash_after_sent_before_delete_sends_each_exactly_once(backend: Backend) -> anyhow::Result<()> {
    let (per_user, _) = run_one_worker(backend, "worker.after_sent", "transactional").await?;
    assert_eq!(per_user.len(), USERS.len(), "{per_user:?}");
    assert!(per_user.values().all(|n| *n == 1), "a redelivered message sees `sent`: {per_user:?}");
    Ok(())
}

pub async fn marketing_crash_after_provider_never_duplicates(backend: Backend) -> anyhow::Result<()> {
    let (per_user, deliveries) = run(backend, "worker.after_provider", "marketing").await?;
    assert!(per_user.values().all(|n| *n == 1), "marketing is at most once: {per_user:?}");
    // The crash came after the provider took a batch: those deliveries are closed once their
    // claim's lease ran out, as failed with an unknown outcome (they were, in fact, sent once).
    let unknown: Vec<&Value> = deliveries.iter().filter(|d| d["status"] == "failed").collect();
    assert!(!unknown.is_empty(), "the crashed batch is closed: {deliveries:?}");
    assert!(unknown.iter().all(|d| d["reason"] == "outcome_unknown"), "{deliveries:?}");
    assert!(deliveries.iter().all(|d| d["status"] == "sent" || d["status"] == "failed"), "{deliveries:?}");
    Ok(())
}

pub async fn relay_crash_before_commit_loses_nothing_and_absorbs_repeats(backend: Backend) -> anyhow::Result<()> {
    let (per_user, _, sends) = run_with_sends(backend, "relay.after_send", "transactional", Options::default()).await?;
    assert_repeats_absorbed(&per_user, &sends);
    Ok(())
}

pub async fn fanout_crash_midway_loses_nothing_and_absorbs_repeats(backend: Backend) -> anyhow::Result<()> {
    // Deliveries created before the crash are still queued; the page run again creates none twice.
    let (per_user, _, sends) =
        run_with_sends(backend, "orchestrator.mid_fanout", "transactional", Options::default()).await?;
    assert_repeats_absorbed(&per_user, &sends);
    Ok(())
}

pub async fn reservation_crash_after_commit_holds_once(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_CRASH_AT", "inventory.after_commit".into()));
    let mut s = Server::start(backend, opts).await?;
    let (st, _) = s.call("PUT", "/v1/inventory/sku-crash", Some(json!({"on_hand": 10}))).await?;
    assert_eq!(st, 201);
    let order = |i: usize| json!({"order_id": format!("o-crash-{i}"), "user_id": "c1", "items": [{"sku_id": "sku-crash", "qty": 3}]});
    for i in 0..CRASHES {
        // The reservation commits, then the process dies before answering.
        let answer = s.call("POST", "/v1/orders", Some(order(i))).await;
        assert!(answer.is_err(), "the call must be cut off by the crash: {answer:?}");
        assert!(s.exited_within(Duration::from_secs(30)).await?, "crash {i}");
        s.restart_with_crash_at(if i + 1 < CRASHES { Some("inventory.after_commit") } else { None }).await?;
        // The client retries with the same order id: the hold exists once.
        if i + 1 == CRASHES {
            for j in 0..CRASHES {
                let (st, v) = s.call("POST", "/v1/orders", Some(order(j))).await?;
                assert_eq!(st, 200, "the retry finds the committed order: {v}");
                assert_eq!(v["status"], "PENDING");
            }
        }
    }
    let (_, stock) = s.call("GET", "/v1/inventory/sku-crash", None).await?;
    let held = 3 * CRASHES as i64;
    assert_eq!((stock["available"].as_i64(), stock["reserved"].as_i64()), (Some(10 - held), Some(held)), "{stock}");
    let (_, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
    assert_eq!(report["discrepancies"], json!([]), "{report}");
    Ok(())
}

/// The workflow engine's crash points (docs/workflows.md, "The engine"): the server dies at each,
/// once, while three triggers of a digest workflow run for one user; started again, the user gets
/// one digest of all three. A step cut off midway is driven again by what drove it (the request
/// message, the timer), and finds its effects made: the run's creation, the digest membership,
/// the window's close. At `workflow.send_planned` the delivery was queued before the process
/// died: the worker may have been calling the provider at that instant (the transactional
/// trade-off), so one resend is allowed there and only there.
///
/// On the manual clock (which a restart resumes where it stood): the window closes when the test
/// moves the clock, after all three triggers are in it, however long the restart and the
/// redeliveries take on loaded emulators. A window that closed first would rightly send the late
/// triggers a digest of their own.
pub async fn workflow_steps_cut_off_at_each_point_send_one_digest(backend: Backend) -> anyhow::Result<()> {
    for point in ["workflow.run_created", "workflow.digest_entered", "workflow.digest_closed", "workflow.send_planned"]
    {
        let mut opts = Options { manual_clock: true, ..Options::default() };
        opts.env.push(("TIDINGS_CRASH_AT", point.into()));
        opts.env.push(("TIDINGS_MAX_RECEIVES", "12".into()));
        opts.env.push(("TIDINGS_SET_ASIDE_AFTER_CRASHES", "12".into()));
        let mut s = Server::start(backend, opts).await?;
        setup(&s).await?;
        let workflow = json!({"name": "digest", "category": "transactional", "steps": [
            {"type": "digest", "window": "20m"},
            {"type": "send", "channel": "email", "template_id": "crash"}]});
        let (st, v) = s.call("PUT", "/v1/workflows/digest", Some(workflow)).await?;
        assert_eq!(st, 200, "{v}");
        let trigger = |n: usize| {
            json!({"idempotency_key": format!("wf-crash-{n}"), "recipients": {"user_ids": ["c1"]},
                   "workflow_id": "digest", "params": {"n": n}})
        };
        let mut ids = Vec::new();
        let mut unanswered = Vec::new();
        for n in 0..3 {
            match s.call("POST", "/v1/notifications", Some(trigger(n))).await {
                Ok((202, v)) => ids.push(v["notification_id"].as_str().unwrap_or_default().to_owned()),
                Ok((st, v)) => anyhow::bail!("{point}: trigger {n}: {st} {v}"),
                // Cut off by the crash: asked again, with its key, once the server runs clean.
                Err(_) => unanswered.push(n),
            }
        }
        let at_close = matches!(point, "workflow.digest_closed" | "workflow.send_planned");
        if at_close {
            // These points come after the window's end: all three in, then the clock moved (the
            // tick may be the call the crash cuts off).
            all_in_the_window(&s, &ids, point).await?;
            let _ = s.advance_and_tick(21 * 60).await;
        }
        anyhow::ensure!(s.exited_within(Duration::from_secs(90)).await?, "{point}: the server did not reach the point");
        s.restart_with_crash_at(None).await?;
        for n in unanswered {
            let (st, v) = s.call("POST", "/v1/notifications", Some(trigger(n))).await?;
            assert_eq!(st, 202, "{point}: {v}");
            ids.push(v["notification_id"].as_str().unwrap_or_default().to_owned());
        }
        // The message the crash cut off comes back when its visibility ends (on the embedded
        // backend by this clock; SQS's in real time).
        s.advance_and_tick(61).await?;
        if !at_close {
            all_in_the_window(&s, &ids, point).await?;
            s.advance_and_tick(21 * 60).await?;
        }
        s.eventually(Duration::from_secs(120), &format!("{point}: the digest sent"), || async {
            let sends: Vec<Value> = s.sends_all().await?.into_iter().filter(|x| x["user_id"] == "c1").collect();
            let ended = {
                let mut all = true;
                for id in &ids {
                    let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
                    all &= v["status"] == "completed";
                }
                all
            };
            Ok((!sends.is_empty() && ended).then_some(()))
        })
        .await?;
        // Nothing more comes after every run ended.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let sends: Vec<Value> = s.sends_all().await?.into_iter().filter(|x| x["user_id"] == "c1").collect();
        let most = if point == "workflow.send_planned" { 2 } else { 1 };
        assert!(
            !sends.is_empty() && sends.len() <= most,
            "{point}: one digest (at most {most} sends), got {}: {sends:?}",
            sends.len()
        );
        let mut digested = 0;
        let mut merged = 0;
        for id in &ids {
            let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/runs"), None).await?;
            assert_eq!(st, 200, "{v}");
            for step in v["items"][0]["steps"].as_array().cloned().unwrap_or_default() {
                digested += usize::from(step["status"] == "digested");
                merged += usize::from(step["status"] == "merged");
            }
        }
        assert_eq!((digested, merged), (1, 2), "{point}: one run carried the digest of three: {sends:?}");
    }
    Ok(())
}

/// Waits until each of `ids` has its run waiting at the digest (the leader) or merged into it.
async fn all_in_the_window(s: &Server, ids: &[String], point: &str) -> anyhow::Result<()> {
    s.eventually(Duration::from_secs(120), &format!("{point}: all three triggers in the window"), || async {
        let mut in_it = 0;
        for id in ids {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}/runs"), None).await?;
            let last = v["items"][0]["steps"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null);
            in_it += usize::from(last["index"] == 0 && (last["status"] == "waiting" || last["status"] == "merged"));
        }
        Ok((ids.len() == 3 && in_it == 3).then_some(()))
    })
    .await
}
