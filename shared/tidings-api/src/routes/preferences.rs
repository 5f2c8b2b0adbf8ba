use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use tidings_core::people::preferences::{self, Preferences, PreferencesInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::ApiResult;
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_preferences, get_preferences))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/users/{user_id}/preferences", put(put_preferences).get(get_preferences))
}

/// Only the fields given change; `quiet_hours: null` removes the quiet hours.
#[utoipa::path(put, path = "/v1/users/{user_id}/preferences", tag = "preferences", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id")), request_body = PreferencesInput,
    responses((status = 200, description = "The preferences", body = Preferences)))]
async fn put_preferences(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    Body(input): Body<PreferencesInput>,
) -> ApiResult<Json<Preferences>> {
    Ok(Json(preferences::put(&s.deps, &t, &user_id, input).await?))
}

#[utoipa::path(get, path = "/v1/users/{user_id}/preferences", tag = "preferences", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id")),
    responses((status = 200, description = "The preferences (defaults when never set)", body = Preferences)))]
async fn get_preferences(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<Preferences>> {
    super::users::not_erased(&s, &t, &user_id).await?;
    Ok(Json(preferences::get(&s.deps, &t, &user_id).await?))
}
