//! Open pixel, click redirect and one-click unsubscribe: no API key, the signed token is the
//! credential. Opens and clicks are recorded after the answer (a spawned task), never making the
//! reader wait.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tidings_core::tracking::{self, Claims, TokenKind};

use crate::extract::PathParams;
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(open, click, unsubscribe_page, unsubscribe))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/t/o/{token}", get(open))
        .route("/t/c/{token}", get(click))
        .route("/u/{token}", get(unsubscribe_page).post(unsubscribe))
}

/// A 1×1 transparent GIF.
const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff,
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x02,
    0x02, 0x44, 0x01, 0x00, 0x3b,
];

fn verify(s: &AppState, kind: TokenKind, token: &str) -> ApiResult<Claims> {
    tracking::verify(&s.deps.config, kind, token, s.deps.clock.now().timestamp()).map_err(|e| {
        Problem::new(StatusCode::NOT_FOUND, "invalid_token", format!("this link is not valid: {e}")).into()
    })
}

/// Records in the background: the answer does not wait for the table.
fn record_later(s: &AppState, claims: Claims) {
    let deps = s.deps.clone();
    tidings_core::roles::spawn_in_role(async move { tracking::record(&deps, &claims).await });
}

/// The open pixel: always a 1×1 GIF; a valid token records an open.
#[utoipa::path(get, path = "/t/o/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 200, description = "A 1×1 GIF", content_type = "image/gif", body = Vec<u8>)))]
async fn open(State(s): State<AppState>, PathParams(token): PathParams<String>) -> Response {
    // A bad token still gets the pixel (an image that fails shows a broken icon); it counts nothing.
    if let Ok(claims) = verify(&s, TokenKind::Open, &token) {
        record_later(&s, claims);
    }
    let mut res = (StatusCode::OK, PIXEL).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/gif"));
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store, max-age=0"));
    res
}

/// A tracked link: records the click and redirects.
#[utoipa::path(get, path = "/t/c/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 302, description = "To the link's target"), (status = 404, description = "Invalid or expired link", body = Problem, content_type = "application/problem+json")))]
async fn click(State(s): State<AppState>, PathParams(token): PathParams<String>) -> ApiResult<Response> {
    let claims = verify(&s, TokenKind::Click, &token)?;
    let Some(url) = claims.url.clone().filter(|u| u.starts_with("https://") || u.starts_with("http://")) else {
        return Err(Problem::new(StatusCode::NOT_FOUND, "invalid_token", "this link has no target").into());
    };
    let location = HeaderValue::from_str(&url)
        .map_err(|_| Problem::new(StatusCode::NOT_FOUND, "invalid_token", "this link has no usable target"))?;
    record_later(&s, claims);
    let mut res = StatusCode::FOUND.into_response();
    res.headers_mut().insert(header::LOCATION, location);
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// GET only shows a confirmation: mail scanners follow links, and must not unsubscribe anyone
/// (RFC 8058 §4). The button posts to the same URL.
#[utoipa::path(get, path = "/u/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 200, description = "A confirmation page", content_type = "text/html", body = String), (status = 404, description = "Invalid or expired link", body = Problem, content_type = "application/problem+json")))]
async fn unsubscribe_page(State(s): State<AppState>, PathParams(token): PathParams<String>) -> ApiResult<Html<String>> {
    verify(&s, TokenKind::Unsubscribe, &token)?;
    Ok(Html(format!(
        "<!doctype html><meta charset=utf-8><title>Unsubscribe</title>\
         <form method=post action=\"/u/{token}\"><p>Stop receiving marketing messages?</p>\
         <button type=submit>Unsubscribe</button></form>"
    )))
}

/// RFC 8058 one-click: `POST` with `List-Unsubscribe=One-Click` (or the form's button).
#[utoipa::path(post, path = "/u/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 200, description = "Unsubscribed", content_type = "text/html", body = String), (status = 404, description = "Invalid or expired link", body = Problem, content_type = "application/problem+json")))]
async fn unsubscribe(
    State(s): State<AppState>,
    PathParams(token): PathParams<String>,
) -> ApiResult<Html<&'static str>> {
    let claims = verify(&s, TokenKind::Unsubscribe, &token)?;
    tracking::unsubscribe(&s.deps, &claims).await?;
    Ok(Html(
        "<!doctype html><meta charset=utf-8><title>Unsubscribed</title><p>You will not receive marketing messages any more.</p>",
    ))
}
