//! Inventory and timers against the embedded store (SQLite), through the ports only.
//!
//! Each pitfall of docs/inventory.md has a test named after it (`pit1_` to `pit5_`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tidings_core::inventory::findings::{self, Finding, FindingStatus, SettleRequest, SettlementKind};
use tidings_core::inventory::{
    self, AdjustmentRequest, Counters, HoldTimes, LedgerKind, OrderLine, OrderRequest, OrderStatus, REVIEW_QUEUE,
    Settlement, WarmUpRequest,
};
use tidings_core::messages::Outcome;
use tidings_core::ports::{ManualClock, Queues, Update};
use tidings_core::tasks::handle;
use tidings_core::timers::{self, TIMERS_QUEUE, TimerMessage, TimerStep, TimerTask};
use tidings_core::{CoreConfig, CoreError, Deps, TenantId};
use tidings_embedded::EmbeddedStore;
use tidings_embedded::test_world::{HookedSends, SendHook, TestWorld, TestWorldBuilder};

struct World {
    deps: Deps,
    clock: Arc<ManualClock>,
    store: EmbeddedStore,
    t: TenantId,
}

const START: &str = "2026-11-29T00:00:00Z";

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(START).unwrap().with_timezone(&Utc)
}

fn world_of(builder: TestWorldBuilder, config: CoreConfig) -> World {
    let tw = builder.queues(&[TIMERS_QUEUE, REVIEW_QUEUE], 5).config(config).build();
    World { clock: tw.clock(), deps: tw.deps, store: tw.store, t: TenantId::parse("shop-a").unwrap() }
}

fn world_on(store: EmbeddedStore, clock: Arc<ManualClock>, config: CoreConfig) -> World {
    world_of(TestWorld::builder().store(store).manual_clock(clock), config)
}

fn world_with(config: CoreConfig) -> World {
    world_of(TestWorld::builder().start_at(START), config)
}

fn world() -> World {
    world_with(CoreConfig::default())
}

fn warm_req(on_hand: i64, shards: Option<u32>, category: Option<&str>) -> WarmUpRequest {
    WarmUpRequest { on_hand, shards, category: category.map(str::to_owned) }
}

async fn warm(w: &World, sku: &str, on_hand: i64) {
    let (_, created) = inventory::warm_up(&w.deps, &w.t, sku, &warm_req(on_hand, None, None)).await.unwrap();
    assert!(created);
}

async fn warm_sharded(w: &World, sku: &str, on_hand: i64, shards: u32) {
    let (view, created) = inventory::warm_up(&w.deps, &w.t, sku, &warm_req(on_hand, Some(shards), None)).await.unwrap();
    assert!(created);
    assert_eq!(view.shards, shards);
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

fn adjustment(delta: i64, source: &str, key: &str) -> AdjustmentRequest {
    AdjustmentRequest::new(delta, source, key)
}

async fn stock(w: &World, sku: &str) -> inventory::StockView {
    inventory::get_stock(&w.deps, &w.t, sku).await.unwrap().unwrap()
}

async fn ledger_sum(w: &World, sku: &str) -> Counters {
    inventory::all_ledger_entries(&w.deps, &w.t, sku)
        .await
        .unwrap()
        .iter()
        .fold(Counters::default(), |acc, e| acc.plus(e.delta()))
}

/// Counters equal the ledger's sums, none is negative, and reconciliation agrees.
async fn assert_consistent(w: &World, skus: &[&str]) {
    for sku in skus {
        let s = stock(w, sku).await;
        assert!(s.available >= 0 && s.reserved >= 0 && s.sold >= 0, "negative counter: {s:?}");
        assert_eq!(ledger_sum(w, sku).await, s.counters(), "ledger of {sku} does not sum to its counters");
    }
    let report = inventory::reconcile(&w.deps, Some(&w.t)).await.unwrap();
    assert!(report.discrepancies.is_empty(), "{report:?}");
    assert!(report.skipped.is_empty(), "{report:?}");
}

fn code_of(e: &CoreError) -> &'static str {
    match e {
        CoreError::Conflict { code, .. } => code,
        CoreError::Invalid { .. } => "invalid",
        CoreError::NotFound { .. } => "not_found",
        _ => "other",
    }
}

/// Receives and handles every visible message of the timers queue; returns how many.
async fn drain_timers(w: &World) -> usize {
    let mut handled = 0;
    loop {
        let got = w.store.receive(TIMERS_QUEUE, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return handled;
        }
        for m in got {
            assert_eq!(handle::<TimerStep>(&w.deps, &m).await, Outcome::Done, "{}", m.body);
            Queues::delete(&w.store, TIMERS_QUEUE, &m.receipt).await.unwrap();
            handled += 1;
        }
    }
}

async fn order_status(w: &World, id: &str) -> (OrderStatus, Option<String>) {
    let o = inventory::get_order(&w.deps, &w.t, id).await.unwrap().unwrap();
    (o.status, o.cancel_reason)
}

/// Runs `n` orders of `qty` units at once; returns (accepted, refused as insufficient_stock).
async fn concurrent_orders(w: &World, prefix: &str, n: usize, lines: &[(&str, i64)]) -> (usize, usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let deps = w.deps.clone();
        let t = w.t.clone();
        let req = order(&format!("{prefix}-{i}"), lines, None);
        tasks.push(tokio::spawn(async move { inventory::place_order(&deps, &t, &req).await }));
    }
    let (mut ok, mut short) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(placed) => {
                assert!(placed.created);
                ok += 1;
            }
            Err(e) if code_of(&e) == "insufficient_stock" => short += 1,
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    }
    (ok, short)
}

// ---------------------------------------------------------------------------------------------
// The pitfalls of docs/inventory.md
// ---------------------------------------------------------------------------------------------

/// Pitfall 1: check-then-act (read, then write) oversells under concurrency; the deduction must be
/// atomic.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn pit1_check_then_act_never_oversells() {
    let w = world();
    warm(&w, "hot", 20).await;
    let (ok, short) = concurrent_orders(&w, "o", 50, &[("hot", 1)]).await;
    assert_eq!((ok, short), (20, 30));
    let s = stock(&w, "hot").await;
    assert_eq!(s.counters(), Counters::new(0, 20, 0));
    assert_consistent(&w, &["hot"]).await;

    // Several units per order: never more reserved than there was.
    warm(&w, "multi", 40).await;
    let (ok, _) = concurrent_orders(&w, "m", 30, &[("multi", 3)]).await;
    assert_eq!(ok, 13);
    assert_eq!(stock(&w, "multi").await.counters(), Counters::new(1, 39, 0));
    assert_consistent(&w, &["hot", "multi"]).await;
}

