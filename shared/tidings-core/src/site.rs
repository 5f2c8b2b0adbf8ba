//! The shop's own site (docs/site.md): the origins whose pages may call the user-token routes
//! (`/v1/me/*`, answered with CORS only for them), and what a preference centre shows: the
//! user's preferences beside the tenant's workflows and the channels, required workflows
//! marked so that a page locks them.

use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys;
use crate::notify::model::Category;
use crate::people::preferences::{self, Preferences, PreferencesInput, WorkflowPreference};
use crate::ports::{Channel, Cond, Item, attrs_of};
use crate::workflows;

/// The origins (`https://shop.example`, `http://localhost:8080`) whose pages get CORS answers
/// from the tenant's `/v1/me` routes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AllowedOrigins {
    #[serde(default)]
    pub origins: Vec<String>,
    #[serde(default)]
    pub updated_at: String,
}

/// The body of `PUT /v1/settings/allowed-origins`: the whole list (it replaces the old one).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowedOriginsInput {
    /// Scheme, host and optional port, as a browser sends them in `Origin`: no path, no
    /// wildcard. `https://shop.example`, `http://localhost:8080`.
    pub origins: Vec<String>,
}

/// At most this many origins per tenant.
pub const MAX_ORIGINS: usize = 50;

impl AllowedOrigins {
    /// Whether a request's `Origin` header is one of the list (compared in the form the list
    /// keeps: lower case, without a default port).
    pub fn allows(&self, origin: &str) -> bool {
        parse_origin("Origin", origin).is_ok_and(|o| self.origins.contains(&o))
    }
}

/// An origin as the list keeps it: `http` or `https`, a host name (or `localhost`, or an IPv4
/// address), an optional port other than the scheme's default; lower case. A trailing `/` is
/// dropped; any other path, a query, user info or a `*` is refused naming `field`.
pub fn parse_origin(field: &str, given: &str) -> CoreResult<String> {
    let bad = |why: &str| {
        CoreError::invalid(
            field,
            format!(
                "{why}: an origin is a scheme, a host and an optional port, such as https://shop.example or http://localhost:8080"
            ),
        )
    };
    let text = given.trim();
    let text = text.strip_suffix('/').unwrap_or(text);
    if text.contains('*') {
        return Err(bad("no wildcards"));
    }
    let Some((scheme, rest)) = text.split_once("://") else { return Err(bad("no scheme")) };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    if rest.contains(['/', '?', '#', '@', '\\']) || rest.chars().any(char::is_whitespace) {
        return Err(bad("no path, query, fragment or user info"));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => {
            let port: u16 = p.parse().ok().filter(|p| *p > 0).ok_or_else(|| bad("the port must be 1 to 65535"))?;
            (h, Some(port))
        }
        None => (rest, None),
    };
    let host = host.to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(bad("not a host name"));
    }
    let default_port = if scheme == "https" { 443 } else { 80 };
    Ok(match port {
        Some(p) if p != default_port => format!("{scheme}://{host}:{p}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// Replaces the tenant's allowed origins.
pub async fn put_allowed_origins(deps: &Deps, t: &TenantId, input: AllowedOriginsInput) -> CoreResult<AllowedOrigins> {
    if input.origins.len() > MAX_ORIGINS {
        return Err(CoreError::invalid("origins", format!("at most {MAX_ORIGINS} origins")));
    }
    let mut origins = Vec::with_capacity(input.origins.len());
    for (i, o) in input.origins.iter().enumerate() {
        let origin = parse_origin(&format!("origins[{i}]"), o)?;
        if !origins.contains(&origin) {
            origins.push(origin);
        }
    }
    let out =
        AllowedOrigins { origins, updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true) };
    deps.table.put(Item::new(keys::allowed_origins(t), attrs_of(&out)?), Cond::Always).await?;
    Ok(out)
}

/// The tenant's allowed origins (none when never set: no page of any origin gets a CORS answer).
pub async fn allowed_origins(deps: &Deps, t: &TenantId) -> CoreResult<AllowedOrigins> {
    match deps.table.get(&keys::allowed_origins(t)).await? {
        Some(item) => Ok(item.parse()?),
        None => Ok(AllowedOrigins::default()),
    }
}

/// Whether the live feed's WebSocket handshake may go on from `origin` (a browser's `Origin`
/// header) for tenant `t`. A WebSocket is not covered by CORS, so the handshake checks the
/// origin itself, once the tenant has a list: a tenant without allowed origins keeps the feed
/// open to any page holding a token (as before lists existed); with a list, a browser page of
/// another origin is refused. No `Origin` (not a browser): admitted.
pub async fn feed_origin_admitted(deps: &Deps, t: &TenantId, origin: Option<&str>) -> CoreResult<bool> {
    let Some(origin) = origin else { return Ok(true) };
    let list = allowed_origins(deps, t).await?;
    Ok(list.origins.is_empty() || list.allows(origin))
}

/// A workflow as a preference centre shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WorkflowChoice {
    pub workflow_id: String,
    pub name: String,
    pub category: Category,
    /// No preference stops it (OTPs, security): show it locked, on.
    pub required: bool,
    /// The channels its send steps use, in the order of `CatalogChannels`.
    pub channels: Vec<Channel>,
}

/// A category as a preference centre shows it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct CategoryChoice {
    /// `transactional` or `marketing`.
    pub category: String,
    /// Cannot be turned off (transactional: password resets, one-time codes; a user turns a
    /// channel off instead): show it locked, on.
    pub required: bool,
}

