//! Table cases: conditional writes, updates, transactions, conditions, queries.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tidings_core::ports::{Cond, Item, Key, QueryOpts, StoreError, Table, Update, Updating, Write};

use crate::{attrs, run_id};

fn key(pk: &str, sk: &str) -> Key {
    Key::new(pk, sk)
}

fn item(pk: &str, sk: &str, value: Value) -> Item {
    Item::new(key(pk, sk), attrs(value))
}

fn assert_condition_failed<T: std::fmt::Debug>(r: Result<T, StoreError>, index: usize, what: &str) {
    match r {
        Err(StoreError::ConditionFailed { index: i }) => {
            assert_eq!(i, index, "{what}: ConditionFailed names write {i}, expected write {index}")
        }
        other => panic!("{what}: expected ConditionFailed {{ index: {index} }}, got {other:?}"),
    }
}

async fn get_attrs(t: &dyn Table, k: &Key) -> Option<Value> {
    t.get(k).await.unwrap().map(|i| Value::Object(i.attrs))
}

/// `get_many` answers every key in the order asked, `None` for an absent item, a key asked
/// twice twice, and more keys than one `BatchGetItem` takes (100).
pub async fn get_many_in_order(t: &dyn Table) {
    let pk = format!("getmany-{}", run_id());
    for i in 0..150 {
        t.put(item(&pk, &format!("s{i:03}"), json!({"i": i})), Cond::Always).await.unwrap();
    }
    let mut keys: Vec<Key> = (0..150).rev().map(|i| key(&pk, &format!("s{i:03}"))).collect();
    keys.insert(7, key(&pk, "absent"));
    keys.push(key(&pk, "s042"));
    let got = t.get_many(&keys).await.unwrap();
    assert_eq!(got.len(), keys.len(), "one answer per key");
    for (k, answer) in keys.iter().zip(&got) {
        match (k.sk.as_str(), answer) {
            ("absent", None) => {}
            ("absent", Some(i)) => panic!("an absent key answered {i:?}"),
            (sk, Some(i)) => {
                assert_eq!(&i.key, k, "answers come in the order asked");
                let n: i64 = sk[1..].parse().unwrap();
                assert_eq!(i.i64("i"), Some(n), "{sk} has its own attributes");
            }
            (sk, None) => panic!("{sk} exists but was answered None"),
        }
    }
    assert!(t.get_many(&[]).await.unwrap().is_empty());
}

/// `query_many` answers each query's first page in the order asked, as `query` with no cursor
/// answers it: its partition and prefix only, in sort-key order, at most `limit` items with a
/// cursor when more are left (which `query` then continues), none for a partition without.
pub async fn query_many_in_order(t: &dyn Table) {
    let run = run_id();
    let pks: Vec<String> = (0..30).map(|u| format!("qmany-{run}-{u:02}")).collect();
    for (u, pk) in pks.iter().enumerate() {
        // User u has u % 4 devices, and an item of another prefix beside them.
        for d in 0..u % 4 {
            t.put(item(pk, &format!("DEV#{d}"), json!({"u": u, "d": d})), Cond::Always).await.unwrap();
        }
        t.put(item(pk, "PREF", json!({"u": u})), Cond::Always).await.unwrap();
    }
    let mut queries: Vec<(String, String)> = pks.iter().rev().map(|pk| (pk.clone(), "DEV#".to_owned())).collect();
    queries.push((pks[3].clone(), "DEV#".to_owned()));
    let pages = t.query_many(&queries, 2).await.unwrap();
    assert_eq!(pages.len(), queries.len(), "one page per query");
    for ((pk, prefix), page) in queries.iter().zip(&pages) {
        let u: usize = pk.rsplit('-').next().unwrap().parse().unwrap();
        let sks: Vec<&str> = page.items.iter().map(|i| i.key.sk.as_str()).collect();
        let expected: Vec<String> = (0..(u % 4).min(2)).map(|d| format!("DEV#{d}")).collect();
        assert_eq!(sks, expected, "{pk}: its own items of the prefix, in order, at most the limit");
        assert!(page.items.iter().all(|i| &i.key.pk == pk && i.i64("u") == Some(u as i64)));
        // A cursor when more are left (DynamoDB may also give one at exactly the limit, whose
        // next page is empty).
        assert!(page.next_cursor.is_some() || u % 4 <= 2, "{pk}: more are left, and no cursor");
        if let Some(cursor) = &page.next_cursor {
            let rest = t
                .query(pk, prefix, QueryOpts { limit: 2, cursor: Some(cursor.clone()), descending: false })
                .await
                .unwrap();
            let rest: Vec<&str> = rest.items.iter().map(|i| i.key.sk.as_str()).collect();
            let left: &[&str] = if u % 4 > 2 { &["DEV#2"] } else { &[] };
            assert_eq!(rest, left, "{pk}: the query continues where the first page stopped");
        }
    }
    assert!(t.query_many(&[], 2).await.unwrap().is_empty());
}

