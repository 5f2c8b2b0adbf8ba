//! The rest of the resource API against the embedded store: the lists (every item once across
//! pages, filters, one tenant's list never shows another's), erasing a user (what goes, what
//! stays, twice the same, and queued work that does not bring the user back), and template
//! previews.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Handling, Recorder, TestWorld, drain, start};
use tidings_core::error::CoreError;
use tidings_core::lists::{self, NotificationFilter};
use tidings_core::messages::{dispatch, settle};
use tidings_core::notify::api;
use tidings_core::notify::model::{Delivery, DeliveryStatus, NotificationRequest, NotificationStatus};
use tidings_core::people::devices::{self, DeviceInput};
use tidings_core::people::preferences::{self, PreferencesInput};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{ChangeFeed, Channel, ManualClock, Platform};
use tidings_core::restock::model::SubscriptionRequest;
use tidings_core::restock::subscriptions;
use tidings_core::templates::preview::{self, PreviewRequest};
use tidings_core::{CoreConfig, Deps, TenantId, inbox, keys, people::erasure, templates};
use tidings_embedded::EmbeddedChangeFeed;

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    feed: EmbeddedChangeFeed,
    email: Arc<Recorder>,
    a: TenantId,
    b: TenantId,
}

async fn world() -> World {
    let email = Arc::new(Recorder::default());
    let config = CoreConfig { retry_base: Duration::from_secs(1), ..CoreConfig::default() };
    let tw = TestWorld::builder()
        .all_queues(5)
        .email(email.clone())
        .sms(Arc::new(Recorder::default()))
        .push(Arc::new(Recorder::default()))
        .config(config)
        .build();
    let w = World {
        feed: tw.feed("relay"),
        clock: tw.clock(),
        deps: tw.deps,
        email,
        a: TenantId::parse("shop-a").unwrap(),
        b: TenantId::parse("shop-b").unwrap(),
    };
    for t in [&w.a, &w.b] {
        let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
            "email_subject": "Order {{ order_id }}", "email_body": "Hi {{ user_id }}, order {{ order_id }} shipped",
            "inapp_title": "Order {{ order_id }}", "inapp_body": "Shipped"}}}))
        .unwrap();
        templates::put_template(&w.deps, t, "shipped", input).await.unwrap();
    }
    w
}

async fn put_user(w: &World, t: &TenantId, id: &str, tags: &[&str]) {
    let input = UserInput {
        email: Some(format!("{id}@example.com")),
        tags: tags.iter().map(|s| s.to_string()).collect(),
        ..UserInput::default()
    };
    users::put_user(&w.deps, t, id, input).await.unwrap();
}

fn send(users: &[&str], category: &str, channels: &[&str]) -> NotificationRequest {
    serde_json::from_value(json!({"recipients": {"user_ids": users}, "template_id": "shipped",
        "params": {"order_id": "7"}, "category": category, "channels": channels}))
    .unwrap()
}

async fn delivery(w: &World, id: &str, user: &str, channel: Channel) -> Delivery {
    w.deps.table.get(&keys::delivery(&w.a, id, user, channel)).await.unwrap().unwrap().parse().unwrap()
}

