//! The local console at `/`, driven in headless Chromium (Debian's `chromium` and
//! `chromium-driver`, through selenium in the emulator's virtualenv: `make test` installs them).

use std::time::Duration;

use serde_json::json;

use crate::server::{Backend, Options, Server};

/// The Python of the virtualenv `make test` prepares (selenium installed).
fn python() -> String {
    std::env::var("TIDINGS_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/../infra/.venv/bin/python", env!("CARGO_MANIFEST_DIR")))
}

pub async fn console_shows_the_system_and_redrives(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_MAX_RECEIVES", "1".into()));
    let s = Server::start(backend, opts).await?;
    s.call("PUT", "/v1/users/alice", Some(json!({"email": "alice@example.com"}))).await?;
    s.call(
        "PUT",
        "/v1/templates/welcome",
        Some(json!({"default_locale": "en", "locales": {"en": {
            "email_subject": "Welcome", "email_body": "Hello", "sms": "Hello",
            "inapp_title": "Welcome aboard", "inapp_body": "Glad you are here"}}})),
    )
    .await?;
    let send = |key: &str, channels: serde_json::Value| {
        json!({"idempotency_key": key, "recipients": {"user_ids": ["alice"]}, "template_id": "welcome",
               "category": "transactional", "channels": channels})
    };
    s.call("POST", "/v1/notifications", Some(send("c-1", json!(["email", "inapp"])))).await?;
    // A second email that dies: the provider fails until after the dead letter is shown.
    s.eventually(Duration::from_secs(90), "the first email", || async {
        Ok((!s.sends_all().await?.is_empty()).then_some(()))
    })
    .await?;
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "fail_5xx"}))).await?;
    s.call("PUT", "/v1/users/alice", Some(json!({"email": "alice@example.com", "phone": "+14155550100"}))).await?;
    s.call("POST", "/v1/notifications", Some(send("c-2", json!(["sms"])))).await?;
    s.eventually(Duration::from_secs(90), "a dead letter on sms-high", || async {
        let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
        Ok(v["queues"].as_array().unwrap().iter().any(|q| q["name"] == "sms-high" && q["dlq_depth"] == 1).then_some(()))
    })
    .await?;
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "ok"}))).await?;

    let out = tokio::process::Command::new(python())
        .arg(format!("{}/console/drive.py", env!("CARGO_MANIFEST_DIR")))
        .arg(&s.base)
        .arg(&s.ops_key)
        .arg(&s.key)
        .arg("sms-high")
        .output()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run the browser driver ({e}); run `make test`, which installs chromium and selenium"
            )
        })?;
    assert!(
        out.status.success(),
        "console check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The redrive clicked in the browser delivered the dead SMS, once.
    let sms = s
        .eventually(Duration::from_secs(90), "the redriven sms", || async {
            let sends = s.sends_all().await?;
            let sms: Vec<_> = sends.into_iter().filter(|x| x["channel"] == "sms").collect();
            Ok((!sms.is_empty()).then_some(sms))
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sms.len(), 1);
    Ok(())
}
