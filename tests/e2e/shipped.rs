//! The shape that ships: a day of a shop through the real function binaries (`sam build`'s
//! `bootstrap`s under a Lambda Runtime API, see `lambda/`), on DynamoDB Local and moto, each
//! function with only the environment and the IAM policy `template.yaml` gives it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::lambda::{Options, Stack};

const WAIT: Duration = Duration::from_secs(180);

async fn ok(s: &Stack, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    ok_as(s, &s.key, method, path, body).await
}

async fn ok_as(s: &Stack, key: &str, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let (st, v) = s.call_as(key, method, path, body).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}\nrefused: {:?}", s.refused());
    Ok(v)
}

async fn notify(s: &Stack, body: Value) -> anyhow::Result<String> {
    let v = ok(s, "POST", "/v1/notifications", Some(body)).await?;
    Ok(v["notification_id"].as_str().unwrap_or_default().to_owned())
}

async fn completed(s: &Stack, id: &str) -> anyhow::Result<Value> {
    s.eventually(WAIT, &format!("{id} completed"), || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
        Ok((v["status"] == "completed").then_some(v))
    })
    .await
}

async fn deliveries(s: &Stack, id: &str) -> anyhow::Result<Vec<Value>> {
    let v = ok(s, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_event(socket: &mut Socket) -> anyhow::Result<Value> {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(90), socket.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("closed"))??;
        if let Message::Text(text) = msg {
            return Ok(serde_json::from_str(&text)?);
        }
    }
}

/// Sends per (channel, to).
fn sent_to(s: &Stack) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for send in s.sends() {
        *out.entry((send.channel.to_owned(), send.to.clone())).or_default() += 1;
    }
    out
}

