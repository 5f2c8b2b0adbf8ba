//! A workflow as the shop defines it (`PUT /v1/workflows/{id}`), checked, and laid out as the
//! engine runs it: a flat list of nodes in the order the steps are written (a branch's `then`
//! steps follow it, then its `else` steps), each knowing the node that follows it. A step's
//! index (`if: {"step": N}`, a run's `steps[].index`) is its node's position in that list.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CoreError, CoreResult};
use crate::notify::model::Category;
use crate::ports::Channel;

/// The most nodes a workflow may have, branches' steps included.
pub const MAX_NODES: usize = 50;
/// How deep branches may nest.
pub const MAX_DEPTH: usize = 4;
/// The most events a digest may carry (`max`), and its default.
pub const MAX_DIGEST_EVENTS: u32 = 100;
pub const DEFAULT_DIGEST_EVENTS: u32 = 50;
/// The longest `window`, `for`, `wait` or throttle `per`.
pub const MAX_DURATION_S: u64 = 31 * 24 * 3600;

/// The body of `PUT /v1/workflows/{workflow_id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowInput {
    /// What the user sees in their preferences ("Comments on your posts").
    pub name: String,
    pub category: Category,
    /// OTPs, security notices: no preference stops it.
    #[serde(default)]
    pub required: bool,
    /// Run in order for each recipient.
    #[schema(no_recursion)]
    pub steps: Vec<StepDef>,
}

/// One step. Every kind takes `if`: when it does not hold, the step is skipped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StepDef {
    /// The triggers for one (workflow, recipient, key) during `window` from the first become one
    /// run of the steps after it, with `events` (their params, oldest first, at most `max`) and
    /// `count`. With `schedule`, it collects until that time in the user's zone instead.
    Digest {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schedule: Option<DigestSchedule>,
        /// A template of the params (`{{ post_id }}`): triggers with other keys never merge.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<u32>,
        #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
        when: Option<Condition>,
    },
    /// Waits `for` a duration, or `until` a wall time (`09:00`) in the user's zone.
    Delay {
        #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
        duration: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<String>,
        #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
        when: Option<Condition>,
    },
    /// Sends `template_id` on `channel`, or on the first of `channels` that works: the next is
    /// tried when the last had no address, was opted out, failed for good, or (with `wait`) did
    /// not reach `until` in time.
    Send {
        template_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channel: Option<Channel>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channels: Option<Vec<Channel>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<Reach>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait: Option<String>,
        #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
        when: Option<Condition>,
    },
    /// At most `limit` runs past it per `per` per (recipient, key); the rest end `throttled`.
    Throttle {
        limit: u32,
        per: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, rename = "if", skip_serializing_if = "Option::is_none")]
        when: Option<Condition>,
    },
    /// `then` when `if` holds, else `else`; then the steps after the branch.
    Branch {
        #[serde(rename = "if")]
        when: Condition,
        #[serde(default)]
        #[schema(no_recursion)]
        then: Vec<StepDef>,
        #[serde(default, rename = "else")]
        #[schema(no_recursion)]
        otherwise: Vec<StepDef>,
    },
}

/// A digest's schedule: collect until `at` (`09:00`) in the user's zone, every day, or every
/// week on `on` (default monday).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DigestSchedule {
    pub at: String,
    pub every: Every,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Every {
    Day,
    Week,
}

/// How far a send must get for a fallback `send` to stop trying channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reach {
    Sent,
    Delivered,
    Opened,
    Clicked,
    Read,
}

impl Reach {
    pub fn as_str(self) -> &'static str {
        match self {
            Reach::Sent => "sent",
            Reach::Delivered => "delivered",
            Reach::Opened => "opened",
            Reach::Clicked => "clicked",
            Reach::Read => "read",
        }
    }
}

/// A condition, one of: `{"step": N, "is": "delivered"}` (what step N's send reached),
/// `{"param": "total", "gte": 100}` (`eq`, `gte`, `lte`, `in`), `{"user": "locale", "eq": "zh-CN"}`
/// (`locale`, `timezone` with `eq` or `in`; `tags` with `eq`: has the tag, or `in`: has one of).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is: Option<Engagement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserAttr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eq: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gte: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lte: Option<f64>,
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub any_of: Option<Vec<Value>>,
}

