//! What a client is told when a request is refused (docs/errors.md): each 4xx names the field or
//! header at fault and what to do, and every answer carries its request id.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use axum::body::Body;
use axum::http::{Method, Request};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tidings_core::ops::tenants::{self, KeySpec, Role};
use tidings_core::{TenantId, ops::tenants::register_key};
use tower::ServiceExt;

struct Answer {
    status: u16,
    headers: axum::http::HeaderMap,
    body: Value,
}

async fn app() -> axum::Router {
    let deps = crate::test_support::memory_deps();
    register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
    tenants::register(&deps, "key-op", KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
    crate::app(crate::AppState::of(deps))
}

async fn send(app: &axum::Router, req: Request<Body>) -> Answer {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer { status, headers, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
}

fn put_user(headers: &[(&str, &str)], body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::builder().method(Method::PUT).uri("/v1/users/u1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(body.into()).unwrap()
}

fn problem(a: &Answer, status: u16, code: &str, field: Option<&str>) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.headers["content-type"], "application/problem+json", "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert_eq!(a.body["field"].as_str(), field, "{}", a.body);
}

const JSON: (&str, &str) = ("content-type", "application/json");
const KEY: (&str, &str) = ("authorization", "Bearer key-a");

#[tokio::test]
async fn a_401_says_what_is_wrong_with_the_authorization_header() {
    let app = app().await;
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[JSON], "no Authorization header"),
        (&[JSON, ("authorization", "key-a")], "must be `Bearer <key>`"),
        (&[JSON, ("authorization", "Basic a2V5LWE6")], "must be `Bearer <key>`"),
        (&[JSON, ("authorization", "Bearer nope")], "not valid (unknown, revoked or expired)"),
    ];
    for (headers, says) in cases {
        let a = send(&app, put_user(headers, "{}")).await;
        problem(&a, 401, "unauthorized", Some("Authorization"));
        assert!(a.body["detail"].as_str().unwrap().contains(says), "{}", a.body);
        assert_eq!(a.headers["www-authenticate"], "Bearer");
    }
    // The scheme's case does not matter.
    let a = send(&app, put_user(&[JSON, ("authorization", "bEaReR key-a")], "{}")).await;
    assert_eq!(a.status, 200, "{}", a.body);
}

#[tokio::test]
async fn a_403_names_the_role_the_route_needs() {
    let app = app().await;
    let a = send(&app, put_user(&[JSON, ("authorization", "Bearer key-op")], "{}")).await;
    problem(&a, 403, "operator_key", Some("Authorization"));
    assert!(a.body["detail"].as_str().unwrap().contains("needs a tenant key"), "{}", a.body);
    let req = Request::get("/v1/ops/queues").header("authorization", "Bearer key-a").body(Body::empty()).unwrap();
    let a = send(&app, req).await;
    problem(&a, 403, "operator_only", Some("Authorization"));
    assert!(a.body["detail"].as_str().unwrap().contains("needs an operator key"), "{}", a.body);
}

#[tokio::test]
async fn bodies_that_are_not_json_are_415_naming_content_type() {
    let app = app().await;
    for content_type in ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"] {
        let a = send(&app, put_user(&[KEY, ("content-type", content_type)], r#"{"email": "a@b.example"}"#)).await;
        problem(&a, 415, "unsupported_media_type", Some("Content-Type"));
        assert!(a.body["detail"].as_str().unwrap().contains("application/json"), "{}", a.body);
    }
    for content_type in ["application/json; charset=utf-8", "application/merge-patch+json"] {
        let a = send(&app, put_user(&[KEY, ("content-type", content_type)], "{}")).await;
        assert_eq!(a.status, 200, "{content_type}: {}", a.body);
    }
}

/// 413 whatever the size: past the API's 1 MiB and past axum's own 2 MiB alike.
#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let app = app().await;
    for size in [crate::extract::MAX_BODY + 1, 2 * crate::extract::MAX_BODY + 1, 5 * crate::extract::MAX_BODY] {
        let body = format!(r#"{{"email": "{}"}}"#, "x".repeat(size));
        let a = send(&app, put_user(&[KEY, JSON], body)).await;
        problem(&a, 413, "body_too_large", None);
    }
}

#[tokio::test]
async fn malformed_json_says_where_and_a_missing_field_is_named() {
    let app = app().await;
    let a = send(&app, put_user(&[KEY, JSON], "{\n  \"email\": \"a@b.example\",\n  \"tags\": [\"a\",,]\n}")).await;
    assert_eq!((a.status, &a.body["code"]), (400, &json!("malformed_json")), "{}", a.body);
    assert!(a.body["field"].as_str().is_some_and(|f| f.starts_with("tags") && !f.contains('?')), "{}", a.body);
    let detail = a.body["detail"].as_str().unwrap();
    assert!(detail.contains("line 3, column"), "{detail}");
    let a = send(&app, put_user(&[KEY, JSON], "{\"email\" \"a\"}")).await;
    assert_eq!((a.status, &a.body["code"]), (400, &json!("malformed_json")), "{}", a.body);
    assert!(a.body["field"].is_null() || a.body["field"].as_str().is_some_and(|f| !f.contains('?')), "{}", a.body);
    let a = send(&app, put_user(&[KEY, JSON], "")).await;
    problem(&a, 400, "malformed_json", None);
    assert!(a.body["detail"].as_str().unwrap().contains("empty"), "{}", a.body);

    let order = json!({"order_id": "o1", "items": [{"qty": 1}]}).to_string();
    let req =
        Request::post("/v1/orders").header("authorization", "Bearer key-a").header("content-type", "application/json");
    let a = send(&app, req.body(Body::from(order)).unwrap()).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body["field"] == "user_id" || a.body["field"] == "items[0].sku_id", "{}", a.body);
    assert!(a.body["detail"].as_str().unwrap().contains("is required"), "{}", a.body);
}

