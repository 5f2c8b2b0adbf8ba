//! The notification platform end to end (issue 5): preferences and the orchestrator's checks,
//! quiet hours, frequency caps, scheduled sends, devices, receipts, tracking and unsubscribe.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::server::{Backend, Options, Server};

// Generous: the AWS backend shares one emulator with the other tests; a pass returns at once.
const WAIT: Duration = Duration::from_secs(90);
pub(crate) const SIGNING_CERT: &str = include_str!("../fixtures/sns/test-signing-cert.pem");
const SIGNING_KEY: &str = include_str!("../fixtures/sns/test-signing-key.pem");

async fn template(s: &Server) -> anyhow::Result<()> {
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/news",
            Some(json!({"default_locale": "en", "locales": {"en": {
                "email_subject": "News {{ n }}", "email_body": "<p>News {{ n }} <a href=\"https://shop.example/sale\">sale</a></p>",
                "sms": "News {{ n }}", "push_title": "News", "push_body": "News {{ n }}",
                "inapp_title": "News", "inapp_body": "News {{ n }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

async fn user(s: &Server, id: &str, body: Value) -> anyhow::Result<()> {
    let (st, v) = s.call("PUT", &format!("/v1/users/{id}"), Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

async fn prefs(s: &Server, id: &str, body: Value) -> anyhow::Result<Value> {
    let (st, v) = s.call("PUT", &format!("/v1/users/{id}/preferences"), Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v)
}

async fn notify(s: &Server, body: Value) -> anyhow::Result<(String, String)> {
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok((v["notification_id"].as_str().unwrap().to_owned(), v["status"].as_str().unwrap_or_default().to_owned()))
}

fn req(key: &str, users: &[&str], category: &str, channels: Option<&[&str]>, n: u32) -> Value {
    let mut v = json!({"idempotency_key": key, "recipients": {"user_ids": users}, "template_id": "news",
                       "params": {"n": n}, "category": category});
    if let Some(c) = channels {
        v["channels"] = json!(c);
    }
    v
}

async fn deliveries(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries?limit=500"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// Waits until every delivery of the notification is out of `pending`/`sending` (and there is
/// at least one), unless `deferred` ones are expected to stay.
async fn settled(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    s.eventually(WAIT, &format!("deliveries of {id} settled"), || async {
        let d = deliveries(s, id).await?;
        let open = d
            .iter()
            .any(|d| (d["status"] == "pending" && d.get("deferred_until").is_none()) || d["status"] == "sending");
        Ok((!d.is_empty() && !open).then_some(d))
    })
    .await
}

fn find<'a>(d: &'a [Value], user: &str, channel: &str) -> &'a Value {
    d.iter().find(|x| x["user_id"] == user && x["channel"] == channel).unwrap_or(&Value::Null)
}

async fn now(s: &Server) -> anyhow::Result<chrono::DateTime<chrono::Utc>> {
    let (_, v) = s.call("GET", "/dev/clock", None).await?;
    Ok(chrono::DateTime::parse_from_rfc3339(v["now"].as_str().unwrap())?.with_timezone(&chrono::Utc))
}

fn manual() -> Options {
    Options { manual_clock: true, ..Options::default() }
}

pub async fn quiet_hours_defer_marketing_but_not_transactional(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    template(&s).await?;
    // Quiet from an hour ago to an hour from now, in the user's own zone (Shanghai, UTC+8).
    let local = now(&s).await? + chrono::Duration::hours(8);
    let hhmm = |t: chrono::DateTime<chrono::Utc>| t.format("%H:%M").to_string();
    user(&s, "u1", json!({"email": "a@example.com", "phone": "+8613800001234", "timezone": "Asia/Shanghai"})).await?;
    prefs(
        &s,
        "u1",
        json!({"quiet_hours": {"start": hhmm(local - chrono::Duration::hours(1)), "end": hhmm(local + chrono::Duration::hours(1))}}),
    )
    .await?;

    let (promo, _) = notify(&s, req("promo", &["u1"], "marketing", Some(&["sms"]), 1)).await?;
    let (otp, _) = notify(&s, req("otp", &["u1"], "transactional", Some(&["sms"]), 2)).await?;
    // The OTP goes at once, quiet hours or not.
    let d = settled(&s, &otp).await?;
    assert_eq!(find(&d, "u1", "sms")["status"], "sent", "{d:?}");
    // The marketing message waits, deferred (not suppressed, not dropped).
    let d = s
        .eventually(WAIT, "the promo deferred", || async {
            let d = deliveries(&s, &promo).await?;
            Ok(d.into_iter().find(|x| x.get("deferred_until").is_some()))
        })
        .await?;
    assert_eq!(d["status"], "pending", "{d}");
    assert_eq!(d["reason"], "quiet_hours", "{d}");
    assert!(s.sends(&promo).await?.is_empty(), "nothing may be sent during quiet hours");

    // Half an hour on: still quiet.
    s.advance_and_tick(30 * 60).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(s.sends(&promo).await?.is_empty(), "still quiet");
    // The window ends: it arrives.
    s.advance_and_tick(45 * 60).await?;
    let sends = s
        .eventually(WAIT, "the promo after the quiet hours", || async {
            let sends = s.sends(&promo).await?;
            Ok((!sends.is_empty()).then_some(sends))
        })
        .await?;
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0]["body"], "News 1");
    let d = settled(&s, &promo).await?;
    assert_eq!(find(&d, "u1", "sms")["status"], "sent", "{d:?}");
    Ok(())
}

pub async fn frequency_cap_suppresses_the_fourth_marketing_message(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_FREQUENCY_CAPS", "globex:1".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let mut ids = Vec::new();
    for i in 1..=4 {
        ids.push(notify(&s, req(&format!("promo-{i}"), &["u1"], "marketing", Some(&["email"]), i)).await?.0);
    }
    // Transactional is never capped.
    let (otp, _) = notify(&s, req("otp", &["u1"], "transactional", Some(&["email"]), 9)).await?;
    let mut statuses = Vec::new();
    for id in &ids {
        let d = settled(&s, id).await?;
        statuses.push((find(&d, "u1", "email")["status"].clone(), find(&d, "u1", "email")["reason"].clone()));
    }
    let sent = statuses.iter().filter(|(st, _)| st == "sent").count();
    let capped: Vec<_> = statuses.iter().filter(|(st, _)| st == "suppressed").collect();
    assert_eq!(sent, 3, "{statuses:?}");
    assert_eq!(capped.len(), 1, "{statuses:?}");
    assert_eq!(capped[0].1, "frequency_cap");
    assert_eq!(find(&settled(&s, &otp).await?, "u1", "email")["status"], "sent");

    // Per tenant: globex allows one a day.
    let other = s.other_tenant_key();
    let (st, _) = s.call_as(&other, "PUT", "/v1/users/g1", Some(json!({"email": "g@example.com"}))).await?;
    assert_eq!(st, 200);
    let (st, _) = s
        .call_as(
            &other,
            "PUT",
            "/v1/templates/news",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "x", "email_body": "y"}}})),
        )
        .await?;
    assert_eq!(st, 200);
    let mut globex = Vec::new();
    for i in 1..=2 {
        let (st, v) = s
            .call_as(
                &other,
                "POST",
                "/v1/notifications",
                Some(req(&format!("g-{i}"), &["g1"], "marketing", Some(&["email"]), i)),
            )
            .await?;
        assert_eq!(st, 202, "{v}");
        globex.push(v["notification_id"].as_str().unwrap().to_owned());
    }
    let mut reasons = Vec::new();
    for id in &globex {
        let d = s
            .eventually(WAIT, "globex settled", || async {
                let (_, v) = s.call_as(&other, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
                let items = v["items"].as_array().cloned().unwrap_or_default();
                Ok(items.into_iter().find(|d| d["status"] == "sent" || d["status"] == "suppressed"))
            })
            .await?;
        reasons.push(d["reason"].clone());
    }
    assert_eq!(reasons.iter().filter(|r| **r == "frequency_cap").count(), 1, "{reasons:?}");
    Ok(())
}

pub async fn opted_out_users_get_nothing_and_one_click_unsubscribe_works(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SIGNING_KEYS", "k1:e2e-signing-secret".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    // Links are tracked only to the shop's own hosts.
    let (st, v) = s.call("PUT", "/v1/settings/link-hosts", Some(json!({"hosts": ["shop.example"]}))).await?;
    assert_eq!(st, 200, "{v}");
    for (id, email) in [
        ("all-off", "off@example.com"),
        ("no-sms", "nosms@example.com"),
        ("no-mkt", "nomkt@example.com"),
        ("reader", "r@example.com"),
    ] {
        user(&s, id, json!({"email": email, "phone": "+14155550100"})).await?;
    }
    let p = prefs(&s, "all-off", json!({"unsubscribe_all": true})).await?;
    assert_eq!(p["unsubscribe_all"], true);
    prefs(&s, "no-sms", json!({"channels": {"sms": false}})).await?;
    prefs(&s, "no-mkt", json!({"categories": {"marketing": false}})).await?;
    // Only the fields given change.
    let p = prefs(&s, "all-off", json!({"quiet_hours": {"start": "23:00", "end": "23:30"}})).await?;
    assert_eq!(p["unsubscribe_all"], true, "{p}");
    let (st, p) = s.call("GET", "/v1/users/all-off/preferences", None).await?;
    assert_eq!(st, 200);
    assert_eq!(p["quiet_hours"]["start"], "23:00");
    // Bad input names the field.
    let (st, v) = s
        .call("PUT", "/v1/users/u1/preferences", Some(json!({"quiet_hours": {"start": "7pm", "end": "08:00"}})))
        .await?;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["field"], "quiet_hours.start");
    let (st, v) = s.call("PUT", "/v1/users/u1/preferences", Some(json!({"unsubscribe_all": "yes"}))).await?;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["field"], "unsubscribe_all");

    let users = ["all-off", "no-sms", "no-mkt", "reader"];
    let (promo, _) = notify(&s, req("promo", &users, "marketing", Some(&["email", "sms"]), 1)).await?;
    let d = settled(&s, &promo).await?;
    let reason = |u: &str, c: &str| {
        find(&d, u, c)["reason"].as_str().unwrap_or(find(&d, u, c)["status"].as_str().unwrap_or("?")).to_owned()
    };
    assert_eq!(reason("all-off", "email"), "unsubscribed");
    assert_eq!(reason("all-off", "sms"), "unsubscribed");
    assert_eq!(reason("no-sms", "sms"), "channel_off");
    assert_eq!(find(&d, "no-sms", "email")["status"], "sent");
    assert_eq!(reason("no-mkt", "email"), "category_off");
    assert_eq!(find(&d, "reader", "email")["status"], "sent");
    // Without `channels`: what the user can receive and has not turned off (no SMS for no-sms).
    let (implicit, _) = notify(&s, req("implicit", &["no-sms"], "transactional", None, 2)).await?;
    let d = settled(&s, &implicit).await?;
    let mut channels: Vec<String> = d.iter().map(|x| x["channel"].as_str().unwrap().to_owned()).collect();
    channels.sort();
    assert_eq!(channels, vec!["email", "inapp"], "{d:?}");

    // Marketing email carries RFC 8058 headers; the one-click POST unsubscribes from marketing.
    let send =
        s.sends(&promo).await?.into_iter().find(|x| x["user_id"] == "reader" && x["channel"] == "email").unwrap();
    let headers = send["headers"].as_array().cloned().unwrap_or_default();
    let header = |name: &str| {
        headers.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str()).map(str::to_owned).unwrap_or_default()
    };
    assert_eq!(header("List-Unsubscribe-Post"), "List-Unsubscribe=One-Click");
    let link = header("List-Unsubscribe");
    let path =
        link.trim_start_matches('<').trim_end_matches('>').split_once("/u/").map(|(_, t)| format!("/u/{t}")).unwrap();
    // The open pixel and the click redirect, signed (in the HTML part: docs/security.md, "Email parts").
    let body = send["html"].as_str().unwrap();
    assert!(body.contains("/t/o/") && body.contains("/t/c/"), "{body}");
    let click = body.split("href=\"").nth(1).unwrap().split('"').next().unwrap();
    let click_path = format!("/t/c/{}", click.split("/t/c/").nth(1).unwrap());
    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let res = no_redirect.get(format!("{}{click_path}", s.base)).send().await?;
    assert_eq!(res.status().as_u16(), 302);
    assert_eq!(res.headers()["location"], "https://shop.example/sale");
    let res = no_redirect.get(format!("{}{}x", s.base, click_path)).send().await?;
    assert_eq!(res.status().as_u16(), 404, "a tampered token is refused");
    s.eventually(WAIT, "the click recorded", || async {
        let d = deliveries(&s, &promo).await?;
        Ok((find(&d, "reader", "email")["status"] == "clicked").then_some(()))
    })
    .await?;
    // GET only asks; POST (one click) unsubscribes.
    let (st, _, _) = s.raw("GET", &path, "", None).await?;
    assert_eq!(st, 200);
    let (_, p) = s.call("GET", "/v1/users/reader/preferences", None).await?;
    assert_ne!(p["categories"]["marketing"], false, "GET must not unsubscribe");
    let res = s
        .http
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("List-Unsubscribe=One-Click")
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 200);
    let (_, p) = s.call("GET", "/v1/users/reader/preferences", None).await?;
    assert_eq!(p["categories"]["marketing"], false, "{p}");
    let (promo2, _) = notify(&s, req("promo-2", &["reader"], "marketing", Some(&["email"]), 3)).await?;
    assert_eq!(find(&settled(&s, &promo2).await?, "reader", "email")["reason"], "category_off");
    Ok(())
}

