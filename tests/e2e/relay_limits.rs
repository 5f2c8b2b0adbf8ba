//! The relay and the orchestrator at Lambda's limits, through the function binaries on the
//! emulators (the Lambda harness plays the stream mapping with its retries, bisection and
//! on-failure queue, and tells each invocation its deadline):
//! - a poison stream record ends alone on `stream-failures`, with its keys, while every other
//!   record of its batch is relayed; `tidings ops stream-failures list` lists it and `replay`
//!   re-drives it once its item is readable, deleting the entry;
//! - an orchestrator batch that cannot end before the invocation's deadline hands back what it
//!   did not start (new copies, no receive charged) and everything is still delivered once.

use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use crate::lambda::sources::Dynamo;
use crate::lambda::{Options, Stack};

const WAIT: Duration = Duration::from_secs(120);

async fn ok(s: &Stack, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let (st, v) = s.call(method, path, body).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}\nrefused: {:?}", s.refused());
    Ok(v)
}

async fn completed(s: &Stack, id: &str) -> anyhow::Result<()> {
    s.eventually(WAIT, &format!("{id} completed"), || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(()))
    })
    .await
}

/// The stacks' DynamoDB, read directly ([`crate::lambda::dynamodb_urls`]).
fn dynamo() -> anyhow::Result<Dynamo> {
    let (url, _) = crate::lambda::dynamodb_urls()?;
    Ok(Dynamo { url, http: reqwest::Client::new() })
}

