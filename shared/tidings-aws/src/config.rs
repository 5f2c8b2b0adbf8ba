//! The AWS backend's configuration: read once from the environment.
//!
//! The endpoint is never configured here: the SDK reads the standard `AWS_ENDPOINT_URL` (and
//! `AWS_REGION`, credentials, ...) itself, so the same code talks to AWS, LocalStack or moto.

use std::collections::BTreeMap;

use tidings_core::config::Settings;

/// How [`crate::SqsQueues::redrive`] moves a DLQ back to its queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedriveMode {
    /// SQS `StartMessageMoveTask` (what the console's "redrive" does). The default.
    #[default]
    MessageMoveTask,
    /// Receive from the DLQ, send to the queue, delete from the DLQ, until the DLQ is empty.
    /// For emulators (moto) that lack `StartMessageMoveTask`.
    ReceiveAndResend,
}

impl RedriveMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "message-move-task" => Some(RedriveMode::MessageMoveTask),
            "receive-and-resend" => Some(RedriveMode::ReceiveAndResend),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RedriveMode::MessageMoveTask => "message-move-task",
            RedriveMode::ReceiveAndResend => "receive-and-resend",
        }
    }
}

/// An SMS provider on AWS: either may be the primary, the other the failover
/// (`TIDINGS_SMS_PRIMARY`, `TIDINGS_SMS_SECONDARY`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SmsProvider {
    /// SNS `Publish` to a phone number ([`crate::SnsSms`]).
    #[default]
    Sns,
    /// AWS End User Messaging SMS `SendTextMessage` ([`crate::EndUserMessagingSms`]).
    EndUserMessaging,
}

impl SmsProvider {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "sns" => Some(SmsProvider::Sns),
            "end-user-messaging" => Some(SmsProvider::EndUserMessaging),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SmsProvider::Sns => "sns",
            SmsProvider::EndUserMessaging => "end-user-messaging",
        }
    }
}

/// A configuration value that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}: {reason}")]
    Invalid { var: &'static str, reason: String },
    /// A variable of the wrong kind ([`tidings_core::config`] checks every one).
    #[error(transparent)]
    Settings(#[from] tidings_core::config::ConfigError),
}

/// Everything the AWS backend reads from the `TIDINGS_*` variables (once); each variable's
/// default and meaning are in [`tidings_core::config::VARIABLES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsConfig {
    pub table: String,
    pub queue_prefix: String,
    /// Explicit queue URLs by real queue name suffix: key `requests-high` or `requests-high-dlq`.
    pub queue_urls: BTreeMap<String, String>,
    pub email_from: String,
    /// The SES configuration set sends name (`TIDINGS_SES_CONFIGURATION_SET`).
    pub ses_configuration_set: Option<String>,
    pub redrive_mode: RedriveMode,
    pub max_receives: u32,
    /// SNS platform applications that device tokens become endpoints of.
    pub sns_apns_arn: Option<String>,
    pub sns_fcm_arn: Option<String>,
    pub sms_primary: SmsProvider,
    /// The SMS failover provider; never the primary.
    pub sms_secondary: Option<SmsProvider>,
    pub sms_origination_identity: Option<String>,
    pub sms_configuration_set: Option<String>,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            table: "tidings".into(),
            queue_prefix: "tidings-".into(),
            queue_urls: BTreeMap::new(),
            email_from: "no-reply@tidings.local".into(),
            ses_configuration_set: None,
            redrive_mode: RedriveMode::MessageMoveTask,
            max_receives: 5,
            sns_apns_arn: None,
            sns_fcm_arn: None,
            sms_primary: SmsProvider::Sns,
            sms_secondary: None,
            sms_origination_identity: None,
            sms_configuration_set: None,
        }
    }
}

fn sms_provider(var: &'static str, v: &str) -> Result<SmsProvider, ConfigError> {
    SmsProvider::parse(v)
        .ok_or_else(|| ConfigError::Invalid { var, reason: format!("{v:?} is neither sns nor end-user-messaging") })
}

