//! Provider receipts: SES event notifications delivered through SNS (`POST /v1/callbacks/ses`),
//! and SNS mobile-push application events (`POST /v1/callbacks/push`, see [`apply_push_event`]).
//!
//! Nothing in a callback is believed before its SNS signature is verified: the canonical string
//! of the message's fields, RSA with SHA-1 (`SignatureVersion` 1) or SHA-256 (2), against the
//! certificate at `SigningCertURL`, which must be an `https://sns.<region>.amazonaws.com/….pem`
//! URL (anything else is refused before any fetch). A forged or altered message is refused.
//!
//! A valid signature only says SNS sent the message, not that it is ours: anyone can subscribe
//! the endpoint to a topic of their own. So before anything else the message's `TopicArn` must
//! be one of the stack's ([`check_topic`], `TIDINGS_SNS_TOPIC_ARNS`): a subscription to any
//! other topic is never confirmed, and its events are refused.
//!
//! Then: `SubscriptionConfirmation` is confirmed by fetching its `SubscribeURL` (same host
//! rule); a `Notification` older than [`EVENT_WINDOW`] (by its signed `Timestamp`) or whose
//! `MessageId` was seen before is ignored ([`admit`]); else it carries an SES event: `Delivery`
//! → `delivered`, `Bounce` (permanent) → `failed` and the address suppressed, `Complaint` → the
//! address suppressed, `Reject` → `failed`, `Open` / `Click` → `opened` / `clicked`. The delivery is found by the
//! provider's message id (the channel worker records it, with a hash of the address it sent
//! to, when the provider accepts a message), and an event suppresses only that address: other
//! addresses it lists are not ours to suppress.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};
use x509_cert::Certificate;
use x509_cert::der::DecodePem;
use x509_cert::der::oid::ObjectIdentifier;

/// `rsaEncryption` (RFC 8017, A.1): the key of SNS's signing certificates.
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::notify::model::{Delivery, DeliveryStatus};
use crate::notify::progress::{self, Transition};
use crate::people::suppression::{self, SuppressionReason};
use crate::ports::{Channel, Cond, Item, Update, attrs_of};

/// An SNS HTTP(S) message, as posted to a subscribed endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "PascalCase")]
pub struct SnsMessage {
    #[serde(rename = "Type")]
    pub kind: String,
    pub message_id: String,
    #[serde(default)]
    pub token: Option<String>,
    pub topic_arn: String,
    #[serde(default)]
    pub subject: Option<String>,
    pub message: String,
    pub timestamp: String,
    pub signature_version: String,
    pub signature: String,
    #[serde(rename = "SigningCertURL")]
    pub signing_cert_url: String,
    #[serde(rename = "SubscribeURL", default)]
    pub subscribe_url: Option<String>,
    #[serde(rename = "UnsubscribeURL", default)]
    pub unsubscribe_url: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signing certificate URL is not an SNS one: {0}")]
    UntrustedCertUrl(String),
    #[error("unsupported signature version {0}")]
    UnsupportedVersion(String),
    #[error("the signing certificate is unusable: {0}")]
    BadCertificate(String),
    #[error("the signature does not match")]
    BadSignature,
    #[error("the message is not a known SNS message type")]
    UnknownType,
    #[error("the topic {0:?} is not one of this stack's")]
    TopicNotAllowed(String),
}

/// A message from a topic not in the allow-list (`TIDINGS_SNS_TOPIC_ARNS`) is refused before its
/// signature is even checked: none of it is believed or acted on, a subscription included.
pub fn check_topic(config: &crate::deps::CoreConfig, message: &SnsMessage) -> Result<(), VerifyError> {
    if config.sns_topic_arns.iter().any(|t| t == &message.topic_arn) {
        Ok(())
    } else {
        Err(VerifyError::TopicNotAllowed(message.topic_arn.chars().take(256).collect()))
    }
}

