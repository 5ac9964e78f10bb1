//! tests/copy_threads.rs with plain stores (`KALOS_COPY_NT=0`, the only path off x86_64) and
//! two copy threads.

mod batch_copy;

#[test]
fn large_batches_are_copied_in_parts_and_checked_with_plain_stores() {
    // SAFETY: set_var in the only test of this binary, before any thread reads the environment.
    unsafe {
        std::env::set_var("KALOS_COPY_THREADS", "2");
        std::env::set_var("KALOS_COPY_NT", "0");
    }
    batch_copy::large_batches_are_copied_in_parts_and_checked("copyplain", 2);
}