/// An unknown field is named once, at its own path (not `colour.colour`).
#[tokio::test]
async fn an_unknown_field_is_named_at_its_path() {
    let app = app().await;
    let prefs = |body: Value| {
        Request::put("/v1/users/u1/preferences")
            .header("authorization", "Bearer key-a")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let a = send(&app, prefs(json!({"colour": "red"}))).await;
    problem(&a, 400, "invalid_body", Some("colour"));
    let a = send(&app, prefs(json!({"quiet_hours": {"start": "22:00", "end": "08:00", "zone": "x"}}))).await;
    problem(&a, 400, "invalid_body", Some("quiet_hours.zone"));
}

#[tokio::test]
async fn a_trailing_slash_is_a_404_naming_the_route() {
    let app = app().await;
    let req = Request::get("/v1/users/u1/").header("authorization", "Bearer key-a").body(Body::empty()).unwrap();
    let a = send(&app, req).await;
    problem(&a, 404, "no_route", None);
    assert!(a.body["detail"].as_str().unwrap().contains("`/v1/users/u1`"), "{}", a.body);
    let a = send(&app, Request::get("/v1/nothing/").body(Body::empty()).unwrap()).await;
    problem(&a, 404, "no_route", None);
    assert!(!a.body["detail"].as_str().unwrap().contains("trailing"), "{}", a.body);
}

#[tokio::test]
async fn every_answer_has_a_request_id_and_problems_repeat_it() {
    let app = app().await;
    let a = send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    let made = a.headers["x-request-id"].to_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&made).is_ok(), "{made}");

    let a = send(&app, put_user(&[JSON, ("x-request-id", "client-42")], "{}")).await;
    assert_eq!(a.headers["x-request-id"], "client-42");
    assert_eq!(a.body["request_id"], "client-42", "{}", a.body);

    // An id a log line could not hold safely is replaced.
    let a = send(&app, put_user(&[JSON, ("x-request-id", "a b<c>")], "{}")).await;
    let id = a.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(id, "a b<c>");
    assert_eq!(a.body["request_id"], json!(id), "{}", a.body);

    // axum's own refusals are problems too: a provider callback's body past axum's 2 MiB.
    let big = Body::from(vec![b'x'; 3 * crate::extract::MAX_BODY]);
    let a =
        send(&app, Request::post("/v1/callbacks/ses").header("content-type", "text/plain").body(big).unwrap()).await;
    problem(&a, 413, "body_too_large", None);
    assert!(a.body["request_id"].is_string(), "{}", a.body);

    // In Lambda, API Gateway's id when the client sent none.
    let mut req = Request::get("/healthz").body(Body::empty()).unwrap();
    req.extensions_mut().insert(crate::request_id::GatewayRequestId("JKJaXmPLvHcESHA=".into()));
    let a = send(&app, req).await;
    assert_eq!(a.headers["x-request-id"], "JKJaXmPLvHcESHA=");
}

/// After `DELETE /v1/users/{id}`, what was the user's reads as absent, as the user does, until
/// the user is written again.
#[tokio::test]
async fn an_erased_users_data_reads_404_until_written_again() {
    let app = app().await;
    let get = |uri: &str| Request::get(uri).header("authorization", "Bearer key-a").body(Body::empty()).unwrap();
    let owned =
        ["/v1/users/u1/preferences", "/v1/users/u1/devices", "/v1/users/u1/inbox", "/v1/users/u1/stock-subscriptions"];
    assert_eq!(send(&app, put_user(&[KEY, JSON], "{}")).await.status, 200);
    for uri in owned {
        assert_eq!(send(&app, get(uri)).await.status, 200, "{uri}");
    }
    let erase = Request::delete("/v1/users/u1").header("authorization", "Bearer key-a").body(Body::empty()).unwrap();
    assert_eq!(send(&app, erase).await.status, 204);
    for uri in std::iter::once("/v1/users/u1").chain(owned) {
        let a = send(&app, get(uri)).await;
        problem(&a, 404, "not_found", None);
    }
    assert_eq!(send(&app, put_user(&[KEY, JSON], "{}")).await.status, 200);
    for uri in owned {
        assert_eq!(send(&app, get(uri)).await.status, 200, "{uri}");
    }
}
