//! The conformance suite of Tidings' ports, written once and run against every backend (the
//! embedded one and the AWS one against an emulator), so that they cannot drift apart.
//!
//! Each public async function is one test case. It takes the port objects and panics (plain
//! `assert!`) when the backend does not behave as the port documents. Every case uses keys,
//! partitions and message bodies carrying a fresh random run id, so table cases can share one
//! table and may run concurrently.
//!
//! # Table cases ([`table`])
//! Take `&dyn Table` (or `Arc<dyn Table>` for the concurrent one). Any table works, empty or not.
//!
//! # Change-stream cases ([`stream`])
//! Take `&dyn Table` and a `&dyn ChangeFeed` reading that table's stream. The feed should be
//! used by one case at a time: a case commits everything it reads (other records included).
//!
//! # Queue cases ([`queue`])
//! Take `&dyn Queues` and the name of the queue to use. The harness declares the queues of
//! [`CONFORMANCE_QUEUES`] (`conf-a` … `conf-l`), each with a DLQ and
//! `max_receives` = [`MAX_RECEIVES`] (2), and gives each queue case its own queue, whose
//! queue and DLQ are empty at the start, and which no other case uses at the same time. The
//! cases use real time only, with delays and visibilities of whole seconds (SQS accepts
//! nothing finer), and poll with deadlines rather than sleeping fixed times, so they pass
//! against a real SQS or an emulator too. They leave their queue empty.
//!
//! [`queue::ALL`] lists every queue case with the queue it is meant for.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod queue;
pub mod stream;
pub mod table;

use serde_json::Value;
use tidings_core::ports::Attrs;

/// The queues a harness declares for the queue cases, each with a DLQ `{name}-dlq`.
pub const CONFORMANCE_QUEUES: [&str; 12] = [
    "conf-a", "conf-b", "conf-c", "conf-d", "conf-e", "conf-f", "conf-g", "conf-h", "conf-i", "conf-j", "conf-k",
    "conf-l",
];

/// The `max_receives` (SQS `maxReceiveCount`) of every conformance queue.
pub const MAX_RECEIVES: u32 = 2;

/// A fresh id for one run of one case (16 hex digits).
pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_owned()
}

/// Attributes from a `serde_json::json!({...})` object literal.
pub fn attrs(value: Value) -> Attrs {
    match value {
        Value::Object(map) => map,
        other => panic!("attrs() needs a JSON object, got {other}"),
    }
}