/// What a send step reached, for `{"step": N, "is": ...}`. `read`: an in-app message marked
/// read, or another channel's message opened or clicked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Engagement {
    Sent,
    NotSent,
    Delivered,
    NotDelivered,
    Opened,
    NotOpened,
    Clicked,
    NotClicked,
    Read,
    NotRead,
    Failed,
    Suppressed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum UserAttr {
    Locale,
    Timezone,
    Tags,
}

/// A node of the laid-out workflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub step: StepDef,
    /// The node after this one (`None`: the end).
    pub next: Option<usize>,
    /// A branch's first `then` and `else` nodes (`None`: empty, go to `next`).
    pub then: Option<usize>,
    pub otherwise: Option<usize>,
}

impl StepDef {
    pub fn kind(&self) -> &'static str {
        match self {
            StepDef::Digest { .. } => "digest",
            StepDef::Delay { .. } => "delay",
            StepDef::Send { .. } => "send",
            StepDef::Throttle { .. } => "throttle",
            StepDef::Branch { .. } => "branch",
        }
    }

    /// The step's `if`.
    pub fn when(&self) -> Option<&Condition> {
        match self {
            StepDef::Digest { when, .. }
            | StepDef::Delay { when, .. }
            | StepDef::Send { when, .. }
            | StepDef::Throttle { when, .. } => when.as_ref(),
            StepDef::Branch { .. } => None,
        }
    }

    /// A send's channels, in the order they are tried.
    pub fn send_channels(&self) -> Vec<Channel> {
        match self {
            StepDef::Send { channel: Some(c), .. } => vec![*c],
            StepDef::Send { channels: Some(cs), .. } => cs.clone(),
            _ => Vec::new(),
        }
    }

    fn size(&self) -> usize {
        match self {
            StepDef::Branch { then, otherwise, .. } => {
                1 + then.iter().map(StepDef::size).sum::<usize>() + otherwise.iter().map(StepDef::size).sum::<usize>()
            }
            _ => 1,
        }
    }
}

/// Lays the steps out as nodes (see the module doc).
pub fn layout(steps: &[StepDef]) -> Vec<Node> {
    let mut out = Vec::new();
    lay(steps, None, &mut out);
    out
}

fn lay(steps: &[StepDef], after: Option<usize>, out: &mut Vec<Node>) {
    for (i, step) in steps.iter().enumerate() {
        let at = out.len();
        let next = if i + 1 == steps.len() { after } else { Some(at + step.size()) };
        out.push(Node { step: step.clone(), next, then: None, otherwise: None });
        if let StepDef::Branch { then, otherwise, .. } = step {
            let then_at = (!then.is_empty()).then_some(at + 1);
            lay(then, next, out);
            let else_at = (!otherwise.is_empty()).then_some(out.len());
            lay(otherwise, next, out);
            if let Some(node) = out.get_mut(at) {
                node.then = then_at;
                node.otherwise = else_at;
            }
        }
    }
}

/// A duration as the contract writes it: a whole number and `s`, `m`, `h`, `d` or `w`.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let text = text.trim();
    let unit = text.chars().last()?;
    let n: u64 = text.get(..text.len() - unit.len_utf8())?.parse().ok()?;
    let secs = match unit {
        's' => n,
        'm' => n.checked_mul(60)?,
        'h' => n.checked_mul(3600)?,
        'd' => n.checked_mul(86_400)?,
        'w' => n.checked_mul(7 * 86_400)?,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(secs))
}

/// A checked duration (`for`, `window`, `wait`, `per`) in milliseconds.
pub fn duration_ms(text: &str) -> Option<i64> {
    parse_duration(text).and_then(|d| i64::try_from(d.as_millis()).ok())
}

/// The hash a `key`'s rendered value is stored under (a digest's partition, a throttle's
/// counter): bounded in size whatever the params, and other keys never meet.
pub fn key_hash(key: &str) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(key.as_bytes())[..12])
}

/// A wall time `HH:MM`.
pub fn parse_wall_time(text: &str) -> Option<chrono::NaiveTime> {
    chrono::NaiveTime::parse_from_str(text, "%H:%M").ok()
}

pub fn parse_weekday(text: &str) -> Option<chrono::Weekday> {
    text.parse::<chrono::Weekday>().ok()
}

