//! The local operator console (`tidings serve` only, with the `/dev` routes): one static page
//! and the charting library it plots with, vendored (`src/console/`, uPlot, MIT) and compiled
//! into the binary, so the page needs neither a build step nor any other site. The page calls
//! the API with the keys it is opened with (docs/operators.md, "The operator console"). These are files,
//! not API operations: they are not in `/openapi.json`.

use std::sync::LazyLock;

use axum::Router;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::state::AppState;

const PAGE: &str = include_str!("../console.html");
const UPLOT_JS: &str = include_str!("../console/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../console/uPlot.min.css");

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(page))
        .route("/console/uPlot.iife.min.js", get(|| async { asset("text/javascript; charset=utf-8", UPLOT_JS) }))
        .route("/console/uPlot.min.css", get(|| async { asset("text/css; charset=utf-8", UPLOT_CSS) }))
}

/// The page's Content-Security-Policy: its own inline script and style by their hashes (so an
/// injected one does not run), the vendored library from this server, calls to this server only,
/// and no framing: a page that framed the console could make its redrive and resend buttons
/// the target of a click the operator meant for something else (docs/operators.md, "The
/// console").
static POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src 'self'{}; style-src 'self'{}; connect-src 'self'; img-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        inline_hashes(PAGE, "<script>", "</script>"),
        inline_hashes(PAGE, "<style>", "</style>"),
    )
});

