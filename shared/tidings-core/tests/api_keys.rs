//! API keys: roles, expiry, rotation's grace, revocation, and what a local run's environment
//! registers, against the embedded store through the ports.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use chrono::Duration;
use tidings_core::ops::tenants::{self, KeySpec, Principal, Role};
use tidings_core::ports::{Clock, Cond, Item, ManualClock, attrs_of};
use tidings_core::{CoreError, Deps, TenantId, keys};
use tidings_embedded::test_world::TestWorld;

fn world() -> (Deps, Arc<ManualClock>) {
    let w = TestWorld::builder().start_at("2026-12-01T10:00:00Z").build();
    (w.deps.clone(), w.clock())
}

fn acme() -> TenantId {
    TenantId::parse("acme").unwrap()
}

fn tenant_spec() -> KeySpec {
    KeySpec { role: Role::Tenant, tenant: Some(acme()), name: Some("checkout".into()), expires_at: None }
}

#[tokio::test]
async fn a_key_authenticates_as_its_role_and_the_table_holds_only_its_hash() {
    let (deps, _) = world();
    let t = tenants::create(&deps, tenant_spec()).await.unwrap();
    let o = tenants::create(&deps, KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
    assert_eq!(
        tenants::authenticate(&deps, &t.key).await.unwrap(),
        Some(Principal::Tenant { tenant: acme(), key_id: Some(t.info.id.clone()) })
    );
    assert_eq!(tenants::authenticate(&deps, &o.key).await.unwrap(), Some(Principal::Operator { key_id: o.info.id }));
    assert_eq!(tenants::authenticate(&deps, "tk_nobody").await.unwrap(), None);
    // Neither item holds the secret.
    let lookup = deps.table.get(&keys::api_key(&tenants::hash_key(&t.key))).await.unwrap().unwrap();
    let index = deps.table.get(&keys::api_key_index(&t.info.id)).await.unwrap().unwrap();
    for item in [lookup, index] {
        assert!(!serde_json::to_string(&item.attrs).unwrap().contains(&t.key));
    }
}

#[tokio::test]
async fn a_tenant_key_must_name_its_tenant_and_an_operator_key_must_not() {
    let (deps, _) = world();
    let e = tenants::create(&deps, KeySpec { role: Role::Tenant, ..Default::default() }).await.unwrap_err();
    assert!(matches!(e, CoreError::Invalid { ref field, .. } if field == "tenant"), "{e:?}");
    let e = tenants::create(&deps, KeySpec { role: Role::Operator, tenant: Some(acme()), ..Default::default() })
        .await
        .unwrap_err();
    assert!(matches!(e, CoreError::Invalid { ref field, .. } if field == "tenant"), "{e:?}");
}

#[tokio::test]
async fn a_revoked_key_is_refused_at_once_and_stays_listed_as_revoked() {
    let (deps, _) = world();
    let t = tenants::create(&deps, tenant_spec()).await.unwrap();
    let revoked = tenants::revoke(&deps, &t.info.id).await.unwrap();
    assert_eq!(revoked.status, "revoked");
    assert_eq!(tenants::authenticate(&deps, &t.key).await.unwrap(), None);
    let (listed, _) = tenants::list(&deps, Some(&acme()), 50, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, "revoked");
    // Again: nothing changes, no error.
    assert_eq!(tenants::revoke(&deps, &t.info.id).await.unwrap().status, "revoked");
    assert!(matches!(tenants::revoke(&deps, "key_unknown").await, Err(CoreError::NotFound { .. })));
}

/// The instance that revokes a key forgets what it read of keys: the key it had just
/// accepted (and holds in its cache) is refused at its next request, with no time passing.
#[tokio::test]
async fn a_key_accepted_a_moment_ago_is_refused_once_revoked_here() {
    let (deps, _) = world();
    let t = tenants::create(&deps, tenant_spec()).await.unwrap();
    assert!(tenants::authenticate(&deps, &t.key).await.unwrap().is_some());
    assert!(tenants::authenticate(&deps, &t.key).await.unwrap().is_some(), "from the cache");
    tenants::revoke(&deps, &t.info.id).await.unwrap();
    assert_eq!(tenants::authenticate(&deps, &t.key).await.unwrap(), None);
}

/// Another instance (its own cache, the same table) revokes: this one refuses the key once it
/// has trusted what it read for `KEY_CACHE_FOR`, by its clock.
#[tokio::test]
async fn a_key_revoked_by_another_instance_is_refused_within_the_cache_time() {
    let (deps, clock) = world();
    let other = Deps { keys: Arc::default(), ..deps.clone() };
    let t = tenants::create(&deps, tenant_spec()).await.unwrap();
    assert!(tenants::authenticate(&deps, &t.key).await.unwrap().is_some());
    tenants::revoke(&other, &t.info.id).await.unwrap();
    assert_eq!(tenants::authenticate(&other, &t.key).await.unwrap(), None, "the revoking instance");
    clock.advance(tenants::KEY_CACHE_FOR);
    assert_eq!(tenants::authenticate(&deps, &t.key).await.unwrap(), None, "this one, after the cache time");
}

#[tokio::test]
async fn an_expired_key_is_refused() {
    let (deps, clock) = world();
    let spec = KeySpec { expires_at: Some(clock.now() + Duration::hours(1)), ..tenant_spec() };
    let t = tenants::create(&deps, spec).await.unwrap();
    assert!(tenants::authenticate(&deps, &t.key).await.unwrap().is_some());
    clock.advance(Duration::seconds(3600));
    assert_eq!(tenants::authenticate(&deps, &t.key).await.unwrap(), None);
    assert_eq!(tenants::get(&deps, &t.info.id).await.unwrap().status, "expired");
    let past = KeySpec { expires_at: Some(clock.now() - Duration::seconds(1)), ..tenant_spec() };
    assert!(
        matches!(tenants::create(&deps, past).await, Err(CoreError::Invalid { ref field, .. }) if field == "expires_at")
    );
}

#[tokio::test]
async fn rotation_keeps_both_keys_valid_for_the_grace_period_only() {
    let (deps, clock) = world();
    let old = tenants::create(&deps, tenant_spec()).await.unwrap();
    let rotated = tenants::rotate(&deps, &old.info.id, Duration::minutes(10)).await.unwrap();
    assert_eq!(rotated.new.info.tenant.as_deref(), Some("acme"));
    assert_eq!(rotated.new.info.name.as_deref(), Some("checkout"));
    assert_ne!(rotated.new.key, old.key);
    assert!(tenants::authenticate(&deps, &old.key).await.unwrap().is_some());
    assert!(tenants::authenticate(&deps, &rotated.new.key).await.unwrap().is_some());
    clock.advance(Duration::seconds(600));
    assert_eq!(tenants::authenticate(&deps, &old.key).await.unwrap(), None);
    assert!(tenants::authenticate(&deps, &rotated.new.key).await.unwrap().is_some());
    // An expired key cannot be rotated again; a grace beyond 30 days is refused.
    assert!(matches!(
        tenants::rotate(&deps, &old.info.id, Duration::zero()).await,
        Err(CoreError::Conflict { code: "key_not_active", .. })
    ));
    assert!(matches!(
        tenants::rotate(&deps, &rotated.new.info.id, Duration::days(31)).await,
        Err(CoreError::Invalid { ref field, .. }) if field == "grace_seconds"
    ));
}

#[tokio::test]
async fn last_used_is_recorded_at_most_once_a_minute() {
    let (deps, clock) = world();
    let t = tenants::create(&deps, tenant_spec()).await.unwrap();
    assert_eq!(tenants::get(&deps, &t.info.id).await.unwrap().last_used_at, None);
    tenants::authenticate(&deps, &t.key).await.unwrap();
    let first = tenants::get(&deps, &t.info.id).await.unwrap().last_used_at.unwrap();
    clock.advance(Duration::seconds(30));
    tenants::authenticate(&deps, &t.key).await.unwrap();
    assert_eq!(tenants::get(&deps, &t.info.id).await.unwrap().last_used_at.unwrap(), first);
    clock.advance(Duration::seconds(31));
    tenants::authenticate(&deps, &t.key).await.unwrap();
    assert_ne!(tenants::get(&deps, &t.info.id).await.unwrap().last_used_at.unwrap(), first);
}

#[tokio::test]
async fn a_key_dropped_from_the_environment_is_revoked_at_the_next_start() {
    let (deps, _) = world();
    tenants::register_key(&deps, &acme(), "key-one").await.unwrap();
    tenants::register_key(&deps, &acme(), "key-two").await.unwrap();
    let made = tenants::create(&deps, tenant_spec()).await.unwrap();
    // The next start lists only key-two.
    tenants::register_key(&deps, &acme(), "key-two").await.unwrap();
    assert_eq!(tenants::revoke_env_keys_except(&deps, &["key-two"]).await.unwrap(), 1);
    assert_eq!(tenants::authenticate(&deps, "key-one").await.unwrap(), None);
    assert!(tenants::authenticate(&deps, "key-two").await.unwrap().is_some());
    // A key made through the API is not the environment's to revoke.
    assert!(tenants::authenticate(&deps, &made.key).await.unwrap().is_some());
}

#[tokio::test]
async fn a_key_stored_before_roles_is_a_tenant_key() {
    let (deps, _) = world();
    let legacy = serde_json::json!({"tenant": "acme", "created_at": "2026-11-01T00:00:00Z"});
    let item = Item::new(keys::api_key(&tenants::hash_key("old-key")), attrs_of(&legacy).unwrap());
    deps.table.put(item, Cond::Always).await.unwrap();
    assert_eq!(
        tenants::authenticate(&deps, "old-key").await.unwrap(),
        Some(Principal::Tenant { tenant: acme(), key_id: None })
    );
}

/// A key's id is shown (listings, logs, the console): it is random, not a function of the
/// secret, so seeing it lets nobody test a guess of the secret offline. The same secret in two
/// stores has two ids; registered again in one store (the next start), it keeps its id.
#[tokio::test]
async fn an_environment_keys_id_is_not_a_function_of_its_secret() {
    let secret = "0123456789abcdef-shared";
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (deps, _) = world();
        tenants::register_key(&deps, &acme(), secret).await.unwrap();
        let (listed, _) = tenants::list(&deps, None, 10, None).await.unwrap();
        assert_eq!(listed.len(), 1);
        let id = listed[0].id.clone();
        assert!(!tenants::hash_key(secret).contains(id.trim_start_matches("env_")), "{id} is the secret's hash");
        tenants::register_key(&deps, &acme(), secret).await.unwrap();
        let (again, _) = tenants::list(&deps, None, 10, None).await.unwrap();
        assert_eq!(again.iter().map(|k| &k.id).collect::<Vec<_>>(), [&id], "the next start keeps the id");
        assert_eq!(
            tenants::authenticate(&deps, secret).await.unwrap(),
            Some(Principal::Tenant { tenant: acme(), key_id: Some(id.clone()) })
        );
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "the same secret in two stores");
}

