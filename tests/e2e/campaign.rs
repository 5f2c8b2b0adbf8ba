//! Campaigns end to end: a segment expanded page by page, progress, the metrics route, and a
//! transactional message that is not held up by a campaign draining at the same time.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(180);

async fn put_promo_template(s: &Server) -> anyhow::Result<()> {
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/promo",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "Sale", "email_body": "Hi {{ user_id }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

/// Sends the promo to a segment, as marketing email; its notification id.
async fn start_campaign(s: &Server, idempotency_key: &str, segment: &str) -> anyhow::Result<String> {
    let (st, v) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(
                json!({"idempotency_key": idempotency_key, "recipients": {"segment": segment}, "template_id": "promo",
                        "category": "marketing", "channels": ["email"]}),
            ),
        )
        .await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap().to_owned())
}

/// The notification's view once it is `completed`.
async fn completed(s: &Server, id: &str, within: Duration) -> anyhow::Result<serde_json::Value> {
    s.eventually(within, "the campaign to complete", || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(v))
    })
    .await
}

pub async fn a_segment_campaign_reaches_each_member_once_and_an_otp_is_not_held_up(
    backend: Backend,
) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_CAMPAIGN_PAGE_SIZE", "25".into()));
    // A page takes longer than the tests' default visibility on the emulator (DynamoDB Local
    // runs a table's writes one at a time): give it room rather than redeliver mid-flight.
    opts.env.retain(|(k, _)| *k != "TIDINGS_VISIBILITY_S");
    opts.env.push(("TIDINGS_VISIBILITY_S", "30".into()));
    let s = Server::start(backend, opts).await?;
    // Fewer members on the emulator, which runs a table's writes one at a time.
    let members = if backend == Backend::Aws { 40 } else { 120 };
    for i in 0..members {
        let body = json!({"email": format!("m{i}@example.com"), "tags": ["vip", "newsletter"]});
        let (st, v) = s.call("PUT", &format!("/v1/users/m{i:03}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    let (st, _) =
        s.call("PUT", "/v1/users/outsider", Some(json!({"email": "o@example.com", "tags": ["other"]}))).await?;
    assert_eq!(st, 200);
    put_promo_template(&s).await?;
    let campaign = start_campaign(&s, "sale-1", "vip").await?;

    // An OTP while the campaign drains: it has its own queues and worker pool.
    let sent_at = Instant::now();
    let (st, v) = s
        .call(
            "POST",
            "/v1/notifications",
            Some(json!({"idempotency_key": "otp-1", "recipients": {"user_ids": ["outsider"]}, "template_id": "promo",
                        "category": "transactional", "channels": ["email"]})),
        )
        .await?;
    assert_eq!(st, 202, "{v}");
    let otp = v["notification_id"].as_str().unwrap().to_owned();
    s.eventually(WAIT, "the otp", || async { Ok((!s.sends(&otp).await?.is_empty()).then_some(())) }).await?;
    let otp_latency = sent_at.elapsed();

    let view = completed(&s, &campaign, WAIT).await?;
    // It did not wait for the campaign: sent before the campaign's last send (an order, not a
    // duration, so a loaded machine does not fail it; the time is printed for a reader).
    let at = |v: &Value| v["at"].as_str().unwrap_or_default().to_owned();
    let otp_at = at(&s.sends(&otp).await?[0]);
    let last_campaign_at = s.sends(&campaign).await?.iter().map(at).max().unwrap_or_default();
    eprintln!(
        "otp sent {otp_latency:?} after it was posted; at {otp_at}, the campaign's last send at {last_campaign_at}"
    );
    assert!(otp_at < last_campaign_at, "the otp waited for the campaign: {otp_at} after {last_campaign_at}");
    assert_eq!(view["counts"]["sent"], members, "{view}");
    assert_eq!(view["counts"]["queued"], 0, "{view}");
    assert_eq!(view["expanded"], members, "{view}");
    assert_eq!(view["segment"], "vip", "{view}");
    let sends = s.sends(&campaign).await?;
    assert_eq!(sends.len(), members, "one send per member");
    let users: HashSet<_> = sends.iter().map(|s| s["user_id"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(users.len(), members);
    assert!(!users.contains("outsider"));

    let (st, m) = s.ops("GET", "/v1/ops/metrics", None).await?;
    assert_eq!(st, 200, "{m}");
    assert!(m["sends_total"]["email"].as_u64().unwrap_or(0) > members as u64, "{m}");
    assert!(m["oldest_age_s"].is_object(), "{m}");
    Ok(())
}
