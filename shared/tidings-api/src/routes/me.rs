//! The user-token routes (docs/site.md): what a page of the shop's own site reaches with the
//! token its backend got from `POST /v1/users/{user_id}/inbox/token`, sent as
//! `Authorization: Bearer <token>`. They act on that one user only: the inbox (list, read, read
//! all, archive) and the preferences with the tenant's workflows beside them. Browsers get CORS
//! answers here from the tenant's allowed origins only (`crate::cors`).

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use tidings_core::inbox::{self, InboxChange, InboxPage};
use tidings_core::people::preferences::PreferencesInput;
use tidings_core::site::{self, MyPreferences};

use super::inbox::MarkedRead;
use crate::extract::{Body, PageParams, PathParams, QueryParams, UserToken};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(list, mark_read, read_all, archive, get_preferences, put_preferences))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/me/inbox", get(list))
        .route("/v1/me/inbox/read-all", post(read_all))
        .route("/v1/me/inbox/{message_id}/read", post(mark_read))
        .route("/v1/me/inbox/{message_id}/archive", post(archive))
        .route("/v1/me/preferences", get(get_preferences).put(put_preferences))
}

/// The token's user's inbox, newest first, without archived messages.
#[utoipa::path(get, path = "/v1/me/inbox", tag = "me", security(("user_token" = [])),
    params(PageParams),
    responses((status = 200, description = "One page of the inbox (it may hold fewer than `limit` items when archived ones were skipped; follow `next_cursor`)", body = InboxPage),
        (status = 401, description = "Missing, invalid or expired user token (an API key is refused)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A page of an origin that is not among the tenant's allowed origins", body = Problem, content_type = "application/problem+json")))]
async fn list(
    State(s): State<AppState>,
    me: UserToken,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<InboxPage>> {
    super::users::not_erased(&s, &me.tenant, &me.user_id).await?;
    Ok(Json(inbox::list(&s.deps, &me.tenant, &me.user_id, page.limit()?, page.cursor).await?))
}

/// Marks one of the user's messages read (pushed live as `inbox.read`).
#[utoipa::path(post, path = "/v1/me/inbox/{message_id}/read", tag = "me", security(("user_token" = [])),
    params(("message_id" = String, Path, description = "The message id")),
    responses((status = 200, description = "Marked read", body = MarkedRead),
        (status = 401, description = "Missing, invalid or expired user token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such message in this user's inbox", body = Problem, content_type = "application/problem+json")))]
async fn mark_read(
    State(s): State<AppState>,
    me: UserToken,
    PathParams(message_id): PathParams<String>,
) -> ApiResult<Json<MarkedRead>> {
    let unread_count = inbox::mark_read(&s.deps, &me.tenant, &me.user_id, &message_id).await?;
    Ok(Json(MarkedRead { message_id, read: true, unread_count }))
}

/// Marks every unread message read; each is pushed live as `inbox.read` with the count after it.
#[utoipa::path(post, path = "/v1/me/inbox/read-all", tag = "me", security(("user_token" = [])),
    responses((status = 200, description = "How many were marked, and the unread count after", body = InboxChange),
        (status = 401, description = "Missing, invalid or expired user token", body = Problem, content_type = "application/problem+json")))]
async fn read_all(State(s): State<AppState>, me: UserToken) -> ApiResult<Json<InboxChange>> {
    Ok(Json(inbox::read_all(&s.deps, &me.tenant, &me.user_id).await?))
}

/// Archives a message: no longer listed, read if it was not; pushed live as `inbox.archived`.
/// Archiving twice answers `changed: 0`.
#[utoipa::path(post, path = "/v1/me/inbox/{message_id}/archive", tag = "me", security(("user_token" = [])),
    params(("message_id" = String, Path, description = "The message id")),
    responses((status = 200, description = "Archived", body = InboxChange),
        (status = 401, description = "Missing, invalid or expired user token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such message in this user's inbox", body = Problem, content_type = "application/problem+json")))]
async fn archive(
    State(s): State<AppState>,
    me: UserToken,
    PathParams(message_id): PathParams<String>,
) -> ApiResult<Json<InboxChange>> {
    Ok(Json(inbox::archive(&s.deps, &me.tenant, &me.user_id, &message_id).await?))
}

/// The user's preferences (the shape of `GET /v1/users/{user_id}/preferences`) and, in
/// `catalog`, what they choose from: the channels, the categories and the tenant's workflows,
/// `required` ones to be shown locked.
#[utoipa::path(get, path = "/v1/me/preferences", tag = "me", security(("user_token" = [])),
    responses((status = 200, description = "The preferences and the catalog", body = MyPreferences),
        (status = 401, description = "Missing, invalid or expired user token", body = Problem, content_type = "application/problem+json")))]
async fn get_preferences(State(s): State<AppState>, me: UserToken) -> ApiResult<Json<MyPreferences>> {
    super::users::not_erased(&s, &me.tenant, &me.user_id).await?;
    Ok(Json(site::my_preferences(&s.deps, &me.tenant, &me.user_id).await?))
}

/// Changes the user's preferences: the body of `PUT /v1/users/{user_id}/preferences` (only the
/// fields given change), except that a required workflow cannot be turned off (422 naming
/// `workflows.{workflow_id}`).
#[utoipa::path(put, path = "/v1/me/preferences", tag = "me", security(("user_token" = [])),
    request_body = PreferencesInput,
    responses((status = 200, description = "The preferences and the catalog", body = MyPreferences),
        (status = 401, description = "Missing, invalid or expired user token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A required workflow turned off, or an invalid field; `field` names it", body = Problem, content_type = "application/problem+json")))]
async fn put_preferences(
    State(s): State<AppState>,
    me: UserToken,
    Body(input): Body<PreferencesInput>,
) -> ApiResult<Json<MyPreferences>> {
    super::users::not_erased(&s, &me.tenant, &me.user_id).await?;
    Ok(Json(site::put_my_preferences(&s.deps, &me.tenant, &me.user_id, input).await?))
}
