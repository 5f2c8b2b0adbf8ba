//! The second SMS provider in the shape that ships: with the template's `SmsPrimary` set to
//! `end-user-messaging`, the channel worker sends SMS through End User Messaging's
//! `SendTextMessage`, from the configured origination identity, under its own policy (the
//! harness's IAM proxy authorizes it and answers it, since moto does not serve it), and SNS is
//! not called. The failover itself, SNS failing and coming back, is `sms_failover.rs` on both
//! backends.

use std::time::Duration;

use serde_json::{Value, json};

use crate::lambda::{Options, Stack};

const WAIT: Duration = Duration::from_secs(180);

async fn ok(s: &Stack, method: &str, path: &str, body: Value) -> anyhow::Result<Value> {
    let (st, v) = s.call(method, path, Some(body)).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}\nrefused: {:?}", s.refused());
    Ok(v)
}

pub async fn end_user_messaging_as_the_primary_through_the_function_binaries() -> anyhow::Result<()> {
    let s = Stack::start(Options {
        parameters: vec![
            ("SmsPrimary".into(), "end-user-messaging".into()),
            ("SmsSecondary".into(), "sns".into()),
            ("SmsOriginationIdentity".into(), "pool-harness".into()),
            ("SmsConfigurationSet".into(), "tidings-harness".into()),
        ],
        ..Options::default()
    })
    .await?;
    ok(&s, "PUT", "/v1/users/u1", json!({"phone": "+14155550123"})).await?;
    let template = json!({"default_locale": "en", "locales": {"en": {"sms": "Your code is {{ code }}"}}});
    ok(&s, "PUT", "/v1/templates/otp", template).await?;
    let body = json!({"idempotency_key": "otp-eum-1", "recipients": {"user_ids": ["u1"]}, "template_id": "otp",
        "params": {"code": "424242"}, "category": "transactional", "channels": ["sms"]});
    let id =
        ok(&s, "POST", "/v1/notifications", body).await?["notification_id"].as_str().unwrap_or_default().to_owned();
    let status = s
        .eventually(WAIT, &format!("{id} completed"), || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == "completed").then_some(v))
        })
        .await?;
    assert_eq!(status["counts"]["sent"], 1, "{status}");
    let sms: Vec<_> = s.sends().into_iter().filter(|c| c.channel == "sms").collect();
    assert_eq!(sms.len(), 1, "{sms:?}");
    assert_eq!((sms[0].function.as_str(), sms[0].to.as_str()), ("channel-worker", "+14155550123"));
    assert_eq!(sms[0].body, "Your code is 424242");
    assert_eq!(sms[0].configuration_set, "tidings-harness");
    let worker = s.requests().get("channel-worker").cloned().unwrap_or_default();
    assert_eq!(worker.get("SmsVoiceV2.SendTextMessage"), Some(&1), "{worker:?}");
    assert_eq!(worker.get("SNS.Publish"), None, "SNS is the secondary only: {worker:?}");
    assert!(s.refused().is_empty(), "{:?}", s.refused());
    Ok(())
}
