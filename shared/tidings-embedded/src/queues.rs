//! `impl Queues for EmbeddedStore`: SQS semantics over the `messages` table.
//!
//! - Time (delays, visibility, ages) follows the store's [`Clock`](tidings_core::ports::Clock),
//!   so it may be a manual clock; the `wait` of a receive (long polling) is real time.
//! - Each declared queue `name` has a DLQ `name-dlq`, itself a queue that can be received from
//!   (it has no DLQ of its own). A message received `max_receives` times moves to the DLQ at
//!   the next receive instead of being returned, as SQS's redrive policy does.
//! - Limits as SQS: at most 10 messages per receive, a delay of at most 15 minutes, a
//!   visibility of at most 12 hours, a long-poll wait of at most 20 seconds, bodies of 1 byte
//!   to 256 KiB (`tidings_core::sizes`, as the AWS adapter).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tidings_core::ports::queue::MAX_DELAY;
use tidings_core::ports::{OutMessage, QueueError, QueueStats, Queues, Received};

use crate::{EmbeddedStore, Inner, JoinFailed};

/// The most messages one receive returns. SQS returns at most 10 and a Lambda event source
/// mapping assembles larger batches (up to 10,000) from several receives; the local runtime's
/// batches of up to 100 come from one receive here (one transaction instead of ten).
const MAX_RECEIVE: usize = 100;

/// A queue's statistics, read off the index `messages_waiting` alone (lib.rs's schema).
const STATS: &str = "SELECT
        COALESCE(SUM(visible_at_ms <= ?2), 0),
        COALESCE(SUM(visible_at_ms > ?2 AND receive_count > 0), 0),
        COALESCE(SUM(visible_at_ms > ?2 AND receive_count = 0), 0),
        MIN(sent_at_ms)
     FROM messages WHERE queue = ?1";
/// The longest visibility timeout (SQS's limit).
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);
/// The longest long-poll wait (SQS's limit).
const MAX_WAIT: Duration = Duration::from_secs(20);
/// How often a long poll looks again even without a signal (messages become visible as time
/// passes, and a manual clock moves without telling anyone). A look that [`DueTimes`] says
/// would find nothing costs no receive.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// How long a queue's due time is trusted without a receive: another process writing into the
/// same file is seen within this.
const TRUST_DUE_FOR: Duration = Duration::from_secs(1);

/// When each queue may next have a message to receive, as its last empty receive found (the
/// earliest `visible_at_ms` of its messages, on the store's clock), lowered by every send,
/// visibility change and redrive to it, each on the writer's connection right after its
/// statement: the long polls of idle workers look at it every `POLL_EVERY` and run a receive
/// (a writer transaction) only when something may be due, instead of twenty receives a second
/// each. A queue without an entry (none yet, or older than `TRUST_DUE_FOR`) is received.
#[derive(Default)]
pub(crate) struct DueTimes(std::sync::Mutex<HashMap<String, (i64, std::time::Instant)>>);

impl DueTimes {
    /// Whether a receive of `queue` at `now_ms` may find a message.
    fn may_have(&self, queue: &str, now_ms: i64) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(queue).is_none_or(|&(due, seen)| due <= now_ms || seen.elapsed() >= TRUST_DUE_FOR)
    }

    /// An empty receive found nothing due before `due_ms` (`i64::MAX`: no message at all).
    fn found(&self, queue: &str, due_ms: i64) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(queue.to_owned(), (due_ms, std::time::Instant::now()));
    }

    /// A message of `queue` is visible from `at_ms`.
    fn lower(&self, queue: &str, at_ms: i64) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((due, _)) = map.get_mut(queue) {
            *due = (*due).min(at_ms);
        }
    }
}

/// A queue to declare: its logical name and how many receives a message gets before it moves
/// to the DLQ `{name}-dlq` (SQS's `maxReceiveCount`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    pub name: String,
    pub max_receives: u32,
}

impl QueueConfig {
    pub fn new(name: impl Into<String>, max_receives: u32) -> Self {
        Self { name: name.into(), max_receives }
    }

    /// The name of this queue's DLQ.
    pub fn dlq_name(&self) -> String {
        dlq_name(&self.name)
    }
}

fn dlq_name(queue: &str) -> String {
    format!("{queue}-dlq")
}

/// What the store knows of a declared queue.
#[derive(Clone, Debug)]
pub(crate) struct QueueSpec {
    /// `(max_receives, dlq name)`; `None` for a DLQ.
    redrive: Option<(u32, String)>,
}

