//! What the core's integration tests share (each test file that needs it says `mod support;`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tidings_core::Deps;
use tidings_core::messages::{ALL_QUEUES, dispatch, dispatch_batch, is_consumed, settle, settle_batch};
use tidings_core::notify::relay;
use tidings_core::ports::ChangeFeed;
use tidings_embedded::EmbeddedChangeFeed;
pub use tidings_embedded::test_world::{DEFAULT_START, Recorder, TestWorld};

/// Where a [`TestWorld`]'s manual clock starts by default.
#[allow(dead_code)] // not every test file reads it
pub fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(DEFAULT_START).unwrap().with_timezone(&Utc)
}

/// How [`drain`] hands queue messages to their handlers: one at a time (as the local runtime's
/// workers for most queues) or a received batch at once (as a Lambda invocation).
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each test file uses one of them
pub enum Handling {
    One,
    Batch,
}

/// The relay and every consumed queue, round after round, until nothing moves (50 rounds at
/// most).
#[allow(dead_code)] // not every test file drains
pub async fn drain(deps: &Deps, feed: &EmbeddedChangeFeed, handling: Handling) {
    for _ in 0..50 {
        let records = feed.next_batch(1000).await.unwrap();
        relay::handle_changes(deps, &records).await.unwrap();
        feed.commit(&records).await.unwrap();
        let mut did = records.len();
        for q in ALL_QUEUES.iter().filter(|q| is_consumed(q)) {
            let got = deps.queues.receive(q, 10, Duration::from_secs(60), Duration::ZERO).await.unwrap();
            did += got.len();
            match handling {
                Handling::One => {
                    for m in &got {
                        let outcome = dispatch(deps, q, m).await;
                        settle(deps.queues.as_ref(), q, m, &outcome, deps.clock.now(), true).await.unwrap();
                    }
                }
                Handling::Batch => {
                    let outcomes = dispatch_batch(deps, q, &got).await;
                    settle_batch(deps.queues.as_ref(), q, &got, outcomes, deps.clock.now(), true).await;
                }
            }
        }
        if did == 0 {
            return;
        }
    }
}