fn duration_field(field: &str, text: &str, min_s: u64) -> CoreResult<std::time::Duration> {
    match parse_duration(text) {
        Some(d) if d.as_secs() >= min_s && d.as_secs() <= MAX_DURATION_S => Ok(d),
        _ => Err(CoreError::invalid(
            field,
            format!("must be a duration like \"30s\", \"10m\", \"1h\", \"1d\" from {min_s} s to 31 days"),
        )),
    }
}

/// Checks a workflow's shape (what needs no store: templates are checked by the caller, with
/// [`sends`]): durations, channels, `wait` with `until`, conditions pointing back to a send,
/// nesting and size.
pub fn check(input: &WorkflowInput) -> CoreResult<Vec<Node>> {
    let name = input.name.trim();
    if name.is_empty() || input.name.chars().count() > 200 || input.name.chars().any(char::is_control) {
        return Err(CoreError::invalid("name", "must be 1 to 200 characters, not blank"));
    }
    if input.steps.is_empty() {
        return Err(CoreError::invalid("steps", "must have at least one step"));
    }
    let nodes = layout(&input.steps);
    if nodes.len() > MAX_NODES {
        return Err(CoreError::invalid("steps", format!("at most {MAX_NODES} steps, branches' included")));
    }
    let mut index = 0usize;
    check_steps(&input.steps, "steps", 0, &mut index, &nodes)?;
    Ok(nodes)
}

fn check_steps(steps: &[StepDef], path: &str, depth: usize, index: &mut usize, nodes: &[Node]) -> CoreResult<()> {
    if depth > MAX_DEPTH {
        return Err(CoreError::invalid(path, format!("branches nest at most {MAX_DEPTH} deep")));
    }
    for (i, step) in steps.iter().enumerate() {
        let here = *index;
        *index += 1;
        let field = format!("{path}[{i}]");
        if let Some(c) = step.when() {
            check_condition(c, &format!("{field}.if"), here, nodes)?;
        }
        match step {
            StepDef::Digest { window, schedule, key, max, .. } => {
                match (window, schedule) {
                    (Some(w), None) => {
                        duration_field(&format!("{field}.window"), w, 1)?;
                    }
                    (None, Some(s)) => {
                        if parse_wall_time(&s.at).is_none() {
                            return Err(CoreError::invalid(format!("{field}.schedule.at"), "must be a time HH:MM"));
                        }
                        if let Some(on) = &s.on
                            && (s.every != Every::Week || parse_weekday(on).is_none())
                        {
                            return Err(CoreError::invalid(
                                format!("{field}.schedule.on"),
                                "a weekday (monday … sunday), with every: week only",
                            ));
                        }
                    }
                    _ => {
                        return Err(CoreError::invalid(
                            format!("{field}.window"),
                            "give exactly one of window or schedule",
                        ));
                    }
                }
                if let Some(k) = key {
                    check_key(&format!("{field}.key"), k)?;
                }
                if let Some(m) = max
                    && (*m == 0 || *m > MAX_DIGEST_EVENTS)
                {
                    return Err(CoreError::invalid(
                        format!("{field}.max"),
                        format!("must be 1 to {MAX_DIGEST_EVENTS}"),
                    ));
                }
            }
            StepDef::Delay { duration, until, .. } => match (duration, until) {
                (Some(d), None) => {
                    duration_field(&format!("{field}.for"), d, 1)?;
                }
                (None, Some(u)) => {
                    if parse_wall_time(u).is_none() {
                        return Err(CoreError::invalid(format!("{field}.until"), "must be a time HH:MM"));
                    }
                }
                _ => return Err(CoreError::invalid(format!("{field}.for"), "give exactly one of for or until")),
            },
            StepDef::Send { template_id, channel, channels, until, wait, .. } => {
                crate::ids::check_id(&format!("{field}.template_id"), template_id)?;
                match (channel, channels) {
                    (Some(_), None) => {
                        if until.is_some() || wait.is_some() {
                            return Err(CoreError::invalid(
                                format!("{field}.until"),
                                "until and wait need channels (a list to fall back along)",
                            ));
                        }
                    }
                    (None, Some(list)) => {
                        if list.is_empty() || list.len() > 4 {
                            return Err(CoreError::invalid(format!("{field}.channels"), "must list 1 to 4 channels"));
                        }
                        let mut seen = HashSet::new();
                        for (j, c) in list.iter().enumerate() {
                            if !seen.insert(*c) {
                                return Err(CoreError::invalid(
                                    format!("{field}.channels[{j}]"),
                                    "each channel at most once",
                                ));
                            }
                        }
                        if wait.is_some() && until.is_none() {
                            return Err(CoreError::invalid(
                                format!("{field}.wait"),
                                "needs until (what the channel must reach within wait)",
                            ));
                        }
                        if let Some(w) = wait {
                            duration_field(&format!("{field}.wait"), w, 1)?;
                        }
                        if until.is_some() && wait.is_none() {
                            return Err(CoreError::invalid(
                                format!("{field}.until"),
                                "needs wait (how long the channel has to reach it)",
                            ));
                        }
                    }
                    _ => {
                        return Err(CoreError::invalid(
                            format!("{field}.channel"),
                            "give exactly one of channel or channels",
                        ));
                    }
                }
            }
            StepDef::Throttle { limit, per, key, .. } => {
                if *limit == 0 || *limit > 10_000 {
                    return Err(CoreError::invalid(format!("{field}.limit"), "must be 1 to 10000"));
                }
                duration_field(&format!("{field}.per"), per, 1)?;
                if let Some(k) = key {
                    check_key(&format!("{field}.key"), k)?;
                }
            }
            StepDef::Branch { when, then, otherwise } => {
                check_condition(when, &format!("{field}.if"), here, nodes)?;
                check_steps(then, &format!("{field}.then"), depth + 1, index, nodes)?;
                check_steps(otherwise, &format!("{field}.else"), depth + 1, index, nodes)?;
            }
        }
    }
    Ok(())
}

