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
    let live = ports.live_push_from_env().await;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
        let (deps, live) = (deps.clone(), live.clone());
        async move {
            let response = tidings_lambda::handle_stream_event(&deps, live.as_ref(), event.payload).await;
            tidings_lambda::flush_metrics();
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
