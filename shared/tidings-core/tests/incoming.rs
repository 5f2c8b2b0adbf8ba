//! Incoming stock (docs/inventory.md, "Incoming stock") on the embedded store with a manual
//! clock: a shipment is shown on its SKU until its purchase order's arrival closes it in the
//! adjustment's own transaction; subscribers who asked hear its date once per shipment and date
//! (however often it is recorded again, and a page of subscribers at a time), the others never;
//! a subscriber who asks later hears it at once; the arrival still opens the back-in-stock round.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::json;
use tidings_core::error::CoreError;
use tidings_core::inventory::incoming::{self, IncomingRequest, Recorded};
use tidings_core::inventory::{self, AdjustmentRequest, WarmUpRequest};
use tidings_core::people::users::{self, UserInput};
use tidings_core::restock::{self, SubscriptionRequest, SubscriptionStatus};
use tidings_core::{TenantId, timers};
use tidings_embedded::test_world::{Recorder, TestWorld, drain};

struct Shop {
    w: TestWorld,
    t: TenantId,
    email: Arc<Recorder>,
}

async fn shop() -> Shop {
    let email = Arc::new(Recorder::default());
    let w = TestWorld::builder().all_queues(5).email(email.clone()).build();
    let t = TenantId::parse("shop").unwrap();
    let req = WarmUpRequest { on_hand: 0, shards: None, category: None };
    inventory::warm_up(&w.deps, &t, "A", &req).await.unwrap();
    inventory::warm_up(&w.deps, &t, "B", &req).await.unwrap();
    Shop { w, t, email }
}

async fn settle(s: &Shop) {
    let feed = s.w.feed("test");
    drain(&s.w.deps, &feed).await;
}

/// Past a merge window: what waits is sent.
async fn pass(s: &Shop, secs: i64) {
    s.w.clock().advance(chrono::Duration::seconds(secs));
    timers::tick(&s.w.deps).await.unwrap();
    settle(s).await;
}

async fn subscriber(s: &Shop, user: &str, sku: &str, notify_incoming: bool) -> String {
    let input = UserInput { email: Some(format!("{user}@example.com")), ..UserInput::default() };
    users::put_user(&s.w.deps, &s.t, user, input).await.unwrap();
    let req = SubscriptionRequest { notify_incoming, ..SubscriptionRequest::new(user, sku) };
    restock::subscribe(&s.w.deps, &s.t, &req).await.unwrap().0.subscription_id
}

fn shipment(reference: &str, qty: i64, expected_at: &str) -> IncomingRequest {
    serde_json::from_value(json!({"ref": reference, "qty": qty, "expected_at": expected_at})).unwrap()
}

async fn expect(s: &Shop, sku: &str, req: &IncomingRequest) -> Result<Recorded, CoreError> {
    incoming::expect(&s.w.deps, &s.t, sku, req).await.map(|(_, r)| r)
}

fn arrival(delta: i64, key: &str, reference: Option<&str>) -> AdjustmentRequest {
    AdjustmentRequest {
        reference: reference.map(str::to_owned),
        ..AdjustmentRequest::new(delta, "purchase_order", key)
    }
}

/// The bodies of the emails `user` got.
fn emails_to(s: &Shop, user: &str) -> Vec<String> {
    s.email.sent.lock().unwrap().iter().filter(|m| m.user_id == user).map(|m| m.body.clone()).collect()
}

