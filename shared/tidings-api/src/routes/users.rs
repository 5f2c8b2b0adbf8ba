use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use tidings_core::lists::{self, DevicePage, UserPage};
use tidings_core::people::users::{self, BatchOutcome, BatchUser, MAX_BATCH_USERS, User, UserInput};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::limits::WriteUnits;
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_user, get_user, list_users, erase_user, list_devices, put_users), components(schemas(BatchUser)))]
pub(super) struct Api;

/// The user whose id is the batch route's last segment: `/v1/users/batch` is that route for
/// `POST` only, and the user named `batch` keeps its `GET`, `PUT` and `DELETE`.
const BATCH: &str = "batch";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/users", get(list_users))
        .route("/v1/users/batch", post(put_users).merge(the_user_named_batch()))
        .route("/v1/users/{user_id}", put(put_user).get(get_user).delete(erase_user))
        .route("/v1/users/{user_id}/devices", get(list_devices))
}

/// `PUT`, `GET` and `DELETE` of the user named `batch` (documented under `/v1/users/{user_id}`).
fn the_user_named_batch() -> axum::routing::MethodRouter<AppState> {
    put(|s, t, b| put_user(s, t, PathParams(BATCH.to_owned()), b))
        .get(|s, t| get_user(s, t, PathParams(BATCH.to_owned())))
        .delete(|s, t| erase_user(s, t, PathParams(BATCH.to_owned())))
}

/// The body of `POST /v1/users/batch`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"users": [
    {"user_id": "u-1001", "email": "ada@example.com", "phone": "+14155550100", "locale": "en", "timezone": "America/Los_Angeles", "tags": ["vip"]},
    {"user_id": "u-1002", "email": "li.wei@example.cn", "locale": "zh-CN", "timezone": "Asia/Shanghai"}
]}))]
pub struct UsersBatch {
    /// At most 1,000 users, each as `PUT /v1/users/{user_id}` takes it, with its `user_id`.
    /// Each is read on its own: one with a wrong type or an unknown field is refused in
    /// `errors`, the others are written.
    #[schema(value_type = Vec<BatchUser>)]
    pub users: Vec<serde_json::Value>,
}

/// Creates or replaces up to 1,000 users at once (an import from another system). Each user
/// stands or falls alone, checked as `PUT /v1/users/{user_id}` checks one: the answer counts
/// those that stand (`upserted`, of which `unchanged` were so already and were not written
/// again) and names each refused one (`errors`: its index, the field as `users[3].email`, what
/// is wrong). The same batch again writes nothing. Costs one `write` unit per 100 users.
#[utoipa::path(post, path = "/v1/users/batch", tag = "users", security(("api_key" = [])),
    request_body = UsersBatch,
    responses((status = 200, description = "What stands and what was refused", body = BatchOutcome,
        example = json!({"upserted": 1, "unchanged": 0, "errors": [
            {"index": 1, "field": "users[1].email", "detail": "not one email address, e.g. alice@example.com"}
        ]}))))]
async fn put_users(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    units: WriteUnits,
    Body(batch): Body<UsersBatch>,
) -> ApiResult<Json<BatchOutcome>> {
    let count = batch.users.len();
    if count > MAX_BATCH_USERS {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "too_many_users",
            format!("users: {count} users, at most {MAX_BATCH_USERS} a request: split them into several requests"),
        )
        .with_field("users")
        .into());
    }
    units.take_for_users(&t, count).await?;
    let mut refused = Vec::new();
    let mut parsed = Vec::with_capacity(count);
    for (index, value) in batch.users.into_iter().enumerate() {
        match BatchUser::from_json(index, value) {
            Ok(user) => parsed.push((index, user)),
            Err(e) => refused.push(e),
        }
    }
    let mut outcome = users::put_users(&s.deps, &t, parsed).await?;
    outcome.errors.extend(refused);
    outcome.errors.sort_by_key(|e| e.index);
    Ok(Json(outcome))
}

/// The tenant's users, in user-id order (a user shows once written with `PUT` since the list
/// existed).
#[utoipa::path(get, path = "/v1/users", tag = "users", security(("api_key" = [])), params(PageParams),
    responses((status = 200, description = "One page of users", body = UserPage)))]
async fn list_users(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<UserPage>> {
    Ok(Json(lists::users(&s.deps, &t, page.limit()?, page.cursor).await?))
}

/// Erases the user: contacts, devices, preferences, inbox and stock subscriptions (counts of
/// many users, such as a campaign's counters and the stock ledger, stay). 204 every time,
/// whether or not there was anything left to erase. Notifications accepted before it are not
/// delivered to the user, nor later ones until the user is written again (reason `erased`).
#[utoipa::path(delete, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    responses((status = 204, description = "Erased (or nothing was left)")))]
async fn erase_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<StatusCode> {
    tidings_core::people::erasure::erase(&s.deps, &t, &user_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The user's push devices, in token-hash order (empty for a user without any).
#[utoipa::path(get, path = "/v1/users/{user_id}/devices", tag = "devices", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id"), PageParams),
    responses((status = 200, description = "One page of devices", body = DevicePage)))]
async fn list_devices(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<DevicePage>> {
    not_erased(&s, &t, &user_id).await?;
    Ok(Json(lists::devices(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?))
}

/// Creates or replaces a user's contacts.
#[utoipa::path(put, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    request_body = UserInput,
    responses((status = 200, description = "The user", body = User)))]
async fn put_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    Body(input): Body<UserInput>,
) -> ApiResult<Json<User>> {
    Ok(Json(users::put_user(&s.deps, &t, &user_id, input).await?))
}