/// Updates each on its own: one answer per update in order, the item after it; a failed
/// condition fails that update alone and leaves its item as it was; the others are made.
pub async fn update_each_alone(t: &dyn Table) {
    let pk = format!("ueach-{}", run_id());
    // Counters of a cap of 2, as frequency caps count: c0 at 0 (absent), c1 at 1, c2 at 2.
    t.put(item(&pk, "c1", json!({"n": 1})), Cond::Always).await.unwrap();
    t.put(item(&pk, "c2", json!({"n": 2})), Cond::Always).await.unwrap();
    t.put(item(&pk, "c4", json!({"n": 5})), Cond::Always).await.unwrap();
    let count = |sk: &str| Updating {
        key: key(&pk, sk),
        updates: vec![Update::add("n", 1), Update::set("mark", true)],
        cond: Cond::Or(vec![Cond::AttrNotExists("n".into()), Cond::lt("n", 2)]),
    };
    let asked = vec![count("c2"), count("c0"), count("c1"), count("c4"), count("c3")];
    let answers = t.update_each(asked).await.unwrap();
    assert_eq!(answers.len(), 5, "one answer per update");
    let after = |i: usize| -> Option<i64> { answers[i].as_ref().ok().and_then(|item| item.i64("n")) };
    assert!(answers[0].as_ref().is_err_and(StoreError::is_condition_failed), "c2 full: {:?}", answers[0]);
    assert_eq!(after(1), Some(1), "c0 made by its update: {:?}", answers[1]);
    assert_eq!(after(2), Some(2), "c1 counted: {:?}", answers[2]);
    assert!(answers[3].as_ref().is_err_and(StoreError::is_condition_failed), "c4 over the cap: {:?}", answers[3]);
    assert_eq!(after(4), Some(1), "c3 made: {:?}", answers[4]);
    assert_eq!(answers[2].as_ref().unwrap().key, key(&pk, "c1"), "the answer names its item");
    // What is stored: the failed update left nothing of itself (no mark), the others all.
    let c2 = t.get(&key(&pk, "c2")).await.unwrap().unwrap();
    assert_eq!((c2.i64("n"), c2.attrs.contains_key("mark")), (Some(2), false), "c2 untouched");
    let c4 = t.get(&key(&pk, "c4")).await.unwrap().unwrap();
    assert_eq!((c4.i64("n"), c4.attrs.contains_key("mark")), (Some(5), false), "c4 untouched");
    for (sk, n) in [("c0", 1), ("c1", 2), ("c3", 1)] {
        let got = t.get(&key(&pk, sk)).await.unwrap().unwrap();
        assert_eq!((got.i64("n"), got.attrs.get("mark")), (Some(n), Some(&json!(true))), "{sk} as answered");
    }
    assert!(t.update_each(Vec::new()).await.unwrap().is_empty());
}

/// Put, get, delete; values of every JSON shape come back as they were put.
pub async fn item_round_trip(t: &dyn Table) {
    let pk = format!("rt-{}", run_id());
    let value = json!({
        "s": "héllo \u{1F600} \"quoted\"",
        "n": 42,
        "neg": -7,
        "big": 9_007_199_254_740_993_i64,
        "f": 1.5,
        "b": true,
        "l": [1, "two", {"three": 3}],
        "m": {"x": {"y": [true, false]}, "e": ""},
    });
    let k = key(&pk, "item");
    assert_eq!(t.get(&k).await.unwrap(), None, "a missing item reads as None");
    t.put(item(&pk, "item", value.clone()), Cond::Always).await.unwrap();
    let got = t.get(&k).await.unwrap().expect("the item just put");
    assert_eq!(got.key, k, "the key comes back");
    assert_eq!(Value::Object(got.attrs), value, "the attributes come back unchanged");
    assert_eq!(got_str(&t.get(&k).await.unwrap().unwrap(), "s"), "héllo \u{1F600} \"quoted\"");

    // A put replaces the whole item.
    t.put(item(&pk, "item", json!({"only": 1})), Cond::Always).await.unwrap();
    assert_eq!(get_attrs(t, &k).await, Some(json!({"only": 1})), "a put replaces every attribute");

    t.delete(&k, Cond::Always).await.unwrap();
    assert_eq!(t.get(&k).await.unwrap(), None, "deleted");
    // Deleting a missing item is not an error.
    t.delete(&k, Cond::Always).await.unwrap();
}

fn got_str(item: &Item, name: &str) -> String {
    item.str(name).unwrap_or_default().to_owned()
}

/// `null` attributes are not stored: a put with one, or `Update::Set` to `null`, leaves the
/// attribute absent.
pub async fn null_attributes_are_not_stored(t: &dyn Table) {
    let pk = format!("null-{}", run_id());
    let k = key(&pk, "x");
    t.put(item(&pk, "x", json!({"a": 1, "gone": null})), Cond::Always).await.unwrap();
    assert_eq!(get_attrs(t, &k).await, Some(json!({"a": 1})), "a null attribute is not stored by put");
}

