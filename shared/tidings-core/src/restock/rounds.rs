//! Restock rounds (docs/restock.md, "Rounds"): a SKU's stock going from 0 to more opens a round
//! (the inventory increments `restock_round` in the same transaction); `batch_no` comes from
//! `(sku, round)` only, so the stream, a stock event and the scan all land on the same notice
//! keys and each user is notified once per round.
//!
//! A round is sent in **waves** paced by stock: a wave may notify `k × available` users (oldest
//! first), stock is read again before every batch of a wave, and a sold-out SKU stops the wave
//! and leaves the rest WAITING. Each notice is one transaction: the notice-log put
//! (`NotExists` on `(sku, user, batch_no)`: the deduplication, which is also the lock between
//! instances), the round's count (conditioned on the wave's quota), the subscription leaving
//! WAITING, and the SKU's entry in the user's merge window. A crash anywhere leaves either all
//! of it or none of it.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::info;

use super::keys;
use super::merge;
use super::model::{
    Notice, NoticeStatus, ROUND_EVENT, RestockRound, RoundJob, STOCK_IN_EVENT, StockEvent, StockLaneMessage,
    SubscriptionStatus, WaitingEntry,
};
use super::subscriptions::{expire_old, leave_waiting_writes, now_text};
use super::waiting::waiting_buckets;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::inventory::{self, AdjustmentRequest, AdjustmentSource, StockView};
use crate::outcome::Outcome;
use crate::ports::{ChangeRecord, Cond, Item, OutMessage, QueryOpts, StoreError, Update, Write, attrs_of};
use crate::tasks::{Step, Task};
use crate::workflows::digest;

/// The queue of upstream stock events and of round jobs.
pub const STOCK_EVENTS_QUEUE: &str = "stock-events";

/// The batch number of a round: derived from `(sku, round)` only, never from the trigger.
pub fn batch_no(sku_id: &str, round: i64) -> String {
    format!("{sku_id}.r{round}")
}

/// Stream consumer: stock items whose `restock_round` grew become round jobs. Called by the
/// relay with every batch (other records are ignored).
pub async fn on_stock_changes(deps: &Deps, records: &[ChangeRecord]) -> CoreResult<()> {
    let mut jobs = Vec::new();
    for r in records {
        if r.key.sk != inventory::keys::STOCK_SK {
            continue;
        }
        let Some(new) = &r.new else { continue };
        let round_of = |a: &crate::ports::Attrs| a.get("restock_round").and_then(serde_json::Value::as_i64);
        let new_round = round_of(new).unwrap_or(0);
        let old_round = r.old.as_ref().and_then(round_of).unwrap_or(0);
        if new_round <= old_round {
            continue;
        }
        let Some((tenant, rest)) = crate::keys::tenant_of(&r.key.pk) else { continue };
        let Some(sku) = rest.strip_prefix("SKU#") else { continue };
        let job = RoundJob { event: ROUND_EVENT.into(), tenant, sku_id: sku.to_owned(), round: new_round, wave: None };
        jobs.push(OutMessage::new(serde_json::to_string(&job)?));
    }
    if !jobs.is_empty() {
        deps.queues.send_batch(STOCK_EVENTS_QUEUE, jobs).await?;
    }
    Ok(())
}

/// The answer to a stock event.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StockEventAccepted {
    pub sku_id: String,
    pub idempotency_key: String,
    pub available: i64,
    pub restock_round: i64,
}

