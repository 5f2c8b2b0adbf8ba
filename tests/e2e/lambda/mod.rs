//! The shape that ships, run here: each function of `template.yaml` is its `sam build` binary
//! (`.aws-sam/build/<Function>/bootstrap`) in processes of its own under a Lambda Runtime API,
//! with the environment and the policy the template gives it; the table, queues and parameters
//! the template names are made in the emulators (DynamoDB Local, moto); the harness plays the
//! event source mappings, the schedules, API Gateway, SNS's https subscriptions and SES's event
//! publishing from what the template declares.
//!
//! The harness adds to a function's environment only what a deployed function gets from AWS
//! itself: the Runtime API and `AWS_LAMBDA_*` variables, the region, credentials (one access key
//! per function, so the IAM proxy knows the caller), `AWS_EC2_METADATA_DISABLED`, the
//! endpoints (every AWS request goes through [`proxy`], which enforces the function's policy),
//! and the certificate SNS signs its messages with (on AWS fetched from SNS's own host).

pub mod gateway;
pub mod proxy;
pub mod runtime;
pub mod sns;
pub mod sources;
pub mod template;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tokio::sync::watch;

use self::runtime::{Binaries, Function};
use self::sources::Dynamo;
use self::template::{REGION, Source, StackSpec};

/// What SNS's delivery of one message answered, per https subscription: (endpoint, status, body).
pub type Delivered = Vec<(String, u16, String)>;
/// A published message's envelope (to deliver it again) and its deliveries.
pub type Published = (Value, Delivered);

pub struct Options {
    pub public_url: String,
    pub max_receives: u32,
    /// Environments per function at most (Lambda's concurrency, scaled to this machine).
    pub concurrency: usize,
    /// Visibility of every source queue instead of the template's (180 s), for a test that
    /// waits for a message a crashed or timed-out invocation held to come back.
    pub visibility_s: Option<u64>,
    /// Parameters beyond the harness's own.
    pub parameters: Vec<(String, String)>,
    /// Policy statements taken out (function binary, `Sid`): what a policy that lacks them does.
    pub without_statements: Vec<(&'static str, &'static str)>,
    /// Function timeouts instead of the template's (function binary, seconds): the deadline
    /// a test's function is told, for a test of what a handler does as it nears it. In seconds
    /// of this machine, not stretched for emulation as the template's are: a handler keeps a
    /// fixed margin before its deadline, so a stretched short timeout would widen its window far
    /// more than emulation slows its work, and the deadline would not be met under qemu.
    pub timeouts: Vec<(&'static str, u64)>,
    /// Start every function before the first event (and fail if one does not start).
    pub warm: bool,
    /// Functions whose environments are never thawed once they answer (see
    /// `runtime::Function::never_thaw`): what is left to run after an answer is lost.
    pub never_thawed: Vec<&'static str>,
    /// Time added to each AWS request of these functions (see `proxy::Proxy::latency`).
    pub latency: Vec<(&'static str, Duration)>,
    /// Variables added to a function's environment beyond the template's (function binary,
    /// name, value): what a function does with a setting an operator got wrong.
    pub env: Vec<(&'static str, &'static str, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            public_url: "https://notify.shop.test".into(),
            max_receives: 5,
            concurrency: 2,
            visibility_s: None,
            parameters: Vec::new(),
            without_statements: Vec::new(),
            timeouts: Vec::new(),
            warm: true,
            never_thawed: Vec::new(),
            latency: Vec::new(),
            env: Vec::new(),
        }
    }
}

pub struct Stack {
    pub spec: StackSpec,
    pub api: String,
    pub ws: String,
    pub key: String,
    pub other_key: String,
    /// An operator's key, made by `tidings keys create --backend aws` as an operator would.
    pub ops_key: String,
    /// The stack's table (`TIDINGS_TABLE` for `tidings keys`).
    pub table: String,
    pub functions: BTreeMap<String, Arc<Function>>,
    pub ledger: Arc<Mutex<proxy::Ledger>>,
    pub queue_urls: BTreeMap<String, String>,
    pub sqs: aws_sdk_sqs::Client,
    /// Stream records the relay's mapping gave up on (sent to `stream-failures`).
    pub stream_given_up: Arc<std::sync::atomic::AtomicU64>,
    pub public_url: String,
    pub http: reqwest::Client,
    /// The HTTP API's id (the host of its `execute-api` URL, which subscriptions name).
    pub http_api_id: String,
    stop: watch::Sender<bool>,
}

fn required(var: &str) -> anyhow::Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(v),
        _ => anyhow::bail!(
            "{var} is not set: start the emulators (make test does: infra/moto.sh, infra/dynamodb_local.sh)"
        ),
    }
}

