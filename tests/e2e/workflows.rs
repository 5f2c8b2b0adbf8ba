//! Workflows (issue 33) end to end, through `tidings serve` on both backends: digests under
//! concurrency, a delay before a digest, two digests in one workflow, channel fallback, `if` on
//! what an earlier send reached, preferences per workflow and `required`, definitions refused
//! naming the field, versions, throttles, and a delay past the queues' 15 minutes on the manual
//! clock. Counts are the fake providers' accepted sends (`/dev/deliveries`) and the inboxes.
//!
//! Windows and delays are seconds long: on the AWS backend a timer within 15 minutes is a real
//! SQS delay in the emulator, so the same bodies run on the system clock on both backends; only
//! the hour-long delay uses the manual clock (a timer bucket fired by the tick).

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

// Generous: the AWS backend shares its emulators with other tests; a pass returns at once.
const WAIT: Duration = Duration::from_secs(180);

/// What a notification's status is once nothing more of it will happen.
const ENDED: [&str; 3] = ["completed", "completed_with_failures", "failed"];

async fn put(s: &Server, path: &str, body: Value) -> anyhow::Result<Value> {
    let (st, v) = s.call("PUT", path, Some(body)).await?;
    assert_eq!(st, 200, "PUT {path}: {v}");
    Ok(v)
}

/// `note` (every channel, `{{ n }}`), `note2` (email, told apart from note), `digest` (email and
/// in-app, with the digest's `count`).
async fn templates(s: &Server) -> anyhow::Result<()> {
    let all = |text: &str| {
        json!({"default_locale": "en", "locales": {"en": {
            "email_subject": text, "email_body": text, "sms": text,
            "push_title": text, "push_body": text, "inapp_title": text, "inapp_body": text}}})
    };
    put(s, "/v1/templates/note", all("Note {{ n }}")).await?;
    put(s, "/v1/templates/note2", all("Second note {{ n }}")).await?;
    put(s, "/v1/templates/digest", all("{{ count }} new comments on post {{ post_id }}")).await?;
    Ok(())
}

async fn user(s: &Server, id: &str, body: Value) -> anyhow::Result<()> {
    put(s, &format!("/v1/users/{id}"), body).await?;
    Ok(())
}

async fn workflow(s: &Server, id: &str, body: Value) -> anyhow::Result<Value> {
    put(s, &format!("/v1/workflows/{id}"), body).await
}

fn definition(steps: Value) -> Value {
    json!({"name": "Test workflow", "category": "transactional", "steps": steps})
}

/// A workflow send; its notification id.
async fn trigger(s: &Server, workflow_id: &str, users: &[&str], params: Value) -> anyhow::Result<String> {
    let body = json!({
        "idempotency_key": format!("wf-{:016x}", rand::random::<u64>()),
        "recipients": {"user_ids": users},
        "workflow_id": workflow_id,
        "params": params,
    });
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap_or_default().to_owned())
}

/// `n` triggers of one workflow for `users` at once (`params_of(i)` each), their ids.
async fn triggers_at_once(
    s: &Server,
    workflow_id: &str,
    users: &[&str],
    n: usize,
    params_of: impl Fn(usize) -> Value,
) -> anyhow::Result<Vec<String>> {
    let posts = (0..n).map(|i| trigger(s, workflow_id, users, params_of(i)));
    futures::future::join_all(posts).await.into_iter().collect()
}

async fn notification(s: &Server, id: &str) -> anyhow::Result<Value> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v)
}

/// Waits until nothing more of the notification will happen (every run and delivery ended); on
/// a timeout, prints what its view, runs, deliveries and the queues show.
async fn ended(s: &Server, id: &str) -> anyhow::Result<Value> {
    let end = s
        .eventually(WAIT, &format!("notification {id} to end"), || async {
            let v = notification(s, id).await?;
            Ok(ENDED.contains(&v["status"].as_str().unwrap_or_default()).then_some(v))
        })
        .await;
    if end.is_err() {
        eprintln!(
            "{id}: {}\nruns: {:?}\nqueues: {}\ndeliveries: {:?}",
            notification(s, id).await?,
            runs(s, id).await?,
            s.ops("GET", "/v1/ops/queues", None).await?.1,
            deliveries(s, id).await?
        );
    }
    end
}

async fn all_ended(s: &Server, ids: &[String]) -> anyhow::Result<()> {
    for id in ids {
        ended(s, id).await?;
    }
    Ok(())
}

