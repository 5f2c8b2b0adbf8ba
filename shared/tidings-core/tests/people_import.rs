//! Users written in batches against the embedded backend (docs/people.md, "Importing users"):
//! a batch that meets a concurrent `PUT` of one of its users leaves that user's tag memberships
//! agreeing with the user, and its other users written; a batch's transactions stay within
//! DynamoDB's limits; an import's devices and opt-outs are written once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use tidings_core::people::import::{ImportedUser, import_batch};
use tidings_core::people::users::{self, BatchUser, UserInput, put_user, put_users, segment_page};
use tidings_core::ports::{Platform, StoreError};
use tidings_core::{Deps, TenantId, notify::model::Category, people::preferences};
use tidings_embedded::test_world::{Around, Call, TestWorld, Wrapped};

/// The embedded table, which on its first batch transaction lets a `PUT` of `user` (to the tag
/// `moved`) go first, as a concurrent request would; and which counts transactions and checks
/// each against DynamoDB's limits.
struct RacingTable {
    deps: std::sync::OnceLock<Deps>,
    user: String,
    raced: AtomicBool,
    transactions: AtomicUsize,
}

#[async_trait]
impl Around for RacingTable {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        let Call::Transact(writes) = call else { return Ok(()) };
        tidings_core::sizes::check_transaction(writes)?;
        self.transactions.fetch_add(1, Ordering::SeqCst);
        if writes.len() > 3 && !self.raced.swap(true, Ordering::SeqCst) {
            let deps = self.deps.get().unwrap().clone();
            let t = TenantId::parse("shop").unwrap();
            let input =
                UserInput { email: Some("put@example.com".into()), tags: vec!["moved".into()], ..UserInput::default() };
            Box::pin(put_user(&deps, &t, &self.user, input)).await.unwrap();
        }
        Ok(())
    }
}

fn racing(user: &str) -> (Deps, Arc<Wrapped<RacingTable>>) {
    let world = TestWorld::builder().system_clock().build();
    let racing = RacingTable {
        deps: std::sync::OnceLock::new(),
        user: user.to_owned(),
        raced: AtomicBool::new(false),
        transactions: AtomicUsize::new(0),
    };
    let table = Arc::new(Wrapped::new(world.deps.table.clone(), racing));
    let mut deps = world.deps.clone();
    deps.table = table.clone();
    let _ = table.around.deps.set(deps.clone());
    (deps, table)
}

fn batch(n: usize, tags: &[&str]) -> Vec<(usize, BatchUser)> {
    (0..n)
        .map(|i| {
            (
                i,
                BatchUser {
                    user_id: format!("u{i:04}"),
                    email: Some(format!("u{i}@example.com")),
                    tags: tags.iter().map(|t| (*t).to_owned()).collect(),
                    ..BatchUser::default()
                },
            )
        })
        .collect()
}

/// Members of a tag, by id.
async fn members(deps: &Deps, t: &TenantId, tag: &str) -> Vec<String> {
    let (page, _) = segment_page(deps, t, tag, 500, None).await.unwrap();
    page.into_iter().map(|u| u.user_id).collect()
}

#[tokio::test]
async fn a_batch_meeting_a_concurrent_put_keeps_memberships_with_the_user() {
    let (deps, table) = racing("u0003");
    let t = TenantId::parse("shop").unwrap();
    let outcome = put_users(&deps, &t, batch(300, &["news", "vip"])).await.unwrap();
    assert!(table.around.raced.load(Ordering::SeqCst), "the concurrent PUT ran inside the batch");
    assert_eq!((outcome.upserted, outcome.unchanged, outcome.errors.len()), (300, 0, 0));
    // The batch's write of u0003 came after the PUT: the user and its memberships are the batch's.
    let u = users::get_user(&deps, &t, "u0003").await.unwrap().unwrap();
    assert_eq!(
        (u.email.as_deref(), u.tags.clone()),
        (Some("u3@example.com"), vec!["news".to_owned(), "vip".to_owned()])
    );
    assert!(members(&deps, &t, "moved").await.is_empty(), "no membership left from the PUT");
    assert_eq!(members(&deps, &t, "news").await.len(), 300);
    assert_eq!(members(&deps, &t, "vip").await.len(), 300);
    // Four writes a user, at most 100 a transaction: at least 12 of them, each within the limits.
    assert!(table.around.transactions.load(Ordering::SeqCst) >= 12);
    // Again: nothing is written.
    let before = table.around.transactions.load(Ordering::SeqCst);
    let again = put_users(&deps, &t, batch(300, &["news", "vip"])).await.unwrap();
    assert_eq!((again.upserted, again.unchanged), (300, 300));
    assert_eq!(table.around.transactions.load(Ordering::SeqCst), before, "a repeat costs reads only");
}

