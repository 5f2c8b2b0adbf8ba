//! Users (contacts) and their preferences.

use futures::{StreamExt, TryStreamExt};
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
    /// The phone number's country (ISO 3166, `US`, `GG`), as libphonenumber's metadata places
    /// it when the number is written; what `TIDINGS_SMS_COUNTRIES`' countries are checked
    /// against at each send. Set by Tidings, never given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only, example = "US")]
    pub phone_country: Option<String>,
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
    /// Checks every field and puts the phone number in its E.164 form (`+14155550100`); the
    /// phone's country, when it has one (`User::phone_country`).
    fn validate(&mut self) -> CoreResult<Option<String>> {
        if let Some(email) = &self.email
            && !is_email(email)
        {
            return Err(CoreError::invalid("email", "not one email address, e.g. alice@example.com"));
        }
        let mut phone_country = None;
        if let Some(phone) = &self.phone {
            let (number, country) = e164_and_country(phone).ok_or_else(|| {
                CoreError::invalid("phone", "not a valid phone number in E.164 form, e.g. +8613800001234")
            })?;
            self.phone = Some(number);
            phone_country = country;
        }
        if let Some(locale) = &self.locale
            && (locale.is_empty()
                || locale.len() > 35
                || !locale.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(CoreError::invalid("locale", "not a language tag such as en or zh-CN"));
        }
        if let Some(tz) = &self.timezone
            && crate::people::zones::Zone::named(tz).is_none()
        {
            return Err(CoreError::invalid("timezone", "not an IANA time zone such as Asia/Shanghai"));
        }
        for (i, tag) in self.tags.iter().enumerate() {
            check_id(&format!("tags[{i}]"), tag)?;
        }
        if self.tags.len() > 50 {
            return Err(CoreError::invalid("tags", "at most 50 tags"));
        }
        Ok(phone_country)
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
    e164_and_country(number).map(|(number, _)| number)
}

/// [`e164`], and the number's country (`None` for a code of no country, `+800`).
pub fn e164_and_country(number: &str) -> Option<(String, Option<String>)> {
    // The parser skips what it does not understand (`ext`, a second number after a comma).
    let plain = number.chars().all(|c| c.is_ascii_digit() || matches!(c, ' ' | '-' | '(' | ')' | '.' | '+'));
    if !plain || !number.trim_start().starts_with('+') || number.matches('+').count() != 1 {
        return None;
    }
    crate::people::phones::e164_and_country(number)
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
    let phone_country = input.validate()?;
    let user = user_of(deps, user_id, input, phone_country);
    write_user(deps, t, &user).await?;
    Ok(user)
}