fn specs_for(name: &str, max_receives: u32) -> [(String, QueueSpec); 2] {
    [
        (name.to_owned(), QueueSpec { redrive: Some((max_receives, dlq_name(name))) }),
        (dlq_name(name), QueueSpec { redrive: None }),
    ]
}

pub(crate) fn load_declared(conn: &Connection) -> rusqlite::Result<HashMap<String, QueueSpec>> {
    let mut stmt = conn.prepare("SELECT name, max_receives FROM queues")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?;
    let mut map = HashMap::new();
    for row in rows {
        let (name, max) = row?;
        map.extend(specs_for(&name, max));
    }
    Ok(map)
}

fn q_err(e: rusqlite::Error) -> QueueError {
    QueueError::Unavailable(format!("sqlite: {e}"))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The message a receipt was handed out for (`None`: not a receipt of this store).
fn seq_of(receipt: &str) -> Option<i64> {
    receipt.split_once('.').and_then(|(seq, _)| seq.parse().ok())
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl EmbeddedStore {
    /// Declares a queue and its DLQ `{name}-dlq` (idempotent; a new `max_receives` replaces
    /// the old). Declarations are stored: a reopened store knows its queues.
    pub fn declare_queue(&self, config: QueueConfig) -> Result<(), QueueError> {
        if config.name.is_empty() || config.name.ends_with("-dlq") {
            return Err(QueueError::Invalid(format!("bad queue name {:?}", config.name)));
        }
        if !(1..=1000).contains(&config.max_receives) {
            return Err(QueueError::Invalid(format!("max_receives {} (1 to 1000)", config.max_receives)));
        }
        {
            // Not through the writer thread: declaring is set-up, synchronous, outside any
            // request; the statement commits on its own, synced.
            let conn = self.inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            conn.execute(
                "INSERT INTO queues (name, max_receives) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET max_receives = excluded.max_receives",
                params![config.name, config.max_receives],
            )
            .map_err(q_err)?;
        }
        let mut queues = self.inner.queues.write().unwrap_or_else(|p| p.into_inner());
        queues.extend(specs_for(&config.name, config.max_receives));
        Ok(())
    }

    /// The names of the declared queues (DLQs included), sorted.
    pub fn queue_names(&self) -> Vec<String> {
        let queues = self.inner.queues.read().unwrap_or_else(|p| p.into_inner());
        let mut names: Vec<String> = queues.keys().cloned().collect();
        names.sort();
        names
    }

    /// The signal of a queue's new visible messages.
    pub(crate) fn messages_of(&self, queue: &str) -> std::sync::Arc<tokio::sync::Notify> {
        let mut map = self.inner.messages.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(queue.to_owned()).or_default().clone()
    }

    fn spec(&self, queue: &str) -> Result<QueueSpec, QueueError> {
        let queues = self.inner.queues.read().unwrap_or_else(|p| p.into_inner());
        queues.get(queue).cloned().ok_or_else(|| QueueError::UnknownQueue(queue.to_owned()))
    }

    fn dlq_of(&self, queue: &str) -> Result<String, QueueError> {
        match self.spec(queue)?.redrive {
            Some((_, dlq)) => Ok(dlq),
            None => Err(QueueError::Invalid(format!("{queue} is a DLQ and has no DLQ of its own"))),
        }
    }

    /// Runs a read that scans a queue (its statistics) in a blocking thread on a reader
    /// connection. On the writer's connection the scan held its mutex, so every group commit
    /// waited for it: the bench's progress line and the runtime's queue-age sampling ask for
    /// statistics every few hundred milliseconds, and a deep queue's scan is long. A reader
    /// sees every synced commit, which is all the statistics need (SQS's are approximate).
    /// A store in memory has no readers: the scan runs on its one connection.
    async fn scan_on_reader<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Inner) -> Result<T, QueueError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || match inner.readers.get().filter(|r| !r.is_empty()) {
            Some(readers) => {
                let conn = match readers.iter().find_map(|r| r.try_lock().ok()) {
                    Some(conn) => conn,
                    None => readers[0].lock().unwrap_or_else(|p| p.into_inner()),
                };
                f(&conn, &inner)
            }
            None => {
                let conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&conn, &inner)
            }
        })
        .await
        .map_err(|e| QueueError::from(JoinFailed(e.to_string())))?
    }

    /// One receive attempt, without waiting.
    async fn receive_now(
        &self,
        queue: &str,
        spec: &QueueSpec,
        max: usize,
        visibility: Duration,
    ) -> Result<Vec<Received>, QueueError> {
        let queue = queue.to_owned();
        let redrive = spec.redrive.clone();
        let (got, moved) = self
            .with_conn(move |conn, inner| {
                let now = inner.clock.now_ms();
                let tx = conn.savepoint().map_err(q_err)?;
                let after = inner.turns.lock().unwrap_or_else(|p| p.into_inner()).get(&queue).cloned();
                let mut taking = Taking {
                    tx: &tx,
                    queue: &queue,
                    now,
                    visible_until: now.saturating_add(ms(visibility)),
                    redrive: redrive.as_ref(),
                    got: Vec::new(),
                    moved: 0,
                };
                // Deficit round robin by group: each group with a message due gets an equal
                // share of what is left of the receive, in turn after the group served last;
                // a group that has less gives its share to the others in the next round.
                let (due, next_due) = due_groups(&tx, &queue, now, after.as_deref(), max)?;
                if due.is_empty() {
                    inner.due.found(&queue, next_due);
                }
                let mut active: Vec<(String, (i64, i64))> = due.into_iter().map(|g| (g, START)).collect();
                let mut served = None;
                while taking.got.len() < max && !active.is_empty() {
                    let share = (max - taking.got.len()).div_ceil(active.len());
                    let mut still = Vec::with_capacity(active.len());
                    for (group, mut last) in active {
                        let room = share.min(max - taking.got.len());
                        if room == 0 {
                            break;
                        }
                        let took = taking.take(&group, &mut last, room)?;
                        if took == room {
                            still.push((group.clone(), last));
                        }
                        if took > 0 {
                            served = Some(group);
                        }
                    }
                    active = still;
                }
                let (got, moved) = (taking.got, taking.moved);
                tx.commit().map_err(q_err)?;
                if let Some(group) = served {
                    inner.turns.lock().unwrap_or_else(|p| p.into_inner()).insert(queue, group);
                }
                Ok::<_, QueueError>((got, moved))
            })
            .await?;
        if moved > 0 {
            tracing::debug!(moved, "messages moved to a dead-letter queue");
        }
        Ok(got)
    }
}

