//! Campaigns against the embedded store: paged expansion over the tag index, idempotent pages,
//! progress counters, cancel; the gates in front of the providers (docs/delivery.md, "Campaigns";
//! docs/gates.md; issue 6).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::json;
use tidings_core::gates::{self, BreakerConfig, BreakerState, GateConfig, GateStore, RateGate};
use tidings_core::messages::{ALL_QUEUES, dispatch, settle};
use tidings_core::notify::api::{self, NotificationView};
use tidings_core::notify::model::{DeliveryStatus, NotificationRequest, NotificationStatus};
use tidings_core::notify::relay;
use tidings_core::outcome::Outcome;
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{self, StoreError};
use tidings_core::ports::{
    ChangeFeed, Channel, ManualClock, OutMessage, OutboundMessage, Provider, ProviderError, ProviderReceipt,
};
use tidings_core::{CoreConfig, Deps, Providers, TenantId, templates};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::{HookedSends, SendHook, TestWorld};

/// A provider that counts what it accepted, per user, and can be told to fail.
#[derive(Default)]
struct Recording {
    name: String,
    sends: Mutex<HashMap<String, u32>>,
    failing: Mutex<bool>,
}

impl Recording {
    fn named(name: &str) -> Arc<Self> {
        Arc::new(Self { name: name.into(), ..Default::default() })
    }
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
impl Provider for Recording {
    fn name(&self) -> &str {
        &self.name
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        if *self.failing.lock().unwrap() {
            return Err(ProviderError::transient("provider answered 503"));
        }
        *self.sends.lock().unwrap().entry(m.user_id.clone()).or_default() += 1;
        Ok(ProviderReceipt { provider_message_id: format!("{}-{}", self.name, m.idempotency_key) })
    }
}

struct World {
    deps: Deps,
    store: EmbeddedStore,
    feed: tidings_embedded::EmbeddedChangeFeed,
    email: Arc<Recording>,
    t: TenantId,
}

const START: &str = "2026-11-29T12:00:00Z";

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(START).unwrap().with_timezone(&Utc)
}

fn world(page_size: usize) -> World {
    let email = Recording::named("fake-email");
    let other: Arc<dyn Provider> = Recording::named("fake-other");
    let config = CoreConfig { campaign_page_size: page_size, frequency_cap: 100, ..CoreConfig::default() };
    let tw = TestWorld::builder()
        .start_at(START)
        .all_queues(5)
        .email(email.clone())
        .sms(other.clone())
        .push(other)
        .config(config)
        .build();
    World { feed: tw.feed("relay"), deps: tw.deps, store: tw.store, email, t: TenantId::parse("shop-a").unwrap() }
}

async fn users_with_tag(w: &World, n: usize, tag: &str) {
    for i in 0..n {
        let input = UserInput {
            email: Some(format!("user{i}@example.com")),
            tags: vec![tag.to_owned(), "everyone".to_owned()],
            ..Default::default()
        };
        users::put_user(&w.deps, &w.t, &format!("u{i:05}"), input).await.unwrap();
    }
}

async fn template(w: &World) {
    let input = serde_json::from_value(json!({
        "default_locale": "en",
        "locales": {"en": {"email_subject": "Sale", "email_body": "Hello {{ user_id }}"}}
    }))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "promo", input).await.unwrap();
}

fn campaign(key: &str, segment: &str) -> NotificationRequest {
    serde_json::from_value(json!({
        "idempotency_key": key,
        "recipients": {"segment": segment},
        "template_id": "promo",
        "category": "marketing",
        "channels": ["email"],
    }))
    .unwrap()
}

/// Runs the relay and every queue until nothing is left (what the local runtime does).
async fn drain(w: &World) {
    tidings_embedded::test_world::drain(&w.deps, &w.feed).await;
}

/// Relays every change (the users and their list entries come before the notification's own
/// record), then receives the campaign's first page task.
async fn relay_to_the_first_page(w: &World) -> Vec<ports::Received> {
    loop {
        let records = w.feed.next_batch(1000).await.unwrap();
        if records.is_empty() {
            break;
        }
        relay::handle_changes(&w.deps, &records).await.unwrap();
        w.feed.commit(&records).await.unwrap();
    }
    w.deps.queues.receive("requests-low", 1, Duration::from_secs(60), Duration::ZERO).await.unwrap()
}

async fn view(w: &World, id: &str) -> NotificationView {
    api::get_notification(&w.deps, &w.t, id).await.unwrap().unwrap()
}

#[tokio::test]
async fn a_campaign_to_2500_users_delivers_once_each_with_exact_progress() {
    let w = world(1000);
    users_with_tag(&w, 2500, "vip").await;
    users::put_user(&w.deps, &w.t, "outsider", UserInput { email: Some("o@example.com".into()), ..Default::default() })
        .await
        .unwrap();
    template(&w).await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-1", "vip")).await.unwrap();
    drain(&w).await;
    assert_eq!(w.email.total(), 2500, "every member once");
    assert_eq!(w.email.users(), 2500);
    assert_eq!(w.email.max_per_user(), 1);
    let v = view(&w, &accepted.notification_id).await;
    assert_eq!(v.status, NotificationStatus::Completed, "{v:?}");
    assert_eq!(v.expanded, 2500);
    assert_eq!(v.counts.sent, 2500);
    assert_eq!(v.counts.queued, 0);
    assert_eq!(v.oldest_pending_age_s, 0);
    assert_eq!(v.segment.as_deref(), Some("vip"));
}

