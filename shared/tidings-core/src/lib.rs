//! The Tidings core: every business rule, behind ports (see [`ports`]). Lambda functions and
//! the local runtime are thin wiring around the handlers here.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod abuse;
pub mod crash;
pub mod dead_letters;
pub mod deps;
pub mod dev;
pub mod devices;
pub mod email;
pub mod erasure;
pub mod error;
pub mod gates;
pub mod ids;
pub mod inbox;
pub mod inventory;
pub mod keys;
pub mod lists;
pub mod live;
pub mod messages;
pub mod metrics;
pub mod notify;
pub mod ports;
pub mod preferences;
pub mod receipts;
pub mod restock;
pub mod retry;
pub mod roles;
pub mod schedule;
pub mod signing;
pub mod sizes;
pub mod suppression;
pub mod template_preview;
pub mod templates;
pub mod tenants;
pub mod timers;
pub mod tracking;
pub mod users;
pub mod webhooks;

pub use deps::{CoreConfig, Deps, Providers};
pub use error::{CoreError, CoreResult};
pub use ids::TenantId;
