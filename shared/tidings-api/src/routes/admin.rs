//! API keys, for operators: make, list, rotate and revoke (`tidings keys` does the same straight
//! against the table, for the first operator key).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::TenantId;
use tidings_core::tenants::{self, KeyInfo, KeySpec, NewKey, Role, Rotated};

use crate::extract::{Body, Operator, PageParams, PathParams, QueryParams, parse_json};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(create_key, list_keys, get_key, rotate_key, revoke_key))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/keys", post(create_key).get(list_keys))
        .route("/v1/admin/keys/{key_id}", get(get_key).delete(revoke_key))
        .route("/v1/admin/keys/{key_id}/rotate", post(rotate_key))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    role: Role,
    /// The tenant of a tenant key (absent for an operator key).
    #[serde(default)]
    tenant: Option<String>,
    /// What the key is for, for the people who list them.
    #[serde(default)]
    name: Option<String>,
    /// When it stops working (RFC 3339); none by default.
    #[serde(default)]
    expires_at: Option<DateTime<Utc>>,
}

/// Makes a key. Its secret is in this answer only.
#[utoipa::path(post, path = "/v1/admin/keys", tag = "admin", security(("operator_key" = [])), request_body = CreateKey,
    responses((status = 201, description = "The key, with its secret", body = NewKey)))]
async fn create_key(
    State(s): State<AppState>,
    op: Operator,
    Body(input): Body<CreateKey>,
) -> ApiResult<(StatusCode, Json<NewKey>)> {
    let tenant = match input.tenant.as_deref() {
        Some(t) => Some(TenantId::parse(t).map_err(|e| {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", e.to_string()).with_field("tenant")
        })?),
        None => None,
    };
    let spec = KeySpec { role: input.role, tenant, name: input.name, expires_at: input.expires_at };
    let made = tenants::create(&s.deps, spec).await?;
    tracing::info!(key_id = %made.info.id, role = made.info.role.as_str(), tenant = ?made.info.tenant, by = %op.key_id, "api key created");
    Ok((StatusCode::CREATED, Json(made)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this tenant's keys.
    tenant: Option<String>,
    /// Items per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct KeyList {
    keys: Vec<KeyInfo>,
    next_cursor: Option<String>,
}

/// Every key (revoked and expired ones included, with their status), never a secret.
#[utoipa::path(get, path = "/v1/admin/keys", tag = "admin", security(("operator_key" = [])), params(ListQuery),
    responses((status = 200, description = "A page of keys", body = KeyList)))]
async fn list_keys(
    State(s): State<AppState>,
    _op: Operator,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<KeyList>> {
    let limit = PageParams { limit: q.limit, cursor: None }.limit()?;
    let tenant = match q.tenant.as_deref() {
        Some(t) => Some(TenantId::parse(t).map_err(|e| {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", e.to_string()).with_field("tenant")
        })?),
        None => None,
    };
    let (keys, next_cursor) = tenants::list(&s.deps, tenant.as_ref(), limit, q.cursor).await?;
    Ok(Json(KeyList { keys, next_cursor }))
}

/// One key.
#[utoipa::path(get, path = "/v1/admin/keys/{key_id}", tag = "admin", security(("operator_key" = [])),
    params(("key_id" = String, Path, description = "The key's id (`key_...`)")),
    responses((status = 200, description = "The key", body = KeyInfo),
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json")))]
async fn get_key(
    State(s): State<AppState>,
    _op: Operator,
    PathParams(key_id): PathParams<String>,
) -> ApiResult<Json<KeyInfo>> {
    Ok(Json(tenants::get(&s.deps, &key_id).await?))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RotateKey {
    /// How long the old key keeps working beside the new one, 0 to 2592000 (30 days); 86400 by
    /// default.
    #[serde(default)]
    grace_seconds: Option<i64>,
}

/// Makes a new key with the old one's role, tenant and name; the old one expires after the
/// grace period.
#[utoipa::path(post, path = "/v1/admin/keys/{key_id}/rotate", tag = "admin", security(("operator_key" = [])),
    params(("key_id" = String, Path, description = "The key's id")), request_body(content = Option<RotateKey>, description = "Optional: without a body the grace is a day"),
    responses((status = 201, description = "The new key (with its secret) and the old one", body = Rotated),
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`key_not_active`: the key is revoked or expired", body = Problem, content_type = "application/problem+json")))]
async fn rotate_key(
    State(s): State<AppState>,
    op: Operator,
    PathParams(key_id): PathParams<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<Rotated>)> {
    // No body: the default grace.
    let input: RotateKey = if body.is_empty() { RotateKey::default() } else { parse_json(&body)? };
    let grace = input.grace_seconds.unwrap_or(86_400);
    if !(0..=tenants::MAX_GRACE.num_seconds()).contains(&grace) {
        return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "0 to 2592000 seconds")
            .with_field("grace_seconds")
            .into());
    }
    let rotated = tenants::rotate(&s.deps, &key_id, Duration::seconds(grace)).await?;
    tracing::info!(key_id = %key_id, new_key_id = %rotated.new.info.id, by = %op.key_id, "api key rotated");
    Ok((StatusCode::CREATED, Json(rotated)))
}

/// Revokes a key: every instance refuses it from the next request on.
#[utoipa::path(delete, path = "/v1/admin/keys/{key_id}", tag = "admin", security(("operator_key" = [])),
    params(("key_id" = String, Path, description = "The key's id")),
    responses((status = 200, description = "The revoked key", body = KeyInfo),
        (status = 404, description = "No such key", body = Problem, content_type = "application/problem+json")))]
async fn revoke_key(
    State(s): State<AppState>,
    op: Operator,
    PathParams(key_id): PathParams<String>,
) -> ApiResult<Json<KeyInfo>> {
    let revoked = tenants::revoke(&s.deps, &key_id).await?;
    tracing::info!(key_id = %key_id, by = %op.key_id, "api key revoked");
    Ok(Json(revoked))
}