/// Pitfall 1 with a sharded hot SKU: reserving from random shards with fallback still never
/// oversells.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn pit1_sharded_counter_never_oversells() {
    let w = world();
    warm_sharded(&w, "hot8", 100, 8).await;
    let (ok, short) = concurrent_orders(&w, "s", 250, &[("hot8", 1)]).await;
    assert_eq!((ok, short), (100, 150));
    assert_eq!(stock(&w, "hot8").await.counters(), Counters::new(0, 100, 0));

    // Lines larger than any one shard are split over shards, still never overselling.
    warm_sharded(&w, "split", 40, 4).await;
    let (ok, _) = concurrent_orders(&w, "x", 30, &[("split", 3)]).await;
    assert_eq!(ok, 13);
    assert_eq!(stock(&w, "split").await.counters(), Counters::new(1, 39, 0));
    assert_consistent(&w, &["hot8", "split"]).await;

    // Releasing and paying touch exactly the shards that hold the units.
    for i in 0..13 {
        let id = format!("x-{i}");
        if inventory::get_order(&w.deps, &w.t, &id).await.unwrap().is_none() {
            continue;
        }
        if i % 2 == 0 {
            inventory::pay(&w.deps, &w.t, &id).await.unwrap();
        } else {
            inventory::cancel(&w.deps, &w.t, &id).await.unwrap();
        }
    }
    assert_consistent(&w, &["hot8", "split"]).await;
}

/// Pitfall 2: the deduction and its record drift apart (a cache deducted, the database not) and a
/// restart loses one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pit2_counter_and_ledger_are_one_write_and_survive_a_restart() {
    let path = std::env::temp_dir().join(format!("tidings-inventory-{}.db", uuid_like()));
    let clock = Arc::new(ManualClock::new(start()));
    {
        let store = EmbeddedStore::open_with_clock(&path, clock.clone()).unwrap();
        let w = world_on(store, clock.clone(), CoreConfig::default());
        warm(&w, "a", 10).await;
        warm(&w, "b", 1).await;
        inventory::place_order(&w.deps, &w.t, &order("o1", &[("a", 3)], None)).await.unwrap();
        inventory::place_order(&w.deps, &w.t, &order("o2", &[("a", 2)], None)).await.unwrap();
        inventory::pay(&w.deps, &w.t, "o1").await.unwrap();
        inventory::cancel(&w.deps, &w.t, "o2").await.unwrap();
        inventory::adjust(&w.deps, &w.t, "a", &adjustment(5, "purchase_order", "po-1")).await.unwrap();
        // A failed order changes neither counters nor ledger: both or nothing.
        let before = inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().len();
        let e = inventory::place_order(&w.deps, &w.t, &order("o3", &[("a", 1), ("b", 2)], None)).await.unwrap_err();
        assert_eq!(code_of(&e), "insufficient_stock");
        assert_eq!(inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().len(), before);
        assert_consistent(&w, &["a", "b"]).await;
    }
    // Reopened from the file: everything that answered Ok is there, and still adds up.
    let store = EmbeddedStore::open_with_clock(&path, clock.clone()).unwrap();
    let w = world_on(store, clock, CoreConfig::default());
    assert_eq!(stock(&w, "a").await.counters(), Counters::new(12, 0, 3));
    let kinds: Vec<LedgerKind> =
        inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            LedgerKind::WarmUp,
            LedgerKind::Reserve,
            LedgerKind::Reserve,
            LedgerKind::Sell,
            LedgerKind::Release,
            LedgerKind::Adjustment
        ]
    );
    assert_consistent(&w, &["a", "b"]).await;
    let _ = std::fs::remove_file(&path);
}

fn uuid_like() -> String {
    format!("{}-{}", std::process::id(), Utc::now().timestamp_nanos_opt().unwrap_or(0))
}

/// Pitfall 3: restoring stock on timeout with a set overwrites other orders' deductions; it must be
/// an increment.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn pit3_release_is_an_increment_not_a_set() {
    let w = world();
    for round in 0..15 {
        let sku = format!("r{round}");
        warm(&w, &sku, 10).await;
        inventory::place_order(&w.deps, &w.t, &order(&format!("{sku}-a"), &[(&sku, 3)], None)).await.unwrap();
        let (d1, d2, d3) = (w.deps.clone(), w.deps.clone(), w.deps.clone());
        let (t1, t2, t3) = (w.t.clone(), w.t.clone(), w.t.clone());
        let (a, b, c) = (
            format!("{sku}-a"),
            order(&format!("{sku}-b"), &[(&sku, 2)], None),
            order(&format!("{sku}-c"), &[(&sku, 4)], None),
        );
        let release = tokio::spawn(async move { inventory::cancel(&d1, &t1, &a).await });
        let ob = tokio::spawn(async move { inventory::place_order(&d2, &t2, &b).await });
        let oc = tokio::spawn(async move { inventory::place_order(&d3, &t3, &c).await });
        release.await.unwrap().unwrap();
        ob.await.unwrap().unwrap();
        oc.await.unwrap().unwrap();
        // 10 - 2 - 4 held by b and c; a's 3 came back on top of them, not instead of them.
        assert_eq!(stock(&w, &sku).await.counters(), Counters::new(4, 6, 0), "round {round}");
    }
    let skus: Vec<String> = (0..15).map(|r| format!("r{r}")).collect();
    assert_consistent(&w, &skus.iter().map(String::as_str).collect::<Vec<_>>()).await;
}

/// Pitfall 4: a hard-coded timeout: promotion items 15 min, ordinary 30; configure per category,
/// not one global value.
#[tokio::test]
async fn pit4_hold_time_is_per_category() {
    let w = world();
    let t0 = w.clock.now_ms_for_test();
    inventory::warm_up(&w.deps, &w.t, "promo", &warm_req(5, None, Some("promotion"))).await.unwrap();
    inventory::warm_up(&w.deps, &w.t, "plain", &warm_req(5, None, None)).await.unwrap();
    let p = inventory::place_order(&w.deps, &w.t, &order("p", &[("promo", 1)], None)).await.unwrap();
    let n = inventory::place_order(&w.deps, &w.t, &order("n", &[("plain", 1)], None)).await.unwrap();
    let mixed = inventory::place_order(&w.deps, &w.t, &order("m", &[("plain", 1), ("promo", 1)], None)).await.unwrap();
    let own = inventory::place_order(&w.deps, &w.t, &order("h", &[("plain", 1)], Some(3600))).await.unwrap();
    let mut by_category = order("c", &[("promo", 1)], None);
    by_category.category = Some("vip".into());
    let c = inventory::place_order(&w.deps, &w.t, &by_category).await.unwrap();
    let expires =
        |v: &inventory::OrderView| DateTime::parse_from_rfc3339(&v.expires_at).unwrap().timestamp_millis() - t0;
    assert_eq!(expires(&p.order), 15 * 60_000);
    assert_eq!(expires(&n.order), 30 * 60_000);
    assert_eq!(expires(&mixed.order), 15 * 60_000, "the shortest hold among the SKUs");
    assert_eq!(expires(&own.order), 3_600_000, "hold_seconds overrides");
    assert_eq!(expires(&c.order), 30 * 60_000, "an unknown category gets the default");

    // After 16 minutes the promotion holds are released; the ordinary buyer is not cut off.
    w.clock.advance(chrono::Duration::minutes(16));
    drain_timers(&w).await;
    timers::tick(&w.deps).await.unwrap();
    drain_timers(&w).await;
    assert_eq!(order_status(&w, "p").await, (OrderStatus::Cancelled, Some("expiry".into())));
    assert_eq!(order_status(&w, "m").await.0, OrderStatus::Cancelled);
    assert_eq!(order_status(&w, "n").await.0, OrderStatus::Pending);
    assert_eq!(order_status(&w, "c").await.0, OrderStatus::Pending);
    inventory::pay(&w.deps, &w.t, "n").await.unwrap();

    // And the table of hold times is configuration.
    let custom = HoldTimes::parse("default=600, flash=60").unwrap();
    assert_eq!(custom.for_category(Some("flash")), Duration::from_secs(60));
    assert_eq!(custom.for_category(None), Duration::from_secs(600));
    assert!(HoldTimes::parse("flash=0").is_err());
    let w2 = world_with(CoreConfig { hold_times: custom, ..CoreConfig::default() });
    inventory::warm_up(&w2.deps, &w2.t, "f", &warm_req(1, None, Some("flash"))).await.unwrap();
    let f = inventory::place_order(&w2.deps, &w2.t, &order("f", &[("f", 1)], None)).await.unwrap();
    assert_eq!(expires(&f.order), 60_000);
}

