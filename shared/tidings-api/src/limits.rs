//! Rate limits on the API ([`tidings_core::gates::api`]; how to size them: docs/gates.md, "API
//! limits"): a middleware that classes each request and answers 429 with `Retry-After`, a
//! `rate_limited` problem and the `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers) when its bucket is empty.
//!
//! The public routes (tracking links, unsubscribe, callbacks, the live feed) take no key: their
//! buckets are per client address, taken here before the handler. The others are per tenant,
//! known only once the key is checked: the middleware leaves a [`Pending`] in the request and
//! the [`crate::extract::Tenant`] extractor takes from the tenant's bucket through [`admit_tenant`]
//! (a send's recipients through [`SendBudget`]); the answer gets its fields here on the way out.
//!
//! In front of every route that checks a key, failed authentications are counted per client
//! address: an address out of them is answered 429 before its key is looked at, so wrong keys
//! cannot be tried at the API's speed (docs/gates.md, "API limits").

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
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
    // A checkout: holding stock, paying, cancelling, reading the order back. A flash sale is
    // all of these at once, and must not be refused by the budget of ordinary changes.
    if route == "/v1/orders" || route.starts_with("/v1/orders/") {
        return Some(RouteClass::Orders);
    }
    if method == Method::GET || method == Method::HEAD { Some(RouteClass::Read) } else { Some(RouteClass::Write) }
}

/// Whether a route checks a key (so its failed authentications count against the address):
/// every tenant and operator route, and the `/dev` routes (an operator's key, or none with
/// `--dev` on loopback).
fn checks_a_key(class: Option<RouteClass>, route: &str) -> bool {
    match class {
        Some(c) => !c.by_address(),
        None => route.starts_with("/dev/"),
    }
}

/// A tenant route's places in its buckets, filled in by [`admit_tenant`] and [`SendBudget`].
#[derive(Clone)]
pub struct Pending {
    limits: Arc<ApiLimits>,
    class: RouteClass,
    admissions: Arc<Mutex<Vec<Admission>>>,
}

impl Pending {
    fn admissions(&self) -> std::sync::MutexGuard<'_, Vec<Admission>> {
        self.admissions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps an admission for the answer's `RateLimit` fields (one member per bucket: it replaces
    /// an earlier one of its class, as it says where the bucket now stands) and answers its
    /// refusal, if it was refused.
    /// Takes `take` units of `tenant`'s `class` bucket, all or none, for a request that costs
    /// `cost` in all: 422 from `too_many` (given the burst) when `cost` is more than the bucket
    /// ever holds, 429 when the units are not there yet.
    async fn take_units(
        &self,
        tenant: &TenantId,
        class: RouteClass,
        cost: u32,
        take: u32,
        too_many: impl FnOnce(u32) -> Problem,
    ) -> Result<(), ApiError> {
        let caller = Caller::Tenant(tenant);
        let Some(rate) = self.limits.rate(caller, class) else { return Ok(()) };
        let burst = rate.burst_units();
        if cost > burst {
            return Err(too_many(burst).into());
        }
        let Some(admission) = self.limits.admit_n(caller, class, take, SystemClock.now_ms()).await else {
            return Ok(());
        };
        self.record(admission)
    }

    fn record(&self, admission: Admission) -> Result<(), ApiError> {
        let refused = admission.refused.is_some().then(|| refusal(&admission));
        let mut admissions = self.admissions();
        admissions.retain(|a| a.class != admission.class);
        admissions.push(admission);
        match refused {
            Some(p) => Err(p.into()),
            None => Ok(()),
        }
    }
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
    req: Request,
    next: Next,
) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let route = route.as_deref().unwrap_or(req.uri().path()).to_owned();
    let class = class_of(req.method(), &route);
    // No address known (a test calling the router directly): nothing to key a bucket by.
    let ip = client_ip(&req);
    if checks_a_key(class, &route)
        && let Some(ip) = ip
    {
        return guard_authentication(&limits, ip, class, req, next).await;
    }
    match class {
        Some(class) => limited(limits, ip, class, req, next).await,
        None => next.run(req).await,
    }
}

