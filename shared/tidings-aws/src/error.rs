//! Classification of SDK errors, shared by the adapters.

use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// What kind of failure an SDK call ended in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Throttled, 5xx, timeout, connection failure: try again later.
    Transient,
    /// The service answered with an error that will not go away by retrying.
    Service,
    /// The request could not even be built.
    Construction,
}

/// A classified SDK error: its kind, the service's error code (if any), the `Retry-After`
/// header and a message with the whole source chain.
#[derive(Clone, Debug)]
pub(crate) struct Classified {
    pub kind: Kind,
    pub code: Option<String>,
    pub retry_after: Option<Duration>,
    pub message: String,
}

impl Classified {
    pub fn code(&self) -> &str {
        self.code.as_deref().unwrap_or("")
    }
    pub fn is_transient(&self) -> bool {
        self.kind == Kind::Transient
    }
}

const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "RequestThrottledException",
    "SlowDown",
    "LimitExceededException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "InternalErrorException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "TransactionInProgressException",
    "KMSThrottlingException",
    "SendingPausedException",
];

pub(crate) fn classify<E>(err: &SdkError<E, HttpResponse>) -> Classified
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let message = DisplayErrorContext(err).to_string();
    match err {
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().map(str::to_string);
            let status = ctx.raw().status().as_u16();
            let retry_after = ctx
                .raw()
                .headers()
                .get("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            // A "service error" on a 2xx/3xx status is an answer the SDK could not parse (a
            // proxy's page, a truncated body): the call may well have succeeded, so it is
            // retried (at least once) rather than failed for good.
            let transient = status >= 500
                || status == 429
                || status < 400
                || code.as_deref().is_some_and(|c| THROTTLING_CODES.contains(&c));
            Classified { kind: if transient { Kind::Transient } else { Kind::Service }, code, retry_after, message }
        }
        SdkError::ResponseError(ctx) => {
            let status = ctx.raw().status().as_u16();
            // An answer that could not be parsed: a 5xx page from a proxy, usually.
            let kind = if status >= 500 || status == 429 || status < 400 { Kind::Transient } else { Kind::Service };
            Classified { kind, code: None, retry_after: None, message }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => {
            Classified { kind: Kind::Transient, code: None, retry_after: None, message }
        }
        SdkError::ConstructionFailure(_) => {
            Classified { kind: Kind::Construction, code: None, retry_after: None, message }
        }
        _ => Classified { kind: Kind::Transient, code: None, retry_after: None, message },
    }
}
