//! The notification slice, end to end.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

// Generous: the AWS backend shares one emulator with the other tests; a pass returns at once.
const WAIT: Duration = Duration::from_secs(180);

async fn setup(s: &Server) -> anyhow::Result<()> {
    for (id, body) in [
        ("u1", json!({"email": "alice@example.com", "phone": "+8613800001234", "locale": "zh-CN"})),
        ("u2", json!({"email": "bob@example.com", "phone": "+14155550100"})),
    ] {
        let (st, _) = s.call("PUT", &format!("/v1/users/{id}"), Some(body)).await?;
        assert_eq!(st, 200);
    }
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/order_shipped",
            Some(json!({
                "default_locale": "en",
                "locales": {
                    "en": {"email_subject": "Order {{ order_id }} shipped", "email_body": "Your order {{ order_id }} is on its way",
                           "sms": "Order {{ order_id }} shipped", "inapp_title": "Shipped", "inapp_body": "Order {{ order_id }} shipped"},
                    "zh-CN": {"email_subject": "订单 {{ order_id }} 已发货", "email_body": "您的订单 {{ order_id }} 已发货", "sms": "订单 {{ order_id }} 已发货"}
                }
            })),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

fn request(key: &str, users: &[&str], channels: &[&str], order_id: &str) -> Value {
    json!({
        "idempotency_key": key,
        "recipients": {"user_ids": users},
        "template_id": "order_shipped",
        "params": {"order_id": order_id},
        "category": "transactional",
        "channels": channels,
    })
}

async fn send(s: &Server, body: Value) -> anyhow::Result<String> {
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(v["notification_id"].as_str().unwrap().to_owned())
}

async fn deliveries(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries?limit=500"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

async fn wait_sends(s: &Server, id: &str, n: usize) -> anyhow::Result<Vec<Value>> {
    s.eventually(WAIT, &format!("{n} sends of {id}"), || async {
        let sends = s.sends(id).await?;
        Ok((sends.len() >= n).then_some(sends))
    })
    .await
}

async fn wait_delivery_status(s: &Server, id: &str, status: &str) -> anyhow::Result<Value> {
    s.eventually(WAIT, &format!("a delivery of {id} to be {status}"), || async {
        let d = deliveries(s, id).await?;
        Ok(d.into_iter().find(|d| d["status"] == status))
    })
    .await
}

pub async fn two_users_on_email_and_sms_get_exactly_four_sends(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let body = request("order-123-shipped", &["u1", "u2"], &["email", "sms"], "123");
    let id = send(&s, body.clone()).await?;
    let sends = wait_sends(&s, &id, 4).await?;
    let mut pairs: Vec<(String, String)> = sends
        .iter()
        .map(|x| (x["user_id"].as_str().unwrap().to_owned(), x["channel"].as_str().unwrap().to_owned()))
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        vec![
            ("u1".into(), "email".into()),
            ("u1".into(), "sms".into()),
            ("u2".into(), "email".into()),
            ("u2".into(), "sms".into())
        ]
    );
    // Locale: u1 reads Chinese, u2 the default.
    let u1_sms = sends.iter().find(|x| x["user_id"] == "u1" && x["channel"] == "sms").unwrap();
    assert_eq!(u1_sms["body"], "订单 123 已发货");
    assert_eq!(u1_sms["to"], "+8613800001234");

    // The same request again: the same id, nothing more sent.
    let again = send(&s, body.clone()).await?;
    assert_eq!(again, id);
    // Another body with the same key: 409.
    let (st, v) =
        s.call("POST", "/v1/notifications", Some(request("order-123-shipped", &["u1"], &["email"], "999"))).await?;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["code"], "idempotency_conflict");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.sends(&id).await?.len(), 4, "a repeated request must not send again");

    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(st, 200);
    assert_eq!(v["counts"]["sent"], 4, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    Ok(())
}

pub async fn transient_failures_back_off_then_send_once(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let (st, _) = s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx", "fail_first_n": 2}))).await?;
    assert_eq!(st, 200);
    let id = send(&s, request("k-5xx", &["u2"], &["email"], "5")).await?;
    let d = wait_delivery_status(&s, &id, "sent").await?;
    assert_eq!(d["attempts"], 3, "two failures then a success: {d}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 1, "sent exactly once: {sends:?}");
    assert_eq!(sends[0]["attempt"], 3);
    Ok(())
}

pub async fn permanent_failure_is_not_retried(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "permanent"}))).await?;
    let id = send(&s, request("k-perm", &["u2"], &["sms"], "6")).await?;
    let d = wait_delivery_status(&s, &id, "failed").await?;
    assert_eq!(d["attempts"], 1, "{d}");
    assert!(d["last_error"].as_str().unwrap().contains("rejected"), "{d}");
    // Heal the provider: a retry would now succeed, so any retry would show.
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "ok"}))).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = deliveries(&s, &id).await?;
    assert_eq!(d[0]["status"], "failed");
    assert_eq!(d[0]["attempts"], 1);
    assert!(s.sends(&id).await?.is_empty());
    Ok(())
}

