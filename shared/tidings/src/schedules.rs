//! Scheduled jobs (EventBridge schedules on AWS): run on their period by the local runtime, or
//! at once by `POST /dev/schedules/{name}/run`.

use std::time::Duration;

use tidings_core::Deps;
use tokio::sync::watch;
use tokio::task::JoinSet;




/// Runs one job now: `Ok(None)` when there is no job of that name.
pub async fn run(_deps: &Deps, name: &str) -> Result<Option<serde_json::Value>, String> {
    match name {
        _ => Ok(None),
    }
}

/// Starts the periodic jobs.
pub fn start(set: &mut JoinSet<()>, deps: Deps, stop: watch::Receiver<bool>) {
    let _ = (deps, Duration::ZERO);
    drop(stop);
    let _ = set;
}
