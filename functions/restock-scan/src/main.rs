//! The `restock-scan` function (seed 000 §2). Two triggers:
//! - on its EventBridge schedule, the safety-net scan: every SKU with stock and WAITING
//!   subscribers gets its current round queued (same `batch_no` as the event: sent once), and
//!   WAITING subscriptions past the maximum age expire;
//! - from the `stock-events` queue, upstream `stock.in` events (applied as adjustments) and
//!   round jobs (the waves of a round). Partial batch failures are reported.

use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    tidings_lambda::serve_queue_and_schedule(ports.deps(), ports.queue_prefix().to_owned(), |deps| async move {
        let report = tidings_core::restock::scan(&deps).await?;
        tracing::info!(skus = report.skus_checked, queued = report.rounds_queued, expired = report.expired, "scanned");
        Ok(serde_json::to_value(report)?)
    })
    .await
}
