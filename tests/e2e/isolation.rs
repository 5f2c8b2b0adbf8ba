//! Tenant isolation on every `/v1` route: tenant A makes one of everything, holding a secret
//! marker; tenant B then calls every route the OpenAPI document lists, with A's ids in the path.
//! B never sees the marker, never changes A's objects, and gets 404 for A's objects by id. The
//! operator routes (`operator_key` in the document) refuse both tenants' keys (403), and every
//! tenant route refuses an operator's key (403): operators are not tenants.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const MARK: &str = "secret-of-acme";

pub async fn no_route_shows_or_changes_another_tenants_data(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    // Tenant A: one of everything.
    let a = |m: &'static str, p: String, b: Option<Value>| {
        let s = &s;
        async move {
            let (st, v) = s.call(m, &p, b).await?;
            assert!((200..300).contains(&st), "{m} {p}: {st} {v}");
            anyhow::Ok(v)
        }
    };
    a("PUT", "/v1/users/u1".into(), Some(json!({"email": format!("{MARK}@example.com"), "tags": ["vip"]}))).await?;
    a("PUT", "/v1/users/u1/preferences".into(), Some(json!({"channels": {"sms": false}}))).await?;
    a(
        "PUT",
        "/v1/templates/t1".into(),
        Some(json!({"default_locale": "en", "locales": {"en": {"inapp_title": MARK, "inapp_body": MARK, "email_subject": MARK, "email_body": MARK}}})),
    )
    .await?;
    a(
        "PUT",
        "/v1/workflows/w1".into(),
        Some(json!({"name": MARK, "category": "transactional", "steps": [{"type": "send", "channel": "inapp", "template_id": "t1"}]})),
    )
    .await?;
    let n = a(
        "POST",
        "/v1/notifications".into(),
        Some(json!({"recipients": {"user_ids": ["u1"]}, "template_id": "t1", "category": "transactional", "channels": ["inapp", "email"]})),
    )
    .await?;
    let nid = n["notification_id"].as_str().unwrap_or_default().to_owned();
    a("PUT", "/v1/inventory/sku1".into(), Some(json!({"on_hand": 5}))).await?;
    a(
        "POST",
        "/v1/orders".into(),
        Some(json!({"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "sku1", "qty": 1}]})),
    )
    .await?;
    let sub = a("POST", "/v1/stock-subscriptions".into(), Some(json!({"user_id": "u1", "sku_id": "sku1"}))).await?;
    let sub_id = sub["subscription_id"].as_str().unwrap_or_default().to_owned();
    let inbox = s
        .eventually(Duration::from_secs(90), "A's inbox message", || async {
            let (_, v) = s.call("GET", "/v1/users/u1/inbox", None).await?;
            Ok(v["items"].as_array().and_then(|i| i.first()).and_then(|m| m["message_id"].as_str()).map(str::to_owned))
        })
        .await?;

    // Tenant B: every /v1 route of the OpenAPI document, with A's ids.
    let (_, doc) = s.call("GET", "/openapi.json", None).await?;
    let b = s.other_tenant_key();
    // User tokens (docs/site.md): B's token of a user of the same id, and A's user's own.
    let token_of = |key: String| {
        let s = &s;
        async move {
            let (st, v) = s.call_as(&key, "POST", "/v1/users/u1/inbox/token", None).await?;
            assert_eq!(st, 200, "{v}");
            anyhow::Ok(v["token"].as_str().unwrap_or_default().to_owned())
        }
    };
    let b_user = token_of(b.clone()).await?;
    let a_user = token_of(s.key.clone()).await?;
    let mut user_routes = 0;
    let mut called = 0;
    let mut operator_routes = 0;
    for (path, ops) in doc["paths"].as_object().cloned().unwrap_or_default() {
        if !path.starts_with("/v1/") || path == "/v1/ws" || path.starts_with("/v1/callbacks") {
            continue; // the live feed and provider callbacks are not keyed by API key
        }
        let concrete = path
            .replace("{user_id}", "u1")
            .replace("{template_id}", "t1")
            .replace("{workflow_id}", "w1")
            .replace("{id}", &nid)
            .replace("{sku_id}", "sku1")
            .replace("{order_id}", "o1")
            .replace("{subscription_id}", &sub_id)
            .replace("{token}", &format!("tok-{MARK}"))
            .replace("{message_id}", &inbox)
            .replace("{queue}", "email-high")
            .replace("{key_id}", "key_0");
        for method in ["get", "put", "post", "delete"] {
            if ops.get(method).is_none() {
                continue;
            }
            let body = (method == "put" || method == "post").then(|| json!({}));
            let scheme = ops[method]["security"][0].as_object().and_then(|o| o.keys().next().cloned());
            if scheme.as_deref() == Some("operator_key") {
                // An operator's route: no tenant key may use it, A's or B's.
                for key in [&s.key, &b] {
                    let (st, v) = s.call_as(key, &method.to_uppercase(), &concrete, body.clone()).await?;
                    assert_eq!(st, 403, "{method} {concrete} with a tenant key: {v}");
                    assert_eq!(v["code"], "operator_only", "{v}");
                    operator_routes += 1;
                }
                continue;
            }
            if scheme.as_deref() == Some("user_token") {
                // A user's own route: no API key opens it; B's user of the same id sees and
                // changes only its own.
                for key in [&s.key, &b, &s.ops_key] {
                    let (st, v) = s.call_as(key, &method.to_uppercase(), &concrete, body.clone()).await?;
                    assert_eq!(st, 401, "{method} {concrete} with an API key: {v}");
                }
                let (st, v) = s.call_as(&b_user, &method.to_uppercase(), &concrete, body).await?;
                assert!(st < 500, "{method} {concrete} with another tenant's user token: {st} {v}");
                assert!(!v.to_string().contains(MARK), "{method} {concrete} showed another tenant's data: {v}");
                if path.contains("{message_id}") {
                    assert_eq!(st, 404, "{method} {concrete}: A's message is not B's user's: {v}");
                }
                user_routes += 1;
                continue;
            }
            if scheme.as_deref() == Some("api_key") {
                // A user token opens no API-key route, not even its own user's.
                let (st, v) = s.call_as(&a_user, &method.to_uppercase(), &concrete, body.clone()).await?;
                assert_eq!(st, 401, "{method} {concrete} with a user token: {v}");
                // A tenant's route: an operator key is not a tenant's.
                let (st, v) = s.call_as(&s.ops_key, &method.to_uppercase(), &concrete, body.clone()).await?;
                assert_eq!(st, 403, "{method} {concrete} with an operator key: {v}");
                assert_eq!(v["code"], "operator_key", "{v}");
            }
            let (st, v) = s.call_as(&b, &method.to_uppercase(), &concrete, body).await?;
            called += 1;
            assert!(st < 500, "{method} {concrete} as another tenant: {st} {v}");
            assert!(!v.to_string().contains(MARK), "{method} {concrete} showed another tenant's data: {v}");
            if method == "get" && path.contains('{') && !path.starts_with("/v1/users/{user_id}/") {
                assert_eq!(st, 404, "GET {concrete} of another tenant's object: {v}");
            }
        }
    }
    assert!(called >= 30, "the sweep reached the routes ({called} calls)");
    assert!(user_routes >= 6, "the sweep reached the user-token routes ({user_routes} calls)");
    assert!(operator_routes >= 2 * 8, "the sweep reached the operator routes ({operator_routes} calls)");

    // A's objects are as A left them.
    let (_, u) = s.call("GET", "/v1/users/u1", None).await?;
    assert_eq!(u["email"], format!("{MARK}@example.com"));
    let (_, o) = s.call("GET", "/v1/orders/o1", None).await?;
    assert_eq!(o["status"], "PENDING", "{o}");
    let (_, n) = s.call("GET", &format!("/v1/notifications/{nid}"), None).await?;
    assert_ne!(n["status"], "cancelled", "{n}");
    let (_, subs) = s.call("GET", "/v1/users/u1/stock-subscriptions", None).await?;
    assert_eq!(subs["items"][0]["status"], "WAITING", "{subs}");
    let (_, w) = s.call("GET", "/v1/workflows/w1", None).await?;
    assert_eq!((w["name"].as_str(), w["version"].as_u64()), (Some(MARK), Some(1)), "{w}");
    let (_, t) = s.call("GET", "/v1/templates/t1", None).await?;
    assert_eq!(t["locales"]["en"]["inapp_body"], MARK);
    let (_, st) = s.call("GET", "/v1/inventory/sku1", None).await?;
    assert_eq!((st["available"].as_i64(), st["reserved"].as_i64()), (Some(4), Some(1)), "{st}");
    let (_, ib) = s.call("GET", "/v1/users/u1/inbox", None).await?;
    assert_eq!(ib["unread_count"], 1, "B could not mark A's message read: {ib}");
    Ok(())
}
