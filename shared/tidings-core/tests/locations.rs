//! Stock per location and market (docs/inventory.md, "Locations and markets") against the
//! embedded store, through the ports only: every rule of the inventory holds per location.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tidings_core::inventory::locations::{self, LocationRequest};
use tidings_core::inventory::{
    self, AdjustmentRequest, CellId, Counters, LedgerEntry, LedgerKind, LocationStockRequest, OrderLine, OrderRequest,
    OrderStatus, REVIEW_QUEUE, ShardDelta,
};
use tidings_core::messages::Outcome;
use tidings_core::ports::{Cond, Item, Key, ManualClock, Queues, Update, attrs_of};
use tidings_core::tasks::handle;
use tidings_core::timers::{TIMERS_QUEUE, TimerStep};
use tidings_core::{CoreConfig, CoreError, Deps, TenantId};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::TestWorld;

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    store: EmbeddedStore,
    t: TenantId,
}

fn world() -> World {
    let tw = TestWorld::builder()
        .start_at("2026-11-29T00:00:00Z")
        .queues(&[TIMERS_QUEUE, REVIEW_QUEUE], 5)
        .config(CoreConfig::default())
        .build();
    World { clock: tw.clock(), deps: tw.deps, store: tw.store, t: TenantId::parse("shop-a").unwrap() }
}

fn code_of(e: &CoreError) -> String {
    match e {
        CoreError::Conflict { code, .. } => (*code).to_owned(),
        CoreError::Invalid { field, .. } => format!("invalid:{field}"),
        CoreError::NotFound { .. } => "not_found".into(),
        CoreError::NotFoundAt { field, .. } => format!("not_found:{field}"),
        _ => "other".into(),
    }
}

async fn location(w: &World, id: &str, markets: &[&str], priority: i64) {
    let req = LocationRequest {
        name: format!("Warehouse {id}"),
        markets: markets.iter().map(|m| (*m).to_owned()).collect(),
        priority,
    };
    locations::put(&w.deps, &w.t, id, &req).await.unwrap();
}

async fn stock_at(w: &World, sku: &str, loc: &str, on_hand: i64, safety: Option<i64>) -> bool {
    let req = LocationStockRequest { on_hand, safety_stock: safety };
    inventory::put_location_stock(&w.deps, &w.t, sku, loc, &req).await.unwrap().1
}

fn order(id: &str, lines: &[(&str, i64)], hold_seconds: Option<i64>) -> OrderRequest {
    OrderRequest {
        order_id: id.to_owned(),
        user_id: format!("user-{id}"),
        items: lines.iter().map(|(s, q)| OrderLine { sku_id: (*s).to_owned(), qty: *q, unit_price: None }).collect(),
        hold_seconds,
        category: None,
        market: None,
    }
}

fn in_market(req: OrderRequest, market: Option<&str>) -> OrderRequest {
    OrderRequest { market: market.map(str::to_owned), ..req }
}

async fn place(w: &World, id: &str, lines: &[(&str, i64)], market: Option<&str>) -> Result<(), CoreError> {
    inventory::place_order(&w.deps, &w.t, &in_market(order(id, lines, None), market)).await.map(|_| ())
}

fn adjustment(delta: i64, key: &str) -> AdjustmentRequest {
    AdjustmentRequest::new(delta, "purchase_order", key)
}

/// A SKU's counters per location, as `GET /v1/inventory/{sku}` lists them.
async fn at(w: &World, sku: &str) -> BTreeMap<String, Counters> {
    let view = inventory::get_stock(&w.deps, &w.t, sku).await.unwrap().unwrap();
    view.locations
        .iter()
        .map(|l| {
            assert_eq!(l.on_hand, l.available + l.reserved + l.safety_stock);
            (
                l.location_id.clone(),
                Counters { safety: l.safety_stock, ..Counters::new(l.available, l.reserved, l.sold) },
            )
        })
        .collect()
}

fn c(available: i64, reserved: i64, sold: i64, safety: i64) -> Counters {
    Counters { safety, ..Counters::new(available, reserved, sold) }
}

/// The ledger of a SKU summed per location.
async fn ledger_at(w: &World, sku: &str) -> BTreeMap<String, Counters> {
    let mut out: BTreeMap<String, Counters> = BTreeMap::new();
    for e in inventory::all_ledger_entries(&w.deps, &w.t, sku).await.unwrap() {
        for (cell, d) in e.cell_deltas() {
            let sum = out.entry(cell.location).or_default();
            *sum = sum.plus(d);
        }
    }
    out
}

