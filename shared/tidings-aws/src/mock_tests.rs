//! The adapters against typed SDK mocks (`aws-smithy-mocks`): errors are given as the raw
//! HTTP answers the services send, so the SDK's own error parsing is part of the test.

use std::collections::HashMap;
use std::time::Duration;

use aws_smithy_mocks::{Rule, mock};
use serde_json::json;
use tidings_core::ports::{
    Channel, Cond, Item, Key, OutMessage, OutboundMessage, PermanentCode, Provider, ProviderError, QueryOpts,
    QueueError, Queues, StoreError, Table, Update, Write,
};

use crate::{AwsConfig, ConflictRetry, DynamoTable, RedriveMode, SesEmail, SnsPush, SnsSms, SqsQueues};

/// A client of `$krate` answering from the rules (the equivalent of `mock_client!` without the
/// SDK crates' `test-util` feature).
fn dynamo_error(code: &str, extra: serde_json::Value) -> String {
    let mut body = json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{code}"), "message": code});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body.to_string()
}

fn item(pk: &str, sk: &str) -> Item {
    Item::new(Key::new(pk, sk), serde_json::from_value(json!({"n": 1})).unwrap())
}

// --- DynamoDB -----------------------------------------------------------------------------------

fn table_with(rules: &[&Rule]) -> DynamoTable {
    DynamoTable::new(client!(aws_sdk_dynamodb, rules.iter().copied()), "t")
}

