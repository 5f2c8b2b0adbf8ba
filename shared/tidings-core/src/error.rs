//! The core's error: every failure a use-case can report, with what the API answers for it.

use crate::ports::{QueueError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// Well-formed but invalid input (422), naming the field.
    #[error("{field}: {detail}")]
    Invalid { field: String, detail: String },
    /// A placeholder of the template that the request's `params` do not give (422
    /// `missing_param`), naming `params.{name}`.
    #[error("{field}: {detail}")]
    MissingParam { field: String, detail: String },
    /// The object does not exist for this tenant (404).
    #[error("{what} not found")]
    NotFound { what: &'static str },
    /// A request names an object that does not exist for this tenant (404), naming the field
    /// that names it (an order's `items[0].sku_id`).
    #[error("{field}: no such {what}")]
    NotFoundAt { field: String, what: &'static str },
    /// The request conflicts with the state (409), with a stable machine-readable code.
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String },
    /// Too many requests for one subject (429), naming the field, with the seconds until the
    /// limit's window ends.
    #[error("{field}: {detail}")]
    RateLimited { field: &'static str, detail: String, retry_after_s: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl CoreError {
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        CoreError::Invalid { field: field.into(), detail: detail.into() }
    }

    /// The template's placeholder `name` (`order_id`, `order.id`) that `params` lacks.
    pub fn missing_param(name: &str, detail: impl Into<String>) -> Self {
        CoreError::MissingParam { field: format!("params.{name}"), detail: detail.into() }
    }

    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        CoreError::Conflict { code, detail: detail.into() }
    }

    /// The error of a list query that used a client's cursor: a cursor the store cannot read (a
    /// mangled or forged one) is bad input (422 naming `cursor`), not an internal error.
    pub fn of_page_query(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(_) => CoreError::invalid("cursor", "not a cursor this list gave"),
            e => e.into(),
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CoreError::Store(e) => e.is_retryable(),
            CoreError::Queue(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// A record that does not (de)serialize is a corrupt item, like one the store cannot read back.
impl From<serde_json::Error> for CoreError {
    fn from(e: serde_json::Error) -> Self {
        CoreError::Store(StoreError::Corrupt(e.to_string()))
    }
}

pub type CoreResult<T> = Result<T, CoreError>;
