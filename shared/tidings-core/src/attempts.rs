//! Attempt markers: what lets a queue message whose handling ends the process (an abort, a
//! kill, an environment Lambda stops) be set aside after the first crash it causes on a
//! redelivery, instead of ending every restart until its receives run out
//! (docs/delivery.md, "A message that ends the process").
//!
//! A redelivered message (`receive_count >= 2`) is handled under a small item in the table, written
//! before its handler runs and deleted after it returns, whatever the outcome. A marker still
//! there when the message comes again means the process ended while handling it. It names how
//! many other messages the process was handling meanwhile (`beside`): none, and the message is
//! the cause; some, and it is given one more attempt alone (behind [`Attempts`]' gate, nothing
//! else handled beside it). The router applies the rule (`crate::router`); this module holds
//! the marker and the process's count of the messages in flight. A first receipt writes nothing.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::ports::{Cond, Key, Table, Update};

/// How long a marker nobody deleted (its message ended the process and never came back) is kept:
/// longer than a message lives in its queue (SQS keeps one 14 days at most).
pub const KEEP_S: i64 = 15 * 86_400;

/// How long an attempt alone waits for the messages in flight beside it to end (new ones wait
/// behind it meanwhile: the whole process pauses) before it runs beside them anyway, counted,
/// so that a handler that never returns cannot stop the process for good.
pub const ALONE_WAIT: Duration = Duration::from_secs(30);

/// The marker of an attempt at a redelivered message (the item at [`crate::keys::attempt`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The receive the attempt was made at.
    pub receive: u32,
    /// How many other messages the process was handling during the attempt: those in flight
    /// when it began (its batch's included), and more for any that began while it ran with none.
    pub beside: u32,
    /// Whether it was the attempt alone, made after an ambiguous end.
    #[serde(default)]
    pub alone: bool,
    /// Ends of the process, alone, this message was handled through before this attempt.
    #[serde(default)]
    pub crashes: u32,
    /// When the table may drop it (epoch seconds), as for every expiring item.
    pub ttl: i64,
}

/// The messages this process is handling, and the gate an attempt alone closes. One per
/// process (shared by the clones of its `Deps`): the markers speak of what one process did.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Every handling holds it shared; an attempt alone holds it exclusively.
    gate: RwLock<()>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    /// How many handlings began (any message), to see one that began beside an attempt.
    starts: u64,
    next_id: u64,
    /// Markers written with nobody beside whose handling is running: the next handling to begin
    /// counts itself in them before it runs.
    lone: Vec<(u64, Key)>,
    /// (queue, message id) of every message this process is handling: a receive of one of them
    /// is its own message shown again while it still runs (its visibility ran out), not a
    /// sign that the process ended.
    running: std::collections::HashSet<(String, String)>,
    /// (queue, message id) → the receipt of the latest receive of a message that came while an
    /// earlier receive of it still ran here: the only receipt the queue still honours, which
    /// the earlier receive's settling takes ([`Attempts::newest_receipt`]).
    newer: std::collections::HashMap<(String, String), String>,
}

/// How a handling holds the gate (kept for its drop, which opens it).
#[derive(Debug)]
enum Held<'a> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// The handling of some messages, counted in flight until dropped (dropped too when the
/// handling is cut off: only the end of the process leaves a marker behind).
#[derive(Debug)]
pub struct Entry<'a> {
    attempts: &'a Attempts,
    count: usize,
    others: usize,
    start: u64,
    lone: Vec<u64>,
    held: Held<'a>,
}

