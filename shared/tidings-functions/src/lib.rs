//! What each Lambda function runs. Every crate under `functions/` is one line calling its
//! entry here ([`api`], [`orchestrator`], ...): they share this one dependency set, so `sam build` (one
//! `cargo lambda build --bin <fn>` per function) compiles the shared crates once and each
//! function's build after the first only links.
//!
//! Start-up wires only what the function uses, and each entry names it: the providers (SES,
//! SNS, End User Messaging) only where it sends ([`AwsPorts::sending`]), SNS's push alone where
//! it registers devices ([`AwsPorts::registering`]),
//! the signing keys (an SSM parameter) only where it signs or verifies links and tokens
//! ([`AwsPorts::signing`]; a function whose policy in `template.yaml` has no
//! `ssm:GetParameter` never asks), live pushes only where they go out. These are calls, not
//! flags: a function that does not make one does not link that client.

use std::process::ExitCode;
use std::sync::Arc;

use aws_lambda_events::apigw::{ApiGatewayProxyResponse, ApiGatewayWebsocketProxyRequest};
use aws_lambda_events::dynamodb::Event as DynamoDbEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;
use tidings_aws::wiring::AwsPorts;
use tidings_core::router::{Handlers, consumers};

/// The functions of `template.yaml`, by their binary names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// The HTTP API behind API Gateway (HTTP API, payload 2.0): the shop's routes of the axum
    /// router `tidings serve` serves locally, but for the commerce and message routes.
    Api,
    /// The stock and order routes of the same HTTP API, behind their own API Gateway routes.
    CommerceApi,
    /// The template, notification and workflow routes of the same HTTP API.
    MessagesApi,
    /// The buyers' routes of the same HTTP API (tracking, unsubscribe, the preferences page,
    /// `/v1/me`, the site elements), behind their own API Gateway routes.
    PublicApi,
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
    /// The binary (and crate) name.
    pub fn name(self) -> &'static str {
        match self {
            Function::Api => "api",
            Function::CommerceApi => tidings_core::roles::COMMERCE_API,
            Function::MessagesApi => tidings_core::roles::MESSAGES_API,
            Function::PublicApi => tidings_core::roles::PUBLIC_API,
            Function::OutboxRelay => "outbox-relay",
            Function::Orchestrator => "orchestrator",
            Function::ChannelWorker => "channel-worker",
            Function::Tick => "tick",
            Function::Reconcile => "reconcile",
            Function::RestockScan => "restock-scan",
            Function::WsConnections => "ws-connections",
        }
    }
}

/// Runs `function` until the Lambda runtime stops it: `serve` gets the table and the queues
/// and wires what else it uses. A start-up error is printed and the process exits non-zero,
/// which Lambda reports as an init error.
///
/// Each function's `main` calls its own entry below ([`api`], [`outbox_relay`], ...) rather
/// than one `match` on [`Function`]: the linker then keeps only the code that function can
/// reach (the channel worker has no HTTP router, the relay no template engine), which is most
/// of each binary's size.
fn run<F, Fut>(function: Function, serve: F) -> ExitCode
where
    F: FnOnce(AwsPorts) -> Fut,
    Fut: std::future::Future<Output = Result<(), lambda_runtime::Error>>,
{
    tidings_lambda::init_tracing();
    tidings_lambda::init_metrics(function.name());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, function = function.name(), "no async runtime");
            return ExitCode::FAILURE;
        }
    };
    // Every `TIDINGS_*` variable is checked once, here: a malformed one stops the start, naming
    // it (Lambda reports an init error), rather than leaving its setting on a default.
    let settings = match tidings_core::config::Settings::from_vars(std::env::vars()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, variable = %e.var, function = function.name(), "malformed setting");
            return ExitCode::FAILURE;
        }
    };
    settings.warn_unknown();
    let started = runtime.block_on(async move {
        let ports = AwsPorts::connect_in_lambda(&settings)?;
        serve(ports).await
    });
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, function = function.name(), "stopped");
            ExitCode::FAILURE
        }
    }
}

/// The `api` function.
///
/// It signs the inbox's user tokens and registers push devices with the provider (SNS), which
/// also deletes a dead push endpoint a push-service callback names; it sends nothing.
pub fn api() -> ExitCode {
    run(Function::Api, |ports| async move {
        serve_http(ports.signing().await?.registering(), tidings_api::deployed_app).await
    })
}

