//! Back-in-stock alerts against the embedded store (SQLite), through the ports only, with the
//! manual clock. Every pitfall of docs/restock.md has a `pitfall_*` test, and every item of
//! the launch review (unique constraint, event plus scan, batch idempotency, paced batches, one
//! message per user, retry cap and manual resend) a `review_*` test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tidings_core::inventory::{self, AdjustmentRequest, OrderLine, OrderRequest, WarmUpRequest};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{ChangeFeed, ManualClock, OutboundMessage, Provider, ProviderError, ProviderReceipt};
use tidings_core::restock::{self, NoticeStatus, RestockConfig, StockEvent, SubscriptionRequest, SubscriptionStatus};
use tidings_core::{CoreConfig, Deps, TenantId};
use tidings_embedded::test_world::{Around, Call, TestWorld, Wrapped};
use tidings_embedded::{EmbeddedChangeFeed, EmbeddedStore};

/// What the fake email provider does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Ok,
    Transient,
    Permanent,
}

/// Records accepted emails; can be told to fail.
struct Recorder {
    sent: Mutex<Vec<OutboundMessage>>,
    calls: Mutex<Vec<DateTime<Utc>>>,
    mode: Mutex<Mode>,
    clock: Arc<ManualClock>,
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        use tidings_core::ports::Clock;
        self.calls.lock().unwrap().push(self.clock.now());
        match *self.mode.lock().unwrap() {
            Mode::Ok => {
                self.sent.lock().unwrap().push(m.clone());
                Ok(ProviderReceipt { provider_message_id: format!("m{}", self.sent.lock().unwrap().len()) })
            }
            Mode::Transient => Err(ProviderError::transient("503")),
            Mode::Permanent => Err(ProviderError::Permanent {
                reason: "unsubscribed".into(),
                code: tidings_core::ports::PermanentCode::Rejected,
            }),
        }
    }
}

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    feed: EmbeddedChangeFeed,
    email: Arc<Recorder>,
    store: EmbeddedStore,
    t: TenantId,
}

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T00:00:00Z").unwrap().with_timezone(&Utc)
}

fn config(restock: RestockConfig) -> CoreConfig {
    CoreConfig {
        retry_base: Duration::from_secs(1),
        retry_cap: Duration::from_secs(2),
        max_receives: 2,
        restock,
        ..CoreConfig::default()
    }
}

fn fast() -> RestockConfig {
    RestockConfig { batch_pause: Duration::ZERO, wave_factor: 0, ..RestockConfig::default() }
}

fn world_with(restock: RestockConfig) -> World {
    let clock = Arc::new(ManualClock::new(start()));
    let email = Arc::new(Recorder {
        sent: Mutex::new(Vec::new()),
        calls: Mutex::new(Vec::new()),
        mode: Mutex::new(Mode::Ok),
        clock: clock.clone(),
    });
    let tw = TestWorld::builder()
        .manual_clock(clock.clone())
        .all_queues(2)
        .email(email.clone())
        .config(config(restock))
        .build();
    World {
        clock,
        feed: tw.feed("restock-test"),
        email,
        deps: tw.deps,
        store: tw.store,
        t: TenantId::parse("shop-a").unwrap(),
    }
}

fn world() -> World {
    world_with(fast())
}

/// Feeds the change stream to the relay and runs every queue until nothing is left to do now.
async fn pump(w: &World) {
    tidings_embedded::test_world::drain(&w.deps, &w.feed).await;
}

/// Moves the clock (firing due timers) and lets everything run.
async fn advance(w: &World, secs: i64) {
    w.clock.advance(chrono::Duration::seconds(secs));
    tidings_core::timers::tick(&w.deps).await.unwrap();
    pump(w).await;
}

/// Past the merge window, so merged messages go out.
async fn settle(w: &World) {
    pump(w).await;
    advance(w, 61).await;
    advance(w, 5).await;
}

async fn user(w: &World, id: &str) {
    let input = UserInput { email: Some(format!("{id}@example.com")), ..UserInput::default() };
    users::put_user(&w.deps, &w.t, id, input).await.unwrap();
}

async fn sku(w: &World, id: &str, on_hand: i64) {
    let req = WarmUpRequest { on_hand, shards: None, category: None };
    inventory::warm_up(&w.deps, &w.t, id, &req).await.unwrap();
}

async fn restock_by(w: &World, id: &str, delta: i64, key: &str) {
    let req = AdjustmentRequest::new(delta, "purchase_order", key);
    inventory::adjust(&w.deps, &w.t, id, &req).await.unwrap();
}

async fn subscribe(w: &World, user_id: &str, sku_id: &str) -> (String, bool) {
    let (sub, created) = restock::subscribe(&w.deps, &w.t, &SubscriptionRequest::new(user_id, sku_id)).await.unwrap();
    (sub.subscription_id, created)
}

