//! [`bootstrap`]: creates what the backend needs when it is missing (for emulators and a
//! first local run; on AWS the SAM template owns these resources). Idempotent.

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, StreamSpecification,
    StreamViewType, TableStatus,
};
use aws_sdk_sesv2::operation::create_email_identity::CreateEmailIdentityError;
use aws_sdk_sqs::types::QueueAttributeName;

use crate::AwsBackend;
use crate::table::{PK, SK};

/// A step of [`bootstrap`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("bootstrap: {step}: {detail}")]
    Aws {
        step: String,
        detail: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    #[error("bootstrap: {0}")]
    NotReady(String),
}

fn aws_err<E: std::error::Error + Send + Sync + 'static>(step: impl Into<String>) -> impl FnOnce(E) -> BootstrapError {
    let step = step.into();
    move |e| BootstrapError::Aws {
        step,
        detail: aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string(),
        source: Box::new(e),
    }
}

const TABLE_WAIT: Duration = Duration::from_secs(120);

/// Creates, when missing: the table (`pk` HASH, `sk` RANGE, on-demand, stream
/// `NEW_AND_OLD_IMAGES`), each queue with its DLQ and a redrive policy (`maxReceiveCount` from
/// the configuration), and the SES identity of the sender.
pub async fn bootstrap(backend: &AwsBackend, queue_names: &[&str]) -> Result<(), BootstrapError> {
    ensure_table(backend).await?;
    for name in queue_names {
        ensure_queue(backend, name).await?;
    }
    ensure_sender(backend).await?;
    Ok(())
}

async fn ensure_table(backend: &AwsBackend) -> Result<(), BootstrapError> {
    let client = backend.dynamo_client();
    let table = &backend.config().table;
    let described = client.describe_table().table_name(table).send().await;
    match described {
        Ok(out) => {
            let streaming = out.table().and_then(|t| t.stream_specification()).is_some_and(|s| s.stream_enabled());
            if !streaming {
                client
                    .update_table()
                    .table_name(table)
                    .stream_specification(stream_spec()?)
                    .send()
                    .await
                    .map_err(aws_err(format!("enable the stream of table {table}")))?;
            }
        }
        Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => {
            let attr = |n: &str| {
                AttributeDefinition::builder()
                    .attribute_name(n)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .map_err(aws_err("attribute definition"))
            };
            let key = |n: &str, t: KeyType| {
                KeySchemaElement::builder().attribute_name(n).key_type(t).build().map_err(aws_err("key schema"))
            };
            let created = client
                .create_table()
                .table_name(table)
                .attribute_definitions(attr(PK)?)
                .attribute_definitions(attr(SK)?)
                .key_schema(key(PK, KeyType::Hash)?)
                .key_schema(key(SK, KeyType::Range)?)
                .billing_mode(BillingMode::PayPerRequest)
                .stream_specification(stream_spec()?)
                .send()
                .await;
            if let Err(e) = created {
                // Someone else created it meanwhile.
                if !e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) {
                    return Err(aws_err(format!("create table {table}"))(e));
                }
            }
        }
        Err(e) => return Err(aws_err(format!("describe table {table}"))(e)),
    }
    // Wait until it is active.
    let deadline = tokio::time::Instant::now() + TABLE_WAIT;
    loop {
        let out = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(aws_err(format!("describe table {table}")))?;
        if out.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BootstrapError::NotReady(format!("table {table} is not active after {TABLE_WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn stream_spec() -> Result<StreamSpecification, BootstrapError> {
    StreamSpecification::builder()
        .stream_enabled(true)
        .stream_view_type(StreamViewType::NewAndOldImages)
        .build()
        .map_err(aws_err("stream specification"))
}

async fn ensure_queue(backend: &AwsBackend, logical: &str) -> Result<(), BootstrapError> {
    let sqs = backend.sqs_client();
    let config = backend.config();
    if !tidings_core::messages::has_dlq(logical) {
        // As `template.yaml`: a queue nobody consumes has no DLQ and no redrive policy.
        let name = config.queue_name(logical);
        sqs.create_queue().queue_name(&name).send().await.map_err(aws_err(format!("create queue {name}")))?;
        return Ok(());
    }
    let dlq_name = config.dlq_name(logical);
    let dlq_url = sqs
        .create_queue()
        .queue_name(&dlq_name)
        // The longest retention: a dead letter waits for an operator.
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
        .send()
        .await
        .map_err(aws_err(format!("create queue {dlq_name}")))?
        .queue_url
        .unwrap_or_default();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(&dlq_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .map_err(aws_err(format!("get the ARN of {dlq_name}")))?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        .cloned()
        .ok_or_else(|| BootstrapError::NotReady(format!("queue {dlq_name} has no ARN")))?;

    let name = config.queue_name(logical);
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .map_err(aws_err(format!("create queue {name}")))?
        .queue_url
        .unwrap_or_default();
    let policy = serde_json::json!({
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": config.max_receives.to_string(),
    })
    .to_string();
    sqs.set_queue_attributes()
        .queue_url(&url)
        .attributes(QueueAttributeName::RedrivePolicy, policy)
        .send()
        .await
        .map_err(aws_err(format!("set the redrive policy of {name}")))?;
    Ok(())
}

async fn ensure_sender(backend: &AwsBackend) -> Result<(), BootstrapError> {
    let from = &backend.config().email_from;
    match backend.ses_client().create_email_identity().email_identity(from).send().await {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.as_service_error(), Some(CreateEmailIdentityError::AlreadyExistsException(_))) => Ok(()),
        Err(e) => Err(aws_err(format!("create the SES identity {from}"))(e)),
    }
}
