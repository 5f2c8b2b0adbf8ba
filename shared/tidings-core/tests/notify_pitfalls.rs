//! The pitfalls of notification delivery (docs/delivery.md, docs/gates.md): each has a test named
//! after it, against the embedded store through the ports. Plus the order of the policy checks
//! (`notify::policy`) and scheduled sends in local time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tidings_core::messages::{ALL_QUEUES, Outcome, dispatch, settle};
use tidings_core::notify::api;
use tidings_core::notify::model::{
    ChannelTask, Delivery, DeliveryStatus, NotificationRequest, NotificationStatus, Requester,
};
use tidings_core::notify::relay;
use tidings_core::people::preferences::{self, PreferencesInput, QuietHours};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{
    ChangeFeed, Channel, ManualClock, OutboundMessage, Provider, ProviderError, ProviderReceipt, Update,
};
use tidings_core::{CoreConfig, Deps, TenantId, keys, templates};
use tidings_embedded::EmbeddedChangeFeed;
use tidings_embedded::test_world::TestWorld;

/// A provider that records every call (with its idempotency key) and fails as told.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<OutboundMessage>>,
    /// Answers to give first, in order; then `Ok`.
    script: Mutex<Vec<ProviderError>>,
    /// Push addresses unregistered at the push service.
    unregistered: Mutex<Vec<String>>,
}

impl Recorder {
    fn calls(&self) -> Vec<OutboundMessage> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        self.calls.lock().unwrap().push(message.clone());
        let mut script = self.script.lock().unwrap();
        if !script.is_empty() {
            return Err(script.remove(0));
        }
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", self.calls.lock().unwrap().len()) })
    }
    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        self.unregistered.lock().unwrap().push(address.to_owned());
        Ok(())
    }
}

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    feed: EmbeddedChangeFeed,
    sms: Arc<Recorder>,
    push: Arc<Recorder>,
    email: Arc<Recorder>,
    t: TenantId,
}

/// 2026-11-29 19:00 UTC = 03:00 the next day in Shanghai.
const START: &str = "2026-11-29T19:00:00Z";

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(START).unwrap().with_timezone(&Utc)
}

async fn world() -> World {
    world_with(CoreConfig { retry_base: Duration::from_secs(1), ..CoreConfig::default() }).await
}

async fn world_with(config: CoreConfig) -> World {
    let sms = Arc::new(Recorder::default());
    let email = Arc::new(Recorder::default());
    let push = Arc::new(Recorder::default());
    let tw = TestWorld::builder()
        .start_at(START)
        .all_queues(5)
        .email(email.clone())
        .sms(sms.clone())
        .push(push.clone())
        .config(config)
        .build();
    let t = TenantId::parse("shop-a").unwrap();
    let w = World { feed: tw.feed("relay"), clock: tw.clock(), deps: tw.deps, sms, email, push, t };
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "sms": "Code {{ n }}", "email_subject": "S {{ n }}", "email_body": "B {{ n }}",
        "push_title": "P", "push_body": "P {{ n }}"}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "msg", input).await.unwrap();
    let user = UserInput {
        email: Some("a@example.com".into()),
        phone: Some("+8613800001234".into()),
        timezone: Some("Asia/Shanghai".into()),
        ..UserInput::default()
    };
    users::put_user(&w.deps, &w.t, "u1", user).await.unwrap();
    // The set-up's own change records are not part of any test.
    let setup = w.feed.next_batch(1000).await.unwrap();
    w.feed.commit(&setup).await.unwrap();
    w
}

fn request(key: &str, category: &str, channel: &str, n: u32) -> NotificationRequest {
    serde_json::from_value(json!({"idempotency_key": key, "recipients": {"user_ids": ["u1"]}, "template_id": "msg",
        "params": {"n": n}, "category": category, "channels": [channel]}))
    .unwrap()
}

/// The relay: the change stream to the request queues.
async fn relay_once(w: &World) -> usize {
    let records = w.feed.next_batch(1000).await.unwrap();
    relay::handle_changes(&w.deps, &records).await.unwrap();
    w.feed.commit(&records).await.unwrap();
    records.len()
}

