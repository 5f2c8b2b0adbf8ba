//! The embedded backend: Tidings' table, change stream and queues in one SQLite file, in
//! process, with the same semantics as DynamoDB + DynamoDB Streams + SQS (the conformance suite
//! in `tidings-conformance` holds both backends to them).
//!
//! # Durability
//!
//! A call that returned `Ok` has its transaction on disk: the write-ahead log was synced
//! (`fsync`) before the answer, so it survives a power loss or an operating-system crash, not
//! only the process being killed (`kill -9`). Syncs are grouped (group commit): the writes
//! that arrive while one transaction commits are applied together in the next, one after the
//! other, each in a savepoint of its own, and committed with one sync (`writer.rs`). WAL mode,
//! `synchronous=FULL`. A reader sees a commit only once it is synced, so what a read returns is
//! on disk too. A store in memory keeps nothing.
//!
//! # Concurrency
//!
//! One `rusqlite::Connection` writes, behind a mutex. In a store in a file, a writer thread
//! runs the writes in groups (above) and answers each after its group's commit; the caller
//! awaits the answer, so the async runtime never waits for the disk. Writes are serialised, so
//! transactions never conflict ([`StoreError::Conflict`] is never returned); conditions are
//! evaluated with [`Cond::holds`] inside the writer's transaction, and a request whose
//! condition fails rolls back its own savepoint only, nothing of the others in its group.
//! Reads run on reader connections beside the writer; what may take long (a scan of a whole
//! queue, a redrive, trimming the stream) runs in `tokio::task::spawn_blocking`.
//!
//! # Use
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tidings_core::ports::{ChangeFeed, Queues, Table};
//! use tidings_embedded::{EmbeddedStore, QueueConfig};
//!
//! let store = EmbeddedStore::open(std::path::Path::new("tidings.db"))?;
//! store.declare_queue(QueueConfig::new("email-high", 5))?; // and its DLQ email-high-dlq
//! let table: Arc<dyn Table> = Arc::new(store.clone());
//! let queues: Arc<dyn Queues> = Arc::new(store.clone());
//! let feed: Arc<dyn ChangeFeed> = Arc::new(store.change_feed("outbox-relay"));
//! # Ok(()) }
//! ```
//!
//! `Table` and `Queues` both have a `delete`: on the concrete type, write
//! `Queues::delete(&store, ..)` or `Table::delete(&store, ..)`.
//!
//! # Layout
//!
//! - `items(pk, sk, attrs JSON)`: the table;
//! - `changes(seq, pk, sk, old JSON, new JSON)`: the change stream, appended in the same SQLite
//!   transaction as the write it records;
//! - `feed_checkpoints(consumer, seq)`: durable positions of [`EmbeddedChangeFeed`] consumers;
//! - `queues(name, max_receives)` and `messages(...)`: the queues and their DLQs.
//!
//! [`Cond::holds`]: tidings_core::ports::Cond::holds

mod feed;
mod queues;
mod table;
#[cfg(feature = "test-support")]
pub mod test_world;
mod writer;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::Connection;
use tidings_core::ports::{Clock, StoreError, SystemClock};
use tokio::sync::Notify;

pub use feed::EmbeddedChangeFeed;
pub use queues::QueueConfig;
use writer::NotCommitted;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS items (
    pk TEXT NOT NULL,
    sk TEXT NOT NULL,
    attrs TEXT NOT NULL,
    PRIMARY KEY (pk, sk)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    pk TEXT NOT NULL,
    sk TEXT NOT NULL,
    old TEXT,
    new TEXT
);
CREATE TABLE IF NOT EXISTS feed_checkpoints (
    consumer TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    max_receives INTEGER NOT NULL
);
-- A message's id is random and never looked up; a receipt starts with its message's seq, so
-- deletes and visibility changes find the row by its key. One index besides the key: every
-- index is written on each send, receive and delete.
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    queue TEXT NOT NULL,
    body TEXT NOT NULL,
    visible_at_ms INTEGER NOT NULL,
    receive_count INTEGER NOT NULL,
    sent_at_ms INTEGER NOT NULL,
    receipt TEXT,
    grp TEXT NOT NULL DEFAULT ''
);
DROP INDEX IF EXISTS messages_by_queue;
DROP INDEX IF EXISTS messages_by_receipt;
-- Earlier indexes, replaced by messages_in_turn (INDEXES below). The one by sending time made
-- every receive step over every delayed message (an order's expiry, due in minutes: a flash
-- sale queues tens of thousands).
DROP INDEX IF EXISTS messages_in_order;
DROP INDEX IF EXISTS messages_due;
";

