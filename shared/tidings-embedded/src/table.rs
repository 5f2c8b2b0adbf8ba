//! `impl Table for EmbeddedStore`, and the change records its writes append.

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tidings_core::ports::{Attrs, Cond, Item, Key, Page, QueryOpts, StoreError, Table, Update, Updating, Write};

use crate::{EmbeddedStore, db_err};

/// The default page size of a query.
const DEFAULT_LIMIT: usize = 100;
/// The largest page size of a query.
const MAX_LIMIT: usize = 1000;

#[async_trait]
impl Table for EmbeddedStore {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        let key = key.clone();
        self.with_reader(move |conn| Ok(read_attrs(conn, &key)?.map(|attrs| Item::new(key, attrs)))).await
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = keys.to_vec();
        self.with_reader(move |conn| {
            // One read transaction: the answers are of one moment, as one BatchGetItem's are
            // for each of its items.
            run_cached(conn, "BEGIN", [])?;
            let mut out = Vec::with_capacity(keys.len());
            let mut failed = None;
            for key in keys {
                match read_attrs(conn, &key) {
                    Ok(attrs) => out.push(attrs.map(|attrs| Item::new(key, attrs))),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            run_cached(conn, "COMMIT", [])?;
            match failed {
                Some(e) => Err(e),
                None => Ok(out),
            }
        })
        .await
    }

    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        self.write_all(vec![Write::Put { item, cond }]).await.map(|_| ())
    }

    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        let key = key.clone();
        let mut after = self.write_all(vec![Write::Update { key: key.clone(), updates, cond }]).await?;
        updated(key, after.pop().flatten())
    }

    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        self.write_all(vec![Write::Delete { key: key.clone(), cond }]).await.map(|_| ())
    }

    async fn update_each(&self, updates: Vec<Updating>) -> Result<Vec<Result<Item, StoreError>>, StoreError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let writes: Vec<Write> =
            updates.into_iter().map(|u| Write::Update { key: u.key, updates: u.updates, cond: u.cond }).collect();
        let checked: Vec<Result<(), StoreError>> = writes.iter().map(validate).collect();
        let (answers, appended) = self
            .with_conn(move |conn, inner| {
                // One request to the writer: each update under its own savepoint, so a failed
                // condition undoes that update alone; all of them under one, so a failed
                // statement answers none and leaves none.
                let filter = inner.stream_filter.get().copied();
                within(conn, &UPDATE_EACH, || {
                    let mut answers = Vec::with_capacity(writes.len());
                    let mut appended = false;
                    for (write, checked) in writes.into_iter().zip(checked) {
                        let key = write.key().clone();
                        if let Err(e) = checked {
                            answers.push(Err(e));
                            continue;
                        }
                        let applied = within(conn, &UPDATE_ONE, || apply_write(conn, write, 0, filter))?;
                        answers.push(applied.and_then(|(after, changed)| {
                            appended |= changed;
                            updated(key, after)
                        }));
                    }
                    Ok((answers, appended))
                })?
            })
            .await?;
        if appended {
            self.inner.changes.notify_waiters();
        }
        Ok(answers)
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Err(StoreError::Invalid("a transaction needs at least one write".into()));
        }
        // DynamoDB's limits (count, items, 4 MB in all), as the AWS adapter checks them.
        tidings_core::sizes::check_transaction(&writes)?;
        let mut seen = HashSet::new();
        for w in &writes {
            if !seen.insert(w.key()) {
                let k = w.key();
                return Err(StoreError::Invalid(format!("two writes on {}/{} in one transaction", k.pk, k.sk)));
            }
        }
        self.write_all(writes).await.map(|_| ())
    }

    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let limit = page_limit(opts.limit);
        let after = match &opts.cursor {
            None => None,
            Some(c) => Some(decode_cursor(c)?),
        };
        let pk = pk.to_owned();
        let prefix = sk_prefix.to_owned();
        let descending = opts.descending;
        self.with_reader(move |conn| query_page(conn, &pk, &prefix, after.as_deref(), descending, limit)).await
    }

    async fn query_many(&self, queries: &[(String, String)], limit: usize) -> Result<Vec<Page>, StoreError> {
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let limit = page_limit(limit);
        let queries = queries.to_vec();
        self.with_reader(move |conn| {
            // One read transaction, as `get_many`: each query beginning its own would start a
            // snapshot and read the index's upper pages again after every commit of the writer.
            run_cached(conn, "BEGIN", [])?;
            let pages: Result<Vec<Page>, StoreError> =
                queries.iter().map(|(pk, prefix)| query_page(conn, pk, prefix, None, false, limit)).collect();
            run_cached(conn, "COMMIT", [])?;
            pages
        })
        .await
    }

    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let limit = page_limit(opts.limit);
        let after = match &opts.cursor {
            None => None,
            Some(c) => Some(decode_cursor(c)?),
        };
        let (pk, from, to) = (pk.to_owned(), from.to_owned(), to.to_owned());
        let descending = opts.descending;
        self.with_reader(move |conn| range_page(conn, &pk, &from, &to, after.as_deref(), descending, limit)).await
    }
}

