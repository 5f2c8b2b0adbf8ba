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

/// A neighbour's bulk that asks for the high lane is queued first: transactional notifications
/// to 20 users each and a segment, all asking `high`, from tenant acme, whose sends are held to
/// a tenant rate so that its backlog stays. Then globex's OTP and acme's own OTP: both are sent
/// while most of that backlog still waits (docs/delivery.md, "Fair lanes"). An order of the
/// sends' times, not a duration, so a loaded machine does not fail it.
pub async fn a_neighbours_bulk_asking_high_does_not_hold_the_otps(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    let acme_rate = if backend == Backend::Aws { 10 } else { 40 };
    opts.env.retain(|(k, _)| !matches!(*k, "TIDINGS_API_RATES" | "TIDINGS_VISIBILITY_S" | "TIDINGS_TENANT_RATES"));
    opts.env.push(("TIDINGS_API_RATES", "off".into()));
    opts.env.push(("TIDINGS_VISIBILITY_S", "30".into()));
    opts.env.push(("TIDINGS_TENANT_RATES", format!("default:1000,acme:{acme_rate}")));
    let s = Server::start(backend, opts).await?;
    let globex = s.other_tenant_key();
    let members = if backend == Backend::Aws { 60 } else { 400 };
    let users: Vec<Value> = (0..members)
        .map(|i| json!({"user_id": format!("b{i:03}"), "email": format!("b{i}@example.com"), "tags": ["all"]}))
        .chain([json!({"user_id": "own", "email": "own@example.com"})])
        .collect();
    let (st, v) = s.call("POST", "/v1/users/batch", Some(json!({"users": users}))).await?;
    assert_eq!((st, &v["errors"]), (200, &json!([])), "{v}");
    let template =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "Code {{ code }}"}}});
    for key in [&s.key, &globex] {
        let (st, v) = s.call_as(key, "PUT", "/v1/templates/otp", Some(template.clone())).await?;
        assert_eq!(st, 200, "{v}");
    }
    let (st, v) = s.call_as(&globex, "PUT", "/v1/users/shopper", Some(json!({"email": "s@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");

    let send = |key: &str, body: Value| {
        let (s, key) = (&s, key.to_owned());
        async move {
            let (st, v) = s.call_as(&key, "POST", "/v1/notifications", Some(body)).await?;
            assert_eq!(st, 202, "{v}");
            anyhow::Ok(v)
        }
    };
    let mut bulk = HashSet::new();
    for chunk in 0..members / 20 {
        let ids: Vec<String> = (chunk * 20..chunk * 20 + 20).map(|i| format!("b{i:03}")).collect();
        let v = send(
            &s.key,
            json!({"idempotency_key": format!("bulk-{chunk}"), "recipients": {"user_ids": ids},
            "template_id": "otp", "params": {"code": "0"}, "category": "transactional", "channels": ["email"],
            "priority": "high"}),
        )
        .await?;
        assert_eq!((&v["priority"], &v["priority_lowered"]), (&json!("normal"), &json!("too_many_recipients")), "{v}");
        bulk.insert(v["notification_id"].as_str().unwrap_or_default().to_owned());
    }
    let v = send(&s.key, json!({"idempotency_key": "bulk-segment", "recipients": {"segment": "all"},
        "template_id": "otp", "params": {"code": "0"}, "category": "marketing", "channels": ["email"], "priority": "high"}))
    .await?;
    assert_eq!(v["priority"], "normal", "{v}");
    bulk.insert(v["notification_id"].as_str().unwrap_or_default().to_owned());

    let otp = |user: &str| {
        json!({"idempotency_key": format!("otp-{user}"), "recipients": {"user_ids": [user]},
        "template_id": "otp", "params": {"code": "123456"}, "category": "transactional", "channels": ["email"]})
    };
    let theirs = send(&globex, otp("shopper")).await?;
    let own = send(&s.key, otp("own")).await?;
    assert_eq!((&theirs["priority"], &own["priority"]), (&json!("high"), &json!("high")));
    let otps: Vec<String> =
        [theirs, own].iter().map(|v| v["notification_id"].as_str().unwrap_or_default().to_owned()).collect();
    let at = |v: &Value| v["at"].as_str().unwrap_or_default().to_owned();
    let otp_times = s
        .eventually(WAIT, "both otps sent", || async {
            let mut times = Vec::new();
            for id in &otps {
                match s.sends(id).await?.first() {
                    Some(send) => times.push(at(send)),
                    None => return Ok(None),
                }
            }
            Ok(Some(times))
        })
        .await?;
    let last_otp = otp_times.iter().max().cloned().unwrap_or_default();
    // The whole bulk is sent in the end, each once; at the later OTP, most of it still waited.
    let total = members * 2;
    let sends = s
        .eventually(WAIT * 2, "the bulk sent", || async {
            let all: Vec<Value> = s
                .sends_all()
                .await?
                .into_iter()
                .filter(|v| bulk.contains(v["notification_id"].as_str().unwrap_or_default()))
                .collect();
            Ok((all.len() >= total).then_some(all))
        })
        .await?;
    assert_eq!(sends.len(), total, "each bulk send once");
    let before = sends.iter().filter(|v| at(v) < last_otp).count();
    eprintln!("otps sent at {otp_times:?}; {before} of the bulk's {total} sends before the later one");
    assert!(before * 2 < total, "{before} of {total} bulk sends went before the otps");
    Ok(())
}
