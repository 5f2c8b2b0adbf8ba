//! Errors as RFC 9457 problem documents, with a stable `code`. Internal details never reach
//! the client; they are logged with their cause chain.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tidings_core::CoreError;
use tracing::error;

/// An RFC 9457 problem document (`application/problem+json`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    /// The HTTP status, repeated.
    pub status: u16,
    /// A stable machine-readable word, e.g. `insufficient_stock`.
    pub code: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The request field at fault (400 and 422), or the header (`Authorization` in a 401,
    /// `Content-Type` in a 415, `Idempotency-Key`): what to change to be answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The request's `x-request-id` (the client's own when it sent a valid one), as in the
    /// answer's header and the server's log lines of that request (docs/errors.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Seconds for the `Retry-After` header (429, and 409 `write_conflict`).
    #[serde(skip)]
    pub retry_after_s: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        Self {
            type_: format!("https://tidings.dev/problems/{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            code: code.to_owned(),
            detail: Some(detail.into()),
            field: None,
            request_id: None,
            retry_after_s: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn not_found(what: &str) -> Self {
        Problem::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    /// A 401 naming the `Authorization` header. `detail` says what is wrong with it as far as
    /// that helps a client and not a guesser: missing, not a bearer key, or not a valid key
    /// (never which of unknown, revoked or expired; docs/errors.md).
    pub fn unauthorized(detail: &str) -> Self {
        Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail).with_field("Authorization")
    }

    /// The answer's head (status, content type, `WWW-Authenticate`, `Retry-After`) and its
    /// JSON body: what [`IntoResponse`] sends, for a caller that needs the bytes themselves
    /// (the Lambda functions' answer when a body could not be read).
    pub fn into_head_and_body(self) -> (axum::http::response::Parts, Vec<u8>) {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let (mut head, ()) = Response::new(()).into_parts();
        head.status = status;
        head.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        // RFC 9110, 11.6.1: a 401 says which scheme it asks for.
        if status == StatusCode::UNAUTHORIZED {
            head.headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(secs) = self.retry_after_s {
            head.headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        (head, body)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (head, body) = self.into_head_and_body();
        Response::from_parts(head, axum::body::Body::from(body))
    }
}

/// The error type of every handler.
#[derive(Debug)]
pub struct ApiError(pub Box<Problem>);

impl From<Problem> for ApiError {
    fn from(p: Problem) -> Self {
        ApiError(Box::new(p))
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        let p = match &e {
            CoreError::Invalid { field, detail } => {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", format!("{field}: {detail}"))
                    .with_field(field.clone())
            }
            CoreError::MissingParam { field, detail } => {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "missing_param", format!("{field}: {detail}"))
                    .with_field(field.clone())
            }
            CoreError::NotFound { what } => Problem::not_found(what),
            CoreError::NotFoundAt { field, what } => {
                Problem::new(StatusCode::NOT_FOUND, "not_found", format!("{field}: no such {what}"))
                    .with_field(field.clone())
            }
            CoreError::Conflict { code, detail } => Problem::new(StatusCode::CONFLICT, code, detail.clone()),
            CoreError::RateLimited { field, detail, retry_after_s } => {
                let mut p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", format!("{field}: {detail}"))
                    .with_field(*field);
                p.retry_after_s = Some(*retry_after_s);
                p
            }
            // Other requests wrote the same items at the same moment, past the adapter's own
            // retries: nothing of this request was written, and the same request may be sent
            // again (an idempotency key makes that safe in any case).
            CoreError::Store(tidings_core::ports::StoreError::Conflict) => {
                let mut p = Problem::new(
                    StatusCode::CONFLICT,
                    "write_conflict",
                    "other requests changed the same items at the same moment; nothing was written, try again",
                );
                p.retry_after_s = Some(1);
                p
            }
            e if e.is_retryable() => {
                error!(error = %e, "store or queue unavailable");
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "temporarily unavailable, try again")
            }
            e => {
                error!(error = %e, source = ?std::error::Error::source(e), "internal error");
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
            }
        };
        ApiError(Box::new(p))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tidings_core::ports::StoreError;

    /// A write that still met transaction conflicts after the store's retries wrote nothing: a
    /// clean 409 the client may repeat after `Retry-After`, never a 5xx.
    #[test]
    fn a_write_conflict_is_a_409_with_retry_after() {
        let res = ApiError::from(CoreError::Store(StoreError::Conflict)).into_response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers().get(header::RETRY_AFTER).unwrap(), "1");
        let unavailable = ApiError::from(CoreError::Store(StoreError::Unavailable("throttled".into()))).into_response();
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
