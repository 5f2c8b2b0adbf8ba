//! What `sam build` leaves for each function of `template.yaml`: a bootstrap built for size
//! (`functions/.cargo/config.toml`: `opt-level = "z"`, fat LTO, one codegen unit; cargo-lambda
//! strips it), linking one crypto library, and unwinding on a panic, so that a panic in the
//! template engine fails that one render and not the worker every tenant shares
//! (`templates::run`; the workspace's profile names `panic = "unwind"` because cargo-lambda
//! would otherwise build with `panic = "abort"`), and position-dependent (no table of
//! relocations for the loader to apply at every start). docs/deploy.md, "The functions' size".

use std::path::PathBuf;

use crate::lambda::template;

/// Each function's ceiling: what the bootstrap measured (2026-12-06/07: `opt-level = "z"`,
/// position-dependent, each function wiring only its own clients and linking only its own lanes'
/// handlers or routes) and about 10%, never over the 8 MB (the tick, at 7.6 MB, has 5%;
/// the API's, about 7.6 MB since its commerce and message routes are functions of their own,
/// 5%; it was 11.3 MB with the `phonenumber` crate at run time and every shop route). A build
/// that lost the size profile is more than half again as large (`api` 39 MB, the rest 17-26 MB
/// before it); one that reached the whole engine again, 12-13 MB.
const CEILING_MB: [(&str, f64); 11] = [
    ("ApiFunction", 8.0),
    ("CommerceApiFunction", 7.6),
    ("MessagesApiFunction", 7.1),
    ("PublicApiFunction", 6.4),
    ("OrchestratorFunction", 7.7),
    ("ChannelWorkerFunction", 6.0),
    ("TickFunction", 8.0),
    ("RestockScanFunction", 5.3),
    ("OutboxRelayFunction", 5.5),
    ("WsConnectionsFunction", 5.7),
    ("ReconcileFunction", 4.9),
];

/// The size of each named section of a little-endian ELF64 file (arm64 and x86_64 alike).
fn section_sizes(elf: &[u8]) -> anyhow::Result<Vec<(String, u64)>> {
    let u16_at = |at: usize| -> anyhow::Result<u64> {
        let b = elf.get(at..at + 2).ok_or_else(|| anyhow::anyhow!("ELF cut short at {at}"))?;
        Ok(u64::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u32_at = |at: usize| -> anyhow::Result<u64> {
        let b = elf.get(at..at + 4).ok_or_else(|| anyhow::anyhow!("ELF cut short at {at}"))?;
        Ok(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    };
    let u64_at = |at: usize| -> anyhow::Result<u64> {
        let b = elf.get(at..at + 8).ok_or_else(|| anyhow::anyhow!("ELF cut short at {at}"))?;
        Ok(u64::from_le_bytes(b.try_into()?))
    };
    anyhow::ensure!(elf.starts_with(b"\x7fELF\x02\x01"), "not a little-endian ELF64 file");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28)? as usize, u16_at(0x3a)? as usize, u16_at(0x3c)? as usize, u16_at(0x3e)? as usize);
    let header = |i: usize| shoff + i * shentsize;
    let names = u64_at(header(shstrndx) + 0x18)? as usize;
    let mut out = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let name_at = names + u32_at(header(i))? as usize;
        let name = elf.get(name_at..).unwrap_or_default();
        let name = String::from_utf8_lossy(&name[..name.iter().position(|b| *b == 0).unwrap_or(0)]).into_owned();
        out.push((name, u64_at(header(i) + 0x20)?));
    }
    Ok(out)
}

