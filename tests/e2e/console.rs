//! The operator console at `/`, driven in headless Chromium (Debian's `chromium` and
//! `chromium-driver`, through selenium in the emulator's virtualenv: `make test` installs them).
//! `tests/console/drive.py` opens it as `tidings serve`'s link does and goes through each view;
//! this test prepares what the views show and checks, after, what the clicks did.

use std::time::Duration;

use serde_json::json;

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);

/// The Python of the virtualenv `make test` prepares (selenium installed).
fn python() -> String {
    std::env::var("TIDINGS_TEST_PYTHON")
        .unwrap_or_else(|_| format!("{}/../infra/.venv/bin/python", env!("CARGO_MANIFEST_DIR")))
}

async fn emails_to(s: &Server, user: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(s.sends_all().await?.into_iter().filter(|x| x["channel"] == "email" && x["user_id"] == user).collect())
}

pub async fn console_shows_the_system_and_redrives(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    // A failed send is dead at once; restock alerts give up after three quick retries.
    opts.env.push(("TIDINGS_MAX_RECEIVES", "1".into()));
    opts.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "500".into()));
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    opts.env.push(("TIDINGS_RESTOCK_RETRY_DELAYS_MS", "500,500,500".into()));
    // One worker per low queue: with the provider slowed, the campaign drains over seconds.
    opts.env.push(("TIDINGS_WORKERS_LOW", "1".into()));
    // The watched campaign ends `completed`: none of its sends may time out on a loaded run.
    opts.patient_provider(backend);
    let s = Server::start(backend, opts).await?;
    s.call("PUT", "/v1/users/alice", Some(json!({"email": "alice@example.com"}))).await?;
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/welcome",
            Some(json!({"default_locale": "en", "locales": {"en": {
                "email_subject": "Welcome", "email_body": "Hello", "sms": "Hello",
                "inapp_title": "Welcome aboard", "inapp_body": "Glad you are here"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/promo",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "Sale", "email_body": "Hi {{ user_id }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    // The campaign's segment (drive.py starts the campaign, to see its bar move).
    let members = 60;
    for i in 0..members {
        let body = json!({"email": format!("m{i}@example.com"), "tags": ["vip"]});
        let (st, v) = s.call("PUT", &format!("/v1/users/m{i:03}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    let send = |key: &str, channels: serde_json::Value| {
        json!({"idempotency_key": key, "recipients": {"user_ids": ["alice"]}, "template_id": "welcome",
               "category": "transactional", "channels": channels})
    };
    s.call("POST", "/v1/notifications", Some(send("c-1", json!(["email", "inapp"])))).await?;
    s.eventually(Duration::from_secs(90), "the first email", || async {
        Ok((!emails_to(&s, "alice").await?.is_empty()).then_some(()))
    })
    .await?;
    // An SMS that dies beside an email that goes: the provider fails until after the dead letter
    // is shown, and the notification reads `completed_with_failures` (amber in the console).
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "fail_5xx"}))).await?;
    s.call("PUT", "/v1/users/alice", Some(json!({"email": "alice@example.com", "phone": "+14155550100"}))).await?;
    let (_, v) = s.call("POST", "/v1/notifications", Some(send("c-2", json!(["email", "sms"])))).await?;
    let partial = v["notification_id"].as_str().unwrap_or_default().to_owned();
    s.eventually(Duration::from_secs(90), "a dead letter on sms-high", || async {
        let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
        Ok(v["queues"].as_array().unwrap().iter().any(|q| q["name"] == "sms-high" && q["dlq_depth"] == 1).then_some(()))
    })
    .await?;
    // An SMS refused for good, alone: `failed` (red).
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "permanent"}))).await?;
    let (_, v) = s.call("POST", "/v1/notifications", Some(send("c-3", json!(["sms"])))).await?;
    let failed = v["notification_id"].as_str().unwrap_or_default().to_owned();
    for (id, status) in [(&partial, "completed_with_failures"), (&failed, "failed")] {
        s.eventually(Duration::from_secs(90), status, || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == status).then_some(()))
        })
        .await?;
    }
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "ok"}))).await?;
    // A SKU with a ledger, and a restock alert whose retries run out (MANUAL).
    let (st, v) = s.call("PUT", "/v1/inventory/A", Some(json!({"on_hand": 0}))).await?;
    assert_eq!(st, 201, "{v}");
    // Bob has an email address only (alice's SMS would deliver the alert).
    s.call("PUT", "/v1/users/bob", Some(json!({"email": "bob@example.com"}))).await?;
    let (st, v) = s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": "bob", "sku_id": "A"}))).await?;
    assert_eq!(st, 201, "{v}");
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx"}))).await?;
    let event = json!({"event": "stock.in", "skuId": "A", "qty": 3, "source": "purchase_order", "eventId": "po-A-1"});
    let (st, v) = s.call("POST", "/v1/stock-events", Some(event)).await?;
    assert_eq!(st, 202, "{v}");
    s.eventually(WAIT, "the restock notice to need attention", || async {
        let (_, v) = s.call("GET", "/v1/ops/restock-notices?status=MANUAL", None).await?;
        Ok(v["items"].as_array().is_some_and(|i| !i.is_empty()).then_some(()))
    })
    .await?;
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "ok"}))).await?;
    let emails_before = emails_to(&s, "bob").await?.len();

    let backend_name = format!("{backend:?}").to_lowercase();
    let shots = format!("{}/../target/console-screenshots/{backend_name}", env!("CARGO_MANIFEST_DIR"));
    let out = tokio::process::Command::new(python())
        .arg(format!("{}/console/drive.py", env!("CARGO_MANIFEST_DIR")))
        .args([&s.base, &s.ops_key, &s.key, "sms-high", "vip", &shots])
        .args([format!("completed_with_failures={partial}"), format!("failed={failed}")])
        .output()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run the browser driver ({e}); run `make test`, which installs chromium and selenium"
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "console check failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    println!("{stdout}");
    println!("console screenshots: {shots}");
    for view in ["notifications", "outcomes", "rates", "dead-letters", "user", "stock", "restock"] {
        let png = std::fs::read(format!("{shots}/{view}.png"))?;
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{view}.png: {} bytes", png.len());
    }

    // The redrive clicked in the browser delivered the dead SMS, once.
    let sms = s
        .eventually(WAIT, "the redriven sms", || async {
            let sends = s.sends_all().await?;
            let sms: Vec<_> = sends.into_iter().filter(|x| x["channel"] == "sms").collect();
            Ok((!sms.is_empty()).then_some(sms))
        })
        .await?;
    // The resend clicked in the browser sent bob his restock alert.
    s.eventually(WAIT, "the resent restock alert", || async {
        Ok((emails_to(&s, "bob").await?.len() > emails_before).then_some(()))
    })
    .await?;
    // The campaign whose bar the browser watched reached each member once.
    let campaign = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("campaign "))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .unwrap_or_default();
    let (st, v) = s.call("GET", &format!("/v1/notifications/{campaign}"), None).await?;
    assert_eq!((st, v["status"].as_str()), (200, Some("completed")), "{v}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sends = s.sends_all().await?;
    assert_eq!(sends.iter().filter(|x| x["channel"] == "sms").count(), 1, "the redriven sms, once: {sms:?}");
    let to_members = sends.iter().filter(|x| x["notification_id"] == campaign.as_str()).count();
    assert_eq!(to_members, members, "one email per member");
    Ok(())
}
