//! The `tick` function: every minute (EventBridge) it fires the due minute buckets of timers;
//! from the `timers` queue it runs each timer (hold expiry, ...). Partial batch failures are
//! reported.

use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    tidings_lambda::serve_queue_and_schedule(ports.deps(), ports.queue_prefix().to_owned(), |deps| async move {
        let report = tidings_core::timers::tick(&deps).await?;
        Ok(serde_json::to_value(report)?)
    })
    .await
}
