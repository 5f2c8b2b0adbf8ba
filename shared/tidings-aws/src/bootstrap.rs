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

/// What [`bootstrap_reporting`] found for one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bootstrapped {
    Created,
    /// There already; for the table, its stream was on.
    Found,
    /// The table was there without its stream, which was turned on.
    StreamEnabled,
}

impl Bootstrapped {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Found => "found",
            Self::StreamEnabled => "found, stream enabled",
        }
    }
}

/// One resource [`bootstrap_reporting`] made sure of: its kind (`table`, `queue`, `dlq`,
/// `sender`), its name, and what was done.
pub type BootstrapReport<'a> = &'a (dyn Fn(&str, &str, Bootstrapped) + Send + Sync);

/// Creates, when missing: the table (`pk` HASH, `sk` RANGE, on-demand, stream
/// `NEW_AND_OLD_IMAGES`), each queue with its DLQ and a redrive policy (`maxReceiveCount` from
/// the configuration), and the SES identity of the sender.
pub async fn bootstrap(backend: &AwsBackend, queue_names: &[&str]) -> Result<(), BootstrapError> {
    bootstrap_reporting(backend, queue_names, &|_, _, _| {}).await
}

/// [`bootstrap`], telling `report` of each resource as it is made sure of (the `tidings`
/// command's progress).
pub async fn bootstrap_reporting(
    backend: &AwsBackend,
    queue_names: &[&str],
    report: BootstrapReport<'_>,
) -> Result<(), BootstrapError> {
    let done = ensure_table(backend).await?;
    report("table", &backend.config().table, done);
    for name in queue_names {
        ensure_queue(backend, name, report).await?;
    }
    let done = ensure_sender(backend).await?;
    report("sender", &backend.config().email_from, done);
    Ok(())
}

/// Whether a queue of this name exists (so that a report tells created from found; creating
/// an existing queue with the same attributes succeeds either way).
async fn queue_exists(sqs: &aws_sdk_sqs::Client, name: &str) -> bool {
    sqs.get_queue_url().queue_name(name).send().await.is_ok()
}

async fn ensure_table(backend: &AwsBackend) -> Result<Bootstrapped, BootstrapError> {
    let client = backend.dynamo_client();
    let table = &backend.config().table;
    let described = client.describe_table().table_name(table).send().await;
    let mut done = Bootstrapped::Found;
    match described {
        Ok(out) => {
            let streaming = out.table().and_then(|t| t.stream_specification()).is_some_and(|s| s.stream_enabled());
            if !streaming {
                done = Bootstrapped::StreamEnabled;
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
            match created {
                Ok(_) => done = Bootstrapped::Created,
                // Someone else created it meanwhile.
                Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {}
                Err(e) => return Err(aws_err(format!("create table {table}"))(e)),
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
            return Ok(done);
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

fn found_or_created(existed: bool) -> Bootstrapped {
    if existed { Bootstrapped::Found } else { Bootstrapped::Created }
}

async fn ensure_queue(backend: &AwsBackend, logical: &str, report: BootstrapReport<'_>) -> Result<(), BootstrapError> {
    let sqs = backend.sqs_client();
    let config = backend.config();
    if !tidings_core::messages::has_dlq(logical) {
        // As `template.yaml`: a queue nobody consumes has no DLQ and no redrive policy.
        let name = config.queue_name(logical);
        let existed = queue_exists(sqs, &name).await;
        sqs.create_queue().queue_name(&name).send().await.map_err(aws_err(format!("create queue {name}")))?;
        report("queue", &name, found_or_created(existed));
        return Ok(());
    }
    let dlq_name = config.dlq_name(logical);
    let dlq_existed = queue_exists(sqs, &dlq_name).await;
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
    report("dlq", &dlq_name, found_or_created(dlq_existed));

    let name = config.queue_name(logical);
    let existed = queue_exists(sqs, &name).await;
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
    report("queue", &name, found_or_created(existed));
    Ok(())
}

async fn ensure_sender(backend: &AwsBackend) -> Result<Bootstrapped, BootstrapError> {
    let from = &backend.config().email_from;
    match backend.ses_client().create_email_identity().email_identity(from).send().await {
        Ok(_) => Ok(Bootstrapped::Created),
        Err(e) if matches!(e.as_service_error(), Some(CreateEmailIdentityError::AlreadyExistsException(_))) => {
            Ok(Bootstrapped::Found)
        }
        Err(e) => Err(aws_err(format!("create the SES identity {from}"))(e)),
    }
}
