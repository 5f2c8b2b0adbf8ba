//! The conformance suite (`tidings-conformance`) against the AWS backend, on the emulators
//! `make test` starts: DynamoDB and its streams from DynamoDB Local (`infra/dynamodb_local.sh`,
//! `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL_DYNAMODB_STREAMS`), SQS from moto
//! (`infra/moto.sh`, `AWS_ENDPOINT_URL`); or LocalStack, or AWS itself.
//!
//! ```sh
//! infra/moto.sh start; infra/dynamodb_local.sh start
//! env $(infra/moto.sh env) $(infra/dynamodb_local.sh env) cargo test -p tidings-tests --test conformance_aws
//! ```
//!
//! Without `AWS_ENDPOINT_URL` and `AWS_ENDPOINT_URL_DYNAMODB`, or with an endpoint that does not
//! answer, every test FAILS with a message saying so: nothing is skipped. Each test bootstraps
//! its own table (`tidings-conf-<run>-<test>`) and the queues it uses
//! (`tidings-conf-<run>-<id>-conf-a`, ... with `maxReceiveCount` 2), and deletes them at the end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;
use tidings_aws::{AwsBackend, AwsConfig, RedriveMode, bootstrap};
use tidings_conformance::{CONFORMANCE_QUEUES, MAX_RECEIVES, attrs, queue, run_id, stream, table};
use tidings_core::ports::{ChangeFeed, Cond, Item, Key, OutMessage, Queues, Table, Update, Write};

/// One id for the whole test process, so that names never clash with an earlier run.
fn process_run() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| run_id()[..8].to_string())
}

/// The endpoint, or a loud failure.
fn endpoint() -> String {
    let how = "Start the emulators with `infra/moto.sh start; infra/dynamodb_local.sh start` and run \
               `env $(infra/moto.sh env) $(infra/dynamodb_local.sh env) cargo test -p tidings-tests --test conformance_aws`.";
    match (std::env::var("AWS_ENDPOINT_URL"), std::env::var("AWS_ENDPOINT_URL_DYNAMODB")) {
        (Ok(url), Ok(ddb)) if !url.trim().is_empty() && !ddb.trim().is_empty() => ddb,
        (Ok(url), _) if !url.trim().is_empty() => panic!(
            "AWS_ENDPOINT_URL_DYNAMODB is not set: the AWS conformance tests take DynamoDB from DynamoDB Local, \
             not from {url}. {how}"
        ),
        _ => panic!("AWS_ENDPOINT_URL is not set: the AWS conformance tests need the emulators (or AWS). {how}"),
    }
}

/// A backend on a fresh table and the given conformance queues, bootstrapped.
struct Env {
    backend: AwsBackend,
}

impl Env {
    async fn new(test: &str, queues: &[&str]) -> Env {
        let url = endpoint();
        let mut config = AwsConfig::from_env().expect("the TIDINGS_* environment");
        config.table = format!("tidings-conf-{}-{test}", process_run());
        // Queues of their own per test (cases must not share a queue at the same time).
        config.queue_prefix = format!("tidings-conf-{}-{}-", process_run(), &run_id()[..6]);
        config.queue_urls.clear();
        config.max_receives = MAX_RECEIVES;
        // Receive-and-resend works on every SQS (moto has no StartMessageMoveTask); an explicit
        // TIDINGS_REDRIVE_MODE wins.
        if std::env::var_os("TIDINGS_REDRIVE_MODE").is_none() {
            config.redrive_mode = RedriveMode::ReceiveAndResend;
        }
        let backend = AwsBackend::from_config(config).await;
        let reachable =
            tokio::time::timeout(Duration::from_secs(20), backend.dynamo_client().list_tables().limit(1).send()).await;
        match reachable {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!(
                "AWS_ENDPOINT_URL_DYNAMODB={url} does not answer DynamoDB ({}). Is DynamoDB Local running \
                 (`infra/dynamodb_local.sh start`) and are AWS_REGION / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY set \
                 (`infra/moto.sh env`)?",
                aws_sdk_error(&e)
            ),
            Err(_) => panic!("AWS_ENDPOINT_URL_DYNAMODB={url} did not answer within 20 s"),
        }
        bootstrap(&backend, queues).await.unwrap_or_else(|e| panic!("bootstrap on {url}: {e}"));
        Env { backend }
    }

    fn table(&self) -> tidings_aws::DynamoTable {
        self.backend.table()
    }

