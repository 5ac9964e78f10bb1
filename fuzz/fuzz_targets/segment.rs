//! libFuzzer on the `segment` target of tests/fuzz.rs: each input is written as a segment under
//! /dev/shm (removed at exit) and attached.
#![no_main]
#![allow(dead_code)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/targets.rs"]
mod targets;

use std::sync::OnceLock;

static SEG: OnceLock<targets::FakeSegment> = OnceLock::new();

extern "C" fn cleanup() {
    if let Some(s) = SEG.get() {
        s.remove();
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let seg = SEG.get_or_init(|| {
        // SAFETY: registers a plain function to run at exit.
        unsafe { libc::atexit(cleanup) };
        targets::FakeSegment::new("libfuzzer-seg")
    });
    targets::check_segment(seg, data);
});
