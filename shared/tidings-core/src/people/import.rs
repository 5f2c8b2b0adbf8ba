//! Importing people from another system (`tidings import users|pinpoint`; docs/people.md,
//! "Importing users"): users with their contacts, push devices and marketing opt-outs, written
//! through the same rules as the API's (`users::put_users`, `devices::register`,
//! `preferences::leave_marketing`). Every step is an idempotent upsert that skips what is already
//! so, which is what makes an import resumable: running it again after an interruption writes
//! what was missing and nothing else.

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use crate::deps::Deps;
use crate::error::{CoreError, CoreResult};
use crate::ids::{TenantId, check_id};
use crate::people::devices::{self, DeviceInput};
use crate::people::preferences;
use crate::people::users::{self, BatchError, BatchUser};
use crate::ports::Platform;

/// Devices registered and opt-outs written at once: a device is a push-service call on AWS
/// (`CreatePlatformEndpoint`), so they go a few at a time rather than one after the other.
const IN_FLIGHT: usize = 8;

/// One person to import.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportedUser {
    pub user: BatchUser,
    /// Push tokens, each with its platform.
    pub devices: Vec<(Platform, String)>,
    /// The person opted out of marketing in the other system: they leave marketing here too.
    pub marketing_opt_out: bool,
}

/// What an import did, counted: summed over its batches, and the figures of its summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ImportCounts {
    /// Users that stand as given (written now, or already so).
    pub users: usize,
    /// Of them, those already so (not written again).
    pub users_unchanged: usize,
    /// Devices registered now.
    pub devices: usize,
    /// Devices that were registered to the user already.
    pub devices_unchanged: usize,
    /// Users who left marketing now.
    pub opt_outs: usize,
    /// Users who had left marketing already.
    pub opt_outs_unchanged: usize,
}

impl ImportCounts {
    pub fn add(&mut self, other: ImportCounts) {
        self.users += other.users;
        self.users_unchanged += other.users_unchanged;
        self.devices += other.devices;
        self.devices_unchanged += other.devices_unchanged;
        self.opt_outs += other.opt_outs;
        self.opt_outs_unchanged += other.opt_outs_unchanged;
    }

    /// How many things were written: 0 for a re-run over a finished import.
    pub fn written(&self) -> usize {
        self.users - self.users_unchanged + self.devices + self.opt_outs
    }
}

/// What an import did, summed over its batches: its counts and what it left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ImportTally {
    #[serde(flatten)]
    pub counts: ImportCounts,
    /// What was not imported, and why (`index` is the person's place in what was given).
    pub errors: Vec<BatchError>,
}

impl ImportTally {
    pub fn add(&mut self, other: ImportTally) {
        self.counts.add(other.counts);
        self.errors.extend(other.errors);
    }
}

/// Imports one batch of at most [`users::MAX_BATCH_USERS`] people (`(index, person)`): the users
/// first, then the devices of those that stood, then the opt-outs of every person whose id is
/// valid (an opt-out is kept even when the person's contacts were refused, so a later write of
/// them never mails someone who had said no). An error of one person (a bad address, a token the
/// push service refuses) is in `errors`; a store that fails stops the import (run it again).
pub async fn import_batch(deps: &Deps, t: &TenantId, people: Vec<(usize, ImportedUser)>) -> CoreResult<ImportTally> {
    if people.len() > users::MAX_BATCH_USERS {
        return Err(CoreError::invalid("users", format!("at most {} users a batch", users::MAX_BATCH_USERS)));
    }
    let batch: Vec<(usize, BatchUser)> = people.iter().map(|(i, p)| (*i, p.user.clone())).collect();
    let outcome = users::put_users(deps, t, batch).await?;
    let refused: std::collections::HashSet<usize> = outcome.errors.iter().map(|e| e.index).collect();
    let mut tally = ImportTally {
        counts: ImportCounts { users: outcome.upserted, users_unchanged: outcome.unchanged, ..ImportCounts::default() },
        errors: outcome.errors,
    };

    let devices: Vec<(usize, usize, DeviceInput)> = people
        .iter()
        .filter(|(i, _)| !refused.contains(i))
        .flat_map(|(i, p)| {
            p.devices.iter().enumerate().map(move |(d, (platform, token))| {
                (*i, d, DeviceInput { user_id: p.user.user_id.clone(), platform: *platform, token: token.clone() })
            })
        })
        .collect();
    let registered: Vec<(usize, usize, Result<bool, CoreError>)> = stream::iter(devices)
        .map(|(i, d, input)| async move { (i, d, devices::register(deps, t, input).await.map(|(_, new)| new)) })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    for (i, d, result) in registered {
        match result {
            Ok(true) => tally.counts.devices += 1,
            Ok(false) => tally.counts.devices_unchanged += 1,
            Err(CoreError::Invalid { field, detail }) => {
                tally.errors.push(BatchError::new(i, &format!("devices[{d}].{field}"), detail));
            }
            Err(e) => return Err(e),
        }
    }

    let opt_outs: Vec<&str> = people
        .iter()
        .filter(|(_, p)| p.marketing_opt_out && check_id("user_id", &p.user.user_id).is_ok())
        .map(|(_, p)| p.user.user_id.as_str())
        .collect();
    let left: Vec<bool> = stream::iter(opt_outs)
        .map(|user_id| preferences::leave_marketing(deps, t, user_id))
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await?;
    tally.counts.opt_outs = left.iter().filter(|now| **now).count();
    tally.counts.opt_outs_unchanged = left.len() - tally.counts.opt_outs;
    tally.errors.sort_by_key(|e| e.index);
    Ok(tally)
}
