//! Every AWS request a function makes passes through here, as through IAM: the caller is the
//! function whose access key signed it (each function runs with its own), the request is
//! authorized against that function's own policy statements in `template.yaml` (actions,
//! resources, conditions), and only then forwarded to the emulator. A request its policy does
//! not allow is answered `AccessDenied`, so it fails in the function as it would on AWS, and is
//! recorded for the test to name. Every request is counted by function and operation, and what
//! the providers accepted (SES `SendEmail`, SNS `Publish`) is recorded as AWS received it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::template::{ACCOUNT, REGION, Statement, queue_arn, table_arn};

/// What a provider accepted, as the function sent it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProviderCall {
    pub function: String,
    pub channel: &'static str,
    pub to: String,
    pub subject: String,
    pub body: String,
    /// The provider's id of the message (SES's `MessageId`), as its receipts name it.
    pub message_id: String,
    /// The SES configuration set the send named (empty when none).
    pub configuration_set: String,
    /// When the provider's answer came back (ms since the Unix epoch).
    pub at_ms: u128,
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

#[derive(Default)]
pub struct Ledger {
    /// function → `Service.Operation` (with `@queue` for SQS) → count
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    pub refused: Vec<String>,
    pub sends: Vec<ProviderCall>,
    /// DynamoDB capacity the requests used, in request units (on-demand billing: a write is
    /// one unit per 1 KB of its item, rounded up, two in a transaction; a read half a unit per
    /// 4 KB, eventually consistent, one when strongly consistent; see [`units`]), by `function
    /// operation kind` (kind: the sort key's prefix, `D#` a delivery, `C#` a progress
    /// counter...; see [`kind_of`]): (write, read).
    pub units_by: BTreeMap<String, (f64, f64)>,
}

/// An item's size as DynamoDB bills it: each attribute's name and value (strings and binaries
/// by their bytes, numbers by about one byte per two digits, lists and maps 3 bytes and 1 per
/// element besides their contents).
pub fn item_size(item: &Value) -> usize {
    fn value(v: &Value) -> usize {
        let Some((ty, v)) = v.as_object().and_then(|o| o.iter().next()) else { return 0 };
        let s = |v: &Value| v.as_str().map_or(0, str::len);
        let n = |v: &Value| {
            let digits = v.as_str().unwrap_or_default().chars().filter(char::is_ascii_digit).count();
            digits.div_ceil(2) + 1
        };
        let b = |v: &Value| s(v) * 3 / 4;
        let each = |v: &Value, f: &dyn Fn(&Value) -> usize| v.as_array().map_or(0, |a| a.iter().map(f).sum());
        match ty.as_str() {
            "S" => s(v),
            "N" => n(v),
            "B" => b(v),
            "SS" => each(v, &s),
            "NS" => each(v, &n),
            "BS" => each(v, &b),
            "L" => 3 + each(v, &|e| 1 + value(e)),
            "M" => 3 + v.as_object().map_or(0, |m| m.iter().map(|(k, e)| 1 + k.len() + value(e)).sum()),
            _ => 1,
        }
    }
    item.as_object().map_or(0, |o| o.iter().map(|(k, v)| k.len() + value(v)).sum())
}

/// What an item is, for the units' breakdown: its sort key's prefix up to the first `#`
/// (`D#` a delivery, `C#` a progress counter, `CAP#` a frequency counter), a short upper-case
/// sort key itself (`N` a notification, `IDEM`), else its partition's kind (`TAG`, `PM`...).
pub fn kind_of(key: &Value) -> String {
    let sk = key["sk"]["S"].as_str().unwrap_or_default();
    let pk = key["pk"]["S"].as_str().unwrap_or_default();
    if let Some((prefix, _)) = sk.split_once('#') {
        return format!("{prefix}#");
    }
    if !sk.is_empty() && sk.len() <= 8 && sk.chars().all(|c| c.is_ascii_uppercase()) {
        return sk.to_owned();
    }
    let parts: Vec<&str> = pk.split('#').collect();
    let kind = if parts.first() == Some(&"T") { parts.get(2) } else { parts.first() };
    kind.copied().unwrap_or("?").to_owned()
}

/// The key attributes (`pk`, `sk`) of an item.
fn key_of(item: &Value) -> Value {
    json!({"pk": item["pk"], "sk": item["sk"]})
}

/// Write units of an item of `bytes`.
fn write_units(bytes: usize) -> f64 {
    (bytes as f64 / 1024.0).ceil().max(1.0)
}

/// Read units of `bytes` read at once.
fn read_units(consistent: bool, bytes: usize) -> f64 {
    let blocks = (bytes as f64 / 4096.0).ceil().max(1.0);
    if consistent { blocks } else { blocks / 2.0 }
}

