//! Identifiers and validated names.

use crate::error::CoreError;

/// A new time-ordered unique id (UUID v7, hex without dashes).
pub fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// Checks an id given by a client: 1..=128 characters of `[A-Za-z0-9._:@+-]`. Ids become parts
/// of table keys, so `#` and `/` (our separators) and control characters are refused.
pub fn check_id(field: &str, value: &str) -> Result<(), CoreError> {
    if value.is_empty() || value.len() > 128 {
        return Err(CoreError::invalid(field, "must be 1 to 128 characters"));
    }
    if !value.chars().all(|c| c.is_ascii_alphanumeric() || "._:@+-".contains(c)) {
        return Err(CoreError::invalid(field, "may contain only letters, digits and . _ : @ + -"));
    }
    Ok(())
}

/// A tenant's id (checked like a client id), checked again whenever it is read from a message
/// or an item: a value of this type is always valid.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct TenantId(String);

impl TryFrom<String> for TenantId {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, CoreError> {
        check_id("tenant", &value)?;
        Ok(Self(value))
    }
}

impl TenantId {
    pub fn parse(value: &str) -> Result<Self, CoreError> {
        check_id("tenant", value)?;
        Ok(Self(value.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Masks an address for logs: `al***@example.com`, `+86******1234`.
pub fn mask_address(to: &str) -> String {
    if let Some((local, domain)) = to.split_once('@') {
        let keep: String = local.chars().take(2).collect();
        return format!("{keep}***@{domain}");
    }
    let n = to.chars().count();
    if n <= 4 {
        return "****".into();
    }
    let tail: String = to.chars().skip(n - 4).collect();
    let head: String = to.chars().take(if to.starts_with('+') { 3 } else { 0 }).collect();
    format!("{head}******{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_refuse_separators() {
        assert!(check_id("user_id", "u-1.a@b").is_ok());
        assert!(check_id("user_id", "a#b").is_err());
        assert!(check_id("user_id", "a/b").is_err());
        assert!(check_id("user_id", "").is_err());
        assert!(check_id("user_id", &"x".repeat(129)).is_err());
    }

    #[test]
    fn a_tenant_is_checked_when_it_deserializes() {
        let t: TenantId = serde_json::from_str(r#""shop-1""#).unwrap();
        assert_eq!(t.as_str(), "shop-1");
        assert_eq!(serde_json::to_string(&t).unwrap(), r#""shop-1""#);
        assert!(serde_json::from_str::<TenantId>(r#""a#b""#).is_err());
        assert!(serde_json::from_str::<TenantId>(r#""""#).is_err());
    }

    #[test]
    fn masks_addresses() {
        assert_eq!(mask_address("alice@example.com"), "al***@example.com");
        assert_eq!(mask_address("+8613800001234"), "+86******1234");
        assert!(!mask_address("+8613800001234").contains("13800"));
    }
}
