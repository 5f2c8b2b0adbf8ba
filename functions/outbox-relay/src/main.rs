//! The `outbox-relay` function: the table's stream (filtered to new notifications and stock
//! items) → request queues. Partial failures are reported so the batch is retried and bisected.

fn main() -> std::process::ExitCode {
    tidings_functions::outbox_relay()
}
