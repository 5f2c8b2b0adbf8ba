//! Group commit: nothing the store answers is answered before it is on disk, and one `fsync`
//! covers every write that arrived while the one before it ran.
//!
//! A store in a file has one writer thread. Each piece of work on the writer's connection is a
//! [`Job`] sent to it; the thread takes every job that is waiting (up to [`MAX_GROUP`]), runs
//! them one after the other inside one `BEGIN IMMEDIATE` transaction, commits it (with
//! `synchronous=FULL`: SQLite syncs the WAL before the commit counts), and only then answers
//! each job. While it commits, the next jobs queue up, and the next commit takes them all.
//!
//! Each job still sees the effects of the jobs before it (they run in order, on one
//! connection), and each runs inside a `SAVEPOINT` of its own (the table's and the queues'
//! writes open one), so a job that fails, a refused condition for instance, rolls back only
//! its own writes, never those of the others in its group. A reader connection sees a commit
//! only once it is synced (SQLite updates the WAL index after the sync), so reads never wait.
//!
//! **Two classes of jobs.** Jobs submitted from bulk work (`tidings_core::lanes::bulk`: the
//! low-priority queues' workers, a campaign's pages and sends) wait behind every other job (an
//! API request, the relay, a high-priority queue's worker), which a group takes first,
//! whenever they arrived. And a group takes bulk jobs only while the jobs it ran so far took
//! less than [`BULK_BUDGET`] (at least one a group, so bulk work never starves): a job that
//! arrives while a group runs waits for at most about that long before its own group. Without
//! the two, an OTP's every write (accepted, relayed, planned, claimed, recorded) queued behind
//! up to a few dozen campaign transactions, each of up to 100 item writes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Weak, mpsc};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::Inner;

/// The most jobs in one transaction: bounds the wait of the first of a group.
const MAX_GROUP: usize = 256;

/// A group takes no more bulk jobs once its jobs ran this long.
pub(crate) const BULK_BUDGET: Duration = Duration::from_millis(2);

/// A job and whether it is bulk work.
type Queued = (Job, bool);

/// The jobs taken off the channel and not yet run, by class.
#[derive(Default)]
struct Waiting {
    first: VecDeque<Job>,
    bulk: VecDeque<Job>,
}

impl Waiting {
    fn push(&mut self, (job, bulk): Queued) {
        if bulk { self.bulk.push_back(job) } else { self.first.push_back(job) }
    }

    fn is_empty(&self) -> bool {
        self.first.is_empty() && self.bulk.is_empty()
    }

    /// The next job of a group: one that is not bulk work, else a bulk one when `bulk` allows.
    fn next(&mut self, bulk: bool) -> Option<Queued> {
        match self.first.pop_front() {
            Some(job) => Some((job, false)),
            None if bulk => self.bulk.pop_front().map(|job| (job, true)),
            None => None,
        }
    }

    /// Everything sent so far, off the channel.
    fn drain(&mut self, queue: &mpsc::Receiver<Queued>) {
        while let Ok(q) = queue.try_recv() {
            self.push(q);
        }
    }
}

/// A group's transaction that did not commit: none of its jobs' writes happened.
#[derive(Clone, Debug)]
pub(crate) struct NotCommitted(pub(crate) String);

impl From<NotCommitted> for tidings_core::ports::StoreError {
    fn from(e: NotCommitted) -> Self {
        tidings_core::ports::StoreError::Unavailable(format!("not committed: {}", e.0))
    }
}

impl From<NotCommitted> for tidings_core::ports::QueueError {
    fn from(e: NotCommitted) -> Self {
        tidings_core::ports::QueueError::Unavailable(format!("not committed: {}", e.0))
    }
}

/// What a job does once its group's commit is known: answers its caller.
pub(crate) type Answer = Box<dyn FnOnce(Result<(), NotCommitted>) + Send>;

/// One caller's work: runs on the writer's connection inside the group's transaction (`None`:
/// the transaction could not begin, so nothing runs) and returns how to answer.
pub(crate) type Job = Box<dyn FnOnce(Option<(&mut Connection, &Inner)>) -> Answer + Send>;

