//! The routes, one module per resource.

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use tidings_core::roles;

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
/// serve` runs, every function's routes in one router.
pub fn app_with_limits(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    // On Lambda these routes are other functions': what they call is counted as theirs.
    let as_function = |function: &'static str, routes: Router<AppState>| {
        routes.layer(axum::middleware::from_fn(move |req, next: axum::middleware::Next| {
            roles::acting_as(function, next.run(req))
        }))
    };
    let mut router = shop_routes()
        .merge(as_function(roles::COMMERCE_API, commerce_routes()))
        .merge(as_function(roles::MESSAGES_API, message_routes()))
        .merge(as_function(roles::PUBLIC_API, public_routes()));
    if state.dev.is_some() {
        router = router.merge(dev::router()).merge(console::router());
    }
    finish(router, state, limits)
}

// What each HTTP function of `template.yaml` serves. Each is a choice made by the caller, not
// read from the state, so that a function links only its own routes' handlers (and never the
// development hooks or the console, whatever the state holds); API Gateway sends each path to
// the function that has it (`template.yaml`'s `HttpApi` events; the gateway test of
// `tests/e2e/lambda` sends every path of the reference through them).

/// What the `api` function serves: the shop's routes for its users, their preferences, devices
/// and inboxes, its settings, keys, webhooks and operations, the providers' callbacks and the
/// reference, every one but the reference behind an API key, all behind the rate limits.
pub fn deployed_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(shop_routes(), state, limits)
}

/// What the `commerce-api` function serves: stock (locations, inventory, adjustments, incoming
/// stock, the ledger), orders and their holds, stock subscriptions and events, restock notices
/// and analytics, reconciliation and its findings. It signs nothing and holds no provider.
pub fn commerce_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(commerce_routes(), state, limits)
}

/// What the `messages-api` function serves: templates and their previews, notifications
/// (sends, campaigns, their deliveries, cancels and workflow runs) and workflows. It signs
/// nothing (the orchestrator signs a message's links) and holds no provider.
pub fn messages_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(message_routes(), state, limits)
}

/// What the `public-api` function serves: the routes a buyer's browser or mail client and the
/// shop's own pages reach without an API key (the signed token or the user token is the
/// credential): tracking, unsubscribe, the preferences page, `/v1/me` and the site elements'
/// script. It holds none of the shop's rights (keys, redrives, devices, providers). The
/// providers' callbacks stay with the `api`, which has SNS (a dead push endpoint is deleted
/// there).
pub fn public_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(public_routes(), state, limits)
}

/// The `api` function's routes ([`deployed_app`]).
fn shop_routes() -> Router<AppState> {
    Router::new()
        .merge(openapi::router())
        .merge(callbacks::router())
        .merge(users::router())
        .merge(preferences::router())
        .merge(devices::router())
        .merge(tracking::settings_router())
        .merge(site::settings_router())
        .merge(inbox::router())
        .merge(live::router())
        .merge(ops::router())
        .merge(admin::router())
        .merge(webhooks::router())
}

/// The `commerce-api` function's routes ([`commerce_app`]).
fn commerce_routes() -> Router<AppState> {
    Router::new().merge(inventory::router()).merge(restock::router())
}

/// The `messages-api` function's routes ([`messages_app`]).
fn message_routes() -> Router<AppState> {
    Router::new().merge(templates::router()).merge(notifications::router()).merge(workflows::router())
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
