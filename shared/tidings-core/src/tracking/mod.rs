//! Tracking and one-click unsubscribe (docs/tracking.md; RFC 8058).
//!
//! Links carry tokens signed by the shared [`crate::signing::Signer`] (HMAC-SHA256, expiry,
//! key id for rotation: `TIDINGS_SIGNING_KEYS`), each made for one purpose (`track.open`,
//! `track.click`, `unsubscribe`). Without a signing key no links are added.
//!
//! Opens and clicks are analytics, never on the send path. The route queues each one on the
//! timers queue before it answers (one queue send: [`queue`]), and the timers' handler applies
//! it ([`apply`]): nothing is left to run after the answer, which Lambda would freeze.
//!
//! A click goes through Tidings' own domain, so it only ever leads to a host the tenant
//! registered (`PUT /v1/settings/link-hosts`): a link to another host, say one a placeholder
//! brought in, is left as written, untracked, and the redirect checks the host again (a host
//! removed since the mail was sent no longer redirects). No hosts registered: no click
//! tracking.

pub mod claims;
pub mod receipts;

use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::deps::{CoreConfig, Deps};
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::keys;
use crate::notify::model::{Category, ChannelTask, Delivery, DeliveryStatus};
use crate::notify::progress::{self, Transition};
use crate::people::preferences;
use crate::ports::{Cond, Item, Update, attrs_of};
pub use crate::signing::TokenError;
pub use claims::{Claims, TokenKind};

/// Days a link stays valid: opens and clicks 90, unsubscribe a year (RFC 8058 asks that it keep
/// working for a long time).
const OPEN_CLICK_DAYS: i64 = 90;
const UNSUBSCRIBE_DAYS: i64 = 365;

/// Signs claims for their purpose, valid `days`; `None` without a signing key.
pub fn sign(config: &CoreConfig, claims: &Claims, days: i64, now_s: i64) -> Option<String> {
    config.signer.sign(claims.k.purpose(), claims, now_s + days * 86_400).ok()
}

/// Checks a token made for `kind`: signature, key id, purpose and expiry.
pub fn verify(config: &CoreConfig, kind: TokenKind, token: &str, now_s: i64) -> Result<Claims, TokenError> {
    let claims: Claims = config.signer.verify(kind.purpose(), token, now_s)?;
    if claims.k != kind {
        return Err(TokenError::WrongPurpose);
    }
    Ok(claims)
}

fn claims_for(task: &ChannelTask, k: TokenKind, url: Option<String>) -> Claims {
    Claims {
        k,
        t: task.tenant.clone(),
        n: task.notification_id.clone(),
        u: task.user_id.clone(),
        c: task.channel,
        url,
        s: task.step,
    }
}

/// The hosts a tenant's tracked links may lead to: `shop.example`, or `*.shop.example` for
/// every subdomain of it (not `shop.example` itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LinkHosts {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub updated_at: String,
}

/// The body of `PUT /v1/settings/link-hosts`: the whole list (it replaces the old one).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkHostsInput {
    pub hosts: Vec<String>,
}

/// At most this many hosts per tenant.
pub const MAX_LINK_HOSTS: usize = 100;

impl LinkHosts {
    /// Whether a link to `url` may be tracked (and redirected to): `http` or `https`, and its
    /// host one of the list.
    pub fn allows(&self, url: &str) -> bool {
        let Ok(parsed) = url::Url::parse(url) else { return false };
        let Some(host) = parsed.host_str().filter(|_| matches!(parsed.scheme(), "http" | "https")) else {
            return false;
        };
        self.hosts.iter().any(|h| match h.strip_prefix("*.") {
            Some(parent) => host.strip_suffix(parent).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == h,
        })
    }
}