async fn status_of(w: &World, id: &str) -> SubscriptionStatus {
    restock::subscriptions::get(&w.deps, &w.t, id).await.unwrap().unwrap().status
}

fn emails_to(w: &World, user_id: &str) -> Vec<OutboundMessage> {
    w.email.sent.lock().unwrap().iter().filter(|m| m.user_id == user_id).cloned().collect()
}

fn email_count(w: &World) -> usize {
    w.email.sent.lock().unwrap().len()
}

/// Pitfall: a unique key without the status makes the second subscription fail.
#[tokio::test]
async fn pitfall_unique_key_without_status_blocks_second_subscription() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    let (first, created) = subscribe(&w, "u1", "A").await;
    assert!(created);
    let (again, created) = subscribe(&w, "u1", "A").await;
    assert_eq!((again.as_str(), created), (first.as_str(), false), "a repeat reuses the WAITING one");
    restock_by(&w, "A", 5, "po-1").await;
    settle(&w).await;
    assert_eq!(status_of(&w, &first).await, SubscriptionStatus::Notified);
    // Sold out again, and the user asks again: a new WAITING subscription, the old row stays.
    restock_by(&w, "A", -5, "sold").await;
    let (second, created) = subscribe(&w, "u1", "A").await;
    assert!(created);
    assert_ne!(second, first);
    let cancelled = restock::cancel(&w.deps, &w.t, &second).await.unwrap();
    assert_eq!(cancelled.status, SubscriptionStatus::Cancelled);
    let (third, created) = subscribe(&w, "u1", "A").await;
    assert!(created && third != second);
    let list = restock::list_for_user(&w.deps, &w.t, "u1", 50, None).await.unwrap();
    let statuses: Vec<_> = list.items.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        vec![SubscriptionStatus::Waiting, SubscriptionStatus::Cancelled, SubscriptionStatus::Notified],
        "newest first, every row kept"
    );
}

/// Pitfall: events only, no scan: a lost event means no alert ever.
#[tokio::test]
async fn pitfall_event_only_without_scan_never_notifies_after_a_lost_event() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    restock_by(&w, "A", 3, "po-1").await;
    // The event is lost: the stream records are consumed without being handled.
    let lost = w.feed.next_batch(1000).await.unwrap();
    w.feed.commit(&lost).await.unwrap();
    settle(&w).await;
    assert_eq!(email_count(&w), 0);
    let report = restock::scan(&w.deps).await.unwrap();
    assert_eq!(report.rounds_queued, 1);
    settle(&w).await;
    assert_eq!(emails_to(&w, "u1").len(), 1, "the scan catches what the event missed");
}

/// Pitfall: no idempotency table: event and scan both fire and the message goes twice.
#[tokio::test]
async fn pitfall_no_idempotency_table_event_and_scan_send_twice() {
    let w = world();
    for u in ["u1", "u2", "u3"] {
        user(&w, u).await;
        subscribe(&w, u, "A").await;
    }
    sku(&w, "A", 0).await;
    restock_by(&w, "A", 10, "po-1").await;
    // The scan runs before the stream is read, then the stream, then the scan again.
    restock::scan(&w.deps).await.unwrap();
    pump(&w).await;
    restock::scan(&w.deps).await.unwrap();
    restock::run_round(&w.deps, &w.t, "A", 1, None).await.unwrap();
    settle(&w).await;
    advance(&w, 61).await; // the check after the send
    for u in ["u1", "u2", "u3"] {
        assert_eq!(emails_to(&w, u).len(), 1, "{u} gets one message");
    }
    let batch = restock::batch_no("A", 1);
    let notice = restock::get_notice(&w.deps, &w.t, &batch, "u1").await.unwrap().unwrap();
    assert_eq!(notice.status, NoticeStatus::Sent);
}

/// Pitfall: pushing everyone at once, one by one, floods the channel.
#[tokio::test]
async fn pitfall_full_fanout_at_once_floods_the_channel() {
    let w = world_with(RestockConfig { batch_size: 100, ..fast() });
    sku(&w, "A", 0).await;
    for i in 0..250 {
        subscribe(&w, &format!("u{i:03}"), "A").await;
    }
    restock_by(&w, "A", 1000, "po-1").await;
    let report = restock::run_round(&w.deps, &w.t, "A", 1, None).await.unwrap();
    assert_eq!(report.claimed, 250);
    assert_eq!(report.batches, 3, "250 waiters go out in batches of 100");
    assert_eq!(report.stopped, "no_waiters");
}

