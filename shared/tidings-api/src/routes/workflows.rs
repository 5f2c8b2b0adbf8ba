use axum::extract::State;
use axum::routing::{get, put};
use axum::{Json, Router};
use tidings_core::workflows::run::{self, RunPage};
use tidings_core::workflows::{self, StepDef, Workflow, WorkflowInput, WorkflowPage};

use crate::extract::{Body, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_workflow, get_workflow, list_workflows, runs), components(schemas(StepDef)))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/workflows", get(list_workflows))
        .route("/v1/workflows/{workflow_id}", put(put_workflow).get(get_workflow))
        .route("/v1/notifications/{id}/runs", get(runs))
}

/// Creates or changes a workflow (docs/workflows.md): its steps run for each recipient of a
/// notification that names it. Each change is a new `version`; a run keeps the version it
/// started with. The same definition again changes nothing.
///
/// Checked before it is stored, the field named: every send's template exists and has content
/// for its channels (`steps[4].template_id`), a condition's `step` is a send before it
/// (`steps[3].if.step`: nothing points forward, so no loops), `wait` goes with `until`,
/// durations are `30s` to `31d`, at most 50 steps and 4 levels of branches.
#[utoipa::path(put, path = "/v1/workflows/{workflow_id}", tag = "workflows", security(("api_key" = [])),
    params(("workflow_id" = String, Path, description = "The workflow's id")),
    request_body = WorkflowInput,
    responses((status = 200, description = "The workflow, its latest version", body = Workflow),
        (status = 409, description = "Changed by another request at the same time (`concurrent_change`): try again", body = Problem,
            content_type = "application/problem+json"),
        (status = 422, description = "A step that cannot work; `field` names it", body = Problem,
            content_type = "application/problem+json")))]
async fn put_workflow(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    Body(input): Body<WorkflowInput>,
) -> ApiResult<Json<Workflow>> {
    Ok(Json(workflows::put_workflow(&s.deps, &t, &id, input).await?))
}

/// The workflow's latest version.
#[utoipa::path(get, path = "/v1/workflows/{workflow_id}", tag = "workflows", security(("api_key" = [])),
    params(("workflow_id" = String, Path, description = "The workflow's id")),
    responses((status = 200, description = "The workflow", body = Workflow),
        (status = 404, description = "No such workflow", body = Problem, content_type = "application/problem+json")))]
async fn get_workflow(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
) -> ApiResult<Json<Workflow>> {
    match workflows::get_workflow(&s.deps, &t, &id).await? {
        Some(w) => Ok(Json(w)),
        None => Err(Problem::not_found("workflow").into()),
    }
}

/// The tenant's workflows, in id order.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows", security(("api_key" = [])), params(PageParams),
    responses((status = 200, description = "One page of workflows", body = WorkflowPage)))]
async fn list_workflows(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<WorkflowPage>> {
    Ok(Json(workflows::list(&s.deps, &t, page.limit()?, page.cursor).await?))
}

/// A workflow send's runs, one per recipient, in user id order: where each is (`running`,
/// `waiting` and until when, or how it ended) and the steps it went through. A template send
/// has none.
#[utoipa::path(get, path = "/v1/notifications/{id}/runs", tag = "workflows", security(("api_key" = [])),
    params(("id" = String, Path, description = "The notification id"), PageParams),
    responses((status = 200, description = "One page of runs", body = RunPage),
        (status = 404, description = "No such notification", body = Problem, content_type = "application/problem+json")))]
async fn runs(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<RunPage>> {
    match run::runs(&s.deps, &t, &id, page.limit()?, page.cursor).await? {
        Some(p) => Ok(Json(p)),
        None => Err(Problem::not_found("notification").into()),
    }
}
