//! The operations dashboard of `template.yaml`, read as cfn-lint decodes it: every queue and
//! function of the template has its widgets (a queue or function added without them fails
//! here), and the metrics of the `Tidings` namespace it reads are those the code emits, with
//! the dimensions its EMF documents carry (a renamed metric fails here).

use std::collections::BTreeSet;

use serde_json::Value;
use tidings_core::metrics;

use crate::lambda::template;

/// One line of a widget: namespace, metric name and dimensions.
#[derive(Debug)]
struct Line {
    namespace: String,
    metric: String,
    dimensions: Vec<(String, String)>,
}

/// A widget's title and lines.
type Widget = (String, Vec<Line>);

/// The dashboard's body (its `${..}` left as written) and its widgets.
fn dashboard(t: &Value) -> anyhow::Result<(String, Vec<Widget>)> {
    let resources = t["Resources"].as_object().into_iter().flatten();
    let dashboards: Vec<&Value> =
        resources.filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Dashboard").map(|(_, r)| r).collect();
    anyhow::ensure!(dashboards.len() == 1, "one dashboard, found {}", dashboards.len());
    let sub = &dashboards[0]["Properties"]["DashboardBody"]["Fn::Sub"];
    let text =
        sub.as_str().or_else(|| sub[0].as_str()).ok_or_else(|| anyhow::anyhow!("DashboardBody is no !Sub string"))?;
    let body: Value = serde_json::from_str(text)?;
    let mut widgets = Vec::new();
    for w in body["widgets"].as_array().into_iter().flatten() {
        let p = &w["properties"];
        let mut lines = Vec::new();
        let mut ids = BTreeSet::new();
        for m in p["metrics"].as_array().into_iter().flatten() {
            let parts = m.as_array().cloned().unwrap_or_default();
            if let Some(id) = parts.iter().find_map(|v| v["id"].as_str()) {
                anyhow::ensure!(ids.insert(id.to_owned()), "id {id} twice in {}", p["title"]);
            }
            let strings: Vec<String> = parts.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            if strings.len() < 2 {
                continue; // an expression
            }
            let dimensions =
                strings[2..].chunks(2).map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default())).collect();
            lines.push(Line { namespace: strings[0].clone(), metric: strings[1].clone(), dimensions });
        }
        widgets.push((p["title"].as_str().unwrap_or_default().to_owned(), lines));
    }
    Ok((text.to_owned(), widgets))
}

/// Whether some widget has a line of `namespace`/`metric` with the dimension `name` = `value`.
fn shows(widgets: &[Widget], namespace: &str, metric: &str, name: &str, value: &str) -> bool {
    widgets.iter().flat_map(|(_, lines)| lines).any(|l| {
        l.namespace == namespace && l.metric == metric && l.dimensions.iter().any(|(n, v)| n == name && v == value)
    })
}

#[test]
fn the_dashboard_shows_every_queue_and_function_and_the_metrics_the_code_emits() -> anyhow::Result<()> {
    let t = template::decode()?;
    let (text, widgets) = dashboard(&t)?;
    let mut missing = Vec::new();
    let resources = t["Resources"].as_object().cloned().unwrap_or_default();
    for (logical, r) in &resources {
        match r["Type"].as_str() {
            Some("AWS::SQS::Queue") => {
                let name = r["Properties"]["QueueName"]["Fn::Sub"].as_str().unwrap_or_default().to_owned();
                let parked = ["-dlq", "stream-failures", "schedule-failures", "inventory-review"];
                let metrics: &[&str] = if parked.iter().any(|p| name.ends_with(p)) {
                    &["ApproximateNumberOfMessagesVisible"]
                } else {
                    &["ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"]
                };
                for m in metrics {
                    if !shows(&widgets, "AWS/SQS", m, "QueueName", &name) {
                        missing.push(format!("{logical} ({name}): no {m}"));
                    }
                }
            }
            Some("AWS::Serverless::Function") => {
                let value = format!("${{{logical}}}");
                for m in ["Errors", "Throttles", "Duration", "ConcurrentExecutions"] {
                    if !shows(&widgets, "AWS/Lambda", m, "FunctionName", &value) {
                        missing.push(format!("{logical}: no {m}"));
                    }
                }
                let streamed =
                    r["Properties"]["Events"].as_object().into_iter().flatten().any(|(_, e)| e["Type"] == "DynamoDB");
                if streamed && !shows(&widgets, "AWS/Lambda", "IteratorAge", "FunctionName", &value) {
                    missing.push(format!("{logical}: reads the stream, no IteratorAge"));
                }
                if !shows(&widgets, metrics::NAMESPACE, metrics::COLD_STARTS, "function", &value) {
                    missing.push(format!("{logical}: no cold starts"));
                }
            }
            _ => {}
        }
    }
    // The figures: each read from what the functions print.
    for channel in ["email", "sms", "push"] {
        for result in ["ok", "throttled"] {
            if !widgets.iter().flat_map(|(_, l)| l).any(|l| {
                l.metric == metrics::PROVIDER_CALLS
                    && l.dimensions.contains(&("channel".into(), channel.into()))
                    && l.dimensions.contains(&("result".into(), result.into()))
            }) {
                missing.push(format!("no {} of {channel} {result}", metrics::PROVIDER_CALLS));
            }
        }
        for m in [metrics::RETRIES, metrics::DEAD_LETTERS, metrics::DELIVERY_LATENCY_MS] {
            if !shows(&widgets, metrics::NAMESPACE, m, "channel", channel) {
                missing.push(format!("no {m} of {channel}"));
            }
        }
    }
    if !widgets.iter().flat_map(|(_, l)| l).any(|l| l.metric == metrics::WORKER_BUSY_MS) {
        missing.push(format!("no {}", metrics::WORKER_BUSY_MS));
    }
    // Every Tidings metric it reads is one the code emits, under a dimension set its EMF
    // documents publish: `function` with every label, or the rollup labels alone.
    let rollup = ["channel", "result", "queue", "priority"];
    for (title, lines) in &widgets {
        for l in lines.iter().filter(|l| l.namespace == metrics::NAMESPACE) {
            if !metrics::ALL.contains(&l.metric.as_str()) {
                missing.push(format!("{title}: {} is no metric the code emits", l.metric));
            }
            let names: Vec<&str> = l.dimensions.iter().map(|(n, _)| n.as_str()).collect();
            if !names.contains(&"function") && !names.iter().all(|n| rollup.contains(n)) {
                missing.push(format!("{title}: {} by {names:?} is no dimension set the code publishes", l.metric));
            }
        }
    }
    // Every `${..}` names a pseudo parameter or a resource of the template.
    for var in text.split("${").skip(1).filter_map(|s| s.split('}').next()) {
        if !var.starts_with("AWS::") && !resources.contains_key(var) {
            missing.push(format!("${{{var}}} names nothing in the template"));
        }
    }
    let url = t["Outputs"]["DashboardUrl"]["Value"]["Fn::Sub"].as_str().unwrap_or_default();
    if !url.contains("#dashboards:name=${OperationsDashboard}") {
        missing.push(format!("the DashboardUrl output does not open the dashboard: {url:?}"));
    }
    assert!(missing.is_empty(), "{missing:#?}");
    Ok(())
}
