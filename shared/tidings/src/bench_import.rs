//! `tidings bench import --users N`: N users imported on the embedded backend (a fresh SQLite
//! file in a temporary directory), from a CSV file and from an Amazon Pinpoint endpoint export
//! (gzip files of endpoint JSON: an email endpoint each, a phone for half, a push device for
//! two in five, opt-outs, inactive duplicates), each through `tidings import`'s own code, then
//! each again (which must write nothing). Prints the figures as JSON (docs/people.md,
//! "Importing users").

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::json;
use tidings_core::TenantId;
use tidings_core::ports::SystemClock;

use crate::backend::Backend;
use crate::import::{self, Summary};
use crate::{BackendArgs, BackendKind};

#[derive(clap::Args, Clone, Debug)]
pub struct ImportArgs {
    /// Users in each source.
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    /// Where to put the sources and the database (default: a temporary directory, removed
    /// afterwards).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

const ZONES: [&str; 5] = ["Asia/Shanghai", "America/New_York", "Europe/Berlin", "America/Los_Angeles", "Asia/Tokyo"];
const LOCALES: [&str; 3] = ["en", "zh-CN", "de"];
/// Files the export is split into (Pinpoint writes several).
const EXPORT_FILES: u64 = 4;

fn user_id(i: u64) -> String {
    format!("b{i:08}")
}

/// A valid mobile number per user (China's 138 range: 11 digits).
fn phone(i: u64) -> String {
    format!("+86138{:08}", i % 100_000_000)
}

/// `users.csv`: every user with an email, half with a phone, a locale, a zone, two tags.
fn write_csv(path: &Path, users: u64) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "user_id,email,phone,locale,timezone,tags,marketing_opt_out")?;
    for i in 0..users {
        let phone = if i % 2 == 0 { phone(i) } else { String::new() };
        let opt_out = if i % 20 == 0 { "true" } else { "" };
        writeln!(
            out,
            "{},b{i}@example.com,{phone},{},{},news;g{},{opt_out}",
            user_id(i),
            LOCALES[(i % 3) as usize],
            ZONES[(i % 5) as usize],
            i % 10
        )?;
    }
    out.flush()?;
    Ok(())
}