pub async fn scheduled_send_fires_at_send_at_and_cancel_stops_it(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, manual()).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let t0 = now(&s).await?;
    let at = |mins: i64| (t0 + chrono::Duration::minutes(mins)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut a = req("a", &["u1"], "transactional", Some(&["email"]), 1);
    a["send_at"] = json!(at(20));
    let mut b = req("b", &["u1"], "transactional", Some(&["email"]), 2);
    b["send_at"] = json!(at(40));
    let mut c = req("c", &["u1"], "transactional", Some(&["email"]), 3);
    c["send_at"] = json!(at(20));
    let (a, st) = notify(&s, a).await?;
    assert_eq!(st, "scheduled");
    let (b, _) = notify(&s, b).await?;
    let (c, _) = notify(&s, c).await?;
    let (st, v) = s.call("POST", &format!("/v1/notifications/{c}/cancel"), None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "cancelled");
    // Not before its time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.advance_and_tick(10 * 60).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(s.sends(&a).await?.is_empty(), "sent before send_at");
    let (_, v) = s.call("GET", &format!("/v1/notifications/{a}"), None).await?;
    assert_eq!(v["status"], "scheduled", "{v}");
    // Its time: a goes, b waits, c never.
    s.advance_and_tick(11 * 60).await?;
    s.eventually(WAIT, "a sent", || async { Ok((!s.sends(&a).await?.is_empty()).then_some(())) }).await?;
    assert!(s.sends(&b).await?.is_empty());
    s.advance_and_tick(20 * 60).await?;
    s.eventually(WAIT, "b sent", || async { Ok((!s.sends(&b).await?.is_empty()).then_some(())) }).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(s.sends(&c).await?.is_empty(), "a cancelled send went out");
    assert!(deliveries(&s, &c).await?.is_empty());
    assert_eq!(s.sends(&a).await?.len(), 1);
    let (_, v) = s.call("GET", &format!("/v1/notifications/{a}"), None).await?;
    assert_eq!(v["status"], "completed", "{v}");
    // local_time needs send_at; send_at at most a year ahead.
    let mut bad = req("bad", &["u1"], "marketing", None, 1);
    bad["local_time"] = json!(true);
    let (st, v) = s.call("POST", "/v1/notifications", Some(bad)).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("local_time")), "{v}");
    Ok(())
}

