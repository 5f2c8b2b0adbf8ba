//! The AWS backend: the core's ports on DynamoDB (and its stream), SQS, SES and SNS, through
//! the official SDK.
//!
//! Configuration comes from the environment once ([`AwsConfig`]); the endpoints are the SDK's
//! own `AWS_ENDPOINT_URL` and its per-service variables (`AWS_ENDPOINT_URL_DYNAMODB`, ...), so
//! the same code runs against AWS, LocalStack or the emulators of `make test` (DynamoDB Local
//! for DynamoDB, moto for the rest).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

/// A client of an AWS SDK crate whose answers are `aws_smithy_mocks` rules, for the unit tests
/// (`client!(aws_sdk_sns, [&rule])`). Defined before the modules so that every one can use it.
#[cfg(test)]
macro_rules! client {
    ($krate:ident, $rules:expr) => {{
        let mut interceptor =
            aws_smithy_mocks::MockResponseInterceptor::new().rule_mode(aws_smithy_mocks::RuleMode::MatchAny);
        for rule in $rules {
            interceptor = interceptor.with_rule(rule);
        }
        $krate::Client::from_conf(
            $krate::Config::builder()
                .behavior_version($krate::config::BehaviorVersion::latest())
                .region($krate::config::Region::new("us-east-1"))
                .credentials_provider($krate::config::Credentials::new("test", "test", None, None, "test"))
                .retry_config($krate::config::retry::RetryConfig::disabled())
                .http_client(aws_smithy_mocks::create_mock_http_client())
                .interceptor(interceptor)
                .build(),
        )
    }};
}

mod bootstrap;
mod config;
mod error;
pub mod http_client;
pub mod live;
mod providers;
mod queues;
pub mod requests;
mod sms_voice;
mod stream;
mod table;
pub mod wiring;

#[cfg(test)]
mod mock_tests;

pub use bootstrap::{BootstrapError, BootstrapReport, Bootstrapped, bootstrap, bootstrap_reporting};
pub use config::{AwsConfig, ConfigError, RedriveMode, SmsProvider};
pub use providers::{SNS_DELIVERY_KEY_ATTRIBUTE, SesEmail, SnsPush, SnsSms};
pub use queues::SqsQueues;
pub use sms_voice::{DELIVERY_KEY_CONTEXT, EndUserMessagingSms, context_delivery_key};
pub use stream::{DynamoChangeFeed, attrs_from_stream_image, change_record_from_stream, key_from_stream_image};
pub use table::{
    ConflictRetry, DynamoTable, ExprBuilder, attrs_from_stored, item_from_dynamo, item_to_dynamo, port_attr_name,
    stored_attr_name, value_to_dynamo,
};

use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};

/// The SDK's configuration loader (region, credentials, `AWS_ENDPOINT_URL` from the
/// environment) with the one HTTP client every SDK client here shares ([`http_client`]):
/// reqwest's, HTTP/1.1 over rustls with ring, the crypto library the rest of the build links
/// already. (The SDK's default client would bring aws-lc beside it, about 2 MB more of every
/// function, and its hyper client HTTP/2, 0.5 MB more.)
pub fn sdk_defaults() -> ConfigLoader {
    aws_config::defaults(BehaviorVersion::latest()).http_client(http_client::shared())
}

/// [`sdk_defaults`], loaded.
pub async fn load_sdk_config() -> SdkConfig {
    sdk_defaults().load().await
}

