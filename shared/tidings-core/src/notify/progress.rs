//! Progress of a notification: counters of its deliveries by status, changed in the same
//! transaction as the delivery's own status change, so a count can never disagree with the
//! deliveries (no read-all-deliveries on `GET /v1/notifications/{id}`, whatever the audience).
//!
//! The counters live in items `C#{page:08}#{shard}` of the notification's partition (see
//! [`keys::progress_counter`]): one set per expansion page and per shard of the user id, so a
//! million-user campaign spreads its status changes over many items instead of one hot key.
//! Each counter item also holds `created_ms` (when its page was expanded): the oldest item with
//! something still queued gives the age of the oldest pending delivery.

use std::time::Duration;

use serde::Serialize;

use super::model::DeliveryStatus;
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::ports::{Cond, Key, QueryOpts, StoreError, Update, Write};

/// Shards of each page's counters.
pub const COUNTER_SHARDS: u32 = 4;

/// The attribute of a delivery naming the expansion page it was created by (0 for a
/// `user_ids` notification).
pub const PAGE_ATTR: &str = "page";

/// The expansion page a delivery was created by (0 for one without: a `user_ids` notification's).
pub fn page_of(item: &crate::ports::Item) -> u64 {
    item.i64(PAGE_ATTR).unwrap_or(0).max(0) as u64
}

/// What a delivery status counts as.
pub fn bucket(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Pending | DeliveryStatus::Sending => "queued",
        DeliveryStatus::Sent => "sent",
        DeliveryStatus::Delivered | DeliveryStatus::Opened | DeliveryStatus::Clicked => "delivered",
        DeliveryStatus::Failed => "failed",
        DeliveryStatus::Suppressed => "suppressed",
        DeliveryStatus::Dead => "dead",
    }
}

/// A stable shard of a user id (FNV-1a: the same on every instance and every run).
pub fn shard_of(user_id: &str) -> u32 {
    keys::stable_shard(user_id, COUNTER_SHARDS)
}

/// The counter item a delivery of `user_id` created by `page` is counted in.
pub fn counter_key(t: &TenantId, notification_id: &str, page: u64, user_id: &str) -> Key {
    keys::progress_counter(t, notification_id, page, shard_of(user_id))
}