/// Every location's counters equal its ledger's sums, none is negative, and reconciliation
/// agrees.
async fn assert_consistent(w: &World, skus: &[&str]) {
    for sku in skus {
        let counters = at(w, sku).await;
        for (l, c) in &counters {
            assert!(c.available >= 0 && c.reserved >= 0 && c.sold >= 0 && c.safety >= 0, "{sku}@{l}: {c:?}");
        }
        let ledger = ledger_at(w, sku).await;
        for (l, c) in &counters {
            assert_eq!(ledger.get(l).copied().unwrap_or_default(), *c, "ledger of {sku}@{l}");
        }
    }
    let report = inventory::reconcile(&w.deps, Some(&w.t)).await.unwrap();
    assert!(report.discrepancies.is_empty(), "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
}

async fn held_at(w: &World, order_id: &str) -> Vec<(String, i64)> {
    let o = inventory::get_order(&w.deps, &w.t, order_id).await.unwrap().unwrap();
    o.items.iter().flat_map(|i| i.allocations.iter().map(|a| (a.location_id.clone(), a.qty))).collect()
}

async fn drain_timers(w: &World) {
    loop {
        let got = w.store.receive(TIMERS_QUEUE, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return;
        }
        for m in got {
            assert_eq!(handle::<TimerStep>(&w.deps, &m).await, Outcome::Done, "{}", m.body);
            Queues::delete(&w.store, TIMERS_QUEUE, &m.receipt).await.unwrap();
        }
    }
}

/// 1,000 orders at once for one SKU held at three locations serving two markets (US: east,
/// west; CA: west, north), some of two units (split when a location has one left): no location
/// sells more than its stock minus its safety stock, no order is held where its market is not
/// served, and each location's ledger sums to its counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_thousand_orders_over_three_locations_and_two_markets_never_oversell_a_location() {
    let w = world();
    location(&w, "default", &[], 100).await;
    location(&w, "east", &["US"], 1).await;
    location(&w, "west", &["US", "CA"], 2).await;
    location(&w, "north", &["CA"], 1).await;
    stock_at(&w, "hot", "east", 120, Some(20)).await;
    stock_at(&w, "hot", "west", 80, Some(10)).await;
    stock_at(&w, "hot", "north", 60, Some(15)).await;
    let sellable = BTreeMap::from([("east", 100), ("west", 70), ("north", 45)]);
    let serves = |m: &str, l: &str| match m {
        "US" => l == "east" || l == "west",
        _ => l == "west" || l == "north",
    };

    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (deps, t) = (w.deps.clone(), w.t.clone());
        let market = if i % 2 == 0 { "US" } else { "CA" };
        let qty = if i % 5 == 0 { 2 } else { 1 };
        let req = in_market(order(&format!("o{i}"), &[("hot", qty)], None), Some(market));
        tasks.push(tokio::spawn(async move { (market, qty, inventory::place_order(&deps, &t, &req).await) }));
    }
    let (mut accepted, mut refused, mut units) = (Vec::new(), 0, 0);
    for task in tasks {
        let (market, qty, got) = task.await.unwrap();
        match got {
            Ok(placed) => {
                assert!(placed.created);
                units += qty;
                accepted.push((placed.order.order_id, market));
            }
            Err(e) if code_of(&e) == "insufficient_stock" => refused += 1,
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    }
    assert_eq!(accepted.len() + refused, 1000);
    let counters = at(&w, "hot").await;
    let mut reserved = 0;
    for (l, sell) in &sellable {
        let got = counters[*l];
        assert!(got.reserved + got.sold <= *sell, "{l} oversold: {got:?}");
        assert_eq!(got.available + got.reserved, *sell, "{l}: {got:?}");
        reserved += got.reserved;
    }
    assert_eq!(counters["east"].safety, 20);
    assert_eq!(counters["west"].safety, 10);
    assert_eq!(counters["north"].safety, 15);
    assert_eq!(counters["default"], Counters::default());
    assert_eq!(reserved, units, "every accepted unit is held once");
    assert!(refused > 0, "1,000 orders for 215 sellable units: some are refused");
    for (id, market) in &accepted {
        for (l, _) in held_at(&w, id).await {
            assert!(serves(market, &l), "{id} for {market} held at {l}");
        }
    }
    assert_consistent(&w, &["hot"]).await;
}

