//! Webhooks out to the shop, end to end: real HTTP receivers on loopback that verify every
//! `webhook-signature` themselves (HMAC-SHA256 over `id.timestamp.body`, the Standard Webhooks
//! scheme, written here apart from the server's code) and record each `webhook-id`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(90);

/// One post a receiver took.
#[derive(Clone, Debug)]
pub struct Post {
    pub id: String,
    pub kind: String,
    pub body: Value,
    /// Which of the receiver's secrets (by index) some signature entry verifies with.
    pub verified_by: Vec<usize>,
    /// How many `v1,` entries the header carried.
    pub signatures: usize,
    /// What the receiver answered.
    pub status: u16,
    /// When it arrived.
    pub at: std::time::Instant,
}

#[derive(Default)]
struct Inner {
    secrets: Vec<String>,
    posts: Vec<Post>,
    answer: u16,
}

/// A webhook receiver on 127.0.0.1: answers `answer` (200 unless told), records every post.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

/// The signature a receiver expects: `v1,` and base64 HMAC-SHA256 of `id.timestamp.body`
/// keyed with the base64 after `whsec_`.
pub fn expected_signature(secret: &str, id: &str, timestamp: &str, body: &[u8]) -> String {
    let key = B64.decode(secret.trim_start_matches("whsec_")).unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

async fn take(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (id, timestamp, signature) = (h("webhook-id"), h("webhook-timestamp"), h("webhook-signature"));
    let mut inner = r.inner.lock().unwrap();
    let entries: Vec<&str> = signature.split(' ').filter(|s| !s.is_empty()).collect();
    let verified_by = (0..inner.secrets.len())
        .filter(|&i| entries.contains(&expected_signature(&inner.secrets[i], &id, &timestamp, &body).as_str()))
        .collect();
    let fresh = timestamp.parse::<i64>().is_ok_and(|t| (chrono::Utc::now().timestamp() - t).abs() < 300);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let status = if fresh { inner.answer } else { 400 };
    inner.posts.push(Post {
        id,
        kind: parsed["type"].as_str().unwrap_or_default().to_owned(),
        body: parsed,
        verified_by,
        signatures: entries.len(),
        status,
        at: std::time::Instant::now(),
    });
    StatusCode::from_u16(status).unwrap()
}

impl Receiver {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let r = Receiver { url, inner: Arc::new(Mutex::new(Inner { answer: 200, ..Default::default() })) };
        let app = axum::Router::new().route("/hook", axum::routing::post(take)).with_state(r.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(r)
    }

    /// Secrets to verify with, in order (a rotation adds the new one).
    pub fn trust(&self, secret: &str) {
        self.inner.lock().unwrap().secrets.push(secret.to_owned());
    }

    pub fn answer(&self, status: u16) {
        self.inner.lock().unwrap().answer = status;
    }

    pub fn posts(&self) -> Vec<Post> {
        self.inner.lock().unwrap().posts.clone()
    }

    /// Posts answered 2xx, by webhook-id: how many times each.
    pub fn delivered(&self) -> BTreeMap<String, usize> {
        let mut by_id = BTreeMap::new();
        for p in self.posts().into_iter().filter(|p| (200..300).contains(&p.status)) {
            *by_id.entry(p.id).or_default() += 1;
        }
        by_id
    }
}

async fn setup(s: &Server) -> anyhow::Result<()> {
    for (id, body) in [
        ("u1", json!({"email": "alice@example.com", "phone": "+14155550101"})),
        ("u2", json!({"email": "bob@example.com", "phone": "+14155550102"})),
    ] {
        let (st, v) = s.call("PUT", &format!("/v1/users/{id}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    let template = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "Order {{ order_id }}", "email_body": "Order {{ order_id }} shipped", "sms": "Order {{ order_id }}"}}});
    let (st, v) = s.call("PUT", "/v1/templates/shipped", Some(template)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

async fn send(s: &Server, key: &str, users: &[&str], channels: &[&str]) -> anyhow::Result<String> {
    let body = json!({"idempotency_key": key, "recipients": {"user_ids": users}, "template_id": "shipped",
        "params": {"order_id": key}, "category": "transactional", "channels": channels});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap().to_owned())
}

/// Registers an endpoint; returns (id, secret).
async fn endpoint(s: &Server, r: &Receiver, events: &[&str]) -> anyhow::Result<(String, String)> {
    endpoint_at_rate(s, r, events, 50).await
}

/// Registers an endpoint posted to at most `rate` times a second; returns (id, secret).
async fn endpoint_at_rate(s: &Server, r: &Receiver, events: &[&str], rate: u32) -> anyhow::Result<(String, String)> {
    let (st, v) =
        s.call("POST", "/v1/webhooks", Some(json!({"url": r.url, "events": events, "rate_limit": rate}))).await?;
    assert_eq!(st, 201, "{v}");
    let secret = v["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{v}");
    r.trust(&secret);
    Ok((v["endpoint_id"].as_str().unwrap().to_owned(), secret))
}

fn options(extra: Vec<(&'static str, String)>) -> Options {
    let mut o = Options::default();
    o.env.push(("TIDINGS_WEBHOOK_ALLOW_PRIVATE", "true".into()));
    o.env.extend(extra);
    o
}

/// Two endpoints, each subscribed to one event type: each gets its events once per webhook-id,
/// signed, and nothing else; the test route, a rotation's two signatures, and another tenant
/// that can neither see nor delete them.
pub async fn subscribed_events_arrive_once_signed_and_only_to_their_subscribers(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, options(Vec::new())).await?;
    setup(&s).await?;
    let (sent_rx, failed_rx) = (Receiver::start().await?, Receiver::start().await?);
    let (sent_ep, old_secret) = endpoint(&s, &sent_rx, &["delivery.sent"]).await?;
    let (_failed_ep, _) = endpoint(&s, &failed_rx, &["delivery.failed"]).await?;

    // Refused input names its field.
    for (body, field) in [
        (json!({"url": "ftp://127.0.0.1/x", "events": ["delivery.sent"]}), "url"),
        (json!({"url": sent_rx.url, "events": []}), "events"),
        (json!({"url": sent_rx.url, "events": ["webhook.test"]}), "events"),
        (json!({"url": sent_rx.url, "events": ["delivery.sent"], "rate_limit": 0}), "rate_limit"),
    ] {
        let (st, v) = s.call("POST", "/v1/webhooks", Some(body)).await?;
        assert_eq!((st, v["field"].as_str()), (422, Some(field)), "{v}");
    }

    // Two emails sent; an SMS refused for good by its provider.
    let (st, _) = s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "permanent"}))).await?;
    assert_eq!(st, 200);
    let emails = send(&s, "wh-emails", &["u1", "u2"], &["email"]).await?;
    let sms = send(&s, "wh-sms", &["u1"], &["sms"]).await?;
    s.eventually(WAIT, "two delivery.sent posts", || async { Ok((sent_rx.delivered().len() >= 2).then_some(())) })
        .await?;
    s.eventually(WAIT, "one delivery.failed post", || async { Ok((!failed_rx.delivered().is_empty()).then_some(())) })
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // anything repeated would show by now

    let posts = sent_rx.posts();
    assert_eq!(posts.len(), 2, "each event posted once: {posts:#?}");
    assert!(posts.iter().all(|p| p.kind == "delivery.sent" && p.verified_by == vec![0]), "{posts:#?}");
    assert!(sent_rx.delivered().values().all(|&n| n == 1), "{:?}", sent_rx.delivered());
    let mut users: Vec<&str> = posts.iter().map(|p| p.body["data"]["user_id"].as_str().unwrap()).collect();
    users.sort();
    assert_eq!(users, ["u1", "u2"]);
    assert!(posts.iter().all(|p| p.body["data"]["notification_id"] == emails.as_str()
        && p.body["data"]["channel"] == "email"
        && p.id.starts_with("evt_")
        && p.body["timestamp"].is_string()));
    let failed = failed_rx.posts();
    assert_eq!(failed.len(), 1, "{failed:#?}");
    assert_eq!((failed[0].kind.as_str(), failed[0].verified_by.clone()), ("delivery.failed", vec![0]));
    assert_eq!(failed[0].body["data"]["notification_id"], sms.as_str());

    // The endpoint shows its last attempt, never its secret.
    let (st, v) = s.call("GET", &format!("/v1/webhooks/{sent_ep}"), None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["last_attempt"]["outcome"], "delivered", "{v}");
    assert!(v.get("secret").is_none() && !v.to_string().contains("whsec_"), "{v}");

    // The test route.
    let (st, v) = s.call("POST", &format!("/v1/webhooks/{sent_ep}/test"), None).await?;
    assert_eq!(st, 202, "{v}");
    let test_id = v["event_id"].as_str().unwrap().to_owned();
    let test = s
        .eventually(WAIT, "the webhook.test post", || async {
            Ok(sent_rx.posts().into_iter().find(|p| p.id == test_id))
        })
        .await?;
    assert_eq!((test.kind.as_str(), test.verified_by.clone(), test.signatures), ("webhook.test", vec![0], 1));

    // Rotation: during the grace period both the old and the new secret sign.
    let (st, v) = s.call("POST", &format!("/v1/webhooks/{sent_ep}/rotate"), None).await?;
    assert_eq!(st, 200, "{v}");
    let new_secret = v["secret"].as_str().unwrap().to_owned();
    assert!(new_secret.starts_with("whsec_") && new_secret != old_secret);
    sent_rx.trust(&new_secret);
    let (_, v) = s.call("POST", &format!("/v1/webhooks/{sent_ep}/test"), None).await?;
    let rotated_id = v["event_id"].as_str().unwrap().to_owned();
    let rotated = s
        .eventually(WAIT, "the post after rotation", || async {
            Ok(sent_rx.posts().into_iter().find(|p| p.id == rotated_id))
        })
        .await?;
    assert_eq!((rotated.signatures, rotated.verified_by.clone()), (2, vec![0, 1]), "{rotated:?}");

    // Another tenant sees none of it and cannot delete it.
    let other = s.other_tenant_key();
    let (st, v) = s.call_as(&other, "GET", "/v1/webhooks", None).await?;
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(0)), "{v}");
    for (method, path) in [
        ("GET", format!("/v1/webhooks/{sent_ep}")),
        ("DELETE", format!("/v1/webhooks/{sent_ep}")),
        ("POST", format!("/v1/webhooks/{sent_ep}/rotate")),
        ("POST", format!("/v1/webhooks/{sent_ep}/test")),
    ] {
        let (st, v) = s.call_as(&other, method, &path, None).await?;
        assert_eq!(st, 404, "{method} {path}: {v}");
    }
    let (st, v) = s.call("GET", "/v1/webhooks", None).await?;
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(2)), "{v}");

    // Deleted: gone, and nothing more is posted to it.
    let (st, _) = s.call("DELETE", &format!("/v1/webhooks/{sent_ep}"), None).await?;
    assert_eq!(st, 204);
    let (st, _) = s.call("GET", &format!("/v1/webhooks/{sent_ep}"), None).await?;
    assert_eq!(st, 404);
    let before = sent_rx.posts().len();
    send(&s, "wh-after-delete", &["u1"], &["email"]).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(sent_rx.posts().len(), before, "posted to a deleted endpoint");
    Ok(())
}

