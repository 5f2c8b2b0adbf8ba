//! What back-in-stock alerts earn (docs/restock.md, "What alerts earn") against the embedded
//! store, through the ports only, with the manual clock: the 7-day rule, orders placed before
//! the notice, clicks, a repeated pay, exact revenue, the median, the WAITING count, `since`,
//! and another tenant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidings_core::inventory::{self, AdjustmentRequest, OrderLine, OrderRequest, WarmUpRequest};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{Channel, ManualClock};
use tidings_core::restock::analytics::{self, SkuEarnings};
use tidings_core::restock::{self, RestockConfig, SubscriptionRequest};
use tidings_core::tracking::{self, Claims, TokenKind};
use tidings_core::{CoreConfig, Deps, TenantId};
use tidings_embedded::EmbeddedChangeFeed;
use tidings_embedded::test_world::TestWorld;

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    feed: EmbeddedChangeFeed,
    t: TenantId,
}

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T08:00:00Z").unwrap().with_timezone(&Utc)
}

fn world() -> World {
    let clock = Arc::new(ManualClock::new(start()));
    let restock = RestockConfig { batch_pause: Duration::ZERO, wave_factor: 0, ..RestockConfig::default() };
    let config = CoreConfig { restock, ..CoreConfig::default() };
    let tw = TestWorld::builder().manual_clock(clock.clone()).all_queues(2).config(config).build();
    World { clock, feed: tw.feed("analytics-test"), deps: tw.deps, t: TenantId::parse("shop-a").unwrap() }
}

/// Feeds the change stream to the relay and runs every queue until nothing is left to do now.
async fn pump(w: &World) {
    tidings_embedded::test_world::drain(&w.deps, &w.feed).await;
}

async fn advance(w: &World, secs: i64) {
    w.clock.advance(chrono::Duration::seconds(secs));
    tidings_core::timers::tick(&w.deps).await.unwrap();
    pump(w).await;
}

async fn setup(w: &World, users_: &[&str], sku: &str) {
    for id in users_ {
        let input = UserInput { email: Some(format!("{id}@example.com")), ..UserInput::default() };
        users::put_user(&w.deps, &w.t, id, input).await.unwrap();
    }
    let req = WarmUpRequest { on_hand: 0, shards: None, category: None };
    inventory::warm_up(&w.deps, &w.t, sku, &req).await.unwrap();
}

async fn subscribe(w: &World, user_id: &str, sku_id: &str) -> String {
    restock::subscribe(&w.deps, &w.t, &SubscriptionRequest::new(user_id, sku_id)).await.unwrap().0.subscription_id
}

async fn restock_by(w: &World, sku: &str, delta: i64, key: &str) {
    let req = AdjustmentRequest::new(delta, "purchase_order", key);
    inventory::adjust(&w.deps, &w.t, sku, &req).await.unwrap();
}

async fn place(w: &World, order_id: &str, user: &str, sku: &str, qty: i64, price: Option<&str>) {
    let req = OrderRequest {
        order_id: order_id.into(),
        user_id: user.into(),
        items: vec![OrderLine { sku_id: sku.into(), qty, unit_price: price.map(Into::into) }],
        hold_seconds: None,
        category: None,
        market: None,
    };
    inventory::place_order(&w.deps, &w.t, &req).await.unwrap();
}

async fn buy(w: &World, order_id: &str, user: &str, sku: &str, qty: i64, price: Option<&str>) {
    place(w, order_id, user, sku, qty, price).await;
    inventory::pay(&w.deps, &w.t, order_id).await.unwrap();
}

async fn figures(w: &World, t: &TenantId, sku: &str, since: Option<&str>) -> SkuEarnings {
    let page = analytics::analytics(&w.deps, t, Some(sku), since, 20, None).await.unwrap();
    assert_eq!(page.items.len(), 1);
    page.items.into_iter().next().unwrap()
}