/// The user to store from checked input: tags once each, in their first order.
fn user_of(deps: &Deps, user_id: &str, input: UserInput, phone_country: Option<String>) -> User {
    let mut tags = Vec::with_capacity(input.tags.len());
    for tag in input.tags {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    User {
        user_id: user_id.to_owned(),
        email: input.email,
        phone: input.phone,
        phone_country,
        locale: input.locale,
        timezone: input.timezone,
        tags,
        updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    }
}

/// Writes `user` over what is stored, read first (optimistic, retried on a race).
async fn write_user(deps: &Deps, t: &TenantId, user: &User) -> CoreResult<()> {
    let key = keys::user(t, &user.user_id);
    for _ in 0..8 {
        let old = deps.table.get(&key).await?;
        let (writes, removed) = user_writes(t, user, old.as_ref())?;
        let mut writes = writes;
        if writes.len() + removed.len() <= MAX_TRANSACTION_WRITES {
            writes.extend(removed);
        } else if !removed.is_empty() {
            // Too many for one transaction: leave the old tags first (a crash in between only
            // drops memberships that were going anyway).
            deps.table.transact(removed).await?;
        }
        match deps.table.transact(writes).await {
            Ok(()) => return Ok(()),
            Err(StoreError::ConditionFailed { index: 0 }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}

/// The writes that store `user` over `old` (the stored item as read): the user, conditioned on
/// the revision read (its first write), its users-list entry and its tag memberships; and,
/// apart, the deletes of the memberships of tags it no longer has.
fn user_writes(t: &TenantId, user: &User, old: Option<&Item>) -> CoreResult<(Vec<Write>, Vec<Write>)> {
    let (cond, rev, old_tags) = match old {
        None => (Cond::NotExists, 1, Vec::new()),
        Some(item) => {
            let old_user: User = item.parse()?;
            match item.i64(REVISION) {
                Some(rev) => (Cond::eq(REVISION, rev), rev + 1, old_user.tags),
                None => (Cond::And(vec![Cond::Exists, Cond::AttrNotExists(REVISION.into())]), 1, old_user.tags),
            }
        }
    };
    let member = attrs_of(user)?;
    let mut attrs = member.clone();
    attrs.insert(REVISION.into(), rev.into());
    let removed: Vec<Write> = old_tags
        .iter()
        .filter(|tag| !user.tags.contains(tag))
        .map(|tag| Write::Delete { key: keys::tag_member(t, tag, &user.user_id), cond: Cond::Always })
        .collect();
    let mut writes = vec![Write::Put { item: Item::new(keys::user(t, &user.user_id), attrs), cond }];
    // Its entry in the tenant's users list, with it (`crate::lists`).
    writes.push(entry_write(t, user)?);
    writes.extend(user.tags.iter().map(|tag| Write::Put {
        item: Item::new(keys::tag_member(t, tag, &user.user_id), member.clone()),
        cond: Cond::Always,
    }));
    Ok((writes, removed))
}

/// The most users one batch takes (`POST /v1/users/batch`; docs/people.md, "Importing users").
pub const MAX_BATCH_USERS: usize = 1000;

/// One user of a batch: the body of `PUT /v1/users/{id}` with its id.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchUser {
    pub user_id: String,
    pub email: Option<String>,
    pub phone: Option<String>,
    pub locale: Option<String>,
    pub timezone: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

impl BatchUser {
    /// The user at `index` of a batch from its JSON, or its error naming the field: a wrong
    /// type, an unknown field, no `user_id` (a batch reads each user on its own, so one such
    /// user does not refuse the others).
    pub fn from_json(index: usize, value: serde_json::Value) -> Result<BatchUser, BatchError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // serde names a missing or unknown field in its message, at the user's own path.
            let field = if inner.starts_with("missing field `user_id`") {
                "user_id".to_owned()
            } else if let Some(name) = inner.strip_prefix("unknown field `").and_then(|r| r.split('`').next()) {
                name.to_owned()
            } else {
                path
            };
            let detail = match inner.split_once(" at line ") {
                Some((head, _)) => head.to_owned(),
                None => inner,
            };
            BatchError::new(index, &field, detail)
        })
    }

    fn into_input(self) -> (String, UserInput) {
        let BatchUser { user_id, email, phone, locale, timezone, tags } = self;
        (user_id, UserInput { email, phone, locale, timezone, tags })
    }
}

/// A user of a batch that was not written, and why.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BatchError {
    /// The user's place in the batch, from 0.
    pub index: usize,
    /// The field at fault, as `users[3].email`.
    pub field: String,
    pub detail: String,
}

impl BatchError {
    /// The error of the user at `index` whose `field` (`email`, or `.` for the user as a whole)
    /// is at fault.
    pub fn new(index: usize, field: &str, detail: impl Into<String>) -> Self {
        let field = if field == "." || field.is_empty() {
            format!("users[{index}]")
        } else {
            format!("users[{index}].{field}")
        };
        Self { index, field, detail: detail.into() }
    }
}

/// What a batch did: `upserted` users stand as given (`unchanged` of them were so already and
/// were not written again); the others are in `errors`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BatchOutcome {
    pub upserted: usize,
    pub unchanged: usize,
    pub errors: Vec<BatchError>,
}

/// Whether the stored user holds what `user` says (contacts and tags; not when it was written).
/// The phone's country counts: a user stored before Tidings recorded it is written again.
fn same_contacts(stored: &User, user: &User) -> bool {
    stored.email == user.email
        && stored.phone == user.phone
        && stored.phone_country == user.phone_country
        && stored.locale == user.locale
        && stored.timezone == user.timezone
        && stored.tags == user.tags
}

/// Transactions of one batch written at once.
const CHUNKS_IN_FLIGHT: usize = 8;

/// Room left in a transaction for what is not counted exactly (DynamoDB's 4 MB, less a margin).
const BATCH_TRANSACTION_BYTES: usize = crate::sizes::MAX_TRANSACTION_BYTES - 64 * 1024;