/// Pitfall: several SKUs back at once, not merged: seven or eight messages to one user.
#[tokio::test]
async fn pitfall_unmerged_skus_send_seven_messages_to_one_user() {
    let w = world();
    user(&w, "u1").await;
    let skus: Vec<String> = (1..=7).map(|i| format!("S{i}")).collect();
    for s in &skus {
        sku(&w, s, 0).await;
        subscribe(&w, "u1", s).await;
    }
    for s in &skus {
        restock_by(&w, s, 2, &format!("po-{s}")).await;
    }
    settle(&w).await;
    let mails = emails_to(&w, "u1");
    assert_eq!(mails.len(), 1, "one merged message");
    for s in &skus {
        assert!(mails[0].body.contains(s.as_str()), "{s} is named: {}", mails[0].body);
    }
}

/// Pitfall: retries without backoff hammer a failing channel.
#[tokio::test]
async fn pitfall_retry_without_backoff_hammers_the_channel() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    *w.email.mode.lock().unwrap() = Mode::Transient;
    restock_by(&w, "A", 2, "po-1").await;
    pump(&w).await;
    advance(&w, 61).await; // the window closes: attempt 1
    for _ in 0..5 {
        advance(&w, 3).await; // the channel worker's own short retries run out
    }
    let after_first = w.email.calls.lock().unwrap().len();
    assert!(after_first >= 1);
    advance(&w, 30).await;
    assert_eq!(w.email.calls.lock().unwrap().len(), after_first, "no retry sooner than 1 minute");
    advance(&w, 40).await;
    for _ in 0..5 {
        advance(&w, 3).await;
    }
    let after_second = w.email.calls.lock().unwrap().len();
    assert!(after_second > after_first, "retried after 1 minute");
    advance(&w, 120).await;
    assert_eq!(w.email.calls.lock().unwrap().len(), after_second, "the next retry waits 5 minutes");
    let notice = restock::get_notice(&w.deps, &w.t, &restock::batch_no("A", 1), "u1").await.unwrap().unwrap();
    assert_eq!(notice.status, NoticeStatus::Failed);
    assert_eq!(notice.attempts, 2);
}

