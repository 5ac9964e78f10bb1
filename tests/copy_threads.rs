//! A large batch's queries are checked and copied into the slot by several threads with
//! streaming stores (the default on x86_64). `KALOS_COPY_THREADS` is read once per process:
//! this file's only test sets it first, so the split runs even on a 2-core CI machine, where
//! the default would be one thread. tests/copy_plain.rs covers plain stores.

mod batch_copy;

#[test]
fn large_batches_are_copied_in_parts_and_checked() {
    // SAFETY: set_var in the only test of this binary, before any thread reads the environment.
    unsafe { std::env::set_var("KALOS_COPY_THREADS", "3") };
    batch_copy::large_batches_are_copied_in_parts_and_checked("copythreads", 3);
}
