//! Assembles the core's ports on AWS from the environment: what every Lambda `main` and
//! `tidings serve --backend aws` call, so the wiring exists once.

use aws_config::SdkConfig;
use std::sync::Arc;

use tidings_core::config::Settings;
use tidings_core::inbox::live::{LivePush, NoLive};
use tidings_core::ports::{
    ChangeFeed, OutboundMessage, Platform, Provider, ProviderError, ProviderReceipt, Queues, SystemClock, Table,
};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::{AwsBackend, AwsConfig, ConfigError};

#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Settings(#[from] tidings_core::config::ConfigError),
    #[error("signing key: {0}")]
    Secret(String),
    #[error("{0}")]
    Setting(String),
}

/// The ports on AWS: the table and the queues, and what a function wires beyond them
/// ([`AwsPorts::sending`], [`AwsPorts::signing`], [`AwsPorts::live_push`]).
///
/// Each of those is a step a function's entry takes or not, not a flag read at run time: a
/// function that never takes a step never calls its SDK client, so the link drops the client
/// (the reconcile function has no SES, SNS, End User Messaging or SSM code).
#[derive(Clone)]
pub struct AwsPorts {
    pub backend: AwsBackend,
    pub table: Arc<dyn Table>,
    pub queues: Arc<dyn Queues>,
    /// The providers, once wired ([`AwsPorts::sending`]).
    pub providers: Option<AwsProviders>,
    /// Prefix of the queue ARNs in the SQS events the local runtime builds.
    pub queue_arn_prefix: String,
    /// The core's configuration, read once; its signing keys from `TIDINGS_SIGNING_KEYS`, or
    /// from SSM once [`AwsPorts::signing`] has read them.
    pub config: CoreConfig,
    /// The WebSocket API's management endpoint (`TIDINGS_WS_ENDPOINT`), if live pushes go out.
    pub ws_endpoint: Option<String>,
    /// `TIDINGS_SIGNING_KEY_PARAM`: the SSM parameter holding the signing keys.
    signing_key_param: Option<String>,
    /// Whether `TIDINGS_PUBLIC_URL` is set (`config.public_url` has a default).
    public_url_set: bool,
}

/// The channel providers on AWS, as configured.
#[derive(Clone)]
pub struct AwsProviders {
    /// SES for email, the primary SMS provider (`TIDINGS_SMS_PRIMARY`), SNS for push.
    pub channels: Providers,
    /// The one SMS fails over to while the primary's breaker is open (`TIDINGS_SMS_SECONDARY`).
    pub sms_secondary: Option<Arc<dyn Provider>>,
}

impl AwsProviders {
    /// SES, and SNS or End User Messaging for SMS, SNS for push, with their clients.
    pub fn new(backend: &AwsBackend) -> Self {
        Self {
            channels: Providers {
                email: Arc::new(backend.email()),
                sms: backend.sms_provider(backend.config().sms_primary),
                push: Arc::new(backend.push()),
            },
            sms_secondary: backend.config().sms_secondary.map(|p| backend.sms_provider(p)),
        }
    }
}

/// The provider of a function that sends nothing (its entry did not take
/// [`AwsPorts::sending`]): every call fails, transiently, so that a message routed to it by
/// mistake goes back to its queue and on to the dead letters, not lost, and the log says why.
struct Unwired;

#[async_trait::async_trait]
impl Provider for Unwired {
    fn name(&self) -> &str {
        "unwired"
    }
    async fn send(&self, _: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        Err(unwired())
    }
    async fn register_device(&self, _: Platform, _: &str) -> Result<String, ProviderError> {
        Err(unwired())
    }
    async fn unregister_device(&self, _: &str) -> Result<(), ProviderError> {
        Err(unwired())
    }
}

impl Unwired {
    /// Every channel [`Unwired`] but push, which `push` is when given.
    fn providers(push: Option<Arc<dyn Provider>>) -> Providers {
        let unwired: Arc<dyn Provider> = Arc::new(Unwired);
        Providers { email: unwired.clone(), sms: unwired.clone(), push: push.unwrap_or(unwired) }
    }
}

fn unwired() -> ProviderError {
    tracing::error!("a provider was called in a function that sends nothing (tidings_functions wires none)");
    ProviderError::transient("this function's providers are not wired: it sends nothing")
}

/// Whether the process runs under a Lambda Runtime API (on AWS, or a harness that plays it).
pub fn in_lambda() -> bool {
    std::env::var("AWS_LAMBDA_RUNTIME_API").is_ok_and(|v| !v.is_empty())
}