/// A write adding `deltas` (bucket, n) to a counter item (creating it when absent).
pub fn counter_write(key: Key, deltas: &[(&'static str, i64)], created_ms: i64) -> Write {
    let mut updates: Vec<Update> = deltas.iter().filter(|(_, n)| *n != 0).map(|(b, n)| Update::add(b, *n)).collect();
    updates.push(Update::SetIfAbsent("created_ms".into(), created_ms.into()));
    Write::Update { key, updates, cond: Cond::Always }
}

/// The writes of many counter changes `(counter item, bucket, delta)`, summed into one write
/// per counter item (a transaction may write each item once).
pub fn counter_writes(changes: impl IntoIterator<Item = (Key, &'static str, i64)>, created_ms: i64) -> Vec<Write> {
    let mut by_key: std::collections::BTreeMap<Key, std::collections::BTreeMap<&'static str, i64>> = Default::default();
    for (key, bucket, delta) in changes {
        *by_key.entry(key).or_default().entry(bucket).or_default() += delta;
    }
    by_key
        .into_iter()
        .map(|(key, deltas)| {
            let deltas: Vec<(&'static str, i64)> = deltas.into_iter().collect();
            counter_write(key, &deltas, created_ms)
        })
        .collect()
}

/// A delivery being moved from one status to another.
#[derive(Clone)]
pub struct Transition<'a> {
    pub t: &'a TenantId,
    pub notification_id: &'a str,
    pub user_id: &'a str,
    pub page: u64,
    pub key: &'a Key,
    pub from: DeliveryStatus,
    pub to: DeliveryStatus,
    /// More conditions on the delivery (besides `status == from`).
    pub also: Option<Cond>,
    /// The delivery's updates (`status` is set by the transition).
    pub updates: Vec<Update>,
}

/// The delivery's write of a transition, and its counter change (key, from bucket, to bucket)
/// when the buckets differ.
fn transition_parts(tr: Transition<'_>) -> (Write, Option<(Key, &'static str, &'static str)>) {
    let mut cond = vec![Cond::eq("status", tr.from.as_str())];
    cond.extend(tr.also);
    let cond = Cond::And(cond);
    let mut updates = tr.updates;
    updates.retain(|u| !matches!(u, Update::Set(n, _) if n == "status"));
    updates.push(Update::set("status", tr.to.as_str()));
    let (from, to) = (bucket(tr.from), bucket(tr.to));
    let counter = (from != to).then(|| (counter_key(tr.t, tr.notification_id, tr.page, tr.user_id), from, to));
    (Write::Update { key: tr.key.clone(), updates, cond }, counter)
}

/// The webhook events of transitions (`crate::webhooks`), put in the same transaction as the
/// status changes they tell of: none, and no read, when no transition is an event.
async fn webhook_writes(deps: &Deps, trs: &[Transition<'_>]) -> Result<Vec<Write>, StoreError> {
    type Changes<'a> = (&'a TenantId, Vec<crate::webhooks::DeliveryChange<'a>>);
    let mut by_tenant: std::collections::BTreeMap<&str, Changes<'_>> = Default::default();
    for tr in trs {
        if crate::webhooks::delivery_event_type(tr.from, tr.to).is_some() {
            let change = crate::webhooks::DeliveryChange {
                notification_id: tr.notification_id,
                user_id: tr.user_id,
                delivery_sk: tr.key.sk.clone(),
                from: tr.from,
                to: tr.to,
            };
            by_tenant.entry(tr.t.as_str()).or_insert_with(|| (tr.t, Vec::new())).1.push(change);
        }
    }
    let mut writes = Vec::new();
    for (_, (t, changes)) in by_tenant {
        writes.extend(crate::webhooks::delivery_event_writes(deps, t, changes).await?);
    }
    Ok(writes)
}

/// Several transitions (at most 30) and `extra` unconditional writes in one transaction, their
/// counter changes summed per counter item: what a channel worker records for a batch of
/// sends. Each answer is [`transition`]'s. When the transaction fails (a delivery moved by
/// someone else, a conflict), each transition is applied alone, and the extra writes after it.
pub async fn transition_many(
    deps: &Deps,
    trs: Vec<Transition<'_>>,
    extra: Vec<Write>,
) -> Result<Vec<bool>, StoreError> {
    if trs.len() > 30 {
        return Err(StoreError::Invalid(format!("{} transitions in one transaction (at most 30)", trs.len())));
    }
    let now_ms = deps.clock.now_ms();
    let mut writes = Vec::with_capacity(trs.len() * 2 + extra.len());
    let mut changes = Vec::with_capacity(trs.len() * 2);
    for tr in &trs {
        let (write, counter) = transition_parts(tr.clone());
        writes.push(write);
        if let Some((key, from, to)) = counter {
            changes.push((key.clone(), from, -1));
            changes.push((key, to, 1));
        }
    }
    writes.extend(counter_writes(changes, now_ms));
    writes.extend(webhook_writes(deps, &trs).await?);
    writes.extend(extra.iter().cloned());
    if !trs.is_empty() && deps.table.transact(writes).await.is_ok() {
        return Ok(vec![true; trs.len()]);
    }
    let mut out = Vec::with_capacity(trs.len());
    for tr in trs {
        out.push(transition(deps, tr).await?);
    }
    for w in extra {
        if let Write::Put { item, cond } = w {
            deps.table.put(item, cond).await?;
        } else {
            deps.table.transact(vec![w]).await?;
        }
    }
    Ok(out)
}

/// Applies a status change with its counters in one transaction. `Ok(false)` when the delivery
/// was not in `from` (someone else moved it: nothing is changed, nothing counted). Transaction
/// conflicts (DynamoDB, on a busy counter) are retried here, briefly.
pub async fn transition(deps: &Deps, tr: Transition<'_>) -> Result<bool, StoreError> {
    let events = webhook_writes(deps, std::slice::from_ref(&tr)).await?;
    let (write, counter) = transition_parts(tr);
    let mut writes = vec![write];
    if let Some((key, from, to)) = counter {
        writes.push(counter_write(key, &[(from, -1), (to, 1)], deps.clock.now_ms()));
    }
    writes.extend(events);
    let mut attempt = 0u32;
    loop {
        let result = if writes.len() == 1 {
            let Some(Write::Update { key, updates, cond }) = writes.pop() else {
                return Err(StoreError::Invalid("transition without a write".into()));
            };
            let r = deps.table.update(&key, updates.clone(), cond.clone()).await.map(|_| ());
            writes.push(Write::Update { key, updates, cond });
            r
        } else {
            deps.table.transact(writes.clone()).await
        };
        match result {
            Ok(()) => return Ok(true),
            Err(StoreError::ConditionFailed { index: 0 }) => return Ok(false),
            Err(e) if e.is_retryable() && attempt < 5 => {
                attempt += 1;
                let jitter = rand::random::<u64>() % (20 * u64::from(attempt));
                tokio::time::sleep(Duration::from_millis(5 + jitter)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A transaction, tried again a few times when it conflicts (a busy counter on DynamoDB).
pub(crate) async fn transact_retrying(table: &dyn crate::ports::Table, writes: Vec<Write>) -> Result<(), StoreError> {
    let mut attempt = 0u64;
    loop {
        match table.transact(writes.clone()).await {
            Err(e) if e.is_retryable() && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10 * attempt + rand::random::<u64>() % 20)).await;
            }
            other => return other,
        }
    }
}

/// Counts of a notification's deliveries, as `GET /v1/notifications/{id}` shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Counts {
    pub queued: u64,
    pub sent: u64,
    pub delivered: u64,
    pub failed: u64,
    pub suppressed: u64,
    pub dead: u64,
}

/// What the counter items add up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub counts: Counts,
    /// Recipients expanded so far (pages finished).
    pub expanded: u64,
    /// Pages finished.
    pub pages: u64,
    /// When the oldest counter item that still has queued deliveries was made.
    pub oldest_pending_ms: Option<i64>,
    /// A workflow send's runs not yet ended (`crate::workflows::run`).
    pub running: u64,
}

/// Adds up a notification's counter items.
pub async fn read(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<Progress> {
    let pk = keys::notification_pk(t, notification_id);
    let mut p = Progress::default();
    let mut cursor = None;
    let n = |item: &crate::ports::Item, name: &str| item.i64(name).unwrap_or(0).max(0) as u64;
    loop {
        let page =
            deps.table.query(&pk, keys::COUNTER_PREFIX, QueryOpts { limit: 1000, cursor, descending: false }).await?;
        for item in &page.items {
            let c = &mut p.counts;
            c.queued += n(item, "queued");
            c.sent += n(item, "sent");
            c.delivered += n(item, "delivered");
            c.failed += n(item, "failed");
            c.suppressed += n(item, "suppressed");
            c.dead += n(item, "dead");
            p.expanded += n(item, "expanded");
            p.pages += n(item, "pages");
            p.running += n(item, "running");
            if n(item, "queued") > 0
                && let Some(ms) = item.i64("created_ms")
            {
                p.oldest_pending_ms = Some(p.oldest_pending_ms.map_or(ms, |o| o.min(ms)));
            }
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(p);
        }
    }
}
