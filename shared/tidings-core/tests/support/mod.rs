//! What the core's integration tests share (each test file that needs it says `mod support;`).

use std::sync::Mutex;
use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tidings_core::messages::{ALL_QUEUES, dispatch, dispatch_batch, is_consumed, settle, settle_batch};
use tidings_core::notify::relay;
use tidings_core::ports::{ChangeFeed, Clock, ManualClock, OutboundMessage, Provider, ProviderError, ProviderReceipt};
use tidings_core::{CoreConfig, Deps, Providers};
use tidings_embedded::{EmbeddedChangeFeed, EmbeddedStore, QueueConfig};

/// Where the manual clock of [`store_on_manual_clock`] starts.
#[allow(dead_code)] // not every test file reads it
pub fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z").unwrap().with_timezone(&Utc)
}

/// An in-memory embedded store with every queue declared (`max_receives` before its DLQ).
pub fn store_with_queues(store: EmbeddedStore, max_receives: u32) -> EmbeddedStore {
    for q in ALL_QUEUES {
        store.declare_queue(QueueConfig::new(*q, max_receives)).unwrap();
    }
    store
}

/// An in-memory embedded store whose time is a manual clock at [`start`], every queue declared.
#[allow(dead_code)] // not every test file runs on a manual clock
pub fn store_on_manual_clock(max_receives: u32) -> (EmbeddedStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(start()));
    let store = EmbeddedStore::in_memory_with_clock(clock.clone()).unwrap();
    (store_with_queues(store, max_receives), clock)
}

/// The core's dependencies over one embedded store (its table and its queues).
pub fn deps(store: &EmbeddedStore, clock: Arc<dyn Clock>, providers: Providers, config: CoreConfig) -> Deps {
    Deps { table: Arc::new(store.clone()), queues: Arc::new(store.clone()), clock, providers, config: Arc::new(config) }
}

/// A provider that accepts every send and records it; its message ids are `pm-1`, `pm-2`, ...
#[derive(Default)]
pub struct Recorder {
    pub sent: Mutex<Vec<OutboundMessage>>,
}

#[async_trait]
impl Provider for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    async fn send(&self, message: &OutboundMessage) -> Result<ProviderReceipt, ProviderError> {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        sent.push(message.clone());
        Ok(ProviderReceipt { provider_message_id: format!("pm-{}", sent.len()) })
    }
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