async fn serve(router: axum::Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(format!("http://{addr}"))
}

/// The DynamoDB Local the function binaries' stacks use, and its streams:
/// `TIDINGS_TEST_DYNAMODB_FUNCTIONS{,_STREAMS}` when set (`make test` starts a second DynamoDB
/// Local for them, so that a stack's writes never queue behind the rest of the suite's in one
/// emulator's table lock: infra/README.md), else the one `AWS_ENDPOINT_URL_DYNAMODB{,_STREAMS}`
/// names.
pub fn dynamodb_urls() -> anyhow::Result<(String, String)> {
    let set = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    if let Some(url) = set("TIDINGS_TEST_DYNAMODB_FUNCTIONS") {
        let streams = set("TIDINGS_TEST_DYNAMODB_FUNCTIONS_STREAMS").unwrap_or_else(|| url.clone());
        return Ok((url, streams));
    }
    let url = required("AWS_ENDPOINT_URL_DYNAMODB")?;
    let streams = set("AWS_ENDPOINT_URL_DYNAMODB_STREAMS").unwrap_or_else(|| url.clone());
    Ok((url, streams))
}

/// Runs `tidings keys <args> --backend aws` against `table` (in the stacks' DynamoDB,
/// [`dynamodb_urls`]) and returns what it printed.
pub async fn keys_cli(table: &str, args: &[&str]) -> anyhow::Result<Value> {
    let data = tempfile::tempdir()?;
    let (dynamodb, streams) = dynamodb_urls()?;
    let out = tokio::process::Command::new(crate::server::binary()?)
        .arg("keys")
        .args(args)
        .args(["--backend", "aws", "--data-dir"])
        .arg(data.path())
        .env("TIDINGS_TABLE", table)
        .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb)
        .env("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", streams)
        .env("AWS_REGION", REGION)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "tidings keys {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