/// A Pinpoint export of the same people: `EXPORT_FILES` gzip files, endpoints dealt round-robin.
fn write_export(dir: &Path, users: u64) -> anyhow::Result<u64> {
    use flate2::Compression;
    use flate2::write::GzEncoder;
    std::fs::create_dir_all(dir)?;
    let mut files = (0..EXPORT_FILES)
        .map(|n| {
            let f = std::fs::File::create(dir.join(format!("{n}.gz")))?;
            Ok(GzEncoder::new(std::io::BufWriter::new(f), Compression::fast()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut endpoints = 0u64;
    for i in 0..users {
        let demographic =
            json!({"Timezone": ZONES[(i % 5) as usize], "Locale": LOCALES[(i % 3) as usize], "Platform": "ios"});
        let user = json!({"UserId": user_id(i), "UserAttributes": {"FirstName": ["B"]}});
        let mut own = vec![json!({
            "ChannelType": "EMAIL", "Address": format!("b{i}@example.com"), "EndpointStatus": "ACTIVE",
            "OptOut": if i % 20 == 0 { "ALL" } else { "NONE" }, "EffectiveDate": "2026-09-01T10:00:00.000Z",
            "CohortId": (i % 100).to_string(), "Demographic": demographic, "User": user,
        })];
        if i % 2 == 0 {
            own.push(json!({"ChannelType": "SMS", "Address": phone(i), "EndpointStatus": "ACTIVE", "OptOut": "NONE",
                "EffectiveDate": "2026-09-01T10:00:00.000Z", "User": user}));
        }
        match i % 5 {
            0 => own.push(json!({"ChannelType": "APNS", "Address": format!("{:064x}", i), "EndpointStatus": "ACTIVE",
                "OptOut": "NONE", "EffectiveDate": "2026-09-01T10:00:00.000Z", "User": user})),
            1 => own.push(json!({"ChannelType": "GCM", "Address": format!("fcm:{i:012}"), "EndpointStatus": "ACTIVE",
                "OptOut": "NONE", "EffectiveDate": "2026-09-01T10:00:00.000Z", "User": user})),
            _ => {}
        }
        if i % 50 == 0 {
            own.push(
                json!({"ChannelType": "EMAIL", "Address": format!("old-b{i}@example.com"), "EndpointStatus": "INACTIVE",
                "OptOut": "NONE", "EffectiveDate": "2024-01-01T00:00:00.000Z", "User": user}),
            );
        }
        for (n, mut e) in own.into_iter().enumerate() {
            e["Id"] = json!(format!("ep-{i}-{n}"));
            e["ApplicationId"] = json!("611e3e3cdd47474c9c1399a505665b91");
            let file = &mut files[(endpoints % EXPORT_FILES) as usize];
            serde_json::to_writer(&mut *file, &e)?;
            file.write_all(b"\n")?;
            endpoints += 1;
        }
    }
    for f in files {
        f.finish()?.flush()?;
    }
    Ok(endpoints)
}

fn figures(s: &Summary) -> serde_json::Value {
    let mut out = json!({
        "seconds": s.seconds,
        "users_per_s": (s.counts.users as f64 / s.seconds.max(0.001)).round(),
        "errors": s.errors_total,
    });
    if let (Some(out), Ok(serde_json::Value::Object(counts))) = (out.as_object_mut(), serde_json::to_value(s.counts)) {
        out.extend(counts);
    }
    out
}

/// What every run must show: all users in, no errors; a re-run writes nothing.
fn check(what: &str, first: &Summary, again: &Summary, users: u64) -> anyhow::Result<()> {
    let users = users as usize;
    if first.counts.users != users || first.errors_total != 0 || first.counts.users_unchanged != 0 {
        anyhow::bail!(
            "{what}: {} users of {users} imported, {} unchanged, {} errors: {:?}",
            first.counts.users,
            first.counts.users_unchanged,
            first.errors_total,
            first.errors.first()
        );
    }
    let wrote_again = again.counts.written();
    if again.counts.users != users || wrote_again != 0 {
        anyhow::bail!("{what}: the re-run wrote {wrote_again} things (it must write nothing)");
    }
    Ok(())
}

pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = args.data_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv = dir.join("users.csv");
    let export = dir.join("pinpoint-export");
    let generating = crate::progress::Progress::spinner("generate");
    write_csv(&csv, args.users)?;
    generating.step(format!("{} ({} users)", csv.display(), args.users));
    let endpoints = write_export(&export, args.users)?;
    generating.step(format!("{} ({endpoints} endpoints in {EXPORT_FILES} gzip files)", export.display()));
    generating.finish(format!("sources written in {:.1} s", generating.elapsed_s()));

    let backend_args = BackendArgs {
        data_dir: dir.join("store"),
        backend: BackendKind::Embedded,
        bootstrap: true,
        data_dir_from: None,
    };
    let backend = Backend::open(&backend_args, Arc::new(SystemClock)).await?;
    let deps = &backend.deps;

    let t = TenantId::parse("bench-csv")?;
    let csv_first = import::import_users_file(deps, &t, &csv).await?;
    let csv_again = import::import_users_file(deps, &t, &csv).await?;
    check("csv", &csv_first, &csv_again, args.users)?;

    let t = TenantId::parse("bench-pinpoint")?;
    let pp_first = import::import_pinpoint(deps, &t, &export, false).await?;
    let pp_again = import::import_pinpoint(deps, &t, &export, false).await?;
    check("pinpoint", &pp_first, &pp_again, args.users)?;

    let report = json!({
        "users": args.users,
        "backend": "embedded",
        "csv": {"import": figures(&csv_first), "again": figures(&csv_again)},
        "pinpoint": {"endpoints": endpoints, "files": EXPORT_FILES, "import": figures(&pp_first), "again": figures(&pp_again)},
        "peak_rss_mib": crate::bench::peak_rss_mib(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