impl EmbeddedStore {
    /// Applies the writes in one SQLite transaction; returns each write's item after it (`None`
    /// for deletes, checks and absent items).
    async fn write_all(&self, writes: Vec<Write>) -> Result<Vec<Option<Attrs>>, StoreError> {
        for w in &writes {
            validate(w)?;
        }
        let (after, appended) = self
            .with_conn(move |conn, inner| {
                // A savepoint: inside the writer's group transaction (see writer.rs), a failure
                // rolls back this request's writes only. Its statements are cached: preparing
                // them again for every request was a tenth of an order's writing.
                let filter = inner.stream_filter.get().copied();
                within(conn, &WRITE_ALL, || {
                    let mut after = Vec::with_capacity(writes.len());
                    let mut appended = false;
                    for (index, write) in writes.into_iter().enumerate() {
                        let (new, changed) = apply_write(conn, write, index, filter)?;
                        appended |= changed;
                        after.push(new);
                    }
                    Ok((after, appended))
                })?
            })
            .await?;
        if appended {
            self.inner.changes.notify_waiters();
        }
        Ok(after)
    }
}

/// The item an update left (an update always leaves one).
fn updated(key: Key, after: Option<Attrs>) -> Result<Item, StoreError> {
    match after {
        Some(attrs) => Ok(Item::new(key, attrs)),
        None => Err(StoreError::Corrupt(format!("{}/{}: update left no item", key.pk, key.sk))),
    }
}

/// A savepoint's three statements (cached as any other).
struct Savepoint {
    begin: &'static str,
    undo: &'static str,
    release: &'static str,
}

const WRITE_ALL: Savepoint =
    Savepoint { begin: "SAVEPOINT write_all", undo: "ROLLBACK TO write_all", release: "RELEASE write_all" };
const UPDATE_EACH: Savepoint =
    Savepoint { begin: "SAVEPOINT update_each", undo: "ROLLBACK TO update_each", release: "RELEASE update_each" };
const UPDATE_ONE: Savepoint =
    Savepoint { begin: "SAVEPOINT update_one", undo: "ROLLBACK TO update_one", release: "RELEASE update_one" };

