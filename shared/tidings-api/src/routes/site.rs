//! The shop's own site (docs/site.md): the origins whose pages may call `/v1/me` (tenant key),
//! and the hosted preferences page every marketing email links to (`GET|POST /p/{token}`, no
//! key: the signed token in the path is the credential).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tidings_core::people::preferences::{PreferencesInput, WorkflowPreference};
use tidings_core::site::{self, AllowedOrigins, AllowedOriginsInput, MyPreferences};
use tidings_core::templates::email::escape_attr as esc;
use tidings_core::tracking::{self, TokenKind};
use tracing::warn;

use crate::extract::{Body, PathParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(put_allowed_origins, get_allowed_origins, preferences_page, save_preferences_page))]
pub(super) struct Api;

/// The buyers' route: the hosted preferences page.
pub fn router() -> Router<AppState> {
    Router::new().route("/p/{token}", get(preferences_page).post(save_preferences_page))
}

/// The shop's setting: the origins whose pages may call `/v1/me`.
pub fn settings_router() -> Router<AppState> {
    Router::new().route("/v1/settings/allowed-origins", get(get_allowed_origins).put(put_allowed_origins))
}

/// Replaces the origins whose pages get CORS answers from the `/v1/me` routes (with a user
/// token of this tenant): `https://shop.example`, `http://localhost:8080`. No path, no
/// wildcard; an empty list lets no page in.
#[utoipa::path(put, path = "/v1/settings/allowed-origins", tag = "site", security(("api_key" = [])),
    request_body = AllowedOriginsInput,
    responses((status = 200, description = "The origins, as kept (lower case, without a default port)", body = AllowedOrigins),
        (status = 422, description = "Not an origin; `field` names it (`origins[0]`)", body = Problem,
            content_type = "application/problem+json")))]
async fn put_allowed_origins(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(input): Body<AllowedOriginsInput>,
) -> ApiResult<Json<AllowedOrigins>> {
    Ok(Json(site::put_allowed_origins(&s.deps, &t, input).await?))
}

/// The origins whose pages get CORS answers from `/v1/me` (none when never set).
#[utoipa::path(get, path = "/v1/settings/allowed-origins", tag = "site", security(("api_key" = [])),
    responses((status = 200, description = "The origins", body = AllowedOrigins)))]
async fn get_allowed_origins(State(s): State<AppState>, Tenant(t): Tenant) -> ApiResult<Json<AllowedOrigins>> {
    Ok(Json(site::allowed_origins(&s.deps, &t).await?))
}

/// A page's answer: HTML that is never cached, framed, or sent on as a referrer (the path holds
/// the token), and that may post only to itself.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=en><meta charset=utf-8><meta name=viewport content=\"width=device-width,initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style><main><h1>{}</h1>{body}</main></html>",
        esc(title),
        esc(title)
    );
    let mut res = (status, html).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    res
}

const STYLE: &str = "body{font:16px/1.5 system-ui,sans-serif;margin:0;background:#f6f6f6;color:#222}\
main{max-width:40rem;margin:2rem auto;padding:1.5rem;background:#fff;border-radius:8px}\
table{border-collapse:collapse;width:100%;margin:1rem 0}th,td{padding:.4rem;border-bottom:1px solid #ddd;text-align:left}\
td.c,th.c{text-align:center}.note{color:#555;font-size:.9rem}.saved{color:#0a6b2d}button{font:inherit;padding:.5rem 1.2rem}";

fn invalid_link() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "This link is not valid",
        "<p>This preferences link is not valid, or it has expired. Open the link in a newer email from us, \
         or change your preferences in your account on our site.</p>",
    )
}

/// Whose preferences a page token opens, or the page to answer instead.
async fn owner(s: &AppState, token: &str) -> Result<(tidings_core::TenantId, String), Response> {
    let Ok(claims) = tracking::verify(&s.deps.config, TokenKind::Preferences, token, s.deps.clock.now().timestamp())
    else {
        return Err(invalid_link());
    };
    match tidings_core::people::erasure::stops_link(&s.deps, &claims.t, &claims.u, &claims.n).await {
        Ok(false) => Ok((claims.t, claims.u)),
        Ok(true) => Err(page(StatusCode::OK, "Nothing to manage", "<p>We keep no preferences for you any more.</p>")),
        Err(e) => Err(unavailable(&e)),
    }
}

fn unavailable(e: &dyn std::fmt::Display) -> Response {
    warn!(error = %e, "preferences page unavailable");
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Please try again",
        "<p>Your preferences could not be reached just now. Please try again in a minute.</p>",
    )
}

/// The hosted preferences page: the user's categories, channels and workflows × channels as
/// checkboxes, required workflows locked, and a form that posts back to this URL.
#[utoipa::path(get, path = "/p/{token}", tag = "site", params(("token" = String, Path, description = "The signed token of a marketing email's preferences link")),
    responses((status = 200, description = "The preferences page", content_type = "text/html", body = String),
        (status = 404, description = "A forged or expired link: a page that says so", content_type = "text/html", body = String)))]
async fn preferences_page(State(s): State<AppState>, PathParams(token): PathParams<String>) -> Response {
    let (t, u) = match owner(&s, &token).await {
        Ok(o) => o,
        Err(res) => return res,
    };
    match site::my_preferences(&s.deps, &t, &u).await {
        Ok(p) => page(StatusCode::OK, "Your message preferences", &form(&p, None)),
        Err(e) => unavailable(&e),
    }
}