/// Launch review: a sku + user unique constraint, and a state machine covering
/// WAITING/NOTIFIED/CANCELLED (docs/restock.md, "Subscriptions").
#[tokio::test]
async fn review_unique_constraint_on_sku_and_user_and_state_machine() {
    let w = world();
    sku(&w, "A", 0).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let deps = w.deps.clone();
        let t = w.t.clone();
        tasks.push(tokio::spawn(async move {
            let req = SubscriptionRequest { spu_id: Some("P1".into()), ..SubscriptionRequest::new("u1", "A") };
            restock::subscribe(&deps, &t, &req).await.unwrap().0.subscription_id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "concurrent subscribes share one WAITING subscription");
    let (cancel_me, _) = subscribe(&w, "u2", "A").await;
    restock::cancel(&w.deps, &w.t, &cancel_me).await.unwrap();
    let (old, _) = subscribe(&w, "u3", "B").await;
    user(&w, "u1").await;
    restock_by(&w, "A", 1, "po").await;
    settle(&w).await;
    assert_eq!(status_of(&w, &ids[0]).await, SubscriptionStatus::Notified);
    assert_eq!(status_of(&w, &cancel_me).await, SubscriptionStatus::Cancelled);
    assert!(emails_to(&w, "u2").is_empty(), "a cancelled subscriber gets nothing");
    // WAITING past the maximum age (90 days) expires in the scan.
    w.clock.advance(chrono::Duration::days(91));
    let report = restock::scan(&w.deps).await.unwrap();
    assert_eq!(report.expired, 1);
    assert_eq!(status_of(&w, &old).await, SubscriptionStatus::Expired);
    assert!(restock::cancel(&w.deps, &w.t, &old).await.is_err(), "EXPIRED cannot be cancelled");
}

/// Launch review: real-time events and a scheduled scan, both (docs/restock.md, "Rounds").
#[tokio::test]
async fn review_event_and_scheduled_scan_double_guarantee() {
    let w = world();
    user(&w, "u1").await;
    user(&w, "u2").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    // The upstream event on the stock-events queue (the upstream's shape, plus the tenant).
    let body =
        r#"{"event":"stock.in","skuId":"A","qty":50,"source":"purchase_order","eventId":"po-1","tenant":"shop-a"}"#;
    w.deps.queues.send_batch("stock-events", vec![tidings_core::ports::OutMessage::new(body)]).await.unwrap();
    settle(&w).await;
    assert_eq!(emails_to(&w, "u1").len(), 1, "the event path notifies");
    // Stock that never went through 0 → more (warmed up in stock): only the scan sees it.
    sku(&w, "B", 4).await;
    subscribe(&w, "u2", "B").await;
    settle(&w).await;
    assert!(emails_to(&w, "u2").is_empty());
    restock::scan(&w.deps).await.unwrap();
    settle(&w).await;
    assert_eq!(emails_to(&w, "u2").len(), 1, "the scan path notifies");
}

/// Launch review: notices deduplicated per batch; event and scan together send once
/// (docs/restock.md, "Rounds").
#[tokio::test]
async fn review_batch_idempotent_event_and_scan_send_once() {
    let w = world();
    sku(&w, "A", 0).await;
    for i in 0..40 {
        let u = format!("u{i}");
        user(&w, &u).await;
        subscribe(&w, &u, "A").await;
    }
    // The same event twice (a redelivery): applied once.
    let ev: StockEvent =
        serde_json::from_str(r#"{"event":"stock.in","skuId":"A","qty":5,"source":"purchase_order","eventId":"po-7"}"#)
            .unwrap();
    let a = restock::apply_stock_event(&w.deps, &w.t, &ev).await.unwrap();
    let b = restock::apply_stock_event(&w.deps, &w.t, &ev).await.unwrap();
    assert_eq!((a.available, b.available), (5, 5));
    // Several instances on the same round at once: the stream, two scans, a direct run.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (deps, t) = (w.deps.clone(), w.t.clone());
        tasks.push(tokio::spawn(async move { restock::run_round(&deps, &t, "A", 1, None).await.unwrap().claimed }));
    }
    restock::scan(&w.deps).await.unwrap();
    let claimed: u64 = {
        let mut n = 0;
        for t in tasks {
            n += t.await.unwrap();
        }
        n
    };
    settle(&w).await;
    assert!(claimed <= 40);
    assert_eq!(email_count(&w), 40, "every waiting user exactly once");
    for i in 0..40 {
        assert_eq!(emails_to(&w, &format!("u{i}")).len(), 1);
    }
}

/// Launch review: large restocks sharded and paced; backoff on the channel
/// (docs/restock.md, "Waves").
#[tokio::test]
async fn review_large_restock_batched_and_paced() {
    let w = world_with(RestockConfig { batch_size: 10, batch_pause: Duration::from_millis(30), ..fast() });
    sku(&w, "A", 0).await;
    for i in 0..30 {
        subscribe(&w, &format!("u{i:02}"), "A").await;
    }
    restock_by(&w, "A", 100, "po").await;
    let started = std::time::Instant::now();
    let report = restock::run_round(&w.deps, &w.t, "A", 1, None).await.unwrap();
    assert_eq!((report.claimed, report.batches), (30, 3));
    assert!(started.elapsed() >= Duration::from_millis(60), "a pause between batches");
    // Backoff on the channel: the retry delays are 1, 5 and 30 minutes by default.
    let d = RestockConfig::default().retry_delays;
    assert_eq!(d, vec![Duration::from_secs(60), Duration::from_secs(300), Duration::from_secs(1800)]);
}

/// Launch review: one user, several SKUs back: one message (docs/restock.md, "Merge per buyer").
#[tokio::test]
async fn review_one_message_per_user_for_several_skus() {
    let w = world();
    user(&w, "u1").await;
    users::put_user(
        &w.deps,
        &w.t,
        "u2",
        UserInput { email: Some("u2@example.com".into()), locale: Some("zh-CN".into()), ..UserInput::default() },
    )
    .await
    .unwrap();
    for s in ["A", "B", "C"] {
        sku(&w, s, 0).await;
        subscribe(&w, "u1", s).await;
        subscribe(&w, "u2", s).await;
    }
    restock_by(&w, "A", 1, "a").await;
    pump(&w).await;
    advance(&w, 30).await; // within the window
    restock_by(&w, "B", 1, "b").await;
    settle(&w).await;
    let mails = emails_to(&w, "u1");
    assert_eq!(mails.len(), 1);
    assert!(mails[0].body.contains('A') && mails[0].body.contains('B'), "{}", mails[0].body);
    let zh = emails_to(&w, "u2");
    assert_eq!(zh.len(), 1);
    assert!(zh[0].body.contains("到货"), "zh-CN template: {}", zh[0].body);
    // C after the window: a second message.
    restock_by(&w, "C", 1, "c").await;
    settle(&w).await;
    assert_eq!(emails_to(&w, "u1").len(), 2);
}

/// The merge window is the workflow engine's digest (docs/restock.md, "Merge per buyer"): while
/// it is open, its head is in the user's digest partition and a second SKU's notice joins it; the
/// flush closes it (the head goes) and sends one message. A window opened before the merge was a
/// digest (its items in the old layout, its id `{ms}-{user}`) still flushes after the upgrade.
#[tokio::test]
async fn the_merge_window_is_a_digest_and_a_window_from_before_still_flushes() {
    use tidings_core::ports::{Cond, Item, Key};
    let w = world();
    user(&w, "u1").await;
    user(&w, "u2").await;
    for s in ["A", "B", "C"] {
        sku(&w, s, 0).await;
    }
    subscribe(&w, "u1", "A").await;
    subscribe(&w, "u1", "B").await;
    subscribe(&w, "u2", "C").await;
    let head_of = |user: &str| Key::new(restock::keys::merge_partition(&w.t, user), "HEAD");
    restock_by(&w, "A", 1, "a").await;
    pump(&w).await;
    let head = w.deps.table.get(&head_of("u1")).await.unwrap().expect("the open window is the digest's head");
    let window = head.str("window").unwrap().to_owned();
    restock_by(&w, "B", 1, "b").await;
    pump(&w).await;
    let pending = restock::list_notices(&w.deps, &w.t, "PENDING", 10, None).await.unwrap().items;
    let windows: Vec<&str> = pending.iter().filter(|n| n.user_id == "u1").map(|n| n.window_id.as_str()).collect();
    assert_eq!(windows, vec![window.as_str(), window.as_str()], "both SKUs in the one window");
    assert!(emails_to(&w, "u1").is_empty());

    // u2's window, moved into the layout of before: its head gone from the digest, an open-window
    // item, the message and its one SKU under the old id.
    restock_by(&w, "C", 1, "c").await;
    pump(&w).await;
    let notice = restock::list_notices(&w.deps, &w.t, "PENDING", 10, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|n| n.user_id == "u2")
        .unwrap();
    let new_key = restock::keys::message(&w.t, &notice.window_id);
    let mut message: restock::RestockMessage = w.deps.table.get(&new_key).await.unwrap().unwrap().parse().unwrap();
    let old_id = format!("{}-u2", message.start_ms);
    message.window_id = old_id.clone();
    let attrs = |v: serde_json::Value| v.as_object().cloned().unwrap();
    let put = |key: Key, v: serde_json::Value| {
        let table = w.deps.table.clone();
        async move { table.put(Item::new(key, attrs(v)), Cond::Always).await.unwrap() }
    };
    put(restock::keys::message(&w.t, &old_id), serde_json::to_value(&message).unwrap()).await;
    let entry =
        serde_json::json!({"sku_id": "C", "batch_no": notice.batch_no, "subscription_id": notice.subscription_id});
    put(Key::new(restock::keys::message_pk(&w.t, &old_id), format!("E#{}", notice.batch_no)), entry).await;
    put(
        restock::keys::open_window(&w.t, "u2"),
        serde_json::json!({"window_id": old_id, "closes_ms": message.closes_ms}),
    )
    .await;
    w.deps.table.delete(&head_of("u2"), Cond::Always).await.unwrap();
    w.deps.table.delete(&new_key, Cond::Always).await.unwrap();
    restock::merge::flush(&w.deps, &w.t, &old_id).await.unwrap();

    settle(&w).await;
    let mails = emails_to(&w, "u1");
    assert_eq!(mails.len(), 1, "one message for the window");
    assert!(mails[0].body.contains('A') && mails[0].body.contains('B'), "{}", mails[0].body);
    assert!(w.deps.table.get(&head_of("u1")).await.unwrap().is_none(), "the flush closed the digest");
    let old = emails_to(&w, "u2");
    assert_eq!(old.len(), 1, "the window from before flushed");
    assert!(old[0].body.contains('C'), "{}", old[0].body);
    assert!(w.deps.table.get(&restock::keys::open_window(&w.t, "u2")).await.unwrap().is_none());
    assert_eq!(
        restock::get_notice(&w.deps, &w.t, &notice.batch_no, "u2").await.unwrap().unwrap().status,
        NoticeStatus::Sent
    );
}

/// Launch review: retries capped, and a manual resend
/// (docs/restock.md, "Retries and manual resend").
#[tokio::test]
async fn review_retry_cap_and_manual_resend() {
    let w = world();
    for u in ["u1", "u2"] {
        user(&w, u).await;
        subscribe(&w, u, "A").await;
    }
    sku(&w, "A", 0).await;
    *w.email.mode.lock().unwrap() = Mode::Transient;
    restock_by(&w, "A", 3, "po").await;
    pump(&w).await;
    // 1 + 3 retries at 1, 5 and 30 minutes, then MANUAL.
    for _ in 0..80 {
        advance(&w, 60).await;
    }
    let batch = restock::batch_no("A", 1);
    let manual = restock::list_notices(&w.deps, &w.t, "MANUAL", 50, None).await.unwrap();
    assert_eq!(manual.items.len(), 2, "{:?}", manual.items);
    assert_eq!(manual.items[0].attempts, 4);
    let calls = w.email.calls.lock().unwrap().clone();
    advance(&w, 3600).await;
    assert_eq!(w.email.calls.lock().unwrap().len(), calls.len(), "no retry after MANUAL");
    // u2 cancels; the operator resends the batch once the channel is back.
    let u2_sub = manual.items.iter().find(|n| n.user_id == "u2").unwrap().subscription_id.clone();
    restock::cancel(&w.deps, &w.t, &u2_sub).await.unwrap();
    *w.email.mode.lock().unwrap() = Mode::Ok;
    let report = restock::resend(&w.deps, &w.t, &batch).await.unwrap();
    assert_eq!((report.resent, report.skipped_cancelled), (1, 1));
    let again = restock::resend(&w.deps, &w.t, &batch).await.unwrap();
    assert_eq!(again.resent, 0, "a resend is idempotent per batch");
    pump(&w).await;
    assert_eq!(emails_to(&w, "u1").len(), 1);
    assert!(emails_to(&w, "u2").is_empty());
    assert!(restock::list_notices(&w.deps, &w.t, "MANUAL", 50, None).await.unwrap().items.is_empty());
}

/// A closed channel or an unsubscribed user is not retried.
#[tokio::test]
async fn permanent_failure_is_not_retried() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    *w.email.mode.lock().unwrap() = Mode::Permanent;
    restock_by(&w, "A", 3, "po").await;
    pump(&w).await;
    for _ in 0..40 {
        advance(&w, 60).await;
    }
    assert_eq!(w.email.calls.lock().unwrap().len(), 1);
    let notice = restock::get_notice(&w.deps, &w.t, &restock::batch_no("A", 1), "u1").await.unwrap().unwrap();
    assert_eq!(notice.status, NoticeStatus::Unreachable);
    // Every status is listable, not only MANUAL: the notice is in UNREACHABLE's list alone.
    let unreachable = restock::list_notices(&w.deps, &w.t, "UNREACHABLE", 50, None).await.unwrap();
    assert_eq!(unreachable.items, [notice], "listed by its status");
    for other in ["PENDING", "SENDING", "SENT", "FAILED", "MANUAL"] {
        let page = restock::list_notices(&w.deps, &w.t, other, 50, None).await.unwrap();
        assert!(page.items.is_empty(), "{other}: {:?}", page.items);
    }
    let e = restock::list_notices(&w.deps, &w.t, "LOST", 50, None).await.unwrap_err();
    assert!(e.to_string().contains("status"), "{e}");
}

/// A failed alert is retried 1, 5 and 30 minutes after each failure, then MANUAL;
/// the channel's own retries do not run first (they made the first retry come 3 minutes
/// after the failure, not 1).
#[tokio::test]
async fn retries_come_1_5_and_30_minutes_after_each_failure() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    *w.email.mode.lock().unwrap() = Mode::Transient;
    restock_by(&w, "A", 2, "po-1").await;
    pump(&w).await;
    advance(&w, 61).await; // the window closes: attempt 1, which fails
    let calls = || w.email.calls.lock().unwrap().clone();
    assert_eq!(calls().len(), 1, "one call, no channel retries of its own");
    let first = calls()[0];
    let after = |c: &[DateTime<Utc>]| c.iter().map(|at| (*at - first).num_seconds()).collect::<Vec<_>>();
    let sending = restock::list_notices(&w.deps, &w.t, "SENDING", 50, None).await.unwrap();
    assert_eq!(sending.items.len(), 1, "listed while it is on its way");
    for (wait, expect) in [(60, vec![0, 60]), (300, vec![0, 60, 360]), (1800, vec![0, 60, 360, 2160])] {
        for _ in 0..(wait / 60 - 1) {
            advance(&w, 60).await;
        }
        advance(&w, 59).await;
        assert_eq!(after(&calls()), expect[..expect.len() - 1], "not before {wait} s after the failure");
        advance(&w, 1).await;
        assert_eq!(after(&calls()), expect, "{wait} s after the failure");
    }
    advance(&w, 3600).await;
    assert_eq!(calls().len(), 4, "no retry after the third");
    let manual = restock::list_notices(&w.deps, &w.t, "MANUAL", 50, None).await.unwrap();
    assert_eq!(manual.items.len(), 1);
    assert_eq!(manual.items[0].attempts, 4);
    assert!(restock::list_notices(&w.deps, &w.t, "FAILED", 50, None).await.unwrap().items.is_empty());
}

