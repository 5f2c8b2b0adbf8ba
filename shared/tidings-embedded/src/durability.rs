//! Group commit: nothing the store answers is answered before it is on disk, and one `fsync`
//! of the write-ahead log covers every commit made while the one before it ran.
//!
//! The writer's connection runs `synchronous=NORMAL`: its commits reach the WAL file (the
//! operating system's cache) without a sync, under the writer's lock. Each piece of work on the
//! connection takes a number ([`WalSync::book`]); a thread of its own ([`sync_loop`]) syncs the
//! WAL file (`fdatasync`) and publishes the highest number the sync covered, and the caller
//! waits for its number ([`WalSync::durable`]) after it let go of the lock, so the next writers
//! commit while the disk works, and the sync after that covers all of them. NORMAL already
//! syncs the WAL before each checkpoint and the database file after it; with a sync of the WAL
//! after each commit that is what `synchronous=FULL` promises, with one sync for many commits.
//!
//! Reads wait too: a read on a reader connection may see a commit that is not synced yet (its
//! writer is still waiting), so a read returns only when every commit that had begun before it
//! ended is synced. An idempotent retry that finds the order of the first attempt answers
//! it only once it is on disk.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rusqlite::Connection;
use tokio::sync::watch;

/// A sync of the WAL that failed: the store answers nothing more (after a failed `fsync` the
/// kernel may have dropped the pages, so what the WAL holds is unknown until a restart).
#[derive(Clone, Debug)]
pub(crate) struct NotDurable(pub(crate) String);

impl From<NotDurable> for tidings_core::ports::StoreError {
    fn from(e: NotDurable) -> Self {
        tidings_core::ports::StoreError::Unavailable(format!("write-ahead log not synced: {}", e.0))
    }
}

impl From<NotDurable> for tidings_core::ports::QueueError {
    fn from(e: NotDurable) -> Self {
        tidings_core::ports::QueueError::Unavailable(format!("write-ahead log not synced: {}", e.0))
    }
}

/// What the sync thread has made durable.
#[derive(Clone, Debug, Default)]
struct Synced {
    /// Every piece of work numbered up to this is on disk.
    through: u64,
    /// Set once a sync failed; never cleared.
    failed: Option<String>,
}

/// The state the writers, the readers and the sync thread share.
struct Shared {
    /// The number of the last piece of work that began on the writer's connection (it may
    /// still be running, and its commit may be visible to readers already).
    begun: AtomicU64,
    /// The number of the last piece of work that ended (its commit, if any, is in the WAL).
    ended: AtomicU64,
    /// The number of the last piece of work that changed something (0: none yet).
    last_change: AtomicU64,
    /// How many times the WAL file was synced.
    syncs: AtomicU64,
    /// Guards the sync thread's sleep; `true` once the store is gone.
    stop: Mutex<bool>,
    wake: Condvar,
    synced: watch::Sender<Synced>,
    /// Tests hold the sync thread back with this, to see who waits for it.
    #[cfg(test)]
    paused: std::sync::atomic::AtomicBool,
}

/// The group commit of a store in a file (see the module docs).
pub(crate) struct WalSync {
    shared: Arc<Shared>,
    synced: watch::Receiver<Synced>,
}

impl WalSync {
    /// Starts the sync thread of the database at `db` (its WAL is `db` + `-wal`). The directory
    /// is synced once, so that the WAL file's own name survives a power loss.
    pub(crate) fn start(db: &Path) -> std::io::Result<Self> {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        let (tx, rx) = watch::channel(Synced::default());
        let shared = Arc::new(Shared {
            begun: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            last_change: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            synced: tx,
            #[cfg(test)]
            paused: std::sync::atomic::AtomicBool::new(false),
        });
        let thread = shared.clone();
        std::thread::Builder::new().name("tidings-wal-sync".into()).spawn(move || sync_loop(&thread, &wal))?;
        Ok(Self { shared, synced: rx })
    }