trait NowMs {
    fn now_ms_for_test(&self) -> i64;
}
impl NowMs for ManualClock {
    fn now_ms_for_test(&self) -> i64 {
        tidings_core::ports::Clock::now_ms(self)
    }
}

/// Pitfall 5: reconciling only totals misses errors in between; compare every SKU against its
/// ledger and queue the difference for people.
#[tokio::test]
async fn pit5_reconcile_checks_each_sku_against_its_ledger() {
    let w = world();
    warm(&w, "a", 10).await;
    warm(&w, "b", 10).await;
    warm_sharded(&w, "c", 8, 4).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("a", 2), ("b", 1), ("c", 1)], None)).await.unwrap();
    assert_consistent(&w, &["a", "b", "c"]).await;

    // Corrupt counters behind the ledger's back so that every total still balances: a +1,
    // b -1 (the sum over SKUs is unchanged), and one unit moved between two shards of c.
    let key = |sku: &str| tidings_core::ports::Key::new(format!("T#{}#SKU#{sku}", w.t), "STOCK");
    let shard = |i: u32| tidings_core::ports::Key::new(format!("T#{}#SKU#c#S{i}", w.t), "CELL");
    w.deps.table.update(&key("a"), vec![Update::add("available", 1)], tidings_core::ports::Cond::Exists).await.unwrap();
    w.deps
        .table
        .update(&key("b"), vec![Update::add("available", -1)], tidings_core::ports::Cond::Exists)
        .await
        .unwrap();
    w.deps
        .table
        .update(&shard(0), vec![Update::add("available", -1)], tidings_core::ports::Cond::Exists)
        .await
        .unwrap();
    w.deps.table.update(&shard(1), vec![Update::add("available", 1)], tidings_core::ports::Cond::Exists).await.unwrap();
    assert_eq!(stock(&w, "c").await.available, 7, "c's total is unchanged");

    let report = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!(report.checked, 3);
    let mut found: Vec<(String, Option<u32>, i64, i64)> = report
        .discrepancies
        .iter()
        .map(|d| (d.sku_id.clone(), d.shard, d.expected.available, d.actual.available))
        .collect();
    found.sort();
    let c0 = found.iter().find(|f| f.0 == "c" && f.1 == Some(0)).cloned().unwrap();
    assert_eq!(c0.3, c0.2 - 1);
    let c1 = found.iter().find(|f| f.0 == "c" && f.1 == Some(1)).cloned().unwrap();
    assert_eq!(c1.3, c1.2 + 1);
    assert!(found.contains(&("a".into(), None, 8, 9)), "{found:?}");
    assert!(found.contains(&("b".into(), None, 9, 8)), "{found:?}");
    assert_eq!(found.len(), 4);

    // Reported, recorded for review, queued for an operator; not silently fixed.
    assert_eq!(stock(&w, "a").await.available, 9);
    assert_eq!(stock(&w, "b").await.available, 8);
    let review = findings::all(&w.deps, FindingStatus::Open).await.unwrap();
    assert_eq!(review.len(), 4);
    assert!(review.iter().all(|r| r.status == FindingStatus::Open && r.tenant == w.t));
    let queued = w.store.receive(REVIEW_QUEUE, 10, Duration::from_secs(30), Duration::ZERO).await.unwrap();
    assert_eq!(queued.len(), 4);
    assert!(queued.iter().any(|m| m.body.contains("\"sku_id\":\"a\"")));
}

// ---------------------------------------------------------------------------------------------
// Findings: one record per difference, settled by a person (docs/inventory.md, "Findings")
// ---------------------------------------------------------------------------------------------

/// Moves a counter of `sku` (its stock item, or shard `shard`) behind the ledger's back.
async fn drift(w: &World, sku: &str, shard: Option<u32>, counter: &str, by: i64) {
    let key = match shard {
        None => tidings_core::ports::Key::new(format!("T#{}#SKU#{sku}", w.t), "STOCK"),
        Some(i) => tidings_core::ports::Key::new(format!("T#{}#SKU#{sku}#S{i}", w.t), "CELL"),
    };
    w.deps.table.update(&key, vec![Update::add(counter, by)], tidings_core::ports::Cond::Exists).await.unwrap();
}

async fn open_findings(w: &World) -> Vec<Finding> {
    findings::all(&w.deps, FindingStatus::Open).await.unwrap()
}

async fn reviews_queued(w: &World) -> usize {
    w.store.receive(REVIEW_QUEUE, 10, Duration::from_secs(300), Duration::ZERO).await.unwrap().len()
}

fn settle_req(kind: &str, reason: &str) -> SettleRequest {
    SettleRequest { kind: kind.to_owned(), reason: reason.to_owned() }
}

/// Every run sees the difference; one record holds it (first and last seen, how often) and one
/// message was queued for it, while sales move the counters and the ledger together.
#[tokio::test]
async fn a_difference_seen_by_every_run_is_one_finding_queued_once() {
    let w = world();
    warm(&w, "a", 10).await;
    drift(&w, "a", None, "available", 2).await;
    let first = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!(first.opened, 1);
    w.clock.advance(chrono::TimeDelta::hours(1));
    inventory::place_order(&w.deps, &w.t, &order("o", &[("a", 3)], None)).await.unwrap();
    let second = inventory::reconcile(&w.deps, Some(&w.t)).await.unwrap();
    assert_eq!(second.opened, 0, "{second:?}");
    assert_eq!(second.discrepancies[0].finding_id, first.discrepancies[0].finding_id);
    let open = open_findings(&w).await;
    assert_eq!(open.len(), 1, "{open:?}");
    let f = &open[0];
    assert_eq!((f.times_seen, f.difference), (2, Counters::new(2, 0, 0)));
    assert_eq!((f.expected, f.actual), (Counters::new(7, 3, 0), Counters::new(9, 3, 0)), "the latest sums: {f:?}");
    assert!(f.last_seen > f.first_seen, "{f:?}");
    assert_eq!(reviews_queued(&w).await, 1, "queued once");

    // The difference changes while the finding is open: the same record shows the new one.
    drift(&w, "a", None, "available", 1).await;
    let third = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!(third.opened, 0);
    let open = open_findings(&w).await;
    assert_eq!((open.len(), open[0].difference, open[0].times_seen), (1, Counters::new(3, 0, 0), 3));
}

