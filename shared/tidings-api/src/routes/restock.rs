//! Back-in-stock (API.md "Back-in-stock", "Operations"); the rules live in
//! `tidings_core::restock`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tidings_core::CoreError;
use tidings_core::restock::{
    self, NoticePage, ResendReport, StockEvent, StockEventAccepted, Subscription, SubscriptionPage, SubscriptionRequest,
};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::ApiResult;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/stock-subscriptions", post(subscribe))
        .route("/v1/stock-subscriptions/{subscription_id}", delete(cancel))
        .route("/v1/users/{user_id}/stock-subscriptions", get(list_for_user))
        .route("/v1/stock-events", post(stock_event))
        .route("/v1/ops/restock-notices", get(list_notices))
        .route("/v1/ops/restock-notices/resend", post(resend))
}

/// 201 with a new WAITING subscription; 200 with the WAITING one that exists.
async fn subscribe(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<SubscriptionRequest>,
) -> ApiResult<(StatusCode, Json<Subscription>)> {
    let (sub, created) = restock::subscribe(&s.deps, &t, &req).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(sub)))
}

/// 200 CANCELLED; the record stays.
async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Subscription>> {
    Ok(Json(restock::cancel(&s.deps, &t, &id).await?))
}

async fn list_for_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<SubscriptionPage>> {
    Ok(Json(restock::list_for_user(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?))
}

/// The upstream `stock.in` event, applied once as an adjustment → 202 (the alerts follow).
async fn stock_event(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(ev): Body<StockEvent>,
) -> ApiResult<(StatusCode, Json<StockEventAccepted>)> {
    if ev.tenant.as_deref().is_some_and(|other| other != t.as_str()) {
        return Err(CoreError::invalid("tenant", "must be omitted or be the caller's tenant").into());
    }
    Ok((StatusCode::ACCEPTED, Json(restock::apply_stock_event(&s.deps, &t, &ev).await?)))
}

#[derive(Debug, Deserialize)]
struct NoticeQuery {
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_notices(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(q): QueryParams<NoticeQuery>,
) -> ApiResult<Json<NoticePage>> {
    let limit = PageParams { limit: q.limit, cursor: None }.limit()?;
    let status = q.status.unwrap_or_else(|| "MANUAL".into());
    Ok(Json(restock::list_notices(&s.deps, &t, &status, limit, q.cursor).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResendRequest {
    batch_no: String,
}

async fn resend(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<ResendRequest>,
) -> ApiResult<Json<ResendReport>> {
    Ok(Json(restock::resend(&s.deps, &t, &req.batch_no).await?))
}
