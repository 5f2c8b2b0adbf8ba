//! The `restock-scan` function (seed 000 §2). Two triggers:
//! - on its EventBridge schedule, the safety-net scan: every SKU with stock and WAITING
//!   subscribers gets its current round queued (same `batch_no` as the event: sent once), and
//!   WAITING subscriptions past the maximum age expire;
//! - from the `stock-events` queue, upstream `stock.in` events (applied as adjustments) and
//!   round jobs (the waves of a round). Partial batch failures are reported.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    let deps = ports.deps();
    let prefix = ports.queue_prefix().to_owned();
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let (deps, prefix) = (deps.clone(), prefix.clone());
        async move {
            // One function, two triggers: an SQS batch has `Records`; a schedule does not.
            if event.payload.get("Records").is_some() {
                let batch: SqsEvent = serde_json::from_value(event.payload)?;
                let response = tidings_lambda::handle_sqs_batch(&deps, &prefix, batch).await;
                return Ok::<Value, lambda_runtime::Error>(serde_json::to_value(response)?);
            }
            let report = tidings_core::restock::scan(&deps).await?;
            tracing::info!(
                skus = report.skus_checked,
                queued = report.rounds_queued,
                expired = report.expired,
                "scanned"
            );
            Ok(serde_json::to_value(report)?)
        }
    }))
    .await
}
