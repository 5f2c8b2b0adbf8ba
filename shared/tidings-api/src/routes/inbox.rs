use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tidings_core::inbox::{self, InboxPage};

use crate::extract::{PageParams, PathParams, QueryParams, Tenant};
use crate::problem::ApiResult;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/users/{user_id}/inbox", get(list))
        .route("/v1/users/{user_id}/inbox/{message_id}/read", post(mark_read))
}

async fn list(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(user_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<InboxPage>> {
    Ok(Json(inbox::list(&s.deps, &t, &user_id, page.limit()?, page.cursor).await?))
}

async fn mark_read(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams((user_id, message_id)): PathParams<(String, String)>,
) -> ApiResult<Json<Value>> {
    let unread = inbox::mark_read(&s.deps, &t, &user_id, &message_id).await?;
    Ok(Json(json!({"message_id": message_id, "read": true, "unread_count": unread})))
}
