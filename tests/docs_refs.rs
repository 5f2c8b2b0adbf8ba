//! Comments and docs speak of this repository: no file names a document a reader of the
//! repository does not have (the source documents the project started from, by number, or the
//! design and API notes that lived beside the repository), nor carries the untranslated pitfall
//! marker those documents used; a rule's reason is on a `docs/` page. And every `docs/*.md` page
//! a file names exists, with the section it quotes (`docs/inventory.md, "Holds expire"`).
//!
//! The forbidden words are built at run time, so this file does not name them itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

/// Folders never read: build output, tool installs, local data, and the fuzz corpora (whose
/// "seeds" are fuzzing inputs, not documents). This file is not read either: it holds the
/// examples its detectors are tested on.
const SKIP_DIRS: &[&str] =
    &["target", ".git", ".venv", ".venv-sam", ".ddb", ".tools", "node_modules", ".tidings", "corpus", "seeds"];

/// The kinds of file that hold comments or prose.
const EXTENSIONS: &[&str] = &["rs", "md", "yaml", "yml", "sh", "toml", "py", "html"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) {
                files(&path, out);
            }
        } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| EXTENSIONS.contains(&e))
            && !name.ends_with(".min.js")
            && !path.ends_with("tests/docs_refs.rs")
        {
            out.push(path);
        }
    }
}

/// What is wrong with one line, if anything: the reference it makes to a document the reader
/// does not have.
fn dangling_reference(line: &str) -> Option<&'static str> {
    let lower = line.to_lowercase();
    let seed = ["se", "ed"].concat();
    // "seed 004", "seed `002...`", "seeds/000_..."
    for (at, _) in lower.match_indices(&seed) {
        if lower[..at].ends_with('-') {
            continue; // a command's `--seed 7`
        }
        let rest = &lower[at + seed.len()..];
        let mut chars = rest.chars();
        let next = chars.next();
        let after = chars.next();
        let numbered = matches!((next, after), (Some(' ' | '`' | '/'), Some(c)) if c.is_ascii_digit())
            || matches!((next, after), (Some(' '), Some('`')) if rest[2..].starts_with(|c: char| c.is_ascii_digit()))
            || rest.starts_with("s/0");
        if numbered {
            return Some("names a source document by its number");
        }
        // "the seed's rule", "the seed," (but "the seeds" of a fuzz corpus is fine)
        let before = &lower[..at];
        if before.ends_with("the ") && !next.is_some_and(|c| c.is_alphanumeric()) {
            return Some("speaks of 'the seed', a document the reader does not have");
        }
    }
    for doc in [["design", ".md"].concat(), ["api", ".md"].concat()] {
        for (at, _) in lower.match_indices(&doc) {
            let before = lower[..at].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                return Some("names a design or API note that is not in the repository");
            }
        }
    }
    if line.contains('\u{5751}') {
        return Some("carries the untranslated pitfall marker: say the pitfall in words, or point at docs/");
    }
    None
}