    /// Runs `work` on the writer's connection (locked by the caller) and books it; returns its
    /// result and the number to wait for with [`Self::durable`] before answering.
    pub(crate) fn book<T>(&self, conn: &mut Connection, work: impl FnOnce(&mut Connection) -> T) -> (T, u64) {
        let s = &self.shared;
        // Under the writer's lock: nobody else moves `begun` or `ended` meanwhile.
        let number = s.ended.load(Ordering::Acquire) + 1;
        s.begun.store(number, Ordering::Release);
        let before = conn.total_changes();
        let out = work(conn);
        let changed = conn.total_changes() != before;
        if changed {
            s.last_change.store(number, Ordering::Release);
        }
        s.ended.store(number, Ordering::Release);
        self.wake();
        // Work that changed nothing read what the writers before it committed.
        let wait_for = if changed { number } else { s.last_change.load(Ordering::Acquire) };
        (out, wait_for)
    }

    /// The number a read on a reader connection waits for, taken after the read: every piece
    /// of work that had begun by then (whose commit the read may have seen).
    pub(crate) fn read_mark(&self) -> u64 {
        self.shared.begun.load(Ordering::Acquire)
    }

    /// Waits until the work numbered `number` and everything before it is on disk.
    pub(crate) async fn durable(&self, number: u64) -> Result<(), NotDurable> {
        let covers = |s: &Synced| s.failed.is_some() || s.through >= number;
        let mut synced = self.synced.clone();
        let seen = match synced.wait_for(covers).await {
            Ok(seen) => seen.clone(),
            Err(_) => return Err(NotDurable("the sync thread stopped".into())),
        };
        match seen.failed {
            Some(e) => Err(NotDurable(e)),
            None => Ok(()),
        }
    }

