//! [`DynamoTable`]: the [`Table`] port on one DynamoDB table with a string `pk` (HASH) and a
//! string `sk` (RANGE).

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, KeysAndAttributes, Put, ReturnValue, TransactWriteItem, Update as DynUpdate,
};
use serde_json::Value;
use tidings_core::ports::{Attrs, CmpOp, Cond, Item, Key, Page, QueryOpts, StoreError, Table, Update, Updating, Write};
use tidings_core::retry::backoff;

use crate::error::{Kind, classify};

/// The key attributes of every item, and the escaping of attribute names that would clash with
/// them: one convention, shared with the Lambda stream events (`tidings_core::ports::table::stored`).
pub use tidings_core::ports::table::stored::{PK, SK, attrs_from_stored, port_attr_name, stored_attr_name};

/// The default and the largest page of a query.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// How a write answered with a transaction conflict is tried again.
///
/// DynamoDB refuses a write of an item that another transaction holds at that moment
/// (`TransactionConflict` in a cancelled transaction's reasons, `TransactionConflictException`
/// for a single write) instead of waiting for it. Nothing of a refused write is applied, so
/// the same write is simply sent again (its conditions are evaluated anew): after an
/// equal-jitter backoff from `base`, doubling up to `cap`, while the time spent stays within
/// `budget`. Past the budget the caller gets [`StoreError::Conflict`] (retryable; the API answers
/// 409 `write_conflict` with `Retry-After`). The budget is a small part of a request's: API
/// Gateway gives an API call 29 s, and a queue message's handler has its visibility timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConflictRetry {
    pub budget: Duration,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for ConflictRetry {
    fn default() -> Self {
        Self { budget: Duration::from_secs(3), base: Duration::from_millis(10), cap: Duration::from_millis(320) }
    }
}

impl ConflictRetry {
    /// No retry at all: the first conflict is the answer.
    pub const NONE: ConflictRetry = ConflictRetry { budget: Duration::ZERO, base: Duration::ZERO, cap: Duration::ZERO };

    /// Runs `write` until it ends in anything but a conflict, or the budget is spent.
    pub async fn run<T, F, Fut>(&self, operation: &'static str, mut write: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            match write().await {
                Err(StoreError::Conflict) => {
                    attempt += 1;
                    let delay = backoff(attempt, self.base, self.cap, None);
                    if started.elapsed() + delay > self.budget {
                        metrics::counter!("tidings_store_conflicts_given_up_total", "operation" => operation)
                            .increment(1);
                        tracing::warn!(operation, attempts = attempt, "transaction conflicts past the retry budget");
                        return Err(StoreError::Conflict);
                    }
                    metrics::counter!("tidings_store_conflict_retries_total", "operation" => operation).increment(1);
                    tokio::time::sleep(delay).await;
                }
                other => return other,
            }
        }
    }
}

/// The [`Table`] port on DynamoDB.
#[derive(Clone, Debug)]
pub struct DynamoTable {
    client: Client,
    table: String,
    conflicts: ConflictRetry,
}

impl DynamoTable {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into(), conflicts: ConflictRetry::default() }
    }

    /// The same table with another retry of transaction conflicts.
    pub fn with_conflict_retry(mut self, conflicts: ConflictRetry) -> Self {
        self.conflicts = conflicts;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn table_name(&self) -> &str {
        &self.table
    }
}

// ---------------------------------------------------------------------------------------------
// Item mapping

/// Attributes to a DynamoDB item, with the key. `null` attributes are not stored; attributes
/// named like the key attributes are stored under escaped names (see [`stored_attr_name`]).
pub fn item_to_dynamo(key: &Key, attrs: &Attrs) -> Result<HashMap<String, AttributeValue>, StoreError> {
    let mut map: HashMap<String, AttributeValue> = HashMap::with_capacity(attrs.len() + 2);
    for (name, value) in attrs {
        if value.is_null() {
            continue;
        }
        map.insert(stored_attr_name(name).into_owned(), value_to_dynamo(value)?);
    }
    map.insert(PK.into(), AttributeValue::S(key.pk.clone()));
    map.insert(SK.into(), AttributeValue::S(key.sk.clone()));
    Ok(map)
}

/// A JSON value to a DynamoDB attribute value.
pub fn value_to_dynamo(value: &Value) -> Result<AttributeValue, StoreError> {
    serde_dynamo::to_attribute_value(value).map_err(|e| StoreError::Invalid(format!("attribute value: {e}")))
}

