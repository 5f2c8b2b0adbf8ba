//! The operating figures (docs/operators.md, "Operating figures"): a backlog builds behind a slow,
//! throttling email provider and drains when it recovers; `GET /v1/ops/metrics` shows the
//! oldest pending message growing older and falling back, and every figure with a plausible
//! value; `GET /metrics` gives the same to a Prometheus scrape, to an operator only.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);
/// Transactional emails, each its own notification: one at a time per worker of `email-high`.
const SENDS: usize = 16;
/// The provider's answer time while the backlog builds.
const SLOW_MS: u64 = 1500;
/// The first sends answered 429.
const THROTTLED: u32 = 3;

async fn metrics(s: &Server) -> anyhow::Result<Value> {
    let (st, m) = s.ops("GET", "/v1/ops/metrics", None).await?;
    anyhow::ensure!(st == 200, "{st} {m}");
    Ok(m)
}

/// Messages of `email-high` not yet done (visible, in flight or waiting for a retry).
async fn backlog(s: &Server) -> anyhow::Result<u64> {
    let (st, v) = s.ops("GET", "/v1/ops/queues", None).await?;
    anyhow::ensure!(st == 200, "{st} {v}");
    let q =
        v["queues"].as_array().into_iter().flatten().find(|q| q["name"] == "email-high").cloned().unwrap_or_default();
    Ok(["visible", "in_flight", "delayed"].iter().map(|f| q[f].as_u64().unwrap_or(0)).sum())
}

fn ratio_in_unit(m: &Value, figure: &str, channel: &str) {
    let r = m[figure][channel].as_f64().unwrap_or(-1.0);
    assert!((0.0..=1.0).contains(&r), "{figure}.{channel} = {r}: {m}");
}

