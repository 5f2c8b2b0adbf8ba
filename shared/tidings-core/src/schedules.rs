//! What the `tick` function runs every minute, on AWS (EventBridge's schedule) and in the local
//! runtime alike: the due timer buckets ([`crate::timers::tick`]), the relay's safety net
//! ([`crate::notify::sweep`]) and the open campaigns' completion ([`crate::notify::completion`]),
//! side by side so none waits on another's reads.

use crate::deps::Deps;
use crate::error::CoreResult;

/// Runs the minute's work; its report is the timers' report with `relay_sweep` and
/// `campaigns` beside it.
pub async fn every_minute(deps: &Deps) -> CoreResult<serde_json::Value> {
    let (fired, swept, campaigns) = tokio::join!(
        crate::timers::tick(deps),
        crate::notify::sweep::sweep(deps),
        crate::notify::completion::check_open(deps)
    );
    let (fired, swept, campaigns) = (fired?, swept?, campaigns?);
    let mut report = serde_json::to_value(fired).unwrap_or_default();
    if let Some(fields) = report.as_object_mut() {
        fields.insert("relay_sweep".into(), serde_json::to_value(swept).unwrap_or_default());
        fields.insert("campaigns".into(), serde_json::to_value(campaigns).unwrap_or_default());
    }
    Ok(report)
}
