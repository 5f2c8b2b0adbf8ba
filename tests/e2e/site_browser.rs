//! The shop's own site: `examples/site` (a page of another origin with `<tidings-inbox>` and
//! `<tidings-preferences>`, and its token-minting backend) driven in headless Chromium (Debian's
//! `chromium` and `chromium-driver` through selenium in `infra/.venv`, as the console test;
//! `make test` installs them). This test prepares the server and the two shop origins (one
//! allowed, one not), runs `tests/site/drive.py`, stops the server when the driver asks (for the
//! reconnect checks), and checks the screenshots it saved.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::server::{Backend, Options, Server};

/// The Python of the virtualenv `make test` prepares (selenium installed).
fn python() -> String {
    std::env::var("TIDINGS_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/../infra/.venv/bin/python", env!("CARGO_MANIFEST_DIR")))
}

/// `examples/site/server.py` on a free loopback port: the child and its URL.
async fn shop(api: &str, key: &str) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(python())
        .arg(format!("{}/../examples/site/server.py", env!("CARGO_MANIFEST_DIR")))
        .args(["--port", "0"])
        .env("TIDINGS_API", api)
        .env("TIDINGS_KEY", key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start examples/site/server.py; run `make test`, which prepares infra/.venv")?;
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the shop did not start")??
        .context("the shop exited")?;
    let url = line.split("listening on ").nth(1).context("no address")?.trim().to_owned();
    Ok((child, url))
}

pub async fn the_shop_site_shows_both_elements_from_another_origin(backend: Backend) -> anyhow::Result<()> {
    let mut s = Server::start(backend, Options::default()).await?;
    for user in ["alice", "bob"] {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{user}"), Some(json!({"email": format!("{user}@example.com")}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    let content = json!({"inapp_title": "Your order", "inapp_body": "Message {{ n }}",
                         "email_subject": "Your order", "email_body": "Message {{ n }}"});
    let (st, v) =
        s.call("PUT", "/v1/templates/hello", Some(json!({"default_locale": "en", "locales": {"en": content}}))).await?;
    assert_eq!(st, 200, "{v}");
    let send = |channel: &str| json!({"type": "send", "channel": channel, "template_id": "hello"});
    let (st, v) = s
        .call(
            "PUT",
            "/v1/workflows/order_updates",
            Some(
                json!({"name": "Order updates", "category": "transactional", "steps": [send("inapp"), send("email")]}),
            ),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s
        .call(
            "PUT",
            "/v1/workflows/security",
            Some(json!({"name": "Security alerts", "category": "transactional", "required": true, "steps": [send("email")]})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    // Six messages, one after the other (the list's order is their order).
    for i in 1..=6 {
        let body = json!({"idempotency_key": format!("seed-{i}"), "recipients": {"user_ids": ["alice"]},
                          "template_id": "hello", "params": {"n": format!("seed-{i}")},
                          "category": "transactional", "channels": ["inapp"]});
        let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
        assert_eq!(st, 202, "{v}");
        s.eventually(Duration::from_secs(60), "the seeded message", || async {
            let (_, v) = s.call("GET", "/v1/users/alice/inbox", None).await?;
            Ok((v["items"].as_array().map_or(0, Vec::len) == i).then_some(()))
        })
        .await?;
    }

    let (_allowed_shop, allowed) = shop(&s.base, &s.key).await?;
    let (_other_shop, not_allowed) = shop(&s.base, &s.key).await?;
    let (st, v) = s.call("PUT", "/v1/settings/allowed-origins", Some(json!({"origins": [allowed]}))).await?;
    assert_eq!(st, 200, "{v}");

    let backend_name = format!("{backend:?}").to_lowercase();
    let shots = format!("{}/../target/site-screenshots/{backend_name}", env!("CARGO_MANIFEST_DIR"));
    let mut driver = Command::new(python())
        .arg(format!("{}/site/drive.py", env!("CARGO_MANIFEST_DIR")))
        .args([&s.base, &s.key, &s.other_tenant_key(), &allowed, &not_allowed, &shots])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run the browser driver ({e}); run `make test`, which installs chromium and selenium"
            )
        })?;
    let mut stdin = driver.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(driver.stdout.take().context("no stdout")?).lines();
    let mut said = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(300), lines.next_line()).await?? {
        println!("{line}");
        if line == "stop-server" {
            s.stop().await?;
            stdin.write_all(b"stopped\n").await?;
            stdin.flush().await?;
        }
        said.push(line);
    }
    let out = driver.wait_with_output().await?;
    assert!(out.status.success(), "site check failed:\n{}\n{}", said.join("\n"), String::from_utf8_lossy(&out.stderr));
    assert!(said.iter().any(|l| l.starts_with("site OK")), "the driver did not finish: {said:?}");
    for view in [
        "inbox-list",
        "inbox-live",
        "inbox-read-one",
        "inbox-read-all",
        "inbox-archived",
        "inbox-zh-CN",
        "preferences",
        "inbox-other-user",
        "origin-not-allowed",
        "inbox-reconnecting",
    ] {
        let png = std::fs::read(format!("{shots}/{view}.png"))?;
        assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "{view}.png: {} bytes", png.len());
    }
    println!("site screenshots: {shots}");
    Ok(())
}