    /// Best effort: the table and the queues of this test go away.
    async fn cleanup(self, queues: &[&str]) {
        let c = self.backend.config().clone();
        let _ = self.backend.dynamo_client().delete_table().table_name(&c.table).send().await;
        for q in queues {
            for name in [c.queue_name(q), c.dlq_name(q)] {
                if let Ok(out) = self.backend.sqs_client().get_queue_url().queue_name(&name).send().await
                    && let Some(url) = out.queue_url
                {
                    let _ = self.backend.sqs_client().delete_queue().queue_url(url).send().await;
                }
            }
        }
    }
}

fn aws_sdk_error(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

macro_rules! table_case {
    ($name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let env = Env::new(stringify!($name), &[]).await;
            table::$name(&env.table()).await;
            env.cleanup(&[]).await;
        }
    };
}

macro_rules! stream_case {
    ($name:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let env = Env::new(stringify!($name), &[]).await;
            let feed = env.backend.change_feed();
            stream::$name(&env.table(), &feed).await;
            env.cleanup(&[]).await;
        }
    };
}

macro_rules! queue_case {
    ($name:ident, $queue:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let env = Env::new(stringify!($name), &[$queue]).await;
            queue::$name(&env.backend.queues(), $queue).await;
            env.cleanup(&[$queue]).await;
        }
    };
}

table_case!(item_round_trip);
table_case!(get_many_in_order);
table_case!(query_many_in_order);
table_case!(update_each_alone);
table_case!(null_attributes_are_not_stored);
table_case!(conditional_put_conflict);
table_case!(update_upsert_and_add);
table_case!(conditions_semantics);
table_case!(transact_reports_failing_index);
table_case!(transact_rejects_invalid);
table_case!(query_prefix_and_pagination);
table_case!(query_range_and_pagination);
table_case!(item_and_transaction_sizes);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_all_or_nothing() {
    let env = Env::new("transactions_all_or_nothing", &[]).await;
    table::transactions_all_or_nothing(Arc::new(env.table())).await;
    env.cleanup(&[]).await;
}

stream_case!(change_stream_delivers_every_committed_write_in_order);
stream_case!(change_stream_skips_unchanged_writes);
stream_case!(change_stream_resumes_after_commit);

queue_case!(queue_send_receive_delete, "conf-a");
queue_case!(queue_send_many, "conf-b");
queue_case!(queue_delay, "conf-c");
queue_case!(queue_visibility_timeout, "conf-d");
queue_case!(queue_change_visibility, "conf-e");
queue_case!(queue_stale_receipt, "conf-f");
queue_case!(queue_max_receives_then_dlq, "conf-g");
queue_case!(queue_redrive, "conf-h");
queue_case!(queue_stats, "conf-i");
queue_case!(queue_long_poll, "conf-j");
queue_case!(queue_size_limits, "conf-k");
queue_case!(queue_groups, "conf-l");

/// The table cases concurrently on one table (as the embedded suite runs them on one store),
/// then the queue cases through `queue::ALL` concurrently, as a harness sharing one backend would
/// run them: failed transactions of one case never undo another case's writes. The stream case
/// reads a table of its own, so that it sees only its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_suite_on_one_shared_backend() {
    let env = Env::new("shared", &CONFORMANCE_QUEUES).await;
    let shared_table = Env::new("shared-table", &[]).await;
    let t = shared_table.table();
    tokio::join!(
        table::item_round_trip(&t),
        table::conditional_put_conflict(&t),
        table::update_upsert_and_add(&t),
        table::conditions_semantics(&t),
        table::transact_reports_failing_index(&t),
        table::transact_rejects_invalid(&t),
        table::query_prefix_and_pagination(&t),
        table::transactions_all_or_nothing(Arc::new(t.clone())),
    );
    let feed = env.backend.change_feed();
    stream::change_stream_delivers_every_committed_write_in_order(&env.table(), &feed).await;
    let queues = env.backend.queues();
    let mut cases = Vec::new();
    for (_, name, case) in queue::ALL {
        cases.push(case(&queues, name));
    }
    futures::future::join_all(cases).await;
    shared_table.cleanup(&[]).await;
    env.cleanup(&CONFORMANCE_QUEUES).await;
}

// ---------------------------------------------------------------------------------------------
// What only the AWS backend has.