/// A corrective entry settles a finding with the ledger alone: the counters do not move, the
/// next run finds no difference and no open finding; settling it again is 409.
#[tokio::test]
async fn a_corrective_entry_makes_the_ledger_agree_and_the_counters_stay() {
    let w = world();
    warm(&w, "a", 10).await;
    warm_sharded(&w, "c", 8, 4).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("a", 2), ("c", 1)], Some(600))).await.unwrap();
    drift(&w, "a", None, "reserved", -1).await;
    drift(&w, "c", Some(0), "available", -1).await;
    drift(&w, "c", Some(1), "available", 1).await;
    let report = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!(report.opened, 3, "{report:?}");
    let before = (stock(&w, "a").await.counters(), stock(&w, "c").await.counters());
    for f in open_findings(&w).await {
        let settled =
            findings::settle(&w.deps, &f.id, &settle_req("corrective_entry", "counted"), "ops-1").await.unwrap();
        let s = settled.settlement.clone().unwrap();
        assert_eq!(
            (settled.status, s.kind, s.by.as_str()),
            (FindingStatus::Settled, SettlementKind::CorrectiveEntry, "ops-1")
        );
        let again = findings::settle(&w.deps, &f.id, &settle_req("accepted", "again"), "ops-1").await.unwrap_err();
        assert_eq!(code_of(&again), "already_settled");
    }
    assert_eq!((stock(&w, "a").await.counters(), stock(&w, "c").await.counters()), before, "no counter moved");
    let corrections: Vec<_> = inventory::all_ledger_entries(&w.deps, &w.t, "c")
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == LedgerKind::Correction)
        .collect();
    assert_eq!(corrections.len(), 2, "one per shard: {corrections:?}");
    assert!(corrections.iter().all(|e| e.shards.len() == 1 && e.reason.as_deref() == Some("counted")));
    assert_consistent(&w, &["a", "c"]).await;
    let after = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!((after.discrepancies.len(), after.opened), (0, 0), "{after:?}");
    assert!(open_findings(&w).await.is_empty());
    assert_eq!(findings::all(&w.deps, FindingStatus::Settled).await.unwrap().len(), 3);

    // A new difference on the corrected cell is a new finding.
    drift(&w, "a", None, "sold", 1).await;
    assert_eq!(inventory::reconcile(&w.deps, None).await.unwrap().opened, 1);
}

/// An accepted finding is not reopened while the difference is the one accepted; another
/// difference opens a new finding.
#[tokio::test]
async fn an_accepted_difference_is_not_reopened_and_a_new_one_is_a_new_finding() {
    let w = world();
    warm(&w, "b", 10).await;
    drift(&w, "b", None, "available", -1).await;
    inventory::reconcile(&w.deps, None).await.unwrap();
    let id = open_findings(&w).await[0].id.clone();
    let settled = findings::settle(&w.deps, &id, &settle_req("accepted", "legacy import"), "ops-1").await.unwrap();
    assert_eq!(settled.settlement.map(|s| s.kind), Some(SettlementKind::Accepted));
    assert_eq!(stock(&w, "b").await.available, 9, "nothing written");
    assert_eq!(reviews_queued(&w).await, 1);
    for _ in 0..2 {
        let run = inventory::reconcile(&w.deps, None).await.unwrap();
        assert_eq!(run.opened, 0, "{run:?}");
        assert_eq!(
            run.discrepancies[0].finding_id.as_deref(),
            Some(id.as_str()),
            "reported, under the accepted finding"
        );
    }
    assert!(open_findings(&w).await.is_empty(), "not reopened");
    assert_eq!(reviews_queued(&w).await, 0, "not queued again");

    drift(&w, "b", None, "available", -1).await;
    let run = inventory::reconcile(&w.deps, None).await.unwrap();
    assert_eq!(run.opened, 1, "{run:?}");
    let open = open_findings(&w).await;
    assert_eq!((open.len(), open[0].difference), (1, Counters::new(-2, 0, 0)));
    assert_ne!(open[0].id, id);
}

/// Settling checks its input (422 naming the field, 404 for no such finding) and refuses a
/// corrective entry for a difference that is not the finding's any more (409, nothing written).
#[tokio::test]
async fn settling_refuses_bad_input_and_a_difference_that_moved() {
    let w = world();
    warm(&w, "a", 10).await;
    drift(&w, "a", None, "available", 2).await;
    inventory::reconcile(&w.deps, None).await.unwrap();
    let id = open_findings(&w).await[0].id.clone();
    for (req, field) in [
        (settle_req("corrective_entry", ""), "reason"),
        (settle_req("corrective_entry", " \n "), "reason"),
        (settle_req("corrective_entry", &"x".repeat(findings::MAX_REASON + 1)), "reason"),
        (settle_req("fix", "x"), "kind"),
    ] {
        match findings::settle(&w.deps, &id, &req, "ops-1").await {
            Err(CoreError::Invalid { field: f, .. }) => assert_eq!(f, field, "{req:?}"),
            other => panic!("{req:?}: {other:?}"),
        }
    }
    let e = findings::settle(&w.deps, "nope", &settle_req("accepted", "x"), "ops-1").await.unwrap_err();
    assert_eq!(code_of(&e), "not_found");
    let e = findings::settle(&w.deps, "a#b", &settle_req("accepted", "x"), "ops-1").await.unwrap_err();
    assert_eq!(code_of(&e), "invalid");

    drift(&w, "a", None, "available", 1).await;
    let entries = inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().len();
    let e = findings::settle(&w.deps, &id, &settle_req("corrective_entry", "x"), "ops-1").await.unwrap_err();
    assert_eq!(code_of(&e), "finding_changed", "{e}");
    assert_eq!(inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().len(), entries, "nothing written");
    assert_eq!(open_findings(&w).await.len(), 1, "still open");
    // The next run shows the new difference on the same finding; then it can be corrected.
    inventory::reconcile(&w.deps, None).await.unwrap();
    findings::settle(&w.deps, &id, &settle_req("corrective_entry", "x"), "ops-1").await.unwrap();
    assert_consistent(&w, &["a"]).await;
}

/// Two runs at once (a start's run and an operator's) still make one finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_make_one_finding() {
    let w = world();
    for sku in ["a", "b", "c"] {
        warm(&w, sku, 10).await;
        drift(&w, sku, None, "available", 1).await;
    }
    let runs = (0..4).map(|_| inventory::reconcile(&w.deps, None));
    let reports = futures::future::join_all(runs).await;
    let opened: u64 = reports.into_iter().map(|r| r.unwrap().opened).sum();
    assert_eq!(opened, 3);
    assert_eq!(open_findings(&w).await.len(), 3);
    assert_eq!(reviews_queued(&w).await, 3);
}

