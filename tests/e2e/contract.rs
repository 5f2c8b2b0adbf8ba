//! The OpenAPI document and the answers agree (issue 32): every operation the document lists is
//! called with and without keys, with an empty and a malformed body and unknown path parameters,
//! and every answer must be a status the document lists for that operation
//! ([`crate::server::Server::undocumented`]; other e2e tests run the same check on their own
//! answers).

use crate::server::{Backend, Options, Server};

/// The document's operations as (method, path with `{param}`s filled, whether it takes a body).
fn operations() -> anyhow::Result<Vec<(String, String, bool)>> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut ops = Vec::new();
    for (template, item) in doc["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            let filled: Vec<String> = template
                .split('/')
                .map(|s| if s.starts_with('{') { "nope-1".to_owned() } else { s.to_owned() })
                .collect();
            ops.push((method.to_ascii_uppercase(), filled.join("/"), !op["requestBody"].is_null()));
        }
    }
    Ok(ops)
}

pub async fn every_answer_is_a_documented_status(backend: Backend) -> anyhow::Result<()> {
    let s = Server::start(backend, Options::default()).await?;
    let ops = operations()?;
    assert!(ops.len() > 50, "the document lists {} operations", ops.len());
    let tenant = s.key.clone();
    let operator = s.ops_key.clone();
    for (method, path, takes_body) in &ops {
        for key in [None, Some(tenant.as_str()), Some(operator.as_str())] {
            let bodies: &[&str] = if *takes_body { &["{}", "{", "[]"] } else { &[""] };
            for body in bodies {
                s.raw(method, path, body, key).await?;
            }
        }
    }
    let answers = s.answers();
    let statuses: std::collections::BTreeSet<u16> = answers.iter().map(|a| a.2).collect();
    let operations: std::collections::BTreeSet<(&str, &str)> =
        answers.iter().map(|a| (a.0.as_str(), a.1.as_str())).collect();
    eprintln!("{} answers to {} operations; statuses {statuses:?}", answers.len(), operations.len());
    assert_eq!(operations.len(), ops.len(), "every operation was called");
    for expected in [200, 400, 401, 404, 422] {
        assert!(statuses.contains(&expected), "no {expected} among {statuses:?}: the calls did not reach the handlers");
    }
    let undocumented = s.undocumented();
    assert!(undocumented.is_empty(), "answers the OpenAPI document does not list:\n{}", undocumented.join("\n"));
    // The check itself: an undocumented status, or an answer to no operation, is caught.
    let answer = |m: &str, p: &str, st: u16| vec![(m.to_owned(), p.to_owned(), st)];
    assert!(crate::server::undocumented(&answer("POST", "/v1/notifications/n1/cancel", 409)).is_empty());
    assert_eq!(crate::server::undocumented(&answer("POST", "/v1/notifications/n1/cancel", 201)).len(), 1);
    assert_eq!(crate::server::undocumented(&answer("GET", "/healthz", 404)).len(), 1);
    assert_eq!(crate::server::undocumented(&answer("GET", "/v1/nothing-here", 200)).len(), 1);
    assert!(crate::server::undocumented(&answer("GET", "/v1/nothing-here", 404)).is_empty());
    Ok(())
}
