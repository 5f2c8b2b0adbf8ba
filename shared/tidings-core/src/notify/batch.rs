//! Send batches: a page's marketing push and SMS deliveries recorded per batch of up to 25 instead of
//! an item each (docs/delivery.md, "Send batches").
//!
//! - The orchestrator packs a page's marketing push and SMS sends into batches ([`pack`]): one queue
//!   message ([`SendBatchTask`], each entry with its address and rendered content, under a
//!   queue message's size) and one item `B#{page}#{n}` ([`SendBatch`]) listing its users,
//!   created `pending` by a conditional put in a transaction with the page's counters
//!   ([`write_batches`]). Its number `n` follows the page's batches that exist already, whose
//!   members a retried page does not plan again ([`PageBatches`]): membership is fixed at
//!   creation.
//! - The channel worker claims the whole batch with one conditional update and records every
//!   entry's outcome in one transaction with the counters it moves (`super::send_batch`).
//! - `GET /v1/notifications/{id}/deliveries` lists the entries like deliveries ([`list`]).
//!
//! Everything else (transactional, email, in-app, and every delivery that ends at planning:
//! suppressed, failed render, deferred) keeps its own `D#` item. Marketing email does too: its
//! receipts and tracked links name a delivery item, which a batch entry is not (yet).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::model::{Category, ChannelTask, Delivery, DeliveryStatus, Notification};
use super::progress;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys;
use crate::ports::table::MAX_TRANSACTION_WRITES;
use crate::ports::{Channel, Cond, Item, Key, QueryOpts, StoreError, Table, Update, Write, attrs_of};

/// Most deliveries in one send batch.
pub const MAX_BATCH: usize = 25;

/// Room kept in a batch message for its envelope (tenant, ids, priority).
const ENVELOPE_BYTES: usize = 1024;

/// Whether a delivery of this category on this channel is sent through a send batch: marketing
/// push and SMS, whose sends nothing names afterwards (no receipt, no tracked link).
pub fn batchable(category: Category, channel: Channel) -> bool {
    category == Category::Marketing && matches!(channel, Channel::Push | Channel::Sms)
}

/// Where a send batch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchStatus {
    /// Created, or back after a retryable answer: its open entries are sent by the next claim.
    Pending,
    /// Claimed by a worker (under a lease).
    Sending,
    /// Some entries ran out of receives (`dead`): a redrive claims it again.
    Dead,
    /// Every entry is final.
    Done,
}

impl BatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Pending => "pending",
            BatchStatus::Sending => "sending",
            BatchStatus::Dead => "dead",
            BatchStatus::Done => "done",
        }
    }
}

/// One delivery of a send batch, as recorded in the batch item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchEntry {
    pub user_id: String,
    pub status: DeliveryStatus,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

impl BatchEntry {
    /// Not final yet: sent by the batch's next claim.
    pub fn is_open(&self) -> bool {
        matches!(self.status, DeliveryStatus::Pending | DeliveryStatus::Sending | DeliveryStatus::Dead)
    }
}

/// The batch item `B#{page}#{n}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SendBatch {
    pub notification_id: String,
    pub channel: Channel,
    pub category: Category,
    /// The expansion page that created it (its progress counters).
    pub page: u64,
    pub status: BatchStatus,
    /// How many times it was claimed: a record is conditional on its own claim's number.
    #[serde(default)]
    pub claims: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<i64>,
    pub entries: Vec<BatchEntry>,
    pub updated_at: String,
}

impl SendBatch {
    /// Its entries as `GET …/deliveries` shows deliveries: an open entry of a claimed batch is
    /// `sending`.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.entries
            .iter()
            .map(|e| Delivery {
                user_id: e.user_id.clone(),
                channel: self.channel,
                status: match e.status {
                    DeliveryStatus::Pending if self.status == BatchStatus::Sending => DeliveryStatus::Sending,
                    s => s,
                },
                attempts: e.attempts,
                last_error: e.last_error.clone(),
                reason: e.reason.clone(),
                sent_at: e.sent_at.clone(),
                first_failed_at: e.first_failed_at.clone(),
                lease_until_ms: (self.status == BatchStatus::Sending && e.status == DeliveryStatus::Pending)
                    .then_some(self.lease_until_ms)
                    .flatten(),
                provider_message_id: e.provider_message_id.clone(),
                deferred_until: None,
                category: self.category,
                updated_at: e.updated_at.clone().unwrap_or_else(|| self.updated_at.clone()),
                step: None,
            })
            .collect()
    }
}