pub fn the_bootstraps_are_built_for_size_and_unwind() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let decoded = template::decode()?;
    let resources = decoded["Resources"].as_object().ok_or_else(|| anyhow::anyhow!("template without Resources"))?;
    let functions: Vec<&String> =
        resources.iter().filter(|(_, r)| r["Type"] == "AWS::Serverless::Function").map(|(id, _)| id).collect();
    assert_eq!(functions.len(), CEILING_MB.len(), "a ceiling for each function of the template: {functions:?}");
    let mut report = Vec::new();
    for id in functions {
        let path = root.join(".aws-sam/build").join(id).join("bootstrap");
        let elf =
            std::fs::read(&path).map_err(|e| anyhow::anyhow!("{}: {e}: run `sam build` first", path.display()))?;
        let sections = section_sizes(&elf)?;
        let size = |name: &str| sections.iter().find(|(n, _)| n == name).map(|(_, s)| *s);
        let mb = elf.len() as f64 / 1e6;
        let ceiling = CEILING_MB.iter().find(|(f, _)| f == id).map(|(_, c)| *c);
        let ceiling = ceiling.ok_or_else(|| anyhow::anyhow!("no ceiling for {id}"))?;
        assert!(
            mb <= ceiling,
            "{id}: {mb:.1} MB, over its {ceiling} MB: was it built with functions/.cargo/config.toml?"
        );
        assert!(size(".symtab").is_none(), "{id}: not stripped");
        // Position-dependent (`ET_EXEC`, `-C relocation-model=static`): the pointers of the
        // constant tables written at link time, not relocated at each start (a
        // position-independent build of reconcile carries 0.9 MB of relocations, the tick 2.1).
        let kind = elf.get(0x10..0x12).map(|b| u16::from_le_bytes([b[0], b[1]]));
        assert_eq!(
            kind,
            Some(2),
            "{id}: not ET_EXEC: built without the relocation model of functions/.cargo/config.toml?"
        );
        let relocations = size(".rela.dyn").unwrap_or(0);
        assert!(relocations < 16_384, "{id}: {relocations} bytes of dynamic relocations");
        // Unwinding leaves the landing pads' table; `panic = "abort"` leaves a few KB of it.
        let pads = size(".gcc_except_table").unwrap_or(0);
        assert!(pads > 100_000, "{id}: {pads} bytes of landing pads: built with panic = \"abort\"?");
        // One crypto library: ring (rustls and the SDK's client), not aws-lc beside it.
        let aws_lc = elf.windows(6).any(|w| w == b"AWS-LC" || w == b"aws-lc");
        assert!(!aws_lc, "{id}: links aws-lc (a client crate's `default-https-client`?)");
        // Only the channel worker, wired with the providers (`AwsPorts::sending`), reaches code
        // that sends: the sends and the removal of a dead push token, known here by their log
        // lines, and the email and SMS providers' requests (SES's `SendEmail`, End User
        // Messaging's `SendTextMessage`, SNS's SMS attributes). Another function reaching them
        // would find no provider (`Unwired`) and fail those messages again and again. The API
        // registers push devices (`AwsPorts::registering`: SNS alone) and sends nothing.
        let has = |text: &str| elf.windows(text.len()).any(|w| w == text.as_bytes());
        let calls_providers = ["permanent failure; not retried", "invalid push token deleted"].map(has);
        let email_and_sms =
            ["SendEmailRequestSerializer", "SendTextMessageRequestSerializer", "AWS.SNS.SMS.SMSType"].map(has);
        if id == "ChannelWorkerFunction" {
            assert_eq!(calls_providers, [true, true], "{id}: the log lines are no longer in the binary");
            assert_eq!(email_and_sms, [true; 3], "{id}: the providers' requests are no longer in the binary");
        } else {
            // The API may remove a device the provider calls invalid; it sends nothing.
            let expected = [false, id == "ApiFunction" && calls_providers[1]];
            assert_eq!(calls_providers, expected, "{id} reaches a provider call but has no providers");
            assert_eq!(email_and_sms, [false; 3], "{id} links an email or SMS provider but sends nothing");
        }
        // Phone numbers are checked against tables written at build time with a small regex
        // engine (`people::phones`): no function links the `phonenumber` crate's run-time
        // metadata or the Unicode regex engine its patterns were compiled with (2 MB of the API),
        // known here by their source paths (panic locations).
        assert!(
            !has("/phonenumber-") && !has("/regex-syntax-"),
            "{id} links the phonenumber crate or the regex crate's parser (regex-syntax)"
        );
        // The console and the development hooks are `tidings serve`'s (`deployed_app`): no
        // function carries the console's charts or the hooks' routes.
        assert!(!has("uPlot") && !has("/dev/clock/advance"), "{id} links the console or the /dev routes");
        // The HTTP API's routes are split between four functions (`deployed_app`,
        // `commerce_app`, `messages_app`, `public_app`): each links only its own, known here by
        // a route of each.
        let routes = [
            has("/t/o/{token}"),
            has("/v1/admin/keys/{key_id}/rotate"),
            has("/v1/orders/{order_id}/pay"),
            has("/v1/templates/{template_id}/preview"),
        ];
        let expected = match id.as_str() {
            "PublicApiFunction" => [true, false, false, false],
            "ApiFunction" => [false, true, false, false],
            "CommerceApiFunction" => [false, false, true, false],
            "MessagesApiFunction" => [false, false, false, true],
            _ => [false; 4],
        };
        assert_eq!(routes, expected, "{id}: [the buyers', the shop's, the commerce, the message routes] linked");
        report.push(format!("{id} {mb:.1} MB (landing pads {} KB, relocations {relocations} B)", pads / 1000));
    }
    println!("bootstraps: {}", report.join(", "));
    Ok(())
}
