//! Workflows (docs/workflows.md) on the embedded store with a manual clock: the digest under
//! concurrency (the anchors' bugs: novuhq/novu#2569, #3893, #2698, #1633, #2699, #2628), channel
//! fallback (#2859), conditions on engagement, throttles, branches, preferences per workflow,
//! required workflows, cancel, and a run's step driven twice doing its work once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Duration;
use serde_json::{Value, json};
use tidings_core::error::CoreError;
use tidings_core::notify::api;
use tidings_core::notify::model::{NotificationRequest, NotificationStatus};
use tidings_core::notify::requests;
use tidings_core::people::devices::{self, DeviceInput};
use tidings_core::people::preferences::{self, PreferencesInput};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{
    Channel, Cond, OutboundMessage, PermanentCode, Platform, Provider, ProviderError, ProviderReceipt, StoreError,
    Write,
};
use tidings_core::webhooks::{self, EndpointInput, EventType};
use tidings_core::workflows::run::{self, RunStatus, RunView, Wake};
use tidings_core::workflows::{self, WorkflowInput};
use tidings_core::{Deps, TenantId, inbox, templates, timers};
use tidings_embedded::test_world::{Around, Call, Recorder, TestWorld, Wrapped, drain};

/// A provider that fails every send for good (a push token gone).
#[derive(Default)]
struct Refuses {
    calls: Mutex<usize>,
}

#[async_trait]
impl Provider for Refuses {
    fn name(&self) -> &str {
        "refuses"
    }
    async fn send(&self, _: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        *self.calls.lock().unwrap() += 1;
        Err(ProviderError::Permanent { reason: "gone".into(), code: PermanentCode::Rejected })
    }
}

/// The store with a read latency on digest heads (as a remote table has one): every trigger
/// reads "no window open" before any of them writes, so they all race to open it.
struct Latent;

#[async_trait]
impl Around for Latent {
    async fn after(&self, call: Call<'_>) {
        if matches!(call, Call::Get(key) if key.sk == "HEAD") {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// The store answering a transaction conflict (as DynamoDB does when other transactions hold
/// an item, and the adapter's retries ran out) to the creation of `user`'s run (`create`) or to
/// the write of its progress after a drive (not `create`), `times` times.
struct Conflicts {
    user: String,
    create: bool,
    times: Mutex<u32>,
}

#[async_trait]
impl Around for Conflicts {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        let Call::Transact(writes) = call else { return Ok(()) };
        let hit = writes.iter().any(|w| match w {
            Write::Put { item, cond } => {
                item.key.sk == format!("R#{}", self.user) && matches!(cond, Cond::NotExists) == self.create
            }
            _ => false,
        });
        let mut left = self.times.lock().unwrap();
        if hit && *left > 0 {
            *left -= 1;
            return Err(StoreError::Conflict);
        }
        Ok(())
    }
}

struct Shop {
    w: TestWorld,
    t: TenantId,
    email: Arc<Recorder>,
    sms: Arc<Recorder>,
}

async fn shop_at(start: &str, push: Arc<dyn Provider>) -> Shop {
    let email = Arc::new(Recorder::default());
    shop_with(start, push, email.clone(), email).await
}

/// A shop whose email goes to `email_to` (`email` records what reaches it, when that is it).
async fn shop_with(start: &str, push: Arc<dyn Provider>, email_to: Arc<dyn Provider>, email: Arc<Recorder>) -> Shop {
    let sms = Arc::new(Recorder::default());
    let w =
        TestWorld::builder().start_at(start).all_queues(5).email(email_to).sms(sms.clone()).push(push.clone()).build();
    let t = TenantId::parse("shop").unwrap();
    let tpl = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "{{ count }} new", "email_body": "{{ count }} comments{% for e in events %} [{{ e.author }}]{% endfor %} on {{ post_id }}",
        "sms": "sms {{ post_id }}", "push_title": "push", "push_body": "push {{ post_id }}",
        "inapp_title": "inapp", "inapp_body": "inapp {{ post_id }}"}}});
    templates::put_template(&w.deps, &t, "comment", serde_json::from_value(tpl).unwrap()).await.unwrap();
    let tpl = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "note", "email_body": "note {{ post_id }}", "sms": "sms {{ post_id }}",
        "push_title": "push", "push_body": "push {{ post_id }}", "inapp_title": "inapp", "inapp_body": "inapp {{ post_id }}"}}});
    templates::put_template(&w.deps, &t, "note", serde_json::from_value(tpl).unwrap()).await.unwrap();
    Shop { w, t, email, sms }
}

