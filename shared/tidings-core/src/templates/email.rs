//! An email's two parts (docs/security.md, "Email parts"): a text part and an HTML part, either of which a
//! template may leave out and have derived from the other. Text becomes HTML by escaping, with
//! paragraphs (a blank line) as `<p>`, other line breaks as `<br>` and bare `http(s)` URLs as
//! anchors. HTML becomes text on html5ever's tokenizer: blocks and `<br>` as line breaks, list
//! items as `* ` or numbers, a link's URL in parentheses after its text (bare, where click
//! tracking finds it), entities decoded, `<head>`, `<script>` and `<style>` left out. Only the
//! tokenizer: html5ever's tree builder (and html2text on it) takes time quadratic in the nesting
//! depth (about 40 s for the 20,000 nested `<div>` that fit in a template), and a template is
//! tenant input rendered in workers every tenant shares.
//!
//! The text part never carries markup of its own: the open pixel goes into the HTML part only,
//! and tracked links are bare URLs in the text and `href`s in the HTML (`crate::tracking`).

use std::cell::RefCell;

use html5ever::TokenizerResult;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{BufferQueue, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts};
use linkify::{LinkFinder, LinkKind};

/// Whether `text` holds an HTML tag, comment or doctype: `<` then a letter, `/` and a letter, or
/// `!`, closed by a later `>`.
pub fn has_markup(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().enumerate().any(|(i, &b)| {
        if b != b'<' {
            return false;
        }
        let opens = match (bytes.get(i + 1), bytes.get(i + 2)) {
            (Some(c), _) if c.is_ascii_alphabetic() || *c == b'!' => true,
            (Some(b'/'), Some(c)) => c.is_ascii_alphabetic(),
            _ => false,
        };
        opens && bytes[i..].contains(&b'>')
    })
}

fn url_finder() -> LinkFinder {
    let mut finder = LinkFinder::new();
    finder.kinds(&[LinkKind::Url]);
    finder
}

/// An `http` or `https` URL (the only ones made into anchors or tracked in text).
fn is_web_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// `text` escaped for an HTML attribute value in double quotes (and so for text too).
pub fn escape_attr(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_escaped(&mut out, text, true);
    out
}

fn push_escaped(out: &mut String, text: &str, attribute: bool) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attribute => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// The HTML part made from a text part: escaped, a paragraph (lines up to a blank line) in
/// `<p>`, its other line breaks `<br>`, and each bare `http(s)` URL an anchor to itself.
pub fn text_to_html(text: &str) -> String {
    let finder = url_finder();
    let mut out = String::with_capacity(text.len() + text.len() / 8 + 16);
    let mut in_paragraph = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            if in_paragraph {
                out.push_str("</p>\n");
                in_paragraph = false;
            }
            continue;
        }
        if in_paragraph {
            out.push_str("<br>\n");
        } else {
            out.push_str("<p>");
            in_paragraph = true;
        }
        for span in finder.spans(line) {
            let s = span.as_str();
            if span.kind().is_some() && is_web_url(s) {
                out.push_str("<a href=\"");
                push_escaped(&mut out, s, true);
                out.push_str("\">");
                push_escaped(&mut out, s, false);
                out.push_str("</a>");
            } else {
                push_escaped(&mut out, s, false);
            }
        }
    }
    if in_paragraph {
        out.push_str("</p>\n");
    }
    out
}

/// The text of an HTML part, built token by token.
#[derive(Default)]
struct TextOut {
    out: String,
    /// Line breaks owed before the next text (1: a new line, 2: a blank line).
    breaks: usize,
    /// A space owed before the next text on the line.
    space: bool,
    /// Inside `<head>`, `<script>`, `<style>`, `<title>`, ...: text left out.
    hidden: usize,
    /// Inside `<pre>`: white space kept.
    pre: usize,
    /// Open lists: `None` a `<ul>`, `Some(n)` an `<ol>` at item n.
    lists: Vec<Option<u32>>,
    /// Open links: their URL, and where their text starts in `out`.
    links: Vec<(Option<String>, usize)>,
    /// The cell starts a row (no separator before it).
    row_start: bool,
}

