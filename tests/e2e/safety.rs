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
