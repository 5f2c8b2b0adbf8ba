//! The cargo-fuzz targets (tests/fuzz) run without cargo-fuzz: each over its seeds, mutations of
//! them and random bytes, from a fixed seed, so CI exercises them on every run. A failure prints
//! the input; `cargo fuzz run` (tests/fuzz/README.md) searches much further.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fuzz/src/lib.rs"]
mod targets;

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inputs per target beyond the seeds.
const GENERATED: usize = 4000;

/// A number in `0..n` (0 when `n` is 0), from the run's seeded generator.
fn below(rng: &mut StdRng, n: usize) -> usize {
    rng.random_range(0..n.max(1))
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// Tokens JSON is made of, so mutations stay near the parsers' interesting paths.
const DICTIONARY: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "-1",
    "1e999",
    "0.5",
    "\"\\u0000\"",
    "\"a#b\"",
    "\"\"",
    "\"recipients\"",
    "\"user_ids\"",
    "\"segment\"",
    "\"Records\"",
    "\"dynamodb\"",
    "\"NewImage\"",
    "\"S\"",
    "\"N\"",
    "\"M\"",
    "\"L\"",
    "\"body\"",
    ".",
    "k1",
    "k2",
];

fn mutate(rng: &mut StdRng, seed: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..=below(rng, 4) {
        let at = below(rng, out.len() + 1);
        match below(rng, 6) {
            0 if !out.is_empty() => {
                let end = (at + 1 + below(rng, 16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            1 => out.splice(at..at, DICTIONARY[below(rng, DICTIONARY.len())].bytes()).for_each(drop),
            2 if at < out.len() => out[at] ^= 1 << below(rng, 8),
            3 => out.truncate(at),
            4 => {
                let other = &others[below(rng, others.len())];
                let from = below(rng, other.len() + 1);
                out.splice(at..at, other[from..].iter().copied().take(64)).for_each(drop);
            }
            _ => out.insert(at.min(out.len()), rng.random::<u8>()),
        }
    }
    out
}

fn exercise(target: &str, run: fn(&[u8])) {
    let seeds = seeds(target);
    let mut rng = StdRng::seed_from_u64(0x7469_6469_6e67_7321);
    let mut inputs = seeds.clone();
    for i in 0..GENERATED {
        inputs.push(if i % 4 == 3 {
            (0..below(&mut rng, 64)).map(|_| rng.random::<u8>()).collect()
        } else {
            let seed = &seeds[below(&mut rng, seeds.len())];
            mutate(&mut rng, seed, &seeds)
        });
    }
    for input in inputs {
        let outcome = std::panic::catch_unwind(|| run(&input));
        assert!(outcome.is_ok(), "{target} failed on input {:?}", String::from_utf8_lossy(&input));
    }
}

#[test]
fn request_parsers() {
    exercise("request_parsers", targets::request_parsers);
}

#[test]
fn lambda_events() {
    exercise("lambda_events", targets::lambda_events);
}

#[test]
fn token_verifier() {
    exercise("token_verifier", targets::token_verifier);
}
