//! API Gateway in front of the functions: the HTTP API (payload format 2.0), whose routes
//! (`template.yaml`'s `HttpApi` events) send each request to the `api`, `commerce-api`,
//! `messages-api` or `public-api` function as API Gateway picks among them, and the WebSocket
//! API of the inbox's live feed (`$connect`, `$disconnect`, `$default`) for `ws-connections`,
//! with its `@connections` management endpoint.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::runtime::Function;
use super::template::ACCOUNT;

/// Lambda's synchronous invocation payload limit.
const MAX_PAYLOAD: usize = 6 * 1024 * 1024;

#[derive(Clone)]
pub struct HttpApi {
    pub routes: Arc<Vec<Route<Arc<Function>>>>,
    pub api_id: String,
}

/// One segment of a route's path.
#[derive(Clone, Debug, PartialEq)]
enum Segment {
    Literal(String),
    /// `{name}`: one segment.
    Variable(String),
    /// `{name+}`: the rest of the path, at least one segment.
    Greedy(String),
}

/// How specifically a route matches a request: no greedy variable, its literal segments, a
/// method rather than `ANY`; the greater wins.
type Specificity = (bool, usize, bool);

/// A route of the HTTP API (`ANY /t/{proxy+}`) and what it invokes (the function; its binary's
/// name where no function runs).
#[derive(Clone)]
pub struct Route<F> {
    /// `ANY` or a method, as the template writes it.
    method: String,
    path: String,
    segments: Vec<Segment>,
    pub function: F,
}

impl<F> Route<F> {
    pub fn new(method: &str, path: &str, function: F) -> Self {
        let segments = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => match name.strip_suffix('+') {
                    Some(name) => Segment::Greedy(name.to_owned()),
                    None => Segment::Variable(name.to_owned()),
                },
                None => Segment::Literal(s.to_owned()),
            })
            .collect();
        Route { method: method.to_uppercase(), path: path.to_owned(), segments, function }
    }

    /// `ANY /t/{proxy+}`: the event's `routeKey`.
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// How specifically this route matches `method` and `path`, and the path's parameters; `None`
    /// when it does not. API Gateway takes the most specific: a route without a greedy variable
    /// over one with, more literal segments over fewer, a method over `ANY`.
    fn matching(&self, method: &Method, path: &str) -> Option<(Specificity, BTreeMap<String, String>)> {
        let specific = self.method != "ANY";
        if specific && self.method != method.as_str() {
            return None;
        }
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut params = BTreeMap::new();
        let (mut literals, mut greedy) = (0, false);
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Literal(l) => {
                    if parts.get(i) != Some(&l.as_str()) {
                        return None;
                    }
                    literals += 1;
                }
                Segment::Variable(name) => {
                    params.insert(name.clone(), (*parts.get(i)?).to_owned());
                }
                Segment::Greedy(name) => {
                    if parts.len() <= i {
                        return None;
                    }
                    params.insert(name.clone(), parts[i..].join("/"));
                    greedy = true;
                    break;
                }
            }
        }
        if !greedy && parts.len() != self.segments.len() {
            return None;
        }
        Some(((!greedy, literals, specific), params))
    }
}

/// `template.yaml`'s HTTP API routes, each to the binary of its function.
pub fn template_routes() -> anyhow::Result<Vec<Route<String>>> {
    use super::template::{self, Source};
    let spec = template::stack_for_tests()?;
    Ok(spec
        .functions
        .iter()
        .flat_map(|f| {
            f.sources.values().filter_map(|s| match s {
                Source::HttpApi { method, path } => Some(Route::new(method, path, f.binary.clone())),
                _ => None,
            })
        })
        .collect())
}

/// The binary of the function API Gateway sends `method` `path` to, as `template.yaml` routes it.
pub fn function_serving(method: &str, path: &str) -> anyhow::Result<String> {
    let method = Method::from_bytes(method.as_bytes())?;
    let routes = template_routes()?;
    let (route, _) = route_of(&routes, &method, path)
        .ok_or_else(|| anyhow::anyhow!("no route of template.yaml has {method} {path}"))?;
    Ok(route.function.clone())
}

