//! The Tidings HTTP API (its contract is the committed `openapi.json`; docs/http-api.md, "API reference"):
//! one axum router, served by `lambda_http` in the `api` Lambda function and by `axum::serve` in
//! `tidings serve`.

pub mod cors;
pub mod extract;
pub mod limits;
pub mod problem;
pub mod request_id;
pub mod routes;
pub mod state;
#[cfg(test)]
mod test_support;

pub use routes::openapi::document as openapi;
pub use routes::{app, app_with_limits, commerce_app, deployed_app, messages_app, public_app};
pub use state::{AppParts, AppState, DevControl};
