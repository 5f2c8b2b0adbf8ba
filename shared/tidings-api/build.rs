//! Gzips the committed `openapi.json` (at the repository's root) into the build's output, for
//! `GET /openapi.json` to serve as it is kept (`src/routes/openapi.rs`). The server does not
//! build the document from the handlers' annotations at start: only `tidings openapi` does, and
//! writes that file; `the_committed_openapi_json_is_the_served_document` keeps the two equal.

use std::io::Write;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?);
    let source = manifest.join("../../openapi.json");
    println!("cargo::rerun-if-changed={}", source.display());
    let text = std::fs::read(&source).map_err(|e| format!("{}: {e}", source.display()))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&text)?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(out.join("openapi.json.gz"), gz.finish()?)?;
    Ok(())
}
