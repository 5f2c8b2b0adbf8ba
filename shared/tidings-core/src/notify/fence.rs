//! The cancel fence (docs/delivery.md, "Cancel"): a cancelled notification sends nothing after
//! the cancel's answer.
//!
//! Two halves, one per side:
//! - **the send** ([`cancelled`]): right before its provider call, each claimed send reads its
//!   notification's cancel mark fresh (a strongly consistent read that started after the send
//!   asked, never an older answer; the cancel writes the mark with the `cancelled` status in one
//!   transaction, and the mark is a few bytes where the notification record is kilobytes), and
//!   a cancelled one is not sent (its delivery is closed as `suppressed`, `cancelled`). The
//!   reads are shared: per notification and process one read is in flight at a time, and it
//!   answers every send that asked before it started; a cancelled answer is final and is kept.
//!   A campaign of a million sends costs far fewer reads than sends, and none of its writes
//!   change.
//! - **the cancel** ([`wait_for_sends`]): after its write, the cancel waits for the sends of
//!   the notification that had started their check before the write (they hold a [`Guard`]
//!   from before their check to after their record), at most a bound. A send that starts its
//!   check after the write reads `cancelled`. So on one process (the embedded backend, or
//!   `tidings serve --backend aws`) nothing is sent after the answer; across Lambda instances a
//!   send whose check passed just before the write may still end after the answer (at most one
//!   per worker in flight, within the gate wait and the provider timeout).
//!
//! The 1 s cache of `super::campaign::status` still decides the cheap early skip of a cancelled
//! campaign's tasks; only this fence decides a send.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::deps::Deps;
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;

/// One order for every guard, read and cancel of the process.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::SeqCst)
}

fn key_of(t: &TenantId, notification_id: &str) -> String {
    format!("{t}/{notification_id}")
}

/// The last read of one notification's status: (its sequence when it started, cancelled).
type Slot = Arc<tokio::sync::Mutex<Option<(u64, bool)>>>;

fn slots() -> &'static Mutex<HashMap<String, Slot>> {
    static SLOTS: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

fn slot(key: &str) -> Slot {
    let mut slots = slots().lock().unwrap_or_else(|p| p.into_inner());
    if slots.len() > 10_000 {
        // Slots nobody is reading; a cancelled answer lost here is read again.
        slots.retain(|_, s| Arc::strong_count(s) > 1);
    }
    slots.entry(key.to_owned()).or_default().clone()
}

/// Whether the notification is cancelled, as of a read that started after this call did.
/// Called right before each provider call, under a [`Guard`] entered before it.
pub async fn cancelled(deps: &Deps, t: &TenantId, notification_id: &str) -> CoreResult<bool> {
    let asked = next_seq();
    let slot = slot(&key_of(t, notification_id));
    let mut last = slot.lock().await;
    if let Some((started, was_cancelled)) = *last
        && (was_cancelled || started > asked)
    {
        return Ok(was_cancelled);
    }
    let started = next_seq();
    let is_cancelled = deps.table.get(&keys::cancel_mark(t, notification_id)).await?.is_some();
    *last = Some((started, is_cancelled));
    Ok(is_cancelled)
}

/// Sends in flight per notification: the sequence each entered at, how many at it.
type InFlight = HashMap<String, BTreeMap<u64, usize>>;

fn in_flight() -> &'static (Mutex<InFlight>, tokio::sync::Notify) {
    static IN_FLIGHT: OnceLock<(Mutex<InFlight>, tokio::sync::Notify)> = OnceLock::new();
    IN_FLIGHT.get_or_init(Default::default)
}

/// Sends of these notifications are under way: from before their fence checks to after their
/// record. A cancel waits for the guards entered before its write.
#[must_use]
pub struct Guard {
    keys: Vec<String>,
    seq: u64,
}

/// Enters the sends of `notifications` (repeats are one).
pub fn enter<'a>(notifications: impl IntoIterator<Item = (&'a TenantId, &'a str)>) -> Guard {
    let mut keys: Vec<String> = notifications.into_iter().map(|(t, id)| key_of(t, id)).collect();
    keys.sort();
    keys.dedup();
    let (map, _) = in_flight();
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    // Taken under the lock: a cancel's sequence is either before it (and the cancel does not
    // wait for it, which is right: its check reads after the write) or after it (and it
    // sees this guard).
    let seq = next_seq();
    for k in &keys {
        *map.entry(k.clone()).or_default().entry(seq).or_default() += 1;
    }
    Guard { keys, seq }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (map, notify) = in_flight();
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        for k in &self.keys {
            let Some(entered) = map.get_mut(k) else { continue };
            if let Some(n) = entered.get_mut(&self.seq) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    entered.remove(&self.seq);
                }
            }
            if entered.is_empty() {
                map.remove(k);
            }
        }
        drop(map);
        notify.notify_waiters();
    }
}

/// Whether a send of the notification entered before `seq` is still under way.
fn busy_before(key: &str, seq: u64) -> bool {
    let (map, _) = in_flight();
    let map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.get(key).and_then(|entered| entered.keys().next()).is_some_and(|&first| first < seq)
}

/// After a cancel's write: waits until no send of the notification that entered before the
/// write is under way, at most `bound`. `false`: the bound ran out first.
pub async fn wait_for_sends(t: &TenantId, notification_id: &str, bound: Duration) -> bool {
    let seq = {
        let (map, _) = in_flight();
        let _map = map.lock().unwrap_or_else(|p| p.into_inner());
        next_seq()
    };
    let key = key_of(t, notification_id);
    let until = tokio::time::Instant::now() + bound;
    loop {
        let notified = in_flight().1.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !busy_before(&key, seq) {
            return true;
        }
        if tokio::time::timeout_at(until, notified).await.is_err() {
            return !busy_before(&key, seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancel_waits_for_the_sends_entered_before_it_only() {
        let t = TenantId::parse("fence-t").unwrap();
        let before = enter([(&t, "n1")]);
        let other = enter([(&t, "n2")]);
        // A send entered before the cancel holds it back.
        assert!(!wait_for_sends(&t, "n1", Duration::from_millis(50)).await);
        // Another notification's send does not.
        assert!(wait_for_sends(&t, "n3", Duration::from_millis(50)).await);
        let waiting = tokio::spawn({
            let t = t.clone();
            async move { wait_for_sends(&t, "n1", Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A send entered after the cancel's write does not hold it back.
        let after = enter([(&t, "n1")]);
        drop(before);
        assert!(waiting.await.unwrap(), "the cancel went on once the earlier send ended");
        drop(after);
        drop(other);
    }
}