pub use super::model::{BatchSend, SendBatchTask};

/// The batch item's key of a batch message; `Err` when the message names something else.
pub fn key_of(task: &SendBatchTask) -> CoreResult<Key> {
    if !task.batch.starts_with(keys::SEND_BATCH_PREFIX) || task.batch.contains(['\n', '\0']) {
        return Err(CoreError::invalid("batch", "not a send batch key"));
    }
    Ok(Key::new(keys::notification_pk(&task.tenant, &task.notification_id), task.batch.clone()))
}

fn send_of(task: ChannelTask) -> BatchSend {
    BatchSend {
        user_id: task.user_id,
        to: task.to,
        subject: task.subject,
        body: task.body,
        html: task.html,
        headers: task.headers,
    }
}

fn size_of(send: &BatchSend) -> usize {
    serde_json::to_vec(send).map(|b| b.len() + 1).unwrap_or(usize::MAX)
}

/// Whether a rendered send fits a batch message on its own.
pub fn fits(task: &ChannelTask) -> bool {
    size_of(&send_of(task.clone())) + ENVELOPE_BYTES <= crate::sizes::MAX_MESSAGE_BYTES
}

/// The send batches already made by a page (a retried or redriven page): their members are
/// not planned again, and the pending ones are queued again.
#[derive(Debug, Default)]
pub struct PageBatches {
    /// Each batched user: its batch's key, and whether that batch is still `pending`.
    pub by_user: HashMap<String, (Key, bool)>,
    /// The batches, by key.
    pub batches: BTreeMap<Key, SendBatch>,
    /// The number of the next batch.
    pub next: u32,
}

