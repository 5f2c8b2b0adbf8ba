//! Backorders and pre-orders (docs/inventory.md, "Backorders and pre-orders") on the embedded
//! store with a manual clock: orders past the stock are promised up to the SKU's limit (never
//! more, however many race), wait without expiring, and are filled oldest first by the stock
//! that arrives, before `available` rises, so a back-in-stock alert goes out only for the units
//! beyond them; cancel and pay of a waiting order, the pre-order window, the policy's
//! validation, and the ledger and reconciliation that account for it all.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::json;
use tidings_core::error::CoreError;
use tidings_core::inventory::{
    self, AdjustmentRequest, Counters, OrderLine, OrderRequest, OrderStatus, StockPolicy, StockView, WarmUpRequest,
};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{Cond, Update};
use tidings_core::restock::{self, SubscriptionRequest};
use tidings_core::{TenantId, timers};
use tidings_embedded::test_world::{Recorder, TestWorld, drain};

struct Shop {
    w: TestWorld,
    t: TenantId,
    email: Arc<Recorder>,
}

async fn shop(on_hand: i64, policy: serde_json::Value) -> Shop {
    let email = Arc::new(Recorder::default());
    let w = TestWorld::builder().all_queues(5).email(email.clone()).build();
    let t = TenantId::parse("shop").unwrap();
    let req = WarmUpRequest { on_hand, shards: None, category: None };
    inventory::warm_up(&w.deps, &t, "A", &req).await.unwrap();
    let s = Shop { w, t, email };
    set_policy(&s, policy).await.unwrap();
    s
}

async fn set_policy(s: &Shop, policy: serde_json::Value) -> Result<StockView, CoreError> {
    let policy: StockPolicy = serde_json::from_value(policy).unwrap();
    inventory::put_policy(&s.w.deps, &s.t, "A", &policy).await
}

fn order(id: &str, qty: i64) -> OrderRequest {
    OrderRequest {
        order_id: id.into(),
        user_id: format!("buyer-{id}"),
        items: vec![OrderLine { sku_id: "A".into(), qty, unit_price: None }],
        hold_seconds: Some(600),
        category: None,
        market: None,
    }
}

async fn place(s: &Shop, id: &str, qty: i64) -> Result<OrderStatus, CoreError> {
    // One millisecond apart at least: "oldest first" is by the time an order was placed.
    s.w.clock().advance(chrono::Duration::milliseconds(5));
    inventory::place_order(&s.w.deps, &s.t, &order(id, qty)).await.map(|p| p.order.status)
}

/// Units arrive; the fill their adjustment queued runs (the timers queue, at once).
async fn arrive(s: &Shop, delta: i64, key: &str) -> StockView {
    let req = AdjustmentRequest::new(delta, "purchase_order", key);
    inventory::adjust(&s.w.deps, &s.t, "A", &req).await.unwrap();
    settle(s).await;
    stock(s).await
}

/// What is queued runs: the relay, the fills, the restock rounds.
async fn settle(s: &Shop) {
    drain(&s.w.deps, &s.w.feed("test")).await;
}

async fn stock(s: &Shop) -> StockView {
    inventory::get_stock(&s.w.deps, &s.t, "A").await.unwrap().unwrap()
}

/// (status, units held or sold, units still waiting) of an order.
async fn order_state(s: &Shop, id: &str) -> (OrderStatus, i64, i64) {
    let o = inventory::get_order(&s.w.deps, &s.t, id).await.unwrap().unwrap();
    let held: i64 = o.items[0].allocations.iter().map(|a| a.qty).sum();
    (o.status, held, o.items[0].backordered)
}

/// The ledger sums to the counters, backorders included, and reconciliation finds nothing.
async fn accounted(s: &Shop) {
    let view = stock(s).await;
    let sum = inventory::all_ledger_entries(&s.w.deps, &s.t, "A")
        .await
        .unwrap()
        .iter()
        .fold(Counters::default(), |acc, e| acc.plus(e.delta()));
    assert_eq!((sum.available, sum.reserved, sum.sold), (view.available, view.reserved, view.sold));
    assert_eq!((sum.backordered, sum.allotted), (view.backordered.unwrap_or(0), view.allotted));
    assert_eq!(sum.allotted + sum.unfilled, sum.backordered, "set aside + unfilled = promised");
    let report = inventory::reconcile(&s.w.deps, Some(&s.t)).await.unwrap();
    assert!(report.discrepancies.is_empty(), "{:?}", report.discrepancies);
}

