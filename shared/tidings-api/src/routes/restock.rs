//! Back-in-stock (docs/restock.md); the rules live in
//! `tidings_core::restock`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::Serialize;
use tidings_core::CoreError;
use tidings_core::restock::analytics::{EarningsPage, MAX_SKUS_PER_PAGE};
use tidings_core::restock::{
    self, NoticePage, ResendReport, StockEvent, StockEventAccepted, Subscription, SubscriptionRequest,
    SubscriptionStatus,
};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(subscribe, cancel, list_for_user, stock_event, list_notices, resend, analytics))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/stock-subscriptions", post(subscribe))
        .route("/v1/stock-subscriptions/{subscription_id}", delete(cancel))
        .route("/v1/users/{user_id}/stock-subscriptions", get(list_for_user))
        .route("/v1/stock-events", post(stock_event))
        .route("/v1/ops/restock-notices", get(list_notices))
        .route("/v1/ops/restock-notices/resend", post(resend))
        .route("/v1/restock/analytics", get(analytics))
}

/// A subscription as the API shows it: the stored record without the fields only storage
/// reads (its sort key and creation time in milliseconds).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StockSubscription {
    pub subscription_id: String,
    pub sku_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spu_id: Option<String>,
    pub user_id: String,
    pub status: SubscriptionStatus,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notified_at: Option<String>,
    /// The batch that notified it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_no: Option<String>,
    /// The market whose stock alerts it (docs/restock.md, "Markets").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Z]{2}$", example = "US")]
    pub market: Option<String>,
}

impl From<Subscription> for StockSubscription {
    fn from(s: Subscription) -> Self {
        StockSubscription {
            subscription_id: s.subscription_id,
            sku_id: s.sku_id,
            spu_id: s.spu_id,
            user_id: s.user_id,
            status: s.status,
            created_at: s.created_at,
            updated_at: s.updated_at,
            notified_at: s.notified_at,
            batch_no: s.batch_no,
            market: s.market,
        }
    }
}

/// One page of a user's subscriptions, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StockSubscriptionPage {
    pub items: Vec<StockSubscription>,
    pub next_cursor: Option<String>,
}

/// 201 with a new WAITING subscription; 200 with the WAITING one that exists.
#[utoipa::path(post, path = "/v1/stock-subscriptions", tag = "restock", security(("api_key" = [])), request_body = SubscriptionRequest,
    responses((status = 201, description = "A new WAITING subscription", body = StockSubscription),
        (status = 200, description = "The WAITING subscription that exists", body = StockSubscription)))]
async fn subscribe(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<SubscriptionRequest>,
) -> ApiResult<(StatusCode, Json<StockSubscription>)> {
    let (sub, created) = restock::subscribe(&s.deps, &t, &req).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(sub.into())))
}

/// 200 CANCELLED; the record stays.
#[utoipa::path(delete, path = "/v1/stock-subscriptions/{subscription_id}", tag = "restock", security(("api_key" = [])),
    params(("subscription_id" = String, Path, description = "The subscription id")),
    responses((status = 200, description = "CANCELLED", body = StockSubscription),
        (status = 404, description = "No such subscription", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not cancellable in its status", body = Problem, content_type = "application/problem+json")))]
async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<StockSubscription>> {
    Ok(Json(restock::cancel(&s.deps, &t, &id).await?.into()))
}

#[utoipa::path(get, path = "/v1/users/{user_id}/stock-subscriptions", tag = "restock", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id"), PageParams),
    responses((status = 200, description = "The user's subscriptions, newest first", body = StockSubscriptionPage)))]
async fn list_for_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<StockSubscriptionPage>> {
    super::users::not_erased(&s, &t, &user_id).await?;
    let page = restock::list_for_user(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?;
    Ok(Json(StockSubscriptionPage {
        items: page.items.into_iter().map(StockSubscription::from).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// The upstream `stock.in` event, applied once as an adjustment → 202 (the alerts follow).
#[utoipa::path(post, path = "/v1/stock-events", tag = "restock", security(("api_key" = [])), request_body = StockEvent,
    responses((status = 202, description = "Applied once as an adjustment; alerts follow", body = StockEventAccepted),
        (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Conflicts with the stock or an earlier event", body = Problem, content_type = "application/problem+json")))]
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

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct NoticeQuery {
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/ops/restock-notices", tag = "restock", security(("api_key" = [])), params(NoticeQuery),
    responses((status = 200, description = "Notices in that status (default MANUAL)", body = NoticePage)))]
async fn list_notices(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(q): QueryParams<NoticeQuery>,
) -> ApiResult<Json<NoticePage>> {
    let limit = PageParams { limit: q.limit, cursor: None }.limit()?;
    let status = q.status.unwrap_or_else(|| "MANUAL".into());
    Ok(Json(restock::list_notices(&s.deps, &t, &status, limit, q.cursor).await?))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ResendRequest {
    batch_no: String,
}

#[utoipa::path(post, path = "/v1/ops/restock-notices/resend", tag = "restock", security(("api_key" = [])), request_body = ResendRequest,
    responses((status = 200, description = "What was resent", body = ResendReport),
        (status = 404, description = "No such batch", body = Problem, content_type = "application/problem+json")))]
async fn resend(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<ResendRequest>,
) -> ApiResult<Json<ResendReport>> {
    Ok(Json(restock::resend(&s.deps, &t, &req.batch_no).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct AnalyticsQuery {
    /// One SKU (its row even when nothing happened to it); absent: every SKU that has had
    /// subscribers, a page at a time.
    sku_id: Option<String>,
    /// RFC 3339: figures from the start of this time's UTC day (the counts are kept per day).
    since: Option<String>,
    /// SKUs per page, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// What back-in-stock alerts earn per SKU (docs/restock.md, "What alerts earn").
#[utoipa::path(get, path = "/v1/restock/analytics", tag = "restock", security(("api_key" = [])), params(AnalyticsQuery),
    responses((status = 200, description = "Per SKU: waiting, notified, clicked, ordered within 7 days of the notice, revenue, median minutes to order", body = EarningsPage),
        (status = 422, description = "A bad `sku_id`, `since`, `limit` or `cursor`", body = Problem, content_type = "application/problem+json")))]
async fn analytics(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(q): QueryParams<AnalyticsQuery>,
) -> ApiResult<Json<EarningsPage>> {
    let limit = q.limit.unwrap_or(20.min(MAX_SKUS_PER_PAGE));
    let page =
        restock::analytics::analytics(&s.deps, &t, q.sku_id.as_deref(), q.since.as_deref(), limit, q.cursor).await?;
    Ok(Json(page))
}