/// Conditional puts and deletes: `NotExists` makes a put create-only, a failed condition
/// changes nothing and reports write 0.
pub async fn conditional_put_conflict(t: &dyn Table) {
    let pk = format!("cp-{}", run_id());
    let k = key(&pk, "a");
    t.put(item(&pk, "a", json!({"v": 1})), Cond::NotExists).await.unwrap();
    assert_condition_failed(
        t.put(item(&pk, "a", json!({"v": 99})), Cond::NotExists).await,
        0,
        "second create-only put",
    );
    assert_eq!(get_attrs(t, &k).await, Some(json!({"v": 1})), "a failed put changes nothing");

    // Optimistic concurrency: replace only when v is still 1.
    t.put(item(&pk, "a", json!({"v": 2})), Cond::eq("v", 1)).await.unwrap();
    assert_condition_failed(t.put(item(&pk, "a", json!({"v": 3})), Cond::eq("v", 1)).await, 0, "stale version put");
    assert_eq!(get_attrs(t, &k).await, Some(json!({"v": 2})));

    // Exists on a missing item.
    let missing = key(&pk, "missing");
    assert_condition_failed(
        t.put(item(&pk, "missing", json!({"v": 1})), Cond::Exists).await,
        0,
        "put with Exists on a missing item",
    );
    assert_eq!(t.get(&missing).await.unwrap(), None, "a failed put creates nothing");

    // Conditional deletes.
    assert_condition_failed(t.delete(&k, Cond::eq("v", 1)).await, 0, "delete with a false condition");
    assert!(t.get(&k).await.unwrap().is_some(), "a failed delete deletes nothing");
    assert_condition_failed(t.delete(&missing, Cond::Exists).await, 0, "delete with Exists on a missing item");
    t.delete(&k, Cond::eq("v", 2)).await.unwrap();
    assert_eq!(t.get(&k).await.unwrap(), None);
}

/// `update` is an upsert; `Add` starts from 0; `SetIfAbsent`, `Remove`; the returned item is
/// the item after the update; a failed condition changes (and creates) nothing.
pub async fn update_upsert_and_add(t: &dyn Table) {
    let pk = format!("up-{}", run_id());
    let k = key(&pk, "counter");

    let after = t
        .update(
            &k,
            vec![Update::add("n", 5), Update::set("name", "c"), Update::SetIfAbsent("since".into(), json!(1))],
            Cond::Always,
        )
        .await
        .unwrap();
    assert_eq!(after.key, k);
    assert_eq!(Value::Object(after.attrs.clone()), json!({"n": 5, "name": "c", "since": 1}), "update creates the item");
    assert_eq!(get_attrs(t, &k).await, Some(Value::Object(after.attrs)), "update returns what is stored");

    let after = t
        .update(
            &k,
            vec![Update::add("n", -2), Update::SetIfAbsent("since".into(), json!(2)), Update::add("other", 3)],
            Cond::Always,
        )
        .await
        .unwrap();
    assert_eq!(
        Value::Object(after.attrs),
        json!({"n": 3, "name": "c", "since": 1, "other": 3}),
        "Add subtracts, SetIfAbsent keeps, Add on a missing attribute starts from 0"
    );

    let after =
        t.update(&k, vec![Update::Remove("other".into()), Update::set("name", "d")], Cond::ge("n", 3)).await.unwrap();
    assert_eq!(Value::Object(after.attrs), json!({"n": 3, "name": "d", "since": 1}), "Remove and Set");

    // Guarded decrement: n >= 4 does not hold.
    assert_condition_failed(t.update(&k, vec![Update::add("n", -4)], Cond::ge("n", 4)).await, 0, "guarded decrement");
    assert_eq!(
        get_attrs(t, &k).await,
        Some(json!({"n": 3, "name": "d", "since": 1})),
        "a failed update changes nothing"
    );

    // A create-only update on an existing item, and an update requiring existence on a missing one.
    assert_condition_failed(t.update(&k, vec![Update::add("n", 1)], Cond::NotExists).await, 0, "create-only update");
    let missing = key(&pk, "missing");
    assert_condition_failed(t.update(&missing, vec![Update::add("n", 1)], Cond::Exists).await, 0, "update with Exists");
    assert_eq!(t.get(&missing).await.unwrap(), None, "a failed update creates nothing");

    // Create-only update on a missing item works.
    let fresh = key(&pk, "fresh");
    let after = t.update(&fresh, vec![Update::add("n", 1)], Cond::NotExists).await.unwrap();
    assert_eq!(Value::Object(after.attrs), json!({"n": 1}));
}

