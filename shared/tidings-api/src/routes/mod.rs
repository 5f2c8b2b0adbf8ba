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
/// serve` runs.
pub fn app_with_limits(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    let mut router = routes();
    if state.dev.is_some() {
        router = router.merge(dev::router()).merge(console::router());
    }
    finish(router, state, limits)
}

/// What a deployment serves (the `api` function): the API behind its rate limits, never the
/// development hooks or the console, whatever the state holds. A choice made by the caller, not
/// read from the state, so that the function does not link them (their handlers and the
/// console's page and scripts).
pub fn deployed_app(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    finish(routes(), state, limits)
}

/// Every route of the API proper.
fn routes() -> Router<AppState> {
    Router::new()
        .merge(openapi::router())
        .merge(elements::router())
        .merge(users::router())
        .merge(preferences::router())
        .merge(devices::router())
        .merge(callbacks::router())
        .merge(tracking::router())
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
        .merge(me::router())
        .merge(site::router())
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