/// Runs `f` under a savepoint: what it wrote stays when it answers `Ok`, is undone when it
/// answers `Err`. The outer error: a statement of the savepoint failed.
fn within<T>(
    conn: &Connection,
    savepoint: &Savepoint,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<Result<T, StoreError>, StoreError> {
    run_cached(conn, savepoint.begin, [])?;
    let applied = f();
    if applied.is_err() {
        run_cached(conn, savepoint.undo, [])?;
    }
    run_cached(conn, savepoint.release, [])?;
    Ok(applied)
}

/// Runs a statement through the connection's statement cache; the rows it changed.
pub(crate) fn run_cached(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<usize, StoreError> {
    conn.prepare_cached(sql).and_then(|mut stmt| stmt.execute(params)).map_err(db_err)
}

/// Rejects what DynamoDB would reject before looking at any item.
fn validate(write: &Write) -> Result<(), StoreError> {
    let key = write.key();
    if key.pk.is_empty() {
        return Err(StoreError::Invalid("empty partition key".into()));
    }
    if let Write::Put { item, .. } = write {
        check_size(&item.key, &item.attrs)?;
    }
    Ok(())
}

/// DynamoDB's item size, counted as DynamoDB counts it (`tidings_core::sizes`).
fn check_size(key: &Key, attrs: &Attrs) -> Result<(), StoreError> {
    tidings_core::sizes::check_item(key, attrs)
}

/// Null attributes are not stored (see [`Attrs`]).
fn strip_nulls(attrs: &mut Attrs) {
    attrs.retain(|_, v| !v.is_null());
}

/// Applies one write inside the transaction. Returns the item after it and whether a change
/// record was appended (only for changes the stream filter accepts, when there is one).
fn apply_write(
    tx: &Connection,
    write: Write,
    index: usize,
    filter: Option<crate::StreamFilter>,
) -> Result<(Option<Attrs>, bool), StoreError> {
    let write = match write {
        Write::Put { item, cond: Cond::NotExists } => return insert_new(tx, item, index, filter),
        other => other,
    };
    let key = write.key().clone();
    let old = read_attrs(tx, &key)?;
    let cond = match &write {
        Write::Put { cond, .. }
        | Write::Update { cond, .. }
        | Write::Delete { cond, .. }
        | Write::Check { cond, .. } => cond,
    };
    if !cond.holds(old.as_ref()) {
        return Err(StoreError::ConditionFailed { index });
    }
    let new = match write {
        Write::Check { .. } => return Ok((old, false)),
        Write::Put { mut item, .. } => {
            strip_nulls(&mut item.attrs);
            Some(item.attrs)
        }
        Write::Update { updates, .. } => {
            let mut attrs = old.clone().unwrap_or_default();
            Update::apply_all(&updates, &mut attrs);
            strip_nulls(&mut attrs);
            check_size(&key, &attrs)?;
            Some(attrs)
        }
        Write::Delete { .. } => None,
    };
    if old == new {
        // Unchanged (or a delete of a missing item): nothing written, no change record, as in
        // DynamoDB Streams.
        return Ok((new, false));
    }
    let new_json = new.as_ref().map(to_json).transpose()?;
    match &new_json {
        Some(json) => {
            run_cached(
                tx,
                "INSERT INTO items (pk, sk, attrs) VALUES (?1, ?2, ?3)
                 ON CONFLICT (pk, sk) DO UPDATE SET attrs = excluded.attrs",
                params![key.pk, key.sk, json],
            )?;
        }
        None => {
            run_cached(tx, "DELETE FROM items WHERE pk = ?1 AND sk = ?2", params![key.pk, key.sk])?;
        }
    }
    if filter.is_some_and(|streamed| !streamed(&key, old.as_ref(), new.as_ref())) {
        return Ok((new, false));
    }
    let old_json = old.as_ref().map(to_json).transpose()?;
    append_change(tx, &key, old_json.as_deref(), new_json.as_deref())?;
    Ok((new, true))
}

/// A put that must not find its item (`Cond::NotExists`: an order, a ledger entry, a delivery
/// record): the insert is its own condition, so no old image is read or parsed. Same answer and
/// change record as [`apply_write`]'s path, which reads the item first.
fn insert_new(
    tx: &Connection,
    mut item: Item,
    index: usize,
    filter: Option<crate::StreamFilter>,
) -> Result<(Option<Attrs>, bool), StoreError> {
    strip_nulls(&mut item.attrs);
    let json = to_json(&item.attrs)?;
    let inserted = run_cached(
        tx,
        "INSERT INTO items (pk, sk, attrs) VALUES (?1, ?2, ?3) ON CONFLICT (pk, sk) DO NOTHING",
        params![item.key.pk, item.key.sk, json],
    )?;
    if inserted == 0 {
        return Err(StoreError::ConditionFailed { index });
    }
    if filter.is_some_and(|streamed| !streamed(&item.key, None, Some(&item.attrs))) {
        return Ok((Some(item.attrs), false));
    }
    append_change(tx, &item.key, None, Some(&json))?;
    Ok((Some(item.attrs), true))
}

fn append_change(tx: &Connection, key: &Key, old: Option<&str>, new: Option<&str>) -> Result<(), StoreError> {
    run_cached(tx, "INSERT INTO changes (pk, sk, old, new) VALUES (?1, ?2, ?3, ?4)", params![key.pk, key.sk, old, new])
        .map(drop)
}

pub(crate) fn to_json(attrs: &Attrs) -> Result<String, StoreError> {
    serde_json::to_string(attrs).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// An item's attributes from their JSON; `what` names the item in an error only (formatted
/// then, not for every read).
pub(crate) fn parse_attrs(what: &dyn std::fmt::Display, json: &str) -> Result<Attrs, StoreError> {
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(StoreError::Corrupt(format!("{what}: not an object"))),
        Err(e) => Err(StoreError::Corrupt(format!("{what}: {e}"))),
    }
}

fn read_attrs(conn: &Connection, key: &Key) -> Result<Option<Attrs>, StoreError> {
    let json: Option<String> = conn
        .prepare_cached("SELECT attrs FROM items WHERE pk = ?1 AND sk = ?2")
        .and_then(|mut stmt| stmt.query_row(params![key.pk, key.sk], |r| r.get(0)).optional())
        .map_err(db_err)?;
    json.map(|j| parse_attrs(&format_args!("{}/{}", key.pk, key.sk), &j)).transpose()
}

/// The smallest string greater than every string that starts with `prefix` (`None` when the
/// prefix is empty or only of `char::MAX`). SQLite compares TEXT with memcmp over UTF-8, which
/// orders like code points, so `prefix <= sk < upper` is exactly "sk starts with prefix".
fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..=0xDFFF).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn encode_cursor(sk: &str) -> String {
    hex::encode(sk.as_bytes())
}

/// Any hex string is a position in the partition (bytes that are not UTF-8 read as U+FFFD):
/// the query compares it with the sort keys, so a cursor the server never gave pages too.
/// A query's page size: the default for 0, at most the largest.
fn page_limit(limit: usize) -> usize {
    match limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    }
}

