//! The size limits of SQS and DynamoDB, measured the way those services measure, held by both
//! backends (the embedded one enforces them too, so a test on it fails where AWS would), and by
//! the use-cases, which refuse a request whose stored form cannot fit (422 naming the field)
//! before anything is written.
//!
//! - A queue message is at most [`MAX_MESSAGE_BYTES`]; one `SendMessageBatch` carries at most
//!   [`MAX_BATCH_MESSAGES`] messages and [`MAX_BATCH_BYTES`] in all ([`send_batches`] splits by
//!   both).
//! - An item is at most [`MAX_ITEM_BYTES`] as [`item_size`] counts it (DynamoDB's rule: the
//!   UTF-8 bytes of every attribute name and value, the key attributes included); a
//!   transaction has at most [`MAX_TRANSACTION_WRITES`] writes and [`MAX_TRANSACTION_BYTES`] in
//!   all ([`check_transaction`]).

use serde_json::Value;

use crate::error::{CoreError, CoreResult};
use crate::ports::table::{MAX_TRANSACTION_WRITES, stored};
use crate::ports::{Attrs, Item, Key, OutMessage, QueueError, StoreError, Update, Write};

/// The largest queue message body. SQS's limit of 256 KiB: since 2025 a queue may be set to
/// take up to 1 MiB, but a queue's `MaximumMessageSize` is its own setting, and 256 KiB is what
/// every SQS queue takes.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// The largest total of the bodies of one `SendMessageBatch` (SQS's limit, as for one message).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// The most messages of one `SendMessageBatch`.
pub const MAX_BATCH_MESSAGES: usize = 10;

/// DynamoDB's largest item, 400 KB (counted as 400 × 1024 bytes, as DynamoDB does).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// The largest total of one transaction's writes: DynamoDB's 4 MB, counted as 4,000,000 bytes
/// (the smaller reading).
pub const MAX_TRANSACTION_BYTES: usize = 4_000_000;

/// The size SQS counts for a message: its body's bytes (Tidings sends no message attributes).
pub fn message_size(message: &OutMessage) -> usize {
    message.body.len()
}

