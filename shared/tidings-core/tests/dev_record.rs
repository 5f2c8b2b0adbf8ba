//! The fake providers' record of sends (`GET /dev/deliveries`) expires: each record carries the
//! table's `ttl`, and one past it is neither listed nor kept, on a store without TTL of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use serde_json::json;
use tidings_core::dev::{self, DevProvider, NullProvider, RECORD_TTL_S};
use tidings_core::keys::DEV_SENDS_PK;
use tidings_core::ports::{
    Channel, Clock, Cond, Item, Key, ManualClock, OutboundMessage, Provider, QueryOpts, SystemClock, Table,
};
use tidings_embedded::EmbeddedStore;

#[tokio::test]
async fn a_recorded_send_expires() {
    let store = EmbeddedStore::in_memory().unwrap();
    let table: Arc<dyn Table> = Arc::new(store);
    // A manual clock a year behind: the expiry is wall-clock time all the same.
    let clock = Arc::new(ManualClock::new(chrono::Utc::now() - chrono::Duration::days(365)));
    let email = DevProvider::new(Channel::Email, Arc::new(NullProvider), table.clone(), clock);
    let msg = OutboundMessage {
        channel: Channel::Email,
        to: "a@example.com".into(),
        subject: Some("Your code".into()),
        body: "123456".into(),
        html: None,
        headers: vec![],
        idempotency_key: "k1".into(),
        marketing: false,
        tenant: "acme".into(),
        notification_id: "n1".into(),
        user_id: "u1".into(),
        attempt: 1,
    };
    email.send(&msg).await.unwrap();
    let page = table.query(DEV_SENDS_PK, "", QueryOpts { limit: 10, cursor: None, descending: false }).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let ttl = page.items[0].i64("ttl").expect("a ttl attribute");
    let expected = SystemClock.now().timestamp() + RECORD_TTL_S;
    assert!((expected - 5..=expected).contains(&ttl), "ttl {ttl}, expected about {expected}");

    // A record past its ttl (as one left from days ago would be).
    let mut old = page.items[0].attrs.clone();
    old.insert("ttl".into(), json!(SystemClock.now().timestamp() - 1));
    old.insert("notification_id".into(), json!("n0"));
    table.put(Item::new(Key::new(DEV_SENDS_PK, "000000000000001#old"), old), Cond::Always).await.unwrap();
    let listed = dev::list_sends(table.as_ref(), None, None).await.unwrap();
    assert_eq!(listed.iter().map(|s| s.notification_id.as_str()).collect::<Vec<_>>(), vec!["n1"]);
    let left = table.query(DEV_SENDS_PK, "", QueryOpts { limit: 10, cursor: None, descending: false }).await.unwrap();
    assert_eq!(left.items.len(), 1, "the expired record was deleted");
}
