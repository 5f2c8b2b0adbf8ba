//! The change stream's reading side: [`EmbeddedChangeFeed`].

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tidings_core::ports::{ChangeFeed, ChangeRecord, Key, StoreError};

use crate::table::parse_attrs;
use crate::{EmbeddedStore, db_err};

/// How long `next_batch` waits for a record when there is none.
const BATCH_WAIT: Duration = Duration::from_millis(200);
/// The most records in one batch.
const MAX_BATCH: usize = 1000;

/// One consumer's view of the change stream, with a durable checkpoint (stored in the same
/// file). At least once: `next_batch` returns the records after the last `commit`, again and
/// again until they are committed. Several consumers may read the same stream independently.
#[derive(Clone, Debug)]
pub struct EmbeddedChangeFeed {
    store: EmbeddedStore,
    consumer: String,
}

impl EmbeddedStore {
    /// The change feed of the named consumer (its checkpoint survives restarts).
    pub fn change_feed(&self, consumer: &str) -> EmbeddedChangeFeed {
        EmbeddedChangeFeed { store: self.clone(), consumer: consumer.to_owned() }
    }

    /// Deletes the change records up to and including `seq` (the numeric value of
    /// [`ChangeRecord::seq`]). Returns how many were deleted. Consumers whose checkpoint is
    /// older lose those records: trim below [`EmbeddedStore::min_checkpoint`].
    pub async fn trim_changes(&self, up_to_seq: u64) -> Result<u64, StoreError> {
        let up_to = i64::try_from(up_to_seq).unwrap_or(i64::MAX);
        self.with_conn_offloaded(move |conn, _| {
            let n = conn.execute("DELETE FROM changes WHERE seq <= ?1", params![up_to]).map_err(db_err)?;
            Ok(n as u64)
        })
        .await
    }

    /// The lowest checkpoint of all consumers that ever committed (0 when none has).
    pub async fn min_checkpoint(&self) -> Result<u64, StoreError> {
        self.with_conn_offloaded(|conn, _| {
            let min: Option<i64> =
                conn.query_row("SELECT MIN(seq) FROM feed_checkpoints", [], |r| r.get(0)).map_err(db_err)?;
            Ok(u64::try_from(min.unwrap_or(0)).unwrap_or(0))
        })
        .await
    }
}

/// Formats a sequence number so that string order is numeric order (20 digits).
fn format_seq(seq: i64) -> String {
    format!("{seq:020}")
}

fn parse_seq(seq: &str) -> Result<i64, StoreError> {
    seq.trim().parse::<i64>().map_err(|_| StoreError::Invalid(format!("bad change sequence number {seq:?}")))
}

fn checkpoint(conn: &Connection, consumer: &str) -> Result<i64, StoreError> {
    let seq: Option<i64> = conn
        .query_row("SELECT seq FROM feed_checkpoints WHERE consumer = ?1", params![consumer], |r| r.get(0))
        .optional()
        .map_err(db_err)?;
    Ok(seq.unwrap_or(0))
}

fn read_after(conn: &Connection, consumer: &str, max: usize) -> Result<Vec<ChangeRecord>, StoreError> {
    let after = checkpoint(conn, consumer)?;
    let mut stmt = conn
        .prepare_cached("SELECT seq, pk, sk, old, new FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2")
        .map_err(db_err)?;
    let rows = stmt
        .query_map(params![after, i64::try_from(max).unwrap_or(i64::MAX)], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })
        .map_err(db_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, pk, sk, old, new) = row.map_err(db_err)?;
        let what = format_args!("change {seq} of {pk}/{sk}");
        let old = old.map(|j| parse_attrs(&what, &j)).transpose()?;
        let new = new.map(|j| parse_attrs(&what, &j)).transpose()?;
        out.push(ChangeRecord { seq: format_seq(seq), key: Key::new(pk, sk), old, new });
    }
    Ok(out)
}

#[async_trait]
impl ChangeFeed for EmbeddedChangeFeed {
    async fn next_batch(&self, max: usize) -> Result<Vec<ChangeRecord>, StoreError> {
        let max = max.clamp(1, MAX_BATCH);
        let deadline = tokio::time::Instant::now() + BATCH_WAIT;
        loop {
            // Register interest before looking, so that a commit in between is not missed.
            let notified = self.store.inner.changes.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let consumer = self.consumer.clone();
            let batch = self.store.with_reader(move |conn| read_after(conn, &consumer, max)).await?;
            if !batch.is_empty() {
                return Ok(batch);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn commit(&self, records: &[ChangeRecord]) -> Result<(), StoreError> {
        let mut max = None;
        for r in records {
            let seq = parse_seq(&r.seq)?;
            max = Some(max.map_or(seq, |m: i64| m.max(seq)));
        }
        let Some(max) = max else { return Ok(()) };
        let consumer = self.consumer.clone();
        self.store
            .with_conn(move |conn, _| {
                conn.execute(
                    "INSERT INTO feed_checkpoints (consumer, seq) VALUES (?1, ?2)
                     ON CONFLICT (consumer) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                    params![consumer, max],
                )
                .map_err(db_err)?;
                Ok(())
            })
            .await
    }
}
