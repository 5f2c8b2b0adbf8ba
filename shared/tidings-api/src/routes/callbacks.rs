//! `POST /v1/callbacks/{provider}`: provider receipts. No API key: an SNS message is believed
//! only when it comes from one of the stack's topics (`TIDINGS_SNS_TOPIC_ARNS`) and its
//! signature verifies against SNS's own certificate (see `tidings_core::tracking::receipts`). Other
//! topics, forged or altered messages get 403; old or repeated notifications are ignored.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{Value, json};
use tidings_core::tracking::receipts::{self, Callback, SnsMessage, check_cert_url, check_topic, is_sns_url};
use tracing::{info, warn};

use crate::extract::{MAX_BODY, PathParams, parse_json};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(callback))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/callbacks/{provider}", post(callback))
}

fn http() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default()
    })
}

/// SNS signing certificates, by URL (they change rarely; a process keeps what it fetched).
fn cert_cache() -> &'static Mutex<HashMap<String, String>> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn forbidden(detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::FORBIDDEN, "invalid_signature", detail)
}

/// The certificate to verify with: the configured one (tests, emulators), else SNS's, fetched
/// only from an SNS URL.
async fn certificate(s: &AppState, url: &str) -> ApiResult<String> {
    if let Some(pem) = &s.deps.config.sns_trusted_cert_pem {
        return Ok(pem.clone());
    }
    check_cert_url(url).map_err(|e| forbidden(e.to_string()))?;
    if let Some(pem) = cert_cache().lock().unwrap_or_else(|p| p.into_inner()).get(url) {
        return Ok(pem.clone());
    }
    let fetched = async { http().get(url).send().await?.error_for_status()?.text().await }.await;
    let pem = fetched.map_err(|e| {
        warn!(error = %e, "SNS signing certificate not fetched");
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the signing certificate could not be fetched")
    })?;
    cert_cache().lock().unwrap_or_else(|p| p.into_inner()).insert(url.to_owned(), pem.clone());
    Ok(pem)
}

/// Provider receipts through SNS: SES events (`ses`) and SNS mobile-push application events
/// (`push`: a delivery failure naming a dead token, or a deleted endpoint, deletes the device).
/// No API key: the topic must be one of the stack's and the SNS signature must verify; a
/// notification older than 24 hours or seen before answers 200 `{"ignored": "stale" |
/// "replayed"}` and changes nothing.
#[utoipa::path(post, path = "/v1/callbacks/{provider}", tag = "callbacks",
    params(("provider" = String, Path, description = "`ses` or `push`")),
    request_body(content = SnsMessage, content_type = "text/plain; charset=UTF-8", description = "An SNS message: SNS posts its JSON with this content type (the body is read as JSON whatever the content type says)"),
    responses((status = 200, description = "Applied, confirmed or ignored", body = Object),
        (status = 403, description = "A topic not in TIDINGS_SNS_TOPIC_ARNS (`topic_not_allowed`), or the signature does not verify (`invalid_signature`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown provider", body = Problem, content_type = "application/problem+json")))]
async fn callback(
    State(s): State<AppState>,
    PathParams(provider): PathParams<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    if provider != "ses" && provider != "push" {
        return Err(Problem::not_found(&format!("provider {provider}")).into());
    }
    if body.len() > MAX_BODY {
        return Err(
            Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", "the body is larger than 1 MiB").into()
        );
    }
    // SNS posts JSON as text/plain: the body is parsed whatever the content type says.
    let message: SnsMessage = parse_json(&body)?;
    // Another topic's message is refused before anything is fetched for it.
    check_topic(&s.deps.config, &message).map_err(|e| {
        warn!(error = %e, "SNS callback from a topic not ours refused");
        Problem::new(StatusCode::FORBIDDEN, "topic_not_allowed", e.to_string()).with_field("TopicArn")
    })?;
    let pem = certificate(&s, &message.signing_cert_url).await?;
    message.verify_with_cert(&pem).map_err(|e| {
        warn!(error = %e, "SNS callback refused");
        forbidden(e.to_string())
    })?;
    match message.kind.as_str() {
        "SubscriptionConfirmation" => {
            let Some(url) = message.subscribe_url.as_deref().filter(|u| is_sns_url(u)) else {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_field",
                    "SubscribeURL is not an SNS URL",
                )
                .with_field("SubscribeURL")
                .into());
            };
            let confirmed = async { http().get(url).send().await?.error_for_status() }.await;
            if let Err(e) = confirmed {
                warn!(error = %e, "subscription not confirmed; SNS will send the confirmation again");
                return Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "confirmation failed").into());
            }
            info!(topic = ?message.topic_arn, "SNS subscription confirmed");
            Ok((StatusCode::OK, Json(json!({"confirmed": true}))))
        }
        "UnsubscribeConfirmation" => Ok((StatusCode::OK, Json(json!({"ignored": true})))),
        _ => {
            let event: Value = serde_json::from_str(&message.message).map_err(|e| {
                Problem::new(StatusCode::BAD_REQUEST, "invalid_body", format!("Message is not JSON: {e}"))
                    .with_field("Message")
            })?;
            let callback = if provider == "push" { Callback::Push } else { Callback::Ses };
            let outcome = receipts::receive(&s.deps, &message, &event, callback).await?;
            Ok((StatusCode::OK, Json(outcome)))
        }
    }
}
