//! SNS's https delivery, as the template subscribes it: a message published to one of the
//! stack's topics is posted to every https subscription of that topic (its endpoint must be the
//! stack's HTTP API), signed as SNS signs (SHA256withRSA, version 2) with the test key whose
//! certificate the functions are given as `TIDINGS_SNS_TRUSTED_CERT_PEM`; on AWS SNS's own.

use base64::Engine;
use serde_json::{Value, json};

const SIGNING_KEY: &str = include_str!("../../fixtures/sns/test-signing-key.pem");
pub const CERT_URL: &str = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem";

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Signs `m` over the fields SNS signs for its `Type`, in SNS's order.
fn sign(mut m: Value) -> Value {
    use rsa::pkcs1v15::SigningKey;
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::signature::{SignatureEncoding, Signer};
    let fields: &[&str] = if m["Type"] == "Notification" {
        &["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    } else {
        &["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    };
    let mut canonical = String::new();
    for f in fields {
        if let Some(v) = m[*f].as_str() {
            canonical.push_str(&format!("{f}\n{v}\n"));
        }
    }
    let key = rsa::RsaPrivateKey::from_pkcs8_pem(SIGNING_KEY).expect("the test signing key");
    let sig = SigningKey::<sha2::Sha256>::new(key).sign(canonical.as_bytes()).to_vec();
    m["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode(sig));
    m
}

/// A `Notification` of `topic_arn` carrying `message`, stamped now.
pub fn notification(topic_arn: &str, message: &Value) -> Value {
    sign(json!({
        "Type": "Notification",
        "MessageId": uuid::Uuid::new_v4().to_string(),
        "TopicArn": topic_arn,
        "Message": message.to_string(),
        "Timestamp": now(),
        "SignatureVersion": "2",
        "SigningCertURL": CERT_URL,
        "UnsubscribeURL": format!("https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&SubscriptionArn={topic_arn}:x"),
    }))
}

/// The `SubscriptionConfirmation` SNS posts when an endpoint is subscribed to `topic_arn`.
pub fn subscription_confirmation(topic_arn: &str) -> Value {
    let token = format!("{:064x}", rand::random::<u128>());
    sign(json!({
        "Type": "SubscriptionConfirmation",
        "MessageId": uuid::Uuid::new_v4().to_string(),
        "Token": token,
        "TopicArn": topic_arn,
        "Message": format!("You have chosen to subscribe to the topic {topic_arn}."),
        "SubscribeURL": format!("https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn={topic_arn}&Token={token}"),
        "Timestamp": now(),
        "SignatureVersion": "2",
        "SigningCertURL": CERT_URL,
    }))
}
