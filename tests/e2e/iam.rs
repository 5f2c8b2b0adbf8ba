//! What each Lambda function calls, against what `template.yaml` lets it call.
//!
//! The emulator checks no permissions, so a call the template forgot to allow passes every other
//! test and fails on AWS. Here the AWS backend runs a day of a shop (notifications on every
//! channel, a campaign, devices and a push-service event, orders and a hold that expires, a
//! back-in-stock round, the scheduled jobs, the ops routes) while the local runtime labels each
//! request with the function it was made for (`tidings_core::roles`). Then every
//! `Service.Operation` a function was seen to make must be an action its policies in
//! `template.yaml` allow, and an SQS request's queue must be one of that statement's resources.
//! Calls made by the event source mappings (queue receives and deletes, stream reads) are
//! Lambda's, under the permissions SAM adds for each event source; the start-up (creating the
//! emulator's resources) is deployment. Other resources (the one table, SES identities, SNS
//! endpoints) are not compared.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::platform::{SIGNING_CERT, push_options, sns_notification};
use crate::server::{Backend, Server};

const WAIT: Duration = Duration::from_secs(120);

/// The IAM action a request needs, from its SDK service and operation name.
fn action_of(service: &str, operation: &str) -> String {
    let service = service.to_ascii_lowercase();
    // The batch forms are authorized by the single ones.
    let operation = match operation {
        "SendMessageBatch" => "SendMessage",
        "DeleteMessageBatch" => "DeleteMessage",
        "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
        other => other,
    };
    let prefix = if service.contains("apigatewaymanagement") {
        return "execute-api:ManageConnections".to_owned();
    } else if service.contains("dynamodb") {
        "dynamodb"
    } else if service == "sesv2" || service == "ses" {
        "ses"
    } else {
        service.as_str()
    };
    format!("{prefix}:{operation}")
}

/// Whether `allowed` covers `action`. A transaction is authorized item by item, by the action of
/// each of its writes: one of them is enough to say the function may write in transactions.
fn allows(allowed: &BTreeSet<String>, action: &str) -> bool {
    if action == "dynamodb:TransactWriteItems" {
        return ["PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem"]
            .iter()
            .any(|a| allowed.contains(&format!("dynamodb:{a}")));
    }
    allowed.contains(action)
}

/// One `Allow` statement: its actions and resources (a `Fn::GetAtt`'s logical id, `*`, or
/// the text of anything else).
#[derive(serde::Deserialize)]
struct Statement {
    actions: BTreeSet<String>,
    resources: BTreeSet<String>,
}