/// DynamoDB request units of a request and its answer, by item kind: `(kind, op, write, read)`.
/// `stored` is the size of each item the request updates, deletes or checks, as stored after
/// it (what an update is billed for is the larger of before and after; ours mostly grow).
pub fn units(
    op: &str,
    request: &Value,
    answer: &Value,
    stored: &dyn Fn(&Value) -> usize,
) -> Vec<(String, String, f64, f64)> {
    let consistent = request["ConsistentRead"] == json!(true);
    let mut out = Vec::new();
    match op {
        "PutItem" => out.push((kind_of(&request["Item"]), op.into(), write_units(item_size(&request["Item"])), 0.0)),
        "UpdateItem" | "DeleteItem" => {
            let bytes = if answer["Attributes"].is_object() && op == "UpdateItem" {
                item_size(&answer["Attributes"])
            } else {
                stored(&request["Key"])
            };
            out.push((kind_of(&request["Key"]), op.into(), write_units(bytes), 0.0))
        }
        "GetItem" => {
            out.push((kind_of(&request["Key"]), op.into(), 0.0, read_units(consistent, item_size(&answer["Item"]))))
        }
        "Query" => {
            let bytes = answer["Items"].as_array().map_or(0, |a| a.iter().map(item_size).sum());
            let kind = answer["Items"].as_array().and_then(|a| a.first()).map_or("?".into(), kind_of);
            out.push((kind, op.into(), 0.0, read_units(consistent, bytes)));
        }
        "BatchGetItem" => {
            let found: Vec<&Value> = answer["Responses"]
                .as_object()
                .into_iter()
                .flat_map(|t| t.values())
                .flat_map(|v| v.as_array().into_iter().flatten())
                .collect();
            for ask in request["RequestItems"].as_object().into_iter().flat_map(|t| t.values()) {
                let consistent = ask["ConsistentRead"] == json!(true);
                for key in ask["Keys"].as_array().into_iter().flatten() {
                    // A key not found is billed as the smallest read.
                    let bytes = found.iter().find(|i| key_of(i) == key_of(key)).map_or(0, |i| item_size(i));
                    out.push((kind_of(key), op.into(), 0.0, read_units(consistent, bytes)));
                }
            }
        }
        "BatchWriteItem" => {
            for w in request["RequestItems"]
                .as_object()
                .into_iter()
                .flat_map(|t| t.values())
                .flat_map(|v| v.as_array().into_iter().flatten())
            {
                let item = &w["PutRequest"]["Item"];
                let (kind, bytes) = if item.is_object() {
                    (kind_of(item), item_size(item))
                } else {
                    (kind_of(&w["DeleteRequest"]["Key"]), 0)
                };
                out.push((kind, op.into(), write_units(bytes), 0.0));
            }
        }
        "TransactWriteItems" => {
            for item in request["TransactItems"].as_array().into_iter().flatten() {
                let Some((what, w)) = item.as_object().and_then(|o| o.iter().next()) else { continue };
                let (kind, bytes) = match what.as_str() {
                    "Put" => (kind_of(&w["Item"]), item_size(&w["Item"])),
                    _ => (kind_of(&w["Key"]), stored(&w["Key"])),
                };
                out.push((kind, format!("TransactWriteItems.{what}"), 2.0 * write_units(bytes), 0.0));
            }
        }
        "TransactGetItems" => {
            for item in request["TransactItems"].as_array().into_iter().flatten() {
                out.push((kind_of(&item["Get"]["Key"]), op.into(), 0.0, 2.0));
            }
        }
        _ => {}
    }
    out
}

