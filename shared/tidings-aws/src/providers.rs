//! Channel providers on AWS: [`SesEmail`] (SES v2), [`SnsSms`] and [`SnsPush`] (SNS).
//!
//! Errors are classified once: throttling, 429, 5xx, timeouts and connection failures are
//! transient (with the `Retry-After` header when the answer carried one); invalid parameters,
//! rejected messages and disabled endpoints are permanent.

use async_trait::async_trait;
use aws_sdk_sesv2::config::http::HttpResponse;
use aws_sdk_sesv2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sesv2::operation::send_email::SendEmailError;
use aws_sdk_sesv2::types::{Body, Content, Destination, EmailContent, Message, MessageHeader};
use aws_sdk_sns::operation::publish::PublishError;
use aws_sdk_sns::types::MessageAttributeValue;
use tidings_core::ports::{OutboundMessage, PermanentCode, Platform, Provider, ProviderError, ProviderReceipt};

use crate::error::{Classified, Kind, classify};

fn transient(c: Classified) -> ProviderError {
    ProviderError::Transient { reason: c.message, retry_after: c.retry_after }
}

fn permanent(reason: String, code: PermanentCode) -> ProviderError {
    ProviderError::Permanent { reason, code }
}

/// Anything not recognised: transient when the classification says so, else rejected.
fn fallback(c: Classified) -> ProviderError {
    match c.kind {
        Kind::Transient => transient(c),
        Kind::Service | Kind::Construction => permanent(c.message, PermanentCode::Rejected),
    }
}

fn ses_error(err: SdkError<SendEmailError, HttpResponse>) -> ProviderError {
    let c = classify(&err);
    if c.is_transient() {
        return transient(c);
    }
    match err.as_service_error() {
        Some(SendEmailError::TooManyRequestsException(_))
        | Some(SendEmailError::LimitExceededException(_))
        | Some(SendEmailError::SendingPausedException(_)) => transient(c),
        Some(SendEmailError::MessageRejected(_))
        | Some(SendEmailError::MailFromDomainNotVerifiedException(_))
        | Some(SendEmailError::AccountSuspendedException(_))
        | Some(SendEmailError::NotFoundException(_)) => permanent(c.message, PermanentCode::Rejected),
        Some(SendEmailError::BadRequestException(e)) => {
            let m = e.meta().message().unwrap_or_default().to_ascii_lowercase();
            let code = if m.contains("address") || m.contains("destination") || m.contains("recipient") {
                PermanentCode::BadAddress
            } else {
                PermanentCode::Rejected
            };
            permanent(c.message, code)
        }
        _ => match c.code() {
            "MessageRejected" | "InvalidParameterValue" | "ValidationException" => {
                permanent(c.message, PermanentCode::Rejected)
            }
            _ => fallback(c),
        },
    }
}

/// How a publish error reads for one channel (`push`: a disabled or deleted endpoint is an
/// invalid token).
fn sns_error(err: SdkError<PublishError, HttpResponse>, push: bool) -> ProviderError {
    let c = classify(&err);
    if c.is_transient() {
        return transient(c);
    }
    let gone = if push { PermanentCode::InvalidToken } else { PermanentCode::BadAddress };
    match err.as_service_error() {
        Some(PublishError::EndpointDisabledException(_)) => permanent(c.message, PermanentCode::InvalidToken),
        Some(PublishError::NotFoundException(_)) => permanent(c.message, gone),
        Some(PublishError::InvalidParameterException(_))
        | Some(PublishError::InvalidParameterValueException(_))
        | Some(PublishError::ValidationException(_)) => {
            let code = if push { PermanentCode::InvalidToken } else { PermanentCode::BadAddress };
            permanent(c.message, code)
        }
        Some(PublishError::InternalErrorException(_)) | Some(PublishError::KmsThrottlingException(_)) => transient(c),
        Some(PublishError::PlatformApplicationDisabledException(_))
        | Some(PublishError::AuthorizationErrorException(_))
        | Some(PublishError::InvalidSecurityException(_)) => permanent(c.message, PermanentCode::Rejected),
        _ => match c.code() {
            "EndpointDisabled" => permanent(c.message, PermanentCode::InvalidToken),
            "NotFound" => permanent(c.message, gone),
            "InvalidParameter" | "ParameterValueInvalid" => permanent(c.message, gone),
            "Throttled" | "ThrottledException" => transient(c),
            _ => fallback(c),
        },
    }
}

