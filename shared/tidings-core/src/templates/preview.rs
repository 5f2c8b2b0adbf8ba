//! `POST /v1/templates/{id}/preview`: a template rendered as a send renders it, through
//! [`Template::render`] (the same engine, sandbox, limits and locale fallback), without
//! sending anything. A send's tracking (the open pixel, rewritten links, the unsubscribe
//! headers) is added after rendering and is not shown.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::ports::Channel;
use crate::templates::{self, Template, TemplateError};

/// The body of a preview.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// The notification's `params`.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object, example = json!({"order_id": "123"}))]
    pub params: Value,
    /// The reader's locale: one of the template's, exactly or by its language (`zh` finds
    /// `zh-CN`); a channel that locale has no content for falls back to the default locale, as
    /// a send does. Absent: the default locale.
    #[serde(default)]
    #[schema(example = "zh-CN", min_length = 1, max_length = 35, pattern = "^[A-Za-z0-9_-]{1,35}$")]
    pub locale: Option<String>,
    /// The channels to render; absent: every channel the template has content for.
    #[serde(default)]
    #[schema(example = json!(["email", "sms"]))]
    pub channels: Option<Vec<Channel>>,
    /// The `user_id` placeholder, which a send fills with the recipient's id (default
    /// `preview`).
    #[serde(default)]
    #[schema(example = "u1", min_length = 1, max_length = 128, pattern = "^[A-Za-z0-9._:@+-]+$")]
    pub user_id: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// One channel's message, as it would be sent.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PreviewPart {
    pub channel: Channel,
    /// The locale whose content was used.
    #[schema(example = "en")]
    pub locale: String,
    /// The email subject, push title or in-app title.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "Order 123 shipped")]
    pub subject: Option<String>,
    /// The message; for an email, its text part.
    #[schema(example = "Your order 123 is on its way.")]
    pub body: String,
    /// An email's HTML part (written or derived, as a send has it); absent for other channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "<p>Your order 123 is on its way.</p>")]
    pub html: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Preview {
    pub template_id: String,
    pub parts: Vec<PreviewPart>,
}

/// Whether the template has the locale, exactly or by its language.
fn has_locale(template: &Template, locale: &str) -> bool {
    let lang = |l: &str| l.split(['-', '_']).next().unwrap_or_default().to_owned();
    template.locales.contains_key(locale) || template.locales.keys().any(|k| lang(k) == lang(locale))
}

/// Renders the template; `None` when it does not exist.
pub async fn preview(deps: &Deps, t: &TenantId, template_id: &str, req: PreviewRequest) -> CoreResult<Option<Preview>> {
    let Some(template) = templates::get_template(deps, t, template_id).await? else { return Ok(None) };
    if !req.params.is_object() {
        return Err(CoreError::invalid("params", "must be an object"));
    }
    if let Some(locale) = &req.locale {
        let tag = !locale.is_empty()
            && locale.len() <= 35
            && locale.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !tag {
            return Err(CoreError::invalid("locale", "not a language tag such as en or zh-CN"));
        }
        if !has_locale(&template, locale) {
            let known: Vec<&str> = template.locales.keys().map(String::as_str).collect();
            return Err(CoreError::invalid(
                "locale",
                format!("the template has no locale {locale} nor its language (it has {})", known.join(", ")),
            ));
        }
    }
    if let Some(id) = &req.user_id {
        check_id("user_id", id)?;
    }
    // The params a send renders with: the request's, and the recipient's id and locale
    // (`notify::orchestrator`), here the preview's.
    let mut params = req.params.clone();
    if let Value::Object(map) = &mut params {
        map.entry("user_id").or_insert_with(|| Value::from(req.user_id.clone().unwrap_or_else(|| "preview".into())));
        if let Some(locale) = &req.locale {
            map.entry("locale").or_insert_with(|| Value::from(locale.clone()));
        }
    }
    let locale = req.locale.as_deref();
    let channels: Vec<(String, Channel)> = match &req.channels {
        Some(list) => list.iter().enumerate().map(|(i, c)| (format!("channels[{i}]"), *c)).collect(),
        None => Channel::ALL
            .into_iter()
            .filter(|c| template.has_channel(*c, locale))
            .map(|c| ("channels".to_owned(), c))
            .collect(),
    };
    let mut parts = Vec::with_capacity(channels.len());
    for (field, channel) in channels {
        let rendered = template.render(channel, locale, &params).map_err(|e| match e {
            TemplateError::NoContent(_) => {
                CoreError::invalid(field.clone(), format!("the template has no {channel} content"))
            }
            TemplateError::MissingPlaceholder(name) => {
                CoreError::missing_param(&name, format!("missing placeholder {name}: give it in params"))
            }
            other => CoreError::invalid("params", other.to_string()),
        })?;
        parts.push(PreviewPart {
            channel,
            locale: rendered.locale,
            subject: rendered.subject,
            body: rendered.body,
            html: rendered.html,
        });
    }
    Ok(Some(Preview { template_id: template_id.to_owned(), parts }))
}
