//! `tidings bench reserve --backend aws`: concurrent single-unit orders on one sharded SKU in
//! DynamoDB Local, through the emulators' conflict layer (overlapping writes of a shard are
//! refused as DynamoDB refuses them, so `place_order`'s retries and the bench's own run). The
//! bench checks its invariants itself; this test then reads the table directly, without
//! Tidings' code: the shards hold exactly the stock, none below zero, every unit reserved
//! once, and the SKU's ledger has the warm-up and one row per accepted order.

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use crate::lambda::sources::Dynamo;

const ORDERS: u32 = 120;
const UNITS: i64 = 60;
const SHARDS: u32 = 4;

fn number(item: &Value, field: &str) -> anyhow::Result<i64> {
    item[field]["N"].as_str().and_then(|n| n.parse().ok()).with_context(|| format!("{field} of {item}"))
}

pub async fn reserve_bench_on_aws_sells_exactly_the_stock_and_the_table_agrees() -> anyhow::Result<()> {
    crate::server::emulator();
    let run = format!("e2e{:08x}", rand::random::<u32>());
    let table = format!("{run}-table");
    let data = tempfile::tempdir()?;
    let (orders, units, shards) = (ORDERS.to_string(), UNITS.to_string(), SHARDS.to_string());
    let out = tokio::process::Command::new(crate::server::binary()?)
        .args(["bench", "reserve", "--backend", "aws", "--bootstrap", "--no-peer", "--concurrency", "8"])
        .args(["--orders", &orders, "--units", &units, "--shards", &shards])
        .current_dir(data.path())
        .env("TIDINGS_TABLE", &table)
        .env("TIDINGS_QUEUE_PREFIX", format!("{run}-"))
        .env("TIDINGS_LOG", "warn")
        .output()
        .await
        .context("running tidings bench reserve")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "tidings bench reserve --backend aws failed:\n{stdout}\n{stderr}");
    ensure!(
        stdout.contains(&format!("accepted {UNITS}, refused {} (0 while stock remained)", i64::from(ORDERS) - UNITS)),
        "every unit sold, the rest refused, none refused early:\n{stdout}"
    );
    ensure!(stdout.contains("invariants hold"), "{stdout}");
    let sku = stdout
        .split("SKU ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("no SKU in the report:\n{stdout}"))?;

    let url = std::env::var("AWS_ENDPOINT_URL_DYNAMODB").context("AWS_ENDPOINT_URL_DYNAMODB")?;
    let db = Dynamo { url, http: reqwest::Client::new() };
    let (mut available, mut reserved) = (0, 0);
    for i in 0..SHARDS {
        let got = db
            .call(
                "DynamoDB_20120810.GetItem",
                json!({"TableName": table, "ConsistentRead": true,
                       "Key": {"pk": {"S": format!("T#bench#SKU#{sku}#S{i}")}, "sk": {"S": "CELL"}}}),
            )
            .await?;
        let cell = &got["Item"];
        ensure!(cell.is_object(), "shard {i} of {sku} is missing: {got}");
        let (a, r, s) = (number(cell, "available")?, number(cell, "reserved")?, number(cell, "sold")?);
        ensure!(a >= 0 && r >= 0 && s == 0, "shard {i}: available {a}, reserved {r}, sold {s}");
        available += a;
        reserved += r;
    }
    ensure!(available == 0 && reserved == UNITS, "the shards: available {available}, reserved {reserved} of {UNITS}");
    let mut rows = 0;
    let mut start: Option<Value> = None;
    loop {
        let mut query = json!({"TableName": table, "ConsistentRead": true, "Select": "COUNT",
            "KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": {"S": format!("T#bench#LEDGER#{sku}")}}});
        if let Some(key) = start.take() {
            query["ExclusiveStartKey"] = key;
        }
        let page = db.call("DynamoDB_20120810.Query", query).await?;
        rows += page["Count"].as_i64().context("Count")?;
        match page.get("LastEvaluatedKey") {
            Some(key) if !key.is_null() => start = Some(key.clone()),
            _ => break,
        }
    }
    ensure!(rows == 1 + UNITS, "the ledger holds the warm-up and one row per accepted order: {rows}");
    Ok(())
}

/// `tidings bench digest --backend aws` at a tiny scale: 50 triggers into 5 users' digests on
/// the emulators (DynamoDB Local behind its conflict layer, so the triggers of one user that
/// meet at its window's head conflict as on DynamoDB). The bench's own checks pass (one digest
/// per user with its 10 events, every run ended) and its report carries the cost per trigger.
pub async fn digest_bench_on_aws_sends_one_digest_per_user_with_its_events() -> anyhow::Result<()> {
    crate::server::emulator();
    let run = format!("e2e{:08x}", rand::random::<u32>());
    let data = tempfile::tempdir()?;
    let out = tokio::process::Command::new(crate::server::binary()?)
        .args(["bench", "digest", "--backend", "aws", "--bootstrap", "--users", "5", "--per-user", "10"])
        .args(["--timeout-s", "300"])
        .current_dir(data.path())
        .env("TIDINGS_TABLE", format!("{run}-table"))
        .env("TIDINGS_QUEUE_PREFIX", format!("{run}-"))
        .env("TIDINGS_LOG", "warn")
        .output()
        .await
        .context("running tidings bench digest")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "tidings bench digest --backend aws failed:\n{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).with_context(|| format!("the report:\n{stdout}"))?;
    ensure!(report["backend"] == "aws" && report["triggers"] == 50, "{report}");
    ensure!(report["digests_sent"] == 5, "one digest per user: {report}");
    ensure!(report["runs"]["digest digested 10 events"] == 5 && report["runs"]["digest merged"] == 45, "{report}");
    ensure!(report["runs"]["status completed"] == 50, "every run ended: {report}");
    ensure!(report["per_trigger"]["write_units"].as_f64().unwrap_or(0.0) >= 4.0, "{report}");
    ensure!(report["aws_requests"]["DynamoDB.TransactWriteItems"].as_u64().unwrap_or(0) >= 50, "{report}");
    ensure!(stderr.contains("checks pass"), "{stderr}");
    Ok(())
}
