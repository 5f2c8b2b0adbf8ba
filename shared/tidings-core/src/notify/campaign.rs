//! Campaigns: a notification to a segment (a tag), expanded page by page with a cursor over the
//! user ids, up to 1,000 users a page task, never loaded whole (docs/delivery.md, "Campaigns").
//!
//! - Each page is one request-queue task `{tenant, notification_id, page, cursor}`. A page reads
//!   its users from the tag index with the cursor, and before planning them puts the *next*
//!   page's item (`P#{page+1}`, with the next cursor) by a conditional put. That item is an
//!   outbox entry: its insert reaches the relay through the change stream, which queues the
//!   task. So the next page is queued exactly when the put succeeds, whatever crashes, and a
//!   retried or redriven page cannot queue its successor twice (no duplicate chains).
//! - Pages run in parallel (as many as there are orchestrator workers); memory holds one page.
//! - A page's deliveries are created by conditional puts (one key per campaign, user and
//!   channel), packed into transactions of up to 100 writes with the page's progress counters
//!   ([`PageWriter`]); a page done once is marked (`C#{page}#done`), and a task for a marked page
//!   does nothing.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::model::{DeliveryStatus, Notification, RequestMessage};
use super::progress::{self, PAGE_ATTR};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::ports::table::MAX_TRANSACTION_WRITES;
use crate::ports::{Attrs, Cond, Item, Key, Page, QueryOpts, StoreError, Table, Update, Updating, Write, attrs_of};

/// A queued page of a campaign: the item whose insert the relay turns into a request task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CampaignPage {
    pub tenant: TenantId,
    pub notification_id: String,
    pub page: u64,
    pub cursor: String,
    /// The request queue of the campaign's priority.
    pub queue: String,
    pub created_at: String,
}

/// The request task of a page item, for the relay.
pub fn page_task(attrs: &Attrs) -> Option<(String, RequestMessage)> {
    let page: CampaignPage = serde_json::from_value(serde_json::Value::Object(attrs.clone())).ok()?;
    let message = RequestMessage {
        tenant: page.tenant,
        notification_id: page.notification_id,
        cursor: Some(page.cursor),
        page: page.page,
    };
    Some((page.queue, message))
}