/// A notification older than this (its signed `Timestamp`) is ignored: SNS retries an https
/// delivery for about an hour, so a day is far beyond a genuine late one, and an old message
/// captured by someone cannot be replayed once its `MessageId` is forgotten.
pub const EVENT_WINDOW: chrono::Duration = chrono::Duration::hours(24);
/// A notification stamped further ahead than this is ignored too (no clock is that far off).
const FUTURE_SKEW: chrono::Duration = chrono::Duration::minutes(15);

/// Whether a verified notification is to be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// New: its `MessageId` is now remembered (until the window has passed).
    Fresh,
    /// Outside [`EVENT_WINDOW`] (or unreadably stamped): ignored.
    Stale,
    /// Its `MessageId` was seen before: ignored.
    Replayed,
}

impl Admission {
    pub fn as_str(self) -> &'static str {
        match self {
            Admission::Fresh => "fresh",
            Admission::Stale => "stale",
            Admission::Replayed => "replayed",
        }
    }
}

#[derive(Serialize)]
struct SeenMessage<'a> {
    topic: &'a str,
    ttl: i64,
}

/// Admits a verified notification once: recent, and its `MessageId` not seen before (remembered
/// with a TTL past the window; a repeat after that is stale anyway).
pub async fn admit(deps: &Deps, message: &SnsMessage) -> CoreResult<Admission> {
    let Ok(stamped) = chrono::DateTime::parse_from_rfc3339(&message.timestamp) else {
        return Ok(Admission::Stale);
    };
    let stamped = stamped.with_timezone(&chrono::Utc);
    let now = deps.clock.now();
    if stamped < now - EVENT_WINDOW || stamped > now + FUTURE_SKEW {
        return Ok(Admission::Stale);
    }
    let seen = SeenMessage { topic: &message.topic_arn, ttl: (stamped + EVENT_WINDOW).timestamp() + 3600 };
    let item = Item::new(keys::sns_message(&message.message_id), attrs_of(&seen)?);
    match deps.table.put(item, Cond::NotExists).await {
        Ok(()) => Ok(Admission::Fresh),
        Err(e) if e.is_condition_failed() => Ok(Admission::Replayed),
        Err(e) => Err(e.into()),
    }
}

/// Forgets an admitted `MessageId` whose event could not be applied, so that SNS's retry of it
/// is applied instead of ignored.
pub async fn forget(deps: &Deps, message: &SnsMessage) {
    if let Err(e) = deps.table.delete(&keys::sns_message(&message.message_id), Cond::Always).await {
        warn!(error = %e, "SNS message id not forgotten; its retry will be ignored");
    }
}

/// Whether a URL is one SNS itself serves: `https://sns.<region>.amazonaws.com[.cn]/…`.
pub fn is_sns_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("https://") else { return false };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.contains(['@', ':']) {
        return false;
    }
    let Some(region) = host.strip_prefix("sns.") else { return false };
    let Some(region) = region.strip_suffix(".amazonaws.com").or_else(|| region.strip_suffix(".amazonaws.com.cn"))
    else {
        return false;
    };
    !region.is_empty() && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The signing certificate URL must be SNS's own, and a `.pem`.
pub fn check_cert_url(url: &str) -> Result<(), VerifyError> {
    if is_sns_url(url) && url.split('?').next().is_some_and(|p| p.ends_with(".pem")) {
        Ok(())
    } else {
        Err(VerifyError::UntrustedCertUrl(url.chars().take(200).collect()))
    }
}

impl SnsMessage {
    /// The string SNS signs: named fields in a fixed order, each `name\nvalue\n`.
    pub fn canonical(&self) -> Result<String, VerifyError> {
        let mut out = String::new();
        let mut field = |name: &str, value: Option<&str>| {
            if let Some(v) = value {
                out.push_str(name);
                out.push('\n');
                out.push_str(v);
                out.push('\n');
            }
        };
        match self.kind.as_str() {
            "Notification" => {
                field("Message", Some(&self.message));
                field("MessageId", Some(&self.message_id));
                field("Subject", self.subject.as_deref());
                field("Timestamp", Some(&self.timestamp));
                field("TopicArn", Some(&self.topic_arn));
                field("Type", Some(&self.kind));
            }
            "SubscriptionConfirmation" | "UnsubscribeConfirmation" => {
                field("Message", Some(&self.message));
                field("MessageId", Some(&self.message_id));
                field("SubscribeURL", self.subscribe_url.as_deref());
                field("Timestamp", Some(&self.timestamp));
                field("Token", self.token.as_deref());
                field("TopicArn", Some(&self.topic_arn));
                field("Type", Some(&self.kind));
            }
            _ => return Err(VerifyError::UnknownType),
        }
        Ok(out)
    }

