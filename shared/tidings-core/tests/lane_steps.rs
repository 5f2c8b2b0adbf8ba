//! Every lane's handler has one shape (`tasks.rs`): a message whose body names an invalid
//! tenant, or is of a shape the lane does not know, is rejected (to its DLQ, with the reason),
//! and a step that fails for a reason that passes (the table unavailable) is retried with the
//! backoff. Each lane is driven through the router, as the runtimes drive it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use tidings_core::Deps;
use tidings_core::lanes::{Lane, Urgency};
use tidings_core::notify::model::Priority;
use tidings_core::outcome::Outcome;
use tidings_core::ports::{Channel, Cond, Item, Key, Page, QueryOpts, Received, StoreError, Table, Update, Write};
use tidings_core::router::route;
use tidings_embedded::test_world::TestWorld;

/// A table that is down: every call fails as a throttled or unreachable store does.
struct Down;

fn down() -> StoreError {
    StoreError::Unavailable("the table is down".into())
}

#[async_trait]
impl Table for Down {
    async fn get(&self, _: &Key) -> Result<Option<Item>, StoreError> {
        Err(down())
    }
    async fn put(&self, _: Item, _: Cond) -> Result<(), StoreError> {
        Err(down())
    }
    async fn update(&self, _: &Key, _: Vec<Update>, _: Cond) -> Result<Item, StoreError> {
        Err(down())
    }
    async fn delete(&self, _: &Key, _: Cond) -> Result<(), StoreError> {
        Err(down())
    }
    async fn transact(&self, _: Vec<Write>) -> Result<(), StoreError> {
        Err(down())
    }
    async fn query(&self, _: &str, _: &str, _: QueryOpts) -> Result<Page, StoreError> {
        Err(down())
    }
}

fn world() -> TestWorld {
    TestWorld::builder().all_queues(5).build()
}

fn message(body: &Value) -> Received {
    Received {
        message_id: "m-1".into(),
        receipt: "r-1".into(),
        body: body.to_string(),
        receive_count: 2,
        sent_at_ms: 0,
        group: None,
    }
}

/// `body` with its tenant (at the top, or in `task` for a timer) replaced by `tenant`.
fn with_tenant(mut body: Value, tenant: &str) -> Value {
    let at = if body.get("task").is_some() { &mut body["task"] } else { &mut body };
    at["tenant"] = json!(tenant);
    body
}

/// The lane's invariants for a `valid` body (one that reaches the table) and a body of a shape
/// the lane does not know.
async fn check_lane(lane: Lane, valid: Value, unknown: Value) {
    let w = world();
    for tenant in ["../x", "a#b", ""] {
        let body = with_tenant(valid.clone(), tenant);
        match route(&w.deps, lane, &message(&body)).await {
            Outcome::Reject(why) => assert!(why.contains("tenant"), "{lane}: the reason names the tenant: {why}"),
            other => panic!("{lane}: a message naming tenant {tenant:?} is rejected, got {other:?}"),
        }
    }
    match route(&w.deps, lane, &message(&unknown)).await {
        Outcome::Reject(why) => assert!(why.starts_with("malformed"), "{lane}: {why}"),
        other => panic!("{lane}: a message of an unknown shape is rejected, got {other:?}"),
    }
    let down = Deps { table: Arc::new(Down), ..w.deps.clone() };
    match route(&down, lane, &message(&valid)).await {
        Outcome::Retry(after) => assert!(!after.is_zero(), "{lane}: retried after a backoff"),
        other => panic!("{lane}: a message whose step failed on a store that is down is retried, got {other:?}"),
    }
}

#[tokio::test]
async fn request_lanes() {
    let valid = json!({"tenant": "shop", "notification_id": "n-1"});
    let unknown = json!({"tenant": "shop", "notification": "n-1"});
    check_lane(Lane::Requests(Priority::Normal), valid, unknown).await;
}

#[tokio::test]
async fn timers_lane() {
    let valid = json!({"due_ms": 0, "task": {"kind": "order.expire", "tenant": "shop", "order_id": "o-1"}});
    let unknown = json!({"due_ms": 0, "task": {"kind": "order.explode", "tenant": "shop", "order_id": "o-1"}});
    check_lane(Lane::Timers, valid, unknown).await;
}

#[tokio::test]
async fn stock_events_lane_round_jobs() {
    let valid = json!({"event": "restock.round", "tenant": "shop", "skuId": "A", "round": 1});
    let unknown = json!({"event": "stock.out", "tenant": "shop", "skuId": "A", "qty": 1});
    check_lane(Lane::StockEvents, valid, unknown).await;
}

#[tokio::test]
async fn stock_events_lane_stock_in() {
    let valid = json!({"event": "stock.in", "tenant": "shop", "skuId": 7, "qty": 5, "source": "purchase_order", "eventId": "e-1"});
    let unknown = json!({"event": "stock.in", "tenant": "shop", "skuId": ["A"], "qty": 5});
    check_lane(Lane::StockEvents, valid.clone(), unknown).await;
    // On the queue the tenant is required (through the API the key names it).
    let mut anonymous = valid;
    anonymous.as_object_mut().unwrap().remove("tenant");
    match route(&world().deps, Lane::StockEvents, &message(&anonymous)).await {
        Outcome::Reject(why) => assert!(why.contains("tenant"), "{why}"),
        other => panic!("a stock event without a tenant is rejected, got {other:?}"),
    }
}

#[tokio::test]
async fn webhooks_lane() {
    let event = json!({"id": "ev-1", "type": "delivery.sent", "timestamp": "2026-12-01T10:00:00Z", "data": {}});
    let valid = json!({"kind": "event", "tenant": "shop", "event": event});
    let unknown = json!({"kind": "broadcast", "tenant": "shop", "event": event});
    check_lane(Lane::Webhooks, valid, unknown).await;
    let attempt =
        json!({"kind": "attempt", "tenant": "shop", "endpoint_id": "0123456789abcdef0123456789abcdef", "event": event});
    let down = Deps { table: Arc::new(Down), ..world().deps };
    assert!(matches!(route(&down, Lane::Webhooks, &message(&attempt)).await, Outcome::Retry(_)));
}

#[tokio::test]
async fn channel_lanes_reject_what_they_cannot_parse() {
    let w = world();
    let lane = Lane::Channel(Channel::Sms, Urgency::Low);
    let task = json!({
        "tenant": "../x", "notification_id": "n-1", "user_id": "u-1", "channel": "sms",
        "category": "marketing", "to": "+15550100", "body": "hi"
    });
    match route(&w.deps, lane, &message(&task)).await {
        Outcome::Reject(why) => assert!(why.contains("tenant"), "{why}"),
        other => panic!("a channel task naming an invalid tenant is rejected, got {other:?}"),
    }
    match route(&w.deps, lane, &message(&json!({"send": "hi"}))).await {
        Outcome::Reject(why) => assert!(why.starts_with("malformed"), "{why}"),
        other => panic!("a channel task of an unknown shape is rejected, got {other:?}"),
    }
}