/// The send batches a page made already.
pub async fn page_batches(
    table: &dyn Table,
    t: &TenantId,
    notification_id: &str,
    page: u64,
) -> CoreResult<PageBatches> {
    let pk = keys::notification_pk(t, notification_id);
    let prefix = keys::send_batch_page_prefix(page);
    let mut out = PageBatches::default();
    let mut cursor = None;
    loop {
        let got = table.query(&pk, &prefix, QueryOpts { limit: 1000, cursor, descending: false }).await?;
        for item in got.items {
            let n: u32 = item.key.sk.strip_prefix(&prefix).and_then(|n| n.parse().ok()).unwrap_or(0);
            out.next = out.next.max(n + 1);
            let batch: SendBatch = item.parse()?;
            let pending = batch.status == BatchStatus::Pending;
            for e in &batch.entries {
                out.by_user.insert(e.user_id.clone(), (item.key.clone(), pending));
            }
            out.batches.insert(item.key, batch);
        }
        cursor = got.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

/// One run's hold on planning a page (docs/delivery.md, "Send batches": two runs of one page).
/// A `D#` item per delivery rules out a second send by its key; a member of a send batch is
/// only kept from a second batch by the batches a run reads before planning, so two runs of one
/// page at the same time (SQS hands a message to two consumers, a visibility timeout ran out)
/// must not both plan it. The lease is an item `L#{page}` naming its run, held for the
/// visibility timeout: a crashed run's message comes back after that (SQS's own timeout is
/// never shorter), so a retry finds it expired. Every transaction that creates batches checks
/// that this run still holds it, so a run that outlived its lease creates nothing.
#[derive(Clone, Debug)]
pub struct PageLease {
    pub key: Key,
    pub owner: String,
}

impl PageLease {
    fn check(&self) -> Write {
        Write::Check { key: self.key.clone(), cond: Cond::eq("owner", self.owner.as_str()) }
    }

    /// Lets the page go (best effort: a lease not released runs out).
    pub async fn release(&self, table: &dyn Table) {
        if let Err(e) = table.delete(&self.key, Cond::eq("owner", self.owner.as_str())).await {
            tracing::debug!(error = %e, "page lease not released; it runs out");
        }
    }
}

/// Whether planning this notification's pages takes a [`PageLease`]: when it may make send
/// batches.
pub fn needs_page_lease(n: &Notification) -> bool {
    let channels = n.request.channels.as_deref().unwrap_or(&Channel::ALL[..]);
    channels.iter().any(|&c| batchable(n.request.category(), c))
}

/// Takes the page's lease for `hold_ms`, unless another run holds it (then `None`).
pub async fn lease_page(
    table: &dyn Table,
    t: &TenantId,
    notification_id: &str,
    page: u64,
    now_ms: i64,
    hold_ms: i64,
) -> CoreResult<Option<PageLease>> {
    let lease = PageLease { key: keys::page_lease(t, notification_id, page), owner: crate::ids::new_id() };
    let updates = vec![
        Update::set("owner", lease.owner.as_str()),
        Update::set("until_ms", now_ms.saturating_add(hold_ms)),
        // Kept a week at most (the table's TTL attribute), whatever happens to the run.
        Update::set("ttl", now_ms / 1000 + 7 * 86_400),
    ];
    let free = Cond::Or(vec![Cond::NotExists, Cond::lt("until_ms", now_ms)]);
    match table.update(&lease.key, updates, free).await {
        Ok(_) => Ok(Some(lease)),
        Err(StoreError::ConditionFailed { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A batch about to be created: its item and its message.
pub struct NewBatch {
    pub key: Key,
    pub item: SendBatch,
    pub task: SendBatchTask,
}

/// Packs a page's rendered marketing sends (one channel) into batches numbered from `first`,
/// in user order: up to [`MAX_BATCH`] each, fewer when their content would not fit one queue
/// message.
pub fn pack(
    t: &TenantId,
    n: &Notification,
    page: u64,
    first: u32,
    mut tasks: Vec<ChannelTask>,
    now: &str,
) -> Vec<NewBatch> {
    tasks.sort_by(|a, b| (a.channel.as_str(), &a.user_id).cmp(&(b.channel.as_str(), &b.user_id)));
    let mut out: Vec<NewBatch> = Vec::new();
    let mut bytes = 0usize;
    for task in tasks {
        let (channel, category, priority) = (task.channel, task.category, task.priority);
        let send = send_of(task);
        let size = size_of(&send);
        let full = out.last().is_none_or(|b| {
            b.task.entries.len() >= MAX_BATCH
                || b.task.channel != channel
                || bytes + size + ENVELOPE_BYTES > crate::sizes::MAX_MESSAGE_BYTES
        });
        if full {
            let number = first + out.len() as u32;
            let key = keys::send_batch(t, &n.notification_id, page, number);
            let item = SendBatch {
                notification_id: n.notification_id.clone(),
                channel,
                category,
                page,
                status: BatchStatus::Pending,
                claims: 0,
                lease_until_ms: None,
                entries: Vec::new(),
                updated_at: now.to_owned(),
            };
            let task = SendBatchTask {
                tenant: t.clone(),
                notification_id: n.notification_id.clone(),
                batch: key.sk.clone(),
                page,
                channel,
                category,
                accepted_ms: Some(n.created_ms),
                priority,
                entries: Vec::new(),
            };
            out.push(NewBatch { key, item, task });
            bytes = 0;
        }
        if let Some(b) = out.last_mut() {
            bytes += size;
            b.item.entries.push(BatchEntry {
                user_id: send.user_id.clone(),
                status: DeliveryStatus::Pending,
                attempts: 0,
                last_error: None,
                reason: None,
                sent_at: None,
                first_failed_at: None,
                provider_message_id: None,
                updated_at: None,
            });
            b.task.entries.push(send);
        }
    }
    out
}

/// The message of a batch made earlier and still `pending`, from its members' sends rendered
/// again (a member that can no longer be rendered is closed by the worker as not sent).
pub fn requeued(
    t: &TenantId,
    n: &Notification,
    key: &Key,
    batch: &SendBatch,
    sends: Vec<ChannelTask>,
) -> SendBatchTask {
    let priority = sends.first().and_then(|s| s.priority).or(Some(n.priority));
    SendBatchTask {
        tenant: t.clone(),
        notification_id: n.notification_id.clone(),
        batch: key.sk.clone(),
        page: batch.page,
        channel: batch.channel,
        category: batch.category,
        accepted_ms: Some(n.created_ms),
        priority,
        entries: sends.into_iter().map(send_of).collect(),
    }
}

/// Batches per creating transaction (with the page's counters, well under 100 writes).
const WRITE_CHUNK: usize = 20;

/// Creates the batches (each put only if absent) in transactions with the page's `queued`
/// counters, each checking that `lease` is still this run's. Returns the messages to queue: the
/// batches created, and those that existed already and are still `pending` (their message, cut
/// to the batch's members). A lease lost (another run holds the page now) is an error: nothing
/// more is created, and what was is that run's to find.
pub async fn write_batches(
    table: &dyn Table,
    t: &TenantId,
    notification_id: &str,
    now_ms: i64,
    lease: &PageLease,
    batches: Vec<NewBatch>,
) -> CoreResult<Vec<SendBatchTask>> {
    let counters = |bs: &[&NewBatch]| {
        let changes = bs.iter().flat_map(|b| {
            b.item.entries.iter().map(|e| {
                (progress::counter_key(t, notification_id, b.item.page, &e.user_id), progress::bucket(e.status), 1)
            })
        });
        progress::counter_writes(changes, now_ms)
    };
    let put = |b: &NewBatch| -> Result<Write, StoreError> {
        Ok(Write::Put { item: Item::new(b.key.clone(), attrs_of(&b.item)?), cond: Cond::NotExists })
    };
    let lost = || CoreError::conflict("page_lease_lost", "another run of this page holds its lease");
    let mut out = Vec::with_capacity(batches.len());
    let room = MAX_TRANSACTION_WRITES - progress::COUNTER_SHARDS as usize - 1;
    for chunk in batches.chunks(WRITE_CHUNK.min(room)) {
        let refs: Vec<&NewBatch> = chunk.iter().collect();
        // The lease's check first: index 0 of a failed condition is a lost lease.
        let mut writes = vec![lease.check()];
        writes.extend(chunk.iter().map(put).collect::<Result<Vec<_>, _>>()?);
        writes.extend(counters(&refs));
        match progress::transact_retrying(table, writes).await {
            Ok(()) => {
                out.extend(chunk.iter().map(|b| b.task.clone()));
                continue;
            }
            Err(StoreError::ConditionFailed { index: 0 }) => return Err(lost()),
            Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        // Some exist (an earlier run of the page made them): one by one.
        for b in chunk {
            let mut writes = vec![lease.check(), put(b)?];
            writes.extend(counters(&[b]));
            match progress::transact_retrying(table, writes).await {
                Ok(()) => out.push(b.task.clone()),
                Err(StoreError::ConditionFailed { index: 0 }) => return Err(lost()),
                Err(StoreError::ConditionFailed { .. }) => {
                    let Some(item) = table.get(&b.key).await? else { continue };
                    let existing: SendBatch = item.parse()?;
                    if existing.status == BatchStatus::Pending {
                        let members: std::collections::HashSet<&str> =
                            existing.entries.iter().map(|e| e.user_id.as_str()).collect();
                        let mut task = b.task.clone();
                        task.entries.retain(|s| members.contains(s.user_id.as_str()));
                        out.push(task);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(out)
}

/// Where a merged list of deliveries stopped: after the `D#` item `d` and the entry `b.1` of
/// the batch `b.0`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ListCursor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    b: Option<(String, usize)>,
}

/// The prefix of a cursor of a merged list (a notification with send batches).
const CURSOR_PREFIX: &str = "m1.";

fn encode(c: &ListCursor) -> String {
    use base64::Engine;
    let json = serde_json::to_vec(c).unwrap_or_default();
    format!("{CURSOR_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json))
}

fn decode(s: &str) -> Option<ListCursor> {
    use base64::Engine;
    let raw = s.strip_prefix(CURSOR_PREFIX)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(raw).ok()?;
    serde_json::from_slice(&json).ok()
}

/// One page of a notification's deliveries: its `D#` items and its batches' entries, merged in
/// the order of their delivery keys (`{user}#{channel}`), as a notification without batches
/// lists its `D#` items. `None`: the notification has no batches (its `D#` items are listed
/// as they always were).
pub async fn list(
    table: &dyn Table,
    pk: &str,
    limit: usize,
    cursor: Option<&str>,
) -> CoreResult<Option<(Vec<Delivery>, Option<String>)>> {
    let at = match cursor {
        Some(c) => match decode(c) {
            Some(at) => at,
            None if c.starts_with(CURSOR_PREFIX) => {
                return Err(CoreError::invalid("cursor", "not a cursor this list gave"));
            }
            None => return Ok(None),
        },
        None => {
            let any = table.query(pk, keys::SEND_BATCH_PREFIX, QueryOpts { limit: 1, cursor: None, descending: false });
            if any.await?.items.is_empty() {
                return Ok(None);
            }
            ListCursor::default()
        }
    };
    let limit = limit.max(1);
    let opts = QueryOpts { limit, cursor: None, descending: false };
    // `D#` items after the cursor (a sort key followed by NUL is the next one up).
    let d_from = at.d.as_ref().map_or_else(|| "D#".to_owned(), |d| format!("{d}\u{0}"));
    let d_page = table.query_range(pk, &d_from, "D$", opts.clone()).await?;
    let d_more = d_page.next_cursor.is_some();
    let mut ds: Vec<(String, Delivery, String)> = Vec::with_capacity(d_page.items.len());
    for item in d_page.items {
        let d: Delivery = item.parse()?;
        ds.push((format!("{}#{}", d.user_id, d.channel), d, item.key.sk));
    }
    // Batch entries from the cursor's batch on: at most `limit + 1` batches hold `limit`.
    let b_from = at.b.as_ref().map_or_else(|| keys::SEND_BATCH_PREFIX.to_owned(), |b| b.0.clone());
    let b_page = table.query_range(pk, &b_from, "B$", QueryOpts { limit: limit + 1, ..opts }).await?;
    let mut b_more = b_page.next_cursor.is_some();
    let mut bs: Vec<(String, Delivery, (String, usize))> = Vec::new();
    for item in b_page.items {
        let batch: SendBatch = item.parse()?;
        for (i, d) in batch.deliveries().into_iter().enumerate() {
            if at.b.as_ref().is_some_and(|(sk, at)| *sk == item.key.sk && i <= *at) {
                continue;
            }
            bs.push((format!("{}#{}", d.user_id, d.channel), d, (item.key.sk.clone(), i)));
        }
        if bs.len() > limit {
            b_more = true;
            break;
        }
    }
    let mut out = Vec::with_capacity(limit);
    let mut next = ListCursor { d: at.d, b: at.b };
    let (mut di, mut bi) = (ds.into_iter().peekable(), bs.into_iter().peekable());
    while out.len() < limit {
        let take_d = match (di.peek(), bi.peek()) {
            (Some(d), Some(b)) => d.0 <= b.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_d {
            if let Some((_, d, sk)) = di.next() {
                next.d = Some(sk);
                out.push(d);
            }
        } else if let Some((_, d, at)) = bi.next() {
            next.b = Some(at);
            out.push(d);
        }
    }
    let more = di.peek().is_some() || bi.peek().is_some() || d_more || b_more;
    Ok(Some((out, more.then(|| encode(&next)))))
}

/// What a dead-letter view says of a batch message: whom it was for and where its entries
/// stand (never their content).
pub async fn explain(table: &dyn Table, task: &SendBatchTask) -> (String, Option<SendBatch>) {
    let about = format!(
        "{} send batch {} of notification {} ({} deliveries)",
        task.channel,
        task.batch,
        task.notification_id,
        task.entries.len()
    );
    let key = match key_of(task) {
        Ok(key) => key,
        Err(e) => return (format!("{about}: {e}"), None),
    };
    match table.get(&key).await.map(|i| i.map(|i| i.parse::<SendBatch>())) {
        Ok(Some(Ok(b))) => {
            let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
            for e in &b.entries {
                *by_status.entry(e.status.as_str()).or_default() += 1;
            }
            let counts: Vec<String> = by_status.iter().map(|(s, n)| format!("{n} {s}")).collect();
            let last_error = b.entries.iter().rev().find_map(|e| e.last_error.clone()).unwrap_or_default();
            let attempts = b.entries.iter().map(|e| e.attempts).max().unwrap_or(0);
            let reason = format!(
                "{about}: batch {}, entries {}, up to {attempts} attempt(s), last error {last_error:?}",
                b.status.as_str(),
                counts.join(", "),
            );
            (reason, Some(b))
        }
        Ok(Some(Err(e))) => (format!("{about}: its batch record cannot be read ({e})"), None),
        Ok(None) => (format!("{about}: no batch record"), None),
        Err(e) => (format!("{about}: its batch record was not read ({e})"), None),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::notify::model::{ChannelMessage, NotificationRequest, NotificationStatus};

    fn notification() -> Notification {
        let request: NotificationRequest = serde_json::from_value(serde_json::json!({
            "recipients": {"segment": "all"}, "template_id": "promo", "category": "marketing", "channels": ["push"]
        }))
        .unwrap();
        Notification {
            notification_id: "n1".into(),
            status: NotificationStatus::Processing,
            priority: request.priority(),
            priority_lowered: None,
            request,
            body_hash: String::new(),
            created_at: String::new(),
            created_ms: 0,
            orchestrated: false,
            counted: true,
            last_page: None,
            user_triggered: false,
            verified_at: None,
            one_attempt: false,
            workflow: None,
        }
    }

    fn tasks(n: usize, body_bytes: usize) -> Vec<ChannelTask> {
        let t = TenantId::parse("shop-a").unwrap();
        (0..n)
            .rev()
            .map(|i| ChannelTask {
                tenant: t.clone(),
                notification_id: "n1".into(),
                user_id: format!("u{i:03}"),
                channel: Channel::Push,
                category: Category::Marketing,
                to: format!("u{i:03}"),
                subject: Some("Sale".into()),
                body: "x".repeat(body_bytes),
                html: None,
                headers: Vec::new(),
                accepted_ms: Some(0),
                priority: None,
                one_attempt: false,
                step: None,
                wake: false,
            })
            .collect()
    }

    fn message_bytes(b: &NewBatch) -> usize {
        serde_json::to_vec(&ChannelMessage::Batch(b.task.clone())).unwrap().len()
    }

    #[test]
    fn small_sends_pack_25_to_a_batch_in_user_order_with_deterministic_keys() {
        let t = TenantId::parse("shop-a").unwrap();
        let packed = pack(&t, &notification(), 3, 7, tasks(60, 100), "now");
        let sizes: Vec<usize> = packed.iter().map(|b| b.task.entries.len()).collect();
        assert_eq!(sizes, [25, 25, 10]);
        let keys: Vec<&str> = packed.iter().map(|b| b.key.sk.as_str()).collect();
        assert_eq!(keys, ["B#00000003#0007", "B#00000003#0008", "B#00000003#0009"]);
        let users: Vec<String> = packed.iter().flat_map(|b| b.item.entries.iter().map(|e| e.user_id.clone())).collect();
        let mut sorted = users.clone();
        sorted.sort();
        assert_eq!(users, sorted, "user order");
        for b in &packed {
            let members: Vec<&str> = b.item.entries.iter().map(|e| e.user_id.as_str()).collect();
            let sent: Vec<&str> = b.task.entries.iter().map(|s| s.user_id.as_str()).collect();
            assert_eq!(members, sent, "the item lists the message's members");
            assert!(b.item.entries.iter().all(|e| e.status == DeliveryStatus::Pending));
        }
    }

    #[test]
    fn large_sends_pack_fewer_and_every_message_fits_a_queue_message() {
        let t = TenantId::parse("shop-a").unwrap();
        let packed = pack(&t, &notification(), 0, 0, tasks(40, 30_000), "now");
        assert!(packed.len() > 2, "{} batches", packed.len());
        assert!(packed.iter().all(|b| b.task.entries.len() < MAX_BATCH));
        assert_eq!(packed.iter().map(|b| b.task.entries.len()).sum::<usize>(), 40);
        for b in &packed {
            assert!(message_bytes(b) <= crate::sizes::MAX_MESSAGE_BYTES, "{} bytes", message_bytes(b));
        }
        // The largest send that fits a batch on its own still makes a message under the limit.
        let mut big = tasks(1, 0);
        let room = crate::sizes::MAX_MESSAGE_BYTES - ENVELOPE_BYTES - 200;
        big[0].body = "x".repeat(room);
        assert!(fits(&big[0]));
        let one = pack(&t, &notification(), 0, 0, big.clone(), "now");
        assert!(message_bytes(&one[0]) <= crate::sizes::MAX_MESSAGE_BYTES);
        big[0].body = "x".repeat(crate::sizes::MAX_MESSAGE_BYTES);
        assert!(!fits(&big[0]), "refused at planning (too_large)");
    }

    #[test]
    fn a_batch_message_parses_as_a_batch_and_a_task_as_a_task() {
        let t = TenantId::parse("shop-a").unwrap();
        let packed = pack(&t, &notification(), 0, 0, tasks(2, 10), "now");
        let body = serde_json::to_string(&ChannelMessage::Batch(packed[0].task.clone())).unwrap();
        assert!(matches!(serde_json::from_str::<ChannelMessage>(&body).unwrap(), ChannelMessage::Batch(_)));
        let task = serde_json::to_string(&tasks(1, 10)[0]).unwrap();
        assert!(matches!(serde_json::from_str::<ChannelMessage>(&task).unwrap(), ChannelMessage::Task(_)));
        let bad = serde_json::from_str::<ChannelMessage>(r#"{"batch": "B#1", "tenant": "shop-a"}"#);
        assert!(bad.unwrap_err().to_string().contains("missing field"));
        let mut wrong = packed[0].task.clone();
        wrong.batch = "D#u1#push".into();
        assert!(key_of(&wrong).is_err(), "a batch message names a batch item only");
    }
}
