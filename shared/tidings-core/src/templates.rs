//! Templates: per-locale content for each channel, rendered with minijinja.
//!
//! Placeholders are `{{ name }}`. An undefined placeholder is an error (strict mode): the send
//! fails permanently with `template_error` instead of going out with a hole in it. Email bodies
//! are HTML-escaped.

use std::collections::BTreeMap;

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::{Channel, Cond, Item, attrs_of};

/// The content of one locale. Every field is optional: a channel without content cannot be
/// used with this template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocaleContent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email_subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email_body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inapp_title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inapp_body: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Template {
    #[serde(default)]
    pub template_id: String,
    pub default_locale: String,
    pub locales: BTreeMap<String, LocaleContent>,
    #[serde(default)]
    pub updated_at: String,
}

/// A message rendered for one channel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rendered {
    /// Email subject, push title or in-app title.
    pub subject: Option<String>,
    pub body: String,
    pub locale: String,
}

/// Why rendering failed; always permanent for the delivery.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TemplateError {
    #[error("template_error: template {0} not found")]
    NotFound(String),
    #[error("template_error: template has no {0} content")]
    NoContent(Channel),
    #[error("template_error: {0}")]
    Render(String),
}

impl Template {
    /// Checks syntax of every field so a broken template is refused when it is saved.
    pub fn validate(&self) -> CoreResult<()> {
        if !self.locales.contains_key(&self.default_locale) {
            return Err(CoreError::invalid("default_locale", "must be one of the keys of locales"));
        }
        let env = environment();
        for (locale, c) in &self.locales {
            let fields = [
                ("email_subject", &c.email_subject),
                ("email_body", &c.email_body),
                ("sms", &c.sms),
                ("push_title", &c.push_title),
                ("push_body", &c.push_body),
                ("inapp_title", &c.inapp_title),
                ("inapp_body", &c.inapp_body),
            ];
            for (name, text) in fields {
                if let Some(text) = text
                    && let Err(e) = env.template_from_str(text)
                {
                    return Err(CoreError::invalid(format!("locales.{locale}.{name}"), e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// The locales to try for a reader's locale, best first: exact match, then the language
    /// alone (`zh` for `zh-CN`), then the template's default.
    fn candidates(&self, locale: Option<&str>) -> Vec<(&str, &LocaleContent)> {
        let mut out: Vec<(&str, &LocaleContent)> = Vec::new();
        if let Some(l) = locale {
            if let Some((k, c)) = self.locales.get_key_value(l) {
                out.push((k, c));
            }
            let lang = l.split(['-', '_']).next().unwrap_or(l);
            if let Some((k, c)) = self.locales.iter().find(|(k, _)| k.split(['-', '_']).next() == Some(lang)) {
                out.push((k, c));
            }
        }
        if let Some((k, c)) = self.locales.get_key_value(&self.default_locale) {
            out.push((k, c));
        }
        out
    }

    /// The content for a locale (see `candidates`).
    pub fn content_for(&self, locale: Option<&str>) -> (&str, &LocaleContent) {
        self.candidates(locale).into_iter().next().unwrap_or((&self.default_locale, EMPTY_CONTENT))
    }

    /// Whether some candidate locale has content for the channel.
    pub fn has_channel(&self, channel: Channel, locale: Option<&str>) -> bool {
        self.candidates(locale).iter().any(|(_, c)| body_of(c, channel).is_some())
    }

    pub fn render(&self, channel: Channel, locale: Option<&str>, params: &Value) -> Result<Rendered, TemplateError> {
        // The first locale that has this channel's content: a template translated for email
        // only still sends in-app messages, in its default language.
        let (locale, c) = self
            .candidates(locale)
            .into_iter()
            .find(|(_, c)| body_of(c, channel).is_some())
            .ok_or(TemplateError::NoContent(channel))?;
        let html = channel == Channel::Email;
        let subject = match channel {
            Channel::Email => c.email_subject.as_deref(),
            Channel::Push => c.push_title.as_deref(),
            Channel::Inapp => c.inapp_title.as_deref(),
            Channel::Sms => None,
        };
        let body = body_of(c, channel).ok_or(TemplateError::NoContent(channel))?;
        let env = environment();
        let render = |name: &str, text: &str| -> Result<String, TemplateError> {
            let mut env = env.clone();
            env.add_template_owned(name.to_owned(), text.to_owned())
                .map_err(|e| TemplateError::Render(e.to_string()))?;
            let tmpl = env.get_template(name).map_err(|e| TemplateError::Render(e.to_string()))?;
            tmpl.render(params).map_err(|e| TemplateError::Render(describe(&e)))
        };
        let subject = subject.map(|s| render("subject.txt", s)).transpose()?;
        let body = render(if html { "body.html" } else { "body.txt" }, body)?;
        Ok(Rendered { subject, body, locale: locale.to_owned() })
    }
}

fn body_of(c: &LocaleContent, channel: Channel) -> Option<&str> {
    match channel {
        Channel::Email => c.email_body.as_deref(),
        Channel::Sms => c.sms.as_deref(),
        Channel::Push => c.push_body.as_deref(),
        Channel::Inapp => c.inapp_body.as_deref(),
    }
}

static EMPTY_CONTENT: &LocaleContent = &LocaleContent {
    email_subject: None,
    email_body: None,
    sms: None,
    push_title: None,
    push_body: None,
    inapp_title: None,
    inapp_body: None,
};

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|name| if name.ends_with(".html") { AutoEscape::Html } else { AutoEscape::None });
    env
}

fn describe(e: &minijinja::Error) -> String {
    match e.kind() {
        minijinja::ErrorKind::UndefinedError => {
            format!("missing placeholder{}", e.detail().map(|d| format!(" ({d})")).unwrap_or_default())
        }
        _ => e.to_string(),
    }
}

/// The body of `PUT /v1/templates/{id}`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateInput {
    pub default_locale: String,
    pub locales: BTreeMap<String, LocaleContent>,
}

pub async fn put_template(deps: &Deps, t: &TenantId, template_id: &str, input: TemplateInput) -> CoreResult<Template> {
    check_id("template_id", template_id)?;
    let template = Template {
        template_id: template_id.to_owned(),
        default_locale: input.default_locale,
        locales: input.locales,
        updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    template.validate()?;
    deps.table.put(Item::new(keys::template(t, template_id), attrs_of(&template)?), Cond::Always).await?;
    Ok(template)
}

pub async fn get_template(deps: &Deps, t: &TenantId, template_id: &str) -> CoreResult<Option<Template>> {
    check_id("template_id", template_id)?;
    match deps.table.get(&keys::template(t, template_id)).await? {
        Some(item) => Ok(Some(item.parse()?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tpl() -> Template {
        let mut locales = BTreeMap::new();
        locales.insert(
            "en".into(),
            LocaleContent {
                email_subject: Some("Order {{ order_id }} shipped".into()),
                email_body: Some("<p>Hi {{ name }}</p>".into()),
                sms: Some("Order {{ order_id }} shipped".into()),
                ..Default::default()
            },
        );
        locales.insert(
            "zh-CN".into(),
            LocaleContent { sms: Some("订单 {{ order_id }} 已发货".into()), ..Default::default() },
        );
        Template { template_id: "t".into(), default_locale: "en".into(), locales, updated_at: String::new() }
    }

    #[test]
    fn renders_with_locale_fallback() {
        let t = tpl();
        let p = json!({"order_id": "123", "name": "Al"});
        assert_eq!(t.render(Channel::Sms, Some("zh-CN"), &p).map(|r| r.body), Ok("订单 123 已发货".into()));
        assert_eq!(t.render(Channel::Sms, Some("zh"), &p).map(|r| r.locale), Ok("zh-CN".into()));
        assert_eq!(t.render(Channel::Sms, Some("fr"), &p).map(|r| r.body), Ok("Order 123 shipped".into()));
        assert_eq!(t.render(Channel::Sms, None, &p).map(|r| r.locale), Ok("en".into()));
    }

    #[test]
    fn missing_placeholder_is_an_error() {
        let t = tpl();
        let r = t.render(Channel::Sms, Some("en"), &json!({}));
        assert!(matches!(r, Err(TemplateError::Render(ref m)) if m.contains("missing placeholder")), "{r:?}");
    }

    #[test]
    fn email_body_is_escaped_but_sms_is_not() {
        let t = tpl();
        let p = json!({"order_id": "<b>", "name": "<script>"});
        let email = t.render(Channel::Email, Some("en"), &p);
        assert!(matches!(&email, Ok(r) if r.body == "<p>Hi &lt;script&gt;</p>"), "{email:?}");
        assert!(matches!(&email, Ok(r) if r.subject.as_deref() == Some("Order <b> shipped")));
        assert_eq!(t.render(Channel::Sms, Some("en"), &p).map(|r| r.body), Ok("Order <b> shipped".into()));
    }

    #[test]
    fn a_channel_missing_in_the_locale_falls_back_to_the_default() {
        let mut t = tpl();
        t.locales.get_mut("en").unwrap().inapp_body = Some("Order {{ order_id }}".into());
        let r = t.render(Channel::Inapp, Some("zh-CN"), &json!({"order_id": "1"}));
        assert_eq!(r.map(|r| (r.locale, r.body)), Ok(("en".into(), "Order 1".into())));
    }

    #[test]
    fn channel_without_content_is_an_error() {
        assert_eq!(tpl().render(Channel::Push, None, &json!({})), Err(TemplateError::NoContent(Channel::Push)));
    }

    #[test]
    fn broken_syntax_is_refused_on_save() {
        let mut t = tpl();
        t.locales.insert("de".into(), LocaleContent { sms: Some("{{ oops".into()), ..Default::default() });
        assert!(matches!(t.validate(), Err(CoreError::Invalid { field, .. }) if field == "locales.de.sms"));
    }
}
