//! `tidings import users FILE` and `tidings import pinpoint PATH` (docs/people.md, "Importing
//! users"): people from another system, written through the core's functions
//! (`people::import::import_batch`, 1,000 at a time) against the backend the command is given,
//! never through HTTP. A progress bar on stderr, one JSON summary on stdout.
//!
//! Resumable by being idempotent: every write is an upsert that skips what is already so, so a
//! run interrupted halfway is finished by running it again, and a second run writes nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;
use serde::{Deserialize, Serialize};
use tidings_core::people::import::{self, ImportCounts, ImportTally, ImportedUser};
use tidings_core::people::users::{BatchUser, MAX_BATCH_USERS, e164, is_email};
use tidings_core::ports::{Platform, SystemClock};
use tidings_core::{Deps, TenantId};

use crate::BackendArgs;
use crate::backend::Backend;
use crate::progress::Progress;

#[derive(Subcommand)]
pub enum ImportCommand {
    /// Users from a CSV file with a header (`user_id` and any of `email`, `phone`, `locale`,
    /// `timezone`, `tags` (separated by `;`), `marketing_opt_out` (true/false)) or from NDJSON
    /// (one user object a line, the fields of `POST /v1/users/batch`, and `marketing_opt_out`).
    #[command(after_help = crate::examples::IMPORT_USERS)]
    Users {
        /// The file: `.csv`, or `.ndjson` / `.jsonl` / `.json`; another name is read as NDJSON
        /// when it starts with `{`, else as CSV.
        file: PathBuf,
        /// The tenant the users belong to.
        #[arg(long)]
        tenant: String,
    },
    /// An Amazon Pinpoint endpoint export (`aws pinpoint create-export-job`, then the bucket's
    /// objects copied here): a directory, searched recursively, or one file; gzip files (or plain
    /// ones) of endpoint JSON, one endpoint a line.
    #[command(after_help = crate::examples::IMPORT_PINPOINT)]
    Pinpoint {
        /// The export: the directory its objects were copied to, or one of its files.
        path: PathBuf,
        /// The tenant the users belong to.
        #[arg(long)]
        tenant: String,
        /// An endpoint without `User.UserId` becomes a user named by the endpoint's `Id`
        /// (without it such endpoints are skipped, and counted).
        #[arg(long)]
        endpoint_id_as_user: bool,
    },
}

/// One person read from a source, with where (for its errors).
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub at: String,
    pub person: ImportedUser,
}

/// What was not imported, where it was read, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecordError {
    pub at: String,
    pub field: String,
    pub detail: String,
}

/// Errors listed in the summary at most; `errors_total` counts them all.
const LISTED_ERRORS: usize = 1000;

/// What a source held besides its people, for the summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SourceNotes {
    /// Lines or rows read.
    pub records: usize,
    /// CSV columns that are not a user's field (not imported).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored_columns: Vec<String>,
    /// Pinpoint: files read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<usize>,
    /// Pinpoint: endpoints without `User.UserId` (skipped unless `--endpoint-id-as-user`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints_without_user: Option<usize>,
    /// Pinpoint: `INACTIVE` endpoints, whose addresses were not imported (Pinpoint sends
    /// nothing to them; another endpoint took the address over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inactive_endpoints: Option<usize>,
    /// Pinpoint: endpoints of channels Tidings does not import, per `ChannelType`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped_channels: BTreeMap<String, usize>,
    /// Pinpoint: `Demographic.Timezone` values that are no IANA zone (the user keeps none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_timezones: Option<usize>,
}

/// The JSON summary of an import.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub tenant: String,
    pub source: String,
    pub format: &'static str,
    #[serde(flatten)]
    pub notes: SourceNotes,
    #[serde(flatten)]
    pub counts: ImportCounts,
    pub errors_total: usize,
    pub errors: Vec<RecordError>,
    pub seconds: f64,
}