async fn runs(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/runs?limit=500"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// The only run of a one-recipient notification.
async fn run_of(s: &Server, id: &str) -> anyhow::Result<Value> {
    let r = runs(s, id).await?;
    assert_eq!(r.len(), 1, "one run: {r:?}");
    Ok(r[0].clone())
}

async fn deliveries(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries?limit=500"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// The fake provider's accepted sends to `user_id` on `channel`.
async fn sent(s: &Server, user_id: &str, channel: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/dev/deliveries?user_id={user_id}&channel={channel}"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v.as_array().cloned().unwrap_or_default())
}

async fn inbox(s: &Server, user_id: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/v1/users/{user_id}/inbox?limit=500"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// The step records of `run` at `index` with `status`.
fn records<'a>(run: &'a Value, index: u64, status: &str) -> Vec<&'a Value> {
    run["steps"].as_array().into_iter().flatten().filter(|r| r["index"] == index && r["status"] == status).collect()
}

/// The records of a one-channel send at `index`: `queued`, or `sent` when the send had ended by
/// the time the run was driven (a request message redelivered under load drives the run again
/// and finds the delivery sent).
fn sends_at(run: &Value, index: u64) -> Vec<&Value> {
    let mut r = records(run, index, "queued");
    r.extend(records(run, index, "sent"));
    r
}

/// How many of `runs` went through step `index` with `status`.
fn count_runs(runs: &[Value], index: u64, status: &str) -> usize {
    runs.iter().filter(|r| !records(r, index, status).is_empty()).count()
}

/// The sends' texts, sorted, without the preferences link a marketing email ends with
/// (docs/site.md).
fn bodies(sends: &[Value]) -> Vec<String> {
    let text = |s: &Value| {
        let body = s["body"].as_str().unwrap_or_default();
        body.split("\n\n--\nChoose which messages you get: ").next().unwrap_or_default().to_owned()
    };
    let mut b: Vec<String> = sends.iter().map(text).collect();
    b.sort();
    b
}

/// The digest tests run on the manual clock with windows past the queues' 15 minutes (a timer
/// bucket, fired by the tick once the clock is moved): a window then closes only when the test
/// moves the clock, after every trigger has reached it. On the system clock a window counts from
/// its first trigger's acceptance, and on the AWS backend the emulators take the triggers at
/// their own pace (30 triggers accepted within 40 ms reached the digest over 10 s alone, over
/// 30 s beside three other tests), so a window of seconds could close before the last trigger
/// was taken, or before the test acts on an open one, whatever the engine did.
fn manual() -> Options {
    Options { manual_clock: true, ..Options::default() }
}

/// Waits until each of `ids` has `user_id`'s run at step `index`: waiting there, or merged
/// there; their runs then.
async fn all_at(s: &Server, ids: &[String], user_id: &str, index: u64) -> anyhow::Result<Vec<Value>> {
    s.eventually(WAIT, &format!("{} runs of {user_id} to reach step {index}", ids.len()), || async {
        let mut all = Vec::new();
        for id in ids {
            let Some(run) = runs(s, id).await?.into_iter().find(|r| r["user_id"] == user_id) else { return Ok(None) };
            let last = run["steps"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null);
            let here = last["index"] == index && (last["status"] == "waiting" || last["status"] == "merged");
            if !here {
                return Ok(None);
            }
            all.push(run);
        }
        Ok(Some(all))
    })
    .await
}

fn waiting_at(runs: &[Value], index: u64) -> usize {
    runs.iter().filter(|r| r["status"] == "waiting" && !records(r, index, "waiting").is_empty()).count()
}

fn assert_documented(s: &Server) {
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list: {undocumented:?}");
}

/// 30 triggers for one user in the same instant become one digest (one email saying 30, one run
/// `digested`, 29 `merged`); triggers with other keys never merge.
pub async fn many_triggers_in_one_instant_make_one_digest(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    workflow(
        &s,
        "comments",
        definition(json!([
            {"type": "digest", "window": "20m", "key": "{{ post_id }}"},
            {"type": "send", "channel": "email", "template_id": "digest"},
        ])),
    )
    .await?;
    let ids = triggers_at_once(&s, "comments", &["u1"], 30, |i| json!({"post_id": "p1", "i": i})).await?;
    let at = all_at(&s, &ids, "u1", 0).await?;
    assert_eq!((waiting_at(&at, 0), count_runs(&at, 0, "merged")), (1, 29), "one window, one leader: {at:?}");
    assert!(sent(&s, "u1", "email").await?.is_empty(), "nothing before the window's end");
    s.advance_and_tick(21 * 60).await?;
    all_ended(&s, &ids).await?;
    let emails = sent(&s, "u1", "email").await?;
    assert_eq!(bodies(&emails), vec!["30 new comments on post p1".to_owned()], "{emails:?}");
    let mut all = Vec::new();
    for id in &ids {
        all.push(run_of(&s, id).await?);
    }
    assert_eq!(count_runs(&all, 0, "digested"), 1, "{all:?}");
    assert_eq!(count_runs(&all, 0, "merged"), 29, "{all:?}");
    assert!(all.iter().all(|r| r["status"] == "completed"), "{all:?}");
    // The leader's run carries the digest, and its email is its notification's, step 1.
    let leader = all.iter().find(|r| !records(r, 0, "digested").is_empty()).unwrap();
    assert_eq!(records(leader, 0, "digested")[0]["detail"], "30 events", "{leader}");
    let leader_id =
        ids.iter().zip(&all).find(|(_, r)| !records(r, 0, "digested").is_empty()).map(|(id, _)| id.clone()).unwrap();
    assert_eq!(emails[0]["notification_id"], leader_id.as_str());
    let d = deliveries(&s, &leader_id).await?;
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0]["channel"].as_str(), d[0]["status"].as_str(), d[0]["step"].as_u64()),
        (Some("email"), Some("sent"), Some(1))
    );

    // Other keys never merge: a and b at once are two digests of one each.
    let ab =
        futures::future::join_all(["a", "b"].map(|post| trigger(&s, "comments", &["u1"], json!({"post_id": post}))))
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<_>>>()?;
    let at = all_at(&s, &ab, "u1", 0).await?;
    assert_eq!(waiting_at(&at, 0), 2, "two windows: {at:?}");
    s.advance_and_tick(21 * 60).await?;
    all_ended(&s, &ab).await?;
    let emails = sent(&s, "u1", "email").await?;
    assert_eq!(
        bodies(&emails),
        vec![
            "1 new comments on post a".to_owned(),
            "1 new comments on post b".to_owned(),
            "30 new comments on post p1".to_owned()
        ],
        "{emails:?}"
    );
    assert_documented(&s);
    Ok(())
}