/// What the user may choose from: every channel, every category, the tenant's workflows.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PreferenceCatalog {
    pub channels: Vec<Channel>,
    pub categories: Vec<CategoryChoice>,
    pub workflows: Vec<WorkflowChoice>,
}

/// `GET|PUT /v1/me/preferences`: the user's preferences exactly as
/// `GET /v1/users/{user_id}/preferences` answers them, and beside them the `catalog`.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct MyPreferences {
    #[serde(flatten)]
    pub preferences: Preferences,
    pub catalog: PreferenceCatalog,
}

/// At most this many workflows are listed in a catalog.
pub const MAX_CATALOG_WORKFLOWS: usize = 200;

/// The tenant's catalog: its workflows in id order (at most [`MAX_CATALOG_WORKFLOWS`]).
pub async fn catalog(deps: &Deps, t: &TenantId) -> CoreResult<PreferenceCatalog> {
    let mut choices = Vec::new();
    let mut cursor = None;
    loop {
        let page = workflows::list(deps, t, 100, cursor).await?;
        for summary in page.items {
            if choices.len() >= MAX_CATALOG_WORKFLOWS {
                break;
            }
            let mut channels = Vec::new();
            if let Some(w) = workflows::get_workflow(deps, t, &summary.workflow_id).await? {
                for (_, _, chs) in workflows::definition::sends(&w.steps) {
                    channels.extend(chs);
                }
            }
            choices.push(WorkflowChoice {
                workflow_id: summary.workflow_id,
                name: summary.name,
                category: summary.category,
                required: summary.required,
                channels: Channel::ALL.into_iter().filter(|c| channels.contains(c)).collect(),
            });
        }
        cursor = page.next_cursor;
        if cursor.is_none() || choices.len() >= MAX_CATALOG_WORKFLOWS {
            break;
        }
    }
    Ok(PreferenceCatalog {
        channels: Channel::ALL.to_vec(),
        categories: preferences::CATEGORIES
            .iter()
            .map(|c| CategoryChoice { category: (*c).to_owned(), required: *c == "transactional" })
            .collect(),
        workflows: choices,
    })
}

/// The user's preferences with the catalog.
pub async fn my_preferences(deps: &Deps, t: &TenantId, user_id: &str) -> CoreResult<MyPreferences> {
    let preferences = preferences::get(deps, t, user_id).await?;
    Ok(MyPreferences { preferences, catalog: catalog(deps, t).await? })
}

/// A change the user makes on their own (`PUT /v1/me/preferences`, the hosted page): the same
/// body as the tenant's route, but a required workflow cannot be turned off (422 naming
/// `workflows.{id}`), as no preference would stop it anyway.
pub async fn put_my_preferences(
    deps: &Deps,
    t: &TenantId,
    user_id: &str,
    input: PreferencesInput,
) -> CoreResult<MyPreferences> {
    let catalog = catalog(deps, t).await?;
    if let Some(wfs) = &input.workflows {
        for (id, pref) in wfs {
            let off = match pref {
                WorkflowPreference::All(on) => !on,
                WorkflowPreference::Channels(map) => map.values().any(|on| !on),
            };
            if off && catalog.workflows.iter().any(|w| &w.workflow_id == id && w.required) {
                return Err(CoreError::invalid(
                    format!("workflows.{id}"),
                    "this workflow is required (security, one-time codes): it cannot be turned off",
                ));
            }
        }
    }
    let preferences = preferences::put(deps, t, user_id, input).await?;
    Ok(MyPreferences { preferences, catalog })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_kept_in_the_form_a_browser_sends() {
        assert_eq!(parse_origin("o", "https://Shop.Example").unwrap(), "https://shop.example");
        assert_eq!(parse_origin("o", "https://shop.example/").unwrap(), "https://shop.example");
        assert_eq!(parse_origin("o", "https://shop.example:443").unwrap(), "https://shop.example");
        assert_eq!(parse_origin("o", "http://localhost:8080").unwrap(), "http://localhost:8080");
        assert_eq!(parse_origin("o", "http://127.0.0.1:80").unwrap(), "http://127.0.0.1");
        assert_eq!(parse_origin("o", "https://shop.example:8443").unwrap(), "https://shop.example:8443");
    }

    #[test]
    fn an_origin_with_a_path_a_wildcard_or_another_scheme_is_refused_naming_the_field() {
        for bad in [
            "https://shop.example/path",
            "https://*.shop.example",
            "*",
            "null",
            "ftp://shop.example",
            "shop.example",
            "https://user@shop.example",
            "https://shop.example?x=1",
            "https://shop.example:0",
            "https://shop.example:99999",
            "https://",
            "https://-bad.example",
            "https://shop..example",
        ] {
            match parse_origin("origins[3]", bad) {
                Err(CoreError::Invalid { field, .. }) => assert_eq!(field, "origins[3]", "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn allows_compares_the_browser_form() {
        let list = AllowedOrigins { origins: vec!["https://shop.example".into()], updated_at: String::new() };
        assert!(list.allows("https://shop.example"));
        assert!(list.allows("https://SHOP.example:443"));
        assert!(!list.allows("https://shop.example:8443"));
        assert!(!list.allows("http://shop.example"));
        assert!(!list.allows("https://evil.example"));
        assert!(!list.allows("null"));
    }
}
