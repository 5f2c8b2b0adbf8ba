//! The `api` function: the Tidings HTTP API behind API Gateway (HTTP API, payload 2.0). The
//! same axum router `tidings serve` serves locally.

use std::sync::Arc;

use tidings_api::AppState;
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    tidings_lambda::init_tracing();
    let queue_names: Vec<String> = tidings_lambda::ALL_QUEUES.iter().map(|q| (*q).to_owned()).collect();
    let ports = AwsPorts::from_env(false, &queue_names).await?;
    let state = AppState { deps: ports.deps(), queue_names: Arc::new(queue_names), dev: None, live: None };
    lambda_http::run(tidings_api::app(state)).await
}
