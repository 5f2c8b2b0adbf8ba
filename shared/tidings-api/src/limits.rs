//! Rate limits on the API ([`tidings_core::gates::api`]): a middleware that classes each request
//! and answers 429 with `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers) when its bucket is empty.
//!
//! The public routes (tracking links, unsubscribe, callbacks, the live feed) take no key: their
//! buckets are per client address, taken here before the handler. The others are per tenant,
//! known only once the key is checked: the middleware leaves a [`Pending`] in the request and
//! the [`crate::extract::Tenant`] extractor takes from the tenant's bucket through [`admit_tenant`];
//! the answer gets its fields here on the way out.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tidings_core::TenantId;
use tidings_core::gates::api::{Admission, ApiLimits, Caller, RouteClass};
use tidings_core::ports::{Clock, SystemClock};

use crate::problem::{ApiError, Problem};

/// The client's address, as the runtime saw it: API Gateway's `sourceIp` in Lambda (put here by
/// the `api` function), the peer address under `tidings serve` (its `ConnectInfo`). Headers such
/// as `X-Forwarded-For` are the client's to write and are never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which bucket a route takes from; `None`: not limited (health, the dev routes).
pub fn class_of(method: &Method, route: &str) -> Option<RouteClass> {
    if route == "/healthz" || route.starts_with("/dev/") {
        return None;
    }
    if route.starts_with("/v1/callbacks/") {
        return Some(RouteClass::Callback);
    }
    if !route.starts_with("/v1/") || route == "/v1/ws" {
        // `/t/*`, `/u/*`, the console page, the OpenAPI document and the live feed: no key.
        return Some(RouteClass::Public);
    }
    if method == Method::POST && route == "/v1/notifications" {
        return Some(RouteClass::Send);
    }
    if method == Method::GET || method == Method::HEAD { Some(RouteClass::Read) } else { Some(RouteClass::Write) }
}

/// A tenant route's place in its bucket, filled in by [`admit_tenant`].
#[derive(Clone)]
pub struct Pending {
    limits: Arc<ApiLimits>,
    class: RouteClass,
    admission: Arc<Mutex<Option<Admission>>>,
}

fn client_ip(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ClientIp>()
        .map(|c| c.0)
        .or_else(|| req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
}

/// The middleware (`axum::middleware::from_fn_with_state(limits, limit)`).
pub async fn limit(
    axum::extract::State(limits): axum::extract::State<Arc<ApiLimits>>,
    mut req: Request,
    next: Next,
) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let Some(class) = class_of(req.method(), route.as_deref().unwrap_or(req.uri().path())) else {
        return next.run(req).await;
    };
    if class.by_address() {
        // No address known (a test calling the router directly): nothing to key a bucket by.
        let Some(ip) = client_ip(&req) else { return next.run(req).await };
        let Some(admission) = limits.admit(Caller::Address(ip), class, SystemClock.now_ms()).await else {
            return next.run(req).await;
        };
        if admission.refused.is_some() {
            return with_fields(refusal(&admission).into_response(), &admission);
        }
        return with_fields(next.run(req).await, &admission);
    }
    let slot = Arc::new(Mutex::new(None));
    req.extensions_mut().insert(Pending { limits, class, admission: slot.clone() });
    let res = next.run(req).await;
    let admission = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    match admission {
        Some(a) => with_fields(res, &a),
        None => res,
    }
}

/// Takes a request of `tenant` from its bucket (once per request): 429 when it is empty.
pub async fn admit_tenant(parts: &axum::http::request::Parts, tenant: &TenantId) -> Result<(), ApiError> {
    let Some(pending) = parts.extensions.get::<Pending>() else { return Ok(()) };
    if pending.admission.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Ok(());
    }
    let Some(admission) = pending.limits.admit(Caller::Tenant(tenant), pending.class, SystemClock.now_ms()).await
    else {
        return Ok(());
    };
    let refused = admission.refused.is_some().then(|| refusal(&admission));
    *pending.admission.lock().unwrap_or_else(|p| p.into_inner()) = Some(admission);
    match refused {
        Some(p) => Err(p.into()),
        None => Ok(()),
    }
}

fn seconds_up(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000) as u64
}

fn refusal(a: &Admission) -> Problem {
    let wait = seconds_up(a.refused.unwrap_or_default()).max(1);
    let who = if a.class.by_address() { "this address" } else { "this tenant" };
    let mut p = Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!(
            "more than {} {} requests a second from {who}; try again in {wait} s (see RateLimit-Policy)",
            a.quota,
            a.class.as_str()
        ),
    );
    p.retry_after_s = Some(wait);
    p
}