fn decode_cursor(cursor: &str) -> Result<String, StoreError> {
    hex::decode(cursor)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|_| StoreError::Invalid(format!("bad query cursor {cursor:?}")))
}

/// One page of [`Table::query_range`]: `from <= sk <= to`, narrowed by the cursor on the side
/// the page moves to (one bound on each side, as in [`query_page`]).
fn range_page(
    conn: &Connection,
    pk: &str,
    from: &str,
    to: &str,
    after: Option<&str>,
    descending: bool,
    limit: usize,
) -> Result<Page, StoreError> {
    let (mut lower, mut upper) = ((">=", from.to_owned()), ("<=", to.to_owned()));
    if let Some(after) = after {
        if descending {
            if after <= to {
                upper = ("<", after.to_owned());
            }
        } else if after >= from {
            lower = (">", after.to_owned());
        }
    }
    let sql = format!(
        "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk {} ?2 AND sk {} ?3 ORDER BY sk {} LIMIT ?4",
        lower.0,
        upper.0,
        if descending { "DESC" } else { "ASC" }
    );
    let fetch = i64::try_from(limit + 1).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(&sql).map_err(db_err)?;
    let rows = stmt
        .query_map(params![pk, lower.1, upper.1, fetch], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(db_err)?;
    page_of(pk, rows, limit, |_| true)
}

fn query_page(
    conn: &Connection,
    pk: &str,
    prefix: &str,
    after: Option<&str>,
    descending: bool,
    limit: usize,
) -> Result<Page, StoreError> {
    // One bound on each side, so that SQLite seeks to the cursor: given both `sk >= prefix`
    // and `sk > cursor` it may start at the prefix and step over every earlier page (a
    // million-user segment read page by page became quadratic).
    let mut upper = prefix_upper_bound(prefix);
    let mut lower = prefix.to_owned();
    let mut strict = false;
    if let Some(after) = after {
        if descending {
            if upper.as_ref().is_none_or(|u| after < u.as_str()) {
                upper = Some(after.to_owned());
            }
        } else if after >= prefix {
            (lower, strict) = (after.to_owned(), true);
        }
    }
    let mut args: Vec<rusqlite::types::Value> = vec![pk.to_owned().into(), lower.into()];
    let bounded = upper.is_some();
    args.extend(upper.map(Into::into));
    // One more than asked, to know whether there is a next page.
    args.push(i64::try_from(limit + 1).unwrap_or(i64::MAX).into());
    let mut stmt = conn.prepare_cached(query_sql(strict, bounded, descending)).map_err(db_err)?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(args), |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(db_err)?;
    page_of(pk, rows, limit, |sk| sk.starts_with(prefix))
}

/// The statement of a query page: `sk` above its lower bound (`>` past a cursor, else `>=` the
/// prefix), below its upper bound when it has one, in either order, `LIMIT` last. Written out,
/// one text per shape, so no query formats its statement.
fn query_sql(strict: bool, bounded: bool, descending: bool) -> &'static str {
    match (strict, bounded, descending) {
        (false, false, false) => "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk >= ?2 ORDER BY sk ASC LIMIT ?3",
        (false, false, true) => "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk >= ?2 ORDER BY sk DESC LIMIT ?3",
        (false, true, false) => {
            "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk >= ?2 AND sk < ?3 ORDER BY sk ASC LIMIT ?4"
        }
        (false, true, true) => {
            "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk >= ?2 AND sk < ?3 ORDER BY sk DESC LIMIT ?4"
        }
        (true, false, false) => "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 ORDER BY sk ASC LIMIT ?3",
        (true, false, true) => "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 ORDER BY sk DESC LIMIT ?3",
        (true, true, false) => {
            "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 AND sk < ?3 ORDER BY sk ASC LIMIT ?4"
        }
        (true, true, true) => {
            "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 AND sk < ?3 ORDER BY sk DESC LIMIT ?4"
        }
    }
}

