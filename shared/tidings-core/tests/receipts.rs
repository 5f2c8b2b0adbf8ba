//! Receipts and tracking against the embedded store: SES events through SNS believed only from
//! the stack's topics, applied once and only while recent, suppressing only the address the
//! delivery went to; opens and clicks queued on the timers queue and applied from there.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use base64::Engine;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tidings_core::notify::api;
use tidings_core::notify::model::{Delivery, DeliveryStatus, NotificationRequest};
use tidings_core::people::suppression;
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{Channel, ManualClock};
use tidings_core::timers::TIMERS_QUEUE;
use tidings_core::tracking::receipts::{self, Callback, SnsMessage, VerifyError};
use tidings_core::tracking::{self, Claims, TokenKind};
use tidings_core::{CoreConfig, Deps, Providers, TenantId, keys, templates};
use tidings_embedded::EmbeddedChangeFeed;

mod support;
use support::{Recorder, TestWorld};

const CERT: &str = include_str!("../../../tests/fixtures/sns/test-signing-cert.pem");
const KEY: &str = include_str!("../../../tests/fixtures/sns/test-signing-key.pem");
const OUR_TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:stack-SesEventsTopic";
const THEIR_TOPIC: &str = "arn:aws:sns:us-east-1:666666666666:attacker";

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    feed: EmbeddedChangeFeed,
    t: TenantId,
}

async fn world() -> World {
    let recorder = Arc::new(Recorder::default());
    let config = CoreConfig { sns_topic_arns: vec![OUR_TOPIC.into()], ..CoreConfig::default() };
    let providers = Providers { email: recorder.clone(), sms: recorder.clone(), push: recorder };
    let tw = TestWorld::builder().all_queues(5).providers(providers).config(config).build();
    let t = TenantId::parse("shop-a").unwrap();
    let w = World { feed: tw.feed("relay"), clock: tw.clock(), deps: tw.deps, t };
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "S {{ n }}", "email_body": "B {{ n }}"}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.t, "msg", input).await.unwrap();
    for (user, email) in [("u1", "buyer@example.com"), ("u2", "victim@example.com")] {
        let input = UserInput { email: Some(email.into()), ..UserInput::default() };
        users::put_user(&w.deps, &w.t, user, input).await.unwrap();
    }
    w
}

/// Everything, until quiet.
async fn drain(w: &World) {
    support::drain(&w.deps, &w.feed, support::Handling::One).await;
}