/// Refuses an address out of failed authentications before its key is checked; counts the
/// request's own failure (a 401, whatever the route) once it is answered.
async fn guard_authentication(
    limits: &Arc<ApiLimits>,
    ip: IpAddr,
    class: Option<RouteClass>,
    req: Request,
    next: Next,
) -> Response {
    if let Some(refused) = limits.authentication_refused(ip, SystemClock.now_ms()) {
        return with_fields(refusal(&refused).into_response(), &[refused]);
    }
    let res = match class {
        Some(class) => limited(limits.clone(), Some(ip), class, req, next).await,
        None => next.run(req).await,
    };
    if res.status() == StatusCode::UNAUTHORIZED {
        // The answer stays the 401: the address learns it is refused from its next request.
        let _ = limits.authentication_failed(ip, SystemClock.now_ms()).await;
    }
    res
}

async fn limited(
    limits: Arc<ApiLimits>,
    ip: Option<IpAddr>,
    class: RouteClass,
    mut req: Request,
    next: Next,
) -> Response {
    if class.by_address() {
        let Some(ip) = ip else { return next.run(req).await };
        let Some(admission) = limits.admit(Caller::Address(ip), class, SystemClock.now_ms()).await else {
            return next.run(req).await;
        };
        if admission.refused.is_some() {
            return with_fields(refusal(&admission).into_response(), &[admission]);
        }
        return with_fields(next.run(req).await, &[admission]);
    }
    let pending = Pending { limits, class, admissions: Arc::new(Mutex::new(Vec::new())) };
    req.extensions_mut().insert(pending.clone());
    let res = next.run(req).await;
    let admissions = std::mem::take(&mut *pending.admissions());
    with_fields(res, &admissions)
}

/// Takes a request of `tenant` from its bucket (once per request): 429 when it is empty.
pub async fn admit_tenant(parts: &Parts, tenant: &TenantId) -> Result<(), ApiError> {
    let Some(pending) = parts.extensions.get::<Pending>() else { return Ok(()) };
    if pending.admissions().iter().any(|a| a.class == pending.class) {
        return Ok(());
    }
    let Some(admission) = pending.limits.admit(Caller::Tenant(tenant), pending.class, SystemClock.now_ms()).await
    else {
        return Ok(());
    };
    pending.record(admission)
}

/// The recipients budget of a send (`recipients` in `TIDINGS_API_RATES`): a notification to
/// 1,000 users costs 1,000 units, taken once its body is read (docs/gates.md, "API limits").
#[derive(Clone, Default)]
pub struct SendBudget(Option<Pending>);

impl<S: Send + Sync> FromRequestParts<S> for SendBudget {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(SendBudget(parts.extensions.get::<Pending>().cloned()))
    }
}

impl SendBudget {
    /// Takes `recipients` units of `tenant`'s budget, all or none: 429 when they are not there
    /// yet, 422 naming `recipients.user_ids` when they never can be (more than the bucket holds).
    pub async fn take(&self, tenant: &TenantId, recipients: usize) -> Result<(), ApiError> {
        let Some(pending) = &self.0 else { return Ok(()) };
        if recipients == 0 {
            return Ok(());
        }
        let units = u32::try_from(recipients).unwrap_or(u32::MAX);
        pending
            .take_units(tenant, RouteClass::Recipients, units, units, |burst| {
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "too_many_recipients",
                    format!(
                        "recipients.user_ids: {recipients} users, more than this tenant's recipients budget holds at \
                         once ({burst}): send them in requests of at most {burst} users, or to a segment"
                    ),
                )
                .with_field("recipients.user_ids")
            })
            .await
    }
}

/// The `write` units of a request that makes many changes at once, beyond the one unit its
/// class took when the key was checked: `POST /v1/users/batch` costs one unit per
/// [`USERS_PER_WRITE_UNIT`] users (docs/gates.md, "API limits").
#[derive(Clone, Default)]
pub struct WriteUnits(Option<Pending>);

/// Users of a batch that one `write` unit pays for: a batch of 1,000 costs 10, where 1,000
/// `PUT`s cost 1,000 (one transaction holds several users; a user already so costs no write).
pub const USERS_PER_WRITE_UNIT: usize = 100;

impl<S: Send + Sync> FromRequestParts<S> for WriteUnits {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(WriteUnits(parts.extensions.get::<Pending>().cloned()))
    }
}