impl Stack {
    pub async fn start(opts: Options) -> anyhow::Result<Self> {
        let moto = required("AWS_ENDPOINT_URL")?;
        let (dynamodb, streams_url) = dynamodb_urls()?;
        let sdk = tidings_aws::sdk_defaults().region(REGION).load().await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let sns = aws_sdk_sns::Client::new(&sdk);
        let ssm = aws_sdk_ssm::Client::new(&sdk);
        let ses = aws_sdk_sesv2::Client::new(&sdk);
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
        let dynamo = Dynamo { url: dynamodb.clone(), http: http.clone() };
        let streams = Dynamo { url: streams_url, http: http.clone() };
        let stack = format!("lh{:08x}", rand::random::<u32>());

        // What a shop creates outside the stack (docs/deploy.md, "Deploy"): the signing key, the SES
        // identity, the push platform applications.
        let signing_param = format!("/{stack}/signing-key");
        ssm.put_parameter()
            .name(&signing_param)
            .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
            .value(format!("k1:{:032x}", rand::random::<u128>()))
            .send()
            .await?;
        let email_from = "no-reply@shop.test".to_owned();
        ses.create_email_identity().email_identity("shop.test").send().await?;
        let mut parameters: BTreeMap<String, String> = BTreeMap::from([
            ("PublicUrl".into(), opts.public_url.clone()),
            ("EmailFrom".into(), email_from),
            ("SigningKeyParam".into(), signing_param),
            ("MaxReceives".into(), opts.max_receives.to_string()),
            // The emulators take any rate: the template's defaults (a new account's quotas, SES
            // 14/s) would only slow the other scenarios down; the rates' own test names its own.
            ("ProviderRates".into(), String::new()),
            ("TenantRates".into(), String::new()),
        ]);
        for (platform, param) in [("APNS", "SnsApnsArn"), ("GCM", "SnsFcmArn")] {
            let app = sns
                .create_platform_application()
                .name(format!("{stack}-{}", platform.to_lowercase()))
                .platform(platform)
                .attributes("PlatformCredential", "test")
                .attributes("PlatformPrincipal", "test")
                .send()
                .await?;
            parameters.insert(param.into(), app.platform_application_arn.unwrap_or_default());
        }
        parameters.extend(opts.parameters.iter().cloned());

        let decoded = template::decode()?;
        let ws_api_id = format!("ws{stack}");
        let mut other = BTreeMap::from([
            ("InboxWebSocketApi".to_owned(), ws_api_id.clone()),
            ("InboxWebSocketStage".to_owned(), "live".to_owned()),
            ("HttpApi".to_owned(), format!("http{stack}")),
        ]);
        // The table's stream ARN is DynamoDB Local's: made first.
        let table_name = template::table_name(&stack);
        let names = template::Names { stack: &stack, parameters: &parameters, other: other.clone() };
        let spec = template::stack(&decoded, &names)?;
        let props = &spec.table.properties;
        let created = dynamo
            .call(
                "DynamoDB_20120810.CreateTable",
                json!({
                    "TableName": table_name,
                    "AttributeDefinitions": props["AttributeDefinitions"],
                    "KeySchema": props["KeySchema"],
                    "BillingMode": props["BillingMode"],
                    "StreamSpecification": {"StreamEnabled": true, "StreamViewType": props["StreamSpecification"]["StreamViewType"]},
                }),
            )
            .await?;
        let stream_arn = created["TableDescription"]["LatestStreamArn"].as_str().context("no stream")?.to_owned();
        if let Some(ttl) = props["TimeToLiveSpecification"]["AttributeName"].as_str() {
            dynamo
                .call(
                    "DynamoDB_20120810.UpdateTimeToLive",
                    json!({"TableName": table_name, "TimeToLiveSpecification": {"AttributeName": ttl, "Enabled": true}}),
                )
                .await?;
        }
        other.insert(format!("{}.StreamArn", spec.table.logical_id), stream_arn.clone());
        let names = template::Names { stack: &stack, parameters: &parameters, other };
        let mut spec = template::stack(&decoded, &names)?;
        for (binary, sid) in &opts.without_statements {
            let f = spec.functions.iter_mut().find(|f| f.binary == *binary).context("no such function")?;
            let before = f.statements.len();
            f.statements.retain(|st| st.sid != *sid);
            anyhow::ensure!(f.statements.len() < before, "{binary} has no statement {sid}");
        }

        // Queues: DLQs first, then the queues that name them.
        let mut queue_urls = BTreeMap::new();
        let mut queues = spec.queues.clone();
        queues.sort_by_key(|q| q.redrive.is_some());
        for q in &queues {
            let mut create = sqs
                .create_queue()
                .queue_name(&q.name)
                .attributes(aws_sdk_sqs::types::QueueAttributeName::MessageRetentionPeriod, q.retention_s.to_string());
            let visibility = match (&q.redrive, opts.visibility_s) {
                (Some(_), Some(v)) => v,
                _ => q.visibility_s,
            };
            create =
                create.attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, visibility.to_string());
            if let Some((dlq, max)) = &q.redrive {
                let dlq_name = &spec.queues.iter().find(|d| &d.logical_id == dlq).context("dlq")?.name;
                let policy = json!({"deadLetterTargetArn": template::queue_arn(dlq_name), "maxReceiveCount": max});
                create = create.attributes(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy, policy.to_string());
            }
            let url = create.send().await?.queue_url.unwrap_or_default();
            queue_urls.insert(q.logical_id.clone(), url);
        }

        // Tenants' keys (as an operator registers them; the API has no route for it yet).
        let key = format!("tk_acme_{:032x}", rand::random::<u128>());
        let other_key = format!("tk_globex_{:032x}", rand::random::<u128>());
        for (tenant, k) in [("acme", &key), ("globex", &other_key)] {
            let hash = tidings_core::ops::tenants::hash_key(k);
            dynamo
                .call(
                    "DynamoDB_20120810.PutItem",
                    json!({"TableName": table_name, "Item": {
                        "pk": {"S": format!("KEY#{hash}")}, "sk": {"S": "KEY"},
                        "tenant": {"S": tenant}, "created_at": {"S": "2026-12-01T00:00:00Z"}}}),
                )
                .await?;
        }

