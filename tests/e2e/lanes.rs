//! `template.yaml`'s queues against the core's lane table ([`tidings_core::lanes::Lane`]): every
//! queue of the template is a lane or a lane's DLQ, every lane is in the template, and each SQS
//! event source maps a lane to the function the table names with the batch size it gives. A
//! queue added, renamed or rewired on one side only fails here.

use std::collections::BTreeSet;

use anyhow::Context;
use serde_json::Value;
use tidings_core::lanes::Lane;

use crate::lambda::template;

/// A queue's logical name from its `QueueName: !Sub "${AWS::StackName}-<name>"`.
fn queue_name(resource: &Value) -> Option<String> {
    let sub = resource["Properties"]["QueueName"]["Fn::Sub"].as_str()?;
    sub.strip_prefix("${AWS::StackName}-").map(str::to_owned)
}

#[test]
fn the_templates_queues_and_their_consumers_are_the_lane_table() -> anyhow::Result<()> {
    let t = template::decode()?;
    let resources = t["Resources"].as_object().context("Resources")?;
    let mut names = BTreeSet::new();
    let mut by_logical = std::collections::BTreeMap::new();
    for (logical, r) in resources {
        if r["Type"] == "AWS::SQS::Queue" {
            let name = queue_name(r).with_context(|| format!("{logical}: QueueName"))?;
            by_logical.insert(logical.clone(), name.clone());
            names.insert(name);
        }
    }
    let lanes: Vec<Lane> = Lane::ALL.into_iter().chain(Lane::FAILURES).collect();
    let mut expected = BTreeSet::new();
    for lane in &lanes {
        expected.insert(lane.name().to_owned());
        expected.extend(lane.dlq());
    }
    assert_eq!(names, expected, "the template's queues (left) and the lanes with their DLQs (right)");

    let mut mapped = BTreeSet::new();
    for r in resources.values().filter(|r| r["Type"] == "AWS::Serverless::Function") {
        let binary = template::scalar(&r["Metadata"]["BuildProperties"]["Binary"]);
        for (event, e) in r["Properties"]["Events"].as_object().into_iter().flatten() {
            if e["Type"] != "SQS" {
                continue;
            }
            let logical = e["Properties"]["Queue"]["Fn::GetAtt"][0].as_str().context("Queue: !GetAtt")?;
            let name = by_logical.get(logical).with_context(|| format!("{binary} {event}: {logical}"))?;
            let lane = Lane::from_name(name).with_context(|| format!("{binary} {event}: {name} is not a lane"))?;
            assert_eq!(lane.consumer(), Some(binary.as_str()), "{name}: consumer");
            let batch = e["Properties"]["BatchSize"].as_u64().and_then(|b| usize::try_from(b).ok());
            assert_eq!(lane.batch_size(), batch, "{name}: batch size");
            mapped.insert(lane.name());
        }
    }
    let consumed: BTreeSet<&str> = lanes.iter().filter(|l| l.is_consumed()).map(|l| l.name()).collect();
    assert_eq!(mapped, consumed, "the queues with an event source (left) and the consumed lanes (right)");
    Ok(())
}
