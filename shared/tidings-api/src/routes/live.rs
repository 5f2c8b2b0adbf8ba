//! `GET /v1/ws?token=...[&since=message_id]`: the inbox's live feed under `tidings serve` (on AWS
//! the same protocol is an API Gateway WebSocket API, handled by the `ws-connections` function).
//! The token comes from `POST /v1/users/{id}/inbox/token`, so no API key reaches a browser.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tidings_core::TenantId;
use tidings_core::inbox::live::{self, FeedToken, LiveEvent, LivePush};
use tokio::sync::mpsc;
use tracing::debug;

use crate::extract::{PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

type Connections = HashMap<(String, String), Vec<(u64, mpsc::UnboundedSender<String>)>>;

/// The live connections of this process.
#[derive(Default)]
pub struct LocalHub {
    connections: Mutex<Connections>,
    next_id: AtomicU64,
}

impl LocalHub {
    fn register(&self, t: &TenantId, user: &str) -> (u64, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        conns.entry((t.as_str().to_owned(), user.to_owned())).or_default().push((id, tx));
        (id, rx)
    }

    fn unregister(&self, t: &TenantId, user: &str, id: u64) {
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let key = (t.as_str().to_owned(), user.to_owned());
        if let Some(list) = conns.get_mut(&key) {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                conns.remove(&key);
            }
        }
    }

    /// How many connections a user has (for tests and the console).
    pub fn connection_count(&self, t: &TenantId, user: &str) -> usize {
        let conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        conns.get(&(t.as_str().to_owned(), user.to_owned())).map_or(0, Vec::len)
    }
}

#[async_trait]
impl LivePush for LocalHub {
    async fn publish(&self, t: &TenantId, user: &str, event: &LiveEvent) -> Result<usize, String> {
        let text = serde_json::to_string(event).map_err(|e| e.to_string())?;
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let Some(list) = conns.get_mut(&(t.as_str().to_owned(), user.to_owned())) else { return Ok(0) };
        // A closed connection is removed at the first failed send (the local 410).
        list.retain(|(_, tx)| tx.send(text.clone()).is_ok());
        Ok(list.len())
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(token, connect))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/ws", get(connect)).route("/v1/users/{user_id}/inbox/token", post(token))
}

/// A short-lived signed token for the user's own app to open the live feed (`/v1/ws`).
#[utoipa::path(post, path = "/v1/users/{user_id}/inbox/token", tag = "inbox", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The user id")),
    responses((status = 200, description = "The token and when it expires", body = FeedToken),
        (status = 409, description = "No signing key is configured", body = Problem, content_type = "application/problem+json")))]
async fn token(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<FeedToken>> {
    Ok(Json(live::feed_token(&s.deps, &t, &user_id)?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ConnectParams {
    /// A token from `POST /v1/users/{user_id}/inbox/token`.
    token: Option<String>,
    /// Replays the messages after this one first.
    since: Option<String>,
}

/// A client message: `{"type": "since", "message_id": "..."}` asks for what was missed.
#[derive(Deserialize)]
#[serde(tag = "type")]
enum ClientMessage {
    #[serde(rename = "since")]
    Since { message_id: String },
}

/// The inbox's live feed (WebSocket): pushes `inbox.message` and `inbox.read` events.
#[utoipa::path(get, path = "/v1/ws", tag = "inbox", params(ConnectParams),
    responses((status = 101, description = "Switching to the WebSocket protocol"),
        (status = 401, description = "Missing, invalid or expired token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`origin_not_allowed`: a browser page of an origin the tenant's allowed origins do not list (a tenant without a list: any)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The live feed is not served by this deployment", body = Problem, content_type = "application/problem+json"),
        (status = 426, description = "Not a WebSocket upgrade request", body = Problem, content_type = "application/problem+json")))]
async fn connect(
    State(s): State<AppState>,
    QueryParams(p): QueryParams<ConnectParams>,
    headers: axum::http::HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let Some(hub) = s.live.clone() else {
        return Err(Problem::new(StatusCode::NOT_FOUND, "no_route", "live feed is not served here").into());
    };
    let token = p.token.unwrap_or_default();
    let (tenant, user) = live::verify_feed_token(&s.deps, &token)
        .map_err(|e| Problem::new(StatusCode::UNAUTHORIZED, "invalid_token", e.to_string()))?;
    let origin = headers.get(axum::http::header::ORIGIN).and_then(|v| v.to_str().ok());
    if !tidings_core::site::feed_origin_admitted(&s.deps, &tenant, origin).await? {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "this page's origin is not among the shop's allowed origins (PUT /v1/settings/allowed-origins)",
        )
        .with_field("Origin")
        .into());
    }
    // A plain GET gets a problem document, not axum's text rejection.
    let ws = ws.map_err(|e| Problem::new(StatusCode::UPGRADE_REQUIRED, "websocket_required", e.body_text()))?;
    // On AWS the connection's own work (the replay after `since`) is `ws-connections`'.
    Ok(ws.on_upgrade(move |socket| {
        tidings_core::roles::acting_as("ws-connections", session(s, hub, tenant, user, p.since, socket))
    }))
}

async fn send_missed(s: &AppState, t: &TenantId, user: &str, since: &str, socket: &mut WebSocket) -> bool {
    let Ok(missed) = live::missed_since(&s.deps, t, user, since).await else { return true };
    let unread_count = tidings_core::inbox::unread_count(&s.deps, t, user).await.unwrap_or(0);
    for message in missed {
        let event = LiveEvent::InboxMessage { message, unread_count };
        let Ok(text) = serde_json::to_string(&event) else { continue };
        if socket.send(Message::Text(text.into())).await.is_err() {
            return false;
        }
    }
    true
}

async fn session(
    s: AppState,
    hub: std::sync::Arc<LocalHub>,
    t: TenantId,
    user: String,
    since: Option<String>,
    mut socket: WebSocket,
) {
    let (id, mut rx) = hub.register(&t, &user);
    debug!(tenant = %t, "live connection opened");
    if let Some(since) = since
        && !send_missed(&s, &t, &user, &since, &mut socket).await
    {
        hub.unregister(&t, &user, id);
        return;
    }
    loop {
        tokio::select! {
            out = rx.recv() => {
                let Some(text) = out else { break };
                if socket.send(Message::Text(text.into())).await.is_err() {
                    break;
                }
            }
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(ClientMessage::Since { message_id }) = serde_json::from_str(&text)
                        && !send_missed(&s, &t, &user, &message_id, &mut socket).await
                    {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
    }
    hub.unregister(&t, &user, id);
    debug!(tenant = %t, "live connection closed");
}