/// The route API Gateway sends `method` `path` to, with the path's parameters; `None` when no
/// route matches (API Gateway answers 404 itself).
pub fn route_of<'r, F>(
    routes: &'r [Route<F>],
    method: &Method,
    path: &str,
) -> Option<(&'r Route<F>, BTreeMap<String, String>)> {
    routes
        .iter()
        .filter_map(|r| r.matching(method, path).map(|(rank, params)| (rank, r, params)))
        .max_by_key(|(rank, _, _)| *rank)
        .map(|(_, r, params)| (r, params))
}

fn now() -> (String, i64) {
    let t = chrono::Utc::now();
    (t.format("%d/%b/%Y:%H:%M:%S +0000").to_string(), t.timestamp_millis())
}

/// The payload-2.0 event for a request.
pub fn http_event(
    api_id: &str,
    route: (&str, &BTreeMap<String, String>),
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Value {
    let (route_key, path_parameters) = route;
    let mut joined: BTreeMap<String, String> = BTreeMap::new();
    let mut cookies = Vec::new();
    for (k, v) in headers {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        if k == "cookie" {
            cookies.extend(v.split("; ").map(str::to_owned));
            continue;
        }
        joined.entry(k.as_str().to_owned()).and_modify(|e| *e = format!("{e},{v}")).or_insert(v);
    }
    joined.entry("x-forwarded-for".into()).or_insert_with(|| "127.0.0.1".into());
    joined.insert("x-forwarded-proto".into(), "https".into());
    let query = uri.query().unwrap_or_default().to_owned();
    let mut params: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        params.entry(k.into_owned()).and_modify(|e| *e = format!("{e},{v}")).or_insert(v.into_owned());
    }
    let (time, epoch) = now();
    let text = std::str::from_utf8(body).ok();
    let path = uri.path().to_owned();
    json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        "cookies": if cookies.is_empty() { Value::Null } else { json!(cookies) },
        "headers": joined,
        "queryStringParameters": if params.is_empty() { Value::Null } else { json!(params) },
        "pathParameters": if path_parameters.is_empty() { Value::Null } else { json!(path_parameters) },
        "requestContext": {
            "accountId": ACCOUNT, "apiId": api_id, "domainName": format!("{api_id}.execute-api.us-east-1.amazonaws.com"),
            "domainPrefix": api_id, "requestId": uuid::Uuid::new_v4().to_string(), "routeKey": route_key,
            "stage": "$default", "time": time, "timeEpoch": epoch,
            "http": {"method": method.as_str(), "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": headers.get("x-harness-source-ip").and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1"),
                     "userAgent": headers.get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or_default()},
        },
        "body": match text { Some(t) => json!(t), None => json!(base64::engine::general_purpose::STANDARD.encode(body)) },
        "isBase64Encoded": text.is_none(),
    })
}

/// API Gateway's answer for a function's response.
pub fn http_response(payload: &[u8]) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(payload) else {
        return (StatusCode::BAD_GATEWAY, "{\"message\":\"Internal Server Error\"}").into_response();
    };
    let status = v["statusCode"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::OK);
    let body = match (v["body"].as_str(), v["isBase64Encoded"].as_bool().unwrap_or(false)) {
        (Some(b), true) => base64::engine::general_purpose::STANDARD.decode(b).unwrap_or_default(),
        (Some(b), false) => b.as_bytes().to_vec(),
        (None, _) => Vec::new(),
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    // The function's own content type, not the one a byte body defaults to.
    headers.remove(axum::http::header::CONTENT_TYPE);
    for (k, val) in v["headers"].as_object().into_iter().flatten() {
        if let (Ok(name), Some(Ok(value))) = (k.parse::<axum::http::HeaderName>(), val.as_str().map(str::parse)) {
            headers.append(name, value);
        }
    }
    for (k, vals) in v["multiValueHeaders"].as_object().into_iter().flatten() {
        for val in vals.as_array().into_iter().flatten() {
            if let (Ok(name), Some(Ok(value))) = (k.parse::<axum::http::HeaderName>(), val.as_str().map(str::parse)) {
                headers.append(name, value);
            }
        }
    }
    for c in v["cookies"].as_array().into_iter().flatten() {
        if let Some(Ok(value)) = c.as_str().map(str::parse) {
            headers.append("set-cookie", value);
        }
    }
    response
}

