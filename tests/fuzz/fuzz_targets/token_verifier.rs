#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidings_fuzz::token_verifier(data));
