//! Notifications: accept → relay → orchestrator → channel worker.

pub mod api;
pub mod model;
pub mod orchestrator;
pub mod relay;
pub mod worker;