impl AwsConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(std::env::vars())
    }

    /// Reads the given variables (for tests).
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        Self::from_settings(&Settings::from_vars(vars)?)
    }

    /// The AWS backend's part of the checked variables.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        let text = |name| s.get(name).map(str::to_owned);
        let mut config = AwsConfig {
            table: s.value("TIDINGS_TABLE").to_owned(),
            // An empty prefix is a prefix: queue names as they are.
            queue_prefix: s.raw("TIDINGS_QUEUE_PREFIX").unwrap_or(s.value("TIDINGS_QUEUE_PREFIX")).to_owned(),
            queue_urls: s
                .queue_urls()
                .map(|(name, url)| (name.to_ascii_lowercase().replace('_', "-"), url.to_owned()))
                .collect(),
            email_from: s.value("TIDINGS_EMAIL_FROM").to_owned(),
            ses_configuration_set: text("TIDINGS_SES_CONFIGURATION_SET"),
            redrive_mode: RedriveMode::default(),
            max_receives: s.number("TIDINGS_MAX_RECEIVES") as u32,
            sns_apns_arn: text("TIDINGS_SNS_APNS_ARN"),
            sns_fcm_arn: text("TIDINGS_SNS_FCM_ARN"),
            sms_primary: sms_provider("TIDINGS_SMS_PRIMARY", s.value("TIDINGS_SMS_PRIMARY"))?,
            sms_secondary: None,
            sms_origination_identity: text("TIDINGS_SMS_ORIGINATION_IDENTITY"),
            sms_configuration_set: text("TIDINGS_SMS_CONFIGURATION_SET"),
        };
        if let Some(v) = s.get("TIDINGS_REDRIVE_MODE") {
            config.redrive_mode = RedriveMode::parse(v).ok_or_else(|| ConfigError::Invalid {
                var: "TIDINGS_REDRIVE_MODE",
                reason: format!("{v:?} is neither message-move-task nor receive-and-resend"),
            })?;
        }
        if let Some(v) = s.get("TIDINGS_SMS_SECONDARY").filter(|v| *v != "none") {
            config.sms_secondary = Some(sms_provider("TIDINGS_SMS_SECONDARY", v)?);
        }
        if config.sms_secondary == Some(config.sms_primary) {
            return Err(ConfigError::Invalid {
                var: "TIDINGS_SMS_SECONDARY",
                reason: format!(
                    "{:?} is the primary too (TIDINGS_SMS_PRIMARY): fail over to the other provider, or none",
                    config.sms_primary.as_str()
                ),
            });
        }
        Ok(config)
    }

    /// The real name of a logical queue.
    pub fn queue_name(&self, logical: &str) -> String {
        format!("{}{logical}", self.queue_prefix)
    }

    /// The real name of a logical queue's DLQ.
    pub fn dlq_name(&self, logical: &str) -> String {
        format!("{}{logical}-dlq", self.queue_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = AwsConfig::from_vars(Vec::<(String, String)>::new()).unwrap();
        assert_eq!(c, AwsConfig::default());
        assert_eq!(c.queue_name("requests-high"), "tidings-requests-high");
        assert_eq!(c.dlq_name("requests-high"), "tidings-requests-high-dlq");
    }

    #[test]
    fn reads_vars() {
        let c = AwsConfig::from_vars([
            ("TIDINGS_TABLE", "t1"),
            ("TIDINGS_QUEUE_PREFIX", "x-"),
            ("TIDINGS_QUEUE_URL_REQUESTS_HIGH", "http://q/1"),
            ("TIDINGS_QUEUE_URL_REQUESTS_HIGH_DLQ", "http://q/2"),
            ("TIDINGS_EMAIL_FROM", "a@b.c"),
            ("TIDINGS_REDRIVE_MODE", "receive-and-resend"),
            ("TIDINGS_MAX_RECEIVES", "2"),
            ("UNRELATED", "1"),
        ])
        .unwrap();
        assert_eq!(c.table, "t1");
        assert_eq!(c.queue_name("a"), "x-a");
        assert_eq!(c.queue_urls.get("requests-high").map(String::as_str), Some("http://q/1"));
        assert_eq!(c.queue_urls.get("requests-high-dlq").map(String::as_str), Some("http://q/2"));
        assert_eq!(c.email_from, "a@b.c");
        assert_eq!(c.redrive_mode, RedriveMode::ReceiveAndResend);
        assert_eq!(c.max_receives, 2);
    }

    #[test]
    fn either_sms_provider_may_be_the_primary_and_never_both() {
        let c = AwsConfig::from_vars([
            ("TIDINGS_SMS_PRIMARY", "end-user-messaging"),
            ("TIDINGS_SMS_SECONDARY", "sns"),
            ("TIDINGS_SMS_ORIGINATION_IDENTITY", "pool-1"),
            ("TIDINGS_SMS_CONFIGURATION_SET", "tidings-sms"),
        ])
        .unwrap();
        assert_eq!((c.sms_primary, c.sms_secondary), (SmsProvider::EndUserMessaging, Some(SmsProvider::Sns)));
        assert_eq!(c.sms_origination_identity.as_deref(), Some("pool-1"));
        assert_eq!(c.sms_configuration_set.as_deref(), Some("tidings-sms"));
        let c = AwsConfig::from_vars([("TIDINGS_SMS_SECONDARY", "end-user-messaging")]).unwrap();
        assert_eq!((c.sms_primary, c.sms_secondary), (SmsProvider::Sns, Some(SmsProvider::EndUserMessaging)));
        let c = AwsConfig::from_vars([("TIDINGS_SMS_SECONDARY", "none")]).unwrap();
        assert_eq!(c.sms_secondary, None);
        for bad in [
            vec![("TIDINGS_SMS_SECONDARY", "sns")],
            vec![("TIDINGS_SMS_PRIMARY", "end-user-messaging"), ("TIDINGS_SMS_SECONDARY", "end-user-messaging")],
            // The embedded backend's fake is no AWS provider.
            vec![("TIDINGS_SMS_SECONDARY", "fake")],
            vec![("TIDINGS_SMS_PRIMARY", "twilio")],
        ] {
            let err = AwsConfig::from_vars(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("TIDINGS_SMS_"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn rejects_bad_values() {
        for (name, bad) in
            [("TIDINGS_REDRIVE_MODE", "sideways"), ("TIDINGS_MAX_RECEIVES", "0"), ("TIDINGS_MAX_RECEIVES", "five")]
        {
            let e = AwsConfig::from_vars([(name, bad)]).unwrap_err().to_string();
            assert!(e.starts_with(name), "{name}={bad}: {e}");
        }
    }
}