/// The index, made after [`migrate`] (an older store's `messages` has no `grp` until then).
///
/// Receives take a queue's fairness groups (its tenants) in turn, and within a group walk its
/// visible messages, the longest visible first, stopping at the first one not yet due
/// (docs/delivery.md, "Fair lanes"). So the index is by group, then visibility: a receive finds
/// the next group by one seek past the last (`grp > ?`), and a group's due messages by one
/// more, never stepping over another tenant's backlog nor over a delayed message. It replaces
/// `messages_waiting` (the same without the group), which walked every tenant's messages in one
/// line. It also carries what a queue's statistics count (receive_count, sent_at_ms: both
/// change only when visible_at_ms does, or never), so those are read off the index alone, not
/// through each queued message's body.
const INDEXES: &str = "
DROP INDEX IF EXISTS messages_waiting;
CREATE INDEX IF NOT EXISTS messages_in_turn ON messages (queue, grp, visible_at_ms, seq, receive_count, sent_at_ms);
";

/// Brings a store an older version made up to this schema: the queues' fairness group
/// (`messages.grp`, every message already queued in the common group `''`).
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has_group: bool =
        conn.query_row("SELECT COUNT(*) > 0 FROM pragma_table_info('messages') WHERE name = 'grp'", [], |r| r.get(0))?;
    if !has_group {
        conn.execute_batch("ALTER TABLE messages ADD COLUMN grp TEXT NOT NULL DEFAULT ''")?;
    }
    Ok(())
}

/// Prepared statements kept per connection. rusqlite keeps 16 by default, fewer than the
/// statements one connection runs (reads by key, the shapes of range and prefix queries, the
/// queues' receives, sends and deletes, the stream, the group's `BEGIN` and `COMMIT`): past
/// that, a statement evicted was parsed and planned again the next time it ran.
const STATEMENT_CACHE: usize = 64;

/// What every connection of a store is given before its first statement.
///
/// **The query planner's stability guarantee (QPSG) is on.** Without it SQLite plans some
/// statements with the values bound to them (a bound `LIMIT ?`, a `LIKE ?` pattern, ranges
/// against STAT4 samples) and marks such a statement expired whenever that parameter is bound
/// again, so the next step parses and plans it anew (`sqlite3Reprepare`). Every page read here
/// binds its `LIMIT`: each `query` and `query_range` call was a fresh prepare despite the
/// statement cache (a campaign's planning reads one such page per member). With the guarantee
/// a statement keeps one plan for any values, which is all these statements need: their plans
/// follow the primary key `(pk, sk)` whatever the bounds.
fn tune(conn: &Connection) -> Result<(), StoreError> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(db_err)?;
    Ok(())
}

/// The shared state behind every handle.
pub(crate) struct Inner {
    pub(crate) conn: Mutex<Connection>,
    pub(crate) clock: Arc<dyn Clock>,
    /// Signalled after every commit that appended change records.
    pub(crate) changes: Notify,
    /// Signalled after sends, visibility changes and redrives.
    /// Per queue: signalled after sends, visibility changes and redrives to it (a send wakes
    /// the workers of its queue only, not every idle worker of every queue).
    pub(crate) messages: Mutex<HashMap<String, Arc<Notify>>>,
    /// Declared queues by name (a DLQ is declared with its queue, with no redrive of its own).
    pub(crate) queues: RwLock<HashMap<String, queues::QueueSpec>>,
    /// Per queue, the fairness group a receive served last: the next starts after it.
    pub(crate) turns: Mutex<HashMap<String, String>>,
    /// Per queue, when a receive may next find a message (`queues::DueTimes`).
    pub(crate) due: queues::DueTimes,
    /// Which items' changes are recorded (all when unset): see [`EmbeddedStore::set_stream_filter`].
    pub(crate) stream_filter: std::sync::OnceLock<StreamFilter>,
    /// Read-only connections of a store in a file (none in memory: reads then use `conn`).
    pub(crate) readers: std::sync::OnceLock<Vec<Mutex<Connection>>>,
    /// The writer thread of a store in a file (none in memory: writes run on the caller's
    /// thread, there is no disk to wait for).
    pub(crate) writer: std::sync::OnceLock<writer::Writer>,
}

