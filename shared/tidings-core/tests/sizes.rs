//! Sizes at the services' limits (`tidings_core::sizes`), against the embedded store, which
//! holds SQS's and DynamoDB's limits as the AWS backend does: a request too large to store is
//! refused naming its field with nothing written; a page of large emails is delivered in full;
//! an email too large for any queue message fails its delivery for good instead of leaving its
//! page retried until the DLQ.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tidings_core::messages::ALL_QUEUES;
use tidings_core::notify::api;
use tidings_core::notify::model::{Delivery, DeliveryStatus, NotificationRequest, NotificationStatus};
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::{ChangeFeed, Channel};
use tidings_core::sizes::{MAX_ITEM_BYTES, MAX_MESSAGE_BYTES};
use tidings_core::{CoreConfig, CoreError, Deps, Providers, TenantId, keys, templates};
use tidings_embedded::EmbeddedChangeFeed;

mod support;
use support::{Recorder, TestWorld};

struct World {
    deps: Deps,
    feed: EmbeddedChangeFeed,
    email: Arc<Recorder>,
    t: TenantId,
}

async fn world() -> World {
    let email = Arc::new(Recorder::default());
    let other = Arc::new(Recorder::default());
    let providers = Providers { email: email.clone(), sms: other.clone(), push: other };
    let config = CoreConfig { retry_base: Duration::from_millis(10), ..CoreConfig::default() };
    let tw = TestWorld::builder().system_clock().all_queues(3).providers(providers).config(config).build();
    let t = TenantId::parse("shop-a").unwrap();
    World { feed: tw.feed("relay"), deps: tw.deps, email, t }
}

async fn template(w: &World, id: &str, email_body: &str) {
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "News {{ n }}", "email_body": email_body}}}))
    .unwrap();
    templates::put_template(&w.deps, &w.t, id, input).await.unwrap();
}

async fn users(w: &World, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("u{i}");
        let input = UserInput { email: Some(format!("{id}@example.com")), ..UserInput::default() };
        users::put_user(&w.deps, &w.t, &id, input).await.unwrap();
        ids.push(id);
    }
    ids
}

fn request(key: &str, template_id: &str, user_ids: &[String], params: serde_json::Value) -> NotificationRequest {
    serde_json::from_value(json!({"idempotency_key": key, "recipients": {"user_ids": user_ids},
        "template_id": template_id, "params": params, "category": "transactional", "channels": ["email"]}))
    .unwrap()
}

/// The relay and every queue, batch by batch, until nothing moves.
async fn drain(w: &World) {
    support::drain(&w.deps, &w.feed, support::Handling::Batch).await;
}

async fn delivery(w: &World, id: &str, user_id: &str) -> Delivery {
    w.deps.table.get(&keys::delivery(&w.t, id, user_id, Channel::Email)).await.unwrap().unwrap().parse().unwrap()
}

/// Params of 500 KB: the notification cannot be stored (DynamoDB's 400 KB). 422 naming
/// `params`, and nothing is written: the same idempotency key with small params is then a new
/// notification, not a repeat.
#[tokio::test]
async fn params_too_large_to_store_are_refused_naming_the_field() {
    let w = world().await;
    template(&w, "news", "<p>{{ n }}</p>").await;
    let ids = users(&w, 1).await;
    let setup = w.feed.next_batch(1000).await.unwrap();
    w.feed.commit(&setup).await.unwrap();
    let big: serde_json::Map<String, serde_json::Value> =
        (0..20).map(|i| (format!("p{i}"), json!("x".repeat(25_000)))).collect();
    let e = api::accept(&w.deps, &w.t, request("k1", "news", &ids, json!(big))).await.unwrap_err();
    match &e {
        CoreError::Invalid { field, detail } => {
            assert_eq!(field, "params");
            assert!(detail.contains("too large") && detail.contains(&MAX_ITEM_BYTES.to_string()), "{detail}");
        }
        other => panic!("expected 422 naming params, got {other:?}"),
    }
    let written = w.feed.next_batch(1000).await.unwrap();
    assert!(
        written.is_empty(),
        "nothing of the refused request is written: {:?}",
        written.iter().map(|r| &r.key).collect::<Vec<_>>()
    );
    let ok = api::accept(&w.deps, &w.t, request("k1", "news", &ids, json!({"n": 1}))).await.unwrap();
    assert!(ok.created, "the idempotency key was not taken by the refused request");
    // Just under the limit is accepted.
    let mut fits: serde_json::Map<String, serde_json::Value> =
        (0..15).map(|i| (format!("p{i}"), json!("x".repeat(25_000)))).collect();
    fits.insert("n".into(), json!(1)); // the template's placeholder, which accept checks
    assert!(api::accept(&w.deps, &w.t, request("k2", "news", &ids, json!(fits))).await.is_ok());
}

