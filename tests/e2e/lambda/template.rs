//! `template.yaml`, read as CloudFormation would deploy it into the emulators: the functions
//! (binary, timeout, memory, environment, event sources, policy statements), the queues and
//! the table, with every `Ref`, `Fn::Sub`, `Fn::GetAtt`, `Fn::Select`, `Fn::Split` and
//! `Fn::Join` resolved to the names the harness gives the stack's resources.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde_json::{Value, json};

pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "us-east-1";

/// The template decoded to JSON (cfn-lint reads CloudFormation's short tags), from the test
/// virtualenv's Python.
pub fn decode() -> anyhow::Result<Value> {
    let python = std::env::var("TIDINGS_TEST_PYTHON")
        .map_err(|_| anyhow::anyhow!("TIDINGS_TEST_PYTHON is not set: run the tests with `make test`"))?;
    let script = r#"
import json, sys
from cfnlint.decode import decode
template, errors = decode(sys.argv[1])
assert not errors, errors
print(json.dumps(template, default=str))
"#;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml");
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(path).output()?;
    anyhow::ensure!(out.status.success(), "decoding template.yaml failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// One event source of a function.
#[derive(Clone, Debug)]
pub enum Source {
    Sqs {
        queue_logical: String,
        batch_size: usize,
        window_s: u64,
        report_failures: bool,
        max_concurrency: usize,
    },
    Stream {
        batch_size: usize,
        window_s: u64,
        report_failures: bool,
        bisect: bool,
        max_retries: i64,
        on_failure_queue: Option<String>,
        filters: Vec<Value>,
    },
    Schedule {
        expression: String,
    },
    /// A route of the HTTP API: `ANY` or a method, and a path (`/{proxy+}`, `/t/{proxy+}`).
    HttpApi {
        method: String,
        path: String,
    },
}

#[derive(Clone, Debug)]
pub struct Statement {
    pub sid: String,
    pub actions: Vec<String>,
    pub resources: Vec<String>,
    pub condition: Option<Value>,
}

#[derive(Clone, Debug)]
pub struct FunctionSpec {
    pub logical_id: String,
    pub binary: String,
    pub timeout_s: u64,
    pub memory_mb: u64,
    pub env: BTreeMap<String, String>,
    pub sources: BTreeMap<String, Source>,
    pub statements: Vec<Statement>,
}

#[derive(Clone, Debug)]
pub struct QueueSpec {
    pub logical_id: String,
    pub name: String,
    pub visibility_s: u64,
    pub retention_s: u64,
    /// (the DLQ's logical id, maxReceiveCount)
    pub redrive: Option<(String, u32)>,
}

#[derive(Clone, Debug)]
pub struct TableSpec {
    pub logical_id: String,
    pub properties: Value,
}

/// An SNS subscription (`AWS::SNS::Subscription`), resolved.
#[derive(Clone, Debug)]
pub struct SubscriptionSpec {
    pub topic_arn: String,
    pub protocol: String,
    pub endpoint: String,
}

/// An SES configuration set's event destination (`AWS::SES::ConfigurationSetEventDestination`).
#[derive(Clone, Debug)]
pub struct EventDestinationSpec {
    pub configuration_set: String,
    pub enabled: bool,
    /// As the template writes them: `send`, `delivery`, `bounce`, ...
    pub event_types: Vec<String>,
    pub topic_arn: String,
}

/// The stack as the emulators will hold it.
#[derive(Clone, Debug)]
pub struct StackSpec {
    pub name: String,
    pub functions: Vec<FunctionSpec>,
    pub queues: Vec<QueueSpec>,
    pub table: TableSpec,
    pub subscriptions: Vec<SubscriptionSpec>,
    pub event_destinations: Vec<EventDestinationSpec>,
}

/// What the harness names things that CloudFormation would name.
pub struct Names<'a> {
    pub stack: &'a str,
    pub parameters: &'a BTreeMap<String, String>,
    /// Values for `Ref`/`GetAtt` of resources the emulators do not create (the WebSocket API).
    pub other: BTreeMap<String, String>,
}

pub fn queue_arn(name: &str) -> String {
    format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}")
}

pub fn table_name(stack: &str) -> String {
    format!("{stack}-table")
}

pub fn table_arn(name: &str) -> String {
    format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}")
}

/// The ARN of an SNS topic the template makes (CloudFormation names it after the stack).
pub fn topic_arn(stack: &str, logical: &str) -> String {
    format!("arn:aws:sns:{REGION}:{ACCOUNT}:{stack}-{logical}")
}

