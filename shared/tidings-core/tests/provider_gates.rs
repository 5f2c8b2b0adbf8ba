//! The gates and the provider's timeout (docs/gates.md, "Time at the gates", "Retry-After"):
//! time waiting at Tidings' own rate gate is not the provider's, and a send held there past the
//! gate's limit goes back to its queue unattempted, never to `outcome_unknown`; a 429 with
//! `Retry-After` holds the provider for that tenant, with or without configured rates, and for
//! that tenant only (issue 32).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::gates::{self, GateConfig, GateStore, TenantGates};
use tidings_core::messages;
use tidings_core::notify::api;
use tidings_core::notify::model::{DeliveryStatus, NotificationRequest};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{
    Channel, Clock, ManualClock, OutboundMessage, Provider, ProviderError, ProviderReceipt, Providers, Table,
};
use tidings_core::{CoreConfig, TenantId, templates};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

/// Answers at once, and counts what it took per user.
#[derive(Default)]
struct Fast {
    sends: Mutex<HashMap<String, u32>>,
}

#[async_trait]
impl Provider for Fast {
    fn name(&self) -> &str {
        "fast"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        *self.sends.lock().unwrap().entry(m.user_id.clone()).or_default() += 1;
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", m.user_id) })
    }
}

/// The numbers: a provider timeout of 1.5 s, an email rate of 5/s and a campaign of 30
/// marketing emails to a provider that answers at once. Before, 18 of them waited at the gate
/// longer than the provider timeout and were closed `failed` (`outcome_unknown`) unsent; now
/// every one is sent, once, and none counted an attempt for its time at the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_at_the_rate_gate_is_not_the_providers_time() {
    const MEMBERS: usize = 30;
    let provider = Arc::new(Fast::default());
    let gate_config = GateConfig {
        provider_rates: [("email".to_owned(), 5.0)].into_iter().collect(),
        max_wait: Duration::from_secs(2),
        ..GateConfig::default()
    };
    let email: Arc<dyn Provider> = provider.clone();
    let providers = gates::wrap(
        &Providers { email: email.clone(), sms: email.clone(), push: email },
        None,
        &gate_config,
        GateStore::Local,
    );
    let config = CoreConfig {
        provider_timeout: Duration::from_millis(1500),
        frequency_cap: 100,
        gates: gate_config,
        ..CoreConfig::default()
    };
    let w = TestWorld::builder().system_clock().all_queues(5).providers(providers).config(config).build();
    let t = TenantId::parse("shop-a").unwrap();
    for i in 0..MEMBERS {
        let user =
            UserInput { email: Some(format!("u{i}@example.com")), tags: vec!["all".into()], ..Default::default() };
        users::put_user(&w.deps, &t, &format!("u{i:02}"), user).await.unwrap();
    }
    let template = serde_json::from_value(json!({
        "default_locale": "en", "locales": {"en": {"email_subject": "S", "email_body": "B"}}
    }))
    .unwrap();
    templates::put_template(&w.deps, &t, "tpl", template).await.unwrap();
    let request: NotificationRequest = serde_json::from_value(json!({
        "idempotency_key": "gate-30", "recipients": {"segment": "all"}, "template_id": "tpl",
        "category": "marketing", "channels": ["email"],
    }))
    .unwrap();
    let id = api::accept(&w.deps, &t, request).await.unwrap().notification_id;
    let feed = w.feed("relay");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let deliveries = loop {
        pump(&w.deps, &feed).await;
        let page = api::list_deliveries(&w.deps, &t, &id, 100, None).await.unwrap().unwrap();
        let closed = page.items.iter().filter(|d| !d.status.is_open()).count();
        if page.items.len() == MEMBERS && closed == MEMBERS {
            break page.items;
        }
        assert!(std::time::Instant::now() < deadline, "not every delivery closed within 60 s: {:?}", page.items);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let failed: Vec<_> = deliveries.iter().filter(|d| d.status != DeliveryStatus::Sent).collect();
    assert!(failed.is_empty(), "{} of {MEMBERS} not sent: {failed:?}", failed.len());
    let sends = provider.sends.lock().unwrap().clone();
    assert_eq!(sends.len(), MEMBERS, "every member reached the provider");
    assert!(sends.values().all(|n| *n == 1), "each once: {sends:?}");
    // Time at the gate is no attempt: each delivery was attempted once, by the call that sent it.
    assert!(deliveries.iter().all(|d| d.attempts == 1), "{deliveries:?}");
}