#[tokio::test]
async fn a_shipment_is_shown_until_its_arrival_closes_it_once() {
    let s = shop().await;
    assert_eq!(expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap(), Recorded::Created);
    assert_eq!(expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap(), Recorded::Unchanged);
    assert_eq!(expect(&s, "A", &shipment("po-8", 5, "2026-12-10T09:00:00+01:00")).await.unwrap(), Recorded::Created);
    let view = inventory::get_stock(&s.w.deps, &s.t, "A").await.unwrap().unwrap();
    let shown: Vec<(&str, i64, &str)> =
        view.incoming.iter().map(|i| (i.reference.as_str(), i.qty, i.expected_at.as_str())).collect();
    assert_eq!(shown, vec![("po-8", 5, "2026-12-10T08:00:00.000Z"), ("po-7", 40, "2026-12-20T09:00:00.000Z")]);
    assert!(inventory::get_stock(&s.w.deps, &s.t, "B").await.unwrap().unwrap().incoming.is_empty());

    // Bad input names its field; a shipment of a SKU that does not exist is 404.
    let bad = [
        (shipment("po-9", 0, "2026-12-20T09:00:00Z"), "qty"),
        (shipment("po-9", 1, "next week"), "expected_at"),
        (shipment("po 9", 1, "2026-12-20T09:00:00Z"), "ref"),
        (shipment("po-9", 1, "2046-12-20T09:00:00Z"), "expected_at"),
    ];
    for (req, field) in bad {
        match expect(&s, "A", &req).await {
            Err(CoreError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert!(matches!(
        expect(&s, "nope", &shipment("po-9", 1, "2026-12-20T09:00:00Z")).await,
        Err(CoreError::NotFound { .. })
    ));

    // The arrival: stock in, the shipment closed, in one transaction.
    let view = inventory::adjust(&s.w.deps, &s.t, "A", &arrival(38, "in-1", Some("po-7"))).await.unwrap();
    assert_eq!(view.available, 38);
    assert_eq!(view.incoming.iter().map(|i| i.reference.as_str()).collect::<Vec<_>>(), vec!["po-8"]);
    let closed: incoming::Incoming =
        s.w.deps.table.get(&inventory::keys::incoming(&s.t, "A", "po-7")).await.unwrap().unwrap().parse().unwrap();
    assert_eq!((closed.status, closed.received_qty), (incoming::IncomingStatus::Received, Some(38)));
    // What a view reads holds only what is still on its way: received shipments are not read
    // again, however many a SKU has had.
    let open =
        s.w.deps.table.query(&inventory::keys::incoming_open_pk(&s.t, "A"), "", Default::default()).await.unwrap();
    assert_eq!(open.items.iter().map(|i| i.key.sk.as_str()).collect::<Vec<_>>(), vec!["po-8"]);
    // The same request again is the same adjustment; another arrival of that shipment is refused
    // and moves no stock; so is a shipment that was never recorded, or a ref on a non-arrival.
    inventory::adjust(&s.w.deps, &s.t, "A", &arrival(38, "in-1", Some("po-7"))).await.unwrap();
    match inventory::adjust(&s.w.deps, &s.t, "A", &arrival(2, "in-2", Some("po-7"))).await {
        Err(CoreError::Conflict { code, .. }) => assert_eq!(code, "incoming_received"),
        other => panic!("{other:?}"),
    }
    match inventory::adjust(&s.w.deps, &s.t, "A", &arrival(2, "in-3", Some("po-x"))).await {
        Err(CoreError::Invalid { field, .. }) => assert_eq!(field, "ref"),
        other => panic!("{other:?}"),
    }
    let returned = AdjustmentRequest { source: "return".into(), ..arrival(1, "in-4", Some("po-8")) };
    assert!(matches!(inventory::adjust(&s.w.deps, &s.t, "A", &returned).await, Err(CoreError::Invalid { .. })));
    assert_eq!(inventory::get_stock(&s.w.deps, &s.t, "A").await.unwrap().unwrap().available, 38);
    let ledger = inventory::all_ledger_entries(&s.w.deps, &s.t, "A").await.unwrap();
    assert_eq!(ledger.len(), 2, "the warm-up and one arrival: {ledger:?}");
    // An arrived shipment cannot be moved.
    match expect(&s, "A", &shipment("po-7", 40, "2026-12-21T09:00:00Z")).await {
        Err(CoreError::Conflict { code, .. }) => assert_eq!(code, "incoming_received"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn subscribers_who_asked_hear_the_date_once_per_shipment_and_date() {
    let s = shop().await;
    subscriber(&s, "asks", "A", true).await;
    subscriber(&s, "quiet", "A", false).await;
    subscriber(&s, "other-sku", "B", true).await;
    expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap();
    settle(&s).await;
    // Recorded again (a client's retry), and the page's task run twice: still once.
    expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap();
    restock::incoming::tell_page(&s.w.deps, &s.t, "A", "po-7", "2026-12-20T09:00:00.000Z", Default::default())
        .await
        .unwrap();
    settle(&s).await;
    assert_eq!(emails_to(&s, "asks"), vec!["A is on its way to us, expected on 2026-12-20.".to_owned()]);
    assert!(emails_to(&s, "quiet").is_empty(), "did not ask");
    assert!(emails_to(&s, "other-sku").is_empty(), "another SKU");
    // The date moves: told again, of the new date; the task of the old date tells nobody now.
    expect(&s, "A", &shipment("po-7", 40, "2026-12-23T09:00:00Z")).await.unwrap();
    restock::incoming::tell_page(&s.w.deps, &s.t, "A", "po-7", "2026-12-20T09:00:00.000Z", Default::default())
        .await
        .unwrap();
    settle(&s).await;
    assert_eq!(emails_to(&s, "asks").len(), 2);
    assert!(emails_to(&s, "asks")[1].contains("2026-12-23"));
    // Only the quantity changes: nothing new to tell.
    expect(&s, "A", &shipment("po-7", 45, "2026-12-23T09:00:00Z")).await.unwrap();
    settle(&s).await;
    assert_eq!(emails_to(&s, "asks").len(), 2);
    // Someone who asks now hears the soonest shipment at once; asking again tells nothing more.
    subscriber(&s, "late", "A", true).await;
    subscriber(&s, "late", "A", true).await;
    settle(&s).await;
    assert_eq!(emails_to(&s, "late"), vec!["A is on its way to us, expected on 2026-12-23.".to_owned()]);

    // The arrival opens the back-in-stock round as any stock from 0 does: every waiter hears it.
    inventory::adjust(&s.w.deps, &s.t, "A", &arrival(45, "in-1", Some("po-7"))).await.unwrap();
    settle(&s).await;
    pass(&s, 61).await;
    pass(&s, 5).await;
    for user in ["asks", "quiet", "late"] {
        assert!(emails_to(&s, user).iter().any(|b| b.contains("back in stock")), "{user}: {:?}", emails_to(&s, user));
    }
    let subs = restock::list_for_user(&s.w.deps, &s.t, "asks", 10, None).await.unwrap();
    assert_eq!(subs.items[0].status, SubscriptionStatus::Notified);
}

#[tokio::test]
async fn every_subscriber_who_asked_is_told_a_page_at_a_time() {
    let s = shop().await;
    for i in 0..250 {
        subscriber(&s, &format!("u{i:03}"), "A", i % 5 != 0).await;
    }
    expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap();
    settle(&s).await;
    let told: usize = (0..250).map(|i| emails_to(&s, &format!("u{i:03}")).len()).sum();
    assert_eq!(told, 200, "the 200 of 250 who asked, once each");
    for i in (0..250).step_by(5) {
        assert!(emails_to(&s, &format!("u{i:03}")).is_empty());
    }
}

#[tokio::test]
async fn a_task_lost_after_the_shipments_write_is_told_by_its_durable_timer() {
    let s = shop().await;
    subscriber(&s, "asks", "A", true).await;
    expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap();
    // The process dies before the task at once is handled: its message is gone.
    let got =
        s.w.deps
            .queues
            .receive("timers", 10, std::time::Duration::from_secs(30), std::time::Duration::ZERO)
            .await
            .unwrap();
    assert_eq!(got.len(), 1, "the task at once");
    s.w.deps.queues.delete("timers", &got[0].receipt).await.unwrap();
    settle(&s).await;
    assert!(emails_to(&s, "asks").is_empty());
    // The timer written with the shipment fires minutes later.
    for _ in 0..5 {
        pass(&s, 60).await;
    }
    assert_eq!(emails_to(&s, "asks"), vec!["A is on its way to us, expected on 2026-12-20.".to_owned()]);
}

#[tokio::test]
async fn a_shipment_goes_to_a_location_and_arrives_there() {
    let s = shop().await;
    let (d, t) = (&s.w.deps, &s.t);
    let east = inventory::LocationRequest { name: "East".into(), markets: vec!["US".into()], priority: 1 };
    inventory::locations::put(d, t, "east", &east).await.unwrap();
    let cell = inventory::LocationStockRequest { on_hand: 0, safety_stock: None };
    inventory::stock::put_location_stock(d, t, "A", "east", &cell).await.unwrap();
    let to = |loc: &str| {
        serde_json::from_value::<IncomingRequest>(
            json!({"ref": "po-e", "qty": 8, "expected_at": "2026-12-20T09:00:00Z", "location_id": loc}),
        )
        .unwrap()
    };
    match expect(&s, "A", &to("west")).await {
        Err(CoreError::NotFoundAt { field, .. }) => assert_eq!(field, "location_id"),
        other => panic!("{other:?}"),
    }
    expect(&s, "A", &to("east")).await.unwrap();
    // Its arrival recorded at another location is refused, and moves nothing.
    match inventory::adjust(d, t, "A", &arrival(8, "in-1", Some("po-e"))).await {
        Err(CoreError::Invalid { field, .. }) => assert_eq!(field, "location_id"),
        other => panic!("{other:?}"),
    }
    assert_eq!(inventory::get_stock(d, t, "A").await.unwrap().unwrap().available, 0);
    let view = inventory::adjust(
        d,
        t,
        "A",
        &AdjustmentRequest { location_id: Some("east".into()), ..arrival(8, "in-2", Some("po-e")) },
    )
    .await
    .unwrap();
    assert_eq!(view.available, 8);
    assert!(view.incoming.is_empty());
}

#[tokio::test]
async fn a_tenants_template_that_cannot_be_filled_does_not_refuse_the_subscription() {
    // Seen by schemathesis: the tenant's own `restock_incoming` asks for a param the date's
    // message does not give; subscribing must still work, and the telling of the others too.
    let s = shop().await;
    let tpl = json!({"default_locale": "en", "locales": {"en": {"email_subject": "x", "email_body": "order {{ order_id }}"}}});
    tidings_core::templates::put_template(&s.w.deps, &s.t, "restock_incoming", serde_json::from_value(tpl).unwrap())
        .await
        .unwrap();
    expect(&s, "A", &shipment("po-7", 40, "2026-12-20T09:00:00Z")).await.unwrap();
    subscriber(&s, "asks", "A", true).await;
    restock::incoming::tell_page(&s.w.deps, &s.t, "A", "po-7", "2026-12-20T09:00:00.000Z", Default::default())
        .await
        .unwrap();
    settle(&s).await;
    assert!(emails_to(&s, "asks").is_empty());
}
