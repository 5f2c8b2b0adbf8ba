//! API keys, for operators: make, list, rotate and revoke (`tidings keys` does the same straight
//! against the table, for the first operator key).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::TenantId;
use tidings_core::ops::tenants::{self, KeyInfo, KeySpec, NewKey, Role, Rotated};

use crate::extract::{Body, Operator, PageParams, PathParams, QueryParams, parse_json};
use crate::problem::{ApiError, ApiResult, Problem};
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

/// A `tenant` field or parameter, 422 naming it when it is not a tenant id.
fn tenant_param(t: Option<&str>) -> Result<Option<TenantId>, ApiError> {
    t.map(|t| {
        TenantId::parse(t).map_err(|e| {
            Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", e.to_string()).with_field("tenant").into()
        })
    })
    .transpose()
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
    let tenant = tenant_param(input.tenant.as_deref())?;
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
    let tenant = tenant_param(q.tenant.as_deref())?;
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
    #[schema(minimum = 0, maximum = 2_592_000)]
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
    // No body, or `null` (the document's optional body): the default grace.
    let input: RotateKey = if body.is_empty() {
        RotateKey::default()
    } else {
        parse_json::<Option<RotateKey>>(&body)?.unwrap_or_default()
    };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::http::Method;
    use serde_json::Value;
    use tidings_core::ops::tenants::{self, KeySpec, Role};

    use crate::state::AppState;

    async fn app() -> axum::Router {
        let deps = crate::test_support::memory_deps();
        tenants::register(&deps, "key-ops", KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
        crate::app(AppState::of(deps))
    }

    async fn call(app: &axum::Router, key: &str, method: Method, uri: &str, body: &str) -> (u16, Value) {
        crate::test_support::call_json(app, key, method, uri, body.to_owned()).await
    }

    #[tokio::test]
    async fn an_operator_makes_rotates_and_revokes_a_tenant_key() {
        let app = app().await;
        let (st, made) =
            call(&app, "key-ops", Method::POST, "/v1/admin/keys", r#"{"role":"tenant","tenant":"acme"}"#).await;
        assert_eq!(st, 201, "{made}");
        let (old, id) = (made["key"].as_str().unwrap(), made["id"].as_str().unwrap());
        assert_eq!(call(&app, old, Method::GET, "/v1/users/u1", "").await.0, 404, "the key works (no such user)");
        // Rotation without a body: a day's grace, both work meanwhile.
        let (st, rotated) = call(&app, "key-ops", Method::POST, &format!("/v1/admin/keys/{id}/rotate"), "").await;
        assert_eq!(st, 201, "{rotated}");
        let new = rotated["new"]["key"].as_str().unwrap();
        assert!(rotated["previous"]["expires_at"].is_string(), "{rotated}");
        assert_eq!(call(&app, old, Method::GET, "/v1/users/u1", "").await.0, 404);
        assert_eq!(call(&app, new, Method::GET, "/v1/users/u1", "").await.0, 404);
        // Revoked: 401 at once; listed as revoked, without a secret.
        let (st, v) = call(&app, "key-ops", Method::DELETE, &format!("/v1/admin/keys/{id}"), "").await;
        assert_eq!((st, v["status"].as_str()), (200, Some("revoked")), "{v}");
        assert_eq!(call(&app, old, Method::GET, "/v1/users/u1", "").await.0, 401);
        let (_, list) = call(&app, "key-ops", Method::GET, "/v1/admin/keys?tenant=acme", "").await;
        assert_eq!(list["keys"].as_array().unwrap().len(), 2, "{list}");
        assert!(!list.to_string().contains(old) && !list.to_string().contains(new), "a secret in a listing");
    }

    #[tokio::test]
    async fn bad_input_is_422_naming_the_field() {
        let app = app().await;
        for (body, field) in [
            (r#"{"role":"tenant"}"#, "tenant"),
            (r#"{"role":"operator","tenant":"acme"}"#, "tenant"),
            (r#"{"role":"tenant","tenant":"Not A Tenant!"}"#, "tenant"),
            (r#"{"role":"tenant","tenant":"acme","expires_at":"2001-01-01T00:00:00Z"}"#, "expires_at"),
        ] {
            let (st, v) = call(&app, "key-ops", Method::POST, "/v1/admin/keys", body).await;
            assert_eq!((st, v["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        let (st, v) = call(&app, "key-ops", Method::POST, "/v1/admin/keys", r#"{"role":"root"}"#).await;
        assert_eq!((st, v["field"].as_str()), (400, Some("role")), "{v}");
        let (st, v) = call(&app, "key-ops", Method::POST, "/v1/admin/keys/key_nope/rotate", "").await;
        assert_eq!(st, 404, "{v}");
        let (_, made) =
            call(&app, "key-ops", Method::POST, "/v1/admin/keys", r#"{"role":"tenant","tenant":"acme"}"#).await;
        let id = made["id"].as_str().unwrap();
        let (st, v) =
            call(&app, "key-ops", Method::POST, &format!("/v1/admin/keys/{id}/rotate"), r#"{"grace_seconds":-1}"#)
                .await;
        assert_eq!((st, v["field"].as_str()), (422, Some("grace_seconds")), "{v}");
    }
}
