//! Locations (docs/inventory.md, "Locations and markets"): where stock is, which markets each
//! serves and in what priority orders are held there. A small record per location of a tenant
//! (`T#t#LOCATIONS` / `{location}`); a shop that never defined one has `default`, which serves
//! every market and comes first.

use serde::{Deserialize, Serialize};

use super::keys;
use super::model::{DEFAULT_LOCATION, is_default_location};
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::{Cond, Item, QueryOpts, StoreError, Write, attrs_of};

/// The most locations a tenant may define (each SKU's cells over every location must fit one
/// transaction with room to spare: 16 default shards + 50 locations + 2 < 100).
pub const MAX_LOCATIONS: usize = 50;
/// The most markets one location may serve.
pub const MAX_MARKETS: usize = 250;
/// Priorities are `-PRIORITY_RANGE..=PRIORITY_RANGE`; lower is held from first.
pub const PRIORITY_RANGE: i64 = 1_000_000;
/// How often a replacement is tried again after another changed the location meanwhile.
const PUT_ATTEMPTS: usize = 16;
/// The longest location name.
pub const MAX_NAME: usize = 200;

/// The body of `PUT /v1/locations/{location_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocationRequest {
    pub name: String,
    /// The markets it serves: ISO 3166-1 alpha-2 codes, upper case (`US`, `CA`).
    pub markets: Vec<String>,
    /// Lower is held from first (ties by location id).
    pub priority: i64,
}

/// A location as stored and shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Location {
    pub location_id: String,
    pub name: String,
    pub markets: Vec<String>,
    pub priority: i64,
    /// True for the `default` location of a shop that never defined it: it serves every
    /// market and comes before every other location.
    #[serde(default)]
    pub implicit: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub updated_at: String,
}

impl Location {
    fn implicit_default() -> Self {
        Location {
            location_id: DEFAULT_LOCATION.to_owned(),
            name: "Default".to_owned(),
            markets: Vec::new(),
            priority: 0,
            implicit: true,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    /// Whether an order for `market` (`None`: any) may be held here.
    pub fn serves(&self, market: Option<&str>) -> bool {
        match market {
            None => true,
            Some(m) => self.implicit || self.markets.iter().any(|x| x == m),
        }
    }
}

/// `GET /v1/locations`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LocationList {
    /// In the order orders are held from them (no market): `default` first, then by priority.
    pub items: Vec<Location>,
}

/// Checks a market code: two upper-case ASCII letters (ISO 3166-1 alpha-2).
pub fn check_market(field: &str, m: &str) -> CoreResult<()> {
    if m.len() == 2 && m.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(CoreError::invalid(field, "must be an ISO 3166-1 alpha-2 code in upper case (e.g. US)"))
    }
}

fn validate(req: &LocationRequest) -> CoreResult<()> {
    let name = req.name.trim();
    if name.is_empty() || req.name.chars().count() > MAX_NAME {
        return Err(CoreError::invalid("name", format!("must be 1 to {MAX_NAME} characters, not blank")));
    }
    if req.markets.len() > MAX_MARKETS {
        return Err(CoreError::invalid("markets", format!("at most {MAX_MARKETS} markets")));
    }
    for (i, m) in req.markets.iter().enumerate() {
        check_market(&format!("markets[{i}]"), m)?;
        if req.markets[..i].contains(m) {
            return Err(CoreError::invalid(format!("markets[{i}]"), "each market may appear once"));
        }
    }
    if !(-PRIORITY_RANGE..=PRIORITY_RANGE).contains(&req.priority) {
        return Err(CoreError::invalid("priority", format!("must be -{PRIORITY_RANGE} to {PRIORITY_RANGE}")));
    }
    Ok(())
}

async fn stored(deps: &Deps, t: &TenantId) -> CoreResult<Vec<Location>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page =
            deps.table.query(&keys::locations_pk(t), "", QueryOpts { limit: 1000, cursor, descending: false }).await?;
        for item in &page.items {
            out.push(item.parse()?);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(out);
        }
    }
}

