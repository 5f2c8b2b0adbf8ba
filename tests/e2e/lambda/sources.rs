//! The event source mappings and schedules of `template.yaml`, played as Lambda plays them:
//! SQS pollers that gather `BatchSize` within the batching window, invoke, and delete what did
//! not fail (`ReportBatchItemFailures`), leaving the rest to come back after its visibility;
//! the DynamoDB stream read shard by shard, filtered by the mapping's `FilterCriteria`, retried
//! from the first failed record, bisected on function errors and, after `MaximumRetryAttempts`,
//! recorded on the `OnFailure` queue; EventBridge schedules as scheduled events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

use super::runtime::Function;
use super::template::{ACCOUNT, REGION, queue_arn};

/// A scheduled event as EventBridge sends it.
pub fn scheduled_event(rule: &str) -> Value {
    json!({
        "version": "0", "id": uuid::Uuid::new_v4().to_string(), "detail-type": "Scheduled Event",
        "source": "aws.events", "account": ACCOUNT, "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": REGION, "resources": [format!("arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}")], "detail": {}
    })
}

/// One SQS event source mapping: its queue, function and settings.
pub struct SqsMapping {
    pub sqs: aws_sdk_sqs::Client,
    pub function: Arc<Function>,
    pub queue_url: String,
    pub queue_name: String,
    pub batch_size: usize,
    pub window: Duration,
    pub report_failures: bool,
    pub ledger: Arc<std::sync::Mutex<super::proxy::Ledger>>,
}