/// `'sha256-…'` of every block between `open` and `close`: what CSP allows inline by content.
fn inline_hashes(page: &str, open: &str, close: &str) -> String {
    let mut hashes = String::new();
    let mut rest = page;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(close) else { break };
        let digest = Sha256::digest(&after.as_bytes()[..end]);
        hashes.push_str(&format!(" 'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest)));
        rest = &after[end + close.len()..];
    }
    hashes
}

/// The page. It reads its keys from the URL's fragment, which browsers never send: no key
/// reaches this server's logs by opening the link.
async fn page() -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        [(header::CONTENT_SECURITY_POLICY, POLICY.as_str())],
        Html(PAGE),
    )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=3600"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn response(uri: &str) -> axum::response::Response {
        super::router()
            .with_state(crate::AppState::of(crate::test_support::memory_deps()))
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn headers_of(uri: &str) -> axum::http::HeaderMap {
        response(uri).await.headers().clone()
    }

    /// Clickjacking and injected code: the page may not be framed, and runs only its own inline
    /// script and style (by hash) and this server's files. The hashes are of the page as
    /// served, so an edit of the page keeps its policy right; a new inline handler would not
    /// run, which the browser test (`tests/e2e/console.rs`) would show.
    #[tokio::test]
    async fn the_page_refuses_framing_and_runs_only_its_own_code() {
        use base64::Engine as _;
        use sha2::Digest as _;
        let h = headers_of("/").await;
        let csp = h.get("content-security-policy").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        for directive in ["frame-ancestors 'none'", "default-src 'none'", "connect-src 'self'", "base-uri 'none'"] {
            assert!(csp.contains(directive), "{directive} in {csp:?}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
        let (_, _, page) = get("/").await;
        let script = page.split("<script>").nth(1).and_then(|s| s.split("</script>").next()).unwrap();
        let digest = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script.as_bytes()));
        let script_src = csp.split(';').find(|d| d.trim().starts_with("script-src")).unwrap();
        assert!(script_src.contains(&format!("'sha256-{digest}'")), "the inline script is allowed: {csp}");
        assert_eq!(page.matches("<script>").count(), 1, "one inline script, hashed");
        assert!(!page.contains(" onclick=") && !page.contains(" style=\""), "no inline handlers or style attributes");
        assert_eq!(h.get("x-frame-options").unwrap(), "DENY");
        assert_eq!(h.get("x-content-type-options").unwrap(), "nosniff");
        assert_eq!(h.get("referrer-policy").unwrap(), "no-referrer");
        let js = headers_of("/console/uPlot.iife.min.js").await;
        assert_eq!(js.get("x-content-type-options").unwrap(), "nosniff");
    }

    async fn get(uri: &str) -> (u16, String, String) {
        let res = response(uri).await;
        let status = res.status().as_u16();
        let ct = res.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let body = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        (status, ct, body)
    }

    /// The colour of a CSS rule of the page (`selector { ...: #rrggbb; }`), as (r, g, b).
    fn colour_of(page: &str, selector: &str) -> (u8, u8, u8) {
        let rule = page.split(&format!("{selector} {{")).nth(1).and_then(|r| r.split('}').next()).unwrap();
        let hex = rule.split('#').nth(1).map(|h| &h[..6]).unwrap();
        let byte = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
        (byte(0), byte(2), byte(4))
    }

    /// How a notification ended has its class in the console: each status the API reads once
    /// every delivery has ended (`NotificationStatus::ended`) maps to one, shown green, amber
    /// (some failed or died) or red (none sent) in its status cell and its progress bar. The
    /// browser test (`tests/e2e/console.rs`) sees them on a running server.
    #[tokio::test]
    async fn each_ending_has_its_colour() {
        use tidings_core::notify::model::NotificationStatus;
        let (_, _, page) = get("/").await;
        let object = page.split("const OUTCOME = {").nth(1).and_then(|s| s.split('}').next()).unwrap();
        let outcome: std::collections::BTreeMap<&str, &str> = object
            .split(',')
            .filter_map(|pair| pair.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
            .collect();
        let ends = [NotificationStatus::ended(1, 0), NotificationStatus::ended(1, 1), NotificationStatus::ended(0, 1)];
        let keys: std::collections::BTreeSet<&str> = ends.iter().map(|s| s.as_str()).collect();
        assert_eq!(outcome.keys().copied().collect::<std::collections::BTreeSet<_>>(), keys, "{object}");
        let (ok, partial, failed) = (outcome["completed"], outcome["completed_with_failures"], outcome["failed"]);
        let green = colour_of(&page, &format!(".outcome-{ok}"));
        let amber = colour_of(&page, &format!(".outcome-{partial}"));
        let red = colour_of(&page, &format!(".outcome-{failed}"));
        assert!(green.1 > green.0 && green.1 > green.2, "completed is green: {green:?}");
        assert!(amber.0 > amber.1 && amber.1 > amber.2 && amber.1 > 0x40, "with failures is amber: {amber:?}");
        assert!(red.0 > 0x90 && red.1 < 0x40, "failed is red: {red:?}");
        let bar_amber = colour_of(&page, &format!(".bar.{partial} > span"));
        let bar_red = colour_of(&page, &format!(".bar.{failed} > span"));
        assert!(bar_amber.0 > bar_amber.1 && bar_amber.1 > bar_amber.2 && bar_amber.1 > 0x40, "{bar_amber:?}");
        assert!(bar_red.0 > 0x90 && bar_red.1 < 0x60, "{bar_red:?}");
    }

    /// The page loads its library from this server (no other site), and the server has it.
    #[tokio::test]
    async fn the_page_and_its_vendored_library_are_served() {
        let (st, ct, page) = get("/").await;
        assert_eq!((st, ct.starts_with("text/html")), (200, true), "{ct}");
        for asset in ["/console/uPlot.iife.min.js", "/console/uPlot.min.css"] {
            assert!(page.contains(&format!("\"{asset}\"")), "the page links {asset}");
            let (st, _, body) = get(asset).await;
            assert_eq!(st, 200, "{asset}");
            assert!(body.contains("MIT License"), "{asset} names its licence");
        }
        assert!(!page.contains("https://") && !page.contains("http://"), "the page loads nothing from another site");
        let (_, ct, js) = get("/console/uPlot.iife.min.js").await;
        assert!(ct.starts_with("text/javascript") && js.contains("var uPlot="), "{ct}");
    }
}
