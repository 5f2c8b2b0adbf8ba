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

/// Contacts are one real address each; the SMS country allow-list takes countries derived from
/// the number.
pub async fn contacts_are_real_addresses_and_sms_countries_come_from_the_number(
    backend: Backend,
) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SMS_COUNTRIES", "US".into()));
    let s = Server::start(backend, opts).await?;
    for (body, field) in [
        (json!({"email": "a@b.c,d@e.f"}), "email"),
        (json!({"email": "a@b@c.d"}), "email"),
        (json!({"email": "Alice <a@example.com>"}), "email"),
        (json!({"phone": "14155550100"}), "phone"),
        (json!({"phone": "+1415555"}), "phone"),
        (json!({"phone": "+14155550100,+14155550101"}), "phone"),
    ] {
        let (st, v) = s.call("PUT", "/v1/users/x", Some(body.clone())).await?;
        assert_eq!(st, 422, "{body}: {v}");
        assert_eq!(v["field"], field, "{body}: {v}");
    }
    let v = put(&s, "/v1/users/us", json!({"phone": "+1 (415) 555-0100", "email": "us@example.com"})).await?;
    assert_eq!(v["phone"], "+14155550100", "stored in E.164 form: {v}");
    // Jamaica shares +1 with the United States; the country list tells them apart.
    put(&s, "/v1/users/jm", json!({"phone": "+1 876 927 1234"})).await?;
    put(&s, "/v1/templates/code", json!({"default_locale": "en", "locales": {"en": {"sms": "Code {{ c }}"}}})).await?;
    let key = s.key.clone();
    let id = notify(
        &s,
        &key,
        json!({"recipients": {"user_ids": ["us", "jm"]}, "template_id": "code", "params": {"c": "1"},
               "category": "transactional", "channels": ["sms"]}),
    )
    .await?;
    let d = settled(&s, &key, &id, 2).await?;
    let of = |u: &str| d.iter().find(|x| x["user_id"] == u).cloned().unwrap_or_default();
    assert_eq!(of("us")["status"], "sent", "{d:?}");
    assert_eq!(of("jm")["reason"], "country_not_allowed", "{d:?}");
    Ok(())
}

/// Only links to the hosts the shop registered are tracked and redirected; a link to any other
/// host is left as written, and removing a host stops its redirects.
pub async fn clicks_redirect_only_to_the_shops_hosts(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SIGNING_KEYS", "k1:e2e-signing-secret".into()));
    let s = Server::start(backend, opts).await?;
    let key = s.key.clone();
    let (st, v) =
        s.call("PUT", "/v1/settings/link-hosts", Some(json!({"hosts": ["shop.example", "https://x"]}))).await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["field"], "hosts[1]", "{v}");
    let v = put(&s, "/v1/settings/link-hosts", json!({"hosts": ["Shop.Example", "*.cdn.example"]})).await?;
    assert_eq!(v["hosts"], json!(["shop.example", "*.cdn.example"]), "{v}");
    let (st, v) = s.call_as(&s.other_tenant_key(), "GET", "/v1/settings/link-hosts", None).await?;
    assert_eq!((st, v["hosts"].clone()), (200, json!([])), "another tenant's are its own");
    put(
        &s,
        "/v1/templates/order",
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Order", "email_body":
            "<a href=\"https://shop.example/o/1\">order</a> <a href=\"https://reviews.example/{{ sku }}\">review</a>"}}}),
    )
    .await?;
    put(&s, "/v1/users/u1", json!({"email": "u1@example.com"})).await?;
    let id = notify(
        &s,
        &key,
        json!({"recipients": {"user_ids": ["u1"]}, "template_id": "order", "category": "transactional",
               "params": {"sku": "s1"}, "channels": ["email"]}),
    )
    .await?;
    let sent = s.eventually(WAIT, "the email", || async { Ok(s.sends(&id).await?.into_iter().next()) }).await?;
    let body = sent["html"].as_str().unwrap_or_default().to_owned();
    assert_eq!(body.matches("/t/c/").count(), 1, "{body}");
    assert!(body.contains("href=\"https://reviews.example/s1\""), "left as written: {body}");
    let click = body.split("/t/c/").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let res = no_redirect.get(format!("{}/t/c/{click}", s.base)).send().await?;
    assert_eq!(res.status().as_u16(), 302);
    assert_eq!(res.headers()["location"], "https://shop.example/o/1");
    put(&s, "/v1/settings/link-hosts", json!({"hosts": ["*.cdn.example"]})).await?;
    let res = no_redirect.get(format!("{}/t/c/{click}", s.base)).send().await?;
    assert_eq!(res.status().as_u16(), 404);
    let v: Value = res.json().await?;
    assert_eq!(v["code"], "link_host_not_allowed", "{v}");
    Ok(())
}
