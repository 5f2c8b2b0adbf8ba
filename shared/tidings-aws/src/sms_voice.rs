//! SMS through AWS End User Messaging SMS (`pinpoint-sms-voice-v2` `SendTextMessage`): the
//! second SMS provider beside SNS ([`crate::SnsSms`]); either may be the primary
//! (`TIDINGS_SMS_PRIMARY` / `TIDINGS_SMS_SECONDARY`, docs/configuration.md, "SMS failover").
//!
//! `SendTextMessage` takes no client token: the delivery key goes in its `Context` map, which
//! End User Messaging copies into every event of the message (delivered, failed, ...), so an
//! event names the delivery it is about.

use async_trait::async_trait;
use aws_sdk_pinpointsmsvoicev2::config::http::HttpResponse;
use aws_sdk_pinpointsmsvoicev2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_pinpointsmsvoicev2::operation::send_text_message::SendTextMessageError;
use aws_sdk_pinpointsmsvoicev2::types::MessageType;
use sha2::{Digest, Sha256};
use tidings_core::ports::{OutboundMessage, PermanentCode, Provider, ProviderError, ProviderReceipt};

use crate::error::{Kind, classify};

/// The `Context` key that carries the delivery key.
pub const DELIVERY_KEY_CONTEXT: &str = "tidings_delivery_key";

/// The longest `Context` value End User Messaging takes; a longer delivery key goes as its
/// SHA-256 (hex), the same on every retry.
const CONTEXT_VALUE_MAX: usize = 800;

/// The delivery key as it goes in `Context`.
pub fn context_delivery_key(key: &str) -> String {
    if key.len() <= CONTEXT_VALUE_MAX { key.to_owned() } else { hex::encode(Sha256::digest(key.as_bytes())) }
}

/// SMS through End User Messaging `SendTextMessage`, from the configured origination identity
/// (else the account's default for the destination) and configuration set, if any.
#[derive(Clone, Debug)]
pub struct EndUserMessagingSms {
    client: aws_sdk_pinpointsmsvoicev2::Client,
    origination_identity: Option<String>,
    configuration_set: Option<String>,
}

impl EndUserMessagingSms {
    pub fn new(client: aws_sdk_pinpointsmsvoicev2::Client) -> Self {
        Self { client, origination_identity: None, configuration_set: None }
    }

    /// `TIDINGS_SMS_ORIGINATION_IDENTITY`, `TIDINGS_SMS_CONFIGURATION_SET`.
    pub fn with_identity(mut self, origination_identity: Option<String>, configuration_set: Option<String>) -> Self {
        self.origination_identity = origination_identity;
        self.configuration_set = configuration_set;
        self
    }
}

fn transient(reason: String, retry_after: Option<std::time::Duration>) -> ProviderError {
    ProviderError::Transient { reason, retry_after }
}

fn permanent(reason: String, code: PermanentCode) -> ProviderError {
    ProviderError::Permanent { reason, code }
}

/// Throttling, quotas (the spend limit, parts per second), 5xx and the account's own set-up
/// (access denied, an origination identity or configuration set not found) are transient: they
/// are the provider's side, so they count against its breaker and the SMS fails over to the
/// other provider. A refused destination (opted out, not a mobile number, invalid) is
/// permanent: the other provider would refuse it too.
fn sms_voice_error(err: SdkError<SendTextMessageError, HttpResponse>) -> ProviderError {
    let c = classify(&err);
    if c.is_transient() {
        return transient(c.message, c.retry_after);
    }
    let about_destination = |m: Option<&str>| {
        let m = m.unwrap_or_default().to_ascii_lowercase();
        m.contains("destination") || m.contains("phone number") || m.contains("opted out") || m.contains("opt-out")
    };
    match err.as_service_error() {
        Some(SendTextMessageError::ThrottlingException(_))
        | Some(SendTextMessageError::ServiceQuotaExceededException(_))
        | Some(SendTextMessageError::InternalServerException(_))
        | Some(SendTextMessageError::AccessDeniedException(_))
        | Some(SendTextMessageError::ResourceNotFoundException(_)) => transient(c.message, c.retry_after),
        Some(SendTextMessageError::ConflictException(e)) => {
            let code =
                if about_destination(e.meta().message()) { PermanentCode::BadAddress } else { PermanentCode::Rejected };
            permanent(c.message, code)
        }
        Some(SendTextMessageError::ValidationException(e)) => {
            let code =
                if about_destination(e.meta().message()) { PermanentCode::BadAddress } else { PermanentCode::Rejected };
            permanent(c.message, code)
        }
        _ => match c.kind {
            Kind::Transient => transient(c.message, c.retry_after),
            Kind::Service | Kind::Construction => permanent(c.message, PermanentCode::Rejected),
        },
    }
}

