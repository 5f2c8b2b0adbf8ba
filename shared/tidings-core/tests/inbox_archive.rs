//! Archive and read-all in the inbox store (docs/site.md, "Archive and read-all in the store"):
//! the counter agrees with the messages, an archived message is never listed nor brought back
//! by a repeated delivery, and a list page that skips archived messages never skips another.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use tidings_core::inbox;
use tidings_core::notify::model::Notification;
use tidings_core::{Deps, TenantId};
use tidings_embedded::test_world::TestWorld;

fn notification(i: i64) -> Notification {
    serde_json::from_value(json!({
        "notification_id": format!("n{i}"), "status": "accepted",
        "request": {"recipients": {"user_ids": ["u1"]}, "template_id": "t", "category": "transactional"},
        "priority": "normal", "body_hash": "h", "created_at": "2026-12-05T00:00:00Z", "created_ms": 1_000 + i
    }))
    .unwrap()
}

/// Puts message `i` in u1's inbox as an in-app delivery does; whether it was written.
async fn deliver(deps: &Deps, t: &TenantId, i: i64) -> bool {
    let n = notification(i);
    let writes = inbox::message_writes(t, "u1", &n, None, format!("m{i}"), "b".into(), "2026-12-05T00:00:00Z").unwrap();
    deps.table.transact(writes).await.is_ok()
}

#[tokio::test]
async fn archive_and_read_all_keep_the_count_and_an_archived_message_stays_archived() {
    let deps = TestWorld::builder().build().deps;
    let t = TenantId::parse("acme").unwrap();
    for i in 0..5 {
        assert!(deliver(&deps, &t, i).await);
    }
    let all = inbox::list(&deps, &t, "u1", 50, None).await.unwrap();
    assert_eq!((all.items.len(), all.unread_count), (5, 5));
    let ids: Vec<String> = all.items.iter().map(|m| m.message_id.clone()).collect();

    // Archive two unread ones (each counted down once) and a read one (not counted again).
    inbox::mark_read(&deps, &t, "u1", &ids[4]).await.unwrap();
    for (id, unread) in [(&ids[1], 3), (&ids[2], 2), (&ids[4], 2)] {
        let c = inbox::archive(&deps, &t, "u1", id).await.unwrap();
        assert_eq!((c.changed, c.unread_count), (1, unread), "{id}");
    }
    assert_eq!(inbox::archive(&deps, &t, "u1", &ids[1]).await.unwrap().changed, 0, "twice: nothing more");
    assert!(matches!(
        inbox::archive(&deps, &t, "u1", "000000000000001-nope").await,
        Err(tidings_core::CoreError::NotFound { .. })
    ));

    // A repeated delivery of an archived message writes nothing: it does not come back.
    assert!(!deliver(&deps, &t, 3).await, "ids are newest first: ids[1] is message 3");
    let page = inbox::list(&deps, &t, "u1", 50, None).await.unwrap();
    let listed: Vec<&str> = page.items.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(listed, vec![ids[0].as_str(), ids[3].as_str()]);
    assert_eq!(page.unread_count, 2);

    // Pages of one: each page skips the archived ones in its way, none is skipped otherwise.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let p = inbox::list(&deps, &t, "u1", 1, cursor).await.unwrap();
        seen.extend(p.items.iter().map(|m| m.message_id.clone()));
        cursor = p.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen, vec![ids[0].clone(), ids[3].clone()]);

    // Read-all: the two left unread, the counter at 0; again: nothing.
    let c = inbox::read_all(&deps, &t, "u1").await.unwrap();
    assert_eq!((c.changed, c.unread_count), (2, 0));
    assert_eq!(inbox::read_all(&deps, &t, "u1").await.unwrap().changed, 0);
    assert!(inbox::list(&deps, &t, "u1", 50, None).await.unwrap().items.iter().all(|m| m.read));
}