pub async fn run(command: ImportCommand, args: &BackendArgs) -> anyhow::Result<()> {
    let (tenant, source) = match &command {
        ImportCommand::Users { file, tenant } => (tenant, file),
        ImportCommand::Pinpoint { path, tenant, .. } => (tenant, path),
    };
    let t = TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("--tenant: {e}"))?;
    if !source.exists() {
        anyhow::bail!("{} does not exist: give the path of the file (or export directory) to import", source.display());
    }
    let backend = Backend::open(args, Arc::new(SystemClock)).await?;
    let summary = match command {
        ImportCommand::Users { file, .. } => import_users_file(&backend.deps, &t, &file).await?,
        ImportCommand::Pinpoint { path, endpoint_id_as_user, .. } => {
            import_pinpoint(&backend.deps, &t, &path, endpoint_id_as_user).await?
        }
    };
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if summary.errors_total > 0 {
        // The import ran to its end (exit status 0); what it left out is the summary's to say.
        eprintln!(
            "import: {} record(s) or address(es) not imported, each named in the summary's `errors`: fix them and run \
             the import again (what was imported stays; a re-run writes only what is missing)",
            summary.errors_total
        );
    }
    Ok(())
}

/// `tidings import users FILE`.
pub async fn import_users_file(deps: &Deps, t: &TenantId, file: &Path) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    let format = users_format(file)?;
    let text = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
    let (records, errors, notes) = match format {
        UsersFormat::Csv => read_csv(&name, &text)?,
        UsersFormat::Ndjson => read_ndjson(&name, &text),
    };
    let progress = Progress::bar("import", records.len() as u64, "users");
    let (tally, mut write_errors) = import_records(deps, t, &records, &progress).await?;
    let mut all = errors;
    all.append(&mut write_errors);
    let summary = summary(t, file, format.name(), notes, tally, all, started);
    progress.finish(format!("{} users from {name} in {:.1} s", summary.counts.users, summary.seconds));
    Ok(summary)
}

fn summary(
    t: &TenantId,
    source: &Path,
    format: &'static str,
    notes: SourceNotes,
    tally: ImportTally,
    mut errors: Vec<RecordError>,
    started: std::time::Instant,
) -> Summary {
    let errors_total = errors.len();
    errors.truncate(LISTED_ERRORS);
    Summary {
        tenant: t.to_string(),
        source: source.display().to_string(),
        format,
        notes,
        counts: tally.counts,
        errors_total,
        errors,
        seconds: (started.elapsed().as_secs_f64() * 100.0).round() / 100.0,
    }
}

/// Writes the people in batches of [`MAX_BATCH_USERS`], in order, moving the bar; errors are
/// named by where their record was read.
pub async fn import_records(
    deps: &Deps,
    t: &TenantId,
    records: &[Record],
    progress: &Progress,
) -> anyhow::Result<(ImportTally, Vec<RecordError>)> {
    let mut tally = ImportTally::default();
    let mut errors = Vec::new();
    progress.set(0, "");
    for (n, chunk) in records.chunks(MAX_BATCH_USERS).enumerate() {
        let base = n * MAX_BATCH_USERS;
        let people = chunk.iter().enumerate().map(|(i, r)| (base + i, r.person.clone())).collect();
        let mut done = import::import_batch(deps, t, people).await.with_context(|| {
            format!("importing records {} to {} (run the import again to go on)", base + 1, base + chunk.len())
        })?;
        for e in std::mem::take(&mut done.errors) {
            let at = records.get(e.index).map_or_else(|| e.index.to_string(), |r| r.at.clone());
            // `users[12].email` is the batch's name for it; here the record's place says which.
            let field = e.field.split_once("].").map_or("user", |(_, f)| f).to_owned();
            errors.push(RecordError { at, field, detail: e.detail });
        }
        tally.add(done);
        progress.set((base + chunk.len()) as u64, "");
    }
    Ok((tally, errors))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsersFormat {
    Csv,
    Ndjson,
}

impl UsersFormat {
    fn name(self) -> &'static str {
        match self {
            UsersFormat::Csv => "csv",
            UsersFormat::Ndjson => "ndjson",
        }
    }
}

/// By the file's extension, else by its first character (`{`: NDJSON).
pub fn users_format(file: &Path) -> anyhow::Result<UsersFormat> {
    let ext = file.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("csv") => return Ok(UsersFormat::Csv),
        Some("ndjson" | "jsonl" | "json") => return Ok(UsersFormat::Ndjson),
        _ => {}
    }
    let mut head = [0u8; 512];
    let n = std::fs::File::open(file)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("reading {}", file.display()))?;
    let first = head[..n].iter().find(|b| !b.is_ascii_whitespace() && **b != 0xEF && **b != 0xBB && **b != 0xBF);
    Ok(if first == Some(&b'{') { UsersFormat::Ndjson } else { UsersFormat::Csv })
}

