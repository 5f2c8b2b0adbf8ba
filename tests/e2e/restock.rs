//! Back-in-stock alerts, end to end (issue 3, docs/restock.md), on both backends.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(120);

fn options() -> Options {
    let mut o = Options::default();
    // Long enough that both SKUs' events land in u1's window on a loaded machine: with 1.5 s, a
    // CI run processed B's event 3.6 s after A's and sent two messages.
    o.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "6000".into()));
    o.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    o.env.push(("TIDINGS_RESTOCK_RETRY_DELAYS_MS", "1000,1000,1000".into()));
    o
}

async fn emails(s: &Server, user: &str) -> anyhow::Result<Vec<Value>> {
    let (st, v) = s.call("GET", &format!("/dev/deliveries?user_id={user}&channel=email"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v.as_array().cloned().unwrap_or_default())
}

async fn setup(s: &Server, users: &[&str], skus: &[&str]) -> anyhow::Result<()> {
    for u in users {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    for sku in skus {
        let (st, v) = s.call("PUT", &format!("/v1/inventory/{sku}"), Some(json!({"on_hand": 0}))).await?;
        assert_eq!(st, 201, "{v}");
    }
    Ok(())
}

async fn subscribe(s: &Server, user: &str, sku: &str) -> anyhow::Result<(u16, String)> {
    let (st, v) = s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": user, "sku_id": sku}))).await?;
    assert!(st == 201 || st == 200, "{st} {v}");
    assert_eq!(v["status"], "WAITING");
    Ok((st, v["subscription_id"].as_str().unwrap_or_default().to_owned()))
}

async fn stock_in(s: &Server, sku: &str, qty: i64) -> anyhow::Result<()> {
    // Each call is another arrival of stock: an upstream id of its own.
    static ARRIVALS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = ARRIVALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let body = json!({"event": "stock.in", "skuId": sku, "qty": qty, "source": "purchase_order", "eventId": format!("po-{sku}-{n}")});
    let (st, v) = s.call("POST", "/v1/stock-events", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    Ok(())
}

pub async fn event_and_scan_race_send_one_merged_message(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, options()).await?;
    setup(&s, &["u1", "u2", "u3"], &["A", "B"]).await?;
    let (st, a1) = subscribe(&s, "u1", "A").await?;
    assert_eq!(st, 201);
    let (st, again) = subscribe(&s, "u1", "A").await?;
    assert_eq!((st, again.as_str()), (200, a1.as_str()), "a repeat returns the WAITING one");
    subscribe(&s, "u1", "B").await?;
    subscribe(&s, "u2", "A").await?;
    let (_, c) = subscribe(&s, "u3", "A").await?;
    let (st, v) = s.call("DELETE", &format!("/v1/stock-subscriptions/{c}"), None).await?;
    assert_eq!((st, v["status"].as_str()), (200, Some("CANCELLED")), "{v}");

    // The events and the scan race on the same rounds.
    stock_in(&s, "A", 5).await?;
    stock_in(&s, "B", 2).await?;
    for _ in 0..3 {
        let (st, v) = s.call("POST", "/dev/schedules/restock-scan/run", None).await?;
        assert_eq!(st, 200, "{v}");
    }
    let mails = s
        .eventually(WAIT, "u1's merged message and u2's", || async {
            let (m1, m2) = (emails(&s, "u1").await?, emails(&s, "u2").await?);
            Ok((!m1.is_empty() && !m2.is_empty()).then_some(m1))
        })
        .await?;
    // Time for any duplicate to show up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    s.call("POST", "/dev/schedules/restock-scan/run", None).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m1 = emails(&s, "u1").await?;
    assert_eq!(m1.len(), 1, "u1: one message for both SKUs: {m1:?}");
    let body = mails[0]["body"].as_str().unwrap_or_default();
    assert!(body.contains('A') && body.contains('B'), "{body}");
    assert_eq!(emails(&s, "u2").await?.len(), 1);
    assert!(emails(&s, "u3").await?.is_empty(), "cancelled: nothing");
    let (st, v) = s.call("GET", "/v1/users/u1/stock-subscriptions", None).await?;
    assert_eq!(st, 200);
    let statuses: Vec<&str> = v["items"].as_array().unwrap().iter().filter_map(|i| i["status"].as_str()).collect();
    assert_eq!(statuses, vec!["NOTIFIED", "NOTIFIED"], "{v}");
    let (_, v) = s.call("GET", "/v1/users/u3/stock-subscriptions", None).await?;
    assert_eq!(v["items"][0]["status"], "CANCELLED");
    Ok(())
}

pub async fn bad_input_retries_manual_and_resend(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, options()).await?;
    setup(&s, &["u1"], &["A"]).await?;
    // Problem documents, never a 500.
    let (st, ct, _) = s.raw("POST", "/v1/stock-subscriptions", "{not json", Some(&s.key)).await?;
    assert_eq!((st, ct.as_str()), (400, "application/problem+json"));
    let (st, v) = s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": "u#1", "sku_id": "A"}))).await?;
    assert_eq!(st, 422, "{v}");
    let (st, v) = s
        .call(
            "POST",
            "/v1/stock-events",
            Some(json!({"event": "stock.in", "skuId": "A", "qty": 0, "source": "purchase_order", "eventId": "po-0"})),
        )
        .await?;
    assert_eq!((st, v["code"].as_str().is_some()), (422, true), "{v}");
    // The upstream's sample shape has no id: refused, naming the field, nothing applied.
    let (st, v) = s
        .call(
            "POST",
            "/v1/stock-events",
            Some(json!({"event": "stock.in", "skuId": "A", "qty": 50, "source": "purchase_order"})),
        )
        .await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("eventId")), "{v}");
    let (_, a) = s.call("GET", "/v1/inventory/A", None).await?;
    assert_eq!(a["available"], 0, "{a}");
    let (st, _) = s.call("GET", "/v1/ops/restock-notices?status=SENT", None).await?;
    assert_eq!(st, 422);
    let (_, sub) = subscribe(&s, "u1", "A").await?;
    let (st, _) = s.call_as(&s.other_tenant_key(), "DELETE", &format!("/v1/stock-subscriptions/{sub}"), None).await?;
    assert_eq!(st, 404, "another tenant's subscription is absent");

    // The channel fails: retries, then MANUAL.
    let (st, v) = s.call("PUT", "/dev/providers/email", Some(json!({"mode": "fail_5xx"}))).await?;
    assert_eq!(st, 200, "{v}");
    stock_in(&s, "A", 1).await?;
    let manual = s
        .eventually(Duration::from_secs(120), "the notice to become MANUAL", || async {
            let (_, v) = s.call("GET", "/v1/ops/restock-notices?status=MANUAL", None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            Ok((!items.is_empty()).then_some(items))
        })
        .await?;
    assert_eq!(manual[0]["attempts"], 4, "{manual:?}");
    let batch = manual[0]["batch_no"].as_str().unwrap_or_default().to_owned();
    assert!(emails(&s, "u1").await?.is_empty());

    // Resend once the channel is back: once per batch.
    s.call("PUT", "/dev/providers/email", Some(json!({"mode": "ok"}))).await?;
    let (st, v) = s.call("POST", "/v1/ops/restock-notices/resend", Some(json!({"batch_no": batch}))).await?;
    assert_eq!((st, v["resent"].as_u64()), (200, Some(1)), "{v}");
    let (st, v) = s.call("POST", "/v1/ops/restock-notices/resend", Some(json!({"batch_no": batch}))).await?;
    assert_eq!((st, v["resent"].as_u64()), (200, Some(0)), "{v}");
    s.eventually(WAIT, "the resent email", || async { Ok((!emails(&s, "u1").await?.is_empty()).then_some(())) })
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(emails(&s, "u1").await?.len(), 1);
    let (st, _) = s.call("POST", "/v1/ops/restock-notices/resend", Some(json!({"batch_no": "nope.r1"}))).await?;
    assert_eq!(st, 404);
    Ok(())
}