/// Issue 3: 3 units for 100 waiters: the first wave is ~9 users, and the waves stop when stock is gone.
#[tokio::test]
async fn three_units_for_a_hundred_waiters_go_in_waves() {
    let w = world_with(RestockConfig { wave_factor: 3, ..fast() });
    sku(&w, "A", 0).await;
    for i in 0..100 {
        let u = format!("u{i:03}");
        user(&w, &u).await;
        subscribe(&w, &u, "A").await;
    }
    restock_by(&w, "A", 3, "po").await;
    settle(&w).await;
    assert_eq!(email_count(&w), 9, "first wave: 3 x 3");
    let first: Vec<String> = w.email.sent.lock().unwrap().iter().map(|m| m.user_id.clone()).collect();
    assert!(first.iter().all(|u| u.as_str() < "u009"), "oldest first: {first:?}");
    // One unit sells; the next wave (after the interval) is 3 x 2.
    let order = OrderRequest {
        order_id: "o1".into(),
        user_id: "u000".into(),
        items: vec![OrderLine { sku_id: "A".into(), qty: 1, unit_price: None }],
        hold_seconds: None,
        category: None,
        market: None,
    };
    inventory::place_order(&w.deps, &w.t, &order).await.unwrap();
    inventory::pay(&w.deps, &w.t, "o1").await.unwrap();
    advance(&w, 601).await;
    settle(&w).await;
    assert_eq!(email_count(&w), 15);
    // Sold out: the next wave stops, the rest stay WAITING for the next round.
    restock_by(&w, "A", -2, "sold").await;
    advance(&w, 601).await;
    settle(&w).await;
    assert_eq!(email_count(&w), 15);
    let waiting = restock::list_for_user(&w.deps, &w.t, "u099", 10, None).await.unwrap();
    assert_eq!(waiting.items[0].status, SubscriptionStatus::Waiting);
    // Next round: the next oldest.
    restock_by(&w, "A", 1, "po-2").await;
    settle(&w).await;
    assert_eq!(email_count(&w), 18);
}