/// A CSV cell given: trimmed, empty means absent.
fn cell(value: Option<&str>) -> Option<String> {
    value.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned)
}

/// `true`, `yes`, `1` (any case); `false`, `no`, `0` or empty.
fn parse_flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "y" | "1" => Some(true),
        "false" | "no" | "n" | "0" | "" => Some(false),
        _ => None,
    }
}

/// Tags of a cell: separated by `;` (or `|`, `,`, blanks: no tag can hold them).
fn split_tags(value: &str) -> Vec<String> {
    value.split([';', '|', ',', ' ', '\t']).filter(|t| !t.is_empty()).map(str::to_owned).collect()
}

const CSV_COLUMNS: [&str; 7] = ["user_id", "email", "phone", "locale", "timezone", "tags", "marketing_opt_out"];

/// A CSV with a header row; columns by name, any order, in any case.
pub fn read_csv(name: &str, text: &[u8]) -> anyhow::Result<(Vec<Record>, Vec<RecordError>, SourceNotes)> {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(text);
    let headers: Vec<String> = reader
        .headers()
        .with_context(|| format!("{name}: the header row"))?
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let column = |name: &str| headers.iter().position(|h| h == name);
    let Some(id_column) = column("user_id") else {
        anyhow::bail!(
            "{name}: no user_id column in the header (found: {}); the columns are {}",
            headers.join(", "),
            CSV_COLUMNS.join(", ")
        );
    };
    let [email, phone, locale, timezone, tags, opt_out] =
        ["email", "phone", "locale", "timezone", "tags", "marketing_opt_out"].map(column);
    let mut notes = SourceNotes {
        ignored_columns: headers.iter().filter(|h| !CSV_COLUMNS.contains(&h.as_str())).cloned().collect(),
        ..SourceNotes::default()
    };
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for row in reader.records() {
        notes.records += 1;
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                errors.push(RecordError {
                    at: format!("{name} line {line}"),
                    field: "row".into(),
                    detail: e.to_string(),
                });
                continue;
            }
        };
        let at = format!("{name} line {}", row.position().map_or(0, |p| p.line()));
        let get = |c: Option<usize>| cell(c.and_then(|c| row.get(c)));
        let marketing_opt_out = match get(opt_out).as_deref().map(parse_flag) {
            None => false,
            Some(Some(v)) => v,
            Some(None) => {
                errors.push(RecordError {
                    at,
                    field: "marketing_opt_out".into(),
                    detail: "not true or false (yes/no, 1/0 are taken too)".into(),
                });
                continue;
            }
        };
        let user = BatchUser {
            user_id: get(Some(id_column)).unwrap_or_default(),
            email: get(email),
            phone: get(phone),
            locale: get(locale),
            timezone: get(timezone),
            tags: get(tags).map(|t| split_tags(&t)).unwrap_or_default(),
        };
        records.push(Record { at, person: ImportedUser { user, devices: Vec::new(), marketing_opt_out } });
    }
    Ok((records, errors, notes))
}

/// One user object a line; blank lines are skipped.
pub fn read_ndjson(name: &str, text: &[u8]) -> (Vec<Record>, Vec<RecordError>, SourceNotes) {
    let mut notes = SourceNotes::default();
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        notes.records += 1;
        let at = format!("{name} line {}", i + 1);
        let mut value: serde_json::Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                errors.push(RecordError { at, field: "line".into(), detail: format!("not JSON: {e}") });
                continue;
            }
        };
        let marketing_opt_out = match value.as_object_mut().and_then(|o| o.remove("marketing_opt_out")) {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => b,
            Some(_) => {
                errors.push(RecordError { at, field: "marketing_opt_out".into(), detail: "not true or false".into() });
                continue;
            }
        };
        match BatchUser::from_json(0, value) {
            Ok(user) => {
                records.push(Record { at, person: ImportedUser { user, devices: Vec::new(), marketing_opt_out } })
            }
            Err(e) => {
                let field = e.field.split_once("].").map_or("user", |(_, f)| f).to_owned();
                errors.push(RecordError { at, field, detail: e.detail });
            }
        }
    }
    (records, errors, notes)
}