/// The keys of the items a request updates, deletes or checks (their sizes are looked up after
/// it: the request does not carry them), by table.
fn keys_to_size(op: &str, request: &Value) -> Vec<(String, Value)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match op {
        // Its answer has the item when it asked for `ALL_NEW` (the table adapter does).
        "UpdateItem" if request["ReturnValues"] != json!("ALL_NEW") => {
            vec![(s(&request["TableName"]), key_of(&request["Key"]))]
        }
        "TransactWriteItems" => request["TransactItems"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| {
                let (what, w) = item.as_object()?.iter().next()?;
                (what != "Put").then(|| (s(&w["TableName"]), key_of(&w["Key"])))
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub struct Proxy {
    /// access key → (function binary, its statements)
    pub callers: BTreeMap<String, (String, Vec<Statement>)>,
    pub dynamodb: String,
    pub moto: String,
    /// Where `execute-api` management calls go (the harness's WebSocket API), and its id.
    pub websocket: String,
    pub websocket_api_id: String,
    pub http: reqwest::Client,
    pub ledger: Arc<Mutex<Ledger>>,
    /// For the SQS operations moto lacks (message move tasks), done here once authorized.
    pub sqs: aws_sdk_sqs::Client,
    pub moves: Mutex<Vec<Value>>,
    /// Time added to every authorized request of a function (binary → delay): a slow network
    /// or a throttled table, so a test sets how long a function's work takes in time that does
    /// not depend on how loaded this machine is.
    pub latency: BTreeMap<String, std::time::Duration>,
}

/// One authorization a request needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Need {
    pub action: String,
    /// `None`: an action with no resource (SNS Publish to a phone number): only `*` grants it.
    pub resource: Option<String>,
    pub context: BTreeMap<String, String>,
}

fn need(action: &str, resource: Option<String>) -> Need {
    Need { action: action.to_owned(), resource, context: BTreeMap::new() }
}

/// `pattern` with `*` and `?` wildcards (IAM's) matches `text`.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

fn condition_holds(condition: &Option<Value>, context: &BTreeMap<String, String>) -> bool {
    let Some(Value::Object(ops)) = condition else { return true };
    ops.iter().all(|(op, keys)| {
        let Some(keys) = keys.as_object() else { return false };
        keys.iter().all(|(key, expected)| {
            let expected: Vec<String> = match expected {
                Value::Array(a) => a.iter().map(super::template::scalar).collect(),
                v => vec![super::template::scalar(v)],
            };
            let actual = context.get(key);
            match op.as_str() {
                "StringEquals" => actual.is_some_and(|a| expected.contains(a)),
                "StringLike" => actual.is_some_and(|a| expected.iter().any(|e| glob(e, a))),
                // Anything else this harness does not evaluate: refused, never assumed.
                _ => false,
            }
        })
    })
}

/// Whether `statements` allow `need`.
pub fn allowed(statements: &[Statement], need: &Need) -> bool {
    statements.iter().any(|st| {
        st.actions.iter().any(|a| glob(&a.to_ascii_lowercase(), &need.action.to_ascii_lowercase()))
            && st.resources.iter().any(|r| match &need.resource {
                Some(res) => glob(r, res),
                None => r == "*",
            })
            && condition_holds(&st.condition, &need.context)
    })
}

/// (access key, signing service) of a SigV4 `Authorization` header.
fn credential(headers: &HeaderMap) -> Option<(String, String)> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let cred = auth.split("Credential=").nth(1)?.split([',', ' ']).next()?;
    let mut parts = cred.split('/');
    let key = parts.next()?.to_owned();
    let service = parts.nth(2)?.to_owned();
    Some((key, service))
}

fn form(body: &[u8]) -> BTreeMap<String, String> {
    form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

fn queue_name_of_url(url: &str) -> String {
    url.rsplit('/').next().unwrap_or_default().to_owned()
}

/// The operation (`Service.Operation`, with `@queue` for SQS), and the authorizations it needs.
pub fn describe(
    service: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    websocket_api_id: &str,
) -> (String, Vec<Need>) {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match service {
        "dynamodb" => {
            let op = target.split('.').nth(1).unwrap_or("Unknown").to_owned();
            let streams = target.starts_with("DynamoDBStreams");
            let label = format!("{}.{op}", if streams { "DynamoDBStreams" } else { "DynamoDB" });
            let table = |name: &str| Some(table_arn(name));
            let needs = match op.as_str() {
                "TransactWriteItems" => json["TransactItems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|item| {
                        let (kind, op) = item.as_object()?.iter().next()?;
                        let action = match kind.as_str() {
                            "Put" => "dynamodb:PutItem",
                            "Update" => "dynamodb:UpdateItem",
                            "Delete" => "dynamodb:DeleteItem",
                            _ => "dynamodb:ConditionCheckItem",
                        };
                        Some(need(action, table(&s(&op["TableName"]))))
                    })
                    .collect(),
                "TransactGetItems" => json["TransactItems"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|item| need("dynamodb:GetItem", table(&s(&item["Get"]["TableName"]))))
                    .collect(),
                "BatchGetItem" | "BatchWriteItem" => json["RequestItems"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, _)| need(&format!("dynamodb:{op}"), table(name)))
                    .collect(),
                _ if streams => vec![need(&format!("dynamodb:{op}"), Some(s(&json["StreamArn"])))],
                _ => {
                    let mut resource = table_arn(&s(&json["TableName"]));
                    if let Some(index) = json["IndexName"].as_str() {
                        resource = format!("{resource}/index/{index}");
                    }
                    vec![need(&format!("dynamodb:{op}"), Some(resource))]
                }
            };
            (label, needs)
        }
        "sqs" => {
            let op = target.split('.').nth(1).unwrap_or("Unknown").to_owned();
            let queue = match (json["QueueUrl"].as_str(), json["SourceArn"].as_str()) {
                (Some(url), _) => queue_name_of_url(url),
                (None, Some(arn)) => arn.rsplit(':').next().unwrap_or_default().to_owned(),
                _ => s(&json["QueueName"]),
            };
            let action = match op.as_str() {
                "SendMessageBatch" => "SendMessage",
                "DeleteMessageBatch" => "DeleteMessage",
                "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
                other => other,
            };
            (format!("SQS.{op}@{queue}"), vec![need(&format!("sqs:{action}"), Some(queue_arn(&queue)))])
        }
        "sns" => {
            let f = form(body);
            let op = f.get("Action").cloned().unwrap_or_else(|| "Unknown".into());
            let resource = ["TopicArn", "TargetArn", "EndpointArn", "PlatformApplicationArn"]
                .iter()
                .find_map(|k| f.get(*k).cloned());
            (format!("SNS.{op}"), vec![need(&format!("sns:{op}"), resource)])
        }
        "ssm" => {
            let op = target.split('.').nth(1).unwrap_or("Unknown").to_owned();
            let name = s(&json["Name"]);
            let resource = format!(
                "arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{}{name}",
                if name.starts_with('/') { "" } else { "/" }
            );
            (format!("SSM.{op}"), vec![need(&format!("ssm:{op}"), Some(resource))])
        }
        "ses" => {
            let path = uri.path();
            let op = match (method.as_str(), path) {
                ("POST", "/v2/email/outbound-emails") => "SendEmail",
                ("GET", p) if p.starts_with("/v2/email/identities/") => "GetEmailIdentity",
                _ => "Unknown",
            };
            let from = s(&json["FromEmailAddress"]);
            let address = from.rsplit('<').next().unwrap_or_default().trim_end_matches('>').to_owned();
            let domain = address.split('@').nth(1).unwrap_or_default().to_owned();
            let mut needs = Vec::new();
            // A send naming a configuration set is authorized on it as well.
            if let Some(set) = json["ConfigurationSetName"].as_str() {
                let mut n =
                    need(&format!("ses:{op}"), Some(format!("arn:aws:ses:{REGION}:{ACCOUNT}:configuration-set/{set}")));
                n.context.insert("ses:FromAddress".into(), address.clone());
                needs.push(n);
            }
            // Either identity (the address, or its domain) authorizes the send.
            for identity in [address.clone(), domain] {
                let mut n =
                    need(&format!("ses:{op}"), Some(format!("arn:aws:ses:{REGION}:{ACCOUNT}:identity/{identity}")));
                n.context.insert("ses:FromAddress".into(), address.clone());
                needs.push(n);
            }
            (format!("SESv2.{op}"), needs)
        }
        "execute-api" => {
            let path = uri.path().trim_start_matches('/');
            let (stage, rest) = path.split_once('/').unwrap_or((path, ""));
            let op = match method.as_str() {
                "POST" => "PostToConnection",
                "DELETE" => "DeleteConnection",
                _ => "GetConnection",
            };
            let resource =
                format!("arn:aws:execute-api:{REGION}:{ACCOUNT}:{websocket_api_id}/{stage}/{}/{rest}", method.as_str());
            (format!("ApiGatewayManagement.{op}"), vec![need("execute-api:ManageConnections", Some(resource))])
        }
        "sms-voice" => {
            // AWS End User Messaging SMS (`PinpointSMSVoiceV2.SendTextMessage`): authorized on the
            // origination identity (the account's choice when none is named) and the
            // configuration set.
            let op = target.split('.').nth(1).unwrap_or("Unknown").to_owned();
            let arn = |kind: &str, id: &str| format!("arn:aws:sms-voice:{REGION}:{ACCOUNT}:{kind}/{id}");
            let identity = match json["OriginationIdentity"].as_str() {
                Some(id) if id.starts_with("arn:") => id.to_owned(),
                Some(id) if id.starts_with("pool-") => arn("pool", id),
                Some(id) if id.starts_with('+') || id.starts_with("phone-") => arn("phone-number", id),
                Some(id) => arn("sender-id", id),
                None => arn("phone-number", "*"),
            };
            let mut needs = vec![need(&format!("sms-voice:{op}"), Some(identity))];
            if let Some(set) = json["ConfigurationSetName"].as_str() {
                let set = if set.starts_with("arn:") { set.to_owned() } else { arn("configuration-set", set) };
                needs.push(need(&format!("sms-voice:{op}"), Some(set)));
            }
            (format!("SmsVoiceV2.{op}"), needs)
        }
        other => (format!("{other}.Unknown"), vec![need(&format!("{other}:Unknown"), None)]),
    }
}