/// Processes one queue's visible messages once; returns the outcomes.
async fn run_queue(w: &World, queue: &str) -> Vec<Outcome> {
    let got = w.deps.queues.receive(queue, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    let mut out = Vec::new();
    for m in &got {
        let outcome = dispatch(&w.deps, queue, m).await;
        settle(w.deps.queues.as_ref(), queue, m, &outcome, w.deps.clock.now(), true).await.unwrap();
        out.push(outcome);
    }
    out
}

/// Everything, until quiet.
async fn drain(w: &World) {
    for _ in 0..50 {
        let mut did = relay_once(w).await;
        for q in ALL_QUEUES.iter().filter(|q| tidings_core::messages::is_consumed(q)) {
            did += run_queue(w, q).await.len();
        }
        if did == 0 {
            return;
        }
    }
}

async fn delivery(w: &World, id: &str, channel: Channel) -> Delivery {
    w.deps.table.get(&keys::delivery(&w.t, id, "u1", channel)).await.unwrap().unwrap().parse().unwrap()
}

async fn accept(w: &World, req: NotificationRequest) -> String {
    api::accept(&w.deps, &w.t, req).await.unwrap().notification_id
}

async fn depth(w: &World, queue: &str) -> u64 {
    let s = w.deps.queues.stats(queue).await.unwrap();
    s.visible + s.delayed + s.in_flight
}

/// Pitfall: one queue for every notification, no priorities (docs/delivery.md, "Priorities"). An
/// OTP and a marketing message never share a queue: the request and channel queues are split by
/// priority, and a marketing backlog leaves the OTP's lane empty.
#[tokio::test]
async fn all_notifications_share_one_queue_without_priority() {
    let w = world().await;
    let marketing: Vec<String> =
        futures_ids(&w, (0..20).map(|i| request(&format!("m{i}"), "marketing", "email", i)).collect()).await;
    let otp = accept(&w, request("otp", "transactional", "sms", 1)).await;
    relay_once(&w).await;
    assert_eq!(depth(&w, "requests-low").await, 20, "marketing waits in its own lane");
    assert_eq!(depth(&w, "requests-high").await, 1, "the OTP is alone in the high lane");
    // The high lane is served without touching the marketing backlog.
    run_queue(&w, "requests-high").await;
    assert_eq!(depth(&w, "sms-high").await, 1);
    run_queue(&w, "sms-high").await;
    assert_eq!(delivery(&w, &otp, Channel::Sms).await.status, DeliveryStatus::Sent);
    assert_eq!(depth(&w, "requests-low").await, 20, "the OTP did not wait for a single marketing message");
    assert!(w.email.calls().is_empty());
    drain(&w).await;
    assert_eq!(delivery(&w, &marketing[0], Channel::Email).await.status, DeliveryStatus::Sent);
}

async fn futures_ids(w: &World, reqs: Vec<NotificationRequest>) -> Vec<String> {
    let mut out = Vec::new();
    for r in reqs {
        out.push(accept(w, r).await);
    }
    out
}

/// Pitfall: retries without deduplication, or a claim of end-to-end exactly once. Retries carry the
/// same delivery key (the provider's idempotency key and the push collapse id), and a task
/// delivered twice sends once. What is *not* claimed: a crash between the provider's acceptance and
/// our `sent` can send twice (the next test shows the window's other side).
#[tokio::test]
async fn retries_without_dedup_or_claiming_exactly_once() {
    let w = world().await;
    w.sms.script.lock().unwrap().push(ProviderError::transient("503"));
    let id = accept(&w, request("otp", "transactional", "sms", 7)).await;
    relay_once(&w).await;
    run_queue(&w, "requests-high").await;
    // Duplicate the channel task, as an at-least-once queue may.
    let got = w.deps.queues.receive("sms-high", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    let task: ChannelTask = serde_json::from_str(&got[0].body).unwrap();
    w.deps.queues.change_visibility("sms-high", &got[0].receipt, Duration::ZERO).await.unwrap();
    w.deps
        .queues
        .send_batch("sms-high", vec![tidings_core::ports::OutMessage::new(serde_json::to_string(&task).unwrap())])
        .await
        .unwrap();
    for _ in 0..10 {
        w.clock.advance(chrono::Duration::seconds(30));
        run_queue(&w, "sms-high").await;
    }
    let calls = w.sms.calls();
    let accepted = calls.len() - 1; // one 503 first
    assert_eq!(accepted, 1, "two copies of the task, one retry: one accepted send");
    let keys: std::collections::HashSet<&str> = calls.iter().map(|c| c.idempotency_key.as_str()).collect();
    assert_eq!(keys.len(), 1, "every attempt carries the same delivery key");
    assert_eq!(keys.into_iter().next().unwrap(), format!("{id}:u1:sms"));
    let d = delivery(&w, &id, Channel::Sms).await;
    assert_eq!((d.status, d.attempts), (DeliveryStatus::Sent, 2));
}

/// A worker that claimed u1's SMS delivery of `id` (as the channel worker does, with a lease)
/// and died before doing anything more.
async fn claim_and_die(w: &World, id: &str, channel: Channel, lease: Duration) {
    let key = keys::delivery(&w.t, id, "u1", channel);
    let lease_until = w.deps.clock.now_ms() + lease.as_millis() as i64;
    let claim =
        vec![Update::set("status", "sending"), Update::add("attempts", 1), Update::set("lease_until_ms", lease_until)];
    w.deps.table.update(&key, claim, tidings_core::ports::Cond::eq("status", "pending")).await.unwrap();
}

/// Pitfall: a one-step "done" key written before sending, which loses the OTP on a crash
/// (docs/delivery.md, "Send: the rule of once"). A transactional send claims its key with a lease
/// (`sending`), and a crash before the provider call only delays it: once the lease runs out
/// the redelivered task sends. (Marketing, by design, writes once and accepts the loss.)
#[tokio::test]
async fn one_step_dedup_key_before_send_loses_the_otp_on_crash() {
    let w = world().await;
    let id = accept(&w, request("otp", "transactional", "sms", 3)).await;
    relay_once(&w).await;
    run_queue(&w, "requests-high").await;
    // The worker claimed the key, then died before calling the provider.
    claim_and_die(&w, &id, Channel::Sms, Duration::from_secs(60)).await;
    // While the lease runs, the redelivered task waits (no second sender).
    let outcomes = run_queue(&w, "sms-high").await;
    assert!(matches!(outcomes[..], [Outcome::Retry(_)]), "{outcomes:?}");
    assert!(w.sms.calls().is_empty());
    // The lease runs out: the OTP goes, once.
    w.clock.advance(chrono::Duration::seconds(120));
    run_queue(&w, "sms-high").await;
    assert_eq!(w.sms.calls().len(), 1);
    assert_eq!(delivery(&w, &id, Channel::Sms).await.status, DeliveryStatus::Sent);
}

/// The marketing side of the same pitfall: a marketing send is claimed once and never sent
/// twice, so a worker that stops after its claim (a crash, or a record that failed) loses that
/// send. The loss must not hang the campaign: the redelivered task waits while the claim's lease
/// runs (a live worker may still be sending), then closes the delivery as `failed`
/// (`outcome_unknown`) without a provider call, and the notification ends (`failed`: its one
/// delivery was not sent).
#[tokio::test]
async fn a_marketing_claim_outliving_its_lease_is_closed_not_sent_again() {
    let w = world().await;
    let id = accept(&w, request("promo-1", "marketing", "email", 1)).await;
    relay_once(&w).await;
    run_queue(&w, "requests-low").await;
    let lease = w.deps.config.marketing_lease;
    claim_and_die(&w, &id, Channel::Email, lease).await;

    let outcomes = run_queue(&w, "email-low").await;
    assert!(matches!(outcomes[..], [Outcome::Retry(_)]), "the lease is running: {outcomes:?}");
    assert_eq!(delivery(&w, &id, Channel::Email).await.status, DeliveryStatus::Sending);
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_eq!((view.status, view.counts.queued), (NotificationStatus::Processing, 1));

    w.clock.advance(chrono::Duration::from_std(lease).unwrap() + chrono::Duration::seconds(1));
    let outcomes = run_queue(&w, "email-low").await;
    assert!(matches!(outcomes[..], [Outcome::Done]), "{outcomes:?}");
    assert!(w.email.calls().is_empty(), "never sent again");
    let d = delivery(&w, &id, Channel::Email).await;
    assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Failed, Some("outcome_unknown")));
    assert_eq!(d.lease_until_ms, None);
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_eq!((view.status, view.counts.queued, view.counts.failed), (NotificationStatus::Failed, 0, 1));
}

fn guarded(countries: &str, limits: &str) -> CoreConfig {
    guarded_by(&[("TIDINGS_SMS_COUNTRIES", countries), ("TIDINGS_SMS_NUMBER_LIMITS", limits)])
}

fn guarded_by(settings: &[(&str, &str)]) -> CoreConfig {
    let abuse = tidings_core::notify::abuse::AbuseGuard::from_settings(|name| {
        settings.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    })
    .unwrap();
    CoreConfig { retry_base: Duration::from_secs(1), abuse, ..CoreConfig::default() }
}

async fn sms_reasons(w: &World, ids: &[String]) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for id in ids {
        let d = delivery(w, id, Channel::Sms).await;
        out.push(if d.status == DeliveryStatus::Suppressed { d.reason } else { Some(d.status.as_str().into()) });
    }
    out
}

