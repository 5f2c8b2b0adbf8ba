//! What a send's template renders with, and what `POST /v1/notifications` checks of it before it
//! answers (docs/delivery.md, "Accept: checked before it answers").
//!
//! A template renders with the request's `params` and the recipient's attributes: `user_id`,
//! always, and `locale`, when the user has one ([`params_for`]). At accept, the template is read
//! once and each of its contents that the send may use (every locale's, for each channel the
//! request names, else for each channel the template has) is rendered once, with the request's
//! params and stand-ins for the recipient's attributes: a placeholder the params do not give is
//! then missing for every recipient, and the request is refused (422 `missing_param` naming
//! `params.{name}`) rather than accepted to fail every delivery. Nothing is rendered per
//! recipient here; what only some recipients lack (a `locale`) fails their deliveries, each
//! with `template_error: missing placeholder {name}`.

use serde_json::{Value, json};

use super::model::NotificationRequest;
use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::TenantId;
use crate::ports::Channel;
use crate::templates::{self, Template, TemplateError};

/// The params a delivery renders with: the request's, plus `user_id` and the user's `locale`
/// when the request does not give them.
pub fn params_for(params: &Value, user_id: &str, locale: Option<&str>) -> Value {
    let mut p = params.clone();
    if let Value::Object(map) = &mut p {
        map.entry("user_id").or_insert_with(|| json!(user_id));
        if let Some(locale) = locale {
            map.entry("locale").or_insert_with(|| json!(locale));
        }
    }
    p
}

/// The stand-in recipient id of the renders at accept: only a missing placeholder is refused
/// there, and no recipient's id changes which placeholders the params give.
const STAND_IN_USER: &str = "u";

/// Checks the request against its template: it exists (else 422 naming `template_id`), has
/// content for each channel the request names (else 422 naming `channels[i]`), and every
/// placeholder its contents need is given by the params or is a recipient's attribute (else 422
/// `missing_param` naming `params.{name}`). Returns the template.
pub async fn check_template(deps: &Deps, t: &TenantId, req: &NotificationRequest) -> CoreResult<Template> {
    let Some(template) = templates::get_template(deps, t, &req.template_id).await? else {
        return Err(CoreError::invalid(
            "template_id",
            format!("no template {}: create it with PUT /v1/templates/{}", req.template_id, req.template_id),
        ));
    };
    let has = |c: Channel| template.locales.values().any(|content| templates::has_body(content, c));
    let channels: Vec<Channel> = match &req.channels {
        Some(named) => {
            for (i, c) in named.iter().enumerate() {
                if !has(*c) {
                    return Err(CoreError::invalid(
                        format!("channels[{i}]"),
                        format!("the template {} has no {c} content", req.template_id),
                    ));
                }
            }
            named.clone()
        }
        None => Channel::ALL.into_iter().filter(|c| has(*c)).collect(),
    };
    // The params copied once (they may be large), the stand-in locale set for each content.
    let mut params = params_for(&req.params, STAND_IN_USER, None);
    let locale_given = req.params.get("locale").is_some();
    for (locale, content) in &template.locales {
        if let Value::Object(map) = &mut params
            && !locale_given
        {
            map.insert("locale".into(), json!(locale));
        }
        for &channel in channels.iter().filter(|c| templates::has_body(content, **c)) {
            // Only a missing placeholder is refused here: another render error (a limit the
            // values break) may depend on the recipient, and fails that delivery alone.
            if let Err(TemplateError::MissingPlaceholder(name)) = template.render(channel, Some(locale), &params) {
                return Err(CoreError::missing_param(
                    &name,
                    format!(
                        "the template {} ({locale}, {channel}) uses {{{{ {name} }}}}: give it in params",
                        req.template_id
                    ),
                ));
            }
        }
    }
    Ok(template)
}