/// A user with 50 tags (52 writes) and one moving from 50 tags to 50 others (102 writes: more
/// than a transaction holds) are written like `PUT` writes them.
#[tokio::test]
async fn users_with_many_tags_fit_the_transaction_limits() {
    let (deps, _) = racing("none");
    let t = TenantId::parse("shop").unwrap();
    let tags_a: Vec<String> = (0..50).map(|i| format!("a{i}")).collect();
    let tags_b: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
    let make =
        |id: &str, tags: &[String]| BatchUser { user_id: id.into(), tags: tags.to_vec(), ..BatchUser::default() };
    let first = vec![(0, make("x", &tags_a)), (1, make("y", &tags_a)), (2, make("z", &tags_a))];
    assert_eq!(put_users(&deps, &t, first).await.unwrap().upserted, 3);
    let second = vec![(0, make("x", &tags_b)), (1, make("y", &tags_a))];
    let outcome = put_users(&deps, &t, second).await.unwrap();
    assert_eq!((outcome.upserted, outcome.unchanged), (2, 1));
    assert_eq!(members(&deps, &t, "a7").await, ["y", "z"]);
    assert_eq!(members(&deps, &t, "b7").await, ["x"]);
}

#[tokio::test]
async fn an_import_writes_devices_and_opt_outs_once() {
    let world = TestWorld::builder().system_clock().build();
    let deps = world.deps;
    let t = TenantId::parse("shop").unwrap();
    let people = vec![
        (
            0,
            ImportedUser {
                user: BatchUser { user_id: "p1".into(), ..BatchUser::default() },
                devices: vec![(Platform::Ios, "tok-1".into()), (Platform::Android, "tok-2".into())],
                marketing_opt_out: true,
            },
        ),
        (
            1,
            ImportedUser {
                user: BatchUser { user_id: "p2".into(), email: Some("nope".into()), ..BatchUser::default() },
                devices: vec![(Platform::Ios, "tok-3".into())],
                marketing_opt_out: true,
            },
        ),
        (
            2,
            ImportedUser {
                user: BatchUser { user_id: "p3".into(), ..BatchUser::default() },
                devices: vec![(Platform::Ios, "has space".into())],
                marketing_opt_out: false,
            },
        ),
    ];
    let tally = import_batch(&deps, &t, people.clone()).await.unwrap();
    assert_eq!((tally.counts.users, tally.counts.devices, tally.counts.opt_outs), (2, 2, 2), "{tally:?}");
    let fields: Vec<&str> = tally.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["users[1].email", "users[2].devices[0].token"]);
    // The refused user's opt-out stands (a later PUT of them must not mail them marketing);
    // its device does not.
    assert!(!preferences::get(&deps, &t, "p2").await.unwrap().category_on(Category::Marketing));
    assert!(tidings_core::people::devices::list(&deps, &t, "p2").await.unwrap().is_empty());
    let again = import_batch(&deps, &t, people).await.unwrap();
    assert_eq!(
        (
            again.counts.users_unchanged,
            again.counts.devices,
            again.counts.devices_unchanged,
            again.counts.opt_outs,
            again.counts.opt_outs_unchanged
        ),
        (2, 0, 2, 0, 2),
        "{again:?}"
    );
}