fn build_error(e: impl std::fmt::Display) -> ProviderError {
    permanent(format!("message could not be built: {e}"), PermanentCode::Rejected)
}

/// Email through SES v2 `SendEmail` (simple content: subject, the text part and the HTML part,
/// extra headers).
#[derive(Clone, Debug)]
pub struct SesEmail {
    client: aws_sdk_sesv2::Client,
    from: String,
    /// Named on every send, so SES publishes its events (delivery, bounce, complaint, open,
    /// click) to the configuration set's destination (`TIDINGS_SES_CONFIGURATION_SET`).
    configuration_set: Option<String>,
}

impl SesEmail {
    pub fn new(client: aws_sdk_sesv2::Client, from: impl Into<String>) -> Self {
        Self { client, from: from.into(), configuration_set: None }
    }

    pub fn with_configuration_set(mut self, name: Option<String>) -> Self {
        self.configuration_set = name.filter(|n| !n.is_empty());
        self
    }
}

#[async_trait]
impl Provider for SesEmail {
    fn name(&self) -> &str {
        "ses"
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let utf8 = |s: &str| Content::builder().data(s).charset("UTF-8").build().map_err(build_error);
        let headers = message
            .headers
            .iter()
            .map(|(n, v)| MessageHeader::builder().name(n).value(v).build().map_err(build_error))
            .collect::<Result<Vec<_>, _>>()?;
        let simple = Message::builder()
            .subject(utf8(message.subject.as_deref().unwrap_or_default())?)
            // Both parts (docs/security.md, "Email parts"): readers show the HTML, or the text without it.
            .body(match &message.html {
                Some(html) => Body::builder().text(utf8(&message.body)?).html(utf8(html)?).build(),
                None => Body::builder().text(utf8(&message.body)?).build(),
            })
            .set_headers(if headers.is_empty() { None } else { Some(headers) })
            .build();
        let out = self
            .client
            .send_email()
            .from_email_address(&self.from)
            .set_configuration_set_name(self.configuration_set.clone())
            .destination(Destination::builder().to_addresses(&message.to).build())
            .content(EmailContent::builder().simple(simple).build())
            .send()
            .await
            .map_err(ses_error)?;
        Ok(ProviderReceipt { provider_message_id: out.message_id.unwrap_or_default() })
    }
}

/// The SNS message attribute that carries an SMS's delivery key.
pub const SNS_DELIVERY_KEY_ATTRIBUTE: &str = "tidings.delivery-key";

/// SMS through SNS `Publish` with a phone number.
#[derive(Clone, Debug)]
pub struct SnsSms {
    client: aws_sdk_sns::Client,
}

