//! The `orchestrator` function: request queues → per user and channel: a delivery record and a channel task.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

use tidings_functions::lanes::{Lane, Priority};

/// The request lanes, one per priority.
const LANES: [Lane; 3] =
    [Lane::Requests(Priority::High), Lane::Requests(Priority::Normal), Lane::Requests(Priority::Low)];

fn main() -> std::process::ExitCode {
    tidings_functions::orchestrator(&LANES)
}
