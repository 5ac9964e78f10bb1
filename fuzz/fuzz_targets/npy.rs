//! libFuzzer on the `npy` target of tests/fuzz.rs.
#![no_main]
#![allow(dead_code)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::check_npy(data));
