//! Marketing push deliveries recorded per send batch (docs/delivery.md, "Send batches"), against
//! the embedded store: each member once, a retried page makes no second batch, a batch is
//! claimed once and a claim that outlived its lease is closed without a send, retryable
//! answers retry only their entries, counters stay exact, cancel and erasure stop what is not
//! sent, the deliveries list shows the entries like deliveries, the dead-letter view explains
//! a batch message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::messages::{dispatch, settle};
use tidings_core::notify::api::{self, NotificationView};
use tidings_core::notify::batch::{BatchStatus, SendBatch};
use tidings_core::notify::model::{ChannelMessage, DeliveryStatus, NotificationRequest, NotificationStatus};
use tidings_core::notify::relay;
use tidings_core::people::devices::{self, DeviceInput};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{
    ChangeFeed, Cond, Key, OutMessage, OutboundMessage, Platform, Provider, ProviderError, ProviderReceipt, QueryOpts,
    Table, Update,
};
use tidings_core::{CoreConfig, Deps, TenantId, keys, templates};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::{Around, Call, TestWorld, Wrapped};

/// A push provider that counts what it accepted per user, and answers 429 to the users in
/// `throttle` (each as often as its count says).
#[derive(Default)]
struct Push {
    sends: Mutex<HashMap<String, u32>>,
    throttle: Mutex<HashMap<String, u32>>,
    always_fail: Mutex<bool>,
}

impl Push {
    fn total(&self) -> u32 {
        self.sends.lock().unwrap().values().sum()
    }
    fn users(&self) -> usize {
        self.sends.lock().unwrap().len()
    }
    fn max_per_user(&self) -> u32 {
        self.sends.lock().unwrap().values().copied().max().unwrap_or(0)
    }
}

#[async_trait]
impl Provider for Push {
    fn name(&self) -> &str {
        "fake-push"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        if *self.always_fail.lock().unwrap() {
            return Err(ProviderError::transient("provider answered 503"));
        }
        if let Some(left) = self.throttle.lock().unwrap().get_mut(&m.user_id)
            && *left > 0
        {
            *left -= 1;
            return Err(ProviderError::Transient { reason: "throttled (429)".into(), retry_after: None });
        }
        *self.sends.lock().unwrap().entry(m.user_id.clone()).or_default() += 1;
        Ok(ProviderReceipt { provider_message_id: format!("push-{}", m.idempotency_key) })
    }
}

struct World {
    deps: Deps,
    store: EmbeddedStore,
    feed: tidings_embedded::EmbeddedChangeFeed,
    clock: Arc<tidings_core::ports::ManualClock>,
    push: Arc<Push>,
    t: TenantId,
}

fn world_with(config: CoreConfig, max_receives: u32) -> World {
    let push = Arc::new(Push::default());
    let tw = TestWorld::builder().all_queues(max_receives).push(push.clone()).config(config).build();
    World {
        feed: tw.feed("relay"),
        clock: tw.clock(),
        deps: tw.deps,
        store: tw.store,
        push,
        t: TenantId::parse("shop-a").unwrap(),
    }
}

fn world(page_size: usize) -> World {
    world_with(
        CoreConfig {
            campaign_page_size: page_size,
            frequency_cap: 100,
            retry_base: Duration::from_secs(1),
            ..CoreConfig::default()
        },
        5,
    )
}

/// `n` members of `tag` with a device each; every tenth has none (suppressed `no_address`).
async fn members(w: &World, n: usize, tag: &str) -> usize {
    let mut with_device = 0;
    for i in 0..n {
        let user_id = format!("u{i:04}");
        let input = UserInput { tags: vec![tag.to_owned()], ..Default::default() };
        users::put_user(&w.deps, &w.t, &user_id, input).await.unwrap();
        if i % 10 != 7 {
            let input = DeviceInput { user_id: user_id.clone(), platform: Platform::Ios, token: format!("tok-{i}") };
            devices::register(&w.deps, &w.t, input).await.unwrap();
            with_device += 1;
        }
    }
    let input = serde_json::from_value(json!({
        "default_locale": "en",
        "locales": {"en": {"push_title": "Sale", "push_body": "Hello {{ user_id }}"}}
    }))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "promo", input).await.unwrap();
    with_device
}

