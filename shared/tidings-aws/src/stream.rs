//! [`DynamoChangeFeed`]: the [`ChangeFeed`] port on the table's DynamoDB stream, for the local
//! runtime (on Lambda the event source mapping reads the stream instead).
//!
//! Every shard is read from `TRIM_HORIZON`, or after the last committed record of that shard
//! (kept in memory: a new feed starts again from the oldest record the stream keeps, which is
//! at least once). A child shard is read only once its parent has been read to its end, so the
//! records of one key come in commit order.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodbstreams::types::{AttributeValue as StreamValue, Record, ShardIteratorType};
use tidings_core::ports::{Attrs, ChangeFeed, ChangeRecord, Key, StoreError};
use tokio::sync::Mutex;

use crate::error::{Kind, classify};
use crate::table::{PK, SK, attrs_from_stored};

/// How often the list of shards is read again.
const SHARD_REFRESH: Duration = Duration::from_secs(2);
/// How long `next_batch` waits for a record when there is none.
const POLL_WAIT: Duration = Duration::from_millis(200);
/// GetRecords calls per shard and pass that may come back empty before moving on.
const EMPTY_READS: usize = 3;

/// Attributes of a stream image, without `pk`/`sk`.
pub fn attrs_from_stream_image(image: &HashMap<String, StreamValue>) -> Result<Attrs, StoreError> {
    let mut image = image.clone();
    image.remove(PK);
    image.remove(SK);
    let stored: Attrs =
        serde_dynamo::from_item(image).map_err(|e| StoreError::Corrupt(format!("stream image: {e}")))?;
    Ok(attrs_from_stored(stored))
}

/// The key (`pk`, `sk`) of a stream image or of a record's `Keys`.
pub fn key_from_stream_image(image: &HashMap<String, StreamValue>) -> Result<Key, StoreError> {
    let pk = image.get(PK).and_then(|v| v.as_s().ok());
    let sk = image.get(SK).and_then(|v| v.as_s().ok());
    match (pk, sk) {
        (Some(pk), Some(sk)) => Ok(Key::new(pk.clone(), sk.clone())),
        _ => Err(StoreError::Corrupt("stream record without string pk/sk".into())),
    }
}

/// A DynamoDB Streams record as a [`ChangeRecord`].
pub fn change_record_from_stream(record: &Record) -> Result<ChangeRecord, StoreError> {
    let Some(d) = record.dynamodb() else {
        return Err(StoreError::Corrupt("stream record without dynamodb part".into()));
    };
    let seq = d
        .sequence_number()
        .ok_or_else(|| StoreError::Corrupt("stream record without sequence number".into()))?
        .to_string();
    let key = match (d.keys(), d.new_image(), d.old_image()) {
        (Some(k), _, _) if !k.is_empty() => key_from_stream_image(k)?,
        (_, Some(i), _) | (_, None, Some(i)) => key_from_stream_image(i)?,
        _ => return Err(StoreError::Corrupt(format!("stream record {seq} without key"))),
    };
    let old = d.old_image().map(attrs_from_stream_image).transpose()?;
    let new = d.new_image().map(attrs_from_stream_image).transpose()?;
    Ok(ChangeRecord { seq, key, old, new })
}

/// GetRecords calls one [`records_between`] makes at most.
const RANGE_READS: usize = 100;

/// The records of shard `shard` of the stream `stream_arn` from sequence number `start` to `end`
/// (both included), as an event source mapping's on-failure record names them. An error when
/// the stream no longer has them (past its 24 hours, `TrimmedDataAccessException`) or the shard
/// is gone.
pub async fn records_between(
    streams: &aws_sdk_dynamodbstreams::Client,
    stream_arn: &str,
    shard: &str,
    start: &str,
    end: &str,
) -> Result<Vec<ChangeRecord>, StoreError> {
    let first = streams
        .get_shard_iterator()
        .stream_arn(stream_arn)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .sequence_number(start)
        .send()
        .await
        .map_err(stream_error)?;
    let mut iterator = first.shard_iterator;
    let mut out = Vec::new();
    for _ in 0..RANGE_READS {
        let Some(it) = iterator.take() else { break };
        let page = streams.get_records().shard_iterator(it).limit(1000).send().await.map_err(stream_error)?;
        let empty = page.records().is_empty();
        for record in page.records() {
            let change = change_record_from_stream(record)?;
            if seq_cmp(&change.seq, end) == std::cmp::Ordering::Greater {
                return Ok(out);
            }
            let last = seq_cmp(&change.seq, end) == std::cmp::Ordering::Equal;
            out.push(change);
            if last {
                return Ok(out);
            }
        }
        iterator = page.next_shard_iterator;
        // An open shard answers empty pages at its end: nothing more to come for this range.
        if empty && !out.is_empty() {
            break;
        }
    }
    Ok(out)
}