/// Creates or replaces many users at once (`POST /v1/users/batch`, `tidings import`), each
/// checked by the rules of [`put_user`] and standing or falling alone: `users` are `(index,
/// user)`, the index being what an error names. A user whose stored contacts and tags are
/// already these (and who is in the users list) is not written again, so the same batch twice
/// writes nothing the second time. The others are written as [`put_user`] writes one (the user
/// over the revision read, its list entry, its tag memberships), several users to a transaction
/// up to its limits (docs/people.md, "Importing users"); a transaction that meets a concurrent
/// write of one of its users is written again user by user.
pub async fn put_users(deps: &Deps, t: &TenantId, users: Vec<(usize, BatchUser)>) -> CoreResult<BatchOutcome> {
    let mut outcome = BatchOutcome::default();
    let mut checked: Vec<User> = Vec::with_capacity(users.len());
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::with_capacity(users.len());
    for (index, batch_user) in users {
        let (user_id, mut input) = batch_user.into_input();
        let phone_country = match check_id("user_id", &user_id).and_then(|()| input.validate()) {
            Ok(country) => country,
            Err(CoreError::Invalid { field, detail }) => {
                outcome.errors.push(BatchError::new(index, &field, detail));
                continue;
            }
            Err(other) => return Err(other),
        };
        if let Some(first) = seen.get(&user_id) {
            outcome.errors.push(BatchError::new(
                index,
                "user_id",
                format!("the same user_id as users[{first}]: give each user once a batch"),
            ));
            continue;
        }
        seen.insert(user_id.clone(), index);
        checked.push(user_of(deps, &user_id, input, phone_country));
    }
    let mut read_keys = Vec::with_capacity(checked.len() * 2);
    for user in &checked {
        read_keys.push(keys::user(t, &user.user_id));
        read_keys.push(keys::user_entry(t, &user.user_id));
    }
    let read = deps.table.get_many(&read_keys).await?;
    let mut chunks: Vec<Vec<(User, Vec<Write>)>> = Vec::new();
    let mut chunk: Vec<(User, Vec<Write>)> = Vec::new();
    let (mut chunk_writes, mut chunk_bytes) = (0, 0);
    let mut alone: Vec<&User> = Vec::new();
    for (user, pair) in checked.iter().zip(read.chunks(2)) {
        let (stored, entry) = (pair.first().and_then(Option::as_ref), pair.get(1).and_then(Option::as_ref));
        if let Some(item) = stored
            && entry.is_some()
            && same_contacts(&item.parse::<User>()?, user)
        {
            outcome.unchanged += 1;
            continue;
        }
        let (mut writes, removed) = user_writes(t, user, stored)?;
        writes.extend(removed);
        if writes.len() > MAX_TRANSACTION_WRITES {
            alone.push(user);
            continue;
        }
        let bytes: usize = writes.iter().map(crate::sizes::write_size).sum();
        if !chunk.is_empty()
            && (chunk_writes + writes.len() > MAX_TRANSACTION_WRITES || chunk_bytes + bytes > BATCH_TRANSACTION_BYTES)
        {
            chunks.push(std::mem::take(&mut chunk));
            (chunk_writes, chunk_bytes) = (0, 0);
        }
        chunk_writes += writes.len();
        chunk_bytes += bytes;
        chunk.push((user.clone(), writes));
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    // The chunks hold different users' items, so they go at once: on the embedded backend one
    // sync then commits several of them, on DynamoDB their requests overlap.
    futures::stream::iter(chunks)
        .map(|chunk| write_chunk(deps, t, chunk))
        .buffer_unordered(CHUNKS_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    for user in alone {
        write_user(deps, t, user).await?;
    }
    outcome.upserted = checked.len();
    Ok(outcome)
}

/// Writes several users' writes in one transaction; when one of them was written meanwhile
/// (its revision moved), each is written again on its own, over what it is now.
async fn write_chunk(deps: &Deps, t: &TenantId, chunk: Vec<(User, Vec<Write>)>) -> CoreResult<()> {
    let writes: Vec<Write> = chunk.iter().flat_map(|(_, w)| w.iter().cloned()).collect();
    match deps.table.transact(writes).await {
        Ok(()) => Ok(()),
        Err(StoreError::ConditionFailed { .. }) => {
            for (user, _) in &chunk {
                write_user(deps, t, user).await?;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
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
        assert_eq!(input.validate().unwrap().as_deref(), Some("US"));
        assert_eq!(input.phone.as_deref(), Some("+14155550100"));
        let mut input = UserInput { phone: Some("+800 1234 5678".into()), ..UserInput::default() };
        assert_eq!(input.validate().unwrap(), None, "a code of no country");
        assert_eq!(UserInput::default().validate().unwrap(), None, "no phone");
        assert_eq!(e164("+8613800001234").as_deref(), Some("+8613800001234"));
    }
}
