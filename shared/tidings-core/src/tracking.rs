//! Tracking and one-click unsubscribe (seed 004 §5.7; RFC 8058).
//!
//! Links carry tokens signed by the shared [`crate::signing::Signer`] (HMAC-SHA256, expiry,
//! key id for rotation: `TIDINGS_SIGNING_KEYS`), each made for one purpose (`track.open`,
//! `track.click`, `unsubscribe`). Without a signing key no links are added.
//!
//! Opens and clicks are analytics: they are recorded off the request path (the handler answers
//! first), and never on the send path.

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::deps::{CoreConfig, Deps};
use crate::error::CoreResult;
use crate::ids::TenantId;
use crate::keys;
use crate::notify::model::{Category, ChannelTask, Delivery, DeliveryStatus};
use crate::notify::progress::{self, PAGE_ATTR, Transition};
use crate::ports::{Channel, Update};
use crate::preferences::{self, PreferencesInput};
pub use crate::signing::TokenError;

/// What a token is for (its purpose).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenKind {
    #[serde(rename = "o")]
    Open,
    #[serde(rename = "c")]
    Click,
    #[serde(rename = "u")]
    Unsubscribe,
}

impl TokenKind {
    pub fn purpose(self) -> &'static str {
        match self {
            TokenKind::Open => "track.open",
            TokenKind::Click => "track.click",
            TokenKind::Unsubscribe => "unsubscribe",
        }
    }
}

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub k: TokenKind,
    /// Tenant, notification, user, channel.
    pub t: String,
    pub n: String,
    pub u: String,
    pub c: Channel,
    /// The click's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

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
    Claims { k, t: task.tenant.clone(), n: task.notification_id.clone(), u: task.user_id.clone(), c: task.channel, url }
}