impl TextOut {
    fn block(&mut self, breaks: usize) {
        if !self.out.is_empty() {
            self.breaks = self.breaks.max(breaks);
        }
        self.space = false;
    }

    fn text(&mut self, text: &str) {
        if self.hidden > 0 {
            return;
        }
        if self.pre > 0 {
            self.flush();
            self.out.push_str(text);
            return;
        }
        for (i, word) in text.split(|c: char| c.is_ascii_whitespace()).enumerate() {
            if i > 0 {
                self.space = true;
            }
            if word.is_empty() {
                continue;
            }
            self.flush();
            self.out.push_str(word);
        }
    }

    /// What is owed before more text: line breaks, or a space within a line.
    fn flush(&mut self) {
        if self.breaks > 0 {
            while self.out.ends_with([' ', '\t']) {
                self.out.pop();
            }
            let have = self.out.len() - self.out.trim_end_matches('\n').len();
            for _ in have..self.breaks {
                self.out.push('\n');
            }
        } else if self.space && !self.out.is_empty() && !self.out.ends_with(['\n', ' ']) {
            self.out.push(' ');
        }
        self.breaks = 0;
        self.space = false;
    }

    fn start(&mut self, name: &str, attr: impl Fn(&str) -> Option<String>) {
        match name {
            "head" | "script" | "style" | "title" | "template" | "noscript" | "object" | "iframe" => self.hidden += 1,
            "br" => {
                self.flush();
                self.out.push('\n');
            }
            "p" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "table" | "blockquote" | "dl" | "hr" => {
                self.block(2);
                if name == "hr" {
                    self.text("----");
                    self.block(2);
                }
            }
            "pre" => {
                self.block(2);
                self.pre += 1;
            }
            "ul" => {
                self.block(1);
                self.lists.push(None);
            }
            "ol" => {
                self.block(1);
                self.lists.push(Some(0));
            }
            "li" => {
                self.block(1);
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        *n += 1;
                        format!("{n}.")
                    }
                    _ => "*".to_owned(),
                };
                self.text(&marker);
                self.space = true;
            }
            "tr" => {
                self.block(1);
                self.row_start = true;
            }
            "td" | "th" => {
                if !self.row_start {
                    self.space = true;
                }
                self.row_start = false;
            }
            "div" | "section" | "article" | "header" | "footer" | "main" | "nav" | "aside" | "address" | "center"
            | "figure" | "figcaption" | "form" | "fieldset" | "dt" | "dd" | "caption" => self.block(1),
            "img" => {
                if let Some(alt) = attr("alt").filter(|a| !a.trim().is_empty()) {
                    self.text(&alt);
                }
            }
            "a" => {
                let at = self.out.len();
                self.links.push((attr("href"), at));
            }
            _ => {}
        }
    }

    fn end(&mut self, name: &str) {
        match name {
            "head" | "script" | "style" | "title" | "template" | "noscript" | "object" | "iframe" => {
                self.hidden = self.hidden.saturating_sub(1)
            }
            "p" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "table" | "blockquote" | "dl" => self.block(2),
            "pre" => {
                self.pre = self.pre.saturating_sub(1);
                self.block(2);
            }
            "ul" | "ol" => {
                self.lists.pop();
                self.block(1);
            }
            "div" | "section" | "article" | "header" | "footer" | "main" | "nav" | "aside" | "address" | "center"
            | "figure" | "figcaption" | "form" | "fieldset" | "dt" | "dd" | "caption" | "li" | "tr" => self.block(1),
            "a" => {
                let Some((href, at)) = self.links.pop() else { return };
                let Some(href) = href.map(|h| h.trim().to_owned()).filter(|h| is_web_url(h)) else { return };
                let shown = self.out.get(at..).unwrap_or_default().trim();
                if shown != href && shown.trim_end_matches('/') != href.trim_end_matches('/') {
                    self.space = true;
                    self.text(&format!("({href})"));
                    self.space = true;
                }
            }
            _ => {}
        }
    }
}

