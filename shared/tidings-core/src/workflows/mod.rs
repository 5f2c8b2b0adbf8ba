//! Workflows (docs/workflows.md): a kind of notification a shop defines once, whose steps run
//! for each recipient. This module keeps the definitions, each change a new version (a run keeps
//! the version it started with):
//!
//! | item | pk | sk |
//! |---|---|---|
//! | the workflow (its latest version) | `T#{t}#WF#{id}` | `WF` |
//! | one version, never changed | `T#{t}#WF#{id}` | `V#{version:08}` |
//! | its entry in the tenant's list | `T#{t}#WFS` | `{id}` |
//!
//! The runs are in [`run`], the digests' windows in [`digest`], conditions in [`conditions`].

pub mod conditions;
pub mod definition;
pub mod digest;
pub mod model;
pub mod run;

use serde::{Deserialize, Serialize};

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::notify::model::Category;
use crate::ports::{Cond, Item, Key, QueryOpts, StoreError, Write, attrs_of};
use crate::templates;
pub use definition::{StepDef, WorkflowInput};
pub use model::WorkflowRef;

/// A workflow as stored and shown: one version of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Workflow {
    pub workflow_id: String,
    /// 1 for the first `PUT`, one more for each `PUT` that changed it.
    pub version: u32,
    pub name: String,
    pub category: Category,
    pub required: bool,
    #[schema(no_recursion)]
    pub steps: Vec<StepDef>,
    pub updated_at: String,
}

/// One page of a tenant's workflows.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct WorkflowPage {
    pub items: Vec<WorkflowSummary>,
    pub next_cursor: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkflowSummary {
    pub workflow_id: String,
    pub name: String,
    pub category: Category,
    pub required: bool,
    pub version: u32,
    pub updated_at: String,
}

fn pk(t: &TenantId, id: &str) -> String {
    format!("T#{t}#WF#{id}")
}

fn head_key(t: &TenantId, id: &str) -> Key {
    Key::new(pk(t, id), "WF")
}

fn version_key(t: &TenantId, id: &str, version: u32) -> Key {
    Key::new(pk(t, id), format!("V#{version:08}"))
}

fn list_pk(t: &TenantId) -> String {
    format!("T#{t}#WFS")
}

/// Creates or changes a workflow: checked (each field named), then stored as a new version
/// unless it is the same as the latest.
pub async fn put_workflow(deps: &Deps, t: &TenantId, id: &str, input: WorkflowInput) -> CoreResult<Workflow> {
    check_id("workflow_id", id)?;
    definition::check(&input)?;
    check_templates(deps, t, &input).await?;
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    for _ in 0..5 {
        let latest = get_workflow(deps, t, id).await?;
        if let Some(w) = &latest
            && w.name == input.name
            && w.category == input.category
            && w.required == input.required
            && w.steps == input.steps
        {
            return Ok(w.clone());
        }
        let version = latest.as_ref().map_or(1, |w| w.version + 1);
        let w = Workflow {
            workflow_id: id.to_owned(),
            version,
            name: input.name.clone(),
            category: input.category,
            required: input.required,
            steps: input.steps.clone(),
            updated_at: now.clone(),
        };
        let head = Item::new(head_key(t, id), attrs_of(&w)?);
        crate::sizes::check_stored("steps", &head)?;
        let cond = match &latest {
            Some(l) => Cond::eq("version", i64::from(l.version)),
            None => Cond::NotExists,
        };
        let summary = WorkflowSummary {
            workflow_id: id.to_owned(),
            name: w.name.clone(),
            category: w.category,
            required: w.required,
            version,
            updated_at: now.clone(),
        };
        let writes = vec![
            Write::Put { item: head.clone(), cond },
            Write::Put { item: Item::new(version_key(t, id, version), head.attrs.clone()), cond: Cond::Always },
            Write::Put { item: Item::new(Key::new(list_pk(t), id), attrs_of(&summary)?), cond: Cond::Always },
        ];
        match deps.table.transact(writes).await {
            Ok(()) => return Ok(w),
            // Another PUT made this version first: read again.
            Err(StoreError::ConditionFailed { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CoreError::conflict("concurrent_change", "the workflow is being changed by other requests; try again"))
}

/// Every send's template exists and has content for each of its channels.
async fn check_templates(deps: &Deps, t: &TenantId, input: &WorkflowInput) -> CoreResult<()> {
    for (field, template_id, channels) in definition::sends(&input.steps) {
        let Some(template) = templates::get_template(deps, t, &template_id).await? else {
            return Err(CoreError::invalid(
                field,
                format!("no template {template_id}: create it with PUT /v1/templates/{template_id}"),
            ));
        };
        for c in channels {
            if !template.locales.values().any(|content| templates::has_body(content, c)) {
                return Err(CoreError::invalid(field, format!("the template {template_id} has no {c} content")));
            }
        }
    }
    Ok(())
}

/// The latest version.
pub async fn get_workflow(deps: &Deps, t: &TenantId, id: &str) -> CoreResult<Option<Workflow>> {
    check_id("workflow_id", id)?;
    match deps.table.get(&head_key(t, id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

/// One version (what a run follows).
pub async fn get_version(deps: &Deps, t: &TenantId, id: &str, version: u32) -> CoreResult<Option<Workflow>> {
    match deps.table.get(&version_key(t, id, version)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

/// The tenant's workflows, in id order.
pub async fn list(deps: &Deps, t: &TenantId, limit: usize, cursor: Option<String>) -> CoreResult<WorkflowPage> {
    let page = deps
        .table
        .query(&list_pk(t), "", QueryOpts { limit, cursor, descending: false })
        .await
        .map_err(CoreError::of_page_query)?;
    let items = page.items.iter().map(Item::parse).collect::<Result<Vec<WorkflowSummary>, _>>()?;
    Ok(WorkflowPage { items, next_cursor: page.next_cursor })
}