#[tokio::test]
async fn transaction_cancelled_names_the_failed_write() {
    let body = dynamo_error(
        "TransactionCanceledException",
        json!({"CancellationReasons": [{"Code": "None"}, {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}, {"Code": "None"}]}),
    );
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .match_requests(|r| r.transact_items().len() == 3)
        .sequence()
        .http_status(400, Some(body))
        .build();
    let table = table_with(&[&rule]);
    let err = table
        .transact(vec![
            Write::Put { item: item("a", "1"), cond: Cond::NotExists },
            Write::Update { key: Key::new("a", "2"), updates: vec![Update::add("n", -1)], cond: Cond::ge("n", 1) },
            Write::Check { key: Key::new("a", "3"), cond: Cond::Always },
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ConditionFailed { index: 1 }), "{err:?}");
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn transaction_conflict_is_retryable() {
    let body = dynamo_error(
        "TransactionCanceledException",
        json!({"CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}]}),
    );
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items).sequence().http_status(400, Some(body)).build();
    let table = table_with(&[&rule]).with_conflict_retry(ConflictRetry::NONE);
    let err = table
        .transact(vec![
            Write::Put { item: item("a", "1"), cond: Cond::Always },
            Write::Delete { key: Key::new("a", "2"), cond: Cond::Always },
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(rule.num_calls(), 1);
}

fn conflict_body() -> String {
    dynamo_error(
        "TransactionCanceledException",
        json!({"CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}]}),
    )
}

fn two_writes() -> Vec<Write> {
    vec![
        Write::Put { item: item("a", "1"), cond: Cond::NotExists },
        Write::Update { key: Key::new("hot", "counter"), updates: vec![Update::add("n", 1)], cond: Cond::Always },
    ]
}

/// A transaction cancelled for a conflict wrote nothing: the adapter sends it again (with a
/// backoff) and the caller sees only the success.
#[tokio::test]
async fn transaction_conflicts_are_retried_until_the_write_goes_through() {
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .sequence()
        .http_status(400, Some(conflict_body()))
        .times(3)
        .output(|| aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput::builder().build())
        .build();
    let table = table_with(&[&rule]);
    table.transact(two_writes()).await.unwrap();
    assert_eq!(rule.num_calls(), 4, "three conflicts, then the write");
}

/// Conflicts that outlast the retry budget end in `Conflict` (retryable), within the budget.
#[tokio::test]
async fn transaction_conflicts_past_the_budget_are_a_retryable_conflict() {
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .sequence()
        .http_status(400, Some(conflict_body()))
        .repeatedly()
        .build();
    let budget = Duration::from_millis(200);
    let table = table_with(&[&rule]).with_conflict_retry(ConflictRetry {
        budget,
        base: Duration::from_millis(5),
        cap: Duration::from_millis(40),
    });
    let started = std::time::Instant::now();
    let err = table.transact(two_writes()).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict), "{err:?}");
    assert!(started.elapsed() < budget + Duration::from_millis(150), "{:?}", started.elapsed());
    assert!(rule.num_calls() > 2, "retried within the budget ({} calls)", rule.num_calls());
}

/// A single write of an item a transaction holds is refused with TransactionConflictException:
/// retried the same way.
#[tokio::test]
async fn a_single_write_refused_for_an_ongoing_transaction_is_retried() {
    let body = dynamo_error("TransactionConflictException", json!({}));
    let rule = mock!(aws_sdk_dynamodb::Client::update_item)
        .sequence()
        .http_status(400, Some(body))
        .times(2)
        .output(|| aws_sdk_dynamodb::operation::update_item::UpdateItemOutput::builder().build())
        .build();
    let table = table_with(&[&rule]);
    table.update(&Key::new("hot", "counter"), vec![Update::add("n", 1)], Cond::Always).await.unwrap();
    assert_eq!(rule.num_calls(), 3);
}

#[tokio::test]
async fn transaction_with_two_writes_on_one_key_is_invalid_without_a_call() {
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .then_output(|| aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsOutput::builder().build());
    let table = table_with(&[&rule]);
    let err = table
        .transact(vec![
            Write::Put { item: item("a", "1"), cond: Cond::Always },
            Write::Delete { key: Key::new("a", "1"), cond: Cond::Always },
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert_eq!(rule.num_calls(), 0);
}

#[tokio::test]
async fn single_write_errors_map() {
    let cond = mock!(aws_sdk_dynamodb::Client::put_item)
        .match_requests(|r| {
            r.item().and_then(|i| i.get("pk")).and_then(|v| v.as_s().ok()).map(String::as_str) == Some("cond")
        })
        .sequence()
        .http_status(400, Some(dynamo_error("ConditionalCheckFailedException", json!({}))))
        .build();
    let throttled = mock!(aws_sdk_dynamodb::Client::put_item)
        .match_requests(|r| {
            r.item().and_then(|i| i.get("pk")).and_then(|v| v.as_s().ok()).map(String::as_str) == Some("slow")
        })
        .sequence()
        .http_status(400, Some(dynamo_error("ProvisionedThroughputExceededException", json!({}))))
        .build();
    let down = mock!(aws_sdk_dynamodb::Client::put_item)
        .match_requests(|r| {
            r.item().and_then(|i| i.get("pk")).and_then(|v| v.as_s().ok()).map(String::as_str) == Some("down")
        })
        .sequence()
        .http_status(503, Some("{}".into()))
        .build();
    let invalid = mock!(aws_sdk_dynamodb::Client::put_item)
        .match_requests(|r| {
            r.item().and_then(|i| i.get("pk")).and_then(|v| v.as_s().ok()).map(String::as_str) == Some("bad")
        })
        .sequence()
        .http_status(400, Some(dynamo_error("ValidationException", json!({}))))
        .build();
    let table = table_with(&[&cond, &throttled, &down, &invalid]);
    let e = table.put(item("cond", "1"), Cond::NotExists).await.unwrap_err();
    assert!(matches!(e, StoreError::ConditionFailed { index: 0 }), "{e:?}");
    let e = table.put(item("slow", "1"), Cond::Always).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    let e = table.put(item("down", "1"), Cond::Always).await.unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    let e = table.put(item("bad", "1"), Cond::Always).await.unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e:?}");
}

#[tokio::test]
async fn update_sends_expressions_and_returns_all_new() {
    use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
    use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
    let rule = mock!(aws_sdk_dynamodb::Client::update_item)
        .match_requests(|r| {
            r.update_expression() == Some("SET #n0 = :v0 ADD #n1 :v1")
                && r.condition_expression() == Some("attribute_exists(#n2)")
                && r.return_values() == Some(&ReturnValue::AllNew)
                && r.expression_attribute_names().and_then(|n| n.get("#n2")).map(String::as_str) == Some("pk")
        })
        .then_output(|| {
            UpdateItemOutput::builder()
                .set_attributes(Some(HashMap::from([
                    ("pk".to_string(), AttributeValue::S("p".into())),
                    ("sk".to_string(), AttributeValue::S("s".into())),
                    ("status".to_string(), AttributeValue::S("OK".into())),
                    ("n".to_string(), AttributeValue::N("4".into())),
                ])))
                .build()
        });
    let table = table_with(&[&rule]);
    let got = table
        .update(&Key::new("p", "s"), vec![Update::set("status", "OK"), Update::add("n", 1)], Cond::Exists)
        .await
        .unwrap();
    assert_eq!(rule.num_calls(), 1);
    assert_eq!(got.key, Key::new("p", "s"));
    assert_eq!(got.str("status"), Some("OK"));
    assert_eq!(got.i64("n"), Some(4));
    assert!(!got.attrs.contains_key("pk"));
}

#[tokio::test]
async fn query_pages_with_an_opaque_cursor() {
    use aws_sdk_dynamodb::operation::query::QueryOutput;
    use aws_sdk_dynamodb::types::AttributeValue;
    let av = |pk: &str, sk: &str| {
        HashMap::from([
            ("pk".to_string(), AttributeValue::S(pk.into())),
            ("sk".to_string(), AttributeValue::S(sk.into())),
        ])
    };
    let first = mock!(aws_sdk_dynamodb::Client::query)
        .match_requests(|r| {
            r.exclusive_start_key().is_none()
                && r.limit() == Some(1)
                && r.scan_index_forward() == Some(false)
                && r.key_condition_expression() == Some("#n0 = :v0 AND begins_with(#n1, :v1)")
        })
        .then_output(move || {
            QueryOutput::builder().items(av("p", "a#2")).set_last_evaluated_key(Some(av("p", "a#2"))).build()
        });
    let second = mock!(aws_sdk_dynamodb::Client::query)
        .match_requests(|r| {
            r.exclusive_start_key().and_then(|k| k.get("sk")).and_then(|v| v.as_s().ok()).map(String::as_str)
                == Some("a#2")
        })
        .then_output(|| QueryOutput::builder().build());
    let table = table_with(&[&first, &second]);
    let opts = QueryOpts { limit: 1, cursor: None, descending: true };
    let page = table.query("p", "a#", opts).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let cursor = page.next_cursor.expect("a cursor");
    let page = table.query("p", "a#", QueryOpts { limit: 1, cursor: Some(cursor), descending: true }).await.unwrap();
    assert!(page.items.is_empty());
    assert!(page.next_cursor.is_none());
    assert_eq!((first.num_calls(), second.num_calls()), (1, 1));
}

// --- Providers ----------------------------------------------------------------------------------

pub(crate) fn message(channel: Channel, to: &str) -> OutboundMessage {
    OutboundMessage {
        channel,
        to: to.into(),
        subject: Some("Back in stock".into()),
        body: "It is back".into(),
        html: None,
        headers: vec![("List-Unsubscribe".into(), "<https://x/u>".into())],
        idempotency_key: "n1:u1:email".into(),
        marketing: false,
        tenant: "t".into(),
        notification_id: "n1".into(),
        user_id: "u1".into(),
        attempt: 1,
    }
}

/// A delivery key longer than APNs's 64 bytes (a UUID user id) still collapses: SNS is given
/// its digest as the APNs collapse id and as the FCM collapse key and tag.
#[tokio::test]
async fn push_collapses_a_long_delivery_key_by_its_digest() {
    use aws_sdk_sns::operation::publish::PublishOutput;
    let key = "n_01JEXAMPLE0000000000000000:7f0c2a8e-3b1d-4c55-9a77-2f6e8d1b9c40:push";
    let digest = tidings_core::people::devices::collapse_id(key);
    assert_eq!(digest.len(), 64);
    let expected = digest.clone();
    let ok = mock!(aws_sdk_sns::Client::publish)
        .match_requests(move |r| {
            let apns = r
                .message_attributes()
                .and_then(|a| a.get("AWS.SNS.MOBILE.APNS.COLLAPSE_ID"))
                .and_then(|v| v.string_value());
            let body: serde_json::Value = serde_json::from_str(r.message().unwrap_or("{}")).unwrap_or_default();
            let gcm: serde_json::Value = serde_json::from_str(body["GCM"].as_str().unwrap_or("{}")).unwrap_or_default();
            let android = &gcm["fcmV1Message"]["message"]["android"];
            apns == Some(expected.as_str())
                && android["collapse_key"] == expected.as_str()
                && android["notification"]["tag"] == expected.as_str()
        })
        .then_output(|| PublishOutput::builder().message_id("p-long").build());
    let push = SnsPush::new(client!(aws_sdk_sns, [&ok]));
    let mut m = message(Channel::Push, "arn:endpoint/ok");
    m.idempotency_key = key.into();
    assert_eq!(push.send(&m).await.unwrap().provider_message_id, "p-long");
}

#[tokio::test]
async fn ses_sends_headers_and_classifies_errors() {
    use aws_sdk_sesv2::operation::send_email::SendEmailOutput;
    let ok = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(|r| {
            let simple = r.content().and_then(|c| c.simple());
            r.from_email_address() == Some("from@x.test")
                && r.destination().map(|d| d.to_addresses()) == Some(&["ok@x.test".to_string()][..])
                && simple.and_then(|s| s.subject()).map(|s| s.data()) == Some("Back in stock")
                && simple.is_some_and(|s| s.headers().iter().any(|h| h.name() == "List-Unsubscribe"))
        })
        .then_output(|| SendEmailOutput::builder().message_id("m-1").build());
    let throttled = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(|r| r.destination().map(|d| d.to_addresses()) == Some(&["slow@x.test".to_string()][..]))
        .sequence()
        .http_status(429, Some(json!({"message": "Maximum sending rate exceeded."}).to_string()))
        .build();
    let rejected = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(|r| r.destination().map(|d| d.to_addresses()) == Some(&["no@x.test".to_string()][..]))
        .sequence()
        .http_status(
            400,
            Some(json!({"__type": "MessageRejected", "message": "Email address is not verified."}).to_string()),
        )
        .build();
    let ses = SesEmail::new(client!(aws_sdk_sesv2, [&ok, &throttled, &rejected]), "from@x.test");
    let receipt = ses.send(&message(Channel::Email, "ok@x.test")).await.unwrap();
    assert_eq!(receipt.provider_message_id, "m-1");
    let e = ses.send(&message(Channel::Email, "slow@x.test")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Transient { .. }), "{e:?}");
    let e = ses.send(&message(Channel::Email, "no@x.test")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Permanent { code: PermanentCode::Rejected, .. }), "{e:?}");
}

fn sns_error(code: &str) -> String {
    format!(
        "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error><Type>Sender</Type><Code>{code}</Code><Message>{code}</Message></Error><RequestId>r</RequestId></ErrorResponse>"
    )
}

#[tokio::test]
async fn sns_disabled_endpoint_is_an_invalid_token() {
    use aws_sdk_sns::operation::publish::PublishOutput;
    let disabled = mock!(aws_sdk_sns::Client::publish)
        .match_requests(|r| r.target_arn() == Some("arn:endpoint/disabled"))
        .sequence()
        .http_status(400, Some(sns_error("EndpointDisabled")))
        .build();
    let throttled = mock!(aws_sdk_sns::Client::publish)
        .match_requests(|r| r.target_arn() == Some("arn:endpoint/slow"))
        .sequence()
        .http_status(400, Some(sns_error("Throttled")))
        .build();
    let ok = mock!(aws_sdk_sns::Client::publish)
        .match_requests(|r| {
            r.target_arn() == Some("arn:endpoint/ok")
                && r.message_attributes()
                    .and_then(|a| a.get("AWS.SNS.MOBILE.APNS.COLLAPSE_ID"))
                    .and_then(|v| v.string_value())
                    == Some("n1:u1:email")
        })
        .then_output(|| PublishOutput::builder().message_id("p-1").build());
    let push = SnsPush::new(client!(aws_sdk_sns, [&disabled, &throttled, &ok]));
    let e = push.send(&message(Channel::Push, "arn:endpoint/disabled")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Permanent { code: PermanentCode::InvalidToken, .. }), "{e:?}");
    let e = push.send(&message(Channel::Push, "arn:endpoint/slow")).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(push.send(&message(Channel::Push, "arn:endpoint/ok")).await.unwrap().provider_message_id, "p-1");
}

#[tokio::test]
async fn sns_sms_bad_number_is_a_bad_address() {
    let bad = mock!(aws_sdk_sns::Client::publish)
        .match_requests(|r| r.phone_number() == Some("+1"))
        .sequence()
        .http_status(400, Some(sns_error("InvalidParameter")))
        .build();
    let sms = SnsSms::new(client!(aws_sdk_sns, [&bad]));
    let e = sms.send(&message(Channel::Sms, "+1")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Permanent { code: PermanentCode::BadAddress, .. }), "{e:?}");
}

// --- SQS ----------------------------------------------------------------------------------------

fn sqs_config(mode: RedriveMode) -> AwsConfig {
    AwsConfig { queue_prefix: "p-".into(), redrive_mode: mode, ..AwsConfig::default() }
}

fn url_rule() -> Rule {
    use aws_sdk_sqs::operation::get_queue_url::GetQueueUrlOutput;
    mock!(aws_sdk_sqs::Client::get_queue_url).then_compute_output(|r| {
        GetQueueUrlOutput::builder().queue_url(format!("http://sqs/1/{}", r.queue_name().unwrap_or_default())).build()
    })
}

fn attributes_rule() -> Rule {
    use aws_sdk_sqs::operation::get_queue_attributes::GetQueueAttributesOutput;
    use aws_sdk_sqs::types::QueueAttributeName;
    mock!(aws_sdk_sqs::Client::get_queue_attributes).then_compute_output(|r| {
        let name = r.queue_url().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_string();
        GetQueueAttributesOutput::builder()
            .attributes(QueueAttributeName::QueueArn, format!("arn:aws:sqs:us-east-1:1:{name}"))
            .attributes(QueueAttributeName::ApproximateNumberOfMessages, "3")
            .build()
    })
}

#[tokio::test]
async fn redrive_starts_a_message_move_task_from_the_dlq_to_the_queue() {
    use aws_sdk_sqs::operation::list_message_move_tasks::ListMessageMoveTasksOutput;
    use aws_sdk_sqs::operation::start_message_move_task::StartMessageMoveTaskOutput;
    use aws_sdk_sqs::types::ListMessageMoveTasksResultEntry;
    let start = mock!(aws_sdk_sqs::Client::start_message_move_task)
        .match_requests(|r| {
            r.source_arn() == Some("arn:aws:sqs:us-east-1:1:p-requests-high-dlq")
                && r.destination_arn() == Some("arn:aws:sqs:us-east-1:1:p-requests-high")
        })
        .then_output(|| StartMessageMoveTaskOutput::builder().task_handle("h-1").build());
    let list = mock!(aws_sdk_sqs::Client::list_message_move_tasks).then_output(|| {
        ListMessageMoveTasksOutput::builder()
            .results(
                ListMessageMoveTasksResultEntry::builder()
                    .task_handle("h-1")
                    .status("COMPLETED")
                    .approximate_number_of_messages_moved(3)
                    .build(),
            )
            .build()
    });
    let (urls, attrs) = (url_rule(), attributes_rule());
    let queues =
        SqsQueues::new(client!(aws_sdk_sqs, [&start, &list, &urls, &attrs]), &sqs_config(RedriveMode::MessageMoveTask));
    assert_eq!(queues.redrive("requests-high").await.unwrap(), 3);
    assert_eq!(start.num_calls(), 1);
    // URLs and ARNs are resolved once.
    let before = urls.num_calls();
    assert_eq!(queues.redrive("requests-high").await.unwrap(), 3);
    assert_eq!(urls.num_calls(), before);
}

#[tokio::test]
async fn sends_in_batches_of_ten_with_delays_and_reports_failed_entries() {
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
    use aws_sdk_sqs::types::BatchResultErrorEntry;
    let ok = mock!(aws_sdk_sqs::Client::send_message_batch)
        .match_requests(|r| r.queue_url() == Some("http://sqs/1/p-a"))
        .then_compute_output(|r| {
            assert!(r.entries().len() <= 10);
            assert!(r.entries().iter().all(|e| e.delay_seconds() == Some(2)));
            SendMessageBatchOutput::builder().set_successful(Some(vec![])).set_failed(Some(vec![])).build().unwrap()
        });
    let failing = mock!(aws_sdk_sqs::Client::send_message_batch)
        .match_requests(|r| r.queue_url() == Some("http://sqs/1/p-b"))
        .then_output(|| {
            SendMessageBatchOutput::builder()
                .set_successful(Some(vec![]))
                .failed(
                    BatchResultErrorEntry::builder().id("0").sender_fault(false).code("InternalError").build().unwrap(),
                )
                .build()
                .unwrap()
        });
    let urls = url_rule();
    let queues =
        SqsQueues::new(client!(aws_sdk_sqs, [&ok, &failing, &urls]), &sqs_config(RedriveMode::ReceiveAndResend));
    let messages: Vec<OutMessage> =
        (0..25).map(|i| OutMessage::delayed(format!("m{i}"), Duration::from_millis(1500))).collect();
    queues.send_batch("a", messages).await.unwrap();
    assert_eq!(ok.num_calls(), 3);
    let e = queues.send_batch("b", vec![OutMessage::new("x")]).await.unwrap_err();
    assert!(matches!(e, QueueError::Unavailable(_)), "{e:?}");
}

/// A message's tenant goes as its `MessageGroupId` (an SQS fair queue's group), one without a
/// group without one; a receive asks for the attribute and gives it back.
#[tokio::test]
async fn a_messages_tenant_is_its_message_group() {
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
    use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
    let send = mock!(aws_sdk_sqs::Client::send_message_batch)
        .match_requests(|r| {
            let groups: Vec<Option<&str>> = r.entries().iter().map(|e| e.message_group_id()).collect();
            groups == [Some("shop-a"), None]
        })
        .then_output(|| {
            SendMessageBatchOutput::builder().set_successful(Some(vec![])).set_failed(Some(vec![])).build().unwrap()
        });
    let receive = mock!(aws_sdk_sqs::Client::receive_message)
        .match_requests(|r| r.message_system_attribute_names().contains(&MessageSystemAttributeName::MessageGroupId))
        .then_output(|| {
            ReceiveMessageOutput::builder()
                .messages(
                    Message::builder()
                        .message_id("id-1")
                        .receipt_handle("rh-1")
                        .body("otp")
                        .attributes(MessageSystemAttributeName::MessageGroupId, "shop-a")
                        .build(),
                )
                .build()
        });
    let urls = url_rule();
    let queues =
        SqsQueues::new(client!(aws_sdk_sqs, [&send, &receive, &urls]), &sqs_config(RedriveMode::ReceiveAndResend));
    let tenant = tidings_core::TenantId::parse("shop-a").unwrap();
    queues.send_batch("a", vec![OutMessage::new("otp").for_tenant(&tenant), OutMessage::new("x")]).await.unwrap();
    assert_eq!(send.num_calls(), 1);
    let got = queues.receive("a", 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(got[0].group.as_deref(), Some("shop-a"));
}

#[tokio::test]
async fn receive_reads_counts_and_stale_receipts_map() {
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
    use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
    let receive = mock!(aws_sdk_sqs::Client::receive_message)
        .match_requests(|r| {
            r.max_number_of_messages() == Some(10)
                && r.visibility_timeout() == Some(31)
                && r.wait_time_seconds() == Some(1)
        })
        .then_output(|| {
            ReceiveMessageOutput::builder()
                .messages(
                    Message::builder()
                        .message_id("id-1")
                        .receipt_handle("rh-1")
                        .body("hello")
                        .attributes(MessageSystemAttributeName::ApproximateReceiveCount, "2")
                        .attributes(MessageSystemAttributeName::SentTimestamp, "1700000000000")
                        .build(),
                )
                .build()
        });
    let delete = mock!(aws_sdk_sqs::Client::delete_message).sequence().http_status(
        400,
        Some(json!({"__type": "com.amazonaws.sqs#ReceiptHandleIsInvalid", "message": "The input receipt handle is invalid."}).to_string()),
    ).build();
    let missing = mock!(aws_sdk_sqs::Client::get_queue_url)
        .match_requests(|r| r.queue_name() == Some("p-nope"))
        .sequence()
        .http_status(400, Some(json!({"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "no"}).to_string()))
        .build();
    let urls = url_rule();
    let queues = SqsQueues::new(
        client!(aws_sdk_sqs, [&receive, &delete, &missing, &urls]),
        &sqs_config(RedriveMode::ReceiveAndResend),
    );
    let got = queues.receive("a", 50, Duration::from_millis(30_001), Duration::from_millis(500)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].receive_count, got[0].sent_at_ms), (2, 1_700_000_000_000));
    assert_eq!(got[0].receipt, "rh-1");
    let e = queues.delete("a", "rh-1").await.unwrap_err();
    assert!(matches!(e, QueueError::StaleReceipt), "{e:?}");
    let e = queues.receive("nope", 1, Duration::ZERO, Duration::ZERO).await.unwrap_err();
    assert!(matches!(e, QueueError::UnknownQueue(_)), "{e:?}");
}

/// The fault matrix's "malformed answer": a provider answer that cannot be parsed (a proxy's
/// HTML page, a truncated body) is transient, so the message is retried, never lost, and never
/// counted as a permanent failure.
#[tokio::test]
async fn malformed_provider_answers_are_transient() {
    let garbage_ok = mock!(aws_sdk_sesv2::Client::send_email)
        .sequence()
        .http_status(200, Some("<html>not json at all".to_string()))
        .build();
    let ses = SesEmail::new(client!(aws_sdk_sesv2, [&garbage_ok]), "from@x.test");
    let e = ses.send(&message(Channel::Email, "ok@x.test")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Transient { .. }), "{e:?}");

    let garbage_502 = mock!(aws_sdk_sns::Client::publish)
        .sequence()
        .http_status(502, Some("<html>Bad Gateway</html>".to_string()))
        .build();
    let sms = SnsSms::new(client!(aws_sdk_sns, [&garbage_502]));
    let e = sms.send(&message(Channel::Sms, "+14155550100")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Transient { .. }), "{e:?}");
}

/// Every send names the configuration set it was given (`TIDINGS_SES_CONFIGURATION_SET`), so SES
/// publishes its events; without one, none.
#[tokio::test]
async fn ses_names_its_configuration_set() {
    use aws_sdk_sesv2::operation::send_email::SendEmailOutput;
    let named = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(|r| r.configuration_set_name() == Some("shop-mail"))
        .then_output(|| SendEmailOutput::builder().message_id("m-set").build());
    let ses =
        SesEmail::new(client!(aws_sdk_sesv2, [&named]), "from@x.test").with_configuration_set(Some("shop-mail".into()));
    assert_eq!(ses.send(&message(Channel::Email, "ok@x.test")).await.unwrap().provider_message_id, "m-set");
    let unnamed = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(|r| r.configuration_set_name().is_none())
        .then_output(|| SendEmailOutput::builder().message_id("m-none").build());
    let ses =
        SesEmail::new(client!(aws_sdk_sesv2, [&unnamed]), "from@x.test").with_configuration_set(Some(String::new()));
    assert_eq!(ses.send(&message(Channel::Email, "ok@x.test")).await.unwrap().provider_message_id, "m-none");
}

/// An email's two parts go as one `Simple` message with a `Text` and an `Html` body, both UTF-8;
/// a message without an HTML part (a task queued before emails had one) goes as text alone.
#[tokio::test]
async fn ses_sends_the_text_and_the_html_part() {
    use aws_sdk_sesv2::operation::send_email::{SendEmailInput, SendEmailOutput};
    /// A body part's data and charset.
    type Part<'a> = Option<(&'a str, Option<&'a str>)>;
    fn parts(r: &SendEmailInput) -> (Part<'_>, Part<'_>) {
        let body = r.content().and_then(|c| c.simple()).and_then(|s| s.body());
        fn part(c: Option<&aws_sdk_sesv2::types::Content>) -> Part<'_> {
            c.map(|c| (c.data(), c.charset()))
        }
        (part(body.and_then(|b| b.text())), part(body.and_then(|b| b.html())))
    }
    let to = |r: &SendEmailInput, a: &str| r.destination().map(|d| d.to_addresses()) == Some(&[a.to_string()][..]);
    let both = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(move |r| {
            to(r, "both@x.test")
                && parts(r)
                    == (
                        Some(("Back: https://shop.example/t/c/tok", Some("UTF-8"))),
                        Some(("<p>Back</p><img src=\"https://shop.example/t/o/tok\">", Some("UTF-8"))),
                    )
        })
        .then_output(|| SendEmailOutput::builder().message_id("m-both").build());
    let text = mock!(aws_sdk_sesv2::Client::send_email)
        .match_requests(move |r| to(r, "text@x.test") && parts(r) == (Some(("It is back", Some("UTF-8"))), None))
        .then_output(|| SendEmailOutput::builder().message_id("m-text").build());
    let ses = SesEmail::new(client!(aws_sdk_sesv2, [&both, &text]), "from@x.test");
    let mut m = message(Channel::Email, "both@x.test");
    m.body = "Back: https://shop.example/t/c/tok".into();
    m.html = Some("<p>Back</p><img src=\"https://shop.example/t/o/tok\">".into());
    assert_eq!(ses.send(&m).await.unwrap().provider_message_id, "m-both");
    assert_eq!(ses.send(&message(Channel::Email, "text@x.test")).await.unwrap().provider_message_id, "m-text");
    assert_eq!((both.num_calls(), text.num_calls()), (1, 1));
}
