//! Templates: per-locale content for each channel, rendered with minijinja.
//!
//! Placeholders are `{{ name }}`. An undefined placeholder is an error (strict mode): the send
//! fails permanently with `template_error` instead of going out with a hole in it.
//!
//! An email has a text part, `email_body`, and an HTML part, `email_html` (docs/security.md,
//! "Email parts"); either may be left out and is then derived from the other ([`crate::templates::email`]). Only
//! the HTML part escapes placeholders as HTML; the text part takes them as they are. An
//! `email_body` written as HTML (with tags) and no `email_html` is the HTML part: templates
//! written before there was an `email_html` kept their markup there.
//!
//! Templates are tenant code running in workers that every tenant shares, so rendering is
//! bounded by construction (docs/templates.md, "Limits"): the engine registers an allowlist of
//! filters, tests and functions, each called through one guard that bounds the arguments that
//! size something, charges what goes in and out to the render's work budget ([`MAX_WORK`]) and
//! refuses a result over [`MAX_VALUE_BYTES`] (`engine`); fuel bounds the instructions, a writer
//! the output, and a sandbox checked when a template is saved and again before it renders
//! refuses what could grow a value without spending either: `*` and `**`, every block but `if`,
//! `for` and `raw` (`set`, `with`, `filter`, `macro` build values no cap sees), recursive loops,
//! slices with a step, and more than [`MAX_CONCATS`] `~` or `+` in one field. Breaking a limit
//! fails the delivery with `template_error`, permanently, and touches nothing else; a panic inside
//! the engine fails that render alone.

pub mod email;
mod engine;
pub mod preview;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use minijinja::machinery::{Token, WhitespaceConfig, tokenize};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::keys;
use crate::ports::{Channel, Cond, Item, attrs_of};
pub use engine::{FUEL, MAX_FORMAT_WIDTH, MAX_RANGE, MAX_VALUE_BYTES, MAX_WORK, RECURSION_LIMIT};
use engine::{LIMIT, environment};

/// The content of one locale. Every field is optional: a channel without content cannot be
/// used with this template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocaleContent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email_subject: Option<String>,
    /// The email's text part (plain text, placeholders not escaped); HTML is derived from it when
    /// `email_html` is absent. Written as HTML (with tags) and without `email_html`, it is taken
    /// as the HTML part instead and the text is derived (templates made before `email_html`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        max_length = 131072,
        example = "Hi {{ name }},\n\nyour order {{ order_id }} is on its way: https://shop.example/o/{{ order_id }}"
    )]
    pub email_body: Option<String>,
    /// The email's HTML part (placeholders HTML-escaped); the text part is derived from it when
    /// `email_body` is absent. With both given, `email_body` must be plain text (no tags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        max_length = 131072,
        example = "<p>Hi {{ name }},</p><p>your order <a href=\"https://shop.example/o/{{ order_id }}\">{{ order_id }}</a> is on its way.</p>"
    )]
    pub email_html: Option<String>,
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
    /// The message; for an email, its text part.
    pub body: String,
    /// An email's HTML part (always there for an email, written or derived); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
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
    /// An undefined placeholder, named as the params would give it (`order_id`, `order.id`):
    /// strict mode sends no message with a hole in it.
    #[error("template_error: missing placeholder {0}")]
    MissingPlaceholder(String),
    /// A limit of the module documentation.
    #[error("template_error: limit: {0}")]
    Limit(String),
}

impl TemplateError {
    /// The reason alone, for a problem document.
    fn message(&self) -> String {
        match self {
            TemplateError::Limit(m) => format!("limit: {m}"),
            TemplateError::Render(m) => m.clone(),
            TemplateError::MissingPlaceholder(name) => format!("missing placeholder {name}"),
            other => other.to_string(),
        }
    }
}

/// The whole template (every locale), well inside a table item.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// `~` and `+` in one field: with neither `set` nor macros, a value grows only through them.
pub const MAX_CONCATS: usize = 16;
/// An SMS is at most this many segments (153 GSM-7 characters or 67 UCS-2 units each).
pub const SMS_MAX_SEGMENTS: usize = 10;
/// Push title and body together, rendered: APNs and FCM refuse a payload over 4 KB, and the
/// payload also carries the JSON around them and the data.
pub const PUSH_MAX_BYTES: usize = 3_500;

/// One content field of a locale, with its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    EmailSubject,
    EmailBody,
    EmailHtml,
    Sms,
    PushTitle,
    PushBody,
    InappTitle,
    InappBody,
}

impl Field {
    pub const ALL: [Field; 8] = [
        Field::EmailSubject,
        Field::EmailBody,
        Field::EmailHtml,
        Field::Sms,
        Field::PushTitle,
        Field::PushBody,
        Field::InappTitle,
        Field::InappBody,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::EmailSubject => "email_subject",
            Field::EmailBody => "email_body",
            Field::EmailHtml => "email_html",
            Field::Sms => "sms",
            Field::PushTitle => "push_title",
            Field::PushBody => "push_body",
            Field::InappTitle => "inapp_title",
            Field::InappBody => "inapp_body",
        }
    }

    /// The largest source, in bytes.
    pub fn max_source(self) -> usize {
        match self {
            Field::EmailBody | Field::EmailHtml => 128 * 1024,
            Field::InappBody => 16 * 1024,
            Field::Sms | Field::PushBody => 4 * 1024,
            Field::EmailSubject | Field::PushTitle | Field::InappTitle => 1024,
        }
    }

    /// The largest rendered text, in bytes (an SMS is also held to [`SMS_MAX_SEGMENTS`], a push
    /// title and body together to [`PUSH_MAX_BYTES`]).
    pub fn max_rendered(self) -> usize {
        match self {
            Field::EmailBody | Field::EmailHtml => 256 * 1024,
            // A header line is at most 998 characters (RFC 5322).
            Field::EmailSubject => 998,
            Field::Sms => 4 * 1024,
            Field::PushTitle | Field::PushBody => PUSH_MAX_BYTES,
            Field::InappTitle => 1024,
            Field::InappBody => 16 * 1024,
        }
    }

    fn of(self, c: &LocaleContent) -> Option<&str> {
        match self {
            Field::EmailSubject => c.email_subject.as_deref(),
            Field::EmailBody => c.email_body.as_deref(),
            Field::EmailHtml => c.email_html.as_deref(),
            Field::Sms => c.sms.as_deref(),
            Field::PushTitle => c.push_title.as_deref(),
            Field::PushBody => c.push_body.as_deref(),
            Field::InappTitle => c.inapp_title.as_deref(),
            Field::InappBody => c.inapp_body.as_deref(),
        }
    }

    /// Whether this field of `c` is HTML, its placeholders escaped: the HTML part of an email.
    fn is_html(self, c: &LocaleContent) -> bool {
        match self {
            Field::EmailHtml => true,
            Field::EmailBody => matches!(EmailParts::of(c), Some(EmailParts::Html(Field::EmailBody, _))),
            _ => false,
        }
    }
}

/// The engine's name for a field's template: `.html` ones escape their placeholders.
fn template_name(html: bool) -> &'static str {
    if html { "body.html" } else { "body.txt" }
}