/// Whether an `http(s)` URL names a loopback, unspecified or `localhost` host; `None` when it is
/// not an http(s) URL.
fn url_is_local(url: &str) -> Option<bool> {
    let rest = match url.split_once("://") {
        Some(("https" | "http", rest)) => rest,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.rsplit_once('@').map_or(authority, |(_, h)| h) {
        h if h.starts_with('[') => h.split(']').next().unwrap_or_default().trim_start_matches('['),
        h => h.rsplit_once(':').map_or(h, |(host, _)| host),
    };
    let host = host.to_ascii_lowercase();
    Some(
        host.is_empty()
            || host == "localhost"
            || host.ends_with(".localhost")
            || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified()),
    )
}

/// Whether every AWS service this process could call is an emulator on this machine:
/// `AWS_ENDPOINT_URL` is set and local, and so is every per-service `AWS_ENDPOINT_URL_*`.
/// What only a local run may do (keys from the environment, the `/dev` routes) asks this.
pub fn endpoints_are_local() -> bool {
    endpoints_are_local_in(std::env::vars())
}

fn endpoints_are_local_in(vars: impl IntoIterator<Item = (String, String)>) -> bool {
    let mut general = false;
    for (k, v) in vars {
        if k == "AWS_ENDPOINT_URL" {
            general = url_is_local(&v) == Some(true);
            if !general {
                return false;
            }
        } else if k.starts_with("AWS_ENDPOINT_URL_") && url_is_local(&v) != Some(true) {
            return false;
        }
    }
    general
}

/// Why `url` cannot be the base of the links a deployed stack sends, or `None`.
pub fn public_url_problem(url: &str) -> Option<String> {
    let Some(loopback) = url_is_local(url) else {
        return Some(format!("TIDINGS_PUBLIC_URL={url:?} is not an http(s) URL"));
    };
    loopback.then(|| {
        format!(
            "TIDINGS_PUBLIC_URL={url:?} names a local host: every tracking, click and unsubscribe link would \
             point at it (set the stack's PublicUrl parameter)"
        )
    })
}

/// The management endpoint of the WebSocket API's stage: `TIDINGS_WS_ENDPOINT`, or, where the
/// SDK's endpoint is overridden (`AWS_ENDPOINT_URL_APIGATEWAYMANAGEMENTAPI`, else
/// `AWS_ENDPOINT_URL`: an emulator), that endpoint with the stage's path kept. The client is
/// given its endpoint in code, which the SDK's own variables would not override.
fn management_endpoint(ws_endpoint: &str) -> String {
    let over = ["AWS_ENDPOINT_URL_APIGATEWAYMANAGEMENTAPI", "AWS_ENDPOINT_URL"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|e| !e.is_empty()));
    match over {
        Some(base) => {
            let path = ws_endpoint.split_once("://").map_or("", |(_, rest)| rest.find('/').map_or("", |i| &rest[i..]));
            format!("{}{path}", base.trim_end_matches('/'))
        }
        None => ws_endpoint.to_owned(),
    }
}