async fn shop() -> Shop {
    shop_at("2026-12-01T10:00:00Z", Arc::new(Recorder::default())).await
}

async fn user(s: &Shop, id: &str, phone: bool, tz: Option<&str>) {
    let input = UserInput {
        email: Some(format!("{id}@example.com")),
        phone: phone.then(|| "+14155550100".to_owned()),
        timezone: tz.map(str::to_owned),
        ..Default::default()
    };
    users::put_user(&s.w.deps, &s.t, id, input).await.unwrap();
}

async fn workflow(s: &Shop, id: &str, v: Value) -> u32 {
    let mut body = json!({"name": id, "category": "transactional"});
    for (k, x) in v.as_object().unwrap() {
        body[k] = x.clone();
    }
    let input: WorkflowInput = serde_json::from_value(body).unwrap();
    workflows::put_workflow(&s.w.deps, &s.t, id, input).await.unwrap().version
}

fn send(workflow: &str, users: &[&str], params: Value) -> NotificationRequest {
    serde_json::from_value(json!({"recipients": {"user_ids": users}, "workflow_id": workflow, "params": params}))
        .unwrap()
}

async fn trigger(s: &Shop, workflow: &str, users: &[&str], params: Value) -> String {
    api::accept(&s.w.deps, &s.t, send(workflow, users, params)).await.unwrap().notification_id
}

async fn settle(s: &Shop) {
    let feed = s.w.feed("test");
    drain(&s.w.deps, &feed).await;
}

/// Moves the clock, fires due timer buckets and runs what is due.
async fn pass(s: &Shop, d: Duration) {
    s.w.clock().advance(d);
    timers::tick(&s.w.deps).await.unwrap();
    settle(s).await;
}

fn bodies(r: &Recorder) -> Vec<String> {
    r.sent.lock().unwrap().iter().map(|m| m.body.clone()).collect()
}

async fn runs(s: &Shop, id: &str) -> Vec<RunView> {
    run::runs(&s.w.deps, &s.t, id, 500, None).await.unwrap().unwrap().items
}

fn statuses(r: &RunView) -> Vec<String> {
    r.steps.iter().map(|x| format!("{}:{}", x.index, x.status)).collect()
}

