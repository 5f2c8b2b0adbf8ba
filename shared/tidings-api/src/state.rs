//! What every handler can reach.

use std::sync::Arc;

use async_trait::async_trait;
use tidings_core::Deps;
use tidings_core::dev::DevProviders;
use tidings_core::ports::ManualClock;

/// Local-development hooks, present only under `tidings serve` (never in Lambda).
#[async_trait]
pub trait DevControl: Send + Sync {
    fn providers(&self) -> &DevProviders;
    /// The manual clock, when the server runs with `--manual-clock`.
    fn manual_clock(&self) -> Option<&ManualClock>;
    /// Runs a scheduled job now and waits for it: `Ok(None)` when no job has that name.
    async fn run_schedule(&self, name: &str) -> Result<Option<serde_json::Value>, String>;
    /// Signals the runtime that the clock moved, so due work is processed at once.
    fn clock_moved(&self) {}
    /// Whether `/dev/*` answers without an API key (`tidings serve --dev` on a loopback address).
    fn keyless(&self) -> bool {
        false
    }
}

/// What every handler can reach, behind one `Arc`: axum clones the state for every extractor
/// and middleware of every request, and a clone of this is one count, not one per port.
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    pub fn new(parts: AppParts) -> Self {
        Self(Arc::new(parts))
    }

    /// The state of `deps` alone: no dev hooks, no queues to list, no live hub (the Lambda
    /// fixture's and the route tests' server).
    pub fn of(deps: Deps) -> Self {
        Self::new(AppParts { deps, queue_names: Arc::default(), dev: None, live: None })
    }

    /// [`AppState::of`] with the local-development hooks.
    pub fn with_dev(deps: Deps, dev: Arc<dyn DevControl>) -> Self {
        Self::new(AppParts { deps, queue_names: Arc::default(), dev: Some(dev), live: None })
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// The parts of an [`AppState`].
pub struct AppParts {
    pub deps: Deps,
    /// The queues this deployment uses (for `/v1/ops/queues`).
    pub queue_names: Arc<Vec<String>>,
    pub dev: Option<Arc<dyn DevControl>>,
    /// The live feed's connections, when this process serves `/v1/ws` (`tidings serve`).
    pub live: Option<Arc<crate::routes::live::LocalHub>>,
}