/// Issue 3: a cancelled subscriber gets nothing; a NOTIFIED one gets nothing next round unless they subscribed again.
#[tokio::test]
async fn cancelled_and_notified_get_nothing_next_round() {
    let w = world();
    for u in ["u1", "u2", "u3"] {
        user(&w, u).await;
    }
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    subscribe(&w, "u2", "A").await;
    let (c, _) = subscribe(&w, "u3", "A").await;
    restock::cancel(&w.deps, &w.t, &c).await.unwrap();
    restock_by(&w, "A", 2, "po-1").await;
    settle(&w).await;
    assert_eq!((emails_to(&w, "u1").len(), emails_to(&w, "u2").len(), emails_to(&w, "u3").len()), (1, 1, 0));
    restock_by(&w, "A", -2, "sold").await;
    subscribe(&w, "u2", "A").await; // u2 asks again, u1 does not
    restock_by(&w, "A", 2, "po-2").await;
    settle(&w).await;
    assert_eq!((emails_to(&w, "u1").len(), emails_to(&w, "u2").len(), emails_to(&w, "u3").len()), (1, 2, 0));
}

/// A table whose transactions fail after a number of them: a process dying mid-round.
struct Dying {
    left: Mutex<i64>,
}

#[async_trait]
impl Around for Dying {
    async fn before(&self, call: Call<'_>) -> Result<(), tidings_core::ports::StoreError> {
        if let Call::Transact(_) = call {
            let mut left = self.left.lock().unwrap();
            *left -= 1;
            if *left < 0 {
                return Err(tidings_core::ports::StoreError::Unavailable("process killed".into()));
            }
        }
        Ok(())
    }
}

