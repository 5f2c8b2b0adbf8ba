//! Backorders through the HTTP API, on both backends (docs/inventory.md, "Backorders and
//! pre-orders"; issue 35's "a backorder is filled before the alert goes out for the same
//! units").

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

async fn stock(s: &Server, sku: &str) -> anyhow::Result<Value> {
    let (st, v) = s.call("GET", &format!("/v1/inventory/{sku}"), None).await?;
    anyhow::ensure!(st == 200, "GET stock: {st} {v}");
    Ok(v)
}

async fn alerts(s: &Server) -> anyhow::Result<usize> {
    let (_, v) = s.call("GET", "/dev/deliveries?user_id=waiter&channel=email", None).await?;
    Ok(v.as_array().map_or(0, Vec::len))
}

/// A waiter is subscribed to a sold-out SKU and a buyer's order past the stock is backordered.
/// Stock equal to the backorder arrives: the order is filled (PENDING, its units held) and no
/// unit becomes available, so no restock round opens and the waiter hears nothing. More stock
/// arrives: those units are available, and the waiter is alerted.
pub async fn a_backorder_is_filled_before_the_alert_goes_out_for_the_same_units(
    backend: Backend,
) -> anyhow::Result<()> {
    let mut opts = Options { manual_clock: true, ..Options::default() };
    opts.env.push(("TIDINGS_RESTOCK_MERGE_WINDOW_MS", "1000".into()));
    opts.env.push(("TIDINGS_RESTOCK_BATCH_PAUSE_MS", "0".into()));
    let s = Server::start(backend, opts).await?;
    s.call("PUT", "/v1/users/waiter", Some(json!({"email": "waiter@example.com"}))).await?;
    s.call("PUT", "/v1/inventory/kettle", Some(json!({"on_hand": 0}))).await?;
    let (st, v) = s.call("PUT", "/v1/inventory/kettle/policy", Some(json!({"backorder_limit": -1}))).await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("backorder_limit")), "{v}");
    let (st, v) = s.call("PUT", "/v1/inventory/kettle/policy", Some(json!({"backorder_limit": 5}))).await?;
    assert_eq!((st, v["policy"]["backorder_limit"].as_i64()), (200, Some(5)), "{v}");
    let (st, v) =
        s.call("POST", "/v1/stock-subscriptions", Some(json!({"user_id": "waiter", "sku_id": "kettle"}))).await?;
    assert_eq!(st, 201, "{v}");
    let order = json!({"order_id": "bo-1", "user_id": "buyer", "items": [{"sku_id": "kettle", "qty": 3}]});
    let (st, v) = s.call("POST", "/v1/orders", Some(order)).await?;
    assert_eq!((st, v["status"].as_str()), (201, Some("BACKORDERED")), "{v}");
    assert_eq!(v["items"][0]["backordered"], 3, "{v}");
    let too_many = json!({"order_id": "bo-2", "user_id": "buyer", "items": [{"sku_id": "kettle", "qty": 3}]});
    let (st, v) = s.call("POST", "/v1/orders", Some(too_many)).await?;
    assert_eq!((st, v["code"].as_str()), (409, Some("insufficient_stock")), "past the limit: {v}");
    let before = stock(&s, "kettle").await?;
    assert_eq!((before["backordered"].as_i64(), before["available"].as_i64()), (Some(3), Some(0)), "{before}");

    // Stock for exactly the backorder: the order is filled, nothing becomes available.
    let arrival = json!({"delta": 3, "source": "purchase_order", "idempotency_key": "in-1"});
    let (st, v) = s.call("POST", "/v1/inventory/kettle/adjustments", Some(arrival)).await?;
    assert_eq!(st, 200, "{v}");
    let filled = s
        .eventually(Duration::from_secs(60), "the backorder filled", || async {
            let (_, o) = s.call("GET", "/v1/orders/bo-1", None).await?;
            Ok((o["status"] == "PENDING").then_some(o))
        })
        .await?;
    assert_eq!(filled["items"][0]["allocations"][0]["qty"], 3, "{filled}");
    let after = stock(&s, "kettle").await?;
    assert_eq!(
        (after["available"].as_i64(), after["reserved"].as_i64(), after["backordered"].as_i64()),
        (Some(0), Some(3), Some(0)),
        "{after}"
    );
    assert_eq!(after["restock_round"], before["restock_round"], "no restock round for promised units");
    // Time passes and the scan runs: still no alert.
    for _ in 0..5 {
        s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 2}))).await?;
        s.call("POST", "/dev/schedules/restock-scan/run", None).await?;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(alerts(&s).await?, 0, "no alert for units that went to the backorder");

    // Units beyond the backorders: available, and the waiter hears of them.
    let more = json!({"delta": 2, "source": "purchase_order", "idempotency_key": "in-2"});
    let (st, v) = s.call("POST", "/v1/inventory/kettle/adjustments", Some(more)).await?;
    assert_eq!((st, v["available"].as_i64()), (200, Some(2)), "{v}");
    s.eventually(Duration::from_secs(180), "the back-in-stock message", || async {
        s.call("POST", "/dev/clock/advance", Some(json!({"seconds": 2}))).await?;
        Ok((alerts(&s).await? > 0).then_some(()))
    })
    .await?;
    assert_eq!(alerts(&s).await?, 1);
    // The ledger accounts for the backorder and reconciliation finds nothing.
    let (st, report) = s.call("POST", "/v1/ops/reconcile", None).await?;
    assert_eq!(st, 200, "{report}");
    assert_eq!(report["discrepancies"], json!([]), "{report}");
    assert!(s.undocumented().is_empty(), "{:?}", s.undocumented());
    Ok(())
}
