use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use tidings_core::lists::{self, NotificationFilter, NotificationPage};
use tidings_core::notify::api::{self, Accepted, DeliveryPage, NotificationView};
use tidings_core::notify::model::{NotificationRequest, NotificationStatus};
use tidings_core::notify::verification::{self, Verified};

use crate::extract::{Body, IdempotencyKey, PageParams, PathParams, QueryParams, Tenant};
use crate::limits::SendBudget;
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(create, list, show, deliveries, cancel, verified))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/notifications", post(create).get(list))
        .route("/v1/notifications/{id}", get(show))
        .route("/v1/notifications/{id}/deliveries", get(deliveries))
        .route("/v1/notifications/{id}/cancel", post(cancel))
        .route("/v1/notifications/{id}/verified", post(verified))
}

/// 202 once the request is durably written (the write is the outbox).
///
/// Before answering it checks what can be checked: the template exists, has content for the
/// channels named, and the params give every placeholder that is not a recipient's attribute.
#[utoipa::path(post, path = "/v1/notifications", tag = "notifications", security(("api_key" = [])),
    params(("Idempotency-Key" = Option<String>, Header, description = "The body's `idempotency_key` as a header (either, or both the same; 422 when they differ)")),
    request_body = NotificationRequest,
    responses((status = 202, description = "Accepted (or scheduled); the same id for a repeated idempotency key. `priority` is the one granted: `high` only for a transactional send to at most 10 users, else at most `normal` (`priority_requested` and `priority_lowered` say so)", body = Accepted),
        (status = 409, description = "`idempotency_conflict`: the key was used with another body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid, naming the `field`: no such template (`template_id`), a channel the template has no content for (`channels[i]`); `missing_param`: a placeholder of the template that `params` do not give and that is not a recipient's attribute (`user_id`, `locale`), naming `params.<name>`; `too_many_recipients`: more `user_ids` than the tenant's recipients budget holds at once", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate_limited`: the tenant's send requests or recipients a second (`TIDINGS_API_RATES`), or the `requester`'s limit (`field` names which), is reached; nothing accepted; see `Retry-After`", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u64, description = "Seconds until the limit's window ends")))))]
async fn create(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    budget: SendBudget,
    header: IdempotencyKey,
    Body(mut req): Body<NotificationRequest>,
) -> ApiResult<(StatusCode, Json<Accepted>)> {
    req.idempotency_key = header.merge(req.idempotency_key.take())?;
    // Each user named costs one unit of the tenant's recipients budget; a segment (a campaign)
    // costs none here: its pages are paced by the campaign pipeline (docs/gates.md, "API limits").
    budget.take(&t, req.user_ids().len()).await?;
    let accepted = api::accept(&s.deps, &t, req).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only notifications in this status (as `GET /v1/notifications/{id}` shows it).
    status: Option<NotificationStatus>,
    /// Accepted at or after this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime, example = "2026-12-01T00:00:00Z")]
    since: Option<chrono::DateTime<chrono::Utc>>,
    /// Accepted before this time (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime, example = "2026-12-02T00:00:00Z")]
    until: Option<chrono::DateTime<chrono::Utc>>,
    /// Items per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// The tenant's notifications, newest first, with their status and counts. With `status`, a
/// page holds the matches among up to 1000 notifications it looked at: it may hold fewer than
/// `limit` (even none) and still have a `next_cursor`. Notifications accepted before this list
/// existed are not in it.
#[utoipa::path(get, path = "/v1/notifications", tag = "notifications", security(("api_key" = [])), params(ListQuery),
    responses((status = 200, description = "One page of notifications", body = NotificationPage)))]
async fn list(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(q): QueryParams<ListQuery>,
) -> ApiResult<Json<NotificationPage>> {
    let limit = PageParams { limit: q.limit, cursor: None }.limit()?;
    let filter = NotificationFilter { status: q.status, since: q.since, until: q.until };
    Ok(Json(lists::notifications(&s.deps, &t, &filter, limit, q.cursor).await?))
}

#[utoipa::path(get, path = "/v1/notifications/{id}", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "Status and counts", body = NotificationView),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn show(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<NotificationView>> {
    match api::get_notification(&s.deps, &t, &id).await? {
        Some(v) => Ok(Json(v)),
        None => Err(Problem::not_found("notification").into()),
    }
}

/// One page of deliveries, per (user, channel).
#[utoipa::path(get, path = "/v1/notifications/{id}/deliveries", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id"), PageParams),
    responses((status = 200, description = "Deliveries", body = DeliveryPage),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn deliveries(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<DeliveryPage>> {
    match api::list_deliveries(&s.deps, &t, &id, page.limit()?, page.cursor).await? {
        Some(p) => Ok(Json(p)),
        None => Err(Problem::not_found("notification").into()),
    }
}

/// Stops what has not been sent yet.
#[utoipa::path(post, path = "/v1/notifications/{id}/cancel", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "The notification, cancelled: nothing of it is sent after this answer (docs/delivery.md, \"Cancel\")", body = NotificationView),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`already_sent`: every delivery has ended, nothing is left to cancel (the notification stays as it was)", body = Problem, content_type = "application/problem+json")))]
async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<NotificationView>> {
    Ok(Json(api::cancel(&s.deps, &t, &id).await?))
}

/// The shop's user entered the code this notification carried: counted once (repeats answer
/// the first time) in its template's verification stats, `GET /v1/ops/verification`.
#[utoipa::path(post, path = "/v1/notifications/{id}/verified", tag = "notifications", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id")),
    responses((status = 200, description = "Verified (now, or at the time first reported)", body = Verified),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn verified(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Verified>> {
    match verification::verify(&s.deps, &t, &id).await? {
        Some(v) => Ok(Json(v)),
        None => Err(Problem::not_found("notification").into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::body::Body as HttpBody;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tidings_core::TenantId;
    use tidings_core::ops::tenants;
    use tower::ServiceExt;

    use crate::state::AppState;

    async fn app() -> axum::Router {
        let deps = crate::test_support::memory_deps();
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        crate::app(AppState::of(deps))
    }

    async fn call(app: &axum::Router, method: Method, uri: &str, key: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", "Bearer key-a")
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let res = app.clone().oneshot(req.body(HttpBody::from(body.to_string())).unwrap()).await.unwrap();
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    fn send(n: i64) -> Value {
        json!({"recipients": {"user_ids": ["u1"]}, "template_id": "t", "params": {"n": n},
               "category": "transactional", "channels": ["email"]})
    }

    /// The header is the body's `idempotency_key` by another name: the same key and body answer
    /// the first notification, another body 409, header and field different 422 naming the header.
    #[tokio::test]
    async fn the_idempotency_key_header_keeps_the_body_fields_rules() {
        let app = app().await;
        let template =
            json!({"default_locale": "en", "locales": {"en": {"email_subject": "S", "email_body": "B {{ n }}"}}});
        assert_eq!(call(&app, Method::PUT, "/v1/templates/t", None, template).await.0, 200);
        assert_eq!(call(&app, Method::PUT, "/v1/users/u1", None, json!({"email": "a@example.com"})).await.0, 200);

        let (st, first) = call(&app, Method::POST, "/v1/notifications", Some("k-1"), send(1)).await;
        assert_eq!(st, 202, "{first}");
        let (st, again) = call(&app, Method::POST, "/v1/notifications", Some("\"k-1\""), send(1)).await;
        assert_eq!((st, &again["notification_id"]), (202, &first["notification_id"]), "quoted: the same key");
        let mut in_body = send(1);
        in_body["idempotency_key"] = json!("k-1");
        let (st, same) = call(&app, Method::POST, "/v1/notifications", None, in_body.clone()).await;
        assert_eq!(
            (st, &same["notification_id"]),
            (202, &first["notification_id"]),
            "the body's field is the same key"
        );
        let (st, both) = call(&app, Method::POST, "/v1/notifications", Some("k-1"), in_body.clone()).await;
        assert_eq!((st, &both["notification_id"]), (202, &first["notification_id"]));

        let (st, v) = call(&app, Method::POST, "/v1/notifications", Some("k-1"), send(2)).await;
        assert_eq!((st, v["code"].as_str()), (409, Some("idempotency_conflict")), "{v}");
        let (st, v) = call(&app, Method::POST, "/v1/notifications", Some("k-2"), in_body).await;
        assert_eq!((st, v["field"].as_str()), (422, Some("Idempotency-Key")), "{v}");
        let (st, v) = call(&app, Method::POST, "/v1/notifications", Some("\"\""), send(3)).await;
        assert_eq!((st, v["field"].as_str()), (422, Some("Idempotency-Key")), "{v}");
        let (st, v) = call(&app, Method::POST, "/v1/notifications", Some("a#b"), send(3)).await;
        assert_eq!(st, 422, "the key's own rules apply to the header: {v}");
    }
}
