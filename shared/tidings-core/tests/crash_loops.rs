//! A queue message whose handling ends the process is set aside (dead-lettered with its reason)
//! at the receive after the first redelivery it ends, not after its last receive
//! (docs/delivery.md, "A message that ends the process"). Each "process" here is a `Deps` of its
//! own over one store (the markers are in the table, the count of messages in flight in the
//! process); a process ends while handling a message when the task handling it is aborted at a
//! table read that never answers: its future is dropped where it stood, as an abort leaves it,
//! the marker's deletion never run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tidings_core::Deps;
use tidings_core::attempts::Marker;
use tidings_core::keys;
use tidings_core::lanes::{Lane, Urgency};
use tidings_core::messages::{Rejected, settle};
use tidings_core::notify::model::Priority;
use tidings_core::outcome::Outcome;
use tidings_core::ports::{Channel, Cond, Item, Key, Received, StoreError, Table, attrs_of};
use tidings_core::router::{route, route_batch};
use tidings_embedded::test_world::{Around, Call, TestWorld, Wrapped};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

const LANE: Lane = Lane::Requests(Priority::Normal);

/// The store, with reads of chosen notifications that never answer (a handler stuck there until
/// its process ends) and failures on demand.
struct Stalls {
    /// Notification ids whose reads never answer.
    stalled: Mutex<HashSet<String>>,
    /// One permit per read that stalled.
    reached: Semaphore,
    /// Reads of a tenant's items: how many times a handler ran.
    handled: AtomicUsize,
    /// Tenant reads fail as a store that is down (the handler returns a retry).
    tenant_down: AtomicBool,
    /// Attempt markers cannot be written.
    markers_down: AtomicBool,
}

impl Stalls {
    fn over(inner: Arc<dyn Table>) -> Arc<Wrapped<Self>> {
        Arc::new(Wrapped::new(
            inner,
            Self {
                stalled: Mutex::default(),
                reached: Semaphore::new(0),
                handled: AtomicUsize::new(0),
                tenant_down: AtomicBool::new(false),
                markers_down: AtomicBool::new(false),
            },
        ))
    }

    fn stall(&self, notification: &str) {
        self.stalled.lock().unwrap().insert(notification.to_owned());
    }

    fn unstall(&self, notification: &str) {
        self.stalled.lock().unwrap().remove(notification);
    }

    fn handled(&self) -> usize {
        self.handled.load(Ordering::SeqCst)
    }

    async fn tenant_read(&self, key: &Key) -> Result<(), StoreError> {
        if !key.pk.starts_with("T#") {
            return Ok(());
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        if self.tenant_down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the table is down".into()));
        }
        let stalled = self.stalled.lock().unwrap().iter().any(|n| key.pk.ends_with(&format!("#N#{n}")));
        if stalled {
            self.reached.add_permits(1);
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn marker_write(&self, key: &Key) -> Result<(), StoreError> {
        if key.pk.starts_with("ATTEMPT#") && self.markers_down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the table is down".into()));
        }
        Ok(())
    }
}

#[async_trait]
impl Around for Stalls {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        match call {
            Call::Get(key) => self.tenant_read(key).await,
            Call::GetMany(keys) => {
                for key in keys {
                    self.tenant_read(key).await?;
                }
                Ok(())
            }
            Call::Put(item, _) => self.marker_write(&item.key),
            Call::Update(key) | Call::Delete(key) => self.marker_write(key),
            Call::Transact(_) | Call::Query(..) | Call::QueryMany(_) => Ok(()),
        }
    }
}

struct Fixture {
    world: TestWorld,
    table: Arc<Wrapped<Stalls>>,
}

fn fixture() -> Fixture {
    let world = TestWorld::builder().all_queues(5).build();
    let table = Stalls::over(world.deps.table.clone());
    Fixture { world, table }
}

