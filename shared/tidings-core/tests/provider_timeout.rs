//! A provider call that outlasts the provider timeout has an unknown outcome: the provider may
//! have taken the message. A marketing delivery is then closed as `failed` (`outcome_unknown`)
//! and never sent again (at most once); a transactional one is tried again (at least once)
//! (docs/delivery.md, "Send: the rule of once").

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::notify::api;
use tidings_core::notify::model::{DeliveryStatus, NotificationRequest};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{OutboundMessage, Provider, ProviderError, ProviderReceipt};
use tidings_core::{CoreConfig, TenantId, templates};
use tidings_embedded::test_world::{TestWorld, drain};

/// Takes every message, but answers its first call only after the worker stopped waiting.
#[derive(Default)]
struct SlowFirst {
    taken: AtomicU32,
}

#[async_trait]
impl Provider for SlowFirst {
    fn name(&self) -> &str {
        "slow-first"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let n = self.taken.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}-{n}", m.user_id) })
    }
}

/// Runs the relay and every queue until nothing is visible, then moves the clock on and runs
/// them again, a few times (retries wait on the manual clock).
async fn drain_with_retries(w: &TestWorld) {
    let feed = w.feed("relay");
    for _ in 0..4 {
        drain(&w.deps, &feed).await;
        w.clock().advance(chrono::Duration::seconds(600));
    }
}

async fn one_send(category: &str) -> (Arc<SlowFirst>, DeliveryStatus, Option<String>) {
    let email = Arc::new(SlowFirst::default());
    let config =
        CoreConfig { provider_timeout: Duration::from_millis(200), frequency_cap: 100, ..CoreConfig::default() };
    let w = TestWorld::builder().all_queues(5).email(email.clone()).config(config).build();
    let t = TenantId::parse("shop-a").unwrap();
    let user = UserInput { email: Some("u1@example.com".into()), tags: vec!["all".into()], ..Default::default() };
    users::put_user(&w.deps, &t, "u1", user).await.unwrap();
    let template = serde_json::from_value(json!({
        "default_locale": "en", "locales": {"en": {"email_subject": "S", "email_body": "B"}}
    }))
    .unwrap();
    templates::put_template(&w.deps, &t, "tpl", template).await.unwrap();
    let recipients = if category == "marketing" { json!({"segment": "all"}) } else { json!({"user_ids": ["u1"]}) };
    let request: NotificationRequest = serde_json::from_value(json!({
        "idempotency_key": format!("timeout-{category}"), "recipients": recipients, "template_id": "tpl",
        "category": category, "channels": ["email"],
    }))
    .unwrap();
    let id = api::accept(&w.deps, &t, request).await.unwrap().notification_id;
    drain_with_retries(&w).await;
    let page = api::list_deliveries(&w.deps, &t, &id, 10, None).await.unwrap().unwrap();
    assert_eq!(page.items.len(), 1, "{:?}", page.items);
    let d = &page.items[0];
    (email, d.status, d.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marketing_send_that_times_out_is_closed_and_never_sent_again() {
    let (email, status, reason) = one_send("marketing").await;
    assert_eq!(email.taken.load(Ordering::SeqCst), 1, "the provider took it once, and only once");
    assert_eq!((status, reason.as_deref()), (DeliveryStatus::Failed, Some("outcome_unknown")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_send_that_times_out_is_tried_again() {
    let (email, status, _) = one_send("transactional").await;
    assert_eq!(email.taken.load(Ordering::SeqCst), 2, "tried again after the timeout (at least once)");
    assert_eq!(status, DeliveryStatus::Sent);
}