pub async fn dead_letters_are_redriven_and_delivered_once(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_MAX_RECEIVES", "2".into()));
    // With two receives a message is dead, so a receive it gets while still being handled
    // (its visibility run out under a loaded emulator: a five-user request took 10.5 s) is one
    // of the two: the request itself went to the dead letters before any send. 30 s of
    // visibility, as for the tests that need every send made.
    opts.patient_provider(backend);
    let s = Server::start(backend, opts).await?;
    setup(&s).await?;
    // Five recipients, five messages that all die.
    let users = ["d1", "d2", "d3", "d4", "d5"];
    for u in users {
        s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
    }
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx"}))).await?;
    let id = send(&s, request("k-dlq", &users, &["email"], "7")).await?;
    s.eventually(WAIT, "all five deliveries dead", || async {
        let d = deliveries(&s, &id).await?;
        Ok((d.len() == 5 && d.iter().all(|d| d["status"] == "dead")).then_some(()))
    })
    .await?;
    for d in deliveries(&s, &id).await? {
        // Dead only after `max_receives` tries; more when a task was queued twice (the relay
        // and the queue deliver at least once: each copy counts its own receives).
        assert!(d["attempts"].as_u64().is_some_and(|a| a >= 2), "{d}");
        assert!(d["last_error"].as_str().unwrap().contains("503"), "an operator sees why: {d}");
    }
    // One message per delivery in the DLQ, more when a task was queued twice: each copy dies on
    // its own receives. Settled when nothing is left in email-high itself.
    let dead = s
        .eventually(WAIT, "every copy in email-high's DLQ", || async {
            let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
            let q = v["queues"].as_array().unwrap().iter().find(|q| q["name"] == "email-high").cloned().unwrap();
            let left = ["visible", "in_flight", "delayed"].iter().map(|k| q[k].as_u64().unwrap_or(1)).sum::<u64>();
            let dlq = q["dlq_depth"].as_u64().unwrap_or(0);
            Ok((left == 0 && dlq >= 5).then_some(dlq))
        })
        .await?;
    assert!(s.sends(&id).await?.is_empty());

    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "ok"}))).await?;
    let (st, v) = s.ops("POST", "/v1/ops/dlq/email-high/redrive", None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["moved"], dead, "every dead copy moved back");
    s.eventually(WAIT, "all five sent", || async {
        Ok(deliveries(&s, &id).await?.iter().all(|d| d["status"] == "sent").then_some(()))
    })
    .await?;
    // A second redrive of an empty DLQ changes nothing.
    let (_, v) = s.ops("POST", "/v1/ops/dlq/email-high/redrive", None).await?;
    assert_eq!(v["moved"], 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sends = s.sends(&id).await?;
    let mut to: Vec<_> = sends.iter().map(|x| x["user_id"].as_str().unwrap().to_owned()).collect();
    to.sort();
    assert_eq!(to, users.to_vec(), "each redriven message is processed exactly once more");
    Ok(())
}

pub async fn accepted_work_survives_kill_9(backend: Backend) -> anyhow::Result<()> {
    let mut s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    // The provider fails until the crash, so the work is accepted but not delivered.
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx"}))).await?;
    let id = send(&s, request("k-crash", &["u1", "u2"], &["email"], "8")).await?;
    s.eventually(WAIT, "a failed attempt", || async {
        Ok(deliveries(&s, &id).await?.iter().any(|d| d["attempts"].as_u64().unwrap_or(0) >= 1).then_some(()))
    })
    .await?;
    s.kill9_and_restart().await?; // the provider comes back healthy
    let sends = wait_sends(&s, &id, 2).await?;
    assert_eq!(sends.len(), 2);
    // The provider's record comes first, the delivery's `sent` right after it.
    let v = s
        .eventually(WAIT, "both deliveries recorded sent", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["counts"]["sent"] == 2).then_some(v))
        })
        .await?;
    assert_eq!(v["counts"]["queued"], 0, "{v}");
    assert_eq!(s.sends(&id).await?.len(), 2, "still one send each");
    Ok(())
}

