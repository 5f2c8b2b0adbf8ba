//! The routes, one module per resource.

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::problem::Problem;
use crate::state::AppState;

mod admin;
mod callbacks;
mod console;
mod dev;
mod devices;
mod elements;
#[cfg(test)]
mod errors_tests;
#[cfg(test)]
mod examples_tests;
mod inbox;
mod inventory;
pub mod live;
mod me;
mod notifications;
pub mod openapi;
mod ops;
mod preferences;
mod restock;
mod site;
mod templates;
mod tracking;
mod users;
mod webhooks;
mod workflows;

/// The whole API, without rate limits (tests that call the router directly).
pub fn app(state: AppState) -> Router {
    app_with_limits(state, std::sync::Arc::new(tidings_core::gates::api::ApiLimits::off()))
}

/// The whole API behind its rate limits (`crate::limits`), with the local-development hooks
/// (`/dev/*`) and the console when the state has them (`tidings serve --dev`): what `tidings
/// serve` runs, the shop's routes and the buyers' in one router.
pub fn app_with_limits(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    // On Lambda the buyers' routes are another function's: what they call is counted as its.
    let public = public_routes().layer(axum::middleware::from_fn(|req, next: axum::middleware::Next| {
        tidings_core::roles::acting_as("public-api", next.run(req))
    }));
    let mut router = shop_routes().merge(public);
    if state.dev.is_some() {
        router = router.merge(dev::router()).merge(console::router());
    }
    finish(router, state, limits)
}

/// What the `api` function serves: the shop's routes (every one behind an API key, and the
/// reference) behind the rate limits, never the development hooks or the console, whatever the
/// state holds. A choice made by the caller, not read from the state, so that the function does
/// not link them (their handlers and the console's page and scripts), nor the buyers' routes,
/// which API Gateway sends to the `public-api` function ([`public_app`]).
pub fn deployed_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(shop_routes(), state, limits)
}

/// What the `public-api` function serves: the routes a buyer's browser or mail client and the
/// shop's own pages reach without an API key (the signed token or the user token is the
/// credential): tracking, unsubscribe, the preferences page, `/v1/me` and the site elements'
/// script. Their own function, behind their own API Gateway routes (`template.yaml`), holds none
/// of the shop's rights (keys, redrives, devices, providers) and starts smaller. The providers'
/// callbacks stay with the `api`, which has SNS (a dead push endpoint is deleted there).
pub fn public_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(public_routes(), state, limits)
}

/// The shop's routes, the providers' callbacks and the reference.
fn shop_routes() -> Router<AppState> {
    Router::new()
        .merge(openapi::router())
        .merge(callbacks::router())
        .merge(users::router())
        .merge(preferences::router())
        .merge(devices::router())
        .merge(tracking::settings_router())
        .merge(site::settings_router())
        .merge(templates::router())
        .merge(notifications::router())
        .merge(inbox::router())
        .merge(live::router())
        .merge(inventory::router())
        .merge(restock::router())
        .merge(ops::router())
        .merge(admin::router())
        .merge(webhooks::router())
        .merge(workflows::router())
}

/// The buyers' routes ([`public_app`]).
fn public_routes() -> Router<AppState> {
    Router::new().merge(elements::router()).merge(tracking::router()).merge(me::router()).merge(site::router())
}

/// The fallbacks and the layers every request passes.
fn finish(
    router: Router<AppState>,
    state: AppState,
    limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>,
) -> Router {
    router
        .fallback(|uri: axum::http::Uri| async move { no_route(uri.path()) })
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
                .into_response()
        })
        .layer(axum::middleware::from_fn_with_state(limits, crate::limits::limit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::cors::cors))
        .layer(axum::middleware::from_fn(crate::request_id::request_id))
        .with_state(state)
}

/// The 404 of a path no route has. A path that is a route but for a trailing slash names the
/// route (a problem rather than a redirect: a client should fix its URL, and a redirected
/// `POST` loses its body in many clients; docs/errors.md).
fn no_route(path: &str) -> Problem {
    let trimmed = path.trim_end_matches('/');
    if path.ends_with('/') && !trimmed.is_empty() && is_route(trimmed) {
        return Problem::new(
            StatusCode::NOT_FOUND,
            "no_route",
            format!("no such route: routes have no trailing slash, use `{trimmed}`"),
        );
    }
    Problem::new(StatusCode::NOT_FOUND, "no_route", "no such route: the routes are listed at /openapi.json and /docs")
}

/// Whether `path` matches a path of the OpenAPI document (`{param}` matches one segment).
fn is_route(path: &str) -> bool {
    static TEMPLATES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let templates = TEMPLATES.get_or_init(openapi::served_paths);
    let segments: Vec<&str> = path.split('/').collect();
    templates.iter().any(|t| {
        let parts: Vec<&str> = t.split('/').collect();
        parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(p, s)| p == s || (p.starts_with('{') && p.ends_with('}') && !s.is_empty()))
    })
}
