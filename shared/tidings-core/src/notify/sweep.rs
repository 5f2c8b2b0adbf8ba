//! The relay's safety net: notifications still `accepted` some time after they were accepted
//! (their stream record given up on by the event source mapping, or trimmed from the stream
//! before a failure was replayed) are queued again, on the tick's schedule.
//!
//! The accept transaction also puts a watch entry in the minute of its acceptance
//! ([`super::watch`]); the sweep keeps how far it has gone:
//!
//! | item | pk | sk |
//! |---|---|---|
//! | how far the sweep has gone | `RELAY#SWEPT` | `CURSOR` |
//!
//! [`sweep`] reads each minute once, when all of it is older than
//! [`crate::CoreConfig::relay_sweep_after`] (`TIDINGS_RELAY_SWEEP_AFTER_S`, 300 by default),
//! and re-drives every notification of it still `accepted` ([`super::relay::redrive`]). A repeat
//! (two sweeps at once, a sweep beside a late relay) is absorbed by the orchestrator: a
//! notification is moved to `processing` once, a page done is not done again, and a delivery is
//! made by a conditional put.

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::relay::{Redriven, redrive};
use super::watch::{WATCH_SHARDS, watch_pk};
use crate::deps::Deps;
use crate::error::CoreResult;
use crate::keys::NOTIFICATION_SK;
use crate::ports::{Cond, Key, QueryOpts, Update};
use crate::timers::{MINUTE_MS, minute_of};

/// The most minutes one sweep reads (a sweep after a long pause catches up over a few ticks).
pub const MINUTES_PER_SWEEP: i64 = 30;
/// Minutes read at once (each its WATCH_SHARDS partitions): a sweep is a few round trips, not
/// one per partition.
const MINUTES_AT_ONCE: usize = 6;
/// How far back the first sweep of a deployment looks.
pub const FIRST_LOOK_BACK_MINUTES: i64 = 60;
const CURSOR_PK: &str = "RELAY#SWEPT";
const CURSOR_SK: &str = "CURSOR";

/// What a sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReport {
    pub minutes: u64,
    pub checked: u64,
    pub redriven: u64,
}

/// One partition of a minute's watch entries: (entries read, notifications re-driven).
async fn sweep_partition(deps: &Deps, pk: String) -> CoreResult<(u64, u64)> {
    let (mut checked, mut redriven) = (0, 0);
    let mut pages = Watched::new(pk);
    while let Some(keys) = pages.next(deps).await? {
        for key in keys {
            checked += 1;
            match redrive(deps, &key).await {
                Ok(Redriven::Queued) => redriven += 1,
                Ok(Redriven::NothingToDo) => {}
                // An unreadable notification stays as it is: the stream's poison record names it
                // on the stream-failures queue.
                Err(e) if !e.is_retryable() => warn!(error = %e, pk = %key.pk, "not re-driven"),
                Err(e) => return Err(e),
            }
        }
    }
    Ok((checked, redriven))
}

/// The keys of the notifications one watch partition names, a page at a time.
struct Watched {
    pk: String,
    cursor: Option<String>,
    done: bool,
}

impl Watched {
    fn new(pk: String) -> Self {
        Self { pk, cursor: None, done: false }
    }

    /// The next page's notification keys; `None` past the last page.
    async fn next(&mut self, deps: &Deps) -> CoreResult<Option<Vec<Key>>> {
        if self.done {
            return Ok(None);
        }
        let opts = QueryOpts { limit: 100, cursor: self.cursor.take(), descending: false };
        let page = deps.table.query(&self.pk, "", opts).await?;
        self.cursor = page.next_cursor;
        self.done = self.cursor.is_none();
        Ok(Some(page.items.into_iter().map(|entry| Key::new(entry.key.sk, NOTIFICATION_SK)).collect()))
    }
}

/// How many notifications accepted in the last `minutes` minutes (of the clock) are still
/// `accepted`: in the outbox, not yet relayed to their queue (a process stopped before its relay
/// ran leaves them so). For a report on what an earlier run left; the sweep re-drives them.
pub async fn still_accepted(deps: &Deps, minutes: i64) -> CoreResult<u64> {
    let now = minute_of(deps.clock.now_ms());
    let mut accepted = 0;
    for minute in (0..minutes.max(1)).map(|i| now - i * MINUTE_MS) {
        for shard in 0..WATCH_SHARDS {
            let mut pages = Watched::new(watch_pk(minute, shard));
            while let Some(keys) = pages.next(deps).await? {
                for key in keys {
                    if let Some(item) = deps.table.get(&key).await?
                        && item.parse::<super::model::Notification>()?.status
                            == super::model::NotificationStatus::Accepted
                    {
                        accepted += 1;
                    }
                }
            }
        }
    }
    Ok(accepted)
}

/// Re-drives the notifications still `accepted` of every minute that is now old enough and not
/// swept yet (at most [`MINUTES_PER_SWEEP`]). Run on the tick's schedule.
pub async fn sweep(deps: &Deps) -> CoreResult<SweepReport> {
    let age_ms = i64::try_from(deps.config.relay_sweep_after.as_millis()).unwrap_or(i64::MAX);
    let now = deps.clock.now_ms();
    // The last minute all of whose notifications are older than the age.
    let last = minute_of(now.saturating_sub(age_ms) - MINUTE_MS);
    let cursor_key = Key::new(CURSOR_PK, CURSOR_SK);
    let swept = deps.table.get(&cursor_key).await?.and_then(|i| i.i64("minute_ms"));
    let minute = match swept {
        Some(m) => m + MINUTE_MS,
        None => last - (FIRST_LOOK_BACK_MINUTES - 1) * MINUTE_MS,
    };
    let mut report = SweepReport::default();
    // The minutes due, read a few at a time with their shards at once (a tick after a pause has
    // up to MINUTES_PER_SWEEP of them), the cursor written once per group read in full.
    let due: Vec<i64> = (0..MINUTES_PER_SWEEP).map(|i| minute + i * MINUTE_MS).take_while(|m| *m <= last).collect();
    for group in due.chunks(MINUTES_AT_ONCE) {
        let reads =
            group.iter().flat_map(|&m| (0..WATCH_SHARDS).map(move |shard| sweep_partition(deps, watch_pk(m, shard))));
        for done in futures::future::join_all(reads).await {
            let (checked, redriven) = done?;
            report.checked += checked;
            report.redriven += redriven;
        }
        let Some(&through) = group.last() else { break };
        deps.table.update(&cursor_key, vec![Update::set("minute_ms", through)], Cond::Always).await?;
        report.minutes += group.len() as u64;
    }
    if report.redriven > 0 {
        info!(redriven = report.redriven, checked = report.checked, "notifications still accepted were queued again");
    }
    Ok(report)
}