/// Where a locale's two email parts come from (module documentation).
#[derive(Clone, Copy, Debug)]
enum EmailParts<'a> {
    /// Both written: `email_body` the text, `email_html` the HTML.
    Both(&'a str, &'a str),
    /// The text only: the HTML is derived from it.
    Text(&'a str),
    /// The HTML only (`email_html`, or an `email_body` written as HTML): the text is derived.
    Html(Field, &'a str),
}

impl<'a> EmailParts<'a> {
    fn of(c: &'a LocaleContent) -> Option<Self> {
        match (c.email_body.as_deref(), c.email_html.as_deref()) {
            (Some(text), Some(html)) => Some(EmailParts::Both(text, html)),
            (None, Some(html)) => Some(EmailParts::Html(Field::EmailHtml, html)),
            (Some(body), None) if source_has_markup(body) => Some(EmailParts::Html(Field::EmailBody, body)),
            (Some(text), None) => Some(EmailParts::Text(text)),
            (None, None) => None,
        }
    }
}

/// Whether a template's own text (not its tags and expressions) holds HTML markup.
fn source_has_markup(source: &str) -> bool {
    #[allow(clippy::default_constructed_unit_structs)]
    let syntax = SyntaxConfig::default();
    tokenize(source, false, syntax, WhitespaceConfig::default())
        .filter_map(Result::ok)
        .any(|(token, _)| matches!(token, Token::TemplateData(text) if crate::templates::email::has_markup(text)))
}

/// Renders both parts of an email, deriving the one not written. The error names the field it
/// comes from.
fn render_email(
    parts: EmailParts<'_>,
    params: &Value,
    undefined: UndefinedBehavior,
) -> Result<(String, String), (Field, TemplateError)> {
    let cap = Field::EmailHtml.max_rendered();
    let render = |field: Field, source: &str, html: bool| {
        render_source(field, source, html, params, cap, undefined).map_err(|e| (field, e))
    };
    match parts {
        EmailParts::Both(text, html) => {
            Ok((render(Field::EmailBody, text, false)?, render(Field::EmailHtml, html, true)?))
        }
        EmailParts::Text(source) => {
            let text = render(Field::EmailBody, source, false)?;
            let html = crate::templates::email::text_to_html(&text);
            if html.len() > cap {
                return Err((
                    Field::EmailBody,
                    TemplateError::Limit(format!(
                        "the HTML made from email_body is {} bytes; at most {cap}",
                        html.len()
                    )),
                ));
            }
            Ok((text, html))
        }
        EmailParts::Html(field, source) => {
            let html = render(field, source, true)?;
            let text = crate::templates::email::html_to_text(&html);
            if text.len() > cap {
                return Err((
                    field,
                    TemplateError::Limit(format!(
                        "the text made from {} is {} bytes; at most {cap}",
                        field.name(),
                        text.len()
                    )),
                ));
            }
            Ok((text, html))
        }
    }
}

/// What [`Template::validate`] checks of a locale's email as a whole: a text part with tags
/// beside an HTML part is refused (the text part holds no markup), and both parts, rendered
/// without placeholders, must fit a queue message together.
fn check_email(parts: EmailParts<'_>, params: &Value) -> Result<(), (Field, TemplateError)> {
    if let EmailParts::Both(text, _) = parts
        && source_has_markup(text)
    {
        return Err((
            Field::EmailBody,
            TemplateError::Render(
                "the text part must be plain text, without HTML tags, when email_html is given".into(),
            ),
        ));
    }
    match render_email(parts, params, UndefinedBehavior::Chainable) {
        Err((field, e @ TemplateError::Limit(_))) => Err((field, e)),
        // An email goes to its channel worker as one queue message (both parts escaped as JSON,
        // beside the task's other fields): parts that cannot fit one even without their
        // placeholders could never be sent.
        Ok((text, html)) if queued_len(&text).saturating_add(queued_len(&html)) > MAX_QUEUED_EMAIL_BODY => {
            let field = match parts {
                EmailParts::Both(..) if queued_len(&text) >= queued_len(&html) => Field::EmailBody,
                EmailParts::Both(..) => Field::EmailHtml,
                EmailParts::Text(_) => Field::EmailBody,
                EmailParts::Html(field, _) => field,
            };
            Err((
                field,
                TemplateError::Limit(format!(
                    "the email's text and HTML parts are {} bytes in a queue message even without its placeholders; at most {MAX_QUEUED_EMAIL_BODY}",
                    queued_len(&text).saturating_add(queued_len(&html))
                )),
            ))
        }
        // Anything else depends on the variables a notification brings.
        _ => Ok(()),
    }
}

impl Template {
    /// Checks every field so that a broken or hostile template is refused when it is saved:
    /// its size, its syntax, the sandbox, and a trial render with no variables (undefined
    /// ones allowed) that must stay within fuel and the rendered size.
    pub fn validate(&self) -> CoreResult<()> {
        if !self.locales.contains_key(&self.default_locale) {
            return Err(CoreError::invalid("default_locale", "must be one of the keys of locales"));
        }
        let total: usize = self.locales.values().flat_map(|c| Field::ALL.map(|f| f.of(c).map_or(0, str::len))).sum();
        if total > MAX_TEMPLATE_BYTES {
            return Err(CoreError::invalid(
                "locales",
                format!("the template is {total} bytes; at most {MAX_TEMPLATE_BYTES} in all locales together"),
            ));
        }
        for (locale, c) in &self.locales {
            let invalid = |field: Field, e: TemplateError| {
                CoreError::invalid(format!("locales.{locale}.{}", field.name()), e.message())
            };
            for field in Field::ALL {
                let Some(text) = field.of(c) else { continue };
                check_field(field, text, field.is_html(c), &json_empty()).map_err(|e| invalid(field, e))?;
            }
            if let Some(parts) = EmailParts::of(c) {
                check_email(parts, &json_empty()).map_err(|(field, e)| invalid(field, e))?;
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
        let (subject_field, body_field) = fields_of(channel);
        check_params(params)?;
        let subject = match subject_field.and_then(|f| f.of(c).map(|text| (f, text))) {
            Some((f, text)) => Some(render_field(f, text, false, params, f.max_rendered())?),
            None => None,
        };
        if channel == Channel::Email {
            let parts = EmailParts::of(c).ok_or(TemplateError::NoContent(channel))?;
            let (body, html) = render_email(parts, params, UndefinedBehavior::Strict).map_err(|(_, e)| e)?;
            return Ok(Rendered { subject, body, html: Some(html), locale: locale.to_owned() });
        }
        let body = body_field.of(c).ok_or(TemplateError::NoContent(channel))?;
        let cap = match channel {
            Channel::Push => PUSH_MAX_BYTES.saturating_sub(subject.as_ref().map_or(0, String::len)),
            _ => body_field.max_rendered(),
        };
        let body = render_field(body_field, body, false, params, cap)?;
        if channel == Channel::Sms {
            let segments = sms_segments(&body);
            if segments > SMS_MAX_SEGMENTS {
                return Err(TemplateError::Limit(format!(
                    "the SMS is {segments} segments; at most {SMS_MAX_SEGMENTS}"
                )));
            }
        }
        Ok(Rendered { subject, body, html: None, locale: locale.to_owned() })
    }
}

/// The subject field (if the channel has one) and the body field of a channel.
fn fields_of(channel: Channel) -> (Option<Field>, Field) {
    match channel {
        Channel::Email => (Some(Field::EmailSubject), Field::EmailBody),
        Channel::Push => (Some(Field::PushTitle), Field::PushBody),
        Channel::Inapp => (Some(Field::InappTitle), Field::InappBody),
        Channel::Sms => (None, Field::Sms),
    }
}

fn json_empty() -> Value {
    Value::Object(serde_json::Map::new())
}

/// A placeholder value over [`MAX_VALUE_BYTES`] (any string, however deep) is refused: values
/// are what `~` and `+` can grow.
fn check_params(params: &Value) -> Result<(), TemplateError> {
    fn walk(v: &Value) -> bool {
        match v {
            Value::String(s) => s.len() <= MAX_VALUE_BYTES,
            Value::Array(a) => a.iter().all(walk),
            Value::Object(o) => o.iter().all(|(k, v)| k.len() <= MAX_VALUE_BYTES && walk(v)),
            _ => true,
        }
    }
    if walk(params) {
        Ok(())
    } else {
        Err(TemplateError::Limit(format!("a placeholder value is over {MAX_VALUE_BYTES} bytes")))
    }
}

/// The most an email's two parts together may take in its queue message (as JSON strings),
/// leaving room for the task's other fields, its subject and headers
/// (`crate::sizes::MAX_MESSAGE_BYTES` in all).
pub const MAX_QUEUED_EMAIL_BODY: usize = crate::sizes::MAX_MESSAGE_BYTES - 8 * 1024;

/// A text's length as a JSON string (quotes, backslashes and control characters are escaped).
fn queued_len(text: &str) -> usize {
    serde_json::to_string(text).map_or(usize::MAX, |s| s.len())
}

/// What [`Template::validate`] checks of one field; the trial render runs with `params` and
/// undefined placeholders allowed, so only the limits can fail it (an email's parts together
/// are checked by [`check_email`]).
fn check_field(field: Field, text: &str, html: bool, params: &Value) -> Result<(), TemplateError> {
    if text.len() > field.max_source() {
        return Err(TemplateError::Limit(format!(
            "the source is {} bytes; at most {}",
            text.len(),
            field.max_source()
        )));
    }
    sandbox(text)?;
    let mut env = environment();
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    env.add_template_owned(template_name(html), text.to_owned()).map_err(|e| TemplateError::Render(engine_text(&e)))?;
    match run(&env, field, html, params, field.max_rendered()) {
        Err(e @ TemplateError::Limit(_)) => Err(e),
        Ok(rendered) if field == Field::Sms && sms_segments(&rendered) > SMS_MAX_SEGMENTS => {
            Err(TemplateError::Limit(format!(
                "the SMS is {} segments even without its placeholders; at most {SMS_MAX_SEGMENTS}",
                sms_segments(&rendered)
            )))
        }
        // Anything else depends on the variables a notification brings.
        _ => Ok(()),
    }
}

/// Checks a short template of the params (a workflow's digest or throttle `key`) as a
/// template field is checked at save: syntax and the sandbox.
pub fn check_fragment(text: &str) -> Result<(), String> {
    compiled(text, false, UndefinedBehavior::Chainable).map(|_| ()).map_err(|e| e.message())
}

/// Renders a short template of the params (a workflow's `key`): an undefined placeholder is
/// empty, the output at most 500 bytes.
pub fn render_fragment(text: &str, params: &Value) -> Result<String, TemplateError> {
    render_source(Field::InappTitle, text, false, params, 500, UndefinedBehavior::Chainable)
}

/// Renders one field, within its limits (`html`: its placeholders escaped as HTML).
fn render_field(field: Field, text: &str, html: bool, params: &Value, cap: usize) -> Result<String, TemplateError> {
    render_source(field, text, html, params, cap, UndefinedBehavior::Strict)
}

fn render_source(
    field: Field,
    text: &str,
    html: bool,
    params: &Value,
    cap: usize,
    undefined: UndefinedBehavior,
) -> Result<String, TemplateError> {
    if text.len() > field.max_source() {
        return Err(TemplateError::Limit(format!("{} is over {} bytes", field.name(), field.max_source())));
    }
    let env = compiled(text, html, undefined)?;
    run(&env, field, html, params, cap)
}

/// Environments with one source compiled, by (escaping, undefined behaviour, source): a
/// campaign renders the same subject and body for every recipient, and building an
/// environment and compiling its source cost several times the render itself. The fuel and
/// recursion limits hold per render, so sharing one environment changes nothing a render
/// sees. Bounded: emptied when full.
type Compiled = Vec<(bool, UndefinedBehavior, HashMap<String, Arc<Environment<'static>>>)>;
static COMPILED: LazyLock<Mutex<Compiled>> = LazyLock::new(|| Mutex::new(Vec::new()));
const COMPILED_MAX: usize = 512;

fn compiled(text: &str, html: bool, undefined: UndefinedBehavior) -> Result<Arc<Environment<'static>>, TemplateError> {
    let found = |all: &Compiled| {
        all.iter()
            .find(|(h, u, _)| *h == html && *u == undefined)
            .and_then(|(_, _, by_source)| by_source.get(text).cloned())
    };
    if let Some(env) = found(&COMPILED.lock().unwrap_or_else(|p| p.into_inner())) {
        return Ok(env);
    }
    // Again at render: a template stored before these rules were checked at save.
    sandbox(text)?;
    let mut env = environment();
    env.set_undefined_behavior(undefined);
    env.add_template_owned(template_name(html), text.to_owned()).map_err(|e| TemplateError::Render(engine_text(&e)))?;
    let env = Arc::new(env);
    let mut all = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if all.iter().map(|(_, _, by_source)| by_source.len()).sum::<usize>() >= COMPILED_MAX {
        all.clear();
    }
    let slot = match all.iter().position(|(h, u, _)| *h == html && *u == undefined) {
        Some(i) => i,
        None => {
            all.push((html, undefined, HashMap::new()));
            all.len() - 1
        }
    };
    all[slot].2.insert(text.to_owned(), env.clone());
    Ok(env)
}

fn run(env: &Environment<'_>, field: Field, html: bool, params: &Value, cap: usize) -> Result<String, TemplateError> {
    let tmpl = env.get_template(template_name(html)).map_err(|e| TemplateError::Render(engine_text(&e)))?;
    let mut out = CappedWriter { buf: Vec::new(), cap };
    // A panic in the engine (a builtin's bug on input nobody tried) fails this render only,
    // never the worker every tenant shares.
    let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine::with_budget(|| tmpl.render_captured_to(params, &mut out))
    }));
    match rendered {
        Ok(Ok(_)) => String::from_utf8(out.buf).map_err(|e| TemplateError::Render(e.to_string())),
        Ok(Err(e)) => Err(classify(field, cap, &e, tmpl.source(), params)),
        Err(_) => Err(TemplateError::Render(ENGINE_FAILED.to_owned())),
    }
}