/// Saves the page's form (`application/x-www-form-urlencoded`): a box not sent is off.
#[utoipa::path(post, path = "/p/{token}", tag = "site", params(("token" = String, Path, description = "The signed token of a marketing email's preferences link")),
    request_body(content = String, content_type = "application/x-www-form-urlencoded", description = "The page's form: `save=1`, and `unsubscribe_all`, `category.{name}`, `channel.{name}`, `workflow.{id}.{channel}` for each box that is on"),
    responses((status = 200, description = "Saved: the page again, with a note", content_type = "text/html", body = String),
        (status = 400, description = "Not the page's form", content_type = "text/html", body = String),
        (status = 404, description = "A forged or expired link", content_type = "text/html", body = String)))]
async fn save_preferences_page(
    State(s): State<AppState>,
    PathParams(token): PathParams<String>,
    body: Bytes,
) -> Response {
    let (t, u) = match owner(&s, &token).await {
        Ok(o) => o,
        Err(res) => return res,
    };
    let fields: Vec<(String, String)> = url::form_urlencoded::parse(&body).into_owned().collect();
    if !fields.iter().any(|(k, _)| k == "save") {
        return page(
            StatusCode::BAD_REQUEST,
            "Not saved",
            "<p>This was not the preferences form. Open the link again.</p>",
        );
    }
    let catalog = match site::catalog(&s.deps, &t).await {
        Ok(c) => c,
        Err(e) => return unavailable(&e),
    };
    let on = |name: String| fields.iter().any(|(k, _)| *k == name);
    let mut workflows = BTreeMap::new();
    for w in catalog.workflows.iter().filter(|w| !w.required && !w.channels.is_empty()) {
        let channels = w
            .channels
            .iter()
            .map(|c| (c.as_str().to_owned(), on(format!("workflow.{}.{}", w.workflow_id, c.as_str()))));
        workflows.insert(w.workflow_id.clone(), WorkflowPreference::Channels(channels.collect()));
    }
    let input = PreferencesInput {
        unsubscribe_all: Some(on("unsubscribe_all".into())),
        categories: Some(
            catalog
                .categories
                .iter()
                .filter(|c| !c.required)
                .map(|c| (c.category.clone(), on(format!("category.{}", c.category))))
                .collect(),
        ),
        channels: Some(
            catalog.channels.iter().map(|c| (c.as_str().to_owned(), on(format!("channel.{}", c.as_str())))).collect(),
        ),
        quiet_hours: None,
        workflows: Some(workflows),
    };
    match site::put_my_preferences(&s.deps, &t, &u, input).await {
        Ok(p) => page(StatusCode::OK, "Your message preferences", &form(&p, Some("Saved."))),
        Err(tidings_core::CoreError::Invalid { field, detail }) => page(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Not saved",
            &format!("<p>{}: {}. Open the link again.</p>", esc(&field), esc(&detail)),
        ),
        Err(e) => unavailable(&e),
    }
}

fn checkbox(name: &str, checked: bool, locked: bool, label: &str) -> String {
    format!(
        "<input type=checkbox name=\"{}\" aria-label=\"{}\"{}{}>",
        esc(name),
        esc(label),
        if checked { " checked" } else { "" },
        if locked { " disabled" } else { "" }
    )
}

/// The page's form. Every value from the tenant or the user is escaped.
fn form(p: &MyPreferences, note: Option<&str>) -> String {
    let prefs = &p.preferences;
    let mut out = String::new();
    if let Some(note) = note {
        out.push_str(&format!("<p class=saved role=status>{}</p>", esc(note)));
    }
    out.push_str("<form method=post><input type=hidden name=save value=1>");
    out.push_str("<h2>Kinds of message</h2><table>");
    for c in &p.catalog.categories {
        let name = &c.category;
        let on = c.required || prefs.categories.get(name).copied().unwrap_or(true);
        let label = if c.required { format!("{name} (always sent; turn a channel off instead)") } else { name.clone() };
        out.push_str(&format!(
            "<tr><td><label>{} {}</label></td></tr>",
            checkbox(&format!("category.{name}"), on, c.required, name),
            esc(&label)
        ));
    }
    out.push_str("</table><h2>Channels</h2><table>");
    for c in &p.catalog.channels {
        let on = prefs.channels.get(c.as_str()).copied().unwrap_or(true);
        out.push_str(&format!(
            "<tr><td><label>{} {}</label></td></tr>",
            checkbox(&format!("channel.{}", c.as_str()), on, false, c.as_str()),
            esc(c.as_str())
        ));
    }
    out.push_str("</table>");
    if !p.catalog.workflows.is_empty() {
        out.push_str("<h2>Messages</h2><table><tr><th>Message</th>");
        for c in &p.catalog.channels {
            out.push_str(&format!("<th class=c>{}</th>", esc(c.as_str())));
        }
        out.push_str("</tr>");
        for w in &p.catalog.workflows {
            let name = if w.required { format!("{} (required)", w.name) } else { w.name.clone() };
            out.push_str(&format!("<tr><td>{}</td>", esc(&name)));
            for c in &p.catalog.channels {
                if w.channels.contains(c) {
                    let on = w.required || prefs.workflow_on(&w.workflow_id, *c);
                    let field = format!("workflow.{}.{}", w.workflow_id, c.as_str());
                    let label = format!("{} by {}", w.name, c.as_str());
                    out.push_str(&format!("<td class=c>{}</td>", checkbox(&field, on, w.required, &label)));
                } else {
                    out.push_str("<td class=c>–</td>");
                }
            }
            out.push_str("</tr>");
        }
        out.push_str("</table><p class=note>Required messages (security, one-time codes) are always sent.</p>");
    }
    out.push_str(&format!(
        "<p><label>{} Unsubscribe from everything that can be turned off</label></p>",
        checkbox("unsubscribe_all", prefs.unsubscribe_all, false, "unsubscribe from everything")
    ));
    out.push_str("<p><button type=submit>Save</button></p></form>");
    out
}
