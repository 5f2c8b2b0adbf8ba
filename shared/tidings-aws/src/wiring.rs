//! Assembles the core's ports on AWS from the environment: what every Lambda `main` and
//! `tidings serve --backend aws` call, so the wiring exists once.

use std::sync::Arc;

use tidings_core::live::{LivePush, NoLive};
use tidings_core::ports::{ChangeFeed, Provider, Queues, SystemClock, Table};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::{AwsBackend, BootstrapError, ConfigError, bootstrap};

#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error("signing key: {0}")]
    Secret(String),
    #[error("{0}")]
    Setting(String),
}

/// The ports on AWS.
#[derive(Clone)]
pub struct AwsPorts {
    pub backend: AwsBackend,
    pub table: Arc<dyn Table>,
    pub queues: Arc<dyn Queues>,
    pub feed: Arc<dyn ChangeFeed>,
    pub email: Arc<dyn Provider>,
    pub sms: Arc<dyn Provider>,
    pub push: Arc<dyn Provider>,
    /// Prefix of the queue ARNs in the SQS events the local runtime builds.
    pub queue_arn_prefix: String,
    /// The core's configuration, read once; its signing keys from SSM
    /// (`TIDINGS_SIGNING_KEY_PARAM`) when `TIDINGS_SIGNING_KEYS` does not give them.
    pub config: CoreConfig,
}

/// Reads the signing keys (`kid:secret,...`) from the SSM SecureString parameter named by
/// `TIDINGS_SIGNING_KEY_PARAM`, so the secret is never in the template or the environment.
async fn signer_from_ssm() -> Result<tidings_core::signing::Signer, WiringError> {
    let Ok(name) = std::env::var("TIDINGS_SIGNING_KEY_PARAM") else { return Ok(Default::default()) };
    if name.is_empty() || std::env::var("TIDINGS_SIGNING_KEYS").is_ok_and(|v| !v.is_empty()) {
        return Ok(Default::default());
    }
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let conf = aws_sdk_ssm::config::Builder::from(&sdk).interceptor(crate::requests::RequestCounter).build();
    let out = aws_sdk_ssm::Client::from_conf(conf)
        .get_parameter()
        .name(&name)
        .with_decryption(true)
        .send()
        .await
        .map_err(|e| WiringError::Secret(aws_sdk_ssm::error::DisplayErrorContext(&e).to_string()))?;
    let value = out.parameter().and_then(|p| p.value()).unwrap_or_default();
    let signer = tidings_core::signing::Signer::parse(value);
    if !signer.is_configured() {
        return Err(WiringError::Secret(format!("parameter {name} holds no `kid:secret` pairs")));
    }
    Ok(signer)
}

impl AwsPorts {
    /// Reads the configuration; with `bootstrap`, first creates the table and the queues where
    /// missing (for an emulator; on AWS the SAM template owns them).
    pub async fn from_env(bootstrap_first: bool, queue_names: &[String]) -> Result<Self, WiringError> {
        let mut config = CoreConfig::from_env().map_err(WiringError::Setting)?;
        let backend = AwsBackend::from_env().await?;
        if bootstrap_first {
            let names: Vec<&str> = queue_names.iter().map(String::as_str).collect();
            bootstrap(&backend, &names).await?;
        }
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        if !config.signer.is_configured() {
            config.signer = signer_from_ssm().await?;
        }
        Ok(Self {
            table: Arc::new(backend.table()),
            queues: Arc::new(backend.queues()),
            feed: Arc::new(backend.change_feed()),
            email: Arc::new(backend.email()),
            sms: Arc::new(backend.sms()),
            push: Arc::new(backend.push()),
            queue_arn_prefix: format!("arn:aws:sqs:{region}:000000000000:{}", backend.config().queue_prefix),
            config,
            backend,
        })
    }

    /// The core's dependencies, with the real providers and the system clock (Lambda).
    pub fn deps(&self) -> Deps {
        let config = self.config.clone();
        Deps {
            table: self.table.clone(),
            queues: self.queues.clone(),
            clock: Arc::new(SystemClock),
            providers: self.gated_providers(),
            config: Arc::new(config),
        }
    }

    /// The providers behind the three gates (per-provider and per-tenant token buckets kept in
    /// the table, so every Lambda instance shares them; a circuit breaker per provider).
    pub fn gated_providers(&self) -> Providers {
        let raw = Providers { email: self.email.clone(), sms: self.sms.clone(), push: self.push.clone() };
        tidings_core::gates::wrap(
            &raw,
            None,
            &tidings_core::gates::GateConfig::from_env(),
            tidings_core::gates::GateStore::Shared(self.table.clone()),
        )
    }

    /// Pushes to API Gateway WebSocket connections when `TIDINGS_WS_ENDPOINT` names the
    /// WebSocket API's management endpoint (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`);
    /// otherwise nothing is pushed (the inbox is read when the app opens).
    pub async fn live_push_from_env(&self) -> Arc<dyn LivePush> {
        match std::env::var("TIDINGS_WS_ENDPOINT") {
            Ok(endpoint) if !endpoint.is_empty() => {
                let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                let conf = aws_sdk_apigatewaymanagement::config::Builder::from(&sdk)
                    .endpoint_url(endpoint)
                    .interceptor(crate::requests::RequestCounter)
                    .build();
                let client = aws_sdk_apigatewaymanagement::Client::from_conf(conf);
                Arc::new(crate::live::ApiGatewayLive::new(client, self.deps()))
            }
            _ => Arc::new(NoLive),
        }
    }

    /// The deployment's queue prefix (logical name = physical name without it).
    pub fn queue_prefix(&self) -> &str {
        &self.backend.config().queue_prefix
    }
}
