//! Live in-app delivery (docs/inbox.md): when the user is online, push over WebSocket; when not,
//! they pull it when they open the app. The inbox is the truth: an inbox write is committed
//! first, and its change-stream record is then pushed to the user's live connections. A failed
//! push never affects delivery to the inbox.
//!
//! On AWS the connections live in the table (one item per API Gateway WebSocket connection, with
//! a TTL) and a push is `PostToConnection`; locally `tidings serve` keeps them in memory.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::inbox::{self, InboxMessage};
use crate::keys;
use crate::ports::{ChangeRecord, Cond, Item, Key, QueryOpts};
use crate::signing::TokenError;
use serde_json::Value;

/// What a live connection receives (docs/inbox.md, "The live feed").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum LiveEvent {
    #[serde(rename = "inbox.message")]
    InboxMessage { message: LiveMessage, unread_count: i64 },
    #[serde(rename = "inbox.read")]
    InboxRead { message_id: String, unread_count: i64 },
    /// The user archived a message (`POST /v1/me/inbox/{id}/archive`): other tabs drop it.
    #[serde(rename = "inbox.archived")]
    InboxArchived { message_id: String, unread_count: i64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LiveMessage {
    pub message_id: String,
    pub title: String,
    pub body: String,
    pub created_at: String,
}

impl From<&InboxMessage> for LiveMessage {
    fn from(m: &InboxMessage) -> Self {
        Self {
            message_id: m.message_id.clone(),
            title: m.title.clone(),
            body: m.body.clone(),
            created_at: m.created_at.clone(),
        }
    }
}

/// Pushes events to a user's live connections.
#[async_trait]
pub trait LivePush: Send + Sync + 'static {
    /// Sends to every live connection of the user; returns how many received it. Connections
    /// found gone are removed.
    async fn publish(&self, tenant: &TenantId, user_id: &str, event: &LiveEvent) -> Result<usize, String>;
}

/// No live connections (Lambda functions other than the relay).
#[derive(Debug, Default)]
pub struct NoLive;

#[async_trait]
impl LivePush for NoLive {
    async fn publish(&self, _t: &TenantId, _u: &str, _e: &LiveEvent) -> Result<usize, String> {
        Ok(0)
    }
}

/// The inbox user of an inbox message key, if it is one.
fn inbox_owner(key: &Key) -> Option<(TenantId, String)> {
    let (tenant, rest) = keys::tenant_of(&key.pk)?;
    let user = rest.strip_prefix("INBOX#")?;
    key.sk.starts_with("M#").then(|| (tenant, user.to_owned()))
}

/// Turns committed inbox writes into live events and pushes them. Never fails: a push that
/// does not arrive is read from the inbox when the app opens.
pub async fn handle_changes(deps: &Deps, live: &dyn LivePush, records: &[ChangeRecord]) {
    for record in records {
        let Some((tenant, user)) = inbox_owner(&record.key) else { continue };
        let Some(new) = &record.new else { continue };
        let Ok(message) = Item::new(record.key.clone(), new.clone()).parse::<InboxMessage>() else { continue };
        let was_read = record.old.as_ref().and_then(|o| o.get("read")).and_then(Value::as_bool);
        let was_archived =
            record.old.as_ref().is_some_and(|o| o.get("archived").and_then(Value::as_bool) == Some(true));
        let unread_count = match inbox::unread_count(deps, &tenant, &user).await {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "unread count unavailable; live push skipped");
                continue;
            }
        };
        let event = match (record.old.is_none(), was_read, message.read) {
            (false, _, _) if message.archived && !was_archived => {
                LiveEvent::InboxArchived { message_id: message.message_id.clone(), unread_count }
            }
            (true, _, _) => LiveEvent::InboxMessage { message: LiveMessage::from(&message), unread_count },
            (false, Some(false), true) => LiveEvent::InboxRead { message_id: message.message_id.clone(), unread_count },
            _ => continue,
        };
        if let Err(e) = live.publish(&tenant, &user, &event).await {
            warn!(error = %e, "live push failed; the inbox still has the message");
        }
    }
}

/// The claims of an inbox live-feed token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeedClaims {
    pub t: String,
    pub u: String,
}

const FEED_PURPOSE: &str = "inbox-feed";
/// How long a feed token is valid: long enough to connect, short enough not to be worth stealing.
pub const FEED_TOKEN_TTL_S: i64 = 15 * 60;

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct FeedToken {
    pub token: String,
    pub expires_at: String,
}

/// `POST /v1/users/{id}/inbox/token`: a short-lived signed token for the user's own app, so no
/// API key ever reaches a browser.
pub fn feed_token(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<FeedToken> {
    check_id("user_id", user_id)?;
    let now = deps.clock.now();
    let expires = now + chrono::Duration::seconds(FEED_TOKEN_TTL_S);
    let claims = FeedClaims { t: t.as_str().to_owned(), u: user_id.to_owned() };
    let token = deps.config.signer.sign(FEED_PURPOSE, &claims, expires.timestamp()).map_err(|e| match e {
        TokenError::NoKey => CoreError::conflict("signing_unavailable", "no signing key is configured"),
        other => CoreError::conflict("signing_failed", other.to_string()),
    })?;
    Ok(FeedToken { token, expires_at: expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true) })
}