/// One worker of the email queues: a batch of up to 10 messages, handled together; how many.
async fn work(deps: &tidings_core::Deps) -> usize {
    let mut did = 0;
    for q in ["email-low", "email-high"] {
        let got = deps.queues.receive(q, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        if got.is_empty() {
            continue;
        }
        did += got.len();
        let outcomes = messages::dispatch_batch(deps, q, &got).await;
        messages::settle_batch(deps.queues.as_ref(), q, &got, outcomes, deps.clock.now(), true).await;
    }
    did
}

/// The relay and the other queues one message at a time; the email queues as `tidings serve`
/// runs them: batches of 10, two workers at once (their sends wait at the gate together).
async fn pump(deps: &tidings_core::Deps, feed: &tidings_embedded::EmbeddedChangeFeed) {
    loop {
        let did = tidings_embedded::test_world::pass(deps, feed, |q| !q.starts_with("email")).await;
        let (a, b) = tokio::join!(work(deps), work(deps));
        if did + a + b == 0 {
            return;
        }
    }
}

/// Answers 429 with `Retry-After: 6` to its first call, then takes everything; records the
/// (manual) time and tenant of every call that reached it.
struct ThrottlesOnce {
    clock: Arc<ManualClock>,
    calls: Mutex<Vec<(String, i64)>>,
}

#[async_trait]
impl Provider for ThrottlesOnce {
    fn name(&self) -> &str {
        "throttles-once"
    }
    async fn send(&self, m: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut calls = self.calls.lock().unwrap();
        calls.push((m.tenant.clone(), self.clock.now_ms()));
        if calls.len() == 1 {
            return Err(ProviderError::Transient {
                reason: "provider answered 429".into(),
                retry_after: Some(Duration::from_secs(6)),
            });
        }
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", calls.len()) })
    }
}

fn message(tenant: &str) -> OutboundMessage {
    OutboundMessage {
        channel: Channel::Email,
        to: "a@example.com".into(),
        subject: None,
        body: "x".into(),
        html: None,
        headers: vec![],
        idempotency_key: format!("k-{tenant}"),
        marketing: false,
        tenant: tenant.into(),
        notification_id: "n".into(),
        user_id: "u".into(),
        attempt: 1,
    }
}

/// Two instances (two gates over one store, or one gate twice on the local store); `rate`: a
/// configured provider rate, or none (the local default).
async fn retry_after_holds(store: Option<Arc<dyn Table>>, rate: Option<f64>) {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let provider = Arc::new(ThrottlesOnce { clock: clock.clone(), calls: Mutex::default() });
    let gate_store = match &store {
        Some(table) => GateStore::Shared(table.clone()),
        None => GateStore::Local,
    };
    let instance = |tenants: Arc<TenantGates>| {
        let gate = rate.map(|r| -> Arc<dyn gates::RateGate> {
            match &store {
                Some(table) => Arc::new(gates::SharedGate::new(table.clone(), "provider#email", r)),
                None => Arc::new(gates::LocalGate::new(r, clock.now_ms())),
            }
        });
        // `max_wait` zero: a held send is refused at once (and its message handed back).
        gates::Gated::new(provider.clone(), Channel::Email, gate, tenants, Duration::ZERO, clock.clone())
    };
    let shared_tenants = Arc::new(TenantGates::new(GateConfig::default(), gate_store.clone()));
    let a = instance(shared_tenants.clone());
    // The second instance has gates of its own; on the local store it is the same process.
    let b = match &store {
        Some(_) => instance(Arc::new(TenantGates::new(GateConfig::default(), gate_store))),
        None => instance(shared_tenants),
    };
    let start = clock.now_ms();
    let refused = |r: Result<ProviderReceipt, ProviderError>| match r {
        Err(e) => gates::gate_refusal(&e).is_some(),
        Ok(_) => false,
    };
    // 429 for shop-a, asking for six seconds.
    assert!(a.send(&message("shop-a")).await.is_err());
    for step_ms in [1000, 2000, 2000, 900] {
        clock.advance(chrono::Duration::milliseconds(step_ms));
        assert!(refused(a.send(&message("shop-a")).await), "shop-a held on this instance");
        assert!(refused(b.send(&message("shop-a")).await), "shop-a held on the other instance too");
    }
    // Another tenant is not held by shop-a's 429.
    assert!(b.send(&message("shop-b")).await.is_ok(), "shop-b is not held");
    clock.advance(chrono::Duration::milliseconds(100));
    assert!(a.send(&message("shop-a")).await.is_ok(), "after the Retry-After, shop-a goes again");
    let calls = provider.calls.lock().unwrap().clone();
    let a_calls: Vec<i64> = calls.iter().filter(|(t, _)| t == "shop-a").map(|(_, at)| at - start).collect();
    assert_eq!(a_calls, [0, 6000], "no send of shop-a reached the provider inside the Retry-After");
    assert_eq!(calls.iter().filter(|(t, _)| t == "shop-b").count(), 1);
}

#[tokio::test]
async fn a_429_holds_the_provider_for_its_tenant_without_configured_rates() {
    retry_after_holds(None, None).await;
}

#[tokio::test]
async fn a_429_holds_the_provider_for_its_tenant_with_configured_rates() {
    retry_after_holds(None, Some(1000.0)).await;
}

#[tokio::test]
async fn a_429_holds_the_provider_for_its_tenant_on_every_instance() {
    let table: Arc<dyn Table> = Arc::new(EmbeddedStore::in_memory().unwrap());
    retry_after_holds(Some(table.clone()), None).await;
}

/// A send that is still at a gate when its time runs out never reached the provider: it is
/// handed back, not taken for a call whose outcome is unknown.
#[tokio::test]
async fn the_provider_timeout_counts_only_outside_the_gates() {
    // 300 ms at a gate, then a provider that answers in 50 ms, under a timeout of 200 ms.
    let send = async {
        {
            let _at = gates::AtGate::enter();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        "answered"
    };
    let r = gates::within(Duration::from_millis(200), Duration::from_secs(2), send).await;
    assert_eq!(r, Ok("answered"));
    // The same provider answering in 300 ms outside any gate has timed out.
    let slow = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        "answered"
    };
    assert_eq!(
        gates::within(Duration::from_millis(200), Duration::from_secs(2), slow).await,
        Err(gates::Elapsed::InCall)
    );
    // Stuck at a gate past its limit: given up there, unsent.
    let stuck = async {
        let _at = gates::AtGate::enter();
        tokio::time::sleep(Duration::from_secs(5)).await;
        "answered"
    };
    let r = gates::within(Duration::from_millis(100), Duration::from_millis(200), stuck).await;
    assert_eq!(r, Err(gates::Elapsed::AtGate));
}