#[tokio::test]
async fn redriven_page_tasks_create_nothing_twice() {
    let w = world(100);
    users_with_tag(&w, 250, "vip").await;
    template(&w).await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-2", "vip")).await.unwrap();
    // Keep every request task the relay queues, to send them all again afterwards.
    let mut bodies = Vec::new();
    loop {
        let records = w.feed.next_batch(1000).await.unwrap();
        if !records.is_empty() {
            relay::handle_changes(&w.deps, &records).await.unwrap();
            w.feed.commit(&records).await.unwrap();
        }
        let got = w.deps.queues.receive("requests-low", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        if got.is_empty() && records.is_empty() {
            break;
        }
        for m in &got {
            bodies.push(m.body.clone());
            let outcome = dispatch(&w.deps, "requests-low", m).await;
            settle(w.deps.queues.as_ref(), "requests-low", m, &outcome, w.deps.clock.now(), true).await.unwrap();
        }
    }
    assert_eq!(bodies.len(), 3, "pages of 100, 100 and 50: {bodies:?}");
    drain(&w).await;
    assert_eq!(w.email.total(), 250);
    let before = view(&w, &accepted.notification_id).await;

    // Every page task again, as a redrive from the DLQ would bring them; and a page interrupted
    // before it was marked done (its marker removed) runs again without duplicates.
    let done_key = tidings_core::ports::Key::new(
        tidings_core::keys::notification_pk(&w.t, &accepted.notification_id),
        "C#00000001#done",
    );
    tidings_core::ports::Table::delete(&w.store, &done_key, tidings_core::ports::Cond::Exists).await.unwrap();
    let messages = bodies.iter().map(|b| OutMessage::new(b.clone())).collect();
    w.deps.queues.send_batch("requests-low", messages).await.unwrap();
    drain(&w).await;
    assert_eq!(w.email.total(), 250, "no second send");
    assert_eq!(w.email.max_per_user(), 1);
    let after = view(&w, &accepted.notification_id).await;
    assert_eq!(after.counts, before.counts, "counts unchanged");
    assert_eq!(after.expanded, 250);
    let deliveries = api::list_deliveries(&w.deps, &w.t, &accepted.notification_id, 1000, None).await.unwrap().unwrap();
    assert_eq!(deliveries.items.len(), 250, "one delivery per user and channel");
}

#[tokio::test]
async fn cancel_stops_the_rest_and_counts_say_so() {
    let w = world(100);
    users_with_tag(&w, 300, "vip").await;
    template(&w).await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-3", "vip")).await.unwrap();
    // Expand the first page only, then cancel. Every change is relayed first (the users and
    // their list entries come before the notification's own record).
    let got = relay_to_the_first_page(&w).await;
    let outcome = dispatch(&w.deps, "requests-low", &got[0]).await;
    settle(w.deps.queues.as_ref(), "requests-low", &got[0], &outcome, w.deps.clock.now(), true).await.unwrap();
    let v = view(&w, &accepted.notification_id).await;
    assert_eq!(v.counts.queued, 100, "{v:?}");
    assert_eq!(v.expanded, 100);
    // The workers' early skip holds the status read just before the cancel (a second's cache):
    // the cancel fence right before each provider call stops the sends all the same, at once
    // (docs/delivery.md, "Cancel").
    let cached = tidings_core::notify::campaign::status(&w.deps, &w.t, &accepted.notification_id).await.unwrap();
    assert_eq!(cached, Some(NotificationStatus::Processing));
    api::cancel(&w.deps, &w.t, &accepted.notification_id).await.unwrap();
    drain(&w).await;
    assert_eq!(w.email.total(), 0, "nothing sent after the cancel");
    let v = view(&w, &accepted.notification_id).await;
    assert_eq!(v.status, NotificationStatus::Cancelled);
    assert_eq!(v.counts.suppressed, 100, "{v:?}");
    assert_eq!(v.counts.queued, 0);
    assert_eq!(v.expanded, 100, "the other pages were never expanded");
}

/// A page run stopped after writing its deliveries and before queueing their tasks, then the
/// cancel: the page's task, when it comes again, finds the notification cancelled and closes
/// those deliveries (`suppressed`, `cancelled`), counters and all. Before, it returned at once
/// and they stayed `pending` for ever (the AWS e2e cancel test's failure under load).
#[tokio::test]
async fn a_cancelled_pages_deliveries_that_were_never_queued_end() {
    let w = world(100);
    users_with_tag(&w, 250, "vip").await;
    template(&w).await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-cut", "vip")).await.unwrap();
    let got = relay_to_the_first_page(&w).await;
    // The email lane refuses every task: the run stops after writing the page's deliveries and
    // before queueing their tasks (as a crash or an invocation's deadline there).
    let lane_down: SendHook = Arc::new(|queue| {
        let down = queue.starts_with("email");
        Box::pin(async move {
            if down { Err(ports::QueueError::Unavailable("the email lane is down".into())) } else { Ok(()) }
        })
    });
    let cut = Deps { queues: HookedSends::new(w.deps.queues.clone(), lane_down), ..w.deps.clone() };
    let outcome = dispatch(&cut, "requests-low", &got[0]).await;
    assert!(matches!(outcome, Outcome::Retry(_)), "{outcome:?}");
    // Back at once, as a run cut off at its deadline is (`router::cut_off_at`).
    let cut_off = Outcome::Retry(Duration::ZERO);
    settle(w.deps.queues.as_ref(), "requests-low", &got[0], &cut_off, w.deps.clock.now(), true).await.unwrap();
    let v = view(&w, &accepted.notification_id).await;
    assert_eq!(v.counts.queued, 100, "the page's deliveries are written, their tasks not queued: {v:?}");
    api::cancel(&w.deps, &w.t, &accepted.notification_id).await.unwrap();
    drain(&w).await;
    assert_eq!(w.email.total(), 0, "nothing sent after the cancel");
    let v = view(&w, &accepted.notification_id).await;
    assert_eq!(v.status, NotificationStatus::Cancelled);
    assert_eq!((v.counts.queued, v.counts.suppressed), (0, 100), "{v:?}");
    let deliveries = api::list_deliveries(&w.deps, &w.t, &accepted.notification_id, 1000, None).await.unwrap().unwrap();
    assert_eq!(deliveries.items.len(), 100);
    for d in &deliveries.items {
        assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("cancelled")), "{d:?}");
    }
}