/// A DynamoDB item to a key and attributes (without `pk`/`sk`).
pub fn item_from_dynamo(mut map: HashMap<String, AttributeValue>) -> Result<Item, StoreError> {
    let key = key_from_dynamo(&map)?;
    map.remove(PK);
    map.remove(SK);
    let attrs: Attrs =
        serde_dynamo::from_item(map).map_err(|e| StoreError::Corrupt(format!("{}/{}: {e}", key.pk, key.sk)))?;
    Ok(Item::new(key, attrs_from_stored(attrs)))
}

fn key_from_dynamo(map: &HashMap<String, AttributeValue>) -> Result<Key, StoreError> {
    let pk = map.get(PK).and_then(|v| v.as_s().ok());
    let sk = map.get(SK).and_then(|v| v.as_s().ok());
    match (pk, sk) {
        (Some(pk), Some(sk)) => Ok(Key::new(pk.clone(), sk.clone())),
        _ => Err(StoreError::Corrupt("item without string pk/sk".into())),
    }
}

/// The most keys in one `BatchGetItem`.
const MAX_BATCH_GET: usize = 100;

fn key_to_dynamo(key: &Key) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PK.to_string(), AttributeValue::S(key.pk.clone())),
        (SK.to_string(), AttributeValue::S(key.sk.clone())),
    ])
}

// ---------------------------------------------------------------------------------------------
// Expressions

/// Builds condition and update expressions with `#n0`/`:v0` placeholders.
#[derive(Debug, Default)]
pub struct ExprBuilder {
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

/// A translated condition: always true, always false, or an expression.
#[derive(Clone, Debug, PartialEq)]
enum CondExpr {
    True,
    False,
    Expr(String),
}

/// The DynamoDB type of a JSON value, as `attribute_type` names it.
fn dynamo_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Bool(_) => "BOOL",
        Value::Number(_) => "N",
        Value::String(_) => "S",
        Value::Array(_) => "L",
        Value::Object(_) => "M",
    }
}

