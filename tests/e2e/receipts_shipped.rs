//! Receipts through the function binaries (`lambda/`): opens and clicks under an API whose
//! environments are never thawed once they answer (as Lambda may leave them), and SES's events
//! through the template's configuration set, topic and https subscription to
//! `/v1/callbacks/ses`, with another topic's signed messages refused.

use std::time::Duration;

use serde_json::{Value, json};

use crate::lambda::proxy::ProviderCall;
use crate::lambda::{Options, Published, Stack, sns, template};

const WAIT: Duration = Duration::from_secs(180);

async fn ok(s: &Stack, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let (st, v) = s.call(method, path, body).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}\nrefused: {:?}", s.refused());
    Ok(v)
}

/// A template with a tracked link, and users `u{i}` at the given addresses.
async fn shop(s: &Stack, addresses: &[&str]) -> anyhow::Result<()> {
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "News {{ n }}",
        "email_body": "<p>Hello <a href=\"https://shop.example/new?n={{ n }}\">new</a></p>"}}});
    ok(s, "PUT", "/v1/templates/news", Some(template)).await?;
    ok(s, "PUT", "/v1/settings/link-hosts", Some(json!({"hosts": ["shop.example"]}))).await?;
    for (i, a) in addresses.iter().enumerate() {
        ok(s, "PUT", &format!("/v1/users/u{i}"), Some(json!({"email": a}))).await?;
    }
    Ok(())
}

/// Mails `users` (transactional) and waits for every delivery to settle; its deliveries.
async fn mail(s: &Stack, key: &str, users: &[&str]) -> anyhow::Result<(String, Vec<Value>)> {
    let body = json!({"idempotency_key": key, "recipients": {"user_ids": users}, "template_id": "news",
        "params": {"n": 1}, "category": "transactional", "channels": ["email"]});
    let id = ok(s, "POST", "/v1/notifications", Some(body)).await?["notification_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    s.eventually(WAIT, &format!("{id} completed"), || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(()))
    })
    .await?;
    Ok((id.clone(), deliveries(s, &id).await?))
}

