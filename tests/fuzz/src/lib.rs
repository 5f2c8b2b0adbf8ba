//! The fuzz targets' bodies: each takes arbitrary bytes and must neither panic nor break the
//! property it asserts. `cargo fuzz` drives them through `fuzz_targets/*.rs`; the workspace's
//! `tests/fuzz_targets.rs` runs them over `seeds/` and a few thousand generated inputs in CI.

use aws_lambda_events::dynamodb::{Event as DynamoDbEvent, EventRecord};
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde::de::DeserializeOwned;
use tidings_api::extract::parse_json;
use tidings_core::dev::FaultConfig;
use tidings_core::inventory::{AdjustmentRequest, OrderRequest, WarmUpRequest};
use tidings_core::notify::model::NotificationRequest;
use tidings_core::people::users::UserInput;
use tidings_core::signing::Signer;
use tidings_core::templates::TemplateInput;

/// Parses `data` as `T` the way a handler's `Body<T>` does: an error is a 400 problem naming a
/// stable code, never a panic.
fn parse<T: DeserializeOwned>(data: &[u8]) -> Option<T> {
    match parse_json::<T>(data) {
        Ok(v) => Some(v),
        Err(e) => {
            assert_eq!(e.0.status, 400, "a body that does not parse is a 400");
            assert!(matches!(e.0.code.as_str(), "malformed_json" | "invalid_body"), "code {}", e.0.code);
            None
        }
    }
}

/// Every JSON request body the API takes, then the validation that follows parsing.
pub fn request_parsers(data: &[u8]) {
    if let Some(req) = parse::<NotificationRequest>(data) {
        let _ = req.validate();
        let _ = req.validate_schedule(chrono_now());
    }
    if let Some(tpl) = parse::<TemplateInput>(data) {
        let _ = tidings_core::templates::template_of("t", tpl, String::new());
    }
    let _ = parse::<UserInput>(data);
    let _ = parse::<OrderRequest>(data);
    let _ = parse::<WarmUpRequest>(data);
    let _ = parse::<AdjustmentRequest>(data);
    let _ = parse::<FaultConfig>(data);
}

fn chrono_now() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(1_764_417_600, 0).unwrap_or_default()
}

/// SQS and DynamoDB stream events, as Lambda would deliver them, converted to the core's view.
pub fn lambda_events(data: &[u8]) {
    if let Ok(event) = serde_json::from_slice::<SqsEvent>(data) {
        for record in &event.records {
            sqs_record(record);
        }
    }
    if let Ok(record) = serde_json::from_slice::<SqsMessage>(data) {
        sqs_record(&record);
    }
    if let Ok(event) = serde_json::from_slice::<DynamoDbEvent>(data) {
        for record in &event.records {
            stream_record(record);
        }
    }
    if let Ok(record) = serde_json::from_slice::<EventRecord>(data) {
        stream_record(&record);
    }
}

fn sqs_record(record: &SqsMessage) {
    let received = tidings_lambda::received_of(record);
    assert_eq!(Some(&received.body), record.body.as_ref().or(Some(&String::new())));
    let _ = tidings_lambda::logical_queue_name(record.event_source_arn.as_deref().unwrap_or_default(), "tidings-");
}

fn stream_record(record: &EventRecord) {
    if let Some(change) = tidings_lambda::change_record_of(record) {
        // What the local runtime builds back from a change reads as a change again.
        if let Ok(back) = tidings_lambda::event_record_of(&change) {
            assert!(tidings_lambda::change_record_of(&back).is_some(), "a built record is readable");
        }
    }
}

const PURPOSE: &str = "fuzz";

fn signer() -> Signer {
    Signer::new(vec![("k2".into(), b"second-secret".to_vec()), ("k1".into(), b"first-secret".to_vec())])
}

/// The signed-token verifier: arbitrary tokens are refused without a panic, and a valid token
/// changed in any way is refused.
pub fn token_verifier(data: &[u8]) {
    let signer = signer();
    let now = 1_764_417_600;
    let text = String::from_utf8_lossy(data);
    if let Ok(claims) = signer.verify::<serde_json::Value>(PURPOSE, &text, now) {
        // Only a token this signer made can verify: its MAC covers everything.
        let again = signer.sign(PURPOSE, &claims, now + 60);
        assert!(again.is_ok(), "what verified can be signed again");
    }
    // A real token with the input spliced in.
    let Ok(token) = signer.sign(PURPOSE, &serde_json::json!({"t": "acme", "u": "u1"}), now + 60) else { return };
    if data.is_empty() {
        assert!(signer.verify::<serde_json::Value>(PURPOSE, &token, now).is_ok());
        return;
    }
    let at = usize::from(data[0]) % (token.len() + 1);
    let mut forged = token.clone();
    forged.insert_str(at, &String::from_utf8_lossy(&data[1..]));
    if data.len() == 1 {
        forged = format!("{}{}", &token[..at], &token[(at + 1).min(token.len())..]);
    }
    if forged != token {
        assert!(
            signer.verify::<serde_json::Value>(PURPOSE, &forged, now).is_err(),
            "a forged token verified: {forged}"
        );
    }
    assert!(signer.verify::<serde_json::Value>("another", &token, now).is_err(), "another purpose");
    assert!(signer.verify::<serde_json::Value>(PURPOSE, &token, now + 61).is_err(), "expired");
}
