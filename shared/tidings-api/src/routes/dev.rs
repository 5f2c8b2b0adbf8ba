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
        let keyless = dev_of(state)?.keyless();
        let authority = authority(parts);
        // Without a key, "on loopback" must hold for the name the browser asked for too: a page
        // whose own domain re-resolves to 127.0.0.1 (DNS rebinding) is same-origin with itself
        // and reads every answer (docs/operators.md, "The /dev routes").
        if keyless && !authority.as_deref().is_some_and(is_loopback_authority) {
            return Err(Problem::new(
                StatusCode::MISDIRECTED_REQUEST,
                "dev_host_not_loopback",
                "the keyless /dev routes answer only a Host of localhost, 127.0.0.1 or [::1]; \
                 open them by one of those names, or send an operator key",
            )
            .into());
        }
        // Another site's page can send simple requests (a text/plain POST needs no preflight)
        // without reading the answer: its writes (fail every send, move the clock) would land.
        if let Some(why) = cross_site(parts, authority.as_deref()) {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "cross_origin_refused",
                format!("{why}: the /dev routes answer only pages of this server's own origin; call them from a terminal or the console it serves"),
            )
            .into());
        }
        if keyless {
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

/// The name and port the client asked for: `Host`, or the URI's authority (HTTP/2).
fn authority(parts: &Parts) -> Option<String> {
    match parts.headers.get(axum::http::header::HOST) {
        Some(h) => h.to_str().ok().map(str::to_owned),
        None => parts.uri.authority().map(|a| a.as_str().to_owned()),
    }
}

/// `localhost`, an IPv4 loopback address or `[::1]`, with or without a port: names no other
/// site's DNS can hand out.
fn is_loopback_authority(authority: &str) -> bool {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some((host, tail)) = rest.split_once(']') else { return false };
        match tail.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if tail.is_empty() => (host, None),
            None => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return false;
    }
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why a request comes from another origin's page, if it does: an `Origin` other than this
/// server's own, or a browser's `Sec-Fetch-Site` saying another site (or another port of this
/// one) sent it. Terminals send neither; the console, served from here, is same-origin.
fn cross_site(parts: &Parts, authority: Option<&str>) -> Option<String> {
    if let Some(site) = parts.headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("unreadable");
        if !matches!(site, "same-origin" | "none") {
            return Some(format!("Sec-Fetch-Site is {site:?}"));
        }
    }
    let origin = parts.headers.get(axum::http::header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("unreadable");
    let origin_lower = origin.to_ascii_lowercase();
    let own = authority.is_some_and(|a| {
        let a = a.to_ascii_lowercase();
        ["http://", "https://"].iter().any(|scheme| origin_lower.strip_prefix(scheme) == Some(a.as_str()))
    });
    (!own).then(|| format!("Origin {origin:?} is not this server's"))
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
#[utoipa::path(get, path = "/dev/deliveries", tag = "dev", security(("operator_key" = [])), params(SendFilter),
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
#[utoipa::path(put, path = "/dev/providers/{channel}", tag = "dev", security(("operator_key" = [])), params(("channel" = String, Path, description = "email, sms or push")), request_body = FaultConfig,
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

#[utoipa::path(get, path = "/dev/providers/{channel}", tag = "dev", security(("operator_key" = [])), params(("channel" = String, Path, description = "email, sms or push")),
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
#[utoipa::path(get, path = "/dev/clock", tag = "dev", security(("operator_key" = [])), responses((status = 200, description = "Now", body = ClockView)))]
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
#[utoipa::path(post, path = "/dev/clock/advance", tag = "dev", security(("operator_key" = [])), request_body = Advance,
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
#[utoipa::path(post, path = "/dev/schedules/{name}/run", tag = "dev", security(("operator_key" = [])),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tidings_core::dev::{DevProvider, DevProviders};
    use tidings_core::ports::{Channel, ManualClock};
    use tower::ServiceExt;

    use crate::state::DevControl;

    /// `tidings serve --dev` on loopback: keyless.
    struct KeylessDev(DevProviders);

    #[async_trait::async_trait]
    impl DevControl for KeylessDev {
        fn providers(&self) -> &DevProviders {
            &self.0
        }
        fn manual_clock(&self) -> Option<&ManualClock> {
            None
        }
        async fn run_schedule(&self, _: &str) -> Result<Option<serde_json::Value>, String> {
            Ok(None)
        }
        fn keyless(&self) -> bool {
            true
        }
    }

    fn app() -> axum::Router {
        crate::app(dev_state())
    }

    /// A state with keyless development hooks over a fresh in-memory store.
    fn dev_state() -> crate::AppState {
        let deps = crate::test_support::memory_deps();
        let provider = |c: Channel| {
            let inner = deps.providers.for_channel(c).unwrap().clone();
            Arc::new(DevProvider::new(c, inner, deps.table.clone(), deps.clock.clone()))
        };
        let providers = DevProviders {
            email: provider(Channel::Email),
            sms: provider(Channel::Sms),
            push: provider(Channel::Push),
        };
        crate::AppState::with_dev(deps, Arc::new(KeylessDev(providers)))
    }

    /// A deployment's app has neither the development hooks nor the console, even given a
    /// state that holds them; `tidings serve --dev`'s has both.
    #[tokio::test]
    async fn a_deployment_serves_no_development_hook_and_no_console() {
        let off = || Arc::new(tidings_core::gates::api::ApiLimits::off());
        for uri in ["/dev/deliveries", "/", "/console/uPlot.min.css"] {
            let get = || Request::get(uri).header("host", "localhost").body(Body::empty()).unwrap();
            let served = crate::app_with_limits(dev_state(), off()).oneshot(get()).await.unwrap();
            assert_eq!(served.status(), 200, "{uri} under tidings serve --dev");
            let deployed = crate::deployed_app(dev_state(), off()).oneshot(get()).await.unwrap();
            assert_eq!(deployed.status(), 404, "{uri} in a deployment");
        }
    }

    async fn call(method: &str, uri: &str, headers: &[(&str, &str)]) -> (u16, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = if method == "GET" { Body::empty() } else { Body::from(r#"{"seconds": 60}"#) };
        let res = app().oneshot(req.body(body).unwrap()).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    /// DNS rebinding: a page at `rebind.example`, whose name now resolves to 127.0.0.1, is
    /// same-origin with itself and would read every tenant's sends. Only loopback names pass.
    #[tokio::test]
    async fn keyless_dev_answers_only_a_loopback_host() {
        for host in ["localhost:8080", "LOCALHOST", "127.0.0.1:9", "127.0.0.1", "[::1]:8080", "[::1]"] {
            let (st, v) = call("GET", "/dev/deliveries", &[("host", host)]).await;
            assert_eq!(st, 200, "{host}: {v}");
        }
        for host in [
            "rebind.example",
            "rebind.example:8080",
            "localhost.rebind.example",
            "127.0.0.1.nip.io:8080",
            "[::2]:8080",
            "localhost:80x",
            "[::1]x",
        ] {
            let (st, v) = call("GET", "/dev/deliveries", &[("host", host)]).await;
            assert_eq!((st, v["code"].as_str()), (421, Some("dev_host_not_loopback")), "{host}: {v}");
            assert!(v["detail"].as_str().unwrap().contains("localhost"), "says what to do: {v}");
        }
        let (st, _) = call("GET", "/dev/deliveries", &[]).await;
        assert_eq!(st, 421, "no Host at all is not loopback");
    }

    /// A simple cross-site request (a form's text/plain POST needs no preflight) reaches the
    /// server from any page the developer visits: refused before it does anything.
    #[tokio::test]
    async fn keyless_dev_refuses_other_origins_pages() {
        let host = ("host", "127.0.0.1:8080");
        let text = ("content-type", "text/plain");
        for refused in [
            vec![host, text, ("origin", "https://evil.example")],
            vec![host, text, ("origin", "null")],
            vec![host, text, ("origin", "http://localhost:3000")],
            vec![host, text, ("origin", "http://127.0.0.1:8081")],
            vec![host, text, ("sec-fetch-site", "cross-site")],
            vec![host, text, ("sec-fetch-site", "same-site")],
        ] {
            let (st, v) = call("POST", "/dev/clock/advance", &refused).await;
            assert_eq!((st, v["code"].as_str()), (403, Some("cross_origin_refused")), "{refused:?}: {v}");
        }
        // The console, served by this server, is its own origin; a terminal sends no Origin.
        for allowed in [
            vec![host, ("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "same-origin")],
            vec![host, ("sec-fetch-site", "none")],
            vec![host],
        ] {
            let (st, v) = call("GET", "/dev/clock", &allowed).await;
            assert_eq!(st, 200, "{allowed:?}: {v}");
        }
    }
}