    /// Syncs everything booked so far, on the calling thread (for the store's own set-up,
    /// which answers no request and has no runtime to wait on).
    pub(crate) fn wait_blocking(&self, number: u64) -> Result<(), NotDurable> {
        let mut synced = self.synced.clone();
        loop {
            {
                let seen = synced.borrow_and_update();
                if let Some(e) = &seen.failed {
                    return Err(NotDurable(e.clone()));
                }
                if seen.through >= number {
                    return Ok(());
                }
            }
            // The sync thread publishes quickly; a short sleep keeps this free of a runtime.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn wake(&self) {
        let _guard = self.shared.stop.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.wake.notify_one();
    }

    /// How many times the WAL file was synced.
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> u64 {
        self.shared.syncs.load(Ordering::Acquire)
    }

    /// The number of the last piece of work that ended.
    #[cfg(test)]
    pub(crate) fn ended(&self) -> u64 {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// The number through which everything is on disk.
    #[cfg(test)]
    pub(crate) fn synced_through(&self) -> u64 {
        self.synced.borrow().through
    }

    /// Holds the sync thread back (`true`) or lets it go.
    #[cfg(test)]
    pub(crate) fn pause(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Release);
        self.wake();
    }
}

impl Drop for WalSync {
    fn drop(&mut self) {
        let mut stop = self.shared.stop.lock().unwrap_or_else(|p| p.into_inner());
        *stop = true;
        self.shared.wake.notify_one();
    }
}

/// The sync thread: sleeps until work has ended past what it published, syncs the WAL file
/// when any of that work changed something, and publishes the number the sync covered. Commits
/// made while it syncs wait for the next round, which covers them all at once.
fn sync_loop(s: &Shared, wal: &Path) {
    let mut file: Option<(File, u64)> = None;
    let mut through = 0u64;
    loop {
        {
            let mut stop = s.stop.lock().unwrap_or_else(|p| p.into_inner());
            while !*stop && s.ended.load(Ordering::Acquire) <= through {
                stop = s.wake.wait(stop).unwrap_or_else(|p| p.into_inner());
            }
            if *stop {
                return;
            }
        }
        #[cfg(test)]
        while s.paused.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let target = s.ended.load(Ordering::Acquire);
        if s.last_change.load(Ordering::Acquire) > through {
            if let Err(e) = sync_wal(&mut file, wal) {
                tracing::error!(error = %e, "the write-ahead log could not be synced; the store answers nothing more");
                s.synced.send_modify(|synced| synced.failed = Some(e.to_string()));
                return;
            }
            s.syncs.fetch_add(1, Ordering::AcqRel);
        }
        through = target;
        s.synced.send_modify(|synced| synced.through = target);
    }
}

/// `fdatasync` of the WAL file, opened again when SQLite made a new one (a new inode at the
/// path: it deletes the WAL when its last connection closes).
fn sync_wal(file: &mut Option<(File, u64)>, wal: &Path) -> std::io::Result<()> {
    let current = inode(&std::fs::metadata(wal)?);
    if file.as_ref().is_none_or(|(_, ino)| *ino != current) {
        let opened = File::open(wal)?;
        let ino = inode(&opened.metadata()?);
        *file = Some((opened, ino));
    }
    match file {
        Some((f, _)) => f.sync_data(),
        None => Ok(()),
    }
}

#[cfg(unix)]
fn inode(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &std::fs::Metadata) -> u64 {
    0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;
    use tidings_core::ports::{Cond, Item, Key, StoreError, Table, Update, Write};

    use crate::EmbeddedStore;

    fn wal(store: &EmbeddedStore) -> &super::WalSync {
        store.inner.wal.get().expect("a store in a file has a group commit")
    }

    fn item(pk: &str, sk: &str) -> Item {
        Item::new(Key::new(pk, sk), json!({"n": 1}).as_object().unwrap().clone())
    }

    /// Until the work numbered `n` has ended (polling: the writers are on other tasks).
    async fn until_ended(store: &EmbeddedStore, n: u64) {
        while wal(store).ended() < n {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Until the sync thread has published everything that ended.
    async fn until_idle(store: &EmbeddedStore) {
        while wal(store).synced_through() < wal(store).ended() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_is_answered_only_after_the_wal_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        until_idle(&store).await;
        let (syncs, ended) = (wal(&store).syncs(), wal(&store).ended());

        wal(&store).pause(true);
        let writer = store.clone();
        let put = tokio::spawn(async move { writer.put(item("p", "1"), Cond::NotExists).await });
        until_ended(&store, ended + 1).await;
        // Committed (in the WAL, in the OS cache) but not synced: not answered.
        assert!(!put.is_finished(), "the put was answered before its commit was synced");
        assert_eq!(wal(&store).syncs(), syncs);

        wal(&store).pause(false);
        put.await.unwrap().unwrap();
        assert_eq!(wal(&store).syncs(), syncs + 1);
        assert!(wal(&store).synced_through() > ended);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_condition_waits_for_the_commits_it_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        until_idle(&store).await;
        let ended = wal(&store).ended();

        wal(&store).pause(true);
        let (a, b) = (store.clone(), store.clone());
        let first = tokio::spawn(async move { a.put(item("p", "1"), Cond::NotExists).await });
        until_ended(&store, ended + 1).await;
        // A second request refused on the first one's unsynced item: refused only once that
        // item is on disk (a power loss before would make the refusal a lie).
        let second = tokio::spawn(async move { b.put(item("p", "1"), Cond::NotExists).await });
        until_ended(&store, ended + 2).await;
        assert!(!second.is_finished(), "refused on a commit that was not synced yet");

        wal(&store).pause(false);
        first.await.unwrap().unwrap();
        assert!(matches!(second.await.unwrap(), Err(StoreError::ConditionFailed { index: 0 })));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_sync_covers_every_commit_made_while_the_last_one_ran() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        until_idle(&store).await;
        let (syncs, ended) = (wal(&store).syncs(), wal(&store).ended());

        wal(&store).pause(true);
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..50 {
            let writer = store.clone();
            puts.spawn(async move { writer.put(item("p", &i.to_string()), Cond::NotExists).await });
        }
        until_ended(&store, ended + 50).await;
        wal(&store).pause(false);
        while let Some(done) = puts.join_next().await {
            done.unwrap().unwrap();
        }
        assert_eq!(wal(&store).syncs(), syncs + 1, "50 commits made during one sync: one sync for all");
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
        let page = store
            .query("order", "", tidings_core::ports::QueryOpts { limit: 1000, ..Default::default() })
            .await
            .unwrap();
        let stored: Vec<String> = page.items.iter().map(|i| i.key.sk.clone()).collect();
        assert_eq!(stored, accepted, "the accepted orders, and only they, after a reopen");
    }
}