/// What a render that panicked inside the engine fails with.
pub const ENGINE_FAILED: &str = "the template engine failed on this template; simplify it or write to support";

/// Limit errors from the engine (fuel, recursion, the writer, the guarded filters) are told
/// apart from the rest so that a trial render at save refuses only those.
fn classify(field: Field, cap: usize, e: &minijinja::Error, source: &str, params: &Value) -> TemplateError {
    let detail = e.detail().unwrap_or_default();
    match e.kind() {
        ErrorKind::OutOfFuel => TemplateError::Limit(format!("more than {FUEL} instructions")),
        ErrorKind::WriteFailure => TemplateError::Limit(format!("{} renders to more than {cap} bytes", field.name())),
        ErrorKind::InvalidOperation if detail.starts_with(LIMIT) || detail.contains("recursion limit") => {
            TemplateError::Limit(detail.trim_start_matches(LIMIT).to_owned())
        }
        ErrorKind::InvalidOperation if detail.contains("too large") || detail.contains("too many") => {
            TemplateError::Limit(detail.to_owned())
        }
        ErrorKind::UndefinedError => match missing_placeholder(source, params, e.range()) {
            Some(name) => TemplateError::MissingPlaceholder(name),
            None => TemplateError::Render(describe(e)),
        },
        _ => TemplateError::Render(describe(e)),
    }
}

