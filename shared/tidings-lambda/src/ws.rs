//! The inbox's WebSocket routes on API Gateway (`$connect`, `$disconnect`, `$default`).

use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
use serde::Deserialize;
use tidings_core::Deps;
use tidings_core::inbox::live::{self, LiveEvent, LivePush};
use tracing::warn;

#[derive(Deserialize)]
#[serde(tag = "type")]
enum ClientMessage {
    #[serde(rename = "since")]
    Since { message_id: String },
}

/// Handles one WebSocket event; returns the HTTP status for API Gateway (a non-2xx answer to
/// `$connect` refuses the connection).
pub async fn handle(deps: &Deps, live: &dyn LivePush, event: &ApiGatewayWebsocketProxyRequest) -> u16 {
    let ctx = &event.request_context;
    let Some(connection_id) = ctx.connection_id.as_deref() else { return 400 };
    match ctx.route_key.as_deref() {
        Some("$connect") => {
            let token = event.query_string_parameters.first("token").unwrap_or_default();
            let Ok((tenant, user)) = live::verify_feed_token(deps, token) else { return 401 };
            let origin = event.headers.get("origin").and_then(|v| v.to_str().ok());
            match tidings_core::site::feed_origin_admitted(deps, &tenant, origin).await {
                Ok(true) => {}
                Ok(false) => return 403,
                Err(e) => {
                    warn!(error = %e, "could not read the allowed origins");
                    return 500;
                }
            }
            match live::remember_connection(deps, &tenant, &user, connection_id).await {
                Ok(()) => 200,
                Err(e) => {
                    warn!(error = %e, "could not store the connection");
                    500
                }
            }
        }
        Some("$disconnect") => match live::forget_connection(deps, connection_id).await {
            Ok(()) => 200,
            Err(e) => {
                warn!(error = %e, "could not forget the connection; its TTL will");
                200
            }
        },
        _ => {
            let Some(Ok(ClientMessage::Since { message_id })) = event.body.as_deref().map(serde_json::from_str) else {
                return 400;
            };
            let Ok(Some((tenant, user))) = live::connection_owner(deps, connection_id).await else { return 410 };
            let Ok(missed) = live::missed_since(deps, &tenant, &user, &message_id).await else { return 400 };
            let unread_count = tidings_core::inbox::unread_count(deps, &tenant, &user).await.unwrap_or(0);
            for message in missed {
                // Replayed to every connection of the user: simpler than a per-connection post,
                // and harmless (clients dedupe by message_id).
                let _ = live.publish(&tenant, &user, &LiveEvent::InboxMessage { message, unread_count }).await;
            }
            200
        }
    }
}