fn check_key(field: &str, key: &str) -> CoreResult<()> {
    if key.is_empty() || key.len() > 500 {
        return Err(CoreError::invalid(field, "must be 1 to 500 characters (a template of the params)"));
    }
    crate::templates::check_fragment(key).map_err(|e| CoreError::invalid(field, e))
}

fn check_condition(c: &Condition, field: &str, here: usize, nodes: &[Node]) -> CoreResult<()> {
    let forms = [c.step.is_some() || c.is.is_some(), c.param.is_some(), c.user.is_some()];
    if forms.iter().filter(|f| **f).count() != 1 {
        return Err(CoreError::invalid(field, "give exactly one of step (with is), param or user"));
    }
    let ops = [c.eq.is_some(), c.gte.is_some(), c.lte.is_some(), c.any_of.is_some()];
    let n_ops = ops.iter().filter(|o| **o).count();
    if let Some(step) = c.step.or(c.is.map(|_| u32::MAX)) {
        let Some(_) = c.is else {
            return Err(CoreError::invalid(
                format!("{field}.is"),
                "needs is (delivered, opened, clicked, read, not_read, …)",
            ));
        };
        if n_ops != 0 {
            return Err(CoreError::invalid(field, "a step condition takes is, no eq/gte/lte/in"));
        }
        let points_back =
            (step as usize) < here && nodes.get(step as usize).is_some_and(|n| matches!(n.step, StepDef::Send { .. }));
        if !points_back {
            return Err(CoreError::invalid(
                format!("{field}.step"),
                format!("must be the index of a send step before this one (this step is {here})"),
            ));
        }
        return Ok(());
    }
    if c.is.is_some() {
        return Err(CoreError::invalid(format!("{field}.is"), "is goes with step"));
    }
    if n_ops != 1 {
        return Err(CoreError::invalid(field, "give exactly one of eq, gte, lte or in"));
    }
    if let Some(p) = &c.param
        && (p.is_empty() || p.len() > 200)
    {
        return Err(CoreError::invalid(format!("{field}.param"), "must be 1 to 200 characters (a.b for nested)"));
    }
    if c.user.is_some() && (c.gte.is_some() || c.lte.is_some()) {
        return Err(CoreError::invalid(field, "a user condition takes eq or in"));
    }
    if let Some(list) = &c.any_of
        && (list.is_empty() || list.len() > 100)
    {
        return Err(CoreError::invalid(format!("{field}.in"), "must list 1 to 100 values"));
    }
    Ok(())
}

/// Every send step's template and channels, with the field that names the template.
pub fn sends(steps: &[StepDef]) -> Vec<(String, String, Vec<Channel>)> {
    let mut out = Vec::new();
    collect_sends(steps, "steps", &mut out);
    out
}

