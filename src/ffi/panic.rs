//! Panic boundary and the thread-local last-error message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::abi::kalos_status;
use crate::error::{Error, Result, Status};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(e: &Error) {
    let msg = format!("{}: {}", e.status.name(), e.message).replace('\0', " ");
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::new(msg).unwrap_or_default());
}

fn clear_last_error() {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        if !l.as_bytes().is_empty() {
            *l = CString::default();
        }
    });
}

/// Runs an exported body: converts errors to status codes (recording the message) and a panic
/// to `KALOS_PANIC`. Requires `panic = "unwind"` (set in Cargo.toml).
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> kalos_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            clear_last_error();
            0
        }
        Ok(Err(e)) => {
            set_last_error(&e);
            e.status as kalos_status
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&Error::new(Status::Panic, format!("internal panic: {what}")));
            Status::Panic as kalos_status
        }
    }
}

/// The message of the last failed call on this thread ("" after a success). The pointer stays
/// valid until the next Kalos call on the same thread; copy it to keep it. Never free it.
#[no_mangle]
pub extern "C" fn kalos_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