/// Applies an upstream `stock.in` as an inventory adjustment, once per event (the idempotency
/// key is a hash of the tenant and the event's required `eventId`). A 0 → more change opens the round through
/// the stream, like any other adjustment.
pub async fn apply_stock_event(deps: &Deps, t: &TenantId, ev: &StockEvent) -> CoreResult<StockEventAccepted> {
    if ev.event != STOCK_IN_EVENT {
        return Err(CoreError::invalid("event", "only stock.in is accepted"));
    }
    check_id("skuId", &ev.sku_id)?;
    if ev.qty <= 0 {
        return Err(CoreError::invalid("qty", "must be a positive number of units"));
    }
    AdjustmentSource::parse(&ev.source)?;
    // Without the upstream's id, a repeat of this event and a second genuine arrival of the
    // same quantity look alike: deduplicating by content would drop the second delivery of
    // stock for good, not deduplicating would count a redelivery twice. So the id is required.
    let Some(id) = ev.event_id.as_deref() else {
        return Err(CoreError::invalid(
            "eventId",
            "required: the upstream's own id of this event (a repeat of it is applied once, another arrival of the same quantity is applied again)",
        ));
    };
    check_id("eventId", id)?;
    let basis = format!("{t}\nid\n{id}");
    let key = format!("stock-in-{}", &hex::encode(Sha256::digest(basis.as_bytes()))[..40]);
    let req = AdjustmentRequest::new(ev.qty, &ev.source, &key);
    let view = inventory::adjust(deps, t, &ev.sku_id, &req).await?;
    Ok(StockEventAccepted {
        sku_id: view.sku_id,
        idempotency_key: key,
        available: view.available,
        restock_round: view.restock_round,
    })
}

/// The stock-events lane's step: an upstream `stock.in` (with `tenant`), or a round job. A
/// stock event that names no SKU of ours, or conflicts with one, can never apply: rejected.
pub struct StockEventStep;

impl Step for StockEventStep {
    type Body = StockLaneMessage;
    const WHAT: &'static str = "stock event";
    async fn run(deps: &Deps, task: &Task<StockLaneMessage>) -> CoreResult<Outcome> {
        let result = match &task.body {
            StockLaneMessage::Round(job) => {
                run_round(deps, &job.tenant, &job.sku_id, job.round, job.wave).await.map(|_| ())
            }
            StockLaneMessage::StockIn { tenant, event } => apply_stock_event(deps, tenant, event).await.map(|_| ()),
        };
        match result {
            Ok(()) => Ok(Outcome::Done),
            Err(e @ (CoreError::NotFound { .. } | CoreError::Conflict { .. })) => Ok(Outcome::Reject(e.to_string())),
            Err(e) => Err(e),
        }
    }
}

/// What one run of a round did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveReport {
    pub batch_no: String,
    pub wave: u32,
    /// Notices this run claimed.
    pub claimed: u64,
    /// Batches it sent in.
    pub batches: u64,
    /// Why it stopped: `quota`, `no_waiters`, `sold_out`, `superseded`, `not_due`, `no_sku`.
    pub stopped: String,
}

enum Claim {
    Claimed,
    /// Someone (another instance, the event or the scan) claimed it for this batch.
    Already,
    /// The subscription left WAITING meanwhile.
    NotWaiting,
    /// The wave's quota is used up.
    QuotaReached,
}

fn report(batch_no: &str, wave: u32, stopped: &str) -> WaveReport {
    WaveReport { batch_no: batch_no.to_owned(), wave, stopped: stopped.into(), ..Default::default() }
}

/// How many notices a wave may send for `available` units.
fn wave_quota(deps: &Deps, available: i64) -> i64 {
    match deps.config.restock.wave_factor {
        0 => i64::MAX / 2,
        k => k.saturating_mul(available.max(0)),
    }
}

async fn read_round(deps: &Deps, t: &TenantId, sku: &str, round: i64) -> CoreResult<Option<RestockRound>> {
    Ok(deps.table.get(&keys::round(t, sku, round)).await?.map(|i| i.parse()).transpose()?)
}