/// The keyset's start: before every message.
const START: (i64, i64) = (i64::MIN, i64::MIN);

/// The groups of `queue` with a message due, in turn: those after `after` in order, then from
/// the first round to `after` itself (served last, so last in turn); at most `max`. One seek to
/// find each group and one for its earliest message, whatever its backlog. With no group due,
/// also when the queue's first message comes due (`i64::MAX`: it has none).
fn due_groups(
    tx: &Connection,
    queue: &str,
    now: i64,
    after: Option<&str>,
    max: usize,
) -> Result<(Vec<String>, i64), QueueError> {
    let mut groups = Vec::new();
    let mut next_due = i64::MAX;
    let mut at: Option<String> = after.map(str::to_owned);
    let mut wrapped = after.is_none();
    loop {
        let next: Option<String> = match &at {
            Some(g) => tx
                .prepare_cached("SELECT grp FROM messages WHERE queue = ?1 AND grp > ?2 ORDER BY grp LIMIT 1")
                .and_then(|mut stmt| stmt.query_row(params![queue, g], |r| r.get(0)).optional()),
            None => tx
                .prepare_cached("SELECT grp FROM messages WHERE queue = ?1 ORDER BY grp LIMIT 1")
                .and_then(|mut stmt| stmt.query_row(params![queue], |r| r.get(0)).optional()),
        }
        .map_err(q_err)?;
        let Some(group) = next else {
            if wrapped {
                break;
            }
            wrapped = true;
            at = None;
            continue;
        };
        if wrapped && after.is_some_and(|a| group.as_str() > a) {
            break;
        }
        let earliest: Option<i64> = tx
            .prepare_cached("SELECT MIN(visible_at_ms) FROM messages WHERE queue = ?1 AND grp = ?2")
            .and_then(|mut stmt| stmt.query_row(params![queue, group], |r| r.get(0)))
            .map_err(q_err)?;
        let earliest = earliest.unwrap_or(i64::MAX);
        next_due = next_due.min(earliest);
        if earliest <= now {
            groups.push(group.clone());
            if groups.len() >= max {
                break;
            }
        }
        at = Some(group);
    }
    Ok((groups, next_due))
}

/// A receive in progress: what it took so far, in one savepoint.
struct Taking<'a> {
    tx: &'a Connection,
    queue: &'a str,
    now: i64,
    visible_until: i64,
    redrive: Option<&'a (u32, String)>,
    got: Vec<Received>,
    moved: usize,
}

