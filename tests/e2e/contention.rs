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
