use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use tidings_core::lists::{self, DevicePage, UserPage};
use tidings_core::people::users::{self, User, UserInput};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_user, get_user, list_users, erase_user, list_devices))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/users", get(list_users))
        .route("/v1/users/{user_id}", put(put_user).get(get_user).delete(erase_user))
        .route("/v1/users/{user_id}/devices", get(list_devices))
}

/// The tenant's users, in user-id order (a user shows once written with `PUT` since the list
/// existed).
#[utoipa::path(get, path = "/v1/users", tag = "users", security(("api_key" = [])), params(PageParams),
    responses((status = 200, description = "One page of users", body = UserPage)))]
async fn list_users(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<UserPage>> {
    Ok(Json(lists::users(&s.deps, &t, page.limit()?, page.cursor).await?))
}

/// Erases the user: contacts, devices, preferences, inbox and stock subscriptions (counts of
/// many users, such as a campaign's counters and the stock ledger, stay). 204 every time,
/// whether or not there was anything left to erase. Notifications accepted before it are not
/// delivered to the user, nor later ones until the user is written again (reason `erased`).
#[utoipa::path(delete, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    responses((status = 204, description = "Erased (or nothing was left)")))]
async fn erase_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<StatusCode> {
    tidings_core::people::erasure::erase(&s.deps, &t, &user_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The user's push devices, in token-hash order (empty for a user without any).
#[utoipa::path(get, path = "/v1/users/{user_id}/devices", tag = "devices", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id"), PageParams),
    responses((status = 200, description = "One page of devices", body = DevicePage)))]
async fn list_devices(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<DevicePage>> {
    not_erased(&s, &t, &user_id).await?;
    Ok(Json(lists::devices(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?))
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

/// 404 for a user erased and not written since (`people::erasure::is_erased`): what was theirs
/// is gone, and reading it answers as reading the user does.
pub(super) async fn not_erased(s: &AppState, t: &tidings_core::TenantId, user_id: &str) -> ApiResult<()> {
    if tidings_core::people::erasure::is_erased(&s.deps, t, user_id).await? {
        return Err(crate::problem::Problem::not_found("user (erased)").into());
    }
    Ok(())
}
