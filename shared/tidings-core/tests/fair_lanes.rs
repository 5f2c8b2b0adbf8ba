//! Fair lanes (docs/delivery.md, "Priorities"): no tenant delays another tenant's OTP, and no
//! bulk send delays an OTP of the same tenant. Order, not time: the workers are stepped lane by
//! lane as the local runtime's pools take them, and what the recording provider was asked to
//! send is counted at the moment each OTP went out.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tidings_core::lanes::Lane;
use tidings_core::messages::{ALL_QUEUES, dispatch, is_consumed, settle};
use tidings_core::notify::api;
use tidings_core::notify::model::{MAX_HIGH_RECIPIENTS, NotificationRequest, Priority, PriorityLowered};
use tidings_core::notify::relay;
use tidings_core::people::users::{self, UserInput};
use tidings_core::ports::ChangeFeed;
use tidings_core::{CoreConfig, Deps, TenantId, templates};

use tidings_embedded::EmbeddedChangeFeed;

use support::{Recorder, TestWorld};

/// B's bulk: 40 transactional sends of 1,000 users each (inside its rate limit), as the audit
/// found it, and a campaign to a segment of 1,000 more.
const BULK_SENDS: usize = 40;
const PER_SEND: usize = 1000;
const SEGMENT: usize = 1000;
/// C's flood of the high lane itself: small transactional sends, each allowed on it.
const SMALL_SENDS: usize = 500;

struct World {
    deps: Deps,
    feed: EmbeddedChangeFeed,
    email: Arc<Recorder>,
}

fn tenant(name: &str) -> TenantId {
    TenantId::parse(name).unwrap()
}

async fn shop(w: &World, t: &TenantId, users: usize, tag: Option<&str>) {
    let input = serde_json::from_value(json!({"default_locale": "en", "locales": {"en": {
        "email_subject": "S {{ n }}", "email_body": "B {{ n }}"}}}))
    .unwrap();
    templates::put_template(&w.deps, t, "msg", input).await.unwrap();
    for i in 0..users {
        let user = UserInput {
            email: Some(format!("u{i}@{t}.example")),
            tags: tag.map(|tag| vec![tag.to_owned()]).unwrap_or_default(),
            ..UserInput::default()
        };
        users::put_user(&w.deps, t, &format!("u{i}"), user).await.unwrap();
    }
}

fn request(users: std::ops::Range<usize>, category: &str, priority: Option<&str>) -> NotificationRequest {
    let ids: Vec<String> = users.map(|i| format!("u{i}")).collect();
    let mut body = json!({"recipients": {"user_ids": ids}, "template_id": "msg", "params": {"n": 1},
        "category": category, "channels": ["email"]});
    if let Some(p) = priority {
        body["priority"] = json!(p);
    }
    serde_json::from_value(body).unwrap()
}

async fn relay_all(w: &World) {
    loop {
        let records = w.feed.next_batch(1000).await.unwrap();
        if records.is_empty() {
            return;
        }
        relay::handle_changes(&w.deps, &records).await.unwrap();
        w.feed.commit(&records).await.unwrap();
    }
}

/// One round of the workers: the relay, then one receive of each consumed queue at its batch
/// size, each message handled and settled. Returns how many messages were handled.
async fn round(w: &World) -> usize {
    relay_all(w).await;
    let mut did = 0;
    for q in ALL_QUEUES.iter().filter(|q| is_consumed(q)) {
        let batch = Lane::from_name(q).and_then(Lane::batch_size).unwrap_or(10);
        let got = w.deps.queues.receive(q, batch, Duration::from_secs(600), Duration::ZERO).await.unwrap();
        did += got.len();
        for m in &got {
            let outcome = dispatch(&w.deps, q, m).await;
            settle(w.deps.queues.as_ref(), q, m, &outcome, w.deps.clock.now(), true).await.unwrap();
        }
    }
    did
}

/// Emails sent so far to `tenant`'s users.
fn sent_to(w: &World, tenant: &str) -> usize {
    let suffix = format!("@{tenant}.example");
    w.email.sent.lock().unwrap().iter().filter(|m| m.to.ends_with(&suffix)).count()
}