/// Runs (a wave of) a round. `wave`: a given wave (from its timer); `None`: start the first, or
/// continue one that stalled, or start the next if its time has come (stream, event, scan).
pub async fn run_round(deps: &Deps, t: &TenantId, sku: &str, round: i64, wave: Option<u32>) -> CoreResult<WaveReport> {
    let batch = batch_no(sku, round);
    let Some(stock) = inventory::stock_counters(deps, t, sku).await? else { return Ok(report(&batch, 0, "no_sku")) };
    if stock.restock_round != round {
        // A newer round took over (its batch_no notifies whoever is still WAITING).
        return Ok(report(&batch, 0, "superseded"));
    }
    let now_ms = deps.clock.now_ms();
    let current = read_round(deps, t, sku, round).await?;
    let n = match (&current, wave) {
        (None, _) => 1,
        (Some(r), Some(w)) if w < r.wave => return Ok(report(&batch, w, "not_due")),
        (Some(r), Some(w)) if w == r.wave => return continue_wave(deps, t, sku, round, r.wave).await,
        (Some(r), Some(_)) => r.wave + 1,
        // A wave with quota left (stalled, or running elsewhere): join it; claims are exclusive
        // and the quota is a condition, so joining never sends more.
        (Some(r), None) if quota_left(deps, t, sku, round, r).await? => {
            return continue_wave(deps, t, sku, round, r.wave).await;
        }
        (Some(r), None) if now_ms < r.next_wave_ms => return Ok(report(&batch, r.wave, "not_due")),
        (Some(r), None) => r.wave + 1,
    };
    start_wave(deps, t, sku, round, n, &stock).await
}