/// The `commerce-api` function: stock and orders.
///
/// It signs nothing, registers no device and sends nothing: the table and the queues (an
/// order's hold schedules its expiry on the timers queue).
pub fn commerce_api() -> ExitCode {
    run(Function::CommerceApi, |ports| async move { serve_http(ports, tidings_api::commerce_app).await })
}

/// The `messages-api` function: templates, notifications and workflows.
///
/// It signs nothing (the orchestrator signs a message's links when it makes its channel task),
/// registers no device and sends nothing: the table and the queues.
pub fn messages_api() -> ExitCode {
    run(Function::MessagesApi, |ports| async move { serve_http(ports, tidings_api::messages_app).await })
}

/// The `public-api` function: the buyers' routes, which need no API key.
///
/// It verifies links and tokens (signing keys) and holds no provider: it registers no device
/// and sends nothing.
pub fn public_api() -> ExitCode {
    run(Function::PublicApi, |ports| async move { serve_http(ports.signing().await?, tidings_api::public_app).await })
}

/// The `outbox-relay` function: the table, the queues and live pushes.
pub fn outbox_relay() -> ExitCode {
    run(Function::OutboxRelay, serve_outbox_relay)
}

/// The lanes, for a function's `main` to name the ones it serves ([`serve_lanes`]).
pub mod lanes {
    pub use tidings_core::lanes::{Lane, Urgency};
    pub use tidings_core::notify::model::Priority;
    pub use tidings_core::ports::Channel;
}

/// Runs `function` on the queue lanes it serves (the orchestrator, the channel worker): each
/// record goes to its lane's handler; a record of a lane not in `lanes` is refused to its DLQ
/// with the reason. A lane whose consumer is another function is a wiring error: the start
/// fails, naming it.
///
/// The orchestrator signs (emails get signed open, click and unsubscribe links when their
/// channel task is made); the channel worker sends, and removes dead push tokens at the
/// provider. Each links only its lanes' handlers ([`consumers`]), so only the channel worker
/// reaches a provider and only it has them.
pub fn orchestrator(lanes: &'static [lanes::Lane]) -> ExitCode {
    serve_lanes::<consumers::Orchestrator, _, _>(
        Function::Orchestrator,
        lanes,
        |ports| async move { ports.signing().await },
    )
}

/// The `channel-worker` function on `lanes` (see [`orchestrator`]).
pub fn channel_worker(lanes: &'static [lanes::Lane]) -> ExitCode {
    serve_lanes::<consumers::ChannelWorker, _, _>(
        Function::ChannelWorker,
        lanes,
        |ports| async move { Ok(ports.sending()) },
    )
}

fn serve_lanes<H: Handlers, W, Fut>(function: Function, lanes: &'static [lanes::Lane], wire: W) -> ExitCode
where
    W: FnOnce(AwsPorts) -> Fut,
    Fut: std::future::Future<Output = Result<AwsPorts, tidings_aws::wiring::WiringError>>,
{
    if let Some(lane) = lanes.iter().find(|l| l.consumer() != Some(function.name())) {
        refuse_lane(function, lane);
        return ExitCode::FAILURE;
    }
    run(function, move |ports| async move {
        let ports = wire(ports).await?;
        tidings_lambda::serve_lanes::<H>(ports.deps(), ports.queue_prefix().to_owned(), lanes).await
    })
}

/// Says, before tracing is set up, that `function` was given a lane it does not consume.
fn refuse_lane(function: Function, lane: &lanes::Lane) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{} is not the consumer of lane {lane}", function.name());
    }
}

/// The `tick` function. It signs: it makes the channel tasks of deferred sends, and their
/// emails' links. It sends nothing itself (the channel worker does).
pub fn tick() -> ExitCode {
    run(Function::Tick, |ports| async move {
        let ports = ports.signing().await?;
        let prefix = ports.queue_prefix().to_owned();
        tidings_lambda::serve_queue_and_schedule::<consumers::Tick, _, _>(ports.deps(), prefix, |deps| async move {
            Ok(tidings_core::schedules::every_minute(&deps).await?)
        })
        .await
    })
}

/// The `restock-scan` function: the table and the queues; it sends nothing itself.
pub fn restock_scan() -> ExitCode {
    run(Function::RestockScan, |ports| async move {
        let prefix = ports.queue_prefix().to_owned();
        tidings_lambda::serve_queue_and_schedule::<consumers::RestockScan, _, _>(
            ports.deps(),
            prefix,
            |deps| async move {
                let report = tidings_core::restock::scan(&deps).await?;
                tracing::info!(
                    skus = report.skus_checked,
                    queued = report.rounds_queued,
                    expired = report.expired,
                    "scanned"
                );
                Ok(serde_json::to_value(report)?)
            },
        )
        .await
    })
}