/// Pitfall: skipping the frequency cap is not the same as leaving the door open
/// (docs/gates.md, "Abuse guard"). An OTP skips quiet hours and the frequency cap, so
/// the number it goes to is limited instead: beyond `TIDINGS_SMS_NUMBER_LIMITS` the delivery is
/// suppressed (`number_rate_limited`), the provider never called; the next window sends again;
/// a notification orchestrated twice (the relay delivering its event twice) counts once.
#[tokio::test]
async fn skipping_the_cap_leaves_the_otp_open_to_sms_pumping() {
    let w = world_with(guarded("", "2/1h")).await;
    let first = accept(&w, request("otp-1", "transactional", "sms", 1)).await;
    // The first one's event reaches the orchestrator twice.
    let records = w.feed.next_batch(100).await.unwrap();
    relay::handle_changes(&w.deps, &records).await.unwrap();
    relay::handle_changes(&w.deps, &records).await.unwrap();
    w.feed.commit(&records).await.unwrap();
    drain(&w).await;
    assert_eq!(w.sms.calls().len(), 1);
    let second = accept(&w, request("otp-2", "transactional", "sms", 2)).await;
    let third = accept(&w, request("otp-3", "transactional", "sms", 3)).await;
    drain(&w).await;
    assert_eq!(w.sms.calls().len(), 2, "counted once per notification: the second still goes");
    let ids = [first, second, third];
    assert_eq!(
        sms_reasons(&w, &ids).await,
        vec![Some("sent".into()), Some("sent".into()), Some("number_rate_limited".into())]
    );
    // The next hour's window.
    w.clock.advance(chrono::Duration::hours(1));
    let fourth = accept(&w, request("otp-4", "transactional", "sms", 4)).await;
    drain(&w).await;
    assert_eq!(w.sms.calls().len(), 3);
    assert_eq!(delivery(&w, &fourth, Channel::Sms).await.status, DeliveryStatus::Sent);
}

/// The per-number limit holds under concurrency: twenty OTPs to one number orchestrated at once
/// against a limit of three send exactly three (a conditional counter in each delivery's
/// transaction, not a read then a write).
#[tokio::test]
async fn concurrent_otps_to_one_number_never_exceed_its_limit() {
    let w = world_with(guarded("", "3/1h")).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(accept(&w, request(&format!("otp-{i}"), "transactional", "sms", i)).await);
    }
    relay_once(&w).await;
    let got = w.deps.queues.receive("requests-high", 100, Duration::from_secs(60), Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 20);
    let outcomes = futures::future::join_all(got.iter().map(|m| dispatch(&w.deps, "requests-high", m))).await;
    for (m, outcome) in got.iter().zip(&outcomes) {
        settle(w.deps.queues.as_ref(), "requests-high", m, outcome, w.deps.clock.now(), true).await.unwrap();
    }
    drain(&w).await;
    assert_eq!(w.sms.calls().len(), 3);
    let reasons = sms_reasons(&w, &ids).await;
    assert_eq!(reasons.iter().filter(|r| r.as_deref() == Some("sent")).count(), 3, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| r.as_deref() == Some("number_rate_limited")).count(), 17, "{reasons:?}");
}

fn from(key: &str, ip: &str) -> NotificationRequest {
    let mut req = request(key, "transactional", "email", 1);
    req.requester = Some(Requester { ip: Some(ip.into()), device_id: None });
    req
}

/// The OTP endpoint limited per requester (limits per number, IP and device:
/// docs/gates.md, "Abuse guard"): beyond the IP's limit `accept` refuses with `rate_limited` naming `requester.ip` and
/// the time left, and writes nothing; a repeated request (same idempotency key) is answered as
/// before without counting; twelve concurrent requests against a limit of three accept exactly
/// three.
#[tokio::test]
async fn the_otp_endpoint_is_limited_per_requester_ip() {
    let w = world_with(guarded_by(&[("TIDINGS_REQUESTER_IP_LIMITS", "3/1h")])).await;
    let first = accept(&w, from("otp-1", "203.0.113.7")).await;
    for _ in 0..3 {
        assert_eq!(accept(&w, from("otp-1", "203.0.113.7")).await, first, "a repeat, not counted");
    }
    accept(&w, from("otp-2", "203.0.113.7")).await;
    accept(&w, from("otp-3", "203.0.113.7")).await;
    let refused = api::accept(&w.deps, &w.t, from("otp-4", "203.0.113.7")).await.unwrap_err();
    match refused {
        tidings_core::CoreError::RateLimited { field, retry_after_s, .. } => {
            assert_eq!(field, "requester.ip");
            // 19:00 UTC: the hour's window ends in an hour.
            assert_eq!(retry_after_s, 3600);
        }
        other => panic!("{other:?}"),
    }
    let records = w.feed.next_batch(1000).await.unwrap();
    let written = records.iter().filter(|r| r.key.sk == keys::NOTIFICATION_SK && r.is_insert()).count();
    assert_eq!(written, 3, "three notifications written, not four");
    w.feed.commit(&records).await.unwrap();
    // Another address is not limited; the next window is open again.
    accept(&w, from("otp-5", "198.51.100.1")).await;
    w.clock.advance(chrono::Duration::hours(1));
    accept(&w, from("otp-6", "203.0.113.7")).await;

    let concurrent = world_with(guarded_by(&[("TIDINGS_REQUESTER_IP_LIMITS", "3/1h")])).await;
    let results = futures::future::join_all(
        (0..12).map(|i| api::accept(&concurrent.deps, &concurrent.t, from(&format!("c-{i}"), "2001:db8::1"))),
    )
    .await;
    let accepted = results.iter().filter(|r| r.is_ok()).count();
    let limited = results.iter().filter(|r| matches!(r, Err(tidings_core::CoreError::RateLimited { .. }))).count();
    assert_eq!((accepted, limited), (3, 9), "{results:?}");
}

/// Watch the share of codes sent that nobody verifies (docs/gates.md, "Abuse guard").
/// User-triggered notifications (accepted with a `requester`) are counted per template and hour,
/// and so are those the shop reports verified (once each, however often reported, in the hour they
/// were accepted): the ratio is what an operator watches for codes requested that nobody uses.
#[tokio::test]
async fn codes_nobody_verifies_show_in_the_verification_ratio() {
    use tidings_core::notify::verification;
    let w = world().await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(accept(&w, from(&format!("otp-{i}"), "203.0.113.7")).await);
    }
    let plain = accept(&w, request("not-user-triggered", "transactional", "email", 1)).await;
    let first = verification::verify(&w.deps, &w.t, &ids[0]).await.unwrap().unwrap();
    w.clock.advance(chrono::Duration::minutes(5));
    let again = verification::verify(&w.deps, &w.t, &ids[0]).await.unwrap().unwrap();
    assert_eq!(again, first, "a repeat answers the first time and counts nothing");
    assert!(verification::verify(&w.deps, &w.t, &plain).await.unwrap().is_some());
    assert_eq!(verification::verify(&w.deps, &w.t, "no-such-id").await.unwrap(), None);

    let s = verification::stats(&w.deps, &w.t, "msg", 24).await.unwrap();
    assert_eq!((s.accepted, s.verified, s.ratio), (4, 1, Some(0.25)), "{s:?}");
    assert_eq!(s.hours.len(), 1);
    assert_eq!(s.hours[0].hour, "2026-11-29T19:00:00Z");

    // The next hour: one more, verified; reported newest first, and `hours` bounds the view.
    w.clock.advance(chrono::Duration::hours(1));
    let late = accept(&w, from("otp-late", "198.51.100.1")).await;
    verification::verify(&w.deps, &w.t, &late).await.unwrap();
    let s = verification::stats(&w.deps, &w.t, "msg", 24).await.unwrap();
    let hours: Vec<(&str, u64, u64)> = s.hours.iter().map(|h| (h.hour.as_str(), h.accepted, h.verified)).collect();
    assert_eq!(hours, vec![("2026-11-29T20:00:00Z", 1, 1), ("2026-11-29T19:00:00Z", 4, 1)]);
    assert_eq!((s.accepted, s.verified), (5, 2));
    assert_eq!(verification::stats(&w.deps, &w.t, "msg", 1).await.unwrap().hours.len(), 1);
    assert!(matches!(
        verification::stats(&w.deps, &w.t, "msg", 0).await,
        Err(tidings_core::CoreError::Invalid { field, .. }) if field == "hours"
    ));
}

