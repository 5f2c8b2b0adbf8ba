//! `/dev/*`: local development only (present when the runtime gives dev hooks: `tidings
//! serve`, on the AWS backend only with `--dev` against emulators on this machine; never in
//! Lambda). Every route needs an operator key ([`DevAccess`]), except under `tidings serve --dev`
//! on a loopback address.

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidings_core::dev::{self, FaultConfig, RecordedSend};
use tidings_core::ports::Channel;

use crate::extract::{Body, PathParams, QueryParams};
use crate::problem::{ApiError, ApiResult, Problem};
use crate::state::{AppState, DevControl};

#[derive(utoipa::OpenApi)]
#[openapi(paths(deliveries, configure_provider, provider_config, clock, advance, run_schedule))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/dev/deliveries", get(deliveries))
        .route("/dev/providers/{channel}", put(configure_provider).get(provider_config))
        .route("/dev/clock", get(clock))
        .route("/dev/clock/advance", post(advance))
        .route("/dev/schedules/{name}/run", post(run_schedule))
}

fn dev_of(s: &AppState) -> ApiResult<&dyn DevControl> {
    s.dev.as_deref().ok_or_else(|| Problem::new(StatusCode::NOT_FOUND, "no_route", "dev routes are off").into())
}

/// Who may use a `/dev` route: the holder of any valid API key, or anyone when the runtime
/// allows keyless access (`tidings serve --dev` listening on loopback). What the routes show
/// (every tenant's sent bodies, OTP codes among them) and do (fail every send) is no tenant's.
pub struct DevAccess;

impl FromRequestParts<AppState> for DevAccess {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if dev_of(state)?.keyless() {
            return Ok(DevAccess);
        }
        // Every tenant's sent bodies and OTP codes, and faults that fail every tenant's sends:
        // an operator's, like the other system-wide routes.
        match crate::extract::principal(parts, state).await? {
            tidings_core::ops::tenants::Principal::Operator { .. } => Ok(DevAccess),
            tidings_core::ops::tenants::Principal::Tenant { .. } => Err(Problem::new(
                StatusCode::FORBIDDEN,
                "operator_only",
                "the /dev routes show and change every tenant's sends: an operator key",
            )
            .into()),
        }
    }
}

fn channel_of(name: &str) -> ApiResult<Channel> {
    match Channel::parse(name) {
        Some(c) if c != Channel::Inapp => Ok(c),
        _ => Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "channel must be email, sms or push")
            .with_field("channel")
            .into()),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct SendFilter {
    user_id: Option<String>,
    channel: Option<String>,
}

/// Sends the local fake providers accepted (`tidings serve` only).
#[utoipa::path(get, path = "/dev/deliveries", tag = "dev", security(("api_key" = [])), params(SendFilter),
    responses((status = 200, description = "Recorded sends", body = Vec<RecordedSend>)))]
async fn deliveries(
    _: DevAccess,
    State(s): State<AppState>,
    QueryParams(f): QueryParams<SendFilter>,
) -> ApiResult<Json<Vec<RecordedSend>>> {
    dev_of(&s)?;
    let channel = f.channel.as_deref().map(channel_of).transpose()?;
    Ok(Json(dev::list_sends(s.deps.table.as_ref(), f.user_id.as_deref(), channel).await?))
}

/// Makes a local fake provider fail, throttle or time out (`tidings serve` only).
#[utoipa::path(put, path = "/dev/providers/{channel}", tag = "dev", security(("api_key" = [])), params(("channel" = String, Path, description = "email, sms or push")), request_body = FaultConfig,
    responses((status = 200, description = "The provider's behaviour now", body = FaultConfig),
        (status = 422, description = "`invalid_field`: a bad `channel`, or `delay_ms` over 60000", body = Problem, content_type = "application/problem+json")))]
async fn configure_provider(
    _: DevAccess,
    State(s): State<AppState>,
    PathParams(name): PathParams<String>,
    Body(config): Body<FaultConfig>,
) -> ApiResult<Json<FaultConfig>> {
    let channel = channel_of(&name)?;
    if config.delay_ms.is_some_and(|ms| ms > dev::MAX_DELAY_MS) {
        return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "delay_ms is at most 60000")
            .with_field("delay_ms")
            .into());
    }
    let d = dev_of(&s)?;
    let p = d.providers().get(channel).ok_or_else(|| Problem::not_found("provider"))?;
    p.configure(config);
    Ok(Json(p.config()))
}

#[utoipa::path(get, path = "/dev/providers/{channel}", tag = "dev", security(("api_key" = [])), params(("channel" = String, Path, description = "email, sms or push")),
    responses((status = 200, description = "The provider's behaviour", body = FaultConfig)))]
async fn provider_config(
    _: DevAccess,
    State(s): State<AppState>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<FaultConfig>> {
    let channel = channel_of(&name)?;
    let d = dev_of(&s)?;
    let p = d.providers().get(channel).ok_or_else(|| Problem::not_found("provider"))?;
    Ok(Json(p.config()))
}

#[derive(Serialize, utoipa::ToSchema)]
struct ClockView {
    now: String,
    /// Whether the server runs with `--manual-clock`.
    #[serde(skip_serializing_if = "Option::is_none")]
    manual: Option<bool>,
}

/// The server's clock (`tidings serve` only).
#[utoipa::path(get, path = "/dev/clock", tag = "dev", security(("api_key" = [])), responses((status = 200, description = "Now", body = ClockView)))]
async fn clock(_: DevAccess, State(s): State<AppState>) -> ApiResult<Json<ClockView>> {
    dev_of(&s)?;
    let now = s.deps.clock.now();
    Ok(Json(ClockView {
        now: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        manual: Some(s.dev.as_ref().is_some_and(|d| d.manual_clock().is_some())),
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Advance {
    /// 0 to 31622400.
    #[schema(minimum = 0, maximum = 31_622_400)]
    seconds: i64,
}

/// Moves the manual clock forward and runs what fell due (`tidings serve --manual-clock` only).
#[utoipa::path(post, path = "/dev/clock/advance", tag = "dev", security(("api_key" = [])), request_body = Advance,
    responses((status = 200, description = "The new now", body = ClockView),
        (status = 409, description = "`not_manual_clock`: the server runs on the system clock", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`clock_not_stored`: the store did not take the new time", body = Problem, content_type = "application/problem+json")))]
async fn advance(_: DevAccess, State(s): State<AppState>, Body(a): Body<Advance>) -> ApiResult<Json<ClockView>> {
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
    // Kept with the data before answering: a restart (even `kill -9`) resumes from here.
    if let Err(e) = tidings_core::dev::store_manual_clock(s.deps.table.as_ref(), now).await {
        tracing::error!(error = %e, "the manual clock's time was not stored");
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "clock_not_stored",
            "the clock moved but its time was not stored; advance again (0 seconds stores it)",
        )
        .into());
    }
    d.clock_moved();
    Ok(Json(ClockView { now: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), manual: None }))
}

/// Runs a scheduled job now and waits for it (`tidings serve` only).
#[utoipa::path(post, path = "/dev/schedules/{name}/run", tag = "dev", security(("api_key" = [])),
    params(("name" = String, Path, description = "The schedule's name")),
    responses((status = 200, description = "`{schedule, result}`: what the job reported", body = Object),
        (status = 404, description = "No such schedule", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The job failed", body = Problem, content_type = "application/problem+json")))]
async fn run_schedule(
    _: DevAccess,
    State(s): State<AppState>,
    PathParams(name): PathParams<String>,
) -> ApiResult<Json<Value>> {
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