/// Issue 3: a crash in the middle of a round: after restart every user is notified once.
#[tokio::test]
async fn crash_mid_round_then_everyone_notified_once() {
    let w = world();
    sku(&w, "A", 0).await;
    for i in 0..50 {
        let u = format!("u{i:02}");
        user(&w, &u).await;
        subscribe(&w, &u, "A").await;
    }
    restock_by(&w, "A", 100, "po").await;
    let store_deps = w.deps.clone();
    let dying = Deps {
        table: Arc::new(Wrapped::new(Arc::new(w.store.clone()), Dying { left: Mutex::new(30) })),
        ..store_deps.clone()
    };
    assert!(restock::run_round(&dying, &w.t, "A", 1, None).await.is_err(), "dies mid-round");
    // Restart: the stream and the scan bring the round back.
    settle(&w).await;
    restock::scan(&w.deps).await.unwrap();
    settle(&w).await;
    assert_eq!(email_count(&w), 50);
    for i in 0..50 {
        assert_eq!(emails_to(&w, &format!("u{i:02}")).len(), 1);
    }
}

/// Issue 3: 10,000 subscribers on one SKU: all notified once, in batches, with bounded memory (one page at a time).
#[tokio::test]
async fn ten_thousand_subscribers_notified_once_in_batches() {
    let w = world_with(RestockConfig { batch_size: 100, ..fast() });
    sku(&w, "A", 0).await;
    for i in 0..10_000 {
        subscribe(&w, &format!("u{i:05}"), "A").await;
    }
    restock_by(&w, "A", 1_000_000, "po").await;
    let report = restock::run_round(&w.deps, &w.t, "A", 1, None).await.unwrap();
    assert_eq!(report.claimed, 10_000);
    assert_eq!(report.batches, 100);
    let again = restock::run_round(&w.deps, &w.t, "A", 1, None).await.unwrap();
    assert_eq!(again.claimed, 0, "a second instance claims nothing");
    let mut notices = 0;
    let mut cursor = None;
    loop {
        let page = w
            .deps
            .table
            .query(
                &restock::keys::notice_pk(&w.t, &restock::batch_no("A", 1)),
                "",
                tidings_core::ports::QueryOpts { limit: 1000, cursor, descending: false },
            )
            .await
            .unwrap();
        notices += page.items.len();
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(notices, 10_000);
}

/// A stock event is deduplicated by the upstream's id, never by its content: the upstream's
/// sample shape (no `eventId`) is refused naming the field, and a second genuine arrival of the
/// same quantity from the same source is applied again.
#[tokio::test]
async fn stock_events_need_their_id_and_a_second_arrival_counts() {
    let w = world();
    sku(&w, "A", 0).await;
    let seed: StockEvent =
        serde_json::from_str(r#"{"event":"stock.in","skuId":1001,"qty":50,"source":"purchase_order"}"#).unwrap();
    match restock::apply_stock_event(&w.deps, &w.t, &seed).await {
        Err(tidings_core::error::CoreError::Invalid { field, .. }) => assert_eq!(field, "eventId"),
        other => panic!("expected a refusal naming eventId, got {other:?}"),
    }
    let arrival = |id: &str| -> StockEvent {
        serde_json::from_value(serde_json::json!(
            {"event": "stock.in", "skuId": "A", "qty": 5, "source": "purchase_order", "eventId": id}))
        .unwrap()
    };
    let first = restock::apply_stock_event(&w.deps, &w.t, &arrival("po-1")).await.unwrap();
    let second = restock::apply_stock_event(&w.deps, &w.t, &arrival("po-2")).await.unwrap();
    let repeat = restock::apply_stock_event(&w.deps, &w.t, &arrival("po-2")).await.unwrap();
    assert_eq!((first.available, second.available, repeat.available), (5, 10, 10));
    assert_eq!(second.idempotency_key, repeat.idempotency_key);
    assert_ne!(first.idempotency_key, second.idempotency_key);
}

/// What the timers queue held each time a merge window's message was about to be written.
struct TimersAtWindowWrite {
    queues: Arc<dyn tidings_core::ports::Queues>,
    seen: Mutex<Vec<u64>>,
}

#[async_trait]
impl Around for TimersAtWindowWrite {
    async fn before(&self, call: Call<'_>) -> Result<(), tidings_core::ports::StoreError> {
        if let Call::Transact(writes) = call
            && writes.iter().any(|w| w.key().pk.contains("#RMSG#"))
        {
            let stats = self.queues.stats(tidings_core::timers::TIMERS_QUEUE).await.unwrap();
            self.seen.lock().unwrap().push(stats.visible + stats.delayed + stats.in_flight);
        }
        Ok(())
    }
}

/// A merge window's flush is queued only once the window is written: one queued before could
/// run first on a slow store, find no window and leave it open for good (seen on the emulators:
/// the back-in-stock email never sent). And a durable timer written with the window flushes it
/// when that message is lost.
#[tokio::test]
async fn a_merge_windows_flush_comes_after_its_window_and_survives_a_lost_message() {
    let w = world();
    user(&w, "u1").await;
    sku(&w, "A", 0).await;
    subscribe(&w, "u1", "A").await;
    restock_by(&w, "A", 3, "po-1").await;
    let around = TimersAtWindowWrite { queues: w.deps.queues.clone(), seen: Mutex::default() };
    let table = Arc::new(Wrapped::new(Arc::new(w.store.clone()), around));
    let deps = Deps { table: table.clone(), ..w.deps.clone() };
    let report = restock::run_round(&deps, &w.t, "A", 1, None).await.unwrap();
    assert_eq!(report.claimed, 1, "{report:?}");
    assert_eq!(*table.around.seen.lock().unwrap(), vec![0], "no timer queued before the window is written");
    assert_eq!(w.deps.queues.stats(tidings_core::timers::TIMERS_QUEUE).await.unwrap().delayed, 1, "then its flush");

    // The flush's message is lost: the window is still flushed, by its durable timer.
    w.clock.advance(chrono::Duration::seconds(61));
    let timers = tidings_core::timers::TIMERS_QUEUE;
    let lost = w.deps.queues.receive(timers, 10, Duration::from_secs(3600), Duration::ZERO).await.unwrap();
    assert_eq!(lost.len(), 1);
    for m in &lost {
        w.deps.queues.delete(timers, &m.receipt).await.unwrap();
    }
    pump(&w).await;
    assert!(emails_to(&w, "u1").is_empty(), "not yet: the durable timer is minutes out");
    advance(&w, 5 * 60).await;
    advance(&w, 5).await;
    assert_eq!(emails_to(&w, "u1").len(), 1, "flushed once by the durable timer");
}