impl WriteUnits {
    /// Takes what `users` users cost in all (the request's first unit is paid already), all or
    /// none: 429 when they are not there yet, 422 naming `users` when they never can be.
    pub async fn take_for_users(&self, tenant: &TenantId, users: usize) -> Result<(), ApiError> {
        let Some(pending) = &self.0 else { return Ok(()) };
        let units = u32::try_from(users.div_ceil(USERS_PER_WRITE_UNIT)).unwrap_or(u32::MAX);
        if units <= 1 || pending.class != RouteClass::Write {
            return Ok(());
        }
        // The request's first unit was taken when its key was checked.
        pending
            .take_units(tenant, RouteClass::Write, units, units - 1, |burst| {
                let most = burst as usize * USERS_PER_WRITE_UNIT;
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "too_many_users",
                    format!(
                        "users: {users} users cost {units} write units ({USERS_PER_WRITE_UNIT} users a unit), more than \
                         this tenant's write budget holds at once ({burst}): send at most {most} users a request"
                    ),
                )
                .with_field("users")
            })
            .await
    }
}

fn seconds_up(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000) as u64
}

fn refusal(a: &Admission) -> Problem {
    let wait = seconds_up(a.refused.unwrap_or_default()).max(1);
    let who = if a.class.by_address() { "this address" } else { "this tenant" };
    let detail = match a.class {
        RouteClass::Auth => format!(
            "too many requests with a missing or wrong API key from this address; its key is not checked \
             for {wait} s: fix the key (Authorization: Bearer <key>) and try again in {wait} s"
        ),
        RouteClass::Recipients => format!(
            "more than {} recipients a second from this tenant (its recipients budget); try again in {wait} s \
             or send to a segment (see RateLimit-Policy)",
            a.quota
        ),
        class => format!(
            "more than {} {} {} a second from {who}; try again in {wait} s (see RateLimit-Policy)",
            a.quota,
            class.as_str(),
            class.unit()
        ),
    };
    let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", detail);
    p.retry_after_s = Some(wait);
    p
}