/// A new feed on a table starts from the oldest record the stream keeps (TRIM_HORIZON), and
/// many records arrive in batches no larger than asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_feed_reads_from_trim_horizon_in_bounded_batches() {
    let env = Env::new("feed_trim_horizon", &[]).await;
    let t = env.table();
    for i in 0..25 {
        t.put(Item::new(Key::new("p", format!("k{i:02}")), attrs(json!({"i": i}))), Cond::Always).await.unwrap();
    }
    let feed = env.backend.change_feed();
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 25 && tokio::time::Instant::now() < until {
        let batch = feed.next_batch(7).await.unwrap();
        assert!(batch.len() <= 7, "a batch holds at most max records ({})", batch.len());
        feed.commit(&batch).await.unwrap();
        seen.extend(batch.into_iter().map(|r| r.key.sk));
    }
    let expected: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
    assert_eq!(seen, expected, "every write once, in commit order");
    env.cleanup(&[]).await;
}

/// Bootstrap is idempotent and keeps the redrive policy; the stats of a fresh queue are zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_bootstrap_is_idempotent() {
    let env = Env::new("bootstrap_twice", &["conf-a"]).await;
    bootstrap(&env.backend, &["conf-a"]).await.unwrap();
    let queues = env.backend.queues();
    let s = queues.stats("conf-a").await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed, s.dlq_depth), (0, 0, 0, 0));
    let url = queues.queue_url("conf-a").await.unwrap();
    let attrs = env
        .backend
        .sqs_client()
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy)
        .send()
        .await
        .unwrap();
    let policy = attrs
        .attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy))
        .cloned()
        .unwrap_or_default();
    assert!(policy.contains("conf-a-dlq") && policy.contains('2'), "redrive policy {policy}");
    // The table answers, with its stream.
    let t = env.table();
    t.transact(vec![Write::Update { key: Key::new("b", "c"), updates: vec![Update::add("n", 1)], cond: Cond::Always }])
        .await
        .unwrap();
    assert_eq!(t.get(&Key::new("b", "c")).await.unwrap().unwrap().i64("n"), Some(1));
    queues.send_batch("conf-a", vec![OutMessage::new("x")]).await.unwrap();
    env.cleanup(&["conf-a"]).await;
}

/// The providers against the endpoint: SES sends from the bootstrapped identity (with extra
/// headers), SNS sends an SMS, and a disabled push endpoint is an invalid token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_providers_send_and_classify() {
    use tidings_core::ports::{Channel, OutboundMessage, PermanentCode, Provider, ProviderError};
    let env = Env::new("providers", &[]).await;
    let message = |channel: Channel, to: &str| OutboundMessage {
        channel,
        to: to.into(),
        subject: Some("Back in stock".into()),
        body: "It is back".into(),
        html: None,
        headers: vec![("List-Unsubscribe".into(), "<https://example.test/u>".into())],
        idempotency_key: "n1:u1".into(),
        marketing: false,
        tenant: "t".into(),
        notification_id: "n1".into(),
        user_id: "u1".into(),
        attempt: 1,
    };
    let receipt = env.backend.email().send(&message(Channel::Email, "someone@example.test")).await.unwrap();
    assert!(!receipt.provider_message_id.is_empty(), "SES answers a message id");
    let receipt = env.backend.sms().send(&message(Channel::Sms, "+15555550100")).await.unwrap();
    assert!(!receipt.provider_message_id.is_empty(), "SNS answers a message id");

    let sns: aws_sdk_sns::Client = env.backend.sns_client();
    let app = sns
        .create_platform_application()
        .name(format!("tidings-conf-{}", run_id()))
        .platform("GCM")
        .attributes("PlatformCredential", "key")
        .send()
        .await
        .unwrap()
        .platform_application_arn
        .unwrap();
    let endpoint = sns
        .create_platform_endpoint()
        .platform_application_arn(&app)
        .token(format!("token-{}", run_id()))
        .send()
        .await
        .unwrap()
        .endpoint_arn
        .unwrap();
    let push = env.backend.push();
    push.send(&message(Channel::Push, &endpoint)).await.unwrap();
    sns.set_endpoint_attributes().endpoint_arn(&endpoint).attributes("Enabled", "false").send().await.unwrap();
    let e = push.send(&message(Channel::Push, &endpoint)).await.unwrap_err();
    assert!(
        matches!(e, ProviderError::Permanent { code: PermanentCode::InvalidToken, .. }),
        "a disabled endpoint is an invalid token: {e:?}"
    );
    let _ = sns.delete_platform_application().platform_application_arn(&app).send().await;
    env.cleanup(&[]).await;
}