/// Every accept of a template counts in its hour: on DynamoDB one counter item would be written
/// by every concurrent accept transaction and refuse all but one of them (a transaction
/// conflict). The hour is spread over shard items, chosen by the notification, and summed when
/// read; an hour counted in one item before the shards still adds up.
#[tokio::test]
async fn a_templates_hourly_counts_are_spread_over_shards_and_summed() {
    use tidings_core::notify::verification;
    use tidings_core::ports::{Cond, Item, Key};
    let w = world().await;
    let results = futures::future::join_all(
        (0..40).map(|i| api::accept(&w.deps, &w.t, from(&format!("shard-{i}"), "203.0.113.9"))),
    )
    .await;
    let ids: Vec<String> = results.into_iter().map(|r| r.unwrap().notification_id).collect();
    for id in ids.iter().take(10) {
        verification::verify(&w.deps, &w.t, id).await.unwrap();
    }
    let pk = keys::verification_pk(&w.t, "msg");
    let page = w.deps.table.query(&pk, keys::VERIFICATION_HOUR_PREFIX, Default::default()).await.unwrap();
    assert!(page.items.len() > 4, "40 accepts spread over several items: {}", page.items.len());
    assert!(page.items.len() as u32 <= verification::COUNTER_SHARDS);
    // An hour counted the way it was before shards: one item, no shard suffix.
    let legacy = Item::new(
        Key::new(pk.clone(), format!("{}2026112919", keys::VERIFICATION_HOUR_PREFIX)),
        serde_json::from_value(serde_json::json!({"accepted": 5, "verified": 2})).unwrap(),
    );
    w.deps.table.put(legacy, Cond::Always).await.unwrap();
    let s = verification::stats(&w.deps, &w.t, "msg", 24).await.unwrap();
    assert_eq!(s.hours.len(), 1, "{s:?}");
    assert_eq!((s.hours[0].hour.as_str(), s.accepted, s.verified), ("2026-11-29T19:00:00Z", 45, 12), "{s:?}");
}

/// SMS go only to the allowed countries (`TIDINGS_SMS_COUNTRIES`), whatever the category: a
/// number elsewhere is suppressed (`country_not_allowed`), the same notification's email goes.
#[tokio::test]
async fn sms_to_a_country_not_allowed_is_suppressed() {
    let w = world_with(guarded("+1,+44", "")).await;
    let mut req = request("otp-abroad", "transactional", "sms", 1);
    req.channels = Some(vec![Channel::Sms, Channel::Email]);
    let id = accept(&w, req).await;
    drain(&w).await;
    assert!(w.sms.calls().is_empty());
    assert_eq!(w.email.calls().len(), 1);
    assert_eq!(sms_reasons(&w, &[id]).await, vec![Some("country_not_allowed".into())]);
}

/// Pitfall: ignoring the upstream gap where a transaction commits and its event is never sent
/// (docs/delivery.md, "Accept"). Accepting is one write, and that write is the
/// outbox: a process that dies right after it loses nothing, the change stream still has the
/// record and the relay queues it (again, harmlessly, if it had already).
#[tokio::test]
async fn committed_but_never_published_event() {
    let w = world().await;
    let id = accept(&w, request("order-1-shipped", "transactional", "sms", 1)).await;
    // "Crash": nothing was queued by the API itself.
    assert_eq!(depth(&w, "requests-high").await, 0);
    // The relay reads the committed write; a relay that dies before committing reads it again.
    let records = w.feed.next_batch(100).await.unwrap();
    assert!(records.iter().any(|r| r.key.sk == keys::NOTIFICATION_SK && r.is_insert()), "{records:?}");
    relay::handle_changes(&w.deps, &records).await.unwrap();
    let again = w.feed.next_batch(100).await.unwrap();
    assert_eq!(again.len(), records.len(), "not committed: delivered again");
    relay::handle_changes(&w.deps, &again).await.unwrap();
    w.feed.commit(&again).await.unwrap();
    assert_eq!(depth(&w, "requests-high").await, 2);
    drain(&w).await;
    assert_eq!(w.sms.calls().len(), 1, "two relays of one event: one send");
    assert_eq!(delivery(&w, &id, Channel::Sms).await.status, DeliveryStatus::Sent);
}

/// Pitfall: quiet hours and the frequency cap blocking the OTP too. At 03:00 in the user's zone,
/// inside quiet hours and over the day's marketing cap, the OTP goes at once; marketing waits for
/// the window's end (deferred, not dropped) and the one over the cap is suppressed.
#[tokio::test]
async fn quiet_hours_and_frequency_caps_block_the_otp() {
    let w = world().await;
    let quiet = PreferencesInput {
        quiet_hours: Some(Some(QuietHours { start: "22:00".into(), end: "08:00".into() })),
        ..PreferencesInput::default()
    };
    preferences::put(&w.deps, &w.t, "u1", quiet).await.unwrap();
    // Use up the day's cap (3) before the quiet hours (at 21:00 local = 13:00 UTC).
    w.clock.set(DateTime::parse_from_rfc3339("2026-11-29T13:00:00Z").unwrap().with_timezone(&Utc));
    for i in 0..3 {
        accept(&w, request(&format!("early-{i}"), "marketing", "email", i)).await;
    }
    drain(&w).await;
    assert_eq!(w.email.calls().len(), 3);
    w.clock.set(start()); // 03:00 in Shanghai
    let promo = accept(&w, request("promo", "marketing", "sms", 1)).await;
    let otp = accept(&w, request("otp", "transactional", "sms", 2)).await;
    drain(&w).await;
    assert_eq!(delivery(&w, &otp, Channel::Sms).await.status, DeliveryStatus::Sent, "the OTP goes at 3 a.m.");
    let d = delivery(&w, &promo, Channel::Sms).await;
    assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Pending, Some("quiet_hours")));
    assert_eq!(d.deferred_until.as_deref(), Some("2026-11-30T00:00:00Z"), "08:00 in Shanghai");
    assert_eq!(w.sms.calls().len(), 1);
    // Back on the local day of the three emails (22:00 in Shanghai, quiet hours removed): the
    // fourth marketing email is over the cap.
    w.clock.set(DateTime::parse_from_rfc3339("2026-11-29T14:00:00Z").unwrap().with_timezone(&Utc));
    preferences::put(&w.deps, &w.t, "u1", PreferencesInput { quiet_hours: Some(None), ..Default::default() })
        .await
        .unwrap();
    let fourth = accept(&w, request("fourth", "marketing", "email", 4)).await;
    let otp2 = accept(&w, request("otp-2", "transactional", "email", 5)).await;
    drain(&w).await;
    let d = delivery(&w, &fourth, Channel::Email).await;
    assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("frequency_cap")));
    assert_eq!(delivery(&w, &otp2, Channel::Email).await.status, DeliveryStatus::Sent, "caps never hold an OTP");
    // The deferred promo goes when its window ends (the timer is a bucket fired by tick).
    w.clock.set(DateTime::parse_from_rfc3339("2026-11-30T00:00:30Z").unwrap().with_timezone(&Utc));
    tidings_core::timers::tick(&w.deps).await.unwrap();
    drain(&w).await;
    assert_eq!(delivery(&w, &promo, Channel::Sms).await.status, DeliveryStatus::Sent);
}