/// Whether the needs are met: all of them, except SES's, where one identity is enough (and the
/// configuration set, when the send names one).
fn authorized(service: &str, statements: &[Statement], needs: &[Need]) -> bool {
    if service == "ses" {
        let (sets, identities): (Vec<&Need>, Vec<&Need>) =
            needs.iter().partition(|n| n.resource.as_deref().is_some_and(|r| r.contains(":configuration-set/")));
        return identities.iter().any(|n| allowed(statements, n)) && sets.iter().all(|n| allowed(statements, n));
    }
    needs.iter().all(|n| allowed(statements, n))
}

fn denied(service: &str, message: String) -> Response {
    if service == "sns" {
        let xml = format!(
            "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error><Type>Sender</Type>\
             <Code>AuthorizationError</Code><Message>{message}</Message></Error><RequestId>harness</RequestId></ErrorResponse>"
        );
        return (StatusCode::FORBIDDEN, [("content-type", "text/xml")], xml).into_response();
    }
    let body = json!({"__type": "AccessDeniedException", "message": message, "Message": message});
    (
        StatusCode::FORBIDDEN,
        [("content-type", "application/x-amz-json-1.0"), ("x-amzn-errortype", "AccessDeniedException")],
        body.to_string(),
    )
        .into_response()
}