async fn proxy(State(api): State<HttpApi>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    if body.len() > MAX_PAYLOAD {
        return (StatusCode::PAYLOAD_TOO_LARGE, "{\"message\":\"Request Entity Too Large\"}").into_response();
    }
    let Some((route, params)) = route_of(&api.routes, &method, uri.path()) else {
        return (StatusCode::NOT_FOUND, "{\"message\":\"Not Found\"}").into_response();
    };
    let event = http_event(&api.api_id, (&route.key(), &params), &method, &uri, &headers, &body);
    match route.function.invoke(Function::json(&event)).await {
        Ok(inv) => match inv.payload {
            Ok(payload) => http_response(&payload),
            Err(_) if inv.timed_out => {
                (StatusCode::SERVICE_UNAVAILABLE, "{\"message\":\"Service Unavailable\"}").into_response()
            }
            Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "{\"message\":\"Internal Server Error\"}").into_response(),
        },
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "{\"message\":\"Internal Server Error\"}").into_response(),
    }
}

pub fn http_router(api: HttpApi) -> Router {
    Router::new().fallback(any(proxy)).with_state(api)
}

/// The WebSocket API: connections by id, each with a channel to its socket.
#[derive(Clone)]
pub struct WebSocketApi {
    pub function: Arc<Function>,
    pub api_id: String,
    pub stage: String,
    pub connections: Arc<Mutex<BTreeMap<String, mpsc::UnboundedSender<Message>>>>,
}

fn ws_event(
    api: &WebSocketApi,
    route: &str,
    kind: &str,
    connection: &str,
    query: Option<&BTreeMap<String, String>>,
    body: Option<String>,
) -> Value {
    let (_, epoch) = now();
    json!({
        "requestContext": {
            "routeKey": route, "eventType": kind, "connectionId": connection, "stage": api.stage,
            "apiId": api.api_id, "domainName": format!("{}.execute-api.us-east-1.amazonaws.com", api.api_id),
            "requestId": uuid::Uuid::new_v4().to_string(), "connectedAt": epoch, "requestTimeEpoch": epoch,
            "messageDirection": "IN", "extendedRequestId": uuid::Uuid::new_v4().to_string(),
        },
        "queryStringParameters": query,
        "headers": {"Host": format!("{}.execute-api.us-east-1.amazonaws.com", api.api_id)},
        "isBase64Encoded": false,
        "body": body,
    })
}

async fn route_status(api: &WebSocketApi, event: Value) -> u16 {
    match api.function.invoke(Function::json(&event)).await {
        Ok(inv) => match inv.payload {
            Ok(p) => {
                serde_json::from_slice::<Value>(&p).ok().and_then(|v| v["statusCode"].as_u64()).unwrap_or(200) as u16
            }
            Err(_) => 500,
        },
        Err(_) => 500,
    }
}

async fn connect(
    State(api): State<WebSocketApi>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    let connection = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
    let mut event = ws_event(&api, "$connect", "CONNECT", &connection, Some(&query), None);
    // API Gateway gives `$connect` the handshake's headers; the browser's `Origin` among them.
    if let Some(origin) = headers.get("origin").and_then(|v| v.to_str().ok()) {
        event["headers"]["Origin"] = json!(origin);
    }
    let status = route_status(&api, event).await;
    if !(200..300).contains(&status) {
        return StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN).into_response();
    }
    upgrade.on_upgrade(move |socket| serve_socket(api, connection, socket))
}

