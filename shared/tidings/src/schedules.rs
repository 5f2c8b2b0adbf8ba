//! Scheduled jobs (EventBridge schedules on AWS): run on their period by the local runtime, or
//! at once by `POST /dev/schedules/{name}/run`.

use std::time::Duration;

use tidings_core::{Deps, inventory, restock, roles};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::warn;

/// Each job and its period (the SAM template declares the same schedules).
pub const SCHEDULES: &[(&str, Duration)] = &[
    ("tick", Duration::from_secs(60)),
    ("reconcile", Duration::from_secs(24 * 3600)),
    ("restock-scan", Duration::from_secs(3600)),
];

/// Runs one job now: `Ok(None)` when there is no job of that name. Each job runs as its
/// function (`POST /dev/schedules/{name}/run` included).
pub async fn run(deps: &Deps, name: &str) -> Result<Option<serde_json::Value>, String> {
    let Some(&(job, _)) = SCHEDULES.iter().find(|(n, _)| *n == name) else { return Ok(None) };
    roles::acting_as(job, async {
        let result = match job {
            "tick" => tidings_core::schedules::every_minute(deps).await,
            "restock-scan" => restock::scan(deps).await.map(|r| serde_json::to_value(r).unwrap_or_default()),
            "reconcile" => inventory::reconcile(deps, None).await.map(|r| serde_json::to_value(r).unwrap_or_default()),
            _ => return Ok(None),
        };
        result.map(Some).map_err(|e| e.to_string())
    })
    .await
}

/// Starts the periodic jobs. `clock_moved` wakes the tick at once (for `--manual-clock`).
pub fn start(set: &mut JoinSet<()>, deps: Deps, clock_moved: std::sync::Arc<Notify>, stop: watch::Receiver<bool>) {
    for (name, period) in SCHEDULES {
        let (deps, stop, moved) = (deps.clone(), stop.clone(), clock_moved.clone());
        set.spawn(async move {
            while !*stop.borrow() {
                if let Err(e) = run(&deps, name).await {
                    warn!(schedule = name, error = %e, "scheduled job failed; it runs again next period");
                }
                if *name == "tick" {
                    tokio::select! {
                        _ = tokio::time::sleep(*period) => {}
                        _ = moved.notified() => {}
                    }
                } else {
                    tokio::time::sleep(*period).await;
                }
            }
        });
    }
}
