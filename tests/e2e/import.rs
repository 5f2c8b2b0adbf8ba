//! `tidings import` through the AWS backend (docs/people.md, "Importing users"): the command an
//! operator runs against the account (here DynamoDB Local and moto), beside a running
//! `tidings serve --backend aws` on the same table; what it imported is then read through the
//! HTTP API with the tenant's key, and a second run writes nothing. (The embedded backend's
//! imports are `shared/tidings/tests/import.rs`.)

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use crate::server::{Backend, Server};

/// Runs `tidings import ARGS --tenant acme --backend aws` against the server's table, queues and
/// push applications, and returns its JSON summary (stdout is that document alone).
async fn import(s: &Server, args: &[&str]) -> anyhow::Result<Value> {
    let data = tempfile::tempdir()?;
    let out = tokio::process::Command::new(crate::server::binary()?)
        .arg("import")
        .args(args)
        .args(["--tenant", "acme", "--backend", "aws", "--data-dir"])
        .arg(data.path())
        .envs(
            ["TIDINGS_TABLE", "TIDINGS_QUEUE_PREFIX", "TIDINGS_SNS_APNS_ARN", "TIDINGS_SNS_FCM_ARN"]
                .iter()
                .filter_map(|name| s.env_of(name)),
        )
        .env("TIDINGS_LOG", "warn")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "tidings import {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("the summary on stdout is one JSON document")
}

async fn get(s: &Server, path: &str) -> anyhow::Result<Value> {
    let (status, body) = s.call("GET", path, None).await?;
    ensure!(status == 200, "GET {path}: {status} {body}");
    Ok(body)
}

pub async fn a_csv_and_a_pinpoint_export_are_imported_through_the_aws_backend() -> anyhow::Result<()> {
    // The push service's platform applications, made in the emulator (devices become endpoints).
    let s = Server::start(Backend::Aws, crate::platform::push_options(Backend::Aws).await?).await?;
    let dir = tempfile::tempdir()?;

    // 300 users from CSV (a third opted out of marketing), one of them refused by its address.
    let csv = dir.path().join("users.csv");
    let mut f = std::fs::File::create(&csv)?;
    writeln!(f, "user_id,email,phone,locale,timezone,tags,marketing_opt_out")?;
    for i in 0..300 {
        let email = if i == 7 { "not an address".to_owned() } else { format!("c{i}@example.com") };
        writeln!(f, "c{i:03},{email},+1 415 555 {:04},en,Europe/Berlin,news;g{},{}", i, i % 2, i % 3 == 0)?;
    }
    drop(f);
    let path = csv.to_str().context("a path")?;
    let first = import(&s, &["users", path]).await?;
    assert_eq!((first["records"].clone(), first["users"].clone()), (json!(300), json!(299)), "{first}");
    assert_eq!((first["opt_outs"].clone(), first["errors_total"].clone()), (json!(100), json!(1)), "{first}");
    assert_eq!(first["errors"][0]["field"], "email", "{first}");

    let u = get(&s, "/v1/users/c042").await?;
    assert_eq!(
        (&u["email"], &u["phone"], &u["timezone"], &u["tags"]),
        (&json!("c42@example.com"), &json!("+14155550042"), &json!("Europe/Berlin"), &json!(["news", "g0"])),
        "{u}"
    );
    let opted_out = get(&s, "/v1/users/c003/preferences").await?;
    assert_eq!(opted_out["categories"]["marketing"], false, "{opted_out}");
    let (status, _) = s.call("GET", "/v1/users/c007", None).await?;
    assert_eq!(status, 404, "the refused record is not half-imported");
    let (status, _) = s.call_as(&s.other_tenant_key(), "GET", "/v1/users/c042", None).await?;
    assert_eq!(status, 404, "imported for acme only");

    // Again: nothing written (the user's updated_at stands).
    let again = import(&s, &["users", path]).await?;
    assert_eq!(
        (again["users_unchanged"].clone(), again["opt_outs_unchanged"].clone()),
        (json!(299), json!(100)),
        "{again}"
    );
    assert_eq!(get(&s, "/v1/users/c042").await?["updated_at"], u["updated_at"], "not written again");

    // A Pinpoint export (here one plain file of endpoint JSON; the gzip files of an export job are
    // read the same way: shared/tidings/tests/import.rs).
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/tidings/tests/fixtures/pinpoint-endpoints.jsonl");
    let export = dir.path().join("export");
    std::fs::create_dir_all(&export)?;
    std::fs::copy(fixture, export.join("part-0.json"))?;
    let p = import(&s, &["pinpoint", export.to_str().context("a path")?]).await?;
    assert_eq!(
        (p["users"].clone(), p["devices"].clone(), p["opt_outs"].clone()),
        (json!(4), json!(2), json!(2)),
        "{p}"
    );
    let ada = get(&s, "/v1/users/cust-1001").await?;
    assert_eq!((&ada["email"], &ada["timezone"]), (&json!("ada.lovelace@example.com"), &json!("Europe/London")));
    let devices = get(&s, "/v1/users/cust-1001/devices").await?;
    let items = devices["items"].as_array().or(devices.as_array()).context("a device list")?;
    assert_eq!(items.len(), 1, "{devices}");
    assert_eq!(items[0]["platform"], "ios", "{devices}");
    let prefs = get(&s, "/v1/users/cust-1001/preferences").await?;
    assert_eq!(prefs["categories"]["marketing"], false, "opted out by SMS: {prefs}");

    // An imported user is sendable at once: the send reaches the fake provider.
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "Welcome"}}});
    let (status, body) = s.call("PUT", "/v1/templates/welcome", Some(template)).await?;
    assert_eq!(status, 200, "{body}");
    let (status, body) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(json!({"idempotency_key": "imported-1", "recipients": {"user_ids": ["c042"]},
                        "template_id": "welcome", "category": "transactional", "channels": ["email"]})),
        )
        .await?;
    assert_eq!(status, 202, "{body}");
    let id = body["notification_id"].as_str().context("an id")?.to_owned();
    let sends = s
        .eventually(Duration::from_secs(30), "the imported user's email", || async {
            let sends = s.sends(&id).await?;
            Ok((!sends.is_empty()).then_some(sends))
        })
        .await?;
    assert_eq!(sends[0]["to"], "c42@example.com");
    Ok(())
}
