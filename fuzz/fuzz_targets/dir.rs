//! libFuzzer on the `dir` target of tests/fuzz.rs: each input is laid out as a data directory
//! under /dev/shm (removed at exit), opened and repaired.
#![no_main]
#![allow(dead_code)]

#[path = "../../tests/fuzz/mutate.rs"]
mod mutate;
#[path = "../../tests/fuzz/targets.rs"]
mod targets;

use std::sync::OnceLock;

static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

extern "C" fn cleanup() {
    if let Some(d) = DIR.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(|| {
        // SAFETY: registers a plain function to run at exit.
        unsafe { libc::atexit(cleanup) };
        targets::scratch_dir("libfuzzer-dir")
    });
    targets::check_dir(dir, data, &mut targets::DirStats::default());
});