#[async_trait]
impl Provider for EndUserMessagingSms {
    fn name(&self) -> &str {
        "end-user-messaging"
    }

    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let message_type = if message.marketing { MessageType::Promotional } else { MessageType::Transactional };
        let mut request = self
            .client
            .send_text_message()
            .destination_phone_number(&message.to)
            .message_body(&message.body)
            .message_type(message_type)
            .set_origination_identity(self.origination_identity.clone())
            .set_configuration_set_name(self.configuration_set.clone());
        if !message.idempotency_key.is_empty() {
            request = request.context(DELIVERY_KEY_CONTEXT, context_delivery_key(&message.idempotency_key));
        }
        let out = request.send().await.map_err(sms_voice_error)?;
        Ok(ProviderReceipt { provider_message_id: out.message_id.unwrap_or_default() })
    }
}

#[cfg(test)]
mod tests {
    //! Both SMS providers' requests against typed SDK mocks: End User Messaging is served by no
    //! emulator here (moto answers 500 to `SendTextMessage`), and SNS's request shape is only
    //! visible this way.

    use aws_sdk_pinpointsmsvoicev2 as sms_voice;
    use aws_sdk_pinpointsmsvoicev2::operation::send_text_message::SendTextMessageOutput;
    use aws_smithy_mocks::mock;
    use serde_json::json;
    use tidings_core::ports::{Channel, OutboundMessage, PermanentCode, Provider, ProviderError};

    use super::*;

    fn sms(to: &str, marketing: bool) -> OutboundMessage {
        OutboundMessage {
            channel: Channel::Sms,
            to: to.into(),
            subject: None,
            body: "Your code is 123456".into(),
            html: None,
            headers: vec![],
            idempotency_key: "n1:u1:sms".into(),
            marketing,
            tenant: "acme".into(),
            notification_id: "n1".into(),
            user_id: "u1".into(),
            attempt: 1,
        }
    }

    fn key_of(r: &sms_voice::operation::send_text_message::SendTextMessageInput) -> Option<&str> {
        r.context().and_then(|c| c.get(DELIVERY_KEY_CONTEXT)).map(String::as_str)
    }

    #[tokio::test]
    async fn a_transactional_sms_names_destination_identity_configuration_set_and_delivery_key() {
        let ok = mock!(sms_voice::Client::send_text_message)
            .match_requests(|r| {
                r.destination_phone_number() == Some("+15555550100")
                    && r.message_body() == Some("Your code is 123456")
                    && r.message_type() == Some(&MessageType::Transactional)
                    && r.origination_identity() == Some("pool-0123")
                    && r.configuration_set_name() == Some("tidings-sms")
                    && key_of(r) == Some("n1:u1:sms")
            })
            .then_output(|| SendTextMessageOutput::builder().message_id("eum-1").build());
        let provider = EndUserMessagingSms::new(client!(sms_voice, [&ok]))
            .with_identity(Some("pool-0123".into()), Some("tidings-sms".into()));
        assert_eq!(provider.name(), "end-user-messaging");
        let receipt = provider.send(&sms("+15555550100", false)).await.unwrap();
        assert_eq!(receipt.provider_message_id, "eum-1");
        assert_eq!(ok.num_calls(), 1);
    }

    #[tokio::test]
    async fn a_marketing_sms_is_promotional_and_unset_identities_are_left_out() {
        let ok = mock!(sms_voice::Client::send_text_message)
            .match_requests(|r| {
                r.message_type() == Some(&MessageType::Promotional)
                    && r.origination_identity().is_none()
                    && r.configuration_set_name().is_none()
                    && key_of(r) == Some("n1:u1:sms")
            })
            .then_output(|| SendTextMessageOutput::builder().message_id("eum-2").build());
        let provider = EndUserMessagingSms::new(client!(sms_voice, [&ok]));
        assert_eq!(provider.send(&sms("+15555550100", true)).await.unwrap().provider_message_id, "eum-2");
        assert_eq!(ok.num_calls(), 1);
    }

