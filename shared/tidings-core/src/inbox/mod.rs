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
    /// Archived by the user: kept (a repeated delivery does not bring it back) but no longer
    /// listed; an archived message is read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(ignore)]
    pub archived: bool,
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
        archived: false,
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

/// How many store pages one inbox page reads at most while it skips archived messages: a page
/// may then hold fewer than `limit` items, with a `next_cursor` to go on.
const LIST_READS: usize = 8;

/// One page of the inbox, newest first, archived messages left out. Each read asks the store
/// for exactly as many items as the page still lacks, so its cursor never skips one.
pub async fn list(
    deps: &Deps,
    t: &TenantId,
    user_id: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<InboxPage> {
    check_id("user_id", user_id)?;
    let mut items = Vec::new();
    let mut cursor = cursor;
    let pk = keys::inbox_pk(t, user_id);
    for _ in 0..LIST_READS {
        let want = limit - items.len();
        let page = deps.table.query(&pk, "M#", QueryOpts { limit: want, cursor, descending: true }).await;
        let page = page.map_err(CoreError::of_page_query)?;
        for item in &page.items {
            let m: InboxMessage = item.parse()?;
            if !m.archived {
                items.push(m);
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() || items.len() >= limit {
            break;
        }
    }
    Ok(InboxPage { items, unread_count: unread_count(deps, t, user_id).await?, next_cursor: cursor })
}

/// Marks a message read (once: the counter moves only on the first call). Returns the unread
/// count after.
pub async fn mark_read(deps: &Deps, t: &TenantId, user_id: &str, message_id: &str) -> CoreResult<i64> {
    check_id("user_id", user_id)?;
    check_id("message_id", message_id)?;
    if !mark_once(deps, t, user_id, message_id).await?
        && deps.table.get(&keys::inbox_message(t, user_id, message_id)).await?.is_none()
    {
        return Err(CoreError::NotFound { what: "inbox message" });
    }
    unread_count(deps, t, user_id).await
}

/// Marks a message read and counts it down, in one transaction; whether this call did.
async fn mark_once(deps: &Deps, t: &TenantId, user_id: &str, message_id: &str) -> CoreResult<bool> {
    let writes = vec![
        Write::Update {
            key: keys::inbox_message(t, user_id, message_id),
            updates: vec![Update::set("read", true)],
            cond: Cond::eq("read", false),
        },
        Write::Update {
            key: keys::inbox_counter(t, user_id),
            updates: vec![Update::add("unread", -1)],
            cond: Cond::ge("unread", 1),
        },
    ];
    match deps.table.transact(writes).await {
        Ok(()) => Ok(true),
        Err(StoreError::ConditionFailed { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What `archive` and `read_all` answer.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct InboxChange {
    /// The message archived (`archive`), or none (`read_all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// How many messages this call changed (0 when repeated).
    pub changed: u32,
    pub unread_count: i64,
}

/// Archives a message: no longer listed, read if it was not (the counter moves once). Its
/// change-stream record is pushed live as `inbox.archived`. Archiving twice changes nothing.
pub async fn archive(deps: &Deps, t: &TenantId, user_id: &str, message_id: &str) -> CoreResult<InboxChange> {
    check_id("user_id", user_id)?;
    check_id("message_id", message_id)?;
    let key = keys::inbox_message(t, user_id, message_id);
    // Twice at most: a read between the get and the write changes which writes it takes.
    let mut changed = 0;
    for _ in 0..2 {
        let Some(item) = deps.table.get(&key).await? else { return Err(CoreError::NotFound { what: "inbox message" }) };
        let m: InboxMessage = item.parse()?;
        if m.archived {
            break;
        }
        let not_archived = Cond::Or(vec![Cond::AttrNotExists("archived".into()), Cond::eq("archived", false)]);
        let mut writes = vec![Write::Update {
            key: key.clone(),
            updates: vec![Update::set("archived", true), Update::set("read", true)],
            cond: Cond::And(vec![not_archived, Cond::eq("read", m.read)]),
        }];
        if !m.read {
            writes.push(Write::Update {
                key: keys::inbox_counter(t, user_id),
                updates: vec![Update::add("unread", -1)],
                cond: Cond::ge("unread", 1),
            });
        }
        match deps.table.transact(writes).await {
            Ok(()) => {
                changed = 1;
                break;
            }
            Err(StoreError::ConditionFailed { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let unread_count = unread_count(deps, t, user_id).await?;
    Ok(InboxChange { message_id: Some(message_id.to_owned()), changed, unread_count })
}

/// Marks every unread message read, newest first, each as `mark_read` does (so each is pushed
/// live as `inbox.read` with the count after it). Returns how many it marked.
pub async fn read_all(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<InboxChange> {
    check_id("user_id", user_id)?;
    let mut changed = 0u32;
    let mut cursor = None;
    loop {
        let page = deps
            .table
            .query(&keys::inbox_pk(t, user_id), "M#", QueryOpts { limit: 100, cursor, descending: true })
            .await?;
        for item in &page.items {
            let m: InboxMessage = item.parse()?;
            if m.read || m.archived {
                continue;
            }
            if mark_once(deps, t, user_id, &m.message_id).await? {
                changed += 1;
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    // Nothing unread is left: a counter that drifted above zero (it never goes below) is set
    // back only through the messages themselves, so it is read, not reset.
    Ok(InboxChange { message_id: None, changed, unread_count: unread_count(deps, t, user_id).await? })
}