/// Queues page `page` of the campaign, starting at `cursor`: a conditional put of its item (the
/// relay queues it). Idempotent.
pub async fn queue_page(deps: &Deps, t: &TenantId, n: &Notification, page: u64, cursor: String) -> CoreResult<()> {
    let item = CampaignPage {
        tenant: t.clone(),
        notification_id: n.notification_id.clone(),
        page,
        cursor,
        queue: crate::lanes::Lane::requests(n.priority).name().to_owned(),
        created_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let key = keys::campaign_page(t, &n.notification_id, page);
    match deps.table.put(Item::new(key, attrs_of(&item)?), Cond::NotExists).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `read` over `items` a thousand at a time (a page's reads, within the port's bulk bounds),
/// its answers in the items' order.
async fn in_chunks<'a, T, R, F, Fut>(items: &'a [T], read: F) -> Result<Vec<R>, StoreError>
where
    F: Fn(&'a [T]) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<R>, StoreError>>,
{
    let mut got = Vec::with_capacity(items.len());
    for chunk in items.chunks(1000) {
        got.extend(read(chunk).await?);
    }
    Ok(got)
}

/// The marker of a finished page. Its `expanded` and `pages` add up with the counters.
fn done_key(t: &TenantId, notification_id: &str, page: u64) -> Key {
    Key::new(keys::notification_pk(t, notification_id), format!("{}{page:08}#done", keys::COUNTER_PREFIX))
}

pub async fn page_done(deps: &Deps, t: &TenantId, notification_id: &str, page: u64) -> CoreResult<bool> {
    Ok(deps.table.get(&done_key(t, notification_id, page)).await?.is_some())
}

/// How many deliveries of a page its counters hold as queued (`pending` or `sending`), over
/// its shards: one query of at most a few items.
pub async fn page_queued(deps: &Deps, t: &TenantId, notification_id: &str, page: u64) -> CoreResult<i64> {
    let pk = keys::notification_pk(t, notification_id);
    let prefix = format!("{}{page:08}#", keys::COUNTER_PREFIX);
    let got = deps.table.query(&pk, &prefix, QueryOpts { limit: 100, cursor: None, descending: false }).await?;
    Ok(got.items.iter().filter_map(|i| i.i64(progress::bucket(DeliveryStatus::Pending))).sum())
}

/// Marks a page finished, with how many recipients it expanded (once).
pub async fn finish_page(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
    page: u64,
    expanded: usize,
) -> CoreResult<()> {
    let mut attrs = Attrs::new();
    attrs.insert("expanded".into(), (expanded as u64).into());
    attrs.insert("pages".into(), 1.into());
    attrs.insert("created_ms".into(), deps.clock.now_ms().into());
    match deps.table.put(Item::new(done_key(t, notification_id, page), attrs), Cond::NotExists).await {
        Ok(()) | Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Records the last page of a campaign on its notification (the status is `completed` once
/// every page up to it is done and nothing is queued).
///
/// A campaign (a counted notification) is then put in the open list whose completion the tick
/// tells the shop of ([`super::completion`]).
pub async fn set_last_page(deps: &Deps, t: &TenantId, notification_id: &str, page: u64) -> CoreResult<()> {
    let n = deps
        .table
        .update(
            &keys::notification(t, notification_id),
            vec![Update::set("last_page", page), Update::set("orchestrated", true)],
            Cond::Exists,
        )
        .await?;
    if n.attrs.get("counted").and_then(|v| v.as_bool()) == Some(true) {
        super::completion::watch(deps, t, notification_id).await?;
    }
    Ok(())
}

/// One delivery creation held back by [`PageWriter`]: its writes (the delivery's put, plus the
/// inbox writes of an in-app delivery) and what it counts as.
struct Unit {
    writes: Vec<Write>,
    delivery: Key,
    user_id: String,
    bucket: &'static str,
    /// How many of `writes`, first, are gates (a frequency cap, a per-number SMS limit): when
    /// one of them fails, the delivery is created `suppressed` (with that gate's reason) instead.
    gates: usize,
    /// The delivery as created when a gate fails.
    suppressed: Option<Item>,
}

impl Unit {
    /// Hashes of the items its gates update that another unit may update too: a phone number's
    /// counters (a frequency cap is the user's own).
    fn gate_hashes<'a>(&'a self, hasher: &'a impl BuildHasher) -> impl Iterator<Item = u64> + 'a {
        self.writes
            .iter()
            .take(self.gates)
            .filter(|w| crate::notify::abuse::is_counter(w.key()))
            .map(move |w| hasher.hash_one(w.key()))
    }
}

/// A table for the per-user planning code of one page: it holds back the creation of the
/// page's deliveries (a conditional put `NotExists` on a delivery key of this notification,
/// alone or in a transaction) and answers `Ok`; everything else goes straight through.
/// [`PageWriter::flush`] then writes them in large transactions together with the page's
/// progress counters, and says which deliveries existed already and are past `pending` (their
/// tasks must not be queued again). A few large transactions instead of a thousand small
/// ones: the store is what limits a campaign's speed.
pub struct PageWriter {
    inner: Arc<dyn Table>,
    t: TenantId,
    notification_id: String,
    pk: String,
    page: u64,
    /// When the page was expanded (its counters' `created_ms`).
    now_ms: i64,
    units: Mutex<Vec<Unit>>,
    /// Items read at once before the page is planned ([`PageWriter::prefetch`]): `get` answers
    /// them from here (`None`: known absent).
    prefetched: Mutex<std::collections::HashMap<Key, Option<Item>>>,
    /// First pages of queries read at once ([`PageWriter::prefetch_queries`]), by partition,
    /// prefix and limit: the first `query` asking one is answered from here.
    prefetched_queries: Mutex<std::collections::HashMap<(String, String, usize), Page>>,
}

impl PageWriter {
    pub fn new(inner: Arc<dyn Table>, t: &TenantId, notification_id: &str, page: u64, now_ms: i64) -> Self {
        Self {
            inner,
            t: t.clone(),
            notification_id: notification_id.to_owned(),
            pk: keys::notification_pk(t, notification_id),
            page,
            now_ms,
            units: Mutex::new(Vec::new()),
            prefetched: Mutex::new(Default::default()),
            prefetched_queries: Mutex::new(Default::default()),
        }
    }

    /// Reads `keys` at once (one `get_many`), for the planning code's `get`s: a page's
    /// preferences, suppressions, frequency counters and existing deliveries cost a few round
    /// trips instead of four per user. They are read when the page starts, as they would be
    /// one by one a few milliseconds later; the caps are checked again by the writes'
    /// conditions.
    pub async fn prefetch(&self, keys: Vec<Key>) -> Result<(), StoreError> {
        let got = in_chunks(&keys, |chunk| self.inner.get_many(chunk)).await?;
        let mut map = self.prefetched.lock().unwrap_or_else(|p| p.into_inner());
        map.reserve(keys.len());
        for (key, item) in keys.into_iter().zip(got) {
            map.insert(key, item);
        }
        Ok(())
    }

    /// Runs `queries` at once (one `query_many`: the users' devices of a page in one read
    /// instead of one each), for the planning code's first `query` of each with this `limit`.
    pub async fn prefetch_queries(&self, queries: Vec<(String, String)>, limit: usize) -> Result<(), StoreError> {
        let got = in_chunks(&queries, |chunk| self.inner.query_many(chunk, limit)).await?;
        let mut map = self.prefetched_queries.lock().unwrap_or_else(|p| p.into_inner());
        map.reserve(queries.len());
        for ((pk, prefix), page) in queries.into_iter().zip(got) {
            map.insert((pk, prefix, limit), page);
        }
        Ok(())
    }

    fn prefetched(&self, key: &Key) -> Option<Option<Item>> {
        self.prefetched.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    fn is_creation(&self, write: &Write) -> bool {
        matches!(write, Write::Put { item, cond: Cond::NotExists }
            if item.key.pk == self.pk && item.key.sk.starts_with("D#"))
    }

    /// Holds back a creation; `writes` holds exactly one delivery creation, after `gates`
    /// gate writes.
    fn hold(&self, writes: Vec<Write>, gates: usize) -> Result<(), StoreError> {
        let unit = self.unit_with_gates(writes, gates)?;
        self.units.lock().unwrap_or_else(|p| p.into_inner()).push(unit);
        Ok(())
    }

    /// The unit of writes holding one delivery creation (the page is noted on the delivery).
    fn unit_of(&self, writes: Vec<Write>) -> Result<Unit, StoreError> {
        self.unit_with_gates(writes, 0)
    }

    fn unit_with_gates(&self, mut writes: Vec<Write>, gates: usize) -> Result<Unit, StoreError> {
        let mut found = None;
        let mut suppressed = None;
        for w in &mut writes {
            if self.is_creation(w)
                && let Write::Put { item, .. } = w
            {
                item.attrs.insert(PAGE_ATTR.into(), self.page.into());
                let status: DeliveryStatus = item
                    .attrs
                    .get("status")
                    .cloned()
                    .and_then(|s| serde_json::from_value(s).ok())
                    .ok_or_else(|| StoreError::Corrupt("delivery without a status".into()))?;
                let user_id = item.str("user_id").unwrap_or_default().to_owned();
                found = Some((item.key.clone(), user_id, progress::bucket(status)));
                if gates > 0 {
                    let mut alt = item.clone();
                    alt.attrs.insert("status".into(), DeliveryStatus::Suppressed.as_str().into());
                    alt.attrs.remove("sent_at");
                    alt.attrs.insert("attempts".into(), 0.into());
                    suppressed = Some(alt);
                }
            }
        }
        let Some((delivery, user_id, bucket)) = found else {
            return Err(StoreError::Invalid("no delivery creation to hold".into()));
        };
        Ok(Unit { writes, delivery, user_id, bucket, gates, suppressed })
    }

    /// Writes what was held back. Returns the deliveries that existed already and are no longer
    /// `pending` (not to be queued again).
    pub async fn flush(&self) -> Result<HashSet<Key>, StoreError> {
        let now_ms = self.now_ms;
        let units = std::mem::take(&mut *self.units.lock().unwrap_or_else(|p| p.into_inner()));
        let mut skip = HashSet::new();
        // Room for the counters: at most one update per shard.
        let room = MAX_TRANSACTION_WRITES - progress::COUNTER_SHARDS as usize;
        // And bytes (in-app messages are up to 16 KiB each): DynamoDB's 4 MB a transaction,
        // less room for the counters.
        let room_bytes = crate::sizes::MAX_TRANSACTION_BYTES - 64 * 1024;
        let mut chunk: Vec<Unit> = Vec::new();
        let mut size = 0;
        let mut bytes = 0;
        // The shared gates the chunk writes (hashed): a transaction may name an item once, and
        // two units can share a gate (two users with one phone number share its counters). The
        // other writes are the unit's own (its delivery, its cap, its inbox message).
        let hasher = std::collections::hash_map::RandomState::new();
        let mut gates: HashSet<u64> = HashSet::new();
        for unit in units {
            let shares = unit.gate_hashes(&hasher).any(|h| gates.contains(&h));
            let unit_bytes: usize = unit.writes.iter().map(crate::sizes::write_size).sum();
            if (size + unit.writes.len() > room || bytes + unit_bytes > room_bytes || shares) && !chunk.is_empty() {
                self.write_chunk(std::mem::take(&mut chunk), now_ms, &mut skip).await?;
                size = 0;
                bytes = 0;
                gates.clear();
            }
            size += unit.writes.len();
            bytes += unit_bytes;
            gates.extend(unit.gate_hashes(&hasher));
            chunk.push(unit);
        }
        if !chunk.is_empty() {
            self.write_chunk(chunk, now_ms, &mut skip).await?;
        }
        Ok(skip)
    }

    fn counters(&self, units: &[Unit], now_ms: i64) -> Vec<Write> {
        let changes = units
            .iter()
            .map(|u| (progress::counter_key(&self.t, &self.notification_id, self.page, &u.user_id), u.bucket, 1));
        progress::counter_writes(changes, now_ms)
    }

    async fn write_chunk(&self, units: Vec<Unit>, now_ms: i64, skip: &mut HashSet<Key>) -> Result<(), StoreError> {
        let mut writes: Vec<Write> = units.iter().flat_map(|u| u.writes.iter().cloned()).collect();
        writes.extend(self.counters(&units, now_ms));
        match progress::transact_retrying(self.inner.as_ref(), writes).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed { .. }) => {}
            Err(e) => return Err(e),
        }
        // Some exist already (a retried or redriven page), or a cap was reached meanwhile:
        // one by one.
        for mut unit in units {
            let mut writes = unit.writes.clone();
            writes.extend(self.counters(std::slice::from_ref(&unit), now_ms));
            let mut result = progress::transact_retrying(self.inner.as_ref(), writes).await;
            if let (Err(StoreError::ConditionFailed { index }), Some(alt)) = (&result, &unit.suppressed)
                && *index < unit.gates
                && let Some(gate) = unit.writes.get(*index)
            {
                // A gate is full: the delivery is created `suppressed`, and not queued.
                skip.insert(unit.delivery.clone());
                unit.bucket = progress::bucket(DeliveryStatus::Suppressed);
                let mut alt = alt.clone();
                alt.attrs.insert("reason".into(), super::policy::gate_reason(gate).as_str().into());
                let mut writes = vec![Write::Put { item: alt, cond: Cond::NotExists }];
                writes.extend(self.counters(std::slice::from_ref(&unit), now_ms));
                result = progress::transact_retrying(self.inner.as_ref(), writes).await;
            }
            match result {
                Ok(()) => {}
                Err(StoreError::ConditionFailed { .. }) => {
                    let pending = match self.inner.get(&unit.delivery).await? {
                        Some(item) => item.str("status") == Some(DeliveryStatus::Pending.as_str()),
                        None => false,
                    };
                    if !pending {
                        skip.insert(unit.delivery);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Table for PageWriter {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        match self.prefetched(key) {
            Some(item) => Ok(item),
            None => self.inner.get(key).await,
        }
    }

    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        let write = Write::Put { item, cond };
        if self.is_creation(&write) {
            return self.hold(vec![write], 0);
        }
        let Write::Put { item, cond } = write else { return Err(StoreError::Invalid("not a put".into())) };
        self.inner.put(item, cond).await
    }

    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        self.inner.update(key, updates, cond).await
    }

    async fn update_each(&self, updates: Vec<Updating>) -> Result<Vec<Result<Item, StoreError>>, StoreError> {
        self.inner.update_each(updates).await
    }

    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        self.inner.delete(key, cond).await
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        if writes.iter().filter(|w| self.is_creation(w)).count() != 1 {
            return self.inner.transact(writes).await;
        }
        let room = MAX_TRANSACTION_WRITES - progress::COUNTER_SHARDS as usize;
        // Gates (a frequency cap: conditional updates before the creation) on prefetched items
        // are decided on what was read: a condition that fails there fails now (counts only
        // grow), one that holds is held back with the creation and checked again when written.
        let creation_at = writes.iter().position(|w| self.is_creation(w)).unwrap_or(0);
        let mut gates = 0;
        for (index, w) in writes.iter().enumerate().take(creation_at) {
            let Write::Update { key, cond, .. } = w else { break };
            let Some(snapshot) = self.prefetched(key) else { break };
            if !cond.holds(snapshot.as_ref().map(|i| &i.attrs)) {
                return Err(StoreError::ConditionFailed { index });
            }
            gates = index + 1;
        }
        // Held back only when no other write can fail in a way the caller must hear of now
        // (an inbox message is created with its delivery, so it exists only if that does).
        let holdable = writes.iter().enumerate().all(|(i, w)| {
            i < gates
                || self.is_creation(w)
                || matches!(
                    w,
                    Write::Update { cond: Cond::Always, .. } | Write::Put { cond: Cond::Always | Cond::NotExists, .. }
                )
        });
        if holdable && writes.len() <= room {
            return self.hold(writes, gates);
        }
        // Conditions whose answer the caller needs now (a frequency cap): written at once,
        // with the delivery's counter in the same transaction, after the caller's writes (so a
        // failed condition names the same index).
        let unit = self.unit_of(writes)?;
        let mut writes = unit.writes.clone();
        if writes.len() < MAX_TRANSACTION_WRITES {
            writes.extend(self.counters(std::slice::from_ref(&unit), self.now_ms));
        }
        progress::transact_retrying(self.inner.as_ref(), writes).await
    }

    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        if opts.cursor.is_none() && !opts.descending {
            let found = self.prefetched_queries.lock().unwrap_or_else(|p| p.into_inner()).remove(&(
                pk.to_owned(),
                sk_prefix.to_owned(),
                opts.limit,
            ));
            if let Some(page) = found {
                return Ok(page);
            }
        }
        self.inner.query(pk, sk_prefix, opts).await
    }

    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        self.inner.query_range(pk, from, to, opts).await
    }
}

/// How long a channel worker may act on a campaign's status read earlier: a cancelled
/// campaign stops within this, and a million sends do not cost a million reads.
const STATUS_TTL: std::time::Duration = std::time::Duration::from_secs(1);

type StatusCache = Mutex<std::collections::HashMap<String, (std::time::Instant, super::model::NotificationStatus)>>;

fn status_cache() -> &'static StatusCache {
    static CACHE: std::sync::OnceLock<StatusCache> = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A notification's status, as the channel worker checks it before each send: read every
/// time for a `user_ids` notification, at most once per [`STATUS_TTL`] per process for a
/// campaign. `None` when it does not exist.
pub async fn status(
    deps: &Deps,
    t: &TenantId,
    notification_id: &str,
) -> CoreResult<Option<super::model::NotificationStatus>> {
    let cache_key = format!("{t}/{notification_id}");
    if let Some((at, status)) = status_cache().lock().unwrap_or_else(|p| p.into_inner()).get(&cache_key)
        && at.elapsed() < STATUS_TTL
    {
        return Ok(Some(*status));
    }
    let Some(n) = super::api::load(deps, t, notification_id).await? else { return Ok(None) };
    if n.segment().is_some() {
        let mut cache = status_cache().lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.retain(|_, (at, _)| at.elapsed() < STATUS_TTL);
        }
        cache.insert(cache_key, (std::time::Instant::now(), n.status));
    }
    Ok(Some(n.status))
}