async fn serve_socket(api: WebSocketApi, connection: String, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    api.connections.lock().unwrap_or_else(|e| e.into_inner()).insert(connection.clone(), tx);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
    });
    while let Some(Ok(m)) = stream.next().await {
        match m {
            Message::Text(text) => {
                let event = ws_event(&api, "$default", "MESSAGE", &connection, None, Some(text.to_string()));
                let _ = route_status(&api, event).await;
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    api.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&connection);
    writer.abort();
    let _ = route_status(&api, ws_event(&api, "$disconnect", "DISCONNECT", &connection, None, None)).await;
}

/// `@connections/{id}`: POST sends, DELETE closes, GET describes; 410 for a connection gone.
async fn manage(
    State(api): State<WebSocketApi>,
    method: Method,
    Path((_stage, id)): Path<(String, String)>,
    body: Bytes,
) -> StatusCode {
    let tx = api.connections.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
    let Some(tx) = tx else { return StatusCode::GONE };
    match method {
        Method::POST => {
            let m = match String::from_utf8(body.to_vec()) {
                Ok(text) => Message::Text(text.into()),
                Err(e) => Message::Binary(e.into_bytes().into()),
            };
            if tx.send(m).is_err() { StatusCode::GONE } else { StatusCode::OK }
        }
        Method::DELETE => {
            let _ = tx.send(Message::Close(None));
            StatusCode::NO_CONTENT
        }
        _ => StatusCode::OK,
    }
}

pub fn ws_router(api: WebSocketApi) -> Router {
    let stage = format!("/{}", api.stage);
    Router::new().route(&stage, get(connect)).route("/{stage}/@connections/{id}", any(manage)).with_state(api)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use axum::body::Body;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::{Route, route_of, template_routes};

    fn picked(routes: &[Route<&'static str>], method: Method, path: &str) -> Option<(String, Value)> {
        route_of(routes, &method, path)
            .map(|(r, params)| (format!("{} {}", r.function, r.key()), serde_json::json!(params)))
    }

    /// The harness picks a route as API Gateway's HTTP API does: a literal segment over a
    /// variable, a variable over a greedy tail, a method over `ANY`; a greedy tail takes one
    /// segment at least, so `/t` is not `/t/{proxy+}`'s.
    #[test]
    fn the_gateway_picks_the_most_specific_route() {
        let routes = [
            Route::new("ANY", "/{proxy+}", "api"),
            Route::new("ANY", "/", "api"),
            Route::new("ANY", "/t/{proxy+}", "public"),
            Route::new("ANY", "/v1/me/{proxy+}", "public"),
            Route::new("GET", "/v1/x/{id}", "get-x"),
            Route::new("ANY", "/v1/x/{id}", "any-x"),
        ];
        let p = |m, path| picked(&routes, m, path).map(|(r, _)| r);
        assert_eq!(p(Method::GET, "/t/o/abc").as_deref(), Some("public ANY /t/{proxy+}"));
        assert_eq!(picked(&routes, Method::GET, "/t/o/abc").unwrap().1, serde_json::json!({"proxy": "o/abc"}));
        assert_eq!(p(Method::GET, "/t").as_deref(), Some("api ANY /{proxy+}"));
        assert_eq!(p(Method::GET, "/").as_deref(), Some("api ANY /"));
        assert_eq!(p(Method::POST, "/v1/me/inbox/read-all").as_deref(), Some("public ANY /v1/me/{proxy+}"));
        assert_eq!(p(Method::GET, "/v1/meter").as_deref(), Some("api ANY /{proxy+}"));
        assert_eq!(p(Method::GET, "/v1/x/7").as_deref(), Some("get-x GET /v1/x/{id}"));
        assert_eq!(picked(&routes, Method::GET, "/v1/x/7").unwrap().1, serde_json::json!({"id": "7"}));
        assert_eq!(p(Method::PUT, "/v1/x/7").as_deref(), Some("any-x ANY /v1/x/{id}"));
        assert_eq!(p(Method::PUT, "/v1/x/7/y").as_deref(), Some("api ANY /{proxy+}"));
        assert_eq!(picked(&routes[2..], Method::GET, "/v1/users"), None);
    }

    /// Every path and method of the committed reference, sent through `template.yaml`'s routes,
    /// reaches a function whose router has that route: the `api` function's
    /// (`tidings_api::deployed_app`), the `commerce-api`'s (`commerce_app`), the
    /// `messages-api`'s (`messages_app`) or the `public-api`'s (`public_app`). A route
    /// added to one router but routed by the template to another fails here, as it would fail
    /// deployed (a 404 `no_route`, or a 405).
    #[tokio::test]
    async fn every_path_of_the_reference_reaches_a_function_that_serves_it() {
        let routes = template_routes().unwrap();
        let binaries: std::collections::BTreeSet<&str> = routes.iter().map(|r| r.function.as_str()).collect();
        assert_eq!(
            binaries,
            ["api", "commerce-api", "messages-api", "public-api"].into(),
            "the functions behind the HTTP API"
        );

        let store = tidings_embedded::EmbeddedStore::in_memory().unwrap();
        let deps = tidings_embedded::test_world::TestWorld::builder().system_clock().store(store).build().deps;
        let state = tidings_api::AppState::of(deps);
        let limits = || std::sync::Arc::new(tidings_core::gates::api::ApiLimits::off());
        let apps: BTreeMap<&str, axum::Router> = [
            ("api", tidings_api::deployed_app(state.clone(), limits())),
            ("commerce-api", tidings_api::commerce_app(state.clone(), limits())),
            ("messages-api", tidings_api::messages_app(state.clone(), limits())),
            ("public-api", tidings_api::public_app(state, limits())),
        ]
        .into();

        let reference: Value = serde_json::from_str(include_str!("../../../openapi.json")).unwrap();
        let mut checked = BTreeMap::<String, usize>::new();
        for (path, operations) in reference["paths"].as_object().unwrap() {
            if path.starts_with("/dev/") || path == "/v1/ws" {
                // `tidings serve --dev` only; the live feed, which on AWS is the WebSocket API's
                // (the api answers it `no_route`, naming that)
                continue;
            }
            let concrete: String =
                path.split('/').map(|s| if s.starts_with('{') { "x1" } else { s }).collect::<Vec<_>>().join("/");
            for method in operations.as_object().unwrap().keys() {
                let method: Method = method.to_uppercase().parse().unwrap();
                let (route, _) = route_of(&routes, &method, &concrete)
                    .unwrap_or_else(|| panic!("{method} {path}: no route of template.yaml takes it"));
                let app = &apps[route.function.as_str()];
                let req = Request::builder().method(method.clone()).uri(&concrete).body(Body::empty()).unwrap();
                let res = app.clone().oneshot(req).await.unwrap();
                let status = res.status().as_u16();
                let body = res.into_body().collect().await.unwrap().to_bytes();
                let problem: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                assert!(
                    status != 405 && problem["code"] != "no_route",
                    "{method} {path}: routed to {} ({}), whose router does not have it: {status} {problem}",
                    route.function,
                    route.key(),
                );
                *checked.entry(route.function.clone()).or_default() += 1;
            }
        }
        // Each function serves some of the reference; tracking, unsubscribe and `/v1/me` are the
        // public one's, the providers' callbacks the api's, a user's stock subscriptions the
        // commerce function's, a notification's runs the messages function's.
        assert!(checked.get("api").copied().unwrap_or(0) > 30, "{checked:?}");
        assert!(checked.get("commerce-api").copied().unwrap_or(0) >= 15, "{checked:?}");
        assert!(checked.get("messages-api").copied().unwrap_or(0) >= 10, "{checked:?}");
        assert!(checked.get("public-api").copied().unwrap_or(0) >= 10, "{checked:?}");
        for (method, path, function) in [
            (Method::GET, "/t/o/x1", "public-api"),
            (Method::POST, "/u/x1", "public-api"),
            (Method::GET, "/v1/me/inbox", "public-api"),
            (Method::GET, "/v1/users", "api"),
            (Method::POST, "/v1/callbacks/ses", "api"),
            (Method::GET, "/", "api"),
            (Method::GET, "/v1/users/x1/inbox", "api"),
            (Method::GET, "/v1/users/x1/stock-subscriptions", "commerce-api"),
            (Method::POST, "/v1/orders", "commerce-api"),
            (Method::POST, "/v1/ops/reconcile", "commerce-api"),
            (Method::GET, "/v1/ops/queues", "api"),
            (Method::GET, "/v1/notifications/x1/runs", "messages-api"),
            (Method::POST, "/v1/notifications", "messages-api"),
            (Method::GET, "/v1/notifications/x1", "messages-api"),
            (Method::POST, "/v1/templates", "messages-api"),
        ] {
            assert_eq!(route_of(&routes, &method, path).unwrap().0.function, function, "{method} {path}");
        }
    }
}