fn campaign(key: &str, segment: &str) -> NotificationRequest {
    serde_json::from_value(json!({
        "idempotency_key": key,
        "recipients": {"segment": segment},
        "template_id": "promo",
        "category": "marketing",
        "channels": ["push"],
    }))
    .unwrap()
}

async fn drain(w: &World) {
    tidings_embedded::test_world::drain(&w.deps, &w.feed).await;
}

/// Drains, moving the clock past retries' backoffs, until nothing is left.
async fn drain_with_time(w: &World) {
    for _ in 0..12 {
        drain(w).await;
        w.clock.advance(chrono::Duration::minutes(20));
    }
    drain(w).await;
}

async fn view(w: &World, id: &str) -> NotificationView {
    api::get_notification(&w.deps, &w.t, id).await.unwrap().unwrap()
}

async fn batches(w: &World, id: &str) -> Vec<(Key, SendBatch)> {
    let pk = keys::notification_pk(&w.t, id);
    let page = w.store.query(&pk, "B#", QueryOpts { limit: 1000, cursor: None, descending: false }).await.unwrap();
    page.items.into_iter().map(|i| (i.key.clone(), i.parse().unwrap())).collect()
}

/// Relays and runs only the request queue (the pages), keeping what the channel lane gets.
async fn expand(w: &World) -> Vec<String> {
    let mut requests = Vec::new();
    loop {
        let records = w.feed.next_batch(1000).await.unwrap();
        if !records.is_empty() {
            relay::handle_changes(&w.deps, &records).await.unwrap();
            w.feed.commit(&records).await.unwrap();
        }
        let got = w.deps.queues.receive("requests-low", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        if got.is_empty() && records.is_empty() {
            return requests;
        }
        for m in &got {
            requests.push(m.body.clone());
            let outcome = dispatch(&w.deps, "requests-low", m).await;
            settle(w.deps.queues.as_ref(), "requests-low", m, &outcome, w.deps.clock.now(), true).await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_push_campaign_goes_out_in_batches_once_each_with_exact_progress() {
    let w = world(100);
    let reachable = members(&w, 230, "vip").await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-1", "vip")).await.unwrap();
    let id = accepted.notification_id;
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable, "every reachable member once");
    assert_eq!(w.push.users(), reachable);
    assert_eq!(w.push.max_per_user(), 1);
    let v = view(&w, &id).await;
    assert_eq!(v.status, NotificationStatus::Completed, "{v:?}");
    assert_eq!(v.counts.sent as usize, reachable);
    assert_eq!(v.counts.suppressed as usize, 230 - reachable);
    assert_eq!(v.counts.queued, 0);
    // One item per batch of up to 25, none per push delivery sent.
    let made = batches(&w, &id).await;
    assert!(made.iter().all(|(_, b)| b.entries.len() <= 25 && b.status == BatchStatus::Done));
    assert_eq!(made.iter().map(|(_, b)| b.entries.len()).sum::<usize>(), reachable);
    // Pages of 100: 90, 90 and 27 members with a device, so 4 + 4 + 2 batches.
    assert_eq!(made.len(), 10, "{:?}", made.iter().map(|(k, b)| (&k.sk, b.entries.len())).collect::<Vec<_>>());
    let pk = keys::notification_pk(&w.t, &id);
    let ds = w.store.query(&pk, "D#", QueryOpts { limit: 1000, cursor: None, descending: false }).await.unwrap();
    assert_eq!(ds.items.len(), 230 - reachable, "only the suppressed have a delivery item");
}

/// A batch's sends are told to the endpoints subscribed to `delivery.sent`, one event per member
/// sent, recorded with the batch's outcomes; a tenant whose endpoint wants another type gets
/// none (the events are made only when wanted: `webhooks::delivery_event_writes`).
#[tokio::test]
async fn a_batchs_sends_are_told_to_the_endpoints_that_want_them_only() {
    use tidings_core::webhooks::{self, EVENT_SK, EndpointInput, EventType};
    let w = world(100);
    let audit = w.store.change_feed("audit");
    let reachable = members(&w, 30, "vip").await;
    let endpoint =
        |events: Vec<EventType>| EndpointInput { url: "https://93.184.216.34/hooks".into(), events, rate_limit: None };
    let events_written = || async {
        let records = audit.next_batch(10_000).await.unwrap();
        audit.commit(&records).await.unwrap();
        records
            .into_iter()
            .filter(|r| r.key.sk == EVENT_SK && r.is_insert())
            .map(|r| r.new.unwrap().get("event").cloned().unwrap())
            .collect::<Vec<_>>()
    };
    let other = webhooks::create(&w.deps, &w.t, endpoint(vec![EventType::OrderExpired])).await.unwrap();
    api::accept(&w.deps, &w.t, campaign("told-none", "vip")).await.unwrap();
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    assert!(events_written().await.is_empty(), "no endpoint wants delivery.sent: no event");

    webhooks::delete(&w.deps, &w.t, &other.endpoint.endpoint_id).await.unwrap();
    webhooks::create(&w.deps, &w.t, endpoint(vec![EventType::DeliverySent])).await.unwrap();
    let id = api::accept(&w.deps, &w.t, campaign("told-all", "vip")).await.unwrap().notification_id;
    drain(&w).await;
    let events = events_written().await;
    assert_eq!(events.len(), reachable, "one per member sent: {events:?}");
    let mut told: Vec<&str> = events.iter().filter_map(|e| e["data"]["user_id"].as_str()).collect();
    told.sort_unstable();
    told.dedup();
    assert_eq!(told.len(), reachable, "each member once");
    for e in &events {
        assert_eq!((e["type"].as_str(), e["data"]["channel"].as_str()), (Some("delivery.sent"), Some("push")), "{e}");
        assert_eq!(e["data"]["notification_id"].as_str(), Some(id.as_str()), "{e}");
    }
}

#[tokio::test]
async fn the_deliveries_list_shows_batch_entries_in_user_order_and_pages_them() {
    let w = world(40);
    members(&w, 95, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-2", "vip")).await.unwrap().notification_id;
    drain(&w).await;
    let all = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    assert!(all.next_cursor.is_none());
    let users: Vec<&str> = all.items.iter().map(|d| d.user_id.as_str()).collect();
    let expected: Vec<String> = (0..95).map(|i| format!("u{i:04}")).collect();
    assert_eq!(users, expected, "every member once, batch entries and delivery items merged in user order");
    for d in &all.items {
        let want = if d.user_id.ends_with('7') { DeliveryStatus::Suppressed } else { DeliveryStatus::Sent };
        assert_eq!(d.status, want, "{d:?}");
        assert_eq!(d.channel, tidings_core::ports::Channel::Push);
        if want == DeliveryStatus::Sent {
            assert_eq!(d.attempts, 1);
            assert!(d.sent_at.is_some() && d.provider_message_id.is_some(), "{d:?}");
        }
    }
    // The same JSON shape as a delivery item's.
    let sent = all.items.iter().find(|d| d.status == DeliveryStatus::Sent).unwrap();
    let shape = serde_json::to_value(sent).unwrap();
    for field in
        ["user_id", "channel", "status", "attempts", "sent_at", "provider_message_id", "category", "updated_at"]
    {
        assert!(shape.get(field).is_some(), "{field} in {shape}");
    }
    // Paged by 7: the same list.
    let mut paged = Vec::new();
    let mut cursor = None;
    for _ in 0..100 {
        let page = api::list_deliveries(&w.deps, &w.t, &id, 7, cursor).await.unwrap().unwrap();
        assert!(page.items.len() <= 7);
        paged.extend(page.items.into_iter().map(|d| d.user_id));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(paged, expected);
    // A cursor it never gave is refused as invalid input.
    let bad = api::list_deliveries(&w.deps, &w.t, &id, 7, Some("m1.!!!".into())).await;
    assert!(matches!(bad, Err(tidings_core::CoreError::Invalid { .. })), "{bad:?}");
}

#[tokio::test]
async fn a_retried_or_redriven_page_makes_no_second_batch() {
    let w = world(50);
    let reachable = members(&w, 120, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-3", "vip")).await.unwrap().notification_id;
    let requests = expand(&w).await;
    assert_eq!(requests.len(), 3, "pages of 50, 50 and 20");
    let made = batches(&w, &id).await;
    // Every page again before anything is sent (a retried page whose task came back), one with
    // its done marker removed (a page that stopped before it was marked): the batches stay.
    let done = Key::new(keys::notification_pk(&w.t, &id), "C#00000001#done");
    Table::delete(&w.store, &done, Cond::Exists).await.unwrap();
    let messages = requests.iter().map(|b| OutMessage::new(b.clone())).collect();
    w.deps.queues.send_batch("requests-low", messages).await.unwrap();
    drain(&w).await;
    assert_eq!(batches(&w, &id).await.len(), made.len(), "no second batch");
    assert_eq!(w.push.total() as usize, reachable, "each member once");
    assert_eq!(w.push.max_per_user(), 1);
    let v = view(&w, &id).await;
    assert_eq!(v.counts.sent as usize, reachable, "{v:?}");
    assert_eq!(v.counts.queued, 0);
    assert_eq!(v.expanded, 120);
    assert_eq!(v.status, NotificationStatus::Completed);
    // Membership fixed at creation.
    let after = batches(&w, &id).await;
    for ((_, a), (_, b)) in made.iter().zip(&after) {
        let users = |b: &SendBatch| b.entries.iter().map(|e| e.user_id.clone()).collect::<Vec<_>>();
        assert_eq!(users(a), users(b));
    }
    // The frequency cap counted each member once (the retried page found its own marks).
    let user = users::get_user(&w.deps, &w.t, "u0000").await.unwrap();
    let zone = user.as_ref().and_then(|u| u.timezone.as_deref());
    let cap = tidings_core::notify::policy::cap_key(
        &w.t,
        "u0000",
        zone,
        tidings_core::ports::Channel::Push,
        w.deps.clock.now(),
    );
    assert_eq!(w.store.get(&cap).await.unwrap().unwrap().i64("count"), Some(1));
}

/// A page run once more after its first run created its batches but stopped before queueing
/// them (a crash after the page's transactions): the pending batches are queued again.
#[tokio::test]
async fn a_page_that_stopped_before_queueing_its_batches_queues_them_when_retried() {
    let w = world(100);
    let reachable = members(&w, 60, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-4", "vip")).await.unwrap().notification_id;
    let requests = expand(&w).await;
    // Lose what the page queued, and its done marker, as a crash before the sends would.
    let lost = w.deps.queues.receive("push-low", 10, Duration::from_secs(600), Duration::ZERO).await.unwrap();
    assert_eq!(lost.len(), 3, "54 members with a device: batches of 25, 25 and 4");
    let done = Key::new(keys::notification_pk(&w.t, &id), "C#00000000#done");
    Table::delete(&w.store, &done, Cond::Exists).await.unwrap();
    w.deps.queues.send_batch("requests-low", vec![OutMessage::new(requests[0].clone())]).await.unwrap();
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    assert_eq!(w.push.max_per_user(), 1);
    // The lost messages coming back after all (their visibility ran out) send nothing more.
    w.clock.advance(chrono::Duration::minutes(15));
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    assert_eq!(view(&w, &id).await.counts.sent as usize, reachable);
}

#[tokio::test]
async fn a_duplicate_batch_message_sends_nothing_twice() {
    let w = world(100);
    let reachable = members(&w, 50, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-5", "vip")).await.unwrap().notification_id;
    expand(&w).await;
    // SQS may deliver a message twice: every batch message once more.
    let got = w.deps.queues.receive("push-low", 10, Duration::from_secs(0), Duration::ZERO).await.unwrap();
    assert!(!got.is_empty());
    for m in &got {
        assert!(matches!(serde_json::from_str::<ChannelMessage>(&m.body).unwrap(), ChannelMessage::Batch(_)));
    }
    let copies = got.iter().map(|m| OutMessage::new(m.body.clone())).collect();
    w.deps.queues.send_batch("push-low", copies).await.unwrap();
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    assert_eq!(w.push.max_per_user(), 1);
    assert_eq!(view(&w, &id).await.counts.sent as usize, reachable);
}

#[tokio::test]
async fn a_claim_that_outlived_its_lease_is_closed_as_outcome_unknown_not_sent() {
    let w = world(100);
    let reachable = members(&w, 30, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-6", "vip")).await.unwrap().notification_id;
    expand(&w).await;
    let made = batches(&w, &id).await;
    let (key, _) = &made[0];
    // A worker claimed the first batch and stopped before its record.
    let now_ms = w.deps.clock.now_ms();
    let claim =
        vec![Update::set("status", "sending"), Update::add("claims", 1), Update::set("lease_until_ms", now_ms + 1000)];
    w.store.update(key, claim, Cond::eq("status", "pending")).await.unwrap();
    // While the lease runs, its message waits; once it ran out the batch is closed.
    drain(&w).await;
    let first = made[0].1.entries.len();
    assert_eq!(w.push.total() as usize, reachable - first, "the claimed batch is not sent by another worker");
    w.clock.advance(chrono::Duration::minutes(10));
    drain_with_time(&w).await;
    assert_eq!(w.push.total() as usize, reachable - first, "never sent again");
    let (_, closed) = batches(&w, &id).await.into_iter().next().unwrap();
    assert_eq!(closed.status, BatchStatus::Done);
    for e in &closed.entries {
        assert_eq!(e.status, DeliveryStatus::Failed);
        assert_eq!(e.reason.as_deref(), Some("outcome_unknown"));
    }
    let v = view(&w, &id).await;
    assert_eq!(v.counts.failed as usize, first, "{v:?}");
    assert_eq!(v.counts.sent as usize, reachable - first);
    assert_eq!(v.status, NotificationStatus::CompletedWithFailures, "some sent, the closed batch's failed");
}

#[tokio::test]
async fn retryable_answers_retry_only_their_entries() {
    let w = world(100);
    let reachable = members(&w, 40, "vip").await;
    for u in ["u0001", "u0002", "u0030"] {
        w.push.throttle.lock().unwrap().insert(u.into(), 2);
    }
    let id = api::accept(&w.deps, &w.t, campaign("sale-7", "vip")).await.unwrap().notification_id;
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable - 3, "the throttled wait for their retry");
    let v = view(&w, &id).await;
    assert_eq!(v.counts.queued, 3, "{v:?}");
    drain_with_time(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    assert_eq!(w.push.max_per_user(), 1, "the others are not sent again");
    let list = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    for d in list.items.iter().filter(|d| d.status == DeliveryStatus::Sent) {
        let throttled = ["u0001", "u0002", "u0030"].contains(&d.user_id.as_str());
        assert_eq!(d.attempts, if throttled { 3 } else { 1 }, "{d:?}");
    }
    let v = view(&w, &id).await;
    assert_eq!((v.counts.sent as usize, v.counts.queued), (reachable, 0));
    assert_eq!(v.status, NotificationStatus::Completed);
}

#[tokio::test]
async fn cancel_and_erasure_stop_entries_not_yet_sent() {
    let w = world(100);
    let reachable = members(&w, 30, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-8", "vip")).await.unwrap().notification_id;
    expand(&w).await;
    api::cancel(&w.deps, &w.t, &id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // the workers' status cache
    drain(&w).await;
    assert_eq!(w.push.total(), 0, "nothing sent after the cancel");
    let v = view(&w, &id).await;
    assert_eq!(v.counts.suppressed, 30, "{v:?}");
    assert_eq!(v.counts.queued, 0);
    let list = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    assert_eq!(list.items.iter().filter(|d| d.reason.as_deref() == Some("cancelled")).count(), reachable);

    let w = world(100);
    let reachable = members(&w, 30, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-9", "vip")).await.unwrap().notification_id;
    expand(&w).await;
    tidings_core::people::erasure::erase(&w.deps, &w.t, "u0003").await.unwrap();
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable - 1);
    assert!(!w.push.sends.lock().unwrap().contains_key("u0003"), "not sent to an erased user");
    let list = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    let erased = list.items.iter().find(|d| d.user_id == "u0003").unwrap();
    assert_eq!((erased.status, erased.reason.as_deref()), (DeliveryStatus::Suppressed, Some("erased")));
    let v = view(&w, &id).await;
    assert_eq!((v.counts.sent as usize, v.counts.suppressed), (reachable - 1, 4), "{v:?}");
}

#[tokio::test]
async fn the_frequency_cap_still_holds_for_batched_sends() {
    let w = world_with(CoreConfig { frequency_cap: 1, ..CoreConfig::default() }, 5);
    let reachable = members(&w, 20, "vip").await;
    let first = api::accept(&w.deps, &w.t, campaign("sale-10", "vip")).await.unwrap().notification_id;
    drain(&w).await;
    let second = api::accept(&w.deps, &w.t, campaign("sale-11", "vip")).await.unwrap().notification_id;
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable, "one a day");
    assert_eq!(view(&w, &first).await.counts.sent as usize, reachable);
    let v = view(&w, &second).await;
    assert_eq!((v.counts.sent, v.counts.suppressed), (0, 20), "{v:?}");
    assert!(batches(&w, &second).await.is_empty());
    let list = api::list_deliveries(&w.deps, &w.t, &second, 1000, None).await.unwrap().unwrap();
    assert_eq!(list.items.iter().filter(|d| d.reason.as_deref() == Some("frequency_cap")).count(), reachable);
}

#[tokio::test]
async fn a_dead_batch_is_explained_on_its_dlq_and_redriven_once() {
    let w = world_with(
        CoreConfig {
            frequency_cap: 100,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(2),
            max_receives: 2,
            ..CoreConfig::default()
        },
        2,
    );
    let reachable = members(&w, 10, "vip").await;
    *w.push.always_fail.lock().unwrap() = true;
    let id = api::accept(&w.deps, &w.t, campaign("sale-12", "vip")).await.unwrap().notification_id;
    drain_with_time(&w).await;
    let v = view(&w, &id).await;
    assert_eq!(v.counts.dead as usize, reachable, "{v:?}");
    let dead = w.deps.queues.peek_dlq("push-low", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = tidings_core::ops::dead_letters::explain(&w.deps, &dead[0]).await;
    assert_eq!(letter.kind, "send_batch");
    assert_eq!(letter.notification_id.as_deref(), Some(id.as_str()));
    assert_eq!(letter.delivery_status.as_deref(), Some("dead"));
    assert!(letter.reason.contains(&format!("{reachable} dead")), "{}", letter.reason);
    assert!(letter.reason.contains("503"), "{}", letter.reason);
    assert!(!letter.reason.contains("Hello"), "no content: {}", letter.reason);
    // Redriven once the provider is back: each sent once.
    *w.push.always_fail.lock().unwrap() = false;
    assert_eq!(w.deps.queues.redrive("push-low").await.unwrap(), 1);
    drain(&w).await;
    assert_eq!(w.push.total() as usize, reachable);
    let v = view(&w, &id).await;
    assert_eq!((v.counts.sent as usize, v.counts.dead, v.counts.queued), (reachable, 0, 0), "{v:?}");
    assert_eq!(v.status, NotificationStatus::Completed);
}

/// Marketing SMS goes out in send batches too (no receipts or tracked links name an SMS
/// delivery, so nothing needs its own item): each member with a number once, counts exact,
/// the deliveries list shows every member, and only the suppressed have a `D#` item.
#[tokio::test]
async fn an_sms_campaign_goes_out_in_batches_once_each() {
    let sms = Arc::new(Push::default());
    let tw = TestWorld::builder()
        .all_queues(5)
        .sms(sms.clone())
        .config(CoreConfig { campaign_page_size: 100, frequency_cap: 100, ..CoreConfig::default() })
        .build();
    let (feed, t) = (tw.feed("relay"), TenantId::parse("shop-a").unwrap());
    let (deps, store) = (tw.deps, tw.store);
    let mut reachable = 0;
    for i in 0..130 {
        let phone = (i % 10 != 3).then(|| format!("+86138{i:08}"));
        reachable += usize::from(phone.is_some());
        let input = UserInput { tags: vec!["vip".into()], phone, ..Default::default() };
        users::put_user(&deps, &t, &format!("u{i:04}"), input).await.unwrap();
    }
    let template =
        serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {"sms": "Sale for {{ user_id }}"}}}));
    templates::put_template(&deps, &t, "promo", template.unwrap()).await.unwrap();
    let mut request = campaign("sms-sale", "vip");
    request.channels = Some(vec![tidings_core::ports::Channel::Sms]);
    let id = api::accept(&deps, &t, request).await.unwrap().notification_id;
    tidings_embedded::test_world::drain(&deps, &feed).await;

    assert_eq!((sms.total() as usize, sms.users(), sms.max_per_user()), (reachable, reachable, 1));
    let v = api::get_notification(&deps, &t, &id).await.unwrap().unwrap();
    assert_eq!(v.status, NotificationStatus::Completed, "{v:?}");
    assert_eq!(
        (v.counts.sent as usize, v.counts.suppressed as usize, v.counts.queued),
        (reachable, 130 - reachable, 0)
    );
    let pk = keys::notification_pk(&t, &id);
    let all = QueryOpts { limit: 1000, cursor: None, descending: false };
    let made = store.query(&pk, "B#", all.clone()).await.unwrap().items;
    let entries: usize = made.iter().map(|i| i.parse::<SendBatch>().unwrap().entries.len()).sum();
    assert_eq!(entries, reachable, "every SMS sent is an entry of a batch");
    let ds = store.query(&pk, "D#", all).await.unwrap().items;
    assert_eq!(ds.len(), 130 - reachable, "only the suppressed have a delivery item");
    let listed = api::list_deliveries(&deps, &t, &id, 500, None).await.unwrap().unwrap();
    assert_eq!(listed.items.len(), 130, "every member listed");
    assert_eq!(listed.items.iter().filter(|d| d.status == DeliveryStatus::Sent).count(), reachable);
}

/// Two runs of one page at the same time (SQS handed its message to two orchestrators, or a
/// visibility timeout ran out) must not both plan it: a member could land in a different batch
/// in each and be sent twice. While one run holds the page's lease, another plans nothing and
/// its message comes back; once the lease ran out (a crashed run) the page is planned, each
/// member once.
#[tokio::test]
async fn a_page_another_run_holds_is_planned_only_after_its_lease() {
    use tidings_core::notify::batch::lease_page;
    let w = world(100);
    let reachable = members(&w, 60, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-lease", "vip")).await.unwrap().notification_id;
    let hold = w.deps.config.visibility.as_millis() as i64;
    let other = lease_page(&w.store, &w.t, &id, 0, w.deps.clock.now_ms(), hold).await.unwrap();
    assert!(other.is_some(), "the page is free at first");
    assert!(
        lease_page(&w.store, &w.t, &id, 0, w.deps.clock.now_ms(), hold).await.unwrap().is_none(),
        "a held lease is not taken twice"
    );
    expand(&w).await;
    assert!(batches(&w, &id).await.is_empty(), "nothing planned while another run holds the page");
    drain(&w).await;
    assert_eq!(w.push.total(), 0);
    // The other run died: its lease runs out, the message's retry plans the page.
    w.clock.advance(chrono::Duration::milliseconds(hold + 1));
    drain_with_time(&w).await;
    assert_eq!((w.push.total() as usize, w.push.max_per_user()), (reachable, 1));
    let v = view(&w, &id).await;
    assert_eq!((v.status, v.counts.sent as usize), (NotificationStatus::Completed, reachable), "{v:?}");
    // A run that ends lets its page go: a redrive right after it is not held up.
    assert!(lease_page(&w.store, &w.t, &id, 0, w.deps.clock.now_ms(), hold).await.unwrap().is_some());
}

/// A run that outlived its lease (another run took the page since) creates no batch: each of
/// its creating transactions checks the lease.
#[tokio::test]
async fn a_run_that_lost_its_page_lease_creates_no_batch() {
    use tidings_core::notify::batch::{lease_page, pack, write_batches};
    use tidings_core::notify::model::{Category, ChannelTask, Notification};
    let w = world(100);
    members(&w, 3, "vip").await;
    let id = api::accept(&w.deps, &w.t, campaign("sale-lost", "vip")).await.unwrap().notification_id;
    let n: Notification = w.store.get(&keys::notification(&w.t, &id)).await.unwrap().unwrap().parse().unwrap();
    let hold = 1_000;
    let mine = lease_page(&w.store, &w.t, &id, 0, w.deps.clock.now_ms(), hold).await.unwrap().unwrap();
    w.clock.advance(chrono::Duration::milliseconds(hold + 1));
    let theirs = lease_page(&w.store, &w.t, &id, 0, w.deps.clock.now_ms(), hold).await.unwrap();
    assert!(theirs.is_some(), "an expired lease is taken by the next run");
    let sends: Vec<ChannelTask> = (0..3)
        .map(|i| ChannelTask {
            tenant: w.t.clone(),
            notification_id: id.clone(),
            user_id: format!("u{i:04}"),
            channel: tidings_core::ports::Channel::Push,
            category: Category::Marketing,
            to: format!("u{i:04}"),
            subject: Some("Sale".into()),
            body: "Hello".into(),
            html: None,
            headers: Vec::new(),
            accepted_ms: Some(0),
            priority: None,
            one_attempt: false,
            step: None,
            wake: false,
        })
        .collect();
    let packed = pack(&w.t, &n, 0, 0, sends.clone(), "now");
    let written = write_batches(&w.store, &w.t, &id, w.deps.clock.now_ms(), &mine, packed).await;
    assert!(written.is_err(), "the lost lease stops the creation");
    assert!(batches(&w, &id).await.is_empty(), "no batch created");
    let packed = pack(&w.t, &n, 0, 0, sends, "now");
    let written = write_batches(&w.store, &w.t, &id, w.deps.clock.now_ms(), &theirs.unwrap(), packed).await.unwrap();
    assert_eq!(written.len(), 1, "the holder creates its batch");
}

/// Counts the device reads of the table it wraps: queries of a user's devices asked one by
/// one, and `query_many` calls with how many queries they carried.
#[derive(Default)]
struct DeviceReads {
    one_by_one: std::sync::atomic::AtomicUsize,
    many_calls: std::sync::atomic::AtomicUsize,
    many_queries: std::sync::atomic::AtomicUsize,
}

impl DeviceReads {
    fn load(n: &std::sync::atomic::AtomicUsize) -> usize {
        n.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait]
impl Around for DeviceReads {
    async fn before(&self, call: Call<'_>) -> Result<(), tidings_core::ports::StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        match call {
            Call::Query(_, prefix) if prefix == keys::DEVICE_SK_PREFIX => {
                self.one_by_one.fetch_add(1, SeqCst);
            }
            Call::QueryMany(queries) => {
                self.many_calls.fetch_add(1, SeqCst);
                self.many_queries.fetch_add(queries.len(), SeqCst);
            }
            _ => {}
        }
        Ok(())
    }
}

/// A push campaign reads its members' devices once per page (for planning) and once per send
/// batch (after its claim, for the sends), never user by user; the sends go to every device a
/// member has when the batch is sent (a member's second device gets it too, a device removed
/// after planning does not).
#[tokio::test]
async fn a_push_campaign_reads_devices_per_page_and_per_batch_not_per_user() {
    let mut w = world(100);
    let reachable = members(&w, 120, "vip").await;
    let second = DeviceInput { user_id: "u0001".into(), platform: Platform::Android, token: "tok-1b".into() };
    devices::register(&w.deps, &w.t, second).await.unwrap();
    let reads = Arc::new(Wrapped::new(w.deps.table.clone(), DeviceReads::default()));
    w.deps.table = reads.clone();
    let reads = &reads.around;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-devices", "vip")).await.unwrap();
    let id = accepted.notification_id;
    expand(&w).await;
    let planned = DeviceReads::load(&reads.many_queries);
    assert_eq!(planned, 120, "planning asked every member's devices once, in pages");
    // u0002 removes its only device after planning, before its batch is sent.
    devices::unregister(&w.deps, &w.t, "tok-2").await.unwrap();
    drain(&w).await;
    assert_eq!(DeviceReads::load(&reads.one_by_one), 0, "no member's devices were read alone");
    let made = batches(&w, &id).await;
    // Pages of 100 (two), then one read per batch of the members it sends to.
    assert_eq!(DeviceReads::load(&reads.many_calls), 2 + made.len(), "{made:?}");
    assert_eq!(DeviceReads::load(&reads.many_queries), planned + reachable);
    let sends = w.push.sends.lock().unwrap().clone();
    assert_eq!(sends.get("u0001"), Some(&2), "both devices of u0001");
    assert_eq!(sends.get("u0002"), None, "the device removed before the send");
    assert_eq!(w.push.total() as usize, reachable - 1 + 1);
    assert_eq!(w.push.users(), reachable - 1);
}