impl Fixture {
    /// A new process over the same store: nothing in flight, the markers where they were.
    fn process(&self) -> Deps {
        Deps { table: self.table.clone(), attempts: Arc::default(), ..self.world.deps.clone() }
    }

    async fn marker(&self, id: &str) -> Option<Marker> {
        let item = self.world.deps.table.get(&keys::attempt(LANE.name(), id)).await.unwrap();
        item.map(|item| item.parse().unwrap())
    }
}

/// A request message for notification `n` (none exists: handled, it does nothing).
fn request(id: &str, n: &str, receive_count: u32) -> Received {
    Received {
        message_id: id.into(),
        receipt: format!("r-{id}-{receive_count}"),
        body: json!({"tenant": "shop", "notification_id": n}).to_string(),
        receive_count,
        sent_at_ms: 0,
        group: None,
    }
}

/// Starts handling each message in `process` and waits until every one is stuck in its handler.
async fn stuck(fx: &Fixture, process: &Deps, messages: &[Received]) -> Vec<JoinHandle<Outcome>> {
    let mut handles = Vec::new();
    for m in messages {
        let (deps, m) = (process.clone(), m.clone());
        handles.push(tokio::spawn(async move { route(&deps, LANE, &m).await }));
        fx.table.around.reached.acquire().await.unwrap().forget();
    }
    handles
}

/// The process ends: its handlings stop where they stand.
async fn ends(handles: Vec<JoinHandle<Outcome>>) {
    for h in handles {
        h.abort();
        assert!(h.await.unwrap_err().is_cancelled());
    }
}

/// The message of the issue: its handling ends the process each time. Receive 1 writes no
/// marker; receive 2 ends the process again with nothing beside it; receive 3 is dead-lettered
/// without being handled, its body and the reason kept.
#[tokio::test]
async fn a_message_that_ends_the_process_at_a_redelivery_is_set_aside_at_the_next_receive() {
    let fx = fixture();
    fx.table.around.stall("n-1");
    let first = stuck(&fx, &fx.process(), &[request("m-1", "n-1", 1)]).await;
    assert_eq!(fx.marker("m-1").await, None, "a first receipt writes nothing");
    ends(first).await;

    let second = stuck(&fx, &fx.process(), &[request("m-1", "n-1", 2)]).await;
    let marker = fx.marker("m-1").await.expect("a redelivery runs marked");
    assert_eq!((marker.receive, marker.beside, marker.alone), (2, 0, false));
    ends(second).await;

    // Answered now: handled again, it would return, not end the process.
    fx.table.around.unstall("n-1");
    let handled = fx.table.around.handled();
    let third = request("m-1", "n-1", 3);
    let outcome = route(&fx.process(), LANE, &third).await;
    let Outcome::Reject(reason) = &outcome else { panic!("set aside, got {outcome:?}") };
    assert!(reason.starts_with("set aside: the process ended while handling this message at receive 2"), "{reason}");
    assert_eq!(fx.table.around.handled(), handled, "not handled again");

    let deps = &fx.world.deps;
    assert!(settle(deps.queues.as_ref(), LANE.name(), &third, &outcome, deps.clock.now(), false).await.unwrap());
    let dead = deps.queues.peek_dlq(LANE.name(), 10).await.unwrap();
    let letter: Rejected = serde_json::from_str(&dead[0].body).unwrap();
    assert_eq!((letter.rejected.as_str(), letter.receive_count), (reason.as_str(), 3));
    assert_eq!(letter.original_body, third.body);
}

