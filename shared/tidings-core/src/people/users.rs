//! Users (contacts) and their preferences.

use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::table::MAX_TRANSACTION_WRITES;
use crate::ports::{Cond, Item, QueryOpts, StoreError, Write, attrs_of};

/// A user's contacts, as the shop gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// The write of a user's entry in the users list ([`crate::lists::users`]): the user as stored,
/// written in the user's transaction.
fn entry_write(t: &TenantId, user: &User) -> CoreResult<Write> {
    Ok(Write::Put { item: Item::new(keys::user_entry(t, &user.user_id), attrs_of(user)?), cond: Cond::Always })
}

/// The body of `PUT /v1/users/{id}`.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
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
    /// Checks every field and puts the phone number in its E.164 form (`+14155550100`).
    fn validate(&mut self) -> CoreResult<()> {
        if let Some(email) = &self.email
            && !is_email(email)
        {
            return Err(CoreError::invalid("email", "not one email address, e.g. alice@example.com"));
        }
        if let Some(phone) = &self.phone {
            self.phone = Some(e164(phone).ok_or_else(|| {
                CoreError::invalid("phone", "not a valid phone number in E.164 form, e.g. +8613800001234")
            })?);
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

/// One address (no display name, no list, no IP literal), with a top-level domain.
pub fn is_email(address: &str) -> bool {
    let options = email_address::Options::default().with_required_tld().without_display_text().without_domain_literal();
    address.len() <= 254 && email_address::EmailAddress::parse_with_options(address, options).is_ok()
}

/// The E.164 form of a number given with its country code (`+1 415 555 0100` →
/// `+14155550100`), when it is a valid number of a country's numbering plan.
pub fn e164(number: &str) -> Option<String> {
    // The parser skips what it does not understand (`ext`, a second number after a comma).
    let plain = number.chars().all(|c| c.is_ascii_digit() || matches!(c, ' ' | '-' | '(' | ')' | '.' | '+'));
    if !plain || !number.trim_start().starts_with('+') || number.matches('+').count() != 1 {
        return None;
    }
    let parsed = phonenumber::parse(None, number).ok()?;
    (parsed.is_valid() && parsed.extension().is_none())
        .then(|| parsed.format().mode(phonenumber::Mode::E164).to_string())
}

/// The hidden revision of a stored user: `put_user` writes only over the revision it read, so
/// that two concurrent writes cannot leave tag memberships that disagree with the user.
const REVISION: &str = "rev";

/// Stores the user and its tag memberships (the segment index, `keys::tag_member`) in one
/// transaction: memberships of tags the user no longer has are deleted, the others rewritten
/// with the user's current contacts, so a campaign page reads users without a get per user.
pub async fn put_user(deps: &Deps, t: &TenantId, user_id: &str, input: UserInput) -> CoreResult<User> {
    check_id("user_id", user_id)?;
    let mut input = input;
    input.validate()?;
    let mut tags = Vec::with_capacity(input.tags.len());
    for tag in input.tags {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    let user = User {
        user_id: user_id.to_owned(),
        email: input.email,
        phone: input.phone,
        locale: input.locale,
        timezone: input.timezone,
        tags,
        updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let key = keys::user(t, user_id);
    for _ in 0..8 {
        let old = deps.table.get(&key).await?;
        let (cond, rev, old_tags) = match &old {
            None => (Cond::NotExists, 1, Vec::new()),
            Some(item) => {
                let old_user: User = item.parse()?;
                match item.i64(REVISION) {
                    Some(rev) => (Cond::eq(REVISION, rev), rev + 1, old_user.tags),
                    None => (Cond::And(vec![Cond::Exists, Cond::AttrNotExists(REVISION.into())]), 1, old_user.tags),
                }
            }
        };
        let mut attrs = attrs_of(&user)?;
        attrs.insert(REVISION.into(), rev.into());
        let member = attrs_of(&user)?;
        let removed: Vec<Write> = old_tags
            .iter()
            .filter(|tag| !user.tags.contains(tag))
            .map(|tag| Write::Delete { key: keys::tag_member(t, tag, user_id), cond: Cond::Always })
            .collect();
        let mut writes = vec![Write::Put { item: Item::new(key.clone(), attrs), cond }];
        // Its entry in the tenant's users list, with it (`crate::lists`).
        writes.push(entry_write(t, &user)?);
        writes.extend(user.tags.iter().map(|tag| Write::Put {
            item: Item::new(keys::tag_member(t, tag, user_id), member.clone()),
            cond: Cond::Always,
        }));
        if writes.len() + removed.len() <= MAX_TRANSACTION_WRITES {
            writes.extend(removed);
        } else if !removed.is_empty() {
            // Too many for one transaction: leave the old tags first (a crash in between only
            // drops memberships that were going anyway).
            deps.table.transact(removed).await?;
        }
        match deps.table.transact(writes).await {
            Ok(()) => return Ok(user),
            Err(StoreError::ConditionFailed { index: 0 }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// One page of a segment's members (users with the tag), in user-id order.
pub async fn segment_page(
    deps: &Deps,
    t: &TenantId,
    tag: &str,
    limit: usize,
    cursor: Option<String>,
) -> CoreResult<(Vec<User>, Option<String>)> {
    let page = deps.table.query(&keys::tag_pk(t, tag), "", QueryOpts { limit, cursor, descending: false }).await?;
    let users = page.items.iter().map(Item::parse).collect::<Result<Vec<User>, _>>()?;
    Ok((users, page.next_cursor))
}

pub async fn get_user(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<Option<User>> {
    check_id("user_id", user_id)?;
    match deps.table.get(&keys::user(t, user_id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

/// Several users at once, in the order asked, with the ids given (one round trip per 100 on
/// DynamoDB: a notification's `user_ids` list read one by one took a request per user).
pub async fn get_users(deps: &Deps, t: &TenantId, user_ids: Vec<String>) -> CoreResult<Vec<(String, Option<User>)>> {
    for user_id in &user_ids {
        check_id("user_id", user_id)?;
    }
    let keys: Vec<_> = user_ids.iter().map(|u| keys::user(t, u)).collect();
    let items = deps.table.get_many(&keys).await?;
    let mut users = Vec::with_capacity(user_ids.len());
    for (user_id, item) in user_ids.into_iter().zip(items) {
        let user = match item {
            Some(item) => Some(item.parse()?),
            None => None,
        };
        users.push((user_id, user));
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(input: UserInput) -> Option<String> {
        let mut input = input;
        match input.validate() {
            Err(CoreError::Invalid { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn an_email_is_one_address() {
        for bad in
            ["a@b.c,d@e.f", "a@b@c.d", "Alice <a@example.com>", "a@localhost", "a@[10.0.0.1]", "a b@example.com", ""]
        {
            let input = UserInput { email: Some(bad.into()), ..UserInput::default() };
            assert_eq!(field_of(input), Some("email".into()), "{bad:?}");
        }
        for good in ["alice@example.com", "a.b+shop@mail.example.co.uk"] {
            let input = UserInput { email: Some(good.into()), ..UserInput::default() };
            assert_eq!(field_of(input), None, "{good:?}");
        }
    }

    #[test]
    fn a_phone_number_is_valid_and_stored_in_e164_form() {
        for bad in ["8613800001234", "+1", "+15555550100", "+8613800001234,+14155550100", "+1 415 555 0100 ext"] {
            let input = UserInput { phone: Some(bad.into()), ..UserInput::default() };
            assert_eq!(field_of(input), Some("phone".into()), "{bad:?}");
        }
        let mut input = UserInput { phone: Some("+1 (415) 555-0100".into()), ..UserInput::default() };
        assert!(input.validate().is_ok());
        assert_eq!(input.phone.as_deref(), Some("+14155550100"));
        assert_eq!(e164("+8613800001234").as_deref(), Some("+8613800001234"));
    }
}
