//! Inventory through the HTTP API, on both backends (issue 4's "done when"; the AWS backend
//! runs against the emulator with less concurrency than the core tests).

use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

/// Concurrent single-unit orders against `units`: returns (accepted, refused as insufficient).
/// A buyer answered 409 `write_conflict` (other orders held the stock item at that moment past
/// the server's own retries; nothing was written) sends the same order again after
/// `Retry-After`, as a client should; so does a buyer whose call timed out (the client's 30 s,
/// as API Gateway's 29 s would cut it), since the order id makes a repeat safe: a committed
/// order answers 200 with itself, counted as accepted once. Any other answer, a 5xx above all,
/// fails the test.
async fn rush(s: &Server, sku: &str, buyers: usize) -> anyhow::Result<(usize, usize)> {
    let calls = (0..buyers).map(|i| {
        let body = json!({"order_id": format!("{sku}-o{i}"), "user_id": format!("b{i}"), "items": [{"sku_id": sku, "qty": 1}]});
        s.place_order(body)
    });
    let (mut accepted, mut refused) = (0, 0);
    for result in join_all(calls).await {
        let (st, v): (u16, Value) = result?;
        match st {
            200 | 201 => accepted += 1,
            409 => {
                assert_eq!(v["code"], "insufficient_stock", "{v}");
                refused += 1;
            }
            other => panic!("unexpected answer {other}: {v}"),
        }
    }
    Ok((accepted, refused))
}

async fn stock(s: &Server, sku: &str) -> anyhow::Result<Value> {
    let (st, v) = s.call("GET", &format!("/v1/inventory/{sku}"), None).await?;
    assert_eq!(st, 200, "{v}");
    Ok(v)
}

async fn ledger_sums(s: &Server, sku: &str) -> anyhow::Result<(i64, i64, i64)> {
    let (mut a, mut r, mut d) = (0, 0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/inventory/{sku}/ledger?limit=500&cursor={c}"),
            None => format!("/v1/inventory/{sku}/ledger?limit=500"),
        };
        let (st, v) = s.call("GET", &path, None).await?;
        assert_eq!(st, 200, "{v}");
        for e in v["items"].as_array().cloned().unwrap_or_default() {
            a += e["delta_available"].as_i64().unwrap_or(0);
            r += e["delta_reserved"].as_i64().unwrap_or(0);
            d += e["delta_sold"].as_i64().unwrap_or(0);
        }
        cursor = v["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            return Ok((a, r, d));
        }
    }
}

