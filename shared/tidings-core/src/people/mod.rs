//! The people a tenant sends to: users and their contacts, devices, preferences (categories,
//! channels, quiet hours, caps), suppressed addresses, and erasure.

pub mod devices;
pub mod erasure;
pub mod preferences;
pub mod suppression;
pub mod users;
