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
mod inbox;
mod inventory;
pub mod live;
mod notifications;
pub mod openapi;
mod ops;
mod preferences;
mod restock;
mod templates;
mod tracking;
mod users;
mod webhooks;

/// The whole API, without rate limits (tests that call the router directly).
pub fn app(state: AppState) -> Router {
    app_with_limits(state, std::sync::Arc::new(tidings_core::gates::api::ApiLimits::off()))
}

/// The whole API behind its rate limits (`crate::limits`): what `tidings serve` and the `api`
/// function run.
pub fn app_with_limits(state: AppState, limits: std::sync::Arc<tidings_core::gates::api::ApiLimits>) -> Router {
    let mut router = Router::new()
        .merge(openapi::router())
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
        .merge(webhooks::router());
    if state.dev.is_some() {
        router = router.merge(dev::router()).merge(console::router());
    }
    router
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, "no_route", "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
                .into_response()
        })
        .layer(axum::middleware::from_fn_with_state(limits, crate::limits::limit))
        .with_state(state)
}