/// A line one location cannot fill is split over the next ones in priority order; when the
/// locations together are short the order is refused, naming the SKU, and nothing is held.
#[tokio::test]
async fn an_order_split_across_two_locations_is_held_whole_or_not_at_all() {
    let w = world();
    location(&w, "a", &["US"], 1).await;
    location(&w, "b", &["US"], 2).await;
    location(&w, "c", &["CA"], 1).await;
    stock_at(&w, "s", "a", 3, None).await;
    stock_at(&w, "s", "b", 5, None).await;
    stock_at(&w, "s", "c", 9, None).await;
    stock_at(&w, "t", "a", 1, None).await;

    // One location short: the split, a first (priority 1).
    place(&w, "split", &[("s", 6)], Some("US")).await.unwrap();
    assert_eq!(held_at(&w, "split").await, [("a".to_owned(), 3), ("b".to_owned(), 3)]);
    let held = at(&w, "s").await;
    assert_eq!((held["a"], held["b"], held["c"]), (c(0, 3, 0, 0), c(2, 3, 0, 0), c(9, 0, 0, 0)));
    let ledger_before = inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap().len();

    // Both together short (2 left for US; c serves CA only): 409 and nothing held anywhere.
    let e = place(&w, "short", &[("s", 3)], Some("US")).await.unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    assert!(e.to_string().contains("sku s"), "{e}");
    // A line that fits beside one that does not: still nothing held.
    let e = place(&w, "pair", &[("s", 2), ("t", 2)], Some("US")).await.unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    assert!(e.to_string().contains("sku t"), "{e}");
    assert_eq!(at(&w, "s").await, held);
    assert_eq!(at(&w, "t").await["a"], c(1, 0, 0, 0));
    assert_eq!(inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap().len(), ledger_before);
    for id in ["short", "pair"] {
        assert!(inventory::get_order(&w.deps, &w.t, id).await.unwrap().is_none());
    }

    // Without a market every location may serve: default (0 here) first, then by priority (a and
    // c at 1, a empty), then b.
    place(&w, "any", &[("s", 11)], None).await.unwrap();
    assert_eq!(held_at(&w, "any").await, [("b".to_owned(), 2), ("c".to_owned(), 9)]);
    // A market nobody serves (default implicit serves all, but holds none of s).
    assert_eq!(code_of(&place(&w, "mx", &[("s", 1)], Some("MX")).await.unwrap_err()), "insufficient_stock");
    assert_eq!(code_of(&place(&w, "bad", &[("s", 1)], Some("us")).await.unwrap_err()), "invalid:market");
    // The same order id with another market is another order.
    let again = inventory::place_order(&w.deps, &w.t, &in_market(order("split", &[("s", 6)], None), Some("US"))).await;
    assert!(!again.unwrap().created);
    let other = inventory::place_order(&w.deps, &w.t, &in_market(order("split", &[("s", 6)], None), Some("CA"))).await;
    assert_eq!(code_of(&other.unwrap_err()), "idempotency_conflict");
    assert_consistent(&w, &["s", "t"]).await;
}