/// On AWS the push provider needs SNS platform applications: made here in the emulator.
pub(crate) async fn push_options(backend: Backend) -> anyhow::Result<Options> {
    let mut opts = Options::default();
    if backend == Backend::Aws {
        let config = tidings_aws::sdk_defaults().load().await;
        let sns = aws_sdk_sns::Client::new(&config);
        for (platform, var) in [("APNS", "TIDINGS_SNS_APNS_ARN"), ("GCM", "TIDINGS_SNS_FCM_ARN")] {
            let app = sns
                .create_platform_application()
                .name(format!("e2e-{}-{}", platform.to_lowercase(), rand::random::<u32>()))
                .platform(platform)
                .attributes("PlatformCredential", "test")
                .attributes("PlatformPrincipal", "test")
                .send()
                .await?;
            opts.env.push((var, app.platform_application_arn.unwrap_or_default()));
        }
    }
    Ok(opts)
}

pub async fn push_reaches_every_device_and_a_dead_token_is_deleted(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, push_options(backend).await?).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let register = |platform: &'static str, token: &'static str| {
        let s = &s;
        async move {
            s.call("POST", "/v1/devices", Some(json!({"user_id": "u1", "platform": platform, "token": token}))).await
        }
    };
    assert_eq!(register("ios", "tok-ios-1").await?.0, 201);
    assert_eq!(register("ios", "tok-ios-1").await?.0, 200, "registered again: 200");
    assert_eq!(register("android", "tok-android-2").await?.0, 201);
    assert_eq!(register("android", "invalid-dead-3").await?.0, 201);
    let (st, v) =
        s.call("POST", "/v1/devices", Some(json!({"user_id": "u1", "platform": "windows", "token": "x"}))).await?;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["field"], "platform");

    let (id, _) = notify(&s, req("push-1", &["u1"], "transactional", Some(&["push"]), 1)).await?;
    let d = settled(&s, &id).await?;
    assert_eq!(find(&d, "u1", "push")["status"], "sent", "{d:?}");
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 2, "both live devices: {sends:?}");
    for send in &sends {
        assert_eq!(send["collapse_id"], format!("{id}:u1:push"), "collapse id / tag = the delivery key");
    }
    // The dead token is gone after its first 410: registering it again makes it new.
    assert_eq!(register("android", "invalid-dead-3").await?.0, 201, "the dead token was not deleted");
    let (st, _) = s.call("DELETE", "/v1/devices/invalid-dead-3", None).await?;
    assert_eq!(st, 204);
    // Unregister one: the other still receives.
    let (st, _) = s.call("DELETE", "/v1/devices/tok-ios-1", None).await?;
    assert_eq!(st, 204);
    let (st, _) = s.call("DELETE", "/v1/devices/tok-ios-1", None).await?;
    assert_eq!(st, 204, "idempotent");
    let (id2, _) = notify(&s, req("push-2", &["u1"], "transactional", Some(&["push"]), 2)).await?;
    settled(&s, &id2).await?;
    assert_eq!(s.sends(&id2).await?.len(), 1);
    // No device at all: suppressed, no_address.
    let (st, _) = s.call("DELETE", "/v1/devices/tok-android-2", None).await?;
    assert_eq!(st, 204);
    let (id3, _) = notify(&s, req("push-3", &["u1"], "transactional", Some(&["push"]), 3)).await?;
    let d = settled(&s, &id3).await?;
    assert_eq!(find(&d, "u1", "push")["reason"], "no_address", "{d:?}");

    // A UUID user id makes the delivery key longer than APNs's 64 bytes: the push still carries
    // a collapse id, the key's SHA-256 in hex.
    let uuid = "7f0c2a8e-3b1d-4c55-9a77-2f6e8d1b9c40";
    user(&s, uuid, json!({"email": "b@example.com"})).await?;
    // A token of this run only: moto keeps the endpoints of earlier runs.
    let token = format!("tok-android-{}", rand::random::<u32>());
    let (st, _) =
        s.call("POST", "/v1/devices", Some(json!({"user_id": uuid, "platform": "android", "token": token}))).await?;
    assert_eq!(st, 201);
    let (id4, _) = notify(&s, req("push-4", &[uuid], "transactional", Some(&["push"]), 4)).await?;
    settled(&s, &id4).await?;
    let key = format!("{id4}:{uuid}:push");
    assert!(key.len() > 64, "{key}");
    let digest = format!("{:x}", sha2::Sha256::digest(key.as_bytes()));
    let sends = s.sends(&id4).await?;
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(sends[0]["collapse_id"], digest.as_str(), "{sends:?}");
    if backend == Backend::Aws {
        // What SNS itself received (moto keeps each endpoint's messages): the FCM payload's
        // collapse key and tag. (moto drops message attributes, so the APNs collapse id is
        // checked against the SDK request in tidings-aws's mock tests.)
        let got = moto_endpoint_messages(&crate::server::emulator(), &token).await?;
        assert_eq!(got.len(), 1, "{got:?}");
        let body: Value = serde_json::from_str(&got[0])?;
        let gcm: Value = serde_json::from_str(body["GCM"].as_str().unwrap_or("{}"))?;
        let android = &gcm["fcmV1Message"]["message"]["android"];
        assert_eq!(android["collapse_key"], digest.as_str(), "{gcm}");
        assert_eq!(android["notification"]["tag"], digest.as_str(), "{gcm}");
    }
    Ok(())
}

