//! SMS failover between two providers (docs/configuration.md, "SMS failover"): with the primary failing, its
//! breaker opens and SMS goes out through the secondary; once the primary recovers, the
//! breaker's probe closes it and SMS goes through the primary again.
//!
//! Embedded: the fake primary and the fake secondary (`TIDINGS_SMS_SECONDARY=fake`). AWS: SNS
//! `Publish` (moto) and AWS End User Messaging `SendTextMessage`, which moto does not serve
//! (it answers 500): [`SmsVoiceStandIn`] answers it here, as the service's JSON protocol does,
//! through the SDK's own per-service endpoint `AWS_ENDPOINT_URL_PINPOINT_SMS_VOICE_V2`. The
//! primary is made to fail by the dev fault injection in front of it (`PUT /dev/providers/sms`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(90);

/// AWS End User Messaging SMS as far as Tidings uses it: `SendTextMessage` over the
/// `awsJson1_0` protocol (`X-Amz-Target: PinpointSMSVoiceV2.SendTextMessage`), answering a
/// message id and keeping each request as it arrived.
pub struct SmsVoiceStandIn {
    pub url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    _server: tokio::task::JoinHandle<()>,
}

impl SmsVoiceStandIn {
    pub async fn start() -> anyhow::Result<Self> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let kept = requests.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
                let json_type = [("content-type", "application/x-amz-json-1.0")];
                if target != "PinpointSMSVoiceV2.SendTextMessage" {
                    let body = json!({"__type": "UnknownOperationException", "message": target});
                    return (StatusCode::BAD_REQUEST, json_type, body.to_string()).into_response();
                }
                let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                kept.lock().unwrap().push(request);
                let answer = json!({"MessageId": uuid::Uuid::new_v4().to_string()});
                (StatusCode::OK, json_type, answer.to_string()).into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, requests, _server: server })
    }

    /// The `SendTextMessage` requests received, oldest first.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

async fn otp(s: &Server, key: &str, code: &str) -> anyhow::Result<String> {
    let body = json!({
        "idempotency_key": key,
        "recipients": {"user_ids": ["u2"]},
        "template_id": "otp",
        "params": {"code": code},
        "category": "transactional",
        "channels": ["sms"],
    });
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap().to_owned())
}

/// The one send of a notification, once it is recorded.
async fn sent(s: &Server, id: &str) -> anyhow::Result<Value> {
    let sends = s
        .eventually(WAIT, &format!("the send of {id}"), || async {
            let sends = s.sends(id).await?;
            Ok((!sends.is_empty()).then_some(sends))
        })
        .await?;
    // A second send would show within the retry cap (1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = s.sends(id).await?;
    assert_eq!(again.len(), 1, "sent once: {again:?}");
    assert_eq!(sends[0]["to"], "+14155550100");
    Ok(sends[0].clone())
}

pub async fn sms_fails_over_to_the_second_provider_and_back(backend: Backend) -> anyhow::Result<()> {
    let stand_in = SmsVoiceStandIn::start().await?;
    let mut opts = Options::default();
    // Open after two failures in the window; a probe after 3 s; one good probe closes it.
    opts.env.push(("TIDINGS_BREAKER", "window_s=60,min_calls=2,error_ratio=0.5,open_s=3,probes=1".into()));
    let (primary, secondary) = match backend {
        Backend::Embedded => {
            opts.env.push(("TIDINGS_SMS_SECONDARY", "fake".into()));
            ("null", "fake-secondary")
        }
        Backend::Aws => {
            opts.env.push(("TIDINGS_SMS_PRIMARY", "sns".into()));
            opts.env.push(("TIDINGS_SMS_SECONDARY", "end-user-messaging".into()));
            opts.env.push(("TIDINGS_SMS_ORIGINATION_IDENTITY", "pool-e2e".into()));
            opts.env.push(("TIDINGS_SMS_CONFIGURATION_SET", "tidings-e2e".into()));
            opts.env.push(("AWS_ENDPOINT_URL_PINPOINT_SMS_VOICE_V2", stand_in.url.clone()));
            ("sns-sms", "end-user-messaging")
        }
    };
    let s = Server::start(backend, opts).await?;
    let (st, _) = s.call("PUT", "/v1/users/u2", Some(json!({"phone": "+14155550100"}))).await?;
    assert_eq!(st, 200);
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/otp",
            Some(json!({"default_locale": "en", "locales": {"en": {"sms": "Your code is {{ code }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");

    // The primary fails: two failed attempts open its breaker, the next goes to the secondary.
    let (st, _) = s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "fail_5xx"}))).await?;
    assert_eq!(st, 200);
    let first = otp(&s, "otp-failover-1", "111111").await?;
    let send = sent(&s, &first).await?;
    assert_eq!(send["provider"], secondary, "{send}");
    assert_eq!(send["body"], "Your code is 111111");
    assert!(send["attempt"].as_u64().is_some_and(|a| a >= 3), "two failures on the primary first: {send}");
    if backend == Backend::Aws {
        // What End User Messaging was asked, as it arrived.
        let requests = stand_in.requests();
        assert_eq!(requests.len(), 1, "{requests:?}");
        let r = &requests[0];
        assert_eq!(r["DestinationPhoneNumber"], "+14155550100", "{r}");
        assert_eq!(r["MessageBody"], "Your code is 111111", "{r}");
        assert_eq!(r["MessageType"], "TRANSACTIONAL", "{r}");
        assert_eq!(r["OriginationIdentity"], "pool-e2e", "{r}");
        assert_eq!(r["ConfigurationSetName"], "tidings-e2e", "{r}");
        assert_eq!(r["Context"][tidings_aws::DELIVERY_KEY_CONTEXT], format!("{first}:u2:sms"), "{r}");
    }

    // The primary recovers: once the breaker lets a probe through, SMS is back on it.
    let (st, _) = s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "ok"}))).await?;
    assert_eq!(st, 200);
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (i, key) in ["otp-failover-2", "otp-failover-3"].iter().enumerate() {
        let id = otp(&s, key, &format!("22222{i}")).await?;
        let send = sent(&s, &id).await?;
        assert_eq!(send["provider"], primary, "back on the primary: {send}");
        assert_eq!(send["attempt"], 1, "{send}");
    }
    let through_end_user_messaging = if backend == Backend::Aws { 1 } else { 0 };
    assert_eq!(stand_in.requests().len(), through_end_user_messaging, "nothing more through End User Messaging");
    Ok(())
}
