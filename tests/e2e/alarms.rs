//! The alarms a shop expects, read from `template.yaml` as cfn-lint decodes it: a function,
//! dead-letter queue or schedule added without its alarm or failure path fails here.

use serde_json::Value;

use crate::lambda::template;

/// The logical id a `Ref` or `Fn::GetAtt` names.
fn names(v: &Value) -> Option<String> {
    if let Some(r) = v["Ref"].as_str() {
        return Some(r.to_owned());
    }
    match &v["Fn::GetAtt"] {
        Value::Array(parts) => parts.first().and_then(Value::as_str).map(str::to_owned),
        Value::String(s) => s.split('.').next().map(str::to_owned),
        _ => None,
    }
}

/// Alarms as (namespace, metric, the resources their dimensions name).
fn alarms(t: &Value) -> Vec<(String, String, Vec<String>, &Value)> {
    let mut out = Vec::new();
    for (logical, r) in t["Resources"].as_object().into_iter().flatten() {
        if r["Type"] != "AWS::CloudWatch::Alarm" {
            continue;
        }
        let p = &r["Properties"];
        let dims: Vec<String> =
            p["Dimensions"].as_array().into_iter().flatten().filter_map(|d| names(&d["Value"])).collect();
        out.push((
            p["Namespace"].as_str().unwrap_or_default().to_owned(),
            p["MetricName"].as_str().unwrap_or_default().to_owned(),
            dims,
            &t["Resources"][logical.as_str()],
        ));
    }
    out
}

fn has(alarms: &[(String, String, Vec<String>, &Value)], ns: &str, metric: &str, resource: Option<&str>) -> bool {
    alarms.iter().any(|(n, m, dims, _)| n == ns && m == metric && resource.is_none_or(|r| dims.iter().any(|d| d == r)))
}

#[test]
fn every_function_queue_and_schedule_has_its_alarm_and_failure_path() -> anyhow::Result<()> {
    let t = template::decode()?;
    let all = alarms(&t);
    let mut missing = Vec::new();
    for (logical, r) in t["Resources"].as_object().into_iter().flatten() {
        match r["Type"].as_str() {
            Some("AWS::Serverless::Function") => {
                for metric in ["Errors", "Throttles"] {
                    if !has(&all, "AWS/Lambda", metric, Some(logical)) {
                        missing.push(format!("{logical}: no {metric} alarm"));
                    }
                }
                let events = r["Properties"]["Events"].as_object().cloned().unwrap_or_default();
                let mut scheduled = false;
                for (name, e) in &events {
                    match e["Type"].as_str() {
                        Some("Schedule") => {
                            scheduled = true;
                            let p = &e["Properties"];
                            if p["RetryPolicy"]["MaximumRetryAttempts"].as_u64().is_none() {
                                missing.push(format!("{logical}.{name}: no RetryPolicy"));
                            }
                            if names(&p["DeadLetterConfig"]["Arn"]).is_none() {
                                missing.push(format!("{logical}.{name}: no DeadLetterConfig"));
                            }
                        }
                        Some("DynamoDB") if !has(&all, "AWS/Lambda", "IteratorAge", Some(logical)) => {
                            missing.push(format!("{logical}.{name}: no IteratorAge alarm"));
                        }
                        _ => {}
                    }
                }
                let on_failure = &r["Properties"]["EventInvokeConfig"]["DestinationConfig"]["OnFailure"];
                if scheduled && names(&on_failure["Destination"]).is_none() {
                    missing.push(format!("{logical}: scheduled, but no EventInvokeConfig OnFailure destination"));
                }
            }
            Some("AWS::SQS::Queue") => {
                // Every queue nothing drains on its own: the DLQs and the failure and review queues.
                let name = format!("{}", r["Properties"]["QueueName"]);
                let parked = ["-dlq", "stream-failures", "schedule-failures", "inventory-review"];
                if parked.iter().any(|p| name.contains(p))
                    && !has(&all, "AWS/SQS", "ApproximateNumberOfMessagesVisible", Some(logical))
                {
                    missing.push(format!("{logical}: no depth alarm"));
                }
            }
            Some("AWS::Serverless::HttpApi") if !has(&all, "AWS/ApiGateway", "5xx", Some(logical)) => {
                missing.push(format!("{logical}: no 5xx alarm"));
            }
            _ => {}
        }
    }
    for metric in ["Reputation.BounceRate", "Reputation.ComplaintRate"] {
        if !has(&all, "AWS/SES", metric, None) {
            missing.push(format!("no SES {metric} alarm"));
        }
    }
    for (_, metric, _, alarm) in &all {
        let actions = alarm["Properties"]["AlarmActions"].as_array().cloned().unwrap_or_default();
        if !actions.iter().any(|a| names(a).as_deref() == Some("AlarmTopic")) {
            missing.push(format!("the {metric} alarm notifies no one"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    Ok(())
}