/// The notification of the restock message `user` was sent.
async fn message_of(w: &World, sku: &str, user: &str) -> String {
    let subs = restock::list_for_user(&w.deps, &w.t, user, 10, None).await.unwrap();
    let sub = subs.items.iter().find(|s| s.sku_id == sku).unwrap();
    let batch = sub.batch_no.clone().expect("notified");
    let notice = restock::get_notice(&w.deps, &w.t, &batch, user).await.unwrap().unwrap();
    notice.notification_id.expect("sent")
}

fn click(w: &World, notification_id: &str, user: &str) -> Claims {
    Claims {
        k: TokenKind::Click,
        t: w.t.clone(),
        n: notification_id.into(),
        u: user.into(),
        c: Channel::Email,
        url: Some("https://shop.example/p/A".into()),
        s: None,
    }
}

/// Issue 35: an order placed after a click counts; one placed before the notice does not, even
/// when it is paid after it; a repeated pay counts once; revenue is exact (3 × 19.99 = 59.97);
/// clicks count once per user; another tenant sees nothing.
#[tokio::test]
async fn an_order_after_a_click_counts_and_one_placed_before_the_notice_does_not() {
    let w = world();
    setup(&w, &["u1", "u2", "u3"], "A").await;
    for u in ["u1", "u2", "u3"] {
        subscribe(&w, u, "A").await;
    }
    let before = figures(&w, &w.t, "A", None).await;
    assert_eq!((before.waiting, before.notified, before.ordered), (3, 0, 0), "{before:?}");

    // Stock arrives; u3 orders before any notice is written (the round has not run yet).
    restock_by(&w, "A", 20, "po-1").await;
    place(&w, "o-before", "u3", "A", 1, Some("19.99")).await;
    advance(&w, 60).await;
    pump(&w).await;
    advance(&w, 61).await; // past the merge window: the messages go out
    let notified = figures(&w, &w.t, "A", None).await;
    assert_eq!((notified.waiting, notified.notified), (0, 3), "{notified:?}");
    inventory::pay(&w.deps, &w.t, "o-before").await.unwrap();

    // u1 clicks (twice: one click counted), then buys 3 at 19.99.
    let n1 = message_of(&w, "A", "u1").await;
    let at = w.clock_ms();
    tracking::apply(&w.deps, &click(&w, &n1, "u1"), at).await.unwrap();
    tracking::apply(&w.deps, &click(&w, &n1, "u1"), at + 1000).await.unwrap();
    advance(&w, 600).await;
    buy(&w, "o1", "u1", "A", 3, Some("19.99")).await;
    // u2 buys one at 0.01 and pays again (409): one order.
    advance(&w, 600).await;
    buy(&w, "o2", "u2", "A", 1, Some("0.01")).await;
    let again = inventory::pay(&w.deps, &w.t, "o2").await.unwrap_err();
    assert!(matches!(again, tidings_core::CoreError::Conflict { code: "invalid_state", .. }), "{again:?}");

    let f = figures(&w, &w.t, "A", None).await;
    assert_eq!((f.waiting, f.notified, f.clicked, f.ordered, f.units), (0, 3, 1, 2, 4), "{f:?}");
    assert_eq!(f.revenue, "59.98", "3 × 19.99 + 0.01, exactly");
    assert_eq!(f.notices_per_order, Some(1.5));
    assert!(!f.truncated);

    // The list names the SKU; another tenant sees none of it.
    let all = analytics::analytics(&w.deps, &w.t, None, None, 20, None).await.unwrap();
    assert_eq!(all.items, vec![f.clone()]);
    let other = TenantId::parse("shop-b").unwrap();
    let theirs = analytics::analytics(&w.deps, &other, None, None, 20, None).await.unwrap();
    assert!(theirs.items.is_empty(), "{theirs:?}");
    let theirs_a = figures(&w, &other, "A", None).await;
    assert_eq!(
        (theirs_a.waiting, theirs_a.notified, theirs_a.clicked, theirs_a.ordered, theirs_a.revenue.as_str()),
        (0, 0, 0, 0, "0.00")
    );
}