/// Every kind of condition, checked on a stored item and on a missing one, through the store
/// (a lone `Write::Check` in a transaction, and a conditional put for a few); the result must
/// also agree with [`Cond::holds`].
pub async fn conditions_semantics(t: &dyn Table) {
    let pk = format!("cond-{}", run_id());
    let present = key(&pk, "present");
    let absent = key(&pk, "absent");
    let stored = attrs(json!({"n": 5, "s": "abc", "up": "B", "b": true, "f": 1.5}));
    t.put(Item::new(present.clone(), stored.clone()), Cond::Always).await.unwrap();

    use tidings_core::ports::CmpOp::*;
    let cmp = |name: &str, op, v: Value| Cond::Cmp(name.into(), op, v);
    // (condition, holds on the stored item, holds when the item is absent)
    let cases: Vec<(Cond, bool, bool)> = vec![
        (Cond::Always, true, true),
        (Cond::Exists, true, false),
        (Cond::NotExists, false, true),
        (Cond::AttrExists("n".into()), true, false),
        (Cond::AttrExists("zz".into()), false, false),
        (Cond::AttrNotExists("zz".into()), true, true),
        (Cond::AttrNotExists("n".into()), false, true),
        // numbers
        (cmp("n", Eq, json!(5)), true, false),
        (cmp("n", Eq, json!(6)), false, false),
        (cmp("n", Ne, json!(6)), true, false),
        (cmp("n", Ne, json!(5)), false, false),
        (cmp("n", Lt, json!(10)), true, false),
        (cmp("n", Lt, json!(5)), false, false),
        (cmp("n", Le, json!(5)), true, false),
        (cmp("n", Gt, json!(5)), false, false),
        (cmp("n", Gt, json!(-1)), true, false),
        (cmp("n", Ge, json!(5)), true, false),
        (cmp("f", Gt, json!(1)), true, false),
        (cmp("f", Lt, json!(2)), true, false),
        (cmp("f", Eq, json!(1.5)), true, false),
        (cmp("n", Eq, json!(5.0)), true, false),
        // a missing attribute satisfies no comparison, `Ne` included
        (cmp("zz", Eq, json!(1)), false, false),
        (cmp("zz", Ne, json!(1)), false, false),
        (cmp("zz", Lt, json!(1)), false, false),
        (cmp("zz", Ge, json!(1)), false, false),
        // strings compare by bytes
        (cmp("s", Eq, json!("abc")), true, false),
        (cmp("s", Lt, json!("abd")), true, false),
        (cmp("s", Gt, json!("ab")), true, false),
        (cmp("s", Ge, json!("abc")), true, false),
        (cmp("up", Lt, json!("a")), true, false),
        // different types are never equal
        (cmp("n", Eq, json!("5")), false, false),
        (cmp("s", Gt, json!(1)), false, false),
        // booleans
        (cmp("b", Eq, json!(true)), true, false),
        (cmp("b", Ne, json!(false)), true, false),
        // IN
        (Cond::is_in("n", [json!(1), json!(5)]), true, false),
        (Cond::is_in("n", [json!(1), json!(2)]), false, false),
        (Cond::is_in("s", [json!("x"), json!("abc")]), true, false),
        (Cond::is_in("zz", [json!(1)]), false, false),
        // AND / OR / NOT
        (Cond::And(vec![Cond::eq("n", 5), Cond::eq("s", "abc")]), true, false),
        (Cond::And(vec![Cond::eq("n", 5), Cond::eq("s", "x")]), false, false),
        (Cond::Or(vec![Cond::eq("n", 1), Cond::eq("s", "abc")]), true, false),
        (Cond::Or(vec![Cond::eq("n", 1), Cond::eq("s", "x")]), false, false),
        (Cond::Or(vec![Cond::NotExists, Cond::eq("n", 5)]), true, true),
        (Cond::Not(Box::new(Cond::eq("n", 6))), true, true),
        (Cond::Not(Box::new(Cond::eq("zz", 1))), true, true),
        (Cond::Not(Box::new(Cond::Exists)), false, true),
        (
            Cond::And(vec![Cond::Exists, Cond::Or(vec![Cond::lt("n", 0), Cond::Not(Box::new(Cond::eq("s", "x")))])]),
            true,
            false,
        ),
    ];
    for (i, (cond, on_present, on_absent)) in cases.iter().enumerate() {
        assert_eq!(cond.holds(Some(&stored)), *on_present, "case {i}: Cond::holds on the item: {cond:?}");
        assert_eq!(cond.holds(None), *on_absent, "case {i}: Cond::holds on no item: {cond:?}");
        for (k, expected) in [(&present, *on_present), (&absent, *on_absent)] {
            let r = t.transact(vec![Write::Check { key: k.clone(), cond: cond.clone() }]).await;
            match (expected, r) {
                (true, Ok(())) => {}
                (false, Err(StoreError::ConditionFailed { index: 0 })) => {}
                (e, r) => panic!("case {i}: {cond:?} on {}: expected holds={e}, store said {r:?}", k.sk),
            }
        }
    }
    // The same conditions on a put (the item is rewritten unchanged when they hold).
    for (i, (cond, on_present, _)) in cases.iter().enumerate() {
        let r = t.put(Item::new(present.clone(), stored.clone()), cond.clone()).await;
        match (on_present, r) {
            (true, Ok(())) => {}
            (false, Err(StoreError::ConditionFailed { index: 0 })) => {}
            (e, r) => panic!("case {i}: put with {cond:?}: expected holds={e}, store said {r:?}"),
        }
    }
    assert_eq!(t.get(&absent).await.unwrap(), None, "checks never create items");
    assert_eq!(t.get(&present).await.unwrap().map(|i| i.attrs), Some(stored), "the item is intact");
}