impl crate::AwsBackend {
    /// [`records_between`] with this backend's DynamoDB Streams client.
    pub async fn stream_records_between(
        &self,
        stream_arn: &str,
        shard: &str,
        start: &str,
        end: &str,
    ) -> Result<Vec<ChangeRecord>, StoreError> {
        records_between(&self.streams_client(), stream_arn, shard, start, end).await
    }
}

/// Compares two sequence numbers (decimal strings of any length).
fn seq_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[derive(Debug, Default)]
struct ShardState {
    parent: Option<String>,
    /// The last committed record of the shard.
    committed: Option<String>,
    /// An iterator and the position it reads after (the last record it delivered).
    cursor: Option<(String, Option<String>)>,
    /// The shard was read to its end, which came after this position.
    ended_at: Option<Option<String>>,
    /// The shard no longer exists (trimmed).
    gone: bool,
}

impl ShardState {
    fn done(&self) -> bool {
        self.gone || self.ended_at.as_ref().is_some_and(|end| *end == self.committed)
    }
}

#[derive(Debug, Default)]
struct FeedState {
    stream_arn: Option<String>,
    shards: BTreeMap<String, ShardState>,
    /// Shard ids, parents before children.
    order: Vec<String>,
    refreshed: Option<Instant>,
    /// Records handed out and not yet committed: sequence number -> shard.
    delivered: HashMap<String, String>,
}

/// The [`ChangeFeed`] port on a DynamoDB stream.
#[derive(Debug)]
pub struct DynamoChangeFeed {
    dynamo: aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
    table: String,
    state: Mutex<FeedState>,
}

fn stream_error<E>(
    err: aws_sdk_dynamodbstreams::error::SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>,
) -> StoreError
where
    E: aws_sdk_dynamodbstreams::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let c = classify(&err);
    match c.kind {
        Kind::Transient => StoreError::Unavailable(c.message),
        Kind::Service | Kind::Construction => StoreError::Invalid(c.message),
    }
}