/// Issue 35: an order placed more than 7 days after the notice does not count; one placed
/// just inside the 7 days does.
#[tokio::test]
async fn an_order_more_than_seven_days_after_the_notice_is_not_counted() {
    let w = world();
    setup(&w, &["u1", "u2"], "A").await;
    subscribe(&w, "u1", "A").await;
    subscribe(&w, "u2", "A").await;
    restock_by(&w, "A", 10, "po-1").await;
    pump(&w).await;
    assert_eq!(figures(&w, &w.t, "A", None).await.notified, 2);
    advance(&w, 7 * 24 * 3600 - 60).await;
    buy(&w, "inside", "u1", "A", 1, Some("5")).await;
    advance(&w, 120).await;
    buy(&w, "late", "u2", "A", 1, Some("5")).await;
    let f = figures(&w, &w.t, "A", None).await;
    assert_eq!((f.ordered, f.revenue.as_str()), (1, "5.00"), "{f:?}");
    // 7 days less a minute, in minutes.
    assert_eq!(f.median_minutes_to_order, Some((7 * 24 * 60 - 1) as f64));
}

/// Issue 35: the median minutes from notice to order, for an odd and an even count; `since`
/// counts from its UTC day.
#[tokio::test]
async fn the_median_is_the_middle_of_an_odd_count_and_the_mean_of_the_two_middles_of_an_even_one() {
    let w = world();
    let users_ = ["u1", "u2", "u3", "u4"];
    setup(&w, &users_, "A").await;
    for u in users_ {
        subscribe(&w, u, "A").await;
    }
    restock_by(&w, "A", 10, "po-1").await;
    pump(&w).await; // the notices, at the start
    advance(&w, 10 * 60).await;
    buy(&w, "o1", "u1", "A", 1, None).await;
    advance(&w, 10 * 60).await;
    buy(&w, "o2", "u2", "A", 1, None).await;
    advance(&w, 10 * 60).await;
    buy(&w, "o3", "u3", "A", 1, None).await;
    let f = figures(&w, &w.t, "A", None).await;
    assert_eq!((f.ordered, f.median_minutes_to_order, f.revenue.as_str()), (3, Some(20.0), "0.00"), "{f:?}");
    advance(&w, 15 * 60).await;
    buy(&w, "o4", "u4", "A", 1, None).await;
    let f = figures(&w, &w.t, "A", None).await;
    assert_eq!((f.ordered, f.median_minutes_to_order), (4, Some(25.0)), "{f:?}");

    // `since` today (any time of it): everything; since tomorrow: nothing but who waits.
    let today = figures(&w, &w.t, "A", Some("2026-11-29T23:00:00Z")).await;
    assert_eq!((today.notified, today.ordered), (4, 4));
    let tomorrow = figures(&w, &w.t, "A", Some("2026-11-30T00:00:00+00:00")).await;
    assert_eq!((tomorrow.notified, tomorrow.ordered, tomorrow.median_minutes_to_order), (0, 0, None));
    let bad = analytics::analytics(&w.deps, &w.t, Some("A"), Some("yesterday"), 20, None).await.unwrap_err();
    assert!(matches!(&bad, tidings_core::CoreError::Invalid { field, .. } if field == "since"), "{bad:?}");
}

