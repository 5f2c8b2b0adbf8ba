//! Extractors: the tenant from the API key, JSON bodies whose errors name the field, and
//! pagination.

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tidings_core::TenantId;
use tidings_core::ops::tenants::{self, Principal};

use crate::problem::{ApiError, Problem};
use crate::state::AppState;

/// Who the request's API key belongs to (`Authorization: Bearer <key>`), or 401 naming the
/// header and what is wrong with it: missing, not a bearer key, or a key that is not valid.
/// Which of unknown, revoked or expired is never said: it would tell a guesser which keys
/// existed (docs/errors.md).
pub async fn principal(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(Problem::unauthorized("no Authorization header: send `Authorization: Bearer <key>`").into());
    };
    let key = bearer_key(value).ok_or_else(|| {
        Problem::unauthorized("Authorization must be `Bearer <key>`: the word Bearer, a space, then the API key")
    })?;
    tenants::authenticate(&state.deps, key).await?.ok_or_else(|| {
        if tidings_core::inbox::live::feed_token_owner(&state.deps, key).is_some() {
            return Problem::unauthorized("a user token opens only /v1/me/* and /v1/ws: this route takes an API key")
                .into();
        }
        Problem::unauthorized(
            "the key is not valid (unknown, revoked or expired): check the key, or ask an operator for a new one",
        )
        .into()
    })
}

/// The key of an `Authorization: Bearer <key>` value (the scheme's case does not matter, RFC
/// 9110, 11.1), if it is one.
fn bearer_key(value: &axum::http::HeaderValue) -> Option<&str> {
    let (scheme, key) = value.to_str().ok()?.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
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
                "this route needs a tenant key: an operator key acts on the system (/v1/ops, /v1/admin), \
                 not on a tenant's data",
            )
            .with_field("Authorization")
            .into()),
        }
    }
}

/// The one user a user token opens (`Authorization: Bearer <token>`, the token of
/// `POST /v1/users/{user_id}/inbox/token`): what the `/v1/me` routes act on, and nothing else.
/// An API key is not a user token (401): `/v1/me` is the user's own, a tenant's key has its
/// `/v1/users/{user_id}` routes (docs/site.md, "User tokens").
#[derive(Clone, Debug)]
pub struct UserToken {
    pub tenant: TenantId,
    pub user_id: String,
}

/// The tenant and user of a user token in `Authorization`, if it is one with a good signature,
/// expired or not (the CORS layer answers an expired token's 401 so that a page can read it).
pub fn user_token_owner(parts_headers: &axum::http::HeaderMap, state: &AppState) -> Option<(TenantId, String)> {
    let key = bearer_key(parts_headers.get(axum::http::header::AUTHORIZATION)?)?;
    tidings_core::inbox::live::feed_token_owner(&state.deps, key)
}

impl<S> FromRequestParts<S> for UserToken
where
    AppState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let state = AppState::from_ref(state);
        let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) else {
            return Err(Problem::unauthorized(
                "no Authorization header: send `Authorization: Bearer <user token>` (from POST /v1/users/{user_id}/inbox/token)",
            )
            .into());
        };
        let token = bearer_key(value).ok_or_else(|| {
            Problem::unauthorized(
                "Authorization must be `Bearer <user token>`: the word Bearer, a space, then the token",
            )
        })?;
        let (tenant, user_id) = tidings_core::inbox::live::verify_feed_token(&state.deps, token).map_err(|e| {
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                format!(
                    "not a valid user token ({e}): /v1/me takes the token of POST /v1/users/{{user_id}}/inbox/token \
                         (an API key does not open it); get a new one from the shop's backend"
                ),
            )
            .with_field("Authorization")
        })?;
        crate::limits::admit_tenant(parts, &tenant).await?;
        Ok(UserToken { tenant, user_id })
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
                "this route needs an operator key (`tidings keys create --role operator`): a tenant key \
                 cannot use it",
            )
            .with_field("Authorization")
            .into()),
        }
    }
}

/// A JSON body. A content type other than JSON is 415 naming `Content-Type`; a body over
/// [`MAX_BODY`] is 413, whatever its size; malformed JSON or a wrong type is 400 naming the line
/// and column, and the field when it is known (docs/errors.md).
pub struct Body<T>(pub T);