/// Keys stored by earlier versions under an id derived from the secret (`env_` and 16 hex of
/// its SHA-256) keep authenticating; the next start gives them a random id and drops the
/// derived one, and a revoked one is renamed too.
#[tokio::test]
async fn keys_stored_under_a_derived_id_keep_working_and_lose_that_id() {
    let (deps, _) = world();
    let old = |secret: &str, revoked: bool| {
        let hash = tenants::hash_key(secret);
        let id = format!("env_{}", &hash[..16]);
        let lookup =
            serde_json::json!({"id": id, "role": "tenant", "tenant": "acme", "created_at": "2026-11-01T00:00:00Z"});
        let mut index = serde_json::json!({"id": id, "role": "tenant", "tenant": "acme",
            "created_at": "2026-11-01T00:00:00Z", "source": "env", "hash": hash});
        if revoked {
            index["revoked_at"] = "2026-11-02T00:00:00Z".into();
        }
        (id, hash, lookup, index)
    };
    let (live_id, live_hash, lookup, index) = old("0123456789abcdef-live", false);
    deps.table.put(Item::new(keys::api_key(&live_hash), attrs_of(&lookup).unwrap()), Cond::Always).await.unwrap();
    deps.table.put(Item::new(keys::api_key_index(&live_id), attrs_of(&index).unwrap()), Cond::Always).await.unwrap();
    let (dead_id, _, _, index) = old("0123456789abcdef-dead", true);
    deps.table.put(Item::new(keys::api_key_index(&dead_id), attrs_of(&index).unwrap()), Cond::Always).await.unwrap();
    assert_eq!(
        tenants::authenticate(&deps, "0123456789abcdef-live").await.unwrap(),
        Some(Principal::Tenant { tenant: acme(), key_id: Some(live_id.clone()) }),
        "an old key authenticates before any start of this version"
    );

    // The next start.
    tenants::register_key(&deps, &acme(), "0123456789abcdef-live").await.unwrap();
    assert_eq!(tenants::revoke_env_keys_except(&deps, &["0123456789abcdef-live"]).await.unwrap(), 0);
    let (listed, _) = tenants::list(&deps, None, 10, None).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    for k in &listed {
        assert!(k.id != live_id && k.id != dead_id, "a derived id is still listed: {listed:?}");
    }
    let live = listed.iter().find(|k| k.status == "active").unwrap();
    assert!(listed.iter().any(|k| k.status == "revoked"));
    assert_eq!(
        tenants::authenticate(&deps, "0123456789abcdef-live").await.unwrap(),
        Some(Principal::Tenant { tenant: acme(), key_id: Some(live.id.clone()) })
    );
    assert!(matches!(tenants::get(&deps, &live_id).await, Err(CoreError::NotFound { .. })));
    // Revoking by the new id refuses the old key.
    tenants::revoke(&deps, &live.id).await.unwrap();
    assert_eq!(tenants::authenticate(&deps, "0123456789abcdef-live").await.unwrap(), None);
}
