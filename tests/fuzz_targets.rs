//! The cargo-fuzz targets (tests/fuzz) run without cargo-fuzz: each over its seeds, mutations of
//! them and random bytes, from a fixed seed, so CI exercises them on every run. A failure prints
//! the input; `cargo fuzz run` (tests/fuzz/README.md) searches much further.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "fuzz/src/lib.rs"]
mod targets;

use std::path::PathBuf;

/// Inputs per target beyond the seeds.
const GENERATED: usize = 4000;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
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

fn mutate(rng: &mut Rng, seed: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            1 => out.splice(at..at, DICTIONARY[rng.below(DICTIONARY.len())].bytes()).for_each(drop),
            2 if at < out.len() => out[at] ^= 1 << rng.below(8),
            3 => out.truncate(at),
            4 => {
                let other = &others[rng.below(others.len())];
                let from = rng.below(other.len() + 1);
                out.splice(at..at, other[from..].iter().copied().take(64)).for_each(drop);
            }
            _ => out.insert(at.min(out.len()), rng.next() as u8),
        }
    }
    out
}

fn exercise(target: &str, run: fn(&[u8])) {
    let seeds = seeds(target);
    let mut rng = Rng(0x7469_6469_6e67_7321);
    let mut inputs = seeds.clone();
    for i in 0..GENERATED {
        inputs.push(if i % 4 == 3 {
            (0..rng.below(64)).map(|_| rng.next() as u8).collect()
        } else {
            let seed = &seeds[rng.below(seeds.len())];
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
