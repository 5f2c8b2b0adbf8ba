use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tidings_core::inbox::{self, InboxPage};

use crate::extract::{PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(list, mark_read))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/users/{user_id}/inbox", get(list))
        .route("/v1/users/{user_id}/inbox/{message_id}/read", post(mark_read))
}

/// The user's in-app messages, newest first.
#[utoipa::path(get, path = "/v1/users/{user_id}/inbox", tag = "inbox", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id"), PageParams),
    responses((status = 200, description = "One page of the inbox", body = InboxPage)))]
async fn list(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<InboxPage>> {
    super::users::not_erased(&s, &t, &user_id).await?;
    Ok(Json(inbox::list(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?))
}

/// The answer of `POST .../inbox/{message_id}/read`.
#[derive(Serialize, utoipa::ToSchema)]
struct MarkedRead {
    message_id: String,
    read: bool,
    unread_count: i64,
}

#[utoipa::path(post, path = "/v1/users/{user_id}/inbox/{message_id}/read", tag = "inbox", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id"), ("message_id" = String, Path, description = "The message id")),
    responses((status = 200, description = "Marked read", body = MarkedRead),
        (status = 404, description = "No such message", body = Problem, content_type = "application/problem+json")))]
async fn mark_read(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams((user_id, message_id)): PathParams<(String, String)>,
) -> ApiResult<Json<MarkedRead>> {
    let unread_count = inbox::mark_read(&s.deps, &t, &user_id, &message_id).await?;
    Ok(Json(MarkedRead { message_id, read: true, unread_count }))
}