/// A delay before the digest: the five triggers (each to two users) still make one digest for
/// each user.
pub async fn a_delay_then_a_digest_make_one_digest(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    user(&s, "u2", json!({"email": "u2@example.com"})).await?;
    workflow(
        &s,
        "later",
        definition(json!([
            {"type": "delay", "for": "20m"},
            {"type": "digest", "window": "20m"},
            {"type": "send", "channel": "email", "template_id": "digest"},
        ])),
    )
    .await?;
    let ids = triggers_at_once(&s, "later", &["u1", "u2"], 5, |_| json!({"post_id": "p5"})).await?;
    for u in ["u1", "u2"] {
        assert_eq!(waiting_at(&all_at(&s, &ids, u, 0).await?, 0), 5, "every run at its delay");
    }
    s.advance_and_tick(21 * 60).await?;
    for u in ["u1", "u2"] {
        let at = all_at(&s, &ids, u, 1).await?;
        assert_eq!((waiting_at(&at, 1), count_runs(&at, 1, "merged")), (1, 4), "{u}: {at:?}");
    }
    assert!(sent(&s, "u1", "email").await?.is_empty());
    s.advance_and_tick(21 * 60).await?;
    all_ended(&s, &ids).await?;
    for u in ["u1", "u2"] {
        let emails = sent(&s, u, "email").await?;
        assert_eq!(bodies(&emails), vec!["5 new comments on post p5".to_owned()], "{u}: {emails:?}");
        let mut all = Vec::new();
        for id in &ids {
            all.extend(runs(&s, id).await?.into_iter().filter(|r| r["user_id"] == u));
        }
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(count_runs(&all, 0, "done"), 5, "every run waited its delay: {all:?}");
        assert_eq!(count_runs(&all, 1, "digested"), 1, "{all:?}");
        assert_eq!(count_runs(&all, 1, "merged"), 4, "{all:?}");
    }
    assert_documented(&s);
    Ok(())
}

/// Two digests in one workflow: per post first (in-app), then per user (email).
pub async fn two_digest_steps_each_digest(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    workflow(
        &s,
        "twice",
        definition(json!([
            {"type": "digest", "window": "20m", "key": "{{ post_id }}"},
            {"type": "send", "channel": "inapp", "template_id": "digest"},
            {"type": "digest", "window": "20m"},
            {"type": "send", "channel": "email", "template_id": "digest"},
        ])),
    )
    .await?;
    let posts = ["a", "a", "a", "b", "b"];
    let ids = triggers_at_once(&s, "twice", &["u1"], posts.len(), |i| json!({"post_id": posts[i]})).await?;
    let at = all_at(&s, &ids, "u1", 0).await?;
    assert_eq!((waiting_at(&at, 0), count_runs(&at, 0, "merged")), (2, 3), "a window per post: {at:?}");
    s.advance_and_tick(21 * 60).await?;
    let leaders: Vec<String> =
        ids.iter().zip(&at).filter(|(_, r)| r["status"] == "waiting").map(|(id, _)| id.clone()).collect();
    let at = all_at(&s, &leaders, "u1", 2).await?;
    assert_eq!((waiting_at(&at, 2), count_runs(&at, 2, "merged")), (1, 1), "one window for both: {at:?}");
    let mut titles: Vec<String> =
        inbox(&s, "u1").await?.iter().map(|m| m["body"].as_str().unwrap_or_default().to_owned()).collect();
    titles.sort();
    assert_eq!(titles, vec!["2 new comments on post b".to_owned(), "3 new comments on post a".to_owned()]);
    assert!(sent(&s, "u1", "email").await?.is_empty());
    s.advance_and_tick(21 * 60).await?;
    all_ended(&s, &ids).await?;
    let emails = sent(&s, "u1", "email").await?;
    assert_eq!(emails.len(), 1, "the two posts' runs make one email: {emails:?}");
    assert!(
        emails[0]["body"].as_str().unwrap_or_default().starts_with("2 new comments on post "),
        "the second digest counts the two runs that reached it: {emails:?}"
    );
    assert_eq!(inbox(&s, "u1").await?.len(), 2);
    let mut all = Vec::new();
    for id in &ids {
        all.push(run_of(&s, id).await?);
    }
    assert_eq!((count_runs(&all, 0, "digested"), count_runs(&all, 0, "merged")), (2, 3), "{all:?}");
    assert_eq!((count_runs(&all, 2, "digested"), count_runs(&all, 2, "merged")), (1, 1), "{all:?}");
    assert_documented(&s);
    Ok(())
}