/// A cancelled campaign's claim left by a worker that stopped between its claim and its record
/// (lease run out) ends `failed` (`outcome_unknown`) when its task comes back: neither sent
/// again nor left `sending` for ever. Before, the task was dropped and the claim stayed open.
#[tokio::test]
async fn a_cancelled_campaigns_stale_claim_ends() {
    let w = world(100);
    users_with_tag(&w, 3, "vip").await;
    template(&w).await;
    let accepted = api::accept(&w.deps, &w.t, campaign("sale-claim", "vip")).await.unwrap();
    let id = accepted.notification_id.clone();
    let got = relay_to_the_first_page(&w).await;
    let outcome = dispatch(&w.deps, "requests-low", &got[0]).await;
    settle(w.deps.queues.as_ref(), "requests-low", &got[0], &outcome, w.deps.clock.now(), true).await.unwrap();
    // u00001's worker claimed it and stopped: `sending`, its lease run out.
    let key = tidings_core::keys::delivery(&w.t, &id, "u00001", Channel::Email);
    let expired = w.deps.clock.now_ms() - 1;
    let claim = vec![ports::Update::set("status", "sending"), ports::Update::set("lease_until_ms", expired)];
    w.deps.table.update(&key, claim, ports::Cond::eq("status", "pending")).await.unwrap();
    api::cancel(&w.deps, &w.t, &id).await.unwrap();
    drain(&w).await;
    assert_eq!(w.email.total(), 0, "nothing sent after the cancel");
    let deliveries = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    let ends: Vec<(&str, DeliveryStatus, Option<&str>)> =
        deliveries.items.iter().map(|d| (d.user_id.as_str(), d.status, d.reason.as_deref())).collect();
    assert_eq!(
        ends,
        [
            ("u00000", DeliveryStatus::Suppressed, Some("cancelled")),
            ("u00001", DeliveryStatus::Failed, Some("outcome_unknown")),
            ("u00002", DeliveryStatus::Suppressed, Some("cancelled")),
        ]
    );
    let v = view(&w, &id).await;
    assert_eq!((v.counts.queued, v.counts.failed, v.counts.suppressed), (0, 1, 2), "{v:?}");
}

#[tokio::test]
async fn leaving_a_tag_leaves_the_segment() {
    let w = world(1000);
    users_with_tag(&w, 3, "vip").await;
    users::put_user(&w.deps, &w.t, "u00001", UserInput { email: Some("x@example.com".into()), ..Default::default() })
        .await
        .unwrap();
    let (members, next) = users::segment_page(&w.deps, &w.t, "vip", 10, None).await.unwrap();
    let ids: Vec<_> = members.iter().map(|u| u.user_id.as_str()).collect();
    assert_eq!(ids, ["u00000", "u00002"]);
    assert!(next.is_none());
}

/// A provider answering 429 beyond `limit` sends per (manual-clock) second.
struct Throttling {
    clock: Arc<ManualClock>,
    limit: u32,
    window: Mutex<(i64, u32)>,
    accepted: Mutex<Vec<i64>>,
}

#[async_trait]
impl Provider for Throttling {
    fn name(&self) -> &str {
        "throttling"
    }
    async fn send(&self, _m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let now = tidings_core::ports::Clock::now_ms(self.clock.as_ref());
        let mut w = self.window.lock().unwrap();
        if now / 1000 != w.0 {
            *w = (now / 1000, 0);
        }
        if w.1 >= self.limit {
            return Err(ProviderError::Transient {
                reason: "provider answered 429".into(),
                retry_after: Some(Duration::from_secs(2)),
            });
        }
        w.1 += 1;
        self.accepted.lock().unwrap().push(now);
        Ok(ProviderReceipt::default())
    }
}