    #[tokio::test]
    async fn a_delivery_key_too_long_for_context_goes_as_its_digest() {
        let long = format!("n1:{}:sms", "u".repeat(900));
        let digest = context_delivery_key(&long);
        assert_eq!(digest.len(), 64);
        assert_eq!(digest, context_delivery_key(&long), "the same on every retry");
        assert_eq!(context_delivery_key("n1:u1:sms"), "n1:u1:sms");
        let expected = digest.clone();
        let ok = mock!(sms_voice::Client::send_text_message)
            .match_requests(move |r| key_of(r) == Some(expected.as_str()))
            .then_output(|| SendTextMessageOutput::builder().message_id("eum-3").build());
        let provider = EndUserMessagingSms::new(client!(sms_voice, [&ok]));
        let mut m = sms("+15555550100", false);
        m.idempotency_key = long;
        assert_eq!(provider.send(&m).await.unwrap().provider_message_id, "eum-3");
    }

    fn error(code: &str, message: &str) -> String {
        json!({"__type": code, "message": message, "Message": message}).to_string()
    }

    #[tokio::test]
    async fn the_providers_side_is_transient_and_a_refused_destination_is_permanent() {
        let answer = |to: &'static str, status: u16, body: String| {
            mock!(sms_voice::Client::send_text_message)
                .match_requests(move |r| r.destination_phone_number() == Some(to))
                .sequence()
                .http_status(status, Some(body))
                .build()
        };
        let throttled = answer("+15555550001", 400, error("ThrottlingException", "Rate exceeded"));
        let internal = answer("+15555550002", 500, error("InternalServerException", "Internal error"));
        let spend = answer("+15555550003", 402, error("ServiceQuotaExceededException", "MONTHLY_SPEND_LIMIT_REACHED"));
        let no_pool = answer("+15555550004", 404, error("ResourceNotFoundException", "Pool pool-x not found"));
        let opted_out = answer(
            "+15555550005",
            409,
            error(
                "ConflictException",
                "The destination phone number is opted out (DESTINATION_PHONE_NUMBER_OPTED_OUT)",
            ),
        );
        let invalid = answer(
            "+15555550006",
            400,
            error("ValidationException", "Invalid destination phone number: not a valid E.164 number"),
        );
        let provider = EndUserMessagingSms::new(client!(
            sms_voice,
            [&throttled, &internal, &spend, &no_pool, &opted_out, &invalid]
        ));
        for to in ["+15555550001", "+15555550002", "+15555550003", "+15555550004"] {
            let e = provider.send(&sms(to, false)).await.unwrap_err();
            assert!(matches!(e, ProviderError::Transient { .. }), "{to}: {e:?}");
            // The breaker counts a throttle as the provider asking for less, not as a failure;
            // the others count against it.
            assert_eq!(tidings_core::gates::is_rate_limited(&e), to == "+15555550001", "{to}: {e:?}");
        }
        for to in ["+15555550005", "+15555550006"] {
            let e = provider.send(&sms(to, false)).await.unwrap_err();
            assert!(matches!(e, ProviderError::Permanent { code: PermanentCode::BadAddress, .. }), "{to}: {e:?}");
        }
    }

    #[tokio::test]
    async fn sns_sms_carries_the_category_and_the_delivery_key_as_attributes() {
        use aws_sdk_sns::operation::publish::PublishOutput;
        let attr = |r: &aws_sdk_sns::operation::publish::PublishInput, name: &str| {
            r.message_attributes().and_then(|a| a.get(name)).and_then(|v| v.string_value()).map(str::to_owned)
        };
        let transactional = mock!(aws_sdk_sns::Client::publish)
            .match_requests(move |r| {
                r.phone_number() == Some("+15555550100")
                    && attr(r, "AWS.SNS.SMS.SMSType").as_deref() == Some("Transactional")
                    && attr(r, crate::SNS_DELIVERY_KEY_ATTRIBUTE).as_deref() == Some("n1:u1:sms")
            })
            .then_output(|| PublishOutput::builder().message_id("sns-1").build());
        let promotional = mock!(aws_sdk_sns::Client::publish)
            .match_requests(move |r| {
                r.phone_number() == Some("+15555550199")
                    && attr(r, "AWS.SNS.SMS.SMSType").as_deref() == Some("Promotional")
                    && attr(r, crate::SNS_DELIVERY_KEY_ATTRIBUTE).as_deref() == Some("n1:u1:sms")
            })
            .then_output(|| PublishOutput::builder().message_id("sns-2").build());
        let client = client!(aws_sdk_sns, [&transactional, &promotional]);
        let sns = crate::SnsSms::new(client);
        assert_eq!(sns.send(&sms("+15555550100", false)).await.unwrap().provider_message_id, "sns-1");
        assert_eq!(sns.send(&sms("+15555550199", true)).await.unwrap().provider_message_id, "sns-2");
    }
}