/// push → sms → email: push failing for good and sms without an address give way to email;
/// push that works is the only send.
pub async fn fallback_goes_from_push_to_sms_to_email_only_when_needed(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, crate::platform::push_options(backend).await?).await?;
    templates(&s).await?;
    user(&s, "u4", json!({"email": "u4@example.com"})).await?;
    let (st, v) =
        s.call("POST", "/v1/devices", Some(json!({"user_id": "u4", "platform": "ios", "token": "tok-u4"}))).await?;
    assert_eq!(st, 201, "{v}");
    workflow(
        &s,
        "alert",
        definition(json!([{"type": "send", "channels": ["push", "sms", "email"], "template_id": "note"}])),
    )
    .await?;
    let (st, v) = s.call("PUT", "/dev/providers/push", Some(json!({"mode": "permanent"}))).await?;
    assert_eq!(st, 200, "{v}");
    let id = trigger(&s, "alert", &["u4"], json!({"n": 1})).await?;
    ended(&s, &id).await?;
    assert_eq!(bodies(&sent(&s, "u4", "email").await?), vec!["Note 1".to_owned()]);
    assert!(sent(&s, "u4", "push").await?.is_empty());
    assert!(sent(&s, "u4", "sms").await?.is_empty());
    let run = run_of(&s, &id).await?;
    assert_eq!(run["status"], "completed", "{run}");
    let fell = records(&run, 0, "fell_back");
    assert_eq!(fell.len(), 1, "{run}");
    assert_eq!(fell[0]["channel"], "push", "{run}");
    let sms = records(&run, 0, "suppressed");
    assert_eq!(sms.len(), 1, "{run}");
    assert_eq!((sms[0]["channel"].as_str(), sms[0]["detail"].as_str()), (Some("sms"), Some("no_address")), "{run}");
    let done = records(&run, 0, "done");
    assert_eq!(done.len(), 1, "{run}");
    assert_eq!(done[0]["channel"], "email", "{run}");
    let d = deliveries(&s, &id).await?;
    let status_of = |c: &str| d.iter().find(|x| x["channel"] == c).map(|x| x["status"].clone()).unwrap_or(Value::Null);
    assert_eq!((status_of("push"), status_of("email")), (json!("failed"), json!("sent")), "{d:?}");

    // Push works: push only, no sms, no email.
    let (st, _) = s.call("PUT", "/dev/providers/push", Some(json!({"mode": "ok"}))).await?;
    assert_eq!(st, 200);
    let id = trigger(&s, "alert", &["u4"], json!({"n": 2})).await?;
    ended(&s, &id).await?;
    assert_eq!(bodies(&sent(&s, "u4", "push").await?), vec!["Note 2".to_owned()]);
    assert_eq!(sent(&s, "u4", "email").await?.len(), 1, "no email after a push that worked");
    assert!(sent(&s, "u4", "sms").await?.is_empty());
    let run = run_of(&s, &id).await?;
    assert_eq!(run["status"], "completed", "{run}");
    assert!(records(&run, 0, "fell_back").is_empty(), "{run}");
    assert_eq!(records(&run, 0, "done")[0]["channel"], "push", "{run}");
    assert_documented(&s);
    Ok(())
}

/// `[inapp, delay, email if step 0 not_read]`: the user who read the in-app message before the
/// delay ended gets no email; the other does.
pub async fn an_email_only_when_the_inapp_message_was_not_read(backend: Backend) -> anyhow::Result<()> {
    // On the manual clock: the delay ends when the test moves the clock, never while the loaded
    // emulators are still delivering the in-app message.
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    user(&s, "reader", json!({"email": "reader@example.com"})).await?;
    user(&s, "idle", json!({"email": "idle@example.com"})).await?;
    workflow(
        &s,
        "nudge",
        definition(json!([
            {"type": "send", "channel": "inapp", "template_id": "note"},
            {"type": "delay", "for": "20m"},
            {"type": "send", "channel": "email", "template_id": "note", "if": {"step": 0, "is": "not_read"}},
        ])),
    )
    .await?;
    let id = trigger(&s, "nudge", &["reader", "idle"], json!({"n": 5})).await?;
    let reader_waits = || async {
        let r = runs(&s, &id).await?;
        anyhow::Ok(r.iter().any(|r| r["user_id"] == "reader" && r["status"] == "waiting"))
    };
    let message = s
        .eventually(WAIT, "the reader's in-app message, and the run at its delay", || async {
            let m = inbox(&s, "reader").await?.first().and_then(|m| m["message_id"].as_str().map(str::to_owned));
            Ok(if reader_waits().await? { m } else { None })
        })
        .await?;
    let (st, v) = s.call("POST", &format!("/v1/users/reader/inbox/{message}/read"), None).await?;
    assert_eq!(st, 200, "{v}");
    // Read before the delay ended (else this test proves nothing).
    assert!(reader_waits().await?, "read while the run waits at its delay");
    s.advance_and_tick(21 * 60).await?;
    ended(&s, &id).await?;
    assert!(sent(&s, "reader", "email").await?.is_empty(), "the reader read it: no email");
    assert_eq!(bodies(&sent(&s, "idle", "email").await?), vec!["Note 5".to_owned()]);
    let all = runs(&s, &id).await?;
    let of = |u: &str| all.iter().find(|r| r["user_id"] == u).cloned().unwrap_or(Value::Null);
    assert_eq!(records(&of("reader"), 2, "skipped").len(), 1, "{all:?}");
    assert_eq!(sends_at(&of("idle"), 2).len(), 1, "{all:?}");
    assert_eq!(inbox(&s, "idle").await?.len(), 1);
    assert_documented(&s);
    Ok(())
}