pub async fn concurrent_orders_never_oversell_plain_and_sharded(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    // On the AWS backend every buyer's transaction meets DynamoDB's conflicts on the SKU's
    // stock item (or shard); fewer than on the embedded backend, for the emulator's speed.
    let (buyers, units) = if backend == Backend::Aws { (100, 20) } else { (400, 40) };
    for (sku, shards) in [("plain", None), ("hot", Some(8))] {
        let mut body = json!({"on_hand": units});
        if let Some(n) = shards {
            body["shards"] = json!(n);
        }
        let (st, v) = s.call("PUT", &format!("/v1/inventory/{sku}"), Some(body)).await?;
        assert_eq!(st, 201, "{v}");
        let (accepted, refused) = rush(&s, sku, buyers).await?;
        assert_eq!((accepted, refused), (units, buyers - units), "{sku}: exactly the stock is sold");
        let v = stock(&s, sku).await?;
        assert_eq!((v["available"].as_i64(), v["reserved"].as_i64()), (Some(0), Some(units as i64)), "{v}");
        assert_eq!(ledger_sums(&s, sku).await?, (0, units as i64, 0), "{sku}: the ledger sums to the counters");
    }
    let (_, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
    assert_eq!(report["discrepancies"], json!([]), "{report}");
    Ok(())
}

pub async fn pay_cancel_and_expiry_race_and_release_once(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options { manual_clock: true, ..Options::default() }).await?;
    s.call("PUT", "/v1/inventory/race", Some(json!({"on_hand": 20}))).await?;
    for i in 0..10 {
        let body = json!({"order_id": format!("r{i}"), "user_id": "u", "items": [{"sku_id": "race", "qty": 2}], "hold_seconds": 60});
        let (st, v) = s.call("POST", "/v1/orders", Some(body)).await?;
        assert_eq!(st, 201, "{v}");
    }
    // Pay and cancel race on every order; then the holds' time runs out.
    let calls = (0..10).flat_map(|i| ["pay", "cancel"].map(move |action| (i, action)));
    let server = &s;
    let answers = join_all(calls.map(|(i, action)| async move {
        server.call("POST", &format!("/v1/orders/r{i}/{action}"), None).await.map(|(st, _)| st)
    }))
    .await;
    for st in answers {
        assert!(matches!(st?, 200 | 409), "each action either wins or is refused");
    }
    s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 120}))).await?;
    s.call("POST", "/dev/schedules/tick/run", None).await?;
    let mut paid = 0;
    for i in 0..10 {
        let (_, o) = s.call("GET", &format!("/v1/orders/r{i}"), None).await?;
        match o["status"].as_str() {
            Some("PAID") => paid += 1,
            Some("CANCELLED") => {}
            other => panic!("order r{i} ended {other:?}: {o}"),
        }
    }
    let v = stock(&s, "race").await?;
    assert_eq!(
        (v["available"].as_i64(), v["reserved"].as_i64(), v["sold"].as_i64()),
        (Some(20 - 2 * paid), Some(0), Some(2 * paid)),
        "each hold released at most once: {v}"
    );
    let (a, r, d) = ledger_sums(&s, "race").await?;
    assert_eq!((a, r, d), (20 - 2 * paid, 0, 2 * paid));
    let (_, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
    assert_eq!(report["discrepancies"], json!([]), "{report}");
    Ok(())
}

pub async fn short_multi_sku_order_holds_nothing(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    s.call("PUT", "/v1/inventory/ma", Some(json!({"on_hand": 5}))).await?;
    s.call("PUT", "/v1/inventory/mb", Some(json!({"on_hand": 1}))).await?;
    let body =
        json!({"order_id": "multi", "user_id": "u", "items": [{"sku_id": "ma", "qty": 3}, {"sku_id": "mb", "qty": 2}]});
    let (st, v) = s.call("POST", "/v1/orders", Some(body)).await?;
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["code"], "insufficient_stock");
    assert!(v["detail"].as_str().unwrap_or_default().contains("mb"), "names the short sku: {v}");
    assert_eq!(stock(&s, "ma").await?["available"], 5, "nothing held on the other sku");
    assert_eq!(stock(&s, "mb").await?["available"], 1);
    Ok(())
}

pub async fn an_expired_hold_is_released_and_its_waiters_are_alerted(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options { manual_clock: true, ..Options::default() };
    opts.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "1000".into()));
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    let s = Server::start(backend, opts).await?;
    s.call("PUT", "/v1/users/waiter", Some(json!({"email": "waiter@example.com"}))).await?;
    s.call("PUT", "/v1/inventory/last", Some(json!({"on_hand": 1}))).await?;
    let (st, v) = s.call("POST", "/v1/orders", Some(json!({"order_id": "hold", "user_id": "buyer", "items": [{"sku_id": "last", "qty": 1}], "hold_seconds": 300}))).await?;
    assert_eq!(st, 201, "{v}");
    assert_eq!(stock(&s, "last").await?["available"], 0);
    let (st, v) =
        s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": "waiter", "sku_id": "last"}))).await?;
    assert_eq!(st, 201, "{v}");
    // Not paid in time: the hold expires (manual clock) and the unit is back.
    s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 301}))).await?;
    s.call("POST", "/dev/schedules/tick/run", None).await?;
    let order = s
        .eventually(Duration::from_secs(90), "the hold to expire", || async {
            let (_, o) = s.call("GET", "/v1/orders/hold", None).await?;
            Ok((o["status"] == "CANCELLED").then_some(o))
        })
        .await?;
    assert_eq!(order["status"], "CANCELLED");
    let v = stock(&s, "last").await?;
    assert_eq!((v["available"].as_i64(), v["reserved"].as_i64()), (Some(1), Some(0)), "{v}");
    // The SKU went from 0 to 1: a restock round opens and the waiter hears of it.
    let mail = s
        .eventually(Duration::from_secs(180), "the waiter's back-in-stock message", || async {
            s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 2}))).await?;
            let (_, v) = s.call("GET", "/dev/deliveries?user_id=waiter&channel=email", None).await?;
            Ok(v.as_array().and_then(|a| a.first().cloned()))
        })
        .await?;
    assert!(mail["body"].as_str().unwrap_or_default().contains("last"), "{mail}");
    Ok(())
}