fn record_send(ledger: &mut Ledger, function: &str, service: &str, body: &[u8], answer: &[u8]) {
    match service {
        "ses" => {
            let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let answered: Value = serde_json::from_slice(answer).unwrap_or(Value::Null);
            let simple = &v["Content"]["Simple"];
            let body = simple["Body"]["Html"]["Data"].as_str().or(simple["Body"]["Text"]["Data"].as_str());
            for to in v["Destination"]["ToAddresses"].as_array().into_iter().flatten() {
                ledger.sends.push(ProviderCall {
                    function: function.to_owned(),
                    channel: "email",
                    to: to.as_str().unwrap_or_default().to_owned(),
                    subject: simple["Subject"]["Data"].as_str().unwrap_or_default().to_owned(),
                    body: body.unwrap_or_default().to_owned(),
                    message_id: answered["MessageId"].as_str().unwrap_or_default().to_owned(),
                    configuration_set: v["ConfigurationSetName"].as_str().unwrap_or_default().to_owned(),
                    at_ms: now_ms(),
                });
            }
        }
        "sns" => {
            let f = form(body);
            if f.get("Action").map(String::as_str) != Some("Publish") {
                return;
            }
            let (channel, to) = match (f.get("PhoneNumber"), f.get("TargetArn")) {
                (Some(p), _) => ("sms", p.clone()),
                (None, Some(t)) => ("push", t.clone()),
                _ => ("topic", f.get("TopicArn").cloned().unwrap_or_default()),
            };
            ledger.sends.push(ProviderCall {
                function: function.to_owned(),
                channel,
                to,
                subject: f.get("Subject").cloned().unwrap_or_default(),
                body: f.get("Message").cloned().unwrap_or_default(),
                message_id: String::new(),
                configuration_set: String::new(),
                at_ms: now_ms(),
            });
        }
        _ => {}
    }
}

impl Proxy {
    pub async fn handle(self: Arc<Self>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let Some((key, service)) = credential(&headers) else {
            return denied("", "request not signed".into());
        };
        let Some((function, statements)) = self.callers.get(&key) else {
            return denied(&service, format!("unknown access key {key}"));
        };
        let (operation, needs) = describe(&service, &method, &uri, &headers, &body, &self.websocket_api_id);
        {
            let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
            *ledger.requests.entry(function.clone()).or_default().entry(operation.clone()).or_default() += 1;
        }
        if !authorized(&service, statements, &needs) {
            let message = format!(
                "{function} is not authorized to perform {operation}: {}",
                needs
                    .iter()
                    .map(|n| format!("{} on {}", n.action, n.resource.as_deref().unwrap_or("(no resource)")))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.ledger.lock().unwrap_or_else(|e| e.into_inner()).refused.push(message.clone());
            return denied(&service, message);
        }
        if let Some(delay) = self.latency.get(function) {
            tokio::time::sleep(*delay).await;
        }
        if service == "sqs"
            && (operation.starts_with("SQS.StartMessageMoveTask") || operation.starts_with("SQS.ListMessageMoveTasks"))
        {
            return self.message_move(&operation, &body).await;
        }
        if service == "sms-voice" {
            return self.send_text_message(function, &operation, &body);
        }
        let upstream = match service.as_str() {
            "dynamodb" => &self.dynamodb,
            "execute-api" => &self.websocket,
            _ => &self.moto,
        };
        let url = format!("{}{}", upstream.trim_end_matches('/'), uri.path_and_query().map_or("/", |p| p.as_str()));
        let mut request = self.http.request(method, url).body(body.clone());
        for (name, value) in &headers {
            if !matches!(name.as_str(), "host" | "content-length" | "connection" | "transfer-encoding") {
                request = request.header(name, value);
            }
        }
        let answer = match request.send().await {
            Ok(a) => a,
            Err(e) => return (StatusCode::BAD_GATEWAY, format!("emulator: {e}")).into_response(),
        };
        let status = answer.status();
        let mut out_headers = HeaderMap::new();
        for (name, value) in answer.headers() {
            if !matches!(name.as_str(), "content-length" | "connection" | "transfer-encoding") {
                out_headers.append(name.clone(), value.clone());
            }
        }
        let bytes = answer.bytes().await.unwrap_or_default();
        if status.is_success() {
            let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
            record_send(&mut ledger, function, &service, &body, &bytes);
        }
        if status.is_success() && service == "dynamodb" && operation.starts_with("DynamoDB.") {
            let op = operation.trim_start_matches("DynamoDB.");
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let answered: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let sizes = self.stored_sizes(&headers, keys_to_size(op, &request)).await;
            let stored = |key: &Value| sizes.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n);
            let mut ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
            for (kind, op, w, r) in units(op, &request, &answered, &stored) {
                let by = ledger.units_by.entry(format!("{function} {op} {kind}")).or_default();
                by.0 += w;
                by.1 += r;
            }
        }
        let mut response = (status, bytes).into_response();
        response.headers_mut().extend(out_headers);
        response
    }
}

