//! Extractors: the tenant from the API key, JSON bodies whose errors name the field, and
//! pagination.

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tidings_core::TenantId;
use tidings_core::ops::tenants::{self, Principal};

use crate::problem::{ApiError, Problem};
use crate::state::AppState;

/// Who the request's API key belongs to (`Authorization: Bearer <key>`), or 401.
pub async fn principal(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let key = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(Problem::unauthorized)?;
    tenants::authenticate(&state.deps, key).await?.ok_or_else(|| Problem::unauthorized().into())
}

/// The tenant whose API key came with the request. An operator's key is refused (403): operators
/// act on the system, not on a tenant's data.
#[derive(Clone, Debug)]
pub struct Tenant(pub TenantId);

impl<S> FromRequestParts<S> for Tenant
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match principal(parts, &AppState::from_ref(state)).await? {
            Principal::Tenant { tenant, .. } => {
                crate::limits::admit_tenant(parts, &tenant).await.map(|()| Tenant(tenant))
            }
            Principal::Operator { .. } => Err(Problem::new(
                StatusCode::FORBIDDEN,
                "operator_key",
                "an operator key acts on the system, not on a tenant's data: use a tenant key",
            )
            .into()),
        }
    }
}

/// An operator, whose key came with the request. A tenant's key is refused (403).
#[derive(Clone, Debug)]
pub struct Operator {
    pub key_id: String,
}

impl<S> FromRequestParts<S> for Operator
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match principal(parts, &AppState::from_ref(state)).await? {
            Principal::Operator { key_id } => Ok(Operator { key_id }),
            Principal::Tenant { .. } => Err(Problem::new(
                StatusCode::FORBIDDEN,
                "operator_only",
                "this route is an operator's: a tenant key cannot use it",
            )
            .into()),
        }
    }
}

/// A JSON body. Malformed JSON or a wrong type is 400 naming the field's path.
pub struct Body<T>(pub T);

/// The largest body accepted.
pub const MAX_BODY: usize = 1 << 20;

impl<S, T> FromRequest<S> for Body<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, "bad_body", e.body_text()))?;
        if bytes.len() > MAX_BODY {
            return Err(
                Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "the body is larger than 1 MiB").into()
            );
        }
        parse_json(&bytes).map(Body)
    }
}

/// Parses JSON, naming the path of the field at fault. A whole-number float (`1.0`) is the
/// integer it equals, as JSON Schema says (`type: integer` takes it): when an integer field
/// refuses one, the body is read again with such floats as integers.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(bytes)) {
        Err(e) if e.inner().to_string().starts_with("invalid type: floating point") => {
            let value: serde_json::Value =
                serde_json::from_slice(bytes).map_err(|e| json_problem(".".to_owned(), e))?;
            serde_path_to_error::deserialize(whole_floats_as_integers(value))
                .map_err(|e| json_problem(e.path().to_string(), e.into_inner()))
        }
        other => other.map_err(|e| json_problem(e.path().to_string(), e.into_inner())),
    }
}

/// `value` with every float that is a whole number in `i64` range as that integer.
fn whole_floats_as_integers(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => match n.as_f64() {
            // The bounds are exact in f64 (-2^63 and 2^63); 2^63 itself is out of range.
            Some(f)
                if !n.is_i64()
                    && !n.is_u64()
                    && f.fract() == 0.0
                    && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) =>
            {
                #[allow(clippy::cast_possible_truncation)]
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(whole_floats_as_integers).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, whole_floats_as_integers(v))).collect()),
        other => other,
    }
}

/// A 400 naming the field at `path` (`.` is the body as a whole).
fn json_problem(path: String, inner: serde_json::Error) -> ApiError {
    let code = if inner.is_syntax() || inner.is_eof() { "malformed_json" } else { "invalid_body" };
    let mut p = Problem::new(StatusCode::BAD_REQUEST, code, inner.to_string());
    if path != "." {
        p = p.with_field(path);
    }
    ApiError::from(p)
}

/// `?limit=&cursor=`: default 50, at most 500.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(50),
            Some(n) if (1..=500).contains(&n) => Ok(n),
            Some(_) => Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "limit must be 1 to 500")
                .with_field("limit")
                .into()),
        }
    }
}

/// A query string whose errors are problem documents.
pub struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryParams(q.0))
            .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()).into())
    }
}

/// Path parameters whose errors are problem documents.
pub struct PathParams<T>(pub T);

impl<S, T> FromRequestParts<S> for PathParams<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e| Problem::new(StatusCode::BAD_REQUEST, "invalid_path", e.body_text()).into())
    }
}

/// The `Idempotency-Key` request header, beside a body's `idempotency_key` (the habit of most
/// notification and payment APIs). Its value may be bare (`k-1`) or a quoted structured-field
/// string (`"k-1"`, as the IETF draft writes it); the key's own rules are the body field's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdempotencyKey(pub Option<String>);

pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_KEY_HEADER) else { return Ok(IdempotencyKey(None)) };
        let invalid = |detail: &str| -> ApiError {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                format!("{IDEMPOTENCY_KEY_HEADER}: {detail}"),
            )
            .with_field(IDEMPOTENCY_KEY_HEADER)
            .into()
        };
        let text = value.to_str().map_err(|_| invalid("must be printable ASCII"))?.trim();
        let key = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(text);
        if key.is_empty() {
            return Err(invalid("must not be empty"));
        }
        Ok(IdempotencyKey(Some(key.to_owned())))
    }
}

impl IdempotencyKey {
    /// The request's key: the header's or the body's, the same when both are given (422 naming
    /// the header when they differ: which one the client meant cannot be known).
    pub fn merge(self, body: Option<String>) -> Result<Option<String>, ApiError> {
        match (self.0, body) {
            (Some(h), Some(b)) if h != b => Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                format!("{IDEMPOTENCY_KEY_HEADER}: differs from the body's idempotency_key"),
            )
            .with_field(IDEMPOTENCY_KEY_HEADER)
            .into()),
            (h, b) => Ok(b.or(h)),
        }
    }
}
