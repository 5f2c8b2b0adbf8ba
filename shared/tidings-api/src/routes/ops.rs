use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tidings_core::ports::QueueError;

use crate::extract::{PathParams, Tenant};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/ops/queues", get(queues))
        .route("/v1/ops/metrics", get(metrics))
        .route("/v1/ops/dlq/{queue}/redrive", post(redrive))
}

fn queue_error(e: QueueError) -> ApiError {
    match e {
        QueueError::UnknownQueue(q) => Problem::not_found(&format!("queue {q}")).into(),
        e => tidings_core::CoreError::from(e).into(),
    }
}

/// Depth of every queue and its DLQ. Any tenant's key may read it (operators' view).
async fn queues(State(s): State<AppState>, Tenant(_t): Tenant) -> ApiResult<Json<Value>> {
    let mut out = Vec::new();
    for name in s.queue_names.iter() {
        out.push(s.deps.queues.stats(name).await.map_err(queue_error)?);
    }
    Ok(Json(json!({ "queues": out })))
}

async fn redrive(
    State(s): State<AppState>,
    Tenant(_t): Tenant,
    PathParams(queue): PathParams<String>,
) -> ApiResult<Json<Value>> {
    if !s.queue_names.contains(&queue) {
        return Err(Problem::not_found(&format!("queue {queue}")).into());
    }
    let moved = s.deps.queues.redrive(&queue).await.map_err(queue_error)?;
    Ok(Json(json!({ "queue": queue, "moved": moved })))
}

/// Sends per second per channel, 429 ratio, retries, dead letters, worker concurrency, and the
/// oldest message's age per queue (read now from the queues). Operators' view, like `queues`.
async fn metrics(State(s): State<AppState>, Tenant(_t): Tenant) -> ApiResult<Json<Value>> {
    let mut report = tidings_core::metrics::installed().map(|r| r.report()).unwrap_or_default();
    for name in s.queue_names.iter() {
        let stats = s.deps.queues.stats(name).await.map_err(queue_error)?;
        report.oldest_age_s.insert(name.clone(), stats.oldest_age_s as f64);
    }
    Ok(Json(json!(report)))
}