/// One endpoint of a Pinpoint export, the fields Tidings reads (the others are ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Endpoint {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub channel_type: Option<String>,
    #[serde(default)]
    pub address: Option<String>,
    /// `ACTIVE` or `INACTIVE` (Pinpoint makes an endpoint inactive when another takes its address).
    #[serde(default)]
    pub endpoint_status: Option<String>,
    /// `ALL`: the person opted out of what is sent to this endpoint; `NONE`: not.
    #[serde(default)]
    pub opt_out: Option<String>,
    /// When the endpoint was last updated (ISO 8601): the latest of a user's endpoints of one
    /// channel gives the address.
    #[serde(default)]
    pub effective_date: Option<String>,
    #[serde(default)]
    pub demographic: Option<Demographic>,
    #[serde(default)]
    pub user: Option<EndpointUser>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Demographic {
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default)]
    pub locale: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct EndpointUser {
    #[serde(default)]
    pub user_id: Option<String>,
}

/// A user's endpoints folded together.
#[derive(Default)]
struct Folded {
    at: String,
    /// `(EffectiveDate, address)` of the latest active endpoint of each kind.
    email: Option<(String, String)>,
    phone: Option<(String, String)>,
    timezone: Option<(String, String)>,
    locale: Option<(String, String)>,
    devices: Vec<(Platform, String)>,
    opt_out: bool,
}

/// Keeps `value` when it is at least as recent as what `slot` holds (a later line wins a tie).
fn latest(slot: &mut Option<(String, String)>, date: &str, value: String) {
    if slot.as_ref().is_none_or(|(d, _)| date >= d.as_str()) {
        *slot = Some((date.to_owned(), value));
    }
}

/// Folds endpoints into people, one per `User.UserId` (docs/people.md, "Importing users"):
/// the latest active `EMAIL` and `SMS` endpoints give the email and the phone, every active
/// `APNS` / `GCM` endpoint a device, the latest `Demographic.Timezone` that is an IANA zone the
/// timezone (likewise the locale), and an `OptOut` of `ALL` on any endpoint of the person makes
/// them leave marketing. An address Tidings would refuse is an error of its endpoint, and the
/// person is imported without it.
#[derive(Default)]
pub struct PinpointFolder {
    users: HashMap<String, Folded>,
    pub notes: SourceNotes,
    pub errors: Vec<RecordError>,
    endpoint_id_as_user: bool,
}

impl PinpointFolder {
    pub fn new(endpoint_id_as_user: bool) -> Self {
        Self { endpoint_id_as_user, ..Self::default() }
    }

    /// One line of an export file.
    pub fn line(&mut self, at: String, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.notes.records += 1;
        match serde_json::from_slice::<Endpoint>(line) {
            Ok(e) => self.endpoint(at, e),
            Err(e) => {
                self.errors.push(RecordError { at, field: "line".into(), detail: format!("not an endpoint: {e}") })
            }
        }
    }

