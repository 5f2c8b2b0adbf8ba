//! Cancels that stop (issue 32; docs/delivery.md, "Cancel"; docs/restock.md, "Merge per buyer"),
//! and two small answers of the contract: an order naming an unknown SKU, and a preferences
//! `updated_at` under a clock that stands still.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(180);

/// The server's sends of a notification, as the dev provider recorded them.
async fn sent(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    s.sends(id).await
}

/// Every delivery of a notification, all pages.
async fn deliveries(s: &Server, id: &str) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/notifications/{id}/deliveries?limit=100&cursor={}", urlencode(c)),
            None => format!("/v1/notifications/{id}/deliveries?limit=100"),
        };
        let (st, v) = s.call("GET", &path, None).await?;
        assert_eq!(st, 200, "{v}");
        all.extend(v["items"].as_array().cloned().unwrap_or_default());
        cursor = v["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            return Ok(all);
        }
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn time_of(v: &Value, field: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let text = v[field].as_str()?;
    Some(chrono::DateTime::parse_from_rfc3339(text).ok()?.with_timezone(&chrono::Utc))
}

async fn put_users(s: &Server, prefix: &str, n: usize, tag: &str) -> anyhow::Result<Vec<String>> {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i:04}")).collect();
    // A hundred a call: a loaded run's emulators have taken past the client's 30 s for 300.
    for chunk in ids.chunks(100) {
        let users: Vec<Value> =
            chunk.iter().map(|u| json!({"user_id": u, "email": format!("{u}@example.com"), "tags": [tag]})).collect();
        let (st, v) = s.call("POST", "/v1/users/batch", Some(json!({"users": users}))).await?;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["errors"].as_array().map_or(0, Vec::len), 0, "{v}");
    }
    Ok(ids)
}

async fn put_template(s: &Server) -> anyhow::Result<()> {
    let body =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Sale", "email_body": "Hi {{ user_id }}"}}});
    let (st, v) = s.call("PUT", "/v1/templates/promo", Some(body)).await?;
    assert_eq!(st, 200, "{v}");
    Ok(())
}