/// The open findings, as an operator lists them.
async fn open_findings(s: &Server) -> anyhow::Result<Vec<Value>> {
    let (st, page) = s.ops("GET", "/v1/ops/inventory-findings?status=open", None).await?;
    anyhow::ensure!(st == 200, "listing findings: {st} {page}");
    Ok(page["items"].as_array().cloned().unwrap_or_default())
}

/// Messages waiting on the review queue (nothing consumes it: a person reads it).
async fn reviews_waiting(s: &Server) -> anyhow::Result<i64> {
    let (_, v) = s.ops("GET", "/v1/ops/queues", None).await?;
    let q = v["queues"].as_array().into_iter().flatten().find(|q| q["name"] == "inventory-review");
    Ok(q.map_or(-1, |q| q["visible"].as_i64().unwrap_or(-1)))
}

/// Discrepancies go to a person (docs/inventory.md, "Findings"): a difference is one finding and
/// one message on the review queue however many runs see it, a start's run included; only an
/// operator lists and settles it, with a reason, once; a corrective entry moves the ledger alone
/// and the next run finds nothing; an accepted difference is not reopened, by a run or a start.
pub async fn a_finding_is_queued_once_and_settled_by_an_operator(backend: Backend) -> anyhow::Result<()> {
    use tidings_core::ports::{Key, Update};
    // The start's run comes after the server answers; a loaded run on the emulators took more
    // than 30 s to record its finding. A pass returns at once.
    let wait = Duration::from_secs(120);
    let mut s = Server::start(backend, Options::default()).await?;
    for sku in ["drift", "known"] {
        let (st, v) = s.call("PUT", &format!("/v1/inventory/{sku}"), Some(json!({"on_hand": 10}))).await?;
        assert_eq!(st, 201, "{v}");
    }
    let stock_key = |sku: &str| Key::new(format!("T#acme#SKU#{sku}"), "STOCK");
    // Two more available than the ledger says; the start's reconciliation sees it.
    s.write_behind_its_back(stock_key("drift"), vec![Update::add("available", 2)]).await?;
    s.eventually(wait, "the start's run to record the finding", || async {
        Ok(open_findings(&s).await?.iter().any(|f| f["sku_id"] == "drift").then_some(()))
    })
    .await?;
    for _ in 0..2 {
        let (st, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
        assert_eq!((st, report["opened"].as_u64()), (200, Some(0)), "the same difference again: {report}");
    }
    let open = open_findings(&s).await?;
    assert_eq!(open.len(), 1, "three runs, one finding: {open:?}");
    let f = &open[0];
    assert_eq!((&f["tenant"], &f["times_seen"]), (&json!("acme"), &json!(3)), "{f}");
    assert_eq!(f["difference"], json!({"available": 2, "reserved": 0, "sold": 0}), "{f}");
    assert!(reviews_waiting(&s).await? <= 1, "queued once at most");
    let id = f["id"].as_str().unwrap_or_default().to_owned();
    let settle = format!("/v1/ops/inventory-findings/{id}/settle");

    // Operators only; a reason is required.
    let (st, v) = s.call("GET", "/v1/ops/inventory-findings", None).await?;
    assert_eq!((st, v["code"].as_str()), (403, Some("operator_only")), "{v}");
    let (st, v) = s.call("POST", &settle, Some(json!({"kind": "accepted", "reason": "mine"}))).await?;
    assert_eq!((st, v["code"].as_str()), (403, Some("operator_only")), "{v}");
    let (st, v) = s.ops("POST", &settle, Some(json!({"kind": "corrective_entry"}))).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("reason")), "{v}");

    // A corrective entry: the ledger moves, the counters do not; settled once.
    let body = json!({"kind": "corrective_entry", "reason": "shelf count: 12"});
    let (st, v) = s.ops("POST", &settle, Some(body.clone())).await?;
    assert_eq!(
        (st, &v["status"], &v["settlement"]["kind"]),
        (200, &json!("settled"), &json!("corrective_entry")),
        "{v}"
    );
    let (st, v) = s.ops("POST", &settle, Some(body)).await?;
    assert_eq!((st, v["code"].as_str()), (409, Some("already_settled")), "{v}");
    let v = stock(&s, "drift").await?;
    assert_eq!(
        (v["available"].as_i64(), v["reserved"].as_i64()),
        (Some(12), Some(0)),
        "the counters did not move: {v}"
    );
    assert_eq!(ledger_sums(&s, "drift").await?, (12, 0, 0), "the ledger agrees");
    let (_, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
    assert_eq!((report["discrepancies"].clone(), report["opened"].as_u64()), (json!([]), Some(0)), "{report}");
    assert!(open_findings(&s).await?.is_empty());

    // Accepted: reported by every run under that finding, never opened again.
    s.write_behind_its_back(stock_key("known"), vec![Update::add("available", -1)]).await?;
    let known = s
        .eventually(wait, "the start's run to record the second finding", || async {
            Ok(open_findings(&s).await?.into_iter().find(|f| f["sku_id"] == "known"))
        })
        .await?;
    let known_id = known["id"].clone();
    let accept = format!("/v1/ops/inventory-findings/{}/settle", known_id.as_str().unwrap_or_default());
    let (st, v) = s.ops("POST", &accept, Some(json!({"kind": "accepted", "reason": "lost in the move"}))).await?;
    assert_eq!((st, &v["settlement"]["kind"]), (200, &json!("accepted")), "{v}");
    s.restart_with_crash_at(None).await?;
    for _ in 0..2 {
        let (_, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
        assert_eq!(report["opened"].as_u64(), Some(0), "{report}");
        assert_eq!(report["discrepancies"][0]["finding_id"], known_id, "{report}");
    }
    assert!(open_findings(&s).await?.is_empty(), "an accepted difference was reopened");
    // Never more than one message per finding. A send that fails is logged and not retried (the
    // record is what counts), so under load on the emulator one may be missing; the core tests
    // count them exactly.
    let waiting = reviews_waiting(&s).await?;
    assert!((1..=2).contains(&waiting), "{waiting} messages for two findings");
    let (_, settled) = s.ops("GET", "/v1/ops/inventory-findings?status=settled", None).await?;
    assert_eq!(settled["items"].as_array().map(Vec::len), Some(2), "{settled}");
    Ok(())
}

/// Incoming stock through the API (docs/inventory.md, "Incoming stock"): a shipment recorded
/// (201, then 200 for the same again) is shown on its SKU; the subscriber who asked hears its
/// date once, the one who did not never; its purchase order's arrival closes it with the stock
/// in, a second arrival of it is 409 and moves nothing, and the arrival opens the back-in-stock
/// round; another tenant sees none of it.
pub async fn incoming_stock_is_shown_told_once_and_closed_by_its_arrival(backend: Backend) -> anyhow::Result<()> {
    let mut opts = Options { manual_clock: true, ..Options::default() };
    opts.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "1000".into()));
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    let s = Server::start(backend, opts).await?;
    s.call("PUT", "/v1/inventory/kettle", Some(json!({"on_hand": 0}))).await?;
    for (user, asks) in [("asks", true), ("quiet", false)] {
        s.call("PUT", &format!("/v1/users/{user}"), Some(json!({"email": format!("{user}@example.com")}))).await?;
        let body = json!({"user_id": user, "sku_id": "kettle", "notify_incoming": asks});
        let (st, v) = s.call("POST", "/v1/stock-subscriptions", Some(body)).await?;
        assert_eq!(st, 201, "{v}");
    }
    let shipment = json!({"ref": "po-7", "qty": 40, "expected_at": "2026-12-20T09:00:00Z"});
    let (st, v) = s.call("POST", "/v1/inventory/kettle/incoming", Some(shipment.clone())).await?;
    assert_eq!((st, v["status"].as_str()), (201, Some("EXPECTED")), "{v}");
    let (st, _) = s.call("POST", "/v1/inventory/kettle/incoming", Some(shipment)).await?;
    assert_eq!(st, 200);
    let (st, v) = s
        .call("POST", "/v1/inventory/kettle/incoming", Some(json!({"ref": "po-8", "qty": 1, "expected_at": "soon"})))
        .await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("expected_at")), "{v}");
    let v = stock(&s, "kettle").await?;
    assert_eq!(v["incoming"][0]["ref"], "po-7", "{v}");
    assert_eq!(v["incoming"][0]["expected_at"], "2026-12-20T09:00:00.000Z", "{v}");
    let mail = s
        .eventually(Duration::from_secs(60), "the date told to who asked", || async {
            let (_, v) = s.call("GET", "/dev/deliveries?user_id=asks&channel=email", None).await?;
            Ok(v.as_array().and_then(|a| a.first().cloned()))
        })
        .await?;
    assert!(mail["body"].as_str().unwrap_or_default().contains("expected on 2026-12-20"), "{mail}");
    let (st, _) = s.call_as(&s.other_tenant_key(), "GET", "/v1/inventory/kettle", None).await?;
    assert_eq!(st, 404, "another tenant sees nothing");

    let arrival = json!({"delta": 40, "source": "purchase_order", "ref": "po-7", "idempotency_key": "in-1"});
    let (st, v) = s.call("POST", "/v1/inventory/kettle/adjustments", Some(arrival)).await?;
    assert_eq!((st, v["available"].as_i64()), (200, Some(40)), "{v}");
    assert!(v.get("incoming").is_none(), "nothing on its way: {v}");
    let again = json!({"delta": 5, "source": "purchase_order", "ref": "po-7", "idempotency_key": "in-2"});
    let (st, v) = s.call("POST", "/v1/inventory/kettle/adjustments", Some(again)).await?;
    assert_eq!((st, v["code"].as_str()), (409, Some("incoming_received")), "{v}");
    assert_eq!(stock(&s, "kettle").await?["available"], 40);
    // Back in stock: both waiters hear it; who did not ask heard nothing else.
    let quiet = s
        .eventually(Duration::from_secs(180), "the back-in-stock message", || async {
            s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 2}))).await?;
            let (_, v) = s.call("GET", "/dev/deliveries?user_id=quiet&channel=email", None).await?;
            Ok(v.as_array().filter(|a| !a.is_empty()).cloned())
        })
        .await?;
    assert_eq!(quiet.len(), 1, "{quiet:?}");
    assert!(quiet[0]["body"].as_str().unwrap_or_default().contains("back in stock"), "{quiet:?}");
    assert!(s.undocumented().is_empty(), "{:?}", s.undocumented());
    Ok(())
}
