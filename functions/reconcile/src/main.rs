//! The `reconcile` function: daily (EventBridge), re-sums every SKU's ledger against its
//! counters and records each discrepancy for review (a table item and the `inventory-review`
//! queue); nothing is silently fixed.

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    let deps = ports.deps();
    lambda_runtime::run(service_fn(|_event: LambdaEvent<Value>| {
        let deps = deps.clone();
        async move {
            let report = tidings_core::inventory::reconcile(&deps, None).await?;
            tracing::info!(checked = report.checked, discrepancies = report.discrepancies.len(), "reconciled");
            Ok::<Value, lambda_runtime::Error>(serde_json::to_value(report)?)
        }
    }))
    .await
}