/// A failed transaction names the write whose condition failed, and changes nothing.
pub async fn transact_reports_failing_index(t: &dyn Table) {
    let pk = format!("tx-idx-{}", run_id());
    t.put(item(&pk, "a", json!({"n": 1})), Cond::Always).await.unwrap();
    t.put(item(&pk, "b", json!({"n": 2})), Cond::Always).await.unwrap();

    for failing in 0..4 {
        let writes = vec![
            Write::Put {
                item: item(&pk, "new", json!({"x": 1})),
                cond: if failing == 0 { Cond::Exists } else { Cond::NotExists },
            },
            Write::Update {
                key: key(&pk, "a"),
                updates: vec![Update::add("n", 10)],
                cond: if failing == 1 { Cond::eq("n", 2) } else { Cond::eq("n", 1) },
            },
            Write::Delete { key: key(&pk, "b"), cond: if failing == 2 { Cond::NotExists } else { Cond::Exists } },
            Write::Check { key: key(&pk, "c"), cond: if failing == 3 { Cond::Exists } else { Cond::NotExists } },
        ];
        assert_condition_failed(t.transact(writes).await, failing, &format!("transaction failing at write {failing}"));
        assert_eq!(t.get(&key(&pk, "new")).await.unwrap(), None, "failing at {failing}: the put did not happen");
        assert_eq!(get_attrs(t, &key(&pk, "a")).await, Some(json!({"n": 1})), "failing at {failing}: no update");
        assert_eq!(get_attrs(t, &key(&pk, "b")).await, Some(json!({"n": 2})), "failing at {failing}: no delete");
    }
}

/// Transactions are all or nothing, sequentially and under contention: 20 tasks race to take
/// one of 5 units with "decrement if n >= 1 + put my claim"; exactly 5 win, the counter never
/// goes negative, and only the winners' claims exist.
pub async fn transactions_all_or_nothing(t: Arc<dyn Table>) {
    let pk = format!("tx-{}", run_id());

    // Sequential: everything applies.
    t.put(item(&pk, "b", json!({"n": 1})), Cond::Always).await.unwrap();
    t.put(item(&pk, "c", json!({"gone": true})), Cond::Always).await.unwrap();
    t.transact(vec![
        Write::Put { item: item(&pk, "a", json!({"v": 1})), cond: Cond::NotExists },
        Write::Update { key: key(&pk, "b"), updates: vec![Update::add("n", 1)], cond: Cond::eq("n", 1) },
        Write::Delete { key: key(&pk, "c"), cond: Cond::Exists },
        Write::Check { key: key(&pk, "d"), cond: Cond::NotExists },
    ])
    .await
    .unwrap();
    assert_eq!(get_attrs(&*t, &key(&pk, "a")).await, Some(json!({"v": 1})), "transaction put applied");
    assert_eq!(get_attrs(&*t, &key(&pk, "b")).await, Some(json!({"n": 2})), "transaction update applied");
    assert_eq!(t.get(&key(&pk, "c")).await.unwrap(), None, "transaction delete applied");
    assert_eq!(t.get(&key(&pk, "d")).await.unwrap(), None, "a check writes nothing");

    // Sequential: nothing applies when the last write fails.
    let r = t
        .transact(vec![
            Write::Put { item: item(&pk, "e", json!({"v": 1})), cond: Cond::Always },
            Write::Update { key: key(&pk, "b"), updates: vec![Update::add("n", 1)], cond: Cond::Always },
            Write::Delete { key: key(&pk, "a"), cond: Cond::Always },
            Write::Update { key: key(&pk, "f"), updates: vec![Update::add("n", 1)], cond: Cond::Exists },
        ])
        .await;
    assert_condition_failed(r, 3, "transaction failing at its last write");
    assert_eq!(t.get(&key(&pk, "e")).await.unwrap(), None, "no partial put");
    assert_eq!(get_attrs(&*t, &key(&pk, "b")).await, Some(json!({"n": 2})), "no partial update");
    assert!(t.get(&key(&pk, "a")).await.unwrap().is_some(), "no partial delete");
    assert_eq!(t.get(&key(&pk, "f")).await.unwrap(), None, "no upsert");

    // Concurrent: 20 tasks, 5 units.
    const UNITS: i64 = 5;
    const TASKS: usize = 20;
    let counter = key(&pk, "counter");
    t.put(Item::new(counter.clone(), attrs(json!({"n": UNITS}))), Cond::Always).await.unwrap();
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let t = t.clone();
        let pk = pk.clone();
        let counter = counter.clone();
        handles.push(tokio::spawn(async move {
            let claim = item(&pk, &format!("claim#{task:02}"), json!({"task": task}));
            for attempt in 0..50u64 {
                let r = t
                    .transact(vec![
                        Write::Update {
                            key: counter.clone(),
                            updates: vec![Update::add("n", -1)],
                            cond: Cond::ge("n", 1),
                        },
                        Write::Put { item: claim.clone(), cond: Cond::NotExists },
                    ])
                    .await;
                match r {
                    Ok(()) => return true,
                    Err(StoreError::ConditionFailed { index: 0 }) => return false,
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(10 + 7 * attempt + (task as u64 % 5) * 3)).await;
                    }
                    Err(e) => panic!("task {task}: unexpected error {e:?}"),
                }
            }
            panic!("task {task}: still conflicting after 50 attempts")
        }));
    }
    let mut winners = Vec::new();
    for (task, h) in handles.into_iter().enumerate() {
        if h.await.expect("task panicked") {
            winners.push(task);
        }
    }
    assert_eq!(winners.len() as i64, UNITS, "exactly {UNITS} of {TASKS} transactions succeed (winners {winners:?})");
    assert_eq!(get_attrs(&*t, &counter).await, Some(json!({"n": 0})), "the counter ends at 0, never below");
    let claims = collect_all(&*t, &pk, "claim#", false, 100).await;
    let claimed: Vec<usize> =
        claims.iter().map(|i| i.attrs.get("task").and_then(Value::as_u64).unwrap() as usize).collect();
    assert_eq!(claimed, winners, "exactly the winners' claims exist (no partial transaction)");
}

