//! The `ws-connections` function: the API Gateway WebSocket API of the inbox's live feed.
//! `$connect` checks the short-lived signed token (`?token=`, from
//! `POST /v1/users/{id}/inbox/token`) and remembers the connection for its user with a TTL;
//! `$disconnect` forgets it; `$default` answers `{"type":"since","message_id":...}` with what the
//! client missed. Pushes of new messages come from the outbox-relay (the inbox's stream).

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use lambda_runtime::{LambdaEvent, service_fn};
use tidings_aws::wiring::AwsPorts;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tidings_lambda::init_tracing();
    let ports = AwsPorts::from_env(false, &[]).await?;
    let deps = ports.deps();
    let live = ports.live_push_from_env().await;
    lambda_runtime::run(service_fn(|event: LambdaEvent<ApiGatewayWebsocketProxyRequest>| {
        let (deps, live) = (deps.clone(), live.clone());
        async move {
            let status = tidings_lambda::ws::handle(&deps, live.as_ref(), &event.payload).await;
            let mut response = ApiGatewayProxyResponse::default();
            response.status_code = i64::from(status);
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