/// A campaign of several hundred recipients, paced by the email provider's rate, cancelled
/// while most of it is still pending: 200, and not one send (in the provider's record or a
/// delivery's `sent_at`) after the answer; the record stops growing and every delivery ends
/// `sent` or `suppressed` (`cancelled`), even one whose page or send was cut off at a deadline
/// (`failed`, `outcome_unknown`, for a claim left by a send cut off before the cancel).
pub async fn a_cancelled_campaign_sends_nothing_after_the_answer(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    // Paced by the email provider's rate on the embedded backend; the emulator's own pace (it
    // runs a table's writes one at a time) is slow enough without a gate.
    if backend == Backend::Embedded {
        opts.env.push(("TIDINGS_PROVIDER_RATES", "email:25".into()));
    }
    opts.env.push(("TIDINGS_CAMPAIGN_PAGE_SIZE", "100".into()));
    let s = Server::start(backend, opts).await?;
    let members = if backend == Backend::Aws { 300 } else { 400 };
    put_users(&s, "m", members, "vip").await?;
    put_template(&s).await?;
    let body = json!({"idempotency_key": "sale-cancel", "recipients": {"segment": "vip"}, "template_id": "promo",
                      "category": "marketing", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap_or_default().to_owned();

    // Mid-way: some sent, most still pending.
    s.eventually(WAIT, "the campaign's first sends", || async { Ok((sent(&s, &id).await?.len() >= 20).then_some(())) })
        .await?;
    let (st, v) = s.call("POST", &format!("/v1/notifications/{id}/cancel"), None).await?;
    let answered = chrono::Utc::now();
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "cancelled", "{v}");
    let at_answer = sent(&s, &id).await?.len();
    assert!(at_answer < members, "the cancel came too late to show anything: {at_answer} of {members} sent");

    // Time for any stray send to show up (the cached status was a second old).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sends = sent(&s, &id).await?;
    let late: Vec<&Value> = sends.iter().filter(|v| time_of(v, "at").is_none_or(|at| at > answered)).collect();
    eprintln!("{} of {members} sent before the cancel's answer at {answered}; {} after", sends.len(), late.len());
    assert!(late.is_empty(), "{} sends after the cancel's answer ({answered}), e.g. {:?}", late.len(), late.first());
    assert_eq!(sends.len(), at_answer, "the record grew after the answer");

    // Every delivery ends: the sent ones before the answer, the rest suppressed as cancelled.
    let all = s
        .eventually(WAIT, "every delivery to end", || async {
            let all = deliveries(&s, &id).await?;
            let open = all.iter().filter(|d| matches!(d["status"].as_str(), Some("pending" | "sending"))).count();
            Ok((open == 0).then_some(all))
        })
        .await?;
    for d in &all {
        match d["status"].as_str() {
            Some("sent") => {
                let at = time_of(d, "sent_at");
                assert!(at.is_some_and(|at| at <= answered), "sent after the answer ({answered}): {d}");
            }
            Some("suppressed") => assert_eq!(d["reason"], "cancelled", "{d}"),
            // A claim whose worker was cut off at its invocation's deadline (a loaded run) and
            // whose lease then ran out: not sent again, its outcome unknown; the provider's
            // record above says it was not sent after the answer.
            Some("failed") => assert_eq!(d["reason"], "outcome_unknown", "{d}"),
            _ => panic!("a delivery neither sent nor cancelled: {d}"),
        }
    }
    let sent_deliveries = all.iter().filter(|d| d["status"] == "sent").count();
    assert_eq!(sent_deliveries, at_answer, "each send is a sent delivery");
    let (_, view) = s.call("GET", &format!("/v1/notifications/{id}"), None).await?;
    assert_eq!(view["status"], "cancelled", "{view}");
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list: {undocumented:?}");
    Ok(())
}

/// A notification whose every delivery has ended cannot be cancelled: 409 `already_sent`, and it
/// stays `completed`. One still sending can: 200, and its rest is not sent.
pub async fn cancelling_a_sent_notification_is_409_and_a_partly_sent_one_stops(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_PROVIDER_RATES", "email:4".into()));
    let s = Server::start(backend, opts).await?;
    let users = put_users(&s, "u", 12, "t").await?;
    put_template(&s).await?;
    let notify = |key: &'static str, to: Vec<String>| {
        let s = &s;
        async move {
            let body = json!({"idempotency_key": key, "recipients": {"user_ids": to}, "template_id": "promo",
                              "category": "transactional", "channels": ["email"]});
            let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
            assert_eq!(st, 202, "{v}");
            anyhow::Ok(v["notification_id"].as_str().unwrap_or_default().to_owned())
        }
    };

    // Fully sent: 409, naming why, and nothing changes.
    let done = notify("one", users[..1].to_vec()).await?;
    s.eventually(WAIT, "the first notification to complete", || async {
        let (_, v) = s.call("GET", &format!("/v1/notifications/{done}"), None).await?;
        Ok((v["status"] == "completed").then_some(()))
    })
    .await?;
    let (st, p) = s.call("POST", &format!("/v1/notifications/{done}/cancel"), None).await?;
    assert_eq!(st, 409, "{p}");
    assert_eq!(p["code"], "already_sent", "{p}");
    assert!(p["detail"].as_str().is_some_and(|d| d.contains("nothing is left to cancel")), "{p}");
    let (_, v) = s.call("GET", &format!("/v1/notifications/{done}"), None).await?;
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["counts"]["sent"], 1, "{v}");

    // Partly sent (paced at 4 a second): 200, and the rest is not sent.
    let part = notify("twelve", users.clone()).await?;
    s.eventually(WAIT, "the first sends", || async { Ok((!sent(&s, &part).await?.is_empty()).then_some(())) }).await?;
    let (st, v) = s.call("POST", &format!("/v1/notifications/{part}/cancel"), None).await?;
    let answered = chrono::Utc::now();
    assert_eq!(st, 200, "{v}");
    let at_answer = sent(&s, &part).await?.len();
    assert!(at_answer < users.len(), "all were sent before the cancel: {at_answer}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sends = sent(&s, &part).await?;
    assert_eq!(sends.len(), at_answer, "sent after the cancel's answer");
    assert!(sends.iter().all(|v| time_of(v, "at").is_some_and(|at| at <= answered)), "{sends:?}");
    // Cancelling again is still 200 (it is cancelled), never 409.
    let (st, v) = s.call("POST", &format!("/v1/notifications/{part}/cancel"), None).await?;
    assert_eq!((st, v["status"].as_str()), (200, Some("cancelled")), "{v}");
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list: {undocumented:?}");
    Ok(())
}