fn sent_to_address(w: &World, to: &str) -> bool {
    w.email.sent.lock().unwrap().iter().any(|m| m.to == to)
}

async fn waiting(w: &World, queue: &str) -> u64 {
    let s = w.deps.queues.stats(queue).await.unwrap();
    s.visible + s.delayed + s.in_flight
}

/// The audit's attack, and the same inside one shop: tenant B queues 40 transactional sends of
/// 1,000 users (default priority `high`) and a campaign asking for `high`; tenant C floods the
/// high lane with small sends. Then A sends an OTP, and B its own. Both OTPs are sent while
/// nearly all of B's 41,000 deliveries and most of C's flood still wait: B's bulk was given
/// `normal` (another lane), and the high lane takes its tenants in turn.
#[tokio::test]
async fn an_otp_is_sent_before_a_neighbours_bulk_and_its_own() {
    let email = Arc::new(Recorder::default());
    let tw = TestWorld::builder().all_queues(5).email(email.clone()).config(CoreConfig::default()).build();
    let w = World { feed: tw.feed("relay"), deps: tw.deps, email };
    let (a, b, c) = (tenant("shop-a"), tenant("shop-b"), tenant("shop-c"));
    shop(&w, &a, 1, None).await;
    shop(&w, &b, PER_SEND, None).await;
    // The segment: B's users from PER_SEND on.
    for i in PER_SEND..PER_SEND + SEGMENT {
        let user =
            UserInput { email: Some(format!("u{i}@{b}.example")), tags: vec!["vip".into()], ..UserInput::default() };
        users::put_user(&w.deps, &b, &format!("u{i}"), user).await.unwrap();
    }
    shop(&w, &c, SMALL_SENDS, None).await;
    relay_all(&w).await;

    // B's bulk asks for the high lane (transactional's default) and is given normal.
    for _ in 0..BULK_SENDS {
        let got = api::accept(&w.deps, &b, request(0..PER_SEND, "transactional", None)).await.unwrap();
        assert_eq!(
            (got.priority, got.priority_requested, got.priority_lowered),
            (Priority::Normal, Some(Priority::High), Some(PriorityLowered::TooManyRecipients))
        );
    }
    let campaign: NotificationRequest = serde_json::from_value(json!({"recipients": {"segment": "vip"},
        "template_id": "msg", "params": {"n": 2}, "category": "marketing", "channels": ["email"], "priority": "high"}))
    .unwrap();
    let got = api::accept(&w.deps, &b, campaign).await.unwrap();
    assert_eq!((got.priority, got.priority_lowered), (Priority::Normal, Some(PriorityLowered::Segment)));
    let view = api::get_notification(&w.deps, &b, &got.notification_id).await.unwrap().unwrap();
    assert_eq!((view.priority, view.priority_requested), (Priority::Normal, Some(Priority::High)));
    // C's small sends are each allowed on the high lane.
    for i in 0..SMALL_SENDS {
        let got = api::accept(&w.deps, &c, request(i..i + 1, "transactional", None)).await.unwrap();
        assert_eq!((got.priority, got.priority_lowered), (Priority::High, None));
    }
    // Every bulk request orchestrated: B's 41,000 deliveries and C's 500 wait on the channel
    // lanes before either OTP is asked for.
    relay_all(&w).await;
    for q in ["requests-normal", "requests-high"] {
        while waiting(&w, q).await > 0 {
            let got = w.deps.queues.receive(q, 10, Duration::from_secs(600), Duration::ZERO).await.unwrap();
            for m in &got {
                let outcome = dispatch(&w.deps, q, m).await;
                settle(w.deps.queues.as_ref(), q, m, &outcome, w.deps.clock.now(), true).await.unwrap();
            }
            relay_all(&w).await;
        }
    }
    let b_backlog = BULK_SENDS * PER_SEND + SEGMENT;
    assert_eq!(waiting(&w, "email-low").await as usize, b_backlog, "B's bulk waits on the low lane");
    assert_eq!(waiting(&w, "email-high").await as usize, SMALL_SENDS, "C's flood waits on the high lane");
    assert_eq!(w.email.sent.lock().unwrap().len(), 0);

    let otp_a = api::accept(&w.deps, &a, request(0..1, "transactional", None)).await.unwrap();
    let otp_b = api::accept(&w.deps, &b, request(PER_SEND..PER_SEND + 1, "transactional", None)).await.unwrap();
    assert_eq!((otp_a.priority, otp_b.priority), (Priority::High, Priority::High));
    let (mut at_a, mut at_b) = (None, None);
    let b_otp_address = format!("u{PER_SEND}@{b}.example");
    for _ in 0..100 {
        round(&w).await;
        // B's OTP goes to a member of the segment: its send is told by its delivery.
        if at_a.is_none() && sent_to(&w, "shop-a") == 1 {
            at_a = Some((sent_to(&w, "shop-b"), sent_to(&w, "shop-c")));
        }
        if at_b.is_none() && otp_sent(&w, &b, &otp_b.notification_id).await {
            at_b = Some((sent_to(&w, "shop-b"), sent_to(&w, "shop-c")));
        }
        if at_a.is_some() && at_b.is_some() {
            break;
        }
    }
    let (b_at_a, c_at_a) = at_a.expect("A's OTP was sent");
    let (b_at_b, c_at_b) = at_b.expect("B's OTP was sent");
    assert!(sent_to_address(&w, &format!("u0@{a}.example")));
    assert!(sent_to_address(&w, &b_otp_address));
    // At each OTP's send, at most two rounds of the low lane (100 a round) of B's bulk, and
    // C's flood taken in turn with A and B on the high lane (batches of 10).
    for (who, b_sent, c_sent) in [("A", b_at_a, c_at_a), ("B", b_at_b, c_at_b)] {
        assert!(b_sent <= 2 * 100 + 1, "{who}'s OTP waited for {b_sent} of B's {b_backlog} bulk sends");
        assert!(c_sent <= 2 * 10, "{who}'s OTP waited for {c_sent} of C's {SMALL_SENDS} small sends");
    }
    assert!(waiting(&w, "email-low").await as usize > b_backlog * 9 / 10, "most of B's backlog still waits");
}