impl Proxy {
    /// The sizes of items as stored now (`(key, bytes)`), read from DynamoDB Local with the
    /// request's own credentials, up to 100 keys a read; a key not found is left out.
    async fn stored_sizes(&self, headers: &HeaderMap, keys: Vec<(String, Value)>) -> Vec<(Value, usize)> {
        let mut out = Vec::with_capacity(keys.len());
        let mut by_table: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (table, key) in keys {
            let keys = by_table.entry(table).or_default();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        for (table, keys) in by_table {
            for chunk in keys.chunks(100) {
                let mut items = serde_json::Map::new();
                items.insert(table.clone(), json!({"Keys": chunk, "ConsistentRead": true}));
                let body = json!({ "RequestItems": items });
                let mut request = self.http.post(&self.dynamodb).body(body.to_string());
                for name in ["authorization", "x-amz-date", "x-amz-security-token"] {
                    if let Some(v) = headers.get(name) {
                        request = request.header(name, v);
                    }
                }
                let request = request
                    .header("x-amz-target", "DynamoDB_20120810.BatchGetItem")
                    .header("content-type", "application/x-amz-json-1.0");
                let Ok(answer) = request.send().await else { continue };
                let answer: Value = answer.json().await.unwrap_or(Value::Null);
                for item in answer["Responses"][&table].as_array().into_iter().flatten() {
                    out.push((key_of(item), item_size(item)));
                }
            }
        }
        out
    }
}

impl Proxy {
    /// End User Messaging's `SendTextMessage`, which moto lacks (it answers 500), answered here
    /// once authorized: a message id, and the send recorded as the service received it.
    fn send_text_message(&self, function: &str, operation: &str, body: &[u8]) -> Response {
        let json_type = [("content-type", "application/x-amz-json-1.0")];
        if operation != "SmsVoiceV2.SendTextMessage" {
            let body = json!({"__type": "UnknownOperationException", "message": operation});
            return (StatusCode::BAD_REQUEST, json_type, body.to_string()).into_response();
        }
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let message_id = uuid::Uuid::new_v4().to_string();
        self.ledger.lock().unwrap_or_else(|e| e.into_inner()).sends.push(ProviderCall {
            function: function.to_owned(),
            channel: "sms",
            to: v["DestinationPhoneNumber"].as_str().unwrap_or_default().to_owned(),
            subject: String::new(),
            body: v["MessageBody"].as_str().unwrap_or_default().to_owned(),
            message_id: message_id.clone(),
            configuration_set: v["ConfigurationSetName"].as_str().unwrap_or_default().to_owned(),
            at_ms: now_ms(),
        });
        (StatusCode::OK, json_type, json!({"MessageId": message_id}).to_string()).into_response()
    }
}

impl Proxy {
    /// SQS message move tasks (what the console's "redrive" starts), which moto lacks: the
    /// DLQ's messages are moved to the destination (or the queue whose redrive policy names the
    /// DLQ) before the task is answered, so it is `COMPLETED` when listed.
    async fn message_move(&self, operation: &str, body: &[u8]) -> Response {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let source = v["SourceArn"].as_str().unwrap_or_default().to_owned();
        let ok = |v: Value| {
            (StatusCode::OK, [("content-type", "application/x-amz-json-1.0")], v.to_string()).into_response()
        };
        if operation.starts_with("SQS.ListMessageMoveTasks") {
            let moves = self.moves.lock().unwrap_or_else(|e| e.into_inner());
            let results: Vec<Value> = moves.iter().rev().filter(|m| m["SourceArn"] == source).cloned().collect();
            return ok(json!({"Results": results}));
        }
        let name_of = |arn: &str| arn.rsplit(':').next().unwrap_or_default().to_owned();
        let destination = v["DestinationArn"]
            .as_str()
            .map(name_of)
            .unwrap_or_else(|| name_of(&source).trim_end_matches("-dlq").to_owned());
        let url_of = |name: String| async move {
            self.sqs.get_queue_url().queue_name(name).send().await.ok().and_then(|o| o.queue_url)
        };
        let (Some(from), Some(to)) = (url_of(name_of(&source)).await, url_of(destination).await) else {
            return (StatusCode::BAD_REQUEST, [("x-amzn-errortype", "ResourceNotFoundException")], "{}")
                .into_response();
        };
        // As SQS: the task moves the messages there when it starts, not the ones that arrive
        // while it runs (a message rejected again at once would otherwise go round for ever).
        let to_move: u64 = self
            .sqs
            .get_queue_attributes()
            .queue_url(&from)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .ok()
            .and_then(|a| {
                a.attributes?.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)?.parse().ok()
            })
            .unwrap_or(0);
        let mut moved = 0u64;
        while moved < to_move {
            let want = (to_move - moved).min(10) as i32;
            let Ok(got) = self
                .sqs
                .receive_message()
                .queue_url(&from)
                .max_number_of_messages(want)
                .visibility_timeout(60)
                .send()
                .await
            else {
                break;
            };
            let messages = got.messages.unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            for m in messages {
                if self
                    .sqs
                    .send_message()
                    .queue_url(&to)
                    .message_body(m.body.clone().unwrap_or_default())
                    .send()
                    .await
                    .is_ok()
                {
                    let _ = self
                        .sqs
                        .delete_message()
                        .queue_url(&from)
                        .receipt_handle(m.receipt_handle.unwrap_or_default())
                        .send()
                        .await;
                    moved += 1;
                }
            }
        }
        let handle = uuid::Uuid::new_v4().to_string();
        self.moves.lock().unwrap_or_else(|e| e.into_inner()).push(json!({
            "TaskHandle": handle, "SourceArn": source, "Status": "COMPLETED",
            "ApproximateNumberOfMessagesMoved": moved, "ApproximateNumberOfMessagesToMove": to_move,
            "StartedTimestamp": super::runtime::now_ms(),
        }));
        ok(json!({"TaskHandle": handle}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(actions: &[&str], resources: &[&str]) -> Statement {
        Statement {
            sid: String::new(),
            actions: actions.iter().map(|s| (*s).to_owned()).collect(),
            resources: resources.iter().map(|s| (*s).to_owned()).collect(),
            condition: None,
        }
    }

    #[test]
    fn globs_match_as_iam_does() {
        assert!(glob("arn:aws:sns:us-east-1:1:endpoint/*", "arn:aws:sns:us-east-1:1:endpoint/APNS/app/x"));
        assert!(!glob("arn:aws:sns:us-east-1:1:app/*", "arn:aws:sns:us-east-1:1:endpoint/x"));
        assert!(glob("*", "anything"));
        assert!(glob("a?c", "abc") && !glob("a?c", "abbc"));
    }

    #[test]
    fn a_transaction_needs_each_of_its_writes() {
        let body = json!({"TransactItems": [
            {"Put": {"TableName": "t"}}, {"ConditionCheck": {"TableName": "t"}}]});
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-target", "DynamoDB_20120810.TransactWriteItems".parse().unwrap());
        let (op, needs) =
            describe("dynamodb", &Method::POST, &"/".parse().unwrap(), &headers, body.to_string().as_bytes(), "ws");
        assert_eq!(op, "DynamoDB.TransactWriteItems");
        let table = table_arn("t");
        let only_put = [st(&["dynamodb:PutItem"], &[&table])];
        assert!(!authorized("dynamodb", &only_put, &needs), "ConditionCheckItem missing");
        let both = [st(&["dynamodb:PutItem", "dynamodb:ConditionCheckItem"], &[&table])];
        assert!(authorized("dynamodb", &both, &needs));
    }

    #[test]
    fn sms_needs_a_star_and_queues_their_arn() {
        let body = b"Action=Publish&PhoneNumber=%2B15550100&Message=hi";
        let (_, needs) = describe("sns", &Method::POST, &"/".parse().unwrap(), &HeaderMap::new(), body, "ws");
        assert!(!allowed(&[st(&["sns:Publish"], &["arn:aws:sns:us-east-1:1:endpoint/*"])], &needs[0]));
        assert!(allowed(&[st(&["sns:Publish"], &["*"])], &needs[0]));
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-target", "AmazonSQS.SendMessageBatch".parse().unwrap());
        let body = json!({"QueueUrl": "http://localhost/123456789012/s-timers"});
        let (op, needs) =
            describe("sqs", &Method::POST, &"/".parse().unwrap(), &headers, body.to_string().as_bytes(), "ws");
        assert_eq!(op, "SQS.SendMessageBatch@s-timers");
        assert!(allowed(&[st(&["sqs:SendMessage"], &[&queue_arn("s-timers")])], &needs[0]));
        assert!(!allowed(&[st(&["sqs:SendMessage"], &[&queue_arn("s-email-high")])], &needs[0]));
    }

    /// A send naming a configuration set needs the grant on it besides one identity's.
    #[test]
    fn a_send_naming_a_configuration_set_needs_it_granted() {
        let body = json!({"FromEmailAddress": "a@shop.example", "ConfigurationSetName": "mail",
            "Destination": {"ToAddresses": ["b@x.example"]}});
        let uri = "/v2/email/outbound-emails".parse().unwrap();
        let (op, needs) = describe("ses", &Method::POST, &uri, &HeaderMap::new(), body.to_string().as_bytes(), "ws");
        assert_eq!(op, "SESv2.SendEmail");
        let identity = format!("arn:aws:ses:{REGION}:{ACCOUNT}:identity/shop.example");
        let set = format!("arn:aws:ses:{REGION}:{ACCOUNT}:configuration-set/mail");
        assert!(!authorized("ses", &[st(&["ses:SendEmail"], &[&identity])], &needs), "no grant on the set");
        assert!(!authorized("ses", &[st(&["ses:SendEmail"], &[&set])], &needs), "no identity");
        assert!(authorized("ses", &[st(&["ses:SendEmail"], &[&identity, &set])], &needs));
        let unnamed = json!({"FromEmailAddress": "a@shop.example"}).to_string();
        let (_, needs) = describe("ses", &Method::POST, &uri, &HeaderMap::new(), unnamed.as_bytes(), "ws");
        assert!(authorized("ses", &[st(&["ses:SendEmail"], &[&identity])], &needs), "no set named, none needed");
    }

    #[test]
    fn a_condition_it_cannot_read_refuses() {
        let mut s = st(&["ses:SendEmail"], &["*"]);
        s.condition = Some(json!({"StringEquals": {"ses:FromAddress": "a@shop.example"}}));
        let mut n = need("ses:SendEmail", Some("x".into()));
        assert!(!allowed(std::slice::from_ref(&s), &n));
        n.context.insert("ses:FromAddress".into(), "a@shop.example".into());
        assert!(allowed(std::slice::from_ref(&s), &n));
        s.condition = Some(json!({"IpAddress": {"aws:SourceIp": "1.2.3.4"}}));
        assert!(!allowed(&[s], &n));
    }

    /// The template's channel worker may send through End User Messaging (its origination
    /// identity and configuration set, or the account's choice); no other function may.
    #[test]
    fn only_the_channel_worker_may_send_sms_through_end_user_messaging() {
        let spec = super::super::template::stack_for_tests().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-amz-target", "PinpointSMSVoiceV2.SendTextMessage".parse().unwrap());
        let requests = [
            json!({"DestinationPhoneNumber": "+14155550100", "MessageBody": "hi"}),
            json!({"DestinationPhoneNumber": "+14155550100", "MessageBody": "hi",
                   "OriginationIdentity": "pool-0123", "ConfigurationSetName": "tidings-sms"}),
        ];
        for body in &requests {
            let (op, needs) = describe(
                "sms-voice",
                &Method::POST,
                &"/".parse().unwrap(),
                &headers,
                body.to_string().as_bytes(),
                "ws",
            );
            assert_eq!(op, "SmsVoiceV2.SendTextMessage");
            assert!(needs.iter().all(|n| n.action == "sms-voice:SendTextMessage"), "{needs:?}");
            for f in &spec.functions {
                let ok = authorized("sms-voice", &f.statements, &needs);
                assert_eq!(ok, f.binary == "channel-worker", "{}: {body}", f.binary);
            }
        }
        let worker = spec.functions.iter().find(|f| f.binary == "channel-worker").unwrap();
        assert_eq!(worker.env.get("TIDINGS_SMS_PRIMARY").map(String::as_str), Some("sns"));
        assert_eq!(worker.env.get("TIDINGS_SMS_SECONDARY").map(String::as_str), Some("end-user-messaging"));
        // Another account's pool is not this policy's.
        let foreign = json!({"DestinationPhoneNumber": "+14155550100", "MessageBody": "hi",
            "OriginationIdentity": "arn:aws:sms-voice:us-east-1:999999999999:pool/pool-x"});
        let (_, needs) =
            describe("sms-voice", &Method::POST, &"/".parse().unwrap(), &headers, foreign.to_string().as_bytes(), "ws");
        assert!(!authorized("sms-voice", &worker.statements, &needs));
    }
}
