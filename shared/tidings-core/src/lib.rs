//! The Tidings core: every business rule, behind ports (see [`ports`]). Lambda functions and
//! the local runtime are thin wiring around the handlers here.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod attempts;
pub mod config;
pub mod crash;
pub mod deps;
pub mod dev;
pub mod error;
pub mod gates;
pub mod ids;
pub mod inbox;
pub mod inventory;
pub mod keys;
pub mod lanes;
pub mod lists;
pub mod log_lines;
pub mod messages;
pub mod metrics;
pub mod money;
pub mod notify;
pub mod ops;
pub mod outcome;
pub mod people;
pub mod ports;
pub mod restock;
pub mod retry;
pub mod roles;
pub mod router;
pub mod schedules;
pub mod signing;
pub mod site;
pub mod sizes;
pub mod tasks;
pub mod templates;
pub mod timers;
pub mod tracking;
pub mod webhook_targets;
pub mod webhooks;
pub mod workflows;

pub use config::CoreConfig;
pub use deps::Deps;
pub use error::{CoreError, CoreResult};
pub use ids::TenantId;
pub use ports::Providers;
