//! Market-scoped alerts (docs/restock.md, "Markets") on the embedded store: a subscription that
//! names a market hears only of stock at locations serving it; a wave counts only the units that
//! market can buy; a market that had none opens a round of its own though the SKU had stock
//! elsewhere; a subscription that names no market behaves as before markets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tidings_core::inventory::locations::{self, LocationRequest};
use tidings_core::inventory::{self, AdjustmentRequest, LocationStockRequest};
use tidings_core::restock::{self, RestockConfig, SubscriptionRequest, SubscriptionStatus};
use tidings_core::{CoreConfig, CoreError, Deps, TenantId};
use tidings_embedded::test_world::TestWorld;

struct Shop {
    deps: Deps,
    t: TenantId,
}

/// Two locations, `east` serving US and `north` serving CA, a SKU with none at either; one
/// notice per unit a market can buy (wave factor 1).
async fn shop() -> Shop {
    let restock = RestockConfig { batch_pause: Duration::ZERO, wave_factor: 1, ..RestockConfig::default() };
    let tw = TestWorld::builder().all_queues(2).config(CoreConfig { restock, ..CoreConfig::default() }).build();
    let s = Shop { deps: tw.deps, t: TenantId::parse("shop-m").unwrap() };
    for (id, market) in [("east", "US"), ("north", "CA")] {
        let req = LocationRequest { name: id.into(), markets: vec![market.into()], priority: 1 };
        locations::put(&s.deps, &s.t, id, &req).await.unwrap();
        let stock = LocationStockRequest { on_hand: 0, safety_stock: None };
        inventory::put_location_stock(&s.deps, &s.t, "hot", id, &stock).await.unwrap();
    }
    s
}

async fn subscribe(s: &Shop, user: &str, market: Option<&str>) -> Result<String, CoreError> {
    let req = SubscriptionRequest { market: market.map(str::to_owned), ..SubscriptionRequest::new(user, "hot") };
    restock::subscribe(&s.deps, &s.t, &req).await.map(|(sub, _)| sub.subscription_id)
}

/// `qty` units arrive at `location`; the SKU's round after it.
async fn arrive(s: &Shop, location: &str, qty: i64, key: &str) -> i64 {
    let req =
        AdjustmentRequest { location_id: Some(location.into()), ..AdjustmentRequest::new(qty, "purchase_order", key) };
    inventory::adjust(&s.deps, &s.t, "hot", &req).await.unwrap().restock_round
}

async fn status(s: &Shop, id: &str) -> SubscriptionStatus {
    restock::subscriptions::get(&s.deps, &s.t, id).await.unwrap().unwrap().status
}

#[tokio::test]
async fn stock_where_a_market_is_not_served_alerts_nobody_in_it_and_a_market_that_had_none_opens_a_round() {
    let s = shop().await;
    let us1 = subscribe(&s, "us1", Some("US")).await.unwrap();
    let us2 = subscribe(&s, "us2", Some("US")).await.unwrap();
    let ca1 = subscribe(&s, "ca1", Some("CA")).await.unwrap();
    let ca2 = subscribe(&s, "ca2", Some("CA")).await.unwrap();
    let ca3 = subscribe(&s, "ca3", Some("CA")).await.unwrap();
    let anyone = subscribe(&s, "anyone", None).await.unwrap();

    // Two units at north (CA only): the SKU went from 0, a round opens. CA's wave counts CA's two
    // units (two of its three notified, oldest first); nobody in the US hears of it; the
    // subscription of no market counts every location's units, as before markets.
    let round = arrive(&s, "north", 2, "po-1").await;
    assert_eq!(round, 1);
    let report = restock::run_round(&s.deps, &s.t, "hot", round, None).await.unwrap();
    assert_eq!(report.claimed, 3, "{report:?}");
    assert_eq!(report.stopped, "quota", "CA's quota is used: a next wave is due for the rest");
    for (id, want) in [
        (&ca1, SubscriptionStatus::Notified),
        (&ca2, SubscriptionStatus::Notified),
        (&ca3, SubscriptionStatus::Waiting),
        (&anyone, SubscriptionStatus::Notified),
        (&us1, SubscriptionStatus::Waiting),
        (&us2, SubscriptionStatus::Waiting),
    ] {
        assert_eq!(status(&s, id).await, want, "{id}");
    }

    // More at north: CA had some, nothing opens.
    assert_eq!(arrive(&s, "north", 1, "po-2").await, round, "a market that still had stock opens no round");

    // One unit at east: the SKU had stock at north, but the US had none: a round of its own,
    // whose wave tells one US subscriber (the oldest), for the one unit the US can buy.
    let next = arrive(&s, "east", 1, "po-3").await;
    assert_eq!(next, round + 1, "the US went from 0");
    restock::run_round(&s.deps, &s.t, "hot", next, None).await.unwrap();
    assert_eq!(status(&s, &us1).await, SubscriptionStatus::Notified);
    assert_eq!(status(&s, &us2).await, SubscriptionStatus::Waiting, "one unit, one notice");
    // CA still has three units: its last subscriber is told in this round too.
    assert_eq!(status(&s, &ca3).await, SubscriptionStatus::Notified);

    // A location's first stock, for a market no location held any of: a round too.
    let req = LocationRequest { name: "south".into(), markets: vec!["MX".into()], priority: 1 };
    locations::put(&s.deps, &s.t, "south", &req).await.unwrap();
    let stock = LocationStockRequest { on_hand: 2, safety_stock: None };
    inventory::put_location_stock(&s.deps, &s.t, "hot", "south", &stock).await.unwrap();
    let view = inventory::get_stock(&s.deps, &s.t, "hot").await.unwrap().unwrap();
    assert_eq!(view.restock_round, next + 1, "MX had none");
}

#[tokio::test]
async fn a_market_is_two_upper_case_letters() {
    let s = shop().await;
    for bad in ["us", "USA", "U1", ""] {
        match subscribe(&s, "u", Some(bad)).await {
            Err(CoreError::Invalid { field, .. }) => assert_eq!(field, "market", "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}
