//! What each Lambda function runs. Every crate under `functions/` is one line calling
//! [`run`] with its [`Function`]: they share this one dependency set, so `sam build` (one
//! `cargo lambda build --bin <fn>` per function) compiles the shared crates once and each
//! function's build after the first only links.
//!
//! Start-up reads only what the function needs: the signing keys (an SSM parameter) only in the
//! functions that sign or verify links and tokens ([`Function::signs`]); a function whose policy
//! in `template.yaml` has no `ssm:GetParameter` never asks for it.

use std::process::ExitCode;
use std::sync::Arc;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tidings_aws::wiring::{AwsPorts, Needs};

/// The functions of `template.yaml`, by their binary names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// The HTTP API behind API Gateway (HTTP API, payload 2.0): the axum router `tidings serve`
    /// serves locally.
    Api,
    /// The table's stream (filtered to new notifications, campaign pages, stock items and inbox
    /// messages) → request queues and live pushes.
    OutboxRelay,
    /// Request queues → per user and channel a delivery record and a channel task.
    Orchestrator,
    /// Channel queues → the providers (SES, SNS), two-phase for transactional messages.
    ChannelWorker,
    /// Every minute: the due timer buckets; from the `timers` queue: each timer (hold expiry,
    /// scheduled and deferred sends, restock waves).
    Tick,
    /// Daily: every SKU's ledger re-summed against its counters; findings recorded for review.
    Reconcile,
    /// Hourly: the back-in-stock safety-net scan; from `stock-events`: stock events and waves.
    RestockScan,
    /// The inbox's live feed behind an API Gateway WebSocket API.
    WsConnections,
}

impl Function {
    pub const ALL: [Function; 8] = [
        Function::Api,
        Function::OutboxRelay,
        Function::Orchestrator,
        Function::ChannelWorker,
        Function::Tick,
        Function::Reconcile,
        Function::RestockScan,
        Function::WsConnections,
    ];

    /// The binary (and crate) name.
    pub fn name(self) -> &'static str {
        match self {
            Function::Api => "api",
            Function::OutboxRelay => "outbox-relay",
            Function::Orchestrator => "orchestrator",
            Function::ChannelWorker => "channel-worker",
            Function::Tick => "tick",
            Function::Reconcile => "reconcile",
            Function::RestockScan => "restock-scan",
            Function::WsConnections => "ws-connections",
        }
    }

    /// Whether the function signs or verifies links and tokens, and so needs the signing keys
    /// and the public URL: the API (inbox tokens, tracking and unsubscribe links it verifies),
    /// the orchestrator and the tick (emails get signed open, click and unsubscribe links when
    /// their channel task is made: the tick makes those of deferred sends), the WebSocket
    /// function (inbox tokens).
    pub fn signs(self) -> bool {
        matches!(self, Function::Api | Function::Orchestrator | Function::Tick | Function::WsConnections)
    }
}

/// Runs `function` until the Lambda runtime stops it. A start-up error is printed and the process
/// exits non-zero, which Lambda reports as an init error.
pub fn run(function: Function) -> ExitCode {
    tidings_lambda::init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, function = function.name(), "no async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(function)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, function = function.name(), "stopped");
            ExitCode::FAILURE
        }
    }
}

async fn serve(function: Function) -> Result<(), lambda_runtime::Error> {
    let needs = Needs { signer: function.signs(), public_url: function.signs() };
    let ports = AwsPorts::from_env(false, &[], needs).await?;
    match function {
        Function::Api => api(ports).await,
        Function::OutboxRelay => outbox_relay(ports).await,
        Function::Orchestrator | Function::ChannelWorker => {
            tidings_lambda::serve_sqs(ports.deps(), ports.queue_prefix().to_owned()).await
        }
        Function::Tick => {
            tidings_lambda::serve_queue_and_schedule(ports.deps(), ports.queue_prefix().to_owned(), |deps| async move {
                let report = tidings_core::timers::tick(&deps).await?;
                Ok(serde_json::to_value(report)?)
            })
            .await
        }
        Function::RestockScan => {
            tidings_lambda::serve_queue_and_schedule(ports.deps(), ports.queue_prefix().to_owned(), |deps| async move {
                let report = tidings_core::restock::scan(&deps).await?;
                tracing::info!(
                    skus = report.skus_checked,
                    queued = report.rounds_queued,
                    expired = report.expired,
                    "scanned"
                );
                Ok(serde_json::to_value(report)?)
            })
            .await
        }
        Function::Reconcile => reconcile(ports).await,
        Function::WsConnections => ws_connections(ports).await,
    }
}

async fn api(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let queue_names: Vec<String> = tidings_lambda::ALL_QUEUES.iter().map(|q| (*q).to_owned()).collect();
    let state =
        tidings_api::AppState { deps: ports.deps(), queue_names: Arc::new(queue_names), dev: None, live: None };
    lambda_http::run(tidings_api::app(state)).await
}

async fn outbox_relay(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let deps = ports.deps();
    let live = ports.live_push_from_env().await;
    lambda_runtime::run(service_fn(|event: LambdaEvent<DynamoDbEvent>| {
        let (deps, live) = (deps.clone(), live.clone());
        async move {
            let response = tidings_lambda::handle_stream_event(&deps, live.as_ref(), event.payload).await;
            tidings_lambda::flush_metrics();
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}

async fn reconcile(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let deps = ports.deps();
    lambda_runtime::run(service_fn(|_event: LambdaEvent<Value>| {
        let deps = deps.clone();
        async move {
            let report = tidings_core::inventory::reconcile(&deps, None).await?;
            tracing::info!(checked = report.checked, discrepancies = report.discrepancies.len(), "reconciled");
            tidings_lambda::flush_metrics();
            Ok::<Value, lambda_runtime::Error>(serde_json::to_value(report)?)
        }
    }))
    .await
}

async fn ws_connections(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
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