/// Adds tracking and unsubscribe to an email about to be queued: click links rewritten through
/// `/t/c/{token}`, an open pixel, and on marketing the `List-Unsubscribe` and
/// `List-Unsubscribe-Post: List-Unsubscribe=One-Click` headers (RFC 8058).
pub fn decorate_email(config: &CoreConfig, task: &mut ChannelTask, now_s: i64) {
    if !config.signer.is_configured() {
        return;
    }
    let base = config.public_url.trim_end_matches('/').to_owned();
    task.body = rewrite_links(&task.body, |url| {
        sign(config, &claims_for(task, TokenKind::Click, Some(url.to_owned())), OPEN_CLICK_DAYS, now_s)
            .map(|tok| format!("{base}/t/c/{tok}"))
    });
    if let Some(tok) = sign(config, &claims_for(task, TokenKind::Open, None), OPEN_CLICK_DAYS, now_s) {
        task.body.push_str(&format!("\n<img src=\"{base}/t/o/{tok}\" width=\"1\" height=\"1\" alt=\"\">"));
    }
    if task.category == Category::Marketing
        && let Some(tok) = sign(config, &claims_for(task, TokenKind::Unsubscribe, None), UNSUBSCRIBE_DAYS, now_s)
    {
        task.headers.push(("List-Unsubscribe".into(), format!("<{base}/u/{tok}>")));
        task.headers.push(("List-Unsubscribe-Post".into(), "List-Unsubscribe=One-Click".into()));
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

/// Records an open or a click on the delivery (`sent`/`delivered` → `opened` → `clicked`), with
/// its progress counters. Never fails the caller: it is analytics.
pub async fn record(deps: &Deps, claims: &Claims) {
    if let Err(e) = try_record(deps, claims).await {
        warn!(error = %e, "tracking event not recorded");
    }
}

async fn try_record(deps: &Deps, claims: &Claims) -> CoreResult<()> {
    let to = match claims.k {
        TokenKind::Open => DeliveryStatus::Opened,
        TokenKind::Click => DeliveryStatus::Clicked,
        TokenKind::Unsubscribe => return Ok(()),
    };
    let t = TenantId::parse(&claims.t)?;
    let key = keys::delivery(&t, &claims.n, &claims.u, claims.c);
    let Some(item) = deps.table.get(&key).await? else { return Ok(()) };
    let d: Delivery = item.parse()?;
    let rank = |s: DeliveryStatus| match s {
        DeliveryStatus::Sent | DeliveryStatus::Delivered => Some(0),
        DeliveryStatus::Opened => Some(1),
        DeliveryStatus::Clicked => Some(2),
        _ => None,
    };
    let (Some(from_rank), Some(to_rank)) = (rank(d.status), rank(to)) else { return Ok(()) };
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let now2 = now.clone();
    let at = if to == DeliveryStatus::Opened { "opened_at" } else { "clicked_at" };
    if from_rank >= to_rank {
        deps.table.update(&key, vec![Update::SetIfAbsent(at.into(), now2.into())], crate::ports::Cond::Exists).await?;
        return Ok(());
    }
    let moved = progress::transition(
        deps,
        Transition {
            t: &t,
            notification_id: &claims.n,
            user_id: &claims.u,
            page: item.i64(PAGE_ATTR).unwrap_or(0).max(0) as u64,
            key: &key,
            from: d.status,
            to,
            also: None,
            updates: vec![Update::SetIfAbsent(at.into(), now.into()), Update::set("updated_at", now2)],
        },
    )
    .await?;
    debug!(moved, status = to.as_str(), "tracking event");
    Ok(())
}

/// One-click unsubscribe: the user leaves marketing (every channel).
pub async fn unsubscribe(deps: &Deps, claims: &Claims) -> CoreResult<()> {
    let t = TenantId::parse(&claims.t)?;
    let input = PreferencesInput {
        categories: Some([("marketing".to_owned(), false)].into_iter().collect()),
        ..PreferencesInput::default()
    };
    preferences::put(deps, &t, &claims.u, input).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::Signer;

    fn config(spec: &str) -> CoreConfig {
        CoreConfig { signer: Signer::parse(spec), ..CoreConfig::default() }
    }

    fn claims(k: TokenKind) -> Claims {
        Claims {
            k,
            t: "acme".into(),
            n: "n1".into(),
            u: "u1".into(),
            c: Channel::Email,
            url: Some("https://shop.example/x?a=1&b=2".into()),
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
            tenant: "acme".into(),
            notification_id: "n1".into(),
            user_id: "u1".into(),
            channel: Channel::Email,
            category: Category::Marketing,
            to: "a@example.com".into(),
            subject: Some("Sale".into()),
            body: r#"<a href="https://shop.example/sale">Sale</a>"#.into(),
            headers: Vec::new(),
        };
        decorate_email(&c, &mut task, 0);
        assert!(task.body.contains("/t/c/"), "{}", task.body);
        assert!(task.body.contains("/t/o/"), "{}", task.body);
        let unsub = task.headers.iter().find(|(n, _)| n == "List-Unsubscribe").unwrap();
        assert!(unsub.1.starts_with("<http://127.0.0.1:8080/u/"), "{unsub:?}");
        assert!(task.headers.contains(&("List-Unsubscribe-Post".into(), "List-Unsubscribe=One-Click".into())));
        let tok = unsub.1.trim_start_matches("<http://127.0.0.1:8080/u/").trim_end_matches('>');
        assert_eq!(verify(&c, TokenKind::Unsubscribe, tok, 10).unwrap().u, "u1");
    }

    #[test]
    fn links_are_rewritten_but_not_mailto() {
        let out = rewrite_links(r#"<a href="https://a.example/?x=1&amp;y=2">a</a> <a href="mailto:x@y">m</a>"#, |u| {
            Some(format!("T[{u}]"))
        });
        assert_eq!(out, r#"<a href="T[https://a.example/?x=1&y=2]">a</a> <a href="mailto:x@y">m</a>"#);
    }
}
