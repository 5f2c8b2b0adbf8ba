//! The in-app inbox: per user, newest first, with an unread counter kept in the same
//! transaction as each message (docs/inbox.md).

pub mod live;

use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::notify::model::Notification;
use crate::ports::{Cond, Item, QueryOpts, StoreError, Update, Write, attrs_of};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InboxMessage {
    pub message_id: String,
    pub title: String,
    pub body: String,
    pub created_at: String,
    pub read: bool,
    #[serde(default)]
    pub notification_id: String,
}

/// The message id of a notification in a user's inbox: ordered by the notification's time and
/// deterministic, so a repeated orchestration writes the same item.
pub fn message_id(n: &Notification) -> String {
    message_id_at(n, None)
}

/// The message id of a notification's in-app message, or of a workflow's send step `step`
/// (a workflow may put several messages in one inbox).
pub fn message_id_at(n: &Notification, step: Option<u32>) -> String {
    match step {
        None => format!("{:015}-{}", n.created_ms.max(0), n.notification_id),
        Some(s) => format!("{:015}-{}-{s}", n.created_ms.max(0), n.notification_id),
    }
}

/// The writes that put a message in the inbox once and count it unread.
pub fn message_writes(
    t: &TenantId,
    user_id: &str,
    n: &Notification,
    step: Option<u32>,
    title: String,
    body: String,
    created_at: &str,
) -> CoreResult<Vec<Write>> {
    let message = InboxMessage {
        message_id: message_id_at(n, step),
        title,
        body,
        created_at: created_at.to_owned(),
        read: false,
        notification_id: n.notification_id.clone(),
    };
    Ok(vec![
        Write::Put {
            item: Item::new(keys::inbox_message(t, user_id, &message.message_id), attrs_of(&message)?),
            cond: Cond::NotExists,
        },
        Write::Update {
            key: keys::inbox_counter(t, user_id),
            updates: vec![Update::add("unread", 1)],
            cond: Cond::Always,
        },
    ])
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct InboxPage {
    pub items: Vec<InboxMessage>,
    pub unread_count: i64,
    pub next_cursor: Option<String>,
}

pub async fn unread_count(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<i64> {
    Ok(deps.table.get(&keys::inbox_counter(t, user_id)).await?.and_then(|i| i.i64("unread")).unwrap_or(0).max(0))
}

pub async fn list(
    deps: &Deps,
    t: &TenantId,
    user_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<InboxPage> {
    check_id("user_id", user_id)?;
    let page = deps.table.query(&keys::inbox_pk(t, user_id), "M#", QueryOpts { limit, cursor, descending: true }).await;
    let page = page.map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<InboxMessage>, _>>()?;
    Ok(InboxPage { items, unread_count: unread_count(deps, t, user_id).await?, next_cursor: page.next_cursor })
}

/// Marks a message read (once: the counter moves only on the first call). Returns the unread
/// count after.
pub async fn mark_read(deps: &Deps, t: &TenantId, user_id: &str, message_id: &str) -> CoreResult<i64> {
    check_id("user_id", user_id)?;
    check_id("message_id", message_id)?;
    let key = keys::inbox_message(t, user_id, message_id);
    let writes = vec![
        Write::Update { key: key.clone(), updates: vec![Update::set("read", true)], cond: Cond::eq("read", false) },
        Write::Update {
            key: keys::inbox_counter(t, user_id),
            updates: vec![Update::add("unread", -1)],
            cond: Cond::ge("unread", 1),
        },
    ];
    match deps.table.transact(writes).await {
        Ok(()) => {}
        Err(StoreError::ConditionFailed { .. }) => {
            if deps.table.get(&key).await?.is_none() {
                return Err(CoreError::NotFound { what: "inbox message" });
            }
        }
        Err(e) => return Err(e.into()),
    }
    unread_count(deps, t, user_id).await
}