/// The writer thread's end of a store.
pub(crate) struct Writer {
    jobs: mpsc::Sender<Queued>,
    /// Groups committed (each one sync of the WAL).
    #[cfg_attr(not(test), allow(dead_code))]
    commits: std::sync::Arc<AtomicU64>,
    /// Tests hold the writer back with this, to let jobs queue up.
    #[cfg(test)]
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Jobs sent (tests wait for them to be queued).
    #[cfg(test)]
    sent: AtomicU64,
}

impl Writer {
    /// Starts the writer thread of `inner`'s connection; it ends when the store is dropped.
    pub(crate) fn start(inner: Weak<Inner>) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Queued>();
        let commits = std::sync::Arc::new(AtomicU64::new(0));
        #[cfg(test)]
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counted = commits.clone();
        #[cfg(test)]
        let held = paused.clone();
        std::thread::Builder::new().name("tidings-writer".into()).spawn(move || {
            let mut waiting = Waiting::default();
            loop {
                if waiting.is_empty() {
                    let Ok(q) = queue.recv() else { return };
                    waiting.push(q);
                }
                #[cfg(test)]
                while held.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let Some(inner) = inner.upgrade() else { return };
                run_group(&inner, &mut waiting, &queue, &counted);
            }
        })?;
        Ok(Self {
            jobs,
            commits,
            #[cfg(test)]
            paused,
            #[cfg(test)]
            sent: AtomicU64::new(0),
        })
    }

    /// Hands a job to the writer thread (`bulk`: bulk work, see the module's docs); `Err`
    /// (with the job back) when it is gone.
    pub(crate) fn submit(&self, job: Job, bulk: bool) -> Result<(), Job> {
        self.jobs.send((job, bulk)).map_err(|e| e.0.0)?;
        #[cfg(test)]
        self.sent.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Groups committed so far.
    #[cfg(test)]
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Acquire)
    }

    /// Jobs handed to the writer so far.
    #[cfg(test)]
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// Holds the writer thread back (`true`) before its next group, or lets it go.
    #[cfg(test)]
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }
}

