//! The `outbox-relay` function: the table's stream (filtered to new notifications and stock
//! items) → request queues. Partial failures are reported so the batch is retried and bisected.

use aws_lambda_events::dynamodb::Event;
use lambda_runtime::{LambdaEvent, service_fn};
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    let deps = ports.deps();
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        let deps = deps.clone();
        async move { Ok::<_, lambda_runtime::Error>(tidings_lambda::handle_stream_event(&deps, event.payload).await) }
    }))
    .await
}
