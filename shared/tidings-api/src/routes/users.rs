use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use tidings_core::users::{self, User, UserInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/users/{user_id}", put(put_user).get(get_user))
}

async fn put_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    Body(input): Body<UserInput>,
) -> ApiResult<Json<User>> {
    Ok(Json(users::put_user(&s.deps, &t, &user_id, input).await?))
}

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
