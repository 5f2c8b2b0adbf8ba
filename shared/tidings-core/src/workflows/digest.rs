//! Digest windows: the triggers of one (workflow, recipient, digest step, key) that arrive while
//! a window is open become one run of the steps after the digest, the first trigger's (its
//! leader's), with every trigger's params as `events`.
//!
//! | item | pk | sk |
//! |---|---|---|
//! | the open window | `T#{t}#DG#{workflow}#{user}#{step}#{key hash}` | `HEAD` |
//! | a trigger's membership (which window, whose run) | same | `M#{notification}` |
//! | a trigger's event (its params) | same | `E#{window}#{ms:015}#{notification}` |
//!
//! Entering is a transaction: the first trigger puts the head (only when absent) with its
//! membership and event; any other checks that the head still names the window it read and puts
//! its membership and event beside it. However many triggers arrive at the same instant, on how
//! many instances, exactly one head is put, so there is one window and one leader; a trigger
//! that finds its membership entered already (a redelivery, a process that died after the write)
//! gets the same answer again. Closing deletes the head (only while it names the window), so a
//! trigger that checked the head before that is in the window, and one after it opens the next;
//! then the window's events are read, oldest first. Keys are hashed: other keys, other
//! partitions, never merged.
//!
//! The back-in-stock merge window is one of these digests (`crate::restock::merge`): a notice
//! enters its user's restock partition in the notice's own transaction ([`entry`]), and the
//! window's flush closes it ([`close`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, new_id};
use crate::ports::{Cond, Item, Key, QueryOpts, StoreError, Write, attrs_of};

/// How long digest items outlive their window (for the membership of a late redelivery).
const KEEP_S: i64 = 35 * 24 * 3600;

/// Where one (workflow, recipient, step, key) collects.
pub fn partition(t: &TenantId, workflow_id: &str, user_id: &str, step: u32, key: &str) -> String {
    format!("T#{t}#DG#{workflow_id}#{user_id}#{step}#{}", super::definition::key_hash(key))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Head {
    window: String,
    leader: String,
    flush_ms: i64,
    ttl: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Member {
    window: String,
    leader: String,
    flush_ms: i64,
    ttl: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct EventItem {
    params: Value,
    ttl: i64,
}

/// A trigger's place in a digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entered {
    /// It opened the window: its run waits for `flush_ms`, then goes on with the events.
    Leader { window: String, flush_ms: i64 },
    /// It joined the window `leader`'s run carries on.
    Joined { window: String, leader: String },
}

/// The writes that put one member (a trigger, or a back-in-stock notice) in the open window of
/// `pk` as read now, or open one that closes at `flush_ms`: see [`entry`].
#[derive(Debug)]
pub struct Entry {
    pub window: String,
    pub leader: String,
    pub flush_ms: i64,
    /// This entry opens the window (its head is put only when absent).
    pub opens: bool,
    /// The head's condition (its put, or its check), the membership (when remembered) and the
    /// event: a transaction of these, with the caller's own writes, commits only while the window
    /// read is still the open one.
    pub writes: Vec<Write>,
}

/// Reads the head of `pk` and makes the writes that enter `member` (with `params`, made at
/// `at_ms`: events sort by it) in its window, or open one that closes at `flush_ms`. `remember`:
/// also put the membership (`M#{member}`) that answers a redelivery; a caller whose own item
/// already records the window (a back-in-stock notice) leaves it out.
pub async fn entry(
    deps: &Deps,
    pk: &str,
    member: &str,
    params: &Value,
    at_ms: i64,
    flush_ms: i64,
    remember: bool,
) -> CoreResult<Entry> {
    let head_key = Key::new(pk, "HEAD");
    let (head, opens, cond_head) = match deps.table.get(&head_key).await? {
        Some(item) => {
            let h: Head = item.parse()?;
            let check = Write::Check { key: head_key.clone(), cond: Cond::eq("window", h.window.clone()) };
            (h, false, check)
        }
        None => {
            let ttl = flush_ms / 1000 + KEEP_S;
            let h = Head { window: new_id(), leader: member.to_owned(), flush_ms, ttl };
            let put = Write::Put { item: Item::new(head_key.clone(), attrs_of(&h)?), cond: Cond::NotExists };
            (h, true, put)
        }
    };
    let ttl = head.flush_ms / 1000 + KEEP_S;
    let mut writes = vec![cond_head];
    if remember {
        let m = Member { window: head.window.clone(), leader: head.leader.clone(), flush_ms: head.flush_ms, ttl };
        writes.push(Write::Put {
            item: Item::new(Key::new(pk, format!("M#{member}")), attrs_of(&m)?),
            cond: Cond::NotExists,
        });
    }
    let event = EventItem { params: params.clone(), ttl };
    let event_key = Key::new(pk, format!("E#{}#{:015}#{member}", head.window, at_ms.max(0)));
    writes.push(Write::Put { item: Item::new(event_key, attrs_of(&event)?), cond: Cond::NotExists });
    Ok(Entry { window: head.window, leader: head.leader, flush_ms: head.flush_ms, opens, writes })
}

/// Enters `notification_id`'s trigger (with `params`, made at `at_ms`: its events sort by it) in
/// the open window of `pk`, or opens one that closes at `flush_ms`.
pub async fn enter(
    deps: &Deps,
    pk: &str,
    notification_id: &str,
    params: &Value,
    at_ms: i64,
    flush_ms: i64,
) -> CoreResult<Entered> {
    let member_key = Key::new(pk, format!("M#{notification_id}"));
    for _ in 0..20 {
        if let Some(item) = deps.table.get(&member_key).await? {
            let m: Member = item.parse()?;
            return Ok(role(m.window, m.leader, m.flush_ms, notification_id));
        }
        let e = entry(deps, pk, notification_id, params, at_ms, flush_ms, true).await?;
        match deps.table.transact(e.writes).await {
            Ok(()) => {
                crate::crash::point("workflow.digest_entered");
                return Ok(role(e.window, e.leader, e.flush_ms, notification_id));
            }
            // The head changed (opened or closed by another trigger), or this trigger is in
            // already: read again.
            Err(StoreError::ConditionFailed { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CoreError::conflict("digest_contention", "the digest window kept changing; try again"))
}

fn role(window: String, leader: String, flush_ms: i64, me: &str) -> Entered {
    if leader == me { Entered::Leader { window, flush_ms } } else { Entered::Joined { window, leader } }
}

/// Ends `window` without a digest, its leader's run cancelled: the head goes (only while it
/// names the window), so the next trigger opens a window of its own instead of joining one that
/// no run will ever close. The triggers that joined it are cancelled with their leader.
pub async fn abandon(deps: &Deps, pk: &str, window: &str) -> CoreResult<()> {
    match deps.table.delete(&Key::new(pk, "HEAD"), Cond::eq("window", window)).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Closes `window` (if still open) and reads its events: the first `max` triggers' params, oldest
/// first, and how many there were.
pub async fn close(deps: &Deps, pk: &str, window: &str, max: usize) -> CoreResult<(Vec<Value>, u64)> {
    match deps.table.delete(&Key::new(pk, "HEAD"), Cond::eq("window", window)).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    crate::crash::point("workflow.digest_closed");
    let prefix = format!("E#{window}#");
    let mut events = Vec::new();
    let mut count = 0u64;
    let mut cursor = None;
    loop {
        let page = deps.table.query(pk, &prefix, QueryOpts { limit: 500, cursor, descending: false }).await?;
        for item in &page.items {
            count += 1;
            if events.len() < max {
                events.push(item.parse::<EventItem>()?.params);
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok((events, count));
        }
    }
}
