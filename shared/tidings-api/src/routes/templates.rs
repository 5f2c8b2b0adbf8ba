use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use tidings_core::templates::{self, Template, TemplateInput};

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/templates/{template_id}", put(put_template).get(get_template))
}

async fn put_template(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    Body(input): Body<TemplateInput>,
) -> ApiResult<Json<Template>> {
    Ok(Json(templates::put_template(&s.deps, &t, &id, input).await?))
}

async fn get_template(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Template>> {
    match templates::get_template(&s.deps, &t, &id).await? {
        Some(tpl) => Ok(Json(tpl)),
        None => Err(Problem::not_found("template").into()),
    }
}