/// A back-in-stock subscription cancelled while its SKU waits in the buyer's merge window is left
/// out of the merged message; a window whose every SKU was cancelled sends nothing.
pub async fn a_subscription_cancelled_in_the_merge_window_is_not_notified(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options { manual_clock: true, ..Options::default() };
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    let s = Server::start(backend, opts).await?;
    for u in ["u1", "u2"] {
        let (st, v) =
            s.call("PUT", &format!("/v1/users/{u}"), Some(json!({"email": format!("{u}@example.com")}))).await?;
        assert_eq!(st, 200, "{v}");
    }
    for sku in ["SKU-KEEP", "SKU-DROP"] {
        let (st, v) = s.call("PUT", &format!("/v1/inventory/{sku}"), Some(json!({"on_hand": 0}))).await?;
        assert_eq!(st, 201, "{v}");
    }
    let subscribe = |user: &'static str, sku: &'static str| {
        let s = &s;
        async move {
            let (st, v) =
                s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": user, "sku_id": sku}))).await?;
            assert_eq!(st, 201, "{v}");
            anyhow::Ok(v["subscription_id"].as_str().unwrap_or_default().to_owned())
        }
    };
    subscribe("u1", "SKU-KEEP").await?;
    let u1_drop = subscribe("u1", "SKU-DROP").await?;
    let u2_drop = subscribe("u2", "SKU-DROP").await?;
    for (sku, n) in [("SKU-KEEP", 0), ("SKU-DROP", 1)] {
        let body = json!({"event": "stock.in", "skuId": sku, "qty": 5, "source": "purchase_order", "eventId": format!("po-{n}")});
        let (st, v) = s.call("POST", "/v1/stock-events", Some(body)).await?;
        assert_eq!(st, 202, "{v}");
    }
    // Every subscription notified: its SKU waits in the user's window (60 s, on the manual clock).
    for user in ["u1", "u2"] {
        s.eventually(WAIT, "the subscriptions to be notified", || async {
            let (_, v) = s.call("GET", &format!("/v1/users/{user}/stock-subscriptions"), None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            Ok((!items.is_empty() && items.iter().all(|i| i["status"] == "NOTIFIED")).then_some(()))
        })
        .await?;
    }
    for id in [&u1_drop, &u2_drop] {
        let (st, v) = s.call("DELETE", &format!("/v1/stock-subscriptions/{id}"), None).await?;
        assert_eq!((st, v["status"].as_str()), (200, Some("CANCELLED")), "{v}");
    }
    let emails = |user: &'static str| {
        let s = &s;
        async move {
            let (st, v) = s.call("GET", &format!("/dev/deliveries?user_id={user}&channel=email"), None).await?;
            assert_eq!(st, 200, "{v}");
            anyhow::Ok(v.as_array().cloned().unwrap_or_default())
        }
    };
    assert!(emails("u1").await?.is_empty() && emails("u2").await?.is_empty(), "sent before the window closed");
    let (st, v) = s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 61}))).await?;
    assert_eq!(st, 200, "{v}");
    let mail =
        s.eventually(WAIT, "u1's merged message", || async { Ok(emails("u1").await?.into_iter().next()) }).await?;
    let text =
        format!("{} {}", mail["subject"].as_str().unwrap_or_default(), mail["body"].as_str().unwrap_or_default());
    assert!(text.contains("SKU-KEEP"), "{text}");
    assert!(!text.contains("SKU-DROP"), "a cancelled subscription's SKU was in the message: {text}");
    // Time for u2's window to be flushed too (it closed at the same time as u1's).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(emails("u2").await?.is_empty(), "u2 cancelled the window's only SKU and was notified");
    assert_eq!(emails("u1").await?.len(), 1, "one message");
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list: {undocumented:?}");
    Ok(())
}

/// An order naming a SKU the shop never stocked: 404 naming the item's field, nothing held. A
/// preferences `updated_at` is an RFC 3339 time, and moves on between writes even when the clock
/// does not.
pub async fn an_unknown_sku_is_404_and_preferences_stamps_are_times(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { manual_clock: true, ..Options::default() }).await?;
    let (st, v) = s.call("PUT", "/v1/inventory/KNOWN", Some(json!({"on_hand": 5}))).await?;
    assert_eq!(st, 201, "{v}");
    let body = json!({"order_id": "o-unknown", "user_id": "u1", "items": [{"sku_id": "KNOWN", "qty": 1}, {"sku_id": "NEVER-STOCKED", "qty": 1}]});
    let (st, p) = s.call("POST", "/v1/orders", Some(body)).await?;
    assert_eq!(st, 404, "{p}");
    assert_eq!(p["field"], "items[1].sku_id", "{p}");
    let (_, stock) = s.call("GET", "/v1/inventory/KNOWN", None).await?;
    assert_eq!(stock["available"], 5, "nothing held: {stock}");
    let (st, _) = s.call("GET", "/v1/orders/o-unknown", None).await?;
    assert_eq!(st, 404, "no order was written");

    let (st, v) = s.call("PUT", "/v1/users/p1", Some(json!({"email": "p1@example.com"}))).await?;
    assert_eq!(st, 200, "{v}");
    let mut previous: Option<chrono::DateTime<chrono::Utc>> = None;
    // The manual clock stands still between these writes.
    for on in [false, true, false] {
        let body = json!({"categories": {"marketing": on}});
        let (st, v) = s.call("PUT", "/v1/users/p1/preferences", Some(body)).await?;
        assert_eq!(st, 200, "{v}");
        let at = time_of(&v, "updated_at");
        assert!(at.is_some(), "not an RFC 3339 time: {v}");
        let (_, read) = s.call("GET", "/v1/users/p1/preferences", None).await?;
        assert_eq!(read["updated_at"], v["updated_at"], "{read}");
        if let (Some(p), Some(at)) = (previous, at) {
            assert!(at > p, "{at} after {p}");
        }
        previous = at;
    }
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list: {undocumented:?}");
    Ok(())
}