    /// Verifies the signature against a PEM certificate: RSA (PKCS #1 v1.5, 2048 to 8192
    /// bits) over the canonical string, with SHA-1 (`SignatureVersion` 1) or SHA-256 (2).
    pub fn verify_with_cert(&self, cert_pem: &str) -> Result<(), VerifyError> {
        let cert =
            Certificate::from_pem(cert_pem.as_bytes()).map_err(|e| VerifyError::BadCertificate(e.to_string()))?;
        let spki = &cert.tbs_certificate.subject_public_key_info;
        if spki.algorithm.oid != RSA_ENCRYPTION {
            return Err(VerifyError::BadCertificate(format!("a key of {}, not RSA", spki.algorithm.oid)));
        }
        // The subject's RSAPublicKey (RFC 8017, A.1.1), as ring reads it.
        let key = spki
            .subject_public_key
            .as_bytes()
            .ok_or_else(|| VerifyError::BadCertificate("a public key of a partial byte".into()))?;
        let algorithm: &'static dyn VerificationAlgorithm = match self.signature_version.as_str() {
            "1" => &signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            "2" => &signature::RSA_PKCS1_2048_8192_SHA256,
            v => return Err(VerifyError::UnsupportedVersion(v.chars().take(10).collect())),
        };
        let canonical = self.canonical()?;
        let sig = B64.decode(self.signature.trim()).map_err(|_| VerifyError::BadSignature)?;
        UnparsedPublicKey::new(algorithm, key).verify(canonical.as_bytes(), &sig).map_err(|_| VerifyError::BadSignature)
    }
}

/// What became of an SES event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReceiptOutcome {
    pub event: String,
    /// Whether a delivery of ours was found for it.
    pub matched: bool,
    pub suppressed: usize,
}

/// Where the provider's message id leads: written by the channel worker once a provider accepts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderMessageRef {
    pub tenant: String,
    pub notification_id: String,
    pub user_id: String,
    pub channel: Channel,
    /// [`suppression::address_hash`] of the address the message was sent to: the only one its
    /// bounces and complaints may suppress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_hash: Option<String>,
    pub ttl: i64,
    /// A workflow's send step (its delivery's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
}

/// The write that records which delivery (and which address) a provider message id belongs to,
/// kept 30 days (`None` without a provider message id), for a caller that writes it with others.
pub fn remember_write(
    deps: &Deps,
    provider: &str,
    provider_message_id: &str,
    t: &TenantId,
    task: &crate::notify::model::ChannelTask,
) -> CoreResult<Option<crate::ports::Write>> {
    if provider_message_id.is_empty() {
        return Ok(None);
    }
    let r = ProviderMessageRef {
        tenant: t.as_str().to_owned(),
        notification_id: task.notification_id.clone(),
        user_id: task.user_id.clone(),
        channel: task.channel,
        to_hash: Some(suppression::address_hash(&task.to)),
        ttl: deps.clock.now().timestamp() + 30 * 86_400,
        step: task.step,
    };
    let item = Item::new(keys::provider_message(provider, provider_message_id), attrs_of(&r)?);
    Ok(Some(crate::ports::Write::Put { item, cond: Cond::Always }))
}

/// The channel worker's part, after a provider accepted: best effort (a receipt for a message
/// not remembered is ignored, never an error on the send path).
pub async fn remember_sent(
    deps: &Deps,
    provider: &str,
    provider_message_id: &str,
    t: &TenantId,
    task: &crate::notify::model::ChannelTask,
) {
    if task.channel != Channel::Email {
        return;
    }
    let _ = provider;
    // Keyed by channel, not by provider name: the provider's message id is what a receipt names.
    let written = async {
        if let Some(crate::ports::Write::Put { item, cond }) =
            remember_write(deps, task.channel.as_str(), provider_message_id, t, task)?
        {
            deps.table.put(item, cond).await?;
        }
        CoreResult::Ok(())
    };
    if let Err(e) = written.await {
        warn!(error = %e, "provider message id not recorded; its receipts will be ignored");
    }
}

