//! The rest of the resource API through `tidings serve`: lists paged by cursor (each item
//! once, filters, another tenant's key sees none of them), erasing a user (gone, twice the
//! same, a later notification delivers nothing), and a template preview.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Server};

const WAIT: Duration = Duration::from_secs(60);

/// Every page of a list route, `limit` at a time: the items, in order.
async fn pages(s: &Server, key: &str, path: &str, limit: usize) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    let sep = if path.contains('?') { '&' } else { '?' };
    for _ in 0..200 {
        let mut url = format!("{path}{sep}limit={limit}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={}", urlencoding(c)));
        }
        let (st, v) = s.call_as(key, "GET", &url, None).await?;
        assert_eq!(st, 200, "{url}: {v}");
        let items = v["items"].as_array().cloned().unwrap_or_default();
        assert!(items.len() <= limit, "{url}: {v}");
        out.extend(items);
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(out),
        }
    }
    anyhow::bail!("{path} never ended")
}

fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn ids(items: &[Value], field: &str) -> Vec<String> {
    items.iter().map(|i| i[field].as_str().unwrap_or_default().to_owned()).collect()
}

pub async fn lists_erase_and_preview(backend: Backend) -> anyhow::Result<()> {
    // On AWS, devices need the SNS platform applications the push tests make.
    let s = Server::start(backend, crate::platform::push_options(backend).await?).await?;
    let other = s.other_tenant_key();
    let template = json!({"default_locale": "en", "locales": {
        "en": {"email_subject": "Order {{ order_id }}", "email_body": "Order {{ order_id }} shipped",
               "inapp_title": "Order {{ order_id }}", "inapp_body": "Shipped"},
        "zh-CN": {"email_subject": "订单 {{ order_id }}", "email_body": "订单 {{ order_id }} 已发货"}}});
    for id in ["t-b", "t-a", "t-c"] {
        let (st, v) = s.call("PUT", &format!("/v1/templates/{id}"), Some(template.clone())).await?;
        assert_eq!(st, 200, "{v}");
    }
    for i in 0..5 {
        let body = json!({"email": format!("u{i}@example.com"), "tags": ["vip"]});
        let (st, v) = s.call("PUT", &format!("/v1/users/u{i}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    for i in 0..3 {
        let body = json!({"user_id": "u1", "platform": "android", "token": format!("tok-{i}")});
        let (st, v) = s.call("POST", "/v1/devices", Some(body)).await?;
        assert_eq!(st, 201, "{v}");
    }
    let (st, _) = s.call_as(&other, "PUT", "/v1/users/g1", Some(json!({"email": "g@example.com"}))).await?;
    assert_eq!(st, 200);

    // Lists, two at a time: each item once, in order; the other tenant sees only its own.
    let users = pages(&s, &s.key, "/v1/users", 2).await?;
    assert_eq!(ids(&users, "user_id"), ["u0", "u1", "u2", "u3", "u4"]);
    assert_eq!(ids(&pages(&s, &other, "/v1/users", 2).await?, "user_id"), ["g1"]);
    let templates = pages(&s, &s.key, "/v1/templates", 2).await?;
    assert_eq!(ids(&templates, "template_id"), ["t-a", "t-b", "t-c"]);
    assert_eq!(templates[0]["locales"], json!(["en", "zh-CN"]));
    assert!(pages(&s, &other, "/v1/templates", 2).await?.is_empty());
    let devices = pages(&s, &s.key, "/v1/users/u1/devices", 2).await?;
    let mut tokens = ids(&devices, "token");
    tokens.sort();
    assert_eq!(tokens, ["tok-0", "tok-1", "tok-2"]);
    assert!(pages(&s, &other, "/v1/users/u1/devices", 2).await?.is_empty());

    let mut sent = Vec::new();
    for i in 0..4 {
        let mut body = json!({"recipients": {"user_ids": ["u2"]}, "template_id": "t-a", "params": {"order_id": i.to_string()},
            "category": "transactional", "channels": ["email"]});
        if i == 1 {
            // Scheduled for tomorrow, so that its cancel finds it unsent (a sent one is 409).
            body["send_at"] = json!((chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339());
        }
        let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
        assert_eq!(st, 202, "{v}");
        sent.push(v["notification_id"].as_str().unwrap().to_owned());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (st, v) = s.call("POST", &format!("/v1/notifications/{}/cancel", sent[1]), None).await?;
    assert_eq!(st, 200, "{v}");
    let mut newest_first = sent.clone();
    newest_first.reverse();
    let listed = pages(&s, &s.key, "/v1/notifications", 3).await?;
    assert_eq!(ids(&listed, "notification_id"), newest_first);
    let cancelled = pages(&s, &s.key, "/v1/notifications?status=cancelled", 1).await?;
    assert_eq!(ids(&cancelled, "notification_id"), [sent[1].clone()]);
    let future = pages(&s, &s.key, "/v1/notifications?since=2999-01-01T00:00:00Z", 10).await?;
    assert!(future.is_empty());
    let (st, v) =
        s.call("GET", "/v1/notifications?since=2026-12-02T00:00:00Z&until=2026-12-01T00:00:00Z", None).await?;
    // An until before the since is an empty window, not an error (no schema states an order
    // between two query parameters).
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(0)), "{v}");
    let (st, v) = s.call("GET", "/v1/notifications?status=done", None).await?;
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.call("GET", "/v1/users?limit=501", None).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("limit")), "{v}");
    assert!(pages(&s, &other, "/v1/notifications", 10).await?.is_empty());

    // Preview: rendered as a send renders it, 422 naming the field, 404 for none.
    let (st, v) =
        s.call("POST", "/v1/templates/t-a/preview", Some(json!({"params": {"order_id": "9"}, "locale": "zh"}))).await?;
    assert_eq!(st, 200, "{v}");
    let email = v["parts"].as_array().unwrap().iter().find(|p| p["channel"] == "email").cloned().unwrap();
    assert_eq!((email["locale"].as_str(), email["subject"].as_str()), (Some("zh-CN"), Some("订单 9")), "{v}");
    let inapp = v["parts"].as_array().unwrap().iter().find(|p| p["channel"] == "inapp").cloned().unwrap();
    assert_eq!(inapp["locale"], "en", "zh-CN has no in-app content: the default's, as a send: {v}");
    let (st, v) = s.call("POST", "/v1/templates/t-a/preview", Some(json!({"params": {}}))).await?;
    assert_eq!(
        (st, v["code"].as_str(), v["field"].as_str()),
        (422, Some("missing_param"), Some("params.order_id")),
        "{v}"
    );
    let (st, v) =
        s.call("POST", "/v1/templates/t-a/preview", Some(json!({"params": {"order_id": "1"}, "locale": "fr"}))).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("locale")), "{v}");
    let (st, _) = s.call("POST", "/v1/templates/none/preview", Some(json!({}))).await?;
    assert_eq!(st, 404);
    let (st, _) = s.call_as(&other, "POST", "/v1/templates/t-a/preview", Some(json!({}))).await?;
    assert_eq!(st, 404, "another tenant's template");

    // Erase u1: gone from everywhere it was, 204 twice; a later notification delivers nothing.
    let (st, _) = s.call("PUT", "/v1/users/u1/preferences", Some(json!({"channels": {"sms": false}}))).await?;
    assert_eq!(st, 200);
    let (st, v) = s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": "u1", "sku_id": "sku-1"}))).await?;
    assert_eq!(st, 201, "{v}");
    for _ in 0..2 {
        let (st, v) = s.call("DELETE", "/v1/users/u1", None).await?;
        assert_eq!((st, &v), (204, &Value::Null));
        let (st, _) = s.call("GET", "/v1/users/u1", None).await?;
        assert_eq!(st, 404);
        // What was the user's reads as absent too, not as an empty default (docs/people.md).
        for owned in ["/v1/users/u1/devices", "/v1/users/u1/stock-subscriptions", "/v1/users/u1/preferences"] {
            let (st, v) = s.call("GET", owned, None).await?;
            assert_eq!(st, 404, "{owned} of an erased user: {v}");
        }
        assert_eq!(ids(&pages(&s, &s.key, "/v1/users", 10).await?, "user_id"), ["u0", "u2", "u3", "u4"]);
    }
    let (st, _) = s.call_as(&other, "GET", "/v1/users/g1", None).await?;
    assert_eq!(st, 200, "another tenant's users are untouched");
    let body = json!({"recipients": {"user_ids": ["u1"]}, "template_id": "t-a", "params": {"order_id": "5"},
        "category": "transactional", "channels": ["email", "inapp"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap().to_owned();
    let deliveries = s
        .eventually(WAIT, "the erased user's deliveries", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            Ok((items.len() == 2).then_some(items))
        })
        .await?;
    for d in &deliveries {
        assert_eq!((d["status"].as_str(), d["reason"].as_str()), (Some("suppressed"), Some("erased")), "{d}");
    }
    assert!(s.sends(&id).await?.is_empty(), "nothing sent");
    let (st, inbox) = s.call("GET", "/v1/users/u1/inbox", None).await?;
    assert_eq!(st, 404, "no inbox comes back: {inbox}");
    Ok(())
}