/// Each function's `Allow` statements, by its binary name, from the template (decoded by
/// cfn-lint, which reads CloudFormation's tags, from the test virtualenv).
fn statements() -> anyhow::Result<BTreeMap<String, Vec<Statement>>> {
    let python = std::env::var("TIDINGS_TEST_PYTHON")
        .map_err(|_| anyhow::anyhow!("TIDINGS_TEST_PYTHON is not set: run the tests with `make test`"))?;
    let script = r#"
import json, sys
from cfnlint.decode import decode
template, errors = decode(sys.argv[1])
assert not errors, errors
def listed(x):
    return x if isinstance(x, list) else [x]
def resource(r):
    if isinstance(r, dict) and "Fn::GetAtt" in r:
        return r["Fn::GetAtt"][0]
    return r if isinstance(r, str) else json.dumps(r, sort_keys=True, default=str)
out = {}
for res in template["Resources"].values():
    if res["Type"] != "AWS::Serverless::Function":
        continue
    binary = res["Metadata"]["BuildProperties"]["Binary"]
    out[binary] = [
        {"actions": listed(st["Action"]), "resources": [resource(r) for r in listed(st.get("Resource", "*"))]}
        for policy in res["Properties"].get("Policies", [])
        for st in policy.get("Statement", [])
        if st.get("Effect") == "Allow"
    ]
print(json.dumps(out))
"#;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml");
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(path).output()?;
    anyhow::ensure!(out.status.success(), "decoding template.yaml failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The template's logical id of a queue: `email-high` → `EmailHighQueue`, `email-high-dlq` →
/// `EmailHighDlq`.
fn logical_id(queue: &str) -> String {
    let (base, kind) = match queue.strip_suffix("-dlq") {
        Some(base) => (base, "Dlq"),
        None => (queue, "Queue"),
    };
    let mut id: String = base
        .split('-')
        .map(|part| {
            let mut c = part.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect();
    id.push_str(kind);
    id
}

/// What is wrong with `function` making `request` (`Service.Operation`, with `@queue` for SQS;
/// the queue's physical name starts with the test run's prefix), or `None`.
fn refused(function: &str, statements: &[Statement], request: &str) -> Option<String> {
    let (call, queue) = match request.split_once('@') {
        Some((call, queue)) => (call, Some(queue.split_once('-').map_or(queue, |(_, logical)| logical))),
        None => (request, None),
    };
    let (service, operation) = call.split_once('.').unwrap_or((call, ""));
    let action = action_of(service, operation);
    let granting: Vec<&Statement> = statements.iter().filter(|st| allows(&st.actions, &action)).collect();
    if granting.is_empty() {
        return Some(format!("{function} calls {call} but is not allowed {action}"));
    }
    let queue = queue?;
    let id = logical_id(queue);
    if granting.iter().any(|st| st.resources.contains("*") || st.resources.contains(&id)) {
        return None;
    }
    Some(format!("{function} calls {call} on {queue} but is allowed {action} only on other resources ({id} missing)"))
}

async fn ok(s: &Server, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let (st, v) = s.call(method, path, body).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}");
    Ok(v)
}

async fn completed(s: &Server, id: &str) -> anyhow::Result<Value> {
    s.eventually(WAIT, &format!("{id} completed"), || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(v))
    })
    .await
}

