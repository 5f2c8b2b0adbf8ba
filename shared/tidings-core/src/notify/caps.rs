//! Capped counters: a counter item that counts one more only while it is below its limit, and
//! once per mark. The frequency cap (`policy`) and the abuse guard's windows (`abuse`) are both
//! such counters, counted in the same transaction as what they limit, so a full window fails
//! that transaction's condition under any concurrency.

use crate::ports::{Cond, Key, Update, Write};

/// One more on the counter item `key`, only while its `count` is below `limit` and, with a
/// `mark`, only once per mark (a repeated orchestration does not count twice); kept until `ttl`
/// (epoch seconds) by the table's TTL. Its condition failing means the limit is reached.
pub fn capped_count(key: Key, limit: u32, mark: Option<&str>, ttl: i64) -> Write {
    let mut conds = vec![Cond::Or(vec![Cond::AttrNotExists("count".into()), Cond::lt("count", i64::from(limit))])];
    let mut updates = vec![Update::add("count", 1), Update::set("ttl", ttl)];
    if let Some(mark) = mark {
        conds.push(Cond::AttrNotExists(mark.to_owned()));
        updates.push(Update::set(mark, true));
    }
    Write::Update { key, updates, cond: Cond::And(conds) }
}
