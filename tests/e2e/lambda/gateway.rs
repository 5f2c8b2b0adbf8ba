//! API Gateway in front of the functions: the HTTP API (payload format 2.0) for the `api`
//! function, and the WebSocket API of the inbox's live feed (`$connect`, `$disconnect`,
//! `$default`) for `ws-connections`, with its `@connections` management endpoint.

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
    pub function: Arc<Function>,
    pub api_id: String,
}

fn now() -> (String, i64) {
    let t = chrono::Utc::now();
    (t.format("%d/%b/%Y:%H:%M:%S +0000").to_string(), t.timestamp_millis())
}

/// The payload-2.0 event for a request.
pub fn http_event(api_id: &str, method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Value {
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
        "routeKey": if path == "/" { "ANY /" } else { "ANY /{proxy+}" },
        "rawPath": path,
        "rawQueryString": query,
        "cookies": if cookies.is_empty() { Value::Null } else { json!(cookies) },
        "headers": joined,
        "queryStringParameters": if params.is_empty() { Value::Null } else { json!(params) },
        "pathParameters": if path == "/" { Value::Null } else { json!({"proxy": path.trim_start_matches('/')}) },
        "requestContext": {
            "accountId": ACCOUNT, "apiId": api_id, "domainName": format!("{api_id}.execute-api.us-east-1.amazonaws.com"),
            "domainPrefix": api_id, "requestId": uuid::Uuid::new_v4().to_string(), "routeKey": if path == "/" { "ANY /" } else { "ANY /{proxy+}" },
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
    let event = http_event(&api.api_id, &method, &uri, &headers, &body);
    match api.function.invoke(Function::json(&event)).await {
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