/// A host name as the list takes it, lower case: `shop.example` or `*.shop.example`.
fn parse_host(field: &str, given: &str) -> CoreResult<String> {
    let bad = || CoreError::invalid(field, "not a host name such as shop.example or *.shop.example");
    let host = given.trim().to_ascii_lowercase();
    let name = host.strip_prefix("*.").unwrap_or(&host);
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() > 253 || labels.len() < 2 || !labels.iter().all(label_ok) {
        return Err(bad());
    }
    // What `url` makes of it must be the name itself (no IP address, no odd encodings).
    match url::Url::parse(&format!("https://{name}/")).ok().and_then(|u| u.host_str().map(str::to_owned)) {
        Some(parsed) if parsed == name && name.parse::<std::net::Ipv4Addr>().is_err() => Ok(host),
        _ => Err(bad()),
    }
}

/// Replaces the tenant's link hosts.
pub async fn put_link_hosts(deps: &Deps, t: &TenantId, input: LinkHostsInput) -> CoreResult<LinkHosts> {
    if input.hosts.len() > MAX_LINK_HOSTS {
        return Err(CoreError::invalid("hosts", format!("at most {MAX_LINK_HOSTS} hosts")));
    }
    let mut hosts = Vec::with_capacity(input.hosts.len());
    for (i, h) in input.hosts.iter().enumerate() {
        let host = parse_host(&format!("hosts[{i}]"), h)?;
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    let out = LinkHosts { hosts, updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true) };
    deps.table.put(Item::new(keys::link_hosts(t), attrs_of(&out)?), Cond::Always).await?;
    Ok(out)
}

/// The tenant's link hosts (none when never set).
pub async fn link_hosts(deps: &Deps, t: &TenantId) -> CoreResult<LinkHosts> {
    match deps.table.get(&keys::link_hosts(t)).await? {
        Some(item) => Ok(item.parse()?),
        None => Ok(LinkHosts::default()),
    }
}

/// The link hosts an orchestration needs: read only when its template has an email body and
/// links are signed at all.
pub async fn link_hosts_for(
    deps: &Deps,
    t: &TenantId,
    template: Option<&crate::templates::Template>,
) -> CoreResult<LinkHosts> {
    let has_email =
        template.is_some_and(|tpl| tpl.locales.values().any(|c| c.email_body.is_some() || c.email_html.is_some()));
    if has_email && deps.config.signer.is_configured() { link_hosts(deps, t).await } else { Ok(LinkHosts::default()) }
}

/// Adds tracking and unsubscribe to an email about to be queued: links to the tenant's hosts
/// rewritten through `/t/c/{token}` (others left as written) in both parts, bare URLs in the
/// text part and `href`s in the HTML part; an open pixel in the HTML part only (the text part
/// stays free of markup); and on marketing the `List-Unsubscribe` and
/// `List-Unsubscribe-Post: List-Unsubscribe=One-Click` headers (RFC 8058).
pub fn decorate_email(config: &CoreConfig, task: &mut ChannelTask, now_s: i64, hosts: &LinkHosts) {
    if !config.signer.is_configured() {
        return;
    }
    let base = config.public_url.trim_end_matches('/').to_owned();
    let click = |url: &str| {
        if !hosts.allows(url) {
            return None;
        }
        sign(config, &claims_for(task, TokenKind::Click, Some(url.to_owned())), OPEN_CLICK_DAYS, now_s)
            .map(|tok| format!("{base}/t/c/{tok}"))
    };
    let body = crate::templates::email::rewrite_text_links(&task.body, click);
    let mut html = task.html.as_deref().map(|h| rewrite_links(h, click));
    if let Some(html) = &mut html
        && let Some(tok) = sign(config, &claims_for(task, TokenKind::Open, None), OPEN_CLICK_DAYS, now_s)
    {
        let pixel = format!("<img src=\"{base}/t/o/{tok}\" width=\"1\" height=\"1\" alt=\"\">");
        *html = crate::templates::email::append_to_body(html, &pixel);
    }
    task.body = body;
    task.html = html;
    if task.category == Category::Marketing
        && let Some(tok) = sign(config, &claims_for(task, TokenKind::Unsubscribe, None), UNSUBSCRIBE_DAYS, now_s)
    {
        task.headers.push(("List-Unsubscribe".into(), format!("<{base}/u/{tok}>")));
        task.headers.push(("List-Unsubscribe-Post".into(), "List-Unsubscribe=One-Click".into()));
    }
    if task.category == Category::Marketing
        && let Some(tok) = sign(config, &claims_for(task, TokenKind::Preferences, None), UNSUBSCRIBE_DAYS, now_s)
    {
        add_preferences_link(task, &format!("{base}/p/{tok}"));
    }
}