/// Checks a feed token: the tenant and user it opens.
pub fn verify_feed_token(deps: &Deps, token: &str) -> Result<(TenantId, String), TokenError> {
    let claims: FeedClaims = deps.config.signer.verify(FEED_PURPOSE, token, deps.clock.now().timestamp())?;
    let tenant = TenantId::parse(&claims.t).map_err(|_| TokenError::Malformed)?;
    Ok((tenant, claims.u))
}

/// The tenant and user of a feed token whose signature holds, expired or not: enough to know
/// whose CORS list answers a request that is then refused (never to act for the user).
pub fn feed_token_owner(deps: &Deps, token: &str) -> Option<(TenantId, String)> {
    let claims: FeedClaims = deps.config.signer.verify(FEED_PURPOSE, token, i64::MIN).ok()?;
    Some((TenantId::parse(&claims.t).ok()?, claims.u))
}

/// Inbox messages newer than `since` (a message id), oldest first, at most 100: what a
/// reconnecting client missed.
pub async fn missed_since(deps: &Deps, t: &TenantId, user_id: &str, since: &str) -> CoreResult<Vec<LiveMessage>> {
    check_id("since", since)?;
    let mut out = Vec::new();
    let mut cursor = None;
    'pages: loop {
        let page = deps
            .table
            .query(&keys::inbox_pk(t, user_id), "M#", QueryOpts { limit: 100, cursor, descending: true })
            .await?;
        for item in &page.items {
            let m: InboxMessage = item.parse()?;
            if m.message_id.as_str() <= since || out.len() >= 100 {
                break 'pages;
            }
            if m.archived {
                continue;
            }
            out.push(LiveMessage::from(&m));
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    out.reverse();
    Ok(out)
}

/// A WebSocket connection of a user (AWS: an API Gateway connection id), kept with a TTL.
pub fn connection_key(t: &TenantId, user_id: &str, connection_id: &str) -> Key {
    Key::new(format!("T#{t}#WS#{user_id}"), format!("C#{connection_id}"))
}

/// Where a connection id leads back to its user (for `$disconnect`, which only knows the id).
fn connection_index(connection_id: &str) -> Key {
    Key::new(format!("WSCONN#{connection_id}"), "CONN")
}

/// How long a stored connection lives without a reconnect (API Gateway closes idle ones at 10
/// minutes and any at 2 hours).
pub const CONNECTION_TTL_S: i64 = 2 * 3600;

pub async fn remember_connection(deps: &Deps, t: &TenantId, user_id: &str, connection_id: &str) -> CoreResult<()> {
    let ttl = deps.clock.now().timestamp() + CONNECTION_TTL_S;
    let attrs =
        serde_json::json!({"tenant": t.as_str(), "user_id": user_id, "connection_id": connection_id, "ttl": ttl});
    let attrs = crate::ports::attrs_of(&attrs)?;
    deps.table
        .transact(vec![
            crate::ports::Write::Put {
                item: Item::new(connection_key(t, user_id, connection_id), attrs.clone()),
                cond: Cond::Always,
            },
            crate::ports::Write::Put { item: Item::new(connection_index(connection_id), attrs), cond: Cond::Always },
        ])
        .await?;
    Ok(())
}

pub async fn forget_connection(deps: &Deps, connection_id: &str) -> CoreResult<()> {
    let Some(index) = deps.table.get(&connection_index(connection_id)).await? else { return Ok(()) };
    if let (Some(t), Some(u)) = (index.str("tenant").and_then(|t| TenantId::parse(t).ok()), index.str("user_id")) {
        deps.table.delete(&connection_key(&t, u, connection_id), Cond::Always).await?;
    }
    deps.table.delete(&connection_index(connection_id), Cond::Always).await?;
    Ok(())
}

/// The tenant and user of a connection.
pub async fn connection_owner(deps: &Deps, connection_id: &str) -> CoreResult<Option<(TenantId, String)>> {
    let Some(index) = deps.table.get(&connection_index(connection_id)).await? else { return Ok(None) };
    let tenant = index.str("tenant").and_then(|t| TenantId::parse(t).ok());
    Ok(tenant.zip(index.str("user_id").map(str::to_owned)))
}

/// The live (unexpired) connection ids of a user.
pub async fn connections_of(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Vec<String>> {
    let now = deps.clock.now().timestamp();
    let page = deps
        .table
        .query(&format!("T#{t}#WS#{user_id}"), "C#", QueryOpts { limit: 100, cursor: None, descending: false })
        .await?;
    Ok(page
        .items
        .iter()
        .filter(|i| i.i64("ttl").is_none_or(|ttl| ttl > now))
        .filter_map(|i| i.str("connection_id").map(str::to_owned))
        .collect())
}
