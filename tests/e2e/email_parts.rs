//! An email's text and HTML parts end to end (docs/security.md, "Email parts"): a template with only a
//! text part and one with only an HTML part each send both parts; the text part carries no
//! markup and its link rewritten through the click redirect, the HTML part the open pixel and
//! its `href` rewritten. What the fake provider recorded is what SES would have been given.

use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Backend, Options, Server};

const WAIT: Duration = Duration::from_secs(90);

/// A tag, comment or doctype: `<` then a letter, `/` or `!`.
fn has_tag(text: &str) -> bool {
    text.as_bytes().windows(2).any(|w| w[0] == b'<' && (w[1].is_ascii_alphabetic() || w[1] == b'/' || w[1] == b'!'))
}

/// The first click redirect in `text` (`…/t/c/{token}`), as a path of this server.
fn click_path(text: &str) -> Option<String> {
    let token: String =
        text.split("/t/c/").nth(1)?.chars().take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).collect();
    Some(format!("/t/c/{token}"))
}

async fn put(s: &Server, path: &str, body: Value) -> anyhow::Result<Value> {
    let (st, v) = s.call("PUT", path, Some(body)).await?;
    assert_eq!(st, 200, "{path}: {v}");
    Ok(v)
}

async fn send_one(s: &Server, key: &str, template: &str) -> anyhow::Result<Value> {
    let body = json!({"idempotency_key": key, "recipients": {"user_ids": ["u1"]}, "template_id": template,
        "params": {"name": "Tom & \"Jerry\" <3", "order_id": "A-7"}, "category": "transactional", "channels": ["email"]});
    let (st, v) = s.call("POST", "/v1/notifications", Some(body)).await?;
    assert_eq!(st, 202, "{v}");
    let id = v["notification_id"].as_str().unwrap_or_default().to_owned();
    s.eventually(WAIT, &format!("the email of {template}"), || async { Ok(s.sends(&id).await?.into_iter().next()) })
        .await
}

pub async fn an_email_has_a_text_part_without_markup_and_an_html_part_with_the_pixel(
    backend: Backend,
) -> anyhow::Result<()> {
    let mut opts = Options::default();
    opts.env.push(("TIDINGS_SIGNING_KEYS", "k1:e2e-signing-secret".into()));
    let s = Server::start(backend, opts).await?;
    put(&s, "/v1/settings/link-hosts", json!({"hosts": ["shop.example"]})).await?;
    put(&s, "/v1/users/u1", json!({"email": "u1@example.com"})).await?;
    // Text only, as every template was before there was an HTML part.
    put(
        &s,
        "/v1/templates/text-only",
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Order {{ order_id }}",
            "email_body": "Hi {{ name }},\n\nyour order: https://shop.example/o/{{ order_id }}"}}}),
    )
    .await?;
    // HTML only: the text part is made from it.
    let v = put(
        &s,
        "/v1/templates/html-only",
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Order {{ order_id }}",
            "email_html": "<html><body><p>Hi <b>{{ name }}</b>, <a href=\"https://shop.example/o/{{ order_id }}\">your order</a></p></body></html>"}}}),
    )
    .await?;
    assert!(v["locales"]["en"]["email_html"].is_string(), "{v}");
    let (st, v) = s.call("GET", "/v1/templates/text-only", None).await?;
    assert_eq!(st, 200);
    assert!(v["locales"]["en"].get("email_html").is_none(), "a text-only template stays as written: {v}");

    let no_redirect = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    for template in ["text-only", "html-only"] {
        let sent = send_one(&s, template, template).await?;
        let text = sent["body"].as_str().unwrap_or_default();
        let html = sent["html"].as_str().unwrap_or_default();
        assert!(!text.is_empty() && !html.is_empty(), "{template}: both parts: {sent}");
        assert!(!has_tag(text), "{template}: no markup in the text part: {text}");
        assert!(text.contains("Tom & \"Jerry\" <3"), "{template}: the value as it is in the text: {text}");
        assert!(html.contains("Tom &amp;") && html.contains("&lt;3"), "{template}: escaped in the HTML: {html}");
        assert!(!text.contains("/t/o/") && !text.contains("shop.example/o/"), "{template}: {text}");
        assert_eq!(html.matches("/t/o/").count(), 1, "{template}: the open pixel, in HTML only: {html}");
        assert!(html.contains("href=\"http") && html.contains("/t/c/"), "{template}: {html}");
        // The text part's link is the click redirect to the order, as the HTML part's.
        for part in [text, html] {
            let path = click_path(part).unwrap_or_default();
            let res = no_redirect.get(format!("{}{path}", s.base)).send().await?;
            assert_eq!(res.status().as_u16(), 302, "{template}: {path}");
            assert_eq!(res.headers()["location"], "https://shop.example/o/A-7", "{template}");
        }
    }
    // Both given: the text part must be plain text.
    let (st, v) = s
        .call(
            "PUT",
            "/v1/templates/both",
            Some(json!({"default_locale": "en", "locales": {"en": {"email_subject": "S",
                "email_body": "<p>Hi</p>", "email_html": "<p>Hi</p>"}}})),
        )
        .await?;
    assert_eq!((st, v["field"].as_str()), (422, Some("locales.en.email_body")), "{v}");
    Ok(())
}