/// A workflow turned off on email suppresses that user's email (`workflow_off`), not another
/// workflow's; a required workflow passes unsubscribe_all, the channel off and itself off.
pub async fn preferences_per_workflow_and_required(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    templates(&s).await?;
    for u in ["off", "on", "gone"] {
        user(&s, u, json!({"email": format!("{u}@example.com")})).await?;
    }
    let one_email = json!([{"type": "send", "channel": "email", "template_id": "note"}]);
    workflow(&s, "w", definition(one_email.clone())).await?;
    workflow(&s, "other", definition(one_email.clone())).await?;
    workflow(
        &s,
        "security",
        json!({"name": "Security notices", "category": "marketing", "required": true, "steps": one_email}),
    )
    .await?;
    workflow(&s, "promo", json!({"name": "Promotions", "category": "marketing", "steps": one_email})).await?;
    let v = put(&s, "/v1/users/off/preferences", json!({"workflows": {"w": {"email": false}}})).await?;
    assert_eq!(v["workflows"]["w"]["email"], false, "{v}");
    put(
        &s,
        "/v1/users/gone/preferences",
        json!({"unsubscribe_all": true, "channels": {"email": false}, "workflows": {"security": false}}),
    )
    .await?;

    let w = trigger(&s, "w", &["off", "on"], json!({"n": 1})).await?;
    let other = trigger(&s, "other", &["off"], json!({"n": 2})).await?;
    let security = trigger(&s, "security", &["gone"], json!({"n": 3})).await?;
    let promo = trigger(&s, "promo", &["gone"], json!({"n": 4})).await?;
    for id in [&w, &other, &security, &promo] {
        ended(&s, id).await?;
    }
    assert_eq!(bodies(&sent(&s, "off", "email").await?), vec!["Note 2".to_owned()], "only the other workflow's");
    assert_eq!(bodies(&sent(&s, "on", "email").await?), vec!["Note 1".to_owned()]);
    assert_eq!(bodies(&sent(&s, "gone", "email").await?), vec!["Note 3".to_owned()], "the required one only");
    let d = deliveries(&s, &w).await?;
    let off = d.iter().find(|x| x["user_id"] == "off").unwrap();
    assert_eq!((off["status"].as_str(), off["reason"].as_str()), (Some("suppressed"), Some("workflow_off")), "{d:?}");
    let all = runs(&s, &w).await?;
    let off_run = all.iter().find(|r| r["user_id"] == "off").unwrap();
    assert_eq!(records(off_run, 0, "suppressed")[0]["detail"], "workflow_off", "{off_run}");
    let d = deliveries(&s, &promo).await?;
    assert_eq!(d[0]["status"], "suppressed", "the same preferences stop a workflow that is not required: {d:?}");
    assert_documented(&s);
    Ok(())
}