#[tokio::test]
async fn a_429_with_retry_after_slows_the_gate_down() {
    let clock = Arc::new(ManualClock::new(start()));
    let provider = Arc::new(Throttling {
        clock: clock.clone(),
        limit: 10,
        window: Mutex::new((0, 0)),
        accepted: Mutex::default(),
    });
    let tenants = Arc::new(gates::TenantGates::new(GateConfig::default(), GateStore::Local));
    let now = tidings_core::ports::Clock::now_ms(clock.as_ref());
    // Configured far above what the provider takes: the 429s must bring it down.
    let gate = Arc::new(gates::LocalGate::new(100.0, now));
    let gated =
        gates::Gated::new(provider.clone(), Channel::Email, Some(gate.clone()), tenants, Duration::ZERO, clock.clone());
    let msg = OutboundMessage {
        channel: Channel::Email,
        to: "a@example.com".into(),
        subject: None,
        body: "x".into(),
        html: None,
        headers: vec![],
        idempotency_key: "k".into(),
        marketing: false,
        tenant: "shop-a".into(),
        notification_id: "n".into(),
        user_id: "u".into(),
        attempt: 1,
    };
    let mut throttled = 0;
    let mut paused = 0;
    for _ in 0..3000 {
        clock.advance(chrono::Duration::milliseconds(1));
        match gated.send(&msg).await {
            Ok(_) => {}
            Err(ProviderError::Transient { reason, retry_after }) if reason.contains("429") => {
                assert_eq!(retry_after, Some(Duration::from_secs(2)));
                throttled += 1;
            }
            Err(ProviderError::Transient { reason, .. }) if reason.starts_with(gates::GATE_REFUSAL) => paused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(throttled >= 1, "the provider pushed back");
    assert!(gate.current_rate() < 100.0, "rate halved on 429: {}", gate.current_rate());
    assert!(paused > 1000, "the gate held sends back while paused by Retry-After ({paused})");
    // After the first 429, the gate waited the whole Retry-After before sending again.
    assert!(throttled <= 3, "{throttled} 429s: the gate slowed down instead of hammering");
}

#[tokio::test]
async fn the_breaker_opens_and_sms_fails_over_then_returns() {
    let primary = Recording::named("sms-primary");
    let secondary = Recording::named("sms-secondary");
    let clock = Arc::new(ManualClock::new(start()));
    let config = BreakerConfig { min_calls: 5, open_for: Duration::from_secs(30), ..BreakerConfig::default() };
    let guarded = Arc::new(gates::Guarded::new(primary.clone(), Channel::Sms, config, clock.clone()));
    let sms = gates::Failover::new(guarded.clone(), secondary.clone());
    let msg = |i: u32| OutboundMessage {
        channel: Channel::Sms,
        to: "+14155550100".into(),
        subject: None,
        body: "code".into(),
        html: None,
        headers: vec![],
        idempotency_key: format!("k{i}"),
        marketing: false,
        tenant: "shop-a".into(),
        notification_id: "n".into(),
        user_id: format!("u{i}"),
        attempt: 1,
    };
    *primary.failing.lock().unwrap() = true;
    let mut errors = 0;
    for i in 0..20 {
        if sms.send(&msg(i)).await.is_err() {
            errors += 1;
        }
    }
    assert_eq!(errors, 5, "five failures open the breaker");
    assert!(matches!(guarded.state(), BreakerState::Open { .. }));
    assert_eq!(secondary.total(), 15, "the secondary carries the traffic while it is open");
    // The primary recovers; after open_for, probes go to it and it closes again.
    *primary.failing.lock().unwrap() = false;
    clock.advance(chrono::Duration::seconds(31));
    for i in 100..110 {
        sms.send(&msg(i)).await.unwrap();
    }
    assert_eq!(guarded.state(), BreakerState::Closed);
    assert_eq!(primary.total(), 10, "traffic returned to the primary");
    assert_eq!(secondary.total(), 15);
}

/// A provider taking at most `limit` sends in any sliding second (real time), answering 429
/// with `Retry-After: 1` beyond; it notes the time of every call and every accepted send.
struct SlidingLimit {
    limit: usize,
    calls: Mutex<Vec<std::time::Instant>>,
    accepted: Mutex<Vec<(std::time::Instant, String)>>,
}

#[async_trait]
impl Provider for SlidingLimit {
    fn name(&self) -> &str {
        "limited-email"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let now = std::time::Instant::now();
        self.calls.lock().unwrap().push(now);
        let mut accepted = self.accepted.lock().unwrap();
        let recent = accepted.iter().filter(|(at, _)| now.duration_since(*at) < Duration::from_secs(1)).count();
        if recent >= self.limit {
            return Err(ProviderError::Transient {
                reason: "provider answered 429".into(),
                retry_after: Some(Duration::from_secs(1)),
            });
        }
        accepted.push((now, m.user_id.clone()));
        Ok(ProviderReceipt::default())
    }
}

/// The most instants in any window of one second.
fn busiest_second(times: &mut [std::time::Instant]) -> usize {
    times.sort();
    let (mut best, mut start) = (0, 0);
    for end in 0..times.len() {
        while times[end].duration_since(times[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

/// The issue's promise, through the real batch path on real time: a provider gated at 40 per
/// second but taking only 25 (429 beyond, with `Retry-After`). The calls never exceed the gate
/// in any one-second window, the gate slows down to what the provider takes, and every one of
/// the 150 members is sent exactly once: nothing lost to the 429s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_provider_is_never_exceeded_and_nothing_is_lost() {
    const MEMBERS: usize = 150;
    const GATE: usize = 40;
    let provider = Arc::new(SlidingLimit { limit: 25, calls: Mutex::default(), accepted: Mutex::default() });
    let other: Arc<dyn Provider> = Recording::named("fake-other");
    let gate_config = GateConfig {
        provider_rates: [("email".to_owned(), GATE as f64)].into_iter().collect(),
        max_wait: Duration::from_secs(2),
        ..GateConfig::default()
    };
    let providers = gates::wrap(
        &Providers { email: provider.clone(), sms: other.clone(), push: other },
        None,
        &gate_config,
        GateStore::Local,
    );
    let config = CoreConfig {
        campaign_page_size: 50,
        frequency_cap: 100,
        max_receives: 20,
        retry_base: Duration::from_millis(200),
        retry_cap: Duration::from_secs(2),
        ..CoreConfig::default()
    };
    let tw = TestWorld::builder().system_clock().all_queues(20).providers(providers).config(config).build();
    let w = World {
        feed: tw.feed("relay"),
        deps: tw.deps,
        store: tw.store,
        email: Recording::named("unused"),
        t: TenantId::parse("shop-a").unwrap(),
    };
    users_with_tag(&w, MEMBERS, "vip").await;
    template(&w).await;
    let id = api::accept(&w.deps, &w.t, campaign("limited", "vip")).await.unwrap().notification_id;

    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while provider.accepted.lock().unwrap().len() < MEMBERS {
        if std::time::Instant::now() > deadline {
            let v = view(&w, &id).await;
            let stats = w.deps.queues.stats("email-low").await.unwrap();
            panic!(
                "not every member was sent within 90 s: {stats:?} {} calls, {} accepted, {v:?}",
                provider.calls.lock().unwrap().len(),
                provider.accepted.lock().unwrap().len()
            );
        }
        let records = w.feed.next_batch(1000).await.unwrap();
        if !records.is_empty() {
            relay::handle_changes(&w.deps, &records).await.unwrap();
            w.feed.commit(&records).await.unwrap();
        }
        let mut did = 0;
        for q in ALL_QUEUES.iter().filter(|q| tidings_core::messages::is_consumed(q)) {
            let got = w.deps.queues.receive(q, 100, Duration::from_secs(60), Duration::ZERO).await.unwrap();
            let outcomes = tidings_core::messages::dispatch_batch(&w.deps, q, &got).await;
            for (m, outcome) in got.iter().zip(&outcomes) {
                settle(w.deps.queues.as_ref(), q, m, outcome, w.deps.clock.now(), true).await.unwrap();
            }
            did += got.len();
        }
        if did == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut calls = provider.calls.lock().unwrap().clone();
    let accepted = provider.accepted.lock().unwrap().clone();
    let busiest = busiest_second(&mut calls);
    assert!(busiest <= GATE, "{busiest} calls in one second: the gate of {GATE}/s was exceeded");
    let throttled = calls.len() - accepted.len();
    assert!(
        throttled >= 1,
        "the provider pushed back at least once (calls {}, accepted {})",
        calls.len(),
        accepted.len()
    );
    let mut per_user: HashMap<String, usize> = HashMap::new();
    for (_, user) in &accepted {
        *per_user.entry(user.clone()).or_default() += 1;
    }
    assert_eq!(per_user.len(), MEMBERS, "every member sent");
    assert!(per_user.values().all(|n| *n == 1), "none twice");
    let v = view(&w, &id).await;
    assert_eq!(v.counts.sent, MEMBERS as u64, "{v:?}");
    assert_eq!(v.counts.dead, 0, "nothing dead: {v:?}");
    println!("{} calls, {} answered 429, busiest second {busiest}", calls.len(), throttled);
}

/// A provider that takes 100 ms per send.
struct Slow(Arc<Recording>);

#[async_trait]
impl Provider for Slow {
    fn name(&self) -> &str {
        "slow-email"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.0.send(m).await
    }
}

/// A world whose email provider takes 100 ms per send, with a provider timeout of 400 ms (the
/// slack keeps a send on a loaded machine from timing out, which would make it a retry later).
fn slow_world() -> (World, Arc<Recording>) {
    let mut w = world(1000);
    let sent_to = Recording::named("slow-email");
    w.deps.providers.email = Arc::new(Slow(sent_to.clone()));
    w.deps.config = Arc::new(CoreConfig { provider_timeout: Duration::from_millis(400), ..(*w.deps.config).clone() });
    (w, sent_to)
}

/// Runs the relay and the request queues: every accepted notification's channel tasks queued,
/// none sent.
async fn expand(w: &World) {
    for _ in 0..20 {
        let records = w.feed.next_batch(1000).await.unwrap();
        relay::handle_changes(&w.deps, &records).await.unwrap();
        w.feed.commit(&records).await.unwrap();
        for q in ["requests-high", "requests-low"] {
            for m in w.deps.queues.receive(q, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap() {
                let outcome = dispatch(&w.deps, q, &m).await;
                settle(w.deps.queues.as_ref(), q, &m, &outcome, w.deps.clock.now(), true).await.unwrap();
            }
        }
    }
}

/// Handles `got` of `queue` as one batch with a deadline `within` from now, and settles it.
async fn run_until(
    w: &World,
    queue: &str,
    got: &[tidings_core::ports::Received],
    within: Duration,
) -> Vec<tidings_core::messages::Outcome> {
    let deadline = std::time::Instant::now() + within;
    let outcomes = tidings_core::messages::dispatch_batch_until(&w.deps, queue, got, Some(deadline)).await;
    let processed = tidings_core::messages::settle_batch(
        w.deps.queues.as_ref(),
        queue,
        got,
        outcomes.clone(),
        w.deps.clock.now(),
        true,
    )
    .await;
    assert!(processed.iter().all(|p| *p), "handed back or done, never left to a retry: {outcomes:?}");
    outcomes
}

/// A transactional email to `users` tagged users, accepted and expanded: its tasks queued on
/// `email-high`, none sent.
async fn transactional_to(w: &World, users: usize) -> String {
    users_with_tag(w, users, "vip").await;
    template(w).await;
    let ids: Vec<String> = (0..users).map(|i| format!("u{i:05}")).collect();
    let req = serde_json::from_value(json!({"recipients": {"user_ids": ids}, "template_id": "promo",
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    let id = api::accept(&w.deps, &w.t, req).await.unwrap().notification_id;
    expand(w).await;
    id
}

fn handed_back(outcomes: &[tidings_core::messages::Outcome]) -> usize {
    outcomes.iter().filter(|o| matches!(o, tidings_core::messages::Outcome::HandBack)).count()
}

/// A batch handled against a deadline (a Lambda invocation's end, a visibility timeout): the
/// first wave of sends always goes, later ones start only while their provider call (timeout
/// 400 ms) can end before it; the rest are handed back `pending`, their messages retried, and
/// on the next run every member is sent exactly once. Nothing is cut off mid-send, nothing is
/// lost, nothing doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_near_its_deadline_hands_back_the_sends_it_cannot_finish() {
    const MEMBERS: usize = 100;
    let (w, sent_to) = slow_world();
    users_with_tag(&w, MEMBERS, "vip").await;
    template(&w).await;
    let id = api::accept(&w.deps, &w.t, campaign("deadline", "vip")).await.unwrap().notification_id;
    expand(&w).await;
    let got = w.deps.queues.receive("email-low", 100, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), MEMBERS);

    let outcomes = run_until(&w, "email-low", &got, Duration::from_millis(650)).await;
    let sent = sent_to.total() as usize;
    let done = outcomes.iter().filter(|o| matches!(o, tidings_core::messages::Outcome::Done)).count();
    let handed_back = handed_back(&outcomes);
    assert!(sent >= 16, "the first wave always goes: {sent}");
    assert!(handed_back > 0, "later sends that could outlast the deadline were not started ({sent} sent)");
    assert_eq!((done, handed_back), (sent, MEMBERS - sent));
    let v = view(&w, &id).await;
    assert_eq!((v.counts.sent, v.counts.queued), (sent as u64, (MEMBERS - sent) as u64), "{v:?}");
    let page = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    let pending: Vec<_> = page.items.iter().filter(|d| d.status == DeliveryStatus::Pending).collect();
    assert_eq!(pending.len(), handed_back);
    assert!(pending.iter().all(|d| d.attempts == 0 && d.lease_until_ms.is_none()), "{pending:?}");
    // Handed back as fresh copies: the receive they were given does not count towards the DLQ.
    let again = w.deps.queues.receive("email-low", 100, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), handed_back);
    assert!(
        again.iter().all(|m| m.receive_count == 1),
        "{:?}",
        again.iter().map(|m| m.receive_count).collect::<Vec<_>>()
    );
    for m in &again {
        w.deps.queues.change_visibility("email-low", &m.receipt, Duration::ZERO).await.unwrap();
    }

    drain(&w).await;
    assert_eq!((sent_to.users(), sent_to.max_per_user()), (MEMBERS, 1), "every member once");
    assert_eq!(view(&w, &id).await.status, NotificationStatus::Completed);
}

/// Transactional tasks go one by one; against a deadline, the first always goes and the others
/// only while a provider call can still end before it: the rest are retried untouched (never
/// claimed), and each user gets the message exactly once in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_tasks_near_the_deadline_are_handed_back_untouched() {
    const USERS: usize = 10;
    let (w, sent_to) = slow_world();
    let id = transactional_to(&w, USERS).await;
    let got = w.deps.queues.receive("email-high", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), USERS);

    let outcomes = run_until(&w, "email-high", &got, Duration::from_millis(600)).await;
    let sent = sent_to.total() as usize;
    let retried = handed_back(&outcomes);
    assert!(sent >= 1, "the first always goes");
    assert!(retried > 0, "the others wait for the next invocation ({sent} sent)");
    assert_eq!(sent + retried, USERS);
    let page = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    let pending = page.items.iter().filter(|d| d.status == DeliveryStatus::Pending && d.attempts == 0).count();
    assert_eq!(pending, retried, "untouched: never claimed");

    drain(&w).await;
    assert_eq!((sent_to.users(), sent_to.max_per_user()), (USERS, 1));
}

/// A task handed back at every deadline, more times than a message may be received before the
/// DLQ takes it (`max_receives`, 5), is still sent, once: hand-backs are not receives. (With a
/// retry instead, the last users' tasks would be dead-lettered without ever being tried.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_handed_back_more_often_than_max_receives_are_not_dead_lettered() {
    const USERS: usize = 10;
    let (w, sent_to) = slow_world();
    assert!(USERS > w.deps.config.max_receives as usize + 1);
    let id = transactional_to(&w, USERS).await;
    // Each invocation has no time to spare: one send, the rest handed back.
    for run in 1..=USERS {
        let got = w.deps.queues.receive("email-high", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        assert_eq!(got.len(), USERS + 1 - run, "run {run}: nothing lost to the DLQ");
        let outcomes = run_until(&w, "email-high", &got, Duration::ZERO).await;
        assert_eq!((sent_to.total() as usize, handed_back(&outcomes)), (run, USERS - run));
    }
    assert_eq!(w.deps.queues.stats("email-high").await.unwrap().dlq_depth, 0);
    assert_eq!((sent_to.users(), sent_to.max_per_user()), (USERS, 1));
    let page = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    assert!(page.items.iter().all(|d| d.status == DeliveryStatus::Sent && d.attempts == 1), "{:?}", page.items);
}

/// The store as the tests see it: counts the writes that reach it (a put, an update, a delete or
/// a transaction, one each) and, once `stalling` is set, writes transactions and then never
/// answers them (a throttled table, a request far slower than those before it).
struct Watched {
    inner: Arc<dyn ports::Table>,
    writes: std::sync::atomic::AtomicUsize,
    stalling: std::sync::atomic::AtomicBool,
}

impl Watched {
    fn over(inner: Arc<dyn ports::Table>) -> Arc<Self> {
        Arc::new(Self { inner, writes: Default::default(), stalling: false.into() })
    }
    fn count(&self) {
        self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn writes(&self) -> usize {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn stall(&self, on: bool) {
        self.stalling.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait]
impl ports::Table for Watched {
    async fn get(&self, key: &ports::Key) -> Result<Option<ports::Item>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_many(&self, keys: &[ports::Key]) -> Result<Vec<Option<ports::Item>>, StoreError> {
        self.inner.get_many(keys).await
    }
    async fn put(&self, item: ports::Item, cond: ports::Cond) -> Result<(), StoreError> {
        self.count();
        self.inner.put(item, cond).await
    }
    async fn update(
        &self,
        key: &ports::Key,
        updates: Vec<ports::Update>,
        cond: ports::Cond,
    ) -> Result<ports::Item, StoreError> {
        self.count();
        self.inner.update(key, updates, cond).await
    }
    async fn delete(&self, key: &ports::Key, cond: ports::Cond) -> Result<(), StoreError> {
        self.count();
        self.inner.delete(key, cond).await
    }
    async fn transact(&self, writes: Vec<ports::Write>) -> Result<(), StoreError> {
        self.count();
        let written = self.inner.transact(writes).await;
        if self.stalling.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        written
    }
    async fn query(&self, pk: &str, sk_prefix: &str, opts: ports::QueryOpts) -> Result<ports::Page, StoreError> {
        self.inner.query(pk, sk_prefix, opts).await
    }
    async fn query_range(
        &self,
        pk: &str,
        from: &str,
        to: &str,
        opts: ports::QueryOpts,
    ) -> Result<ports::Page, StoreError> {
        self.inner.query_range(pk, from, to, opts).await
    }
}

/// A world whose SMS go to a recording provider, with per-number SMS limits `limits`, and whose
/// store counts its writes; `users` tagged `vip`, user `i` with phone number `i % numbers`.
async fn sms_world(users: usize, numbers: usize, limits: &str) -> (World, Arc<Recording>, Arc<Watched>) {
    let mut w = world(1000);
    let sms = Recording::named("fake-sms");
    let counting = Watched::over(w.deps.table.clone());
    w.deps.table = counting.clone();
    w.deps.providers.sms = sms.clone();
    let limits = limits.to_owned();
    let abuse = tidings_core::notify::abuse::AbuseGuard::from_settings(|name| {
        (name == "TIDINGS_SMS_NUMBER_LIMITS").then(|| limits.clone())
    })
    .unwrap();
    w.deps.config = Arc::new(CoreConfig { abuse, ..(*w.deps.config).clone() });
    for i in 0..users {
        let input = UserInput {
            phone: Some(format!("+861380000{:04}", i % numbers)),
            tags: vec!["vip".to_owned()],
            ..Default::default()
        };
        users::put_user(&w.deps, &w.t, &format!("u{i:05}"), input).await.unwrap();
    }
    let input =
        serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {"sms": "Notice {{ user_id }}"}}}))
            .unwrap();
    templates::put_template(&w.deps, &w.t, "notice", input).await.unwrap();
    (w, sms, counting)
}

fn sms_notice(key: &str) -> NotificationRequest {
    serde_json::from_value(json!({"idempotency_key": key, "recipients": {"segment": "vip"}, "template_id": "notice",
        "category": "transactional", "channels": ["sms"]}))
    .unwrap()
}

/// A transactional SMS to a segment, with per-number limits on: the page's deliveries and their
/// number counters are written together in a few large transactions (the counters read ahead
/// with the page), not one transaction per member.
#[tokio::test]
async fn a_transactional_sms_segment_under_number_limits_is_written_in_few_transactions() {
    const USERS: usize = 300;
    let (w, sms, counting) = sms_world(USERS, USERS, "5/1h,10/1d").await;
    let id = api::accept(&w.deps, &w.t, sms_notice("notice-1")).await.unwrap().notification_id;
    let before = counting.writes();
    expand(&w).await;
    let writes = counting.writes() - before;
    assert!(writes < 40, "{writes} writes to expand {USERS} members (one per member would be {USERS}+)");
    drain(&w).await;
    assert_eq!((sms.users(), sms.max_per_user()), (USERS, 1));
    let v = view(&w, &id).await;
    assert_eq!((v.status, v.counts.sent), (NotificationStatus::Completed, USERS as u64), "{v:?}");
}

/// Members who share a phone number share its counters: the number gets the notice once, the
/// others' deliveries are `number_rate_limited`, and the page still goes through (a transaction
/// naming one counter twice would be refused by DynamoDB).
#[tokio::test]
async fn members_sharing_a_number_get_one_sms_between_them() {
    const USERS: usize = 60;
    const NUMBERS: usize = 20;
    let (w, sms, _) = sms_world(USERS, NUMBERS, "5/1h").await;
    let id = api::accept(&w.deps, &w.t, sms_notice("notice-2")).await.unwrap().notification_id;
    drain(&w).await;
    assert_eq!((sms.total() as usize, sms.max_per_user()), (NUMBERS, 1));
    let page = api::list_deliveries(&w.deps, &w.t, &id, 1000, None).await.unwrap().unwrap();
    let limited = page
        .items
        .iter()
        .filter(|d| d.status == DeliveryStatus::Suppressed && d.reason.as_deref() == Some("number_rate_limited"))
        .count();
    assert_eq!(limited, USERS - NUMBERS, "{:?}", page.items);
    let v = view(&w, &id).await;
    assert_eq!(v.status, NotificationStatus::Completed, "{v:?}");
    assert_eq!((v.counts.sent, v.counts.suppressed), (NUMBERS as u64, (USERS - NUMBERS) as u64), "{v:?}");
}

/// Requests (campaign pages) are handled one by one: past the first, a message that the
/// slowest so far says would not end before the invocation's deadline is handed back, not
/// started, so the function is not cut off mid-page by its timeout.
#[tokio::test]
async fn requests_near_the_deadline_are_handed_back_after_the_first() {
    let w = world(10);
    let message = |i: usize| ports::Received {
        message_id: format!("m{i}"),
        receipt: format!("r{i}"),
        body: r#"{"not":"a request"}"#.into(),
        receive_count: 1,
        sent_at_ms: 0,
        group: None,
    };
    let messages: Vec<_> = (0..3).map(message).collect();
    let past = std::time::Instant::now();
    let outcomes = tidings_core::messages::dispatch_batch_until(&w.deps, "requests-low", &messages, Some(past)).await;
    assert!(matches!(outcomes[0], tidings_core::messages::Outcome::Reject(_)), "the first always runs: {outcomes:?}");
    assert!(outcomes[1..].iter().all(|o| matches!(o, tidings_core::messages::Outcome::HandBack)), "{outcomes:?}");
    let later = std::time::Instant::now() + Duration::from_secs(60);
    let outcomes = tidings_core::messages::dispatch_batch_until(&w.deps, "requests-low", &messages, Some(later)).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, tidings_core::messages::Outcome::Reject(_))),
        "time enough for all: {outcomes:?}"
    );
}

/// A request message still running `CUT_OFF_AFTER` past its deadline (its deliveries written,
/// the answer never coming) is cut off and retried, one receive charged, instead of holding the
/// invocation past its end; the retry creates nothing twice and every user is sent once. Without
/// the cut-off the batch never answers and this test does not end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_running_past_its_deadline_is_cut_off_and_retried_creating_nothing_twice() {
    const USERS: usize = 12;
    let mut w = world(1000);
    let stalling = Watched::over(w.deps.table.clone());
    w.deps.table = stalling.clone();
    users_with_tag(&w, USERS, "vip").await;
    template(&w).await;
    let ids: Vec<String> = (0..USERS).map(|i| format!("u{i:05}")).collect();
    let req = serde_json::from_value(json!({"recipients": {"user_ids": ids}, "template_id": "promo",
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    let id = api::accept(&w.deps, &w.t, req).await.unwrap().notification_id;
    let records = w.feed.next_batch(1000).await.unwrap();
    relay::handle_changes(&w.deps, &records).await.unwrap();
    w.feed.commit(&records).await.unwrap();
    // 12 users: more than the high lane takes, so its request is on the normal lane.
    let queue = "requests-normal";
    let got = w.deps.queues.receive(queue, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1, "one request message: {got:?}");

    stalling.stall(true);
    let deadline = std::time::Instant::now();
    let outcomes = tidings_core::messages::dispatch_batch_until(&w.deps, queue, &got, Some(deadline)).await;
    assert_eq!(outcomes, vec![tidings_core::messages::Outcome::Retry(Duration::ZERO)], "cut off and retried");
    assert!(std::time::Instant::now() >= deadline + tidings_core::router::CUT_OFF_AFTER, "not cut off before its time");
    let processed =
        tidings_core::messages::settle_batch(w.deps.queues.as_ref(), queue, &got, outcomes, w.deps.clock.now(), true)
            .await;
    assert_eq!(processed, vec![false], "a retry is left on its queue");
    assert_eq!(w.email.total(), 0, "nothing sent by the run that was cut off");

    stalling.stall(false);
    drain(&w).await;
    assert_eq!(w.email.users(), USERS, "every user sent");
    assert_eq!(w.email.max_per_user(), 1, "none twice");
    let v = view(&w, &id).await;
    assert_eq!(v.status, NotificationStatus::Completed, "{v:?}");
    assert_eq!(v.counts.sent, USERS as u64, "counted once each: {v:?}");
}

/// A store whose first update that records a notification's last page fails, as a task cut off
/// there (a crash, an invocation's deadline) would leave it.
struct LastPageFailsOnce {
    inner: Arc<dyn ports::Table>,
    failed: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl ports::Table for LastPageFailsOnce {
    async fn get(&self, key: &ports::Key) -> Result<Option<ports::Item>, StoreError> {
        self.inner.get(key).await
    }
    async fn put(&self, item: ports::Item, cond: ports::Cond) -> Result<(), StoreError> {
        self.inner.put(item, cond).await
    }
    async fn update(
        &self,
        key: &ports::Key,
        updates: Vec<ports::Update>,
        cond: ports::Cond,
    ) -> Result<ports::Item, StoreError> {
        let last_page = updates.iter().any(|u| matches!(u, ports::Update::Set(name, _) if name == "last_page"));
        if last_page && !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unavailable("cut off".into()));
        }
        self.inner.update(key, updates, cond).await
    }
    async fn delete(&self, key: &ports::Key, cond: ports::Cond) -> Result<(), StoreError> {
        self.inner.delete(key, cond).await
    }
    async fn transact(&self, writes: Vec<ports::Write>) -> Result<(), StoreError> {
        self.inner.transact(writes).await
    }
    async fn query(&self, pk: &str, sk_prefix: &str, opts: ports::QueryOpts) -> Result<ports::Page, StoreError> {
        self.inner.query(pk, sk_prefix, opts).await
    }
    async fn query_range(
        &self,
        pk: &str,
        from: &str,
        to: &str,
        opts: ports::QueryOpts,
    ) -> Result<ports::Page, StoreError> {
        self.inner.query_range(pk, from, to, opts).await
    }
}

/// A request task cut off after its page's work, before its last page is recorded, completes
/// the notification when it comes again. Recording it after marking the page done, the retry
/// found the page done and returned: the notification stayed `processing` for ever (seen on the
/// AWS backend, a task cut off at its invocation's deadline).
#[tokio::test]
async fn a_task_cut_off_before_its_last_page_is_recorded_completes_on_its_retry() {
    let mut w = world(1000);
    let table = Arc::new(LastPageFailsOnce { inner: w.deps.table.clone(), failed: false.into() });
    w.deps.table = table.clone();
    users_with_tag(&w, 3, "vip").await;
    template(&w).await;
    let id = api::accept(&w.deps, &w.t, campaign("cut-off", "vip")).await.unwrap().notification_id;
    let first = tidings_core::notify::requests::orchestrate(&w.deps, &w.t, &id).await;
    assert!(first.is_err() && table.failed.load(std::sync::atomic::Ordering::SeqCst), "cut off: {first:?}");
    tidings_core::notify::requests::orchestrate(&w.deps, &w.t, &id).await.unwrap();
    drain(&w).await;
    let v = view(&w, &id).await;
    assert_eq!((v.status, v.counts.sent), (NotificationStatus::Completed, 3), "{v:?}");
}