/// The hash of the address a remembered message went to; for one remembered before the hash
/// was kept, the user's email address now.
async fn recipient_hash(deps: &Deps, t: &TenantId, r: &ProviderMessageRef) -> CoreResult<Option<String>> {
    if let Some(h) = &r.to_hash {
        return Ok(Some(h.clone()));
    }
    let user = crate::people::users::get_user(deps, t, &r.user_id).await?;
    Ok(user.and_then(|u| u.email).map(|e| suppression::address_hash(&e)))
}

fn recipients(event: &Value, section: &str, list: &str) -> Vec<String> {
    event[section][list]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["emailAddress"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Applies one SES event (the `Message` of a verified SNS notification). Both shapes are read:
/// configuration-set events (`eventType`) and identity notifications (`notificationType`).
pub async fn apply_ses_event(deps: &Deps, provider: &str, event: &Value) -> CoreResult<ReceiptOutcome> {
    let kind =
        event["eventType"].as_str().or_else(|| event["notificationType"].as_str()).unwrap_or_default().to_owned();
    let message_id = event["mail"]["messageId"].as_str().unwrap_or_default();
    let found = if message_id.is_empty() {
        None
    } else {
        deps.table
            .get(&keys::provider_message(provider, message_id))
            .await?
            .map(|i| i.parse::<ProviderMessageRef>())
            .transpose()?
    };
    let mut outcome = ReceiptOutcome { event: kind.clone(), matched: found.is_some(), suppressed: 0 };
    let Some(r) = found else {
        warn!(event = %kind, "receipt for a message we do not know; ignored");
        return Ok(outcome);
    };
    let t = TenantId::parse(&r.tenant)?;
    let (to, detail, suppress) = match kind.as_str() {
        "Delivery" => (Some(DeliveryStatus::Delivered), None, None),
        "Bounce" => {
            let permanent = event["bounce"]["bounceType"].as_str() == Some("Permanent");
            let sub = event["bounce"]["bounceSubType"].as_str().unwrap_or_default();
            let detail = format!("bounce: {} {sub}", event["bounce"]["bounceType"].as_str().unwrap_or_default());
            if permanent {
                (
                    Some(DeliveryStatus::Failed),
                    Some(detail),
                    Some((recipients(event, "bounce", "bouncedRecipients"), SuppressionReason::HardBounce)),
                )
            } else {
                (None, Some(detail), None)
            }
        }
        "Complaint" => (
            None,
            Some("complaint".to_owned()),
            Some((recipients(event, "complaint", "complainedRecipients"), SuppressionReason::Complaint)),
        ),
        // SES took the mail and then refused to send it (a virus): it never left.
        "Reject" => (
            Some(DeliveryStatus::Failed),
            Some(format!("reject: {}", event["reject"]["reason"].as_str().unwrap_or_default())),
            None,
        ),
        "Open" => (Some(DeliveryStatus::Opened), None, None),
        "Click" => (Some(DeliveryStatus::Clicked), None, None),
        _ => (None, None, None),
    };
    if let Some((listed, reason)) = suppress {
        // Only the address this delivery went to: an event naming others (a forged one, or one
        // of a message with several recipients) suppresses nobody else.
        let ours = recipient_hash(deps, &t, &r).await?;
        let addresses: Vec<String> =
            listed.into_iter().filter(|a| ours.as_deref() == Some(suppression::address_hash(a).as_str())).collect();
        for a in &addresses {
            suppression::suppress(deps, &t, r.channel, a, reason).await?;
        }
        outcome.suppressed = addresses.len();
    }
    let key = keys::delivery_at(&t, &r.notification_id, &r.user_id, r.channel, r.step);
    let Some(item) = deps.table.get(&key).await? else { return Ok(outcome) };
    let d: Delivery = item.parse()?;
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut updates = vec![Update::set("updated_at", now)];
    if let Some(detail) = &detail {
        updates.push(Update::set(if kind == "Complaint" { "complaint" } else { "last_error" }, detail.clone()));
    }
    let allowed = |from: DeliveryStatus, to: DeliveryStatus| match to {
        DeliveryStatus::Delivered => from == DeliveryStatus::Sent,
        DeliveryStatus::Opened => matches!(from, DeliveryStatus::Sent | DeliveryStatus::Delivered),
        DeliveryStatus::Clicked => {
            matches!(from, DeliveryStatus::Sent | DeliveryStatus::Delivered | DeliveryStatus::Opened)
        }
        DeliveryStatus::Failed => matches!(from, DeliveryStatus::Sent | DeliveryStatus::Delivered),
        _ => false,
    };
    match to {
        Some(to) if allowed(d.status, to) => {
            progress::transition(
                deps,
                Transition {
                    t: &t,
                    notification_id: &r.notification_id,
                    user_id: &r.user_id,
                    page: progress::page_of(&item),
                    key: &key,
                    from: d.status,
                    to,
                    also: None,
                    updates,
                },
            )
            .await?;
        }
        _ if detail.is_some() => {
            deps.table.update(&key, updates, Cond::Exists).await?;
        }
        _ => {}
    }
    info!(tenant = %t, event = %kind, suppressed = outcome.suppressed, "receipt applied");
    Ok(outcome)
}

/// Which callback a notification came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callback {
    /// SES events (`/v1/callbacks/ses`).
    Ses,
    /// SNS mobile-push application events (`/v1/callbacks/push`).
    Push,
}

/// A verified `Notification` from an allowed topic, its `Message` parsed: admitted once and
/// applied. What it did, or `{"ignored": "stale" | "replayed"}`.
pub async fn receive(deps: &Deps, message: &SnsMessage, event: &Value, callback: Callback) -> CoreResult<Value> {
    let admission = admit(deps, message).await?;
    if admission != Admission::Fresh {
        info!(topic = ?message.topic_arn, why = admission.as_str(), "SNS notification ignored");
        return Ok(serde_json::json!({"ignored": admission.as_str()}));
    }
    let applied = match callback {
        Callback::Push => apply_push_event(deps, event).await.map(|o| serde_json::to_value(o).unwrap_or_default()),
        Callback::Ses => {
            apply_ses_event(deps, "email", event).await.map(|o| serde_json::to_value(o).unwrap_or_default())
        }
    };
    if applied.is_err() {
        forget(deps, message).await;
    }
    applied
}

/// What a push application event did (the answer of `POST /v1/callbacks/push`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PushEventOutcome {
    pub event: String,
    /// Whether the endpoint is a device of ours.
    pub matched: bool,
    /// Whether that device was deleted (its token is gone: it is not sent to again).
    pub removed: bool,
}