async fn deliveries(s: &Stack, id: &str) -> anyhow::Result<Vec<Value>> {
    Ok(ok(s, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn of<'a>(d: &'a [Value], user: &str) -> &'a Value {
    d.iter().find(|x| x["user_id"] == user).unwrap_or(&Value::Null)
}

/// The mail SES accepted for `to` last.
fn sent_to(s: &Stack, to: &str) -> anyhow::Result<ProviderCall> {
    s.sends()
        .into_iter()
        .rev()
        .find(|m| m.channel == "email" && m.to == to)
        .ok_or_else(|| anyhow::anyhow!("no mail to {to}"))
}

/// The path of the first `/t/{kind}/…` link in a mail body.
fn link(body: &str, kind: &str) -> anyhow::Result<String> {
    let marker = format!("/t/{kind}/");
    let tail = body.split(&marker).nth(1).ok_or_else(|| anyhow::anyhow!("no {marker} in {body}"))?;
    Ok(format!("{marker}{}", tail.split('"').next().unwrap_or_default()))
}

/// Every open and click answered by an environment of the `public-api` function (API Gateway's
/// routes for `/t/...`) that is stopped as soon as it answers is recorded: the route queued it
/// before answering, and the timers' function applied it.
pub async fn opens_and_clicks_under_environments_frozen_after_answering_are_all_recorded() -> anyhow::Result<()> {
    let s = Stack::start(Options { never_thawed: vec!["api", "public-api"], ..Options::default() }).await?;
    let readers = ["r0@example.com", "r1@example.com", "r2@example.com", "r3@example.com"];
    shop(&s, &readers).await?;
    let users = ["u0", "u1", "u2", "u3"];
    let (id, d) = mail(&s, "news-1", &users).await?;
    assert!(d.iter().all(|x| x["status"] == "sent"), "{d:?}");
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    // Everyone opens; u0 and u1 click too (u1 twice), u2 only clicks (a client that blocks images).
    for (i, to) in readers.iter().enumerate() {
        let body = sent_to(&s, to)?.body;
        if i != 2 {
            let res = s.http.get(format!("{}{}", s.api, link(&body, "o")?)).send().await?;
            assert_eq!(res.status(), 200, "{to}: the pixel");
            assert_eq!(res.headers()["content-type"], "image/gif");
        }
        let clicks = match i {
            0 | 2 => 1,
            1 => 2,
            _ => 0,
        };
        for _ in 0..clicks {
            let res = no_redirect.get(format!("{}{}", s.api, link(&body, "c")?)).send().await?;
            assert_eq!(res.status(), 302, "{to}: the redirect");
            assert_eq!(res.headers()["location"], "https://shop.example/new?n=1");
        }
    }
    let want = [("u0", "clicked"), ("u1", "clicked"), ("u2", "clicked"), ("u3", "opened")];
    s.eventually(WAIT, "every open and click recorded", || async {
        let d = deliveries(&s, &id).await?;
        Ok(want.iter().all(|(u, st)| of(&d, u)["status"] == *st).then_some(()))
    })
    .await?;
    let view = ok(&s, "GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(view["counts"]["delivered"], 4, "each counted once: {view}");
    // Every environment of the public routes answered the 3 opens and 4 clicks and was stopped
    // once it answered: no answer left work behind it.
    let public = s.stats()["public-api"].clone();
    assert!(public.invocations >= 7, "the opens and clicks went to the public-api function: {public:?}");
    assert!(public.cold_starts as u64 >= public.invocations, "the public-api was thawed: {public:?}");
    assert!(s.refused().is_empty(), "{:?}", s.refused());
    Ok(())
}

/// SES's events reach `/v1/callbacks/ses` through what the template declares: every send names
/// the configuration set, whose event destination publishes to the topic the API is subscribed
/// to. A delivery is marked delivered, a bounce fails the delivery and suppresses its address,
/// a complaint suppresses its address; the same message again changes nothing. A correctly
/// signed message from another topic (an attacker's, naming a real message id and someone
/// else's address) is refused, and so is a subscription to another topic.
pub async fn ses_events_arrive_through_the_templates_topic_and_another_topics_are_refused() -> anyhow::Result<()> {
    let s = Stack::start(Options::default()).await?;
    shop(&s, &["ok@example.com", "bouncy@example.com", "angry@example.com"]).await?;
    let (id, d) = mail(&s, "news-1", &["u0", "u1", "u2"]).await?;
    assert!(d.iter().all(|x| x["status"] == "sent"), "{d:?}");
    let set = s
        .spec
        .functions
        .iter()
        .find(|f| f.binary == "channel-worker")
        .map(|f| f.env["TIDINGS_SES_CONFIGURATION_SET"].clone());
    let (ok_mail, bouncy, angry) =
        (sent_to(&s, "ok@example.com")?, sent_to(&s, "bouncy@example.com")?, sent_to(&s, "angry@example.com")?);
    // The configuration set publishes every event a shop needs, to a topic the API hears.
    let destinations: Vec<_> =
        s.spec.event_destinations.iter().filter(|d| Some(&d.configuration_set) == set.as_ref() && d.enabled).collect();
    assert_eq!(destinations.len(), 1, "{:?}", s.spec.event_destinations);
    for t in ["send", "delivery", "bounce", "complaint", "reject", "open", "click"] {
        assert!(destinations[0].event_types.iter().any(|x| x == t), "{t}: {:?}", destinations[0]);
    }
    for (m, u) in [(&ok_mail, "u0"), (&bouncy, "u1"), (&angry, "u2")] {
        assert_eq!(Some(&m.configuration_set), set.as_ref(), "SendEmail names the template's configuration set");
        assert_eq!(of(&d, u)["provider_message_id"].as_str(), Some(m.message_id.as_str()), "{d:?}");
    }
    let applied = |published: Vec<Published>| -> anyhow::Result<(Value, Value)> {
        anyhow::ensure!(published.len() == 1, "one event destination publishes it: {published:?}");
        let (envelope, delivered) = published.into_iter().next().unwrap_or_default();
        anyhow::ensure!(delivered.len() == 1, "one subscription delivers it: {delivered:?}");
        let (endpoint, st, body) = &delivered[0];
        anyhow::ensure!(endpoint.ends_with("/v1/callbacks/ses") && *st == 200, "{endpoint}: {st} {body}");
        Ok((envelope, serde_json::from_str(body)?))
    };

    // The attack, before any genuine event: signed by SNS, from a topic that is not the stack's.
    let attacker = "arn:aws:sns:us-east-1:666666666666:not-the-shop";
    let forged = json!({"eventType": "Complaint", "mail": {"messageId": ok_mail.message_id, "destination": ["angry@example.com"]},
        "complaint": {"complainedRecipients": [{"emailAddress": "ok@example.com"}, {"emailAddress": "angry@example.com"}]}});
    for envelope in [sns::notification(attacker, &forged), sns::subscription_confirmation(attacker)] {
        let (st, body) = s.raw("POST", "/v1/callbacks/ses", &envelope.to_string(), "text/plain; charset=UTF-8").await?;
        assert_eq!(st, 403, "{body}");
        assert!(body.contains("topic_not_allowed"), "{body}");
    }

    let (_, out) = applied(
        s.ses_event(&ok_mail, "Delivery", json!({"recipients": ["ok@example.com"], "smtpResponse": "250 ok"})).await?,
    )?;
    assert_eq!(out["matched"], true, "{out}");
    let bounce = json!({"bounceType": "Permanent", "bounceSubType": "General",
        "bouncedRecipients": [{"emailAddress": "bouncy@example.com"}, {"emailAddress": "ok@example.com"}]});
    let (bounced, out) = applied(s.ses_event(&bouncy, "Bounce", bounce).await?)?;
    assert_eq!(out["suppressed"], 1, "only the address the mail went to: {out}");
    let (_, out) = applied(
        s.ses_event(&angry, "Complaint", json!({"complainedRecipients": [{"emailAddress": "angry@example.com"}]}))
            .await?,
    )?;
    assert_eq!(out["suppressed"], 1, "{out}");
    // The bounce's notification once more (SNS retries, or someone replays it): ignored.
    let again = s.deliver(&bounced).await?;
    assert_eq!(again.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&again[0].2)?, json!({"ignored": "replayed"}), "{again:?}");

    let d = deliveries(&s, &id).await?;
    assert_eq!(of(&d, "u0")["status"], "delivered", "{d:?}");
    assert_eq!(of(&d, "u1")["status"], "failed", "{d:?}");
    // The next mail: the bounced and the complaining addresses are suppressed, the one the
    // forged complaint named is not.
    let (_, d) = mail(&s, "news-2", &["u0", "u1", "u2"]).await?;
    assert_eq!(of(&d, "u0")["status"], "sent", "{d:?}");
    for u in ["u1", "u2"] {
        assert_eq!(of(&d, u)["reason"], "address_suppressed", "{d:?}");
    }
    // The push events topic is subscribed to its own route, and allowed there.
    let push = template::topic_arn(&s.spec.name, "PushEventsTopic");
    let (_, delivered) = s.publish(&push, &json!({"EventType": "DeliveryFailure", "EndpointArn": "arn:aws:sns:us-east-1:123456789012:endpoint/APNS/x/none"})).await?;
    assert!(
        delivered.len() == 1 && delivered[0].0.ends_with("/v1/callbacks/push") && delivered[0].1 == 200,
        "{delivered:?}"
    );
    assert!(s.refused().is_empty(), "{:?}", s.refused());
    Ok(())
}