/// Read-only connections of a store in a file. The last is kept for work that is not bulk
/// work (`tidings_core::lanes::bulk`): a campaign's reads take the others, so an OTP's reads
/// never wait for a reader behind a page's planning reads.
const READERS: usize = 3;

/// Says whether a change of an item is recorded in the change stream: its key, the item
/// before the write and after it (`None`: absent).
pub type StreamFilter =
    fn(&tidings_core::ports::Key, Option<&tidings_core::ports::Attrs>, Option<&tidings_core::ports::Attrs>) -> bool;

/// The embedded store: a [`Table`](tidings_core::ports::Table), a source of
/// [`EmbeddedChangeFeed`]s and [`Queues`](tidings_core::ports::Queues), all in one SQLite file.
/// Cheap to clone: clones share one connection.
#[derive(Clone)]
pub struct EmbeddedStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").finish_non_exhaustive()
    }
}

/// Creates the data directory (and its parents) readable by its owner only (0700): it holds
/// every tenant's contacts and the local signing key. An existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Creates the database file 0600 when absent, and takes group and others' access away from
/// an existing one and its `-wal` and `-shm` files.
fn make_private(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    drop(options.open(path)?);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            match std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o600)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

impl EmbeddedStore {
    /// Opens (creating when absent) the store in the file at `path`, on the system clock.
    /// What a call answered is on disk, synced, before the answer (see the crate docs).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_clock(path, Arc::new(SystemClock))
    }

    /// Opens the store at `path`; queue delays and visibility follow `clock`. The file is its
    /// owner's alone (0600, an existing one too); SQLite gives its `-wal` and `-shm` files the
    /// database file's mode.
    pub fn open_with_clock(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        make_private(path).map_err(|e| StoreError::Unavailable(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(path).map_err(db_err)?;
        Self::open_conn(path, conn, clock)
    }

    /// Opens the store a `tidings serve` made at `path`, never a new one: no file is created,
    /// and a file that is not a Tidings store (no `items` table) is refused untouched. For the
    /// commands that read or change a running system's data, where a new empty store in the
    /// wrong directory would answer as if that system had nothing
    /// (docs/operators.md, "The `tidings` command").
    pub fn open_existing_with_clock(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        use rusqlite::OpenFlags;
        let unavailable = |why: String| StoreError::Unavailable(format!("{}: {why}", path.display()));
        if !path.is_file() {
            return Err(unavailable("no Tidings store there".into()));
        }
        // Without SQLITE_OPEN_CREATE: should the file go in between, nothing is made in its place.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(path, flags).map_err(db_err)?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'items'", [], |r| r.get(0))
            .map_err(|e| unavailable(format!("not a Tidings store ({e})")))?;
        if tables == 0 {
            return Err(unavailable("not a Tidings store (no items table)".into()));
        }
        make_private(path).map_err(|e| unavailable(e.to_string()))?;
        Self::open_conn(path, conn, clock)
    }

    fn open_conn(path: &Path, conn: Connection, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        tune(&conn)?;
        // WAL + FULL: each commit syncs the WAL before it counts (and before readers see it);
        // the writer thread makes one commit of many requests (writer.rs).
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(db_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!("could not enable WAL (journal_mode={mode})")));
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(db_err)?;
        // A page cache of 32 MiB (the default is 2 MiB): a campaign's working set (queued
        // messages, deliveries being claimed and recorded, the indexes) stays in memory
        // instead of being read again through the kernel on every statement.
        conn.pragma_update(None, "cache_size", -32 * 1024).map_err(db_err)?;
        // Checkpoints every ~40 MiB of WAL instead of every 4 MiB: each copies the WAL's pages
        // into the database file, and a page written many times between two is copied once.
        conn.pragma_update(None, "wal_autocheckpoint", 10_000).map_err(db_err)?;
        let store = Self::setup(conn, clock)?;
        let writer = writer::Writer::start(Arc::downgrade(&store.inner))
            .map_err(|e| StoreError::Unavailable(format!("writer thread: {e}")))?;
        let _ = store.inner.writer.set(writer);
        // Readers beside the writer: in WAL mode a reader sees every committed transaction
        // and never waits for the writer, so reads (a campaign's planning and claiming read
        // as much as they write) run on another core while the writer commits.
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let reader = Connection::open(path).map_err(db_err)?;
            tune(&reader)?;
            reader.busy_timeout(std::time::Duration::from_secs(5)).map_err(db_err)?;
            reader.pragma_update(None, "query_only", true).map_err(db_err)?;
            // A small cache: every commit of the writer empties a reader's cache at its next
            // read (the WAL changed), and SQLite empties it by walking its whole hash table,
            // which keeps the size the cache once reached. At 8 MiB that walk over 8,192 slots
            // was 3% of an order's time; at 2 MiB it is at most 1,024. A read of one page of
            // items touches far fewer pages than that.
            reader.pragma_update(None, "cache_size", -2 * 1024).map_err(db_err)?;
            readers.push(Mutex::new(reader));
        }
        let _ = store.inner.readers.set(readers);
        Ok(store)
    }

    /// A store in memory (for tests), on the system clock. Nothing survives the process.
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::in_memory_with_clock(Arc::new(SystemClock))
    }

    /// A store in memory whose queues follow `clock`.
    pub fn in_memory_with_clock(clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let conn = Connection::open_in_memory().map_err(db_err)?;
        tune(&conn)?;
        Self::setup(conn, clock)
    }

    fn setup(conn: Connection, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(db_err)?;
        conn.execute_batch(SCHEMA).map_err(db_err)?;
        migrate(&conn).map_err(db_err)?;
        conn.execute_batch(INDEXES).map_err(db_err)?;
        let declared = queues::load_declared(&conn).map_err(db_err)?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                clock,
                changes: Notify::new(),
                messages: Mutex::new(HashMap::new()),
                queues: RwLock::new(declared),
                turns: Mutex::new(HashMap::new()),
                due: queues::DueTimes::default(),
                stream_filter: std::sync::OnceLock::new(),
                readers: std::sync::OnceLock::new(),
                writer: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Records in the change stream only the changes of items `filter` accepts, as an event
    /// source mapping's filter does on AWS (there the stream has everything and the mapping
    /// drops the rest; here nothing else is written). Set once, before the store is used;
    /// `false` when a filter was set already.
    pub fn set_stream_filter(&self, filter: StreamFilter) -> bool {
        self.inner.stream_filter.set(filter).is_ok()
    }

    /// The clock the queues follow.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// Runs `f` on the writer's connection and returns once what it wrote is on disk. In a
    /// store in a file, `f` goes to the writer thread and runs in the next group (see the
    /// crate docs); in memory, it runs on the calling thread. A statement or a small
    /// transaction takes microseconds; what may take long (a scan of a whole queue, a redrive,
    /// trimming the stream) goes through [`Self::with_conn_offloaded`]. A write in `f` opens a
    /// savepoint (not a transaction: it runs inside its group's), so that a failure rolls back
    /// its own writes only.
    pub(crate) async fn with_conn<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<NotCommitted>,
        F: FnOnce(&mut Connection, &Inner) -> Result<T, E> + Send + 'static,
    {
        let Some(writer) = self.inner.writer.get() else {
            let mut conn = self.inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            return f(&mut conn, &self.inner);
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<T, E>>();
        let job: writer::Job = Box::new(move |at| {
            let out = at.map(|(conn, inner)| f(conn, inner));
            Box::new(move |committed| {
                let answer = match (committed, out) {
                    (Ok(()), Some(out)) => out,
                    (Err(e), _) => Err(E::from(e)),
                    (Ok(()), None) => Err(E::from(NotCommitted("the work did not run".into()))),
                };
                // A caller that went away (a cancelled request) needs no answer.
                let _ = tx.send(answer);
            })
        });
        if writer.submit(job, tidings_core::lanes::is_bulk()).is_err() {
            return Err(E::from(NotCommitted("the writer thread stopped".into())));
        }
        rx.await.unwrap_or_else(|_| Err(E::from(NotCommitted("the writer thread stopped".into()))))
    }

    /// Runs a read on a reader connection (the first free one; else waits for one), or on
    /// the writer's connection for a store in memory. A reader sees only synced commits.
    pub(crate) async fn with_reader<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<NotCommitted>,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let Some(readers) = self.inner.readers.get().filter(|r| !r.is_empty()) else {
            return self.with_conn(|conn, _| f(conn)).await;
        };
        // The last reader is kept for work that is not bulk (see READERS); with one reader,
        // everything shares it.
        let (shared, kept) = readers.split_at((readers.len() - 1).max(1));
        let (first, then): (&[Mutex<Connection>], &[Mutex<Connection>]) =
            if tidings_core::lanes::is_bulk() || kept.is_empty() { (shared, &[]) } else { (kept, shared) };
        for reader in first.iter().chain(then) {
            if let Ok(conn) = reader.try_lock() {
                return f(&conn);
            }
        }
        let at = READ_TURN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % first.len();
        let conn = first[at].lock().unwrap_or_else(|p| p.into_inner());
        f(&conn)
    }

    /// Runs `f` on the connection in a blocking thread: for work that may take long (scans of a
    /// whole queue, redrives, trimming the stream). Its statements commit on their own, each
    /// synced (`synchronous=FULL`).
    pub(crate) async fn with_conn_offloaded<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static + From<JoinFailed>,
        F: FnOnce(&mut Connection, &Inner) -> Result<T, E> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn, &inner)
        })
        .await
        .map_err(|e| E::from(JoinFailed(e.to_string())))?
    }
}

