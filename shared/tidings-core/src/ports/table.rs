//! The table port: one DynamoDB-shaped table of items addressed by `(pk, sk)`.
//!
//! Both backends implement exactly these semantics (the conformance suite in
//! `tidings-conformance` holds them to it):
//! - an attribute that is missing never satisfies a comparison (`Cmp`), as in DynamoDB;
//! - `update` creates the item when it is absent and the condition allows it (an upsert);
//! - `Add` on a missing attribute starts from 0;
//! - `transact` applies every write or none; a failed condition names the write that failed;
//! - every committed write appears once in the change stream, in commit order per key.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Attributes of an item, without its key. Numbers are JSON numbers, strings are strings,
/// lists and maps nest; `null` is not stored (use `Update::Remove`).
pub type Attrs = serde_json::Map<String, Value>;

/// The primary key of an item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key {
    pub pk: String,
    pub sk: String,
}

impl Key {
    pub fn new(pk: impl Into<String>, sk: impl Into<String>) -> Self {
        Self { pk: pk.into(), sk: sk.into() }
    }
}

/// One stored item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub key: Key,
    pub attrs: Attrs,
}

impl Item {
    pub fn new(key: Key, attrs: Attrs) -> Self {
        Self { key, attrs }
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).and_then(Value::as_str)
    }

    pub fn i64(&self, name: &str) -> Option<i64> {
        self.attrs.get(name).and_then(Value::as_i64)
    }

    /// Deserializes the attributes into a typed record.
    /// Read in place: the attributes are not copied into a JSON object first.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, StoreError> {
        let fields = self.attrs.iter().map(|(name, value)| (name.as_str(), value));
        T::deserialize(serde::de::value::MapDeserializer::<_, serde_json::Error>::new(fields))
            .map_err(|e| StoreError::Corrupt(format!("{}/{}: {e}", self.key.pk, self.key.sk)))
    }
}

/// Builds attributes from any serializable record (which must serialize to a JSON object).
/// `null` fields are dropped, so optional fields may use plain `Option`.
pub fn attrs_of<T: Serialize>(value: &T) -> Result<Attrs, StoreError> {
    match serde_json::to_value(value) {
        Ok(Value::Object(mut map)) => {
            map.retain(|_, v| !v.is_null());
            Ok(map)
        }
        Ok(_) => Err(StoreError::Corrupt("record is not an object".into())),
        Err(e) => Err(StoreError::Corrupt(e.to_string())),
    }
}

/// A comparison operator for [`Cond::Cmp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A condition on the item as it is before the write.
///
/// Numbers compare as numbers, strings as strings (byte order); comparing values of different
/// types, or a missing attribute, is false (DynamoDB's rule, `Ne` included).
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    /// No condition.
    Always,
    /// The item must not exist.
    NotExists,
    /// The item must exist.
    Exists,
    /// The attribute exists.
    AttrExists(String),
    /// The attribute does not exist (true when the item does not exist).
    AttrNotExists(String),
    /// `attribute <op> value`.
    Cmp(String, CmpOp, Value),
    /// The attribute equals one of the values.
    In(String, Vec<Value>),
    And(Vec<Cond>),
    Or(Vec<Cond>),
    Not(Box<Cond>),
}

impl Cond {
    pub fn eq(name: &str, value: impl Into<Value>) -> Self {
        Cond::Cmp(name.into(), CmpOp::Eq, value.into())
    }
    pub fn ge(name: &str, value: impl Into<Value>) -> Self {
        Cond::Cmp(name.into(), CmpOp::Ge, value.into())
    }
    pub fn lt(name: &str, value: impl Into<Value>) -> Self {
        Cond::Cmp(name.into(), CmpOp::Lt, value.into())
    }
    pub fn is_in<V: Into<Value>>(name: &str, values: impl IntoIterator<Item = V>) -> Self {
        Cond::In(name.into(), values.into_iter().map(Into::into).collect())
    }

    /// Evaluates the condition against the current item (`None` when absent). The embedded
    /// backend uses this directly; the AWS backend translates the condition to an expression,
    /// and the conformance suite checks that both agree.
    pub fn holds(&self, item: Option<&Attrs>) -> bool {
        match self {
            Cond::Always => true,
            Cond::NotExists => item.is_none(),
            Cond::Exists => item.is_some(),
            Cond::AttrExists(name) => item.is_some_and(|a| a.contains_key(name)),
            Cond::AttrNotExists(name) => !item.is_some_and(|a| a.contains_key(name)),
            Cond::Cmp(name, op, value) => match item.and_then(|a| a.get(name)) {
                Some(current) => compare(current, *op, value),
                None => false,
            },
            Cond::In(name, values) => match item.and_then(|a| a.get(name)) {
                Some(current) => values.iter().any(|v| compare(current, CmpOp::Eq, v)),
                None => false,
            },
            Cond::And(all) => all.iter().all(|c| c.holds(item)),
            Cond::Or(any) => any.iter().any(|c| c.holds(item)),
            Cond::Not(inner) => !inner.holds(item),
        }
    }
}