/// Runs `tidings ops stream-failures <command> --backend aws` against the stack's table and
/// queues, as an operator would, and returns what it printed.
async fn stream_failures_cli(s: &Stack, command: &str) -> anyhow::Result<Value> {
    let url = s.queue_urls.get("StreamFailuresQueue").context("no StreamFailuresQueue")?;
    let name = url.rsplit('/').next().unwrap_or_default();
    let prefix = name.strip_suffix("stream-failures").context("the queue's name")?;
    let data = tempfile::tempdir()?;
    let (dynamodb, streams) = crate::lambda::dynamodb_urls()?;
    let out = tokio::process::Command::new(crate::server::binary()?)
        .args(["ops", "stream-failures", command, "--backend", "aws", "--data-dir"])
        .arg(data.path())
        .env("TIDINGS_TABLE", &s.table)
        .env("AWS_ENDPOINT_URL_DYNAMODB", dynamodb)
        .env("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", streams)
        .env("TIDINGS_QUEUE_PREFIX", prefix)
        .env("AWS_REGION", crate::lambda::template::REGION)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "tidings ops stream-failures {command}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

async fn setup(s: &Stack, users: usize) -> anyhow::Result<()> {
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi {{ n }}", "email_body": "<p>Hi {{ n }}</p>"}}});
    ok(s, "PUT", "/v1/templates/relay", Some(template)).await?;
    for i in 0..users {
        ok(s, "PUT", &format!("/v1/users/u{i}"), Some(json!({"email": format!("u{i}@example.com")}))).await?;
    }
    Ok(())
}

fn request(key: &str, users: usize) -> Value {
    let ids: Vec<String> = (0..users).map(|i| format!("u{i}")).collect();
    json!({"idempotency_key": key, "recipients": {"user_ids": ids}, "template_id": "relay", "params": {"n": 1},
        "category": "transactional", "channels": ["email"]})
}

pub async fn a_poison_stream_record_ends_alone_on_stream_failures_and_its_batch_is_relayed() -> anyhow::Result<()> {
    let s = Stack::start(Options::default()).await?;
    setup(&s, 1).await?;
    let first = ok(&s, "POST", "/v1/notifications", Some(request("relay-0", 1))).await?;
    let first = first["notification_id"].as_str().unwrap_or_default().to_owned();
    completed(&s, &first).await?;

    // One transaction, so one stream batch: a notification item that can never be relayed
    // (its status is a number) and three good ones (copies of the first, accepted).
    let db = dynamo()?;
    let got = db
        .call(
            "DynamoDB_20120810.GetItem",
            json!({"TableName": s.table, "Key": {"pk": {"S": format!("T#acme#N#{first}")}, "sk": {"S": "N"}}}),
        )
        .await?;
    let item = got["Item"].as_object().context("the first notification's item")?.clone();
    let copy = |id: &str| {
        let mut c = item.clone();
        for gone in ["orchestrated", "last_page", "verified_at"] {
            c.remove(gone);
        }
        c.insert("pk".into(), json!({"S": format!("T#acme#N#{id}")}));
        c.insert("notification_id".into(), json!({"S": id}));
        c.insert("status".into(), json!({"S": "accepted"}));
        Value::Object(c)
    };
    let good = ["relay-a", "relay-b", "relay-c"];
    let poison = json!({"pk": {"S": "T#acme#N#relay-poison"}, "sk": {"S": "N"}, "status": {"N": "7"}});
    let mut puts = vec![json!({"Put": {"TableName": s.table, "Item": poison}})];
    puts.extend(good.iter().map(|id| json!({"Put": {"TableName": s.table, "Item": copy(id)}})));
    db.call("DynamoDB_20120810.TransactWriteItems", json!({"TransactItems": puts})).await?;

    for id in good {
        completed(&s, id).await?;
    }
    let listed = s
        .eventually(WAIT, "the poison record listed", || async {
            let v = stream_failures_cli(&s, "list").await?;
            let entries = v["stream_failures"].as_array().cloned().unwrap_or_default();
            Ok((!entries.is_empty()).then_some(entries))
        })
        .await?;
    assert_eq!(listed.len(), 1, "the poison record alone: {listed:?}");
    let entry = &listed[0];
    assert_eq!(entry["condition"], "PoisonRecord", "{entry}");
    assert_eq!(entry["batch_size"], 1, "{entry}");
    assert_eq!(entry["key"], json!({"pk": "T#acme#N#relay-poison", "sk": "N"}), "{entry}");
    assert!(entry["start_sequence_number"].is_string(), "{entry}");
    assert!(entry["reason"].as_str().unwrap_or_default().contains("unreadable notification"), "{entry}");
    assert_eq!(
        s.stream_given_up.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the mapping gave nothing up: the relay set the poison record aside itself"
    );

    // Still unreadable: replay keeps it. Once the item is readable (fixed by hand, a modify
    // the relay's filter does not see), replay re-drives it and deletes the entry.
    let kept = stream_failures_cli(&s, "replay").await?;
    assert_eq!(kept["kept"].as_array().map(Vec::len), Some(1), "{kept}");
    db.call("DynamoDB_20120810.PutItem", json!({"TableName": s.table, "Item": copy("relay-poison")})).await?;
    // Beside it, an entry as the mapping writes one when it gives a batch up (positions only,
    // tests/e2e/lambda/sources.rs give_up), naming the same record: replay reads it back from
    // the stream.
    let seq = entry["start_sequence_number"].as_str().unwrap_or_default().to_owned();
    let (stream_arn, shard) = shard_of(&s, &db, &seq).await?;
    let given_up = json!({
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
        "DDBStreamBatchInfo": {"shardId": shard, "streamArn": stream_arn, "batchSize": 1,
            "startSequenceNumber": seq, "endSequenceNumber": seq}
    });
    let url = s.queue_urls.get("StreamFailuresQueue").context("no StreamFailuresQueue")?;
    s.sqs.send_message().queue_url(url).message_body(given_up.to_string()).send().await?;
    let replayed = stream_failures_cli(&s, "replay").await?;
    assert_eq!(replayed["kept"], json!([]), "{replayed}");
    let done = replayed["replayed"].as_array().cloned().unwrap_or_default();
    assert_eq!(done.len(), 2, "{replayed}");
    assert!(done.iter().any(|e| e["condition"] == "PoisonRecord" && e["replayed"] == true), "{replayed}");
    assert!(
        done.iter().any(|e| e["condition"] == "RetryAttemptsExhausted" && e["records"] == 1),
        "the record read back from the stream: {replayed}"
    );
    completed(&s, "relay-poison").await?;
    let after = stream_failures_cli(&s, "list").await?;
    assert_eq!(after["stream_failures"], json!([]), "the replayed entries are deleted");
    // Five notifications to u0 (the first, three copies, the fixed one), each sent once though
    // the fixed one was re-driven twice.
    s.eventually(WAIT, "five sends", || async { Ok((s.sends().len() >= 5).then_some(())) }).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.sends().len(), 5, "{:?}", s.sends());
    Ok(())
}

