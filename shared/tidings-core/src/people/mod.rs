//! The people a tenant sends to: users and their contacts, devices, preferences (categories,
//! channels, quiet hours, caps), suppressed addresses, erasure, and importing people.

pub mod calling_codes;
pub mod devices;
pub mod erasure;
pub mod import;
pub mod phones;
pub mod preferences;
pub mod suppression;
pub mod users;
pub mod zones;