/// Reads the signing keys (`kid:secret,...`) from the SSM SecureString parameter `name`
/// (`TIDINGS_SIGNING_KEY_PARAM`), so the secret is never in the template or the environment.
async fn signer_from_ssm(name: &str, sdk: &SdkConfig) -> Result<tidings_core::signing::Signer, WiringError> {
    let conf = aws_sdk_ssm::config::Builder::from(sdk).interceptor(crate::requests::RequestCounter).build();
    let out = aws_sdk_ssm::Client::from_conf(conf)
        .get_parameter()
        .name(name)
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
    /// The table and the queues the checked `settings` describe, and the core's configuration;
    /// no provider and no SSM read yet.
    pub async fn connect(settings: &Settings) -> Result<Self, WiringError> {
        let backend = AwsBackend::from_config(AwsConfig::from_settings(settings)?).await;
        Ok(Self::on(backend, settings))
    }

    /// [`AwsPorts::connect`] for a Lambda function: the SDK configured from the function's
    /// environment only ([`crate::lambda_sdk_config`]), without the default chains' profile
    /// files, IMDS and STS, which the link then drops.
    pub fn connect_in_lambda(settings: &Settings) -> Result<Self, WiringError> {
        let backend = AwsBackend::from_sdk_config(&crate::lambda_sdk_config(), AwsConfig::from_settings(settings)?);
        Ok(Self::on(backend, settings))
    }

    /// [`AwsPorts::connect`] with a backend already made.
    fn on(backend: AwsBackend, settings: &Settings) -> Self {
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        Self {
            table: Arc::new(backend.table()),
            queues: Arc::new(backend.queues()),
            providers: None,
            ws_endpoint: settings.get("TIDINGS_WS_ENDPOINT").map(str::to_owned),
            queue_arn_prefix: format!("arn:aws:sqs:{region}:000000000000:{}", backend.config().queue_prefix),
            config: settings.core(),
            signing_key_param: settings.get("TIDINGS_SIGNING_KEY_PARAM").map(str::to_owned),
            public_url_set: settings.get("TIDINGS_PUBLIC_URL").is_some(),
            backend,
        }
    }

    /// With the providers ([`AwsProviders::new`]): for the functions that send or register
    /// devices.
    #[must_use]
    pub fn sending(mut self) -> Self {
        self.providers = Some(AwsProviders::new(&self.backend));
        self
    }

    /// With only the push provider (SNS), for a function that registers and removes devices
    /// and sends nothing (the API): email and SMS stay [`Unwired`], so the function does not
    /// link SES or End User Messaging.
    #[must_use]
    pub fn registering(mut self) -> Self {
        let push: Arc<dyn Provider> = Arc::new(self.backend.push());
        self.providers = Some(AwsProviders { channels: Unwired::providers(Some(push)), sms_secondary: None });
        self
    }

    /// With the signing keys and a public URL for the links: for the functions that sign or
    /// verify links and tokens. The keys come from `TIDINGS_SIGNING_KEYS`, else the SSM
    /// parameter `TIDINGS_SIGNING_KEY_PARAM` names (a function that never takes this step
    /// never asks SSM, which its policy may not allow); without a key the start fails. In
    /// Lambda, `TIDINGS_PUBLIC_URL` is required and refused when it names a loopback or
    /// unspecified host.
    pub async fn signing(mut self) -> Result<Self, WiringError> {
        if in_lambda() {
            if !self.public_url_set {
                return Err(WiringError::Setting(
                    "TIDINGS_PUBLIC_URL is not set: the links this function makes need it".into(),
                ));
            }
            if let Some(problem) = public_url_problem(&self.config.public_url) {
                return Err(WiringError::Setting(problem));
            }
        }
        if !self.config.signer.is_configured() {
            if let Some(name) = &self.signing_key_param {
                self.config.signer = signer_from_ssm(name, self.backend.sdk_config()).await?;
            }
            if !self.config.signer.is_configured() {
                return Err(WiringError::Secret(
                    "this function signs links and tokens: set TIDINGS_SIGNING_KEY_PARAM (an SSM parameter) or TIDINGS_SIGNING_KEYS".into(),
                ));
            }
        }
        Ok(self)
    }

    /// The core's dependencies, with the real providers and the system clock (Lambda).
    pub fn deps(&self) -> Deps {
        let config = self.config.clone();
        Deps::new(self.table.clone(), self.queues.clone(), Arc::new(SystemClock), self.gated_providers(), config)
    }

    /// The providers behind the three gates (per-provider and per-tenant token buckets kept in
    /// the table, so every Lambda instance shares them; a circuit breaker per provider; SMS
    /// failing over to the secondary while the primary's breaker is open).
    ///
    /// A function that took no [`AwsPorts::sending`] step has [`Unwired`] providers.
    pub fn gated_providers(&self) -> Providers {
        let Some(p) = &self.providers else {
            return Unwired::providers(None);
        };
        tidings_core::gates::wrap(
            &p.channels,
            p.sms_secondary.clone(),
            &self.config.gates,
            tidings_core::gates::GateStore::Shared(self.table.clone()),
        )
    }

    /// Pushes to API Gateway WebSocket connections when `TIDINGS_WS_ENDPOINT` names the
    /// WebSocket API's management endpoint (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`);
    /// otherwise nothing is pushed (the inbox is read when the app opens).
    pub async fn live_push(&self) -> Arc<dyn LivePush> {
        match &self.ws_endpoint {
            Some(endpoint) => {
                let conf = aws_sdk_apigatewaymanagement::config::Builder::from(self.backend.sdk_config())
                    .endpoint_url(management_endpoint(endpoint))
                    .interceptor(crate::requests::RequestCounter)
                    .build();
                let client = aws_sdk_apigatewaymanagement::Client::from_conf(conf);
                Arc::new(crate::live::ApiGatewayLive::new(client, self.deps()))
            }
            None => Arc::new(NoLive),
        }
    }

    /// A reader of the table's stream, for the local runtime (on Lambda the event source mapping
    /// reads it, and no function links the streams client).
    pub fn change_feed(&self) -> Arc<dyn ChangeFeed> {
        Arc::new(self.backend.change_feed())
    }

    /// The deployment's queue prefix (logical name = physical name without it).
    pub fn queue_prefix(&self) -> &str {
        &self.backend.config().queue_prefix
    }
}

