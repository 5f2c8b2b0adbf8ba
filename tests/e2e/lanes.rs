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

/// A function that consumes a high lane has reserved concurrency of at least the sum of its
/// SQS mappings' `MaximumConcurrency`: each mapping can run at its cap at once, so a flood on a
/// low lane never takes what the high lane's mapping is promised, and no other function of
/// the account can take it either (docs/delivery.md, "Priorities").
#[test]
fn the_high_lanes_consumers_reserve_what_their_mappings_may_use() -> anyhow::Result<()> {
    let t = template::decode()?;
    let resources = t["Resources"].as_object().context("Resources")?;
    let mut high_consumers = BTreeSet::new();
    for lane in Lane::ALL.into_iter().filter(|l| l.is_high()) {
        high_consumers.extend(lane.consumer());
    }
    let mut checked = BTreeSet::new();
    for (logical, r) in resources.iter().filter(|(_, r)| r["Type"] == "AWS::Serverless::Function") {
        let binary = template::scalar(&r["Metadata"]["BuildProperties"]["Binary"]);
        if !high_consumers.contains(binary.as_str()) {
            continue;
        }
        let mut caps = 0u64;
        for (event, e) in r["Properties"]["Events"].as_object().into_iter().flatten() {
            if e["Type"] == "SQS" {
                caps += e["Properties"]["ScalingConfig"]["MaximumConcurrency"]
                    .as_u64()
                    .with_context(|| format!("{logical} {event}: ScalingConfig.MaximumConcurrency"))?;
            }
        }
        let reserved = r["Properties"]["ReservedConcurrentExecutions"]
            .as_u64()
            .with_context(|| format!("{logical}: ReservedConcurrentExecutions"))?;
        assert!(reserved >= caps, "{logical}: reserves {reserved}, its mappings may use {caps}");
        checked.insert(binary);
    }
    let expected: BTreeSet<String> = high_consumers.into_iter().map(str::to_owned).collect();
    assert_eq!(checked, expected, "every consumer of a high lane is checked");
    Ok(())
}