// ---------------------------------------------------------------------------------------------
// Orders, races, idempotency
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn multi_sku_orders_are_all_or_nothing() {
    let w = world();
    warm(&w, "a", 10).await;
    warm(&w, "b", 1).await;
    let e = inventory::place_order(&w.deps, &w.t, &order("o", &[("a", 2), ("b", 2)], None)).await.unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    assert!(e.to_string().contains("sku b"), "{e}");
    assert_eq!(stock(&w, "a").await.counters(), Counters::new(10, 0, 0), "nothing held on a");
    assert!(inventory::get_order(&w.deps, &w.t, "o").await.unwrap().is_none());
    assert_eq!(inventory::all_ledger_entries(&w.deps, &w.t, "a").await.unwrap().len(), 1);

    warm(&w, "x", 20).await;
    warm(&w, "y", 5).await;
    let (ok, short) = concurrent_orders(&w, "xy", 20, &[("x", 1), ("y", 1)]).await;
    assert_eq!((ok, short), (5, 15));
    assert_eq!(stock(&w, "x").await.counters(), Counters::new(15, 5, 0));
    assert_eq!(stock(&w, "y").await.counters(), Counters::new(0, 5, 0));
    assert_consistent(&w, &["a", "b", "x", "y"]).await;
}

/// The releases and sales recorded for one order.
async fn settlements_of(w: &World, sku: &str, order_id: &str) -> Vec<LedgerKind> {
    inventory::all_ledger_entries(&w.deps, &w.t, sku)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.reference == format!("order:{order_id}") && e.kind != LedgerKind::Reserve)
        .map(|e| e.kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn pay_cancel_and_expiry_race_and_exactly_one_wins() {
    let w = world();
    warm(&w, "s", 100).await;
    for phase in ["before", "after"] {
        let ids: Vec<String> = (0..15).map(|i| format!("{phase}-{i}")).collect();
        for id in &ids {
            inventory::place_order(&w.deps, &w.t, &order(id, &[("s", 2)], Some(600))).await.unwrap();
        }
        if phase == "after" {
            w.clock.advance(chrono::Duration::seconds(601));
        }
        for id in &ids {
            let (d1, d2, d3) = (w.deps.clone(), w.deps.clone(), w.deps.clone());
            let (t1, t2, t3) = (w.t.clone(), w.t.clone(), w.t.clone());
            let (i1, i2, i3) = (id.clone(), id.clone(), id.clone());
            let pay = tokio::spawn(async move { inventory::pay(&d1, &t1, &i1).await });
            let cancel = tokio::spawn(async move { inventory::cancel(&d2, &t2, &i2).await });
            let expire = tokio::spawn(async move { inventory::expire_order(&d3, &t3, &i3).await });
            let paid = pay.await.unwrap().is_ok();
            let cancelled = cancel.await.unwrap();
            let expired = matches!(expire.await.unwrap().unwrap(), Settlement::Settled(_));
            let kinds = settlements_of(&w, "s", id).await;
            assert_eq!(kinds.len(), 1, "{id}: settled once, released at most once: {kinds:?}");
            let (status, reason) = order_status(&w, id).await;
            match status {
                OrderStatus::Paid => {
                    assert!(paid && cancelled.is_err() && !expired);
                    assert_eq!(kinds, [LedgerKind::Sell]);
                }
                OrderStatus::Cancelled => {
                    assert!(!paid);
                    assert_eq!(kinds, [LedgerKind::Release]);
                    assert_eq!(expired, reason.as_deref() == Some("expiry"));
                    assert!(cancelled.is_ok(), "cancel of a cancelled order answers it");
                }
                other => panic!("{id} still {other:?}"),
            }
            if phase == "after" {
                assert!(!paid, "a hold past expires_at cannot be paid");
            }
        }
    }
    assert_consistent(&w, &["s"]).await;
    let s = stock(&w, "s").await;
    assert_eq!(s.reserved, 0);
    assert_eq!(s.available + s.sold, 100);
}

#[tokio::test]
async fn pay_and_cancel_follow_the_state_machine() {
    let w = world();
    warm(&w, "s", 10).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 2)], None)).await.unwrap();
    let paid = inventory::pay(&w.deps, &w.t, "o").await.unwrap();
    assert_eq!(paid.status, OrderStatus::Paid);
    assert_eq!(code_of(&inventory::pay(&w.deps, &w.t, "o").await.unwrap_err()), "invalid_state");
    assert_eq!(code_of(&inventory::cancel(&w.deps, &w.t, "o").await.unwrap_err()), "invalid_state");
    assert_eq!(stock(&w, "s").await.counters(), Counters::new(8, 0, 2));
    inventory::place_order(&w.deps, &w.t, &order("c", &[("s", 3)], None)).await.unwrap();
    inventory::cancel(&w.deps, &w.t, "c").await.unwrap();
    inventory::cancel(&w.deps, &w.t, "c").await.unwrap();
    assert_eq!(code_of(&inventory::pay(&w.deps, &w.t, "c").await.unwrap_err()), "invalid_state");
    assert_eq!(stock(&w, "s").await.counters(), Counters::new(8, 0, 2));
    assert_eq!(code_of(&inventory::pay(&w.deps, &w.t, "nope").await.unwrap_err()), "not_found");
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test]
async fn warm_up_is_idempotent_and_never_overwrites() {
    let w = world();
    let (v, created) = inventory::warm_up(&w.deps, &w.t, "s", &warm_req(10, None, None)).await.unwrap();
    assert!(created);
    assert_eq!((v.available, v.restock_round), (10, 0));
    inventory::adjust(&w.deps, &w.t, "s", &adjustment(-3, "damage", "d1")).await.unwrap();
    let (v, created) = inventory::warm_up(&w.deps, &w.t, "s", &warm_req(50, None, None)).await.unwrap();
    assert!(!created);
    assert_eq!(v.available, 7, "the manual adjustment survives a repeated warm-up");
    let entries = inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].kind, LedgerKind::WarmUp);
    assert_eq!(entries[0].delta_available, 10);
    assert_eq!(
        code_of(&inventory::warm_up(&w.deps, &w.t, "x", &warm_req(-1, None, None)).await.unwrap_err()),
        "invalid"
    );
    assert_eq!(
        code_of(&inventory::warm_up(&w.deps, &w.t, "x", &warm_req(1, Some(17), None)).await.unwrap_err()),
        "invalid"
    );
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test]
async fn adjustments_apply_once_per_key() {
    let w = world();
    warm(&w, "s", 5).await;
    let a = adjustment(10, "purchase_order", "po-7");
    assert_eq!(inventory::adjust(&w.deps, &w.t, "s", &a).await.unwrap().available, 15);
    assert_eq!(inventory::adjust(&w.deps, &w.t, "s", &a).await.unwrap().available, 15, "same key: applied once");
    let other = adjustment(11, "purchase_order", "po-7");
    assert_eq!(code_of(&inventory::adjust(&w.deps, &w.t, "s", &other).await.unwrap_err()), "idempotency_conflict");
    // Never below zero.
    let e = inventory::adjust(&w.deps, &w.t, "s", &adjustment(-16, "transfer", "t-1")).await.unwrap_err();
    assert_eq!(code_of(&e), "insufficient_stock");
    assert_eq!(inventory::adjust(&w.deps, &w.t, "s", &adjustment(-15, "transfer", "t-2")).await.unwrap().available, 0);
    assert_eq!(
        code_of(&inventory::adjust(&w.deps, &w.t, "s", &adjustment(1, "gift", "g")).await.unwrap_err()),
        "invalid"
    );
    assert_eq!(
        code_of(&inventory::adjust(&w.deps, &w.t, "s", &adjustment(0, "manual", "z")).await.unwrap_err()),
        "invalid"
    );
    assert_eq!(
        code_of(&inventory::adjust(&w.deps, &w.t, "nope", &adjustment(1, "manual", "n")).await.unwrap_err()),
        "not_found"
    );
    let entries = inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap();
    assert_eq!(entries.iter().filter(|e| e.kind == LedgerKind::Adjustment).count(), 2);
    assert!(entries.iter().any(|e| e.reference == "purchase_order:po-7"));

    // Concurrent repeats of one key: still once.
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (d, t) = (w.deps.clone(), w.t.clone());
        tasks
            .push(tokio::spawn(async move { inventory::adjust(&d, &t, "s", &adjustment(4, "return", "ret-1")).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(stock(&w, "s").await.available, 4);
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_are_idempotent() {
    let w = world();
    warm(&w, "s", 10).await;
    let req = order("o", &[("s", 3)], None);
    assert!(inventory::place_order(&w.deps, &w.t, &req).await.unwrap().created);
    let again = inventory::place_order(&w.deps, &w.t, &req).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.order.status, OrderStatus::Pending);
    // Concurrent repeats of one order: held once.
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (d, t, r) = (w.deps.clone(), w.t.clone(), order("p", &[("s", 2)], None));
        tasks.push(tokio::spawn(async move { inventory::place_order(&d, &t, &r).await }));
    }
    let mut created = 0;
    for task in tasks {
        created += usize::from(task.await.unwrap().unwrap().created);
    }
    assert_eq!(created, 1);
    assert_eq!(stock(&w, "s").await.counters(), Counters::new(5, 5, 0));
    let e = inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 4)], None)).await.unwrap_err();
    assert_eq!(code_of(&e), "idempotency_conflict");
    // The SKU sold out since: a repeat is still answered with the order as stored (not 409
    // insufficient_stock), and holds nothing more.
    assert!(inventory::place_order(&w.deps, &w.t, &order("q", &[("s", 5)], None)).await.unwrap().created);
    let again = inventory::place_order(&w.deps, &w.t, &req).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.order.order_id, "o");
    assert_eq!(stock(&w, "s").await.counters(), Counters::new(0, 10, 0));
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test]
async fn orders_are_validated() {
    let w = world();
    warm(&w, "s", 10).await;
    let bad = |e: CoreError| match e {
        CoreError::Invalid { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        bad(inventory::place_order(&w.deps, &w.t, &order("o", &[("s", -1)], None)).await.unwrap_err()),
        "items[0].qty"
    );
    assert_eq!(
        bad(inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 0)], None)).await.unwrap_err()),
        "items[0].qty"
    );
    assert_eq!(bad(inventory::place_order(&w.deps, &w.t, &order("o", &[], None)).await.unwrap_err()), "items");
    assert_eq!(
        bad(inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 1), ("s", 1)], None)).await.unwrap_err()),
        "items[1].sku_id"
    );
    // A SKU never stocked is not found (404), naming the item's field.
    match inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 1), ("zz", 1)], None)).await.unwrap_err() {
        CoreError::NotFoundAt { field, what } => assert_eq!((field.as_str(), what), ("items[1].sku_id", "sku")),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        bad(inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 1)], Some(0))).await.unwrap_err()),
        "hold_seconds"
    );
    assert_eq!(
        bad(inventory::place_order(&w.deps, &w.t, &order("a#b", &[("s", 1)], None)).await.unwrap_err()),
        "order_id"
    );
    // DynamoDB takes 100 writes per transaction: 49 SKUs fit, 50 do not.
    let names: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    for n in &names {
        warm(&w, n, 1).await;
    }
    let lines: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    assert_eq!(bad(inventory::place_order(&w.deps, &w.t, &order("big", &lines, None)).await.unwrap_err()), "items");
    inventory::place_order(&w.deps, &w.t, &order("fits", &lines[..49], None)).await.unwrap();
    inventory::cancel(&w.deps, &w.t, "fits").await.unwrap();
    // Sharded SKUs cost more writes each: three 16-shard SKUs and 40 plain ones do not fit.
    for i in 0..3 {
        warm_sharded(&w, &format!("h{i}"), 16, 16).await;
    }
    let mut heavy: Vec<(String, i64)> = (0..3).map(|i| (format!("h{i}"), 1)).collect();
    heavy.extend(names.iter().take(40).map(|n| (n.clone(), 1)));
    let heavy: Vec<(&str, i64)> = heavy.iter().map(|(s, q)| (s.as_str(), *q)).collect();
    assert_eq!(bad(inventory::place_order(&w.deps, &w.t, &order("heavy", &heavy, None)).await.unwrap_err()), "items");
    assert_consistent(&w, &["s", "k0", "k48", "h0"]).await;
}

