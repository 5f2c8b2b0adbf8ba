//! `x-request-id` on every answer, in every log line of the request and in every problem
//! document (docs/errors.md). The id is the client's when it sent a usable one, else API
//! Gateway's (in Lambda), else a new one, so that a client quoting the id of an answer finds
//! the server's lines of that request.
//!
//! The same middleware makes axum's own refusals (a path or query that does not parse, a
//! WebSocket handshake that is not one) problem documents like every other error.
//!
//! tower-http's `SetRequestId` takes whatever header came, of any length and bytes; the rule
//! below is what a log line can hold safely.

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::problem::Problem;

/// The header, in requests and answers.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The id API Gateway gave the request (`requestContext.requestId`), put in the request's
/// extensions by the `api` function.
#[derive(Clone, Debug)]
pub struct GatewayRequestId(pub String);

/// The request's id, in its extensions for whoever wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

/// Problem documents are small; anything larger is passed on as it is.
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// Whether an incoming id is taken: 1 to 128 of letters, digits and `-_.:@+=/` (a UUID, a
/// ULID, API Gateway's ids, a W3C trace id), nothing a log line or a header could be abused with.
pub fn usable(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:@+=/".contains(&b))
}

/// The middleware (`axum::middleware::from_fn(request_id)`), outermost in the router.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let incoming = req.headers().get(&X_REQUEST_ID).and_then(|v| v.to_str().ok()).map(str::trim);
    let id = incoming
        .filter(|id| usable(id))
        .map(str::to_owned)
        .or_else(|| req.extensions().get::<GatewayRequestId>().map(|g| g.0.clone()).filter(|id| usable(id)))
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let Ok(value) = HeaderValue::from_str(&id) else {
        // Unreachable: `usable` ids and UUIDs are header values.
        return next.run(req).await;
    };
    req.headers_mut().insert(X_REQUEST_ID.clone(), value.clone());
    req.extensions_mut().insert(RequestId(id.clone()));
    // The route's template, never the path itself: paths carry tokens (`/u/{token}`).
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), route = %route);
    let res = next.run(req).instrument(span).await;
    let mut res = with_request_id(res, &id).await;
    res.headers_mut().insert(X_REQUEST_ID.clone(), value);
    res
}

/// `res` with `request_id` in its problem document; a plain-text refusal of axum's own
/// extractors becomes one.
async fn with_request_id(res: Response, id: &str) -> Response {
    let content_type = res.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let problem = content_type.starts_with("application/problem+json");
    let refusal = res.status().is_client_error() && content_type.starts_with("text/plain");
    if !problem && !refusal {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_PROBLEM_BYTES).await else {
        return (parts.status, "").into_response();
    };
    if refusal {
        let mut p = Problem::new(parts.status, refusal_code(parts.status), String::from_utf8_lossy(&bytes));
        p.request_id = Some(id.to_owned());
        let mut res = p.into_response();
        for (name, value) in &parts.headers {
            if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
                res.headers_mut().insert(name.clone(), value.clone());
            }
        }
        return res;
    }
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut doc)) => {
            doc.insert("request_id".to_owned(), serde_json::Value::from(id));
            serde_json::to_vec(&doc).unwrap_or_else(|_| bytes.to_vec())
        }
        _ => bytes.to_vec(),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The `code` of a refusal axum wrote as text.
fn refusal_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::UPGRADE_REQUIRED => "upgrade_required",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_field",
        _ => "bad_request",
    }
}

#[cfg(test)]
mod tests {
    use super::usable;

    #[test]
    fn ids_that_are_taken_and_ids_that_are_not() {
        for id in ["0190b6a8-4b5e-7c1d-9f00-1234567890ab", "01J2ZK8M4V", "Root=1-abc-def", "a"] {
            assert!(usable(id), "{id}");
        }
        for id in ["", "a b", "x\ny", "<script>", &"x".repeat(129), "é"] {
            assert!(!usable(id), "{id:?}");
        }
    }
}