/// The tokenizer's sink: tags and text into a [`TextOut`], raw text where the HTML spec has it.
struct TextSink(RefCell<TextOut>);

impl TokenSink for TextSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut out = self.0.borrow_mut();
        match token {
            Token::TagToken(tag) => {
                let name: &str = &tag.name;
                match tag.kind {
                    TagKind::StartTag => {
                        out.start(name, |wanted| {
                            tag.attrs.iter().find(|a| &*a.name.local == wanted).map(|a| a.value.to_string())
                        });
                        // As the tree builder would switch the tokenizer (HTML, "parsing").
                        return match name {
                            "script" => TokenSinkResult::RawData(RawKind::ScriptData),
                            "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => {
                                TokenSinkResult::RawData(RawKind::Rawtext)
                            }
                            "title" | "textarea" => TokenSinkResult::RawData(RawKind::Rcdata),
                            "plaintext" => TokenSinkResult::Plaintext,
                            _ => TokenSinkResult::Continue,
                        };
                    }
                    TagKind::EndTag => out.end(name),
                }
            }
            Token::CharacterTokens(text) => out.text(&text),
            _ => {}
        }
        TokenSinkResult::Continue
    }
}

/// The text part made from an HTML part (module documentation), in time linear in its length.
pub fn html_to_text(html: &str) -> String {
    let tokenizer = Tokenizer::new(TextSink(RefCell::new(TextOut::default())), TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(html.into());
    // The sink never asks to stop for a script: one feed reads everything.
    while let TokenizerResult::Script(()) = tokenizer.feed(&input) {}
    tokenizer.end();
    let out = std::mem::take(&mut tokenizer.sink.0.borrow_mut().out);
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    let mut text = String::with_capacity(out.len());
    let mut blank = 0;
    for line in lines {
        if line.is_empty() {
            blank += 1;
            continue;
        }
        if !text.is_empty() {
            text.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        text.push_str(line);
    }
    text
}

/// Rewrites every bare `http(s)` URL of a text part with `f` (kept as is when `f` gives nothing).
pub fn rewrite_text_links(text: &str, f: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    for span in url_finder().spans(text) {
        let s = span.as_str();
        match (span.kind().is_some() && is_web_url(s)).then(|| f(s)).flatten() {
            Some(new) => out.push_str(&new),
            None => out.push_str(s),
        }
    }
    out
}

/// `tag` added to an HTML part: before its last `</body>` when it has one, else at its end.
pub fn append_to_body(html: &str, tag: &str) -> String {
    let at = html.to_ascii_lowercase().rfind("</body>");
    match at {
        Some(i) => format!("{}{tag}\n{}", &html[..i], &html[i..]),
        None => format!("{html}\n{tag}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_a_tag_a_comment_or_a_doctype() {
        for yes in ["<p>x</p>", "a <br> b", "</div>", "<!-- c -->", "<!DOCTYPE html>", "x<a href=\"u\">"] {
            assert!(has_markup(yes), "{yes}");
        }
        for no in ["a < b", "1 <2 and 3> 2", "<3", "x <", "Use < and > freely", "price: <€5>"] {
            assert!(!has_markup(no), "{no}");
        }
    }

    #[test]
    fn text_becomes_escaped_paragraphs_with_line_breaks_and_anchors() {
        let text = "Hi Tom & <Jerry>,\nyour order shipped.\n\n\nTrack it: https://shop.example/o/1?a=1&b=2.\r\nThanks";
        assert_eq!(
            text_to_html(text),
            "<p>Hi Tom &amp; &lt;Jerry&gt;,<br>\nyour order shipped.</p>\n\
             <p>Track it: <a href=\"https://shop.example/o/1?a=1&amp;b=2\">https://shop.example/o/1?a=1&amp;b=2</a>.<br>\nThanks</p>\n"
        );
        // Only web URLs become anchors; a URL with a quote cannot leave its attribute.
        let html = text_to_html("mailto:a@b.example ftp://x.example/f javascript:alert(1) https://a.example/\"x");
        assert_eq!(html.matches("<a ").count(), 1, "{html}");
        assert!(!html.contains("href=\"https://a.example/\"x"), "{html}");
        assert_eq!(text_to_html(""), "");
        assert_eq!(text_to_html("\n \n"), "");
    }

    #[test]
    fn html_becomes_text_with_link_urls_and_no_markup() {
        let html = "<!DOCTYPE html><html><head><style>p { color: red }</style><title>T</title></head><body>\
            <h1>Hello</h1><p>Your <b>order</b> &amp; more: <a href=\"https://shop.example/o/1?a=1&amp;b=2\">see it</a></p>\
            <!-- a <div> in a comment --><ul><li>one<li>two</ul><ol><li>first</li><li>second</li></ol>\
            <table><tr><td>SKU</td><td>Qty</td></tr><tr><td>s1</td><td>2</td></tr></table>\
            <p>Line<br>break, <a href=\"https://shop.example/\">https://shop.example/</a> \
            <a href=\"mailto:help@shop.example\">mail us</a></p><img src=\"https://cdn.example/x.png\" alt=\"\">\
            <img src=\"y.png\" alt=\"Logo\"><script>if (a < b) { alert(1) }</script><pre>  keep\n    this</pre></body></html>";
        let text = html_to_text(html);
        assert!(!has_markup(&text), "{text}");
        assert_eq!(
            text,
            "Hello\n\nYour order & more: see it (https://shop.example/o/1?a=1&b=2)\n\n* one\n* two\n1. first\n2. second\n\n\
             SKU Qty\ns1 2\n\nLine\nbreak, https://shop.example/ mail us\n\nLogo\n\n  keep\n    this"
        );
        // A long URL stays whole on its line (tracking finds it whole).
        let long = format!("https://shop.example/{}", "p".repeat(200));
        assert_eq!(html_to_text(&format!("<p><a href=\"{long}\">x</a></p>")), format!("x ({long})"));
        // What the HTML escaped is text again: a value shown as it is.
        assert_eq!(html_to_text("<p>&lt;b&gt;Tom&lt;/b&gt; &#38; Jerry</p>"), "<b>Tom</b> & Jerry");
    }

    /// Nesting that makes a tree builder quadratic (20,000 levels in 120 KB) is read in one pass.
    #[test]
    fn hostile_html_converts_in_linear_time() {
        let started = std::time::Instant::now();
        for html in [
            "<div>".repeat(20_000),
            "<blockquote>".repeat(10_000) + "x",
            "<table><tr><td>".repeat(8_000) + "x",
            "<ul><li>".repeat(15_000) + "x",
            "<hr>".repeat(30_000),
            "<a href=\"https://x.example/\">".repeat(5_000) + "x",
        ] {
            let text = html_to_text(&html);
            assert!(text.len() <= 2 * html.len(), "{}", text.len());
        }
        // About 3 s unoptimized on a busy machine; the tree builder took minutes.
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }

    #[test]
    fn text_links_are_rewritten_but_not_other_schemes() {
        let out = rewrite_text_links("See https://a.example/x?y=1, (http://b.example/) or mailto:m@c.example.", |u| {
            Some(format!("T[{u}]"))
        });
        assert_eq!(out, "See T[https://a.example/x?y=1], (T[http://b.example/]) or mailto:m@c.example.");
        assert_eq!(rewrite_text_links("https://a.example/", |_| None), "https://a.example/");
    }

    #[test]
    fn a_tag_goes_before_the_closing_body_or_at_the_end() {
        assert_eq!(append_to_body("<html><BODY>x</BODY></html>", "<img>"), "<html><BODY>x<img>\n</BODY></html>");
        assert_eq!(append_to_body("<p>x</p>", "<img>"), "<p>x</p>\n<img>");
    }
}
