//! The router as the `api` Lambda function serves it: API Gateway v2 events, parsed by
//! `lambda_http`, answered by the same axum app.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use http_body_util::BodyExt;
use tidings_api::AppState;
use tidings_core::{TenantId, ops::tenants};
use tidings_embedded::test_world::TestWorld;
use tower::ServiceExt;

async fn state() -> AppState {
    let deps = TestWorld::builder().system_clock().build().deps;
    tenants::register_key(&deps, &TenantId::parse("acme").unwrap(), "test-key-acme").await.unwrap();
    AppState::of(deps)
}

fn fixture() -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/apigw-v2-put-user.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[tokio::test]
async fn api_gateway_v2_event_reaches_the_router() {
    let app = tidings_api::app(state().await);
    let req = lambda_http::request::from_str(&fixture()).unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["user_id"], "u1");
    assert_eq!(v["timezone"], "Europe/Paris");
}

#[tokio::test]
async fn api_gateway_v2_event_without_a_valid_key_is_401_problem_json() {
    let app = tidings_api::app(state().await);
    let event = fixture().replace("Bearer test-key-acme", "Bearer forged");
    let res = app.oneshot(lambda_http::request::from_str(&event).unwrap()).await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn dev_routes_do_not_exist_in_lambda() {
    let app = tidings_api::app(state().await);
    let event = fixture().replace("/v1/users/u1", "/dev/deliveries").replace("\"PUT\"", "\"GET\"");
    let res = app.oneshot(lambda_http::request::from_str(&event).unwrap()).await.unwrap();
    assert_eq!(res.status(), 404);
}