/// The placeholder an undefined value is about: of the variables the source reads from its
/// params (with the attributes it reads of them: `order.id`), the first one `params` does not
/// give, preferring those within the error's span (`at`). It names the part that is absent:
/// `order` when there is no `order`, `order.id` when `order` has no `id`. `None` when every
/// one is given (the undefined value came from elsewhere, such as a loop variable's attribute).
pub fn missing_placeholder(source: &str, params: &Value, at: Option<std::ops::Range<usize>>) -> Option<String> {
    let env = environment();
    let tmpl = env.template_from_str(source).ok()?;
    let mut found: Vec<(bool, usize, String)> = Vec::new();
    for path in tmpl.undeclared_variables(true) {
        let mut segments = path.split('.');
        let Some(head) = segments.next() else { continue };
        if env.globals().any(|(g, _)| g == head) {
            continue;
        }
        // The part of the path that is absent from params.
        let mut value = params;
        let mut given = Vec::new();
        let mut absent = None;
        for segment in std::iter::once(head).chain(segments) {
            given.push(segment);
            match value.get(segment) {
                Some(v) => value = v,
                None => {
                    absent = Some(given.join("."));
                    break;
                }
            }
            // Attributes of something that is not an object are not looked up here.
            if !value.is_object() {
                break;
            }
        }
        let Some(name) = absent else { continue };
        let first = source.find(name.as_str()).unwrap_or(usize::MAX);
        let inside = at.as_ref().and_then(|r| source.get(r.clone())).is_some_and(|span| span.contains(name.as_str()));
        if !found.iter().any(|(_, _, n)| *n == name) {
            found.push((!inside, first, name));
        }
    }
    found.sort();
    found.into_iter().next().map(|(_, _, name)| name)
}

