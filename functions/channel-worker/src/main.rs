//! The `channel-worker` function: channel queues → the provider (SES, SNS), two-phase for transactional messages.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    tidings_lambda::serve_sqs(ports.deps(), ports.queue_prefix().to_owned()).await
}
