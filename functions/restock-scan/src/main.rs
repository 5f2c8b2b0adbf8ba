//! The `restock-scan` function. Two triggers:
//! - on its EventBridge schedule, the safety-net scan: every SKU with stock and WAITING
//!   subscribers gets its current round queued (same `batch_no` as the event: sent once), and
//!   WAITING subscriptions past the maximum age expire;
//! - from the `stock-events` queue, upstream `stock.in` events (applied as adjustments) and
//!   round jobs (the waves of a round). Partial batch failures are reported.

fn main() -> std::process::ExitCode {
    tidings_functions::restock_scan()
}