const DIGEST: &str = r#"[{"type": "digest", "window": "10m", "key": "{{ post_id }}"},
                         {"type": "send", "channel": "email", "template_id": "comment"}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_triggers_at_one_instant_on_two_instances_make_one_digest_and_keys_never_merge() {
    // novuhq/novu#2569 (two triggers in one second, two digests), #3893 (concurrent events not
    // bucketed together), #2698 (other keys merged).
    let s = shop().await;
    user(&s, "u1", false, None).await;
    workflow(&s, "comments", json!({"steps": serde_json::from_str::<Value>(DIGEST).unwrap()})).await;
    let mut ids = Vec::new();
    for i in 0..40 {
        let post = if i % 4 == 3 { "p2" } else { "p1" };
        ids.push((trigger(&s, "comments", &["u1"], json!({"post_id": post, "author": format!("a{i}")})).await, post));
    }
    // Every trigger's run started at the same instant on one of two instances (each its own
    // caches, the same store, reads that take a while), all at once.
    let instance = || {
        Deps::new(
            Arc::new(Wrapped::new(Arc::new(s.w.store.clone()), Latent)),
            Arc::new(s.w.store.clone()),
            s.w.deps.clock.clone(),
            s.w.deps.providers.clone(),
            (*s.w.deps.config).clone(),
        )
    };
    let (one, two) = (instance(), instance());
    let mut tasks = Vec::new();
    for (i, (id, _)) in ids.iter().enumerate() {
        let deps = if i % 2 == 0 { one.clone() } else { two.clone() };
        let (t, id) = (s.t.clone(), id.clone());
        tasks.push(tokio::spawn(async move { requests::orchestrate(&deps, &t, &id).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    settle(&s).await;
    assert!(bodies(&s.email).is_empty(), "nothing before the window closes");
    pass(&s, Duration::minutes(11)).await;
    let mut sent = bodies(&s.email);
    sent.sort();
    assert_eq!(sent.len(), 2, "one digest per key: {sent:?}");
    assert!(sent[0].starts_with("10 comments") && sent[0].ends_with("on p2"), "{}", sent[0]);
    assert!(sent[1].starts_with("30 comments") && sent[1].ends_with("on p1"), "{}", sent[1]);
    // Oldest first: the first p1 trigger's author leads the list.
    assert!(sent[1].contains("comments [a0] [a1] [a2] [a4]"), "{}", sent[1]);
    let mut digested = 0;
    let mut merged = 0;
    for (id, _) in &ids {
        for r in runs(&s, id).await {
            assert_eq!(r.status, RunStatus::Completed, "{:?}", r.steps);
            digested += statuses(&r).iter().filter(|x| *x == "0:digested").count();
            merged += statuses(&r).iter().filter(|x| *x == "0:merged").count();
        }
        let n = api::get_notification(&s.w.deps, &s.t, id).await.unwrap().unwrap();
        assert_eq!(n.status, NotificationStatus::Completed, "every run ended: {:?}", n.runs_open);
    }
    assert_eq!((digested, merged), (2, 38));
}

#[tokio::test]
async fn a_delay_then_a_digest_is_one_digest_and_two_digest_steps_each_do_their_job() {
    // novuhq/novu#1633 (a delay before a digest sent one digest per event), #2699 (more than one
    // digest step broke).
    let s = shop().await;
    user(&s, "u1", false, None).await;
    workflow(
        &s,
        "delayed",
        json!({"steps": [{"type": "delay", "for": "5m"}, {"type": "digest", "window": "10m"},
                        {"type": "send", "channel": "email", "template_id": "comment"}]}),
    )
    .await;
    for i in 0..5 {
        trigger(&s, "delayed", &["u1"], json!({"post_id": "p", "author": i})).await;
        s.w.clock().advance(Duration::seconds(20));
    }
    settle(&s).await;
    pass(&s, Duration::minutes(6)).await;
    assert!(bodies(&s.email).is_empty());
    pass(&s, Duration::minutes(11)).await;
    assert_eq!(bodies(&s.email).len(), 1, "{:?}", bodies(&s.email));
    assert!(bodies(&s.email)[0].starts_with("5 comments"), "{:?}", bodies(&s.email));

    workflow(
        &s,
        "twice",
        json!({"steps": [{"type": "digest", "window": "1m"}, {"type": "send", "channel": "inapp", "template_id": "comment"},
                        {"type": "digest", "window": "30m"}, {"type": "send", "channel": "email", "template_id": "comment"}]}),
    )
    .await;
    // Two bursts a few minutes apart: two in-app digests, then one email digest of both.
    for burst in 0..2 {
        for i in 0..3 {
            trigger(&s, "twice", &["u1"], json!({"post_id": format!("b{burst}"), "author": i})).await;
        }
        settle(&s).await;
        pass(&s, Duration::minutes(2)).await;
    }
    let inbox = inbox::list(&s.w.deps, &s.t, "u1", 50, None).await.unwrap();
    assert_eq!(inbox.items.len(), 2, "one in-app message per first-step window");
    pass(&s, Duration::minutes(31)).await;
    let emails = bodies(&s.email);
    assert_eq!(emails.len(), 2, "{emails:?}");
    assert!(emails[1].starts_with("2 comments"), "the second digest merged the two first-step runs: {emails:?}");
}

#[tokio::test]
async fn a_scheduled_digest_fires_at_the_users_local_time_across_daylight_saving_changes() {
    // novuhq/novu#2628: a daily digest at a fixed local time got the zone wrong.
    // 2026-03-08 02:00 New York springs forward: 09:00 that day is 13:00Z, not 14:00Z.
    let s = shop_at("2026-03-07T23:00:00Z", Arc::new(Recorder::default())).await;
    user(&s, "ny", false, Some("America/New_York")).await;
    workflow(
        &s,
        "daily",
        json!({"steps": [{"type": "digest", "schedule": {"at": "09:00", "every": "day"}},
                        {"type": "send", "channel": "email", "template_id": "comment"}]}),
    )
    .await;
    let id = trigger(&s, "daily", &["ny"], json!({"post_id": "p", "author": "a"})).await;
    settle(&s).await;
    let r = runs(&s, &id).await;
    assert_eq!(r[0].waiting_until.as_deref(), Some("2026-03-08T13:00:00.000Z"));
    pass(&s, Duration::minutes(13 * 60 + 59)).await; // 2026-03-08T12:59Z
    assert!(bodies(&s.email).is_empty());
    pass(&s, Duration::minutes(2)).await;
    assert_eq!(bodies(&s.email).len(), 1);
    // And in autumn: 2026-11-01 09:00 New York (standard time again) is 14:00Z.
    let s = shop_at("2026-10-31T23:00:00Z", Arc::new(Recorder::default())).await;
    user(&s, "ny", false, Some("America/New_York")).await;
    workflow(
        &s,
        "weekly",
        json!({"steps": [{"type": "digest", "schedule": {"at": "09:00", "every": "week", "on": "sunday"}},
                        {"type": "send", "channel": "email", "template_id": "comment"}]}),
    )
    .await;
    let id = trigger(&s, "weekly", &["ny"], json!({"post_id": "p", "author": "a"})).await;
    settle(&s).await;
    assert_eq!(runs(&s, &id).await[0].waiting_until.as_deref(), Some("2026-11-01T14:00:00.000Z"));
}

#[tokio::test]
async fn fallback_goes_push_sms_email_and_stops_at_the_first_that_works() {
    // novuhq/novu#2859: channel fallback.
    let refuses = Arc::new(Refuses::default());
    let s = shop_at("2026-12-01T10:00:00Z", refuses.clone()).await;
    user(&s, "nophone", false, None).await;
    let device = DeviceInput { user_id: "nophone".into(), platform: Platform::Ios, token: "a".repeat(64) };
    devices::register(&s.w.deps, &s.t, device).await.unwrap();
    let steps = json!({"steps": [{"type": "send", "channels": ["push", "sms", "email"], "template_id": "note"}]});
    workflow(&s, "fallback", steps).await;
    let id = trigger(&s, "fallback", &["nophone"], json!({"post_id": "p"})).await;
    settle(&s).await;
    assert_eq!(*refuses.calls.lock().unwrap(), 1, "push tried once");
    assert!(bodies(&s.sms).is_empty(), "no phone: no SMS");
    assert_eq!(bodies(&s.email), vec!["note p".to_owned()]);
    let r = &runs(&s, &id).await[0];
    let trail: Vec<(String, Option<Channel>)> = r.steps.iter().map(|x| (x.status.clone(), x.channel)).collect();
    assert_eq!(
        trail,
        vec![
            ("queued".into(), Some(Channel::Push)),
            ("fell_back".into(), Some(Channel::Push)),
            ("suppressed".into(), Some(Channel::Sms)),
            ("queued".into(), Some(Channel::Email)),
            ("done".into(), Some(Channel::Email)),
        ],
        "{:?}",
        r.steps
    );
    assert_eq!(r.status, RunStatus::Completed);

    // Push that works: nothing else is sent.
    let s = shop().await;
    user(&s, "u1", true, None).await;
    let device = DeviceInput { user_id: "u1".into(), platform: Platform::Android, token: "b".repeat(64) };
    devices::register(&s.w.deps, &s.t, device).await.unwrap();
    workflow(&s, "fallback", steps_of("push")).await;
    trigger(&s, "fallback", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    pass(&s, Duration::minutes(30)).await;
    assert!(bodies(&s.sms).is_empty() && bodies(&s.email).is_empty(), "the push worked: no second channel");
}

fn steps_of(first: &str) -> Value {
    json!({"steps": [{"type": "send", "channels": [first, "sms", "email"], "template_id": "note"}]})
}

#[tokio::test]
async fn a_fallback_that_waits_for_delivery_tries_the_next_channel_only_after_the_wait() {
    let s = shop().await;
    user(&s, "u1", true, None).await;
    let steps = json!({"steps": [{"type": "send", "channels": ["email", "sms"], "until": "delivered", "wait": "5m", "template_id": "note"}]});
    workflow(&s, "wait", steps).await;
    let id = trigger(&s, "wait", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    assert_eq!(bodies(&s.email).len(), 1);
    pass(&s, Duration::minutes(4)).await;
    assert!(bodies(&s.sms).is_empty(), "still within the wait");
    pass(&s, Duration::minutes(2)).await;
    assert_eq!(bodies(&s.sms).len(), 1, "the email never reached delivered: SMS after the wait");
    let r = &runs(&s, &id).await[0];
    assert!(statuses(r).contains(&"0:fell_back".to_owned()), "{:?}", r.steps);
}

#[tokio::test]
async fn if_not_read_after_a_delay_skips_a_message_read_meanwhile() {
    let s = shop().await;
    user(&s, "reader", false, None).await;
    user(&s, "busy", false, None).await;
    let steps = json!({"steps": [
        {"type": "send", "channel": "inapp", "template_id": "note"},
        {"type": "delay", "for": "1h"},
        {"type": "send", "channel": "email", "template_id": "note", "if": {"step": 0, "is": "not_read"}}]});
    workflow(&s, "nudge", steps).await;
    let id = trigger(&s, "nudge", &["reader", "busy"], json!({"post_id": "p"})).await;
    settle(&s).await;
    let page = inbox::list(&s.w.deps, &s.t, "reader", 10, None).await.unwrap();
    inbox::mark_read(&s.w.deps, &s.t, "reader", &page.items[0].message_id).await.unwrap();
    let n = api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap();
    assert_eq!((n.status, n.runs_open), (NotificationStatus::Processing, Some(2)), "waiting runs keep it open");
    pass(&s, Duration::minutes(61)).await;
    let to: Vec<String> = s.email.sent.lock().unwrap().iter().map(|m| m.to.clone()).collect();
    assert_eq!(to, vec!["busy@example.com".to_owned()]);
    for r in runs(&s, &id).await {
        let last = statuses(&r).last().cloned().unwrap();
        assert_eq!(last, if r.user_id == "reader" { "2:skipped" } else { "2:queued" }, "{:?}", r.steps);
    }
    let n = api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap();
    assert_eq!((n.status, n.runs_open), (NotificationStatus::Completed, Some(0)));
}

#[tokio::test]
async fn throttle_branch_and_preferences_per_workflow() {
    let s = shop().await;
    user(&s, "u1", true, None).await;
    let audit = s.w.feed("audit");
    let hook = EndpointInput {
        url: "https://93.184.216.34/hooks".into(),
        events: vec![EventType::WorkflowRunEnded],
        rate_limit: None,
    };
    webhooks::create(&s.w.deps, &s.t, hook).await.unwrap();
    let steps = json!({"steps": [
        {"type": "throttle", "limit": 2, "per": "1d"},
        {"type": "branch", "if": {"param": "total", "gte": 100},
         "then": [{"type": "send", "channel": "sms", "template_id": "note"}],
         "else": [{"type": "send", "channel": "email", "template_id": "note"}]}]});
    workflow(&s, "orders", steps).await;
    let mut ids = Vec::new();
    for total in [150, 20, 300, 400] {
        ids.push(trigger(&s, "orders", &["u1"], json!({"post_id": "p", "total": total})).await);
    }
    settle(&s).await;
    assert_eq!((bodies(&s.sms).len(), bodies(&s.email).len()), (1, 1), "two past the throttle, one per branch");
    let ended: Vec<RunStatus> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(runs(&s, id).await[0].status);
        }
        v
    };
    assert_eq!(ended, vec![RunStatus::Completed, RunStatus::Completed, RunStatus::Throttled, RunStatus::Throttled]);
    // A run driven again passes the throttle it passed once (its mark), never twice.
    run::wake(&s.w.deps, &s.t, &ids[0], "u1", Wake::Start).await.unwrap();
    requests::orchestrate(&s.w.deps, &s.t, &ids[0]).await.unwrap();
    settle(&s).await;
    assert_eq!(bodies(&s.sms).len(), 1);
    // Each run's end told once, with how it ended.
    let told = tidings_embedded::test_world::told(&audit, "workflow.run_ended").await;
    let want: Vec<(String, String)> = ids
        .iter()
        .zip(["completed", "completed", "throttled", "throttled"])
        .map(|(i, s)| (i.clone(), s.to_owned()))
        .collect();
    let mut told_sorted = told.clone();
    told_sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(told_sorted, want_sorted, "one event per run end: {told:?}");
    // The next day the throttle opens again.
    pass(&s, Duration::days(1)).await;
    trigger(&s, "orders", &["u1"], json!({"post_id": "p", "total": 1})).await;
    settle(&s).await;
    assert_eq!(bodies(&s.email).len(), 2);

    // Preferences per workflow, per channel; a required workflow passes every preference.
    workflow(&s, "plain", json!({"steps": [{"type": "send", "channel": "email", "template_id": "note"}]})).await;
    workflow(
        &s,
        "otp",
        json!({"required": true, "steps": [{"type": "send", "channel": "email", "template_id": "note"}]}),
    )
    .await;
    let prefs: PreferencesInput = serde_json::from_value(json!({"workflows": {"plain": {"email": false}}})).unwrap();
    preferences::put(&s.w.deps, &s.t, "u1", prefs).await.unwrap();
    let before = bodies(&s.email).len();
    let plain = trigger(&s, "plain", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    assert_eq!(bodies(&s.email).len(), before, "turned off for this workflow on email");
    let r = &runs(&s, &plain).await[0];
    assert_eq!(r.steps[0].detail.as_deref(), Some("workflow_off"), "{:?}", r.steps);
    let prefs: PreferencesInput = serde_json::from_value(
        json!({"unsubscribe_all": true, "channels": {"email": false}, "workflows": {"otp": false}}),
    )
    .unwrap();
    preferences::put(&s.w.deps, &s.t, "u1", prefs).await.unwrap();
    trigger(&s, "otp", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    assert_eq!(bodies(&s.email).len(), before + 1, "required: no preference stops it");
}

#[tokio::test]
async fn a_digest_step_driven_twice_sends_once_and_a_cancel_stops_what_waits() {
    let s = shop().await;
    user(&s, "u1", false, None).await;
    workflow(&s, "comments", json!({"steps": serde_json::from_str::<Value>(DIGEST).unwrap()})).await;
    let id = trigger(&s, "comments", &["u1"], json!({"post_id": "p", "author": "a"})).await;
    settle(&s).await;
    // The request message again (a redelivery): the same run, the same window, its leader.
    requests::orchestrate(&s.w.deps, &s.t, &id).await.unwrap();
    settle(&s).await;
    pass(&s, Duration::minutes(11)).await;
    let window = || async {
        let r = runs(&s, &id).await;
        r[0].steps.iter().any(|x| x.status == "digested")
    };
    assert!(window().await);
    // The close's timer again, and the start again: nothing more.
    run::wake(&s.w.deps, &s.t, &id, "u1", Wake::Digest { node: 0, window: "any".into() }).await.unwrap();
    run::wake(&s.w.deps, &s.t, &id, "u1", Wake::Start).await.unwrap();
    requests::orchestrate(&s.w.deps, &s.t, &id).await.unwrap();
    settle(&s).await;
    assert_eq!(bodies(&s.email).len(), 1);

    workflow(
        &s,
        "later",
        json!({"steps": [{"type": "delay", "for": "2h"}, {"type": "send", "channel": "email", "template_id": "note"}]}),
    )
    .await;
    let id = trigger(&s, "later", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    assert_eq!(runs(&s, &id).await[0].status, RunStatus::Waiting);
    api::cancel(&s.w.deps, &s.t, &id).await.unwrap();
    // Ended by the cancel's sweep, not two hours later by its delay's timer.
    settle(&s).await;
    assert_eq!(runs(&s, &id).await[0].status, RunStatus::Cancelled);
    assert_eq!(api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap().runs_open, Some(0));
    pass(&s, Duration::hours(3)).await;
    assert_eq!(bodies(&s.email).len(), 1, "a cancelled run sends nothing");
    assert_eq!(runs(&s, &id).await[0].status, RunStatus::Cancelled);
}

#[tokio::test]
async fn a_workflow_that_cannot_work_is_refused_and_runs_keep_their_version() {
    let s = shop().await;
    user(&s, "u1", false, None).await;
    let put = |steps: Value| {
        let input: WorkflowInput =
            serde_json::from_value(json!({"name": "x", "category": "marketing", "steps": steps})).unwrap();
        let deps = s.w.deps.clone();
        let t = s.t.clone();
        async move { workflows::put_workflow(&deps, &t, "x", input).await }
    };
    fn field<T: std::fmt::Debug>(r: Result<T, CoreError>) -> String {
        match r {
            Err(CoreError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        field(put(json!([{"type": "send", "channel": "email", "template_id": "nope"}])).await),
        "steps[0].template_id"
    );
    let tpl = json!({"default_locale": "en", "locales": {"en": {"sms": "hi"}}});
    templates::put_template(&s.w.deps, &s.t, "sms_only", serde_json::from_value(tpl).unwrap()).await.unwrap();
    assert_eq!(
        field(put(json!([{"type": "send", "channels": ["sms", "email"], "template_id": "sms_only"}])).await),
        "steps[0].template_id",
        "no email content"
    );
    let unknown = api::accept(&s.w.deps, &s.t, send("nothing", &["u1"], json!({}))).await;
    assert_eq!(field(unknown.map(|_| ())), "workflow_id");

    let v1 = workflow(
        &s,
        "v",
        json!({"steps": [{"type": "delay", "for": "1h"}, {"type": "send", "channel": "email", "template_id": "note"}]}),
    )
    .await;
    assert_eq!(v1, 1);
    assert_eq!(
        workflow(&s, "v", json!({"steps": [{"type": "delay", "for": "1h"}, {"type": "send", "channel": "email", "template_id": "note"}]})).await,
        1,
        "the same definition again is no new version"
    );
    let id = trigger(&s, "v", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    let v2 = workflow(&s, "v", json!({"steps": [{"type": "send", "channel": "inapp", "template_id": "note"}]})).await;
    assert_eq!(v2, 2);
    pass(&s, Duration::minutes(61)).await;
    let r = &runs(&s, &id).await[0];
    assert_eq!((r.version, r.status), (1, RunStatus::Completed));
    assert_eq!(bodies(&s.email).len(), 1, "the run followed its own version: an email, not an in-app message");
}

#[tokio::test]
async fn the_unsubscribe_link_of_a_workflows_email_turns_that_workflow_off_on_email() {
    use tidings_core::tracking::{self, TokenKind};
    let email = Arc::new(Recorder::default());
    let config = tidings_core::CoreConfig {
        signer: tidings_core::signing::Signer::parse("k1:a-signing-secret-of-some-length"),
        ..tidings_core::CoreConfig::default()
    };
    let w = TestWorld::builder().all_queues(5).email(email.clone()).config(config).build();
    let s = Shop { w, t: TenantId::parse("shop").unwrap(), email, sms: Arc::new(Recorder::default()) };
    let tpl =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "s", "email_body": "news {{ post_id }}"}}});
    templates::put_template(&s.w.deps, &s.t, "note", serde_json::from_value(tpl).unwrap()).await.unwrap();
    user(&s, "u1", false, None).await;
    let steps =
        json!({"category": "marketing", "steps": [{"type": "send", "channel": "email", "template_id": "note"}]});
    workflow(&s, "price_drop", steps.clone()).await;
    workflow(&s, "back_in_stock", steps).await;
    trigger(&s, "price_drop", &["u1"], json!({"post_id": "p"})).await;
    settle(&s).await;
    let sent = s.email.sent.lock().unwrap().clone();
    let unsub = sent[0].headers.iter().find(|(n, _)| n == "List-Unsubscribe").expect("a marketing email has the link");
    let token = unsub.1.rsplit("/u/").next().unwrap().trim_end_matches('>');
    let claims =
        tracking::verify(&s.w.deps.config, TokenKind::Unsubscribe, token, s.w.deps.clock.now().timestamp()).unwrap();
    assert_eq!(claims.s, Some(0), "the link names the workflow's step");
    tracking::unsubscribe(&s.w.deps, &claims).await.unwrap();
    let prefs = preferences::get(&s.w.deps, &s.t, "u1").await.unwrap();
    assert!(!prefs.workflow_on("price_drop", Channel::Email));
    assert!(prefs.category_on(tidings_core::notify::model::Category::Marketing), "the rest of marketing stays on");
    trigger(&s, "price_drop", &["u1"], json!({"post_id": "p2"})).await;
    trigger(&s, "back_in_stock", &["u1"], json!({"post_id": "p3"})).await;
    settle(&s).await;
    // Each a marketing email: the page of the user's choices linked at its foot (docs/site.md).
    let sent = bodies(&s.email);
    let heads: Vec<&str> = sent.iter().map(|b| b.split("\n\n--\n").next().unwrap_or_default()).collect();
    assert_eq!(heads, vec!["news p", "news p3"]);
    assert!(sent.iter().all(|b| b.contains("/p/")), "{sent:?}");
}

#[tokio::test]
async fn a_digest_window_and_a_delay_count_from_the_trigger_not_from_a_backlog() {
    let s = shop().await;
    user(&s, "u1", false, None).await;
    workflow(&s, "comments", json!({"steps": serde_json::from_str::<Value>(DIGEST).unwrap()})).await;
    workflow(
        &s,
        "later",
        json!({"steps": [{"type": "delay", "for": "10m"}, {"type": "send", "channel": "email", "template_id": "note"}]}),
    )
    .await;
    let start = s.w.deps.clock.now();
    // Accepted 8 minutes apart; the engine reaches them only at minute 9 (a backlog).
    let first = trigger(&s, "comments", &["u1"], json!({"post_id": "p", "author": "a"})).await;
    let delayed = trigger(&s, "later", &["u1"], json!({"post_id": "p"})).await;
    s.w.clock().advance(Duration::minutes(8));
    trigger(&s, "comments", &["u1"], json!({"post_id": "p", "author": "b"})).await;
    s.w.clock().advance(Duration::minutes(1));
    settle(&s).await;
    let due = (start + Duration::minutes(10)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(
        runs(&s, &first).await[0].waiting_until.as_deref(),
        Some(due.as_str()),
        "the window closes 10 min after the first trigger"
    );
    assert_eq!(
        runs(&s, &delayed).await[0].waiting_until.as_deref(),
        Some(due.as_str()),
        "the delay ends 10 min after its trigger"
    );
    pass(&s, Duration::minutes(1) + Duration::seconds(5)).await;
    let mut sent = bodies(&s.email);
    sent.sort();
    assert_eq!(sent, vec!["2 comments [a] [b] on p".to_owned(), "note p".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_conflict_on_one_run_fails_its_page_once_and_every_other_run_of_the_page_starts() {
    // Seen at scale on DynamoDB (`tidings bench digest --backend aws`, 1,000 users): the runs
    // of a 1,000-recipient page meet at its progress counters, and a run whose transaction
    // conflicted past the adapter's retries stopped the whole page, its other runs dropped;
    // each delivery of the page met another conflict, and after five the page went to the
    // dead letters with most of its triggers never in their digests.
    let s = shop().await;
    let ids: Vec<String> = (0..200).map(|i| format!("u{i:03}")).collect();
    for id in &ids {
        user(&s, id, false, None).await;
    }
    workflow(&s, "comments", json!({"steps": serde_json::from_str::<Value>(DIGEST).unwrap()})).await;
    let users: Vec<&str> = ids.iter().map(String::as_str).collect();
    let id = trigger(&s, "comments", &users, json!({"post_id": "p", "author": "a"})).await;
    let conflicts = Wrapped::new(
        Arc::new(s.w.store.clone()),
        Conflicts { user: "u000".into(), create: true, times: Mutex::new(1) },
    );
    let deps = Deps::new(
        Arc::new(conflicts),
        Arc::new(s.w.store.clone()),
        s.w.deps.clock.clone(),
        s.w.deps.providers.clone(),
        (*s.w.deps.config).clone(),
    );
    // The page's first delivery: u000's run conflicts, the page fails (its message comes
    // again), and every other run was started meanwhile.
    assert!(requests::orchestrate(&deps, &s.t, &id).await.is_err(), "the page fails, so it comes again");
    let started: Vec<String> = runs(&s, &id).await.into_iter().map(|r| r.user_id).collect();
    assert_eq!(started.len(), 199, "every run but the one that conflicted: {} of 200", started.len());
    assert!(!started.contains(&"u000".to_owned()));
    // Its next delivery starts that one; the rest are no-ops.
    requests::orchestrate(&deps, &s.t, &id).await.unwrap();
    settle(&s).await;
    let all = runs(&s, &id).await;
    assert_eq!(all.len(), 200);
    assert!(all.iter().all(|r| r.status == RunStatus::Waiting), "each leads its own digest");
    pass(&s, Duration::minutes(11)).await;
    assert_eq!(bodies(&s.email).len(), 200, "one digest each");
    let n = api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap();
    assert_eq!(n.status, NotificationStatus::Completed, "every run ended: {:?}", n.runs_open);
}

#[tokio::test]
async fn a_one_channel_send_that_failed_before_its_step_was_driven_again_is_the_deliverys_failure() {
    // Seen on DynamoDB under load: the request task planned the run's one email, was cut off
    // before it wrote the run, and its retry came after the email had failed at the provider;
    // the step then read the failure as its own and ended the run `failed`, where a drive that
    // had not been cut off ends it `completed` (a one-channel send is not waited for).
    let refuses = Arc::new(Refuses::default());
    let s = shop_with("2026-12-01T10:00:00Z", Arc::new(Recorder::default()), refuses.clone(), Arc::default()).await;
    user(&s, "u1", false, None).await;
    workflow(&s, "one", json!({"steps": [{"type": "send", "channel": "email", "template_id": "note"}]})).await;
    let id = trigger(&s, "one", &["u1"], json!({"post_id": "p"})).await;
    let cut =
        Wrapped::new(Arc::new(s.w.store.clone()), Conflicts { user: "u1".into(), create: false, times: Mutex::new(1) });
    let deps = Deps::new(
        Arc::new(cut),
        Arc::new(s.w.store.clone()),
        s.w.deps.clock.clone(),
        s.w.deps.providers.clone(),
        (*s.w.deps.config).clone(),
    );
    assert!(requests::orchestrate(&deps, &s.t, &id).await.is_err(), "the run's write fails, so the page comes again");
    let feed = s.w.feed("test");
    while tidings_embedded::test_world::pass(&s.w.deps, &feed, |q| q.starts_with("email")).await > 0 {}
    assert_eq!(*refuses.calls.lock().unwrap(), 1, "the email was tried, and failed for good");
    settle(&s).await;
    let run = &runs(&s, &id).await[0];
    assert_eq!(run.status, RunStatus::Completed, "{:?}", statuses(run));
    assert!(!statuses(run).contains(&"0:failed".to_owned()), "{:?}", statuses(run));
    assert_eq!(*refuses.calls.lock().unwrap(), 1, "sent once");
    let n = api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap();
    assert_eq!(n.status, NotificationStatus::Failed, "the failure is the delivery's, in the notification's status");
}