/// A page of `limit` items from rows of one more than that (`(sk, attrs)` in order), the
/// rows `keep` refuses left out; the next cursor when the extra row was there.
fn page_of(
    pk: &str,
    rows: impl Iterator<Item = rusqlite::Result<(String, String)>>,
    limit: usize,
    keep: impl Fn(&str) -> bool,
) -> Result<Page, StoreError> {
    let mut items = Vec::new();
    let mut more = false;
    for row in rows {
        let (sk, json) = row.map_err(db_err)?;
        if !keep(&sk) {
            continue;
        }
        if items.len() == limit {
            more = true;
            break;
        }
        let attrs = parse_attrs(&format_args!("{pk}/{sk}"), &json)?;
        items.push(Item::new(Key::new(pk, sk), attrs));
    }
    let next_cursor = if more { items.last().map(|i| encode_cursor(&i.key.sk)) } else { None };
    Ok(Page { items, next_cursor })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    /// The statements of every page read bind their `LIMIT`; SQLite re-prepares a statement
    /// whose plan used a bound value each time that value is bound again, unless the store's
    /// connections keep one plan per statement (`tune`, QPSG). Counted by SQLite itself.
    #[tokio::test]
    async fn page_reads_reuse_their_prepared_statements() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("t.db")).unwrap();
        for i in 0..30 {
            let item = Item::new(Key::new("P", format!("m#{i:03}")), Attrs::new());
            store.put(item, Cond::Always).await.unwrap();
        }
        let reprepared = store
            .with_reader(|conn| {
                let mut cursor = None;
                let mut pages = 0;
                loop {
                    let page = query_page(conn, "P", "m#", cursor.as_deref(), false, 4)?;
                    pages += 1;
                    let ranged = range_page(conn, "P", "m#000", "m#029", cursor.as_deref(), false, 4)?;
                    assert_eq!(ranged.items.len(), page.items.len());
                    if page.next_cursor.is_none() {
                        break;
                    }
                    cursor = page.items.last().map(|i| i.key.sk.clone());
                }
                assert_eq!(pages, 8, "30 items, 4 a page");
                // The same statements, from the cache: how often SQLite prepared them again.
                let count = |sql: &str| {
                    let stmt = conn.prepare_cached(sql).unwrap();
                    stmt.get_status(rusqlite::StatementStatus::RePrepare)
                };
                let page =
                    count("SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 AND sk < ?3 ORDER BY sk ASC LIMIT ?4");
                let range = count(
                    "SELECT sk, attrs FROM items WHERE pk = ?1 AND sk > ?2 AND sk <= ?3 ORDER BY sk ASC LIMIT ?4",
                );
                Ok::<_, StoreError>((page, range))
            })
            .await
            .unwrap();
        assert_eq!(reprepared, (0, 0), "page statements were prepared again after binding their LIMIT");
    }

    #[test]
    fn upper_bound_is_exact() {
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(prefix_upper_bound("a#1").as_deref(), Some("a#2"));
        assert_eq!(prefix_upper_bound("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
    }

    #[test]
    fn cursor_round_trips() {
        for sk in ["", "a#1", "ü/ß", "x y%_"] {
            assert_eq!(decode_cursor(&encode_cursor(sk)).unwrap(), sk);
        }
        assert!(decode_cursor("zz").is_err());
        assert!(decode_cursor("abc").is_err(), "odd length");
        assert_eq!(decode_cursor("ff").unwrap(), "\u{FFFD}", "any hex is a position");
    }
}
