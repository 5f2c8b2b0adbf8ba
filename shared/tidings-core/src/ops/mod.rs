//! What operators, not tenants, act on: API keys and their roles, and the dead letters they are
//! shown and redrive.

pub mod dead_letters;
pub mod key_cache;
pub mod tenants;