/// Pay, cancel and expiry of orders split over locations move exactly the cells they hold.
#[tokio::test]
async fn pay_cancel_and_expiry_of_a_split_order_touch_exactly_its_cells() {
    let w = world();
    location(&w, "a", &["US"], 1).await;
    location(&w, "b", &["US"], 2).await;
    location(&w, "c", &["US"], 3).await;
    stock_at(&w, "s", "a", 4, None).await;
    stock_at(&w, "s", "b", 4, None).await;
    stock_at(&w, "s", "c", 10, None).await;

    place(&w, "p", &[("s", 6)], Some("US")).await.unwrap(); // a 4, b 2
    place(&w, "x", &[("s", 4)], Some("US")).await.unwrap(); // b 2, c 2
    inventory::place_order(&w.deps, &w.t, &in_market(order("e", &[("s", 3)], Some(60)), Some("US"))).await.unwrap(); // c 3
    assert_eq!(held_at(&w, "p").await, [("a".to_owned(), 4), ("b".to_owned(), 2)]);
    assert_eq!(held_at(&w, "x").await, [("b".to_owned(), 2), ("c".to_owned(), 2)]);
    assert_eq!(held_at(&w, "e").await, [("c".to_owned(), 3)]);

    inventory::pay(&w.deps, &w.t, "p").await.unwrap();
    let s = at(&w, "s").await;
    assert_eq!((s["a"], s["b"], s["c"]), (c(0, 0, 4, 0), c(0, 2, 2, 0), c(5, 5, 0, 0)));

    inventory::cancel(&w.deps, &w.t, "x").await.unwrap();
    let s = at(&w, "s").await;
    assert_eq!((s["a"], s["b"], s["c"]), (c(0, 0, 4, 0), c(2, 0, 2, 0), c(7, 3, 0, 0)));

    w.clock.advance(chrono::Duration::seconds(61));
    drain_timers(&w).await;
    let o = inventory::get_order(&w.deps, &w.t, "e").await.unwrap().unwrap();
    assert_eq!((o.status, o.cancel_reason.as_deref()), (OrderStatus::Cancelled, Some("expiry")));
    let s = at(&w, "s").await;
    assert_eq!((s["a"], s["b"], s["c"]), (c(0, 0, 4, 0), c(2, 0, 2, 0), c(10, 0, 0, 0)));

    // The ledger says where: the sale of p names both of its cells.
    let sale = inventory::all_ledger_entries(&w.deps, &w.t, "s")
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.kind == LedgerKind::Sell)
        .unwrap();
    let cells: Vec<(CellId, Counters)> = sale.cell_deltas();
    assert_eq!(cells, [(CellId::at("a"), Counters::sell(4)), (CellId::at("b"), Counters::sell(2))]);
    // A stored order from before locations (no `location` in its allocations) reads as default.
    let old: tidings_core::inventory::Allocation = serde_json::from_str(r#"{"shard":0,"qty":2}"#).unwrap();
    assert_eq!(old.location, "default");
    assert_consistent(&w, &["s"]).await;
}

/// A ledger entry injected at one location is found there, and only there.
#[tokio::test]
async fn reconciliation_finds_a_discrepancy_in_one_locations_ledger_and_not_in_the_others() {
    let w = world();
    location(&w, "a", &["US"], 1).await;
    location(&w, "b", &["US"], 2).await;
    stock_at(&w, "s", "default", 5, None).await;
    stock_at(&w, "s", "a", 5, Some(1)).await;
    stock_at(&w, "s", "b", 5, None).await;
    place(&w, "o", &[("s", 12)], Some("US")).await.unwrap(); // default 5, a 4, b 3
    assert_consistent(&w, &["s"]).await;

    // A forged entry at b: b's ledger is 2 available ahead of its counters; the SKU total too.
    let forged = LedgerEntry {
        entry_id: "00000000-0000-7000-8000-000000000001".into(),
        sku_id: "s".into(),
        delta_available: 2,
        delta_reserved: 0,
        delta_sold: 0,
        delta_safety: 0,
        delta_allotted: 0,
        delta_backordered: 0,
        delta_unfilled: 0,
        location: Some("b".into()),
        kind: LedgerKind::Adjustment,
        reference: "forged".into(),
        source: None,
        reason: None,
        shards: vec![ShardDelta::of(&CellId::at("b"), Counters::new(2, 0, 0))],
        at: "2026-11-29T00:00:00.000Z".into(),
    };
    let key = Key::new(format!("T#{}#LEDGER#s", w.t), format!("E#{}", forged.entry_id));
    w.deps.table.put(Item::new(key, attrs_of(&forged).unwrap()), Cond::NotExists).await.unwrap();

    let report = inventory::reconcile(&w.deps, Some(&w.t)).await.unwrap();
    assert_eq!(report.discrepancies.len(), 1, "{report:?}");
    let d = &report.discrepancies[0];
    assert_eq!((d.location.as_deref(), d.shard), (Some("b"), None));
    assert_eq!(d.expected.available - d.actual.available, 2);

    // A counter drifting at a (its safety stock) is a second finding, at a.
    let cell = Key::new(format!("T#{}#SKU#s#L#a", w.t), "CELL");
    w.deps.table.update(&cell, vec![Update::add("safety", 1)], Cond::Exists).await.unwrap();
    let report = inventory::reconcile(&w.deps, Some(&w.t)).await.unwrap();
    let mut places: Vec<Option<String>> = report.discrepancies.iter().map(|d| d.location.clone()).collect();
    places.sort();
    assert_eq!(places, [Some("a".to_owned()), Some("b".to_owned())], "{report:?}");
    let at_a = report.discrepancies.iter().find(|d| d.location.as_deref() == Some("a")).unwrap();
    assert_eq!(at_a.actual.safety - at_a.expected.safety, 1);
    assert_eq!(report.opened, 1, "b's finding was open already");

    // Settled with corrective entries, the ledgers agree again.
    let open = inventory::findings::list(&w.deps, inventory::FindingStatus::Open, 50, None).await.unwrap();
    assert_eq!(open.items.len(), 2);
    for f in &open.items {
        let req = inventory::SettleRequest { kind: "corrective_entry".into(), reason: "counted".into() };
        inventory::findings::settle(&w.deps, &f.id, &req, "op").await.unwrap();
    }
    assert_consistent(&w, &["s"]).await;
}