impl ExprBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The placeholder of an attribute name (`#n0`), reused for the same name.
    pub fn name(&mut self, name: &str) -> String {
        if let Some(p) = self.names.get(name) {
            return p.clone();
        }
        let p = format!("#n{}", self.names.len());
        self.names.insert(name.to_string(), p.clone());
        p
    }

    /// The placeholder of an attribute of the port (its stored name).
    pub fn attr(&mut self, name: &str) -> String {
        self.name(&stored_attr_name(name))
    }

    /// The placeholder of a value (`:v0`).
    pub fn value(&mut self, value: AttributeValue) -> String {
        let p = format!(":v{}", self.values.len());
        self.values.insert(p.clone(), value);
        p
    }

    fn json_value(&mut self, value: &Value) -> Result<String, StoreError> {
        Ok(self.value(value_to_dynamo(value)?))
    }

    /// The condition as an expression; `None` for [`Cond::Always`] (and anything that is
    /// always true).
    pub fn condition(&mut self, cond: &Cond) -> Result<Option<String>, StoreError> {
        Ok(match self.cond(cond)? {
            CondExpr::True => None,
            CondExpr::Expr(e) => Some(e),
            CondExpr::False => {
                // No literal `false` in DynamoDB's grammar.
                let pk = self.name(PK);
                Some(format!("(attribute_exists({pk}) AND attribute_not_exists({pk}))"))
            }
        })
    }

    fn cond(&mut self, cond: &Cond) -> Result<CondExpr, StoreError> {
        Ok(match cond {
            Cond::Always => CondExpr::True,
            Cond::NotExists => CondExpr::Expr(format!("attribute_not_exists({})", self.name(PK))),
            Cond::Exists => CondExpr::Expr(format!("attribute_exists({})", self.name(PK))),
            Cond::AttrExists(a) => CondExpr::Expr(format!("attribute_exists({})", self.attr(a))),
            Cond::AttrNotExists(a) => CondExpr::Expr(format!("attribute_not_exists({})", self.attr(a))),
            Cond::Cmp(a, op, v) => self.cmp(a, *op, v)?,
            Cond::In(a, values) => {
                let values: Vec<&Value> = values.iter().filter(|v| comparable(v, CmpOp::Eq)).collect();
                if values.is_empty() {
                    CondExpr::False
                } else if values.len() == 1 {
                    self.cmp(a, CmpOp::Eq, values[0])?
                } else if values.len() <= 100 {
                    let n = self.attr(a);
                    let mut ps = Vec::with_capacity(values.len());
                    for v in values {
                        ps.push(self.json_value(v)?);
                    }
                    CondExpr::Expr(format!("{n} IN ({})", ps.join(", ")))
                } else {
                    // IN takes at most 100 operands.
                    let ors = values.into_iter().map(|v| Cond::Cmp(a.clone(), CmpOp::Eq, v.clone())).collect();
                    self.cond(&Cond::Or(ors))?
                }
            }
            Cond::And(all) => {
                let mut parts = Vec::new();
                for c in all {
                    match self.cond(c)? {
                        CondExpr::True => {}
                        CondExpr::False => return Ok(CondExpr::False),
                        CondExpr::Expr(e) => parts.push(e),
                    }
                }
                match parts.len() {
                    0 => CondExpr::True,
                    1 => CondExpr::Expr(parts.remove(0)),
                    _ => CondExpr::Expr(format!("({})", parts.join(" AND "))),
                }
            }
            Cond::Or(any) => {
                let mut parts = Vec::new();
                for c in any {
                    match self.cond(c)? {
                        CondExpr::False => {}
                        CondExpr::True => return Ok(CondExpr::True),
                        CondExpr::Expr(e) => parts.push(e),
                    }
                }
                match parts.len() {
                    0 => CondExpr::False,
                    1 => CondExpr::Expr(parts.remove(0)),
                    _ => CondExpr::Expr(format!("({})", parts.join(" OR "))),
                }
            }
            Cond::Not(inner) => match self.cond(inner)? {
                CondExpr::True => CondExpr::False,
                CondExpr::False => CondExpr::True,
                CondExpr::Expr(e) => CondExpr::Expr(format!("(NOT {e})")),
            },
        })
    }

    /// `attribute <op> value`, false on a missing attribute or a value of another type.
    /// DynamoDB's `<>` is true for both, and emulators fail an ordering of values of two types,
    /// so every comparison but `=` is guarded with `attribute_type`.
    fn cmp(&mut self, a: &str, op: CmpOp, v: &Value) -> Result<CondExpr, StoreError> {
        if !comparable(v, op) {
            return Ok(CondExpr::False);
        }
        let n = self.attr(a);
        let p = self.json_value(v)?;
        let op = match op {
            CmpOp::Eq => return Ok(CondExpr::Expr(format!("{n} = {p}"))),
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        };
        let t = self.value(AttributeValue::S(dynamo_type(v).into()));
        Ok(CondExpr::Expr(format!("(attribute_type({n}, {t}) AND {n} {op} {p})")))
    }

    /// The update expression (`SET ... ADD ... REMOVE ...`). An empty list of updates becomes
    /// the removal of an attribute that never exists, so that the item is still created.
    pub fn update(&mut self, updates: &[Update]) -> Result<String, StoreError> {
        let mut set = Vec::new();
        let mut add = Vec::new();
        let mut remove = Vec::new();
        for u in updates {
            match u {
                Update::Set(a, v) if v.is_null() => remove.push(self.attr(a)),
                Update::Set(a, v) => {
                    let n = self.attr(a);
                    let p = self.json_value(v)?;
                    set.push(format!("{n} = {p}"));
                }
                Update::SetIfAbsent(a, v) if v.is_null() => {}
                Update::SetIfAbsent(a, v) => {
                    let n = self.attr(a);
                    let p = self.json_value(v)?;
                    set.push(format!("{n} = if_not_exists({n}, {p})"));
                }
                Update::Add(a, d) => {
                    let n = self.attr(a);
                    let p = self.value(AttributeValue::N(d.to_string()));
                    add.push(format!("{n} {p}"));
                }
                Update::Remove(a) => remove.push(self.attr(a)),
            }
        }
        if set.is_empty() && add.is_empty() && remove.is_empty() {
            remove.push(self.name("__tidings_noop"));
        }
        let mut clauses = Vec::new();
        if !set.is_empty() {
            clauses.push(format!("SET {}", set.join(", ")));
        }
        if !add.is_empty() {
            clauses.push(format!("ADD {}", add.join(", ")));
        }
        if !remove.is_empty() {
            clauses.push(format!("REMOVE {}", remove.join(", ")));
        }
        Ok(clauses.join(" "))
    }

    /// The placeholders of names, `None` when there are none.
    pub fn take_names(&mut self) -> Option<HashMap<String, String>> {
        if self.names.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.names).into_iter().map(|(name, p)| (p, name)).collect())
    }

    /// The placeholders of values, `None` when there are none.
    pub fn take_values(&mut self) -> Option<HashMap<String, AttributeValue>> {
        if self.values.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.values))
    }
}