fn collect_sends(steps: &[StepDef], path: &str, out: &mut Vec<(String, String, Vec<Channel>)>) {
    for (i, step) in steps.iter().enumerate() {
        match step {
            StepDef::Send { template_id, .. } => {
                out.push((format!("{path}[{i}].template_id"), template_id.clone(), step.send_channels()))
            }
            StepDef::Branch { then, otherwise, .. } => {
                collect_sends(then, &format!("{path}[{i}].then"), out);
                collect_sends(otherwise, &format!("{path}[{i}].else"), out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    fn input(steps: Value) -> WorkflowInput {
        serde_json::from_value(json!({"name": "Comments", "category": "transactional", "steps": steps})).unwrap()
    }

    fn refused(steps: Value) -> String {
        match check(&input(steps)) {
            Err(CoreError::Invalid { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_contracts_example_is_laid_out_with_branches_in_place() {
        let wf = input(json!([
            {"type": "digest", "window": "10m", "key": "{{ post_id }}", "max": 50},
            {"type": "send", "channel": "inapp", "template_id": "comment"},
            {"type": "delay", "for": "1h"},
            {"type": "send", "channel": "email", "template_id": "comment_email", "if": {"step": 1, "is": "not_read"}},
            {"type": "send", "channels": ["push", "sms", "email"], "until": "delivered", "wait": "5m", "template_id": "x"},
            {"type": "throttle", "limit": 3, "per": "1d", "key": "{{ shop_id }}"},
            {"type": "branch", "if": {"param": "total", "gte": 100},
             "then": [{"type": "send", "channel": "sms", "template_id": "big"}],
             "else": [{"type": "delay", "for": "1m"}, {"type": "send", "channel": "push", "template_id": "small"}]},
            {"type": "send", "channel": "email", "template_id": "last"}
        ]));
        let nodes = check(&wf).unwrap();
        assert_eq!(nodes.len(), 11);
        assert_eq!(nodes[0].next, Some(1));
        assert_eq!(nodes[6].step.kind(), "branch");
        assert_eq!((nodes[6].then, nodes[6].otherwise, nodes[6].next), (Some(7), Some(8), Some(10)));
        assert_eq!(nodes[7].next, Some(10), "then's last step goes on after the branch");
        assert_eq!(nodes[8].next, Some(9));
        assert_eq!(nodes[9].next, Some(10));
        assert_eq!(nodes[10].next, None);
    }

    #[test]
    fn definitions_that_cannot_work_are_refused_naming_the_field() {
        let send = |extra: Value| {
            let mut s = json!({"type": "send", "channel": "email", "template_id": "t"});
            s.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            s
        };
        assert_eq!(
            refused(json!([send(json!({})), send(json!({"if": {"step": 1, "is": "read"}}))])),
            "steps[1].if.step",
            "a step pointing at itself"
        );
        assert_eq!(
            refused(json!([send(json!({"if": {"step": 1, "is": "read"}})), send(json!({}))])),
            "steps[0].if.step",
            "forward: a loop"
        );
        assert_eq!(
            refused(json!([{"type": "delay", "for": "1h"}, send(json!({"if": {"step": 0, "is": "read"}}))])),
            "steps[1].if.step",
            "not a send"
        );
        assert_eq!(
            refused(json!([{"type": "send", "channels": ["push", "sms"], "wait": "5m", "template_id": "t"}])),
            "steps[0].wait"
        );
        assert_eq!(
            refused(json!([{"type": "send", "channels": ["push", "push"], "template_id": "t"}])),
            "steps[0].channels[1]"
        );
        assert_eq!(refused(json!([{"type": "delay", "for": "soon"}])), "steps[0].for");
        assert_eq!(refused(json!([{"type": "digest", "window": "1m", "max": 0}])), "steps[0].max");
        assert_eq!(refused(json!([{"type": "digest"}])), "steps[0].window");
        assert_eq!(
            refused(
                json!([{"type": "branch", "if": {"param": "x", "eq": 1}, "then": [{"type": "delay", "for": "0s"}]}])
            ),
            "steps[0].then[0].for"
        );
        assert_eq!(refused(json!([])), "steps");
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(parse_duration("10m"), Some(std::time::Duration::from_secs(600)));
        assert_eq!(parse_duration("1d"), Some(std::time::Duration::from_secs(86_400)));
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("5y"), None);
        assert_eq!(parse_duration("99999999999999999999s"), None);
    }
}
