//! The routes, one module per resource.

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use crate::problem::Problem;
use crate::state::AppState;

mod callbacks;
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

/// The whole API.
pub fn app(state: AppState) -> Router {
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
        .merge(ops::router());
    if state.dev.is_some() {
        router = router.merge(dev::router());
    }
    router
        .fallback(|| async { Problem::new(StatusCode::NOT_FOUND, "no_route", "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
                .into_response()
        })
        .with_state(state)
}