/// The words before the preferences link at the foot of a marketing email.
pub const PREFERENCES_LINK_TEXT: &str = "Choose which messages you get";

/// Puts the hosted preferences page's link at the foot of both parts of a marketing email
/// (docs/site.md, "The hosted preferences page"). Added after the links are rewritten: it is
/// Tidings' own link, never a tracked one.
fn add_preferences_link(task: &mut ChannelTask, url: &str) {
    task.body = format!("{}\n\n--\n{PREFERENCES_LINK_TEXT}: {url}\n", task.body.trim_end());
    if let Some(html) = &task.html {
        let foot = format!(
            "<p style=\"font-size:12px;color:#666\"><a href=\"{}\">{PREFERENCES_LINK_TEXT}</a></p>",
            crate::templates::email::escape_attr(url)
        );
        task.html = Some(crate::templates::email::append_to_body(html, &foot));
    }
}

/// Rewrites every `href="http…"` target with `f` (kept as is when `f` gives nothing).
fn rewrite_links(body: &str, f: impl Fn(&str) -> Option<String>) -> String {
    const HREF: &str = "href=\"";
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(i) = rest.find(HREF) {
        let (head, tail) = rest.split_at(i + HREF.len());
        out.push_str(head);
        let end = tail.find('"').unwrap_or(tail.len());
        let url = &tail[..end];
        let decoded = url.replace("&amp;", "&");
        match (decoded.starts_with("http://") || decoded.starts_with("https://")).then(|| f(&decoded)).flatten() {
            Some(new) => out.push_str(&new),
            None => out.push_str(url),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Queues an open or a click (one message on the timers queue, due now) for [`apply`].
pub async fn queue(deps: &Deps, claims: &Claims) -> CoreResult<()> {
    let now = deps.clock.now();
    let task = crate::timers::task::TimerTask::Tracked { claims: claims.clone(), at_ms: now.timestamp_millis() };
    crate::timers::task::schedule(deps, now, task).await
}

/// Records an open or a click made at `at_ms` on the delivery (`sent`/`delivered` → `opened` →
/// `clicked`), with its progress counters. Idempotent: a repeat finds the delivery moved and
/// its time set.
pub async fn apply(deps: &Deps, claims: &Claims, at_ms: i64) -> CoreResult<()> {
    let to = match claims.k {
        TokenKind::Open => DeliveryStatus::Opened,
        TokenKind::Click => DeliveryStatus::Clicked,
        TokenKind::Unsubscribe | TokenKind::Preferences => return Ok(()),
    };
    let t = &claims.t;
    if to == DeliveryStatus::Clicked {
        // A click on a back-in-stock message counts for its SKUs (docs/restock.md, "What
        // alerts earn"); once per message, user and SKU, whatever the delivery's status.
        crate::restock::analytics::on_click(deps, t, &claims.n, &claims.u, at_ms).await?;
    }
    let key = keys::delivery_at(t, &claims.n, &claims.u, claims.c, claims.s);
    let rank = |s: DeliveryStatus| match s {
        DeliveryStatus::Sent | DeliveryStatus::Delivered => Some(0),
        DeliveryStatus::Opened => Some(1),
        DeliveryStatus::Clicked => Some(2),
        _ => None,
    };
    let at_time = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(at_ms).unwrap_or_else(|| deps.clock.now());
    let at_text = at_time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let at = if to == DeliveryStatus::Opened { "opened_at" } else { "clicked_at" };
    // An open and a click of one mail can be applied at once: the one that loses the status
    // race reads the delivery again (a few tries; the status only moves forward).
    for _ in 0..3 {
        let Some(item) = deps.table.get(&key).await? else { return Ok(()) };
        let d: Delivery = item.parse()?;
        let (Some(from_rank), Some(to_rank)) = (rank(d.status), rank(to)) else { return Ok(()) };
        if from_rank >= to_rank {
            deps.table.update(&key, vec![Update::SetIfAbsent(at.into(), at_text.into())], Cond::Exists).await?;
            return Ok(());
        }
        let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let moved = progress::transition(
            deps,
            Transition {
                t,
                notification_id: &claims.n,
                user_id: &claims.u,
                page: progress::page_of(&item),
                key: &key,
                from: d.status,
                to,
                also: None,
                updates: vec![Update::SetIfAbsent(at.into(), at_text.clone().into()), Update::set("updated_at", now)],
            },
        )
        .await?;
        debug!(moved, status = to.as_str(), "tracking event");
        if moved {
            return Ok(());
        }
    }
    Ok(())
}

/// One-click unsubscribe: the user leaves marketing (every channel). The link of an erased user
/// writes nothing and answers as if it worked, which is true: an erased user is sent nothing
/// (`erasure::stops_link`; docs/tracking.md).
pub async fn unsubscribe(deps: &Deps, claims: &Claims) -> CoreResult<()> {
    let t = &claims.t;
    if crate::people::erasure::stops_link(deps, t, &claims.u, &claims.n).await? {
        info!(tenant = %t, "unsubscribe link of an erased user: nothing written");
        return Ok(());
    }
    // A workflow's email: that workflow off on email, the rest as it was.
    if claims.s.is_some()
        && let Some(n) = crate::notify::api::load(deps, t, &claims.n).await?
        && let Some(w) = n.workflow
    {
        let off = preferences::WorkflowPreference::Channels([(claims.c.as_str().to_owned(), false)].into());
        let input =
            preferences::PreferencesInput { workflows: Some([(w.workflow_id, off)].into()), ..Default::default() };
        preferences::put(deps, t, &claims.u, input).await?;
        return Ok(());
    }
    preferences::leave_marketing(deps, t, &claims.u).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::Channel;
    use crate::signing::Signer;

    fn config(spec: &str) -> CoreConfig {
        CoreConfig { signer: Signer::parse(spec), ..CoreConfig::default() }
    }

    fn claims(k: TokenKind) -> Claims {
        Claims {
            k,
            t: TenantId::parse("acme").unwrap(),
            n: "n1".into(),
            u: "u1".into(),
            c: Channel::Email,
            url: Some("https://shop.example/x?a=1&b=2".into()),
            s: None,
        }
    }

    #[test]
    fn tokens_verify_expire_rotate_and_keep_their_purpose() {
        let c = config("k1:secret-one");
        let tok = sign(&c, &claims(TokenKind::Click), 1, 0).unwrap();
        assert_eq!(verify(&c, TokenKind::Click, &tok, 10).unwrap(), claims(TokenKind::Click));
        assert_eq!(verify(&c, TokenKind::Click, &tok, 86_401), Err(TokenError::Expired));
        // A click token is no unsubscribe token.
        assert!(verify(&c, TokenKind::Unsubscribe, &tok, 10).is_err());
        // Rotation: a new key signs, the old one still verifies; dropped, refused.
        assert!(verify(&config("k2:secret-two,k1:secret-one"), TokenKind::Click, &tok, 10).is_ok());
        assert!(verify(&config("k2:secret-two"), TokenKind::Click, &tok, 10).is_err());
        // No key: nothing signed.
        assert!(sign(&CoreConfig::default(), &claims(TokenKind::Open), 1, 0).is_none());
    }

    #[test]
    fn marketing_email_gets_one_click_unsubscribe_headers_and_tracking() {
        let c = config("k1:secret-one");
        let mut task = ChannelTask {
            tenant: TenantId::parse("acme").unwrap(),
            notification_id: "n1".into(),
            user_id: "u1".into(),
            channel: Channel::Email,
            category: Category::Marketing,
            to: "a@example.com".into(),
            subject: Some("Sale".into()),
            body: "Sale: https://shop.example/sale".into(),
            html: Some(r#"<a href="https://shop.example/sale">Sale</a>"#.into()),
            headers: Vec::new(),
            accepted_ms: None,
            priority: None,
            one_attempt: false,
            step: None,
            wake: false,
        };
        let hosts = LinkHosts { hosts: vec!["shop.example".into()], ..LinkHosts::default() };
        decorate_email(&c, &mut task, 0, &hosts);
        let html = task.html.clone().unwrap_or_default();
        assert!(html.contains("/t/c/") && task.body.contains("/t/c/"), "{html} / {}", task.body);
        assert!(html.contains("/t/o/"), "{html}");
        let unsub = task.headers.iter().find(|(n, _)| n == "List-Unsubscribe").unwrap();
        assert!(unsub.1.starts_with("<http://127.0.0.1:8080/u/"), "{unsub:?}");
        assert!(task.headers.contains(&("List-Unsubscribe-Post".into(), "List-Unsubscribe=One-Click".into())));
        let tok = unsub.1.trim_start_matches("<http://127.0.0.1:8080/u/").trim_end_matches('>');
        assert_eq!(verify(&c, TokenKind::Unsubscribe, tok, 10).unwrap().u, "u1");
        // The hosted preferences page, at the foot of both parts, signed for that page only.
        let at = task.body.find("http://127.0.0.1:8080/p/").expect("the text part links the page");
        let page = task.body[at..].trim_end();
        assert!(task.body[..at].ends_with(&format!("{PREFERENCES_LINK_TEXT}: ")), "{}", task.body);
        assert!(html.contains(&format!("<a href=\"{page}\">{PREFERENCES_LINK_TEXT}</a>")), "{html}");
        let ptok = page.trim_start_matches("http://127.0.0.1:8080/p/");
        let claims = verify(&c, TokenKind::Preferences, ptok, 10).unwrap();
        assert_eq!((claims.t.as_str(), claims.u.as_str()), ("acme", "u1"));
        assert!(verify(&c, TokenKind::Unsubscribe, ptok, 10).is_err(), "a page token unsubscribes no one");
        assert!(verify(&c, TokenKind::Preferences, tok, 10).is_err(), "an unsubscribe token opens no page");
    }

    #[test]
    fn only_links_to_the_tenants_hosts_are_tracked() {
        let c = config("k1:secret-one");
        let mut task = ChannelTask {
            tenant: TenantId::parse("acme").unwrap(),
            notification_id: "n1".into(),
            user_id: "u1".into(),
            channel: Channel::Email,
            category: Category::Transactional,
            to: "a@example.com".into(),
            subject: None,
            body: "o https://shop.example/o/1 x https://evil.example/x y https://shop.example@evil.example/".into(),
            html: Some(r#"<a href="https://shop.example/o/1">o</a> <a href="https://evil.example/x">x</a> <a href="https://shop.example@evil.example/">y</a>"#.into()),
            headers: Vec::new(),
            accepted_ms: None,
            priority: None,
            one_attempt: false,
            step: None,
            wake: false,
        };
        let hosts = LinkHosts { hosts: vec!["shop.example".into()], ..LinkHosts::default() };
        decorate_email(&c, &mut task, 0, &hosts);
        let html = task.html.clone().unwrap_or_default();
        assert_eq!(html.matches("/t/c/").count(), 1, "{html}");
        assert!(html.contains(r#"href="https://evil.example/x""#), "{html}");
        assert!(html.contains(r#"href="https://shop.example@evil.example/""#), "{html}");
        assert_eq!(task.body.matches("/t/c/").count(), 1, "{}", task.body);
        assert!(task.body.contains(" https://evil.example/x "), "{}", task.body);
        assert!(task.body.ends_with(" https://shop.example@evil.example/"), "{}", task.body);
        assert!(!task.body.contains("/p/") && !html.contains("/p/"), "a transactional email has no preferences link");
    }

    fn email_task(body: &str, html: &str) -> ChannelTask {
        ChannelTask {
            tenant: TenantId::parse("acme").unwrap(),
            notification_id: "n1".into(),
            user_id: "u1".into(),
            channel: Channel::Email,
            category: Category::Transactional,
            to: "a@example.com".into(),
            subject: Some("Order".into()),
            body: body.into(),
            html: Some(html.into()),
            headers: Vec::new(),
            accepted_ms: None,
            priority: None,
            one_attempt: false,
            step: None,
            wake: false,
        }
    }

    /// The open pixel goes into the HTML part only, before its `</body>`; a click link is
    /// rewritten in both parts to the same signed redirect; the text part holds no markup.
    #[test]
    fn the_pixel_goes_only_into_the_html_part_and_links_are_rewritten_in_both() {
        let c = config("k1:secret-one");
        let hosts = LinkHosts { hosts: vec!["shop.example".into()], ..LinkHosts::default() };
        let mut task = email_task(
            "Your order: https://shop.example/o/1?a=1&b=2.\n\nThanks",
            r#"<html><body><p>Your <a href="https://shop.example/o/1?a=1&amp;b=2">order</a>.</p></body></html>"#,
        );
        decorate_email(&c, &mut task, 0, &hosts);
        let html = task.html.clone().unwrap_or_default();
        assert!(!crate::templates::email::has_markup(&task.body), "{}", task.body);
        assert!(!task.body.contains("/t/o/"), "no pixel in the text part: {}", task.body);
        assert_eq!(html.matches("/t/o/").count(), 1, "{html}");
        assert!(html.ends_with("alt=\"\">\n</body></html>"), "{html}");
        let in_text = task.body.split("Your order: ").nth(1).unwrap().split(".\n").next().unwrap().to_owned();
        assert!(in_text.starts_with("http://127.0.0.1:8080/t/c/"), "{}", task.body);
        let in_html = html.split("href=\"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(in_text, in_html, "one redirect for one link");
        let tok = in_text.trim_start_matches("http://127.0.0.1:8080/t/c/");
        assert_eq!(
            verify(&c, TokenKind::Click, tok, 10).unwrap().url.as_deref(),
            Some("https://shop.example/o/1?a=1&b=2")
        );
        // Without a signing key nothing is added to either part.
        let mut plain = email_task("https://shop.example/o/1", r#"<a href="https://shop.example/o/1">o</a>"#);
        decorate_email(&CoreConfig::default(), &mut plain, 0, &hosts);
        assert_eq!(plain, email_task("https://shop.example/o/1", r#"<a href="https://shop.example/o/1">o</a>"#));
    }

    #[test]
    fn hosts_match_exactly_or_by_subdomain_wildcard() {
        let h = LinkHosts { hosts: vec!["shop.example".into(), "*.cdn.example".into()], ..LinkHosts::default() };
        assert!(h.allows("https://shop.example/a?b=1"));
        assert!(h.allows("http://SHOP.example:8443/a"));
        assert!(h.allows("https://img.cdn.example/x.png"));
        assert!(!h.allows("https://cdn.example/x.png"));
        assert!(!h.allows("https://evilcdn.example/"));
        assert!(!h.allows("https://shop.example.evil.test/"));
        assert!(!h.allows("https://shop.example@evil.test/"));
        assert!(!h.allows("javascript://shop.example/%0aalert(1)"));
        assert!(!LinkHosts::default().allows("https://shop.example/"));
        for bad in [
            "https://shop.example",
            "shop",
            "shop.example/path",
            "10.0.0.1",
            "*.",
            "a..b",
            "-a.example",
            "shop.example:80",
        ] {
            assert!(parse_host("hosts[0]", bad).is_err(), "{bad}");
        }
        assert_eq!(parse_host("hosts[0]", " Shop.Example ").unwrap(), "shop.example");
        assert_eq!(parse_host("hosts[0]", "*.cdn.example").unwrap(), "*.cdn.example");
    }

    #[test]
    fn links_are_rewritten_but_not_mailto() {
        let out = rewrite_links(r#"<a href="https://a.example/?x=1&amp;y=2">a</a> <a href="mailto:x@y">m</a>"#, |u| {
            Some(format!("T[{u}]"))
        });
        assert_eq!(out, r#"<a href="T[https://a.example/?x=1&y=2]">a</a> <a href="mailto:x@y">m</a>"#);
    }
}
