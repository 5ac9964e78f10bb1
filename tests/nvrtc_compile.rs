//! The kernel compile check at both ends of the supported NVRTC range, on a machine without a
//! GPU: pip-installs `nvidia-cuda-nvrtc` (the oldest supported, pinned, and the newest) into
//! `target/nvrtc-<version>` and runs `kalosd doctor --compile` with that library first on
//! `LD_LIBRARY_PATH`. The doctor compiles the variants the engine can request, through the
//! engine's own option builder, so nothing here types an NVRTC option. The oldest NVRTC compiles
//! every variant for sm_90 (the H200's architecture, where the oldest NVRTC runs) and the quick
//! set (`--quick`: the smallest and the largest dimension class of each module, dtype and metric)
//! for sm_80; the newest compiles the quick set for sm_90, which catches a source the newest
//! compiler refuses in a third of the time.
//!
//! Skips (passes with a SKIP line) only when pip cannot install the wheel, unless
//! `KALOS_REQUIRE_NVRTC=1` (CI sets it), where that is a failure. Any compile error fails.
//! Run alone: `cargo test --release --test nvrtc_compile -- --nocapture`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The oldest NVRTC the kernels support: the H200 machine's own (CUDA 13.0).
const OLDEST: &str = "13.0.48";

#[test]
fn kernels_compile_with_the_oldest_supported_nvrtc() {
    check(Some(OLDEST), &["--arch", "sm_90"]);
}

#[test]
fn kernels_compile_for_sm80_with_the_oldest_supported_nvrtc() {
    check(Some(OLDEST), &["--quick", "--arch", "sm_80"]);
}

#[test]
fn kernels_compile_with_the_newest_nvrtc() {
    check(None, &["--quick", "--arch", "sm_90"]);
}

fn check(version: Option<&str>, extra: &[&str]) {
    let Some(lib) = install(version) else { return };
    let kalosd = env!("CARGO_BIN_EXE_kalosd");
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let out = Command::new(kalosd)
        .args(["doctor", "--compile"])
        .args(extra)
        .env("LD_LIBRARY_PATH", ld)
        .output()
        .expect("run kalosd doctor --compile");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "kalosd doctor --compile failed (NVRTC {}):\n{text}", version.unwrap_or("newest"));
    // The doctor ran the NVRTC that was asked for, from where it was installed.
    let want = version.map(|v| v.split('.').take(2).collect::<Vec<_>>().join("."));
    let line = text.lines().find(|l| l.starts_with("nvrtc:")).expect("the doctor's nvrtc line");
    assert!(line.contains(&lib.display().to_string()), "NVRTC loaded from elsewhere: {line}");
    if let Some(w) = want {
        assert!(line.contains(&format!(" {w} from")), "expected NVRTC {w}: {line}");
    }
    assert!(text.contains("(0 failed)"), "{text}");
}

/// Installs the wheel (once; the tests run on parallel threads, two of them want the same
/// wheel) and returns the folder holding libnvrtc.so.13, or None to skip.
fn install(version: Option<&str>) -> Option<PathBuf> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join(format!("nvrtc-{}", version.unwrap_or("newest")));
    let lib = root.join("nvidia").join("cu13").join("lib");
    if lib.join("libnvrtc.so.13").exists() {
        return Some(lib);
    }
    let spec = match version {
        Some(v) => format!("nvidia-cuda-nvrtc=={v}"),
        None => "nvidia-cuda-nvrtc".to_string(),
    };
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let r = Command::new(&py).args(["-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target"]).arg(&root).arg(&spec).output();
    let err = match r {
        Ok(o) if o.status.success() && lib.join("libnvrtc.so.13").exists() => return Some(lib),
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => e.to_string(),
    };
    assert!(std::env::var("KALOS_REQUIRE_NVRTC").as_deref() != Ok("1"), "could not pip-install {spec} and KALOS_REQUIRE_NVRTC=1:\n{err}");
    eprintln!("SKIP: could not pip-install {spec}:\n{err}");
    None
}