    pub fn endpoint(&mut self, at: String, e: Endpoint) {
        let endpoint_id = e.id.clone().unwrap_or_default();
        let at = if endpoint_id.is_empty() { at } else { format!("{at} (endpoint {endpoint_id})") };
        let user_id = match e.user.and_then(|u| u.user_id).filter(|u| !u.is_empty()) {
            Some(u) => u,
            None => {
                *self.notes.endpoints_without_user.get_or_insert(0) += 1;
                if !self.endpoint_id_as_user || endpoint_id.is_empty() {
                    return;
                }
                endpoint_id
            }
        };
        let date = e.effective_date.unwrap_or_default();
        let folded = self.users.entry(user_id).or_insert_with(|| Folded { at: at.clone(), ..Folded::default() });
        if e.opt_out.as_deref() == Some("ALL") {
            folded.opt_out = true;
        }
        if let Some(d) = e.demographic {
            if let Some(tz) = d.timezone.filter(|z| !z.is_empty()) {
                if tidings_core::people::zones::Zone::named(&tz).is_some() {
                    latest(&mut folded.timezone, &date, tz);
                } else {
                    *self.notes.dropped_timezones.get_or_insert(0) += 1;
                }
            }
            if let Some(locale) = d.locale.filter(|l| !l.is_empty()) {
                latest(&mut folded.locale, &date, locale);
            }
        }
        let channel = e.channel_type.unwrap_or_default();
        if e.endpoint_status.as_deref() == Some("INACTIVE") {
            *self.notes.inactive_endpoints.get_or_insert(0) += 1;
            return;
        }
        let address = e.address.unwrap_or_default().trim().to_owned();
        let refuse = |errors: &mut Vec<RecordError>, detail: &str| {
            errors.push(RecordError { at: at.clone(), field: "Address".into(), detail: detail.to_owned() });
        };
        match channel.as_str() {
            "EMAIL" if is_email(&address) => latest(&mut folded.email, &date, address),
            "EMAIL" => refuse(&mut self.errors, "not one email address; the user is imported without it"),
            "SMS" => match e164(&address) {
                Some(number) => latest(&mut folded.phone, &date, number),
                None => {
                    refuse(&mut self.errors, "not a valid phone number in E.164 form; the user is imported without it")
                }
            },
            "APNS" | "GCM" if !address.is_empty() => {
                let platform = if channel == "APNS" { Platform::Ios } else { Platform::Android };
                if !folded.devices.iter().any(|(_, token)| *token == address) {
                    folded.devices.push((platform, address));
                }
            }
            "APNS" | "GCM" => refuse(&mut self.errors, "no push token; the user is imported without this device"),
            other => {
                let name = if other.is_empty() { "(none)" } else { other };
                *self.notes.skipped_channels.entry(name.to_owned()).or_insert(0) += 1;
            }
        }
    }

    /// The people, in user-id order.
    pub fn people(self) -> (Vec<Record>, Vec<RecordError>, SourceNotes) {
        let mut users: Vec<(String, Folded)> = self.users.into_iter().collect();
        users.sort_by(|a, b| a.0.cmp(&b.0));
        let records = users
            .into_iter()
            .map(|(user_id, f)| Record {
                at: format!("user {user_id} (first at {})", f.at),
                person: ImportedUser {
                    user: BatchUser {
                        user_id,
                        email: f.email.map(|(_, v)| v),
                        phone: f.phone.map(|(_, v)| v),
                        locale: f.locale.map(|(_, v)| v),
                        timezone: f.timezone.map(|(_, v)| v),
                        tags: Vec::new(),
                    },
                    devices: f.devices,
                    marketing_opt_out: f.opt_out,
                },
            })
            .collect();
        (records, self.errors, self.notes)
    }
}

/// The export's files: every `.gz`, `.json`, `.jsonl` and `.ndjson` file under a directory
/// (hidden ones skipped), in path order; or the one file given.
pub fn export_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = entry?.path();
            let hidden = p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if hidden {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| {
                ["gz", "json", "jsonl", "ndjson"].contains(&e.to_string_lossy().to_ascii_lowercase().as_str())
            }) {
                files.push(p);
            }
        }
    }
    files.sort();
    if files.is_empty() {
        anyhow::bail!("{}: no export files in it (.gz, or .json / .jsonl / .ndjson)", path.display());
    }
    Ok(files)
}

/// Reads an export file line by line: gzip (one member or several, as S3 multipart writers
/// leave them) when it starts with gzip's magic bytes, else plain text.
pub fn read_export_file(path: &Path, folder: &mut PinpointFolder, root: &Path) -> anyhow::Result<()> {
    let mut file = BufReader::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?);
    let gzip = file.fill_buf().with_context(|| format!("reading {}", path.display()))?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn BufRead> =
        if gzip { Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file))) } else { Box::new(file) };
    let name = path.strip_prefix(root).unwrap_or(path).display().to_string();
    let name = if name.is_empty() { path.display().to_string() } else { name };
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.with_context(|| format!("{name}: reading line {} (a broken gzip file?)", i + 1))?;
        folder.line(format!("{name} line {}", i + 1), &line);
    }
    Ok(())
}