/// The messages moto's SNS holds for the platform endpoint of `token` (its `/moto-api/data.json`).
async fn moto_endpoint_messages(moto: &str, token: &str) -> anyhow::Result<Vec<String>> {
    let data: Value = reqwest::get(format!("{moto}/moto-api/data.json")).await?.json().await?;
    let endpoints = data["sns"]["PlatformEndpoint"].as_array().cloned().unwrap_or_default();
    Ok(endpoints
        .iter()
        .filter(|e| e["token"] == token)
        .flat_map(|e| e["messages"].as_object().cloned().unwrap_or_default().into_values())
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect())
}

/// An SNS message signed with the test key (as SNS signs: SHA256withRSA, version 2).
pub(crate) fn sns_notification(message: &Value) -> Value {
    use rsa::pkcs1v15::SigningKey;
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::signature::{SignatureEncoding, Signer};
    let mut m = json!({
        "Type": "Notification",
        "MessageId": format!("m-{}", rand::random::<u32>()),
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:ses-events",
        "Message": message.to_string(),
        // Now: an older notification than the callbacks' window (24 h) is ignored.
        "Timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "SignatureVersion": "2",
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem",
    });
    let canonical = format!(
        "Message\n{}\nMessageId\n{}\nTimestamp\n{}\nTopicArn\n{}\nType\n{}\n",
        m["Message"].as_str().unwrap(),
        m["MessageId"].as_str().unwrap(),
        m["Timestamp"].as_str().unwrap(),
        m["TopicArn"].as_str().unwrap(),
        m["Type"].as_str().unwrap()
    );
    let key = rsa::RsaPrivateKey::from_pkcs8_pem(SIGNING_KEY).unwrap();
    let sig = SigningKey::<sha2::Sha256>::new(key).sign(canonical.as_bytes()).to_vec();
    m["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode(sig));
    m
}

pub async fn forged_sns_callback_is_rejected_and_a_genuine_bounce_suppresses(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SNS_TRUSTED_CERT_PEM", SIGNING_CERT.into()));
    opts.env.push(("TIDINGS_SNS_TOPIC_ARNS", "arn:aws:sns:us-east-1:123456789012:ses-events".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "bouncy@example.com"})).await?;
    let (id, _) = notify(&s, req("mail-1", &["u1"], "transactional", Some(&["email"]), 1)).await?;
    let d = settled(&s, &id).await?;
    let provider_id = find(&d, "u1", "email")["provider_message_id"].as_str().unwrap().to_owned();
    let bounce = json!({"eventType": "Bounce", "mail": {"messageId": provider_id, "destination": ["bouncy@example.com"]},
        "bounce": {"bounceType": "Permanent", "bounceSubType": "General",
                   "bouncedRecipients": [{"emailAddress": "bouncy@example.com"}]}});
    let genuine = sns_notification(&bounce);

    // Forged: the message altered after signing; a signature from nowhere; a foreign cert URL.
    let mut altered = genuine.clone();
    altered["Message"] = json!(bounce.to_string().replace("Permanent", "Transient"));
    let mut unsigned = genuine.clone();
    unsigned["Signature"] = json!(base64::engine::general_purpose::STANDARD.encode([7u8; 256]));
    for forged in [altered, unsigned] {
        let (st, _, body) = s.raw("POST", "/v1/callbacks/ses", &forged.to_string(), None).await?;
        assert_eq!(st, 403, "{body}");
    }
    let (st, _, _) = s.raw("POST", "/v1/callbacks/ses", "{\"Type\": 1}", None).await?;
    assert_eq!(st, 400);
    let d = deliveries(&s, &id).await?;
    assert_eq!(find(&d, "u1", "email")["status"], "sent", "a forged receipt changed nothing");

    // Genuine (SNS posts JSON as text/plain).
    let res = s
        .http
        .post(format!("{}/v1/callbacks/ses", s.base))
        .header("content-type", "text/plain; charset=UTF-8")
        .body(genuine.to_string())
        .send()
        .await?;
    assert_eq!(res.status().as_u16(), 200);
    let v: Value = res.json().await?;
    assert_eq!(v["matched"], true, "{v}");
    let d = deliveries(&s, &id).await?;
    assert_eq!(find(&d, "u1", "email")["status"], "failed", "{d:?}");
    // The address is suppressed: the next email is not sent; SMS would still go.
    let (id2, _) = notify(&s, req("mail-2", &["u1"], "transactional", Some(&["email"]), 2)).await?;
    let d = settled(&s, &id2).await?;
    assert_eq!(find(&d, "u1", "email")["reason"], "address_suppressed", "{d:?}");
    assert!(s.sends(&id2).await?.is_empty());
    Ok(())
}

