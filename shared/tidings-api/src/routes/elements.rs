//! `GET /elements/tidings.js`: the `<tidings-inbox>` and `<tidings-preferences>` custom elements
//! a shop puts on its own site (docs/site.md). One plain JavaScript file (`src/elements/`),
//! compiled into the binary, so `tidings serve` and the `api` function serve the same bytes with
//! no build step. No key: it is code, not data (its calls carry the user token). A file, not an
//! API operation: not in `/openapi.json`, as the console's files are not.
//!
//! Cached by version: the file's ETag is a hash of its bytes; `/elements/{version}/tidings.js`
//! (the version the plain URL names in its `Content-Location`) is immutable for a year, the plain
//! URL for an hour and then revalidated (a 304 when unchanged).

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::state::AppState;

/// The elements' source.
pub const SCRIPT: &str = include_str!("../elements/tidings.js");

/// The first 16 hex digits of the script's SHA-256: its version.
pub static VERSION: LazyLock<String> =
    LazyLock::new(|| Sha256::digest(SCRIPT.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect());

static ETAG: LazyLock<String> = LazyLock::new(|| format!("\"{}\"", *VERSION));

pub fn router() -> Router<AppState> {
    Router::new().route("/elements/tidings.js", get(|h: HeaderMap| async move { script(&h, false) })).route(
        "/elements/{version}/tidings.js",
        get(|h: HeaderMap, Path(v): Path<String>| async move { script(&h, v == *VERSION) }),
    )
}

/// The script, or 304 when the client's copy is this version. A versioned URL of another version
/// (a page written before an upgrade) gets this one, cached as the plain URL is.
fn script(headers: &HeaderMap, pinned: bool) -> Response {
    let cache = if pinned { "public, max-age=31536000, immutable" } else { "public, max-age=3600, must-revalidate" };
    let location = format!("/elements/{}/tidings.js", *VERSION);
    let common = [
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (header::ETAG, HeaderValue::from_str(&ETAG).unwrap_or(HeaderValue::from_static("\"\""))),
        (header::CONTENT_LOCATION, HeaderValue::from_str(&location).unwrap_or(HeaderValue::from_static("/"))),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        // A shop whose pages isolate themselves (COEP) may still load it.
        (header::HeaderName::from_static("cross-origin-resource-policy"), HeaderValue::from_static("cross-origin")),
    ];
    let fresh = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|tag| matches!(tag.trim().trim_start_matches("W/"), t if t == *ETAG || t == "*"))
    });
    if fresh {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (common, [(header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8"))], SCRIPT)
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn get(path: &str, if_none_match: Option<&str>) -> (StatusCode, HeaderMap, String) {
        let deps = crate::test_support::memory_deps();
        let app = crate::app(crate::AppState::of(deps));
        let mut req = Request::get(path);
        if let Some(tag) = if_none_match {
            req = req.header(header::IF_NONE_MATCH, tag);
        }
        let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let (parts, body) = res.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_script_is_served_without_a_key_and_cached_by_version() {
        let (st, h, body) = get("/elements/tidings.js", None).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert!(body.contains("customElements.define(\"tidings-inbox\"") && body.contains("\"tidings-preferences\""));
        assert_eq!(h[header::CACHE_CONTROL], "public, max-age=3600, must-revalidate");
        let etag = h[header::ETAG].to_str().unwrap().to_owned();
        assert_eq!(etag, format!("\"{}\"", *VERSION));
        // No CORS: a classic <script> needs none, and no route but /v1/me/* and /v1/ws answers it.
        assert!(h.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());

        let (st, h, body) = get("/elements/tidings.js", Some(&etag)).await;
        assert_eq!((st, body.as_str()), (StatusCode::NOT_MODIFIED, ""));
        assert_eq!(h[header::ETAG], etag.as_str());
        let (st, _, _) = get("/elements/tidings.js", Some("\"0000000000000000\"")).await;
        assert_eq!(st, StatusCode::OK, "another version is sent again");

        let pinned = h[header::CONTENT_LOCATION].to_str().unwrap().to_owned();
        assert_eq!(pinned, format!("/elements/{}/tidings.js", *VERSION));
        let (st, h, same) = get(&pinned, None).await;
        assert_eq!((st, same.len()), (StatusCode::OK, SCRIPT.len()));
        assert_eq!(h[header::CACHE_CONTROL], "public, max-age=31536000, immutable");
        let (st, h, _) = get("/elements/0123456789abcdef/tidings.js", None).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(h[header::CACHE_CONTROL], "public, max-age=3600, must-revalidate", "an old version is not pinned");
    }

    /// `1234567` as `1,234,567`.
    fn grouped(n: usize) -> String {
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    }

    #[test]
    fn the_docs_give_the_scripts_size() {
        let docs = include_str!("../../../../docs/site.md");
        let size = format!("**{} bytes as written", grouped(SCRIPT.len()));
        assert!(docs.contains(&size), "docs/site.md, \"The script\" should say {size}");
    }

    #[test]
    fn the_script_stays_small() {
        // docs/site.md gives its size; a framework or a bundle would blow through this.
        assert!(SCRIPT.len() < 40_000, "tidings.js is {} bytes", SCRIPT.len());
    }
}