/// One poller of a mapping (a mapping runs as many as its concurrency allows).
pub async fn sqs_poller(mapping: Arc<SqsMapping>, stop: watch::Receiver<bool>) {
    let SqsMapping { sqs, function, queue_url, queue_name, batch_size, window, report_failures, ledger } = &*mapping;
    let (batch_size, window, report_failures) = (*batch_size, *window, *report_failures);
    let arn = queue_arn(queue_name);
    // The mapping's own requests, billed as SQS requests too (an empty long poll among them).
    let count = |op: &str| {
        let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
        *l.requests
            .entry("event-source-mapping".into())
            .or_default()
            .entry(format!("SQS.{op}@{queue_name}"))
            .or_default() += 1;
    };
    while !*stop.borrow() {
        let started = Instant::now();
        let mut batch: Vec<aws_sdk_sqs::types::Message> = Vec::new();
        loop {
            let want = (batch_size - batch.len()).min(10) as i32;
            let wait = if batch.is_empty() { 1 } else { 0 };
            let got = sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(want)
                .wait_time_seconds(wait)
                .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
                .send()
                .await;
            let Ok(got) = got else {
                tokio::time::sleep(Duration::from_millis(500)).await;
                break;
            };
            let messages = got.messages.unwrap_or_default();
            let empty = messages.is_empty();
            count(if empty { "ReceiveMessage(empty)" } else { "ReceiveMessage" });
            batch.extend(messages);
            if batch.len() >= batch_size
                || (empty && !batch.is_empty() && started.elapsed() >= window)
                || (empty && batch.is_empty())
            {
                break;
            }
            if empty {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if batch.is_empty() {
            continue;
        }
        let records: Vec<Value> = batch
            .iter()
            .map(|m| {
                let attributes: BTreeMap<String, String> = m
                    .attributes
                    .as_ref()
                    .map(|a| a.iter().map(|(k, v)| (k.as_str().to_owned(), v.clone())).collect())
                    .unwrap_or_default();
                json!({
                    "messageId": m.message_id, "receiptHandle": m.receipt_handle, "body": m.body,
                    "attributes": attributes, "messageAttributes": {}, "md5OfBody": m.md5_of_body,
                    "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": REGION,
                })
            })
            .collect();
        let invoked = function.invoke(Function::json(&json!({"Records": records}))).await;
        let failed: Option<BTreeSet<String>> = match invoked {
            Ok(inv) => match inv.payload {
                Ok(body) if report_failures => {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let ids: BTreeSet<String> = v["batchItemFailures"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
                        .collect();
                    let known = ids.iter().all(|id| batch.iter().any(|m| m.message_id.as_deref() == Some(id)));
                    // An unknown or empty identifier fails the whole batch, as on Lambda.
                    if known { Some(ids) } else { None }
                }
                Ok(_) => Some(BTreeSet::new()),
                Err(_) => None,
            },
            Err(_) => None,
        };
        let Some(failed) = failed else {
            // Nothing deleted: the batch comes back after its visibility. A function that
            // cannot start is not asked again at once.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let entries: Vec<_> = batch
            .iter()
            .filter(|m| !failed.contains(m.message_id.as_deref().unwrap_or_default()))
            .enumerate()
            .filter_map(|(i, m)| {
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle.clone().unwrap_or_default())
                    .build()
                    .ok()
            })
            .collect();
        for chunk in entries.chunks(10) {
            count("DeleteMessageBatch");
            let _ = sqs.delete_message_batch().queue_url(queue_url).set_entries(Some(chunk.to_vec())).send().await;
        }
    }
}

/// DynamoDB Local, spoken to directly (the mapping's reads are Lambda's, not the function's).
#[derive(Clone)]
pub struct Dynamo {
    pub url: String,
    pub http: reqwest::Client,
}

impl Dynamo {
    pub async fn call(&self, target: &str, body: Value) -> anyhow::Result<Value> {
        let answer = self
            .http
            .post(&self.url)
            .header("x-amz-target", target)
            .header("content-type", "application/x-amz-json-1.0")
            .header(
                "authorization",
                format!("AWS4-HMAC-SHA256 Credential=harness/20260101/{REGION}/dynamodb/aws4_request, SignedHeaders=host, Signature=0"),
            )
            .body(body.to_string())
            .send()
            .await?;
        let status = answer.status();
        let v: Value = answer.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(status.is_success(), "{target}: {status} {v}");
        Ok(v)
    }
}

/// Whether a stream record matches a Lambda filter pattern (the subset the template uses:
/// arrays of exact values, `{"prefix": ...}`, nested objects).
pub fn matches(pattern: &Value, record: &Value) -> bool {
    match pattern {
        Value::Object(fields) => fields.iter().all(|(k, p)| {
            let v = record.get(k).unwrap_or(&Value::Null);
            match p {
                Value::Array(options) => options.iter().any(|o| match o {
                    Value::Object(rule) => match rule.get("prefix") {
                        Some(Value::String(prefix)) => v.as_str().is_some_and(|s| s.starts_with(prefix.as_str())),
                        _ => false,
                    },
                    exact => v == exact,
                }),
                nested @ Value::Object(_) => matches(nested, v),
                _ => false,
            }
        }),
        _ => false,
    }
}

pub struct StreamMapping {
    pub dynamo: Dynamo,
    pub sqs: aws_sdk_sqs::Client,
    pub function: Arc<Function>,
    pub stream_arn: String,
    pub batch_size: usize,
    pub window: Duration,
    pub report_failures: bool,
    pub bisect: bool,
    pub max_retries: i64,
    pub on_failure_url: Option<String>,
    pub filters: Vec<Value>,
    /// Records given up on (sent to the OnFailure destination).
    pub given_up: Arc<std::sync::atomic::AtomicU64>,
}

impl StreamMapping {
    /// Follows every shard of the stream from its start (TRIM_HORIZON), parents before children.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut iterators: BTreeMap<String, String> = BTreeMap::new();
        let mut pending: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut last_describe = Instant::now() - Duration::from_secs(60);
        while !*stop.borrow() {
            if last_describe.elapsed() > Duration::from_secs(2) || iterators.is_empty() {
                last_describe = Instant::now();
                if let Ok(d) = self
                    .dynamo
                    .call("DynamoDBStreams_20120810.DescribeStream", json!({"StreamArn": self.stream_arn}))
                    .await
                {
                    for shard in d["StreamDescription"]["Shards"].as_array().into_iter().flatten() {
                        let id = shard["ShardId"].as_str().unwrap_or_default().to_owned();
                        // A child is read once its parent is read to its end (or trimmed away).
                        let parent_done =
                            shard["ParentShardId"].as_str().is_none_or(|p| done.contains(p) || !self_has(&d, p));
                        if done.contains(&id) || iterators.contains_key(&id) || !parent_done {
                            continue;
                        }
                        if let Ok(it) = self
                            .dynamo
                            .call(
                                "DynamoDBStreams_20120810.GetShardIterator",
                                json!({"StreamArn": self.stream_arn, "ShardId": id, "ShardIteratorType": "TRIM_HORIZON"}),
                            )
                            .await
                            && let Some(it) = it["ShardIterator"].as_str()
                        {
                            iterators.insert(id, it.to_owned());
                        }
                    }
                }
            }
            let mut idle = true;
            for (shard, iterator) in iterators.clone() {
                let got = self
                    .dynamo
                    .call("DynamoDBStreams_20120810.GetRecords", json!({"ShardIterator": iterator, "Limit": 1000}))
                    .await;
                let Ok(got) = got else {
                    iterators.remove(&shard);
                    continue;
                };
                let records = got["Records"].as_array().cloned().unwrap_or_default();
                let buffer = pending.entry(shard.clone()).or_default();
                for mut r in records {
                    if self.filters.is_empty() || self.filters.iter().any(|f| matches(f, &r)) {
                        r["eventSourceARN"] = json!(self.stream_arn);
                        r["awsRegion"] = json!(REGION);
                        buffer.push(r);
                    }
                }
                match got["NextShardIterator"].as_str() {
                    Some(next) => {
                        iterators.insert(shard.clone(), next.to_owned());
                    }
                    None => {
                        iterators.remove(&shard);
                        if buffer.is_empty() {
                            done.insert(shard.clone());
                        }
                    }
                }
                if !buffer.is_empty() {
                    idle = false;
                    let take: Vec<Value> = buffer.drain(..buffer.len().min(self.batch_size)).collect();
                    let shard_id = shard.clone();
                    self.deliver(&shard_id, take).await;
                    if !iterators.contains_key(&shard) && pending.get(&shard).is_none_or(Vec::is_empty) {
                        done.insert(shard);
                    }
                }
            }
            if idle {
                tokio::time::sleep(self.window.max(Duration::from_millis(200))).await;
            }
        }
    }

    /// Delivers one batch until it is through: retried from the first failed record, bisected on
    /// errors, given up on after the retries.
    async fn deliver(&self, shard: &str, batch: Vec<Value>) {
        let mut queue: std::collections::VecDeque<(Vec<Value>, i64)> = std::collections::VecDeque::from([(batch, 0)]);
        while let Some((batch, tries)) = queue.pop_front() {
            if batch.is_empty() {
                continue;
            }
            let invoked = self.function.invoke(Function::json(&json!({"Records": batch}))).await;
            let outcome = match invoked {
                Ok(inv) => match inv.payload {
                    Ok(body) => {
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let failed: Vec<String> = if self.report_failures {
                            v["batchItemFailures"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
                                .collect()
                        } else {
                            Vec::new()
                        };
                        Ok(failed)
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(failed) if failed.is_empty() => {}
                Ok(failed) => {
                    // Checkpoint before the lowest failed sequence number; retry from there.
                    let position = batch
                        .iter()
                        .position(|r| {
                            failed.iter().any(|f| Some(f.as_str()) == r["dynamodb"]["SequenceNumber"].as_str())
                        })
                        .unwrap_or(0);
                    self.retry_or_give_up(shard, batch[position..].to_vec(), tries, &mut queue, false).await;
                }
                Err(_) => self.retry_or_give_up(shard, batch, tries, &mut queue, self.bisect).await,
            }
        }
    }

    async fn retry_or_give_up(
        &self,
        shard: &str,
        batch: Vec<Value>,
        tries: i64,
        queue: &mut std::collections::VecDeque<(Vec<Value>, i64)>,
        bisect: bool,
    ) {
        if self.max_retries >= 0 && tries >= self.max_retries {
            self.give_up(shard, &batch).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(200 * (tries as u64 + 1).min(10))).await;
        if bisect && batch.len() > 1 {
            let (a, b) = batch.split_at(batch.len() / 2);
            // Split batches count their retries anew, as Lambda's bisection does.
            queue.push_front((b.to_vec(), tries + 1));
            queue.push_front((a.to_vec(), tries + 1));
        } else {
            queue.push_front((batch, tries + 1));
        }
    }

    async fn give_up(&self, shard: &str, batch: &[Value]) {
        self.given_up.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::SeqCst);
        let Some(url) = &self.on_failure_url else { return };
        let seq = |r: &Value| r["dynamodb"]["SequenceNumber"].as_str().unwrap_or_default().to_owned();
        let record = json!({
            "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": self.max_retries + 1},
            "DDBStreamBatchInfo": {
                "shardId": shard, "streamArn": self.stream_arn, "batchSize": batch.len(),
                "startSequenceNumber": batch.first().map(seq), "endSequenceNumber": batch.last().map(seq),
            }
        });
        let _ = self.sqs.send_message().queue_url(url).message_body(record.to_string()).send().await;
    }
}

fn self_has(describe: &Value, shard: &str) -> bool {
    describe["StreamDescription"]["Shards"].as_array().into_iter().flatten().any(|s| s["ShardId"] == shard)
}

/// The period of a `rate(...)` expression; `None` for cron (fired by the tests only).
pub fn rate(expression: &str) -> Option<Duration> {
    let inner = expression.strip_prefix("rate(")?.strip_suffix(')')?;
    let (n, unit) = inner.split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let seconds = match unit.trim_end_matches('s') {
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n * seconds))
}

pub async fn schedule(function: Arc<Function>, rule: String, every: Duration, stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    while !*stop.borrow() {
        tick.tick().await;
        let _ = function.invoke(Function::json(&scheduled_event(&rule))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_as_the_templates_patterns_mean() {
        let insert_n = json!({"eventName": "INSERT", "dynamodb": {"Keys": {"sk": {"S": "N"}, "pk": {"S": "x"}}}});
        let modify_n = json!({"eventName": "MODIFY", "dynamodb": {"Keys": {"sk": {"S": "N"}}}});
        let page = json!({"eventName": "INSERT", "dynamodb": {"Keys": {"sk": {"S": "P#3"}}}});
        let p_n: Value =
            serde_json::from_str(r#"{"eventName":["INSERT"],"dynamodb":{"Keys":{"sk":{"S":["N"]}}}}"#).unwrap();
        let p_page: Value =
            serde_json::from_str(r#"{"eventName":["INSERT"],"dynamodb":{"Keys":{"sk":{"S":[{"prefix":"P#"}]}}}}"#)
                .unwrap();
        assert!(matches(&p_n, &insert_n));
        assert!(!matches(&p_n, &modify_n));
        assert!(!matches(&p_n, &page));
        assert!(matches(&p_page, &page));
        assert!(!matches(&p_page, &insert_n));
    }

    #[test]
    fn rates_are_read() {
        assert_eq!(rate("rate(1 minute)"), Some(Duration::from_secs(60)));
        assert_eq!(rate("rate(2 hours)"), Some(Duration::from_secs(7200)));
        assert_eq!(rate("cron(0 3 * * ? *)"), None);
    }
}
