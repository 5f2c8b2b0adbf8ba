//! Open pixel, click redirect and one-click unsubscribe: no API key, the signed token is the
//! credential. An open or a click is queued (one message on the timers queue) before the
//! answer, so nothing is left to run after it: Lambda freezes an environment once it has
//! answered. Beside them, with the tenant's key, the hosts a click may lead to.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tidings_core::tracking::{self, Claims, LinkHosts, LinkHostsInput, TokenKind};
use tracing::warn;

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(open, click, unsubscribe_page, unsubscribe, put_link_hosts, get_link_hosts))]
pub(super) struct Api;

/// The buyers' routes: the open pixel, the click redirect, the unsubscribe page.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/t/o/{token}", get(open))
        .route("/t/c/{token}", get(click))
        .route("/u/{token}", get(unsubscribe_page).post(unsubscribe))
}

/// The shop's setting: the hosts a tracked link may lead to.
pub fn settings_router() -> Router<AppState> {
    Router::new().route("/v1/settings/link-hosts", get(get_link_hosts).put(put_link_hosts))
}

/// Replaces the hosts a tracked link may lead to: `shop.example`, or `*.shop.example` for its
/// subdomains. Links in emails to these hosts are rewritten through `/t/c/…` (click tracking);
/// links to any other host are left as written and go straight there, so Tidings' domain never
/// redirects to a host the shop did not name. A host removed later stops its old links'
/// redirects. Without hosts, no link is tracked.
#[utoipa::path(put, path = "/v1/settings/link-hosts", tag = "tracking", security(("api_key" = [])),
    request_body = LinkHostsInput,
    responses((status = 200, description = "The hosts", body = LinkHosts),
        (status = 422, description = "Not a host name; `field` names it (`hosts[0]`)", body = Problem,
            content_type = "application/problem+json")))]
async fn put_link_hosts(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(input): Body<LinkHostsInput>,
) -> ApiResult<Json<LinkHosts>> {
    Ok(Json(tracking::put_link_hosts(&s.deps, &t, input).await?))
}

/// The hosts a tracked link may lead to (none when never set).
#[utoipa::path(get, path = "/v1/settings/link-hosts", tag = "tracking", security(("api_key" = [])),
    responses((status = 200, description = "The hosts", body = LinkHosts)))]
async fn get_link_hosts(State(s): State<AppState>, Tenant(t): Tenant) -> ApiResult<Json<LinkHosts>> {
    Ok(Json(tracking::link_hosts(&s.deps, &t).await?))
}

/// A 1×1 transparent GIF.
const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff,
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x02,
    0x02, 0x44, 0x01, 0x00, 0x3b,
];

// The pixel's body in the OpenAPI document: binary, not a JSON array of integers, so a
// generated client reads it as bytes.
/// The image's bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // describes the answer's bytes to the document; PIXEL is what is sent
struct Gif(Vec<u8>);

fn verify(s: &AppState, kind: TokenKind, token: &str) -> ApiResult<Claims> {
    tracking::verify(&s.deps.config, kind, token, s.deps.clock.now().timestamp()).map_err(|e| {
        Problem::new(StatusCode::NOT_FOUND, "invalid_token", format!("this link is not valid: {e}")).into()
    })
}

/// Queues the open or click before the answer (one queue send; the timers' handler records
/// it). A queue that cannot be reached loses this one event, never the reader's pixel or
/// redirect: tracking is analytics.
async fn record(s: &AppState, claims: &Claims) {
    if let Err(e) = tracking::queue(&s.deps, claims).await {
        warn!(error = %e, "tracking event not queued");
    }
}

/// The open pixel: always a 1×1 GIF; a valid token records an open.
#[utoipa::path(get, path = "/t/o/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 200, description = "A 1×1 GIF", content_type = "image/gif", body = inline(Gif))))]
async fn open(State(s): State<AppState>, PathParams(token): PathParams<String>) -> Response {
    // A bad token still gets the pixel (an image that fails shows a broken icon); it counts nothing.
    if let Ok(claims) = verify(&s, TokenKind::Open, &token) {
        record(&s, &claims).await;
    }
    let mut res = (StatusCode::OK, PIXEL).into_response();
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/gif"));
    res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store, max-age=0"));
    res
}

/// A tracked link: records the click and redirects.
#[utoipa::path(get, path = "/t/c/{token}", tag = "tracking", params(("token" = String, Path, description = "A signed link token")),
    responses((status = 302, description = "To the link's target, a host the tenant registered"), (status = 404, description = "Invalid or expired link, or its host no longer registered (`link_host_not_allowed`)", body = Problem, content_type = "application/problem+json")))]
async fn click(State(s): State<AppState>, PathParams(token): PathParams<String>) -> ApiResult<Response> {
    let claims = verify(&s, TokenKind::Click, &token)?;
    let Some(url) = claims.url.clone().filter(|u| u.starts_with("https://") || u.starts_with("http://")) else {
        return Err(Problem::new(StatusCode::NOT_FOUND, "invalid_token", "this link has no target").into());
    };
    // Again at the click: the tenant may have removed the host since the mail went out.
    if !tracking::link_hosts(&s.deps, &claims.t).await?.allows(&url) {
        return Err(
            Problem::new(StatusCode::NOT_FOUND, "link_host_not_allowed", "this link's host is not the shop's").into()
        );
    }
    let location = HeaderValue::from_str(&url)
        .map_err(|_| Problem::new(StatusCode::NOT_FOUND, "invalid_token", "this link has no usable target"))?;
    record(&s, &claims).await;
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