async fn start_wave(
    deps: &Deps,
    t: &TenantId,
    sku: &str,
    round: i64,
    n: u32,
    stock: &StockView,
) -> CoreResult<WaveReport> {
    let batch = batch_no(sku, round);
    if stock.available <= 0 {
        return Ok(report(&batch, n, "sold_out"));
    }
    if !has_waiters(deps, t, sku).await? {
        return Ok(report(&batch, n, "no_waiters"));
    }
    let notified = read_round(deps, t, sku, round).await?.map_or(0, |r| r.notified);
    let target = notified.saturating_add(wave_quota(deps, stock.available));
    let cond = if n == 1 { Cond::AttrNotExists("wave".into()) } else { Cond::eq("wave", i64::from(n) - 1) };
    let updates = vec![
        Update::SetIfAbsent("sku_id".into(), json!(sku)),
        Update::SetIfAbsent("round".into(), json!(round)),
        Update::SetIfAbsent("batch_no".into(), json!(batch)),
        Update::SetIfAbsent("notified".into(), json!(0)),
        Update::set("wave", i64::from(n)),
        Update::set("target", target),
        Update::set("wave_started_ms", deps.clock.now_ms()),
    ];
    match deps.table.update(&keys::round(t, sku, round), updates, cond).await {
        Ok(_) => info!(tenant = %t, sku, round, wave = n, target, available = stock.available, "restock wave started"),
        // Started by another instance: join it.
        Err(StoreError::ConditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let wave = read_round(deps, t, sku, round).await?.map_or(n, |r| r.wave);
    continue_wave(deps, t, sku, round, wave).await
}

async fn has_waiters(deps: &Deps, t: &TenantId, sku: &str) -> CoreResult<bool> {
    for market in waiting_buckets(deps, t, sku).await? {
        let pk = keys::waiting_pk(t, sku, market.as_deref());
        let page = deps.table.query(&pk, "", QueryOpts { limit: 1, cursor: None, descending: false }).await?;
        if !page.items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The wave of a round being sent: whose, of which SKU, which round and wave.
#[derive(Clone, Copy)]
struct WaveAt<'a> {
    deps: &'a Deps,
    t: &'a TenantId,
    sku: &'a str,
    round: i64,
    wave: u32,
}

/// The counters of one WAITING index in a round's item: those of no market (`wave`, `target`,
/// `notified`, as before markets), or a market's (`wave_US`, `target_US`, `notified_US`), whose
/// target is set when a wave first meets the market (docs/restock.md, "Markets").
struct Bucket<'a> {
    market: Option<&'a str>,
}

impl Bucket<'_> {
    fn name(&self, base: &str) -> String {
        match self.market {
            None => base.to_owned(),
            Some(m) => format!("{base}_{m}"),
        }
    }

    fn of(&self, item: &Item, base: &str) -> i64 {
        item.attrs.get(&self.name(base)).and_then(serde_json::Value::as_i64).unwrap_or(0)
    }

    /// The units of `stock` this index's subscribers can buy: every location's for no market, else
    /// those of the locations serving the market.
    fn available(&self, stock: &StockView, locations: &[inventory::locations::Location]) -> i64 {
        let Some(m) = self.market else { return stock.available };
        let serves = |id: &str| locations.iter().any(|l| l.location_id == id && l.serves(Some(m)));
        if stock.locations.is_empty() {
            return if serves(inventory::model::DEFAULT_LOCATION) { stock.available } else { 0 };
        }
        stock.locations.iter().filter(|l| serves(&l.location_id)).map(|l| l.available).sum()
    }
}

/// Whether the round's current wave still has quota in any of its indexes.
async fn quota_left(deps: &Deps, t: &TenantId, sku: &str, round: i64, r: &RestockRound) -> CoreResult<bool> {
    if r.notified < r.target {
        return Ok(true);
    }
    let Some(item) = deps.table.get(&keys::round(t, sku, round)).await? else { return Ok(false) };
    for market in waiting_buckets(deps, t, sku).await?.iter().flatten() {
        let b = Bucket { market: Some(market) };
        if b.of(&item, "wave") == i64::from(r.wave) && b.of(&item, "notified") < b.of(&item, "target") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A market's target for `wave`, set once when the wave first meets it: what it had notified
/// plus the quota of the units it can buy. `None`: the wave moved on meanwhile.
async fn market_target(at: &WaveAt<'_>, b: &Bucket<'_>, available: i64) -> CoreResult<Option<(i64, i64)>> {
    let WaveAt { deps, t, sku, round, wave } = *at;
    let key = keys::round(t, sku, round);
    for _ in 0..5 {
        let Some(item) = deps.table.get(&key).await? else { return Ok(None) };
        if item.attrs.get("wave").and_then(serde_json::Value::as_i64) != Some(i64::from(wave)) {
            return Ok(None);
        }
        if b.of(&item, "wave") == i64::from(wave) {
            return Ok(Some((b.of(&item, "target"), b.of(&item, "notified"))));
        }
        let notified = b.of(&item, "notified");
        let target = notified.saturating_add(wave_quota(deps, available));
        let updates = vec![
            Update::set(&b.name("wave"), i64::from(wave)),
            Update::set(&b.name("target"), target),
            Update::SetIfAbsent(b.name("notified"), json!(0)),
        ];
        let cond = Cond::And(vec![
            Cond::eq("wave", i64::from(wave)),
            Cond::Or(vec![
                Cond::AttrNotExists(b.name("wave")),
                Cond::Cmp(b.name("wave"), crate::ports::CmpOp::Lt, json!(wave)),
            ]),
        ]);
        match deps.table.update(&key, updates, cond).await {
            Ok(_) => {
                info!(tenant = %t, sku, round, wave, market = b.market, target, available, "restock wave met a market");
                return Ok(Some((target, notified)));
            }
            Err(StoreError::ConditionFailed { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// Claims WAITING subscribers, oldest first, batch by batch, in each of the SKU's WAITING
/// indexes (no market first, then each market's), until the index's quota is used, nobody waits
/// in it, or the units its subscribers can buy sell out. Memory holds one page.
async fn continue_wave(deps: &Deps, t: &TenantId, sku: &str, round: i64, wave: u32) -> CoreResult<WaveReport> {
    let batch = batch_no(sku, round);
    let mut out = report(&batch, wave, "no_waiters");
    let locations = inventory::locations::all(deps, t).await?;
    let (mut quota, mut sold_out) = (false, false);
    let at = WaveAt { deps, t, sku, round, wave };
    for market in waiting_buckets(deps, t, sku).await? {
        let b = Bucket { market: market.as_deref() };
        match walk(&at, &b, &locations, &mut out).await? {
            Walked::Quota => quota = true,
            Walked::SoldOut => sold_out = true,
            Walked::NoWaiters => {}
            Walked::Stopped(why) => {
                out.stopped = why.into();
                return Ok(out);
            }
        }
    }
    if quota {
        out.stopped = "quota".into();
        schedule_next_wave(deps, t, sku, round, wave).await?;
    } else if sold_out {
        out.stopped = "sold_out".into();
    }
    Ok(out)
}

/// How the walk of one WAITING index ended.
enum Walked {
    /// Its quota is used: more may wait, for the next wave.
    Quota,
    SoldOut,
    NoWaiters,
    /// The whole wave stops: `superseded`, `not_due`.
    Stopped(&'static str),
}

async fn walk(
    at: &WaveAt<'_>,
    b: &Bucket<'_>,
    locations: &[inventory::locations::Location],
    out: &mut WaveReport,
) -> CoreResult<Walked> {
    let WaveAt { deps, t, sku, round, wave } = *at;
    let cfg = &deps.config.restock;
    let mut cursor: Option<String> = None;
    loop {
        let Some(r) = read_round(deps, t, sku, round).await? else { return Ok(Walked::NoWaiters) };
        if r.wave != wave {
            return Ok(Walked::Stopped("not_due"));
        }
        if b.market.is_none() && r.target - r.notified <= 0 {
            return Ok(Walked::Quota);
        }
        // Stock again before every batch: a sold-out SKU (or market) stops the walk, the rest
        // stay WAITING.
        let available = match inventory::stock_counters(deps, t, sku).await? {
            Some(s) if s.restock_round != round => return Ok(Walked::Stopped("superseded")),
            Some(s) => b.available(&s, locations),
            None => 0,
        };
        if available <= 0 {
            return Ok(Walked::SoldOut);
        }
        let (target, notified) = match b.market {
            None => (r.target, r.notified),
            Some(_) => match market_target(at, b, available).await? {
                Some(counts) => counts,
                None => return Ok(Walked::Stopped("not_due")),
            },
        };
        let left = target - notified;
        if left <= 0 {
            return Ok(Walked::Quota);
        }
        let limit = usize::try_from(left).unwrap_or(usize::MAX).min(cfg.batch_size);
        let page = deps
            .table
            .query(
                &keys::waiting_pk(t, sku, b.market),
                "",
                QueryOpts { limit, cursor: cursor.clone(), descending: false },
            )
            .await?;
        let mut claimed_here = 0u64;
        let mut quota_reached = false;
        for item in &page.items {
            let entry: WaitingEntry = item.parse()?;
            match claim(at, b, target, &item.key.sk, &entry).await? {
                Claim::Claimed => claimed_here += 1,
                Claim::Already | Claim::NotWaiting => {}
                Claim::QuotaReached => {
                    quota_reached = true;
                    break;
                }
            }
        }
        out.claimed += claimed_here;
        if !page.items.is_empty() {
            out.batches += 1;
        }
        if quota_reached {
            return Ok(Walked::Quota);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(Walked::NoWaiters);
        }
        // A pause between batches: the channels are not flooded by one SKU (docs/restock.md,
        // "Waves").
        if !cfg.batch_pause.is_zero() {
            tokio::time::sleep(cfg.batch_pause).await;
        }
    }
}

/// After a wave used its quota: the next wave after the interval, scheduled once.
async fn schedule_next_wave(deps: &Deps, t: &TenantId, sku: &str, round: i64, wave: u32) -> CoreResult<()> {
    let next = wave + 1;
    let interval = deps.config.restock.wave_interval;
    let due = deps.clock.now() + chrono::Duration::from_std(interval).unwrap_or(chrono::Duration::minutes(10));
    let cond = Cond::Or(vec![
        Cond::AttrNotExists("scheduled_wave".into()),
        Cond::Cmp("scheduled_wave".into(), crate::ports::CmpOp::Lt, json!(next)),
    ]);
    let updates =
        vec![Update::set("scheduled_wave", i64::from(next)), Update::set("next_wave_ms", due.timestamp_millis())];
    match deps.table.update(&keys::round(t, sku, round), updates, cond).await {
        Ok(_) => {
            let task = crate::timers::task::TimerTask::RestockWave {
                tenant: t.clone(),
                sku_id: sku.to_owned(),
                round,
                wave: next,
            };
            crate::timers::task::schedule(deps, due, task).await
        }
        Err(StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One notice, as one transaction (see the module doc).
async fn claim(at: &WaveAt<'_>, b: &Bucket<'_>, target: i64, sort: &str, entry: &WaitingEntry) -> CoreResult<Claim> {
    let WaveAt { deps, t, sku, round, wave } = *at;
    let batch = batch_no(sku, round);
    let notice_key = keys::notice(t, &batch, &entry.user_id);
    if deps.table.get(&notice_key).await?.is_some() {
        // Claimed by another instance, whose transaction also moved the subscription.
        return Ok(Claim::Already);
    }
    let pk = keys::merge_partition(t, &entry.user_id);
    let item = super::model::MessageItem {
        sku_id: sku.to_owned(),
        batch_no: batch.clone(),
        subscription_id: entry.subscription_id.clone(),
    };
    let params = serde_json::to_value(&item)?;
    for _ in 0..5 {
        // The user's merge window, a digest of the workflow engine: this notice enters the open
        // one, or opens one (docs/restock.md, "Merge per buyer").
        let closes = merge::window_close(deps);
        let window =
            digest::entry(deps, &pk, &batch, &params, deps.clock.now_ms(), closes.timestamp_millis(), false).await?;
        let at = now_text(deps);
        let notice = Notice {
            batch_no: batch.clone(),
            sku_id: sku.to_owned(),
            user_id: entry.user_id.clone(),
            round,
            subscription_id: entry.subscription_id.clone(),
            status: NoticeStatus::Pending,
            window_id: window.window.clone(),
            attempts: 0,
            notification_id: None,
            created_at: at.clone(),
            updated_at: at.clone(),
        };
        // The quota is a condition of the claim: `notified < target` of this wave, in the
        // subscriber's index (a market's, or that of no market).
        let mut quota = vec![Cond::eq("wave", i64::from(wave))];
        if b.market.is_some() {
            quota.push(Cond::eq(&b.name("wave"), i64::from(wave)));
        }
        quota.push(Cond::eq(&b.name("target"), target));
        quota.push(Cond::lt(&b.name("notified"), target));
        let mut writes = vec![
            Write::Put { item: Item::new(notice_key.clone(), attrs_of(&notice)?), cond: Cond::NotExists },
            Write::Update {
                key: keys::round(t, sku, round),
                updates: vec![Update::add(&b.name("notified"), 1)],
                cond: Cond::And(quota),
            },
        ];
        writes.extend(leave_waiting_writes(
            t,
            &entry.subscription_id,
            &entry.user_id,
            sku,
            b.market,
            sort,
            SubscriptionStatus::Notified,
            &at,
            Some(&batch),
        ));
        // The notice counted for the SKU's day (docs/restock.md, "What alerts earn").
        writes.push(super::analytics::day_write(t, sku, deps.clock.now_ms(), "notified"));
        // The window's head (put only when absent, or checked to still name it) and this SKU's
        // event in it; the message of a window this notice opens.
        if window.opens {
            writes.push(merge::message_write(deps, t, &entry.user_id, &window.window, closes)?);
            writes.push(merge::durable_flush(deps, t, &window.window, closes).await?);
        }
        writes.extend(window.writes);
        // Its entry in the index of its status (`merge::list_notices`).
        writes.push(merge::status_entry_write(t, NoticeStatus::Pending, &batch, &entry.user_id));
        // The `restock.notified` webhook event, in the notice's own transaction.
        let data = serde_json::json!({
            "sku_id": sku, "user_id": entry.user_id, "round": round,
            "batch_no": batch, "subscription_id": entry.subscription_id,
        });
        let event = crate::webhooks::Event::of(
            deps,
            t,
            crate::webhooks::EventType::RestockNotified,
            &[&batch, &entry.user_id],
            data,
        );
        writes.extend(crate::webhooks::event_writes(deps, t, vec![event]).await?);
        let opens = window.opens.then(|| window.window.clone());
        match deps.table.transact(writes).await {
            Ok(()) => {
                if let Some(window) = opens {
                    merge::schedule_flush(deps, t, &window, closes).await;
                }
                return Ok(Claim::Claimed);
            }
            Err(StoreError::ConditionFailed { index: 0 }) => return Ok(Claim::Already),
            Err(StoreError::ConditionFailed { index: 1 }) => {
                // The quota, or the wave moved on (or its target changed): stop this run.
                return Ok(Claim::QuotaReached);
            }
            Err(StoreError::ConditionFailed { index: 2..=4 }) => return Ok(Claim::NotWaiting),
            // The window closed between reading and writing: open the next one.
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// What a scan did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanReport {
    pub tenants: u64,
    pub skus_checked: u64,
    pub rounds_queued: u64,
    pub expired: u64,
}

/// The scheduled safety net (a lost stock event must not mean no alert ever): for every SKU with
/// WAITING subscribers and stock, queue its current round (the same `batch_no` the event used, so
/// nothing is sent twice and nothing is lost when an event was); expire WAITING subscriptions older
/// than the maximum age.
pub async fn scan(deps: &Deps) -> CoreResult<ScanReport> {
    let mut report = ScanReport::default();
    let max_age_ms = i64::try_from(deps.config.restock.max_age.as_millis()).unwrap_or(i64::MAX);
    let cutoff = deps.clock.now_ms().saturating_sub(max_age_ms);
    let mut tenants_cursor = None;
    loop {
        let tenants = deps
            .table
            .query(keys::TENANTS_PK, "", QueryOpts { limit: 100, cursor: tenants_cursor, descending: false })
            .await?;
        for tenant_item in &tenants.items {
            let Ok(t) = TenantId::parse(&tenant_item.key.sk) else { continue };
            report.tenants += 1;
            let mut cursor = None;
            loop {
                let skus = deps
                    .table
                    .query(&keys::watched_pk(&t), "", QueryOpts { limit: 100, cursor, descending: false })
                    .await?;
                let mut jobs = Vec::new();
                for sku_item in &skus.items {
                    let sku = sku_item.key.sk.as_str();
                    report.skus_checked += 1;
                    report.expired += expire_old(deps, &t, sku, cutoff).await?;
                    if !has_waiters(deps, &t, sku).await? {
                        continue;
                    }
                    let Some(stock) = inventory::stock_counters(deps, &t, sku).await? else { continue };
                    if stock.available <= 0 {
                        continue;
                    }
                    let job = RoundJob {
                        event: ROUND_EVENT.into(),
                        tenant: t.clone(),
                        sku_id: sku.to_owned(),
                        round: stock.restock_round,
                        wave: None,
                    };
                    jobs.push(OutMessage::new(serde_json::to_string(&job)?));
                }
                report.rounds_queued += jobs.len() as u64;
                if !jobs.is_empty() {
                    deps.queues.send_batch(STOCK_EVENTS_QUEUE, jobs).await?;
                }
                cursor = skus.next_cursor;
                if cursor.is_none() {
                    break;
                }
            }
        }
        tenants_cursor = tenants.next_cursor;
        if tenants_cursor.is_none() {
            break;
        }
    }
    info!(?report, "restock scan");
    Ok(report)
}