        // The first operator key, made as docs/deploy.md says: `tidings keys create` against the
        // stack's table, with the caller's credentials and no running server.
        let made = keys_cli(&table_name, &["create", "--role", "operator", "--name", "harness"]).await?;
        let ops_key = made["key"].as_str().context("tidings keys create printed no key")?.to_owned();

        // The proxy every function's AWS requests go through.
        let ledger = Arc::new(Mutex::new(proxy::Ledger::default()));
        let access_key = |binary: &str| format!("AKIA{}", binary.to_ascii_uppercase().replace('-', ""));
        let connections = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop, stop_rx) = watch::channel(false);
        let ws_function_spec =
            spec.functions.iter().find(|f| f.binary == "ws-connections").context("ws-connections")?;
        let log_dir =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/lambda-harness").join(&stack);
        let binaries = Binaries::from_env();
        let mut proxy = proxy::Proxy {
            callers: BTreeMap::new(),
            dynamodb: dynamodb.clone(),
            moto: moto.clone(),
            websocket: String::new(),
            websocket_api_id: ws_api_id.clone(),
            http: http.clone(),
            ledger: ledger.clone(),
            sqs: sqs.clone(),
            moves: Mutex::new(Vec::new()),
            latency: opts.latency.iter().map(|(f, d)| ((*f).to_owned(), *d)).collect(),
        };
        for f in &spec.functions {
            proxy.callers.insert(access_key(&f.binary), (f.binary.clone(), f.statements.clone()));
        }
        // The WebSocket API needs its function, the function its endpoint: the server is bound first.
        let ws_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let ws_base = format!("http://{}", ws_listener.local_addr()?);
        proxy.websocket = ws_base.clone();
        let proxy = Arc::new(proxy);
        let proxy_url = serve(axum::Router::new().fallback({
            let proxy = proxy.clone();
            move |method, uri, headers, body| proxy.clone().handle(method, uri, headers, body)
        }))
        .await?;

        let mut functions = BTreeMap::new();
        for f in &spec.functions {
            let f = &match opts.timeouts.iter().find(|(binary, _)| *binary == f.binary) {
                // The runtime stretches every timeout by the time scale: undone for these.
                Some(&(_, timeout_s)) => {
                    template::FunctionSpec { timeout_s: timeout_s.div_ceil(binaries.time_scale()), ..f.clone() }
                }
                None => f.clone(),
            };
            let mut env = f.env.clone();
            env.insert("HARNESS_STACK".into(), stack.clone());
            for (k, v) in [
                ("AWS_REGION", REGION.to_owned()),
                ("AWS_DEFAULT_REGION", REGION.to_owned()),
                ("AWS_ACCESS_KEY_ID", access_key(&f.binary)),
                ("AWS_SECRET_ACCESS_KEY", "harness".to_owned()),
                ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
                ("AWS_ENDPOINT_URL", proxy_url.clone()),
                ("AWS_ENDPOINT_URL_APIGATEWAYMANAGEMENTAPI", proxy_url.clone()),
                ("TIDINGS_SNS_TRUSTED_CERT_PEM", include_str!("../../fixtures/sns/test-signing-cert.pem").to_owned()),
            ] {
                env.insert(k.into(), v);
            }
            for (_, k, v) in opts.env.iter().filter(|(binary, _, _)| *binary == f.binary) {
                env.insert((*k).into(), v.clone());
            }
            let function = Arc::new(Function::new(f.clone(), env, binaries.clone(), opts.concurrency, log_dir.clone()));
            if opts.never_thawed.contains(&f.binary.as_str()) {
                function.never_thaw();
            }
            functions.insert(f.binary.clone(), function);
        }
        let ws_function = functions[&ws_function_spec.binary].clone();
        let connections_api = gateway::WebSocketApi {
            function: ws_function,
            api_id: ws_api_id.clone(),
            stage: "live".into(),
            connections: connections.clone(),
        };
        let ws_router = gateway::ws_router(connections_api);
        tokio::spawn(async move {
            let _ = axum::serve(ws_listener, ws_router).await;
        });

        // Every function started once (its init measured) before any event reaches it.
        if opts.warm {
            for (name, f) in &functions {
                f.warm().await.with_context(|| format!("{name} did not start"))?;
            }
        }

        let mut http_routes = Vec::new();
        let stream_given_up = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for f in &spec.functions {
            let function = functions[&f.binary].clone();
            for (event, source) in &f.sources {
                match source {
                    Source::Sqs { queue_logical, batch_size, window_s, report_failures, max_concurrency } => {
                        let url = queue_urls.get(queue_logical).context("queue")?.clone();
                        let name =
                            spec.queues.iter().find(|q| &q.logical_id == queue_logical).context("queue")?.name.clone();
                        let mapping = Arc::new(sources::SqsMapping {
                            sqs: sqs.clone(),
                            function: function.clone(),
                            queue_url: url,
                            queue_name: name,
                            batch_size: *batch_size,
                            window: Duration::from_secs(*window_s),
                            report_failures: *report_failures,
                            ledger: ledger.clone(),
                        });
                        for _ in 0..(*max_concurrency).min(opts.concurrency) {
                            tokio::spawn(sources::sqs_poller(mapping.clone(), stop_rx.clone()));
                        }
                    }
                    Source::Stream {
                        batch_size,
                        window_s,
                        report_failures,
                        bisect,
                        max_retries,
                        on_failure_queue,
                        filters,
                    } => {
                        let mapping = sources::StreamMapping {
                            dynamo: streams.clone(),
                            sqs: sqs.clone(),
                            function: function.clone(),
                            stream_arn: stream_arn.clone(),
                            batch_size: *batch_size,
                            window: Duration::from_secs(*window_s),
                            report_failures: *report_failures,
                            bisect: *bisect,
                            max_retries: *max_retries,
                            on_failure_url: on_failure_queue.as_ref().and_then(|q| queue_urls.get(q).cloned()),
                            filters: filters.clone(),
                            given_up: stream_given_up.clone(),
                        };
                        tokio::spawn(mapping.run(stop_rx.clone()));
                    }
                    Source::Schedule { expression } => {
                        if let Some(every) = sources::rate(expression) {
                            let rule = format!("{stack}-{}{event}", f.logical_id);
                            tokio::spawn(sources::schedule(function.clone(), rule, every, stop_rx.clone()));
                        }
                    }
                    Source::HttpApi { method, path } => {
                        http_routes.push(gateway::Route::new(method, path, function.clone()));
                    }
                }
            }
        }
        anyhow::ensure!(!http_routes.is_empty(), "no function has an HttpApi event");
        let api_url = serve(gateway::http_router(gateway::HttpApi {
            routes: Arc::new(http_routes),
            api_id: format!("http{stack}"),
        }))
        .await?;
        Ok(Self {
            spec,
            api: api_url,
            ws: format!("{}/live", ws_base.replacen("http://", "ws://", 1)),
            key,
            other_key,
            ops_key,
            table: table_name.clone(),
            functions,
            ledger,
            queue_urls,
            sqs,
            stream_given_up,
            public_url: opts.public_url,
            http,
            http_api_id: format!("http{stack}"),
            stop,
        })
    }

    /// Fires a function's schedule (EventBridge's scheduled event) and waits for its answer.
    pub async fn fire(&self, binary: &str) -> anyhow::Result<Value> {
        let f = self.functions.get(binary).context("no such function")?;
        let inv = f.invoke(Function::json(&sources::scheduled_event(&format!("{}-{binary}", self.spec.name)))).await?;
        let body = inv.payload.map_err(|e| anyhow::anyhow!("{binary}: {e}"))?;
        Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        self.call_as(&self.key, method, path, body).await
    }

    pub async fn call_as(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .request(method.parse()?, format!("{}{path}", self.api))
            .header("authorization", format!("Bearer {key}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await?;
        let status = res.status().as_u16();
        let text = res.text().await?;
        Ok((
            status,
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) },
        ))
    }

    pub async fn raw(&self, method: &str, path: &str, body: &str, content_type: &str) -> anyhow::Result<(u16, String)> {
        let res = self
            .http
            .request(method.parse()?, format!("{}{path}", self.api))
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .await?;
        Ok((res.status().as_u16(), res.text().await?))
    }

    /// Where an https subscription's endpoint leads: it must be this stack's HTTP API.
    fn subscribed_url(&self, endpoint: &str) -> anyhow::Result<String> {
        let host = format!("https://{}.execute-api.{REGION}.amazonaws.com/", self.http_api_id);
        let path = endpoint.strip_prefix(&host).with_context(|| format!("{endpoint} is not this stack's HTTP API"))?;
        Ok(format!("{}/{path}", self.api))
    }

    /// Delivers a signed SNS message as SNS does to every https subscription of its topic that
    /// the template declares: (endpoint, status, body) per subscription (none: nothing listens).
    pub async fn deliver(&self, envelope: &Value) -> anyhow::Result<Delivered> {
        let topic = envelope["TopicArn"].as_str().unwrap_or_default();
        let mut out = Vec::new();
        for sub in self.spec.subscriptions.iter().filter(|s| s.topic_arn == topic && s.protocol == "https") {
            let res = self
                .http
                .post(self.subscribed_url(&sub.endpoint)?)
                .header("content-type", "text/plain; charset=UTF-8")
                .header("x-amz-sns-message-type", envelope["Type"].as_str().unwrap_or_default())
                .header("x-amz-sns-message-id", envelope["MessageId"].as_str().unwrap_or_default())
                .header("x-amz-sns-topic-arn", topic)
                .body(envelope.to_string())
                .send()
                .await?;
            out.push((sub.endpoint.clone(), res.status().as_u16(), res.text().await?));
        }
        Ok(out)
    }

    /// Publishes `message` to a topic of the stack (a new `MessageId`), delivered as
    /// [`Stack::deliver`] does; the envelope is answered too (to deliver it again).
    pub async fn publish(&self, topic_arn: &str, message: &Value) -> anyhow::Result<Published> {
        let envelope = sns::notification(topic_arn, message);
        let delivered = self.deliver(&envelope).await?;
        Ok((envelope, delivered))
    }

    /// What SES does with an event of a mail it accepted: an event of `event_type` (`Delivery`,
    /// `Bounce`, `Complaint`, ...) with its `detail`, published to the topic of every enabled
    /// event destination of the configuration set the send named whose types include it.
    pub async fn ses_event(
        &self,
        send: &proxy::ProviderCall,
        event_type: &str,
        detail: Value,
    ) -> anyhow::Result<Vec<Published>> {
        let mut section = event_type.to_owned();
        section[..1].make_ascii_lowercase();
        let mut event = json!({"eventType": event_type, "mail": {
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "messageId": send.message_id, "destination": [send.to], "source": "no-reply@shop.test"}});
        event[section.as_str()] = detail;
        let mut out = Vec::new();
        for d in self.spec.event_destinations.iter().filter(|d| {
            d.enabled && !send.configuration_set.is_empty() && d.configuration_set == send.configuration_set
        }) {
            if d.event_types.iter().any(|t| t.eq_ignore_ascii_case(event_type)) {
                out.push(self.publish(&d.topic_arn, &event).await?);
            }
        }
        Ok(out)
    }

    /// The stack's table (in the stacks' DynamoDB, [`dynamodb_urls`]) for what a test does by
    /// hand beside the functions (no policy applies to it).
    pub async fn table(&self) -> anyhow::Result<tidings_aws::DynamoTable> {
        let (url, _) = dynamodb_urls()?;
        let sdk = tidings_aws::sdk_defaults().endpoint_url(url).load().await;
        let config = tidings_aws::AwsConfig { table: self.table.clone(), ..Default::default() };
        Ok(tidings_aws::AwsBackend::from_sdk_config(&sdk, config).table())
    }

    /// The durable timers (minute buckets, `tidings_core::timers`) whose task `which` picks:
    /// (bucket, task).
    pub async fn durable_timers(&self, which: impl Fn(&Value) -> bool) -> anyhow::Result<Vec<(String, Value)>> {
        Ok(self
            .durable_timer_items(&which)
            .await?
            .into_iter()
            .map(|(b, item)| (b, item.attrs["task"].clone()))
            .collect())
    }

    async fn durable_timer_items(
        &self,
        which: &impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Vec<(String, tidings_core::ports::Item)>> {
        use tidings_core::ports::{QueryOpts, Table};
        let table = self.table().await?;
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let opts = QueryOpts { limit: 100, cursor, descending: false };
            let page = table.query(tidings_core::timers::OPEN_BUCKETS_PK, "", opts).await?;
            for entry in &page.items {
                let bucket = entry.key.sk.clone();
                let opts = QueryOpts { limit: 1000, cursor: None, descending: false };
                for item in table.query(&format!("TIMER#{bucket}"), "", opts).await?.items {
                    if which(&item.attrs["task"]) {
                        out.push((bucket.clone(), item));
                    }
                }
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                return Ok(out);
            }
        }
    }

    /// What the minutes until a durable timer's bucket would do, for the timers `which` picks:
    /// the stack cannot move its functions' clocks (each binary, native or emulated, reads the
    /// system clock), so the timer is moved instead, into a bucket of the past, due now. `tick`
    /// then fires it as it would have in its minute (the bucket claimed under a lease, the
    /// timer sent to the timers queue, its task run by the timers lane), every step under the
    /// functions' own policies. Answers the timers moved: (the bucket it was in, its task).
    pub async fn bring_forward(&self, which: impl Fn(&Value) -> bool) -> anyhow::Result<Vec<(String, Value)>> {
        use tidings_core::ports::{Cond, Item, Key, Table, Update};
        let table = self.table().await?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        // A minute before now: no function writes there (buckets are written at least 3 minutes
        // ahead), and every tick from now on fires it.
        let bucket = tidings_core::timers::bucket_of(now_ms - 60_000);
        let mut moved = Vec::new();
        for (from, item) in self.durable_timer_items(&which).await? {
            let id = item.key.sk.split_once('#').map_or(item.key.sk.as_str(), |(_, id)| id);
            let mut attrs = item.attrs.clone();
            attrs.insert("due_ms".into(), json!(now_ms));
            let key = Key::new(format!("TIMER#{bucket}"), format!("{now_ms:015}#{id}"));
            table.put(Item::new(key, attrs), Cond::NotExists).await?;
            table.delete(&item.key, Cond::Always).await?;
            moved.push((from, item.attrs["task"].clone()));
        }
        if !moved.is_empty() {
            let index = Key::new(tidings_core::timers::OPEN_BUCKETS_PK, bucket.clone());
            table.update(&index, vec![Update::SetIfAbsent("bucket".into(), bucket.into())], Cond::Always).await?;
        }
        Ok(moved)
    }

    pub fn sends(&self) -> Vec<proxy::ProviderCall> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.clone()
    }

    pub fn requests(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).requests.clone()
    }

    /// DynamoDB request units used by the functions so far, by `function operation kind`
    /// ([`proxy::kind_of`]): (write, read).
    pub fn units_by(&self) -> BTreeMap<String, (f64, f64)> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).units_by.clone()
    }

    pub fn refused(&self) -> Vec<String> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).refused.clone()
    }

    pub fn stats(&self) -> BTreeMap<String, runtime::Stats> {
        self.functions.iter().map(|(k, f)| (k.clone(), f.stats_now())).collect()
    }

    /// Each function's binary size and init times (spawn → first `next`), for docs/deploy.md, "The Lambda budget".
    pub fn budget(&self) -> Value {
        let stats = self.stats();
        json!(self
            .functions
            .iter()
            .map(|(name, f)| (name.clone(), json!({"bytes": f.binary_size(), "init_ms": stats[name].init_ms, "peak_rss_mb": stats[name].peak_rss_mb})))
            .collect::<BTreeMap<_, _>>())
    }

    /// Polls until `check` returns Some, or fails after `within`.
    pub async fn eventually<T, F, Fut>(&self, within: Duration, what: &str, mut check: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(v) = check().await? {
                return Ok(v);
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "timed out waiting for: {what}\nrefused: {:?}\nfunctions: {:?}",
                    self.refused(),
                    self.stats()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for f in self.functions.values() {
            f.stop();
        }
        // The template names the queues `{stack}-…` and the table `{stack}-table`.
        if let Some(stack) = self.table.strip_suffix("table") {
            crate::server::remove_from_emulators(self.table.clone(), stack.to_owned());
        }
    }
}