/// Whether `attribute <op> value` can ever hold (the core's rule: numbers and strings compare,
/// booleans and maps only for equality; anything else is false).
fn comparable(v: &Value, op: CmpOp) -> bool {
    match v {
        Value::Number(_) | Value::String(_) => true,
        Value::Bool(_) | Value::Object(_) => matches!(op, CmpOp::Eq | CmpOp::Ne),
        Value::Null | Value::Array(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

fn store_error<E>(err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let c = classify(&err);
    match c.code() {
        "ConditionalCheckFailedException" => return StoreError::ConditionFailed { index: 0 },
        "TransactionConflictException" => return StoreError::Conflict,
        _ => {}
    }
    match c.kind {
        Kind::Transient => StoreError::Unavailable(c.message),
        Kind::Service if c.code() == "ResourceNotFoundException" => StoreError::Unavailable(c.message),
        Kind::Service | Kind::Construction => StoreError::Invalid(c.message),
    }
}

/// Maps a `TransactionCanceledException`'s reasons (one per write, in order).
fn cancellation_error(reasons: &[Option<&str>], message: String) -> StoreError {
    if let Some(index) = reasons.iter().position(|r| *r == Some("ConditionalCheckFailed")) {
        return StoreError::ConditionFailed { index };
    }
    if reasons.contains(&Some("TransactionConflict")) {
        return StoreError::Conflict;
    }
    if reasons.iter().any(|r| matches!(r, Some("ThrottlingError" | "ProvisionedThroughputExceeded"))) {
        return StoreError::Unavailable(message);
    }
    StoreError::Invalid(message)
}

/// Sequence numbers and stream positions compare as decimal numbers.
fn transact_error(
    err: SdkError<aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError, HttpResponse>,
) -> StoreError {
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    if let SdkError::ServiceError(ctx) = &err
        && let TransactWriteItemsError::TransactionCanceledException(e) = ctx.err()
    {
        let reasons: Vec<Option<&str>> = e.cancellation_reasons().iter().map(|r| r.code()).collect();
        let message = e.message().unwrap_or("transaction canceled").to_string();
        if reasons.is_empty() {
            // Some emulators put the reasons in the message only: "[None, ConditionalCheckFailed]".
            return cancellation_from_message(&message);
        }
        return cancellation_error(&reasons, message);
    }
    store_error(err)
}

fn cancellation_from_message(message: &str) -> StoreError {
    let list = message.rsplit_once('[').and_then(|(_, rest)| rest.split_once(']')).map(|(l, _)| l);
    match list {
        Some(list) => {
            let reasons: Vec<Option<&str>> = list.split(',').map(|s| Some(s.trim())).collect();
            cancellation_error(&reasons, message.to_string())
        }
        None => StoreError::Invalid(message.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Cursor

/// A page's cursor is the sort key of its last item, in hex, as the embedded backend writes it
/// (`QueryOpts::cursor`): the partition is the query's own, so a cursor cannot leave it.
fn encode_cursor(key: &HashMap<String, AttributeValue>) -> Result<String, StoreError> {
    Ok(hex::encode(key_from_dynamo(key)?.sk))
}

/// Any hex string is a position in the partition (bytes that are not UTF-8 read as U+FFFD).
fn decode_cursor(cursor: &str) -> Result<String, StoreError> {
    let bytes = hex::decode(cursor).map_err(|e| StoreError::Invalid(format!("bad cursor: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Where a page starts, for a cursor's sort key `after`.
#[derive(Debug, PartialEq)]
enum Start {
    /// After this item (DynamoDB's `ExclusiveStartKey`).
    After(HashMap<String, AttributeValue>),
    /// At the first item: the cursor is before the query's range in its order.
    First,
    /// Nothing is left: the cursor is past the range.
    Past,
}

/// The start of a page from `after` (a sort key or any string), for a query of `pk` whose sort
/// keys are those `within` takes and `before` tells below the range: DynamoDB refuses a start
/// key outside the key condition, an empty one and one over its 1,024-byte limit, where the
/// embedded backend just compares (`sk > after`).
fn start_of(
    pk: &str,
    after: &str,
    descending: bool,
    within: impl Fn(&str) -> bool,
    before: impl Fn(&str) -> bool,
) -> Start {
    let mut end = after.len().min(1024);
    while !after.is_char_boundary(end) {
        end -= 1;
    }
    let after = &after[..end];
    let below = after.is_empty() || before(after);
    if !after.is_empty() && within(after) {
        Start::After(key_to_dynamo(&Key::new(pk, after)))
    } else if below != descending {
        Start::First
    } else {
        Start::Past
    }
}

// ---------------------------------------------------------------------------------------------
// The port

impl DynamoTable {
    fn transact_item(&self, write: &Write) -> Result<TransactWriteItem, StoreError> {
        let invalid = |e: aws_sdk_dynamodb::error::BuildError| StoreError::Invalid(e.to_string());
        let mut x = ExprBuilder::new();
        Ok(match write {
            Write::Put { item, cond } => {
                let c = x.condition(cond)?;
                let put = Put::builder()
                    .table_name(&self.table)
                    .set_item(Some(item_to_dynamo(&item.key, &item.attrs)?))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(x.take_names())
                    .set_expression_attribute_values(x.take_values())
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().put(put).build()
            }
            Write::Update { key, updates, cond } => {
                let u = x.update(updates)?;
                let c = x.condition(cond)?;
                let update = DynUpdate::builder()
                    .table_name(&self.table)
                    .set_key(Some(key_to_dynamo(key)))
                    .update_expression(u)
                    .set_condition_expression(c)
                    .set_expression_attribute_names(x.take_names())
                    .set_expression_attribute_values(x.take_values())
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().update(update).build()
            }
            Write::Delete { key, cond } => {
                let c = x.condition(cond)?;
                let delete = Delete::builder()
                    .table_name(&self.table)
                    .set_key(Some(key_to_dynamo(key)))
                    .set_condition_expression(c)
                    .set_expression_attribute_names(x.take_names())
                    .set_expression_attribute_values(x.take_values())
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().delete(delete).build()
            }
            Write::Check { key, cond } => {
                // A condition check needs an expression; `Always` checks that nothing at all
                // is required, which `attribute_exists(pk) OR attribute_not_exists(pk)` says.
                let c = match x.condition(cond)? {
                    Some(c) => c,
                    None => {
                        let pk = x.name(PK);
                        format!("(attribute_exists({pk}) OR attribute_not_exists({pk}))")
                    }
                };
                let check = ConditionCheck::builder()
                    .table_name(&self.table)
                    .set_key(Some(key_to_dynamo(key)))
                    .condition_expression(c)
                    .set_expression_attribute_names(x.take_names())
                    .set_expression_attribute_values(x.take_values())
                    .build()
                    .map_err(invalid)?;
                TransactWriteItem::builder().condition_check(check).build()
            }
        })
    }
}

/// Requests of one [`Table::query_many`] or [`Table::update_each`] in flight at once.
const IN_FLIGHT: usize = 16;

#[async_trait]
impl Table for DynamoTable {
    async fn get(&self, key: &Key) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key_to_dynamo(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(store_error)?;
        out.item.map(item_from_dynamo).transpose()
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<Item>>, StoreError> {
        // BatchGetItem refuses a key asked twice: each distinct key once, answers mapped back.
        let mut distinct: Vec<&Key> = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        for key in keys {
            if seen.insert(key) {
                distinct.push(key);
            }
        }
        let mut found: HashMap<Key, Item> = HashMap::with_capacity(distinct.len());
        for chunk in distinct.chunks(MAX_BATCH_GET) {
            let mut pending: Vec<HashMap<String, AttributeValue>> = chunk.iter().map(|k| key_to_dynamo(k)).collect();
            let mut attempt = 0u32;
            while !pending.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| StoreError::Invalid(e.to_string()))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(store_error)?;
                for map in out.responses.and_then(|mut r| r.remove(&self.table)).unwrap_or_default() {
                    let item = item_from_dynamo(map)?;
                    found.insert(item.key.clone(), item);
                }
                // Keys DynamoDB did not get to (throttled or over 16 MB): asked again, with a
                // growing pause, as the API's documentation asks.
                pending =
                    out.unprocessed_keys.and_then(|mut u| u.remove(&self.table)).map(|k| k.keys).unwrap_or_default();
                if !pending.is_empty() {
                    attempt += 1;
                    if attempt > 8 {
                        return Err(StoreError::Unavailable("BatchGetItem left keys unprocessed".into()));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(25 << attempt.min(5))).await;
                }
            }
        }
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    async fn put(&self, item: Item, cond: Cond) -> Result<(), StoreError> {
        tidings_core::sizes::check_item(&item.key, &item.attrs)?;
        let mut x = ExprBuilder::new();
        let c = x.condition(&cond)?;
        let request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item_to_dynamo(&item.key, &item.attrs)?))
            .set_condition_expression(c)
            .set_expression_attribute_names(x.take_names())
            .set_expression_attribute_values(x.take_values());
        self.conflicts.run("PutItem", || async { request.clone().send().await.map_err(store_error) }).await?;
        Ok(())
    }

    async fn update(&self, key: &Key, updates: Vec<Update>, cond: Cond) -> Result<Item, StoreError> {
        let mut x = ExprBuilder::new();
        let u = x.update(&updates)?;
        let c = x.condition(&cond)?;
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key_to_dynamo(key)))
            .update_expression(u)
            .set_condition_expression(c)
            .set_expression_attribute_names(x.take_names())
            .set_expression_attribute_values(x.take_values())
            .return_values(ReturnValue::AllNew);
        let out =
            self.conflicts.run("UpdateItem", || async { request.clone().send().await.map_err(store_error) }).await?;
        match out.attributes {
            Some(attrs) if !attrs.is_empty() => item_from_dynamo(attrs),
            _ => Ok(Item::new(key.clone(), Attrs::new())),
        }
    }

    async fn delete(&self, key: &Key, cond: Cond) -> Result<(), StoreError> {
        let mut x = ExprBuilder::new();
        let c = x.condition(&cond)?;
        let request = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key_to_dynamo(key)))
            .set_condition_expression(c)
            .set_expression_attribute_names(x.take_names())
            .set_expression_attribute_values(x.take_values());
        self.conflicts.run("DeleteItem", || async { request.clone().send().await.map_err(store_error) }).await?;
        Ok(())
    }

    async fn transact(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        // Refused here, before anything is sent, with the reason (DynamoDB answers a
        // ValidationException that names no write).
        tidings_core::sizes::check_transaction(&writes)?;
        let mut keys = std::collections::HashSet::with_capacity(writes.len());
        for w in &writes {
            if !keys.insert(w.key()) {
                let k = w.key();
                return Err(StoreError::Invalid(format!("two writes on {}/{} in one transaction", k.pk, k.sk)));
            }
        }
        let items = writes.iter().map(|w| self.transact_item(w)).collect::<Result<Vec<_>, _>>()?;
        let request = self.client.transact_write_items().set_transact_items(Some(items));
        self.conflicts
            .run("TransactWriteItems", || async { request.clone().send().await.map_err(transact_error) })
            .await?;
        Ok(())
    }

    async fn query(&self, pk: &str, sk_prefix: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        let mut x = ExprBuilder::new();
        let pk_name = x.name(PK);
        let pk_value = x.value(AttributeValue::S(pk.to_string()));
        let mut key_cond = format!("{pk_name} = {pk_value}");
        if !sk_prefix.is_empty() {
            let sk_name = x.name(SK);
            let p = x.value(AttributeValue::S(sk_prefix.to_string()));
            key_cond.push_str(&format!(" AND begins_with({sk_name}, {p})"));
        }
        let start =
            opts.cursor.as_deref().map(decode_cursor).transpose()?.map(|after| {
                start_of(pk, &after, opts.descending, |sk| sk.starts_with(sk_prefix), |sk| sk < sk_prefix)
            });
        self.run_query(key_cond, x, opts, start).await
    }

    async fn query_many(&self, queries: &[(String, String)], limit: usize) -> Result<Vec<Page>, StoreError> {
        use futures::{StreamExt, TryStreamExt};
        // A query is one partition's: several in flight at once, a few at a time.
        type Querying<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Page, StoreError>> + Send + 'a>>;
        let each: Vec<Querying<'_>> = queries
            .iter()
            .map(|(pk, prefix)| -> Querying<'_> {
                Box::pin(self.query(pk, prefix, QueryOpts { limit, cursor: None, descending: false }))
            })
            .collect();
        futures::stream::iter(each).buffered(IN_FLIGHT).try_collect().await
    }

    async fn update_each(&self, updates: Vec<Updating>) -> Result<Vec<Result<Item, StoreError>>, StoreError> {
        use futures::StreamExt;
        // Each its own UpdateItem (a transaction would cost twice and fail as one), a few in
        // flight at once.
        let each = updates.into_iter().map(|u| async move { self.update(&u.key, u.updates, u.cond).await });
        Ok(futures::stream::iter(each).buffered(IN_FLIGHT).collect().await)
    }

    async fn query_range(&self, pk: &str, from: &str, to: &str, opts: QueryOpts) -> Result<Page, StoreError> {
        // DynamoDB refuses a BETWEEN whose bounds are out of order, and an empty string in a key
        // condition: the port answers nothing for the first, and reads "" as the start.
        if from > to || to.is_empty() {
            return Ok(Page::default());
        }
        let mut x = ExprBuilder::new();
        let pk_name = x.name(PK);
        let pk_value = x.value(AttributeValue::S(pk.to_string()));
        let sk_name = x.name(SK);
        let hi = x.value(AttributeValue::S(to.to_string()));
        let key_cond = if from.is_empty() {
            format!("{pk_name} = {pk_value} AND {sk_name} <= {hi}")
        } else {
            let lo = x.value(AttributeValue::S(from.to_string()));
            format!("{pk_name} = {pk_value} AND {sk_name} BETWEEN {lo} AND {hi}")
        };
        let start = opts
            .cursor
            .as_deref()
            .map(decode_cursor)
            .transpose()?
            .map(|after| start_of(pk, &after, opts.descending, |sk| from <= sk && sk <= to, |sk| sk < from));
        self.run_query(key_cond, x, opts, start).await
    }
}

impl DynamoTable {
    /// One page of a query of partition `pk` under `key_cond` (whose names and values `x`
    /// holds), from the cursor on: what `query` and `query_range` share.
    async fn run_query(
        &self,
        key_cond: String,
        mut x: ExprBuilder,
        opts: QueryOpts,
        start: Option<Start>,
    ) -> Result<Page, StoreError> {
        let limit = match opts.limit {
            0 => DEFAULT_LIMIT,
            n => n.min(MAX_LIMIT),
        };
        let start = match start {
            Some(Start::Past) => return Ok(Page::default()),
            Some(Start::After(key)) => Some(key),
            Some(Start::First) | None => None,
        };
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression(key_cond)
            .set_expression_attribute_names(x.take_names())
            .set_expression_attribute_values(x.take_values())
            .scan_index_forward(!opts.descending)
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(store_error)?;
        let items = out.items.unwrap_or_default().into_iter().map(item_from_dynamo).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = match out.last_evaluated_key {
            Some(k) if !k.is_empty() => Some(encode_cursor(&k)?),
            _ => None,
        };
        Ok(Page { items, next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names_of(x: &mut ExprBuilder) -> HashMap<String, String> {
        x.take_names().unwrap_or_default()
    }

    #[test]
    fn conditions_translate() {
        let mut x = ExprBuilder::new();
        assert_eq!(x.condition(&Cond::Always).unwrap(), None);
        assert_eq!(x.condition(&Cond::NotExists).unwrap().unwrap(), "attribute_not_exists(#n0)");
        assert_eq!(x.condition(&Cond::Exists).unwrap().unwrap(), "attribute_exists(#n0)");
        assert_eq!(names_of(&mut x).get("#n0").map(String::as_str), Some("pk"));

        let mut x = ExprBuilder::new();
        let c = Cond::And(vec![Cond::ge("qty", 3), Cond::Cmp("status".into(), CmpOp::Ne, json!("X"))]);
        assert_eq!(
            x.condition(&c).unwrap().unwrap(),
            "((attribute_type(#n0, :v1) AND #n0 >= :v0) AND (attribute_type(#n1, :v3) AND #n1 <> :v2))"
        );
        let values = x.take_values().unwrap();
        assert_eq!(values.get(":v0"), Some(&AttributeValue::N("3".into())));
        assert_eq!(values.get(":v1"), Some(&AttributeValue::S("N".into())));
        assert_eq!(values.get(":v3"), Some(&AttributeValue::S("S".into())));

        let mut x = ExprBuilder::new();
        assert_eq!(x.condition(&Cond::is_in("s", ["a", "b"])).unwrap().unwrap(), "#n0 IN (:v0, :v1)");
        let mut x = ExprBuilder::new();
        assert_eq!(
            x.condition(&Cond::In("s".into(), vec![])).unwrap().unwrap(),
            "(attribute_exists(#n0) AND attribute_not_exists(#n0))"
        );
        let mut x = ExprBuilder::new();
        assert_eq!(x.condition(&Cond::Not(Box::new(Cond::Or(vec![])))).unwrap(), None);
        let mut x = ExprBuilder::new();
        assert_eq!(
            x.condition(&Cond::Not(Box::new(Cond::AttrExists("a".into())))).unwrap().unwrap(),
            "(NOT attribute_exists(#n0))"
        );
    }

    #[test]
    fn updates_translate() {
        let mut x = ExprBuilder::new();
        let e = x
            .update(&[
                Update::set("a", 1),
                Update::SetIfAbsent("b".into(), json!("x")),
                Update::add("c", -2),
                Update::Remove("d".into()),
                Update::Set("e".into(), Value::Null),
            ])
            .unwrap();
        assert_eq!(e, "SET #n0 = :v0, #n1 = if_not_exists(#n1, :v1) ADD #n2 :v2 REMOVE #n3, #n4");
        assert_eq!(x.take_values().unwrap().get(":v2"), Some(&AttributeValue::N("-2".into())));
        let mut x = ExprBuilder::new();
        assert_eq!(x.update(&[]).unwrap(), "REMOVE #n0");
    }

    #[test]
    fn items_round_trip() {
        let key = Key::new("P", "S#1");
        let attrs: Attrs = serde_json::from_value(json!({
            "n": 3, "f": 1.5, "s": "x", "b": true, "l": [1, "a"], "m": {"k": [true]}, "gone": null,
            "pk": "mine", "sk": 2, "~t": "tilde"
        }))
        .unwrap();
        let item = item_to_dynamo(&key, &attrs).unwrap();
        assert!(!item.contains_key("gone"));
        assert_eq!(item.get("pk"), Some(&AttributeValue::S("P".into())));
        assert_eq!(item.get("~pk"), Some(&AttributeValue::S("mine".into())));
        assert_eq!(item.get("~sk"), Some(&AttributeValue::N("2".into())));
        assert_eq!(item.get("~~t"), Some(&AttributeValue::S("tilde".into())));
        let back = item_from_dynamo(item).unwrap();
        assert_eq!(back.key, key);
        let mut expected = attrs.clone();
        expected.remove("gone");
        assert_eq!(back.attrs, expected);
    }

    #[test]
    fn cursors_round_trip() {
        let k = key_to_dynamo(&Key::new("p", "s/1"));
        let c = encode_cursor(&k).unwrap();
        assert_eq!(c, hex::encode("s/1"), "the embedded backend's cursor");
        assert_eq!(decode_cursor(&c).unwrap(), "s/1");
        assert_eq!(decode_cursor("ff").unwrap(), "\u{FFFD}", "any hex is a position");
        assert!(decode_cursor("!!").is_err());
        assert!(decode_cursor("abc").is_err(), "odd length");
    }

    /// A cursor the server never gave still starts a page: after it when it is in the range,
    /// else at the first item or past the last, as the embedded backend's comparison does.
    #[test]
    fn any_cursor_starts_a_page_dynamodb_takes() {
        let within = |sk: &str| sk.starts_with("e#");
        let before = |sk: &str| sk < "e#";
        let after = |sk: &str| Start::After(key_to_dynamo(&Key::new("p", sk)));
        assert_eq!(start_of("p", "e#5", false, within, before), after("e#5"));
        assert_eq!(start_of("p", "a", false, within, before), Start::First);
        assert_eq!(start_of("p", "a", true, within, before), Start::Past);
        assert_eq!(start_of("p", "z", false, within, before), Start::Past);
        assert_eq!(start_of("p", "z", true, within, before), Start::First);
        assert_eq!(start_of("p", "", false, |_| true, |_| false), Start::First, "no empty start key");
        assert_eq!(start_of("p", "", true, |_| true, |_| false), Start::Past);
        let long = format!("e#{}", "\u{FFFD}".repeat(400));
        let Start::After(key) = start_of("p", &long, false, within, before) else { panic!("in the range") };
        let AttributeValue::S(sk) = &key[SK] else { panic!("a string key") };
        assert!(sk.len() <= 1024 && long.starts_with(sk.as_str()), "within DynamoDB's key size");
    }

    #[test]
    fn cancellation_reasons_map() {
        let r = cancellation_error(&[Some("None"), Some("ConditionalCheckFailed")], String::new());
        assert!(matches!(r, StoreError::ConditionFailed { index: 1 }));
        let r = cancellation_error(&[Some("TransactionConflict"), Some("None")], String::new());
        assert!(matches!(r, StoreError::Conflict));
        let r = cancellation_from_message(
            "Transaction cancelled, please refer cancellation reasons for specific reasons [None, None, ConditionalCheckFailed]",
        );
        assert!(matches!(r, StoreError::ConditionFailed { index: 2 }));
    }
}
