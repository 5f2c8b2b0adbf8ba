//! The `commerce-api` function: the routes of the Tidings HTTP API for stock and orders
//! (locations, inventory, orders and their holds, stock subscriptions and events, restock
//! notices and analytics, reconciliation), behind their own API Gateway routes. `tidings serve`
//! serves them in its one router.

fn main() -> std::process::ExitCode {
    tidings_functions::commerce_api()
}
