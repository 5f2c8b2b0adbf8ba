#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tidings_fuzz::lambda_events(data));
