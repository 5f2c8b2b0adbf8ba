//! The DynamoDB adapter's transactions sent again by the SDK after an answer that was lost
//! (docs/delivery.md, "Send: the rule of once"): on DynamoDB Local, through the conflict
//! layer, with a client whose first answer to a TransactWriteItems is replaced by a 500 after
//! DynamoDB applied it. The SDK sends it again with the same `ClientRequestToken` (it fills one
//! in on every TransactWriteItems call the adapter makes, before its retry loop), so DynamoDB
//! applies it once and answers the retry as the first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, ensure};
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextMut;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::types::{AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType};
use tidings_aws::DynamoTable;
use tidings_core::ports::{Attrs, Cond, Item, Key, Table, Update, Write};

/// Replaces the answer of the first `lose` TransactWriteItems attempts (each applied by
/// DynamoDB) with a 500, as a connection cut after the commit or a proxy's error would.
#[derive(Debug)]
struct LoseAnswers {
    seen: Arc<AtomicU32>,
    lose: u32,
}

impl Intercept for LoseAnswers {
    fn name(&self) -> &'static str {
        "LoseAnswers"
    }

    fn modify_before_deserialization(
        &self,
        ctx: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if self.seen.fetch_add(1, Ordering::SeqCst) < self.lose {
            let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"answer lost"}"#;
            let mut lost = HttpResponse::new(500.try_into()?, body.into());
            lost.headers_mut().insert("Content-Type", "application/x-amz-json-1.0");
            *ctx.response_mut() = lost;
        }
        Ok(())
    }
}

async fn make_table(client: &aws_sdk_dynamodb::Client, name: &str) -> anyhow::Result<()> {
    let attr =
        |n: &str| AttributeDefinition::builder().attribute_name(n).attribute_type(ScalarAttributeType::S).build();
    let key = |n: &str, k| KeySchemaElement::builder().attribute_name(n).key_type(k).build();
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr("pk")?)
        .attribute_definitions(attr("sk")?)
        .key_schema(key("pk", KeyType::Hash)?)
        .key_schema(key("sk", KeyType::Range)?)
        .send()
        .await
        .context("creating the table")?;
    Ok(())
}

/// A transaction whose first answer was lost after DynamoDB applied it, sent again by the
/// SDK: applied once (an unconditional counter is 1, not 2), and the caller told it succeeded
/// (its `attribute_not_exists` put is not refused by its own first attempt). Without one token
/// for the call's attempts the retry would add again, and a conditioned transaction (a run's
/// end, a delivery's record) would come back `ConditionFailed` although it had committed.
pub async fn a_transaction_whose_answer_was_lost_is_applied_once_when_the_sdk_sends_it_again() -> anyhow::Result<()> {
    crate::server::emulator();
    let sdk = tidings_aws::load_sdk_config().await;
    let plain = aws_sdk_dynamodb::Client::new(&sdk);
    let name = format!("e2e{:08x}-retries", rand::random::<u32>());
    make_table(&plain, &name).await?;
    let seen = Arc::new(AtomicU32::new(0));
    let lossy = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(LoseAnswers { seen: seen.clone(), lose: 1 }).build(),
    );
    let table = DynamoTable::new(lossy, name.clone());
    let counter = Key::new("retries", "counter");
    let run = Key::new("retries", "run");
    let writes = vec![
        Write::Update { key: counter.clone(), updates: vec![Update::add("n", 1)], cond: Cond::Always },
        Write::Put { item: Item::new(run.clone(), Attrs::new()), cond: Cond::NotExists },
    ];
    let answer = table.transact(writes).await;
    let check = DynamoTable::new(plain.clone(), name.clone());
    let n = check.get(&counter).await?.and_then(|i| i.attrs.get("n").and_then(serde_json::Value::as_i64));
    let attempts = seen.load(Ordering::SeqCst);
    let _ = plain.delete_table().table_name(&name).send().await;
    ensure!(attempts >= 2, "the SDK sent the transaction again after the lost answer ({attempts} attempts)");
    ensure!(answer.is_ok(), "the transaction committed and is answered so: {answer:?}");
    ensure!(n == Some(1), "applied once: the counter is {n:?}");
    Ok(())
}