pub async fn inapp_goes_to_the_inbox(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let id = send(&s, request("k-inapp", &["u2"], &["inapp"], "9")).await?;
    let inbox = s
        .eventually(WAIT, "the inbox message", || async {
            let (_, v) = s.call("GET", "/v1/users/u2/inbox", None).await?;
            Ok((v["items"].as_array().is_some_and(|a| !a.is_empty())).then_some(v))
        })
        .await?;
    assert_eq!(inbox["unread_count"], 1);
    assert_eq!(inbox["items"][0]["title"], "Shipped");
    assert_eq!(inbox["items"][0]["body"], "Order 9 shipped");
    let mid = inbox["items"][0]["message_id"].as_str().unwrap().to_owned();
    let (st, v) = s.call("POST", &format!("/v1/users/u2/inbox/{mid}/read"), None).await?;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["unread_count"], 0);
    // Reading twice does not drive the count below zero.
    let (_, v) = s.call("POST", &format!("/v1/users/u2/inbox/{mid}/read"), None).await?;
    assert_eq!(v["unread_count"], 0);
    let (_, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(v["counts"]["sent"], 1);
    Ok(())
}

pub async fn bad_input_gets_problem_documents(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let key = s.key.clone();
    let (st, ct, body) = s.raw("POST", "/v1/notifications", "{not json", Some(&key)).await?;
    assert_eq!(st, 400, "{body}");
    assert_eq!(ct, "application/problem+json");
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["code"], "malformed_json");

    let (st, _, body) = s
        .raw(
            "POST",
            "/v1/notifications",
            r#"{"recipients":{"user_ids":"u1"},"template_id":"t","category":"transactional"}"#,
            Some(&key),
        )
        .await?;
    assert_eq!(st, 400, "{body}");
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["field"], "recipients.user_ids", "{v}");

    let (st, _, body) = s
        .raw(
            "POST",
            "/v1/notifications",
            r#"{"recipients":{"user_ids":["a#b"]},"template_id":"t","category":"transactional"}"#,
            Some(&key),
        )
        .await?;
    assert_eq!(st, 422, "{body}");
    let v: Value = serde_json::from_str(&body)?;
    assert_eq!(v["field"], "recipients.user_ids[0]", "{v}");

    let (st, _, body) = s.raw("PUT", "/v1/users/u9", r#"{"timezone":"Mars/Olympus"}"#, Some(&key)).await?;
    assert_eq!(st, 422, "{body}");
    assert!(body.contains("\"field\":\"timezone\""), "{body}");

    let (st, _, _) = s.raw("GET", "/v1/users/u1", "", None).await?;
    assert_eq!(st, 401);
    let (st, _, _) = s.raw("GET", "/v1/users/u1", "", Some("wrong-key")).await?;
    assert_eq!(st, 401);
    let (st, _, body) = s.raw("GET", "/v1/notifications/does-not-exist", "", Some(&key)).await?;
    assert_eq!(st, 404, "{body}");
    Ok(())
}

pub async fn tenants_are_isolated(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let id = send(&s, request("k-iso", &["u1"], &["inapp"], "10")).await?;
    let other = s.other_tenant_key();
    let (st, _) = s.call_as(&other, "GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(st, 404, "another tenant's notification is absent");
    let (st, _) = s.call_as(&other, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
    assert_eq!(st, 404);
    let (st, _) = s.call_as(&other, "POST", &format!("/v1/notifications/{id}/cancel"), None).await?;
    assert_eq!(st, 404);
    let (st, _) = s.call_as(&other, "GET", "/v1/users/u1", None).await?;
    assert_eq!(st, 404);
    let (st, _) = s.call_as(&other, "GET", "/v1/templates/order_shipped", None).await?;
    assert_eq!(st, 404);
    // Another tenant's template is not this one's: its send of it names no template it has.
    let (st, v) =
        s.call_as(&other, "POST", "/v1/notifications", Some(request("k-iso", &["u1"], &["inapp"], "11"))).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("template_id")), "{v}");
    let (_, template) = s.call("GET", "/v1/templates/order_shipped", None).await?;
    let body = json!({"default_locale": template["default_locale"], "locales": template["locales"]});
    let (st, v) = s.call_as(&other, "PUT", "/v1/templates/order_shipped", Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    // The same idempotency key in another tenant is another request.
    let (st, v) =
        s.call_as(&other, "POST", "/v1/notifications", Some(request("k-iso", &["u1"], &["inapp"], "11"))).await?;
    assert_eq!(st, 202, "{v}");
    assert_ne!(v["notification_id"], id.as_str());
    wait_delivery_status(&s, &id, "sent").await?;
    let (_, inbox) = s.call_as(&other, "GET", "/v1/users/u1/inbox", None).await?;
    assert!(inbox["items"].as_array().unwrap().iter().all(|m| m["body"] != "Order 10 shipped"), "{inbox}");
    Ok(())
}

async fn status_of(s: &Server, id: &str) -> anyhow::Result<Value> {
    let (st, v) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v)
}