impl Taking<'_> {
    /// Takes up to `room` due messages of `group`, from `last` on (keyset over
    /// `(visible_at_ms, seq)`: visible the longest first, each looked at once, none that is not
    /// due read). A message received `max_receives` times moves to the DLQ instead and does not
    /// count. Returns how many it took: fewer than `room` when the group has no more due.
    fn take(&mut self, group: &str, last: &mut (i64, i64), room: usize) -> Result<usize, QueueError> {
        let mut took = 0;
        while took < room {
            let limit = i64::try_from((room - took).min(64)).unwrap_or(64);
            let candidates: Vec<(i64, String, String, u32, i64, i64)> = {
                let mut stmt = self
                    .tx
                    .prepare_cached(
                        "SELECT seq, id, body, receive_count, sent_at_ms, visible_at_ms FROM messages
                         WHERE queue = ?1 AND grp = ?2 AND visible_at_ms <= ?3
                           AND (visible_at_ms > ?4 OR (visible_at_ms = ?4 AND seq > ?5))
                         ORDER BY visible_at_ms, seq LIMIT ?6",
                    )
                    .map_err(q_err)?;
                let rows = stmt
                    .query_map(params![self.queue, group, self.now, last.0, last.1, limit], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                    })
                    .map_err(q_err)?;
                rows.collect::<Result<_, _>>().map_err(q_err)?
            };
            if candidates.is_empty() {
                break;
            }
            for (seq, id, body, count, sent_at_ms, visible_at_ms) in candidates {
                *last = (visible_at_ms, seq);
                if let Some((max_receives, dlq)) = self.redrive
                    && count >= *max_receives
                {
                    self.tx
                        .prepare_cached(
                            "UPDATE messages SET queue = ?1, visible_at_ms = ?2, receipt = NULL WHERE seq = ?3",
                        )
                        .and_then(|mut stmt| stmt.execute(params![dlq, self.now, seq]))
                        .map_err(q_err)?;
                    self.moved += 1;
                    continue;
                }
                let receipt = format!("{seq}.{}", new_id());
                let count = count.saturating_add(1);
                // Cached: prepared once, not once per message received (it was most of a
                // receive's cost).
                self.tx
                    .prepare_cached(
                        "UPDATE messages SET receive_count = ?1, receipt = ?2, visible_at_ms = ?3 WHERE seq = ?4",
                    )
                    .and_then(|mut stmt| stmt.execute(params![count, receipt, self.visible_until, seq]))
                    .map_err(q_err)?;
                let group = (!group.is_empty()).then(|| group.to_owned());
                self.got.push(Received { message_id: id, receipt, body, receive_count: count, sent_at_ms, group });
                took += 1;
            }
        }
        Ok(took)
    }
}