pub async fn a_day_of_a_shop_through_the_function_binaries() -> anyhow::Result<()> {
    let s = Stack::start(Options::default()).await?;
    let template = json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "Hi {{ n }}", "email_body": "<p>Hi {{ n }} <a href=\"https://shop.example/x\">x</a></p>",
        "sms": "Hi {{ n }}", "push_title": "Hi", "push_body": "Hi {{ n }}", "inapp_title": "Hi", "inapp_body": "Hi {{ n }}"}}});
    ok(&s, "PUT", "/v1/templates/day", Some(template)).await?;
    ok(&s, "PUT", "/v1/settings/link-hosts", Some(json!({"hosts": ["shop.example"]}))).await?;
    for (user, phone) in [("u1", "+8613800001111"), ("u2", "+8613800002222")] {
        let body = json!({"email": format!("{user}@example.com"), "phone": phone, "tags": ["vip"]});
        ok(&s, "PUT", &format!("/v1/users/{user}"), Some(body)).await?;
    }
    ok(&s, "PUT", "/v1/users/u2/preferences", Some(json!({"categories": {"marketing": true}}))).await?;
    ok(&s, "POST", "/v1/devices", Some(json!({"user_id": "u1", "platform": "ios", "token": "tok-day-1"}))).await?;

    // The live inbox: a connection through the WebSocket API, its token from the HTTP API.
    let token =
        ok(&s, "POST", "/v1/users/u1/inbox/token", None).await?["token"].as_str().unwrap_or_default().to_owned();
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("{}?token={token}", s.ws)).await?;
    match tokio_tungstenite::connect_async(format!("{}?token=forged", s.ws)).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(res)) => assert_eq!(res.status(), 401, "a forged token"),
        other => anyhow::bail!("a forged token was not refused at $connect: {:?}", other.map(|_| ())),
    }

    // Every channel, transactional, to two users: each (user, channel) sent once.
    let id = notify(
        &s,
        json!({"idempotency_key": "day-1", "recipients": {"user_ids": ["u1", "u2"]}, "template_id": "day",
        "params": {"n": 1}, "category": "transactional", "channels": ["email", "sms", "push", "inapp"]}),
    )
    .await?;
    completed(&s, &id).await?;
    let (st, _) = s.call_as(&s.other_key, "GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(st, 404, "another tenant's key does not see it");
    let d = deliveries(&s, &id).await?;
    assert_eq!(d.len(), 8, "u1 and u2 on four channels: {d:?}");
    for x in &d {
        let no_device = x["user_id"] == "u2" && x["channel"] == "push";
        let expected = if no_device { "suppressed" } else { "sent" };
        assert_eq!(x["status"], expected, "{x}");
    }
    let sent = sent_to(&s);
    for (channel, to) in
        [("email", "u1@example.com"), ("email", "u2@example.com"), ("sms", "+8613800001111"), ("sms", "+8613800002222")]
    {
        assert_eq!(sent.get(&(channel.into(), to.into())), Some(&1), "{channel} to {to}: {sent:?}");
    }
    let push: Vec<_> = s.sends().into_iter().filter(|x| x.channel == "push").collect();
    assert_eq!(push.len(), 1, "{push:?}");
    let endpoint = push[0].to.clone();
    let e = next_event(&mut socket).await?;
    assert_eq!(e["type"], "inbox.message", "the live feed pushed the in-app message: {e}");
    // The mail's links point at the stack's public URL, signed.
    let mail = s.sends().into_iter().find(|x| x.channel == "email").map(|x| x.body).unwrap_or_default();
    assert!(mail.contains(&format!("{}/t/c/", s.public_url)), "click link: {mail}");
    assert!(mail.contains(&format!("{}/t/o/", s.public_url)), "open pixel: {mail}");
    assert!(!mail.contains("127.0.0.1"), "{mail}");

    // A campaign to the segment: one mail to each member.
    let id = notify(
        &s,
        json!({"idempotency_key": "day-2", "recipients": {"segment": "vip"}, "template_id": "day",
        "params": {"n": 2}, "category": "marketing", "channels": ["email"]}),
    )
    .await?;
    completed(&s, &id).await?;
    for to in ["u1@example.com", "u2@example.com"] {
        assert_eq!(sent_to(&s).get(&("email".into(), to.into())), Some(&2), "{to}: {:?}", sent_to(&s));
    }
    // A scheduled send, cancelled.
    let send_at = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let later = notify(
        &s,
        json!({"idempotency_key": "day-3", "recipients": {"user_ids": ["u1"]}, "template_id": "day",
        "params": {"n": 3}, "category": "transactional", "channels": ["email"], "send_at": send_at}),
    )
    .await?;
    ok(&s, "POST", &format!("/v1/notifications/{later}/cancel"), None).await?;

    // The inbox read, and the read pushed live.
    let inbox = ok(&s, "GET", "/v1/users/u1/inbox", None).await?;
    let message = inbox["items"][0]["message_id"].as_str().unwrap_or_default().to_owned();
    ok(&s, "POST", &format!("/v1/users/u1/inbox/{message}/read"), None).await?;
    let e = next_event(&mut socket).await?;
    assert_eq!(e["type"], "inbox.read", "{e}");
    // A second in-app message comes live; a client that asks what it missed since the first
    // (the WebSocket API's $default route) gets the second replayed.
    let id = notify(
        &s,
        json!({"idempotency_key": "day-4", "recipients": {"user_ids": ["u1"]}, "template_id": "day",
        "params": {"n": 4}, "category": "transactional", "channels": ["inapp"]}),
    )
    .await?;
    completed(&s, &id).await?;
    let e = next_event(&mut socket).await?;
    assert_eq!(e["type"], "inbox.message", "{e}");
    let second = e["message"]["message_id"].clone();
    socket.send(Message::Text(json!({"type": "since", "message_id": message}).to_string().into())).await?;
    let e = next_event(&mut socket).await?;
    assert_eq!(e["message"]["message_id"], second, "replayed through $default: {e}");

    // The shop's own site through the api function (docs/site.md): the user token reaches the
    // user's inbox, an archive is pushed through the WebSocket API, CORS answers the tenant's
    // origin only, and the token opens no API-key route.
    ok(&s, "PUT", "/v1/settings/allowed-origins", Some(json!({"origins": ["https://shop.example"]}))).await?;
    let mine = ok_as(&s, &token, "GET", "/v1/me/inbox", None).await?;
    assert_eq!(mine["unread_count"], 1, "{mine}");
    assert_eq!(mine["items"][0]["message_id"], second, "{mine}");
    let archived =
        ok_as(&s, &token, "POST", &format!("/v1/me/inbox/{}/archive", second.as_str().unwrap_or("")), None).await?;
    assert_eq!(archived["unread_count"], 0, "{archived}");
    let e = next_event(&mut socket).await?;
    assert_eq!(e, json!({"type": "inbox.archived", "message_id": second, "unread_count": 0}), "pushed live");
    let mine = ok_as(&s, &token, "GET", "/v1/me/inbox", None).await?;
    assert!(mine["items"].as_array().is_some_and(|i| i.iter().all(|m| m["message_id"] != second)), "{mine}");
    let prefs = ok_as(&s, &token, "PUT", "/v1/me/preferences", Some(json!({"channels": {"sms": false}}))).await?;
    assert_eq!(
        (&prefs["channels"]["sms"], &prefs["catalog"]["channels"][0]),
        (&json!(false), &json!("email")),
        "{prefs}"
    );
    ok(&s, "PUT", "/v1/users/u1/preferences", Some(json!({"channels": {"sms": true}}))).await?;
    let (st, v) = s.call_as(&token, "GET", "/v1/users/u1/inbox", None).await?;
    assert_eq!(st, 401, "a user token on an API-key route: {v}");
    let (st, v) = s.call("GET", "/v1/me/inbox", None).await?;
    assert_eq!(st, 401, "an API key on /v1/me: {v}");
    let cors = |origin: &'static str| {
        let (s, token) = (&s, &token);
        async move {
            let res =
                s.http.get(format!("{}/v1/me/inbox", s.api)).bearer_auth(token).header("origin", origin).send().await?;
            let allow = res.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap_or("").to_owned());
            anyhow::Ok((res.status().as_u16(), allow))
        }
    };
    assert_eq!(cors("https://shop.example").await?, (200, Some("https://shop.example".to_owned())));
    assert_eq!(cors("https://evil.example").await?, (403, None));
    let preflight = s
        .http
        .request(reqwest::Method::OPTIONS, format!("{}/v1/me/inbox/read-all", s.api))
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .send()
        .await?;
    assert_eq!(preflight.status().as_u16(), 204, "the preflight reaches the api function");
    // The WebSocket API's $connect checks the page's origin against the tenant's list.
    let feed = format!("{}?token={token}", s.ws);
    assert!(crate::site::feed_from(&feed, Some("https://shop.example")).await?.is_ok(), "an allowed origin");
    assert_eq!(crate::site::feed_from(&feed, Some("https://evil.example")).await?.err(), Some(403), "another origin");
    assert!(preflight.headers().get("access-control-allow-methods").is_some());

    // The push service reports the endpoint gone: the device is deleted (registering it again
    // makes it new).
    let event = json!({"EndpointArn": endpoint, "EventType": "DeliveryFailure", "FailureType": "EndpointDisabled",
        "FailureMessage": "x", "MessageId": "m", "Resource": "arn:aws:sns:us-east-1:123456789012:app/APNS/x",
        "Service": "SNS", "Time": "2026-11-30T00:00:00.000Z"});
    // Published to the template's push events topic, delivered by its subscription.
    let push_topic = crate::lambda::template::topic_arn(&s.spec.name, "PushEventsTopic");
    let (_, delivered) = s.publish(&push_topic, &event).await?;
    anyhow::ensure!(
        delivered.len() == 1 && delivered[0].1 == 200 && delivered[0].0.ends_with("/v1/callbacks/push"),
        "push callback: {delivered:?}"
    );
    let (st, _) =
        s.call("POST", "/v1/devices", Some(json!({"user_id": "u1", "platform": "ios", "token": "tok-day-1"}))).await?;
    assert_eq!(st, 201, "the dead device was deleted");

    // Orders: one paid, one left to expire; the waiter hears when its unit is back.
    ok(&s, "PUT", "/v1/inventory/sku-day", Some(json!({"on_hand": 2}))).await?;
    let order = |id: &str, hold: u32| json!({"order_id": id, "user_id": "u2", "items": [{"sku_id": "sku-day", "qty": 1}], "hold_seconds": hold});
    ok(&s, "POST", "/v1/orders", Some(order("paid", 300))).await?;
    ok(&s, "POST", "/v1/orders/paid/pay", None).await?;
    ok(&s, "POST", "/v1/orders", Some(order("held", 3))).await?;
    ok(&s, "POST", "/v1/stock-subscriptions", Some(json!({"user_id": "u1", "sku_id": "sku-day"}))).await?;
    s.eventually(WAIT, "the hold to expire (a timer on the timers queue, run by tick)", || async {
        let (_, o) = s.call("GET", "/v1/orders/held", None).await?;
        Ok((o["status"] == "CANCELLED").then_some(()))
    })
    .await?;
    s.eventually(WAIT, "the waiter's back-in-stock mail", || async {
        Ok(s.sends().iter().any(|m| m.to == "u1@example.com" && m.body.contains("sku-day")).then_some(()))
    })
    .await?;
    ok(
        &s,
        "POST",
        "/v1/stock-events",
        Some(json!({"event": "stock.in", "skuId": "sku-day", "qty": 3, "source": "purchase_order", "eventId": "po-day-1"})),
    )
    .await?;
    ok(
        &s,
        "POST",
        "/v1/inventory/sku-day/adjustments",
        Some(json!({"delta": 1, "source": "manual", "idempotency_key": "adj-1"})),
    )
    .await?;
    ok(&s, "GET", "/v1/inventory/sku-day/ledger", None).await?;
    // Stock on its way: the subscriber who asked hears the date (a task on the timers queue);
    // the purchase order's arrival closes the shipment.
    ok(&s, "PUT", "/v1/inventory/sku-soon", Some(json!({"on_hand": 0}))).await?;
    let asks = json!({"user_id": "u1", "sku_id": "sku-soon", "notify_incoming": true});
    ok(&s, "POST", "/v1/stock-subscriptions", Some(asks)).await?;
    let shipment = json!({"ref": "po-soon", "qty": 5, "expected_at": "2027-01-04T09:00:00Z"});
    ok(&s, "POST", "/v1/inventory/sku-soon/incoming", Some(shipment)).await?;
    s.eventually(WAIT, "the expected date told", || async {
        Ok(s.sends()
            .iter()
            .any(|m| m.to == "u1@example.com" && m.body.contains("expected on 2027-01-04"))
            .then_some(()))
    })
    .await?;
    let arrival = json!({"delta": 5, "source": "purchase_order", "ref": "po-soon", "idempotency_key": "soon-1"});
    let stock = ok(&s, "POST", "/v1/inventory/sku-soon/adjustments", Some(arrival)).await?;
    anyhow::ensure!(stock.get("incoming").is_none() && stock["available"] == 5, "the arrival closes it: {stock}");

    // The scheduled jobs, as EventBridge fires them.
    for job in ["restock-scan", "reconcile", "tick"] {
        s.fire(job).await?;
    }
    ok(&s, "POST", "/v1/ops/reconcile", None).await?;

    // A counter moved behind the ledger's back: the reconcile function records one finding
    // however often it runs, under its own policy; the API settles it with a corrective entry
    // (under its policy: the finding moves from open to settled), and the next run is clean.
    {
        use tidings_core::ports::{Cond, Key, Table, Update};
        // The stacks' DynamoDB, which is not the one of AWS_ENDPOINT_URL_DYNAMODB in `make test`.
        let table = s.table().await?;
        let stock = Key::new("T#acme#SKU#sku-day", "STOCK");
        table.update(&stock, vec![Update::add("available", 1)], Cond::Exists).await?;
    }
    let first = s.fire("reconcile").await?;
    let again = s.fire("reconcile").await?;
    assert_eq!((first["opened"].as_u64(), again["opened"].as_u64()), (Some(1), Some(0)), "{first} {again}");
    let open = ok_as(&s, &s.ops_key, "GET", "/v1/ops/inventory-findings?status=open", None).await?;
    assert_eq!(open["items"].as_array().map(Vec::len), Some(1), "{open}");
    let id = open["items"][0]["id"].as_str().unwrap_or_default().to_owned();
    let settle = json!({"kind": "corrective_entry", "reason": "shelf count"});
    ok_as(&s, &s.ops_key, "POST", &format!("/v1/ops/inventory-findings/{id}/settle"), Some(settle)).await?;
    let after = s.fire("reconcile").await?;
    assert_eq!(after["discrepancies"], json!([]), "{after}");

    // A dead letter: a task no worker can read goes to its DLQ, is listed, and is redriven.
    let email_high = s.queue_urls["EmailHighQueue"].clone();
    s.sqs.send_message().queue_url(&email_high).message_body("{\"not\":\"a task\"}").send().await?;
    let depth = |v: &Value| -> i64 {
        v["queues"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| q["name"] == "email-high")
            .map_or(-1, |q| q["dlq_depth"].as_i64().unwrap_or(-1))
    };
    s.eventually(WAIT, "the bad task in email-high's DLQ", || async {
        let v = ok_as(&s, &s.ops_key, "GET", "/v1/ops/queues", None).await?;
        Ok((depth(&v) == 1).then_some(()))
    })
    .await?;
    let (st, v) = s.call("POST", "/v1/ops/dlq/email-high/redrive", None).await?;
    assert_eq!((st, v["code"].as_str()), (403, Some("operator_only")), "a tenant key redrove a shared queue: {v}");
    let redriven = ok_as(&s, &s.ops_key, "POST", "/v1/ops/dlq/email-high/redrive", None).await?;
    assert_eq!(redriven["moved"], 1, "{redriven}");

    // Keys: the operator key `tidings keys create` made (the harness's) makes a tenant key
    // through the API; it works, is listed without its secret, and once `tidings keys revoke`
    // has run it is refused within seconds.
    let made = ok_as(
        &s,
        &s.ops_key,
        "POST",
        "/v1/admin/keys",
        Some(json!({"role": "tenant", "tenant": "acme", "name": "pos"})),
    )
    .await?;
    let (new_key, new_id) = (made["key"].as_str().unwrap_or_default(), made["id"].as_str().unwrap_or_default());
    ok_as(&s, new_key, "PUT", "/v1/users/u-key", Some(json!({"email": "k@example.com"}))).await?;
    let listed = ok_as(&s, &s.ops_key, "GET", "/v1/admin/keys?tenant=acme", None).await?;
    assert!(listed["keys"].as_array().is_some_and(|k| k.iter().any(|k| k["id"] == new_id)), "{listed}");
    assert!(!listed.to_string().contains(new_key), "a listing showed a secret");
    let (st, _) = s.call_as(new_key, "GET", "/v1/admin/keys", None).await?;
    assert_eq!(st, 403, "a tenant key listed keys");
    crate::lambda::keys_cli(&s.table, &["revoke", new_id]).await?;
    s.eventually(Duration::from_secs(10), "the revoked key refused", || async {
        let (st, _) = s.call_as(new_key, "GET", "/v1/users/u-key", None).await?;
        Ok((st == 401).then_some(()))
    })
    .await?;

    // Time for the last messages; then every function ran, and nothing was refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refused = s.refused();
    assert!(refused.is_empty(), "template.yaml does not allow what the functions call:\n{}", refused.join("\n"));
    let requests = s.requests();
    eprintln!("requests by function: {}", serde_json::to_string_pretty(&requests)?);
    eprintln!("functions: {}", serde_json::to_string_pretty(&s.stats())?);
    println!("lambda budget: {}", s.budget());
    for f in [
        "api",
        "commerce-api",
        "messages-api",
        "public-api",
        "outbox-relay",
        "orchestrator",
        "channel-worker",
        "tick",
        "reconcile",
        "restock-scan",
        "ws-connections",
    ] {
        assert!(requests.contains_key(f), "{f} made no request: {requests:?}");
    }
    assert_eq!(s.stream_given_up.load(std::sync::atomic::Ordering::SeqCst), 0, "no stream record was given up");
    let stats = s.stats();
    for (f, st) in &stats {
        assert!(st.init_failures.is_empty(), "{f}: {:?}", st.init_failures);
        assert_eq!(st.out_of_memory, 0, "{f} went over its MemorySize");
    }
    Ok(())
}