/// The WAITING count is kept in the transactions that move subscriptions: a repeat adds
/// nothing, a cancel, an expiry and an erasure take one off, a notice takes the rest.
#[tokio::test]
async fn the_waiting_count_follows_every_way_in_and_out_of_waiting() {
    let w = world();
    let users_ = ["u1", "u2", "u3", "u4"];
    setup(&w, &users_, "A").await;
    let first = subscribe(&w, "u1", "A").await;
    advance(&w, 3600).await;
    for u in ["u2", "u3", "u4"] {
        subscribe(&w, u, "A").await;
    }
    assert_eq!(subscribe(&w, "u2", "A").await, subscribe(&w, "u2", "A").await, "a repeat is the same one");
    assert_eq!(figures(&w, &w.t, "A", None).await.waiting, 4);
    let u3 = restock::list_for_user(&w.deps, &w.t, "u3", 1, None).await.unwrap().items[0].subscription_id.clone();
    restock::cancel(&w.deps, &w.t, &u3).await.unwrap();
    restock::cancel(&w.deps, &w.t, &u3).await.unwrap();
    assert_eq!(figures(&w, &w.t, "A", None).await.waiting, 3);
    // u1's subscription passes the maximum age (90 days) first and expires in the scan.
    advance(&w, 90 * 24 * 3600 - 1800).await;
    restock::scan(&w.deps).await.unwrap();
    assert_eq!(restock::subscriptions::get(&w.deps, &w.t, &first).await.unwrap().unwrap().status.as_str(), "EXPIRED");
    assert_eq!(figures(&w, &w.t, "A", None).await.waiting, 2);
    // An erased user's WAITING subscription is gone, and out of the count.
    tidings_core::people::erasure::erase(&w.deps, &w.t, "u4").await.unwrap();
    assert_eq!(figures(&w, &w.t, "A", None).await.waiting, 1);
    restock_by(&w, "A", 5, "po-1").await;
    pump(&w).await;
    let f = figures(&w, &w.t, "A", None).await;
    assert_eq!((f.waiting, f.notified), (0, 1), "{f:?}");
}

trait ClockMs {
    fn clock_ms(&self) -> i64;
}

impl ClockMs for World {
    fn clock_ms(&self) -> i64 {
        use tidings_core::ports::Clock;
        self.clock.now().timestamp_millis()
    }
}

/// Without `sku_id`, the SKUs that have had subscribers, a page at a time; bad paging input is
/// refused naming its field.
#[tokio::test]
async fn the_list_pages_the_skus_that_have_had_subscribers() {
    let w = world();
    setup(&w, &["u1"], "A").await;
    let req = WarmUpRequest { on_hand: 0, shards: None, category: None };
    for sku in ["B", "C"] {
        inventory::warm_up(&w.deps, &w.t, sku, &req).await.unwrap();
    }
    subscribe(&w, "u1", "A").await;
    subscribe(&w, "u1", "C").await;
    let first = analytics::analytics(&w.deps, &w.t, None, None, 1, None).await.unwrap();
    let skus: Vec<&str> = first.items.iter().map(|i| i.sku_id.as_str()).collect();
    assert_eq!(skus, vec!["A"]);
    let second = analytics::analytics(&w.deps, &w.t, None, None, 1, first.next_cursor).await.unwrap();
    let skus: Vec<&str> = second.items.iter().map(|i| i.sku_id.as_str()).collect();
    assert_eq!(skus, vec!["C"], "B never had a subscriber");
    assert_eq!(second.items[0].waiting, 1);
    // The last page: no cursor, or (where the store cannot tell) one to an empty page.
    if let Some(cursor) = second.next_cursor {
        let third = analytics::analytics(&w.deps, &w.t, None, None, 1, Some(cursor)).await.unwrap();
        assert!(third.items.is_empty() && third.next_cursor.is_none(), "{third:?}");
    }
    for (limit, cursor, field) in [(0, None, "limit"), (101, None, "limit"), (10, Some("not-hex".to_owned()), "cursor")]
    {
        let e = analytics::analytics(&w.deps, &w.t, None, None, limit, cursor).await.unwrap_err();
        assert!(matches!(&e, tidings_core::CoreError::Invalid { field: f, .. } if f == field), "{e:?}");
    }
    let e = analytics::analytics(&w.deps, &w.t, Some("a#b"), None, 20, None).await.unwrap_err();
    assert!(matches!(&e, tidings_core::CoreError::Invalid { field, .. } if field == "sku_id"), "{e:?}");
}