/// Runs waiting jobs in one transaction, commits, answers them all: every job that is not bulk
/// work first, then bulk jobs while the group has run for less than [`BULK_BUDGET`] (at least
/// one), up to [`MAX_GROUP`] in all.
fn run_group(inner: &Inner, waiting: &mut Waiting, queue: &mpsc::Receiver<Queued>, commits: &AtomicU64) {
    let mut conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
    let mut answers = Vec::new();
    waiting.drain(queue);
    let committed = match crate::table::run_cached(&conn, "BEGIN IMMEDIATE", []) {
        Err(e) => {
            answers.extend(waiting.first.drain(..).map(|job| job(None)));
            answers.extend(waiting.bulk.drain(..).map(|job| job(None)));
            Err(NotCommitted(e.to_string()))
        }
        Ok(_) => {
            let started = Instant::now();
            let mut bulk_taken = false;
            while answers.len() < MAX_GROUP {
                waiting.drain(queue);
                let Some((job, bulk)) = waiting.next(!bulk_taken || started.elapsed() < BULK_BUDGET) else { break };
                bulk_taken |= bulk;
                answers.push(job(Some((&mut conn, inner))));
            }
            match crate::table::run_cached(&conn, "COMMIT", []) {
                Ok(_) => Ok(()),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    tracing::error!(error = %e, jobs = answers.len(), "a group's commit failed");
                    Err(NotCommitted(e.to_string()))
                }
            }
        }
    };
    drop(conn);
    // Counted before the answers: a caller that got its answer sees its group counted (the
    // tests read the count right after their writes return).
    commits.fetch_add(1, Ordering::AcqRel);
    for answer in answers {
        answer(committed.clone());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use serde_json::json;
    use tidings_core::ports::{Cond, Item, Key, QueryOpts, StoreError, Table, Update, Write};

    use crate::EmbeddedStore;

    fn writer(store: &EmbeddedStore) -> &super::Writer {
        store.inner.writer.get().expect("a store in a file has a writer thread")
    }

    fn item(pk: &str, sk: &str) -> Item {
        Item::new(Key::new(pk, sk), json!({"n": 1}).as_object().unwrap().clone())
    }

    /// Until `n` jobs in all were handed to the writer (polling: the callers are other tasks).
    async fn until_sent(store: &EmbeddedStore, n: u64) {
        while writer(store).sent() < n {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn the_writing_connection_syncs_every_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        let conn = store.inner.conn.lock().unwrap();
        let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(synchronous, 2, "synchronous=FULL: the WAL is synced at each commit");
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_is_not_bulk_goes_before_the_bulk_writes_queued_ahead_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        let sent = writer(&store).sent();
        writer(&store).pause(true);
        // 30 bulk writes (a campaign's workers) queue first, each creating the same item.
        let mut bulk = Vec::new();
        for i in 0..30 {
            let store = store.clone();
            let put = async move {
                let it =
                    Item::new(Key::new("race", "k"), json!({"by": format!("bulk {i}")}).as_object().unwrap().clone());
                store.put(it, Cond::NotExists).await
            };
            bulk.push(tokio::spawn(tidings_core::lanes::bulk(put)));
        }
        until_sent(&store, sent + 30).await;
        // Then one that is not (an OTP's), last of all.
        let urgent = {
            let store = store.clone();
            tokio::spawn(async move {
                let it = Item::new(Key::new("race", "k"), json!({"by": "urgent"}).as_object().unwrap().clone());
                store.put(it, Cond::NotExists).await
            })
        };
        until_sent(&store, sent + 31).await;
        writer(&store).pause(false);
        urgent.await.unwrap().expect("the urgent write ran first: the item did not exist yet");
        // Every bulk write ran after it and found the item there (the first of them too,
        // though the writer had taken it off its channel before it paused).
        for b in bulk {
            assert!(matches!(b.await.unwrap(), Err(StoreError::ConditionFailed { .. })), "a bulk write went first");
        }
        let got = store.get(&Key::new("race", "k")).await.unwrap().unwrap();
        assert_eq!(got.attrs["by"], json!("urgent"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_takes_bulk_jobs_for_its_budget_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        let (commits, sent) = (writer(&store).commits(), writer(&store).sent());
        writer(&store).pause(true);
        // 20 bulk jobs of at least 1 ms each: with a 2 ms budget a group holds at most 3.
        let mut jobs = Vec::new();
        for _ in 0..20 {
            let store = store.clone();
            let job = async move {
                store
                    .with_conn(|_, _| {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        Ok::<_, StoreError>(())
                    })
                    .await
            };
            jobs.push(tokio::spawn(tidings_core::lanes::bulk(job)));
        }
        until_sent(&store, sent + 20).await;
        writer(&store).pause(false);
        for j in jobs {
            j.await.unwrap().unwrap();
        }
        let groups = writer(&store).commits() - commits;
        assert!(groups >= 20 / 3, "20 bulk jobs of 1 ms in {groups} groups: the budget was not kept");
        assert!(super::BULK_BUDGET < std::time::Duration::from_millis(3));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_commit_answers_every_write_that_queued_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        let (commits, sent) = (writer(&store).commits(), writer(&store).sent());

        writer(&store).pause(true);
        let mut puts = Vec::new();
        for i in 0..50 {
            let store = store.clone();
            puts.push(tokio::spawn(async move { store.put(item("p", &i.to_string()), Cond::NotExists).await }));
        }
        until_sent(&store, sent + 50).await;
        // Nothing is answered before its group commits (and a commit syncs: FULL, above).
        assert!(puts.iter().all(|p| !p.is_finished()), "a write was answered before its commit");

        writer(&store).pause(false);
        for put in puts {
            put.await.unwrap().unwrap();
        }
        assert_eq!(writer(&store).commits(), commits + 1, "50 writes queued during one commit: one commit for all");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_request_rolls_back_its_own_writes_only_and_its_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = EmbeddedStore::open(&path).unwrap();
        let (commits, sent) = (writer(&store).commits(), writer(&store).sent());

        writer(&store).pause(true);
        let a = store.clone();
        let first = tokio::spawn(async move {
            a.transact(vec![
                Write::Put { item: item("k", "1"), cond: Cond::NotExists },
                Write::Put { item: item("k", "2"), cond: Cond::NotExists },
            ])
            .await
        });
        until_sent(&store, sent + 1).await;
        // Sees the first request's k/1 in the same group, and is refused on it.
        let b = store.clone();
        let second = tokio::spawn(async move {
            b.transact(vec![
                Write::Put { item: item("k", "3"), cond: Cond::NotExists },
                Write::Put { item: item("k", "1"), cond: Cond::NotExists },
            ])
            .await
        });
        until_sent(&store, sent + 2).await;
        let c = store.clone();
        let third = tokio::spawn(async move { c.put(item("k", "4"), Cond::NotExists).await });
        until_sent(&store, sent + 3).await;

        writer(&store).pause(false);
        first.await.unwrap().unwrap();
        assert!(matches!(second.await.unwrap(), Err(StoreError::ConditionFailed { index: 1 })));
        third.await.unwrap().unwrap();
        assert_eq!(writer(&store).commits(), commits + 1, "the three in one group");
        drop(store);

        let store = EmbeddedStore::open(&path).unwrap();
        let page = store.query("k", "", QueryOpts::default()).await.unwrap();
        let keys: Vec<&str> = page.items.iter().map(|i| i.key.sk.as_str()).collect();
        assert_eq!(keys, ["1", "2", "4"], "the refused request's k/3 rolled back, the others kept");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_units_go_to_as_many_orders_and_each_answer_survives_a_reopen() {
        const UNITS: i64 = 7;
        const ORDERS: usize = 60;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = EmbeddedStore::open(&path).unwrap();
        let stock = Key::new("sku#hot", "stock");
        let attrs = json!({"available": UNITS, "reserved": 0}).as_object().unwrap().clone();
        store.put(Item::new(stock.clone(), attrs), Cond::NotExists).await.unwrap();

        let mut orders = tokio::task::JoinSet::new();
        for i in 0..ORDERS {
            let (store, stock) = (store.clone(), stock.clone());
            orders.spawn(async move {
                let order =
                    Item::new(Key::new("order", format!("{i:03}")), json!({"units": 1}).as_object().unwrap().clone());
                let writes = vec![
                    Write::Update {
                        key: stock,
                        updates: vec![Update::add("available", -1), Update::add("reserved", 1)],
                        cond: Cond::ge("available", 1),
                    },
                    Write::Put { item: order, cond: Cond::NotExists },
                ];
                (i, store.transact(writes).await)
            });
        }
        let mut accepted = Vec::new();
        while let Some(done) = orders.join_next().await {
            match done.unwrap() {
                (i, Ok(())) => accepted.push(format!("{i:03}")),
                (_, Err(StoreError::ConditionFailed { index: 0 })) => {}
                (i, Err(e)) => panic!("order {i}: {e}"),
            }
        }
        accepted.sort();
        assert_eq!(accepted.len(), UNITS as usize, "as many orders accepted as units");
        drop(store);

        let store = EmbeddedStore::open(&path).unwrap();
        let stock = store.get(&stock).await.unwrap().unwrap();
        assert_eq!(stock.attrs["available"], json!(0));
        assert_eq!(stock.attrs["reserved"], json!(UNITS));
        let page = store.query("order", "", QueryOpts { limit: 1000, ..Default::default() }).await.unwrap();
        let stored: Vec<String> = page.items.iter().map(|i| i.key.sk.clone()).collect();
        assert_eq!(stored, accepted, "the accepted orders, and only they, after a reopen");
    }
}