fn compare(current: &Value, op: CmpOp, value: &Value) -> bool {
    use std::cmp::Ordering;
    let ordering: Option<Ordering> = match (current, value) {
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => a.as_f64().zip(b.as_f64()).and_then(|(x, y)| x.partial_cmp(&y)),
        },
        (Value::String(a), Value::String(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (Value::Bool(a), Value::Bool(b)) if matches!(op, CmpOp::Eq | CmpOp::Ne) => Some(a.cmp(b)),
        (a, b) if matches!(op, CmpOp::Eq | CmpOp::Ne) && a.is_object() && b.is_object() => {
            if a == b {
                Some(Ordering::Equal)
            } else {
                Some(Ordering::Less)
            }
        }
        _ => None,
    };
    match ordering {
        None => false,
        Some(o) => match op {
            CmpOp::Eq => o == Ordering::Equal,
            CmpOp::Ne => o != Ordering::Equal,
            CmpOp::Lt => o == Ordering::Less,
            CmpOp::Le => o != Ordering::Greater,
            CmpOp::Gt => o == Ordering::Greater,
            CmpOp::Ge => o != Ordering::Less,
        },
    }
}

/// One change to an attribute in [`Table::update`].
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// Sets the attribute.
    Set(String, Value),
    /// Sets the attribute only when it is absent (`if_not_exists`).
    SetIfAbsent(String, Value),
    /// Adds to a number (a missing attribute counts as 0). Negative to subtract.
    Add(String, i64),
    /// Removes the attribute.
    Remove(String),
}

impl Update {
    pub fn set(name: &str, value: impl Into<Value>) -> Self {
        Update::Set(name.into(), value.into())
    }
    pub fn add(name: &str, n: i64) -> Self {
        Update::Add(name.into(), n)
    }

    /// Applies the updates to attributes (used by the embedded backend and by tests).
    pub fn apply_all(updates: &[Update], attrs: &mut Attrs) {
        for u in updates {
            match u {
                Update::Set(n, v) => {
                    attrs.insert(n.clone(), v.clone());
                }
                Update::SetIfAbsent(n, v) => {
                    attrs.entry(n.clone()).or_insert_with(|| v.clone());
                }
                Update::Add(n, d) => {
                    let cur = attrs.get(n).and_then(Value::as_i64).unwrap_or(0);
                    attrs.insert(n.clone(), Value::from(cur.saturating_add(*d)));
                }
                Update::Remove(n) => {
                    attrs.remove(n);
                }
            }
        }
    }
}

/// One write in a transaction.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Put {
        item: Item,
        cond: Cond,
    },
    Update {
        key: Key,
        updates: Vec<Update>,
        cond: Cond,
    },
    Delete {
        key: Key,
        cond: Cond,
    },
    /// Writes nothing; the transaction fails unless the condition holds.
    Check {
        key: Key,
        cond: Cond,
    },
}

impl Write {
    pub fn key(&self) -> &Key {
        match self {
            Write::Put { item, .. } => &item.key,
            Write::Update { key, .. } | Write::Delete { key, .. } | Write::Check { key, .. } => key,
        }
    }
}

/// Options of a query.
#[derive(Clone, Debug, Default)]
pub struct QueryOpts {
    /// At most this many items (the backends may cap it; 0 means the default, 100).
    pub limit: usize,
    /// The `next_cursor` of the previous page: the sort key of its last item in hex, in every
    /// backend. Any hex string is a position (the page starts after it, at the range's first item
    /// or past its last), so only one that is not hex is refused (`StoreError::Invalid`).
    pub cursor: Option<String>,
    /// Newest first (descending sort key).
    pub descending: bool,
}

/// One page of a query.
#[derive(Clone, Debug, Default)]
pub struct Page {
    pub items: Vec<Item>,
    /// Opaque; `None` when there is nothing more.
    pub next_cursor: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A condition did not hold. `index` is the write of a transaction that failed (0 for a
    /// single write). Not retryable as such: the caller reads and decides.
    #[error("condition failed (write {index})")]
    ConditionFailed { index: usize },
    /// Another transaction touched the same items at the same time. Retryable.
    #[error("transaction conflict")]
    Conflict,
    /// Throttled or temporarily unavailable. Retryable.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request was invalid (too many writes, two writes on one key, an item too large).
    #[error("invalid store request: {0}")]
    Invalid(String),
    /// A stored item could not be read back.
    #[error("corrupt item: {0}")]
    Corrupt(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Conflict | StoreError::Unavailable(_))
    }
    pub fn is_condition_failed(&self) -> bool {
        matches!(self, StoreError::ConditionFailed { .. })
    }
}

/// One update of [`Table::update_each`].
#[derive(Clone, Debug)]
pub struct Updating {
    pub key: Key,
    pub updates: Vec<Update>,
    pub cond: Cond,
}

/// The most writes in one transaction (DynamoDB's limit).
pub const MAX_TRANSACTION_WRITES: usize = 100;