/// Checks one message against the queue's limits.
pub fn check_message(message: &OutMessage) -> Result<(), QueueError> {
    let size = message_size(message);
    if size == 0 {
        return Err(QueueError::Invalid("an empty message body (SQS needs at least 1 byte)".into()));
    }
    if size > MAX_MESSAGE_BYTES {
        return Err(QueueError::Invalid(format!(
            "a message of {size} bytes: a queue message holds at most {MAX_MESSAGE_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Checks every message, then splits them, in order, into `SendMessageBatch` calls of at most
/// [`MAX_BATCH_MESSAGES`] messages and [`MAX_BATCH_BYTES`] bytes. A message that could never
/// be sent refuses the whole call before any of it is sent.
pub fn send_batches(messages: &[OutMessage]) -> Result<Vec<&[OutMessage]>, QueueError> {
    for (i, m) in messages.iter().enumerate() {
        check_message(m).map_err(|e| match e {
            QueueError::Invalid(reason) => QueueError::Invalid(format!("message {i} of {}: {reason}", messages.len())),
            other => other,
        })?;
    }
    let mut batches = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, m) in messages.iter().enumerate() {
        let size = message_size(m);
        if i > start && (i - start == MAX_BATCH_MESSAGES || bytes + size > MAX_BATCH_BYTES) {
            batches.push(&messages[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < messages.len() {
        batches.push(&messages[start..]);
    }
    Ok(batches)
}

/// The size DynamoDB counts for a value (without its attribute name): a string its UTF-8
/// bytes, a number 1 byte per two significant digits plus 1, a boolean or null 1, a list or a
/// map 3 bytes plus 1 per element plus its elements (a map's element with its name).
pub fn value_size(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 1,
        Value::String(s) => s.len(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => integer_size(i.unsigned_abs()),
            (None, Some(u)) => integer_size(u),
            _ => number_size(&n.to_string()),
        },
        Value::Array(items) => 3 + items.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        Value::Object(map) => 3 + map.iter().map(|(k, v)| 1 + k.len() + value_size(v)).sum::<usize>(),
    }
}

/// A number's size from its decimal text: leading and trailing zeros do not count, nor do the
/// sign, the point and an exponent.
fn number_size(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len().max(1);
    significant.div_ceil(2) + 1
}

/// [`number_size`] of an integer's magnitude, without writing it out (every counter of every
/// write is sized, and the text cost two allocations each).
fn integer_size(mut n: u64) -> usize {
    if n == 0 {
        return 2;
    }
    while n.is_multiple_of(10) {
        n /= 10;
    }
    let significant = n.ilog10() as usize + 1;
    significant.div_ceil(2) + 1
}

/// The size of a key as stored: the `pk` and `sk` attributes.
pub fn key_size(key: &Key) -> usize {
    stored::PK.len() + key.pk.len() + stored::SK.len() + key.sk.len()
}

/// The size of an item as DynamoDB stores it: the key attributes, and every attribute's stored
/// name (escaped, see [`stored::stored_attr_name`]) and value (`null` attributes are not stored).
pub fn item_size(key: &Key, attrs: &Attrs) -> usize {
    key_size(key)
        + attrs
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(name, v)| stored::stored_attr_name(name).len() + value_size(v))
            .sum::<usize>()
}

/// What one write counts towards its transaction's total: a put its item; an update its key and
/// what it sets; a delete or a check its key.
pub fn write_size(write: &Write) -> usize {
    match write {
        Write::Put { item, .. } => item_size(&item.key, &item.attrs),
        Write::Update { key, updates, .. } => {
            key_size(key)
                + updates
                    .iter()
                    .map(|u| match u {
                        Update::Set(n, v) | Update::SetIfAbsent(n, v) => n.len() + value_size(v),
                        Update::Add(n, d) => n.len() + integer_size(d.unsigned_abs()),
                        Update::Remove(n) => n.len(),
                    })
                    .sum::<usize>()
        }
        Write::Delete { key, .. } | Write::Check { key, .. } => key_size(key),
    }
}

/// Refuses an item over [`MAX_ITEM_BYTES`].
pub fn check_item(key: &Key, attrs: &Attrs) -> Result<(), StoreError> {
    let size = item_size(key, attrs);
    if size > MAX_ITEM_BYTES {
        return Err(StoreError::Invalid(format!(
            "item {}/{} is {size} bytes: an item holds at most {MAX_ITEM_BYTES}",
            key.pk, key.sk
        )));
    }
    Ok(())
}

/// Refuses, before anything is written, a transaction DynamoDB would refuse for its size: more
/// than [`MAX_TRANSACTION_WRITES`] writes, an item put over [`MAX_ITEM_BYTES`], or more than
/// [`MAX_TRANSACTION_BYTES`] in all.
pub fn check_transaction(writes: &[Write]) -> Result<(), StoreError> {
    if writes.len() > MAX_TRANSACTION_WRITES {
        return Err(StoreError::Invalid(format!(
            "{} writes in one transaction (at most {MAX_TRANSACTION_WRITES})",
            writes.len()
        )));
    }
    let mut total = 0;
    for w in writes {
        let size = write_size(w);
        if let Write::Put { item, .. } = w
            && size > MAX_ITEM_BYTES
        {
            return Err(StoreError::Invalid(format!(
                "item {}/{} is {size} bytes: an item holds at most {MAX_ITEM_BYTES}",
                item.key.pk, item.key.sk
            )));
        }
        total += size;
    }
    if total > MAX_TRANSACTION_BYTES {
        return Err(StoreError::Invalid(format!(
            "a transaction of {total} bytes: a transaction holds at most {MAX_TRANSACTION_BYTES}"
        )));
    }
    Ok(())
}

/// The attribute of `attrs` that takes the most room, as a request names it (a use-case maps a
/// record's attribute to its request field): for naming the field of a request too large to
/// store.
pub fn largest_attr(attrs: &Attrs) -> Option<&str> {
    attrs.iter().max_by_key(|(name, v)| name.len() + value_size(v)).map(|(name, _)| name.as_str())
}

/// A request's record must fit in an item: else 422 naming `field` (the request's field that
/// makes it too large), before anything is written.
pub fn check_stored(field: &str, item: &Item) -> CoreResult<()> {
    let size = item_size(&item.key, &item.attrs);
    if size > MAX_ITEM_BYTES {
        return Err(CoreError::invalid(
            field,
            format!("too large: stored, this request would take {size} bytes; a record holds at most {MAX_ITEM_BYTES}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ports::Cond;

    fn attrs(v: Value) -> Attrs {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn an_integer_is_sized_as_its_text_is() {
        let mut cases = vec![0u64, 1, 9, 10, 99, 100, 101, 120_000, 1_000_000_007, u64::MAX, i64::MAX as u64];
        cases.extend((0..2000).map(|i| i * 37));
        for n in cases {
            assert_eq!(integer_size(n), number_size(&n.to_string()), "{n}");
            let i = i64::try_from(n).unwrap_or(i64::MIN);
            assert_eq!(value_size(&json!(i)), number_size(&i.to_string()), "{i}");
        }
    }

    /// DynamoDB's own examples of its rules: names and values in UTF-8 bytes, the key
    /// included; numbers by significant digits; lists and maps 3 bytes plus 1 per element.
    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(value_size(&json!("héllo")), 6, "UTF-8 bytes");
        assert_eq!(value_size(&json!(true)), 1);
        assert_eq!(value_size(&json!(null)), 1);
        assert_eq!(value_size(&json!(0)), 2);
        assert_eq!(value_size(&json!(12345)), 4, "5 significant digits: 3 bytes + 1");
        assert_eq!(value_size(&json!(1000000)), 2, "trailing zeros are trimmed");
        assert_eq!(value_size(&json!(-12.5)), 3);
        assert_eq!(value_size(&json!([])), 3);
        assert_eq!(value_size(&json!(["ab", "c"])), 3 + (1 + 2) + (1 + 1));
        assert_eq!(value_size(&json!({"k": "vv"})), 3 + 1 + 1 + 2);
        let key = Key::new("T#a", "N#1");
        assert_eq!(key_size(&key), 2 + 3 + 2 + 3);
        let a = attrs(json!({"body": "xyz", "gone": null, "pk": "escaped"}));
        assert_eq!(item_size(&key, &a), 10 + (4 + 3) + (3 + 7), "`pk` is stored as `~pk`, null not at all");
    }

    #[test]
    fn batches_split_by_count_and_bytes_in_order() {
        let of = |n: usize, size: usize| -> Vec<OutMessage> {
            (0..n).map(|i| OutMessage::new(format!("{i:04}{}", "x".repeat(size - 4)))).collect()
        };
        let small = of(25, 100);
        let sizes: Vec<usize> = send_batches(&small).unwrap().iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [10, 10, 5]);
        // Ten 60 KB bodies: 600 KB, over one batch's 256 KiB.
        let large = of(10, 60 * 1024);
        let batches = send_batches(&large).unwrap();
        assert!(batches.iter().all(|b| b.iter().map(message_size).sum::<usize>() <= MAX_BATCH_BYTES));
        assert_eq!(batches.iter().map(|b| b.len()).collect::<Vec<_>>(), [4, 4, 2]);
        let flat: Vec<&OutMessage> = batches.iter().flat_map(|b| b.iter()).collect();
        assert!(flat.iter().zip(&large).all(|(a, b)| *a == b), "every message once, in order");
        // A message of exactly the limit goes alone; one byte more refuses the whole call.
        let exact = vec![OutMessage::new("a"), OutMessage::new("b".repeat(MAX_MESSAGE_BYTES)), OutMessage::new("c")];
        assert_eq!(send_batches(&exact).unwrap().iter().map(|b| b.len()).collect::<Vec<_>>(), [1, 1, 1]);
        let over = vec![OutMessage::new("a"), OutMessage::new("b".repeat(MAX_MESSAGE_BYTES + 1))];
        let e = send_batches(&over).unwrap_err();
        assert!(matches!(&e, QueueError::Invalid(r) if r.contains("message 1 of 2") && r.contains("262145")), "{e:?}");
        assert!(matches!(send_batches(&[OutMessage::new("")]), Err(QueueError::Invalid(_))));
        assert!(send_batches(&[]).unwrap().is_empty());
    }

    #[test]
    fn transactions_are_held_to_count_item_and_total() {
        let key = Key::new("p", "s");
        let fill = |n: usize| attrs(json!({"v": "x".repeat(n)}));
        let at_limit = MAX_ITEM_BYTES - key_size(&key) - 1;
        assert!(check_item(&key, &fill(at_limit)).is_ok());
        assert!(matches!(check_item(&key, &fill(at_limit + 1)), Err(StoreError::Invalid(_))));
        let put = |i: usize, n: usize| Write::Put {
            item: Item::new(Key::new("p", format!("{i:03}")), fill(n)),
            cond: Cond::Always,
        };
        // Ten items of 390 KB are 3.9 MB; eleven are over 4 MB.
        let ten: Vec<Write> = (0..10).map(|i| put(i, 390_000)).collect();
        assert!(check_transaction(&ten).is_ok());
        let eleven: Vec<Write> = (0..11).map(|i| put(i, 390_000)).collect();
        assert!(matches!(check_transaction(&eleven), Err(StoreError::Invalid(r)) if r.contains("4000000")));
        let many: Vec<Write> = (0..101).map(|i| put(i, 1)).collect();
        assert!(matches!(check_transaction(&many), Err(StoreError::Invalid(_))));
        let updates = Write::Update {
            key: key.clone(),
            updates: vec![Update::set("body", "x".repeat(10)), Update::add("n", -100), Update::Remove("r".into())],
            cond: Cond::Always,
        };
        assert_eq!(write_size(&updates), key_size(&key) + (4 + 10) + (1 + 2) + 1);
    }

    #[test]
    fn a_request_too_large_to_store_names_its_field() {
        let a = attrs(json!({"request": {"params": {"big": "x".repeat(MAX_ITEM_BYTES)}, "template_id": "t"}}));
        let request = a.get("request").and_then(Value::as_object).unwrap();
        assert_eq!(largest_attr(request), Some("params"));
        let e = check_stored("params", &Item::new(Key::new("p", "s"), a)).unwrap_err();
        assert!(
            matches!(&e, CoreError::Invalid { field, detail } if field == "params" && detail.contains("too large"))
        );
        assert!(check_stored("params", &Item::new(Key::new("p", "s"), attrs(json!({"small": 1})))).is_ok());
    }
}
