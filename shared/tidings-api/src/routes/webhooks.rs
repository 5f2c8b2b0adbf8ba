//! A tenant's webhook endpoints (`tidings_core::webhooks`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tidings_core::webhooks::{self, Endpoint, EndpointInput, EndpointWithSecret};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(create, list, get_one, delete_one, rotate, send_test))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/webhooks", post(create).get(list))
        .route("/v1/webhooks/{endpoint_id}", get(get_one).delete(delete_one))
        .route("/v1/webhooks/{endpoint_id}/rotate", post(rotate))
        .route("/v1/webhooks/{endpoint_id}/test", post(send_test))
}

#[derive(Serialize, utoipa::ToSchema)]
struct EndpointList {
    items: Vec<Endpoint>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct TestQueued {
    /// The `webhook-id` the test event is posted with.
    #[schema(example = "evt_5f0c6e2b9a7d4c1e8f3a2b1c0d9e8f7a")]
    event_id: String,
}

/// Registers an endpoint for the event types it lists. The answer carries the signing secret
/// (`whsec_...`), the only time it is shown. The URL must be `https://` on a public address
/// (422 naming `url` otherwise: private, loopback and link-local targets are refused), unless
/// the server allows private targets (dev and tests).
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", security(("api_key" = [])),
    request_body = EndpointInput,
    responses((status = 201, description = "The endpoint, with its secret", body = EndpointWithSecret),
        (status = 409, description = "`too_many_endpoints`: the tenant has 20 already", body = Problem,
            content_type = "application/problem+json"),
        (status = 422, description = "A bad `url`, `events` or `rate_limit`", body = Problem,
            content_type = "application/problem+json")))]
async fn create(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(input): Body<EndpointInput>,
) -> ApiResult<(StatusCode, Json<EndpointWithSecret>)> {
    Ok((StatusCode::CREATED, Json(webhooks::create(&s.deps, &t, input).await?)))
}

/// This tenant's endpoints (at most 20), without their secrets.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", security(("api_key" = [])),
    responses((status = 200, description = "The endpoints", body = EndpointList)))]
async fn list(State(s): State<AppState>, Tenant(t): Tenant) -> ApiResult<Json<EndpointList>> {
    Ok(Json(EndpointList { items: webhooks::list(&s.deps, &t).await? }))
}

/// One endpoint, with its last attempt.
#[utoipa::path(get, path = "/v1/webhooks/{endpoint_id}", tag = "webhooks", security(("api_key" = [])),
    params(("endpoint_id" = String, Path, description = "The endpoint's id", pattern = "^[0-9a-f]{32}$")),
    responses((status = 200, description = "The endpoint", body = Endpoint),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json")))]
async fn get_one(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Endpoint>> {
    Ok(Json(webhooks::get(&s.deps, &t, &id).await?))
}

/// Removes an endpoint: nothing more is posted to it.
#[utoipa::path(delete, path = "/v1/webhooks/{endpoint_id}", tag = "webhooks", security(("api_key" = [])),
    params(("endpoint_id" = String, Path, description = "The endpoint's id", pattern = "^[0-9a-f]{32}$")),
    responses((status = 204, description = "Removed"),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json")))]
async fn delete_one(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<StatusCode> {
    webhooks::delete(&s.deps, &t, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new signing secret, shown once. The previous one keeps signing beside it for the grace
/// period (24 h by default): `webhook-signature` then carries both, space separated.
#[utoipa::path(post, path = "/v1/webhooks/{endpoint_id}/rotate", tag = "webhooks", security(("api_key" = [])),
    params(("endpoint_id" = String, Path, description = "The endpoint's id", pattern = "^[0-9a-f]{32}$")),
    responses((status = 200, description = "The endpoint, with its new secret", body = EndpointWithSecret),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json")))]
async fn rotate(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<EndpointWithSecret>> {
    Ok(Json(webhooks::rotate(&s.deps, &t, &id).await?))
}

/// Posts a `webhook.test` event to the endpoint, through the queue like any event.
#[utoipa::path(post, path = "/v1/webhooks/{endpoint_id}/test", tag = "webhooks", security(("api_key" = [])),
    params(("endpoint_id" = String, Path, description = "The endpoint's id", pattern = "^[0-9a-f]{32}$")),
    responses((status = 202, description = "Queued", body = TestQueued),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json")))]
async fn send_test(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<(StatusCode, Json<TestQueued>)> {
    let event_id = webhooks::send_test(&s.deps, &t, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(TestQueued { event_id })))
}
