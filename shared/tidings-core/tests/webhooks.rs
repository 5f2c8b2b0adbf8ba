//! Webhook events against the embedded store: an event is written beside its fact only when
//! some endpoint of the tenant subscribes to its type (a shop without webhooks pays nothing),
//! and then exactly once per fact, relayed by the change stream to the webhooks queue.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::json;
use tidings_core::notify::api;
use tidings_core::notify::model::NotificationRequest;
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::ChangeFeed;
use tidings_core::webhooks::{self, EVENT_SK, EndpointInput, EventType, WEBHOOKS_QUEUE};
use tidings_core::{Deps, Providers, TenantId, templates};
use tidings_embedded::EmbeddedChangeFeed;

mod support;
use support::{Recorder, TestWorld};

struct World {
    deps: Deps,
    feed: EmbeddedChangeFeed,
    /// Every change, read apart from the relay's.
    audit: EmbeddedChangeFeed,
    t: TenantId,
}

async fn world() -> World {
    let recorder = Arc::new(Recorder::default());
    let providers = Providers { email: recorder.clone(), sms: recorder.clone(), push: recorder };
    let tw = TestWorld::builder().all_queues(5).providers(providers).build();
    let t = TenantId::parse("shop-a").unwrap();
    let w = World { feed: tw.feed("relay"), audit: tw.feed("audit"), deps: tw.deps, t };
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "S", "email_body": "B"}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "msg", input).await.unwrap();
    let input = UserInput { email: Some("buyer@example.com".into()), ..UserInput::default() };
    users::put_user(&w.deps, &w.t, "u1", input).await.unwrap();
    w
}

async fn mail(w: &World, key: &str) {
    let req: NotificationRequest = serde_json::from_value(json!({"idempotency_key": key,
        "recipients": {"user_ids": ["u1"]}, "template_id": "msg",
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    api::accept(&w.deps, &w.t, req).await.unwrap();
    support::drain(&w.deps, &w.feed, support::Handling::One).await;
}

/// The webhook events written since the last call.
async fn events_written(w: &World) -> Vec<serde_json::Value> {
    let records = w.audit.next_batch(10_000).await.unwrap();
    w.audit.commit(&records).await.unwrap();
    records
        .into_iter()
        .filter(|r| r.key.sk == EVENT_SK && r.is_insert())
        .map(|r| r.new.unwrap().get("event").cloned().unwrap())
        .collect()
}

#[tokio::test]
async fn an_event_is_written_beside_its_fact_only_when_subscribed() {
    let w = world().await;
    mail(&w, "before").await;
    assert!(events_written(&w).await.is_empty(), "no endpoint: no event item");

    // Subscribed to another type only: still nothing.
    let input =
        |events: Vec<EventType>| EndpointInput { url: "https://93.184.216.34/hooks".into(), events, rate_limit: None };
    let other = webhooks::create(&w.deps, &w.t, input(vec![EventType::OrderExpired])).await.unwrap();
    mail(&w, "other-type").await;
    assert!(events_written(&w).await.is_empty(), "no subscriber of delivery.sent");

    webhooks::create(&w.deps, &w.t, input(vec![EventType::DeliverySent])).await.unwrap();
    mail(&w, "subscribed").await;
    let events = events_written(&w).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "delivery.sent");
    assert_eq!(events[0]["data"]["channel"], "email");
    // Relayed to the webhooks queue (its attempt to the endpoint is on its way: a post to an
    // address this test cannot reach is retried later).
    let stats = w.deps.queues.stats(WEBHOOKS_QUEUE).await.unwrap();
    assert!(stats.visible + stats.in_flight + stats.delayed >= 1, "{stats:?}");
    webhooks::delete(&w.deps, &w.t, &other.endpoint.endpoint_id).await.unwrap();
}