#[async_trait]
pub trait Table: Send + Sync + 'static {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError>;

    /// Several items at once (strongly consistent, like [`Table::get`]): one answer per key, in
    /// the order asked, `None` for an absent item. A key may be asked twice. The default reads
    /// them one by one; backends answer with one round trip per batch (DynamoDB's
    /// `BatchGetItem`, 100 keys each; one SQLite call).
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.get(key).await?);
        }
        Ok(out)
    }

    /// Puts (replaces) the item when the condition holds on the current one.
    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError>;

    /// Updates (or creates) the item when the condition holds; returns the item after the
    /// update.
    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError>;

    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError>;

    /// Several updates, each on its own (not a transaction): one answer per update, in the
    /// order asked, the item after it or why it was not made (a failed condition fails that
    /// update alone). The outer error: none was answered. The default makes them one by one;
    /// the embedded store in one request to its writer (each under its own savepoint),
    /// DynamoDB with several `UpdateItem`s in flight. A key may be asked once.
    async fn update_each(&self, updates: Vec<Updating>) -> Result<Vec<Result<Item, StoreError>>, StoreError> {
        let mut out = Vec::with_capacity(updates.len());
        for u in updates {
            out.push(self.update(&u.key, u.updates, u.cond).await);
        }
        Ok(out)
    }

    /// All writes or none. At most [`MAX_TRANSACTION_WRITES`], each on a different key.
    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError>;

    /// Items of one partition whose sort key starts with `sk_prefix`, in sort-key order.
    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError>;

    /// The first page of several queries at once: for each `(pk, sk_prefix)`, what
    /// [`Table::query`] answers with `limit` and no cursor, in the order asked. The default asks
    /// them one by one; the embedded store answers them in one read transaction (one snapshot,
    /// its pages read once), DynamoDB with several queries in flight.
    async fn query_many(&self, queries: &[(String, String)], limit: usize) -> Result<Vec<Page>, StoreError> {
        let mut out = Vec::with_capacity(queries.len());
        for (pk, prefix) in queries {
            out.push(self.query(pk, prefix, QueryOpts { limit, cursor: None, descending: false }).await?);
        }
        Ok(out)
    }

    /// Items of one partition whose sort key is between `from` and `to`, both included (byte
    /// order, DynamoDB's `BETWEEN`; an empty `from` is the partition's start), in sort-key order;
    /// an empty page when `from > to`. The
    /// backends answer it as one query; a wrapper that does not pass it on refuses it.
    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let _ = (pk, from, to, opts);
        Err(StoreError::Invalid("this table does not answer range queries".into()))
    }
}

/// A committed write, as the change stream delivers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// Increasing per key (per shard on DynamoDB): the stream's sequence number.
    pub seq: String,
    pub key: Key,
    pub old: Option<Attrs>,
    pub new: Option<Attrs>,
}

impl ChangeRecord {
    pub fn is_insert(&self) -> bool {
        self.old.is_none() && self.new.is_some()
    }
}

/// The reading side of the change stream, for the local runtime (on Lambda the event source
/// mapping reads the stream). At least once: records after the last `commit` come again.
#[async_trait]
pub trait ChangeFeed: Send + Sync + 'static {
    /// The next records after the committed position, oldest first (may wait briefly).
    async fn next_batch(&self, max: usize) -> Result<Vec<ChangeRecord>, StoreError>;
    /// Marks everything up to and including these records as processed.
    async fn commit(&self, records: &[ChangeRecord]) -> Result<(), StoreError>;
}

/// How items are stored in DynamoDB (by the AWS backend, and as Lambda stream events show
/// them): the key as string attributes `pk` and `sk`, and an attribute of the port whose name
/// would clash with them escaped with a `~` prefix.
pub mod stored {
    use super::Attrs;

    pub const PK: &str = "pk";
    pub const SK: &str = "sk";

    /// Prefix of a stored attribute name that escapes a name of the port's attributes which would
    /// clash with the key attributes (`pk` is stored as `~pk`, `~x` as `~~x`).
    pub const ESCAPE: char = '~';

    /// The stored name of an attribute of the port.
    pub fn stored_attr_name(name: &str) -> std::borrow::Cow<'_, str> {
        if name == PK || name == SK || name.starts_with(ESCAPE) {
            std::borrow::Cow::Owned(format!("{ESCAPE}{name}"))
        } else {
            std::borrow::Cow::Borrowed(name)
        }
    }

    /// The port's name of a stored attribute (the inverse of [`stored_attr_name`]).
    pub fn port_attr_name(stored: &str) -> &str {
        stored.strip_prefix(ESCAPE).unwrap_or(stored)
    }

    /// A stored item's attributes, as JSON (from any DynamoDB image: the SDK's, a stream's, a
    /// Lambda event's), to the port's attributes: without `pk`/`sk`, names unescaped.
    pub fn attrs_from_stored(stored: Attrs) -> Attrs {
        stored
            .into_iter()
            .filter(|(name, _)| name != PK && name != SK)
            .map(|(name, value)| (port_attr_name(&name).to_string(), value))
            .collect()
    }
}
