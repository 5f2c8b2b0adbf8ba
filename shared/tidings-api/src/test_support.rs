//! What the route tests share: a whole `Deps` over one in-memory embedded store.

#![allow(clippy::unwrap_used)]

use tidings_core::Deps;
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

/// `store` as table and queues, providers that accept everything, the system clock and the
/// default configuration.
pub fn deps_over(store: EmbeddedStore) -> Deps {
    TestWorld::builder().system_clock().store(store).build().deps
}

/// [`deps_over`] a fresh in-memory store.
pub fn memory_deps() -> Deps {
    deps_over(EmbeddedStore::in_memory().unwrap())
}

/// One request through `app` with a tenant or operator key and a JSON body (`""`: none): its
/// status and its JSON answer (`null` when it has none).
pub async fn call_json(
    app: &axum::Router,
    key: &str,
    method: axum::http::Method,
    uri: &str,
    body: String,
) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}