/// Every `docs/NAME.md` a line names, with the section it quotes right after (`, "Section"`).
fn docs_references(line: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (at, _) in line.match_indices("docs/") {
        let rest = &line[at + 5..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect();
        let Some(after) = rest[name.len()..].strip_prefix(".md") else { continue };
        if name.is_empty() {
            continue;
        }
        let section = after
            .strip_prefix(", \"")
            .and_then(|s| s.split_once('"'))
            .map(|(section, _)| section.to_owned())
            .filter(|s| !s.is_empty());
        out.push((name, section));
    }
    out
}

/// The headings of a markdown page, without their `#`s.
fn headings(page: &str) -> Vec<String> {
    page.lines().filter(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim().to_owned()).collect()
}

#[test]
fn no_file_references_a_document_the_reader_does_not_have() {
    let root = root();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(all.len() > 100, "the walk found only {} files under {}", all.len(), root.display());
    let mut findings = Vec::new();
    for path in &all {
        let Ok(text) = fs::read_to_string(path) else { continue };
        for (n, line) in text.lines().enumerate() {
            if let Some(why) = dangling_reference(line) {
                let shown = path.strip_prefix(&root).unwrap_or(path).display();
                findings.push(format!("{shown}:{}: {why}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(findings.is_empty(), "references to documents not in this repository:\n{}", findings.join("\n"));
}

#[test]
fn every_docs_page_a_file_names_exists_with_the_section_it_quotes() {
    let root = root();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut findings = Vec::new();
    let mut seen = 0;
    for path in &all {
        let Ok(text) = fs::read_to_string(path) else { continue };
        for (n, line) in text.lines().enumerate() {
            for (name, section) in docs_references(line) {
                seen += 1;
                let shown = path.strip_prefix(&root).unwrap_or(path).display();
                let page_path = root.join("docs").join(format!("{name}.md"));
                let Ok(page) = fs::read_to_string(&page_path) else {
                    findings.push(format!("{shown}:{}: docs/{name}.md does not exist", n + 1));
                    continue;
                };
                if let Some(section) = section
                    && !headings(&page).iter().any(|h| h.starts_with(&section))
                {
                    findings.push(format!("{shown}:{}: docs/{name}.md has no section \"{section}\"", n + 1));
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} references to docs/ pages found: is the walk reading the sources?");
    assert!(findings.is_empty(), "references to docs/ pages that do not exist:\n{}", findings.join("\n"));
}

/// The detectors themselves: each kind of dangling reference is caught, and the words that only
/// look alike (a fuzz corpus's seeds, a random seed, openapi.json) are not.
#[test]
fn the_detectors_catch_each_kind_and_nothing_else() {
    let seed = ["Se", "ed"].concat();
    let flagged = [
        format!("/// Warm-up ({} 002 §5): creates the SKU", seed.to_lowercase()),
        format!("//! Back-in-stock ({} `000_b8f88220a1c75690.txt`)", seed.to_lowercase()),
        format!("// {} 004 §6: each pitfall", seed),
        format!("// the {}'s unique key", seed.to_lowercase()),
        format!("//! The HTTP API (`../shared/{}`)", ["API", ".md"].concat()),
        format!("//! Timers ({} \"Timers\")", ["DESIGN", ".md"].concat()),
        format!("/// {}3: restoring stock with SET", '\u{5751}'),
    ];
    for line in &flagged {
        assert!(dangling_reference(line).is_some(), "not caught: {line}");
    }
    let fine = [
        "//! runs them over its seeds, mutations of the seeds and random bytes, from a fixed seed",
        "    --seed 7 \\",
        "async fn seed_users(table: &dyn Table) {}",
        "let seed: StockEvent = serde_json::from_value(v)?;",
        "cargo run -q -p tidings -- openapi > openapi.json",
        "see docs/inventory.md, \"Holds expire\"",
    ];
    for line in fine {
        assert_eq!(dangling_reference(line), None, "caught wrongly: {line}");
    }
    assert_eq!(
        docs_references("(docs/inventory.md, \"Holds expire\") and docs/README.md"),
        vec![("inventory".to_owned(), Some("Holds expire".to_owned())), ("README".to_owned(), None)]
    );
}

/// A heading's anchor as mdBook (and GitHub) make it: lower case, letters, digits, `-` and `_`
/// kept, spaces as `-`, everything else dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of a markdown page outside fenced code blocks, with their numbers.
fn prose_lines(page: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in page.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((n + 1, line));
        }
    }
    out
}

/// Every anchor a page's headings make, a repeated heading numbered as mdBook numbers it.
fn anchors(page: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, line) in prose_lines(page) {
        if let Some(h) = line.strip_prefix('#') {
            let base = anchor_of(h.trim_start_matches('#'));
            let repeats = out
                .iter()
                .filter(|a| {
                    **a == base || a.strip_prefix(&format!("{base}-")).is_some_and(|n| n.parse::<u32>().is_ok())
                })
                .count();
            out.push(if repeats == 0 { base } else { format!("{base}-{repeats}") });
        }
    }
    out
}

/// The `[text](target)` links of a line, outside inline code.
fn links(line: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            prose.push(c);
        }
    }
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].to_owned());
        rest = &after[end..];
    }
    out
}

/// What is wrong with one link of `from` (a file under `root`), if anything. `in_book`: the
/// page is rendered by mdBook, so its links must stay among the book's files.
fn broken_link(root: &Path, from: &Path, target: &str, in_book: bool) -> Option<String> {
    if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = target.split_once('#').map_or((target, None), |(p, a)| (p, Some(a)));
    let dir = from.parent().expect("a file's folder");
    let file = if path.is_empty() { from.to_path_buf() } else { dir.join(path) };
    let Ok(file) = file.canonicalize() else { return Some(format!("{target}: no such file")) };
    if in_book && !file.starts_with(root.join("docs")) {
        return Some(format!("{target}: leaves the book (docs/), so it is broken in the rendered book"));
    }
    if let Some(anchor) = anchor {
        let Ok(page) = fs::read_to_string(&file) else { return Some(format!("{target}: not a text page")) };
        if !anchors(&page).iter().any(|a| a == anchor) {
            return Some(format!("{target}: the page has no heading with the anchor #{anchor}"));
        }
    }
    None
}

#[test]
fn every_link_in_the_book_and_readme_resolves() {
    let root = root().canonicalize().expect("the workspace root");
    let docs = root.join("docs");
    let summary = fs::read_to_string(docs.join("SUMMARY.md")).expect("docs/SUMMARY.md");
    let mut pages: Vec<PathBuf> = fs::read_dir(&docs)
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    let mut findings = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let name = page.file_name().expect("a name").to_string_lossy().into_owned();
        // Every page is in the book: one SUMMARY.md does not name is never rendered.
        if name != "SUMMARY.md" && !summary.contains(&format!("]({name})")) {
            findings.push(format!("docs/{name}: not in docs/SUMMARY.md, so the book does not have it"));
        }
        let text = fs::read_to_string(page).expect("a page");
        for (n, line) in prose_lines(&text) {
            for target in links(line) {
                checked += 1;
                if let Some(why) = broken_link(&root, page, &target, true) {
                    findings.push(format!("docs/{name}:{n}: {why}"));
                }
            }
        }
    }
    let readme = root.join("README.md");
    let text = fs::read_to_string(&readme).expect("README.md");
    for (n, line) in prose_lines(&text) {
        for target in links(line) {
            checked += 1;
            if let Some(why) = broken_link(&root, &readme, &target, false) {
                findings.push(format!("README.md:{n}: {why}"));
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: is the walk reading the pages?");
    assert!(findings.is_empty(), "broken links:\n{}", findings.join("\n"));
}

/// The link checker itself: a missing page, a missing anchor and a link out of the book are
/// each caught; a repeated heading's numbered anchor and a link inside code are not.
#[test]
fn the_link_checker_catches_each_kind() {
    let root = root().canonicalize().expect("the workspace root");
    let page = root.join("docs").join("README.md");
    assert!(broken_link(&root, &page, "nowhere.md", true).is_some());
    assert!(broken_link(&root, &page, "inventory.md#no-such-heading", true).is_some());
    assert!(broken_link(&root, &page, "../LICENSE", true).is_some());
    assert_eq!(broken_link(&root, &page, "../LICENSE", false), None);
    assert_eq!(broken_link(&root, &page, "inventory.md#holds-expire", true), None);
    assert_eq!(anchors("# A\n## The `x` (y)!\n```\n# not a heading\n```\n## A"), ["a", "the-x-y", "a-1"]);
    assert_eq!(links("see [a](b.md) and `[c](d.md)`"), ["b.md"]);
}
