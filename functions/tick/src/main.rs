//! The `tick` function: every minute (EventBridge) it fires the due minute buckets of timers;
//! from the `timers` queue it runs each timer (hold expiry, ...). Partial batch failures are
//! reported.

fn main() -> std::process::ExitCode {
    tidings_functions::tick()
}
