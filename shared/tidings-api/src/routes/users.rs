use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use tidings_core::users::{self, User, UserInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_user, get_user))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/users/{user_id}", put(put_user).get(get_user))
}

/// Creates or replaces a user's contacts.
#[utoipa::path(put, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    request_body = UserInput,
    responses((status = 200, description = "The user", body = User)))]
async fn put_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    Body(input): Body<UserInput>,
) -> ApiResult<Json<User>> {
    Ok(Json(users::put_user(&s.deps, &t, &user_id, input).await?))
}

#[utoipa::path(get, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    responses((status = 200, description = "The user", body = User),
        (status = 404, description = "No such user", body = Problem, content_type = "application/problem+json")))]
async fn get_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<User>> {
    match users::get_user(&s.deps, &t, &user_id).await? {
        Some(u) => Ok(Json(u)),
        None => Err(Problem::not_found("user").into()),
    }
}