/// The SDK's configuration in a Lambda function, from what Lambda puts in its environment and
/// nothing else: the region (`AWS_REGION`, else `AWS_DEFAULT_REGION`), the function role's credentials
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), and `AWS_ENDPOINT_URL`
/// with its per-service variables (`AWS_ENDPOINT_URL_DYNAMODB`: emulators), with the retries
/// and connect timeout the default loader sets. Not [`sdk_defaults`]' chains (profile files,
/// IMDS, SSO, STS for web identity and assumed roles), which a function never uses: without
/// them every function is about 0.5 MB smaller and reads no file at start-up
/// (docs/deploy.md, "The functions' size"). A missing credential fails the first request,
/// naming the variable.
pub fn lambda_sdk_config() -> SdkConfig {
    use aws_config::environment::EnvironmentVariableCredentialsProvider;
    use aws_types::sdk_config::{RetryConfig, SharedCredentialsProvider, TimeoutConfig};
    let mut sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(
            ["AWS_REGION", "AWS_DEFAULT_REGION"]
                .into_iter()
                .find_map(|v| std::env::var(v).ok().filter(|r| !r.is_empty()))
                .map(aws_config::Region::new),
        )
        .credentials_provider(SharedCredentialsProvider::new(EnvironmentVariableCredentialsProvider::new()))
        .http_client(http_client::shared())
        .retry_config(RetryConfig::standard())
        .timeout_config(TimeoutConfig::builder().connect_timeout(std::time::Duration::from_millis(3_100)).build())
        .service_config(EnvEndpoints(aws_types::os_shim_internal::Env::real()));
    if let Some(sleep) = aws_smithy_async::rt::sleep::default_async_sleep() {
        sdk = sdk.sleep_impl(sleep);
    }
    sdk.build()
}

/// A service's settings from the environment as the SDK's loader reads them, without its
/// profile files: `AWS_ENDPOINT_URL_<SERVICE>` (`AWS_ENDPOINT_URL_DYNAMODB`), else
/// `AWS_ENDPOINT_URL`.
#[derive(Debug)]
struct EnvEndpoints(aws_types::os_shim_internal::Env);

impl aws_types::service_config::LoadServiceConfig for EnvEndpoints {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        let (value, _) = aws_runtime::env_config::EnvConfigValue::new()
            .env(key.env())
            .service_id(key.service_id())
            .load(&self.0, None)?;
        Some(value.into_owned())
    }
}

/// The table's and the queues' SDK clients, built once, and the configuration. Cheap to clone.
///
/// The providers' clients (SES, SNS, End User Messaging) are made when a provider is asked
/// for ([`AwsBackend::email`], ...), not here: a function that sends nothing never asks, so it
/// does not link them (docs/deploy.md, "The functions' size").
#[derive(Clone, Debug)]
pub struct AwsBackend {
    config: AwsConfig,
    sdk: SdkConfig,
    dynamo: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    /// Made when first asked for, then shared by SMS and push (and the instance's clones).
    sns: std::sync::Arc<std::sync::OnceLock<aws_sdk_sns::Client>>,
}

impl AwsBackend {
    /// Reads [`AwsConfig`] and the SDK's configuration (region, credentials, `AWS_ENDPOINT_URL`)
    /// from the environment.
    pub async fn from_env() -> Result<Self, ConfigError> {
        let config = AwsConfig::from_env()?;
        Ok(Self::from_config(config).await)
    }

    /// The given configuration, with the SDK's configuration from the environment.
    pub async fn from_config(config: AwsConfig) -> Self {
        Self::from_sdk_config(&load_sdk_config().await, config)
    }

