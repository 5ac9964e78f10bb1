//! Shared (cross-process) futex wait and wake on a 32-bit word in a shared mapping.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Waits while `*word == expected`, for at most `timeout`. Returns on a wake, a value change,
/// a signal (EINTR) or the timeout; callers re-check their condition and their deadline, so a
/// spurious return is harmless.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `word` is a valid, aligned 32-bit atomic for the duration of the call (it lives in
    // a mapping the caller keeps alive); FUTEX_WAIT (without PRIVATE) works across processes on
    // shared mappings; the timespec is a valid relative timeout on our stack.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes up to `n` waiters on `word`.
pub fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: as in `wait`; FUTEX_WAKE only reads the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