/// Whether the OTP's one delivery is sent.
async fn otp_sent(w: &World, t: &TenantId, id: &str) -> bool {
    let view = api::get_notification(&w.deps, t, id).await.unwrap().unwrap();
    view.counts.sent == 1
}

/// The bound itself: the high lane takes a transactional send to at most
/// [`MAX_HIGH_RECIPIENTS`] users; one more, a marketing send or a segment asking for it gets
/// `normal`; what asks for `normal` or `low` keeps it.
#[test]
fn only_small_transactional_sends_get_the_high_lane() {
    let granted = |req: NotificationRequest| req.granted_priority();
    assert_eq!(granted(request(0..1, "transactional", None)), (Priority::High, None));
    assert_eq!(granted(request(0..MAX_HIGH_RECIPIENTS, "transactional", Some("high"))), (Priority::High, None));
    assert_eq!(
        granted(request(0..MAX_HIGH_RECIPIENTS + 1, "transactional", None)),
        (Priority::Normal, Some(PriorityLowered::TooManyRecipients))
    );
    // Duplicates are one recipient.
    let mut repeated = request(0..MAX_HIGH_RECIPIENTS, "transactional", None);
    repeated.recipients.user_ids.as_mut().unwrap().push("u0".into());
    assert_eq!(granted(repeated), (Priority::High, None));
    assert_eq!(granted(request(0..1, "marketing", Some("high"))), (Priority::Normal, Some(PriorityLowered::Marketing)));
    assert_eq!(granted(request(0..500, "transactional", Some("low"))), (Priority::Low, None));
    assert_eq!(granted(request(0..1, "marketing", None)), (Priority::Low, None));
    let segment: NotificationRequest = serde_json::from_value(json!({"recipients": {"segment": "all"},
        "template_id": "msg", "category": "transactional"}))
    .unwrap();
    assert_eq!(granted(segment), (Priority::Normal, Some(PriorityLowered::Segment)));
}
