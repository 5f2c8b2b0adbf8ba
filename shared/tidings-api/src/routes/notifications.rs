use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use tidings_core::notify::api::{self, Accepted, DeliveryPage, NotificationView};
use tidings_core::notify::model::NotificationRequest;
use tidings_core::notify::verification::{self, Verified};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(create, show, deliveries, cancel, verified))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/notifications", post(create))
        .route("/v1/notifications/{id}", get(show))
        .route("/v1/notifications/{id}/deliveries", get(deliveries))
        .route("/v1/notifications/{id}/cancel", post(cancel))
        .route("/v1/notifications/{id}/verified", post(verified))
}

/// 202 once the request is durably written (the write is the outbox).
#[utoipa::path(post, path = "/v1/notifications", tag = "notifications", security(("api_key" = [])),
    request_body = NotificationRequest,
    responses((status = 202, description = "Accepted (or scheduled); the same id for a repeated idempotency key", body = Accepted),
        (status = 409, description = "`idempotency_conflict`: the key was used with another body", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: the `requester`'s limit is reached (`field` names which); nothing accepted; see `Retry-After`", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until the limit's window ends")))))]
async fn create(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<NotificationRequest>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let accepted = api::accept(&s.deps, &t, req).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

#[utoipa::path(get, path = "/v1/notifications/{id}", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "Status and counts", body = NotificationView),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn show(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<NotificationView>> {
    match api::get_notification(&s.deps, &t, &id).await? {
        Some(v) => Ok(Json(v)),
        None => Err(Problem::not_found("notification").into()),
    }
}

/// One page of deliveries, per (user, channel).
#[utoipa::path(get, path = "/v1/notifications/{id}/deliveries", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id"), PageParams),
    responses((status = 200, description = "Deliveries", body = DeliveryPage),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn deliveries(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<DeliveryPage>> {
    match api::list_deliveries(&s.deps, &t, &id, page.limit()?, page.cursor).await? {
        Some(p) => Ok(Json(p)),
        None => Err(Problem::not_found("notification").into()),
    }
}

/// Stops what has not been sent yet.
#[utoipa::path(post, path = "/v1/notifications/{id}/cancel", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "The notification, cancelled", body = NotificationView),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already finished", body = Problem, content_type = "application/problem+json")))]
async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<NotificationView>> {
    Ok(Json(api::cancel(&s.deps, &t, &id).await?))
}

/// The shop's user entered the code this notification carried: counted once (repeats answer
/// the first time) in its template's verification stats, `GET /v1/ops/verification`.
#[utoipa::path(post, path = "/v1/notifications/{id}/verified", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "Verified (now, or at the time first reported)", body = Verified),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn verified(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Verified>> {
    match verification::verify(&s.deps, &t, &id).await? {
        Some(v) => Ok(Json(v)),
        None => Err(Problem::not_found("notification").into()),
    }
}
