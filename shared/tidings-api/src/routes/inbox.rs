use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tidings_core::inbox::{self, InboxChange, InboxPage};

use crate::extract::{PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(list, mark_read, read_all, archive))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/users/{user_id}/inbox", get(list))
        .route("/v1/users/{user_id}/inbox/{message_id}/read", post(mark_read))
        .route("/v1/users/{user_id}/inbox/read-all", post(read_all))
        .route("/v1/users/{user_id}/inbox/{message_id}/archive", post(archive))
}

/// Marks every unread message of the user read (each pushed live as `inbox.read`), as
/// `POST /v1/me/inbox/read-all` does with the user's token.
#[utoipa::path(post, path = "/v1/users/{user_id}/inbox/read-all", tag = "inbox", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id")),
    responses((status = 200, description = "How many were marked, and the unread count after", body = InboxChange)))]
async fn read_all(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<InboxChange>> {
    Ok(Json(inbox::read_all(&s.deps, &t, &user_id).await?))
}

/// Archives a message (no longer listed, read if it was not; pushed live as
/// `inbox.archived`), as `POST /v1/me/inbox/{message_id}/archive` does with the user's token.
#[utoipa::path(post, path = "/v1/users/{user_id}/inbox/{message_id}/archive", tag = "inbox", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id"), ("message_id" = String, Path, description = "The message id")),
    responses((status = 200, description = "Archived", body = InboxChange),
        (status = 404, description = "No such message", body = Problem, content_type = "application/problem+json")))]
async fn archive(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams((user_id, message_id)): PathParams<(String, String)>,
) -> ApiResult<Json<InboxChange>> {
    Ok(Json(inbox::archive(&s.deps, &t, &user_id, &message_id).await?))
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
pub(super) struct MarkedRead {
    pub message_id: String,
    pub read: bool,
    pub unread_count: i64,
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
