//! `POST /v1/notifications` checks what it can before it answers (docs/delivery.md, "Accept:
//! checked before it answers"): the template exists, has content for the channels named, and
//! the params give every placeholder that is not a recipient's attribute. What only fails for
//! one recipient fails that delivery, naming the placeholder, without retries.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::{Value, json};
use tidings_core::error::CoreError;
use tidings_core::notify::api;
use tidings_core::notify::model::{DeliveryStatus, NotificationRequest, NotificationStatus};
use tidings_core::people::users::{self, UserInput};
use tidings_core::{TenantId, lists, templates};
use tidings_embedded::test_world::{Recorder, TestWorld, drain};

struct Shop {
    w: TestWorld,
    t: TenantId,
    sms: Arc<Recorder>,
}

async fn shop() -> Shop {
    let sms = Arc::new(Recorder::default());
    let w = TestWorld::builder().all_queues(5).email(Arc::new(Recorder::default())).sms(sms.clone()).build();
    let t = TenantId::parse("shop").unwrap();
    for (id, locale) in [("u1", Some("zh-CN")), ("u2", None)] {
        let input = UserInput {
            email: Some(format!("{id}@example.com")),
            phone: Some("+14155550100".into()),
            locale: locale.map(str::to_owned),
            tags: vec!["vip".into()],
            ..Default::default()
        };
        users::put_user(&w.deps, &t, id, input).await.unwrap();
    }
    put(&w, &t, "order_shipped", json!({"default_locale": "en", "locales": {
        "en": {"email_subject": "Order {{ order_id }}", "email_body": "Your order {{ order_id }}", "sms": "Order {{ order_id }}"},
        // Only the Chinese SMS greets by name: a zh-CN recipient would lack it.
        "zh-CN": {"sms": "{{ name }}，订单 {{ order_id }} 已发货"}}}))
    .await;
    Shop { w, t, sms }
}

async fn put(w: &TestWorld, t: &TenantId, id: &str, body: Value) {
    templates::put_template(&w.deps, t, id, serde_json::from_value(body).unwrap()).await.unwrap();
}

fn request(v: Value) -> NotificationRequest {
    let mut base = json!({"recipients": {"user_ids": ["u1", "u2"]}, "template_id": "order_shipped",
                          "params": {"order_id": "7", "name": "Ann"}, "category": "transactional"});
    for (k, v) in v.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).unwrap()
}

/// The refusal's (code, field): `invalid_field` or `missing_param`, as the API answers them.
async fn refused(s: &Shop, v: Value) -> (&'static str, String) {
    match api::accept(&s.w.deps, &s.t, request(v)).await {
        Err(CoreError::Invalid { field, .. }) => ("invalid_field", field),
        Err(CoreError::MissingParam { field, .. }) => ("missing_param", field),
        other => panic!("accepted or another error: {other:?}"),
    }
}

