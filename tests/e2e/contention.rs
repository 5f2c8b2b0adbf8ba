//! Hot items under concurrent requests. On the AWS backend DynamoDB comes from DynamoDB Local
//! behind `infra/dynamodb_conflicts.py`, which refuses a write of an item another request holds
//! at that moment, as DynamoDB does (a transaction conflict): what the code meets in production
//! when many requests write one item inside transactions.

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);
const ACCEPTS: usize = 50;

/// Every OTP accept of a template counts in that template's verification hour, in the accept's
/// transaction: 50 at once on one template must each be accepted (202), none answered 5xx, and
/// each counted once; their 50 verifications likewise.
pub async fn concurrent_otp_accepts_on_one_template_are_all_accepted(backend: Backend) -> anyhow::Result<()> {
    let server = Server::start(backend, Options::default()).await?;
    let s = &server;
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/otp",
            Some(json!({"default_locale": "en", "locales": {"en": {
                "email_subject": "Your code", "email_body": "Your code is {{ code }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let users = (0..ACCEPTS).map(|i| async move {
        let body = json!({"email": format!("otp{i}@example.com")});
        s.call("PUT", &format!("/v1/users/otp{i:02}"), Some(body)).await
    });
    for r in join_all(users).await {
        let (st, v) = r?;
        assert_eq!(st, 200, "{v}");
    }

    let accepts = (0..ACCEPTS).map(|i| {
        let body = json!({
            "idempotency_key": format!("otp-{i}"),
            "recipients": {"user_ids": [format!("otp{i:02}")]},
            "template_id": "otp",
            "params": {"code": format!("{:06}", 100_000 + i)},
            "category": "transactional",
            "channels": ["email"],
            "requester": {"ip": format!("198.51.100.{}", i + 1), "device_id": format!("device-{i}")},
        });
        async move { s.call("POST", "/v1/notifications", Some(body)).await }
    });
    let answers: Vec<(u16, Value)> = join_all(accepts).await.into_iter().collect::<Result<_, _>>()?;
    let refused: Vec<&(u16, Value)> = answers.iter().filter(|(st, _)| *st != 202).collect();
    assert!(refused.is_empty(), "{} of {ACCEPTS} concurrent accepts were not 202: {refused:?}", refused.len());
    let ids: Vec<String> =
        answers.iter().map(|(_, v)| v["notification_id"].as_str().unwrap_or_default().to_owned()).collect();

    let (st, v) = s.call("GET", "/v1/ops/verification?template_id=otp&hours=2", None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["accepted"], json!(ACCEPTS), "each accept counted once: {v}");

    // Every code is sent, once.
    let sends = s
        .eventually(WAIT, "a send of every code", || async {
            let sends = s.sends_all().await?;
            let of_otp = sends.iter().filter(|x| ids.iter().any(|id| x["notification_id"] == id.as_str())).count();
            Ok((of_otp >= ACCEPTS).then_some(of_otp))
        })
        .await?;
    assert_eq!(sends, ACCEPTS, "each code sent exactly once");

    // Their verifications count in the same hour, concurrently too.
    let verifications =
        ids.iter().map(|id| async move { s.call("POST", &format!("/v1/notifications/{id}/verified"), None).await });
    let answers: Vec<(u16, Value)> = join_all(verifications).await.into_iter().collect::<Result<_, _>>()?;
    let refused: Vec<&(u16, Value)> = answers.iter().filter(|(st, _)| *st != 200).collect();
    assert!(refused.is_empty(), "{} of {ACCEPTS} concurrent verifications were not 200: {refused:?}", refused.len());
    let (_, v) = s.call("GET", "/v1/ops/verification?template_id=otp&hours=2", None).await?;
    assert_eq!((&v["accepted"], &v["verified"]), (&json!(ACCEPTS), &json!(ACCEPTS)), "{v}");
    Ok(())
}

/// The abuse guard's counters are hot by design: every OTP from one IP updates that IP's counter
/// in its accept transaction, every SMS to one number that number's counter in the delivery's
/// transaction. Concurrent requests meet there and are retried; the conditions still decide:
/// exactly the limit gets through, the rest are refused cleanly (429, or `number_rate_limited`),
/// none answered 5xx, nothing counted twice.
pub async fn concurrent_otps_against_the_limits_get_exactly_the_limit_through(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_REQUESTER_IP_LIMITS", "3/1h".into()));
    // A day's window: the number's limit is counted as each SMS is planned, which a loaded run
    // spreads over minutes, and a fixed hour's window crossed at the hour let 3 + 2 through.
    opts.env.push(("TIDINGS_SMS_NUMBER_LIMITS", "3/1d".into()));
    let server = Server::start(backend, opts).await?;
    let s = &server;
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/otp",
            Some(json!({"default_locale": "en", "locales": {"en": {
                "sms": "Your code is {{ code }}", "email_subject": "Your code", "email_body": "Your code is {{ code }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    const N: usize = 16;
    let users = (0..N).map(|i| async move {
        // One phone number for all of them; an address each.
        let body = json!({"phone": "+14155550123", "email": format!("lim{i}@example.com")});
        s.call("PUT", &format!("/v1/users/lim{i:02}"), Some(body)).await
    });
    for r in join_all(users).await {
        let (st, v) = r?;
        assert_eq!(st, 200, "{v}");
    }
    let otp = |i: usize, ip: String, channel: &str| {
        json!({
            "idempotency_key": format!("lim-{channel}-{i}"),
            "recipients": {"user_ids": [format!("lim{i:02}")]},
            "template_id": "otp",
            "params": {"code": format!("{:06}", 200_000 + i)},
            "category": "transactional",
            "channels": [channel],
            "requester": {"ip": ip},
        })
    };

    // N at once from one IP against its limit of 3.
    let from_one_ip = (0..N).map(|i| {
        let body = otp(i, "203.0.113.50".into(), "email");
        async move { s.call("POST", "/v1/notifications", Some(body)).await }
    });
    let answers: Vec<(u16, Value)> = join_all(from_one_ip).await.into_iter().collect::<Result<_, _>>()?;
    let accepted = answers.iter().filter(|(st, _)| *st == 202).count();
    let limited = answers.iter().filter(|(st, v)| *st == 429 && v["field"] == "requester.ip").count();
    assert_eq!((accepted, limited), (3, N - 3), "exactly the limit accepted, the rest 429: {answers:?}");

    // N at once to one number (each from its own IP) against its limit of 3.
    let to_one_number = (0..N).map(|i| {
        let body = otp(i, format!("198.51.100.{}", i + 1), "sms");
        async move { s.call("POST", "/v1/notifications", Some(body)).await }
    });
    let answers: Vec<(u16, Value)> = join_all(to_one_number).await.into_iter().collect::<Result<_, _>>()?;
    let refused: Vec<&(u16, Value)> = answers.iter().filter(|(st, _)| *st != 202).collect();
    assert!(refused.is_empty(), "every SMS OTP accepted (the number's limit is applied later): {refused:?}");
    let ids: Vec<String> =
        answers.iter().map(|(_, v)| v["notification_id"].as_str().unwrap_or_default().to_owned()).collect();
    let statuses = s
        .eventually(WAIT, "every SMS delivery settled", || async {
            let mut out = Vec::new();
            for id in &ids {
                let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
                assert_eq!(st, 200, "{v}");
                match v["items"].as_array().and_then(|d| d.first()) {
                    Some(d) if d["status"] == "sent" || d["status"] == "suppressed" => {
                        out.push((d["status"].clone(), d["reason"].clone()))
                    }
                    _ => return Ok(None),
                }
            }
            Ok(Some(out))
        })
        .await?;
    let sent = statuses.iter().filter(|(st, _)| st == "sent").count();
    let limited = statuses.iter().filter(|(st, r)| st == "suppressed" && r == "number_rate_limited").count();
    assert_eq!((sent, limited), (3, N - 3), "{statuses:?}");
    let provider = s.sends_all().await?.iter().filter(|x| x["channel"] == "sms").count();
    assert_eq!(provider, 3, "the provider saw exactly the limit");
    Ok(())
}