/// `TIDINGS_SET_ASIDE_AFTER_CRASHES=2`: the first end on a restart is counted and the message
/// handled again; the second sets it aside.
#[tokio::test]
async fn a_higher_threshold_counts_the_ends_before_setting_a_message_aside() {
    let fx = fixture();
    let process = || {
        let deps = fx.process();
        let config = tidings_core::CoreConfig { set_aside_after_crashes: 2, ..(*deps.config).clone() };
        Deps { config: Arc::new(config), ..deps }
    };
    fx.table.around.stall("n-1");
    ends(stuck(&fx, &process(), &[request("m-1", "n-1", 1)]).await).await;
    ends(stuck(&fx, &process(), &[request("m-1", "n-1", 2)]).await).await;
    // Receive 3: one end counted, handled again (it ends the process once more).
    ends(stuck(&fx, &process(), &[request("m-1", "n-1", 3)]).await).await;
    let marker = fx.marker("m-1").await.expect("marked");
    assert_eq!((marker.receive, marker.crashes), (3, 1));
    fx.table.around.unstall("n-1");
    let outcome = route(&process(), LANE, &request("m-1", "n-1", 4)).await;
    assert!(matches!(&outcome, Outcome::Reject(r) if r.contains("at receive 3")), "{outcome:?}");
}

/// A redelivered message whose handler returned (a retry, a success) leaves no marker: its next
/// receive is handled.
#[tokio::test]
async fn a_redelivered_message_whose_handler_returned_is_not_set_aside() {
    let fx = fixture();
    let process = fx.process();
    fx.table.around.tenant_down.store(true, Ordering::SeqCst);
    assert!(matches!(route(&process, LANE, &request("m-1", "n-1", 2)).await, Outcome::Retry(_)));
    assert_eq!(fx.marker("m-1").await, None, "unmarked after a retry");
    fx.table.around.tenant_down.store(false, Ordering::SeqCst);
    assert_eq!(route(&fx.process(), LANE, &request("m-1", "n-1", 3)).await, Outcome::Done);
    assert_eq!(fx.marker("m-1").await, None, "unmarked after a success");
    assert_eq!(route(&fx.process(), LANE, &request("m-1", "n-1", 4)).await, Outcome::Done);
}

/// Two messages end the process together: neither is known to be the cause. Each gets one
/// attempt alone; the one that ends the process alone is set aside, the other is handled.
#[tokio::test]
async fn a_message_that_ended_the_process_beside_another_is_tried_alone_first() {
    let fx = fixture();
    fx.table.around.stall("n-1");
    fx.table.around.stall("n-2");
    ends(stuck(&fx, &fx.process(), &[request("m-1", "n-1", 2), request("m-2", "n-2", 2)]).await).await;
    assert_eq!(fx.marker("m-2").await.unwrap().beside, 1);

    let alone = stuck(&fx, &fx.process(), &[request("m-1", "n-1", 3)]).await;
    let marker = fx.marker("m-1").await.unwrap();
    assert_eq!((marker.receive, marker.beside, marker.alone), (3, 0, true));
    ends(alone).await;

    fx.table.around.unstall("n-2");
    fx.table.around.unstall("n-1");
    assert_eq!(route(&fx.process(), LANE, &request("m-2", "n-2", 3)).await, Outcome::Done);
    match route(&fx.process(), LANE, &request("m-1", "n-1", 4)).await {
        Outcome::Reject(reason) => {
            assert!(reason.contains("at receive 3 (handled alone after an earlier ambiguous end)"), "{reason}")
        }
        other => panic!("set aside after its attempt alone, got {other:?}"),
    }
}

/// A first receipt that begins while a redelivered message runs with nothing beside it is
/// counted in that message's marker before it runs: had it ended the process, the redelivered
/// message, innocent, would otherwise be set aside.
#[tokio::test]
async fn a_message_that_begins_beside_a_lone_attempt_is_counted_in_its_marker() {
    let fx = fixture();
    fx.table.around.stall("n-1");
    fx.table.around.stall("n-2");
    let process = fx.process();
    let mut handles = stuck(&fx, &process, &[request("m-1", "n-1", 2)]).await;
    assert_eq!(fx.marker("m-1").await.unwrap().beside, 0);
    handles.extend(stuck(&fx, &process, &[request("m-2", "n-2", 1)]).await);
    assert_eq!(fx.marker("m-1").await.unwrap().beside, 1);
    ends(handles).await;

    fx.table.around.unstall("n-1");
    assert_eq!(
        route(&fx.process(), LANE, &request("m-1", "n-1", 3)).await,
        Outcome::Done,
        "tried alone, not set aside"
    );
}

