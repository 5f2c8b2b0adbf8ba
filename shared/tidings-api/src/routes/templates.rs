use axum::extract::State;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use tidings_core::lists::{self, TemplatePage};
use tidings_core::templates::preview::{self, Preview, PreviewRequest};
use tidings_core::templates::{self, Template, TemplateInput};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_template, get_template, list_templates, preview_template))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/templates", get(list_templates))
        .route("/v1/templates/{template_id}", put(put_template).get(get_template))
        .route("/v1/templates/{template_id}/preview", post(preview_template))
}

/// The tenant's templates, in id order: each one's id, locales and last change (`GET
/// /v1/templates/{id}` has the content).
#[utoipa::path(get, path = "/v1/templates", tag = "templates", security(("api_key" = [])), params(PageParams),
    responses((status = 200, description = "One page of templates", body = TemplatePage)))]
async fn list_templates(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<TemplatePage>> {
    Ok(Json(lists::templates(&s.deps, &t, page.limit()?, page.cursor).await?))
}

/// Renders the template as a send would (the same engine, limits and locale fallback), for
/// each channel asked (default: every channel it has content for); nothing is sent. The open
/// pixel, rewritten links and unsubscribe headers a send adds are not shown.
#[utoipa::path(post, path = "/v1/templates/{template_id}/preview", tag = "templates", security(("api_key" = [])),
    params(("template_id" = String, Path, description = "The template's id")),
    request_body = PreviewRequest,
    responses((status = 200, description = "The rendered parts, one per channel", body = Preview),
        (status = 404, description = "No such template", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing placeholder (`field` is `params.<name>`), a locale the template does not have (`locale`), a channel it has no content for (`channels[i]`), or a limit its params break (`params`)", body = Problem,
            content_type = "application/problem+json")))]
async fn preview_template(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    Body(req): Body<PreviewRequest>,
) -> ApiResult<Json<Preview>> {
    match preview::preview(&s.deps, &t, &id, req).await? {
        Some(p) => Ok(Json(p)),
        None => Err(Problem::not_found("template").into()),
    }
}

/// Creates or replaces a template: content per locale, `{{ name }}` placeholders.
///
/// Checked before it is stored, each field named in the problem (`locales.en.sms`): syntax,
/// the source size, the sandbox (no `*`, `**`, `set`, `with`, macros or recursive loops, at
/// most 16 `~` or `+` per field), and a trial render without variables that must stay within
/// the fuel and the rendered size of its channel (an SMS at most 10 segments, a push title and
/// body 3,500 bytes). A limit that only the variables of a notification break fails that
/// delivery with `template_error`, never retried (docs/security.md, "Template limits").
#[utoipa::path(put, path = "/v1/templates/{template_id}", tag = "templates", security(("api_key" = [])),
    params(("template_id" = String, Path, description = "The template's id")),
    request_body = TemplateInput,
    responses((status = 200, description = "The template", body = Template),
        (status = 422, description = "A field breaks a rule or a limit; `field` names it", body = Problem,
            content_type = "application/problem+json")))]
async fn put_template(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    Body(input): Body<TemplateInput>,
) -> ApiResult<Json<Template>> {
    Ok(Json(templates::put_template(&s.deps, &t, &id, input).await?))
}

#[utoipa::path(get, path = "/v1/templates/{template_id}", tag = "templates", security(("api_key" = [])),
    params(("template_id" = String, Path, description = "The template's id")),
    responses((status = 200, description = "The template", body = Template),
        (status = 404, description = "No such template", body = Problem, content_type = "application/problem+json")))]
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
