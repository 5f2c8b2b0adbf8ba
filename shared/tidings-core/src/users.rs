//! Users (contacts) and their preferences.

use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::{Cond, Item, attrs_of};

/// A user's contacts, as the shop gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct User {
    pub user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub updated_at: String,
}

/// The body of `PUT /v1/users/{id}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserInput {
    pub email: Option<String>,
    pub phone: Option<String>,
    pub locale: Option<String>,
    pub timezone: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

impl UserInput {
    fn validate(&self) -> CoreResult<()> {
        if let Some(email) = &self.email {
            let ok = email.len() <= 254
                && email.split_once('@').is_some_and(|(l, d)| !l.is_empty() && d.contains('.') && !d.starts_with('.'))
                && !email.chars().any(|c| c.is_whitespace() || c.is_control());
            if !ok {
                return Err(CoreError::invalid("email", "not an email address"));
            }
        }
        if let Some(phone) = &self.phone {
            let digits = phone.strip_prefix('+').unwrap_or("");
            if digits.len() < 6 || digits.len() > 15 || !digits.chars().all(|c| c.is_ascii_digit()) {
                return Err(CoreError::invalid("phone", "must be E.164, e.g. +8613800001234"));
            }
        }
        if let Some(locale) = &self.locale
            && (locale.is_empty()
                || locale.len() > 35
                || !locale.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(CoreError::invalid("locale", "not a language tag such as en or zh-CN"));
        }
        if let Some(tz) = &self.timezone
            && tz.parse::<chrono_tz::Tz>().is_err()
        {
            return Err(CoreError::invalid("timezone", "not an IANA time zone such as Asia/Shanghai"));
        }
        for (i, tag) in self.tags.iter().enumerate() {
            check_id(&format!("tags[{i}]"), tag)?;
        }
        if self.tags.len() > 50 {
            return Err(CoreError::invalid("tags", "at most 50 tags"));
        }
        Ok(())
    }
}

pub async fn put_user(deps: &Deps, t: &TenantId, user_id: &str, input: UserInput) -> CoreResult<User> {
    check_id("user_id", user_id)?;
    input.validate()?;
    let user = User {
        user_id: user_id.to_owned(),
        email: input.email,
        phone: input.phone,
        locale: input.locale,
        timezone: input.timezone,
        tags: input.tags,
        updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    deps.table.put(Item::new(keys::user(t, user_id), attrs_of(&user)?), Cond::Always).await?;
    Ok(user)
}

pub async fn get_user(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Option<User>> {
    check_id("user_id", user_id)?;
    match deps.table.get(&keys::user(t, user_id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}