/// The `reconcile` function: the table and the queues only.
pub fn reconcile() -> ExitCode {
    run(Function::Reconcile, serve_reconcile)
}

/// The `ws-connections` function. It verifies the inbox's tokens, and pushes what a client
/// missed.
pub fn ws_connections() -> ExitCode {
    run(Function::WsConnections, |ports| async move { serve_ws_connections(ports.signing().await?).await })
}

/// Serves `app`'s routes (the [`api`]'s, the [`commerce_api`]'s, the [`messages_api`]'s or the
/// [`public_api`]'s) to API Gateway.
async fn serve_http<A>(ports: AwsPorts, app: A) -> Result<(), lambda_runtime::Error>
where
    A: FnOnce(tidings_api::AppState, Arc<tidings_core::gates::api::ApiLimits>) -> axum::Router,
{
    let queue_names: Vec<String> = tidings_lambda::ALL_QUEUES.iter().map(|q| (*q).to_owned()).collect();
    let state = tidings_api::AppState::new(tidings_api::AppParts {
        deps: ports.deps(),
        queue_names: Arc::new(queue_names),
        dev: None,
        live: None,
    });
    // The rate buckets live in the table: shared by every instance of the function.
    let rates = ports.config.api_rates.clone();
    let limits = Arc::new(tidings_core::gates::api::ApiLimits::new(
        rates,
        tidings_core::gates::GateStore::Shared(ports.table.clone()),
    ));
    let app = app(state, limits).layer(axum::middleware::map_request(source_ip));
    lambda_http::run(lambda_http::service_fn(move |req: lambda_http::Request| {
        use lambda_http::Service;
        // The router is always ready (axum's `Router::poll_ready`), and never fails.
        let answer = app.clone().call(req);
        async move {
            match answer.await {
                Ok(res) => Ok::<_, lambda_http::Error>(Answer(res)),
                Err(never) => match never {},
            }
        }
    }))
    .await
}

/// An answer of the router as API Gateway takes it: the body whole, as text when it is UTF-8
/// (API Gateway passes it on as it is) and as base64 when it is not (gzipped files).
///
/// `lambda_http`'s own conversion (`impl IntoResponse for Response<B>`) picks text or binary by
/// the content type and decodes text in the charset the type names through `encoding_rs`,
/// whose tables were 0.28 MB of this function for charsets this API never answers in (every
/// text it writes is UTF-8), and it panics on a body that fails to be read, where this answers
/// the problem of a 500.
struct Answer(axum::response::Response);