/// Pitfall: ignoring the providers' rate limits and failover (docs/gates.md). A 429 is transient
/// and its `Retry-After` is honoured: the task comes back no sooner, the delivery stays `pending`
/// (not failed, not dead), and it is sent once when the provider takes it. (The shared rate gates,
/// the circuit breaker and SMS failover are in `gates`; see `tests/campaign.rs`:
/// `a_429_with_retry_after_slows_the_gate_down`,
/// `the_breaker_opens_and_sms_fails_over_then_returns`.)
#[tokio::test]
async fn provider_rate_limits_and_failover_ignored() {
    let w = world().await;
    w.sms
        .script
        .lock()
        .unwrap()
        .push(ProviderError::Transient { reason: "429".into(), retry_after: Some(Duration::from_secs(90)) });
    let id = accept(&w, request("otp", "transactional", "sms", 1)).await;
    relay_once(&w).await;
    run_queue(&w, "requests-high").await;
    let outcomes = run_queue(&w, "sms-high").await;
    match &outcomes[..] {
        [Outcome::Retry(d)] => assert!(*d >= Duration::from_secs(90), "Retry-After ignored: {d:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(delivery(&w, &id, Channel::Sms).await.status, DeliveryStatus::Pending);
    w.clock.advance(chrono::Duration::seconds(60));
    assert!(run_queue(&w, "sms-high").await.is_empty(), "not before Retry-After");
    w.clock.advance(chrono::Duration::seconds(60));
    run_queue(&w, "sms-high").await;
    assert_eq!(delivery(&w, &id, Channel::Sms).await.status, DeliveryStatus::Sent);
    assert_eq!(w.sms.calls().len(), 2);
}

/// The policy's order (`notify::policy`, docs/delivery.md, "Orchestrate"): global unsubscribe
/// before category before channel before address.
#[tokio::test]
async fn checks_run_in_the_seeds_order_and_record_their_reason() {
    let w = world().await;
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"unsubscribe_all": true, "categories": {"marketing": false}, "channels": {"sms": false}}),
            "sms",
            "unsubscribed",
        ),
        (
            json!({"unsubscribe_all": false, "categories": {"marketing": false}, "channels": {"sms": false}}),
            "sms",
            "category_off",
        ),
        (json!({"categories": {"marketing": true}, "channels": {"sms": false}}), "sms", "channel_off"),
        (json!({"channels": {"sms": true}}), "push", "no_address"),
    ];
    for (i, (prefs, channel, reason)) in cases.into_iter().enumerate() {
        let input: PreferencesInput = serde_json::from_value(prefs).unwrap();
        preferences::put(&w.deps, &w.t, "u1", input).await.unwrap();
        w.clock.advance(chrono::Duration::seconds(1));
        let id = accept(&w, request(&format!("c{i}"), "marketing", channel, 1)).await;
        drain(&w).await;
        let d = delivery(&w, &id, Channel::parse(channel).unwrap()).await;
        assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some(reason)), "case {i}");
    }
}

/// Marketing opt-outs never stop a transactional message: a user who unsubscribed from
/// everything (and whose stored preferences still say `transactional: false`, as an old
/// version allowed) gets the one-time code. A channel turned off still stops it.
#[tokio::test]
async fn an_unsubscribed_user_still_gets_the_one_time_code_but_not_on_a_channel_turned_off() {
    let w = world().await;
    let off = PreferencesInput::default();
    preferences::put(&w.deps, &w.t, "u1", off).await.unwrap();
    let mut stored = preferences::get(&w.deps, &w.t, "u1").await.unwrap();
    stored.unsubscribe_all = true;
    stored.categories.insert("marketing".into(), false);
    stored.categories.insert("transactional".into(), false);
    stored.channels.insert("email".into(), false);
    let item =
        tidings_core::ports::Item::new(keys::preferences(&w.t, "u1"), tidings_core::ports::attrs_of(&stored).unwrap());
    w.deps.table.put(item, tidings_core::ports::Cond::Always).await.unwrap();

    let otp = accept(&w, request("otp", "transactional", "sms", 424242)).await;
    let mail = accept(&w, request("otp-mail", "transactional", "email", 424243)).await;
    let promo = accept(&w, request("promo", "marketing", "sms", 1)).await;
    drain(&w).await;
    assert_eq!(delivery(&w, &otp, Channel::Sms).await.status, DeliveryStatus::Sent);
    assert_eq!(w.sms.calls().len(), 1, "only the code, not the promotion");
    assert!(w.sms.calls()[0].body.contains("424242"));
    let d = delivery(&w, &mail, Channel::Email).await;
    assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("channel_off")));
    let d = delivery(&w, &promo, Channel::Sms).await;
    assert_eq!((d.status, d.reason.as_deref()), (DeliveryStatus::Suppressed, Some("unsubscribed")));

    // And the API refuses to turn the category off, naming the field.
    let input: PreferencesInput = serde_json::from_value(json!({"categories": {"transactional": false}})).unwrap();
    match preferences::put(&w.deps, &w.t, "u1", input).await {
        Err(tidings_core::CoreError::Invalid { field, .. }) => assert_eq!(field, "categories.transactional"),
        other => panic!("{other:?}"),
    }
}