/// The largest body accepted.
pub const MAX_BODY: usize = 1 << 20;

impl<S, T> FromRequest<S> for Body<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        json_content_type(req.headers())?;
        // Read here rather than through `Bytes`: its limit is axum's (2 MiB), and its error a
        // text that says nothing of the limit.
        let bytes = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
            Ok(bytes) => bytes,
            Err(e) if over_the_limit(&e) => return Err(too_large().into()),
            Err(e) => {
                return Err(Problem::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("the body could not be read: {e}"),
                )
                .into());
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                "the body is empty: send a JSON object (Content-Type: application/json)",
            )
            .into());
        }
        // Every body is one JSON object. serde would read a JSON array as a struct, field by
        // field in order (`[null, null]`: every field absent, a policy cleared).
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                "the body must be one JSON object (`{ ... }`), not an array or a bare value",
            )
            .into());
        }
        parse_json(&bytes).map(Body)
    }
}

/// The 413 of a body over [`MAX_BODY`].
pub fn too_large() -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "the body is larger than 1 MiB: send less (a batch route takes at most its stated count of items)",
    )
}

/// Whether reading a body failed on its length limit (`http_body_util::Limited`).
fn over_the_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// A body is JSON: `application/json` or a `+json` type (`application/merge-patch+json`). A body
/// without a `Content-Type` is read as JSON too; a form (what `curl -d` sends without `-H`) or
/// any other type is 415 naming the header.
pub fn json_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(axum::http::header::CONTENT_TYPE) else { return Ok(()) };
    let essence = value.to_str().ok().map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase());
    match essence {
        Some(t) if t == "application/json" || (t.starts_with("application/") && t.ends_with("+json")) => Ok(()),
        other => Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body must be JSON: send `Content-Type: application/json` (this request's is {})",
                other.map_or_else(|| "not text".to_owned(), |t| format!("`{t}`"))
            ),
        )
        .with_field("Content-Type")
        .into()),
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

/// A 400 naming the field at `path` (`.` is the body as a whole) when it is known: malformed
/// JSON says its line and column, a missing or unknown field is named with its parent's path.
fn json_problem(path: String, inner: serde_json::Error) -> ApiError {
    // serde_path_to_error writes `?` for a place it could not name (inside malformed JSON).
    let known = (path != "." && !path.contains('?')).then_some(path);
    let message = inner.to_string();
    // serde_json ends its messages with the position; said here in words of our own.
    let reason = match message.rfind(" at line ") {
        Some(i) if inner.line() > 0 => message[..i].to_owned(),
        _ => message.clone(),
    };
    let at = format!("line {}, column {}", inner.line(), inner.column());
    if inner.is_syntax() || inner.is_eof() {
        let mut p = Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("malformed JSON at {at}: {reason}; the body must be one JSON object"),
        );
        if let Some(field) = known {
            p = p.with_field(field);
        }
        return ApiError::from(p);
    }
    // serde_path_to_error's path ends at the parent of a missing field but at an unknown field
    // itself: the name is added only when the path does not end with it already.
    let within = |name: &str| match &known {
        Some(path) if path == name || path.ends_with(&format!(".{name}")) => path.clone(),
        Some(parent) => format!("{parent}.{name}"),
        None => name.to_owned(),
    };
    let named = |prefix: &str| {
        reason.strip_prefix(prefix).and_then(|rest| rest.split('`').next()).filter(|n| !n.is_empty()).map(within)
    };
    let (field, detail) = if let Some(field) = named("missing field `") {
        let detail = format!("{field} is required: add it to the body");
        (Some(field), detail)
    } else if let Some(field) = named("unknown field `") {
        let detail = format!("{field} is not a field of this body ({reason}): remove it or check its spelling");
        (Some(field), detail)
    } else {
        let detail = match &known {
            Some(field) => format!("{field}: {reason} (at {at})"),
            None => format!("{reason} (at {at})"),
        };
        (known, detail)
    };
    let mut p = Problem::new(StatusCode::BAD_REQUEST, "invalid_body", detail);
    if let Some(field) = field {
        p = p.with_field(field);
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