/// `tidings import pinpoint PATH`.
pub async fn import_pinpoint(
    deps: &Deps,
    t: &TenantId,
    path: &Path,
    endpoint_id_as_user: bool,
) -> anyhow::Result<Summary> {
    let started = std::time::Instant::now();
    let files = export_files(path)?;
    let reading = Progress::bar("read", files.len() as u64, "files");
    let mut folder = PinpointFolder::new(endpoint_id_as_user);
    let root = if path.is_file() { path.parent().unwrap_or(path) } else { path };
    for (i, file) in files.iter().enumerate() {
        read_export_file(file, &mut folder, root)?;
        reading.set(i as u64 + 1, format!("{} endpoints", folder.notes.records));
    }
    reading.finish(format!(
        "{} endpoints in {} files in {:.1} s",
        folder.notes.records,
        files.len(),
        reading.elapsed_s()
    ));
    let (records, errors, mut notes) = folder.people();
    notes.files = Some(files.len());
    let progress = Progress::bar("import", records.len() as u64, "users");
    let (tally, mut write_errors) = import_records(deps, t, &records, &progress).await?;
    let mut all = errors;
    all.append(&mut write_errors);
    let summary = summary(t, path, "pinpoint", notes, tally, all, started);
    progress.finish(format!(
        "{} users, {} devices, {} opt-outs from {} endpoints in {:.1} s",
        summary.counts.users, summary.counts.devices, summary.counts.opt_outs, summary.notes.records, summary.seconds
    ));
    Ok(summary)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn csv_columns_by_name_tags_and_opt_outs() {
        let text = "\u{feff}Email,user_id,Tags,marketing_opt_out,first_name\n\
                    ada@example.com,u1,vip;news,yes,Ada\n\
                    ,u2,,,\n\
                    bo@example.com,u3,,maybe,Bo\n";
        let (records, errors, notes) = read_csv("users.csv", text.as_bytes()).unwrap();
        assert_eq!(notes.records, 3);
        assert_eq!(notes.ignored_columns, ["first_name"]);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].at, "users.csv line 2");
        assert_eq!(records[0].person.user.user_id, "u1");
        assert_eq!(records[0].person.user.email.as_deref(), Some("ada@example.com"));
        assert_eq!(records[0].person.user.tags, ["vip", "news"]);
        assert!(records[0].person.marketing_opt_out);
        assert_eq!(records[1].person.user, BatchUser { user_id: "u2".into(), ..BatchUser::default() });
        assert_eq!(
            errors,
            [RecordError {
                at: "users.csv line 4".into(),
                field: "marketing_opt_out".into(),
                detail: "not true or false (yes/no, 1/0 are taken too)".into()
            }]
        );
        let err = read_csv("x.csv", b"id,email\n1,a@example.com\n").unwrap_err().to_string();
        assert!(err.contains("no user_id column") && err.contains("found: id, email"), "{err}");
    }

    #[test]
    fn ndjson_lines_name_their_field() {
        let text = b"{\"user_id\":\"u1\",\"email\":\"ada@example.com\",\"marketing_opt_out\":true}\n\n\
                     {\"user_id\":\"u2\",\"phone\":5}\n\
                     not json\n\
                     {\"user_id\":\"u4\",\"fax\":\"1\"}\n";
        let (records, errors, notes) = read_ndjson("u.ndjson", text);
        assert_eq!(notes.records, 4);
        assert_eq!(records.len(), 1);
        assert!(records[0].person.marketing_opt_out);
        let fields: Vec<(&str, &str)> = errors.iter().map(|e| (e.at.as_str(), e.field.as_str())).collect();
        assert_eq!(fields, [("u.ndjson line 3", "phone"), ("u.ndjson line 4", "line"), ("u.ndjson line 5", "fax")]);
    }

    #[test]
    fn the_format_is_told_by_extension_then_content() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        assert_eq!(users_format(&write("a.CSV", "{")).unwrap(), UsersFormat::Csv);
        assert_eq!(users_format(&write("a.jsonl", "user_id")).unwrap(), UsersFormat::Ndjson);
        assert_eq!(users_format(&write("a.txt", "  \n{\"user_id\":\"u\"}")).unwrap(), UsersFormat::Ndjson);
        assert_eq!(users_format(&write("users", "user_id,email\n")).unwrap(), UsersFormat::Csv);
    }

    fn endpoint(json: serde_json::Value) -> Vec<u8> {
        json.to_string().into_bytes()
    }

    /// A person's endpoints fold into one user: the latest active address of each channel,
    /// every active device, an opt-out on any endpoint, the latest IANA zone.
    #[test]
    fn pinpoint_endpoints_fold_into_people() {
        use serde_json::json;
        let mut f = PinpointFolder::new(false);
        let lines = [
            json!({"Id": "e1", "ChannelType": "EMAIL", "Address": "old@example.com", "EndpointStatus": "ACTIVE", "OptOut": "NONE",
                   "EffectiveDate": "2025-01-01T00:00:00.000Z", "User": {"UserId": "u1"}, "Demographic": {"Timezone": "Europe/Berlin", "Locale": "de_DE"}}),
            json!({"Id": "e2", "ChannelType": "EMAIL", "Address": "ada@example.com", "EndpointStatus": "ACTIVE", "OptOut": "NONE",
                   "EffectiveDate": "2026-03-01T00:00:00.000Z", "User": {"UserId": "u1"}, "Demographic": {"Timezone": "America/New_York"}}),
            json!({"Id": "e3", "ChannelType": "EMAIL", "Address": "newest-but-inactive@example.com", "EndpointStatus": "INACTIVE",
                   "EffectiveDate": "2026-06-01T00:00:00.000Z", "User": {"UserId": "u1"}}),
            json!({"Id": "e4", "ChannelType": "SMS", "Address": "+1 415 555 0100", "EndpointStatus": "ACTIVE", "OptOut": "ALL",
                   "EffectiveDate": "2026-01-01T00:00:00.000Z", "User": {"UserId": "u1"}}),
            json!({"Id": "e5", "ChannelType": "APNS", "Address": "apns-token-1", "EndpointStatus": "ACTIVE", "User": {"UserId": "u1"},
                   "Demographic": {"Timezone": "GMT+8", "Platform": "ios"}}),
            json!({"Id": "e6", "ChannelType": "GCM", "Address": "fcm-token-1", "EndpointStatus": "ACTIVE", "User": {"UserId": "u2"}}),
            json!({"Id": "e7", "ChannelType": "SMS", "Address": "12345", "EndpointStatus": "ACTIVE", "User": {"UserId": "u2"}}),
            json!({"Id": "e8", "ChannelType": "VOICE", "Address": "+14155550100", "EndpointStatus": "ACTIVE", "User": {"UserId": "u2"}}),
            json!({"Id": "e9", "ChannelType": "EMAIL", "Address": "anon@example.com", "EndpointStatus": "ACTIVE"}),
        ];
        for (i, l) in lines.iter().enumerate() {
            f.line(format!("part-1.gz line {}", i + 1), &endpoint(l.clone()));
        }
        f.line("part-1.gz line 10".into(), b"{broken");
        let (records, errors, notes) = f.people();
        assert_eq!(records.len(), 2);
        let u1 = &records[0].person;
        assert_eq!(u1.user.user_id, "u1");
        assert_eq!(u1.user.email.as_deref(), Some("ada@example.com"), "the latest active one");
        assert_eq!(u1.user.phone.as_deref(), Some("+14155550100"), "in E.164");
        assert_eq!(u1.user.timezone.as_deref(), Some("America/New_York"), "the latest IANA zone");
        assert_eq!(u1.user.locale.as_deref(), Some("de_DE"));
        assert_eq!(u1.devices, [(Platform::Ios, "apns-token-1".to_owned())]);
        assert!(u1.marketing_opt_out, "opted out on its SMS endpoint");
        let u2 = &records[1].person;
        assert_eq!(u2.devices, [(Platform::Android, "fcm-token-1".to_owned())]);
        assert_eq!((u2.user.phone.as_ref(), u2.marketing_opt_out), (None, false));
        let at: Vec<(&str, &str)> = errors.iter().map(|e| (e.at.as_str(), e.field.as_str())).collect();
        assert_eq!(at, [("part-1.gz line 7 (endpoint e7)", "Address"), ("part-1.gz line 10", "line")]);
        assert_eq!(notes.records, 10);
        assert_eq!(notes.endpoints_without_user, Some(1));
        assert_eq!(notes.inactive_endpoints, Some(1));
        assert_eq!(notes.dropped_timezones, Some(1));
        assert_eq!(notes.skipped_channels, BTreeMap::from([("VOICE".to_owned(), 1)]));

        let mut f = PinpointFolder::new(true);
        f.line("x line 1".into(), &endpoint(lines[8].clone()));
        let (records, _, _) = f.people();
        assert_eq!(records[0].person.user.user_id, "e9");
    }
}