/// One email to `user`, sent; its delivery.
async fn mail(w: &World, key: &str, user: &str) -> Delivery {
    let req: NotificationRequest = serde_json::from_value(json!({"idempotency_key": key,
        "recipients": {"user_ids": [user]}, "template_id": "msg", "params": {"n": 1},
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    let id = api::accept(&w.deps, &w.t, req).await.unwrap().notification_id;
    drain(w).await;
    let d = delivery(w, &id, user).await;
    assert_eq!(d.status, DeliveryStatus::Sent, "{d:?}");
    d
}

async fn delivery(w: &World, id: &str, user: &str) -> Delivery {
    w.deps.table.get(&keys::delivery(&w.t, id, user, Channel::Email)).await.unwrap().unwrap().parse().unwrap()
}

/// An SNS notification as SNS signs it (SHA256withRSA, version 2) with the test key.
fn sns(topic: &str, message_id: &str, stamped: DateTime<Utc>, event: &Value) -> SnsMessage {
    use rsa::pkcs1v15::SigningKey;
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::signature::{SignatureEncoding, Signer};
    let mut m = SnsMessage {
        kind: "Notification".into(),
        message_id: message_id.into(),
        token: None,
        topic_arn: topic.into(),
        subject: None,
        message: event.to_string(),
        timestamp: stamped.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        signature_version: "2".into(),
        signature: String::new(),
        signing_cert_url: "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem".into(),
        subscribe_url: None,
        unsubscribe_url: None,
    };
    let key = rsa::RsaPrivateKey::from_pkcs8_pem(KEY).unwrap();
    let sig = SigningKey::<sha2::Sha256>::new(key).sign(m.canonical().unwrap().as_bytes()).to_vec();
    m.signature = base64::engine::general_purpose::STANDARD.encode(sig);
    m
}

/// What the callback route does with a posted message: topic, signature, then once and recent.
async fn callback(w: &World, m: &SnsMessage) -> Result<Value, VerifyError> {
    receipts::check_topic(&w.deps.config, m)?;
    m.verify_with_cert(CERT)?;
    let event: Value = serde_json::from_str(&m.message).unwrap();
    Ok(receipts::receive(&w.deps, m, &event, Callback::Ses).await.unwrap())
}

fn complaint(message_id: &str, addresses: &[&str]) -> Value {
    let listed: Vec<Value> = addresses.iter().map(|a| json!({"emailAddress": a})).collect();
    json!({"eventType": "Complaint", "mail": {"messageId": message_id, "destination": addresses},
           "complaint": {"complainedRecipients": listed, "complaintFeedbackType": "abuse"}})
}

fn bounce(message_id: &str, addresses: &[&str]) -> Value {
    let listed: Vec<Value> = addresses.iter().map(|a| json!({"emailAddress": a})).collect();
    json!({"eventType": "Bounce", "mail": {"messageId": message_id, "destination": addresses},
           "bounce": {"bounceType": "Permanent", "bounceSubType": "General", "bouncedRecipients": listed}})
}

/// Log forging (docs/operators.md, "Logs"): the refusal of an unauthenticated callback's
/// topic, which the API logs and answers, quotes the topic with its control characters escaped.
#[test]
fn a_refused_topic_is_quoted_with_its_line_breaks_escaped() {
    let refused = VerifyError::TopicNotAllowed("arn:aws:sns:x\r\nERROR forged".into()).to_string();
    assert!(!refused.chars().any(char::is_control), "{refused}");
    assert!(refused.contains(r#""arn:aws:sns:x\r\nERROR forged""#), "{refused}");
}

async fn suppressed(w: &World, address: &str) -> bool {
    suppression::is_suppressed(&w.deps, &w.t, Channel::Email, address).await.unwrap()
}

/// The attack: someone subscribes the endpoint to a topic of their own and publishes a
/// correctly signed Complaint naming a message id they received and someone else's address.
/// Refused for its topic; and even from our own topic, an event suppresses only the address its
/// delivery went to.
#[tokio::test]
async fn a_signed_complaint_from_another_topic_suppresses_nothing() {
    let w = world().await;
    let d = mail(&w, "k1", "u1").await;
    let pm = d.provider_message_id.unwrap();
    let forged = sns(THEIR_TOPIC, "m-forged", w.deps.clock.now(), &complaint(&pm, &["victim@example.com"]));
    assert_eq!(forged.verify_with_cert(CERT), Ok(()), "the signature itself is SNS's");
    assert!(matches!(callback(&w, &forged).await, Err(VerifyError::TopicNotAllowed(_))));
    assert!(!suppressed(&w, "victim@example.com").await);

    // From our topic, a complaint about u1's mail that lists u2's address too: only u1's.
    let listed =
        sns(OUR_TOPIC, "m-ours", w.deps.clock.now(), &complaint(&pm, &["victim@example.com", "BUYER@example.com"]));
    let out = callback(&w, &listed).await.unwrap();
    assert_eq!((out["matched"].as_bool(), out["suppressed"].as_u64()), (Some(true), Some(1)), "{out}");
    assert!(!suppressed(&w, "victim@example.com").await, "another user's address");
    assert!(suppressed(&w, "buyer@example.com").await);
    // Nobody's: an event naming only other addresses suppresses none.
    let d2 = mail(&w, "k2", "u2").await;
    let other =
        sns(OUR_TOPIC, "m-other", w.deps.clock.now(), &complaint(&d2.provider_message_id.unwrap(), &["x@example.com"]));
    assert_eq!(callback(&w, &other).await.unwrap()["suppressed"], 0);
    assert!(!suppressed(&w, "victim@example.com").await);
}

/// A genuine permanent bounce still fails the delivery and suppresses its address; the same
/// `MessageId` again, or a notification older than the window, changes nothing.
#[tokio::test]
async fn a_genuine_bounce_suppresses_once_and_replays_and_old_events_are_ignored() {
    let w = world().await;
    let d = mail(&w, "k1", "u1").await;
    let pm = d.provider_message_id.unwrap();
    let genuine = sns(OUR_TOPIC, "m-bounce", w.deps.clock.now(), &bounce(&pm, &["buyer@example.com"]));
    let out = callback(&w, &genuine).await.unwrap();
    assert_eq!(out["suppressed"], 1, "{out}");
    assert!(suppressed(&w, "buyer@example.com").await);

    // The suppression is lifted by hand (as an operator would); a replay must not put it back.
    let lifted = suppression::key_of(&w.t, Channel::Email, "buyer@example.com");
    w.deps.table.delete(&lifted, tidings_core::ports::Cond::Always).await.unwrap();
    w.clock.advance(chrono::Duration::hours(1));
    assert_eq!(callback(&w, &genuine).await.unwrap(), json!({"ignored": "replayed"}));
    assert!(!suppressed(&w, "buyer@example.com").await);

    // Older than the window (24 h by its signed Timestamp): ignored even with a new MessageId.
    let old =
        sns(OUR_TOPIC, "m-old", w.deps.clock.now() - chrono::Duration::hours(25), &bounce(&pm, &["buyer@example.com"]));
    assert_eq!(callback(&w, &old).await.unwrap(), json!({"ignored": "stale"}));
    let far_ahead = sns(
        OUR_TOPIC,
        "m-ahead",
        w.deps.clock.now() + chrono::Duration::hours(2),
        &bounce(&pm, &["buyer@example.com"]),
    );
    assert_eq!(callback(&w, &far_ahead).await.unwrap(), json!({"ignored": "stale"}));
    assert!(!suppressed(&w, "buyer@example.com").await);
    // Within the window, new: applied.
    let late = sns(
        OUR_TOPIC,
        "m-late",
        w.deps.clock.now() - chrono::Duration::hours(23),
        &bounce(&pm, &["buyer@example.com"]),
    );
    assert_eq!(callback(&w, &late).await.unwrap()["suppressed"], 1);

    // A Reject (SES took the mail, then refused to send it): the delivery failed, nobody suppressed.
    let req: NotificationRequest = serde_json::from_value(json!({"idempotency_key": "k-reject",
        "recipients": {"user_ids": ["u2"]}, "template_id": "msg", "params": {"n": 1},
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    let id = api::accept(&w.deps, &w.t, req).await.unwrap().notification_id;
    drain(&w).await;
    let pm = delivery(&w, &id, "u2").await.provider_message_id.unwrap();
    let reject = json!({"eventType": "Reject", "mail": {"messageId": pm}, "reject": {"reason": "Bad content"}});
    let out = callback(&w, &sns(OUR_TOPIC, "m-reject", w.deps.clock.now(), &reject)).await.unwrap();
    assert_eq!((out["matched"].as_bool(), out["suppressed"].as_u64()), (Some(true), Some(0)), "{out}");
    assert_eq!(delivery(&w, &id, "u2").await.status, DeliveryStatus::Failed);
    assert!(!suppressed(&w, "victim@example.com").await);
}

/// Opens and clicks are one message each on the timers queue (nothing is left to run after the
/// route answers); applied from there, a repeat changes nothing, and the times are when the
/// reader opened and clicked, not when the queue was drained.
#[tokio::test]
async fn opens_and_clicks_are_queued_then_applied_once() {
    let w = world().await;
    let req: NotificationRequest = serde_json::from_value(json!({"idempotency_key": "t1",
        "recipients": {"user_ids": ["u1"]}, "template_id": "msg", "params": {"n": 1},
        "category": "transactional", "channels": ["email"]}))
    .unwrap();
    let id = api::accept(&w.deps, &w.t, req).await.unwrap().notification_id;
    drain(&w).await;
    let claims = |k| Claims { k, t: w.t.clone(), n: id.clone(), u: "u1".into(), c: Channel::Email, url: None, s: None };
    let opened_at = w.deps.clock.now();
    tracking::queue(&w.deps, &claims(TokenKind::Open)).await.unwrap();
    tracking::queue(&w.deps, &claims(TokenKind::Click)).await.unwrap();
    tracking::queue(&w.deps, &claims(TokenKind::Click)).await.unwrap();
    assert_eq!(w.deps.queues.stats(TIMERS_QUEUE).await.unwrap().visible, 3, "queued, not yet applied");
    assert_eq!(delivery(&w, &id, "u1").await.status, DeliveryStatus::Sent);
    w.clock.advance(chrono::Duration::seconds(30));
    drain(&w).await;
    let item = w.deps.table.get(&keys::delivery(&w.t, &id, "u1", Channel::Email)).await.unwrap().unwrap();
    let d: Delivery = item.parse().unwrap();
    assert_eq!(d.status, DeliveryStatus::Clicked);
    let when = opened_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert_eq!(item.str("opened_at"), Some(when.as_str()), "{item:?}");
    assert_eq!(item.str("clicked_at"), Some(when.as_str()));
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_eq!((view.counts.sent, view.counts.delivered), (0, 1), "counted once: {view:?}");
}