/// The output of one render: an error past `cap` bytes stops the engine at the first write
/// beyond it, so nothing larger is ever held.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.cap {
            return Err(std::io::Error::other("rendered size limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The block statements a template may use (the sandbox refuses any other).
const STATEMENTS: [&str; 8] = ["if", "elif", "else", "endif", "for", "endfor", "raw", "endraw"];

/// The sandbox, on the tokens of one field (module documentation).
fn sandbox(text: &str) -> Result<(), TemplateError> {
    let refuse = |what: &str| Err(TemplateError::Limit(what.to_owned()));
    let mut concats = 0usize;
    let mut after_block_start = false;
    // The brackets open at this token (whether each is a `[`), with the `:` seen directly inside.
    let mut open: Vec<(bool, u8)> = Vec::new();
    // A unit struct without minijinja's `custom_syntax` feature, a configuration with it.
    #[allow(clippy::default_constructed_unit_structs)]
    let syntax = SyntaxConfig::default();
    for token in tokenize(text, false, syntax, WhitespaceConfig::default()) {
        let (token, _) = token.map_err(|e| TemplateError::Render(engine_text(&e)))?;
        let statement = after_block_start;
        after_block_start = matches!(token, Token::BlockStart);
        match token {
            Token::BracketOpen | Token::ParenOpen | Token::BraceOpen => {
                open.push((matches!(token, Token::BracketOpen), 0u8))
            }
            Token::BracketClose | Token::ParenClose | Token::BraceClose => {
                open.pop();
            }
            // The second `:` of `x[a:b:c]`: minijinja panics on a backwards step over an empty
            // value, and `reverse` does what a template needs of a step.
            Token::Colon => {
                if let Some((true, colons)) = open.last_mut() {
                    *colons += 1;
                    if *colons > 1 {
                        return refuse("slices with a step (`x[::2]`) are not available in templates; use `reverse`");
                    }
                }
            }
            Token::Mul | Token::Pow => {
                return refuse("`*` and `**` are not available in templates; compute numbers in the shop");
            }
            Token::Ident("set" | "with") if statement => {
                return refuse("`set` and `with` are not available in templates; pass the value as a variable");
            }
            // Every other block but these captures its body into a value no output cap sees
            // (`filter`, `macro`, `call`) or is of no use in one field.
            Token::Ident(other) if statement && !STATEMENTS.contains(&other) => {
                return refuse(&format!(
                    "`{other}` is not available in templates; only `if`, `for` and `raw` blocks are"
                ));
            }
            Token::Ident("recursive") => return refuse("recursive loops are not available in templates"),
            Token::Tilde | Token::Plus => {
                concats += 1;
                if concats > MAX_CONCATS {
                    return refuse(&format!("more than {MAX_CONCATS} `~` or `+` in one field"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The number of SMS segments of a text: GSM-7 when every character is in its alphabet (an
/// extension character counts twice), else UCS-2; one segment holds 160 or 70, a part of a
/// longer message 153 or 67.
pub fn sms_segments(text: &str) -> usize {
    const BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
    const EXTENSION: &str = "^{}\\[~]|€\u{c}";
    let gsm: Option<usize> = text
        .chars()
        .map(|c| {
            if BASIC.contains(c) {
                Some(1)
            } else if EXTENSION.contains(c) {
                Some(2)
            } else {
                None
            }
        })
        .sum();
    let (units, single, part) = match gsm {
        Some(septets) => (septets, 160, 153),
        None => (text.encode_utf16().count(), 70, 67),
    };
    if units <= single { 1 } else { units.div_ceil(part) }
}

/// Whether a locale's content has the channel's body (the channel can be sent in it).
pub fn has_body(c: &LocaleContent, channel: Channel) -> bool {
    body_of(c, channel).is_some()
}

fn body_of(c: &LocaleContent, channel: Channel) -> Option<&str> {
    match channel {
        Channel::Email => c.email_body.as_deref().or(c.email_html.as_deref()),
        Channel::Sms => c.sms.as_deref(),
        Channel::Push => c.push_body.as_deref(),
        Channel::Inapp => c.inapp_body.as_deref(),
    }
}

static EMPTY_CONTENT: &LocaleContent = &LocaleContent {
    email_subject: None,
    email_body: None,
    email_html: None,
    sms: None,
    push_title: None,
    push_body: None,
    inapp_title: None,
    inapp_body: None,
};

fn describe(e: &minijinja::Error) -> String {
    match e.kind() {
        minijinja::ErrorKind::UndefinedError => {
            format!("missing placeholder{}", e.detail().map(|d| format!(" ({d})")).unwrap_or_default())
        }
        _ => engine_text(e),
    }
}

/// The engine's message without the engine's own name of the template (`body.txt`), which
/// means nothing to the shop: the caller names the field (`locales.en.email_body`), this says
/// the line in it (docs/templates.md).
fn engine_text(e: &minijinja::Error) -> String {
    let mut text = e.kind().to_string();
    if let Some(detail) = e.detail() {
        text = format!("{text}: {detail}");
    }
    if let Some(line) = e.line() {
        text = format!("{text} (line {line})");
    }
    text
}

/// The body of `PUT /v1/templates/{id}`. A locale's content is read here from JSON only when it
/// is an object (`locales_of`): serde would read an array as the struct's fields in order.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateInput {
    /// One of the keys of `locales`.
    #[schema(min_length = 1, max_length = 35, pattern = "^[A-Za-z0-9_-]{1,35}$", example = "en")]
    pub default_locale: String,
    /// Content by locale key: a language tag such as `en` or `zh-CN` (1 to 35 of
    /// `[A-Za-z0-9_-]`, as a user's `locale`), at least one.
    #[schema(value_type = BTreeMap<String, LocaleContent>)]
    pub locales: BTreeMap<String, Value>,
}

/// Whether `key` is a locale key: 1 to 35 of `[A-Za-z0-9_-]` (a user's `locale` has the same rule).
pub fn is_locale_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 35 && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Each locale's content of a template body: an object with the fields of [`LocaleContent`],
/// under a locale key; the error names the locale (`locales.<key>`) or its field.
fn locales_of(input: BTreeMap<String, Value>) -> CoreResult<BTreeMap<String, LocaleContent>> {
    if input.is_empty() {
        return Err(CoreError::invalid("locales", "at least one locale"));
    }
    let mut out = BTreeMap::new();
    for (key, value) in input {
        if !is_locale_key(&key) {
            return Err(CoreError::invalid(
                format!("locales.{key}"),
                "not a locale key: 1 to 35 of [A-Za-z0-9_-], a language tag such as en or zh-CN",
            ));
        }
        if !value.is_object() {
            return Err(CoreError::invalid(
                format!("locales.{key}"),
                "must be an object of the locale's content fields",
            ));
        }
        let content = serde_json::from_value::<LocaleContent>(value)
            .map_err(|e| CoreError::invalid(format!("locales.{key}"), e.to_string()))?;
        out.insert(key, content);
    }
    Ok(out)
}

/// The template a body makes, checked as [`Template::validate`] does and its locales as
/// `locales_of` does.
pub fn template_of(template_id: &str, input: TemplateInput, updated_at: String) -> CoreResult<Template> {
    let locales = locales_of(input.locales)?;
    if !is_locale_key(&input.default_locale) {
        return Err(CoreError::invalid("default_locale", "not a locale key: one of the keys of locales"));
    }
    let template =
        Template { template_id: template_id.to_owned(), default_locale: input.default_locale, locales, updated_at };
    template.validate()?;
    Ok(template)
}

/// What the templates list shows of a template (a whole template may be 256 KB).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TemplateSummary {
    #[schema(example = "order_shipped")]
    pub template_id: String,
    #[schema(example = "en")]
    pub default_locale: String,
    /// Its locales, in byte order.
    #[schema(example = json!(["en", "zh-CN"]))]
    pub locales: Vec<String>,
    pub updated_at: String,
}

/// The write of a template's entry in the templates list ([`crate::lists::templates`]), written
/// with the template.
fn entry_write(t: &TenantId, template: &Template) -> CoreResult<crate::ports::Write> {
    let summary = TemplateSummary {
        template_id: template.template_id.clone(),
        default_locale: template.default_locale.clone(),
        locales: template.locales.keys().cloned().collect(),
        updated_at: template.updated_at.clone(),
    };
    Ok(crate::ports::Write::Put {
        item: Item::new(keys::template_entry(t, &template.template_id), attrs_of(&summary)?),
        cond: Cond::Always,
    })
}

/// Writes a built-in template (English and Simplified Chinese) for the tenant, never over theirs.
pub(crate) async fn put_builtin(
    deps: &Deps,
    t: &TenantId,
    template_id: &str,
    en: LocaleContent,
    zh: LocaleContent,
) -> CoreResult<()> {
    let template = Template {
        template_id: template_id.into(),
        default_locale: "en".into(),
        locales: BTreeMap::from([("en".to_owned(), en), ("zh-CN".to_owned(), zh)]),
        updated_at: deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    template.validate()?;
    let key = crate::keys::template(t, template_id);
    match deps.table.put(Item::new(key, attrs_of(&template)?), Cond::NotExists).await {
        Ok(()) | Err(crate::ports::StoreError::ConditionFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub async fn put_template(deps: &Deps, t: &TenantId, template_id: &str, input: TemplateInput) -> CoreResult<Template> {
    check_id("template_id", template_id)?;
    let now = deps.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let template = template_of(template_id, input, now)?;
    let item = Item::new(keys::template(t, template_id), attrs_of(&template)?);
    crate::sizes::check_stored("locales", &item)?;
    // With its entry in the tenant's templates list (`crate::lists`), in one transaction.
    let entry = entry_write(t, &template)?;
    deps.table.transact(vec![crate::ports::Write::Put { item, cond: Cond::Always }, entry]).await?;
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

    #[test]
    fn a_compiled_source_is_reused_only_with_its_own_escaping_and_undefined_rule() {
        let params = json!({"name": "<b>"});
        let body = |text: &str, html: bool, undefined: UndefinedBehavior| {
            render_source(Field::EmailBody, text, html, &params, 10_000, undefined)
        };
        let text = "Hi {{ name }}{{ missing }}";
        for _ in 0..2 {
            assert_eq!(body(text, false, UndefinedBehavior::Chainable).ok().as_deref(), Some("Hi <b>"));
            assert_eq!(body(text, true, UndefinedBehavior::Chainable).ok().as_deref(), Some("Hi &lt;b&gt;"));
            assert!(body(text, false, UndefinedBehavior::Strict).is_err(), "strict: {{ missing }} is undefined");
            assert_eq!(body("Hi {{ name }}!", false, UndefinedBehavior::Strict).ok().as_deref(), Some("Hi <b>!"));
        }
        // A source the sandbox refuses is refused every time, never compiled and kept.
        for _ in 0..2 {
            assert!(matches!(body("{{ 2 * 3 }}", false, UndefinedBehavior::Strict), Err(TemplateError::Limit(_))));
        }
    }

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
        assert_eq!(r, Err(TemplateError::MissingPlaceholder("order_id".into())));
        assert_eq!(
            r.map(|_| ()).map_err(|e| e.to_string()),
            Err("template_error: missing placeholder order_id".into())
        );
    }

    /// The error names the placeholder that is absent, the part of its path that is: not a
    /// placeholder that is given, nor one guarded by `is defined` that did not fail the render.
    #[test]
    fn a_missing_placeholder_is_named_by_its_absent_part() {
        let render = |text: &str, params: serde_json::Value| {
            render_field(Field::Sms, text, false, &params, 10_000).map_err(|e| e.to_string())
        };
        let named = |name: &str| Err(format!("template_error: missing placeholder {name}"));
        assert_eq!(render("Hi {{ name }}, order {{ order_id }}", json!({"name": "Al"})), named("order_id"));
        assert_eq!(render("Order {{ order.id }}", json!({})), named("order"));
        assert_eq!(render("Order {{ order.id }}", json!({"order": {"total": 3}})), named("order.id"));
        // `coupon` is absent too, but guarded: the render failed on `first_name`.
        let guarded = "{% if coupon is defined %}{{ coupon }}{% endif %} Hi {{ user.first_name }}";
        assert_eq!(render(guarded, json!({"user": {}})), named("user.first_name"));
        assert_eq!(render("{{ a }} {{ b }}", json!({"a": 1})), named("b"));
        assert_eq!(render("{{ b }} {{ a }}", json!({})), named("b"));
    }

    #[test]
    fn the_html_part_is_escaped_but_the_text_part_and_sms_are_not() {
        let t = tpl();
        let p = json!({"order_id": "<b>", "name": "<script>"});
        let email = t.render(Channel::Email, Some("en"), &p).unwrap();
        assert_eq!(email.html.as_deref(), Some("<p>Hi &lt;script&gt;</p>"));
        assert_eq!(email.body, "Hi <script>", "the text part shows the value as it is");
        assert_eq!(email.subject.as_deref(), Some("Order <b> shipped"));
        assert_eq!(
            t.render(Channel::Sms, Some("en"), &p).map(|r| (r.body, r.html)),
            Ok(("Order <b> shipped".into(), None))
        );
    }

    fn email(body: Option<&str>, html: Option<&str>) -> Template {
        let content = LocaleContent {
            email_subject: Some("Order {{ order_id }}".into()),
            email_body: body.map(Into::into),
            email_html: html.map(Into::into),
            ..Default::default()
        };
        Template {
            template_id: "t".into(),
            default_locale: "en".into(),
            locales: BTreeMap::from([("en".into(), content)]),
            updated_at: String::new(),
        }
    }

    /// A text-only template (every template saved before `email_html`) still sends: its text as
    /// written, placeholders unescaped, and an HTML part made from it, escaped, in paragraphs,
    /// with its URL an anchor.
    #[test]
    fn a_text_only_template_gets_an_html_part_made_from_its_text() {
        let t = email(
            Some("Hi {{ name }},\nyour order {{ order_id }} shipped.\n\nTrack: https://shop.example/o/{{ order_id }}"),
            None,
        );
        assert!(t.validate().is_ok());
        let r = t.render(Channel::Email, None, &json!({"name": "Tom & <Jerry>", "order_id": "7"})).unwrap();
        assert_eq!(r.body, "Hi Tom & <Jerry>,\nyour order 7 shipped.\n\nTrack: https://shop.example/o/7");
        assert_eq!(
            r.html.as_deref(),
            Some(
                "<p>Hi Tom &amp; &lt;Jerry&gt;,<br>\nyour order 7 shipped.</p>\n\
                 <p>Track: <a href=\"https://shop.example/o/7\">https://shop.example/o/7</a></p>\n"
            )
        );
        // As stored before (no `email_html` key), it reads and writes back unchanged.
        let stored = json!({"template_id": "t", "default_locale": "en", "updated_at": "",
            "locales": {"en": {"email_subject": "S", "email_body": "B {{ n }}"}}});
        let read: Template = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(read.locales["en"].email_html, None);
        assert_eq!(serde_json::to_value(&read).unwrap(), stored);
        let r = read.render(Channel::Email, None, &json!({"n": 1})).unwrap();
        assert_eq!((r.body.as_str(), r.html.as_deref()), ("B 1", Some("<p>B 1</p>\n")));
    }

    /// An HTML-only template (in `email_html`, or in `email_body` with tags, as written before
    /// `email_html`) gets a text part made from its rendered HTML: no tags, the links' URLs bare.
    #[test]
    fn an_html_only_template_gets_a_text_part_without_markup() {
        let html = "<html><body><h1>Hi {{ name }}</h1><p>Order <a href=\"https://shop.example/o/{{ order_id }}\">{{ order_id }}</a></p></body></html>";
        for t in [email(None, Some(html)), email(Some(html), None)] {
            assert!(t.validate().is_ok());
            let r = t.render(Channel::Email, None, &json!({"name": "<i>Al</i>", "order_id": "7"})).unwrap();
            let h = r.html.clone().unwrap_or_default();
            assert!(h.contains("<h1>Hi &lt;i&gt;Al&lt;&#x2f;i&gt;</h1>"), "escaped in HTML: {h}");
            assert!(!crate::templates::email::has_markup(&r.body.replace("<i>Al</i>", "")), "{}", r.body);
            assert!(r.body.contains("Hi <i>Al</i>"), "the value itself, unescaped: {}", r.body);
            assert_eq!(r.body, "Hi <i>Al</i>\n\nOrder 7 (https://shop.example/o/7)");
        }
    }

    /// A syntax error names the field and the line in it, never the engine's own name of the
    /// template (`body.txt`, `body.html`), which the shop never wrote.
    #[test]
    fn a_syntax_error_names_the_field_and_its_line() {
        for (t, field) in [
            (email(Some("Hi\n{% if x %}no end"), None), "locales.en.email_body"),
            (email(Some("<p>Hi</p>\n{% if x %}no end"), None), "locales.en.email_body"),
            (email(Some("Hi"), Some("<p>Hi</p>\n{% if x %}no end")), "locales.en.email_html"),
        ] {
            match t.validate() {
                Err(CoreError::Invalid { field: f, detail }) => {
                    assert_eq!(f, field);
                    assert!(detail.contains("syntax error") && detail.contains("line 2"), "{detail}");
                    assert!(!detail.contains("body.txt") && !detail.contains("body.html"), "{detail}");
                }
                other => panic!("accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn both_parts_written_render_each_and_the_text_part_must_be_plain() {
        let t = email(Some("Hi {{ name }}: https://shop.example/"), Some("<p>Hi <b>{{ name }}</b></p>"));
        assert!(t.validate().is_ok());
        let r = t.render(Channel::Email, None, &json!({"name": "A&B", "order_id": "7"})).unwrap();
        assert_eq!(r.body, "Hi A&B: https://shop.example/");
        assert_eq!(r.html.as_deref(), Some("<p>Hi <b>A&amp;B</b></p>"));
        // Tags in the text part beside an HTML part: refused, naming the text part.
        refused_at_save(&email(Some("<p>Hi</p>"), Some("<p>Hi</p>")), "locales.en.email_body", "plain text");
        // Only in an expression, a `<` is no tag.
        assert!(email(Some("{{ 1 < 2 }} {{ '<b>' }}"), Some("<p>x</p>")).validate().is_ok());
        // Each part is checked like any field.
        refused_at_save(&email(Some("x"), Some(HOSTILE)), "locales.en.email_html", "`*`");
        refused_at_save(&email(None, Some(&"h".repeat(128 * 1024 + 1))), "locales.en.email_html", "at most 131072");
        // The HTML part alone is email content (the channel is available).
        assert!(email(None, Some("<p>x</p>")).has_channel(Channel::Email, None));
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

    fn one(field: &str, text: &str) -> Template {
        let content: LocaleContent = serde_json::from_value(json!({ field: text })).unwrap();
        Template {
            template_id: "t".into(),
            default_locale: "en".into(),
            locales: BTreeMap::from([("en".into(), content)]),
            updated_at: String::new(),
        }
    }

    /// A body whose locale is not an object (serde would read an array as the struct's fields),
    /// whose locale key is empty or not a language tag, or whose default locale is empty or not
    /// among the keys is refused naming the field; a good one is taken.
    #[test]
    fn a_template_body_needs_object_locales_under_locale_keys() {
        let refused = |body: Value, field: &str, says: &str| {
            let input: TemplateInput = serde_json::from_value(body.clone()).unwrap();
            match template_of("t", input, String::new()) {
                Err(CoreError::Invalid { field: f, detail }) => {
                    assert_eq!(f, field, "{body}: {detail}");
                    assert!(detail.contains(says), "{body}: {detail}");
                }
                other => panic!("{body} accepted: {other:?}"),
            }
        };
        refused(json!({"default_locale": "", "locales": {"": [null, null]}}), "locales.", "not a locale key");
        refused(json!({"default_locale": "en", "locales": {"en": [null, null]}}), "locales.en", "must be an object");
        refused(json!({"default_locale": "en", "locales": {"en": "hi"}}), "locales.en", "must be an object");
        refused(json!({"default_locale": "en", "locales": {"en": {"sms": 1}}}), "locales.en", "invalid type");
        refused(json!({"default_locale": "en", "locales": {"en": {"nope": "x"}}}), "locales.en", "unknown field");
        refused(json!({"default_locale": "en", "locales": {"e n": {"sms": "x"}}}), "locales.e n", "not a locale key");
        refused(json!({"default_locale": "en", "locales": {}}), "locales", "at least one");
        refused(json!({"default_locale": "", "locales": {"en": {"sms": "x"}}}), "default_locale", "not a locale key");
        refused(json!({"default_locale": "de", "locales": {"en": {"sms": "x"}}}), "default_locale", "one of the keys");
        let input: TemplateInput =
            serde_json::from_value(json!({"default_locale": "zh-CN", "locales": {"zh-CN": {"sms": "x"}, "en_GB": {}}}))
                .unwrap();
        let t = template_of("t", input, String::new()).unwrap();
        assert_eq!(t.locales.keys().collect::<Vec<_>>(), ["en_GB", "zh-CN"]);
        assert_eq!(t.locales["zh-CN"].sms.as_deref(), Some("x"));
    }

    fn refused_at_save(t: &Template, field: &str, says: &str) {
        match t.validate() {
            Err(CoreError::Invalid { field: f, detail: message }) => {
                assert_eq!(f, field);
                assert!(message.contains(says), "{message}");
            }
            other => panic!("accepted: {other:?}"),
        }
    }

    fn limit(r: Result<Rendered, TemplateError>, says: &str) {
        assert!(matches!(&r, Err(TemplateError::Limit(m)) if m.contains(says)), "{r:?}");
        let e = r.unwrap_err().to_string();
        assert!(e.starts_with("template_error"), "{e}");
    }

    const HOSTILE: &str = r#"{% for i in range(100000) %}{{ "x" * 100000000 }}{% endfor %}"#;

    #[test]
    fn the_hostile_template_is_refused_at_save_and_at_render_before_it_allocates() {
        refused_at_save(&one("email_body", HOSTILE), "locales.en.email_body", "`*`");
        // Stored before the check (or written around it): refused again before rendering.
        let started = std::time::Instant::now();
        limit(one("email_body", HOSTILE).render(Channel::Email, None, &json!({})), "`*`");
        // Without the repetition, the loop alone is over the range limit.
        let looped = r#"{% for i in range(100000) %}x{% endfor %}"#;
        refused_at_save(&one("sms", looped), "locales.en.sms", "range of 100000");
        limit(one("sms", looped).render(Channel::Sms, None, &json!({})), "range");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn what_could_grow_a_value_without_fuel_is_refused() {
        for (text, says) in [
            (r#"{{ n ** 100 }}"#, "`*`"),
            (r#"{% set a = p ~ p %}{{ a }}"#, "`set`"),
            (r#"{% with a = p ~ p %}{{ a }}{% endwith %}"#, "`set`"),
            (r#"{% for x in items recursive %}{{ loop([x ~ x]) }}{% endfor %}"#, "recursive"),
            (&"{{ p ~ p }}".repeat(MAX_CONCATS + 1), "`~`"),
        ] {
            refused_at_save(&one("inapp_body", text), "locales.en.inapp_body", says);
        }
        // `*` inside text, not in a tag, is text.
        assert!(one("sms", "Use code * 2 {{ n }}").validate().is_ok());
        // A `set` inside text is text too.
        assert!(one("sms", "set {{ n }}").validate().is_ok());
    }

    #[test]
    fn a_macro_calling_itself_is_refused_at_save() {
        let deep = "{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}";
        refused_at_save(&one("email_body", deep), "locales.en.email_body", "`macro` is not available");
        limit(one("email_body", deep).render(Channel::Email, None, &json!({})), "`macro`");
    }

    #[test]
    fn blocks_that_capture_their_body_are_refused() {
        // A `filter` block builds its whole body in memory before the output cap sees it: in a
        // loop within fuel, hundreds of megabytes.
        let captured = "{% filter upper %}{% for i in range(1000) %}{{ p }}{% endfor %}{% endfilter %}";
        refused_at_save(&one("inapp_body", captured), "locales.en.inapp_body", "`filter` is not available");
        limit(one("inapp_body", captured).render(Channel::Inapp, None, &json!({"p": "x"})), "`filter`");
        for text in
            ["{% call m() %}x{% endcall %}", "{% include 'body.txt' %}", "{% autoescape false %}x{% endautoescape %}"]
        {
            refused_at_save(&one("sms", text), "locales.en.sms", "not available");
        }
        let allowed = "{% if a %}{% for x in b %}{{ x }}{% else %}none{% endfor %}{% elif c %}c{% endif %}{% raw %}{{ }}{% endraw %}";
        assert!(one("sms", allowed).validate().is_ok());
    }

    #[test]
    fn builtins_that_size_a_buffer_from_an_argument_are_bounded_before_they_allocate() {
        // Each of these asked minijinja for petabytes, and a failed allocation aborts the process.
        let p = json!({"w": "1000000000000000", "n": 1_000_000_000_000_000_u64});
        for (text, says) in [
            ("{{ '%1000000000000000s'|format('x') }}", "format width"),
            ("{{ ('%' ~ w ~ 's')|format('x') }}", "format width"),
            ("{{ '%.1000000f'|format(1.5) }}", "format width"),
            ("{{ []|batch(1000000000000000)|length }}", "batch into"),
            ("{{ []|batch(n, 'x')|length }}", "batch into"),
            ("{{ []|slice(1000000000000000)|length }}", "slice into"),
            ("{{ 'x'|indent(1000000000000000) }}", "indent would be"),
        ] {
            refused_or_limited(text, &p, says);
        }
        // Within bounds they work as before.
        let r = one(
            "sms",
            "{{ '%8.2f'|format(3.14159) }}|{{ [1,2,3]|batch(2)|list|length }}|{{ [1,2,3]|slice(2)|list|length }}",
        )
        .render(Channel::Sms, None, &json!({}));
        assert_eq!(r.map(|r| r.body), Ok("    3.14|2|2".into()));
    }

    #[test]
    fn the_work_of_filters_is_one_budget_per_render() {
        // 1,000 sorts of a 32 KB list: each call is one instruction of fuel; the work budget
        // stops it.
        let p = json!({"p": "x".repeat(MAX_VALUE_BYTES)});
        refused_or_limited(
            "{% for i in range(1000) %}{{ p|list|sort|length }}{% endfor %}",
            &p,
            "read and build more than",
        );
        // A value no bigger than its inputs but from many of them is over the value limit.
        refused_or_limited("{{ (p ~ p)|upper }}", &p, "at most 32768");
    }

    /// Refused when saved if the trial render (no variables) reaches the limit, else when
    /// rendered with `p`.
    fn refused_or_limited(text: &str, p: &Value, says: &str) {
        let t = one("inapp_body", text);
        match t.validate() {
            Err(CoreError::Invalid { detail, .. }) => assert!(detail.contains(says), "{text}: {detail}"),
            Err(other) => panic!("{text}: {other:?}"),
            Ok(()) => limit(t.render(Channel::Inapp, None, p), says),
        }
    }

    #[test]
    fn deep_data_stops_at_the_recursion_limit() {
        let mut v = json!("leaf");
        for _ in 0..(RECURSION_LIMIT + 5) {
            v = json!([v]);
        }
        // A template nesting loops deeper than the limit.
        let open = "{% for x in d %}".repeat(RECURSION_LIMIT + 1);
        let close = "{% endfor %}".repeat(RECURSION_LIMIT + 1);
        let t = one("inapp_body", &format!("{open}x{close}"));
        let r = t.render(Channel::Inapp, None, &json!({"d": v}));
        assert!(matches!(&r, Err(TemplateError::Limit(_)) | Err(TemplateError::Render(_))), "{r:?}");
    }

    #[test]
    fn a_huge_output_fails_at_render_and_nothing_larger_than_the_cap_is_built() {
        let big = "y".repeat(MAX_VALUE_BYTES);
        let t = one("email_body", "{% for i in range(1000) %}{{ p }}{% endfor %}");
        assert!(t.validate().is_ok(), "nothing to refuse without a value for p");
        limit(t.render(Channel::Email, None, &json!({"p": big})), "more than 262144 bytes");
        // Output known at save: refused then.
        let t = one("email_body", &format!("{{% for i in range(1000) %}}{}{{% endfor %}}", "z".repeat(1000)));
        refused_at_save(&t, "locales.en.email_body", "more than 262144 bytes");
        // Work without output is bounded by fuel.
        let t = one("inapp_body", "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}");
        refused_at_save(&t, "locales.en.inapp_body", "instructions");
        limit(t.render(Channel::Inapp, None, &json!({})), "instructions");
    }

    #[test]
    fn filters_that_grow_a_value_stop_at_the_value_limit() {
        let p = json!({"p": "x".repeat(1000), "items": vec!["a"; 500]});
        for text in [
            "{{ range(1000)|join(p) }}",
            "{{ p|replace('x', p) }}",
            "{{ p|indent(1000000, true) }}",
            "{{ items|join(p) }}",
        ] {
            limit(one("inapp_body", text).render(Channel::Inapp, None, &p), "at most 32768");
        }
        limit(
            one("sms", "{{ p }}").render(Channel::Sms, None, &json!({"p": "x".repeat(MAX_VALUE_BYTES + 1)})),
            "placeholder",
        );
        // Within the limits they work as before.
        let r = one("inapp_body", "{{ items[:3]|join(', ') }} {{ 'a-b'|replace('-', '+') }}").render(
            Channel::Inapp,
            None,
            &p,
        );
        assert_eq!(r.map(|r| r.body), Ok("a, a, a a+b".into()));
        let r = one("email_body", "{{ '<b>'|e }}").render(Channel::Email, None, &json!({}));
        assert_eq!(r.map(|r| r.body), Ok("&lt;b&gt;".into()));
    }

    #[test]
    fn an_sms_is_at_most_ten_segments_and_a_push_fits_its_payload() {
        assert_eq!(sms_segments(&"a".repeat(160)), 1);
        assert_eq!(sms_segments(&"a".repeat(161)), 2);
        assert_eq!(sms_segments(&"a".repeat(306)), 2);
        assert_eq!(sms_segments(&"a".repeat(307)), 3);
        assert_eq!(sms_segments(&"€".repeat(80)), 1, "two septets each");
        assert_eq!(sms_segments(&"订".repeat(70)), 1);
        assert_eq!(sms_segments(&"订".repeat(71)), 2);
        refused_at_save(&one("sms", &"a".repeat(1531)), "locales.en.sms", "11 segments");
        assert!(one("sms", &"a".repeat(1530)).validate().is_ok());
        let t = one("sms", "{{ p }}");
        limit(t.render(Channel::Sms, None, &json!({"p": "订".repeat(700)})), "segments");
        let mut t = one("push_body", "{{ p }}");
        t.locales.get_mut("en").unwrap().push_title = Some("T".repeat(500));
        assert!(t.render(Channel::Push, None, &json!({"p": "b".repeat(3000)})).is_ok());
        limit(t.render(Channel::Push, None, &json!({"p": "b".repeat(3001)})), "more than 3000 bytes");
    }

    #[test]
    fn sources_are_capped_per_field_and_per_template() {
        refused_at_save(&one("push_title", &"t".repeat(1025)), "locales.en.push_title", "at most 1024");
        let mut t = one("email_body", &"b".repeat(100 * 1024));
        for l in ["de", "fr"] {
            t.locales.insert(l.into(), t.locales["en"].clone());
        }
        refused_at_save(&t, "locales", "at most 262144");
    }

    /// An email within its source and rendered limits whose two parts cannot fit a queue
    /// message together once escaped as JSON is refused at save, naming the larger part written:
    /// 64 KB of quotes are 128 KB there, and the HTML made from them as much again; 60 KB fit.
    #[test]
    fn an_email_too_large_for_a_queue_message_is_refused_at_save() {
        refused_at_save(&one("email_body", &"\"".repeat(64 * 1024)), "locales.en.email_body", "queue message");
        assert!(one("email_body", &"\"".repeat(60 * 1024)).validate().is_ok());
        // Both parts count: each fits alone, not together.
        let half = "\"".repeat(64 * 1024);
        refused_at_save(&email(Some(&half), Some(&format!("<p>{half}</p>"))), "locales.en.email_html", "queue message");
        assert!(
            email(Some(&"\"".repeat(40 * 1024)), Some(&format!("<p>{}</p>", "\"".repeat(40 * 1024))))
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn a_long_order_confirmation_renders_within_fuel() {
        let body = "<h1>Thanks {{ name }}</h1>{% for l in lines %}<tr><td>{{ l.sku|upper }}</td><td>{{ l.title|default('-') }}</td>\
            <td>{{ l.qty }}</td><td>{{ l.price }}</td>{% if l.note %}<td>{{ l.note }}</td>{% endif %}</tr>{% endfor %}\
            <p>Total {{ total }} ({{ lines|length }} lines)</p>";
        let lines: Vec<Value> = (0..50)
            .map(|i| json!({"sku": format!("s{i}"), "title": "T", "qty": i, "price": "9.99", "note": "n"}))
            .collect();
        let r =
            one("email_body", body).render(Channel::Email, None, &json!({"name": "A", "lines": lines, "total": "1"}));
        assert!(matches!(&r, Ok(r) if r.body.contains("S49") && r.body.contains("50 lines")), "{r:?}");
    }

    #[test]
    fn broken_syntax_is_refused_on_save() {
        let mut t = tpl();
        t.locales.insert("de".into(), LocaleContent { sms: Some("{{ oops".into()), ..Default::default() });
        assert!(matches!(t.validate(), Err(CoreError::Invalid { field, .. }) if field == "locales.de.sms"));
    }
}
