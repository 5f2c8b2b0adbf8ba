//! The `orchestrator` function: request queues → per user and channel: a delivery record and a channel task.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    let deps = ports.deps();
    let prefix = ports.queue_prefix().to_owned();
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let (deps, prefix) = (deps.clone(), prefix.clone());
        async move { Ok::<_, lambda_runtime::Error>(tidings_lambda::handle_sqs_batch(&deps, &prefix, event.payload).await) }
    }))
    .await
}