async fn runs(s: &Stack, id: &str) -> anyhow::Result<Vec<Value>> {
    let v = ok(s, "GET", &format!("/v1/notifications/{id}/runs"), None).await?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// A run's steps as `index:type:status:channel`.
fn trail(run: &Value) -> Vec<String> {
    run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            let channel = x["channel"].as_str().unwrap_or("-");
            format!(
                "{}:{}:{}:{channel}",
                x["index"],
                x["type"].as_str().unwrap_or(""),
                x["status"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Disables the push endpoint of a device token, as the push service does with a token that is
/// no longer valid (a send to it then fails with `EndpointDisabled`).
async fn disable_endpoint(s: &Stack, token: &str) -> anyhow::Result<()> {
    let sdk = tidings_aws::sdk_defaults().region("us-east-1").load().await;
    let sns = aws_sdk_sns::Client::new(&sdk);
    let apps = sns.list_platform_applications().send().await?;
    for app in apps.platform_applications() {
        let arn = app.platform_application_arn().unwrap_or_default();
        if !arn.contains(&s.spec.name) {
            continue;
        }
        let endpoints = sns.list_endpoints_by_platform_application().platform_application_arn(arn).send().await?;
        for e in endpoints.endpoints() {
            if e.attributes().and_then(|a| a.get("Token")).is_some_and(|t| t == token) {
                sns.set_endpoint_attributes()
                    .endpoint_arn(e.endpoint_arn().unwrap_or_default())
                    .attributes("Enabled", "false")
                    .send()
                    .await?;
                return Ok(());
            }
        }
    }
    anyhow::bail!("no endpoint of {token}")
}

/// Workflows in the shape that ships: the runs start on the request lanes (the orchestrator), a
/// digest's window longer than an SQS delay waits in a durable timer bucket that `tick`'s
/// schedule fires, the timers lane (the `tick` function) closes it and plans its send for the
/// channel worker, and a fallback's sends wake their runs through the timers queue from the
/// channel worker; each function under the policy `template.yaml` gives it.
pub async fn workflows_through_the_function_binaries() -> anyhow::Result<()> {
    let opts = Options { parameters: vec![("WebhookAllowPrivateTargets".into(), "true".into())], ..Options::default() };
    let s = Stack::start(opts).await?;
    // Each run's end is told to the shop's endpoint, whichever function ends it.
    let rx = crate::webhooks::Receiver::start().await?;
    let hook = ok(&s, "POST", "/v1/webhooks", Some(json!({"url": rx.url, "events": ["workflow.run_ended"]}))).await?;
    rx.trust(hook["secret"].as_str().unwrap_or_default());
    let comment = json!({"default_locale": "en", "locales": {"en": {"email_subject": "{{ count }} new",
        "email_body": "{{ count }} comments{% for e in events %} [{{ e.author }}]{% endfor %} on {{ post_id }}"}}});
    ok(&s, "PUT", "/v1/templates/comment", Some(comment)).await?;
    let note = json!({"default_locale": "en", "locales": {"en": {"email_subject": "note", "email_body": "note {{ post_id }}",
        "sms": "sms {{ post_id }}", "push_title": "push", "push_body": "push {{ post_id }}"}}});
    ok(&s, "PUT", "/v1/templates/note", Some(note)).await?;
    // w1 has only an email address; w2 an address, a phone and a device.
    ok(&s, "PUT", "/v1/users/w1", Some(json!({"email": "w1@example.com"}))).await?;
    ok(&s, "PUT", "/v1/users/w2", Some(json!({"email": "w2@example.com", "phone": "+14155550142"}))).await?;
    ok(&s, "POST", "/v1/devices", Some(json!({"user_id": "w2", "platform": "android", "token": "tok-wf-2"}))).await?;
    // w3 has a device the push service has disabled, and a phone.
    ok(&s, "PUT", "/v1/users/w3", Some(json!({"email": "w3@example.com", "phone": "+14155550143"}))).await?;
    ok(&s, "POST", "/v1/devices", Some(json!({"user_id": "w3", "platform": "ios", "token": "tok-wf-3"}))).await?;
    disable_endpoint(&s, "tok-wf-3").await?;
    let digest = json!({"name": "Comments", "category": "transactional", "steps": [
        {"type": "digest", "window": "20m", "key": "{{ post_id }}"},
        {"type": "send", "channel": "email", "template_id": "comment"}]});
    ok(&s, "PUT", "/v1/workflows/comments", Some(digest)).await?;
    let fallback = json!({"name": "Notes", "category": "transactional", "steps": [
        {"type": "send", "channels": ["push", "sms", "email"], "template_id": "note"}]});
    ok(&s, "PUT", "/v1/workflows/notes", Some(fallback)).await?;

    // Two comments on one post: one run opens the window and waits, the other joins it and ends.
    let trigger = |key: &str, author: &str| {
        json!({"idempotency_key": key, "recipients": {"user_ids": ["w1"]}, "workflow_id": "comments",
            "params": {"post_id": "p1", "author": author}})
    };
    let a = notify(&s, trigger("wf-c1", "a1")).await?;
    let b = notify(&s, trigger("wf-c2", "a2")).await?;
    let (leader, joined) = s
        .eventually(WAIT, "one run waiting on the digest, the other merged", || async {
            let (ra, rb) = (runs(&s, &a).await?, runs(&s, &b).await?);
            let (Some(ra), Some(rb)) = (ra.first(), rb.first()) else { return Ok(None) };
            Ok(match (ra["status"].as_str(), rb["status"].as_str()) {
                (Some("waiting"), Some("completed")) => Some(((a.clone(), ra.clone()), (b.clone(), rb.clone()))),
                (Some("completed"), Some("waiting")) => Some(((b.clone(), rb.clone()), (a.clone(), ra.clone()))),
                _ => None,
            })
        })
        .await?;
    let ((leader, run), (joined, merged)) = (leader, joined);
    assert_eq!(trail(&merged), ["0:digest:merged:-"], "{merged}");
    assert_eq!(trail(&run), ["0:digest:waiting:-"], "{run}");
    let until = run["waiting_until"].as_str().unwrap_or_default();
    let until = chrono::DateTime::parse_from_rfc3339(until)?.with_timezone(&chrono::Utc);
    let ahead = until - chrono::Utc::now();
    assert!(ahead > chrono::Duration::minutes(19), "the window closes in 20 minutes: {run}");
    let view = completed(&s, &joined).await?;
    assert_eq!(view["runs_open"], 0, "{view}");
    let (_, view) = s.call("GET", &format!("/v1/notifications/{leader}"), None).await?;
    assert_eq!((view["status"].as_str(), view["runs_open"].as_u64()), (Some("processing"), Some(1)), "{view}");

    // The close is further off than an SQS delay reaches: a durable timer, in its minute's
    // bucket. Time passes for it (the harness cannot move the functions' clocks:
    // `Stack::bring_forward`), and tick's schedule fires the bucket.
    let is_close = |task: &Value| task["kind"] == "workflow.digest" && task["notification_id"] == leader.as_str();
    let timers = s.durable_timers(is_close).await?;
    assert_eq!(timers.len(), 1, "the window's close, a durable timer: {timers:?}");
    let fifteen =
        tidings_core::timers::bucket_of((chrono::Utc::now() + chrono::Duration::minutes(15)).timestamp_millis());
    assert!(timers[0].0 > fifteen, "in a bucket past an SQS delay's reach: {timers:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!s.sends().iter().any(|m| m.to == "w1@example.com"), "nothing before the window closes");
    let moved = s.bring_forward(is_close).await?;
    assert_eq!(moved.len(), 1, "{moved:?}");
    let fired = s.fire("tick").await?;
    eprintln!("tick: {fired}");
    let first_author = if leader == a { "a1" } else { "a2" };
    let second_author = if leader == a { "a2" } else { "a1" };
    let mail = s
        .eventually(WAIT, "the digest's one mail", || async {
            Ok(s.sends().into_iter().find(|m| m.to == "w1@example.com").map(|m| m.body))
        })
        .await?;
    let expected = format!("2 comments [{first_author}] [{second_author}] on p1");
    assert!(mail.contains(&expected), "{expected} (the leader's first): {mail}");
    assert!(s.durable_timers(is_close).await?.is_empty(), "the fired timer was deleted");
    let view = completed(&s, &leader).await?;
    assert_eq!(view["runs_open"], 0, "{view}");
    let run = runs(&s, &leader).await?.first().cloned().unwrap_or_default();
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(trail(&run), ["0:digest:digested:-", "1:send:queued:email"], "{run}");
    assert_eq!(run["steps"][0]["detail"], "2 events", "{run}");

    // A fallback: w1 has no device and no phone, so push and SMS give way to email; w2's push
    // gets through, and nothing else is sent to w2; w3's push fails for good (the endpoint is
    // disabled), so SMS follows. Each run ends when its send's end wakes it (the channel worker,
    // through the timers queue) or its check does.
    let f = notify(
        &s,
        json!({"idempotency_key": "wf-f1", "recipients": {"user_ids": ["w1", "w2", "w3"]}, "workflow_id": "notes",
            "params": {"post_id": "p3"}}),
    )
    .await?;
    let view = s
        .eventually(WAIT, "the fallback's runs to end", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{f}"), None).await?;
            Ok((v["status"] != "processing" && v["status"] != "accepted").then_some(v))
        })
        .await?;
    // w3's push failed: the contract counts it (a failed delivery beside sent ones), though the
    // fallback made up for it and every run completed.
    assert_eq!(view["status"], "completed_with_failures", "{view}");
    assert_eq!(view["runs_open"], 0, "{view}");
    let counts = &view["counts"];
    assert_eq!(
        (counts["sent"].as_u64(), counts["failed"].as_u64(), counts["suppressed"].as_u64()),
        (Some(3), Some(1), Some(2)),
        "{view}"
    );
    let by_user: BTreeMap<String, Value> =
        runs(&s, &f).await?.into_iter().map(|r| (r["user_id"].as_str().unwrap_or("").to_owned(), r)).collect();
    // A send found sent already when its delivery is read back is `sent`, else `queued`.
    let queued_or_sent = |x: &str| x.replace(":sent:", ":queued:");
    let w1: Vec<String> = trail(&by_user["w1"]).iter().map(|x| queued_or_sent(x)).collect();
    assert_eq!(
        w1,
        ["0:send:suppressed:push", "0:send:suppressed:sms", "0:send:queued:email", "0:send:done:email"],
        "{}",
        by_user["w1"]
    );
    let w2: Vec<String> = trail(&by_user["w2"]).iter().map(|x| queued_or_sent(x)).collect();
    assert_eq!(w2, ["0:send:queued:push", "0:send:done:push"], "{}", by_user["w2"]);
    let w3: Vec<String> = trail(&by_user["w3"]).iter().map(|x| queued_or_sent(x)).collect();
    assert_eq!(
        w3,
        ["0:send:queued:push", "0:send:fell_back:push", "0:send:queued:sms", "0:send:done:sms"],
        "{}",
        by_user["w3"]
    );
    for r in by_user.values() {
        assert_eq!(r["status"], "completed", "{r}");
    }
    let sent = sent_to(&s);
    assert_eq!(sent.get(&("email".into(), "w1@example.com".into())), Some(&2), "the digest and the note: {sent:?}");
    assert_eq!(sent.get(&("sms".into(), "+14155550143".into())), Some(&1), "w3's SMS once: {sent:?}");
    let others = |(c, to): &&(String, String)| {
        (c == "sms" && to != "+14155550143") || to.starts_with("w2@") || to.starts_with("w3@")
    };
    assert!(!sent.keys().any(|k| others(&k)), "{sent:?}");
    let push: Vec<_> = s.sends().into_iter().filter(|m| m.channel == "push").collect();
    assert_eq!(push.len(), 1, "w2's push once (w3's was refused by the push service): {push:?}");
    let d = deliveries(&s, &f).await?;
    let statuses: BTreeMap<(String, String), String> = d
        .iter()
        .map(|x| {
            let key = (x["user_id"].as_str().unwrap_or("").to_owned(), x["channel"].as_str().unwrap_or("").to_owned());
            (key, x["status"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    let expected: BTreeMap<(String, String), String> = [
        (("w1", "push"), "suppressed"),
        (("w1", "sms"), "suppressed"),
        (("w1", "email"), "sent"),
        (("w2", "push"), "sent"),
        (("w3", "push"), "failed"),
        (("w3", "sms"), "sent"),
    ]
    .into_iter()
    .map(|((u, c), st)| ((u.to_owned(), c.to_owned()), st.to_owned()))
    .collect();
    assert_eq!(statuses, expected, "{d:?}");

    // Five runs ended (the merged one on the request lane, the digest's and the fallbacks' on
    // the timers lane): five posts, each once, signed.
    let ended = s
        .eventually(WAIT, "a workflow.run_ended post per run", || async {
            let posts: Vec<_> = rx.posts().into_iter().filter(|p| p.kind == "workflow.run_ended").collect();
            Ok((posts.len() >= 5).then_some(posts))
        })
        .await?;
    let mut told: Vec<(String, String, String)> = ended
        .iter()
        .map(|p| {
            let d = &p.body["data"];
            let field = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
            (field("notification_id"), field("user_id"), field("status"))
        })
        .collect();
    told.sort();
    let mut runs_ended: Vec<(String, String, String)> = [&a, &b, &f, &f, &f]
        .iter()
        .zip(["w1", "w1", "w1", "w2", "w3"])
        .map(|(n, u)| ((*n).clone(), u.to_owned(), "completed".to_owned()))
        .collect();
    runs_ended.sort();
    assert_eq!(told, runs_ended, "{ended:?}");
    assert!(ended.iter().all(|p| p.verified_by == vec![0]), "{ended:?}");

    // Time for the last messages (the wakes of sends already judged); nothing was refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let posts = rx.posts().into_iter().filter(|p| p.kind == "workflow.run_ended").count();
    assert_eq!(posts, 5, "no run's end told twice: {:?}", rx.posts());
    let refused = s.refused();
    assert!(refused.is_empty(), "template.yaml does not allow what the functions call:\n{}", refused.join("\n"));
    eprintln!("requests by function: {}", serde_json::to_string_pretty(&s.requests())?);
    assert_eq!(s.stream_given_up.load(std::sync::atomic::Ordering::SeqCst), 0, "no stream record was given up");
    Ok(())
}

/// A policy without a statement its function needs fails that function as AWS would: the API
/// without its SSM grant does not start (every request answers 500), the channel worker
/// without its SES grant sends no mail.
pub async fn a_policy_without_a_needed_statement_fails_its_function() -> anyhow::Result<()> {
    let opts = Options { without_statements: vec![("api", "SigningKey")], warm: false, ..Options::default() };
    let s = Stack::start(opts).await?;
    let (st, _) = s.call("GET", "/healthz", None).await?;
    assert_eq!(st, 500, "an API that cannot start answers as API Gateway does");
    let failures = s.stats()["api"].init_failures.clone();
    assert!(!failures.is_empty(), "the api started without its signing key");
    let refused = s.refused();
    assert!(refused.iter().any(|r| r.contains("api") && r.contains("ssm:GetParameter")), "{refused:?}");
    drop(s);

    let opts = Options { without_statements: vec![("channel-worker", "SendEmail")], ..Options::default() };
    let s = Stack::start(opts).await?;
    let template =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "<p>Hi</p>"}}});
    ok(&s, "PUT", "/v1/templates/t", Some(template)).await?;
    ok(&s, "PUT", "/v1/users/u1", Some(json!({"email": "u1@example.com"}))).await?;
    notify(
        &s,
        json!({"idempotency_key": "k1", "recipients": {"user_ids": ["u1"]}, "template_id": "t",
        "category": "transactional", "channels": ["email"]}),
    )
    .await?;
    let refused = s
        .eventually(WAIT, "the send to be refused", || async {
            let r = s.refused();
            Ok(r.iter().any(|r| r.contains("channel-worker") && r.contains("ses:SendEmail")).then_some(r))
        })
        .await?;
    assert!(s.sends().is_empty(), "a mail went out without the grant: {:?} {refused:?}", s.sends());
    Ok(())
}

/// A campaign of the harness's cost scenario: its category and channel, and the budgets a
/// change that made its deliveries dearer would break (per delivered notification).
pub struct CostCase {
    pub category: &'static str,
    pub channel: &'static str,
    /// DynamoDB write request units.
    pub write_units: f64,
    /// SQS requests (the tasks' sends, the event source mappings' receives and deletes).
    pub sqs_requests: f64,
    /// AWS requests billed by the request (all but DynamoDB's, billed by its units), the
    /// provider's own included.
    pub billed_requests: f64,
}

/// The campaigns the cost scenario runs, in order, on one stack and one audience. The email
/// cases fit `make test`; their budgets are wide, about a third over the marketing email figure
/// of the earlier count (docs/deploy.md, "The Lambda budget"), so a change that doubled a delivery's
/// writes fails them. The push cases hold marketing push to the goal its send batches reach
/// (docs/delivery.md, "Send batches": at most 2 write units and 0.2 SQS requests a delivery)
/// and transactional push, which keeps an item per delivery and the two-phase send, to a budget
/// as wide as transactional email's. Marketing SMS goes out in send batches too and is held to
/// the same goal. `TIDINGS_E2E_CAMPAIGN_CASES=marketing/push,...` runs some.
pub const COST_CASES: [CostCase; 5] = [
    CostCase { category: "marketing", channel: "email", write_units: 14.0, sqs_requests: 0.5, billed_requests: 1.7 },
    CostCase {
        category: "transactional",
        channel: "email",
        write_units: 16.0,
        sqs_requests: 1.0,
        billed_requests: 2.6,
    },
    CostCase { category: "marketing", channel: "push", write_units: 2.0, sqs_requests: 0.2, billed_requests: 1.3 },
    CostCase { category: "marketing", channel: "sms", write_units: 2.0, sqs_requests: 0.2, billed_requests: 1.3 },
    CostCase { category: "transactional", channel: "push", write_units: 16.0, sqs_requests: 1.0, billed_requests: 2.6 },
];

/// The AWS cost of campaigns per delivered message, counted as AWS would bill them: every
/// request each function makes, and the event source mappings' receives and deletes (DynamoDB
/// stream reads by Lambda are not billed), with DynamoDB's request units by operation and item.
/// Each campaign of [`COST_CASES`] goes to every member (each with an email address, a phone number and a
/// device); its `cost per delivery: {...}` line is the table of docs/performance.md, "AWS cost per
/// delivery"), and its budgets are asserted.
pub async fn campaigns_through_the_function_binaries_within_their_cost_budgets() -> anyhow::Result<()> {
    use futures::StreamExt;
    // 200 in `make test` (CI's two cores run every binary under emulation); the figure of docs/performance.md
    // is for TIDINGS_E2E_CAMPAIGN_MEMBERS=2000.
    let members: usize = std::env::var("TIDINGS_E2E_CAMPAIGN_MEMBERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let s = Stack::start(Options { concurrency: 3, ..Options::default() }).await?;
    let puts = futures::stream::iter(0..members)
        .map(|i| {
            let s = &s;
            async move {
                let user =
                    json!({"email": format!("k{i}@example.com"), "phone": format!("+1415555{i:04}"), "tags": ["all"]});
                let (st, v) = s.call("PUT", &format!("/v1/users/k{i:04}"), Some(user)).await?;
                anyhow::ensure!(st == 200, "{v}");
                let device = json!({"user_id": format!("k{i:04}"), "platform": "ios", "token": format!("tok-k{i:04}")});
                let (st, v) = s.call("POST", "/v1/devices", Some(device)).await?;
                anyhow::ensure!((200..300).contains(&st), "{v}");
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for r in puts {
        r?;
    }
    let template = json!({"default_locale": "en", "locales": {"en": {"email_subject": "Sale", "email_body": "Hi {{ user_id }}",
        "push_title": "Sale", "push_body": "Hi {{ user_id }}", "sms": "Sale for {{ user_id }}"}}});
    ok(&s, "PUT", "/v1/templates/promo", Some(template)).await?;
    let wanted = std::env::var("TIDINGS_E2E_CAMPAIGN_CASES").ok();
    let mut over = Vec::new();
    for (n, case) in COST_CASES.iter().enumerate() {
        let name = format!("{}/{}", case.category, case.channel);
        if wanted.as_deref().is_some_and(|w| !w.split(',').any(|c| c.trim() == name)) {
            continue;
        }
        over.extend(campaign_cost(&s, members, n, case).await?);
    }
    anyhow::ensure!(over.is_empty(), "over budget: {over:?}");
    Ok(())
}

/// One campaign of the cost scenario: sent to every member once, its cost printed; what is over
/// its budgets.
async fn campaign_cost(s: &Stack, members: usize, n: usize, case: &CostCase) -> anyhow::Result<Vec<String>> {
    let CostCase { category, channel, .. } = *case;
    // The function API Gateway sends the notification routes to (`template.yaml`).
    let served_by = crate::lambda::gateway::function_serving("POST", "/v1/notifications")?;
    anyhow::ensure!(
        crate::lambda::gateway::function_serving("GET", "/v1/notifications/x")? == served_by,
        "the notification routes are served by one function"
    );
    let before = s.requests();
    let units_before = s.units_by();
    let sent_before = s.sends().len();
    let id = notify(
        s,
        json!({"idempotency_key": format!("all-{n}"), "recipients": {"segment": "all"}, "template_id": "promo",
        "category": category, "channels": [channel]}),
    )
    .await?;
    // The requests of the function that serves the notification routes after this are the
    // test's own polling, not the campaign's.
    let accepted = s.requests();
    let view = s
        .eventually(Duration::from_secs(900), "the campaign to complete", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == "completed").then_some(v))
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(view["counts"]["sent"], members, "{category} {channel}: {view}");
    let sends: Vec<_> = s.sends().into_iter().skip(sent_before).filter(|m| m.channel == channel).collect();
    let to: std::collections::BTreeSet<_> = sends.iter().map(|m| m.to.clone()).collect();
    assert_eq!(sends.len(), members, "{category} {channel}: one send per member");
    assert_eq!(to.len(), members);

    let after = s.requests();
    let mut billed = 0u64;
    let mut breakdown: BTreeMap<String, u64> = BTreeMap::new();
    for (function, ops) in &after {
        let ops = if *function == served_by { accepted.get(function).unwrap_or(ops) } else { ops };
        for (op, n) in ops {
            let n = n - before.get(function).and_then(|o| o.get(op)).copied().unwrap_or(0);
            if n == 0 || op.starts_with("DynamoDBStreams.") {
                continue;
            }
            billed += n;
            let op = op.split('@').next().unwrap_or(op);
            *breakdown.entry(format!("{function} {op}")).or_default() += n;
        }
    }
    // Long polls that found nothing are billed too, but they are the idle cost of a queue,
    // not of a delivery: shown, not charged to the campaign.
    let idle: u64 = breakdown.iter().filter(|(k, _)| k.contains("(empty)")).map(|(_, n)| n).sum();
    let per = |n: f64| (n / members as f64 * 1000.0).round() / 1000.0;
    let requests = per((billed - idle) as f64);
    // DynamoDB bills request units, not requests: the requests billed as requests are the
    // others' (SQS, SNS, SES, SSM...).
    let dynamodb: u64 = breakdown.iter().filter(|(k, _)| k.contains(" DynamoDB.")).map(|(_, n)| n).sum();
    let billed_requests = per((billed - idle - dynamodb) as f64);
    // Units by operation and item, the pipeline's: the function that serves the notification
    // routes is left out, its acceptance (a fixed cost of the campaign, whatever its size) and
    // the test's polls after it alike.
    let mut units: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let served = format!("{served_by} ");
    for (k, (w, r)) in &s.units_by() {
        let (w0, r0) = units_before.get(k).copied().unwrap_or_default();
        let (w, r) = (w - w0, r - r0);
        if (w, r) != (0.0, 0.0) && !k.starts_with(&served) {
            units.insert(k.clone(), (w, r));
        }
    }
    let write_units = per(units.values().map(|u| u.0).sum());
    let read_units = per(units.values().map(|u| u.1).sum());
    let sqs_ops: BTreeMap<String, f64> = breakdown
        .iter()
        .filter(|(k, _)| k.contains(" SQS.") && !k.contains("(empty)"))
        .map(|(k, n)| (k.clone(), per(*n as f64)))
        .collect();
    let sqs = per(sqs_ops.values().sum::<f64>() * members as f64);
    // On-demand list prices in us-east-1: DynamoDB $1.25 per million write request units and
    // $0.25 per million read request units, SQS $0.40 per million requests.
    let usd = ((write_units * 1.25 + read_units * 0.25 + sqs * 0.40) * 100.0).round() / 100.0;
    let write_by: BTreeMap<&String, f64> =
        units.iter().filter(|(_, u)| u.0 > 0.0).map(|(k, u)| (k, per(u.0))).collect();
    let read_by: BTreeMap<&String, f64> = units.iter().filter(|(_, u)| u.1 > 0.0).map(|(k, u)| (k, per(u.1))).collect();
    let cost = json!({
        "category": category, "channel": channel, "members": members,
        "dynamodb_write_units": write_units, "dynamodb_read_units": read_units, "sqs_requests": sqs,
        "aws_requests": requests, "requests_billed_by_the_request": billed_requests, "usd_per_million_before_provider_and_lambda": usd,
        "write_units_by_operation_and_item": write_by,
        "read_units_by_operation_and_item": read_by,
        "sqs_by_operation": sqs_ops,
        "requests_by_function_and_operation": breakdown,
        "empty_long_polls_besides": idle,
    });
    println!("cost per delivery: {cost}");
    let mut over = Vec::new();
    let budgets = [
        ("DynamoDB write units", write_units, case.write_units),
        ("SQS requests", sqs, case.sqs_requests),
        ("requests billed by the request", billed_requests, case.billed_requests),
    ];
    for (what, measured, budget) in budgets {
        if measured > budget {
            over.push(format!("{category} {channel}: {measured} {what} per delivery (budget {budget})"));
        }
    }
    Ok(over)
}

/// A `PublicUrl` naming a local host (which the parameter's pattern lets through) stops the
/// functions that make links before they take any work; the others start.
pub async fn a_local_public_url_stops_the_functions_that_make_links() -> anyhow::Result<()> {
    let opts = Options { public_url: "https://localhost:8443".into(), warm: false, ..Options::default() };
    let s = Stack::start(opts).await?;
    let (st, _) = s.call("GET", "/healthz", None).await?;
    assert_eq!(st, 500, "the api must not start");
    let failures = s.stats()["api"].init_failures.join("\n");
    assert!(failures.contains("TIDINGS_PUBLIC_URL"), "{failures}");
    let report = s.fire("reconcile").await?;
    assert!(report["checked"].is_number(), "reconcile makes no links and starts: {report}");
    assert!(s.stats()["reconcile"].init_failures.is_empty());
    Ok(())
}