/// `RateLimit-Policy: "send";q=50;w=1` and `RateLimit: "send";r=12;t=1` (and `Retry-After` on
/// a refusal, which the problem document already carries).
fn with_fields(mut res: Response, a: &Admission) -> Response {
    let name = a.class.as_str();
    let reset = if a.refused.is_some() { seconds_up(a.reset).max(1) } else { seconds_up(a.reset) };
    let headers = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";q={};w=1", a.quota)) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r={};t={reset}", a.remaining)) {
        headers.insert(RATELIMIT.clone(), v);
    }
    if let Some(wait) = a.refused
        && !headers.contains_key(header::RETRY_AFTER)
    {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds_up(wait).max(1)));
    }
    res
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use axum::body::Body as HttpBody;
    use http_body_util::BodyExt;
    use tidings_core::gates::GateStore;
    use tidings_core::gates::api::ApiRates;
    use tidings_core::ops::tenants;
    use tower::ServiceExt;

    use crate::state::AppState;

    async fn app(rates: &str) -> axum::Router {
        let deps = crate::test_support::memory_deps();
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        tenants::register_key(&deps, &TenantId::parse("b").unwrap(), "key-b").await.unwrap();
        let limits = Arc::new(ApiLimits::new(ApiRates::parse(rates).unwrap(), GateStore::Local));
        let state = AppState { deps, queue_names: Arc::new(Vec::new()), dev: None, live: None };
        crate::app_with_limits(state, limits)
    }

    async fn get(app: &axum::Router, key: Option<&str>, uri: &str, ip: &str) -> Response {
        let mut req = Request::builder().uri(uri);
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let mut req = req.body(HttpBody::empty()).unwrap();
        req.extensions_mut().insert(ClientIp(ip.parse().unwrap()));
        app.clone().oneshot(req).await.unwrap()
    }

    /// Tenant a over its rate of reads gets 429 problems with the fields; tenant b, and a's
    /// other classes, are untouched; a bad key is 401, not counted against anyone.
    #[tokio::test]
    async fn a_tenant_over_its_rate_gets_429_with_the_fields_and_another_does_not() {
        let app = app("read:3,write:3").await;
        let mut statuses = Vec::new();
        for _ in 0..6 {
            let res = get(&app, Some("key-a"), "/v1/users/u1", "198.51.100.1").await;
            statuses.push(res.status().as_u16());
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                assert_eq!(res.headers()["ratelimit-policy"], "\"read\";q=3;w=1");
                assert!(res.headers()["ratelimit"].to_str().unwrap().starts_with("\"read\";r=0;t="));
                let wait: u64 = res.headers()[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
                assert_eq!(wait, 1, "a token comes within a third of a second");
                let body = res.into_body().collect().await.unwrap().to_bytes();
                let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(p["code"], "rate_limited");
            } else {
                assert_eq!(res.headers()["ratelimit-policy"], "\"read\";q=3;w=1");
            }
        }
        // The bucket of 3 at once (and a fourth if the six took over a third of a second).
        let refused = statuses.iter().filter(|s| **s == 429).count();
        assert!((2..=3).contains(&refused), "{statuses:?}");
        assert_eq!(statuses.iter().filter(|s| **s == 404).count(), 6 - refused, "{statuses:?}");
        let b = get(&app, Some("key-b"), "/v1/users/u1", "198.51.100.1").await;
        assert_eq!(b.status(), StatusCode::NOT_FOUND, "b has a bucket of its own");
        assert_eq!(b.headers()["ratelimit"], "\"read\";r=2;t=1");
        let bad = get(&app, Some("nope"), "/v1/users/u1", "198.51.100.1").await;
        assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    }

    /// One address flooding the tracking routes is refused; another address, and the tenants'
    /// API from that same address, are not.
    #[tokio::test]
    async fn a_public_route_flood_from_one_address_is_refused_alone() {
        let app = app("public:2").await;
        let mut refused = 0;
        for _ in 0..10 {
            let res = get(&app, None, "/t/o/not-a-token", "203.0.113.9").await;
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                refused += 1;
                assert!(res.headers().contains_key(header::RETRY_AFTER));
                assert_eq!(res.headers()["ratelimit-policy"], "\"public\";q=2;w=1");
            }
        }
        assert!((7..=8).contains(&refused), "{refused} of 10 refused at 2/s");
        let other = get(&app, None, "/t/o/not-a-token", "203.0.113.10").await;
        assert_ne!(other.status(), StatusCode::TOO_MANY_REQUESTS);
        let api = get(&app, Some("key-a"), "/v1/users/u1", "203.0.113.9").await;
        assert_eq!(api.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn routes_fall_into_their_classes() {
        let c = |m: Method, r: &str| class_of(&m, r);
        assert_eq!(c(Method::POST, "/v1/notifications"), Some(RouteClass::Send));
        assert_eq!(c(Method::POST, "/v1/notifications/{id}/cancel"), Some(RouteClass::Write));
        assert_eq!(c(Method::PUT, "/v1/users/{user_id}"), Some(RouteClass::Write));
        assert_eq!(c(Method::GET, "/v1/notifications/{id}"), Some(RouteClass::Read));
        assert_eq!(c(Method::GET, "/t/o/{token}"), Some(RouteClass::Public));
        assert_eq!(c(Method::POST, "/u/{token}"), Some(RouteClass::Public));
        assert_eq!(c(Method::GET, "/v1/ws"), Some(RouteClass::Public));
        assert_eq!(c(Method::POST, "/v1/callbacks/{provider}"), Some(RouteClass::Callback));
        assert_eq!(c(Method::GET, "/healthz"), None);
        assert_eq!(c(Method::GET, "/dev/deliveries"), None);
    }

    #[test]
    fn the_fields_follow_the_draft() {
        let a = Admission {
            class: RouteClass::Send,
            quota: 50,
            remaining: 0,
            reset: Duration::from_millis(1200),
            refused: Some(Duration::from_millis(20)),
        };
        let res = with_fields(refusal(&a).into_response(), &a);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["ratelimit-policy"], "\"send\";q=50;w=1");
        assert_eq!(res.headers()["ratelimit"], "\"send\";r=0;t=2");
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
        assert_eq!(res.headers()[header::CONTENT_TYPE], "application/problem+json");
    }
}