#[tokio::test]
async fn tenants_do_not_see_each_other() {
    let w = world();
    warm(&w, "s", 10).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 1)], None)).await.unwrap();
    let other = TenantId::parse("shop-b").unwrap();
    assert!(inventory::get_order(&w.deps, &other, "o").await.unwrap().is_none());
    assert!(inventory::get_stock(&w.deps, &other, "s").await.unwrap().is_none());
    assert_eq!(code_of(&inventory::cancel(&w.deps, &other, "o").await.unwrap_err()), "not_found");
}

#[tokio::test]
async fn ledger_pages_oldest_first() {
    let w = world();
    warm(&w, "s", 100).await;
    for i in 0..7 {
        inventory::adjust(&w.deps, &w.t, "s", &adjustment(i + 1, "manual", &format!("k{i}"))).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = inventory::ledger(&w.deps, &w.t, "s", 3, cursor).await.unwrap().unwrap();
        assert!(page.items.len() <= 3);
        seen.extend(page.items.into_iter().map(|e| e.delta_available));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen, [100, 1, 2, 3, 4, 5, 6, 7]);
    assert!(inventory::ledger(&w.deps, &w.t, "nope", 3, None).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------------------------
// Restock rounds
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn restock_round_moves_exactly_when_available_leaves_zero() {
    let w = world();
    warm(&w, "s", 2).await;
    let round = |w: &World| {
        let (d, t) = (w.deps.clone(), w.t.clone());
        async move { inventory::get_stock(&d, &t, "s").await.unwrap().unwrap().restock_round }
    };
    assert_eq!(round(&w).await, 0);
    inventory::place_order(&w.deps, &w.t, &order("a", &[("s", 2)], None)).await.unwrap();
    assert_eq!(round(&w).await, 0, "selling out opens nothing");
    inventory::adjust(&w.deps, &w.t, "s", &adjustment(3, "purchase_order", "po1")).await.unwrap();
    assert_eq!(round(&w).await, 1, "0 -> 3 by a purchase order");
    inventory::adjust(&w.deps, &w.t, "s", &adjustment(1, "return", "r1")).await.unwrap();
    assert_eq!(round(&w).await, 1, "3 -> 4 is not a restock");
    inventory::place_order(&w.deps, &w.t, &order("b", &[("s", 4)], None)).await.unwrap();
    inventory::cancel(&w.deps, &w.t, "a").await.unwrap();
    assert_eq!(round(&w).await, 2, "0 -> 2 by a cancel");
    inventory::place_order(&w.deps, &w.t, &order("c", &[("s", 2)], Some(60))).await.unwrap();
    inventory::pay(&w.deps, &w.t, "b").await.unwrap();
    assert_eq!(round(&w).await, 2, "paying is not a restock");
    w.clock.advance(chrono::Duration::seconds(61));
    drain_timers(&w).await;
    assert_eq!(order_status(&w, "c").await, (OrderStatus::Cancelled, Some("expiry".into())));
    assert_eq!(round(&w).await, 3, "0 -> 2 by an expiry");
    inventory::adjust(&w.deps, &w.t, "s", &adjustment(-2, "damage", "d1")).await.unwrap();
    assert_eq!(round(&w).await, 3);
    assert_consistent(&w, &["s"]).await;

    // Many releases at once on a sold-out SKU open one round, not many.
    warm(&w, "z", 10).await;
    for i in 0..10 {
        inventory::place_order(&w.deps, &w.t, &order(&format!("z{i}"), &[("z", 1)], None)).await.unwrap();
    }
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (d, t) = (w.deps.clone(), w.t.clone());
        tasks.push(tokio::spawn(async move { inventory::cancel(&d, &t, &format!("z{i}")).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(stock(&w, "z").await.restock_round, 1);
    assert_consistent(&w, &["s", "z"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn restock_round_counts_over_all_shards() {
    let w = world();
    warm_sharded(&w, "h", 4, 4).await;
    for i in 0..4 {
        inventory::place_order(&w.deps, &w.t, &order(&format!("h{i}"), &[("h", 1)], None)).await.unwrap();
    }
    assert_eq!(stock(&w, "h").await.available, 0);
    inventory::cancel(&w.deps, &w.t, "h0").await.unwrap();
    assert_eq!(stock(&w, "h").await.restock_round, 1);
    inventory::cancel(&w.deps, &w.t, "h1").await.unwrap();
    assert_eq!(stock(&w, "h").await.restock_round, 1, "1 -> 2 over the shards is not a restock");
    // Sold out again, then concurrent releases: one round.
    inventory::place_order(&w.deps, &w.t, &order("h4", &[("h", 2)], None)).await.unwrap();
    let mut tasks = Vec::new();
    for id in ["h2", "h3", "h4"] {
        let (d, t) = (w.deps.clone(), w.t.clone());
        tasks.push(tokio::spawn(async move { inventory::cancel(&d, &t, id).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(stock(&w, "h").await.restock_round, 2);
    assert_consistent(&w, &["h"]).await;
}

/// The stock item's change record shows the round opening, as the back-in-stock feature reads it.
#[tokio::test]
async fn restock_shows_in_the_change_stream() {
    use tidings_core::ports::ChangeFeed;
    let w = world();
    warm(&w, "s", 1).await;
    inventory::place_order(&w.deps, &w.t, &order("a", &[("s", 1)], None)).await.unwrap();
    let feed = w.store.change_feed("restock-test");
    // Skip what happened so far.
    loop {
        let batch = tokio::time::timeout(Duration::from_millis(200), feed.next_batch(100)).await;
        match batch {
            Ok(Ok(b)) if !b.is_empty() => feed.commit(&b).await.unwrap(),
            _ => break,
        }
    }
    inventory::cancel(&w.deps, &w.t, "a").await.unwrap();
    let batch = feed.next_batch(100).await.unwrap();
    let stock_change = batch.iter().find(|r| r.key.sk == "STOCK").expect("stock item changed");
    let old = stock_change.old.as_ref().unwrap();
    let new = stock_change.new.as_ref().unwrap();
    assert_eq!(old["available"], 0);
    assert_eq!(new["available"], 1);
    assert_eq!(new["restock_round"].as_i64().unwrap(), old["restock_round"].as_i64().unwrap() + 1);
}

// ---------------------------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_long_hold_expires_through_tick() {
    let w = world();
    warm(&w, "s", 5).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 2)], None)).await.unwrap();
    assert_eq!(drain_timers(&w).await, 0, "a 30-minute hold is not a queue delay");
    w.clock.advance(chrono::Duration::minutes(20));
    let early = timers::tick(&w.deps).await.unwrap();
    assert_eq!(early.timers_sent, 0, "its bucket is not due yet");
    assert_eq!(order_status(&w, "o").await.0, OrderStatus::Pending);
    w.clock.advance(chrono::Duration::minutes(11));
    let fired = timers::tick(&w.deps).await.unwrap();
    assert_eq!((fired.buckets_fired, fired.timers_sent), (1, 1));
    assert_eq!(drain_timers(&w).await, 1);
    assert_eq!(order_status(&w, "o").await, (OrderStatus::Cancelled, Some("expiry".into())));
    assert_eq!(stock(&w, "s").await.counters(), Counters::new(5, 0, 0));
    assert_eq!(timers::tick(&w.deps).await.unwrap(), timers::TickReport::default(), "the bucket is closed");
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test]
async fn a_short_hold_expires_through_the_delayed_message() {
    let w = world();
    warm(&w, "s", 5).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 2)], Some(300))).await.unwrap();
    w.clock.advance(chrono::Duration::seconds(299));
    assert_eq!(drain_timers(&w).await, 0, "not visible before its delay");
    w.clock.advance(chrono::Duration::seconds(2));
    assert_eq!(drain_timers(&w).await, 1);
    assert_eq!(order_status(&w, "o").await, (OrderStatus::Cancelled, Some("expiry".into())));
    assert_eq!(stock(&w, "s").await.available, 5);
    // The durable backstop fires later and changes nothing.
    w.clock.advance(chrono::Duration::minutes(10));
    timers::tick(&w.deps).await.unwrap();
    drain_timers(&w).await;
    assert_eq!(inventory::all_ledger_entries(&w.deps, &w.t, "s").await.unwrap().len(), 3);
    assert_consistent(&w, &["s"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_ticks_fire_a_bucket_once() {
    let w = world();
    let due = start() + chrono::Duration::minutes(40);
    for i in 0..3 {
        let task = TimerTask::OrderExpire { tenant: w.t.clone(), order_id: format!("gone-{i}") };
        timers::schedule(&w.deps, due, task).await.unwrap();
    }
    w.clock.advance(chrono::Duration::minutes(41));
    let (a, b) = tokio::join!(timers::tick(&w.deps), timers::tick(&w.deps));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.buckets_fired + b.buckets_fired, 1);
    assert_eq!(a.timers_sent + b.timers_sent, 3);
    assert_eq!(drain_timers(&w).await, 3, "expiring orders that are gone is harmless");
    assert_eq!(timers::tick(&w.deps).await.unwrap().timers_sent, 0);
}

/// An instance remembers the buckets it saw open and does not read their index again; one it
/// fired is forgotten, so a timer put there later (a clock set back) opens it again and never
/// lands in a bucket no tick will fire.
#[tokio::test]
async fn a_bucket_fired_is_opened_again_for_a_later_timer() {
    let w = world();
    let due = start() + chrono::Duration::minutes(30);
    let first = TimerTask::OrderExpire { tenant: w.t.clone(), order_id: "first".into() };
    timers::schedule(&w.deps, due, first).await.unwrap();
    w.clock.advance(chrono::Duration::minutes(31));
    assert_eq!(timers::tick(&w.deps).await.unwrap().timers_sent, 1);
    assert_eq!(drain_timers(&w).await, 1);
    // The bucket is fired and its index gone; back to before it, another timer due then.
    w.clock.set(start());
    let second = TimerTask::OrderExpire { tenant: w.t.clone(), order_id: "second".into() };
    timers::schedule(&w.deps, due, second).await.unwrap();
    let bucket = timers::bucket_of(due.timestamp_millis());
    let index = tidings_core::ports::Key::new(timers::OPEN_BUCKETS_PK, bucket);
    assert!(w.deps.table.get(&index).await.unwrap().is_some(), "the bucket's index is written again");
    w.clock.advance(chrono::Duration::minutes(31));
    assert_eq!(timers::tick(&w.deps).await.unwrap().timers_sent, 1, "the second timer fires");
}

#[tokio::test]
async fn an_expired_bucket_lease_is_claimed_again() {
    let w = world();
    let due = start() + chrono::Duration::minutes(30);
    let task = TimerTask::OrderExpire { tenant: w.t.clone(), order_id: "o".into() };
    timers::schedule(&w.deps, due, task).await.unwrap();
    w.clock.advance(chrono::Duration::minutes(31));
    // A tick that claimed the bucket and died.
    let bucket = timers::bucket_of(due.timestamp_millis());
    let index = tidings_core::ports::Key::new(timers::OPEN_BUCKETS_PK, bucket);
    let until = tidings_core::ports::Clock::now_ms(&*w.clock) + 60_000;
    w.deps
        .table
        .update(
            &index,
            vec![Update::set("lease_owner", "dead"), Update::set("lease_until_ms", until)],
            tidings_core::ports::Cond::Exists,
        )
        .await
        .unwrap();
    assert_eq!(timers::tick(&w.deps).await.unwrap().timers_sent, 0, "leased by someone else");
    w.clock.advance(chrono::Duration::seconds(61));
    assert_eq!(timers::tick(&w.deps).await.unwrap().timers_sent, 1, "the lease ran out");
}

#[tokio::test]
async fn an_early_timer_message_is_delayed_again() {
    let w = world();
    warm(&w, "s", 5).await;
    inventory::place_order(&w.deps, &w.t, &order("o", &[("s", 1)], Some(3600))).await.unwrap();
    // A message due in 40 minutes (as schedule would never send, but a skewed clock could).
    let due_ms = tidings_core::ports::Clock::now_ms(&*w.clock) + 40 * 60_000;
    let body = serde_json::to_string(&TimerMessage {
        due_ms,
        task: TimerTask::OrderExpire { tenant: w.t.clone(), order_id: "o".into() },
    })
    .unwrap();
    w.store.send_batch(TIMERS_QUEUE, vec![tidings_core::ports::OutMessage::new(body)]).await.unwrap();
    assert_eq!(drain_timers(&w).await, 1);
    assert_eq!(order_status(&w, "o").await.0, OrderStatus::Pending);
    w.clock.advance(chrono::Duration::minutes(15));
    assert_eq!(drain_timers(&w).await, 1, "re-delayed by 15 minutes, then again");
    w.clock.advance(chrono::Duration::minutes(15));
    assert_eq!(drain_timers(&w).await, 1);
    w.clock.advance(chrono::Duration::minutes(10));
    assert_eq!(drain_timers(&w).await, 1);
    // Due, but the order's own hold runs an hour: expiry is not due and reschedules itself.
    assert_eq!(order_status(&w, "o").await.0, OrderStatus::Pending);
    w.clock.advance(chrono::Duration::minutes(21));
    timers::tick(&w.deps).await.unwrap();
    drain_timers(&w).await;
    assert_eq!(order_status(&w, "o").await.0, OrderStatus::Cancelled);
}

#[tokio::test]
async fn a_malformed_timer_message_is_rejected() {
    let w = world();
    let m = tidings_core::ports::Received {
        message_id: "m".into(),
        receipt: "r".into(),
        body: "{\"nope\":1}".into(),
        receive_count: 1,
        sent_at_ms: 0,
        group: None,
    };
    assert!(matches!(handle::<TimerStep>(&w.deps, &m).await, Outcome::Reject(_)));
}

/// Issue 4's bar: 1,000 concurrent single-unit orders on 200 units, one counter and 8 shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_thousand_buyers_for_two_hundred_units() {
    let w = world();
    warm(&w, "one", 200).await;
    warm_sharded(&w, "eight", 200, 8).await;
    for sku in ["one", "eight"] {
        let (ok, short) = concurrent_orders(&w, sku, 1000, &[(sku, 1)]).await;
        assert_eq!((ok, short), (200, 800), "{sku}");
        assert_eq!(stock(&w, sku).await.counters(), Counters::new(0, 200, 0), "{sku}");
    }
    assert_consistent(&w, &["one", "eight"]).await;
}

/// A world whose expiry messages wait for the returned semaphore to get a permit.
fn held_world(detached: bool) -> (World, Arc<tokio::sync::Semaphore>) {
    let w = world_with(CoreConfig { detached_expiry_messages: detached, ..CoreConfig::default() });
    let open = Arc::new(tokio::sync::Semaphore::new(0));
    let held = open.clone();
    // Sends to the timers queue wait for a permit: the order's expiry message is held back.
    let hook: SendHook = Arc::new(move |queue| {
        let held = (queue == TIMERS_QUEUE).then(|| held.clone());
        Box::pin(async move {
            if let Some(held) = held {
                let _ = held.acquire().await;
            }
            Ok(())
        })
    });
    let queues: Arc<dyn Queues> = HookedSends::new(w.deps.queues.clone(), hook);
    (World { deps: Deps { queues, ..w.deps }, ..w }, open)
}

async fn timer_messages(w: &World) -> u64 {
    let s = w.store.stats(TIMERS_QUEUE).await.unwrap();
    s.visible + s.in_flight + s.delayed
}

/// In a process that outlives its requests (`tidings serve`), an order is answered once it is
/// durable, without waiting for its expiry message, a second write; the message follows.
/// Elsewhere (a Lambda function, frozen once it answers) the answer waits for the message.
#[tokio::test]
async fn a_detached_expiry_message_goes_after_the_answer_and_an_attached_one_before() {
    let (w, open) = held_world(true);
    warm(&w, "a", 10).await;
    let placed = tokio::time::timeout(
        Duration::from_secs(30),
        inventory::place_order(&w.deps, &w.t, &order("o1", &[("a", 1)], Some(60))),
    )
    .await
    .expect("answered while its expiry message is held back")
    .unwrap();
    assert!(placed.created);
    assert_eq!(timer_messages(&w).await, 0, "the message is still held");
    open.add_permits(1);
    for _ in 0..3000 {
        if timer_messages(&w).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(timer_messages(&w).await, 1, "the message follows the answer");

    let (w, open) = held_world(false);
    warm(&w, "a", 10).await;
    let deps = w.deps.clone();
    let t = w.t.clone();
    let placing =
        tokio::spawn(async move { inventory::place_order(&deps, &t, &order("o1", &[("a", 1)], Some(60))).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!placing.is_finished(), "not answered before its expiry message is sent");
    open.add_permits(1);
    assert!(placing.await.unwrap().unwrap().created);
    assert_eq!(timer_messages(&w).await, 1);
}