/// A tenant's template that breaks a limit fails only its own deliveries, with `template_error`
/// and never retried: the batch they share with another tenant's OTP goes on, and the OTP is
/// sent. One template was stored without the checks at save (as before they existed), one
/// passes them and breaks its output limit only with the variables a notification brings.
#[tokio::test]
async fn a_hostile_template_fails_its_own_delivery_and_another_tenants_otp_in_the_batch_is_sent() {
    use tidings_core::ports::{Cond, Item, attrs_of};
    let w = world().await;
    let evil = TenantId::parse("shop-evil").unwrap();
    let hostile: templates::Template = serde_json::from_value(json!({"template_id": "msg", "default_locale": "en",
        "locales": {"en": {"sms": r#"{% for i in range(100000) %}{{ "x" * 100000000 }}{% endfor %}"#}}}))
    .unwrap();
    w.deps.table.put(Item::new(keys::template(&evil, "msg"), attrs_of(&hostile).unwrap()), Cond::Always).await.unwrap();
    let huge = serde_json::from_value(
        json!({"default_locale": "en", "locales": {"en": {"sms": "{% for i in range(1000) %}{{ p }}{% endfor %}"}}}),
    )
    .unwrap();
    templates::put_template(&w.deps, &evil, "huge", huge).await.unwrap();
    let user = UserInput { phone: Some("+8613800001234".into()), ..UserInput::default() };
    users::put_user(&w.deps, &evil, "u1", user).await.unwrap();
    let bad = api::accept(&w.deps, &evil, request("bad", "transactional", "sms", 1)).await.unwrap().notification_id;
    let mut big = request("big", "transactional", "sms", 1);
    big.template_id = "huge".into();
    big.params = json!({"p": "x".repeat(1000)});
    let big = api::accept(&w.deps, &evil, big).await.unwrap().notification_id;
    let good = accept(&w, request("good", "transactional", "sms", 7)).await;

    relay_once(&w).await;
    let started = std::time::Instant::now();
    let outcomes = run_queue(&w, "requests-high").await;
    assert_eq!(outcomes.len(), 3, "one batch of the three: {outcomes:?}");
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Done)), "{outcomes:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    drain(&w).await;
    for id in [&bad, &big] {
        let d: Delivery =
            w.deps.table.get(&keys::delivery(&evil, id, "u1", Channel::Sms)).await.unwrap().unwrap().parse().unwrap();
        assert_eq!(d.status, DeliveryStatus::Failed);
        assert!(d.last_error.as_deref().unwrap_or_default().starts_with("template_error: limit"), "{d:?}");
        assert_eq!(d.attempts, 0, "never tried at the provider");
    }
    assert_eq!(delivery(&w, &good, Channel::Sms).await.status, DeliveryStatus::Sent);
    let calls = w.sms.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body, "Code 7");
}

/// `local_time`: the same wall-clock time in each user's zone, one timer per zone.
#[tokio::test]
async fn local_time_sends_at_each_users_wall_clock() {
    let w = world().await; // u1 is in Shanghai (UTC+8)
    users::put_user(&w.deps, &w.t, "u2", UserInput { phone: Some("+14155550100".into()), ..UserInput::default() })
        .await
        .unwrap(); // no zone: UTC
    w.clock.set(DateTime::parse_from_rfc3339("2026-11-29T00:00:00Z").unwrap().with_timezone(&Utc));
    let req: NotificationRequest = serde_json::from_value(json!({"recipients": {"user_ids": ["u1", "u2"]},
        "template_id": "msg", "params": {"n": 1}, "category": "marketing", "channels": ["sms"],
        "send_at": "2026-11-29T09:00:00Z", "local_time": true}))
    .unwrap();
    let accepted = api::accept(&w.deps, &w.t, req).await.unwrap();
    assert_eq!(accepted.status, tidings_core::notify::model::NotificationStatus::Scheduled);
    drain(&w).await;
    let step = |to: &str| {
        w.clock.set(DateTime::parse_from_rfc3339(to).unwrap().with_timezone(&Utc));
    };
    step("2026-11-29T00:59:00Z");
    tidings_core::timers::tick(&w.deps).await.unwrap();
    drain(&w).await;
    assert!(w.sms.calls().is_empty(), "09:00 Shanghai is 01:00 UTC");
    step("2026-11-29T01:00:30Z");
    tidings_core::timers::tick(&w.deps).await.unwrap();
    drain(&w).await;
    let to: Vec<String> = w.sms.calls().iter().map(|c| c.user_id.clone()).collect();
    assert_eq!(to, vec!["u1"]);
    step("2026-11-29T09:00:30Z");
    tidings_core::timers::tick(&w.deps).await.unwrap();
    drain(&w).await;
    let to: Vec<String> = w.sms.calls().iter().map(|c| c.user_id.clone()).collect();
    assert_eq!(to, vec!["u1", "u2"]);
    let view = api::get_notification(&w.deps, &w.t, &accepted.notification_id).await.unwrap().unwrap();
    assert_eq!(view.status, tidings_core::notify::model::NotificationStatus::Completed, "{view:?}");
}

/// `local_time` for a segment: the pages are expanded when the earliest zone's 09:00 comes
/// (UTC+14), members whose 09:00 is later wait as deferred deliveries (`local_time`), and each
/// is sent at 09:00 in their own zone, once; the campaign completes after the last zone.
#[tokio::test]
async fn local_time_campaign_sends_each_member_at_their_own_wall_clock() {
    let w = world().await;
    let members = [("s1", Some("Asia/Shanghai")), ("s2", Some("America/New_York")), ("s3", None)];
    for (i, (id, zone)) in members.iter().enumerate() {
        let input = UserInput {
            phone: Some(format!("+1415555020{i}")),
            timezone: zone.map(str::to_owned),
            tags: vec!["local".into()],
            ..UserInput::default()
        };
        users::put_user(&w.deps, &w.t, id, input).await.unwrap();
    }
    let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
    w.clock.set(at("2026-11-28T12:00:00Z"));
    let req: NotificationRequest = serde_json::from_value(json!({"recipients": {"segment": "local"},
        "template_id": "msg", "params": {"n": 1}, "category": "marketing", "channels": ["sms"],
        "send_at": "2026-11-29T09:00:00Z", "local_time": true}))
    .unwrap();
    let accepted = api::accept(&w.deps, &w.t, req).await.unwrap();
    assert_eq!(accepted.status, tidings_core::notify::model::NotificationStatus::Scheduled);
    drain(&w).await;
    let sent_to = || w.sms.calls().iter().map(|c| c.user_id.clone()).collect::<Vec<String>>();
    step(&w, at("2026-11-28T18:59:00Z")).await;
    let view = api::get_notification(&w.deps, &w.t, &accepted.notification_id).await.unwrap().unwrap();
    assert_eq!(view.expanded, 0, "nothing expanded before 09:00 in UTC+14: {view:?}");
    step(&w, at("2026-11-28T19:00:30Z")).await;
    assert!(sent_to().is_empty(), "expanded at UTC+14's 09:00, but no member lives there");
    let view = api::get_notification(&w.deps, &w.t, &accepted.notification_id).await.unwrap().unwrap();
    assert_eq!((view.expanded, view.counts.queued), (3, 3), "{view:?}");
    let waiting = w
        .deps
        .table
        .get(&keys::delivery(&w.t, &accepted.notification_id, "s2", Channel::Sms))
        .await
        .unwrap()
        .unwrap()
        .parse::<Delivery>()
        .unwrap();
    assert_eq!((waiting.status, waiting.reason.as_deref()), (DeliveryStatus::Pending, Some("local_time")));
    step(&w, at("2026-11-29T00:59:00Z")).await;
    assert!(sent_to().is_empty(), "09:00 in Shanghai is 01:00 UTC");
    step(&w, at("2026-11-29T01:00:30Z")).await;
    assert_eq!(sent_to(), vec!["s1"]);
    step(&w, at("2026-11-29T09:00:30Z")).await;
    assert_eq!(sent_to(), vec!["s1", "s3"], "no zone: UTC");
    step(&w, at("2026-11-29T13:59:00Z")).await;
    assert_eq!(sent_to(), vec!["s1", "s3"]);
    step(&w, at("2026-11-29T14:00:30Z")).await;
    assert_eq!(sent_to(), vec!["s1", "s3", "s2"], "09:00 in New York (EST) is 14:00 UTC");
    let view = api::get_notification(&w.deps, &w.t, &accepted.notification_id).await.unwrap().unwrap();
    assert_eq!(view.status, tidings_core::notify::model::NotificationStatus::Completed, "{view:?}");
    assert_eq!(view.counts.sent, 3, "{view:?}");
}

/// Moves the clock, fires the due timers, runs everything.
async fn step(w: &World, to: DateTime<Utc>) {
    w.clock.set(to);
    tidings_core::timers::tick(&w.deps).await.unwrap();
    drain(w).await;
}

/// The push service's own word (docs/people.md, "Devices"): SNS's application events (a
/// `DeliveryFailure` naming a dead token, an `EndpointDeleted`) delete the device they name, in
/// whichever tenant it is, as a send answered as gone would. A failure that says nothing about the
/// token keeps the device; an endpoint nobody has is ignored; a token that moved to another user is
/// deleted from that user.
#[tokio::test]
async fn push_service_events_delete_dead_tokens_and_keep_the_rest() {
    use tidings_core::people::devices::{self, DeviceInput};
    use tidings_core::ports::Platform;
    use tidings_core::tracking::receipts::apply_push_event;
    let w = world().await;
    let other = TenantId::parse("shop-b").unwrap();
    let register = |t: TenantId, user: &'static str, token: &'static str| {
        let deps = w.deps.clone();
        async move {
            let input = DeviceInput { user_id: user.into(), platform: Platform::Ios, token: token.into() };
            devices::register(&deps, &t, input).await.unwrap().0
        }
    };
    let a = register(w.t.clone(), "u1", "tok-a").await;
    let b = register(w.t.clone(), "u2", "tok-b").await;
    let c = register(other.clone(), "u1", "tok-c").await;
    let failure = |endpoint: &str, failure_type: &str| {
        json!({"DeliveryAttempts": 1, "EndpointArn": endpoint, "EventType": "DeliveryFailure",
               "FailureMessage": "x", "FailureType": failure_type, "MessageId": "m1",
               "Resource": "arn:aws:sns:us-east-1:1:app/APNS/shop", "Service": "SNS", "Time": "2026-11-29T19:00:00.000Z"})
    };
    let tokens = |t: TenantId, user: &'static str| {
        let deps = w.deps.clone();
        async move { devices::list(&deps, &t, user).await.unwrap().into_iter().map(|d| d.token).collect::<Vec<_>>() }
    };

    // Not about the token: kept.
    let o = apply_push_event(&w.deps, &failure(&a.address, "MessageTooBig")).await.unwrap();
    assert_eq!((o.matched, o.removed), (true, false));
    assert_eq!(tokens(w.t.clone(), "u1").await, ["tok-a"]);
    // Dead token: deleted, once; the others untouched.
    let o = apply_push_event(&w.deps, &failure(&a.address, "EndpointDisabled")).await.unwrap();
    assert_eq!((o.matched, o.removed), (true, true));
    assert!(tokens(w.t.clone(), "u1").await.is_empty());
    assert_eq!(tokens(w.t.clone(), "u2").await, ["tok-b"]);
    assert_eq!(tokens(other.clone(), "u1").await, ["tok-c"], "another tenant's device of the same user id");
    let o = apply_push_event(&w.deps, &failure(&a.address, "EndpointDisabled")).await.unwrap();
    assert_eq!((o.matched, o.removed), (false, false), "a repeat finds nothing");
    // The endpoint deleted at the push service: the device goes, in its own tenant.
    let deleted = json!({"EndpointArn": c.address, "EventType": "EndpointDeleted",
                         "Resource": "arn:aws:sns:us-east-1:1:app/APNS/shop", "Service": "SNS", "Time": "2026-11-29T19:00:00.000Z"});
    assert!(apply_push_event(&w.deps, &deleted).await.unwrap().removed);
    assert!(tokens(other.clone(), "u1").await.is_empty());
    // Unknown endpoint, malformed event: ignored.
    assert!(!apply_push_event(&w.deps, &failure("arn:nobody", "EndpointDisabled")).await.unwrap().matched);
    assert!(!apply_push_event(&w.deps, &json!({"EventType": "DeliveryFailure"})).await.unwrap().matched);
    // A token that moved from u2 to u3: the event deletes u3's device, and u2 has none left.
    register(w.t.clone(), "u3", "tok-b").await;
    assert!(apply_push_event(&w.deps, &failure(&b.address, "InvalidPlatformToken")).await.unwrap().removed);
    assert!(tokens(w.t.clone(), "u2").await.is_empty());
    assert!(tokens(w.t.clone(), "u3").await.is_empty());
    // Registered again after its deletion: known again.
    register(w.t.clone(), "u1", "tok-a").await;
    assert!(apply_push_event(&w.deps, &failure(&a.address, "EndpointDisabled")).await.unwrap().removed);
}

/// The push service gives one token one endpoint: a token registered in two tenants (one
/// phone, two shops' apps on one push project) shares it. Unregistering it in the tenant that
/// registered it first leaves the endpoint to the other; the last one deletes it.
#[tokio::test]
async fn unregistering_a_token_another_tenant_uses_keeps_its_endpoint() {
    use tidings_core::people::devices::{self, DeviceInput};
    use tidings_core::ports::Platform;
    let w = world().await;
    let other = TenantId::parse("shop-b").unwrap();
    for t in [&w.t, &other] {
        let input = DeviceInput { user_id: "u1".into(), platform: Platform::Android, token: "tok-shared".into() };
        devices::register(&w.deps, t, input).await.unwrap();
    }
    devices::unregister(&w.deps, &w.t, "tok-shared").await.unwrap();
    assert!(w.push.unregistered.lock().unwrap().is_empty(), "shop-b still sends to it");
    assert!(devices::list(&w.deps, &w.t, "u1").await.unwrap().is_empty());
    assert_eq!(devices::list(&w.deps, &other, "u1").await.unwrap().len(), 1);
    devices::unregister(&w.deps, &other, "tok-shared").await.unwrap();
    assert_eq!(*w.push.unregistered.lock().unwrap(), ["tok-shared"]);
}

/// The other order (docs/people.md, "Devices"): tenant B registers a token tenant A registered
/// first, then deletes it. The endpoint is A's too: B's delete leaves it, A still has the device
/// and the push service's events about it still find A's; A's own delete, the last, deletes it.
#[tokio::test]
async fn another_tenant_deleting_a_token_it_registered_after_us_keeps_our_endpoint() {
    use tidings_core::people::devices::{self, DeviceInput};
    use tidings_core::ports::Platform;
    let w = world().await;
    let other = TenantId::parse("shop-b").unwrap();
    let mut address = String::new();
    for t in [&w.t, &other] {
        let input = DeviceInput { user_id: "u1".into(), platform: Platform::Ios, token: "tok-a".into() };
        address = devices::register(&w.deps, t, input).await.unwrap().0.address;
    }
    devices::unregister(&w.deps, &other, "tok-a").await.unwrap();
    assert!(w.push.unregistered.lock().unwrap().is_empty(), "shop-a still sends to it");
    assert!(devices::list(&w.deps, &other, "u1").await.unwrap().is_empty());
    assert_eq!(devices::list(&w.deps, &w.t, "u1").await.unwrap().len(), 1);
    let (owner, _) =
        devices::by_address(&w.deps, &address).await.unwrap().expect("the endpoint still maps to a device");
    assert_eq!(owner, w.t, "the push service's events about it reach shop-a's device");
    // B registering and deleting again, or a B user erased, changes nothing for A either.
    let input = DeviceInput { user_id: "u2".into(), platform: Platform::Ios, token: "tok-a".into() };
    devices::register(&w.deps, &other, input).await.unwrap();
    devices::unregister(&w.deps, &other, "tok-a").await.unwrap();
    assert!(w.push.unregistered.lock().unwrap().is_empty());
    devices::unregister(&w.deps, &w.t, "tok-a").await.unwrap();
    assert_eq!(*w.push.unregistered.lock().unwrap(), ["tok-a"], "the last registration deletes it");
    assert!(devices::by_address(&w.deps, &address).await.unwrap().is_none());
}

async fn queued_requests(w: &World) -> u64 {
    let mut n = 0;
    for q in ["requests-high", "requests-normal", "requests-low"] {
        n += depth(w, q).await;
    }
    n
}

/// Pitfall: the outbox's stream record is lost (given up on after the mapping's retries, trimmed
/// before it was replayed) and the notification stays `accepted` for good. The tick's sweep
/// queues it again once it is older than the configured age, each minute once; a repeated
/// relay of the same notification (sweep, replay, a late stream record) sends nothing twice.
#[tokio::test]
async fn a_notification_whose_stream_record_was_lost_is_swept_once_old_enough() {
    use tidings_core::notify::relay::Redriven;
    use tidings_core::notify::sweep;
    let w = world_with(CoreConfig {
        retry_base: Duration::from_secs(1),
        relay_sweep_after: Duration::from_secs(300),
        ..CoreConfig::default()
    })
    .await;
    let id = accept(&w, request("lost-1", "transactional", "email", 1)).await;
    // The stream record is lost: read and committed without being relayed.
    let records = w.feed.next_batch(1000).await.unwrap();
    w.feed.commit(&records).await.unwrap();
    assert_eq!(sweep::sweep(&w.deps).await.unwrap().redriven, 0, "too young");
    assert_eq!(sweep::still_accepted(&w.deps, 1).await.unwrap(), 1, "left in the outbox");
    w.clock.advance(chrono::Duration::minutes(4));
    assert_eq!(sweep::still_accepted(&w.deps, 1).await.unwrap(), 0, "accepted four minutes ago");
    assert_eq!(sweep::still_accepted(&w.deps, 5).await.unwrap(), 1, "within the last five minutes");
    assert_eq!(sweep::sweep(&w.deps).await.unwrap().redriven, 0, "still younger than the age");
    assert_eq!(queued_requests(&w).await, 0);
    w.clock.advance(chrono::Duration::minutes(3));
    let report = sweep::sweep(&w.deps).await.unwrap();
    assert_eq!((report.checked, report.redriven), (1, 1), "{report:?}");
    assert_eq!(sweep::sweep(&w.deps).await.unwrap().checked, 0, "each minute is swept once");
    // Two more relays of the same notification before any is handled.
    let key = keys::notification(&w.t, &id);
    assert_eq!(relay::redrive(&w.deps, &key).await.unwrap(), Redriven::Queued);
    assert_eq!(relay::redrive(&w.deps, &key).await.unwrap(), Redriven::Queued);
    assert_eq!(queued_requests(&w).await, 3);
    drain(&w).await;
    assert_eq!(delivery(&w, &id, Channel::Email).await.status, DeliveryStatus::Sent);
    assert_eq!(w.email.calls().len(), 1, "three requests for one notification: one send");
    assert_eq!(relay::redrive(&w.deps, &key).await.unwrap(), Redriven::NothingToDo, "no longer accepted");
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_ne!(view.status, NotificationStatus::Accepted);
    assert_eq!(sweep::still_accepted(&w.deps, 10).await.unwrap(), 0, "relayed and handled");
}

/// Header injection (docs/templates.md, "Header fields"): a placeholder's value with a line
/// break (`1\r\nBcc: victim@example.com`) reaches the email provider as one subject line, the
/// break a space; the body keeps its lines.
#[tokio::test]
async fn a_line_break_from_params_never_reaches_an_email_header() {
    let w = world().await;
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "Order {{ order_id }}\u{2028}shipped", "email_body": "Order {{ order_id }}"}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "shipped", input).await.unwrap();
    let req = serde_json::from_value(json!({"idempotency_key": "hdr", "recipients": {"user_ids": ["u1"]},
        "template_id": "shipped", "params": {"order_id": "1\r\nBcc: victim@example.com\n\u{85}x"},
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    accept(&w, req).await;
    drain(&w).await;
    let calls = w.email.calls();
    assert_eq!(calls.len(), 1);
    let subject = calls[0].subject.clone().unwrap();
    assert!(!subject.chars().any(|c| c.is_control() || c == '\u{2028}'), "one line: {subject:?}");
    assert_eq!(subject, "Order 1  Bcc: victim@example.com  x shipped");
    for (name, value) in &calls[0].headers {
        assert!(!format!("{name}{value}").chars().any(char::is_control), "{name}: {value:?}");
    }
    assert!(calls[0].body.contains('\n'), "the body keeps its lines: {:?}", calls[0].body);
}

/// Erasure (docs/people.md, "Erasure"): the one-click unsubscribe link of an email sent before
/// the user was erased writes nothing (no preferences come back), and answers as it would. Once
/// the user is written again, a link of a notification accepted since works as usual.
#[tokio::test]
async fn an_erased_users_unsubscribe_link_writes_nothing() {
    use tidings_core::people::erasure;
    use tidings_core::tracking::{self, Claims, TokenKind};
    let w = world().await;
    let before = accept(&w, request("m-before", "marketing", "email", 1)).await;
    drain(&w).await;
    erasure::erase(&w.deps, &w.t, "u1").await.unwrap();
    let link = |n: &str| Claims {
        k: TokenKind::Unsubscribe,
        t: w.t.clone(),
        n: n.to_owned(),
        u: "u1".into(),
        c: Channel::Email,
        url: None,
        s: None,
    };
    let prefs_item = || async {
        let prefs = preferences::get(&w.deps, &w.t, "u1").await.unwrap();
        (prefs.updated_at.clone(), prefs.categories.get("marketing").copied())
    };
    tracking::unsubscribe(&w.deps, &link(&before)).await.unwrap();
    assert_eq!(prefs_item().await, (String::new(), None), "nothing written for an erased user");
    // Written again: the old link still changes nothing, a new one works.
    users::put_user(&w.deps, &w.t, "u1", UserInput { email: Some("b@example.com".into()), ..UserInput::default() })
        .await
        .unwrap();
    tracking::unsubscribe(&w.deps, &link(&before)).await.unwrap();
    assert_eq!(prefs_item().await.1, None, "a link from before the erasure is not the new user's");
    w.clock.advance(chrono::Duration::seconds(1));
    let after = accept(&w, request("m-after", "marketing", "email", 2)).await;
    tracking::unsubscribe(&w.deps, &link(&after)).await.unwrap();
    assert_eq!(prefs_item().await.1, Some(false), "the user written again unsubscribes");
}
