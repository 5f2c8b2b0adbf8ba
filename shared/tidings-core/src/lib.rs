//! The Tidings core: every business rule, behind ports (see [`ports`]). Lambda functions and
//! the local runtime are thin wiring around the handlers here.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod deps;
pub mod dev;
pub mod error;
pub mod ids;
pub mod inbox;
pub mod inventory;
pub mod keys;
pub mod messages;
pub mod notify;
pub mod ports;
pub mod retry;
pub mod signing;
pub mod templates;
pub mod tenants;
pub mod timers;
pub mod users;

pub use deps::{CoreConfig, Deps, Providers};
pub use error::{CoreError, CoreResult};
pub use ids::TenantId;