/// The stack's stream and the shard that holds sequence number `seq`.
async fn shard_of(s: &Stack, db: &Dynamo, seq: &str) -> anyhow::Result<(String, String)> {
    let table = db.call("DynamoDB_20120810.DescribeTable", json!({"TableName": s.table})).await?;
    let arn = table["Table"]["LatestStreamArn"].as_str().context("the table's stream")?.to_owned();
    let (_, url) = crate::lambda::dynamodb_urls()?;
    let streams = Dynamo { url, http: db.http.clone() };
    let d = streams.call("DynamoDBStreams_20120810.DescribeStream", json!({"StreamArn": arn})).await?;
    // Sequence numbers are decimal strings of any length.
    let le = |a: &str, b: &str| (a.len(), a) <= (b.len(), b);
    let shard = d["StreamDescription"]["Shards"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|sh| {
            let range = &sh["SequenceNumberRange"];
            range["StartingSequenceNumber"].as_str().is_some_and(|start| le(start, seq))
                && range["EndingSequenceNumber"].as_str().is_none_or(|end| le(seq, end))
        })
        .and_then(|sh| sh["ShardId"].as_str())
        .context("no shard holds the record")?;
    Ok((arn, shard.to_owned()))
}

pub async fn a_slow_orchestrator_batch_hands_back_what_it_cannot_finish() -> anyhow::Result<()> {
    // A timeout of 20 s (the handler keeps its last 5 s for what follows its work) and every AWS
    // request of the orchestrator slowed by 500 ms: one notification of fifteen users (its users
    // read in one batch, its deliveries written, its sends queued: about fourteen requests, some
    // of them side by side) takes 4 to 7 s however loaded this machine is, so the first of a
    // batch always ends in time, and a batch of five cannot (the work's length is set by the
    // added latency, not by the machine's speed, which under qemu on a busy CI runner varies
    // several-fold). One environment per function, so one poller per queue: while it works on
    // its first batch the other notifications queue up behind it and its next batch holds all
    // of them; two pollers could split the ten into batches short enough to finish. Two
    // receives before the DLQ: a hand back that charged one would dead-letter a message.
    let users = 15;
    let s = Stack::start(Options {
        timeouts: vec![("orchestrator", 20)],
        latency: vec![("orchestrator", Duration::from_millis(500))],
        max_receives: 2,
        concurrency: 1,
        ..Options::default()
    })
    .await?;
    setup(&s, users).await?;
    let posts = (0..10).map(|i| {
        let s = &s;
        async move {
            let v = ok(s, "POST", "/v1/notifications", Some(request(&format!("slow-{i}"), users))).await?;
            anyhow::Ok(v["notification_id"].as_str().unwrap_or_default().to_owned())
        }
    });
    let ids: Vec<String> = futures_util::future::try_join_all(posts).await?;
    for id in &ids {
        completed(&s, id).await?;
    }
    let sends = s.sends().len();
    assert_eq!(sends, 10 * users, "each of ten notifications to {users} users, once each");
    let orchestrator = s.stats().get("orchestrator").cloned().context("orchestrator stats")?;
    assert_eq!(orchestrator.timeouts, 0, "no invocation outran its deadline: {orchestrator:?}");
    let handed_back: u64 = s
        .requests()
        .get("orchestrator")
        .map(|ops| {
            ops.iter()
                .filter(|(op, _)| op.starts_with("SQS.SendMessage") && op.contains("requests-"))
                .map(|(_, n)| n)
                .sum()
        })
        .unwrap_or(0);
    assert!(handed_back > 0, "messages not started were handed back: {:?}", s.requests().get("orchestrator"));
    let dlq = s.queue_urls.get("RequestsHighDlq").context("no RequestsHighDlq")?;
    let depth = s
        .sqs
        .get_queue_attributes()
        .queue_url(dlq)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await?;
    let depth = depth
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .cloned()
        .unwrap_or_default();
    assert_eq!(depth, "0", "nothing was dead-lettered");
    Ok(())
}