/// An attempt alone waits until what is in flight in its process has ended, and nothing begins
/// beside it.
#[tokio::test]
async fn an_attempt_alone_waits_for_the_messages_in_flight() {
    let fx = fixture();
    let earlier = Marker { receive: 2, beside: 1, alone: false, crashes: 0, ttl: 0 };
    let key = keys::attempt(LANE.name(), "m-1");
    fx.world.deps.table.put(Item::new(key, attrs_of(&earlier).unwrap()), Cond::Always).await.unwrap();
    fx.table.around.stall("n-2");
    let process = fx.process();
    let other = stuck(&fx, &process, &[request("m-2", "n-2", 1)]).await;
    let handled = fx.table.around.handled();

    let deps = process.clone();
    let alone = tokio::spawn(async move { route(&deps, LANE, &request("m-1", "n-1", 3)).await });
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(fx.table.around.handled(), handled, "not started beside a message in flight");
    assert_eq!(fx.marker("m-1").await, Some(earlier));

    ends(other).await;
    assert_eq!(alone.await.unwrap(), Outcome::Done);
    assert_eq!(fx.table.around.handled(), handled + 1);
}

/// The guard never holds a message back: a marker that cannot be written, and the message is
/// handled as a first receipt is.
#[tokio::test]
async fn a_message_whose_marker_cannot_be_written_is_handled() {
    let fx = fixture();
    fx.table.around.markers_down.store(true, Ordering::SeqCst);
    assert_eq!(route(&fx.process(), LANE, &request("m-1", "n-1", 2)).await, Outcome::Done);
    assert_eq!(fx.table.around.handled(), 1);
}

/// A channel lane's batch: only the message whose marker says it ended the process is set
/// aside; the rest of the batch is handled as a batch.
#[tokio::test]
async fn a_channel_batch_sets_aside_only_the_message_that_ended_the_process() {
    let fx = fixture();
    let lane = Lane::Channel(Channel::Sms, Urgency::Low);
    let earlier = Marker { receive: 2, beside: 0, alone: false, crashes: 0, ttl: 0 };
    let key = keys::attempt(lane.name(), "c-1");
    fx.world.deps.table.put(Item::new(key, attrs_of(&earlier).unwrap()), Cond::Always).await.unwrap();
    let message = |id: &str, body: &str, receive_count| Received {
        message_id: id.into(),
        receipt: id.into(),
        body: body.into(),
        receive_count,
        sent_at_ms: 0,
        group: None,
    };
    let batch = [message("c-1", "{}", 3), message("c-2", "{\"send\": 1}", 1), message("c-3", "{\"send\": 2}", 2)];
    let outcomes = route_batch(&fx.process(), lane, &batch, None).await;
    assert!(matches!(&outcomes[0], Outcome::Reject(r) if r.starts_with("set aside")), "{outcomes:?}");
    assert!(matches!(&outcomes[1], Outcome::Reject(r) if r.starts_with("malformed")), "{outcomes:?}");
    assert!(matches!(&outcomes[2], Outcome::Reject(r) if r.starts_with("malformed")), "{outcomes:?}");
    let marker = |id: &str| keys::attempt(lane.name(), id);
    let table = &fx.world.deps.table;
    assert!(
        table.get(&marker("c-3")).await.unwrap().is_none(),
        "the redelivered one handled with its batch was unmarked"
    );
    assert!(
        table.get(&marker("c-1")).await.unwrap().is_some(),
        "kept until its ttl: a settle that fails sets it aside again"
    );
}

