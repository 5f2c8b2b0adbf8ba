//! CORS for the user-token routes (`/v1/me/*`) and nowhere else (docs/site.md, "CORS").
//!
//! A preflight carries no token, so it cannot tell whose allowed origins to read: it is
//! answered for any well-formed origin, with the methods and headers the routes take. What a
//! page can do is decided on the request itself, which carries the token: an `Origin` among
//! the token's tenant's allowed origins gets `Access-Control-Allow-Origin` (and `Vary:
//! Origin`) on the answer; any other `Origin` is refused (403 `origin_not_allowed`, no CORS
//! headers) before the route runs, so a page of another origin neither reads an answer nor
//! changes anything, even with a stolen token. A request without `Origin` (a server, curl) is
//! not a browser's and passes as it is. Every other route answers no CORS headers at all, and
//! its `OPTIONS` stays 405.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tidings_core::site;

use crate::problem::Problem;
use crate::state::AppState;

/// The methods and request headers the `/v1/me` routes take.
pub const ALLOW_METHODS: &str = "GET, PUT, POST";
pub const ALLOW_HEADERS: &str = "Authorization, Content-Type";
/// What a page may read of an answer beyond the CORS-safelisted headers.
pub const EXPOSE_HEADERS: &str = "Retry-After, RateLimit, RateLimit-Policy, X-Request-Id";
/// How long a browser may keep a preflight's answer, in seconds.
pub const MAX_AGE_S: u32 = 600;

/// Whether a path is one of the user-token routes.
pub fn is_user_route(path: &str) -> bool {
    path.strip_prefix("/v1/me").is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn origin_of(headers: &HeaderMap) -> Option<String> {
    headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The middleware (`axum::middleware::from_fn_with_state(state, cors)`).
pub async fn cors(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if !is_user_route(req.uri().path()) {
        return next.run(req).await;
    }
    let origin = origin_of(req.headers());
    if req.method() == Method::OPTIONS {
        return preflight(req.uri().path(), origin.as_deref());
    }
    let Some(origin) = origin else { return vary(next.run(req).await) };
    // The tenant of a token whose signature holds, even expired: its page may read the 401 that
    // tells it to get a new token. A forged token or an API key: no CORS, the route's 401.
    let Some((tenant, _)) = crate::extract::user_token_owner(req.headers(), &state) else {
        return vary(next.run(req).await);
    };
    let allowed = match site::allowed_origins(&state.deps, &tenant).await {
        Ok(list) => list.allows(&origin),
        Err(e) => return vary(crate::problem::ApiError::from(e).into_response()),
    };
    if !allowed {
        let refused = Problem::new(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "this page's origin is not among the shop's allowed origins (PUT /v1/settings/allowed-origins)",
        )
        .with_field("Origin");
        return vary(refused.into_response());
    }
    let mut res = vary(next.run(req).await);
    if let Ok(value) = HeaderValue::from_str(&origin) {
        let h = res.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSE_HEADERS));
    }
    res
}

/// The methods a user-token route takes (its `Allow`): the preferences are read and written, the
/// inbox read, and its other routes posted to.
fn allow_of(path: &str) -> &'static str {
    match path.trim_end_matches('/') {
        "/v1/me/preferences" => "GET, PUT, OPTIONS",
        "/v1/me/inbox" => "GET, OPTIONS",
        _ => "POST, OPTIONS",
    }
}

/// `Vary: Origin`: a cache must not give one origin's answer to another.
fn vary(mut res: Response) -> Response {
    res.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
    res
}

/// The answer to an `OPTIONS` on a user-token route: 204, and for a well-formed `Origin` the
/// CORS answer of the methods and headers the routes take (the request itself is checked
/// against the tenant's list).
fn preflight(path: &str, origin: Option<&str>) -> Response {
    let mut res = StatusCode::NO_CONTENT.into_response();
    let h = res.headers_mut();
    h.insert(header::ALLOW, HeaderValue::from_static(allow_of(path)));
    h.insert(
        header::VARY,
        HeaderValue::from_static("Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
    );
    let Some(origin) = origin.filter(|o| site::parse_origin("Origin", o).is_ok()) else { return res };
    let Ok(value) = HeaderValue::from_str(origin) else { return res };
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(ALLOW_METHODS));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static(ALLOW_HEADERS));
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(MAX_AGE_S));
    res
}