#[utoipa::path(get, path = "/v1/users/{user_id}", tag = "users", security(("api_key" = [])),
    params(("user_id" = String, Path, description = "The shop's user id")),
    responses((status = 200, description = "The user", body = User),
        (status = 404, description = "No such user", body = Problem, content_type = "application/problem+json")))]
async fn get_user(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
) -> ApiResult<Json<User>> {
    match users::get_user(&s.deps, &t, &user_id).await? {
        Some(u) => Ok(Json(u)),
        None => Err(Problem::not_found("user").into()),
    }
}

/// 404 for a user erased and not written since (`people::erasure::is_erased`): what was theirs
/// is gone, and reading it answers as reading the user does.
pub(super) async fn not_erased(s: &AppState, t: &tidings_core::TenantId, user_id: &str) -> ApiResult<()> {
    if tidings_core::people::erasure::is_erased(&s.deps, t, user_id).await? {
        return Err(crate::problem::Problem::not_found("user (erased)").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::http::Method;
    use serde_json::{Value, json};
    use tidings_core::{Deps, TenantId, ops::tenants};

    use crate::state::AppState;

    async fn app() -> (axum::Router, Deps) {
        let deps = crate::test_support::memory_deps();
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        tenants::register_key(&deps, &TenantId::parse("b").unwrap(), "key-b").await.unwrap();
        let state = AppState::of(deps.clone());
        (crate::app(state), deps)
    }

    async fn call(app: &axum::Router, key: &str, method: Method, uri: &str, body: Option<Value>) -> (u16, Value) {
        crate::test_support::call_json(app, key, method, uri, body.map(|b| b.to_string()).unwrap_or_default()).await
    }

    /// Each user stands or falls alone: the good ones are written, each bad one is named by its
    /// index and its field (a rule of `PUT /v1/users/{id}`, a wrong type, an unknown field, no
    /// id, an id given twice), and nothing of a bad one is written.
    #[tokio::test]
    async fn each_user_stands_or_falls_alone_and_errors_name_index_and_field() {
        let (app, _) = app().await;
        let batch = json!({"users": [
            {"user_id": "u1", "email": "ada@example.com", "phone": "+1 (415) 555-0100", "tags": ["vip", "vip"]},
            {"user_id": "u2", "email": "not an address"},
            {"user_id": "u3", "phone": 5},
            {"user_id": "u4", "fax": "+14155550100"},
            {"email": "nobody@example.com"},
            {"user_id": "u1", "email": "again@example.com"},
            {"user_id": "u#7"},
            {"user_id": "u8", "timezone": "Mars/Olympus"},
            "u9",
            {"user_id": "u10", "locale": "zh-CN", "timezone": "Asia/Shanghai"}
        ]});
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(batch)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["upserted"], 2, "{body}");
        assert_eq!(body["unchanged"], 0, "{body}");
        let errors: Vec<(u64, &str)> = body["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["index"].as_u64().unwrap(), e["field"].as_str().unwrap()))
            .collect();
        assert_eq!(
            errors,
            [
                (1, "users[1].email"),
                (2, "users[2].phone"),
                (3, "users[3].fax"),
                (4, "users[4].user_id"),
                (5, "users[5].user_id"),
                (6, "users[6].user_id"),
                (7, "users[7].timezone"),
                (8, "users[8]"),
            ],
            "{body}"
        );
        for e in body["errors"].as_array().unwrap() {
            assert!(!e["detail"].as_str().unwrap().is_empty(), "{e}");
        }
        assert!(body["errors"][4]["detail"].as_str().unwrap().contains("users[0]"), "{body}");
        let (status, u1) = call(&app, "key-a", Method::GET, "/v1/users/u1", None).await;
        assert_eq!(status, 200);
        assert_eq!(
            (&u1["email"], &u1["phone"], &u1["tags"]),
            (&json!("ada@example.com"), &json!("+14155550100"), &json!(["vip"]))
        );
        let (status, u10) = call(&app, "key-a", Method::GET, "/v1/users/u10", None).await;
        assert_eq!((status, &u10["timezone"]), (200, &json!("Asia/Shanghai")));
        for refused in ["u2", "u3", "u4", "u8"] {
            let (status, _) = call(&app, "key-a", Method::GET, &format!("/v1/users/{refused}"), None).await;
            assert_eq!(status, 404, "{refused} was refused and must not be written");
        }
        // The list shows exactly the two written (their entries are written with them).
        let (_, list) = call(&app, "key-a", Method::GET, "/v1/users", None).await;
        let ids: Vec<&str> = list["items"].as_array().unwrap().iter().map(|u| u["user_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["u1", "u10"], "{list}");
    }

    #[tokio::test]
    async fn at_most_a_thousand_users_a_request() {
        let (app, _) = app().await;
        let users: Vec<Value> = (0..1001).map(|i| json!({"user_id": format!("u{i}")})).collect();
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(json!({"users": users}))).await;
        assert_eq!((status, &body["field"], &body["code"]), (422, &json!("users"), &json!("too_many_users")), "{body}");
        assert!(body["detail"].as_str().unwrap().contains("at most 1000"), "{body}");
        let (status, _) = call(&app, "key-a", Method::GET, "/v1/users/u0", None).await;
        assert_eq!(status, 404, "nothing of a refused request is written");
        let users: Vec<Value> = (0..1000).map(|i| json!({"user_id": format!("u{i}"), "tags": ["t"]})).collect();
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(json!({"users": users}))).await;
        assert_eq!((status, &body["upserted"]), (200, &json!(1000)), "{body}");
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(json!({"user": []}))).await;
        assert_eq!((status, &body["code"]), (400, &json!("invalid_body")), "{body}");
    }

    /// The same batch again writes nothing (the users keep their `updated_at`); a changed user
    /// is written, with its tag memberships following its tags as `PUT` keeps them.
    #[tokio::test]
    async fn the_same_batch_again_changes_nothing() {
        let (app, deps) = app().await;
        let users: Vec<Value> = (0..250)
            .map(|i| json!({"user_id": format!("u{i:03}"), "email": format!("u{i}@example.com"), "tags": ["news", format!("g{}", i % 3)]}))
            .collect();
        let batch = json!({"users": users});
        let (_, first) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(batch.clone())).await;
        assert_eq!((&first["upserted"], &first["unchanged"]), (&json!(250), &json!(0)), "{first}");
        let (_, before) = call(&app, "key-a", Method::GET, "/v1/users/u007", None).await;
        let (_, again) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(batch)).await;
        assert_eq!(again, json!({"upserted": 250, "unchanged": 250, "errors": []}));
        let (_, after) = call(&app, "key-a", Method::GET, "/v1/users/u007", None).await;
        assert_eq!(before, after, "not written again");

        let t = TenantId::parse("a").unwrap();
        let (news, _) = tidings_core::people::users::segment_page(&deps, &t, "news", 500, None).await.unwrap();
        assert_eq!(news.len(), 250);
        let changed = json!({"users": [{"user_id": "u007", "email": "new@example.com", "tags": ["g9"]}]});
        let (_, body) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(changed)).await;
        assert_eq!((&body["upserted"], &body["unchanged"]), (&json!(1), &json!(0)), "{body}");
        let (news, _) = tidings_core::people::users::segment_page(&deps, &t, "news", 500, None).await.unwrap();
        assert_eq!(news.len(), 249, "u007 left the segment");
        let (g9, _) = tidings_core::people::users::segment_page(&deps, &t, "g9", 500, None).await.unwrap();
        assert_eq!(
            g9.iter().map(|u| (u.user_id.as_str(), u.email.as_deref())).collect::<Vec<_>>(),
            [("u007", Some("new@example.com"))]
        );
    }

    #[tokio::test]
    async fn a_batch_reaches_its_own_tenant_only() {
        let (app, _) = app().await;
        let a = json!({"users": [{"user_id": "shared", "email": "a@example.com"}, {"user_id": "only-a"}]});
        let (status, _) = call(&app, "key-a", Method::POST, "/v1/users/batch", Some(a)).await;
        assert_eq!(status, 200);
        let (status, _) = call(&app, "key-b", Method::GET, "/v1/users/only-a", None).await;
        assert_eq!(status, 404);
        let b = json!({"users": [{"user_id": "shared", "email": "b@example.com"}]});
        let (_, body) = call(&app, "key-b", Method::POST, "/v1/users/batch", Some(b)).await;
        assert_eq!((&body["upserted"], &body["unchanged"]), (&json!(1), &json!(0)), "b's user is b's own: {body}");
        let (_, user) = call(&app, "key-a", Method::GET, "/v1/users/shared", None).await;
        assert_eq!(user["email"], "a@example.com");
        let (_, list) = call(&app, "key-b", Method::GET, "/v1/users", None).await;
        assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    }

    /// `/v1/users/batch` is the batch route for `POST` only: the user named `batch` is still
    /// written, read and erased.
    #[tokio::test]
    async fn the_user_named_batch_keeps_its_routes() {
        let (app, _) = app().await;
        let (status, body) =
            call(&app, "key-a", Method::PUT, "/v1/users/batch", Some(json!({"email": "b@example.com"}))).await;
        assert_eq!((status, &body["user_id"]), (200, &json!("batch")), "{body}");
        let (status, body) = call(&app, "key-a", Method::GET, "/v1/users/batch", None).await;
        assert_eq!((status, &body["email"]), (200, &json!("b@example.com")), "{body}");
        let (status, _) = call(&app, "key-a", Method::DELETE, "/v1/users/batch", None).await;
        assert_eq!(status, 204);
        let (status, _) = call(&app, "key-a", Method::GET, "/v1/users/batch", None).await;
        assert_eq!(status, 404);
    }
}
