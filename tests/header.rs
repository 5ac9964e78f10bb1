//! Fails when include/kalos.h drifts from src/ffi. Regenerate with
//! `KALOS_BLESS=1 cargo test --test header`.

#[test]
fn header_matches_code() {
    let root = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{root}/cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new().with_crate(root).with_config(config).generate().expect("cbindgen generate");
    let mut out = Vec::new();
    bindings.write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = format!("{root}/include/kalos.h");
    if std::env::var("KALOS_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kalos.h is out of date with src/ffi; run `KALOS_BLESS=1 cargo test --test header` and commit it"
    );
}

#[test]
fn status_constants_match_rust_enum() {
    use kalos::ffi::kalos_status_code::*;
    use kalos::ffi::kalos_status_str;
    let consts = [
        KALOS_OK,
        KALOS_INVALID_ARGUMENT,
        KALOS_NULL_POINTER,
        KALOS_DIMENSION_MISMATCH,
        KALOS_K_OUT_OF_RANGE,
        KALOS_NON_FINITE,
        KALOS_INVALID_NAME,
        KALOS_STORE_FULL,
        KALOS_VERSION_MISMATCH,
        KALOS_NOT_FOUND,
        KALOS_ALREADY_EXISTS,
        KALOS_TIMEOUT,
        KALOS_SERVER_GONE,
        KALOS_BUFFER_TOO_SMALL,
        KALOS_PAYLOAD_TOO_LARGE,
        KALOS_CORRUPT,
        KALOS_IO,
        KALOS_LOCKED,
        KALOS_BACKEND_UNAVAILABLE,
        KALOS_CUDA,
        KALOS_PERMISSION_DENIED,
        KALOS_TOO_LARGE,
        KALOS_CLOSED,
        KALOS_PANIC,
        KALOS_INTERNAL,
        KALOS_UNAVAILABLE,
        KALOS_STALE,
    ];
    for (i, s) in kalos::Status::ALL.iter().enumerate() {
        assert_eq!(consts[i] as i32, *s as i32, "constant for {}", s.name());
        // SAFETY: kalos_status_str returns a static NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(kalos_status_str(*s as i32)) }.to_str().unwrap();
        assert_eq!(name, s.name());
    }
}
