use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use tidings_core::people::devices::{self, Device, DeviceInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::ApiResult;
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(register, unregister))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/devices", post(register)).route("/v1/devices/{token}", delete(unregister))
}

/// 201 when new for the user, 200 when it was registered already.
#[utoipa::path(post, path = "/v1/devices", tag = "devices", security(("api_key" = [])), request_body = DeviceInput,
    responses((status = 201, description = "Registered", body = Device), (status = 200, description = "Already registered", body = Device)))]
async fn register(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(input): Body<DeviceInput>,
) -> ApiResult<(StatusCode, Json<Device>)> {
    let (device, created) = devices::register(&s.deps, &t, input).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(device)))
}

#[utoipa::path(delete, path = "/v1/devices/{token}", tag = "devices", security(("api_key" = [])),
    params(("token" = String, Path, description = "The push token")),
    responses((status = 204, description = "Removed (or was absent)")))]
async fn unregister(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(token): PathParams<String>,
) -> ApiResult<StatusCode> {
    devices::unregister(&s.deps, &t, &token).await?;
    Ok(StatusCode::NO_CONTENT)
}