/// Waits until the notification has ended (no longer `accepted` or `processing`).
async fn wait_ended(s: &Server, id: &str) -> anyhow::Result<Value> {
    s.eventually(WAIT, &format!("{id} to end"), || async {
        let v = status_of(s, id).await?;
        Ok((!["accepted", "processing"].contains(&v["status"].as_str().unwrap_or_default())).then_some(v))
    })
    .await
}

/// What can be checked before answering is checked: a misspelt template is 422 naming
/// `template_id`, a placeholder the params do not give is 422 `missing_param` naming
/// `params.order_id` (for a list of users and for a campaign alike), a channel the template has
/// no content for is 422 naming it; nothing of them is accepted.
pub async fn a_send_that_cannot_work_is_refused_at_accept(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let refused = |body: Value| {
        let s = &s;
        async move {
            let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
            assert_eq!(st, 422, "{v}");
            anyhow::Ok((
                v["code"].as_str().unwrap_or_default().to_owned(),
                v["field"].as_str().unwrap_or_default().to_owned(),
            ))
        }
    };
    let mut misspelt = request("k-typo", &["u2"], &["sms"], "1");
    misspelt["template_id"] = json!("order_shiped");
    assert_eq!(refused(misspelt).await?, ("invalid_field".into(), "template_id".into()));
    let mut no_param = request("k-noparam", &["u2"], &["sms"], "1");
    no_param["params"] = json!({});
    assert_eq!(refused(no_param.clone()).await?, ("missing_param".into(), "params.order_id".into()));
    // Without `channels`: every channel the template has content for is checked.
    no_param.as_object_mut().unwrap().remove("channels");
    no_param["idempotency_key"] = json!("k-noparam-any");
    assert_eq!(refused(no_param).await?, ("missing_param".into(), "params.order_id".into()));
    let campaign = json!({"recipients": {"segment": "vip"}, "template_id": "order_shipped", "params": {"order": "1"},
                          "category": "marketing"});
    assert_eq!(refused(campaign).await?, ("missing_param".into(), "params.order_id".into()));
    assert_eq!(
        refused(request("k-push", &["u2"], &["push"], "1")).await?,
        ("invalid_field".into(), "channels[0]".into())
    );
    let (st, v) = s.call("GET", "/v1/notifications", None).await?;
    assert_eq!((st, v["items"].as_array().map(Vec::len)), (200, Some(0)), "nothing accepted: {v}");
    // The user attributes need no param: `user_id` and `locale` are each recipient's.
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/hello",
            Some(json!({"default_locale": "en", "locales": {"en": {"sms": "Hi {{ user_id }} {{ locale }}"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let mut hello = request("k-hello", &["u1"], &["sms"], "1");
    hello["template_id"] = json!("hello");
    hello["params"] = json!({});
    send(&s, hello).await?;
    Ok(())
}

/// What only fails for one recipient fails that delivery alone, naming the placeholder, without
/// retries: u2 has no `locale`, which the template shows; u1 gets the message. The notification
/// then reads `completed_with_failures`.
pub async fn a_recipients_missing_attribute_fails_that_delivery_naming_it(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/greet",
            Some(json!({"default_locale": "en", "locales": {
            "en": {"sms": "Hi {{ name }} ({{ locale }})"}, "zh-CN": {"sms": "你好 {{ name }} ({{ locale }})"}}})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let body = json!({"recipients": {"user_ids": ["u1", "u2"]}, "template_id": "greet", "params": {"name": "friend"},
                      "category": "transactional", "channels": ["sms"]});
    let id = send(&s, body).await?;
    let d = wait_delivery_status(&s, &id, "failed").await?;
    assert_eq!(d["user_id"], "u2", "{d}");
    assert_eq!(d["last_error"], "template_error: missing placeholder locale", "{d}");
    assert_eq!(d["attempts"], 0, "never tried at the provider: {d}");
    let v = wait_ended(&s, &id).await?;
    assert_eq!(v["status"], "completed_with_failures", "{v}");
    assert_eq!((v["counts"]["sent"].as_u64(), v["counts"]["failed"].as_u64()), (Some(1), Some(1)), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sends = s.sends(&id).await?;
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(sends[0]["user_id"], "u1");
    assert_eq!(deliveries(&s, &id).await?.iter().find(|d| d["user_id"] == "u2").unwrap()["attempts"], 0, "no retry");
    Ok(())
}

/// The outcome read once every delivery has ended: `failed` when none was sent (the provider
/// refuses every message for good), `completed_with_failures` when some were sent and some
/// failed, `completed` when none failed; suppressed deliveries are not failures.
pub async fn a_notification_reads_how_it_ended(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "permanent"}))).await?;
    let all_failed = send(&s, request("k-all-failed", &["u1", "u2"], &["sms"], "1")).await?;
    let v = wait_ended(&s, &all_failed).await?;
    assert_eq!((v["status"].as_str(), v["counts"]["failed"].as_u64()), (Some("failed"), Some(2)), "{v}");
    let partly = send(&s, request("k-partly", &["u2"], &["email", "sms"], "2")).await?;
    let v = wait_ended(&s, &partly).await?;
    assert_eq!(v["status"], "completed_with_failures", "{v}");
    assert_eq!((v["counts"]["sent"].as_u64(), v["counts"]["failed"].as_u64()), (Some(1), Some(1)), "{v}");
    s.call("PUT", "/dev/providers/sms", Some(json!({"mode": "ok"}))).await?;
    // u3 has no phone: suppressed (no_address), beside u2's sent SMS: completed.
    s.call("PUT", "/v1/users/u3", Some(json!({"email": "carol@example.com"}))).await?;
    let fine = send(&s, request("k-fine", &["u2", "u3"], &["sms"], "3")).await?;
    let v = wait_ended(&s, &fine).await?;
    assert_eq!((v["status"].as_str(), v["counts"]["suppressed"].as_u64()), (Some("completed"), Some(1)), "{v}");
    let (st, v) = s.call("GET", "/v1/notifications?status=failed", None).await?;
    assert_eq!(st, 200, "{v}");
    let ids: Vec<&str> = v["items"].as_array().unwrap().iter().filter_map(|n| n["notification_id"].as_str()).collect();
    assert_eq!(ids, [all_failed.as_str()], "the list filters by the outcome: {v}");
    Ok(())
}

/// The provider fault matrix: 429 with Retry-After, 5xx, timeouts (transient: sent once in the
/// end, after backoff) and a permanent refusal (failed after one attempt, never retried).
pub async fn provider_fault_matrix_loses_nothing_and_never_retries_permanent_errors(
    backend: Backend,
) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    setup(&s).await?;
    let cases = [
        ("email", json!({"mode": "throttle_429", "retry_after_s": 1, "fail_first_n": 2}), "sent", 3),
        ("sms", json!({"mode": "timeout", "fail_first_n": 1}), "sent", 2),
        ("email", json!({"mode": "fail_5xx", "fail_first_n": 2}), "sent", 3),
    ];
    for (i, (channel, fault, want, attempts)) in cases.into_iter().enumerate() {
        let (st, v) = s.call("PUT", &format!("/dev/providers/{channel}"), Some(fault.clone())).await?;
        assert_eq!(st, 200, "{v}");
        let id = send(&s, request(&format!("matrix-{i}"), &["u2"], &[channel], "42")).await?;
        let d = wait_delivery_status(&s, &id, want).await?;
        assert_eq!(d["attempts"], attempts, "{channel} under {fault}: {d}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(s.sends(&id).await?.len(), 1, "{channel}: sent exactly once");
        s.call("PUT", &format!("/dev/providers/{channel}"), Some(json!({"mode": "ok"}))).await?;
    }
    // A permanent refusal: one attempt, then nothing, even once the provider is healthy again.
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "permanent", "fail_first_n": 1}))).await?;
    let id = send(&s, request("matrix-permanent", &["u2"], &["email"], "43")).await?;
    let d = wait_delivery_status(&s, &id, "failed").await?;
    assert_eq!(d["attempts"], 1, "{d}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.sends(&id).await?.is_empty(), "a permanent error is never retried");
    Ok(())
}