/// Definitions that cannot work are refused naming the field; an unknown workflow on a send is
/// 422 `workflow_id`; a change is a new version while a run started before keeps its own;
/// another tenant sees no runs.
pub async fn definitions_are_checked_and_runs_keep_their_version(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    let refused = |steps: Value| {
        let s = &s;
        async move {
            let (st, v) = s.call("PUT", "/v1/workflows/bad", Some(definition(steps))).await?;
            assert_eq!(st, 422, "{v}");
            anyhow::Ok(v["field"].as_str().unwrap_or_default().to_owned())
        }
    };
    assert_eq!(
        refused(json!([{"type": "send", "channel": "email", "template_id": "nope"}])).await?,
        "steps[0].template_id"
    );
    assert_eq!(
        refused(json!([
            {"type": "send", "channel": "email", "template_id": "note", "if": {"step": 1, "is": "read"}},
            {"type": "send", "channel": "email", "template_id": "note"},
        ]))
        .await?,
        "steps[0].if.step",
        "a step pointing forward"
    );
    assert_eq!(
        refused(json!([{"type": "send", "channels": ["push", "email"], "wait": "5m", "template_id": "note"}])).await?,
        "steps[0].wait"
    );
    let (st, _) = s.call("GET", "/v1/workflows/bad", None).await?;
    assert_eq!(st, 404, "nothing refused was stored");
    let (st, v) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(json!({"recipients": {"user_ids": ["u1"]}, "workflow_id": "ghost", "params": {}})),
        )
        .await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("workflow_id")), "{v}");

    let v1 = definition(json!([
        {"type": "delay", "for": "3s"},
        {"type": "send", "channel": "email", "template_id": "note"},
    ]));
    assert_eq!(workflow(&s, "ver", v1.clone()).await?["version"], 1);
    let repeated = json!({"idempotency_key": "ver-1", "recipients": {"user_ids": ["u1"]}, "workflow_id": "ver", "params": {"n": 1}});
    let (st, v) = s.call("POST", "/v1/notifications", Some(repeated.clone())).await?;
    assert_eq!(st, 202, "{v}");
    let first = v["notification_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(workflow(&s, "ver", v1).await?["version"], 1, "the same definition again changes nothing");
    let v2 = definition(json!([
        {"type": "delay", "for": "3s"},
        {"type": "send", "channel": "email", "template_id": "note2"},
    ]));
    assert_eq!(workflow(&s, "ver", v2).await?["version"], 2);
    // The same request again (after the change): the same notification, no second run.
    let (st, v) = s.call("POST", "/v1/notifications", Some(repeated)).await?;
    assert_eq!((st, v["notification_id"].as_str()), (202, Some(first.as_str())), "{v}");
    let (_, v) = s.call("GET", "/v1/workflows/ver", None).await?;
    assert_eq!((v["version"].as_u64(), v["steps"][1]["template_id"].as_str()), (Some(2), Some("note2")), "{v}");
    let (_, v) = s.call("GET", "/v1/workflows", None).await?;
    let listed: Vec<(String, u64)> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| (w["workflow_id"].as_str().unwrap_or_default().to_owned(), w["version"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(listed, vec![("ver".to_owned(), 2)], "{v}");
    let second = trigger(&s, "ver", &["u1"], json!({"n": 2})).await?;
    all_ended(&s, &[first.clone(), second.clone()]).await?;
    assert_eq!(run_of(&s, &first).await?["version"], 1);
    assert_eq!(run_of(&s, &second).await?["version"], 2);
    assert_eq!(notification(&s, &first).await?["workflow_version"], 1);
    let emails = sent(&s, "u1", "email").await?;
    let body_of = |id: &str| emails.iter().find(|e| e["notification_id"] == id).map(|e| e["body"].clone());
    assert_eq!(body_of(&first), Some(json!("Note 1")), "the run started on version 1 sends version 1's: {emails:?}");
    assert_eq!(body_of(&second), Some(json!("Second note 2")), "{emails:?}");
    assert_eq!(emails.len(), 2);

    // Another tenant's key: no such notification.
    let (st, v) = s.call_as(&s.other_tenant_key(), "GET", &format!("/v1/notifications/{first}/runs"), None).await?;
    assert_eq!(st, 404, "{v}");
    let (st, _) = s.call_as(&s.other_tenant_key(), "GET", "/v1/workflows/ver", None).await?;
    assert_eq!(st, 404);
    assert_documented(&s);
    Ok(())
}

/// `[throttle 2 per day, send]` fired four times at once: two emails, two runs throttled.
pub async fn a_throttle_lets_its_limit_through(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    workflow(
        &s,
        "calm",
        definition(json!([
            {"type": "throttle", "limit": 2, "per": "1d"},
            {"type": "send", "channel": "email", "template_id": "note"},
        ])),
    )
    .await?;
    let ids = triggers_at_once(&s, "calm", &["u1"], 4, |i| json!({"n": i})).await?;
    all_ended(&s, &ids).await?;
    assert_eq!(sent(&s, "u1", "email").await?.len(), 2);
    let mut all = Vec::new();
    for id in &ids {
        all.push(run_of(&s, id).await?);
    }
    let throttled = all.iter().filter(|r| r["status"] == "throttled").count();
    assert_eq!(throttled, 2, "{all:?}");
    assert_eq!(count_runs(&all, 0, "throttled"), 2, "{all:?}");
    assert_eq!(count_runs(&all, 0, "done"), 2, "{all:?}");
    assert_documented(&s);
    Ok(())
}

/// A delay of an hour (past the queues' 15 minutes: a timer bucket), on the manual clock:
/// nothing before, the email after the clock moves 61 minutes and the tick runs; the
/// notification is `processing` with its run open meanwhile, `completed` after.
pub async fn an_hour_long_delay_waits_for_the_clock(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { manual_clock: true, ..Options::default() }).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    workflow(
        &s,
        "slow",
        definition(json!([
            {"type": "delay", "for": "1h"},
            {"type": "send", "channel": "email", "template_id": "note"},
        ])),
    )
    .await?;
    user(&s, "u2", json!({"email": "u2@example.com"})).await?;
    let id = trigger(&s, "slow", &["u1"], json!({"n": 60})).await?;
    let cancelled = trigger(&s, "slow", &["u2"], json!({"n": 61})).await?;
    let run = s
        .eventually(WAIT, "the run to wait at its delay", || async {
            let r = runs(&s, &id).await?;
            Ok(r.into_iter().find(|r| r["status"] == "waiting"))
        })
        .await?;
    let last = run["steps"].as_array().and_then(|a| a.last()).cloned().unwrap_or(Value::Null);
    assert_eq!((last["index"].as_u64(), last["status"].as_str()), (Some(0), Some("waiting")), "{run}");
    let (_, clock) = s.call("GET", "/dev/clock", None).await?;
    let now = chrono::DateTime::parse_from_rfc3339(clock["now"].as_str().unwrap_or_default())?;
    let until = chrono::DateTime::parse_from_rfc3339(run["waiting_until"].as_str().unwrap_or_default())?;
    let ahead = (until - now).num_seconds();
    assert!((3590..=3600).contains(&ahead), "waits an hour: {ahead} s ({run})");
    let v = notification(&s, &id).await?;
    assert_eq!((v["status"].as_str(), v["runs_open"].as_u64()), (Some("processing"), Some(1)), "{v}");
    // The other one is cancelled while it waits: it stops there.
    s.eventually(WAIT, "the other run to wait at its delay", || async {
        Ok(runs(&s, &cancelled).await?.iter().any(|r| r["status"] == "waiting").then_some(()))
    })
    .await?;
    let (st, v) = s.call("POST", &format!("/v1/notifications/{cancelled}/cancel"), None).await?;
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sent(&s, "u1", "email").await?.is_empty(), "nothing before the hour");
    s.advance_and_tick(61 * 60).await?;
    let v = ended(&s, &id).await?;
    assert_eq!((v["status"].as_str(), v["runs_open"].as_u64()), (Some("completed"), Some(0)), "{v}");
    assert_eq!(bodies(&sent(&s, "u1", "email").await?), vec!["Note 60".to_owned()]);
    let run = run_of(&s, &id).await?;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(records(&run, 0, "done").len(), 1, "{run}");
    assert!(run.get("waiting_until").is_none(), "{run}");
    let stopped = s
        .eventually(WAIT, "the cancelled run to end", || async {
            let r = run_of(&s, &cancelled).await?;
            Ok((r["status"] != "waiting").then_some(r))
        })
        .await?;
    assert_eq!(stopped["status"], "cancelled", "{stopped}");
    assert!(sends_at(&stopped, 1).is_empty(), "{stopped}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(sent(&s, "u2", "email").await?.is_empty(), "a cancelled run sent");
    assert_eq!(notification(&s, &cancelled).await?["status"], "cancelled");
    assert_documented(&s);
    Ok(())
}

/// `[send channels [email, sms] until opened wait 20m]`: the user who opened the email within it
/// gets no SMS; the other gets the SMS after W, the email recorded `fell_back` (not in time).
pub async fn a_fallback_waits_for_until_then_takes_the_next_channel(backend: Backend) -> anyhow::Result<()> {
    // On the manual clock: the wait ends when the test moves the clock, not before the open is in.
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    for u in ["opener", "ignorer"] {
        user(&s, u, json!({"email": format!("{u}@example.com"), "phone": "+14155550100"})).await?;
    }
    workflow(
        &s,
        "reach",
        definition(json!([
            {"type": "send", "channels": ["email", "sms"], "until": "opened", "wait": "20m", "template_id": "note"},
        ])),
    )
    .await?;
    let id = trigger(&s, "reach", &["opener", "ignorer"], json!({"n": 8})).await?;
    let email = s
        .eventually(WAIT, "the opener's email", || async { Ok(sent(&s, "opener", "email").await?.into_iter().next()) })
        .await?;
    let html = email["html"].as_str().unwrap_or_default();
    let start = html.find("/t/o/").expect("an open pixel");
    let token = &html[start..][..html[start..].find('"').unwrap_or(0)];
    let (st, _, _) = s.raw("GET", token, "", None).await?;
    assert_eq!(st, 200, "the open pixel");
    // The open is recorded by a timer task after the pixel's answer.
    s.eventually(WAIT, "the opener's email to be opened", || async {
        let d = deliveries(&s, &id).await?;
        Ok(d.iter().any(|x| x["user_id"] == "opener" && x["status"] == "opened").then_some(()))
    })
    .await?;
    // Opened within the wait: once the step that sent the email is recorded (on a loaded run
    // its request may be cut off first and redelivered, the run `running` meanwhile), the run
    // waits, or a check of its wait (on the AWS backend a queue's delay, in real time) found the
    // open and ended it: never a fallback.
    let opener_run = s
        .eventually(WAIT, "the opener's run past its send", || async {
            let run = runs(&s, &id).await?.into_iter().find(|r| r["user_id"] == "opener");
            Ok(run.filter(|r| r["status"] != "running"))
        })
        .await?;
    assert!(
        opener_run["status"] == "waiting" || records(&opener_run, 0, "done").len() == 1,
        "opened within the wait: {opener_run}"
    );
    assert!(records(&opener_run, 0, "fell_back").is_empty(), "{opener_run}");
    // The email's wait ends (the ignorer's SMS goes), then the SMS's own.
    s.advance_and_tick(21 * 60).await?;
    s.eventually(WAIT, "the ignorer's SMS", || async { Ok(sent(&s, "ignorer", "sms").await?.into_iter().next()) })
        .await?;
    s.advance_and_tick(21 * 60).await?;
    ended(&s, &id).await?;
    assert!(sent(&s, "opener", "sms").await?.is_empty(), "opened in time: no SMS");
    assert_eq!(sent(&s, "ignorer", "email").await?.len(), 1);
    assert_eq!(bodies(&sent(&s, "ignorer", "sms").await?), vec!["Note 8".to_owned()]);
    let all = runs(&s, &id).await?;
    let of = |u: &str| all.iter().find(|r| r["user_id"] == u).cloned().unwrap_or(Value::Null);
    let (opener, ignorer) = (of("opener"), of("ignorer"));
    let done = records(&opener, 0, "done");
    assert_eq!((done.len(), done[0]["channel"].as_str()), (1, Some("email")), "{all:?}");
    let fell = records(&ignorer, 0, "fell_back");
    assert_eq!(fell[0]["channel"], "email", "{all:?}");
    assert_eq!(fell[0]["detail"], "not reached in time", "{all:?}");
    assert!(all.iter().all(|r| r["status"] == "completed"), "{all:?}");
    assert_documented(&s);
    Ok(())
}

/// A digest's leader cancelled while its window is open: its run ends at once (the cancel's
/// sweep, the clock not moved: its window's timer is 20 minutes away), its window ends with it,
/// and a later trigger of the same key opens a new window and is sent (not merged into the dead
/// one).
pub async fn a_cancelled_digest_leader_does_not_swallow_later_triggers(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com"})).await?;
    workflow(
        &s,
        "comments",
        definition(json!([
            {"type": "digest", "window": "20m", "key": "{{ post_id }}"},
            {"type": "send", "channel": "email", "template_id": "digest"},
        ])),
    )
    .await?;
    let leader = trigger(&s, "comments", &["u1"], json!({"post_id": "p"})).await?;
    s.eventually(WAIT, "the leader to wait at its digest", || async {
        Ok(runs(&s, &leader).await?.iter().any(|r| r["status"] == "waiting").then_some(()))
    })
    .await?;
    let (st, v) = s.call("POST", &format!("/v1/notifications/{leader}/cancel"), None).await?;
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    let stopped = s
        .eventually(WAIT, "the leader's run to end, before its window's end", || async {
            let r = run_of(&s, &leader).await?;
            Ok((r["status"] != "waiting").then_some(r))
        })
        .await?;
    assert_eq!(stopped["status"], "cancelled", "{stopped}");
    assert_eq!(notification(&s, &leader).await?["runs_open"], 0);
    let later = trigger(&s, "comments", &["u1"], json!({"post_id": "p"})).await?;
    s.eventually(WAIT, "the later trigger to wait at a digest of its own", || async {
        Ok(runs(&s, &later).await?.iter().any(|r| r["status"] == "waiting").then_some(()))
    })
    .await?;
    s.advance_and_tick(21 * 60).await?;
    ended(&s, &later).await?;
    let run = run_of(&s, &later).await?;
    assert_eq!(count_runs(std::slice::from_ref(&run), 0, "digested"), 1, "a new window, not the dead one: {run}");
    assert_eq!(bodies(&sent(&s, "u1", "email").await?), vec!["1 new comments on post p".to_owned()]);
    assert_documented(&s);
    Ok(())
}

/// A branch on a param, its then and else steps numbered after it, and a step's `if` on the
/// user's tags: `[branch total ≥ 100 then [sms] else [email], inapp if tagged vip]`.
pub async fn a_branch_takes_then_or_else_and_goes_on_after_it(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    templates(&s).await?;
    user(&s, "vip", json!({"email": "vip@example.com", "phone": "+14155550101", "tags": ["vip"]})).await?;
    user(&s, "plain", json!({"email": "plain@example.com", "phone": "+14155550102"})).await?;
    workflow(
        &s,
        "order",
        definition(json!([
            {"type": "branch", "if": {"param": "total", "gte": 100},
             "then": [{"type": "send", "channel": "sms", "template_id": "note"}],
             "else": [{"type": "send", "channel": "email", "template_id": "note"}]},
            {"type": "send", "channel": "inapp", "template_id": "note", "if": {"user": "tags", "eq": "vip"}},
        ])),
    )
    .await?;
    let big = trigger(&s, "order", &["vip", "plain"], json!({"n": 150, "total": 150})).await?;
    let small = trigger(&s, "order", &["vip", "plain"], json!({"n": 50, "total": "50"})).await?;
    all_ended(&s, &[big.clone(), small.clone()]).await?;
    for u in ["vip", "plain"] {
        assert_eq!(bodies(&sent(&s, u, "sms").await?), vec!["Note 150".to_owned()], "{u}");
        assert_eq!(bodies(&sent(&s, u, "email").await?), vec!["Note 50".to_owned()], "{u}");
    }
    let titles = |items: Vec<Value>| -> Vec<String> {
        let mut t: Vec<String> = items.iter().map(|m| m["body"].as_str().unwrap_or_default().to_owned()).collect();
        t.sort();
        t
    };
    assert_eq!(titles(inbox(&s, "vip").await?), vec!["Note 150".to_owned(), "Note 50".to_owned()]);
    assert!(inbox(&s, "plain").await?.is_empty());
    let (big_runs, small_runs) = (runs(&s, &big).await?, runs(&s, &small).await?);
    assert_eq!(count_runs(&big_runs, 0, "then"), 2, "{big_runs:?}");
    assert_eq!(big_runs.iter().filter(|r| sends_at(r, 1).len() == 1).count(), 2, "then's send is step 1: {big_runs:?}");
    assert_eq!(count_runs(&small_runs, 0, "else"), 2, "{small_runs:?}");
    assert_eq!(
        small_runs.iter().filter(|r| sends_at(r, 2).len() == 1).count(),
        2,
        "else's send is step 2: {small_runs:?}"
    );
    for r in [&big_runs, &small_runs] {
        assert_eq!(count_runs(r, 3, "skipped"), 1, "plain is not tagged vip: {r:?}");
        assert_eq!(count_runs(r, 3, "sent"), 1, "{r:?}");
    }
    let steps = |d: Vec<Value>| -> Vec<(String, String, u64)> {
        let mut v: Vec<(String, String, u64)> = d
            .iter()
            .map(|x| {
                (
                    x["user_id"].as_str().unwrap_or_default().to_owned(),
                    x["channel"].as_str().unwrap_or_default().to_owned(),
                    x["step"].as_u64().unwrap_or(99),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        steps(deliveries(&s, &small).await?),
        vec![
            ("plain".to_owned(), "email".to_owned(), 2),
            ("vip".to_owned(), "email".to_owned(), 2),
            ("vip".to_owned(), "inapp".to_owned(), 3)
        ]
    );
    assert_documented(&s);
    Ok(())
}
/// A one-channel send is not waited for (docs/workflows.md, "Runs"): one that fails for good at
/// the provider after the run went past it is the delivery's failure, in the notification's
/// status, not the run's, whose end was told already: the run `completed`, whether the failure
/// came after its end (`[email]`) or before it (`[email, delay, sms]`: the SMS is still sent).
pub async fn a_one_channel_send_that_fails_later_is_the_deliverys_failure_not_the_runs(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    templates(&s).await?;
    user(&s, "u1", json!({"email": "u1@example.com", "phone": "+14155550103"})).await?;
    workflow(&s, "one", definition(json!([{"type": "send", "channel": "email", "template_id": "note"}]))).await?;
    workflow(
        &s,
        "two",
        definition(json!([
            {"type": "send", "channel": "email", "template_id": "note"},
            {"type": "delay", "for": "3s"},
            {"type": "send", "channel": "sms", "template_id": "note"},
        ])),
    )
    .await?;
    let (st, _) = s.call("PUT", "/dev/providers/email", Some(json!({"mode": "permanent"}))).await?;
    assert_eq!(st, 200);
    let one = trigger(&s, "one", &["u1"], json!({"n": 1})).await?;
    let two = trigger(&s, "two", &["u1"], json!({"n": 2})).await?;
    assert_eq!(ended(&s, &one).await?["status"], "failed", "its one delivery failed");
    assert_eq!(ended(&s, &two).await?["status"], "completed_with_failures");
    for (id, sms_index) in [(&one, None), (&two, Some(2))] {
        let run = run_of(&s, id).await?;
        assert_eq!(run["status"], "completed", "{run}");
        assert!(records(&run, 0, "failed").is_empty(), "the run does not wait for a one-channel send: {run}");
        let (_, d) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
        let email: Vec<&Value> =
            d["items"].as_array().into_iter().flatten().filter(|x| x["channel"] == "email").collect();
        assert_eq!(email.len(), 1, "{d}");
        assert_eq!((email[0]["status"].as_str(), email[0]["step"].as_u64()), (Some("failed"), Some(0)), "{d}");
        if let Some(i) = sms_index {
            assert_eq!(sends_at(&run, i).len(), 1, "the run went on: {run}");
        }
    }
    assert!(sent(&s, "u1", "email").await?.is_empty());
    assert_eq!(bodies(&sent(&s, "u1", "sms").await?), vec!["Note 2".to_owned()]);
    assert_documented(&s);
    Ok(())
}