/// Safety stock is on hand and never sold: not available to orders or to decreases, set and
/// lowered by moves that the ledger records.
#[tokio::test]
async fn safety_stock_is_never_sold() {
    let w = world();
    location(&w, "a", &["US"], 1).await;
    assert!(stock_at(&w, "s", "a", 10, Some(4)).await);
    assert_eq!(at(&w, "s").await["a"], c(6, 0, 0, 4));
    assert_eq!(code_of(&place(&w, "big", &[("s", 7)], Some("US")).await.unwrap_err()), "insufficient_stock");
    place(&w, "o", &[("s", 6)], Some("US")).await.unwrap();
    let e = inventory::adjust(
        &w.deps,
        &w.t,
        "s",
        &AdjustmentRequest { location_id: Some("a".into()), ..adjustment(-1, "d1") },
    )
    .await
    .unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    // Raising the safety stock takes available units only.
    let raise = LocationStockRequest { on_hand: 10, safety_stock: Some(5) };
    let e = inventory::put_location_stock(&w.deps, &w.t, "s", "a", &raise).await.unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    // Lowering it frees units to sell (and the PUT of an existing cell keeps its stock: 200).
    assert!(!stock_at(&w, "s", "a", 10, Some(1)).await);
    assert_eq!(at(&w, "s").await["a"], c(3, 6, 0, 1));
    let view = inventory::get_stock(&w.deps, &w.t, "s").await.unwrap().unwrap();
    assert_eq!((view.available, view.reserved, view.safety_stock), (3, 6, 1));
    let kinds: Vec<LedgerKind> =
        inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap().iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&LedgerKind::SafetyStock), "{kinds:?}");
    // A sharded default keeps none.
    inventory::warm_up(&w.deps, &w.t, "h", &inventory::WarmUpRequest { on_hand: 8, shards: Some(4), category: None })
        .await
        .unwrap();
    let e = inventory::put_location_stock(&w.deps, &w.t, "h", "default", &raise).await.unwrap_err();
    assert_eq!(code_of(&e), "invalid:safety_stock");
    let bad = LocationStockRequest { on_hand: 3, safety_stock: Some(4) };
    let e = inventory::put_location_stock(&w.deps, &w.t, "s", "a", &bad).await.unwrap_err();
    assert_eq!(code_of(&e), "invalid:safety_stock");
    assert_consistent(&w, &["s", "h"]).await;
}

