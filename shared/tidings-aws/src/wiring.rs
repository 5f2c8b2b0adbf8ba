//! Assembles the core's ports on AWS from the environment: what every Lambda `main` and
//! `tidings serve --backend aws` call, so the wiring exists once.

use aws_config::SdkConfig;
use std::sync::Arc;

use tidings_core::config::Settings;
use tidings_core::inbox::live::{LivePush, NoLive};
use tidings_core::ports::{ChangeFeed, Provider, Queues, SystemClock, Table};
use tidings_core::{CoreConfig, Deps, Providers};

use crate::{AwsBackend, AwsConfig, BootstrapError, ConfigError, bootstrap};

#[derive(Debug, thiserror::Error)]
pub enum WiringError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Settings(#[from] tidings_core::config::ConfigError),
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
    pub email: Arc<dyn Provider>,
    /// The primary SMS provider (`TIDINGS_SMS_PRIMARY`).
    pub sms: Arc<dyn Provider>,
    /// The one SMS fails over to while the primary's breaker is open (`TIDINGS_SMS_SECONDARY`).
    pub sms_secondary: Option<Arc<dyn Provider>>,
    pub push: Arc<dyn Provider>,
    /// Prefix of the queue ARNs in the SQS events the local runtime builds.
    pub queue_arn_prefix: String,
    /// The core's configuration, read once; its signing keys from SSM
    /// (`TIDINGS_SIGNING_KEY_PARAM`) when `TIDINGS_SIGNING_KEYS` does not give them.
    pub config: CoreConfig,
    /// The WebSocket API's management endpoint (`TIDINGS_WS_ENDPOINT`), if live pushes go out.
    pub ws_endpoint: Option<String>,
}

/// What a function needs at start-up beyond the table, the queues and the providers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// The signing keys: from `TIDINGS_SIGNING_KEYS`, else the SSM parameter
    /// `TIDINGS_SIGNING_KEY_PARAM` names. Without this need, SSM is never asked (a function's
    /// policy may not allow it), and a function that has it refuses to start without a key.
    pub signer: bool,
    /// A public URL for the links it makes (`TIDINGS_PUBLIC_URL`): required, and refused when
    /// it names a loopback or unspecified host, when running in Lambda.
    pub public_url: bool,
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

/// Reads the signing keys (`kid:secret,...`) from the SSM SecureString parameter named by
/// `TIDINGS_SIGNING_KEY_PARAM`, so the secret is never in the template or the environment.
async fn signer_from_ssm(settings: &Settings, sdk: &SdkConfig) -> Result<tidings_core::signing::Signer, WiringError> {
    let Some(name) = settings.get("TIDINGS_SIGNING_KEY_PARAM") else { return Ok(Default::default()) };
    if settings.get("TIDINGS_SIGNING_KEYS").is_some() {
        return Ok(Default::default());
    }
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
    /// The ports the checked `settings` describe; with `bootstrap`, first creates the table and
    /// the queues where missing (for an emulator; on AWS the SAM template owns them).
    pub async fn from_settings(
        settings: &Settings,
        bootstrap_first: bool,
        queue_names: &[String],
        needs: Needs,
    ) -> Result<Self, WiringError> {
        let mut config = settings.core();
        if needs.public_url && in_lambda() {
            if settings.get("TIDINGS_PUBLIC_URL").is_none() {
                return Err(WiringError::Setting(
                    "TIDINGS_PUBLIC_URL is not set: the links this function makes need it".into(),
                ));
            }
            if let Some(problem) = public_url_problem(&config.public_url) {
                return Err(WiringError::Setting(problem));
            }
        }
        let backend = AwsBackend::from_config(AwsConfig::from_settings(settings)?).await;
        if bootstrap_first {
            let names: Vec<&str> = queue_names.iter().map(String::as_str).collect();
            bootstrap(&backend, &names).await?;
        }
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        if needs.signer && !config.signer.is_configured() {
            config.signer = signer_from_ssm(settings, backend.sdk_config()).await?;
            if !config.signer.is_configured() {
                return Err(WiringError::Secret(
                    "this function signs links and tokens: set TIDINGS_SIGNING_KEY_PARAM (an SSM parameter) or TIDINGS_SIGNING_KEYS".into(),
                ));
            }
        }
        Ok(Self {
            table: Arc::new(backend.table()),
            queues: Arc::new(backend.queues()),
            ws_endpoint: settings.get("TIDINGS_WS_ENDPOINT").map(str::to_owned),
            email: Arc::new(backend.email()),
            sms: backend.sms_provider(backend.config().sms_primary),
            sms_secondary: backend.config().sms_secondary.map(|p| backend.sms_provider(p)),
            push: Arc::new(backend.push()),
            queue_arn_prefix: format!("arn:aws:sqs:{region}:000000000000:{}", backend.config().queue_prefix),
            config,
            backend,
        })
    }

    /// The core's dependencies, with the real providers and the system clock (Lambda).
    pub fn deps(&self) -> Deps {
        let config = self.config.clone();
        Deps::new(self.table.clone(), self.queues.clone(), Arc::new(SystemClock), self.gated_providers(), config)
    }

    /// The providers behind the three gates (per-provider and per-tenant token buckets kept in
    /// the table, so every Lambda instance shares them; a circuit breaker per provider; SMS
    /// failing over to the secondary while the primary's breaker is open).
    pub fn gated_providers(&self) -> Providers {
        let raw = Providers { email: self.email.clone(), sms: self.sms.clone(), push: self.push.clone() };
        tidings_core::gates::wrap(
            &raw,
            self.sms_secondary.clone(),
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
    use super::{endpoints_are_local_in, public_url_problem};

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
