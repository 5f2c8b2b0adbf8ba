//! `/dev/*`: local development only (present when the runtime gives dev hooks).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tidings_core::dev::{self, FaultConfig, RecordedSend};
use tidings_core::ports::Channel;

use crate::extract::{Body, PathParams, QueryParams};
use crate::problem::{ApiResult, Problem};
use crate::state::{AppState, DevControl};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(console))
        .route("/dev/deliveries", get(deliveries))
        .route("/dev/providers/{channel}", put(configure_provider).get(provider_config))
        .route("/dev/clock", get(clock))
        .route("/dev/clock/advance", post(advance))
        .route("/dev/schedules/{name}/run", post(run_schedule))
}

/// The local console: queues and DLQs (with a redrive button), recent deliveries, a user's
/// inbox, campaign progress, stock and restock notices, refreshed every two seconds. A static
/// page calling the API with the key the user types (kept in the browser's local storage).
async fn console() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("../console.html"))
}

fn dev_of(s: &AppState) -> ApiResult<&dyn DevControl> {
    s.dev.as_deref().ok_or_else(|| Problem::new(StatusCode::NOT_FOUND, "no_route", "dev routes are off").into())
}

fn channel_of(name: &str) -> ApiResult<Channel> {
    match Channel::parse(name) {
        Some(c) if c != Channel::Inapp => Ok(c),
        _ => Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "channel must be email, sms or push")
            .with_field("channel")
            .into()),
    }
}

#[derive(Deserialize)]
struct SendFilter {
    user_id: Option<String>,
    channel: Option<String>,
}

async fn deliveries(
    State(s): State<AppState>,
    QueryParams(f): QueryParams<SendFilter>,
) -> ApiResult<Json<Vec<RecordedSend>>> {
    dev_of(&s)?;
    let channel = f.channel.as_deref().map(channel_of).transpose()?;
    Ok(Json(dev::list_sends(s.deps.table.as_ref(), f.user_id.as_deref(), channel).await?))
}

async fn configure_provider(
    State(s): State<AppState>,
    PathParams(name): PathParams<String>,
    Body(config): Body<FaultConfig>,
) -> ApiResult<Json<FaultConfig>> {
    let channel = channel_of(&name)?;
    let d = dev_of(&s)?;
    let p = d.providers().get(channel).ok_or_else(|| Problem::not_found("provider"))?;
    p.configure(config);
    Ok(Json(p.config()))
}

async fn provider_config(
    State(s): State<AppState>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<FaultConfig>> {
    let channel = channel_of(&name)?;
    let d = dev_of(&s)?;
    let p = d.providers().get(channel).ok_or_else(|| Problem::not_found("provider"))?;
    Ok(Json(p.config()))
}

async fn clock(State(s): State<AppState>) -> ApiResult<Json<Value>> {
    dev_of(&s)?;
    let now = s.deps.clock.now();
    Ok(Json(
        json!({"now": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "manual": s.dev.as_ref().is_some_and(|d| d.manual_clock().is_some())}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Advance {
    seconds: i64,
}

async fn advance(State(s): State<AppState>, Body(a): Body<Advance>) -> ApiResult<Json<Value>> {
    let d = dev_of(&s)?;
    let Some(clock) = d.manual_clock() else {
        return Err(
            Problem::new(StatusCode::CONFLICT, "not_manual_clock", "start the server with --manual-clock").into()
        );
    };
    if !(0..=366 * 86_400).contains(&a.seconds) {
        return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "seconds must be 0 to 31622400")
            .with_field("seconds")
            .into());
    }
    let now = clock.advance(chrono::Duration::seconds(a.seconds));
    d.clock_moved();
    Ok(Json(json!({"now": now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)})))
}

async fn run_schedule(State(s): State<AppState>, PathParams(name): PathParams<String>) -> ApiResult<Json<Value>> {
    let d = dev_of(&s)?;
    match d.run_schedule(&name).await {
        Ok(Some(v)) => Ok(Json(json!({"schedule": name, "result": v}))),
        Ok(None) => Err(Problem::not_found(&format!("schedule {name}")).into()),
        Err(e) => {
            tracing::error!(schedule = %name, error = %e, "scheduled job failed");
            Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, "schedule_failed", "the job failed; see the server log")
                .into())
        }
    }
}