impl Names<'_> {
    fn resource_type<'t>(&self, template: &'t Value, logical: &str) -> Option<&'t str> {
        template["Resources"][logical]["Type"].as_str()
    }

    fn reference(&self, template: &Value, name: &str) -> anyhow::Result<String> {
        Ok(match name {
            "AWS::StackName" => self.stack.to_owned(),
            "AWS::Region" => REGION.to_owned(),
            "AWS::AccountId" => ACCOUNT.to_owned(),
            "AWS::Partition" => "aws".to_owned(),
            "AWS::URLSuffix" => "amazonaws.com".to_owned(),
            _ => {
                if let Some(v) = self.parameters.get(name) {
                    return Ok(v.clone());
                }
                if template["Parameters"].get(name).is_some() {
                    if let Some(d) = template["Parameters"][name].get("Default") {
                        return Ok(scalar(d));
                    }
                    bail!("parameter {name} has no value and no default");
                }
                if let Some(v) = self.other.get(name) {
                    return Ok(v.clone());
                }
                match self.resource_type(template, name) {
                    Some("AWS::DynamoDB::Table") => table_name(self.stack),
                    Some("AWS::SQS::Queue") => {
                        // Ref of a queue is its URL; the harness only needs its name-bearing form.
                        let qn = self.resolve(template, &template["Resources"][name]["Properties"]["QueueName"])?;
                        format!("http://sqs.{REGION}.localhost/{ACCOUNT}/{}", scalar(&qn))
                    }
                    Some("AWS::SNS::Topic") => topic_arn(self.stack, name),
                    Some("AWS::SES::ConfigurationSet") => {
                        match self.resolve(template, &template["Resources"][name]["Properties"]["Name"])? {
                            Value::Null => format!("{}-{name}", self.stack),
                            given => scalar(&given),
                        }
                    }
                    Some(t) => bail!("Ref {name} of a {t}: not known to the harness"),
                    None => bail!("Ref {name}: no such parameter or resource"),
                }
            }
        })
    }

    fn get_att(&self, template: &Value, logical: &str, attribute: &str) -> anyhow::Result<String> {
        if let Some(v) = self.other.get(&format!("{logical}.{attribute}")) {
            return Ok(v.clone());
        }
        let props = &template["Resources"][logical]["Properties"];
        Ok(match (self.resource_type(template, logical), attribute) {
            (Some("AWS::SQS::Queue"), "Arn") => queue_arn(&scalar(&self.resolve(template, &props["QueueName"])?)),
            (Some("AWS::DynamoDB::Table"), "Arn") => table_arn(&table_name(self.stack)),
            (Some("AWS::DynamoDB::Table"), "StreamArn") => {
                format!("{}/stream/harness", table_arn(&table_name(self.stack)))
            }
            (Some("AWS::Serverless::Function"), "Arn") => {
                format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{}-{logical}", self.stack)
            }
            (t, a) => bail!("GetAtt {logical}.{a} of {t:?}: not known to the harness"),
        })
    }

    /// `value` with every intrinsic function resolved.
    pub fn resolve(&self, template: &Value, value: &Value) -> anyhow::Result<Value> {
        let Value::Object(map) = value else {
            return Ok(match value {
                Value::Array(items) => {
                    Value::Array(items.iter().map(|v| self.resolve(template, v)).collect::<anyhow::Result<_>>()?)
                }
                other => other.clone(),
            });
        };
        if map.len() == 1 {
            let (k, arg) = map.iter().next().context("one key")?;
            match k.as_str() {
                "Ref" => return Ok(json!(self.reference(template, arg.as_str().context("Ref of a string")?)?)),
                "Fn::GetAtt" => {
                    let (logical, attribute) = match arg {
                        Value::Array(a) => (scalar(&a[0]), scalar(&a[1])),
                        Value::String(s) => {
                            let (l, a) = s.split_once('.').context("GetAtt X.Y")?;
                            (l.to_owned(), a.to_owned())
                        }
                        _ => bail!("GetAtt {arg}"),
                    };
                    return Ok(json!(self.get_att(template, &logical, &attribute)?));
                }
                "Fn::Sub" => {
                    let (text, vars) = match arg {
                        Value::String(s) => (s.clone(), serde_json::Map::new()),
                        Value::Array(a) => {
                            (scalar(&a[0]), a.get(1).and_then(Value::as_object).cloned().unwrap_or_default())
                        }
                        _ => bail!("Sub {arg}"),
                    };
                    return Ok(json!(self.sub(template, &text, &vars)?));
                }
                "Fn::Select" => {
                    let a = arg.as_array().context("Select [i, list]")?;
                    let i = scalar(&self.resolve(template, &a[0])?).parse::<usize>()?;
                    let list = self.resolve(template, &a[1])?;
                    return list.get(i).cloned().context("Select out of range");
                }
                "Fn::Split" => {
                    let a = arg.as_array().context("Split [sep, text]")?;
                    let sep = scalar(&a[0]);
                    let text = scalar(&self.resolve(template, &a[1])?);
                    return Ok(json!(text.split(sep.as_str()).collect::<Vec<_>>()));
                }
                "Fn::Join" => {
                    let a = arg.as_array().context("Join [sep, list]")?;
                    let sep = scalar(&a[0]);
                    let list = self.resolve(template, &a[1])?;
                    let parts: Vec<String> = list.as_array().context("Join list")?.iter().map(scalar).collect();
                    return Ok(json!(parts.join(&sep)));
                }
                _ => {}
            }
        }
        let mut out = serde_json::Map::new();
        for (k, v) in map {
            out.insert(k.clone(), self.resolve(template, v)?);
        }
        Ok(Value::Object(out))
    }

    fn sub(&self, template: &Value, text: &str, vars: &serde_json::Map<String, Value>) -> anyhow::Result<String> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let end = rest[i..].find('}').context("unclosed ${")? + i;
            let name = &rest[i + 2..end];
            let value = if let Some(v) = vars.get(name) {
                scalar(&self.resolve(template, v)?)
            } else if let Some((logical, attribute)) = name.split_once('.') {
                self.get_att(template, logical, attribute)?
            } else {
                self.reference(template, name)?
            };
            out.push_str(&value);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// A scalar as text (numbers and booleans as CloudFormation passes them: strings).