/// SNS's mobile-push application events (`POST /v1/callbacks/push`): a forged one changes
/// nothing; a genuine `DeliveryFailure` naming a dead token deletes that device, and the next
/// push goes only to the device left.
pub async fn a_push_service_event_deletes_the_dead_device(backend: Backend) -> anyhow::Result<()> {
    let mut opts = push_options(backend).await?;
    opts.env.push(("TIDINGS_SNS_TRUSTED_CERT_PEM", SIGNING_CERT.into()));
    opts.env.push(("TIDINGS_SNS_TOPIC_ARNS", "arn:aws:sns:us-east-1:123456789012:ses-events".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    for token in ["tok-phone-1", "tok-tablet-2"] {
        let body = json!({"user_id": "u1", "platform": "ios", "token": token});
        assert_eq!(s.call("POST", "/v1/devices", Some(body)).await?.0, 201);
    }
    let (id, _) = notify(&s, req("push-ev-1", &["u1"], "transactional", Some(&["push"]), 1)).await?;
    settled(&s, &id).await?;
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 2, "{sends:?}");
    // The address the push service knows one device by (an SNS endpoint ARN on AWS).
    let dead = sends[0]["to"].as_str().unwrap_or_default().to_owned();
    assert!(!dead.is_empty(), "{sends:?}");
    let event = json!({"DeliveryAttempts": 1, "EndpointArn": dead, "EventType": "DeliveryFailure",
        "FailureMessage": "Endpoint is disabled", "FailureType": "EndpointDisabled", "MessageId": "m-1",
        "Resource": "arn:aws:sns:us-east-1:123456789012:app/APNS/shop", "Service": "SNS",
        "Time": "2026-11-29T12:00:00.000Z"});
    let genuine = sns_notification(&event);
    let mut altered = genuine.clone();
    altered["Message"] = json!(event.to_string().replace("m-1", "m-2"));
    let (st, _, body) = s.raw("POST", "/v1/callbacks/push", &altered.to_string(), None).await?;
    assert_eq!(st, 403, "{body}");
    let (st, _, body) = s.raw("POST", "/v1/callbacks/push", &genuine.to_string(), None).await?;
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!((v["matched"].as_bool(), v["removed"].as_bool()), (Some(true), Some(true)), "{v}");
    let (id2, _) = notify(&s, req("push-ev-2", &["u1"], "transactional", Some(&["push"]), 2)).await?;
    settled(&s, &id2).await?;
    let sends = s.sends(&id2).await?;
    assert_eq!(sends.len(), 1, "only the device left: {sends:?}");
    assert_ne!(sends[0]["to"].as_str(), Some(dead.as_str()));
    Ok(())
}

/// The SMS pumping guard through the API: with `TIDINGS_SMS_NUMBER_LIMITS=2/1h` the third OTP to
/// one number is suppressed (`number_rate_limited`) and never reaches the provider; with
/// `TIDINGS_SMS_COUNTRIES=+86` an SMS to a US number is suppressed (`country_not_allowed`); a
/// segment whose members share a number sends it once.
pub async fn sms_pumping_guard_limits_a_number_and_keeps_to_allowed_countries(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SMS_NUMBER_LIMITS", "2/1h".into()));
    opts.env.push(("TIDINGS_SMS_COUNTRIES", "+86".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    user(&s, "cn", json!({"phone": "+8613800001234"})).await?;
    user(&s, "us", json!({"phone": "+14155550100"})).await?;
    let mut outcomes = Vec::new();
    let mut sent = 0;
    for i in 1..=3 {
        let (id, _) = notify(&s, req(&format!("otp-{i}"), &["cn"], "transactional", Some(&["sms"]), i)).await?;
        let d = settled(&s, &id).await?;
        let sms = find(&d, "cn", "sms");
        outcomes.push((sms["status"].clone(), sms["reason"].clone()));
        sent += s.sends(&id).await?.len();
    }
    assert_eq!(outcomes[0].0, "sent", "{outcomes:?}");
    assert_eq!(outcomes[1].0, "sent", "{outcomes:?}");
    assert_eq!((&outcomes[2].0, &outcomes[2].1), (&json!("suppressed"), &json!("number_rate_limited")));
    assert_eq!(sent, 2, "the provider saw two: {outcomes:?}");
    let (id, _) = notify(&s, req("otp-us", &["us"], "transactional", Some(&["sms"]), 1)).await?;
    let d = settled(&s, &id).await?;
    assert_eq!(find(&d, "us", "sms")["reason"], "country_not_allowed", "{d:?}");
    assert!(s.sends(&id).await?.is_empty());

    // A transactional notice to a segment whose three members share one number: the page is
    // written with the number's counters (never twice in one transaction), the number gets it
    // once, the other two are limited.
    for member in ["f1", "f2", "f3"] {
        user(&s, member, json!({"phone": "+8613900005678", "tags": ["family"]})).await?;
    }
    let mut notice = req("family-notice", &[], "transactional", Some(&["sms"]), 1);
    notice["recipients"] = json!({"segment": "family"});
    let (id, _) = notify(&s, notice).await?;
    let view = s
        .eventually(WAIT, "the family notice completed", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == "completed").then_some(v))
        })
        .await?;
    assert_eq!((view["counts"]["sent"].as_u64(), view["counts"]["suppressed"].as_u64()), (Some(1), Some(2)), "{view}");
    let d = deliveries(&s, &id).await?;
    let limited = d.iter().filter(|x| x["reason"] == "number_rate_limited").count();
    assert_eq!((s.sends(&id).await?.len(), limited), (1, 2), "{d:?}");
    Ok(())
}