/// The `FailureType`s of an SNS `DeliveryFailure` event that mean the token is gone for good.
/// Others (a message too big, a platform credential problem, a TTL) say nothing about the device.
pub const DEAD_ENDPOINT_FAILURES: &[&str] =
    &["EndpointDisabled", "InvalidPlatformToken", "EndpointNotFound", "UnregisteredDevice", "InvalidDeviceToken"];

/// Applies one SNS mobile-push application event (the `Message` of a verified SNS notification
/// from the topic set as a platform application's `EventDeliveryFailure` and
/// `EventEndpointDeleted`): a delivery failure that says the token is gone, or the endpoint's
/// deletion, deletes the device, as a send answered as gone would. Other events are ignored.
pub async fn apply_push_event(deps: &Deps, event: &Value) -> CoreResult<PushEventOutcome> {
    let kind = event["EventType"].as_str().unwrap_or_default().to_owned();
    let endpoint = event["EndpointArn"].as_str().unwrap_or_default();
    let mut outcome = PushEventOutcome { event: kind.clone(), matched: false, removed: false };
    let failure = event["FailureType"].as_str().unwrap_or_default();
    let dead = match kind.as_str() {
        "DeliveryFailure" => DEAD_ENDPOINT_FAILURES.contains(&failure),
        "EndpointDeleted" => true,
        _ => false,
    };
    if endpoint.is_empty() {
        warn!(event = %kind, "push event without an endpoint; ignored");
        return Ok(outcome);
    }
    let Some((t, device)) = crate::people::devices::by_address(deps, endpoint).await? else {
        info!(event = %kind, "push event for an endpoint we do not know; ignored");
        return Ok(outcome);
    };
    outcome.matched = true;
    if dead {
        warn!(tenant = %t, event = %kind, failure, "the push service reports the endpoint gone; deleting the device");
        crate::people::devices::remove_invalid(deps, &t, &device).await?;
        outcome.removed = true;
    } else {
        info!(tenant = %t, event = %kind, failure, "push event noted; the device is kept");
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = include_str!("../../../../tests/fixtures/sns/test-signing-cert.pem");
    const KEY: &str = include_str!("../../../../tests/fixtures/sns/test-signing-key.pem");

    fn signed(version: &str) -> SnsMessage {
        use rsa::pkcs1v15::SigningKey;
        use rsa::pkcs8::DecodePrivateKey;
        use rsa::signature::{SignatureEncoding, Signer};
        let mut m = SnsMessage {
            kind: "Notification".into(),
            message_id: "m1".into(),
            token: None,
            topic_arn: "arn:aws:sns:us-east-1:1:ses".into(),
            subject: None,
            message: r#"{"eventType":"Bounce"}"#.into(),
            timestamp: "2026-11-29T00:00:00.000Z".into(),
            signature_version: version.into(),
            signature: String::new(),
            signing_cert_url: "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem".into(),
            subscribe_url: None,
            unsubscribe_url: None,
        };
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(KEY).unwrap();
        let canonical = m.canonical().unwrap();
        let sig = if version == "1" {
            SigningKey::<sha1::Sha1>::new(key).sign(canonical.as_bytes()).to_vec()
        } else {
            SigningKey::<sha2::Sha256>::new(key).sign(canonical.as_bytes()).to_vec()
        };
        m.signature = B64.encode(sig);
        m
    }

    #[test]
    fn genuine_messages_verify_and_forged_ones_do_not() {
        for v in ["1", "2"] {
            let m = signed(v);
            assert_eq!(m.verify_with_cert(CERT), Ok(()));
            let forged = SnsMessage { message: r#"{"eventType":"Delivery"}"#.into(), ..m.clone() };
            assert_eq!(forged.verify_with_cert(CERT), Err(VerifyError::BadSignature));
        }
        let m = SnsMessage { signature_version: "3".into(), ..signed("2") };
        assert!(matches!(m.verify_with_cert(CERT), Err(VerifyError::UnsupportedVersion(_))));
        // Signed with SHA-256 but said to be version 1 (SHA-1): not verified.
        let m = SnsMessage { signature_version: "1".into(), ..signed("2") };
        assert_eq!(m.verify_with_cert(CERT), Err(VerifyError::BadSignature));
        // A certificate of another key type is refused as such.
        let ec = include_str!("../../../../tests/fixtures/sns/test-ec-cert.pem");
        assert!(matches!(signed("2").verify_with_cert(ec), Err(VerifyError::BadCertificate(_))));
    }

    #[test]
    fn only_sns_hosts_serve_certificates() {
        assert!(check_cert_url("https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem").is_ok());
        for bad in [
            "http://sns.eu-west-1.amazonaws.com/x.pem",
            "https://sns.eu-west-1.amazonaws.com.evil.example/x.pem",
            "https://evil.example/sns.eu-west-1.amazonaws.com/x.pem",
            "https://sns.eu-west-1.amazonaws.com@evil.example/x.pem",
            "https://sns.eu-west-1.amazonaws.com/x.txt",
            "https://s3.amazonaws.com/x.pem",
        ] {
            assert!(check_cert_url(bad).is_err(), "{bad}");
        }
    }
}