#[async_trait]
impl Queues for EmbeddedStore {
    async fn send_batch(&self, queue: &str, messages: Vec<OutMessage>) -> Result<(), QueueError> {
        self.spec(queue)?;
        for m in &messages {
            if m.delay > MAX_DELAY {
                return Err(QueueError::Invalid(format!("delay {:?} is over 15 minutes", m.delay)));
            }
        }
        // SQS's size limits, checked as the AWS adapter checks them (one transaction here, so
        // the batches it would split into need not be sent one by one).
        tidings_core::sizes::send_batches(&messages)?;
        if messages.is_empty() {
            return Ok(());
        }
        let name = queue.to_owned();
        let queue = queue.to_owned();
        // Only a message visible now wakes the receivers waiting on the queue: a delayed one
        // (an order's expiry, due in minutes) would wake every one of them for nothing, and
        // each would run a receive on the writer's connection; they find it when they poll.
        let wakes = messages.iter().any(|m| m.delay.is_zero());
        self.with_conn(move |conn, inner| {
            let now = inner.clock.now_ms();
            let tx = conn.savepoint().map_err(q_err)?;
            {
                let mut stmt = tx
                    .prepare_cached(
                        "INSERT INTO messages (id, queue, body, visible_at_ms, receive_count, sent_at_ms, receipt, grp)
                         VALUES (?1, ?2, ?3, ?4, 0, ?5, NULL, ?6)",
                    )
                    .map_err(q_err)?;
                for m in messages {
                    let group = m.group.unwrap_or_default();
                    let visible_at = now.saturating_add(ms(m.delay));
                    stmt.execute(params![new_id(), queue, m.body, visible_at, now, group]).map_err(q_err)?;
                    inner.due.lower(&queue, visible_at);
                }
            }
            tx.commit().map_err(q_err)
        })
        .await?;
        if wakes {
            self.messages_of(&name).notify_waiters();
        }
        Ok(())
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        visibility: Duration,
        wait: Duration,
    ) -> Result<Vec<Received>, QueueError> {
        let spec = self.spec(queue)?;
        if visibility > MAX_VISIBILITY {
            return Err(QueueError::Invalid(format!("visibility {visibility:?} is over 12 hours")));
        }
        if wait > MAX_WAIT {
            return Err(QueueError::Invalid(format!("wait {wait:?} is over 20 seconds")));
        }
        let max = max.clamp(1, MAX_RECEIVE);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let signal = self.messages_of(queue);
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = if self.inner.due.may_have(queue, self.inner.clock.now_ms()) {
                self.receive_now(queue, &spec, max, visibility).await?
            } else {
                Vec::new()
            };
            let now = tokio::time::Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let nap = POLL_EVERY.min(deadline - now);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    async fn change_visibility(&self, queue: &str, receipt: &str, visibility: Duration) -> Result<(), QueueError> {
        self.spec(queue)?;
        if visibility > MAX_VISIBILITY {
            return Err(QueueError::Invalid(format!("visibility {visibility:?} is over 12 hours")));
        }
        let name = queue.to_owned();
        let (queue, receipt) = (queue.to_owned(), receipt.to_owned());
        let n = self
            .with_conn(move |conn, inner| {
                let at = inner.clock.now_ms().saturating_add(ms(visibility));
                let Some(seq) = seq_of(&receipt) else { return Ok::<_, QueueError>(0) };
                let n = conn
                    .prepare_cached(
                        "UPDATE messages SET visible_at_ms = ?1 WHERE seq = ?2 AND queue = ?3 AND receipt = ?4",
                    )
                    .and_then(|mut stmt| stmt.execute(params![at, seq, queue, receipt]))
                    .map_err(q_err)?;
                inner.due.lower(&queue, at);
                Ok(n)
            })
            .await?;
        if n == 0 {
            return Err(QueueError::StaleReceipt);
        }
        self.messages_of(&name).notify_waiters();
        Ok(())
    }

    async fn delete(&self, queue: &str, receipt: &str) -> Result<(), QueueError> {
        self.spec(queue)?;
        let (queue, receipt) = (queue.to_owned(), receipt.to_owned());
        let n = self
            .with_conn(move |conn, _| {
                let Some(seq) = seq_of(&receipt) else { return Ok(0) };
                conn.prepare_cached("DELETE FROM messages WHERE seq = ?1 AND queue = ?2 AND receipt = ?3")
                    .and_then(|mut stmt| stmt.execute(params![seq, queue, receipt]))
                    .map_err(q_err)
            })
            .await?;
        if n == 0 { Err(QueueError::StaleReceipt) } else { Ok(()) }
    }

    async fn delete_batch(&self, queue: &str, receipts: &[String]) -> Result<(), QueueError> {
        self.spec(queue)?;
        if receipts.is_empty() {
            return Ok(());
        }
        let (queue, receipts) = (queue.to_owned(), receipts.to_vec());
        self.with_conn(move |conn, _| {
            let tx = conn.savepoint().map_err(q_err)?;
            {
                let mut stmt = tx
                    .prepare_cached("DELETE FROM messages WHERE seq = ?1 AND queue = ?2 AND receipt = ?3")
                    .map_err(q_err)?;
                for receipt in receipts {
                    // A stale receipt deletes nothing: skipped, as the port says.
                    if let Some(seq) = seq_of(&receipt) {
                        stmt.execute(params![seq, queue, receipt]).map_err(q_err)?;
                    }
                }
            }
            tx.commit().map_err(q_err)
        })
        .await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let spec = self.spec(queue)?;
        let dlq = spec.redrive.map(|(_, dlq)| dlq);
        let name = queue.to_owned();
        self.scan_on_reader(move |conn, inner| {
            let now = inner.clock.now_ms();
            let (visible, in_flight, delayed, oldest): (i64, i64, i64, Option<i64>) = conn
                .prepare_cached(STATS)
                .and_then(|mut stmt| {
                    stmt.query_row(params![name, now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                })
                .map_err(q_err)?;
            let dlq_depth: i64 = match &dlq {
                Some(dlq) => conn
                    .prepare_cached("SELECT COUNT(*) FROM messages WHERE queue = ?1")
                    .and_then(|mut stmt| stmt.query_row(params![dlq], |r| r.get(0)))
                    .map_err(q_err)?,
                None => 0,
            };
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            Ok(QueueStats {
                name,
                visible: count(visible),
                in_flight: count(in_flight),
                delayed: count(delayed),
                oldest_age_s: oldest.map_or(0, |t| count(now.saturating_sub(t) / 1000)),
                dlq_depth: count(dlq_depth),
            })
        })
        .await
    }

    async fn redrive(&self, queue: &str) -> Result<u64, QueueError> {
        let dlq = self.dlq_of(queue)?;
        let name = queue.to_owned();
        let queue = queue.to_owned();
        let n = self
            .with_conn_offloaded(move |conn, inner| {
                let now = inner.clock.now_ms();
                let n = conn
                    .execute(
                        "UPDATE messages SET queue = ?1, receive_count = 0, visible_at_ms = ?2, receipt = NULL
                         WHERE queue = ?3",
                        params![queue, now, dlq],
                    )
                    .map_err(q_err)?;
                inner.due.lower(&queue, now);
                Ok::<_, QueueError>(n)
            })
            .await?;
        if n > 0 {
            self.messages_of(&name).notify_waiters();
        }
        Ok(n as u64)
    }

    async fn peek_dlq(&self, queue: &str, max: usize) -> Result<Vec<Received>, QueueError> {
        let dlq = self.dlq_of(queue)?;
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        self.with_conn_offloaded(move |conn, _| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, body, receive_count, sent_at_ms, grp FROM messages WHERE queue = ?1
                     ORDER BY sent_at_ms, seq LIMIT ?2",
                )
                .map_err(q_err)?;
            let rows = stmt
                .query_map(params![dlq, limit], |r| {
                    Ok(Received {
                        message_id: r.get(0)?,
                        // Peeking does not receive: there is no receipt to delete with.
                        receipt: String::new(),
                        body: r.get(1)?,
                        receive_count: r.get(2)?,
                        sent_at_ms: r.get(3)?,
                        group: Some(r.get::<_, String>(4)?).filter(|g| !g.is_empty()),
                    })
                })
                .map_err(q_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(q_err)
        })
        .await
    }

    async fn send_to_dlq(&self, queue: &str, body: String) -> Result<(), QueueError> {
        let dlq = self.dlq_of(queue)?;
        self.send_batch(&dlq, vec![OutMessage::new(body)]).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use tidings_core::ports::{OutMessage, Queues};

    use crate::{EmbeddedStore, QueueConfig};

    /// Every figure of a queue's statistics comes off the index: the query plan reads no
    /// message row (each carries its body), so a sample costs the index's entries, not the
    /// queue's bytes.
    #[tokio::test]
    async fn statistics_read_the_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        store.declare_queue(QueueConfig::new("q", 3)).unwrap();
        let plan: Vec<String> = store
            .with_reader(|conn| {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {}", super::STATS)).map_err(crate::db_err)?;
                let rows =
                    stmt.query_map(rusqlite::params!["q", 0], |r| r.get::<_, String>(3)).map_err(crate::db_err)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(crate::db_err)
            })
            .await
            .unwrap();
        assert_eq!(plan, ["SEARCH messages USING COVERING INDEX messages_in_turn (queue=?)"]);
    }

    fn plan_of(store: &EmbeddedStore, sql: &'static str, params: Vec<rusqlite::types::Value>) -> Vec<String> {
        let inner = store.inner.clone();
        let conn = inner.conn.lock().unwrap();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| r.get::<_, String>(3)).unwrap();
        rows.collect::<Result<Vec<_>, _>>().unwrap()
    }

    /// A receive finds the next group, whether it has a message due, and a group's due
    /// messages each by a search of the index: none walks another tenant's backlog.
    #[tokio::test]
    async fn a_receive_searches_the_index_by_group() {
        use rusqlite::types::Value;
        let store = EmbeddedStore::in_memory().unwrap();
        let text = |s: &str| Value::Text(s.to_owned());
        let next = plan_of(
            &store,
            "SELECT grp FROM messages WHERE queue = ?1 AND grp > ?2 ORDER BY grp LIMIT 1",
            vec![text("q"), text("a")],
        );
        assert_eq!(next, ["SEARCH messages USING COVERING INDEX messages_in_turn (queue=? AND grp>?)"]);
        let earliest = plan_of(
            &store,
            "SELECT MIN(visible_at_ms) FROM messages WHERE queue = ?1 AND grp = ?2",
            vec![text("q"), text("a")],
        );
        assert_eq!(earliest, ["SEARCH messages USING COVERING INDEX messages_in_turn (queue=? AND grp=?)"]);
        let take = plan_of(
            &store,
            "SELECT seq, id, body, receive_count, sent_at_ms, visible_at_ms FROM messages
             WHERE queue = ?1 AND grp = ?2 AND visible_at_ms <= ?3
               AND (visible_at_ms > ?4 OR (visible_at_ms = ?4 AND seq > ?5))
             ORDER BY visible_at_ms, seq LIMIT ?6",
            vec![text("q"), text("a"), Value::Integer(0), Value::Integer(0), Value::Integer(0), Value::Integer(10)],
        );
        assert_eq!(
            take,
            [
                "SEARCH messages USING INDEX messages_in_turn (queue=? AND grp=? AND visible_at_ms>? AND visible_at_ms<?)"
            ]
        );
    }

    fn in_group(group: &str, n: usize) -> Vec<OutMessage> {
        (0..n).map(|i| OutMessage::new(format!("{group}{i}")).in_group(Some(group.to_owned()))).collect()
    }

    fn groups_of(got: &[tidings_core::ports::Received]) -> Vec<String> {
        got.iter().map(|m| m.group.clone().unwrap_or_default()).collect()
    }

    /// A tenant's backlog sent first does not hold another's message behind it: the next
    /// receive takes the groups in turn, an equal share each, and within a group the oldest
    /// first; the turn goes on from the group served last.
    #[tokio::test]
    async fn a_receive_takes_the_groups_in_turn() {
        let store = EmbeddedStore::in_memory().unwrap();
        store.declare_queue(QueueConfig::new("q", 3)).unwrap();
        let hour = Duration::from_secs(3600);
        store.send_batch("q", in_group("b", 1000)).await.unwrap();
        store.send_batch("q", in_group("a", 1)).await.unwrap();
        let got = store.receive("q", 10, hour, Duration::ZERO).await.unwrap();
        let mut groups = groups_of(&got);
        groups.sort();
        assert_eq!(groups, ["a", "b", "b", "b", "b", "b", "b", "b", "b", "b"]);
        let b: Vec<&str> = got.iter().filter(|m| m.group.as_deref() == Some("b")).map(|m| m.body.as_str()).collect();
        assert_eq!(b, ["b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"]);

        // Three tenants with work: a receive of 9 takes 3 of each; one of 2 takes two groups
        // and the next receive starts with the third.
        store.send_batch("q", in_group("a", 20)).await.unwrap();
        store.send_batch("q", in_group("c", 20)).await.unwrap();
        let got = store.receive("q", 9, hour, Duration::ZERO).await.unwrap();
        let mut groups = groups_of(&got);
        groups.sort();
        assert_eq!(groups, ["a", "a", "a", "b", "b", "b", "c", "c", "c"]);
        let first = groups_of(&store.receive("q", 1, hour, Duration::ZERO).await.unwrap());
        let second = groups_of(&store.receive("q", 1, hour, Duration::ZERO).await.unwrap());
        let third = groups_of(&store.receive("q", 1, hour, Duration::ZERO).await.unwrap());
        let mut turn = [first, second, third].concat();
        turn.sort();
        assert_eq!(turn, ["a", "b", "c"], "one receive of one message each takes the next group");

        // Messages without a group are one group of their own, in turn with the tenants.
        store.send_batch("q", vec![OutMessage::new("plain")]).await.unwrap();
        let got = store.receive("q", 4, hour, Duration::ZERO).await.unwrap();
        assert!(got.iter().any(|m| m.body == "plain" && m.group.is_none()), "{:?}", groups_of(&got));
    }

    /// A group whose messages are delayed or in flight is passed over, not waited for; its
    /// messages come in its turn once due.
    #[tokio::test]
    async fn a_group_with_nothing_due_is_passed_over() {
        let clock = std::sync::Arc::new(tidings_core::ports::ManualClock::new(chrono::Utc::now()));
        let store = EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
        store.declare_queue(QueueConfig::new("q", 3)).unwrap();
        let later = (0..5)
            .map(|i| OutMessage::delayed(format!("late{i}"), Duration::from_secs(60)).in_group(Some("a".into())))
            .collect();
        store.send_batch("q", later).await.unwrap();
        store.send_batch("q", in_group("b", 5)).await.unwrap();
        let got = store.receive("q", 10, Duration::from_secs(600), Duration::ZERO).await.unwrap();
        assert_eq!(groups_of(&got), ["b"; 5]);
        clock.advance(chrono::Duration::seconds(61));
        let got = store.receive("q", 10, Duration::from_secs(600), Duration::ZERO).await.unwrap();
        assert_eq!(groups_of(&got), ["a"; 5]);
    }

    /// An idle long poll runs a receive (a job of the writer's) only when a message may be due:
    /// a second's wait on a queue whose one message is delayed a minute costs at most two
    /// receives, not twenty; a message sent while it waits is found at once, one whose
    /// visibility runs out or another's delay passes (a manual clock moves without a signal)
    /// at the next look, and a redriven one at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_long_poll_receives_only_when_a_message_may_be_due() {
        let dir = tempfile::tempdir().unwrap();
        let clock = std::sync::Arc::new(tidings_core::ports::ManualClock::new(chrono::Utc::now()));
        let store = EmbeddedStore::open_with_clock(&dir.path().join("q.db"), clock.clone()).unwrap();
        store.declare_queue(QueueConfig::new("q", 2)).unwrap();
        let jobs = |store: &EmbeddedStore| store.inner.writer.get().unwrap().sent();
        store.send_batch("q", vec![OutMessage::delayed("later", Duration::from_secs(60))]).await.unwrap();
        let before = jobs(&store);
        let got = store.receive("q", 10, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
        assert!(got.is_empty());
        let receives = jobs(&store) - before;
        assert!(receives <= 2, "{receives} receives in a second's wait with nothing due");

        // Sent while a poll waits: found at once.
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.receive("q", 10, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = std::time::Instant::now();
        store.send_batch("q", vec![OutMessage::new("now")]).await.unwrap();
        let got = waiting.await.unwrap();
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["now"]);
        assert!(sent.elapsed() < Duration::from_millis(500), "found {:?} after its send", sent.elapsed());

        // Its visibility (30 s) and the other's delay (60 s) run out on the manual clock while a
        // poll waits: both found, with no signal.
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.receive("q", 10, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        clock.advance(chrono::Duration::seconds(61));
        let mut got: Vec<(String, u32)> =
            waiting.await.unwrap().into_iter().map(|m| (m.body, m.receive_count)).collect();
        got.sort();
        assert_eq!(got, [("later".to_owned(), 1), ("now".to_owned(), 2)]);

        // Received twice, "now" moves to the DLQ at its next look; a redrive brings it back at once.
        clock.advance(chrono::Duration::seconds(31));
        let got = store.receive("q", 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["later"]);
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.receive("q", 10, Duration::from_secs(30), Duration::from_secs(5)).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(store.redrive("q").await.unwrap(), 1);
        let got = waiting.await.unwrap();
        assert_eq!(got.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["now"]);
    }

    /// A store an older version made (no group column, the index by visibility alone) opens:
    /// its queued messages are in the common group and received as before, and new ones carry
    /// their group.
    #[tokio::test]
    async fn a_store_from_before_the_groups_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE queues (name TEXT PRIMARY KEY, max_receives INTEGER NOT NULL);
                 CREATE TABLE messages (
                     seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, queue TEXT NOT NULL,
                     body TEXT NOT NULL, visible_at_ms INTEGER NOT NULL, receive_count INTEGER NOT NULL,
                     sent_at_ms INTEGER NOT NULL, receipt TEXT);
                 CREATE INDEX messages_waiting ON messages (queue, visible_at_ms, seq, receive_count, sent_at_ms);
                 INSERT INTO queues VALUES ('q', 3);
                 INSERT INTO messages (id, queue, body, visible_at_ms, receive_count, sent_at_ms, receipt)
                     VALUES ('m1', 'q', 'old1', 0, 0, 0, NULL), ('m2', 'q', 'old2', 0, 1, 0, NULL);",
            )
            .unwrap();
        }
        let store = EmbeddedStore::open(&path).unwrap();
        let indexes: Vec<String> = {
            let conn = store.inner.conn.lock().unwrap();
            let mut stmt =
                conn.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'messages'").unwrap();
            stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
        };
        assert_eq!(indexes, ["messages_in_turn"]);
        store.send_batch("q", in_group("a", 1)).await.unwrap();
        let got = store.receive("q", 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        let mut bodies: Vec<(&str, u32, Option<&str>)> =
            got.iter().map(|m| (m.body.as_str(), m.receive_count, m.group.as_deref())).collect();
        bodies.sort();
        assert_eq!(bodies, [("a0", 1, Some("a")), ("old1", 1, None), ("old2", 2, None)]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statistics_are_read_beside_the_writer_not_on_its_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        store.declare_queue(QueueConfig::new("q", 3)).unwrap();
        let messages = (0..3).map(|i| OutMessage::new(format!("m{i}"))).collect();
        store.send_batch("q", messages).await.unwrap();
        let got = store.receive("q", 1, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        assert_eq!(got.len(), 1);

        // The writer's connection is busy (as during a group commit) until the statistics
        // are back: read on it, they would wait for it, and this test would not end.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let inner = store.inner.clone();
        let holder = std::thread::spawn(move || {
            let _conn = inner.conn.lock().unwrap();
            held_tx.send(()).unwrap();
            let _ = done_rx.recv();
        });
        held_rx.recv().unwrap();
        let stats = tokio::time::timeout(Duration::from_secs(30), store.stats("q"))
            .await
            .expect("the statistics waited for the writer's connection")
            .unwrap();
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!((stats.visible, stats.in_flight, stats.delayed, stats.dlq_depth), (2, 1, 0, 0));
    }
}