fn is_short(r: &Result<OrderStatus, CoreError>) -> bool {
    matches!(r, Err(CoreError::Conflict { code: "insufficient_stock", .. }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_orders_never_promise_past_the_limit_nor_oversell() {
    let s = shop(5, json!({"backorder_limit": 30})).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (deps, t) = (s.w.deps.clone(), s.t.clone());
        tasks.push(tokio::spawn(async move { inventory::place_order(&deps, &t, &order(&format!("o{i}"), 1)).await }));
    }
    let mut by_status = std::collections::BTreeMap::new();
    let mut short = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(p) => *by_status.entry(p.order.status.as_str()).or_insert(0) += 1,
            Err(CoreError::Conflict { code: "insufficient_stock", .. }) => short += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(by_status, std::collections::BTreeMap::from([("BACKORDERED", 30), ("PENDING", 5)]));
    assert_eq!(short, 165);
    let view = stock(&s).await;
    assert_eq!((view.available, view.reserved, view.backordered.unwrap_or(0)), (0, 5, 30));
    accounted(&s).await;
}

#[tokio::test]
async fn an_order_past_the_stock_holds_what_is_there_and_waits_for_the_rest_without_expiring() {
    let s = shop(2, json!({"backorder_limit": 5})).await;
    assert_eq!(place(&s, "o1", 4).await.unwrap(), OrderStatus::Backordered);
    assert_eq!(order_state(&s, "o1").await, (OrderStatus::Backordered, 2, 2));
    // Past the limit: refused, nothing held or promised.
    assert!(is_short(&place(&s, "o2", 4).await));
    assert_eq!(place(&s, "o3", 3).await.unwrap(), OrderStatus::Backordered);
    let view = stock(&s).await;
    assert_eq!((view.available, view.reserved, view.backordered.unwrap_or(0)), (0, 2, 5));
    // Its hold time passes: a waiting order does not expire.
    s.w.clock().advance(chrono::Duration::hours(2));
    timers::tick(&s.w.deps).await.unwrap();
    drain(&s.w.deps, &s.w.feed("test")).await;
    let settled = inventory::expire_order(&s.w.deps, &s.t, "o1").await.unwrap();
    assert!(matches!(settled, inventory::Settlement::NotPending(_)), "{settled:?}");
    assert_eq!(order_state(&s, "o1").await, (OrderStatus::Backordered, 2, 2));
    accounted(&s).await;
}

#[tokio::test]
async fn arrivals_fill_the_oldest_backorders_first_and_only_the_rest_becomes_available() {
    let s = shop(0, json!({"backorder_limit": 10})).await;
    place(&s, "o1", 2).await.unwrap();
    place(&s, "o2", 3).await.unwrap();
    place(&s, "o3", 1).await.unwrap();
    let round = stock(&s).await.restock_round;
    // 4 units: o1 whole, o2 2 of its 3; none available, no restock round.
    let view = arrive(&s, 4, "in-1").await;
    assert_eq!((view.available, view.reserved, view.backordered.unwrap_or(0), view.allotted), (0, 4, 2, 0));
    assert_eq!(view.restock_round, round, "no units beyond the backorders: no round");
    assert_eq!(order_state(&s, "o1").await, (OrderStatus::Pending, 2, 0));
    assert_eq!(order_state(&s, "o2").await, (OrderStatus::Backordered, 2, 1));
    assert_eq!(order_state(&s, "o3").await, (OrderStatus::Backordered, 0, 1));
    // A filled order has a fresh hold and is paid as any other.
    let o1 = inventory::get_order(&s.w.deps, &s.t, "o1").await.unwrap().unwrap();
    assert!(o1.expires_at > s.w.deps.clock.now().to_rfc3339(), "{o1:?}");
    inventory::pay(&s.w.deps, &s.t, "o1").await.unwrap();
    // 5 more: o2 and o3 whole, 3 available, and now the round opens.
    let view = arrive(&s, 5, "in-2").await;
    assert_eq!((view.available, view.reserved, view.sold, view.backordered.unwrap_or(0)), (3, 4, 2, 0));
    assert_eq!(view.restock_round, round + 1);
    assert_eq!(order_state(&s, "o2").await, (OrderStatus::Pending, 3, 0));
    assert_eq!(order_state(&s, "o3").await, (OrderStatus::Pending, 1, 0));
    // The fills are in the ledger.
    let fills = inventory::all_ledger_entries(&s.w.deps, &s.t, "A")
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == inventory::LedgerKind::Fill)
        .map(|e| (e.reference, e.delta_reserved, e.delta_backordered))
        .collect::<Vec<_>>();
    assert_eq!(
        fills,
        vec![
            ("order:o1".to_owned(), 2, -2),
            ("order:o2".to_owned(), 2, -2),
            ("order:o2".to_owned(), 1, -1),
            ("order:o3".to_owned(), 1, -1)
        ]
    );
    accounted(&s).await;
}

#[tokio::test]
async fn a_released_hold_fills_a_backorder_before_it_is_available() {
    let s = shop(2, json!({"backorder_limit": 5})).await;
    assert_eq!(place(&s, "held", 2).await.unwrap(), OrderStatus::Pending);
    assert_eq!(place(&s, "waits", 1).await.unwrap(), OrderStatus::Backordered);
    inventory::cancel(&s.w.deps, &s.t, "held").await.unwrap();
    settle(&s).await;
    assert_eq!(order_state(&s, "waits").await, (OrderStatus::Pending, 1, 0));
    let view = stock(&s).await;
    assert_eq!((view.available, view.reserved, view.backordered.unwrap_or(0)), (1, 1, 0));
    accounted(&s).await;
}

#[tokio::test]
async fn cancelling_a_backordered_order_releases_its_units_and_counts_it_down() {
    let s = shop(1, json!({"backorder_limit": 5})).await;
    assert_eq!(place(&s, "o1", 4).await.unwrap(), OrderStatus::Backordered);
    assert_eq!(place(&s, "o2", 2).await.unwrap(), OrderStatus::Backordered);
    let view = inventory::cancel(&s.w.deps, &s.t, "o1").await.unwrap();
    assert_eq!(view.status, OrderStatus::Cancelled);
    settle(&s).await;
    let view = stock(&s).await;
    // o1's held unit went back, to the backorder that still waits (o2), not to available.
    assert_eq!((view.available, view.reserved, view.backordered.unwrap_or(0)), (0, 1, 1));
    assert_eq!(order_state(&s, "o2").await, (OrderStatus::Backordered, 1, 1));
    // Its room under the limit is free again; cancelling twice changes nothing.
    assert_eq!(place(&s, "o3", 4).await.unwrap(), OrderStatus::Backordered);
    inventory::cancel(&s.w.deps, &s.t, "o1").await.unwrap();
    assert_eq!(stock(&s).await.backordered.unwrap_or(0), 5);
    // Arrivals skip the cancelled order.
    arrive(&s, 5, "in-1").await;
    assert_eq!(order_state(&s, "o2").await, (OrderStatus::Pending, 2, 0));
    assert_eq!(order_state(&s, "o3").await, (OrderStatus::Pending, 4, 0));
    assert_eq!(order_state(&s, "o1").await.0, OrderStatus::Cancelled);
    accounted(&s).await;
}

#[tokio::test]
async fn a_paid_backorder_is_sold_as_its_units_arrive() {
    let s = shop(1, json!({"backorder_limit": 5})).await;
    place(&s, "o1", 3).await.unwrap();
    let paid = inventory::pay(&s.w.deps, &s.t, "o1").await.unwrap();
    assert_eq!(paid.status, OrderStatus::Backordered);
    assert!(paid.paid_at.is_some());
    // Paid once; a paid backorder is not cancelled.
    assert!(matches!(inventory::pay(&s.w.deps, &s.t, "o1").await, Err(CoreError::Conflict { .. })));
    assert!(matches!(inventory::cancel(&s.w.deps, &s.t, "o1").await, Err(CoreError::Conflict { .. })));
    let view = arrive(&s, 2, "in-1").await;
    assert_eq!((view.available, view.reserved, view.sold, view.backordered.unwrap_or(0)), (0, 0, 3, 0));
    assert_eq!(order_state(&s, "o1").await, (OrderStatus::Paid, 3, 0));
    accounted(&s).await;
}

#[tokio::test]
async fn a_preorder_window_takes_orders_until_it_ends() {
    let s = shop(0, json!({})).await;
    let until = (s.w.deps.clock.now() + chrono::Duration::days(1)).to_rfc3339();
    set_policy(&s, json!({"preorder": {"until": until, "limit": 3}})).await.unwrap();
    let view = stock(&s).await;
    assert_eq!(view.policy.unwrap().preorder.unwrap().limit, 3);
    assert_eq!(place(&s, "p1", 2).await.unwrap(), OrderStatus::Preordered);
    assert!(is_short(&place(&s, "p2", 2).await), "past the pre-order limit");
    s.w.clock().advance(chrono::Duration::days(2));
    // The window has closed and there is no backorder limit: orders past the stock are refused.
    assert!(is_short(&place(&s, "p3", 1).await));
    arrive(&s, 2, "in-1").await;
    assert_eq!(order_state(&s, "p1").await, (OrderStatus::Pending, 2, 0));
    accounted(&s).await;
}

#[tokio::test]
async fn the_alert_goes_out_only_for_units_beyond_the_backorders() {
    let s = shop(0, json!({"backorder_limit": 5})).await;
    let input = UserInput { email: Some("w@example.com".into()), ..UserInput::default() };
    users::put_user(&s.w.deps, &s.t, "waiter", input).await.unwrap();
    let req = SubscriptionRequest::new("waiter", "A");
    restock::subscribe(&s.w.deps, &s.t, &req).await.unwrap();
    place(&s, "o1", 3).await.unwrap();
    let pass = |secs| {
        let s = &s;
        async move {
            s.w.clock().advance(chrono::Duration::seconds(secs));
            timers::tick(&s.w.deps).await.unwrap();
            drain(&s.w.deps, &s.w.feed("test")).await;
        }
    };
    let alerts = || s.email.sent.lock().unwrap().iter().filter(|m| m.user_id == "waiter").count();
    arrive(&s, 3, "in-1").await;
    drain(&s.w.deps, &s.w.feed("test")).await;
    pass(61).await;
    pass(5).await;
    assert_eq!(order_state(&s, "o1").await.0, OrderStatus::Pending);
    assert_eq!(alerts(), 0, "the units went to the backorder");
    arrive(&s, 2, "in-2").await;
    drain(&s.w.deps, &s.w.feed("test")).await;
    pass(61).await;
    pass(5).await;
    assert_eq!(alerts(), 1, "units beyond the backorder");
}

#[tokio::test]
async fn a_bad_policy_is_refused_naming_its_field() {
    let s = shop(0, json!({})).await;
    let past = (s.w.deps.clock.now() - chrono::Duration::days(1)).to_rfc3339();
    let soon = (s.w.deps.clock.now() + chrono::Duration::days(1)).to_rfc3339();
    let bad = [
        (json!({"backorder_limit": -1}), "backorder_limit"),
        (json!({"backorder_limit": 2_000_000_000_000_i64}), "backorder_limit"),
        (json!({"preorder": {"until": past, "limit": 3}}), "preorder.until"),
        (json!({"preorder": {"until": "next week", "limit": 3}}), "preorder.until"),
        (json!({"preorder": {"until": "2099-01-01T00:00:00Z", "limit": 3}}), "preorder.until"),
        (json!({"preorder": {"until": soon, "limit": -3}}), "preorder.limit"),
    ];
    for (body, field) in bad {
        match set_policy(&s, body.clone()).await {
            Err(CoreError::Invalid { field: f, .. }) => assert_eq!(f, field, "{body}"),
            other => panic!("{body}: {other:?}"),
        }
    }
    let policy: StockPolicy = serde_json::from_value(json!({"backorder_limit": 1})).unwrap();
    assert!(matches!(inventory::put_policy(&s.w.deps, &s.t, "nope", &policy).await, Err(CoreError::NotFound { .. })));
    // No policy: an order past the stock is refused as ever.
    assert!(is_short(&place(&s, "o1", 1).await));
    // Set, then cleared by a body without it.
    assert_eq!(set_policy(&s, json!({"backorder_limit": 2})).await.unwrap().policy.unwrap().backorder_limit, Some(2));
    assert!(set_policy(&s, json!({})).await.unwrap().policy.is_none());
}

#[tokio::test]
async fn reconciliation_finds_a_backorder_count_that_drifted_from_its_ledger() {
    let s = shop(0, json!({"backorder_limit": 5})).await;
    place(&s, "o1", 2).await.unwrap();
    accounted(&s).await;
    let key = inventory::keys::stock(&s.t, "A");
    s.w.deps.table.update(&key, vec![Update::add("backordered", 1)], Cond::Exists).await.unwrap();
    let report = inventory::reconcile(&s.w.deps, Some(&s.t)).await.unwrap();
    assert_eq!(report.discrepancies.len(), 1, "{:?}", report.discrepancies);
    let d = &report.discrepancies[0];
    assert_eq!((d.expected.backordered, d.actual.backordered), (2, 3));
}