#[tokio::test]
async fn a_send_that_cannot_work_is_refused_naming_the_field() {
    let s = shop().await;
    let f = |code: &'static str, field: &str| (code, field.to_owned());
    assert_eq!(refused(&s, json!({"template_id": "order_shiped"})).await, f("invalid_field", "template_id"));
    // For the channels named, and for every channel the template has when none is named.
    let no_order = json!({"params": {"name": "Ann"}, "channels": ["email"]});
    assert_eq!(refused(&s, no_order).await, f("missing_param", "params.order_id"));
    assert_eq!(refused(&s, json!({"params": {"name": "Ann"}})).await, f("missing_param", "params.order_id"));
    // A placeholder only one locale's content has is checked too.
    let no_name = json!({"params": {"order_id": "7"}, "channels": ["sms"]});
    assert_eq!(refused(&s, no_name).await, f("missing_param", "params.name"));
    // A campaign as well as a list of users.
    let campaign = json!({"recipients": {"segment": "vip"}, "params": {"order_id": "7"}, "category": "marketing"});
    assert_eq!(refused(&s, campaign).await, f("missing_param", "params.name"));
    assert_eq!(refused(&s, json!({"channels": ["sms", "push"]})).await, f("invalid_field", "channels[1]"));
    // A nested placeholder names its absent part.
    put(&s.w, &s.t, "nested", json!({"default_locale": "en", "locales": {"en": {"sms": "Total {{ order.total }}"}}}))
        .await;
    let nested = json!({"template_id": "nested", "params": {"order": {"id": "7"}}});
    assert_eq!(refused(&s, nested).await, f("missing_param", "params.order.total"));
    let page = lists::notifications(&s.w.deps, &s.t, &Default::default(), 50, None).await.unwrap();
    assert!(page.items.is_empty(), "nothing accepted: {:?}", page.items);

    // What the params give, with the recipient's attributes (`user_id`, `locale`), is accepted.
    assert!(api::accept(&s.w.deps, &s.t, request(json!({}))).await.is_ok());
    put(
        &s.w,
        &s.t,
        "hello",
        json!({"default_locale": "en", "locales": {"en": {"sms": "Hi {{ user_id }} ({{ locale }})"}}}),
    )
    .await;
    assert!(api::accept(&s.w.deps, &s.t, request(json!({"template_id": "hello", "params": {}}))).await.is_ok());
}

/// A repeat of an accepted request answers the first answer, even once its template needs more
/// than the request gives: it was accepted, and the idempotency key says it is the same.
#[tokio::test]
async fn a_repeat_answers_as_a_repeat_after_its_template_changed() {
    let s = shop().await;
    let req = json!({"idempotency_key": "k1", "params": {"order_id": "7", "name": "Ann"}});
    let first = api::accept(&s.w.deps, &s.t, request(req.clone())).await.unwrap();
    put(&s.w, &s.t, "order_shipped", json!({"default_locale": "en", "locales": {"en": {"sms": "{{ coupon }}"}}})).await;
    let again = api::accept(&s.w.deps, &s.t, request(req)).await.unwrap();
    assert_eq!((again.notification_id, again.created), (first.notification_id, false));
    // Another request with that template is refused.
    let other = json!({"idempotency_key": "k2", "params": {"order_id": "7", "name": "Ann"}});
    assert_eq!(refused(&s, other).await, ("missing_param", "params.coupon".to_owned()));
}

/// What only one recipient lacks fails that delivery alone, naming the placeholder, never tried
/// at the provider; the notification reads `completed_with_failures`.
#[tokio::test]
async fn a_recipients_missing_attribute_fails_that_delivery_naming_it() {
    let s = shop().await;
    put(
        &s.w,
        &s.t,
        "greet",
        json!({"default_locale": "en", "locales": {"en": {"sms": "Hi {{ name }} ({{ locale }})"}}}),
    )
    .await;
    let feed = s.w.feed("relay");
    let req = request(json!({"template_id": "greet", "params": {"name": "Ann"}, "channels": ["sms"]}));
    let id = api::accept(&s.w.deps, &s.t, req).await.unwrap().notification_id;
    drain(&s.w.deps, &feed).await;
    let page = api::list_deliveries(&s.w.deps, &s.t, &id, 50, None).await.unwrap().unwrap();
    let u2 = page.items.iter().find(|d| d.user_id == "u2").unwrap();
    assert_eq!(u2.status, DeliveryStatus::Failed, "{u2:?}");
    assert_eq!(u2.last_error.as_deref(), Some("template_error: missing placeholder locale"));
    assert_eq!(u2.attempts, 0, "never tried: {u2:?}");
    let calls = s.sms.sent.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "u1 (zh-CN) only: {calls:?}");
    assert_eq!(calls[0].body, "Hi Ann (zh-CN)");
    let v = api::get_notification(&s.w.deps, &s.t, &id).await.unwrap().unwrap();
    assert_eq!((v.status, v.counts.sent, v.counts.failed), (NotificationStatus::CompletedWithFailures, 1, 1), "{v:?}");
}