/// A SKU's restock round opens when its total available goes from 0 to more, whichever location
/// the stock arrives at (the back-in-stock trigger), and when a market that location serves had
/// none (docs/restock.md, "Markets"); not when the stock arrives where its market still had some.
#[tokio::test]
async fn stock_arriving_at_any_location_when_all_were_at_zero_opens_a_round() {
    let w = world();
    location(&w, "a", &["US"], 1).await;
    location(&w, "b", &["CA"], 1).await;
    location(&w, "c", &["CA"], 2).await;
    stock_at(&w, "s", "a", 0, None).await;
    stock_at(&w, "s", "b", 0, None).await;
    let round = |w: &World| {
        let (d, t) = (w.deps.clone(), w.t.clone());
        async move { inventory::get_stock(&d, &t, "s").await.unwrap().unwrap().restock_round }
    };
    assert_eq!(round(&w).await, 0);
    inventory::adjust(&w.deps, &w.t, "s", &AdjustmentRequest { location_id: Some("b".into()), ..adjustment(3, "k1") })
        .await
        .unwrap();
    assert_eq!(round(&w).await, 1, "0 -> 3 at b");
    inventory::adjust(&w.deps, &w.t, "s", &AdjustmentRequest { location_id: Some("a".into()), ..adjustment(2, "k2") })
        .await
        .unwrap();
    assert_eq!(round(&w).await, 2, "a 0 -> 2 while b had 3: the US had none");
    inventory::adjust(&w.deps, &w.t, "s", &AdjustmentRequest { location_id: Some("b".into()), ..adjustment(1, "k3") })
        .await
        .unwrap();
    assert_eq!(round(&w).await, 2, "b 3 -> 4: CA had some, no restock");
    place(&w, "o1", &[("s", 2)], Some("US")).await.unwrap();
    place(&w, "o2", &[("s", 4)], Some("CA")).await.unwrap();
    inventory::cancel(&w.deps, &w.t, "o1").await.unwrap();
    assert_eq!(round(&w).await, 3, "a release at a when all were 0");
    place(&w, "o3", &[("s", 2)], Some("US")).await.unwrap();
    // A new location's stock when all are at 0 opens a round; one kept back as safety stock
    // does not, until it is freed.
    stock_at(&w, "s", "c", 4, Some(4)).await;
    assert_eq!(round(&w).await, 3);
    stock_at(&w, "s", "c", 4, Some(1)).await;
    assert_eq!(round(&w).await, 4);
    assert_consistent(&w, &["s"]).await;
}

/// An order whose hold would not fit one transaction (100 writes) is refused with 422 naming
/// `items`: each line may need a condition on every cell of its SKU (all locations' shards).
#[tokio::test]
async fn an_order_too_large_for_one_transaction_is_refused_naming_items() {
    let w = world();
    for sku in ["p", "q"] {
        let warm = inventory::WarmUpRequest { on_hand: 16, shards: Some(16), category: None };
        inventory::warm_up(&w.deps, &w.t, sku, &warm).await.unwrap();
    }
    for i in 0..30 {
        let l = format!("l{i}");
        location(&w, &l, &["US"], i).await;
        stock_at(&w, "p", &l, 1, None).await;
        stock_at(&w, "q", &l, 1, None).await;
    }
    // p alone: 16 + 30 cells + stock item + ledger + order + timer = 50 writes: fine.
    place(&w, "one", &[("p", 40)], None).await.unwrap();
    // p and q: 2 + 2 × 48 = 98: fine; three such SKUs: refused.
    place(&w, "two", &[("p", 1), ("q", 1)], None).await.unwrap();
    let warm = inventory::WarmUpRequest { on_hand: 16, shards: Some(16), category: None };
    inventory::warm_up(&w.deps, &w.t, "r", &warm).await.unwrap();
    stock_at(&w, "r", "l0", 1, None).await;
    let e = place(&w, "three", &[("p", 1), ("q", 1), ("r", 1)], None).await.unwrap_err();
    assert_eq!(code_of(&e), "invalid:items", "{e}");
    assert!(inventory::get_order(&w.deps, &w.t, "three").await.unwrap().is_none());
    // The largest order there is releases in one transaction too.
    inventory::cancel(&w.deps, &w.t, "one").await.unwrap();
    inventory::cancel(&w.deps, &w.t, "two").await.unwrap();
    assert_consistent(&w, &["p", "q", "r"]).await;
}

