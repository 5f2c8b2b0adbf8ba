//! Every operation that takes a JSON body has an example in the served document, and the server
//! takes it: each is sent as written, after the fixtures the examples name (the template
//! `order_shipped`, the user `u1`, stock of `sku-1001`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tidings_core::TenantId;
use tidings_core::dev::{DevProvider, DevProviders};
use tidings_core::ops::tenants::{self, KeySpec, Role};
use tidings_core::ports::{Channel, ManualClock};
use tower::ServiceExt;

use crate::state::DevControl;

/// `tidings serve --manual-clock`: the dev routes, `POST /dev/clock/advance` among them.
struct ManualDev(DevProviders, ManualClock);

#[async_trait::async_trait]
impl DevControl for ManualDev {
    fn providers(&self) -> &DevProviders {
        &self.0
    }
    fn manual_clock(&self) -> Option<&ManualClock> {
        Some(&self.1)
    }
    async fn run_schedule(&self, _: &str) -> Result<Option<Value>, String> {
        Ok(None)
    }
}

async fn app() -> axum::Router {
    let mut deps = crate::test_support::memory_deps();
    // A signing key: the user-token routes' examples are sent with a user token.
    let signer = tidings_core::signing::Signer::parse("k1:examples-signing-secret");
    deps.config = Arc::new(tidings_core::deps::CoreConfig { signer, ..(*deps.config).clone() });
    tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
    tenants::register(&deps, "key-op", KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
    let provider = |c: Channel| {
        let inner = deps.providers.for_channel(c).unwrap().clone();
        Arc::new(DevProvider::new(c, inner, deps.table.clone(), deps.clock.clone()))
    };
    let providers =
        DevProviders { email: provider(Channel::Email), sms: provider(Channel::Sms), push: provider(Channel::Push) };
    let dev = ManualDev(providers, ManualClock::new(chrono::Utc::now()));
    crate::app(crate::AppState::with_dev(deps, Arc::new(dev)))
}

async fn send(app: &axum::Router, method: &str, uri: &str, key: &str, body: &Value) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The example of an operation's JSON body: the media type's, else its schema's.
fn example_of(doc: &Value, op: &Value) -> Option<Value> {
    let media = op.pointer("/requestBody/content/application~1json")?;
    if let Some(e) = media.get("example") {
        return Some(e.clone());
    }
    let schema = &media["schema"];
    let reference = schema["$ref"].as_str().or_else(|| {
        // `null | Ref` of an optional body.
        schema["oneOf"].as_array()?.iter().find_map(|s| s["$ref"].as_str())
    })?;
    let name = reference.rsplit('/').next()?;
    doc["components"]["schemas"][name].get("example").cloned()
}

#[tokio::test]
async fn every_example_body_is_taken() {
    let app = app().await;
    let doc = crate::openapi();
    let schemas = &doc["components"]["schemas"];

    // The fixtures the examples name, from the document's own examples where it has them.
    let (status, body) =
        send(&app, "PUT", "/v1/templates/order_shipped", "key-a", &schemas["TemplateInput"]["example"]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&app, "PUT", "/v1/users/u1", "key-a", &schemas["UserInput"]["example"]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&app, "PUT", "/v1/inventory/sku-1001", "key-a", &json!({"on_hand": 100})).await;
    assert_eq!(status, 201, "{body}");
    let (status, created) =
        send(&app, "POST", "/v1/admin/keys", "key-op", &json!({"role": "tenant", "tenant": "b"})).await;
    assert_eq!(status, 201, "{created}");
    let key_id = created["key_id"].as_str().or_else(|| created["id"].as_str()).expect("the new key's id").to_owned();
    let (status, token) = send(&app, "POST", "/v1/users/u1/inbox/token", "key-a", &Value::Null).await;
    assert_eq!(status, 200, "{token}");
    let user_token = token["token"].as_str().expect("a user token").to_owned();

    let mut sent = 0;
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if op.pointer("/requestBody/content/application~1json").is_none() {
                // `POST /v1/callbacks/{provider}` takes SNS's signed text, tested with a signed
                // fixture in callbacks.rs.
                continue;
            }
            let Some(example) = example_of(&doc, op) else {
                missing.push(format!("{} {path}", method.to_uppercase()));
                continue;
            };
            let uri = path
                .replace("{user_id}", "u1")
                .replace("{template_id}", "order_shipped")
                .replace("{workflow_id}", "order_updates")
                .replace("{sku_id}", "sku-1001")
                .replace("{channel}", "email")
                .replace("{key_id}", &key_id)
                .replace("{location_id}", "default")
                .replace("{id}", "no-such-finding");
            assert!(!uri.contains('{'), "no value for a parameter of {path}");
            let operator = op["security"].as_array().into_iter().flatten().any(|s| s.get("operator_key").is_some());
            let user = op["security"].as_array().into_iter().flatten().any(|s| s.get("user_token").is_some());
            let key = if operator {
                "key-op"
            } else if user {
                user_token.as_str()
            } else {
                "key-a"
            };
            let (status, body) = send(&app, &method.to_uppercase(), &uri, key, &example).await;
            if path == "/v1/ops/restock-notices/resend" {
                // A batch waits for a manual resend only after a restock round's sends failed
                // for good (docs/restock.md): the body is read, and the batch looked up.
                assert_eq!((status, body["code"].as_str()), (404, Some("not_found")), "{body}");
                sent += 1;
                continue;
            }
            if path == "/v1/ops/inventory-findings/{id}/settle" {
                // A finding exists only once a reconciliation found a difference (docs/inventory.md,
                // "Findings"): the body is taken, and the finding looked up.
                assert_eq!((status, body["code"].as_str()), (404, Some("not_found")), "{body}");
                sent += 1;
                continue;
            }
            assert!(
                (200..300).contains(&status),
                "{} {path} refused its example {example}: {status} {body}",
                method.to_uppercase()
            );
            sent += 1;
        }
    }
    assert!(missing.is_empty(), "operations without an example body: {missing:#?}");
    assert!(sent >= 18, "{sent} examples sent");
}