/// Ten recipients of a 110 KB email each: 1.1 MB of channel tasks from one page, more than one
/// SendMessageBatch carries (256 KiB; and moto's 1 MiB). Every one is sent, whole.
#[tokio::test]
async fn a_page_of_large_emails_is_delivered_in_full() {
    let w = world().await;
    let html = format!("<html><body>{}<p>{{{{ n }}}}</p></body></html>", "<p>Back in stock today.</p>".repeat(4_000));
    assert!(html.len() > 100_000);
    template(&w, "big", &html).await;
    let ids = users(&w, 10).await;
    let id = api::accept(&w.deps, &w.t, request("big-1", "big", &ids, json!({"n": 7}))).await.unwrap().notification_id;
    drain(&w).await;
    for u in &ids {
        let d = delivery(&w, &id, u).await;
        assert_eq!(d.status, DeliveryStatus::Sent, "{u}: {:?}", d.last_error);
    }
    let sent = w.email.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 10, "each email once");
    // Whole: the HTML part as written, and the text part made from it.
    assert!(
        sent.iter().all(|m| m.html.as_ref().is_some_and(|h| h.len() > 100_000 && h.contains("<p>7</p>"))),
        "sent whole"
    );
    assert!(sent.iter().all(|m| m.body.len() > 80_000 && m.body.ends_with("\n\n7")), "with its text part");
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_eq!(view.status, NotificationStatus::Completed);
    assert_eq!(view.counts.sent, 10);
}

/// An email that renders within the template's limits but is larger than any queue message as
/// a task (its 131,020 quotes double when the task is JSON): its delivery fails at once with
/// `too_large`, for good, and the notification ends `failed` (nothing of it was sent); another recipient's smaller email in
/// the same page goes out. Nothing is left `pending` or dead-lettered.
#[tokio::test]
async fn an_email_too_large_for_a_queue_message_fails_for_good() {
    let w = world().await;
    let quotes = "\"".repeat(131_020);
    template(&w, "huge", &format!("{{% if n == 1 %}}{quotes}{{% else %}}small{{% endif %}}{{{{ n }}}}")).await;
    let ids = users(&w, 1).await;
    let id =
        api::accept(&w.deps, &w.t, request("huge-1", "huge", &ids, json!({"n": 1}))).await.unwrap().notification_id;
    let small = api::accept(&w.deps, &w.t, request("small-1", "huge", &ids, json!({"n": 2}))).await.unwrap();
    drain(&w).await;
    let d = delivery(&w, &id, "u0").await;
    assert_eq!(d.status, DeliveryStatus::Failed);
    let error = d.last_error.unwrap_or_default();
    assert!(error.starts_with("too_large:") && error.contains(&MAX_MESSAGE_BYTES.to_string()), "{error}");
    assert_eq!(d.attempts, 0, "never tried: it could not be queued");
    let view = api::get_notification(&w.deps, &w.t, &id).await.unwrap().unwrap();
    assert_eq!((view.status, view.counts.failed, view.counts.queued), (NotificationStatus::Failed, 1, 0));
    assert_eq!(delivery(&w, &small.notification_id, "u0").await.status, DeliveryStatus::Sent);
    for q in ALL_QUEUES.iter().filter(|q| tidings_core::messages::has_dlq(q)) {
        assert_eq!(w.deps.queues.stats(q).await.unwrap().dlq_depth, 0, "{q}: nothing dead-lettered");
    }
}

/// What the API stores from other requests is bounded by their own validation well inside an
/// item: the largest user record validation admits (50 tags of 128 characters, the longest
/// email) and the largest template (`templates::MAX_TEMPLATE_BYTES`) fit, so they can never
/// meet the store's refusal.
#[tokio::test]
async fn other_records_are_bounded_below_the_item_limit() {
    let w = world().await;
    let tags: Vec<String> = (0..50).map(|i| format!("{i:03}{}", "t".repeat(125))).collect();
    let local = "a".repeat(64);
    let domain = format!("{}.{}.{}.example.com", "b".repeat(60), "c".repeat(60), "d".repeat(50));
    let input = UserInput { email: Some(format!("{local}@{domain}")), tags, ..UserInput::default() };
    users::put_user(&w.deps, &w.t, &"u".repeat(128), input).await.unwrap();
    let user = w.deps.table.get(&keys::user(&w.t, &"u".repeat(128))).await.unwrap().unwrap();
    let size = tidings_core::sizes::item_size(&user.key, &user.attrs);
    assert!(size < MAX_ITEM_BYTES / 10, "the largest user is {size} bytes");
    // A template at its source limit is stored (its size left to its placeholders: the queue
    // message takes both parts of an email, and 128 KB of text is as much again as HTML).
    let body = format!("{{% if n %}}{}{{% endif %}}", "b".repeat(128 * 1024 - 21));
    template(&w, "largest", &body).await;
    let item = w.deps.table.get(&keys::template(&w.t, "largest")).await.unwrap().unwrap();
    assert!(tidings_core::sizes::item_size(&item.key, &item.attrs) < MAX_ITEM_BYTES);
}