pub fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn listed(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// The stack `template` makes under `names`.
pub fn stack(template: &Value, names: &Names<'_>) -> anyhow::Result<StackSpec> {
    let globals = &template["Globals"]["Function"];
    let resources = template["Resources"].as_object().context("Resources")?;
    let mut functions = Vec::new();
    let mut queues = Vec::new();
    let mut table = None;
    let mut subscriptions = Vec::new();
    let mut event_destinations = Vec::new();
    for (logical, res) in resources {
        let props = &res["Properties"];
        match res["Type"].as_str() {
            Some("AWS::Serverless::Function") => {
                let binary = scalar(&res["Metadata"]["BuildProperties"]["Binary"]);
                let number = |name: &str, default: u64| -> anyhow::Result<u64> {
                    let v = props.get(name).or_else(|| globals.get(name));
                    Ok(match v {
                        Some(v) => scalar(&names.resolve(template, v)?).parse()?,
                        None => default,
                    })
                };
                let mut env = BTreeMap::new();
                for vars in [&globals["Environment"]["Variables"], &props["Environment"]["Variables"]] {
                    if let Some(vars) = vars.as_object() {
                        for (k, v) in vars {
                            env.insert(k.clone(), scalar(&names.resolve(template, v)?));
                        }
                    }
                }
                let mut sources = BTreeMap::new();
                for (name, event) in props["Events"].as_object().into_iter().flatten() {
                    let p = names.resolve(template, &event["Properties"])?;
                    let n = |k: &str, d: u64| p.get(k).map(scalar).and_then(|s| s.parse().ok()).unwrap_or(d);
                    let reports = listed(&p["FunctionResponseTypes"]).iter().any(|t| t == "ReportBatchItemFailures");
                    let source = match event["Type"].as_str() {
                        Some("SQS") => {
                            let arn = scalar(&p["Queue"]);
                            let queue_logical = queue_logical_of(template, names, &arn)?;
                            Source::Sqs {
                                queue_logical,
                                batch_size: n("BatchSize", 10) as usize,
                                window_s: n("MaximumBatchingWindowInSeconds", 0),
                                report_failures: reports,
                                max_concurrency: p["ScalingConfig"]["MaximumConcurrency"]
                                    .as_u64()
                                    .or_else(|| scalar(&p["ScalingConfig"]["MaximumConcurrency"]).parse().ok())
                                    .unwrap_or(1000) as usize,
                            }
                        }
                        Some("DynamoDB") => {
                            let destination = scalar(&p["DestinationConfig"]["OnFailure"]["Destination"]);
                            Source::Stream {
                                batch_size: n("BatchSize", 100) as usize,
                                window_s: n("MaximumBatchingWindowInSeconds", 0),
                                report_failures: reports,
                                bisect: p["BisectBatchOnFunctionError"] == json!(true)
                                    || p["BisectBatchOnFunctionError"] == json!("true"),
                                max_retries: scalar(&p["MaximumRetryAttempts"]).parse().unwrap_or(-1),
                                on_failure_queue: (!destination.is_empty())
                                    .then(|| queue_logical_of(template, names, &destination))
                                    .transpose()?,
                                filters: listed(&p["FilterCriteria"]["Filters"])
                                    .iter()
                                    .map(|f| serde_json::from_str(&scalar(&f["Pattern"])))
                                    .collect::<Result<_, _>>()?,
                            }
                        }
                        Some("Schedule") => Source::Schedule { expression: scalar(&p["Schedule"]) },
                        Some("HttpApi") => Source::HttpApi { method: scalar(&p["Method"]), path: scalar(&p["Path"]) },
                        other => bail!("{logical}.{name}: event type {other:?} not known to the harness"),
                    };
                    sources.insert(name.clone(), source);
                }
                let mut statements = Vec::new();
                for policy in listed(&props["Policies"]) {
                    for st in listed(&policy["Statement"]) {
                        if st["Effect"] != "Allow" {
                            continue;
                        }
                        let st = names.resolve(template, &st)?;
                        statements.push(Statement {
                            sid: scalar(&st["Sid"]),
                            actions: listed(&st["Action"]).iter().map(scalar).collect(),
                            resources: listed(&st["Resource"]).iter().map(scalar).collect(),
                            condition: st.get("Condition").cloned(),
                        });
                    }
                }
                functions.push(FunctionSpec {
                    logical_id: logical.clone(),
                    binary,
                    timeout_s: number("Timeout", 3)?,
                    memory_mb: number("MemorySize", 128)?,
                    env,
                    sources,
                    statements,
                });
            }
            Some("AWS::SQS::Queue") => {
                let p = names.resolve(template, props)?;
                let n = |k: &str, d: u64| p.get(k).map(scalar).and_then(|s| s.parse().ok()).unwrap_or(d);
                let redrive = match p.get("RedrivePolicy") {
                    Some(r) => Some((
                        queue_logical_of(template, names, &scalar(&r["deadLetterTargetArn"]))?,
                        scalar(&r["maxReceiveCount"]).parse()?,
                    )),
                    None => None,
                };
                queues.push(QueueSpec {
                    logical_id: logical.clone(),
                    name: scalar(&p["QueueName"]),
                    visibility_s: n("VisibilityTimeout", 30),
                    retention_s: n("MessageRetentionPeriod", 345_600),
                    redrive,
                });
            }
            Some("AWS::DynamoDB::Table") => {
                table = Some(TableSpec { logical_id: logical.clone(), properties: names.resolve(template, props)? });
            }
            // A conditional subscription (the alarm e-mail) is not the harness's to play.
            Some("AWS::SNS::Subscription") if res.get("Condition").is_none() => {
                let p = names.resolve(template, props)?;
                subscriptions.push(SubscriptionSpec {
                    topic_arn: scalar(&p["TopicArn"]),
                    protocol: scalar(&p["Protocol"]),
                    endpoint: scalar(&p["Endpoint"]),
                });
            }
            Some("AWS::SES::ConfigurationSetEventDestination") => {
                let p = names.resolve(template, props)?;
                let d = &p["EventDestination"];
                event_destinations.push(EventDestinationSpec {
                    configuration_set: scalar(&p["ConfigurationSetName"]),
                    enabled: d["Enabled"] == json!(true) || d["Enabled"] == json!("true"),
                    event_types: listed(&d["MatchingEventTypes"]).iter().map(scalar).collect(),
                    topic_arn: scalar(&d["SnsDestination"]["TopicARN"]),
                });
            }
            _ => {}
        }
    }
    Ok(StackSpec {
        name: names.stack.to_owned(),
        functions,
        queues,
        table: table.context("no table in template")?,
        subscriptions,
        event_destinations,
    })
}

/// The logical id of the queue with ARN `arn`.
fn queue_logical_of(template: &Value, names: &Names<'_>, arn: &str) -> anyhow::Result<String> {
    for (logical, res) in template["Resources"].as_object().into_iter().flatten() {
        if res["Type"] == "AWS::SQS::Queue" && names.get_att(template, logical, "Arn")? == arn {
            return Ok(logical.clone());
        }
    }
    bail!("no queue has the ARN {arn}")
}

/// The stack `template.yaml` makes under fixed names (stack `s`, a shop's parameters, the APIs
/// `http1` and `ws1`): for the tests that read the template's functions without starting them.
#[cfg(test)]
pub fn stack_for_tests() -> anyhow::Result<StackSpec> {
    let template = decode()?;
    let parameters = BTreeMap::from([
        ("PublicUrl".to_owned(), "https://notify.shop.example".to_owned()),
        ("EmailFrom".to_owned(), "no-reply@shop.example".to_owned()),
    ]);
    let other = BTreeMap::from([
        ("InboxWebSocketApi".to_owned(), "ws1".to_owned()),
        ("InboxWebSocketStage".to_owned(), "live".to_owned()),
        ("HttpApi".to_owned(), "http1".to_owned()),
        ("Table.StreamArn".to_owned(), "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/1".to_owned()),
    ]);
    stack(&template, &Names { stack: "s", parameters: &parameters, other })
}