/// A day of a shop on the AWS backend.
async fn a_day_of_a_shop(s: &Server) -> anyhow::Result<()> {
    let template = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "Hi {{ n }}", "email_body": "<p>Hi {{ n }} <a href=\"https://shop.example/x\">x</a></p>",
        "sms": "Hi {{ n }}", "push_title": "Hi", "push_body": "Hi {{ n }}", "inapp_title": "Hi", "inapp_body": "Hi {{ n }}"}}});
    ok(s, "PUT", "/v1/templates/day", Some(template)).await?;
    for (user, phone) in [("u1", "+8613800001111"), ("u2", "+8613800002222")] {
        let body = json!({"email": format!("{user}@example.com"), "phone": phone, "tags": ["vip"]});
        ok(s, "PUT", &format!("/v1/users/{user}"), Some(body)).await?;
    }
    ok(s, "PUT", "/v1/users/u2/preferences", Some(json!({"categories": {"marketing": true}}))).await?;
    ok(s, "POST", "/v1/devices", Some(json!({"user_id": "u1", "platform": "ios", "token": "tok-day-1"}))).await?;

    // Every channel, transactional; then a campaign to the segment.
    let body = json!({"idempotency_key": "day-1", "recipients": {"user_ids": ["u1", "u2"]}, "template_id": "day",
        "params": {"n": 1}, "category": "transactional", "channels": ["email", "sms", "push", "inapp"]});
    let id = ok(s, "POST", "/v1/notifications", Some(body)).await?["notification_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    completed(s, &id).await?;
    ok(s, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
    let body = json!({"idempotency_key": "day-2", "recipients": {"segment": "vip"}, "template_id": "day",
        "params": {"n": 2}, "category": "marketing", "channels": ["email"]});
    let id = ok(s, "POST", "/v1/notifications", Some(body)).await?["notification_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    completed(s, &id).await?;
    let body = json!({"idempotency_key": "day-3", "recipients": {"user_ids": ["u1"]}, "template_id": "day",
        "params": {"n": 3}, "category": "transactional", "channels": ["email"], "send_at": "2099-01-01T00:00:00Z"});
    let later = ok(s, "POST", "/v1/notifications", Some(body)).await;
    if let Ok(v) = later {
        ok(s, "POST", &format!("/v1/notifications/{}/cancel", v["notification_id"].as_str().unwrap_or_default()), None)
            .await?;
    }

    // The inbox, and its live-feed token.
    let inbox = ok(s, "GET", "/v1/users/u1/inbox", None).await?;
    if let Some(m) = inbox["items"].as_array().and_then(|a| a.first()) {
        let message = m["message_id"].as_str().unwrap_or_default();
        ok(s, "POST", &format!("/v1/users/u1/inbox/{message}/read"), None).await?;
    }
    ok(s, "POST", "/v1/users/u1/inbox/token", None).await?;

    // The push service reports the device's endpoint gone.
    let sends = s.sends_all().await?;
    let endpoint = sends.iter().find(|x| x["channel"] == "push").and_then(|x| x["to"].as_str()).unwrap_or_default();
    let event = json!({"EndpointArn": endpoint, "EventType": "DeliveryFailure", "FailureType": "EndpointDisabled",
        "FailureMessage": "x", "MessageId": "m", "Resource": "arn:aws:sns:us-east-1:123456789012:app/APNS/x",
        "Service": "SNS", "Time": "2026-11-30T00:00:00.000Z"});
    let (st, _, body) = s.raw("POST", "/v1/callbacks/push", &sns_notification(&event).to_string(), None).await?;
    anyhow::ensure!(st == 200, "push callback: {st} {body}");
    ok(s, "POST", "/v1/devices", Some(json!({"user_id": "u2", "platform": "android", "token": "tok-day-2"}))).await?;
    let (st, _) = s.call("DELETE", "/v1/devices/tok-day-2", None).await?;
    anyhow::ensure!(st == 204, "DELETE device: {st}");

    // Orders: one paid, one left to expire; a waiter hears when the unit is back.
    ok(s, "PUT", "/v1/inventory/sku-day", Some(json!({"on_hand": 2}))).await?;
    let order = |id: &str| json!({"order_id": id, "user_id": "u2", "items": [{"sku_id": "sku-day", "qty": 1}], "hold_seconds": 300});
    ok(s, "POST", "/v1/orders", Some(order("paid"))).await?;
    ok(s, "POST", "/v1/orders/paid/pay", None).await?;
    ok(s, "POST", "/v1/orders", Some(order("held"))).await?;
    ok(s, "POST", "/v1/stock-subscriptions", Some(json!({"user_id": "u1", "sku_id": "sku-day"}))).await?;
    ok(s, "POST", "/dev/clock/advance", Some(json!({"seconds": 301}))).await?;
    ok(s, "POST", "/dev/schedules/tick/run", None).await?;
    s.eventually(WAIT, "the hold to expire", || async {
        let (_, o) = s.call("GET", "/v1/orders/held", None).await?;
        Ok((o["status"] == "CANCELLED").then_some(()))
    })
    .await?;
    s.eventually(WAIT, "the waiter's back-in-stock message", || async {
        s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 2}))).await?;
        let (_, v) = s.call("GET", "/dev/deliveries?user_id=u1&channel=email", None).await?;
        let restock =
            v.as_array().is_some_and(|a| a.iter().any(|m| m["body"].as_str().is_some_and(|b| b.contains("sku-day"))));
        Ok(restock.then_some(()))
    })
    .await?;
    let event = json!({"event": "stock.in", "skuId": "sku-day", "qty": 3, "source": "purchase_order"});
    ok(s, "POST", "/v1/stock-events", Some(event)).await?;
    let adjustment = json!({"delta": 1, "source": "manual", "idempotency_key": "adj-1"});
    ok(s, "POST", "/v1/inventory/sku-day/adjustments", Some(adjustment)).await?;
    ok(s, "GET", "/v1/inventory/sku-day/ledger", None).await?;

    // The scheduled jobs and the ops routes.
    for job in ["restock-scan", "reconcile", "tick"] {
        ok(s, "POST", &format!("/dev/schedules/{job}/run"), None).await?;
    }
    ok(s, "POST", "/v1/ops/reconcile", None).await?;
    ok(s, "GET", "/v1/ops/queues", None).await?;
    ok(s, "POST", "/v1/ops/dlq/email-high/redrive", None).await?;
    // Time for the last messages to be handled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(())
}