pub async fn a_backlog_shows_its_oldest_age_growing_then_falling_and_every_figure(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let (st, v) = s.call("PUT", "/v1/users/f1", Some(json!({"email": "figures@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/receipt",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "Receipt {{ n }}", "email_body": "Thanks, order {{ n }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s
        .call(
            "PUT",
            "/dev/providers/email",
            Some(json!({"mode": "throttle_429", "fail_first_n": THROTTLED, "delay_ms": SLOW_MS})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");

    let mut ids = Vec::new();
    for n in 0..SENDS {
        let body = json!({"idempotency_key": format!("fig-{n}"), "recipients": {"user_ids": ["f1"]}, "template_id": "receipt",
            "params": {"n": n}, "category": "transactional", "channels": ["email"]});
        let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
        assert_eq!(st, 202, "{v}");
        ids.push(v["notification_id"].as_str().unwrap_or_default().to_owned());
    }

    // The backlog builds: the oldest pending message grows older between two reads.
    let started = Instant::now();
    let first = s
        .eventually(WAIT, "a backlog with an oldest message of 2 s or more", || async {
            let m = metrics(&s).await?;
            let age = m["oldest_age_s"]["email-high"].as_f64().unwrap_or(0.0);
            let pending = backlog(&s).await?;
            Ok(match backend {
                Backend::Embedded => (age >= 2.0).then_some((age, pending)),
                // SQS has no age attribute (the dashboard reads CloudWatch's
                // ApproximateAgeOfOldestMessage): here the backlog shows in the depths.
                Backend::Aws => (pending >= 4).then_some((age, pending)),
            })
        })
        .await?;
    let grown = s
        .eventually(WAIT, "the oldest message older still, the backlog not drained", || async {
            let m = metrics(&s).await?;
            let age = m["oldest_age_s"]["email-high"].as_f64().unwrap_or(0.0);
            let pending = backlog(&s).await?;
            anyhow::ensure!(
                pending > 0,
                "drained before the age was seen growing ({first:?}, {:?})",
                started.elapsed()
            );
            Ok(match backend {
                Backend::Embedded => (age >= first.0 + 2.0).then_some(age),
                Backend::Aws => Some(age),
            })
        })
        .await?;
    assert!(grown >= first.0, "{grown} < {first:?}");
    let (st, busy) = s.ops("GET", "/v1/ops/metrics", None).await?;
    assert_eq!(st, 200);
    let in_use = busy["worker_concurrency"]["email-high"].as_f64().unwrap_or(-1.0);
    assert!((0.0..=16.0).contains(&in_use), "worker concurrency {in_use}: {busy}");

    // Every throttled answer has been given before the provider recovers: on SQS the backlog
    // shows at once, and with sends answered after 1.5 s the workers may not yet have reached
    // the third 429 (recovery resets the fault count).
    s.eventually(WAIT, "every 429 answered and retried", || async {
        let m = metrics(&s).await?;
        Ok((m["retries"].as_u64().unwrap_or(0) >= u64::from(THROTTLED)).then_some(()))
    })
    .await?;

    // The provider recovers: the backlog drains and the age falls back to 0.
    let (st, v) = s.call("PUT", "/dev/providers/email", Some(json!({"mode": "ok"}))).await?;
    assert_eq!(st, 200, "{v}");
    s.eventually(WAIT, "every send made", || async {
        let sends = s.sends_all().await?;
        Ok(ids.iter().all(|id| sends.iter().any(|x| x["notification_id"] == id.as_str())).then_some(()))
    })
    .await?;
    let m = s
        .eventually(WAIT, "the backlog drained, its oldest age back to 0", || async {
            let m = metrics(&s).await?;
            let age = m["oldest_age_s"]["email-high"].as_f64().unwrap_or(-1.0);
            Ok((age == 0.0 && backlog(&s).await? == 0).then_some(m))
        })
        .await?;

    // Every figure, with a plausible value.
    assert!(m["sends_total"]["email"].as_u64().unwrap_or(0) >= SENDS as u64, "{m}");
    assert!(m["sends_per_s"]["email"].as_f64().is_some_and(|r| r >= 0.0), "{m}");
    for figure in ["throttled_ratio", "retry_ratio", "dead_letter_ratio"] {
        ratio_in_unit(&m, figure, "email");
    }
    assert!(m["throttled_ratio"]["email"].as_f64().unwrap_or(0.0) > 0.0, "the provider answered 429: {m}");
    assert!(m["retry_ratio"]["email"].as_f64().unwrap_or(0.0) > 0.0, "the 429s were retried: {m}");
    assert!(m["retries"].as_u64().unwrap_or(0) >= u64::from(THROTTLED), "{m}");
    let latency = &m["latency_ms"]["email"]["high"];
    let (p50, p99) = (latency["p50_ms"].as_f64().unwrap_or(0.0), latency["p99_ms"].as_f64().unwrap_or(0.0));
    assert!(latency["count"].as_u64().unwrap_or(0) >= SENDS as u64, "{m}");
    assert!(p50 > 0.0 && p99 >= p50 && latency["max_ms"].as_f64().unwrap_or(0.0) >= p99, "{latency}");
    // The backlog made most of them wait behind a provider answering in 1.5 s.
    assert!(p99 >= SLOW_MS as f64, "{latency}");
    assert!(m["worker_concurrency"]["email-high"].as_f64().is_some(), "{m}");
    assert!(
        m["oldest_age_s"].as_object().is_some_and(|q| q.contains_key("email-low") && q.contains_key("requests-high")),
        "{m}"
    );

    // The same for a Prometheus scrape, an operator's only.
    let (st, ct, text) = s.raw("GET", "/metrics", "", Some(&s.ops_key)).await?;
    assert_eq!(st, 200, "{text}");
    assert!(ct.starts_with("text/plain"), "{ct}");
    for needle in [
        "tidings_provider_calls{",
        "result=\"throttled\"",
        "tidings_retries{channel=\"email\"}",
        "tidings_delivery_latency_ms{channel=\"email\",priority=\"high\",quantile=\"0.99\"}",
        "tidings_worker_busy_ms{queue=\"email-high\"}",
        "tidings_workers_busy{queue=\"email-high\"}",
    ] {
        assert!(text.contains(needle), "{needle} not in:\n{text}");
    }
    let (st, _, body) = s.raw("GET", "/metrics", "", Some(&s.key)).await?;
    assert_eq!(st, 403, "a tenant's key: {body}");
    let (st, _, body) = s.raw("GET", "/metrics", "", None).await?;
    assert_eq!(st, 401, "no key: {body}");
    Ok(())
}
