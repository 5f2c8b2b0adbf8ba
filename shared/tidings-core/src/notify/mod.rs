//! Notifications: accept → relay → orchestrator → channel worker.

pub mod abuse;
pub mod api;
pub mod batch;
pub mod campaign;
pub mod caps;
pub mod channel;
pub mod completion;
pub mod fence;
pub mod model;
pub mod orchestrator;
pub mod params;
pub mod policy;
pub mod progress;
pub mod relay;
pub mod requests;
pub mod send_batch;
pub mod sweep;
pub mod verification;
pub mod watch;
pub mod worker;