/// A handler cut off at its deadline returned (a retry): its marker is deleted, so its next
/// receive is handled, not set aside.
#[tokio::test(start_paused = true)]
async fn a_redelivered_message_cut_off_at_its_deadline_is_not_set_aside() {
    let fx = fixture();
    fx.table.around.stall("n-1");
    let deadline = std::time::Instant::now();
    let outcomes = route_batch(&fx.process(), LANE, &[request("m-1", "n-1", 2)], Some(deadline)).await;
    assert_eq!(outcomes, vec![Outcome::Retry(Duration::ZERO)]);
    assert_eq!(fx.marker("m-1").await, None);
    fx.table.around.unstall("n-1");
    assert_eq!(route(&fx.process(), LANE, &request("m-1", "n-1", 3)).await, Outcome::Done);
}

/// An attempt alone that could not wait for its process to be free (its wait ran out: at most
/// `attempts::ALONE_WAIT`, or its deadline) runs beside the others and says so: ending the
/// process there is still ambiguous, and the next receive is tried alone again, not set aside.
#[tokio::test(start_paused = true)]
async fn an_attempt_alone_that_ran_beside_others_is_not_conclusive() {
    let fx = fixture();
    let earlier = Marker { receive: 2, beside: 1, alone: false, crashes: 0, ttl: 0 };
    let key = keys::attempt(LANE.name(), "m-1");
    fx.world.deps.table.put(Item::new(key, attrs_of(&earlier).unwrap()), Cond::Always).await.unwrap();
    fx.table.around.stall("n-1");
    fx.table.around.stall("n-2");
    let process = fx.process();
    let mut handles = stuck(&fx, &process, &[request("m-2", "n-2", 1)]).await;
    let deps = process.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(3600);
    handles.push(tokio::spawn(async move {
        route_batch(&deps, LANE, &[request("m-1", "n-1", 3)], Some(deadline)).await.remove(0)
    }));
    fx.table.around.reached.acquire().await.unwrap().forget();
    ends(handles).await;
    let marker = fx.marker("m-1").await.unwrap();
    assert_eq!((marker.receive, marker.beside, marker.alone), (3, 1, false));

    fx.table.around.unstall("n-1");
    assert_eq!(route(&fx.process(), LANE, &request("m-1", "n-1", 4)).await, Outcome::Done, "tried alone again");
}

/// Its visibility ran out while a receive of it still runs (stuck at a slow store), and the same
/// process receives it again, twice: neither later receive reads the running one's marker as an
/// end of the process; each comes back later, the first receive is settled by the latest
/// receipt, and once the first receive has returned the message is handled, never set aside.
#[tokio::test]
async fn a_message_shown_again_while_it_still_runs_here_is_not_set_aside() {
    let fx = fixture();
    fx.table.around.stall("n-1");
    let process = fx.process();
    let running = stuck(&fx, &process, &[request("m-1", "n-1", 2)]).await;
    for receive in [3, 4] {
        let outcome = route(&process, LANE, &request("m-1", "n-1", receive)).await;
        assert_eq!(outcome, Outcome::Retry(tidings_core::router::RUNNING_AGAIN_AFTER), "receive {receive}");
        assert_eq!(fx.marker("m-1").await.map(|m| m.receive), Some(2), "the running receive's marker stays");
    }
    // The running receive is settled by the latest receipt (the only one a queue honours; by
    // its own the message would stay and be handled again), once.
    assert_eq!(process.attempts.newest_receipt(LANE.name(), "m-1").as_deref(), Some("r-m-1-4"));
    assert_eq!(process.attempts.newest_receipt(LANE.name(), "m-1"), None);
    fx.table.around.unstall("n-1");
    ends(running).await;
    // What the test's abort left is the marker of a receive that ended with its process: the
    // next receive in a new process is judged by it, as before. In the same process (its
    // receive returned instead), the message is handled.
    fx.world.deps.table.delete(&keys::attempt(LANE.name(), "m-1"), Cond::Always).await.unwrap();
    assert_eq!(route(&process, LANE, &request("m-1", "n-1", 5)).await, Outcome::Done);
}