    /// The given configurations (for tests and custom setups).
    pub fn from_sdk_config(sdk: &SdkConfig, config: AwsConfig) -> Self {
        // Every client counts its requests (`requests::RequestCounter`).
        let counted = requests::RequestCounter;
        Self {
            config,
            sdk: sdk.clone(),
            dynamo: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(sdk).interceptor(counted).build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(sdk).interceptor(counted).build()),
            sns: Default::default(),
        }
    }

    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    /// The SDK configuration the clients were made from: loaded once at start-up, for any other
    /// client a function makes (SSM's for the signing key, API Gateway's for live pushes).
    pub fn sdk_config(&self) -> &SdkConfig {
        &self.sdk
    }

    /// The table through a client whose requests are not counted (see [`requests`]): for
    /// test support that is no part of the system's cost, such as the fake providers' record
    /// of what they were asked to send.
    pub fn uncounted_table(&self) -> DynamoTable {
        DynamoTable::new(aws_sdk_dynamodb::Client::new(&self.sdk), self.config.table.clone())
    }

    /// The table named by the configuration.
    pub fn table(&self) -> DynamoTable {
        DynamoTable::new(self.dynamo.clone(), self.config.table.clone())
    }

    /// A reader of the table's stream (for the local runtime).
    pub fn change_feed(&self) -> DynamoChangeFeed {
        DynamoChangeFeed::new(self.dynamo.clone(), self.streams_client(), self.config.table.clone())
    }

    pub fn queues(&self) -> SqsQueues {
        SqsQueues::new(self.sqs.clone(), &self.config)
    }

    pub fn email(&self) -> SesEmail {
        SesEmail::new(self.ses_client(), self.config.email_from.clone())
            .with_configuration_set(self.config.ses_configuration_set.clone())
    }

    pub fn sms(&self) -> SnsSms {
        SnsSms::new(self.sns_client())
    }

    /// SMS through End User Messaging, with the configured origination identity and
    /// configuration set.
    pub fn end_user_messaging_sms(&self) -> EndUserMessagingSms {
        EndUserMessagingSms::new(aws_sdk_pinpointsmsvoicev2::Client::from_conf(
            aws_sdk_pinpointsmsvoicev2::config::Builder::from(&self.sdk).interceptor(requests::RequestCounter).build(),
        ))
        .with_identity(self.config.sms_origination_identity.clone(), self.config.sms_configuration_set.clone())
    }

    /// One of the SMS providers.
    pub fn sms_provider(&self, which: SmsProvider) -> std::sync::Arc<dyn tidings_core::ports::Provider> {
        match which {
            SmsProvider::Sns => std::sync::Arc::new(self.sms()),
            SmsProvider::EndUserMessaging => std::sync::Arc::new(self.end_user_messaging_sms()),
        }
    }

    pub fn push(&self) -> SnsPush {
        SnsPush::new(self.sns_client())
            .with_platform_apps(self.config.sns_apns_arn.clone(), self.config.sns_fcm_arn.clone())
    }

    pub fn dynamo_client(&self) -> &aws_sdk_dynamodb::Client {
        &self.dynamo
    }
    /// Made when asked, not with the others: only the local runtime reads the stream (Lambda's
    /// event source mapping reads it for the functions), so no function links this client.
    pub fn streams_client(&self) -> aws_sdk_dynamodbstreams::Client {
        aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&self.sdk).interceptor(requests::RequestCounter).build(),
        )
    }
    pub fn sqs_client(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }
    /// The SNS client (SMS and push), made at the first call.
    pub fn sns_client(&self) -> aws_sdk_sns::Client {
        self.sns
            .get_or_init(|| {
                aws_sdk_sns::Client::from_conf(
                    aws_sdk_sns::config::Builder::from(&self.sdk).interceptor(requests::RequestCounter).build(),
                )
            })
            .clone()
    }
    /// A new SES client; it shares the SDK configuration's HTTP connections.
    pub fn ses_client(&self) -> aws_sdk_sesv2::Client {
        aws_sdk_sesv2::Client::from_conf(
            aws_sdk_sesv2::config::Builder::from(&self.sdk).interceptor(requests::RequestCounter).build(),
        )
    }
}

#[cfg(test)]
mod lambda_config_tests {
    use aws_types::os_shim_internal::Env;
    use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};

    use super::EnvEndpoints;

    fn endpoint(env: &EnvEndpoints, service: &str) -> Option<String> {
        let key =
            ServiceConfigKey::builder().service_id(service).env("AWS_ENDPOINT_URL").profile("endpoint_url").build();
        env.load_config(key.expect("a complete key"))
    }

    #[test]
    fn a_services_own_endpoint_variable_wins_over_the_common_one() {
        let env = EnvEndpoints(Env::from_slice(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5005"),
            ("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:5006"),
            ("AWS_ENDPOINT_URL_PINPOINT_SMS_VOICE_V2", "http://127.0.0.1:5007"),
        ]));
        assert_eq!(endpoint(&env, "DynamoDB").as_deref(), Some("http://127.0.0.1:5006"));
        assert_eq!(endpoint(&env, "SQS").as_deref(), Some("http://127.0.0.1:5005"));
        assert_eq!(endpoint(&env, "Pinpoint SMS Voice V2").as_deref(), Some("http://127.0.0.1:5007"));
        assert_eq!(endpoint(&EnvEndpoints(Env::from_slice(&[])), "SQS"), None, "AWS's own endpoints");
    }
}
