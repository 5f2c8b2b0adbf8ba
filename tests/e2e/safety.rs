//! What one tenant or one user cannot break (issue 14): transactional messages reach users who
//! left the marketing, templates cannot exhaust the workers, contacts are real addresses, and a
//! tracked link goes only where the shop said.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

// Generous: the AWS backend shares one emulator with the other tests; a pass returns at once.
const WAIT: Duration = Duration::from_secs(90);

async fn put(s: &Server, path: &str, body: Value) -> anyhow::Result<Value> {
    let (st, v) = s.call("PUT", path, Some(body)).await?;
    assert_eq!(st, 200, "PUT {path}: {v}");
    Ok(v)
}

async fn notify(s: &Server, key: &str, body: Value) -> anyhow::Result<String> {
    let (st, v) = s.call_as(key, "POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap().to_owned())
}

/// The notification's `n` deliveries once none is pending any more.
async fn settled(s: &Server, key: &str, id: &str, n: usize) -> anyhow::Result<Vec<Value>> {
    s.eventually(WAIT, &format!("the deliveries of {id} to settle"), || async {
        let (st, v) = s.call_as(key, "GET", &format!("/v1/notifications/{id}/deliveries?limit=500"), None).await?;
        assert_eq!(st, 200, "{v}");
        let d = v["items"].as_array().cloned().unwrap_or_default();
        let done = d.len() >= n && d.iter().all(|d| !matches!(d["status"].as_str(), Some("pending" | "sending")));
        Ok(done.then_some(d))
    })
    .await
}

fn find<'a>(d: &'a [Value], channel: &str) -> &'a Value {
    d.iter().find(|d| d["channel"] == channel).unwrap_or_else(|| panic!("no {channel} delivery in {d:?}"))
}

/// A user who unsubscribed from everything marketing asks for a password reset and gets it;
/// the channel they turned off stays off, and the transactional category cannot be turned off.
pub async fn an_unsubscribed_user_still_gets_the_password_reset(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let key = s.key.clone();
    put(
        &s,
        "/v1/templates/reset",
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Reset", "email_body": "Code {{ code }}",
            "sms": "Code {{ code }}", "inapp_body": "Code {{ code }}"}}}),
    )
    .await?;
    put(&s, "/v1/users/gone", json!({"email": "gone@example.com", "phone": "+14155550100"})).await?;
    put(
        &s,
        "/v1/users/gone/preferences",
        json!({"unsubscribe_all": true, "categories": {"marketing": false}, "channels": {"inapp": false}}),
    )
    .await?;
    let (st, v) =
        s.call("PUT", "/v1/users/gone/preferences", Some(json!({"categories": {"transactional": false}}))).await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["field"], "categories.transactional", "{v}");

    let reset = |k: &str| {
        json!({"idempotency_key": k, "recipients": {"user_ids": ["gone"]}, "template_id": "reset",
               "params": {"code": "913377"}, "category": "transactional", "channels": ["email", "sms", "inapp"]})
    };
    let id = notify(&s, &key, reset("reset-1")).await?;
    let d = settled(&s, &key, &id, 3).await?;
    assert_eq!(find(&d, "email")["status"], "sent", "{d:?}");
    assert_eq!(find(&d, "sms")["status"], "sent", "{d:?}");
    assert_eq!(find(&d, "inapp")["status"], "suppressed", "{d:?}");
    assert_eq!(find(&d, "inapp")["reason"], "channel_off", "{d:?}");
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 2, "{sends:?}");

    let mut promo = reset("promo-1");
    promo["category"] = json!("marketing");
    let id = notify(&s, &key, promo).await?;
    let d = settled(&s, &key, &id, 3).await?;
    assert!(d.iter().all(|d| d["reason"] == "unsubscribed"), "{d:?}");
    Ok(())
}

/// The hostile template and a macro calling itself are refused at save, naming the field; a
/// template whose output breaks its limit only with the notification's variables fails that
/// delivery with `template_error`, never tried at the provider, and another tenant's message
/// sent at the same time is delivered.
pub async fn a_hostile_template_is_refused_and_cannot_harm_another_tenant(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let (acme, globex) = (s.key.clone(), s.other_tenant_key());
    for (field, text, says) in [
        ("email_body", r#"{% for i in range(100000) %}{{ "x" * 100000000 }}{% endfor %}"#, "`*`"),
        ("sms", "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}", "macro"),
        ("inapp_body", "{% for i in range(100000) %}x{% endfor %}", "range"),
    ] {
        let body = json!({"default_locale": "en", "locales": {"en": {field: text}}});
        let (st, v) = s.call("PUT", "/v1/templates/evil", Some(body)).await?;
        assert_eq!(st, 422, "{v}");
        assert_eq!(v["field"], format!("locales.en.{field}"), "{v}");
        assert!(v["detail"].as_str().unwrap_or_default().contains(says), "{v}");
    }
    put(
        &s,
        "/v1/templates/evil",
        json!({"default_locale": "en", "locales": {"en": {
        "sms": "{% for i in range(1000) %}{{ p }}{% endfor %}"}}}),
    )
    .await?;
    let (st, v) = s
        .call_as(
            &globex,
            "PUT",
            "/v1/templates/otp",
            Some(json!({"default_locale": "en", "locales": {"en": {"sms": "Code {{ code }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    for key in [&acme, &globex] {
        let (st, v) = s.call_as(key, "PUT", "/v1/users/u1", Some(json!({"phone": "+14155550100"}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    let sms = |k: &str, template: &str, params: Value| {
        json!({"idempotency_key": k, "recipients": {"user_ids": ["u1"]}, "template_id": template, "params": params,
               "category": "transactional", "channels": ["sms"]})
    };
    let bad = notify(&s, &acme, sms("evil-1", "evil", json!({"p": "x".repeat(1000)}))).await?;
    let good = notify(&s, &globex, sms("otp-1", "otp", json!({"code": "551234"}))).await?;
    let d = settled(&s, &acme, &bad, 1).await?;
    assert_eq!(d[0]["status"], "failed", "{d:?}");
    assert!(d[0]["last_error"].as_str().unwrap_or_default().starts_with("template_error: limit"), "{d:?}");
    assert_eq!(d[0]["attempts"], 0, "{d:?}");
    let d = settled(&s, &globex, &good, 1).await?;
    assert_eq!(d[0]["status"], "sent", "{d:?}");
    let (_, sent) = s.call_as(&globex, "GET", "/dev/deliveries", None).await?;
    let sent = sent.as_array().cloned().unwrap_or_default();
    assert!(sent.iter().any(|x| x["notification_id"] == good.as_str() && x["body"] == "Code 551234"), "{sent:?}");
    assert!(s.sends(&bad).await?.is_empty());
    Ok(())
}