#[cfg(test)]
mod tests {
    use super::{AwsPorts, endpoints_are_local_in, public_url_problem};
    use tidings_core::config::Settings;
    use tidings_core::ports::{Channel, Platform};

    /// Ports on a backend whose SDK configuration is given, not read from this machine (no
    /// request is made).
    fn ports(pairs: &[(&str, &str)]) -> AwsPorts {
        let settings = Settings::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let backend = crate::AwsBackend::from_sdk_config(&sdk, crate::AwsConfig::from_settings(&settings).unwrap());
        AwsPorts::on(backend, &settings)
    }

    /// A function that takes no `sending` step (reconcile, the relay, the WebSocket function)
    /// links no provider; were a message routed to one anyway, it fails transiently, back to
    /// its queue and on to the dead letters, never counted as sent. With the step, the
    /// configured providers answer.
    #[tokio::test]
    async fn without_the_sending_step_every_provider_refuses_for_now() {
        let ports = ports(&[("TIDINGS_TABLE", "t"), ("TIDINGS_EMAIL_FROM", "shop@example.test")]);
        let providers = ports.gated_providers();
        for (channel, provider) in
            [(Channel::Email, &providers.email), (Channel::Sms, &providers.sms), (Channel::Push, &providers.push)]
        {
            assert_eq!(provider.name(), "unwired", "{channel:?}");
            let message = crate::mock_tests::message(channel, "someone@example.test");
            let e = provider.send(&message).await.unwrap_err();
            assert!(e.is_retryable(), "{channel:?}: {e}");
        }
        assert!(providers.push.register_device(Platform::Android, "token").await.unwrap_err().is_retryable());

        let sending = ports.clone().sending().gated_providers();
        assert_ne!(sending.email.name(), "unwired");
        assert_ne!(sending.push.name(), "unwired");

        // The API's step: push, to register devices; email and SMS never sent from there.
        let registering = ports.registering().gated_providers();
        assert_eq!(registering.email.name(), "unwired");
        assert_eq!(registering.sms.name(), "unwired");
        assert_eq!(registering.push.name(), sending.push.name());
    }

    /// The signing step refuses to start without a key (SSM is not asked when no parameter
    /// is named), and takes the keys the environment gives.
    #[tokio::test]
    async fn the_signing_step_needs_a_key() {
        let e = ports(&[("TIDINGS_TABLE", "t")]).signing().await.err().unwrap();
        assert!(e.to_string().contains("TIDINGS_SIGNING_KEY_PARAM"), "{e}");
        let keys = ("TIDINGS_SIGNING_KEYS", "k1:0123456789abcdef0123456789abcdef");
        let signed = ports(&[("TIDINGS_TABLE", "t"), keys]).signing().await.unwrap();
        assert!(signed.config.signer.is_configured());
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn only_emulators_on_this_machine_count_as_local_endpoints() {
        let moto = ("AWS_ENDPOINT_URL", "http://127.0.0.1:5005");
        assert!(endpoints_are_local_in(vars(&[moto])));
        assert!(endpoints_are_local_in(vars(&[moto, ("AWS_ENDPOINT_URL_DYNAMODB", "http://localhost:5006")])));
        // Nothing set: the SDK asks AWS itself.
        assert!(!endpoints_are_local_in(vars(&[("AWS_REGION", "eu-west-1")])));
        // One service on AWS is enough to refuse.
        assert!(!endpoints_are_local_in(vars(&[
            moto,
            ("AWS_ENDPOINT_URL_SES", "https://email.eu-west-1.amazonaws.com")
        ])));
        assert!(!endpoints_are_local_in(vars(&[("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:5006")])));
        assert!(!endpoints_are_local_in(vars(&[("AWS_ENDPOINT_URL", "https://sqs.example.com")])));
    }

    #[test]
    fn loopback_public_urls_are_refused_and_public_ones_kept() {
        for bad in [
            "http://127.0.0.1:8080",
            "https://localhost/x",
            "http://[::1]:3000",
            "http://0.0.0.0",
            "https://api.localhost",
            "ftp://shop.example",
            "shop.example",
            "https://",
        ] {
            assert!(public_url_problem(bad).is_some(), "{bad} accepted");
        }
        for good in
            ["https://notify.shop.example", "https://abc.execute-api.eu-west-1.amazonaws.com/", "http://10.0.0.5:8080"]
        {
            assert_eq!(public_url_problem(good), None, "{good} refused");
        }
    }
}