impl lambda_http::IntoResponse for Answer {
    fn into_response(
        self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = lambda_http::Response<lambda_http::Body>> + Send>> {
        let (parts, body) = self.0.into_parts();
        Box::pin(async move {
            match axum::body::to_bytes(body, usize::MAX).await {
                // The buffer itself when the body was one piece (no copy).
                Ok(bytes) => lambda_http::Response::from_parts(parts, lambda_body(Vec::from(bytes))),
                Err(e) => {
                    tracing::error!(error = %e, "the answer's body could not be read");
                    let (head, body) = tidings_api::problem::Problem::new(
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "the answer could not be written: try again",
                    )
                    .into_head_and_body();
                    lambda_http::Response::from_parts(head, lambda_body(body))
                }
            }
        })
    }
}

fn lambda_body(bytes: Vec<u8>) -> lambda_http::Body {
    if bytes.is_empty() {
        return lambda_http::Body::Empty;
    }
    match String::from_utf8(bytes) {
        Ok(text) => lambda_http::Body::Text(text),
        Err(e) => lambda_http::Body::Binary(e.into_bytes()),
    }
}

/// The client's address as API Gateway saw it (`requestContext.http.sourceIp`), for the public
/// routes' rate limits, and API Gateway's id of the request (`requestContext.requestId`), the
/// answer's `x-request-id` when the client sent none (docs/errors.md).
async fn source_ip(mut req: axum::extract::Request) -> axum::extract::Request {
    use lambda_http::RequestExt;
    let (ip, request_id) = match req.request_context_ref() {
        Some(lambda_http::request::RequestContext::ApiGatewayV2(c)) => {
            (c.http.source_ip.as_deref().and_then(|s| s.parse::<std::net::IpAddr>().ok()), c.request_id.clone())
        }
        _ => (None, None),
    };
    if let Some(ip) = ip {
        req.extensions_mut().insert(tidings_api::limits::ClientIp(ip));
    }
    if let Some(id) = request_id {
        req.extensions_mut().insert(tidings_api::request_id::GatewayRequestId(id));
    }
    req
}

async fn serve_outbox_relay(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let deps = ports.deps();
    let live = ports.live_push().await;
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

async fn serve_reconcile(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let deps = ports.deps();
    lambda_runtime::run(service_fn(|_event: LambdaEvent<Value>| {
        let deps = deps.clone();
        async move {
            let report = tidings_core::inventory::reconcile(&deps, None).await?;
            tracing::info!(
                checked = report.checked,
                discrepancies = report.discrepancies.len(),
                opened = report.opened,
                "reconciled"
            );
            tidings_lambda::flush_metrics();
            Ok::<Value, lambda_runtime::Error>(serde_json::to_value(report)?)
        }
    }))
    .await
}

async fn serve_ws_connections(ports: AwsPorts) -> Result<(), lambda_runtime::Error> {
    let deps = ports.deps();
    let live = ports.live_push().await;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    /// Every answer reaches API Gateway with its bytes as they were written: UTF-8 as text
    /// (JSON, problems, HTML whatever their type says), anything else (a gzipped file) as
    /// binary, which lambda_http sends base64-encoded; no body, no body.
    #[tokio::test]
    async fn answers_go_to_api_gateway_as_written() {
        use axum::response::IntoResponse;
        use lambda_http::{Body, IntoResponse as _};
        let gzipped: &[u8] = &[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe];
        let cases = [
            (
                (axum::http::StatusCode::CREATED, axum::Json(serde_json::json!({"é": "ü"}))).into_response(),
                Body::Text(r#"{"é":"ü"}"#.into()),
            ),
            (
                ([("content-type", "text/html; charset=windows-1252")], "<p>ok</p>").into_response(),
                Body::Text("<p>ok</p>".into()),
            ),
            (
                ([("content-type", "application/json"), ("content-encoding", "gzip")], gzipped).into_response(),
                Body::Binary(gzipped.to_vec()),
            ),
            (
                ([("content-type", "application/octet-stream")], "plain bytes").into_response(),
                Body::Text("plain bytes".into()),
            ),
            (axum::http::StatusCode::NO_CONTENT.into_response(), Body::Empty),
        ];
        for (res, body) in cases {
            let status = res.status();
            let answered = super::Answer(res).into_response().await;
            assert_eq!(answered.status(), status);
            assert_eq!(answered.body(), &body, "{status}");
        }
    }

    /// A body that fails while it is read (a stream cut off) is no panic and no empty 200: API
    /// Gateway gets the problem of a 500, whole, with its content type.
    #[tokio::test]
    async fn a_body_that_cannot_be_read_is_answered_with_a_problem() {
        use lambda_http::{Body, IntoResponse as _};
        let cut = futures::stream::iter([
            Ok(axum::body::Bytes::from_static(b"{\"half\":")),
            Err(std::io::Error::other("cut off")),
        ]);
        let res = axum::http::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(axum::body::Body::from_stream(cut))
            .unwrap();
        let answered = super::Answer(res).into_response().await;
        assert_eq!(answered.status(), 500);
        assert_eq!(answered.headers()["content-type"], "application/problem+json");
        let Body::Text(text) = answered.body() else { panic!("{:?}", answered.body()) };
        let problem: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!((problem["status"].as_u64(), problem["code"].as_str()), (Some(500), Some("internal")), "{problem}");
    }

    /// The public routes' limits key on the address API Gateway saw, from the event itself.
    #[tokio::test]
    async fn the_client_address_is_api_gateways_source_ip() {
        let event = include_str!("../../tidings-api/tests/fixtures/apigw-v2-put-user.json");
        let req = lambda_http::request::from_str(event).unwrap().map(axum::body::Body::new);
        let req = super::source_ip(req).await;
        let ip = req.extensions().get::<tidings_api::limits::ClientIp>().unwrap();
        assert_eq!(ip.0, "203.0.113.7".parse::<std::net::IpAddr>().unwrap());
        let id = req.extensions().get::<tidings_api::request_id::GatewayRequestId>().unwrap();
        assert_eq!(id.0, serde_json::from_str::<serde_json::Value>(event).unwrap()["requestContext"]["requestId"]);
    }
}