/// Invalid transactions are rejected as a whole: empty, more than 100 writes, or two writes on
/// one key.
pub async fn transact_rejects_invalid(t: &dyn Table) {
    let pk = format!("tx-bad-{}", run_id());
    let too_many: Vec<Write> = (0..101)
        .map(|i| Write::Put { item: item(&pk, &format!("i{i:03}"), json!({"i": i})), cond: Cond::Always })
        .collect();
    assert!(matches!(t.transact(too_many).await, Err(StoreError::Invalid(_))), "101 writes are rejected as Invalid");
    assert_eq!(t.get(&key(&pk, "i000")).await.unwrap(), None, "nothing of a rejected transaction is written");

    let twice = vec![
        Write::Put { item: item(&pk, "same", json!({"v": 1})), cond: Cond::Always },
        Write::Update { key: key(&pk, "same"), updates: vec![Update::add("n", 1)], cond: Cond::Always },
    ];
    assert!(matches!(t.transact(twice).await, Err(StoreError::Invalid(_))), "two writes on one key are Invalid");
    assert_eq!(t.get(&key(&pk, "same")).await.unwrap(), None, "nothing written");

    // 100 writes are fine.
    let hundred: Vec<Write> = (0..100)
        .map(|i| Write::Put { item: item(&pk, &format!("h{i:03}"), json!({"i": i})), cond: Cond::Always })
        .collect();
    t.transact(hundred).await.unwrap();
    assert_eq!(collect_all(t, &pk, "h", false, 1000).await.len(), 100, "a 100-write transaction applies");
}

