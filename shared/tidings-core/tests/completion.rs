//! `campaign.completed` is told for every campaign, however many are open at once: the tick
//! reads a bounded number of open campaigns and goes on where the last tick stopped
//! (docs/delivery.md, "Campaigns").

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::notify::api;
use tidings_core::notify::completion::check_open_at_most;
use tidings_core::notify::model::{NotificationRequest, NotificationStatus};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{OutboundMessage, PermanentCode, Provider, ProviderError, ProviderReceipt};
use tidings_core::webhooks::{self, EndpointInput, EventType};
use tidings_core::{CoreConfig, TenantId, templates};
use tidings_embedded::test_world::{Recorder, TestWorld, drain};

/// An SMS provider that is down: the campaigns sent through it stay open.
struct Down;

#[async_trait]
impl Provider for Down {
    fn name(&self) -> &str {
        "down"
    }
    async fn send(&self, _: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        Err(ProviderError::transient("provider answered 503"))
    }
}

async fn shop(w: &TestWorld, tenant: &str) -> TenantId {
    let t = TenantId::parse(tenant).unwrap();
    let input = UserInput {
        email: Some("member@example.com".into()),
        phone: Some("+14155550100".into()),
        tags: vec!["members".into()],
        ..Default::default()
    };
    users::put_user(&w.deps, &t, "m1", input).await.unwrap();
    let template = serde_json::from_value(json!({
        "default_locale": "en",
        "locales": {"en": {"email_subject": "Sale", "email_body": "Hello", "sms": "Hello"}}
    }))
    .unwrap();
    templates::put_template(&w.deps, &t, "promo", template).await.unwrap();
    t
}

async fn campaign(w: &TestWorld, t: &TenantId, key: &str, channel: &str) -> String {
    let request: NotificationRequest = serde_json::from_value(json!({
        "idempotency_key": key, "recipients": {"segment": "members"}, "template_id": "promo",
        "category": "marketing", "channels": [channel],
    }))
    .unwrap();
    api::accept(&w.deps, t, request).await.unwrap().notification_id
}

#[tokio::test]
async fn a_campaign_behind_more_open_ones_than_a_tick_reads_is_still_told() {
    let w = TestWorld::builder()
        .all_queues(5)
        .email(Arc::new(Recorder::default()))
        .sms(Arc::new(Down))
        .config(CoreConfig { frequency_cap: 100, ..CoreConfig::default() })
        .build();
    let feed = w.feed("relay");
    // The open list is ordered by tenant: two campaigns that cannot finish (their SMS provider
    // is down) come before the one that does.
    let front = shop(&w, "aa-shop").await;
    let back = shop(&w, "zz-shop").await;
    let stuck = [campaign(&w, &front, "stuck-1", "sms").await, campaign(&w, &front, "stuck-2", "sms").await];
    let done = campaign(&w, &back, "done-1", "email").await;
    drain(&w.deps, &feed).await;
    let status = |t: TenantId, id: String| {
        let deps = w.deps.clone();
        async move { api::get_notification(&deps, &t, &id).await.unwrap().unwrap().status }
    };
    assert_eq!(status(back.clone(), done.clone()).await, NotificationStatus::Completed);
    for id in &stuck {
        assert_ne!(status(front.clone(), id.clone()).await, NotificationStatus::Completed);
    }

    // A tick that reads two looks at the two stuck campaigns; the next goes on to the third.
    let first = check_open_at_most(&w.deps, 2).await.unwrap();
    assert_eq!((first.checked, first.completed), (2, 0), "{first:?}");
    let second = check_open_at_most(&w.deps, 2).await.unwrap();
    assert_eq!(second.completed, 1, "the campaign after the first two is told: {second:?}");
    // Then from the front again: the stuck ones are still watched, the told one is gone.
    let mut seen = 0;
    for _ in 0..3 {
        let r = check_open_at_most(&w.deps, 2).await.unwrap();
        assert_eq!(r.completed, 0, "told once: {r:?}");
        seen += r.checked;
    }
    assert!(seen >= 4, "the two stuck campaigns are looked at on every round: {seen}");
}

/// An SMS provider that refuses every message for good.
struct Refusing;

#[async_trait]
impl Provider for Refusing {
    fn name(&self) -> &str {
        "refusing"
    }
    async fn send(&self, _: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        Err(ProviderError::Permanent { reason: "rejected".into(), code: PermanentCode::Rejected })
    }
}

/// A campaign whose every delivery failed reads `failed`, one with some sent and some failed
/// `completed_with_failures`; each is told by `campaign.completed` with that status (the
/// event says how it ended, as the API does).
#[tokio::test]
async fn a_campaigns_end_tells_how_it_ended() {
    let w = TestWorld::builder()
        .all_queues(5)
        .email(Arc::new(Recorder::default()))
        .sms(Arc::new(Refusing))
        .config(CoreConfig { frequency_cap: 100, ..CoreConfig::default() })
        .build();
    let feed = w.feed("relay");
    let audit = w.feed("audit");
    let t = shop(&w, "shop").await;
    let input = EndpointInput {
        url: "https://93.184.216.34/hooks".into(),
        events: vec![EventType::CampaignCompleted],
        rate_limit: None,
    };
    webhooks::create(&w.deps, &t, input).await.unwrap();
    // A second member without a phone: the SMS campaign's failures are both refusals and a
    // suppression (no address), which is no failure.
    let input = UserInput { email: Some("m2@example.com".into()), tags: vec!["members".into()], ..Default::default() };
    users::put_user(&w.deps, &t, "m2", input).await.unwrap();
    let failed = campaign(&w, &t, "all-sms", "sms").await;
    let partly = {
        let request: NotificationRequest = serde_json::from_value(json!({
            "idempotency_key": "both", "recipients": {"segment": "members"}, "template_id": "promo",
            "category": "marketing", "channels": ["email", "sms"],
        }))
        .unwrap();
        api::accept(&w.deps, &t, request).await.unwrap().notification_id
    };
    let ok = campaign(&w, &t, "all-email", "email").await;
    drain(&w.deps, &feed).await;
    let view = |id: String| {
        let (deps, t) = (w.deps.clone(), t.clone());
        async move { api::get_notification(&deps, &t, &id).await.unwrap().unwrap() }
    };
    let v = view(failed.clone()).await;
    assert_eq!((v.status, v.counts.failed, v.counts.suppressed), (NotificationStatus::Failed, 1, 1), "{v:?}");
    let v = view(partly.clone()).await;
    assert_eq!(v.status, NotificationStatus::CompletedWithFailures, "{v:?}");
    assert_eq!(view(ok.clone()).await.status, NotificationStatus::Completed);

    let report = check_open_at_most(&w.deps, 10).await.unwrap();
    assert_eq!(report.completed, 3, "{report:?}");
    let told: std::collections::BTreeMap<String, String> =
        tidings_embedded::test_world::told(&audit, "campaign.completed").await.into_iter().collect();
    let want = [(failed, "failed"), (partly, "completed_with_failures"), (ok, "completed")]
        .map(|(id, s)| (id, s.to_owned()))
        .into_iter()
        .collect();
    assert_eq!(told, want);
}