/// Each endpoint is posted to at its own rate: twelve events to an endpoint limited to 1 a
/// second arrive spread out (never more than the rate and its burst in any second, however fast
/// they were produced), all of them, once each, although the queue dead-letters at the second
/// receive (a throttled post waits as a delayed copy and is not charged a receive); an endpoint
/// of the same tenant at a high rate is not held back by the slow one. The slow rate is 1 a
/// second so that its twelve posts take longer than the events take to be produced on a busy
/// machine: at 2 a second the slow endpoint could keep up with events arriving one by one, and
/// which endpoint got the last one first was a coin toss.
pub async fn each_endpoint_is_posted_to_at_its_own_rate_and_loses_nothing(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, options(vec![("TIDINGS_MAX_RECEIVES", "2".into())])).await?;
    setup(&s).await?;
    let users: Vec<String> = (1..=12).map(|i| format!("r{i}")).collect();
    for u in &users {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    let (slow, fast) = (Receiver::start().await?, Receiver::start().await?);
    endpoint_at_rate(&s, &slow, &["delivery.sent"], 1).await?;
    endpoint_at_rate(&s, &fast, &["delivery.sent"], 1000).await?;
    let ids: Vec<&str> = users.iter().map(String::as_str).collect();
    send(&s, "wh-rate", &ids, &["email"]).await?;
    let n = users.len();
    s.eventually(WAIT, "twelve posts to the slow endpoint", || async {
        Ok((slow.delivered().len() >= n).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // anything repeated would show by now

    let posts = slow.posts();
    assert_eq!(posts.len(), n, "each event posted once, none refused: {posts:#?}");
    assert!(slow.delivered().values().all(|&c| c == 1), "{:?}", slow.delivered());
    assert!(posts.iter().all(|p| p.verified_by == vec![0]), "{posts:#?}");
    // 1 a second with a burst of one token: two within a second at most; one more for the
    // jitter between the gate and the receiver's clock.
    let most_in_a_second = posts
        .iter()
        .map(|p| posts.iter().filter(|q| q.at >= p.at && q.at < p.at + Duration::from_secs(1)).count())
        .max()
        .unwrap_or(0);
    assert!(most_in_a_second <= 3, "{most_in_a_second} posts within one second at a rate of 1");
    let span = posts.iter().map(|p| p.at).max().unwrap() - posts.iter().map(|p| p.at).min().unwrap();
    assert!(span >= Duration::from_secs(8), "twelve posts at 1 a second took only {span:?}");

    let fast_posts = fast.posts();
    assert_eq!(fast.delivered().len(), n, "{fast_posts:#?}");
    let fast_last = fast_posts.iter().map(|p| p.at).max().unwrap();
    let slow_done_by_then = posts.iter().filter(|p| p.at <= fast_last).count();
    assert!(
        slow_done_by_then < n,
        "the fast endpoint waited for the slow one ({slow_done_by_then} slow posts before its last)"
    );
    let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
    let webhooks =
        v["queues"].as_array().unwrap().iter().find(|q| q["name"] == "webhooks").cloned().unwrap_or_default();
    assert_eq!(webhooks["dlq_depth"].as_u64(), Some(0), "nothing dead-lettered: {webhooks}");
    Ok(())
}

/// A campaign's end is told once: a segment campaign to eight members, an endpoint subscribed
/// to `campaign.completed` (and another to `delivery.sent` only): once the campaign reads
/// `completed`, the tick posts one signed `campaign.completed` with its counts, and further
/// ticks post nothing more; the other endpoint never gets it.
pub async fn a_campaigns_end_is_posted_once(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, options(Vec::new())).await?;
    setup(&s).await?;
    for i in 0..8 {
        let body = json!({"email": format!("c{i}@example.com"), "tags": ["vip"]});
        let (st, v) = s.call("PUT", &format!("/v1/users/c{i}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    let (done_rx, sent_rx) = (Receiver::start().await?, Receiver::start().await?);
    endpoint(&s, &done_rx, &["campaign.completed"]).await?;
    endpoint(&s, &sent_rx, &["delivery.sent"]).await?;
    let body = json!({"idempotency_key": "wh-campaign", "recipients": {"segment": "vip"}, "template_id": "shipped",
        "params": {"order_id": "sale"}, "category": "marketing", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap().to_owned();
    s.eventually(WAIT, "the campaign to complete", || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(()))
    })
    .await?;
    assert!(done_rx.posts().is_empty() || done_rx.posts().iter().all(|p| p.kind == "campaign.completed"));
    let (st, v) = s.call("POST", "/dev/schedules/tick/run", None).await?;
    assert_eq!(st, 200, "{v}");
    let post = s
        .eventually(WAIT, "the campaign.completed post", || async {
            Ok(done_rx.posts().into_iter().find(|p| p.kind == "campaign.completed"))
        })
        .await?;
    assert_eq!(post.verified_by, vec![0], "{post:?}");
    assert_eq!(post.body["data"]["notification_id"], id.as_str(), "{post:?}");
    assert_eq!(post.body["data"]["segment"], "vip", "{post:?}");
    assert_eq!(post.body["data"]["status"], "completed", "the event says how it ended: {post:?}");
    assert_eq!(post.body["data"]["counts"]["sent"].as_u64(), Some(8), "{post:?}");
    for _ in 0..2 {
        let (st, _) = s.call("POST", "/dev/schedules/tick/run", None).await?;
        assert_eq!(st, 200);
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // anything repeated would show by now
    let done = done_rx.posts();
    assert_eq!(done.len(), 1, "told once: {done:#?}");
    assert!(sent_rx.posts().iter().all(|p| p.kind == "delivery.sent"), "{:#?}", sent_rx.posts());
    // The deliveries' own events go through the webhooks queue at the endpoint's rate, apart
    // from the campaign's end: they may still be arriving when it is told.
    s.eventually(WAIT, "the eight delivery.sent posts", || async {
        Ok((sent_rx.delivered().len() >= 8).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await; // a ninth would show by now
    assert_eq!(sent_rx.delivered().len(), 8);
    Ok(())
}

/// A receiver answering 500 is retried until the queue dead-letters the event; once it is back,
/// the ops redrive delivers it, once. A receiver answering 410 is tried once and recorded failed.
pub async fn a_failing_receiver_is_retried_dead_lettered_and_redriven_once(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, options(vec![("TIDINGS_MAX_RECEIVES", "3".into())])).await?;
    setup(&s).await?;
    let (down, gone) = (Receiver::start().await?, Receiver::start().await?);
    down.answer(500);
    gone.answer(410);
    endpoint(&s, &down, &["delivery.sent"]).await?;
    let (gone_ep, _) = endpoint(&s, &gone, &["delivery.sent"]).await?;
    send(&s, "wh-down", &["u1"], &["email"]).await?;

    s.eventually(WAIT, "the webhooks DLQ to hold the event", || async {
        let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
        let q = v["queues"].as_array().unwrap().iter().find(|q| q["name"] == "webhooks").cloned();
        Ok(q.filter(|q| q["dlq_depth"].as_u64() >= Some(1)))
    })
    .await?;
    let tries = down.posts();
    assert_eq!(tries.len(), 3, "tried max_receives times: {tries:#?}");
    assert!(tries.iter().all(|p| p.id == tries[0].id && p.verified_by == vec![0]), "{tries:#?}");
    assert!(down.delivered().is_empty());

    // A 410 is not retried, and is recorded.
    let gone_posts = gone.posts();
    assert_eq!(gone_posts.len(), 1, "{gone_posts:#?}");
    let (_, v) = s.call("GET", &format!("/v1/webhooks/{gone_ep}"), None).await?;
    assert_eq!(
        (v["last_attempt"]["outcome"].as_str(), v["last_attempt"]["status_code"].as_u64()),
        (Some("failed"), Some(410)),
        "{v}"
    );

    down.answer(200);
    let (st, v) = s.ops("POST", "/v1/ops/dlq/webhooks/redrive", None).await?;
    assert_eq!(st, 200, "{v}");
    assert!(v["moved"].as_u64() >= Some(1), "{v}");
    s.eventually(WAIT, "the redriven event delivered", || async { Ok((!down.delivered().is_empty()).then_some(())) })
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delivered = down.delivered();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered.get(&tries[0].id), Some(&1), "the same webhook-id, delivered once: {delivered:?}");
    assert_eq!(gone.posts().len(), 1, "the 410 endpoint is not posted to again");
    Ok(())
}

/// In the shape that ships: the API registers the endpoint, the channel worker's send writes
/// the event beside the delivery, the relay's filtered stream mapping queues it, and the
/// channel worker's `webhooks` mapping posts it, signed, each function under its template
/// policy (the harness's IAM proxy refuses anything it does not grant). The stack allows a
/// loopback receiver through its `WebhookAllowPrivateTargets` parameter.
pub async fn a_webhook_through_the_function_binaries() -> anyhow::Result<()> {
    use crate::lambda::{Options as StackOptions, Stack};
    const SLOW: Duration = Duration::from_secs(180);
    let s = Stack::start(StackOptions {
        parameters: vec![("WebhookAllowPrivateTargets".into(), "true".into())],
        ..StackOptions::default()
    })
    .await?;
    let rx = Receiver::start().await?;
    let (st, v) = s
        .call("POST", "/v1/webhooks", Some(json!({"url": rx.url, "events": ["delivery.sent"], "rate_limit": 5})))
        .await?;
    anyhow::ensure!(st == 201, "create: {st} {v}\nrefused: {:?}", s.refused());
    rx.trust(v["secret"].as_str().unwrap());
    let endpoint_id = v["endpoint_id"].as_str().unwrap().to_owned();
    let (st, v) = s.call("PUT", "/v1/users/u1", Some(json!({"email": "alice@example.com"}))).await?;
    anyhow::ensure!(st == 200, "{v}");
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "Shipped"}}});
    let (st, v) = s.call("PUT", "/v1/templates/shipped", Some(template)).await?;
    anyhow::ensure!(st == 200, "{v}");
    let body = json!({"idempotency_key": "wh-shipped-1", "recipients": {"user_ids": ["u1"]}, "template_id": "shipped",
        "category": "transactional", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    anyhow::ensure!(st == 202, "{v}");
    let id = v["notification_id"].as_str().unwrap().to_owned();
    let post = s
        .eventually(SLOW, "the delivery.sent post", || async {
            Ok(rx.posts().into_iter().find(|p| p.kind == "delivery.sent"))
        })
        .await?;
    assert_eq!(post.verified_by, vec![0], "{post:?}");
    assert_eq!(post.body["data"]["notification_id"], id.as_str());
    let (st, v) = s.call("POST", &format!("/v1/webhooks/{endpoint_id}/test"), None).await?;
    anyhow::ensure!(st == 202, "test: {st} {v}\nrefused: {:?}", s.refused());
    let test_id = v["event_id"].as_str().unwrap().to_owned();
    s.eventually(SLOW, "the webhook.test post", || async { Ok(rx.posts().into_iter().find(|p| p.id == test_id)) })
        .await?;
    assert_eq!(rx.delivered().len(), 2, "{:?}", rx.posts());
    assert!(rx.delivered().values().all(|&n| n == 1));
    assert!(s.refused().is_empty(), "{:?}", s.refused());
    Ok(())
}
