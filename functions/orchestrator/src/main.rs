//! The `orchestrator` function: request queues → per user and channel: a delivery record and a channel task.
//! Failed messages get their backoff as visibility and are reported in `batchItemFailures`.

fn main() -> std::process::ExitCode {
    tidings_functions::orchestrator()
}