/// Locations are checked (ids, markets, priority), listed `default` first, and a tenant's.
#[tokio::test]
async fn locations_are_validated_listed_and_a_tenants_own() {
    let w = world();
    let req = |name: &str, markets: &[&str], priority| LocationRequest {
        name: name.into(),
        markets: markets.iter().map(|m| (*m).to_owned()).collect(),
        priority,
    };
    let bad = [
        ("ok", req(" ", &["US"], 1), "invalid:name"),
        ("ok", req("x", &["us"], 1), "invalid:markets[0]"),
        ("ok", req("x", &["US", "USA"], 1), "invalid:markets[1]"),
        ("ok", req("x", &["US", "US"], 1), "invalid:markets[1]"),
        ("ok", req("x", &["US"], 10_000_000), "invalid:priority"),
        ("no/slash", req("x", &["US"], 1), "invalid:location_id"),
    ];
    for (id, r, want) in bad {
        assert_eq!(code_of(&locations::put(&w.deps, &w.t, id, &r).await.unwrap_err()), want);
    }
    let (l, created) = locations::put(&w.deps, &w.t, "z", &req("Zed", &["US"], 5)).await.unwrap();
    assert!(created && !l.implicit);
    let (_, created) = locations::put(&w.deps, &w.t, "z", &req("Zed", &["US", "CA"], 5)).await.unwrap();
    assert!(!created);
    locations::put(&w.deps, &w.t, "y", &req("Why", &["CA"], 1)).await.unwrap();
    let all = locations::all(&w.deps, &w.t).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|l| l.location_id.as_str()).collect();
    assert_eq!(ids, ["default", "y", "z"]);
    assert!(all[0].implicit);
    assert_eq!(all[2].markets, ["US", "CA"]);

    // Stock at an unknown location, and another tenant's location: 404 naming location_id.
    let other = TenantId::parse("shop-b").unwrap();
    let stock = LocationStockRequest { on_hand: 1, safety_stock: None };
    let e = inventory::put_location_stock(&w.deps, &other, "s", "z", &stock).await.unwrap_err();
    assert_eq!(code_of(&e), "not_found:location_id");
    assert_eq!(locations::all(&w.deps, &other).await.unwrap().len(), 1);
    stock_at(&w, "s", "z", 3, None).await;
    assert!(inventory::get_stock(&w.deps, &other, "s").await.unwrap().is_none());
    // An adjustment at a location holding no cell of the SKU: 404 naming location_id.
    let e = inventory::adjust(
        &w.deps,
        &w.t,
        "s",
        &AdjustmentRequest { location_id: Some("y".into()), ..adjustment(1, "k") },
    )
    .await
    .unwrap_err();
    assert_eq!(code_of(&e), "not_found:location_id");
    // Adjustments at a location apply once per key, and the key is the location's.
    inventory::adjust(&w.deps, &w.t, "s", &AdjustmentRequest { location_id: Some("z".into()), ..adjustment(2, "k") })
        .await
        .unwrap();
    inventory::adjust(&w.deps, &w.t, "s", &AdjustmentRequest { location_id: Some("z".into()), ..adjustment(2, "k") })
        .await
        .unwrap();
    assert_eq!(at(&w, "s").await["z"], c(5, 0, 0, 0));
    let e = inventory::adjust(&w.deps, &w.t, "s", &adjustment(2, "k")).await.unwrap_err();
    assert_eq!(code_of(&e), "idempotency_conflict");
    assert_consistent(&w, &["s"]).await;
}

/// An order's SKUs may gain locations after it was placed, until deciding "was 0" for its release
/// no longer fits one transaction: the hold is released all the same (never stuck), without
/// moving the restock round (the scheduled restock scan serves the waiters).
#[tokio::test]
async fn a_hold_is_released_even_when_its_skus_gained_locations_past_one_transaction() {
    let w = world();
    for sku in ["p", "q"] {
        let warm = inventory::WarmUpRequest { on_hand: 16, shards: Some(16), category: None };
        inventory::warm_up(&w.deps, &w.t, sku, &warm).await.unwrap();
    }
    for i in 0..30 {
        let l = format!("l{i}");
        location(&w, &l, &["US"], i).await;
        stock_at(&w, "p", &l, 1, None).await;
        stock_at(&w, "q", &l, 1, None).await;
    }
    // Every unit of both: 2 + 2 × (46 + 2) = 98 writes to release.
    place(&w, "all", &[("p", 46), ("q", 46)], None).await.unwrap();
    for i in 30..36 {
        let l = format!("l{i}");
        location(&w, &l, &["US"], i).await;
        stock_at(&w, "p", &l, 0, None).await;
        stock_at(&w, "q", &l, 0, None).await;
    }
    // Now 2 + 2 × (52 + 2) = 110 writes to decide "was 0": more than one transaction.
    inventory::cancel(&w.deps, &w.t, "all").await.unwrap();
    for sku in ["p", "q"] {
        let s = inventory::get_stock(&w.deps, &w.t, sku).await.unwrap().unwrap();
        assert_eq!((s.available, s.reserved, s.restock_round), (46, 0, 0), "{s:?}");
    }
    assert_consistent(&w, &["p", "q"]).await;
}
