//! A slowed fake provider (`PUT /dev/providers/{channel}` with `delay_ms`): every send waits
//! the delay before it is answered, in any mode, and a delay of 0 or none waits nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tidings_core::dev::{DevProvider, FaultConfig, FaultMode, NullProvider};
use tidings_core::ports::{Channel, OutboundMessage, Provider, SystemClock, Table};
use tidings_embedded::EmbeddedStore;

fn message() -> OutboundMessage {
    serde_json::from_value(json!({
        "channel": "email", "to": "a@example.com", "subject": "Sale", "body": "Hi",
        "idempotency_key": "k1", "marketing": true, "tenant": "acme", "notification_id": "n1",
        "user_id": "u1", "attempt": 1
    }))
    .unwrap()
}

async fn timed(p: &DevProvider) -> (Duration, bool) {
    let start = Instant::now();
    let ok = p.send(&message()).await.is_ok();
    (start.elapsed(), ok)
}

#[tokio::test]
async fn a_delayed_provider_answers_after_its_delay() {
    let table: Arc<dyn Table> = Arc::new(EmbeddedStore::in_memory().unwrap());
    let email = DevProvider::new(Channel::Email, Arc::new(NullProvider), table, Arc::new(SystemClock));
    let (quick, ok) = timed(&email).await;
    assert!(ok && quick < Duration::from_millis(300), "no delay configured: {quick:?}");

    email.configure(FaultConfig { delay_ms: Some(400), ..FaultConfig::default() });
    let (slow, ok) = timed(&email).await;
    assert!(ok, "a slow provider still sends");
    assert!(slow >= Duration::from_millis(400), "waited the delay: {slow:?}");

    email.configure(FaultConfig { mode: FaultMode::Fail5xx, delay_ms: Some(400), ..FaultConfig::default() });
    let (slow, ok) = timed(&email).await;
    assert!(!ok && slow >= Duration::from_millis(400), "a failure comes after the delay too: {slow:?}");

    email.configure(FaultConfig { delay_ms: Some(0), ..FaultConfig::default() });
    let (quick, ok) = timed(&email).await;
    assert!(ok && quick < Duration::from_millis(300), "a delay of 0 waits nothing: {quick:?}");
}