/// Which reader a read waits for when all are busy.
static READ_TURN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A blocking task that did not finish (panicked or cancelled).
pub(crate) struct JoinFailed(pub(crate) String);

impl From<JoinFailed> for StoreError {
    fn from(e: JoinFailed) -> Self {
        StoreError::Unavailable(format!("database task failed: {}", e.0))
    }
}

impl From<JoinFailed> for tidings_core::ports::QueueError {
    fn from(e: JoinFailed) -> Self {
        tidings_core::ports::QueueError::Unavailable(format!("database task failed: {}", e.0))
    }
}

pub(crate) fn db_err(e: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {e}"))
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_data_directory_and_the_database_files_are_the_owners_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data").join("tidings");
        create_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("data")), 0o700);
        let path = dir.join("tidings.db");
        let store = EmbeddedStore::open(&path).unwrap();
        store.declare_queue(QueueConfig::new("q", 3)).unwrap();
        for name in ["tidings.db", "tidings.db-wal", "tidings.db-shm"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
        drop(store);
        // A file an older version left readable by everyone is tightened on open.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _store = EmbeddedStore::open(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
    }

    /// `open_existing_with_clock` makes nothing where there is no store, leaves a file that is
    /// not one untouched, and opens one `open` made, with its data.
    #[tokio::test]
    async fn opening_an_existing_store_never_makes_one() {
        use tidings_core::ports::{Item, Key, Table};
        let clock = || -> Arc<dyn Clock> { Arc::new(SystemClock) };
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nowhere").join("tidings.db");
        let e = EmbeddedStore::open_existing_with_clock(&missing, clock()).unwrap_err();
        assert!(e.to_string().contains("no Tidings store there"), "{e}");
        assert!(!tmp.path().join("nowhere").exists(), "a directory was made");

        let other = tmp.path().join("other.db");
        drop(Connection::open(&other).unwrap());
        let before = std::fs::read(&other).unwrap();
        let e = EmbeddedStore::open_existing_with_clock(&other, clock()).unwrap_err();
        assert!(e.to_string().contains("not a Tidings store"), "{e}");
        assert_eq!(std::fs::read(&other).unwrap(), before, "the other file was changed");

        let path = tmp.path().join("tidings.db");
        let key = Key::new("pk", "sk");
        let store = EmbeddedStore::open(&path).unwrap();
        store.put(Item::new(key.clone(), Default::default()), tidings_core::ports::Cond::Always).await.unwrap();
        drop(store);
        let again = EmbeddedStore::open_existing_with_clock(&path, clock()).unwrap();
        assert!(again.get(&key).await.unwrap().is_some(), "the stored item is not there");
    }
}