/// Every page of a list, through its cursor.
async fn all_pages<T, F, Fut>(limit: usize, mut page: F) -> Vec<T>
where
    F: FnMut(usize, Option<String>) -> Fut,
    Fut: std::future::Future<Output = (Vec<T>, Option<String>)>,
{
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..1000 {
        let (items, next) = page(limit, cursor.take()).await;
        assert!(items.len() <= limit, "a page holds at most limit items");
        out.extend(items);
        match next {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("the list never ended")
}

#[tokio::test]
async fn users_and_templates_are_listed_once_each_per_tenant() {
    let w = world().await;
    for i in 0..7 {
        put_user(&w, &w.a, &format!("a{i}"), &["vip"]).await;
    }
    put_user(&w, &w.a, "a3", &[]).await; // written twice: listed once, as it is now
    put_user(&w, &w.b, "b0", &[]).await;
    for limit in [1, 2, 3, 7, 50] {
        let got = all_pages(limit, |limit, cursor| {
            let deps = w.deps.clone();
            let a = w.a.clone();
            async move {
                let p = lists::users(&deps, &a, limit, cursor).await.unwrap();
                (p.items, p.next_cursor)
            }
        })
        .await;
        let ids: Vec<&str> = got.iter().map(|u| u.user_id.as_str()).collect();
        assert_eq!(ids, ["a0", "a1", "a2", "a3", "a4", "a5", "a6"], "pages of {limit}");
        assert!(got[3].tags.is_empty(), "the entry is the user as last written");
    }
    // Tenant b's list is its own partition: a cursor of a's moves within b's users only.
    let a_page = lists::users(&w.deps, &w.a, 2, None).await.unwrap();
    let b_page = lists::users(&w.deps, &w.b, 50, a_page.next_cursor.clone()).await.unwrap();
    assert!(b_page.items.iter().all(|u| u.user_id.starts_with('b')), "{:?}", b_page.items);
    let b_all = lists::users(&w.deps, &w.b, 50, None).await.unwrap();
    assert_eq!(b_all.items.iter().map(|u| u.user_id.as_str()).collect::<Vec<_>>(), ["b0"]);

    for id in ["t2", "t1", "t3"] {
        let input = serde_json::from_value(json!({"default_locale": "en", "locales": {
            "en": {"sms": "x"}, "zh-CN": {"sms": "y"}}}))
        .unwrap();
        templates::put_template(&w.deps, &w.a, id, input).await.unwrap();
    }
    let got = all_pages(2, |limit, cursor| {
        let deps = w.deps.clone();
        let a = w.a.clone();
        async move {
            let p = lists::templates(&deps, &a, limit, cursor).await.unwrap();
            (p.items, p.next_cursor)
        }
    })
    .await;
    let ids: Vec<&str> = got.iter().map(|t| t.template_id.as_str()).collect();
    assert_eq!(ids, ["shipped", "t1", "t2", "t3"]);
    assert_eq!(got[1].locales, ["en", "zh-CN"]);
    let b_templates = lists::templates(&w.deps, &w.b, 50, None).await.unwrap();
    assert_eq!(b_templates.items.len(), 1, "b has its own template only");
}

#[tokio::test]
async fn a_users_devices_are_listed_across_pages() {
    let w = world().await;
    for i in 0..5 {
        let input = DeviceInput { user_id: "u1".into(), platform: Platform::Ios, token: format!("tok-{i}") };
        devices::register(&w.deps, &w.a, input).await.unwrap();
    }
    let other = DeviceInput { user_id: "u2".into(), platform: Platform::Android, token: "tok-u2".into() };
    devices::register(&w.deps, &w.a, other).await.unwrap();
    let got = all_pages(2, |limit, cursor| {
        let deps = w.deps.clone();
        let a = w.a.clone();
        async move {
            let p = lists::devices(&deps, &a, "u1", limit, cursor).await.unwrap();
            (p.items, p.next_cursor)
        }
    })
    .await;
    let mut tokens: Vec<String> = got.iter().map(|d| d.token.clone()).collect();
    tokens.sort();
    assert_eq!(tokens, (0..5).map(|i| format!("tok-{i}")).collect::<Vec<_>>());
    assert!(lists::devices(&w.deps, &w.b, "u1", 50, None).await.unwrap().items.is_empty(), "another tenant's");
}

#[tokio::test]
async fn notifications_are_listed_newest_first_by_time_and_status() {
    let w = world().await;
    put_user(&w, &w.a, "u1", &[]).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email"])).await.unwrap().notification_id);
        w.clock.advance(chrono::Duration::minutes(10));
    }
    api::accept(&w.deps, &w.b, send(&["u1"], "transactional", &["email"])).await.unwrap();
    let filter = NotificationFilter::default();
    let list = |filter: NotificationFilter, limit: usize| {
        let deps = w.deps.clone();
        let a = w.a.clone();
        all_pages(limit, move |limit, cursor| {
            let (deps, a, filter) = (deps.clone(), a.clone(), filter.clone());
            async move {
                let p = lists::notifications(&deps, &a, &filter, limit, cursor).await.unwrap();
                (p.items.into_iter().map(|v| (v.notification_id, v.status)).collect::<Vec<_>>(), p.next_cursor)
            }
        })
    };
    let mut newest_first = ids.clone();
    newest_first.reverse();
    for limit in [1, 2, 4, 6, 50] {
        let got: Vec<String> = list(filter.clone(), limit).await.into_iter().map(|(id, _)| id).collect();
        assert_eq!(got, newest_first, "pages of {limit}, newest first, b's not among them");
    }
    // Accepted at 10:00, 10:10, ... 10:50: [10:10, 10:30) holds the second and third.
    let at = |m: i64| start() + chrono::Duration::minutes(m);
    let range = NotificationFilter { since: Some(at(10)), until: Some(at(30)), ..Default::default() };
    let got: Vec<String> = list(range, 1).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(got, [ids[2].clone(), ids[1].clone()], "since included, until excluded");
    let since = NotificationFilter { since: Some(at(40) + chrono::Duration::microseconds(1)), ..Default::default() };
    assert_eq!(list(since, 50).await.len(), 1, "a since inside a millisecond starts at the next one");
    // An until before the since is an empty window (no schema states an order between two
    // query parameters, so it is not refused).
    let empty = NotificationFilter { since: Some(at(30)), until: Some(at(10)), ..Default::default() };
    assert!(list(empty, 50).await.is_empty(), "until before since: nothing");

    // Status: as the notification shows it.
    api::cancel(&w.deps, &w.a, &ids[1]).await.unwrap();
    api::cancel(&w.deps, &w.a, &ids[4]).await.unwrap();
    let cancelled = NotificationFilter { status: Some(NotificationStatus::Cancelled), ..Default::default() };
    let got = list(cancelled.clone(), 1).await;
    assert_eq!(got, [(ids[4].clone(), NotificationStatus::Cancelled), (ids[1].clone(), NotificationStatus::Cancelled)]);
    drain(&w.deps, &w.feed, Handling::One).await;
    let completed = NotificationFilter { status: Some(NotificationStatus::Completed), ..Default::default() };
    assert_eq!(list(completed, 2).await.len(), 4, "sent ones show completed, as GET shows them");
    let accepted = NotificationFilter { status: Some(NotificationStatus::Accepted), ..Default::default() };
    assert!(list(accepted, 2).await.is_empty());
}

/// A user with everything: contacts and a tag, preferences, a device, an inbox message, a
/// stock subscription; a notification that reached them.
async fn full_user(w: &World) -> String {
    put_user(w, &w.a, "u1", &["vip"]).await;
    put_user(w, &w.a, "u2", &["vip"]).await;
    let prefs: PreferencesInput = serde_json::from_value(json!({"channels": {"sms": false}})).unwrap();
    preferences::put(&w.deps, &w.a, "u1", prefs).await.unwrap();
    let device = DeviceInput { user_id: "u1".into(), platform: Platform::Ios, token: "tok-1".into() };
    devices::register(&w.deps, &w.a, device).await.unwrap();
    let sub = SubscriptionRequest::new("u1", "sku-1");
    subscriptions::subscribe(&w.deps, &w.a, &sub).await.unwrap();
    let n = api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email", "inapp"])).await.unwrap();
    drain(&w.deps, &w.feed, Handling::One).await;
    assert_eq!(inbox::list(&w.deps, &w.a, "u1", 10, None).await.unwrap().items.len(), 1);
    n.notification_id
}

async fn assert_erased(w: &World) {
    let (deps, t) = (&w.deps, &w.a);
    assert!(users::get_user(deps, t, "u1").await.unwrap().is_none(), "contacts gone");
    let (members, _) = users::segment_page(deps, t, "vip", 50, None).await.unwrap();
    assert_eq!(members.iter().map(|u| u.user_id.as_str()).collect::<Vec<_>>(), ["u2"], "out of the segment");
    let listed = lists::users(deps, t, 50, None).await.unwrap();
    assert_eq!(listed.items.iter().map(|u| u.user_id.as_str()).collect::<Vec<_>>(), ["u2"], "out of the list");
    assert!(deps.table.get(&keys::preferences(t, "u1")).await.unwrap().is_none(), "preferences gone");
    assert!(lists::devices(deps, t, "u1", 50, None).await.unwrap().items.is_empty(), "devices gone");
    let page = inbox::list(deps, t, "u1", 50, None).await.unwrap();
    assert!(page.items.is_empty() && page.unread_count == 0, "inbox gone");
    assert!(
        subscriptions::list_for_user(deps, t, "u1", 50, None).await.unwrap().items.is_empty(),
        "subscriptions gone"
    );
    // Only the erasure record stays in the user's partition.
    let rest = deps.table.query(&keys::user_pk(t, "u1"), "", Default::default()).await.unwrap();
    assert_eq!(rest.items.iter().map(|i| i.key.sk.as_str()).collect::<Vec<_>>(), ["ERASED"]);
    assert!(deps.table.query(&format!("T#{t}#RWAIT#sku-1"), "", Default::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn erasing_a_user_removes_their_data_keeps_the_counts_and_is_idempotent() {
    let w = world().await;
    let n = full_user(&w).await;
    let before = api::get_notification(&w.deps, &w.a, &n).await.unwrap().unwrap();
    assert_eq!(before.counts.sent, 2);
    erasure::erase(&w.deps, &w.a, "u1").await.unwrap();
    assert_erased(&w).await;
    let after = api::get_notification(&w.deps, &w.a, &n).await.unwrap().unwrap();
    assert_eq!(after.counts, before.counts, "a notification's counts stay");
    assert_eq!(after.status, before.status);
    erasure::erase(&w.deps, &w.a, "u1").await.unwrap();
    assert_erased(&w).await;
    // Another tenant's user of the same id is untouched.
    put_user(&w, &w.b, "u1", &[]).await;
    erasure::erase(&w.deps, &w.a, "u1").await.unwrap();
    assert!(users::get_user(&w.deps, &w.b, "u1").await.unwrap().is_some());

    // A notification after the erasure delivers nothing (and writes no inbox), until the user
    // is written again.
    let later = api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email", "inapp"])).await.unwrap();
    drain(&w.deps, &w.feed, Handling::One).await;
    for channel in [Channel::Email, Channel::Inapp] {
        let d = delivery(&w, &later.notification_id, "u1", channel).await;
        assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("erased")), "{channel}");
    }
    assert_erased(&w).await;
    w.clock.advance(chrono::Duration::seconds(1));
    put_user(&w, &w.a, "u1", &[]).await;
    let sent_before = w.email.sent.lock().unwrap().len();
    let again = api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email"])).await.unwrap();
    drain(&w.deps, &w.feed, Handling::One).await;
    assert_eq!(delivery(&w, &again.notification_id, "u1", Channel::Email).await.status, DeliveryStatus::Sent);
    assert_eq!(w.email.sent.lock().unwrap().len(), sent_before + 1, "written again: a recipient again");
}

/// Processes one queue's visible messages once.
async fn run_queue(w: &World, queue: &str) -> usize {
    let got = w.deps.queues.receive(queue, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    for m in &got {
        let outcome = dispatch(&w.deps, queue, m).await;
        settle(w.deps.queues.as_ref(), queue, m, &outcome, w.deps.clock.now(), true).await.unwrap();
    }
    got.len()
}

async fn relay(w: &World) {
    let records = w.feed.next_batch(1000).await.unwrap();
    tidings_core::notify::relay::handle_changes(&w.deps, &records).await.unwrap();
    w.feed.commit(&records).await.unwrap();
}

/// A delivery queued before the erasure (its task carries the address) is not sent after it,
/// on the single path (transactional) and the batch path (marketing): suppressed `erased`, no
/// provider call, and the user stays erased, even once written again with a new address.
#[tokio::test]
async fn queued_work_does_not_bring_an_erased_user_back() {
    let w = world().await;
    put_user(&w, &w.a, "u1", &[]).await;
    put_user(&w, &w.a, "u2", &[]).await;
    let otp = api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email"])).await.unwrap();
    let promo = api::accept(&w.deps, &w.a, send(&["u1", "u2"], "marketing", &["email"])).await.unwrap();
    // Orchestrated: the channel tasks wait in their queues with u1's address in them.
    relay(&w).await;
    assert!(run_queue(&w, "requests-high").await + run_queue(&w, "requests-low").await == 2);
    assert_eq!(delivery(&w, &otp.notification_id, "u1", Channel::Email).await.status, DeliveryStatus::Pending);

    w.clock.advance(chrono::Duration::seconds(1));
    erasure::erase(&w.deps, &w.a, "u1").await.unwrap();
    // Written again at once with another address: the old tasks still do not go to the old one.
    let input = UserInput { email: Some("new@example.com".into()), ..UserInput::default() };
    users::put_user(&w.deps, &w.a, "u1", input).await.unwrap();

    run_queue(&w, "email-high").await;
    let got = w.deps.queues.receive("email-low", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 2, "both marketing tasks in one batch");
    let outcomes = tidings_core::messages::dispatch_batch(&w.deps, "email-low", &got).await;
    tidings_core::messages::settle_batch(w.deps.queues.as_ref(), "email-low", &got, outcomes, w.deps.clock.now(), true)
        .await;
    drain(&w.deps, &w.feed, Handling::One).await;

    let sent: Vec<String> = w.email.sent.lock().unwrap().iter().map(|m| m.to.clone()).collect();
    assert_eq!(sent, ["u2@example.com"], "nothing went to u1's old address");
    for id in [&otp.notification_id, &promo.notification_id] {
        let d = delivery(&w, id, "u1", Channel::Email).await;
        assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("erased")));
    }
    assert_eq!(delivery(&w, &promo.notification_id, "u2", Channel::Email).await.status, DeliveryStatus::Sent);
    let user = users::get_user(&w.deps, &w.a, "u1").await.unwrap().unwrap();
    assert_eq!(user.email.as_deref(), Some("new@example.com"), "the old contact is not back");
    let view = api::get_notification(&w.deps, &w.a, &otp.notification_id).await.unwrap().unwrap();
    assert_eq!((view.status, view.counts.queued, view.counts.suppressed), (NotificationStatus::Completed, 0, 1));
}

/// A notification accepted before the erasure and orchestrated after it: nothing for the user,
/// in-app included (no inbox comes back).
#[tokio::test]
async fn a_notification_accepted_before_the_erasure_and_planned_after_delivers_nothing() {
    let w = world().await;
    put_user(&w, &w.a, "u1", &[]).await;
    let n = api::accept(&w.deps, &w.a, send(&["u1"], "transactional", &["email", "inapp"])).await.unwrap();
    w.clock.advance(chrono::Duration::seconds(1));
    erasure::erase(&w.deps, &w.a, "u1").await.unwrap();
    put_user(&w, &w.a, "u1", &[]).await;
    drain(&w.deps, &w.feed, Handling::One).await;
    for channel in [Channel::Email, Channel::Inapp] {
        let d = delivery(&w, &n.notification_id, "u1", channel).await;
        assert_eq!(d.reason.as_deref(), Some("erased"), "{channel}");
    }
    assert!(w.email.sent.lock().unwrap().is_empty());
    assert!(inbox::list(&w.deps, &w.a, "u1", 10, None).await.unwrap().items.is_empty());
}

/// The template `t` rendered as the orchestrator renders it, for the preview's params.
async fn tpl_render(w: &World, channel: Channel) -> templates::Rendered {
    let tpl = templates::get_template(&w.deps, &w.a, "t").await.unwrap().unwrap();
    let params = json!({"order_id": "1", "name": "<b>", "user_id": "preview", "locale": "zh"});
    tpl.render(channel, Some("zh"), &params).unwrap()
}

fn preview_req(v: Value) -> PreviewRequest {
    serde_json::from_value(v).unwrap()
}

fn invalid_field(e: CoreError) -> String {
    match e {
        CoreError::Invalid { field, .. } | CoreError::MissingParam { field, .. } => field,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_preview_renders_as_a_send_would() {
    let w = world().await;
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {
        "en": {"email_subject": "Order {{ order_id }}", "email_body": "<p>{{ name }}</p>", "sms": "Order {{ order_id }}"},
        "zh-CN": {"sms": "订单 {{ order_id }}"}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.a, "t", input).await.unwrap();
    let p = |v: Value| preview::preview(&w.deps, &w.a, "t", preview_req(v));

    let got = p(json!({"params": {"order_id": "1", "name": "<b>"}, "locale": "zh"})).await.unwrap().unwrap();
    let parts: Vec<(Channel, &str, Option<&str>, Option<&str>)> =
        got.parts.iter().map(|x| (x.channel, x.locale.as_str(), x.subject.as_deref(), x.html.as_deref())).collect();
    assert_eq!(
        parts,
        [(Channel::Email, "en", Some("Order 1"), Some("<p>&lt;b&gt;</p>")), (Channel::Sms, "zh-CN", None, None)],
        "the language finds zh-CN; email falls back to the default; the HTML part is escaped"
    );
    assert_eq!(got.parts[1].body, "订单 1");
    let email = tpl_render(&w, Channel::Email).await;
    assert_eq!((email.body, email.html), (got.parts[0].body.clone(), got.parts[0].html.clone()), "both parts as sent");
    // The same renderer as a send.
    let tpl = templates::get_template(&w.deps, &w.a, "t").await.unwrap().unwrap();
    let params = json!({"order_id": "1", "name": "<b>", "user_id": "preview", "locale": "zh"});
    assert_eq!(tpl.render(Channel::Sms, Some("zh"), &params).unwrap().body, got.parts[1].body);

    let e = p(json!({"params": {"order_id": "1"}, "channels": ["email"]})).await.unwrap_err();
    assert!(matches!(&e, CoreError::MissingParam { .. }), "{e:?}");
    assert_eq!(invalid_field(e), "params.name");
    let e = p(json!({"params": {"order_id": "1", "name": "a"}, "locale": "fr"})).await.unwrap_err();
    assert_eq!(invalid_field(e), "locale");
    let e = p(json!({"params": {"order_id": "1", "name": "a"}, "locale": "x y"})).await.unwrap_err();
    assert_eq!(invalid_field(e), "locale");
    let e = p(json!({"params": {"order_id": "1"}, "channels": ["sms", "push"]})).await.unwrap_err();
    assert_eq!(invalid_field(e), "channels[1]");
    let e = p(json!({"params": {"order_id": "x".repeat(templates::MAX_VALUE_BYTES + 1)}, "channels": ["sms"]}))
        .await
        .unwrap_err();
    assert_eq!(invalid_field(e), "params", "a limit, as a send meets it");
    let only_sms = p(json!({"params": {"order_id": "2"}, "channels": ["sms"]})).await.unwrap().unwrap();
    assert_eq!(only_sms.parts.len(), 1);
    let missing = preview::preview(&w.deps, &w.a, "nope", preview_req(json!({}))).await.unwrap();
    assert!(missing.is_none());
    let other = preview::preview(&w.deps, &w.b, "t", preview_req(json!({}))).await.unwrap();
    assert!(other.is_none(), "another tenant's template is not found");
}