/// Reads every page of a query.
pub async fn collect_all(t: &dyn Table, pk: &str, prefix: &str, descending: bool, limit: usize) -> Vec<Item> {
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..10_000 {
        let page = t.query(pk, prefix, QueryOpts { limit, cursor: cursor.take(), descending }).await.unwrap();
        assert!(page.items.len() <= limit.max(1), "a page holds at most `limit` items");
        out.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("query of {pk}/{prefix} never ended")
}

fn sks(items: &[Item]) -> Vec<String> {
    items.iter().map(|i| i.key.sk.clone()).collect()
}

/// Queries by sort-key prefix: exact prefix matching (no wildcards, `a#1` is not `a#10`'s
/// neighbour's prefix, `_` and `%` are literal), sort-key (byte) order both ways, and cursor
/// pages that cover every item exactly once.
pub async fn query_prefix_and_pagination(t: &dyn Table) {
    let run = run_id();
    let pk = format!("q-{run}");
    let other_pk = format!("q-{run}-other");
    let names = ["a", "a#1", "a#10", "a#1#x", "a#2", "a_1", "ab", "a%", "b#1", "A#1", "a#\u{e9}", "a#z"];
    for sk in names {
        t.put(item(&pk, sk, json!({"sk": sk})), Cond::Always).await.unwrap();
        t.put(item(&other_pk, sk, json!({"other": true})), Cond::Always).await.unwrap();
    }
    let page_items = collect_all(t, &pk, "a#1", false, 100).await;
    assert_eq!(sks(&page_items), ["a#1", "a#1#x", "a#10"], "prefix a#1, ascending byte order");
    assert!(page_items.iter().all(|i| i.key.pk == pk && i.attrs.get("sk") == Some(&json!(i.key.sk))), "right items");
    assert_eq!(sks(&collect_all(t, &pk, "a#1", true, 100).await), ["a#10", "a#1#x", "a#1"], "descending");
    assert_eq!(sks(&collect_all(t, &pk, "a_", false, 100).await), ["a_1"], "`_` is not a wildcard");
    assert_eq!(sks(&collect_all(t, &pk, "a%", false, 100).await), ["a%"], "`%` is not a wildcard");
    assert_eq!(sks(&collect_all(t, &pk, "a#", false, 100).await), ["a#1", "a#1#x", "a#10", "a#2", "a#z", "a#\u{e9}"]);
    assert_eq!(sks(&collect_all(t, &pk, "a#10", false, 100).await), ["a#10"]);
    assert!(collect_all(t, &pk, "c", false, 100).await.is_empty(), "nothing matches c");
    assert!(collect_all(t, &format!("q-{run}-none"), "", false, 100).await.is_empty(), "empty partition");
    let mut everything: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    everything.sort();
    assert_eq!(sks(&collect_all(t, &pk, "", false, 100).await), everything, "empty prefix: the whole partition");

    // Pagination over 25 items, every page size, both directions.
    let expected: Vec<String> = (0..25).map(|i| format!("p#{i:03}")).collect();
    for sk in &expected {
        t.put(item(&pk, sk, json!({"sk": sk})), Cond::Always).await.unwrap();
    }
    for limit in [1, 2, 7, 10, 24, 25, 26, 100] {
        let asc = collect_all(t, &pk, "p#", false, limit).await;
        assert_eq!(sks(&asc), expected, "ascending pages of {limit} cover every item once, in order");
        let desc = collect_all(t, &pk, "p#", true, limit).await;
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(sks(&desc), reversed, "descending pages of {limit} cover every item once, in order");
    }
    // A single page that holds everything says there is nothing more.
    let page = t.query(&pk, "p#", QueryOpts { limit: 50, ..Default::default() }).await.unwrap();
    assert_eq!(page.items.len(), 25);
    assert!(page.next_cursor.is_none(), "no cursor when everything fit");
    // limit 0 means the default (100).
    let page = t.query(&pk, "p#", QueryOpts::default()).await.unwrap();
    assert_eq!(page.items.len(), 25, "limit 0 is the default page size");

    // Items written between pages: pages still never repeat or skip the items already there.
    let first = t.query(&pk, "p#", QueryOpts { limit: 10, ..Default::default() }).await.unwrap();
    t.put(item(&pk, "p#000a", json!({})), Cond::Always).await.unwrap(); // before the cursor
    t.delete(&key(&pk, "p#015"), Cond::Always).await.unwrap(); // after the cursor
    let mut rest = Vec::new();
    let mut cursor = first.next_cursor.clone();
    while let Some(c) = cursor {
        let page = t.query(&pk, "p#", QueryOpts { limit: 10, cursor: Some(c), descending: false }).await.unwrap();
        rest.extend(sks(&page.items));
        cursor = page.next_cursor;
    }
    let mut seen = sks(&first.items);
    seen.extend(rest);
    let expected_after: Vec<String> = expected.iter().filter(|s| s.as_str() != "p#015").cloned().collect();
    assert_eq!(seen, expected_after, "pages continue after the last item seen");
}

/// Every page of a range query.
async fn collect_range(t: &dyn Table, pk: &str, from: &str, to: &str, descending: bool, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = None;
    for _ in 0..10_000 {
        let page = t.query_range(pk, from, to, QueryOpts { limit, cursor: cursor.take(), descending }).await.unwrap();
        assert!(page.items.len() <= limit.max(1), "a page holds at most `limit` items");
        assert!(page.items.iter().all(|i| i.key.pk == pk), "one partition");
        out.extend(sks(&page.items));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("range query of {pk} never ended")
}

/// Range queries: both bounds included, byte order, nothing of another partition, cursor pages
/// that cover the range once in either direction, and an empty answer for bounds out of order.
pub async fn query_range_and_pagination(t: &dyn Table) {
    let run = run_id();
    let pk = format!("r-{run}");
    let names: Vec<String> = (0..30).map(|i| format!("{:015}#{i}", 1_000 + i * 10)).collect();
    for sk in &names {
        t.put(item(&pk, sk, json!({"sk": sk})), Cond::Always).await.unwrap();
        t.put(item(&format!("{pk}-other"), sk, json!({})), Cond::Always).await.unwrap();
    }
    t.put(item(&pk, "x", json!({})), Cond::Always).await.unwrap();
    // [1050, 1200): a bound that is no item's key, as the notification list gives them.
    let (from, to) = (format!("{:015}", 1_050), format!("{:015}", 1_200));
    let expected: Vec<String> = names[5..20].to_vec();
    for limit in [1, 4, 15, 16, 100] {
        assert_eq!(collect_range(t, &pk, &from, &to, false, limit).await, expected, "ascending pages of {limit}");
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(collect_range(t, &pk, &from, &to, true, limit).await, reversed, "descending pages of {limit}");
    }
    // Both ends included.
    let got = collect_range(t, &pk, &names[3], &names[6], false, 100).await;
    assert_eq!(got, names[3..=6].to_vec(), "from and to are included");
    assert_eq!(collect_range(t, &pk, &names[3], &names[3], true, 100).await, vec![names[3].clone()]);
    assert!(collect_range(t, &pk, &to, &from, false, 100).await.is_empty(), "bounds out of order: nothing");
    assert_eq!(collect_range(t, &pk, "", "\u{10FFFF}", false, 1000).await.len(), 31, "the whole partition");
}

/// DynamoDB's size limits, counted as `tidings_core::sizes` counts them: an item of exactly
/// 400 KB is stored and read back whole, one byte more is `Invalid` and not stored; an update
/// that would take an item past the limit is `Invalid` and changes nothing (on DynamoDB the
/// service itself refuses it: the count agrees with DynamoDB's at the byte); a transaction of
/// more than 4 MB is `Invalid` and writes nothing, while ten items of 390 KB commit.
pub async fn item_and_transaction_sizes(t: &dyn Table) {
    use tidings_core::sizes::{MAX_ITEM_BYTES, item_size};
    let pk = format!("sizes-{}", run_id());
    let filled = |sk: &str, size: usize| {
        let k = key(&pk, sk);
        let room = size - item_size(&k, &attrs(json!({"v": ""})));
        Item::new(k, attrs(json!({"v": "x".repeat(room)})))
    };
    let exact = filled("exact", MAX_ITEM_BYTES);
    assert_eq!(item_size(&exact.key, &exact.attrs), MAX_ITEM_BYTES);
    t.put(exact.clone(), Cond::Always).await.unwrap();
    assert_eq!(t.get(&exact.key).await.unwrap(), Some(exact.clone()), "an item of exactly 400 KB comes back whole");
    let over = filled("over", MAX_ITEM_BYTES + 1);
    assert!(matches!(t.put(over.clone(), Cond::Always).await, Err(StoreError::Invalid(_))), "one byte over is Invalid");
    assert_eq!(t.get(&over.key).await.unwrap(), None, "and is not stored");

    // Grown by an update: to the limit exactly (`w`: 1 byte of name, 99 of value), then past it.
    let grown = filled("grown", MAX_ITEM_BYTES - 100);
    t.put(grown.clone(), Cond::Always).await.unwrap();
    let after = t.update(&grown.key, vec![Update::set("w", "y".repeat(99))], Cond::Exists).await.unwrap();
    assert_eq!(item_size(&after.key, &after.attrs), MAX_ITEM_BYTES);
    let r = t.update(&grown.key, vec![Update::set("w", "y".repeat(100))], Cond::Exists).await;
    assert!(matches!(r, Err(StoreError::Invalid(_))), "an update past 400 KB is Invalid: {r:?}");
    let kept = t.get(&grown.key).await.unwrap().unwrap();
    assert_eq!(kept.str("w").map(str::len), Some(99), "and changes nothing");

    // Transactions: eleven items of 390 KB are over 4 MB; ten are not.
    let puts = |n: usize, prefix: &str| -> Vec<Write> {
        (0..n).map(|i| Write::Put { item: filled(&format!("{prefix}{i:02}"), 390_000), cond: Cond::Always }).collect()
    };
    assert!(matches!(t.transact(puts(11, "big")).await, Err(StoreError::Invalid(_))), "over 4 MB is Invalid");
    assert!(collect_all(t, &pk, "big", false, 100).await.is_empty(), "nothing of it is written");
    t.transact(puts(10, "fits")).await.unwrap();
    assert_eq!(collect_all(t, &pk, "fits", false, 100).await.len(), 10, "3.9 MB in ten items commit");
    let mixed = vec![
        Write::Put { item: item(&pk, "small", json!({"v": 1})), cond: Cond::Always },
        Write::Put { item: filled("huge", MAX_ITEM_BYTES + 1), cond: Cond::Always },
    ];
    assert!(
        matches!(t.transact(mixed).await, Err(StoreError::Invalid(_))),
        "an item over 400 KB fails its transaction"
    );
    assert_eq!(t.get(&key(&pk, "small")).await.unwrap(), None, "and nothing of it is written");
}