impl SnsSms {
    pub fn new(client: aws_sdk_sns::Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl Provider for SnsSms {
    fn name(&self) -> &str {
        "sns-sms"
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let sms_type = MessageAttributeValue::builder()
            .data_type("String")
            .string_value(if message.marketing { "Promotional" } else { "Transactional" })
            .build()
            .map_err(build_error)?;
        let mut req = self
            .client
            .publish()
            .phone_number(&message.to)
            .message(&message.body)
            .message_attributes("AWS.SNS.SMS.SMSType", sms_type);
        // SNS has no idempotency key for SMS: the delivery key goes as an attribute of the
        // publish (docs/configuration.md, "SMS failover"), which SNS does not deduplicate on.
        if !message.idempotency_key.is_empty() {
            let key = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(&message.idempotency_key)
                .build()
                .map_err(build_error)?;
            req = req.message_attributes(SNS_DELIVERY_KEY_ATTRIBUTE, key);
        }
        let out = req.send().await.map_err(|e| sns_error(e, false))?;
        Ok(ProviderReceipt { provider_message_id: out.message_id.unwrap_or_default() })
    }
}

/// Push through SNS mobile push. A device token becomes a platform endpoint of the platform's
/// application (`CreatePlatformEndpoint`, idempotent for the same token); sends `Publish` to
/// the endpoint ARN with a per-platform JSON message. The delivery key (`devices::collapse_id`:
/// itself, or its digest when longer than APNs's 64 bytes) is the APNs collapse id and the FCM
/// collapse key and tag, so that a duplicate collapses on the device. A disabled or deleted endpoint
/// (APNs 410, FCM `UNREGISTERED`) answers `InvalidToken`.
#[derive(Clone, Debug)]
pub struct SnsPush {
    client: aws_sdk_sns::Client,
    apns_arn: Option<String>,
    fcm_arn: Option<String>,
}

impl SnsPush {
    pub fn new(client: aws_sdk_sns::Client) -> Self {
        Self { client, apns_arn: None, fcm_arn: None }
    }

    /// The platform applications (`TIDINGS_SNS_APNS_ARN`, `TIDINGS_SNS_FCM_ARN`).
    pub fn with_platform_apps(mut self, apns_arn: Option<String>, fcm_arn: Option<String>) -> Self {
        self.apns_arn = apns_arn;
        self.fcm_arn = fcm_arn;
        self
    }
}

/// The SNS message of a push: `default`, plus APNs and FCM payloads carrying the collapse key.
pub fn push_payload(message: &OutboundMessage) -> String {
    let title = message.subject.clone().unwrap_or_default();
    let key = &tidings_core::people::devices::collapse_id(&message.idempotency_key);
    let apns = serde_json::json!({"aps": {"alert": {"title": title, "body": message.body}}});
    let fcm =
        serde_json::json!({"notification": {"title": title, "body": message.body, "tag": key}, "collapse_key": key});
    let fcm_v1 = serde_json::json!({"fcmV1Message": {"message": {"android": {"collapse_key": key,
        "notification": {"title": title, "body": message.body, "tag": key}}}}});
    serde_json::json!({
        "default": message.body,
        "APNS": apns.to_string(),
        "APNS_SANDBOX": apns.to_string(),
        "GCM": if message.idempotency_key.is_empty() { fcm.to_string() } else { fcm_v1.to_string() },
    })
    .to_string()
}

#[async_trait]
impl Provider for SnsPush {
    fn name(&self) -> &str {
        "sns-push"
    }

    async fn register_device(&self, platform: Platform, token: &str) -> Result<String, ProviderError> {
        let arn = match platform {
            Platform::Ios => self.apns_arn.as_deref(),
            Platform::Android => self.fcm_arn.as_deref(),
        };
        let Some(arn) = arn else {
            return Err(permanent(
                format!("no SNS platform application configured for {}", platform.as_str()),
                PermanentCode::Rejected,
            ));
        };
        let out =
            self.client.create_platform_endpoint().platform_application_arn(arn).token(token).send().await.map_err(
                |e| {
                    let c = classify(&e);
                    if c.is_transient() { transient(c) } else { permanent(c.message, PermanentCode::InvalidToken) }
                },
            )?;
        out.endpoint_arn.ok_or_else(|| ProviderError::transient("CreatePlatformEndpoint answered no ARN"))
    }

    async fn unregister_device(&self, address: &str) -> Result<(), ProviderError> {
        if !address.starts_with("arn:") {
            return Ok(());
        }
        self.client.delete_endpoint().endpoint_arn(address).send().await.map_err(|e| fallback(classify(&e)))?;
        Ok(())
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut req =
            self.client.publish().target_arn(&message.to).message_structure("json").message(push_payload(message));
        // APNs takes at most 64 bytes: `collapse_id` keeps to that.
        if !message.idempotency_key.is_empty() {
            let collapse = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(tidings_core::people::devices::collapse_id(&message.idempotency_key))
                .build()
                .map_err(build_error)?;
            req = req.message_attributes("AWS.SNS.MOBILE.APNS.COLLAPSE_ID", collapse);
        }
        let out = req.send().await.map_err(|e| sns_error(e, true))?;
        Ok(ProviderReceipt { provider_message_id: out.message_id.unwrap_or_default() })
    }
}
