use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use tidings_core::notify::api::{self, Accepted, DeliveryPage, NotificationView};
use tidings_core::notify::model::NotificationRequest;

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/notifications", post(create))
        .route("/v1/notifications/{id}", get(show))
        .route("/v1/notifications/{id}/deliveries", get(deliveries))
        .route("/v1/notifications/{id}/cancel", post(cancel))
}

/// 202 once the request is durably written (the write is the outbox).
async fn create(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<NotificationRequest>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    let accepted = api::accept(&s.deps, &t, req).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

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

async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<NotificationView>> {
    Ok(Json(api::cancel(&s.deps, &t, &id).await?))
}