pub async fn every_function_is_allowed_what_it_calls() -> anyhow::Result<()> {
    let statements = statements()?;
    let mut opts = push_options(Backend::Aws).await?;
    opts.manual_clock = true;
    opts.env.push(("TIDINGS_SNS_TRUSTED_CERT_PEM", SIGNING_CERT.into()));
    opts.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "1000".into()));
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    // A provider call allowed longer than a message's visibility (8 s here): after the first
    // send of a batch, every transactional task is handed back (sent again as a new message),
    // so that path's requests are checked too.
    opts.env.retain(|(k, _)| *k != "TIDINGS_PROVIDER_TIMEOUT_MS");
    opts.env.push(("TIDINGS_PROVIDER_TIMEOUT_MS", "9000".into()));
    let s = Server::start(Backend::Aws, opts).await?;
    a_day_of_a_shop(&s).await?;

    let (_, metrics) = s.call("GET", "/v1/ops/metrics", None).await?;
    let by_function: BTreeMap<String, BTreeMap<String, u64>> =
        serde_json::from_value(metrics["aws_requests_by_function"].clone())?;
    let not_functions = ["event-source-mapping", "startup", "local-runtime"];
    eprintln!("requests by function: {}", serde_json::to_string_pretty(&by_function)?);
    let mut seen_functions = BTreeSet::new();
    let mut missing = Vec::new();
    for (function, requests) in &by_function {
        if not_functions.contains(&function.as_str()) {
            continue;
        }
        let Some(granted) = statements.get(function) else {
            missing.push(format!("{function}: no such function in template.yaml ({requests:?})"));
            continue;
        };
        seen_functions.insert(function.clone());
        missing.extend(requests.keys().filter_map(|request| refused(function, granted, request)));
    }
    assert!(missing.is_empty(), "template.yaml does not allow what the code calls:\n{}", missing.join("\n"));
    // The day reached every function that makes requests of its own (ws-connections only
    // answers WebSocket routes, not driven here).
    for function in ["api", "outbox-relay", "orchestrator", "channel-worker", "tick", "reconcile", "restock-scan"] {
        assert!(seen_functions.contains(function), "{function} made no request: {by_function:?}");
    }
    let handed_back = by_function["channel-worker"].keys().any(|r| r.starts_with("SQS.SendMessageBatch@"));
    assert!(handed_back, "no task was handed back, so that path went unchecked: {by_function:?}");
    Ok(())
}

#[test]
fn queue_names_map_to_the_templates_logical_ids() {
    assert_eq!(logical_id("email-high"), "EmailHighQueue");
    assert_eq!(logical_id("email-high-dlq"), "EmailHighDlq");
    assert_eq!(logical_id("timers"), "TimersQueue");
    assert_eq!(logical_id("stock-events-dlq"), "StockEventsDlq");
}

#[test]
fn a_call_outside_every_statement_is_refused() {
    let statement = |actions: &[&str], resources: &[&str]| Statement {
        actions: actions.iter().map(|a| (*a).to_owned()).collect(),
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
    };
    let granted = [
        statement(&["sqs:SendMessage", "sqs:GetQueueUrl"], &["TimersQueue"]),
        statement(&["dynamodb:UpdateItem"], &["Table"]),
        statement(&["sns:Publish"], &["*"]),
    ];
    assert_eq!(refused("api", &granted, "SQS.SendMessageBatch@e2e0000abcd-timers"), None);
    assert_eq!(refused("api", &granted, "DynamoDB.TransactWriteItems"), None);
    assert_eq!(refused("api", &granted, "SNS.Publish"), None);
    assert!(
        refused("api", &granted, "SQS.SendMessageBatch@e2e0000abcd-email-high")
            .is_some_and(|r| r.contains("EmailHighQueue"))
    );
    assert!(refused("api", &granted, "DynamoDB.BatchGetItem").is_some_and(|r| r.contains("dynamodb:BatchGetItem")));
    assert!(refused("api", &granted, "SQS.ChangeMessageVisibility@e2e0000abcd-timers").is_some());
}
