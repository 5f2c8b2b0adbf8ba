//! Tidings' own rate gate and the provider (issue 32, docs/gates.md "Time at the gates" and
//! "Retry-After"), on both backends: waiting one's turn at the gate is not the provider's time,
//! and a 429 with `Retry-After` holds the provider for that tenant, and for that tenant only.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);

fn at(v: &Value, field: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v[field].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{field} of {v}: {e}"))
        .with_timezone(&Utc)
}

async fn template(s: &Server, key: &str) -> anyhow::Result<()> {
    let body =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Hi", "email_body": "Hi {{ user_id }}"}}});
    let (st, v) = s.call_as(key, "PUT", "/v1/templates/hi", Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

/// The numbers: `TIDINGS_PROVIDER_TIMEOUT_MS=1500`, an email rate of 5/s and 30
/// marketing emails to a provider that answers at once. 18 of them were closed `failed`
/// (`outcome_unknown`) unsent; now all are sent, each once, at no more than the rate. The
/// metrics' first read then says what went out (`sends_per_s` over the last 10 s, not between
/// two reads) and how long the store made the system wait.
pub async fn marketing_emails_at_five_a_second_are_all_sent(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    // The 1.5 s on the embedded store, where a send that waited its turn at the gate
    // would time out without the fix. On the emulators the fake provider's call is itself a call
    // to moto and a write to DynamoDB Local (its record of the send), which a loaded test run has
    // held past 10 s: a real provider timeout, not time at the gate. There the provider has 20 s
    // and the messages 30 s of visibility (a visibility shorter than the provider's timeout lets
    // a batch start no more than its first sends, and shows the batch again while it waits at
    // the gate), and the test shows the gate's buckets in DynamoDB pacing the campaign with every
    // send made.
    let members = 30;
    if backend == Backend::Aws {
        opts.patient_provider(backend);
    } else {
        opts.env.retain(|(k, _)| *k != "TIDINGS_PROVIDER_TIMEOUT_MS");
        opts.env.push(("TIDINGS_PROVIDER_TIMEOUT_MS", "1500".into()));
    }
    opts.env.push(("TIDINGS_PROVIDER_RATES", "email:5".into()));
    let s = Server::start(backend, opts).await?;
    for i in 0..members {
        let body = json!({"email": format!("m{i}@example.com"), "tags": ["launch"]});
        let (st, v) = s.call("PUT", &format!("/v1/users/m{i:02}"), Some(body)).await?;
        assert_eq!(st, 200, "{v}");
    }
    template(&s, &s.key).await?;
    let body = json!({"idempotency_key": "launch", "recipients": {"segment": "launch"}, "template_id": "hi",
        "category": "marketing", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap_or_default().to_owned();
    let deliveries = s
        .eventually(WAIT, "every delivery to close", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{id}/deliveries?limit=100"), None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let open = items.iter().any(|d| matches!(d["status"].as_str(), Some("pending" | "sending")));
            Ok((items.len() == members && !open).then_some(items))
        })
        .await?;
    let unsent: Vec<&Value> = deliveries.iter().filter(|d| d["status"] != "sent").collect();
    assert!(unsent.is_empty(), "{} of {members} not sent: {unsent:?}", unsent.len());
    assert!(deliveries.iter().all(|d| d["attempts"] == 1), "time at the gate is no attempt: {deliveries:?}");
    let sends = s.sends(&id).await?;
    let mut users: Vec<&str> = sends.iter().filter_map(|m| m["user_id"].as_str()).collect();
    users.sort_unstable();
    users.dedup();
    assert_eq!((sends.len(), users.len()), (members, members), "each member once");
    // The gate still holds (the provider's clock, the record's). A bucket of 5/s holds one send
    // and refills 4 a second (docs/gates.md): at most 1 + 4·W sends in any W seconds, 5 in any
    // second. On the embedded backend the provider is called the instant the gate admits. On
    // the emulators the gate's admission is a DynamoDB write, and the call follows its answer,
    // which a loaded run delays unevenly: there the provider's clock may be up to half a second
    // off the gate's, and a window of W seconds holds at most 1 + 4·(W + 0.5) sends.
    let mut times: Vec<i64> = sends.iter().map(|m| at(m, "at").timestamp_millis()).collect();
    times.sort_unstable();
    let skew_ms = if backend == Backend::Aws { 500 } else { 0 };
    for window_ms in [1000, 3000] {
        let most = times
            .iter()
            .enumerate()
            .map(|(i, t)| times[i..].iter().take_while(|u| **u < t + window_ms).count())
            .max()
            .unwrap_or(0);
        let bound = 1 + (4 * (window_ms + skew_ms) / 1000) as usize;
        assert!(most <= bound, "at most {bound} in {window_ms} ms, {most} were: {times:?}");
    }

    // The metrics' first read: the sends of the last 10 s, and the store's waits. What the
    // provider recorded in those 10 s (less a second for the clocks) must show; a loaded run that
    // reads more than 10 s after the last send reads 0, which is then right.
    let read_at = chrono::Utc::now();
    let (st, m) = s.ops("GET", "/v1/ops/metrics", None).await?;
    assert_eq!(st, 200, "{m}");
    let rate = m["sends_per_s"]["email"].as_f64().unwrap_or(0.0);
    let recent = sends.iter().filter(|v| at(v, "at") > read_at - chrono::Duration::seconds(9)).count();
    assert!(recent == 0 || rate > 0.0, "{recent} sent in the last 9 s, and the first read says none: {m}");
    assert!(rate <= 5.0 + 1e-9, "never above the gate's rate: {m}");
    for op in ["read", "write"] {
        let w = &m["store_wait_ms"][op];
        assert!(w["count"].as_u64().unwrap_or(0) > 0, "{op}: {m}");
        let (p50, p99, max) = (w["p50_ms"].as_f64(), w["p99_ms"].as_f64(), w["max_ms"].as_f64());
        assert!(p50.is_some_and(|p| p >= 0.0) && p99 >= p50 && max >= p99, "{op}: {w}");
    }
    Ok(())
}

/// Without configured rates (the local default), a 429 asking for six seconds: no other send of
/// that tenant reaches the provider before the six seconds have passed (it came one second after),
/// while another tenant's send goes at once. On the emulators the 429 asks for 30 s: a loaded run
/// has taken 13 s to carry the other tenant's send through DynamoDB Local and moto.
pub async fn a_429_with_retry_after_holds_the_provider_for_its_tenant(backend: Backend) -> anyhow::Result<()> {
    let hold_s: i64 = if backend == Backend::Aws { 30 } else { 6 };
    let s = Server::start(backend, Options::default()).await?;
    let other = s.other_tenant_key();
    for key in [&s.key, &other] {
        for u in ["u1", "u2"] {
            let (st, v) = s
                .call_as(key, "PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")})))
                .await?;
            assert_eq!(st, 200, "{v}");
        }
        template(&s, key).await?;
    }
    let (st, v) = s
        .call(
            "PUT",
            "/dev/providers/email",
            Some(json!({"mode": "throttle_429", "retry_after_s": hold_s, "fail_first_n": 1})),
        )
        .await?;
    assert_eq!(st, 200, "{v}");
    let send = |key: String, user: &'static str, n: &'static str| {
        let s = &s;
        async move {
            let body = json!({"idempotency_key": n, "recipients": {"user_ids": [user]}, "template_id": "hi",
                "category": "transactional", "channels": ["email"]});
            let (st, v) = s.call_as(&key, "POST", "/v1/notifications", Some(body)).await?;
            assert_eq!(st, 202, "{v}");
            anyhow::Ok(v["notification_id"].as_str().unwrap_or_default().to_owned())
        }
    };
    let first = send(s.key.clone(), "u1", "first").await?;
    // The 429: the delivery's first failure.
    let failed_at = s
        .eventually(WAIT, "the first send's 429", || async {
            let (_, v) = s.call("GET", &format!("/v1/notifications/{first}/deliveries"), None).await?;
            let d = v["items"][0].clone();
            Ok(d["first_failed_at"].is_string().then(|| at(&d, "first_failed_at")))
        })
        .await?;
    // At once, a send of the same tenant and one of another tenant.
    let second = send(s.key.clone(), "u2", "second").await?;
    let elsewhere = send(other.clone(), "u2", "elsewhere").await?;
    for (id, key) in [(&first, &s.key), (&second, &s.key), (&elsewhere, &other)] {
        s.eventually(WAIT, "each send to go out", || async {
            let (_, v) = s.call_as(key, "GET", &format!("/v1/notifications/{id}/deliveries"), None).await?;
            Ok((v["items"][0]["status"] == "sent").then_some(()))
        })
        .await?;
    }
    let sends = s.sends_all().await?;
    let of = |id: &str| -> DateTime<Utc> {
        let m = sends.iter().find(|m| m["notification_id"] == id).unwrap_or_else(|| panic!("{id} in {sends:?}"));
        at(m, "at")
    };
    // `first_failed_at` is written just after the 429; a little slack for that.
    let held_until = failed_at + chrono::Duration::milliseconds(hold_s * 1000 - 300);
    for id in [&first, &second] {
        assert!(of(id) >= held_until, "{id} reached the provider {} after the 429", of(id) - failed_at);
    }
    assert!(
        of(&elsewhere) < failed_at + chrono::Duration::seconds(hold_s),
        "another tenant is not held: {}",
        of(&elsewhere) - failed_at
    );
    Ok(())
}
