use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{Value, json};
use tidings_core::ports::{QueueError, QueueStats};

use crate::extract::{Operator, PathParams, QueryParams, Tenant};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(queues, dead_letters, redrive, metrics, prometheus, verification))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/ops/queues", get(queues))
        .route("/v1/ops/metrics", get(metrics))
        .route("/metrics", get(prometheus))
        .route("/v1/ops/verification", get(verification))
        .route("/v1/ops/dlq/{queue}", get(dead_letters))
        .route("/v1/ops/dlq/{queue}/redrive", post(redrive))
}

fn queue_error(e: QueueError) -> ApiError {
    match e {
        QueueError::UnknownQueue(q) => Problem::not_found(&format!("queue {q}")).into(),
        e => tidings_core::CoreError::from(e).into(),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct QueueList {
    queues: Vec<QueueStats>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct Redriven {
    queue: String,
    /// Messages moved from the DLQ back to the queue.
    moved: u64,
}

/// Depth of every queue and its DLQ (an operator key: the queues are every tenant's).
#[utoipa::path(get, path = "/v1/ops/queues", tag = "ops", security(("operator_key" = [])),
    responses((status = 200, description = "Depths per queue", body = QueueList)))]
async fn queues(State(s): State<AppState>, _op: Operator) -> ApiResult<Json<QueueList>> {
    let mut queues = Vec::new();
    for name in s.queue_names.iter() {
        queues.push(s.deps.queues.stats(name).await.map_err(queue_error)?);
    }
    Ok(Json(QueueList { queues }))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DeadLetterQuery {
    /// How many to show, 1 to 500 (default 50), as the lists' `limit`.
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct DeadLetterList {
    #[schema(example = "sms-high")]
    queue: String,
    /// Up to `limit` of the queue's dead letters, each with why it is there (no message text).
    dead_letters: Vec<tidings_core::ops::dead_letters::DeadLetter>,
}

/// A queue's dead letters with their reasons, without removing them (an operator key, like
/// `queues`). On SQS a look counts as a receive of each letter shown (the DLQ has no redrive
/// policy of its own, so nothing moves).
#[utoipa::path(get, path = "/v1/ops/dlq/{queue}", tag = "ops", security(("operator_key" = [])),
    params(("queue" = String, Path, description = "A queue name, as `GET /v1/ops/queues` lists them"), DeadLetterQuery),
    responses((status = 200, description = "The dead letters and why each died", body = DeadLetterList),
        (status = 404, description = "No such queue", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid_field`: `limit` out of 1..=500", body = Problem, content_type = "application/problem+json")))]
async fn dead_letters(
    State(s): State<AppState>,
    _op: Operator,
    PathParams(queue): PathParams<String>,
    QueryParams(q): QueryParams<DeadLetterQuery>,
) -> ApiResult<Json<DeadLetterList>> {
    let limit = crate::extract::PageParams { limit: q.limit, cursor: None }.limit()?;
    if !s.queue_names.contains(&queue) {
        return Err(Problem::not_found(&format!("queue {queue}")).into());
    }
    let mut dead_letters = Vec::new();
    for m in s.deps.queues.peek_dlq(&queue, limit).await.map_err(queue_error)? {
        dead_letters.push(tidings_core::ops::dead_letters::explain(&s.deps, &m).await);
    }
    Ok(Json(DeadLetterList { queue, dead_letters }))
}

/// Moves the queue's dead letters back to it, as new messages (an operator key: a queue is
/// shared by every tenant).
#[utoipa::path(post, path = "/v1/ops/dlq/{queue}/redrive", tag = "ops", security(("operator_key" = [])),
    params(("queue" = String, Path, description = "A queue name, as `GET /v1/ops/queues` lists them")),
    responses((status = 200, description = "How many moved", body = Redriven),
        (status = 404, description = "No such queue", body = Problem, content_type = "application/problem+json")))]
async fn redrive(
    State(s): State<AppState>,
    _op: Operator,
    PathParams(queue): PathParams<String>,
) -> ApiResult<Json<Redriven>> {
    if !s.queue_names.contains(&queue) {
        return Err(Problem::not_found(&format!("queue {queue}")).into());
    }
    let moved = s.deps.queues.redrive(&queue).await.map_err(queue_error)?;
    Ok(Json(Redriven { queue, moved }))
}

/// Sends per second per channel, 429 ratio, retries, dead letters, worker concurrency, and the
/// oldest message's age per queue (read now from the queues). An operator key, like `queues`.
#[utoipa::path(get, path = "/v1/ops/metrics", tag = "ops", security(("operator_key" = [])),
    responses((status = 200, description = "Rates, ratios and queue ages", body = tidings_core::metrics::Report)))]
async fn metrics(State(s): State<AppState>, _op: Operator) -> ApiResult<Json<Value>> {
    let mut report = tidings_core::metrics::installed().map(|r| r.report()).unwrap_or_default();
    for name in s.queue_names.iter() {
        let stats = s.deps.queues.stats(name).await.map_err(queue_error)?;
        report.oldest_age_s.insert(name.clone(), stats.oldest_age_s as f64);
    }
    Ok(Json(json!(report)))
}

/// The same figures for a Prometheus scrape, in its text format: every metric of the process
/// with its labels (histograms as summaries with their quantiles). Only `tidings serve` has it
/// (404 on Lambda, where the figures are CloudWatch's). An operator key, like `metrics`: the
/// figures are every tenant's (a scrape sends it as `authorization: Bearer <key>`).
#[utoipa::path(get, path = "/metrics", tag = "ops", security(("operator_key" = [])),
    responses((status = 200, description = "The Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4",
            example = "# TYPE tidings_provider_calls counter\ntidings_provider_calls{channel=\"email\",provider=\"fake-email\",result=\"ok\"} 12\n"),
        (status = 401, description = "No key, or an unknown one", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`operator_only`: a tenant's key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not served here (a Lambda function)", body = Problem, content_type = "application/problem+json")))]
async fn prometheus(_op: Operator) -> ApiResult<([(axum::http::header::HeaderName, &'static str); 1], String)> {
    match tidings_core::metrics::exposition() {
        Some(text) => Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)),
        None => Err(Problem::not_found("a Prometheus endpoint in this process").into()),
    }
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct VerificationQuery {
    /// The template of the codes (its user-triggered notifications).
    template_id: String,
    /// The last hours to show, 1 to 168 (default 24).
    #[param(minimum = 1, maximum = 168)]
    hours: Option<u32>,
}

/// Per hour, a template's user-triggered notifications (those accepted with a `requester`) and
/// how many were reported verified: a falling ratio is codes requested that nobody uses, the
/// mark of SMS pumping. This tenant's only.
#[utoipa::path(get, path = "/v1/ops/verification", tag = "ops", security(("api_key" = [])), params(VerificationQuery),
    responses((status = 200, description = "Accepted and verified per hour, newest first", body = tidings_core::notify::verification::VerificationStats),
        (status = 422, description = "A bad `template_id` or `hours`", body = Problem, content_type = "application/problem+json")))]
async fn verification(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(q): QueryParams<VerificationQuery>,
) -> ApiResult<Json<tidings_core::notify::verification::VerificationStats>> {
    let hours = q.hours.unwrap_or(24);
    Ok(Json(tidings_core::notify::verification::stats(&s.deps, &t, &q.template_id, hours).await?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tidings_core::TenantId;
    use tidings_core::ops::tenants::{self, KeySpec, Role};
    use tower::ServiceExt;

    use crate::state::AppState;

    async fn get(app: &axum::Router, key: &str, uri: &str) -> (u16, Value) {
        let req = Request::get(uri).header("authorization", format!("Bearer {key}")).body(Body::empty()).unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Each dead letter is shown with why it died, without its message text, and stays on the
    /// DLQ; an unknown queue is 404, a bad `limit` 422 naming it, a tenant's key 403.
    #[tokio::test]
    async fn dead_letters_are_listed_with_their_reasons() {
        let store = tidings_embedded::EmbeddedStore::in_memory().unwrap();
        store.declare_queue(tidings_embedded::QueueConfig::new("sms-high", 3)).unwrap();
        let deps = crate::test_support::deps_over(store);
        tenants::register(&deps, "key-ops", KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        let rejected = json!({"rejected": "not a channel task: expected value at line 1", "queue": "sms-high",
                              "at": "2026-01-01T00:00:00Z", "receive_count": 1, "original_body": "{"});
        let task = json!({"tenant": "a", "notification_id": "n1", "user_id": "alice", "channel": "sms",
                          "category": "transactional", "to": "+14155550100", "body": "Your code is 123456"});
        for body in [rejected, task] {
            deps.queues.send_to_dlq("sms-high", body.to_string()).await.unwrap();
        }
        let queues = Arc::new(vec!["sms-high".to_owned()]);
        let app = crate::app(AppState::new(crate::AppParts {
            deps: deps.clone(),
            queue_names: queues,
            dev: None,
            live: None,
        }));

        let (st, v) = get(&app, "key-ops", "/v1/ops/dlq/sms-high").await;
        assert_eq!(st, 200, "{v}");
        let letters = v["dead_letters"].as_array().unwrap();
        assert_eq!(letters.len(), 2, "{v}");
        let of = |kind: &str| letters.iter().find(|l| l["kind"] == kind).unwrap_or_else(|| panic!("{kind}: {v}"));
        assert!(of("rejected")["reason"].as_str().unwrap().contains("not a channel task"), "{v}");
        let task = of("channel_task");
        assert_eq!(
            (&task["user_id"], &task["channel"], &task["notification_id"]),
            (&json!("alice"), &json!("sms"), &json!("n1"))
        );
        assert!(task["reason"].as_str().unwrap().contains("no delivery record"), "{v}");
        assert!(!v.to_string().contains("123456"), "no message text: {v}");
        let (_, again) = get(&app, "key-ops", "/v1/ops/dlq/sms-high?limit=1").await;
        assert_eq!(again["dead_letters"].as_array().unwrap().len(), 1, "a look removes nothing; limit: {again}");

        let (st, _) = get(&app, "key-ops", "/v1/ops/dlq/nope").await;
        assert_eq!(st, 404);
        for bad in ["0", "501"] {
            let (st, v) = get(&app, "key-ops", &format!("/v1/ops/dlq/sms-high?limit={bad}")).await;
            assert_eq!((st, v["field"].as_str()), (422, Some("limit")), "{v}");
        }
        let (st, _) = get(&app, "key-a", "/v1/ops/dlq/sms-high").await;
        assert_eq!(st, 403, "a tenant's key");
    }
}
