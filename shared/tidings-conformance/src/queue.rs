//! Queue cases (SQS semantics), on real time with whole-second delays and visibilities.
//!
//! Each takes the queues and the name of a queue of its own (see the crate docs): declared
//! with `max_receives` = [`MAX_RECEIVES`](crate::MAX_RECEIVES), empty (DLQ too) at the start,
//! used by no other case at the same time. Each leaves its queue empty.

use std::collections::BTreeSet;
use std::time::Duration;

use tidings_core::ports::{OutMessage, QueueError, Queues, Received};
use tokio::time::Instant;

use crate::run_id;

/// A queue case, as stored in [`ALL`].
pub type QueueCase = for<'a> fn(&'a dyn Queues, &'a str) -> futures::future::BoxFuture<'a, ()>;

/// Every queue case with the conformance queue meant for it, for a harness that runs them all
/// in one test: `for (name, queue, case) in ALL { case(&queues, queue).await }`.
pub const ALL: [(&str, &str, QueueCase); 12] = [
    ("queue_send_receive_delete", "conf-a", |q, n| Box::pin(queue_send_receive_delete(q, n))),
    ("queue_send_many", "conf-b", |q, n| Box::pin(queue_send_many(q, n))),
    ("queue_delay", "conf-c", |q, n| Box::pin(queue_delay(q, n))),
    ("queue_visibility_timeout", "conf-d", |q, n| Box::pin(queue_visibility_timeout(q, n))),
    ("queue_change_visibility", "conf-e", |q, n| Box::pin(queue_change_visibility(q, n))),
    ("queue_stale_receipt", "conf-f", |q, n| Box::pin(queue_stale_receipt(q, n))),
    ("queue_max_receives_then_dlq", "conf-g", |q, n| Box::pin(queue_max_receives_then_dlq(q, n))),
    ("queue_redrive", "conf-h", |q, n| Box::pin(queue_redrive(q, n))),
    ("queue_stats", "conf-i", |q, n| Box::pin(queue_stats(q, n))),
    ("queue_long_poll", "conf-j", |q, n| Box::pin(queue_long_poll(q, n))),
    ("queue_size_limits", "conf-k", |q, n| Box::pin(queue_size_limits(q, n))),
    ("queue_groups", "conf-l", |q, n| Box::pin(queue_groups(q, n))),
];

const LONG: Duration = Duration::from_secs(30);
const DEADLINE: Duration = Duration::from_secs(15);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Receives (long polling up to 1 s at a time) until a message with this body arrives or the
/// deadline passes. Messages with other bodies are returned to the queue at once.
async fn receive_body(
    q: &dyn Queues,
    queue: &str,
    body: &str,
    visibility: Duration,
    within: Duration,
) -> Option<Received> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let got = q.receive(queue, 10, visibility, secs(1)).await.unwrap();
        let mut found = None;
        for m in got {
            if m.body == body && found.is_none() {
                found = Some(m);
            } else {
                let _ = q.change_visibility(queue, &m.receipt, Duration::ZERO).await;
            }
        }
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Receives until every body in `bodies` has come once (visibility `LONG`), and returns them.
async fn receive_all(q: &dyn Queues, queue: &str, bodies: &BTreeSet<String>) -> Vec<Received> {
    let until = Instant::now() + DEADLINE;
    let mut got: Vec<Received> = Vec::new();
    while Instant::now() < until && got.len() < bodies.len() {
        let batch = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
        assert!(batch.len() <= 10, "a receive returns at most 10 messages");
        for m in batch {
            assert!(bodies.contains(&m.body), "unexpected message {:?} on {queue}", m.body);
            assert!(!got.iter().any(|g| g.body == m.body), "{:?} received twice while invisible", m.body);
            got.push(m);
        }
    }
    let seen: BTreeSet<String> = got.iter().map(|m| m.body.clone()).collect();
    assert_eq!(&seen, bodies, "every message sent is received");
    got
}

async fn delete_all(q: &dyn Queues, queue: &str, got: &[Received]) {
    for m in got {
        q.delete(queue, &m.receipt).await.unwrap();
    }
}