/// `RateLimit-Policy: "send";q=50;w=1` and `RateLimit: "send";r=12;t=1`, one list member per
/// bucket the request took from (and `Retry-After` on a refusal, which the problem document
/// already carries).
fn with_fields(mut res: Response, admissions: &[Admission]) -> Response {
    if admissions.is_empty() {
        return res;
    }
    let mut policies = Vec::new();
    let mut limits = Vec::new();
    for a in admissions {
        let name = a.class.as_str();
        let reset = if a.refused.is_some() { seconds_up(a.reset).max(1) } else { seconds_up(a.reset) };
        policies.push(format!("\"{name}\";q={};w=1", a.quota));
        limits.push(format!("\"{name}\";r={};t={reset}", a.remaining));
    }
    let headers = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&policies.join(", ")) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&limits.join(", ")) {
        headers.insert(RATELIMIT.clone(), v);
    }
    if let Some(wait) = admissions.iter().filter_map(|a| a.refused).max()
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
        // Orders write their expiry timers to this queue.
        let store = tidings_embedded::EmbeddedStore::in_memory().unwrap();
        store.declare_queue(tidings_embedded::QueueConfig::new(tidings_core::timers::TIMERS_QUEUE, 5)).unwrap();
        let deps = crate::test_support::deps_over(store);
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        tenants::register_key(&deps, &TenantId::parse("b").unwrap(), "key-b").await.unwrap();
        let limits = Arc::new(ApiLimits::new(ApiRates::parse(rates).unwrap(), GateStore::Local));
        let state = AppState::of(deps);
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

    async fn call(
        app: &axum::Router,
        key: &str,
        method: Method,
        uri: &str,
        body: serde_json::Value,
        ip: &str,
    ) -> Response {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(HttpBody::from(body.to_string()))
            .unwrap();
        req.extensions_mut().insert(ClientIp(ip.parse().unwrap()));
        app.clone().oneshot(req).await.unwrap()
    }

    async fn problem(res: Response) -> serde_json::Value {
        let body = res.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    /// A flash sale at the default rates: 1,000 orders at once and their 1,000 payments are all
    /// answered by the orders (none 429), where the budget of ordinary changes (100 a second)
    /// refused most of them.
    #[tokio::test]
    async fn a_flash_sale_passes_the_default_rates() {
        let app = app("").await;
        let ip = "198.51.100.7";
        let res =
            call(&app, "key-a", Method::PUT, "/v1/inventory/sku-1", serde_json::json!({"on_hand": 100_000}), ip).await;
        assert_eq!(res.status(), StatusCode::CREATED);
        for path in ["/v1/orders", "/v1/orders/{id}/pay"] {
            let mut refused = 0;
            for i in 0..1000 {
                let (uri, body) = if path == "/v1/orders" {
                    let order = serde_json::json!({"order_id": format!("o{i}"), "user_id": "u1", "items": [{"sku_id": "sku-1", "qty": 1}]});
                    ("/v1/orders".to_owned(), order)
                } else {
                    (format!("/v1/orders/o{i}/pay"), serde_json::Value::Null)
                };
                let res = call(&app, "key-a", Method::POST, &uri, body, ip).await;
                match res.status() {
                    StatusCode::TOO_MANY_REQUESTS => refused += 1,
                    s => assert!(s.is_success(), "{uri}: {s} {}", problem(res).await),
                }
            }
            assert_eq!(refused, 0, "{path}: {refused} of 1,000 refused");
        }
        let res = call(&app, "key-a", Method::GET, "/v1/orders/o1", serde_json::Value::Null, ip).await;
        assert_eq!(res.headers()["ratelimit-policy"], "\"orders\";q=1500;w=1");
    }

    /// The recipients budget counts users, not requests: with 10 a second, a notification to 8
    /// users passes, one to 5 more is refused (429, `Retry-After`, both buckets in the fields)
    /// though the send class has room, one to 11 can never pass (422 naming the field), and a
    /// segment costs no recipients.
    #[tokio::test]
    async fn recipients_are_counted_per_user() {
        let app = app("recipients:10").await;
        let ip = "198.51.100.8";
        let template =
            serde_json::json!({"default_locale": "en", "locales": {"en": {"email_subject": "S", "email_body": "B"}}});
        assert_eq!(call(&app, "key-a", Method::PUT, "/v1/templates/t", template, ip).await.status(), StatusCode::OK);
        let send = |users: Vec<String>| {
            serde_json::json!({"recipients": {"user_ids": users}, "template_id": "t",
                "category": "transactional", "channels": ["email"]})
        };
        let users = |n: usize, from: usize| (from..from + n).map(|i| format!("u{i}")).collect::<Vec<_>>();
        let res = call(&app, "key-a", Method::POST, "/v1/notifications", send(users(8, 0)), ip).await;
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        assert_eq!(res.headers()["ratelimit-policy"], "\"send\";q=50;w=1, \"recipients\";q=10;w=1");
        let res = call(&app, "key-a", Method::POST, "/v1/notifications", send(users(5, 8)), ip).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[header::RETRY_AFTER], "1", "3 more units come within 0.3 s");
        assert!(res.headers()["ratelimit"].to_str().unwrap().contains("\"recipients\";r=0;"));
        let p = problem(res).await;
        assert_eq!(p["code"], "rate_limited");
        assert!(p["detail"].as_str().unwrap().contains("recipients"), "{p}");
        let res = call(&app, "key-a", Method::POST, "/v1/notifications", send(users(11, 20)), ip).await;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let p = problem(res).await;
        assert_eq!(
            (p["code"].as_str(), p["field"].as_str()),
            (Some("too_many_recipients"), Some("recipients.user_ids"))
        );
        let campaign = serde_json::json!({"recipients": {"segment": "vip"}, "template_id": "t", "category": "marketing", "channels": ["email"]});
        let res = call(&app, "key-a", Method::POST, "/v1/notifications", campaign, ip).await;
        assert_eq!(res.status(), StatusCode::ACCEPTED, "{}", problem(res).await);
    }

    /// A batch of users costs one `write` unit per 100 users (all or none), told as one member
    /// of the fields; a batch larger than the bucket can ever hold is 422 naming `users`.
    #[tokio::test]
    async fn a_users_batch_costs_a_write_unit_per_hundred_users() {
        let app = app("write:1:20").await;
        let ip = "198.51.100.9";
        let batch = |n: usize, from: usize| {
            let users: Vec<_> = (from..from + n).map(|i| serde_json::json!({"user_id": format!("u{i}")})).collect();
            serde_json::json!({ "users": users })
        };
        let res = call(&app, "key-a", Method::POST, "/v1/users/batch", batch(1000, 0), ip).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit-policy"], "\"write\";q=1;w=1", "one member for the write bucket");
        let remaining = res.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(remaining.starts_with("\"write\";r=10;") || remaining.starts_with("\"write\";r=11;"), "{remaining}");
        let res = call(&app, "key-a", Method::POST, "/v1/users/batch", batch(950, 1000), ip).await;
        assert_eq!(res.status(), StatusCode::OK, "10 more units");
        let res = call(&app, "key-a", Method::POST, "/v1/users/batch", batch(1000, 2000), ip).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(res.headers().contains_key(header::RETRY_AFTER));
        let p = problem(res).await;
        assert!(p["detail"].as_str().unwrap().contains("write"), "{p}");
        // Another tenant's bucket is its own.
        let res = call(&app, "key-b", Method::POST, "/v1/users/batch", batch(1000, 0), ip).await;
        assert_eq!(res.status(), StatusCode::OK);

        let app = self::app("write:5").await;
        let res = call(&app, "key-a", Method::POST, "/v1/users/batch", batch(501, 0), ip).await;
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let p = problem(res).await;
        assert_eq!((p["code"].as_str(), p["field"].as_str()), (Some("too_many_users"), Some("users")));
        assert!(p["detail"].as_str().unwrap().contains("at most 500 users a request"), "{p}");
        // (That request paid its first unit, as every request does: a fresh bucket for this one.)
        let app = self::app("write:5").await;
        let res = call(&app, "key-a", Method::POST, "/v1/users/batch", batch(500, 0), ip).await;
        assert_eq!(res.status(), StatusCode::OK);
    }

    /// Wrong keys from one address are answered 401 until its failed authentications run out,
    /// then 429 with `Retry-After` and a problem before any key is checked (a right one too);
    /// another address still gets 401 for a wrong key, and its right key works.
    #[tokio::test]
    async fn wrong_keys_from_one_address_are_refused_before_the_key_is_checked() {
        let app = app("auth:1:5").await;
        let (flooder, other) = ("203.0.113.66", "203.0.113.67");
        let mut statuses = Vec::new();
        for i in 0..50 {
            let res = get(&app, Some(&format!("guess-{i}")), "/v1/users/u1", flooder).await;
            statuses.push(res.status().as_u16());
        }
        // The bucket's 5, and a sixth if the fifty took a second.
        let unauthorized = statuses.iter().filter(|s| **s == 401).count();
        assert!((5..=6).contains(&unauthorized), "{statuses:?}");
        assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 50 - unauthorized, "{statuses:?}");
        let res = get(&app, Some("key-a"), "/v1/users/u1", flooder).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "refused before the key is looked at");
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
        assert_eq!(res.headers()[header::CONTENT_TYPE], "application/problem+json");
        let p = problem(res).await;
        assert_eq!(p["code"], "rate_limited");
        assert!(p["detail"].as_str().unwrap().contains("API key"), "{p}");
        let res = get(&app, None, "/v1/ops/queues", flooder).await;
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "operator routes too");

        // The other address as `tidings serve` gives it: the socket's peer.
        let from_peer = |key: &str| {
            let mut req = Request::builder()
                .uri("/v1/users/u1")
                .header("authorization", format!("Bearer {key}"))
                .body(HttpBody::empty())
                .unwrap();
            req.extensions_mut().insert(ConnectInfo(SocketAddr::new(other.parse().unwrap(), 40_000)));
            app.clone().oneshot(req)
        };
        let res = from_peer("guess-x").await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "another address is not refused");
        let res = from_peer("key-a").await.unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "a right key works");
        // The public routes take no key: the flooder's tracking requests are not refused for it.
        let res = get(&app, None, "/t/o/not-a-token", flooder).await;
        assert_ne!(res.status(), StatusCode::TOO_MANY_REQUESTS);
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
        assert_eq!(c(Method::POST, "/v1/orders"), Some(RouteClass::Orders));
        assert_eq!(c(Method::POST, "/v1/orders/{order_id}/pay"), Some(RouteClass::Orders));
        assert_eq!(c(Method::POST, "/v1/orders/{order_id}/cancel"), Some(RouteClass::Orders));
        assert_eq!(c(Method::GET, "/v1/orders/{order_id}"), Some(RouteClass::Orders));
        assert_eq!(c(Method::PUT, "/v1/inventory/{sku_id}"), Some(RouteClass::Write));
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
        let res = with_fields(refusal(&a).into_response(), &[a]);
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["ratelimit-policy"], "\"send\";q=50;w=1");
        assert_eq!(res.headers()["ratelimit"], "\"send\";r=0;t=2");
        assert_eq!(res.headers()[header::RETRY_AFTER], "1");
        assert_eq!(res.headers()[header::CONTENT_TYPE], "application/problem+json");
    }
}
