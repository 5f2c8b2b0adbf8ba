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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Weak, mpsc};

use rusqlite::Connection;

use crate::Inner;

/// The most jobs in one transaction: bounds the wait of the first of a group.
const MAX_GROUP: usize = 256;

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
    jobs: mpsc::Sender<Job>,
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
        let (jobs, queue) = mpsc::channel::<Job>();
        let commits = std::sync::Arc::new(AtomicU64::new(0));
        #[cfg(test)]
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let counted = commits.clone();
        #[cfg(test)]
        let held = paused.clone();
        std::thread::Builder::new().name("tidings-writer".into()).spawn(move || {
            while let Ok(first) = queue.recv() {
                #[cfg(test)]
                while held.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let Some(inner) = inner.upgrade() else { return };
                run_group(&inner, first, &queue, &counted);
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

    /// Hands a job to the writer thread; `Err` (with the job back) when it is gone.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)?;
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

/// Runs `first` and every job waiting behind it in one transaction, commits, answers them all.
fn run_group(inner: &Inner, first: Job, queue: &mpsc::Receiver<Job>, commits: &AtomicU64) {
    let mut conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
    let mut answers = Vec::new();
    let committed = match conn.execute_batch("BEGIN IMMEDIATE") {
        Err(e) => {
            answers.push(first(None));
            answers.extend(queue.try_iter().map(|job| job(None)));
            Err(NotCommitted(e.to_string()))
        }
        Ok(()) => {
            answers.push(first(Some((&mut conn, inner))));
            while answers.len() < MAX_GROUP {
                let Ok(job) = queue.try_recv() else { break };
                answers.push(job(Some((&mut conn, inner))));
            }
            match conn.execute_batch("COMMIT") {
                Ok(()) => Ok(()),
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
