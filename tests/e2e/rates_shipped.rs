//! Provider and tenant rates in the shape that ships: the template's `ProviderRates` and
//! `TenantRates` reach the channel worker, whose environments (separate processes under the
//! harness's Lambda runtime) draw from the same token buckets in the table.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tidings_core::gates::token_bucket::most_in_any_second;

use crate::lambda::{Options, Stack};

async fn ok_as(s: &Stack, key: &str, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let (st, v) = s.call_as(key, method, path, body).await?;
    anyhow::ensure!((200..300).contains(&st), "{method} {path}: {st} {v}\nrefused: {:?}", s.refused());
    Ok(v)
}

/// Email at 4 a second for the whole stack, tenant acme at 2: acme's 10 mails and globex's 14
/// go out through two channel-worker processes at once. Every mail is delivered, the stack
/// never sends more than 4 in any second nor acme more than 2 (measured where SES receives
/// them), and both processes did send.
pub async fn two_workers_behind_one_shared_gate_never_exceed_the_rate() -> anyhow::Result<()> {
    const EMAIL_RATE: usize = 4;
    const ACME_RATE: usize = 2;
    let s = Stack::start(Options {
        concurrency: 2,
        parameters: vec![
            ("ProviderRates".into(), format!("email:{EMAIL_RATE}")),
            ("TenantRates".into(), format!("acme:{ACME_RATE}")),
        ],
        ..Options::default()
    })
    .await?;
    let template =
        json!({"default_locale": "en", "locales": {"en": {"email_subject": "Code", "email_body": "Code {{ n }}"}}});
    let tenants = [(s.key.clone(), "acme", 10usize), (s.other_key.clone(), "globex", 14usize)];
    for (key, tenant, members) in &tenants {
        ok_as(&s, key, "PUT", "/v1/templates/code", Some(template.clone())).await?;
        for i in 0..*members {
            let body = json!({"email": format!("u{i}@{tenant}.test")});
            ok_as(&s, key, "PUT", &format!("/v1/users/u{i}"), Some(body)).await?;
        }
    }
    let sent_before = s.sends().len();
    let mut ids = Vec::new();
    for (key, tenant, members) in &tenants {
        // One transactional notification per user: the high-priority queue's batches of 10,
        // so both worker environments take some.
        for i in 0..*members {
            let body = json!({"idempotency_key": format!("rate-{tenant}-{i}"), "recipients": {"user_ids": [format!("u{i}")]},
                "template_id": "code", "params": {"n": i}, "category": "transactional", "channels": ["email"]});
            let v = ok_as(&s, key, "POST", "/v1/notifications", Some(body)).await?;
            ids.push((key.clone(), v["notification_id"].as_str().unwrap_or_default().to_owned()));
        }
    }
    for (key, id) in &ids {
        s.eventually(Duration::from_secs(180), &format!("{id} completed"), || async {
            let (_, v) = s.call_as(key, "GET", &format!("/v1/notifications/{id}"), None).await?;
            Ok((v["status"] == "completed").then_some(v))
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mails: Vec<_> = s.sends().into_iter().skip(sent_before).filter(|m| m.channel == "email").collect();
    let to: BTreeSet<_> = mails.iter().map(|m| m.to.clone()).collect();
    assert_eq!((mails.len(), to.len()), (24, 24), "every mail once: {:?}", to);
    let ms = |m: &crate::lambda::proxy::ProviderCall| i64::try_from(m.at_ms).unwrap_or(i64::MAX);
    let mut all: Vec<i64> = mails.iter().map(ms).collect();
    all.sort_unstable();
    let mut acme: Vec<i64> = mails.iter().filter(|m| m.to.ends_with("@acme.test")).map(ms).collect();
    acme.sort_unstable();
    let (most, most_acme) = (most_in_any_second(&all), most_in_any_second(&acme));
    println!("most sends in one second: {most} of {EMAIL_RATE} (stack), {most_acme} of {ACME_RATE} (acme)");
    assert!(most <= EMAIL_RATE, "{most} mails in one second, over the rate {EMAIL_RATE}: {all:?}");
    assert!(most_acme <= ACME_RATE, "{most_acme} of acme's mails in one second, over {ACME_RATE}: {acme:?}");
    let worker = s.stats()["channel-worker"].clone();
    assert!(worker.cold_starts >= 2, "two worker processes drew from the buckets: {worker:?}");
    Ok(())
}