impl Attempts {
    /// Begins the handling of `count` messages: waits while an attempt alone runs, and counts
    /// itself in any marker written with nobody beside before it.
    pub async fn enter(&self, table: &dyn Table, count: usize) -> Entry<'_> {
        let guard = self.gate.read().await;
        self.begin(table, count, Held::Shared(guard)).await
    }

    /// Begins an attempt alone: waits until nothing else is handled (and holds new handlings
    /// back) for at most `wait`, then begins, alone or beside what still runs.
    pub async fn enter_alone(&self, table: &dyn Table, wait: Duration) -> Entry<'_> {
        match tokio::time::timeout(wait, self.gate.write()).await {
            Ok(guard) => self.begin(table, 1, Held::Alone(guard)).await,
            Err(_) => {
                tracing::warn!(
                    waited_ms = wait.as_millis() as u64,
                    "could not handle a message alone; it runs beside others"
                );
                self.enter(table, 1).await
            }
        }
    }

    async fn begin<'a>(&'a self, table: &dyn Table, count: usize, held: Held<'a>) -> Entry<'a> {
        let (others, start, lone) = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let others = state.in_flight;
            state.in_flight += count;
            state.starts += 1;
            (others, state.starts, std::mem::take(&mut state.lone))
        };
        // Before this handling runs: were it to end the process, those attempts would otherwise
        // look alone.
        for (_, key) in lone {
            widen(table, &key, 1).await;
        }
        Entry { attempts: self, count, others, start, lone: Vec::new(), held }
    }

    /// Makes the marker at `key`, just written for `entry`'s one message with nobody beside,
    /// known to the handlings that begin while it runs; if one began since `entry` did, counts
    /// it in the marker at once.
    pub async fn written_alone(&self, table: &dyn Table, entry: &mut Entry<'_>, key: &Key) {
        let late = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let late = state.starts - entry.start;
            if late == 0 {
                state.next_id += 1;
                let id = state.next_id;
                state.lone.push((id, key.clone()));
                entry.lone.push(id);
            }
            late
        };
        if late > 0 {
            widen(table, key, i64::try_from(late).unwrap_or(i64::MAX)).await;
        }
    }
}

/// Messages [`Attempts::running`] counted as handled by this process, until dropped.
#[derive(Debug)]
pub struct Running<'a> {
    attempts: &'a Attempts,
    ids: Vec<(String, String)>,
}

impl Attempts {
    /// Counts the messages of `messages` (of `queue`; id and receipt) as handled by this process
    /// until the returned guard is dropped; says for each whether it was already (another
    /// receive of it runs here: not counted again, nor given back by this guard, and its receipt
    /// kept for the earlier receive's settling: [`Attempts::newest_receipt`]).
    pub fn running<'a>(&'a self, queue: &str, messages: &[(&str, &str)]) -> (Running<'a>, Vec<bool>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut held = Vec::with_capacity(messages.len());
        let mut already = Vec::with_capacity(messages.len());
        for (id, receipt) in messages {
            let key = (queue.to_owned(), (*id).to_owned());
            let fresh = state.running.insert(key.clone());
            if fresh {
                held.push(key);
            } else {
                if state.newer.len() >= MAX_NEWER {
                    // Receipts nobody took (a caller that settles with its own): forgotten.
                    state.newer.clear();
                }
                state.newer.insert(key, (*receipt).to_owned());
            }
            already.push(!fresh);
        }
        (Running { attempts: self, ids: held }, already)
    }

    /// The receipt of a later receive of `message_id` that came while this process still ran an
    /// earlier one ([`Attempts::running`]), once: what settling the earlier one must use (a
    /// queue deletes a message only by its latest receipt; by an older one it stays, and comes
    /// back to be handled again).
    pub fn newest_receipt(&self, queue: &str, message_id: &str) -> Option<String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.newer.remove(&(queue.to_owned(), message_id.to_owned()))
    }
}

/// The most newer receipts kept at once.
const MAX_NEWER: usize = 10_000;

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut state = self.attempts.state.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.ids {
            state.running.remove(id);
        }
    }
}

impl Entry<'_> {
    /// How many other messages were in flight in the process when this handling began, its own
    /// batch's included: what a marker written for one of its messages says.
    pub fn beside(&self) -> u32 {
        u32::try_from(self.others + self.count.saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Whether it holds the gate alone.
    pub fn is_alone(&self) -> bool {
        matches!(self.held, Held::Alone(_))
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        let mut state = self.attempts.state.lock().unwrap_or_else(|p| p.into_inner());
        state.in_flight = state.in_flight.saturating_sub(self.count);
        state.lone.retain(|(id, _)| !self.lone.contains(id));
    }
}

/// Counts `n` more handlings beside the attempt whose marker is at `key` (none if it is gone:
/// its handling ended). A failure is only logged: the marker then says fewer than there were,
/// and a crash beside it would set it aside (docs/delivery.md, "A message that ends the process").
async fn widen(table: &dyn Table, key: &Key, n: i64) {
    match table.update(key, vec![Update::add("beside", n)], Cond::Exists).await {
        Ok(_) => {}
        Err(e) if e.is_condition_failed() => {}
        Err(e) => tracing::warn!(error = %e, "could not count a message beside a marked attempt"),
    }
}
