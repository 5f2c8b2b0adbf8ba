//! The `reconcile` function: daily (EventBridge), re-sums every SKU's ledger against its
//! counters and records each discrepancy for review (a table item and the `inventory-review`
//! queue); nothing is silently fixed.

fn main() -> std::process::ExitCode {
    tidings_functions::reconcile()
}