/// Every location of the tenant, `default` included (implicit when never defined), in the order
/// an order without a market is held from them: `default` first, then by priority, then id.
pub async fn all(deps: &Deps, t: &TenantId) -> CoreResult<Vec<Location>> {
    let mut locations = stored(deps, t).await?;
    if !locations.iter().any(|l| is_default_location(&l.location_id)) {
        locations.push(Location::implicit_default());
    }
    locations.sort_by(|a, b| {
        let key = |l: &Location| (!is_default_location(&l.location_id), l.priority, l.location_id.clone());
        key(a).cmp(&key(b))
    });
    Ok(locations)
}

/// The locations an order for `market` is held at, in the order it is held from them.
pub(crate) fn serving(all: &[Location], market: Option<&str>) -> Vec<String> {
    let mut out: Vec<&Location> = all.iter().filter(|l| l.serves(market)).collect();
    if market.is_some() {
        out.sort_by(|a, b| (!a.implicit, a.priority, &a.location_id).cmp(&(!b.implicit, b.priority, &b.location_id)));
    }
    out.into_iter().map(|l| l.location_id.clone()).collect()
}

/// For each market a location in `touched` serves (the implicit `default`: every market some
/// location names), the locations serving it: a change that adds stock there opens a restock
/// round when one of these groups had none available (docs/restock.md, "Markets").
pub(crate) fn market_groups(all: &[Location], touched: &[&str]) -> Vec<Vec<String>> {
    let named: std::collections::BTreeSet<&str> =
        all.iter().flat_map(|l| l.markets.iter().map(String::as_str)).collect();
    let mut markets = std::collections::BTreeSet::new();
    for l in all.iter().filter(|l| touched.contains(&l.location_id.as_str())) {
        markets.extend(named.iter().copied().filter(|m| l.serves(Some(m))));
    }
    markets.into_iter().map(|m| serving(all, Some(m))).collect()
}

/// The market groups of a change that adds stock at one location ([`market_groups`]), read at
/// most once however often the change is tried again (a conflict retries its transaction, not
/// the tenant's locations).
pub(crate) struct MarketsOf<'a> {
    deps: &'a Deps,
    t: &'a TenantId,
    location: &'a str,
    read: Option<Vec<Vec<String>>>,
}

impl<'a> MarketsOf<'a> {
    pub(crate) fn new(deps: &'a Deps, t: &'a TenantId, location: &'a str) -> Self {
        Self { deps, t, location, read: None }
    }

    pub(crate) async fn get(&mut self) -> CoreResult<Vec<Vec<String>>> {
        if let Some(groups) = &self.read {
            return Ok(groups.clone());
        }
        let groups = market_groups(&all(self.deps, self.t).await?, &[self.location]);
        self.read = Some(groups.clone());
        Ok(groups)
    }
}

/// Whether `location` exists for the tenant (`default` always does).
pub async fn exists(deps: &Deps, t: &TenantId, location: &str) -> CoreResult<bool> {
    if is_default_location(location) {
        return Ok(true);
    }
    Ok(deps.table.get(&keys::location(t, location)).await?.is_some())
}

/// `PUT /v1/locations/{location_id}`: creates (true) or replaces (false) a location.
pub async fn put(deps: &Deps, t: &TenantId, location_id: &str, req: &LocationRequest) -> CoreResult<(Location, bool)> {
    check_id("location_id", location_id)?;
    validate(req)?;
    let key = keys::location(t, location_id);
    let at = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    for _ in 0..PUT_ATTEMPTS {
        let existing: Option<Location> = match deps.table.get(&key).await? {
            Some(item) => Some(item.parse()?),
            None => None,
        };
        if existing.is_none() && stored(deps, t).await?.len() >= MAX_LOCATIONS {
            return Err(CoreError::invalid("location_id", format!("at most {MAX_LOCATIONS} locations per shop")));
        }
        let location = Location {
            location_id: location_id.to_owned(),
            name: req.name.trim().to_owned(),
            markets: req.markets.clone(),
            priority: req.priority,
            implicit: false,
            created_at: existing.as_ref().map_or_else(|| at.clone(), |e| e.created_at.clone()),
            updated_at: at.clone(),
        };
        let cond = match &existing {
            None => Cond::NotExists,
            Some(e) => Cond::eq("updated_at", e.updated_at.clone()),
        };
        match deps.table.transact(vec![Write::Put { item: Item::new(key.clone(), attrs_of(&location)?), cond }]).await {
            Ok(()) => return Ok((location, existing.is_none())),
            Err(StoreError::ConditionFailed { .. } | StoreError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflict.into())
}
