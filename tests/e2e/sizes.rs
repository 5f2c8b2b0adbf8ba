//! Sizes at SQS's and DynamoDB's limits, through the HTTP API on both backends (the embedded
//! one holds the same limits, `tidings_core::sizes`): a page of large emails is delivered in
//! full, and a request too large to store answers 422 naming its field with nothing stored.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(90);

/// Ten recipients of a 110 KB HTML email: 1.1 MB of channel tasks from one page, more than one
/// `SendMessageBatch` carries (256 KiB; 1 MiB on moto, so smaller emails would not show it
/// there). Each email is sent once, whole, and the notification completes.
pub async fn a_page_of_large_emails_is_delivered_in_full(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let html = format!(
        "<html><body>{}<p>Order {{{{ order_id }}}}</p></body></html>",
        "<p>Your order is on its way.</p>".repeat(3_500)
    );
    assert!(html.len() > 100_000 && html.len() < 128 * 1024);
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Order {{ order_id }}", "email_body": html}}});
    let (st, v) = s.call("PUT", "/v1/templates/large", Some(template)).await?;
    assert_eq!(st, 200, "{v}");
    let users: Vec<String> = (0..10).map(|i| format!("big{i}")).collect();
    for u in &users {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    let body = json!({"idempotency_key": "large-1", "recipients": {"user_ids": users}, "template_id": "large",
        "params": {"order_id": "A-77"}, "category": "transactional", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap_or_default().to_owned();
    let view = s
        .eventually(WAIT, "ten large emails sent", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["counts"]["sent"].as_u64().unwrap_or(0) + v["counts"]["delivered"].as_u64().unwrap_or(0) >= 10)
                .then_some(v))
        })
        .await?;
    let (_, d) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
    let deliveries = d["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(deliveries.len(), 10, "{d}");
    assert!(deliveries.iter().all(|d| d["status"] == "sent" && d["attempts"] == 1), "each sent at once: {d}");
    assert_eq!(view["counts"]["queued"], 0, "{view}");
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 10, "each email once");
    for send in &sends {
        let html = send["html"].as_str().unwrap_or_default();
        assert!(html.len() > 100_000 && html.contains("Order A-77"), "sent whole ({} bytes)", html.len());
        assert!(send["body"].as_str().unwrap_or_default().ends_with("Order A-77"), "with its text part");
    }
    let (_, q) = s.ops("GET", "/v1/ops/queues", None).await?;
    let dead: u64 = q.as_array().into_iter().flatten().map(|q| q["dlq_depth"].as_u64().unwrap_or(0)).sum();
    assert_eq!(dead, 0, "nothing dead-lettered: {q}");
    s.eventually(WAIT, "the notification completed", || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(()))
    })
    .await?;
    Ok(())
}

fn problem_field(v: &Value) -> &str {
    v["field"].as_str().unwrap_or_default()
}

/// Params of 500 KB cannot be stored (DynamoDB's 400 KB item): 422 naming `params`, and the
/// idempotency key stays free (the same key with small params is then accepted, and a repeat of
/// that is the same notification). An email body or an in-app body over its template limit is
/// 422 naming `locales.en.email_body` / `locales.en.inapp_body`, and no template is stored.
pub async fn oversized_params_and_bodies_answer_422_naming_the_field(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let template =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "Hi {{ a }}"}}});
    let (st, v) = s.call("PUT", "/v1/templates/hi", Some(template)).await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.call("PUT", "/v1/users/p1", Some(json!({"email": "p1@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");
    let params: serde_json::Map<String, Value> =
        (0..20).map(|i| (format!("p{i}"), json!("x".repeat(25_000)))).collect();
    let request = |params: Value| {
        json!({"idempotency_key": "big-params", "recipients": {"user_ids": ["p1"]}, "template_id": "hi",
            "params": params, "category": "transactional", "channels": ["email"]})
    };
    let (st, v) = s.call("POST", "/v1/notifications", Some(request(Value::Object(params)))).await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!(problem_field(&v), "params", "{v}");
    assert!(v["detail"].as_str().unwrap_or_default().contains("too large"), "{v}");
    let (st, first) = s.call("POST", "/v1/notifications", Some(request(json!({"a": "small"})))).await?;
    assert_eq!(st, 202, "the key was not taken by the refused request: {first}");
    let (st, again) = s.call("POST", "/v1/notifications", Some(request(json!({"a": "small"})))).await?;
    assert_eq!((st, &again["notification_id"]), (202, &first["notification_id"]), "{again}");

    for (field, content) in [("email_body", "b".repeat(200 * 1024)), ("inapp_body", "i".repeat(20 * 1024))] {
        let body = json!({"default_locale": "en", "locales": {"en": {"email_subject": "S", field: content}}});
        let (st, v) = s.call("PUT", "/v1/templates/too-long", Some(body)).await?;
        assert_eq!(st, 422, "{v}");
        assert_eq!(problem_field(&v), format!("locales.en.{field}"), "{v}");
    }
    let (st, v) = s.call("GET", "/v1/templates/too-long", None).await?;
    assert_eq!(st, 404, "nothing stored: {v}");
    Ok(())
}

/// The same page of ten 110 KB emails through the function binaries (`crate::lambda`): the
/// orchestrator's channel tasks go out in as many `SendMessageBatch` calls as their bytes need,
/// the channel worker sends each through SES (moto) once, whole, and the notification completes.
pub async fn a_page_of_large_emails_through_the_function_binaries() -> anyhow::Result<()> {
    use crate::lambda::{Options as StackOptions, Stack};
    let s = Stack::start(StackOptions::default()).await?;
    let html = format!(
        "<html><body>{}<p>Order {{{{ order_id }}}}</p></body></html>",
        "<p>Your order is on its way.</p>".repeat(3_500)
    );
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Order {{ order_id }}", "email_body": html}}});
    let (st, v) = s.call("PUT", "/v1/templates/large", Some(template)).await?;
    anyhow::ensure!(st == 200, "template: {st} {v}");
    let users: Vec<String> = (0..10).map(|i| format!("big{i}")).collect();
    for u in &users {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        anyhow::ensure!(st == 200, "user: {st} {v}");
    }
    let body = json!({"idempotency_key": "large-1", "recipients": {"user_ids": users}, "template_id": "large",
        "params": {"order_id": "A-77"}, "category": "transactional", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    anyhow::ensure!(st == 202, "notification: {st} {v}\nrefused: {:?}", s.refused());
    let id = v["notification_id"].as_str().unwrap_or_default().to_owned();
    let view = s
        .eventually(Duration::from_secs(180), "the page of large emails completed", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == "completed").then_some(v))
        })
        .await?;
    assert_eq!(view["counts"]["sent"], 10, "{view}");
    let mails: Vec<_> = s.sends().into_iter().filter(|x| x.channel == "email").collect();
    assert_eq!(mails.len(), 10, "each email once through SES");
    for m in &mails {
        assert!(m.body.len() > 100_000 && m.body.contains("Order A-77"), "sent whole ({} bytes)", m.body.len());
    }
    assert!(s.refused().is_empty(), "no call outside the template's policies: {:?}", s.refused());
    Ok(())
}