/// Per-requester limits through the API (`TIDINGS_REQUESTER_IP_LIMITS=2/1h`): the third OTP
/// asked for from one IP is refused with 429 `rate_limited` naming `requester.ip`, with
/// `Retry-After`, and nothing is accepted; a repeated request is not counted again; another IP
/// is not limited; a malformed IP is a 422 naming the field.
pub async fn requester_limits_refuse_the_third_otp_from_one_ip(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_REQUESTER_IP_LIMITS", "2/1h".into()));
    let s = Server::start(backend, opts).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let otp = |key: &str, ip: &str| {
        let mut body = req(key, &["u1"], "transactional", Some(&["email"]), 1);
        body["requester"] = json!({"ip": ip, "device_id": "phone-1"});
        body
    };
    for key in ["otp-1", "otp-1", "otp-2"] {
        let (st, _, v) = s.call_with_headers("POST", "/v1/notifications", otp(key, "203.0.113.7")).await?;
        assert_eq!(st, 202, "{key}: {v}");
    }
    let (st, headers, v) = s.call_with_headers("POST", "/v1/notifications", otp("otp-3", "203.0.113.7")).await?;
    assert_eq!((st, &v["code"], &v["field"]), (429, &json!("rate_limited"), &json!("requester.ip")), "{v}");
    let retry_after: u64 = headers.get("retry-after").and_then(|h| h.to_str().ok()).unwrap_or("").parse()?;
    assert!((1..=3600).contains(&retry_after), "Retry-After {retry_after}");
    let (st, _, v) = s.call_with_headers("POST", "/v1/notifications", otp("otp-4", "198.51.100.1")).await?;
    assert_eq!(st, 202, "another IP: {v}");
    let (st, _, v) = s.call_with_headers("POST", "/v1/notifications", otp("otp-5", "not-an-ip")).await?;
    assert_eq!((st, &v["field"]), (422, &json!("requester.ip")), "{v}");
    // Three notifications accepted (otp-1 once, otp-2, otp-4): three emails.
    s.eventually(WAIT, "three emails", || async {
        let n = s.sends_all().await?.len();
        Ok((n >= 3).then_some(n))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(s.sends_all().await?.len(), 3);
    Ok(())
}

/// A malformed guard setting stops the server at start-up, naming the setting (a guard that
/// silently did nothing would be worse than none).
pub async fn a_malformed_sms_guard_setting_refuses_to_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cmd = tokio::process::Command::new(crate::server::binary()?);
    cmd.arg("serve").arg("--addr").arg("127.0.0.1:0").arg("--data-dir").arg(dir.path());
    cmd.env("TIDINGS_SMS_NUMBER_LIMITS", "5 per hour").kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {stderr}");
    assert!(stderr.contains("TIDINGS_SMS_NUMBER_LIMITS") && stderr.contains("5 per hour"), "{stderr}");
    Ok(())
}

/// Codes nobody uses, seen through the API: three user-triggered OTPs (with a `requester`), one
/// reported verified (twice: counted once); `GET /v1/ops/verification` shows 3 accepted, 1
/// verified; another tenant's key sees none of it and cannot verify.
pub async fn verification_ratio_counts_codes_nobody_used(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let mut ids = Vec::new();
    for i in 1..=3 {
        let mut body = req(&format!("code-{i}"), &["u1"], "transactional", Some(&["email"]), i);
        body["requester"] = json!({"ip": "203.0.113.7"});
        ids.push(notify(&s, body).await?.0);
    }
    let (st, first) = s.call("POST", &format!("/v1/notifications/{}/verified", ids[0]), None).await?;
    assert_eq!(st, 200, "{first}");
    let (_, again) = s.call("POST", &format!("/v1/notifications/{}/verified", ids[0]), None).await?;
    assert_eq!(again["verified_at"], first["verified_at"]);
    let other = s.other_tenant_key();
    let (st, _) = s.call_as(&other, "POST", &format!("/v1/notifications/{}/verified", ids[1]), None).await?;
    assert_eq!(st, 404, "another tenant cannot verify");
    let (st, v) = s.call("GET", "/v1/ops/verification?template_id=news", None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!((&v["accepted"], &v["verified"]), (&json!(3), &json!(1)), "{v}");
    let ratio = v["ratio"].as_f64().unwrap_or(-1.0);
    assert!((ratio - 1.0 / 3.0).abs() < 1e-9, "{v}");
    let (_, theirs) = s.call_as(&other, "GET", "/v1/ops/verification?template_id=news", None).await?;
    assert_eq!((&theirs["accepted"], &theirs["hours"]), (&json!(0), &json!([])), "{theirs}");
    let (st, v) = s.call("GET", "/v1/ops/verification?template_id=news&hours=999", None).await?;
    assert_eq!((st, &v["field"]), (422, &json!("hours")), "{v}");
    Ok(())
}

/// `--manual-clock` keeps its time with the data: advanced an hour, killed with `kill -9` and
/// started again, the server resumes at the advanced time, and a scheduled send and an order's
/// hold set against it come due when the clock moves on.
pub async fn a_manual_clock_keeps_its_time_across_kill_9(backend: Backend) -> anyhow::Result<()> {
    let mut s = Server::start(backend, manual()).await?;
    template(&s).await?;
    user(&s, "u1", json!({"email": "a@example.com"})).await?;
    let t0 = now(&s).await?;
    s.advance_and_tick(3600).await?;
    let t1 = now(&s).await?;
    assert_eq!((t1 - t0).num_seconds(), 3600);
    let mut a = req("later", &["u1"], "transactional", Some(&["email"]), 1);
    // 20 minutes: past SQS's 15-minute delays, so a minute bucket fired by the tick (a queue's
    // delay runs in real seconds on moto, whatever the manual clock says).
    a["send_at"] = json!((t1 + chrono::Duration::minutes(20)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let (a, st) = notify(&s, a).await?;
    assert_eq!(st, "scheduled");
    s.call("PUT", "/v1/inventory/clock-sku", Some(json!({"on_hand": 1}))).await?;
    let order =
        json!({"order_id": "held", "user_id": "u1", "items": [{"sku_id": "clock-sku", "qty": 1}], "hold_seconds": 300});
    let (st, v) = s.call("POST", "/v1/orders", Some(order)).await?;
    assert_eq!(st, 201, "{v}");

    s.kill9_and_restart().await?;
    let t2 = now(&s).await?;
    assert_eq!(t2, t1, "the clock resumed where it stood, not at the wall clock");
    assert!(s.sends(&a).await?.is_empty(), "nothing came due without the clock moving");
    let (_, v) = s.call("GET", "/v1/orders/held", None).await?;
    assert_eq!(v["status"], "PENDING", "{v}");

    s.advance_and_tick(21 * 60).await?;
    s.eventually(WAIT, "the scheduled send after the restart", || async {
        Ok((!s.sends(&a).await?.is_empty()).then_some(()))
    })
    .await?;
    s.eventually(WAIT, "the hold to expire after the restart", || async {
        let (_, o) = s.call("GET", "/v1/orders/held", None).await?;
        Ok((o["status"] == "CANCELLED").then_some(()))
    })
    .await?;
    assert_eq!(s.sends(&a).await?.len(), 1, "sent once");
    // And a second restart still keeps the later time.
    s.kill9_and_restart().await?;
    assert_eq!((now(&s).await? - t1).num_seconds(), 21 * 60);
    Ok(())
}
