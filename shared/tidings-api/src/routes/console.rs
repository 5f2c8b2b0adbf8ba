//! The local operator console (`tidings serve` only, with the `/dev` routes): one static page
//! and the charting library it plots with, vendored (`src/console/`, uPlot, MIT) and compiled
//! into the binary, so the page needs neither a build step nor any other site. The page calls
//! the API with the keys it is opened with (README, "The operator console"). These are files,
//! not API operations: they are not in `/openapi.json`.

use axum::Router;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

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

/// The page. It reads its keys from the URL's fragment, which browsers never send: no key
/// reaches this server's logs by opening the link.
async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store"), (header::REFERRER_POLICY, "no-referrer")], Html(PAGE))
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "max-age=3600")], body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(uri: &str) -> (u16, String, String) {
        let res = super::router()
            .with_state(crate::AppState {
                deps: crate::test_support::memory_deps(),
                queue_names: std::sync::Arc::new(Vec::new()),
                dev: None,
                live: None,
            })
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status().as_u16();
        let ct = res.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let body = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        (status, ct, body)
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
