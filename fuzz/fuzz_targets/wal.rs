//! libFuzzer on the `wal` target of tests/fuzz.rs. After libFuzzer's own mutation the file's
//! checksums are recomputed (as the stable harness does), so mutations reach the parser behind
//! them; not when the top bit of the first byte (the metric's) is set, so that bad checksums
//! stay reachable.
#![no_main]
#![allow(dead_code)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::check_wal(data));

libfuzzer_sys::fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, _seed: u32| {
    let n = libfuzzer_sys::fuzzer_mutate(data, size, max_size);
    if n > 3 && data[0] & 0x80 == 0 {
        mutate::reseal(&mut data[3..n], kalos::persist::HEADER_BYTES);
    }
    n
});