/// Polls `stats` until `check` holds (SQS's counts are approximate and lag).
async fn stats_until(
    q: &dyn Queues,
    queue: &str,
    what: &str,
    check: impl Fn(&tidings_core::ports::QueueStats) -> bool,
) {
    let until = Instant::now() + DEADLINE;
    loop {
        let s = q.stats(queue).await.unwrap();
        if check(&s) {
            return;
        }
        assert!(Instant::now() < until, "{queue}: stats never showed {what}; last {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends three messages, receives each once with receive count 1 and its send time, deletes
/// them; an unknown queue is `UnknownQueue`.
pub async fn queue_send_receive_delete(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let bodies: BTreeSet<String> = (0..3).map(|i| format!("{run}:{i}:h\u{e9}llo {{\"json\": true}}")).collect();
    let before = chrono_ms();
    q.send_batch(queue, bodies.iter().map(OutMessage::new).collect()).await.unwrap();
    let got = receive_all(q, queue, &bodies).await;
    let after = chrono_ms();
    for m in &got {
        assert_eq!(m.receive_count, 1, "first receive counts 1");
        assert!(!m.receipt.is_empty() && !m.message_id.is_empty(), "ids and receipts are set");
        assert!(
            m.sent_at_ms >= before - 60_000 && m.sent_at_ms <= after + 60_000,
            "sent_at_ms {} is about the time of sending ({before}..{after})",
            m.sent_at_ms
        );
    }
    let ids: BTreeSet<&String> = got.iter().map(|m| &m.message_id).collect();
    assert_eq!(ids.len(), 3, "distinct message ids");
    delete_all(q, queue, &got).await;
    // Deleted messages never come back, even after their visibility would have run out.
    let again = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(again.is_empty(), "deleted messages do not come back: {again:?}");

    let unknown = "tidings-conformance-no-such-queue";
    assert!(matches!(q.send_batch(unknown, vec![OutMessage::new("x")]).await, Err(QueueError::UnknownQueue(_))));
    assert!(matches!(q.receive(unknown, 1, LONG, Duration::ZERO).await, Err(QueueError::UnknownQueue(_))));
    assert!(matches!(q.stats(unknown).await, Err(QueueError::UnknownQueue(_))));
}

fn chrono_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Sends 25 messages in one call (backends split into batches of 10) and receives each once;
/// deletes them in one `delete_batch` (split the same way), which skips a stale receipt: the
/// queue is empty afterwards.
pub async fn queue_send_many(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let bodies: BTreeSet<String> = (0..25).map(|i| format!("{run}:{i:02}")).collect();
    q.send_batch(queue, bodies.iter().map(OutMessage::new).collect()).await.unwrap();
    q.send_batch(queue, Vec::new()).await.unwrap();
    let got = receive_all(q, queue, &bodies).await;
    // The first message's receipt made stale by receiving it again after its visibility ran out.
    q.change_visibility(queue, &got[0].receipt, Duration::ZERO).await.unwrap();
    let again = receive_body(q, queue, &got[0].body, LONG, DEADLINE).await.expect("the message comes again");
    let mut receipts: Vec<String> = got.iter().map(|m| m.receipt.clone()).collect();
    receipts.push(again.receipt.clone());
    q.delete_batch(queue, &receipts).await.unwrap();
    q.delete_batch(queue, &[]).await.unwrap();
    stats_until(q, queue, "an empty queue after delete_batch", |s| s.visible + s.in_flight + s.delayed == 0).await;
    let none = q.receive(queue, 10, LONG, Duration::ZERO).await.unwrap();
    assert!(none.is_empty(), "deleted in a batch, nothing comes back: {none:?}");
}

/// A delayed message is invisible until its delay has passed; an undelayed one is not.
pub async fn queue_delay(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let (now_body, later_body) = (format!("{run}:now"), format!("{run}:later"));
    let sent = Instant::now();
    q.send_batch(queue, vec![OutMessage::delayed(later_body.clone(), secs(2)), OutMessage::new(now_body.clone())])
        .await
        .unwrap();
    let first = receive_body(q, queue, &now_body, LONG, secs(1)).await.expect("the undelayed message at once");
    let early = q.receive(queue, 10, LONG, Duration::ZERO).await.unwrap();
    if sent.elapsed() < Duration::from_millis(1500) {
        assert!(early.iter().all(|m| m.body != later_body), "the delayed message is invisible during its delay");
    }
    let later = receive_body(q, queue, &later_body, LONG, DEADLINE).await.expect("the delayed message after its delay");
    let waited = sent.elapsed();
    assert!(waited >= Duration::from_millis(1000), "the delayed message came after {waited:?} (delay 2 s)");
    assert_eq!(later.receive_count, 1);
    delete_all(q, queue, &[first, later]).await;
}

/// A received message is invisible for its visibility timeout, then comes again with a
/// higher receive count and a new receipt.
pub async fn queue_visibility_timeout(q: &dyn Queues, queue: &str) {
    let body = format!("{}:vis", run_id());
    q.send_batch(queue, vec![OutMessage::new(body.clone())]).await.unwrap();
    let first = receive_body(q, queue, &body, secs(2), DEADLINE).await.expect("received");
    let received_at = Instant::now();
    assert_eq!(first.receive_count, 1);
    let during = q.receive(queue, 10, LONG, Duration::ZERO).await.unwrap();
    if received_at.elapsed() < Duration::from_millis(1500) {
        assert!(during.iter().all(|m| m.body != body), "invisible during its visibility timeout");
    }
    let second = receive_body(q, queue, &body, secs(30), DEADLINE).await.expect("visible again after the timeout");
    assert!(received_at.elapsed() >= Duration::from_millis(1000), "came back after {:?}", received_at.elapsed());
    assert_eq!(second.receive_count, 2, "the second receive counts 2");
    assert_ne!(second.receipt, first.receipt, "each receive has its own receipt");
    assert_eq!(second.message_id, first.message_id, "same message");
    q.delete(queue, &second.receipt).await.unwrap();
}

/// `change_visibility` shortens or extends the visibility of a received message; 0 makes it
/// visible at once. (Each case stays within `max_receives` = 2 receives.)
pub async fn queue_change_visibility(q: &dyn Queues, queue: &str) {
    let body = format!("{}:cv", run_id());
    q.send_batch(queue, vec![OutMessage::new(body.clone())]).await.unwrap();
    let first = receive_body(q, queue, &body, LONG, DEADLINE).await.expect("received");
    let hidden = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(hidden.iter().all(|m| m.body != body), "hidden for 30 s");
    // Shorten to 1 s: back soon.
    let changed = Instant::now();
    q.change_visibility(queue, &first.receipt, secs(1)).await.unwrap();
    let second = receive_body(q, queue, &body, LONG, DEADLINE).await.expect("back after change_visibility(1 s)");
    assert!(changed.elapsed() >= Duration::from_millis(900), "not before the new visibility ran out");
    assert_eq!(second.receive_count, 2);

    // Extend: hidden instead of coming back.
    q.change_visibility(queue, &second.receipt, LONG).await.unwrap();
    let hidden = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(hidden.iter().all(|m| m.body != body), "hidden after change_visibility(30 s)");
    // 0: visible at once (shown by stats, as a third receive would move it to the DLQ).
    q.change_visibility(queue, &second.receipt, Duration::ZERO).await.unwrap();
    stats_until(q, queue, "the message visible again", |s| s.visible == 1 && s.in_flight == 0).await;
    // The receipt is still the latest: it deletes.
    q.delete(queue, &second.receipt).await.unwrap();
    stats_until(q, queue, "an empty queue", |s| s.visible == 0 && s.in_flight == 0 && s.dlq_depth == 0).await;
}

/// The receipt of an earlier receive cannot delete (or hide) a message received since: the
/// call returns `StaleReceipt` (or, on SQS, succeeds without effect), and the message is not
/// deleted. (The embedded backend always says `StaleReceipt`; its own tests check that.)
pub async fn queue_stale_receipt(q: &dyn Queues, queue: &str) {
    let body = format!("{}:stale", run_id());
    q.send_batch(queue, vec![OutMessage::new(body.clone())]).await.unwrap();
    let first = receive_body(q, queue, &body, secs(1), DEADLINE).await.expect("received");
    let second = receive_body(q, queue, &body, LONG, DEADLINE).await.expect("received again");
    assert_ne!(first.receipt, second.receipt);

    match q.delete(queue, &first.receipt).await {
        Ok(()) | Err(QueueError::StaleReceipt) => {}
        other => panic!("delete with a stale receipt: {other:?}"),
    }
    match q.change_visibility(queue, &first.receipt, Duration::ZERO).await {
        Ok(()) | Err(QueueError::StaleReceipt) => {}
        other => panic!("change_visibility with a stale receipt: {other:?}"),
    }
    // The message is still there, and still hidden by the second receive.
    let hidden = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(hidden.iter().all(|m| m.body != body), "a stale receipt did not make the message visible");
    stats_until(q, queue, "the message still in flight", |s| s.in_flight == 1 && s.visible == 0).await;
    q.delete(queue, &second.receipt).await.expect("the current receipt deletes");
    stats_until(q, queue, "an empty queue", |s| s.in_flight == 0 && s.visible == 0 && s.dlq_depth == 0).await;
    // Now the second receipt is stale too.
    match q.delete(queue, &second.receipt).await {
        Ok(()) | Err(QueueError::StaleReceipt) => {}
        other => panic!("delete with a receipt of a deleted message: {other:?}"),
    }
}

/// A message received `max_receives` (2) times and never deleted moves to the DLQ at the next
/// receive instead of being returned.
pub async fn queue_max_receives_then_dlq(q: &dyn Queues, queue: &str) {
    let body = format!("{}:poison", run_id());
    q.send_batch(queue, vec![OutMessage::new(body.clone())]).await.unwrap();
    let first = receive_body(q, queue, &body, secs(1), DEADLINE).await.expect("first receive");
    assert_eq!(first.receive_count, 1);
    let second = receive_body(q, queue, &body, secs(1), DEADLINE).await.expect("second receive");
    assert_eq!(second.receive_count, 2);

    // From now on the message must never be returned; it ends on the DLQ.
    let until = Instant::now() + DEADLINE;
    loop {
        let got = q.receive(queue, 10, secs(1), secs(1)).await.unwrap();
        assert!(got.iter().all(|m| m.body != body), "a message received max_receives times is not returned again");
        let dlq = q.peek_dlq(queue, 10).await.unwrap();
        if dlq.iter().any(|m| m.body == body) {
            break;
        }
        assert!(Instant::now() < until, "the message never reached the DLQ");
    }
    // Peeking does not remove.
    let peeked = q.peek_dlq(queue, 10).await.unwrap();
    assert!(peeked.iter().any(|m| m.body == body), "still on the DLQ after peeking");
    stats_until(q, queue, "dlq_depth 1 and an empty queue", |s| s.dlq_depth == 1 && s.visible == 0 && s.in_flight == 0)
        .await;

    // Clean up: back to the queue and delete.
    assert_eq!(q.redrive(queue).await.unwrap(), 1, "one message redriven");
    let back = receive_body(q, queue, &body, LONG, DEADLINE).await.expect("redriven message");
    q.delete(queue, &back.receipt).await.unwrap();
}

/// `send_to_dlq` puts a message on the DLQ, `peek_dlq` shows it without removing it, and
/// `redrive` moves it back as a fresh message (receive count starts again).
pub async fn queue_redrive(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let bodies: Vec<String> = (0..3).map(|i| format!("{run}:dead:{i}")).collect();
    for b in &bodies {
        q.send_to_dlq(queue, b.clone()).await.unwrap();
    }
    for _ in 0..2 {
        let until = Instant::now() + DEADLINE;
        loop {
            let peeked = q.peek_dlq(queue, 10).await.unwrap();
            let seen: BTreeSet<&String> = peeked.iter().map(|m| &m.body).collect();
            if bodies.iter().all(|b| seen.contains(b)) {
                assert_eq!(peeked.len(), 3, "only our messages on the DLQ: {peeked:?}");
                break;
            }
            assert!(Instant::now() < until, "messages sent to the DLQ are shown by peek_dlq: {peeked:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let first_peek = q.peek_dlq(queue, 1).await.unwrap();
    assert_eq!(first_peek.len(), 1, "peek_dlq honours max");
    stats_until(q, queue, "dlq_depth 3", |s| s.dlq_depth == 3).await;
    let nothing = q.receive(queue, 10, LONG, Duration::ZERO).await.unwrap();
    assert!(nothing.is_empty(), "DLQ messages are not on the queue");

    assert_eq!(q.redrive(queue).await.unwrap(), 3, "redrive moves all three");
    let wanted: BTreeSet<String> = bodies.iter().cloned().collect();
    let got = receive_all(q, queue, &wanted).await;
    for m in &got {
        assert_eq!(m.receive_count, 1, "a redriven message starts its receive count again");
    }
    delete_all(q, queue, &got).await;
    stats_until(q, queue, "an empty queue and DLQ", |s| s.dlq_depth == 0 && s.visible == 0 && s.in_flight == 0).await;
}

/// `stats` counts visible, in-flight and delayed messages, and the DLQ.
pub async fn queue_stats(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let s = q.stats(queue).await.unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed, s.dlq_depth), (0, 0, 0, 0), "the queue starts empty: {s:?}");
    let (a, b, c) = (format!("{run}:a"), format!("{run}:b"), format!("{run}:c"));
    let sent = Instant::now();
    q.send_batch(
        queue,
        vec![OutMessage::new(a.clone()), OutMessage::new(b.clone()), OutMessage::delayed(c.clone(), secs(3))],
    )
    .await
    .unwrap();
    let one = q.receive(queue, 1, LONG, secs(1)).await.unwrap();
    assert_eq!(one.len(), 1, "receive honours max = 1");
    assert_ne!(one[0].body, c, "the delayed message is not received");
    // SQS's counts are approximate and may lag a little; they must be right before the delayed
    // message becomes visible (3 s).
    let s = loop {
        let s = q.stats(queue).await.unwrap();
        if (s.visible, s.in_flight, s.delayed) == (1, 1, 1) {
            break s;
        }
        assert!(sent.elapsed() < Duration::from_millis(2500), "stats show 1 visible, 1 in flight, 1 delayed: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(s.oldest_age_s < 60, "oldest_age_s is the age of the oldest message: {s:?}");
    assert_eq!(s.name, queue, "stats name the queue");
    let mut got = one;
    let rest: BTreeSet<String> = [a, b, c].into_iter().filter(|x| got.iter().all(|m| &m.body != x)).collect();
    got.extend(receive_all(q, queue, &rest).await);
    delete_all(q, queue, &got).await;
    stats_until(q, queue, "an empty queue", |s| (s.visible, s.in_flight, s.delayed) == (0, 0, 0)).await;
}

/// A receive that waits returns as soon as a message arrives, not at the end of its wait.
pub async fn queue_long_poll(q: &dyn Queues, queue: &str) {
    let body = format!("{}:lp", run_id());
    let start = Instant::now();
    let (got, ()) = tokio::join!(q.receive(queue, 10, LONG, secs(10)), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        q.send_batch(queue, vec![OutMessage::new(body.clone())]).await.unwrap();
    });
    let got = got.unwrap();
    let waited = start.elapsed();
    let got = if got.is_empty() {
        // Some emulators answer an empty long poll early; the message must then come soon.
        vec![receive_body(q, queue, &body, LONG, DEADLINE).await.expect("the message sent during the poll")]
    } else {
        assert!(waited < Duration::from_secs(8), "the long poll returned when the message arrived ({waited:?})");
        got
    };
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, body);
    delete_all(q, queue, &got).await;
    // An empty long poll waits about its wait time.
    let start = Instant::now();
    let none = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(none.is_empty());
    assert!(start.elapsed() >= Duration::from_millis(900), "an empty receive waited {:?} of 1 s", start.elapsed());
}

/// SQS's size limits (`tidings_core::sizes`): ten messages of 120 KB each, more than one
/// `SendMessageBatch` may carry (256 KiB in all; 1.2 MB is more than even a queue raised to
/// 1 MiB takes, and than moto's batch limit), are sent by one call and each received once;
/// a message of exactly 256 KiB is sent; one byte more is `Invalid`, and nothing of the call
/// that carried it is sent, the small messages before it included.
pub async fn queue_size_limits(q: &dyn Queues, queue: &str) {
    use tidings_core::sizes::MAX_MESSAGE_BYTES;
    let run = run_id();
    let body = |i: usize, size: usize| {
        let head = format!("{run}:{i:02}:");
        format!("{head}{}", "x".repeat(size - head.len()))
    };
    let large: BTreeSet<String> = (0..10).map(|i| body(i, 120 * 1024)).collect();
    q.send_batch(queue, large.iter().map(OutMessage::new).collect()).await.unwrap();
    let got = receive_all(q, queue, &large).await;
    delete_all(q, queue, &got).await;

    let exact = body(10, MAX_MESSAGE_BYTES);
    q.send_batch(queue, vec![OutMessage::new(exact.clone())]).await.unwrap();
    let m = receive_body(q, queue, &exact, LONG, DEADLINE).await.expect("a message of exactly 256 KiB arrives");
    q.delete(queue, &m.receipt).await.unwrap();

    let small = format!("{run}:small");
    let over = vec![OutMessage::new(small.clone()), OutMessage::new(body(11, MAX_MESSAGE_BYTES + 1))];
    match q.send_batch(queue, over).await {
        Err(QueueError::Invalid(reason)) => {
            assert!(reason.contains(&(MAX_MESSAGE_BYTES + 1).to_string()), "the reason gives the size: {reason}")
        }
        other => panic!("a message over 256 KiB is Invalid, got {other:?}"),
    }
    let after = q.receive(queue, 10, LONG, secs(1)).await.unwrap();
    assert!(
        after.is_empty(),
        "nothing of a refused call is sent: {:?}",
        after.iter().map(|m| m.body.len()).collect::<Vec<_>>()
    );
}

/// A message's fairness group (its tenant, `MessageGroupId` on SQS) is accepted on a shared
/// (standard) queue and comes back with the message, so a copy handed back or redriven keeps
/// its tenant's turn; a message sent without one comes back without one. (Which group a
/// receive serves first is the embedded queues' own promise, tested there: SQS's fair queues
/// promise a quiet tenant less waiting, not an order.)
pub async fn queue_groups(q: &dyn Queues, queue: &str) {
    let run = run_id();
    let grouped: BTreeSet<String> = (0..3).map(|i| format!("{run}:shop-{i}")).collect();
    let plain = format!("{run}:plain");
    let mut messages: Vec<OutMessage> = grouped
        .iter()
        .map(|b| OutMessage::new(b.as_str()).in_group(Some(format!("shop-{}", &b[b.len() - 1..]))))
        .collect();
    messages.push(OutMessage::new(plain.as_str()));
    q.send_batch(queue, messages).await.unwrap();
    let mut all = grouped.clone();
    all.insert(plain.clone());
    let got = receive_all(q, queue, &all).await;
    for m in &got {
        let expected = (m.body != plain).then(|| format!("shop-{}", &m.body[m.body.len() - 1..]));
        assert_eq!(m.group, expected, "{:?} comes back in its group", m.body);
    }
    // A copy sent from what was received (a hand-back) is in the same group.
    let first = got.iter().find(|m| m.group.is_some()).expect("a grouped message");
    q.send_batch(queue, vec![OutMessage::new(format!("{}:copy", first.body)).in_group(first.group.clone())])
        .await
        .unwrap();
    delete_all(q, queue, &got).await;
    let copy = receive_body(q, queue, &format!("{}:copy", first.body), LONG, DEADLINE).await.expect("the copy comes");
    assert_eq!(copy.group, first.group);
    q.delete(queue, &copy.receipt).await.unwrap();
}