impl DynamoChangeFeed {
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        streams: aws_sdk_dynamodbstreams::Client,
        table: impl Into<String>,
    ) -> Self {
        Self { dynamo, streams, table: table.into(), state: Mutex::new(FeedState::default()) }
    }

    async fn stream_arn(&self, state: &mut FeedState) -> Result<String, StoreError> {
        if let Some(arn) = &state.stream_arn {
            return Ok(arn.clone());
        }
        let out = self.dynamo.describe_table().table_name(&self.table).send().await.map_err(stream_error)?;
        let arn = out
            .table()
            .and_then(|t| t.latest_stream_arn())
            .ok_or_else(|| StoreError::Invalid(format!("table {} has no stream", self.table)))?
            .to_string();
        state.stream_arn = Some(arn.clone());
        Ok(arn)
    }

    async fn refresh_shards(&self, state: &mut FeedState) -> Result<(), StoreError> {
        if state.refreshed.is_some_and(|t| t.elapsed() < SHARD_REFRESH) {
            return Ok(());
        }
        let arn = self.stream_arn(state).await?;
        let mut start: Option<String> = None;
        let mut listed = Vec::new();
        loop {
            let out = self
                .streams
                .describe_stream()
                .stream_arn(&arn)
                .set_exclusive_start_shard_id(start.take())
                .send()
                .await
                .map_err(stream_error)?;
            let Some(desc) = out.stream_description() else { break };
            for shard in desc.shards() {
                if let Some(id) = shard.shard_id() {
                    listed.push((id.to_string(), shard.parent_shard_id().map(str::to_string)));
                }
            }
            match desc.last_evaluated_shard_id() {
                Some(last) => start = Some(last.to_string()),
                None => break,
            }
        }
        for (id, parent) in listed {
            state.shards.entry(id).or_insert_with(|| ShardState { parent, ..ShardState::default() });
        }
        state.order = parents_first(&state.shards);
        state.refreshed = Some(Instant::now());
        Ok(())
    }

    /// One pass over the shards; appends at most `max - out.len()` records.
    async fn pass(&self, state: &mut FeedState, max: usize, out: &mut Vec<ChangeRecord>) -> Result<(), StoreError> {
        let order = state.order.clone();
        for id in order {
            if out.len() >= max {
                break;
            }
            let eligible = {
                let Some(shard) = state.shards.get(&id) else { continue };
                if shard.done() {
                    continue;
                }
                match shard.parent.as_ref().and_then(|p| state.shards.get(p)) {
                    None => true,
                    Some(parent) => parent.gone || parent.ended_at.is_some(),
                }
            };
            if !eligible {
                continue;
            }
            self.read_shard(state, &id, max, out).await?;
        }
        Ok(())
    }

    async fn read_shard(
        &self,
        state: &mut FeedState,
        id: &str,
        max: usize,
        out: &mut Vec<ChangeRecord>,
    ) -> Result<(), StoreError> {
        use aws_sdk_dynamodbstreams::operation::get_records::GetRecordsError;
        use aws_sdk_dynamodbstreams::operation::get_shard_iterator::GetShardIteratorError;

        let arn = self.stream_arn(state).await?;
        let FeedState { shards, delivered, .. } = state;
        let Some(shard) = shards.get_mut(id) else { return Ok(()) };

        // An iterator positioned right after the committed record.
        let (mut iterator, mut position) = match shard.cursor.take() {
            Some((it, pos)) if pos == shard.committed => (it, pos),
            _ => {
                let req = self.streams.get_shard_iterator().stream_arn(&arn).shard_id(id);
                let req = match &shard.committed {
                    Some(seq) => req.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).sequence_number(seq),
                    None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
                };
                match req.send().await {
                    Ok(o) => match o.shard_iterator {
                        Some(it) => (it, shard.committed.clone()),
                        None => {
                            shard.ended_at = Some(shard.committed.clone());
                            return Ok(());
                        }
                    },
                    Err(e) => {
                        if let Some(GetShardIteratorError::ResourceNotFoundException(_)) = e.as_service_error() {
                            shard.gone = true;
                            return Ok(());
                        }
                        if let Some(GetShardIteratorError::TrimmedDataAccessException(_)) = e.as_service_error() {
                            // The committed record is gone: start from the oldest kept one.
                            shard.committed = None;
                            return Ok(());
                        }
                        return Err(stream_error(e));
                    }
                }
            }
        };

        for _ in 0..EMPTY_READS {
            let want = (max - out.len()).clamp(1, 1000);
            let res = self
                .streams
                .get_records()
                .shard_iterator(&iterator)
                .limit(i32::try_from(want).unwrap_or(1000))
                .send()
                .await;
            let page = match res {
                Ok(p) => p,
                Err(e) => {
                    match e.as_service_error() {
                        Some(GetRecordsError::ExpiredIteratorException(_)) => return Ok(()),
                        Some(GetRecordsError::TrimmedDataAccessException(_)) => {
                            shard.committed = None;
                            return Ok(());
                        }
                        Some(GetRecordsError::ResourceNotFoundException(_)) => {
                            shard.gone = true;
                            return Ok(());
                        }
                        _ => {}
                    }
                    return Err(stream_error(e));
                }
            };
            let got = page.records().len();
            for record in page.records() {
                let change = change_record_from_stream(record)?;
                if change.old.is_some() && change.old == change.new {
                    // A write that changed nothing: DynamoDB Streams never records one, some
                    // emulators do. Skipped, and committed at once when nothing is pending
                    // before it.
                    if position == shard.committed {
                        shard.committed = Some(change.seq.clone());
                    }
                    position = Some(change.seq);
                    continue;
                }
                position = Some(change.seq.clone());
                delivered.insert(change.seq.clone(), id.to_string());
                out.push(change);
            }
            match page.next_shard_iterator {
                None => {
                    shard.ended_at = Some(position);
                    break;
                }
                Some(next) => {
                    iterator = next;
                    shard.cursor = Some((iterator.clone(), position.clone()));
                    if got > 0 || out.len() >= max {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Shard ids ordered so that a parent comes before its children (ids otherwise in order).
fn parents_first(shards: &BTreeMap<String, ShardState>) -> Vec<String> {
    fn visit(id: &str, shards: &BTreeMap<String, ShardState>, seen: &mut Vec<String>, depth: usize) {
        if seen.iter().any(|s| s == id) || depth > shards.len() {
            return;
        }
        if let Some(parent) = shards.get(id).and_then(|s| s.parent.as_deref())
            && shards.contains_key(parent)
        {
            visit(parent, shards, seen, depth + 1);
        }
        if !seen.iter().any(|s| s == id) {
            seen.push(id.to_string());
        }
    }
    let mut seen = Vec::with_capacity(shards.len());
    for id in shards.keys() {
        visit(id, shards, &mut seen, 0);
    }
    seen
}

#[async_trait]
impl ChangeFeed for DynamoChangeFeed {
    async fn next_batch(&self, max: usize) -> Result<Vec<ChangeRecord>, StoreError> {
        let max = max.max(1);
        let mut state = self.state.lock().await;
        let mut out = Vec::new();
        for attempt in 0..2 {
            self.refresh_shards(&mut state).await?;
            self.pass(&mut state, max, &mut out).await?;
            if !out.is_empty() || attempt == 1 {
                break;
            }
            tokio::time::sleep(POLL_WAIT).await;
        }
        Ok(out)
    }

    async fn commit(&self, records: &[ChangeRecord]) -> Result<(), StoreError> {
        let mut state = self.state.lock().await;
        let FeedState { shards, delivered, .. } = &mut *state;
        for record in records {
            let Some(id) = delivered.get(&record.seq) else { continue };
            if let Some(shard) = shards.get_mut(id) {
                let newer = match &shard.committed {
                    None => true,
                    Some(c) => seq_cmp(&record.seq, c).is_gt(),
                };
                if newer {
                    shard.committed = Some(record.seq.clone());
                }
            }
        }
        // Forget what is now behind the committed positions.
        delivered.retain(|seq, id| match shards.get(id.as_str()).and_then(|s| s.committed.as_deref()) {
            Some(c) => seq_cmp(seq, c).is_gt(),
            None => true,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodbstreams::types::StreamRecord;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(seq_cmp("900", "1000").is_lt());
        assert!(seq_cmp("000123", "123").is_eq());
        assert!(seq_cmp("124", "123").is_gt());
    }

    #[test]
    fn parents_come_first() {
        let mut shards = BTreeMap::new();
        shards.insert("a-child".to_string(), ShardState { parent: Some("z-parent".into()), ..Default::default() });
        shards.insert("z-parent".to_string(), ShardState::default());
        shards.insert("m-orphan".to_string(), ShardState { parent: Some("trimmed".into()), ..Default::default() });
        assert_eq!(parents_first(&shards), vec!["z-parent", "a-child", "m-orphan"]);
    }

    #[test]
    fn converts_records() {
        let image = HashMap::from([
            ("pk".to_string(), StreamValue::S("P".into())),
            ("sk".to_string(), StreamValue::S("S".into())),
            ("n".to_string(), StreamValue::N("2".into())),
        ]);
        let record = Record::builder()
            .dynamodb(
                StreamRecord::builder()
                    .sequence_number("100")
                    .set_keys(Some(HashMap::from([
                        ("pk".to_string(), StreamValue::S("P".into())),
                        ("sk".to_string(), StreamValue::S("S".into())),
                    ])))
                    .set_new_image(Some(image))
                    .build(),
            )
            .build();
        let c = change_record_from_stream(&record).unwrap();
        assert_eq!(c.seq, "100");
        assert_eq!(c.key, Key::new("P", "S"));
        assert!(c.is_insert());
        assert_eq!(c.new.unwrap().get("n"), Some(&serde_json::json!(2)));
    }
}
