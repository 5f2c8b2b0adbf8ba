use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use tidings_core::preferences::{self, Preferences, PreferencesInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::ApiResult;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/users/{user_id}/preferences", put(put_preferences).get(get_preferences))
}

/// Only the fields given change; `quiet_hours: null` removes the quiet hours.
async fn put_preferences(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    Body(input): Body<PreferencesInput>,
) -> ApiResult<Json<Preferences>> {
    Ok(Json(preferences::put(&s.deps, &t, &user_id, input).await?))
}

async fn get_preferences(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<Preferences>> {
    Ok(Json(preferences::get(&s.deps, &t, &user_id).await?))
}
