//! The exported functions of the C ABI. Every body runs inside `guard` (a Rust panic becomes
//! `KALOS_PANIC`) and reads its pointer arguments through the checked helpers below.

use std::cell::UnsafeCell;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use super::abi::*;
use super::panic::{guard, set_last_error};
use crate::client::{Kalos, ListOptions, Namespaces, RecallOptions, UpsertOptions};
use crate::error::{Error, Result, Status};
use crate::store::NEVER;
use crate::types::{check_k, Recency, MAX_FILTER_NAMESPACES};

/// `s` as a NUL-terminated C string cut to fit `N` bytes.
fn c_text<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (d, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    out
}

fn null(what: &str) -> Error {
    Error::new(Status::NullPointer, format!("{what} is NULL"))
}

fn misaligned<T>(what: &str) -> Error {
    Error::new(
        Status::InvalidArgument,
        format!("{what} is not aligned to {} bytes (its element type's alignment)", std::mem::align_of::<T>()),
    )
}

/// Borrows a caller slice; NULL is allowed only for an empty slice. A pointer not aligned for
/// `T` is INVALID_ARGUMENT.
///
/// # Safety
/// `p` must point to `len` valid elements (or be NULL with len 0) for the duration of the call.
unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if p.is_null() {
        if len == 0 {
            return Ok(&[]);
        }
        return Err(null(what));
    }
    if !p.is_aligned() {
        return Err(misaligned::<T>(what));
    }
    // SAFETY: the caller promises p points to len valid elements.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// # Safety
/// As `slice`, for a writable buffer that nothing else accesses during the call.
unsafe fn slice_mut<'a, T>(p: *mut T, len: usize, what: &str) -> Result<&'a mut [T]> {
    if p.is_null() {
        if len == 0 {
            return Ok(&mut []);
        }
        return Err(null(what));
    }
    if !p.is_aligned() {
        return Err(misaligned::<T>(what));
    }
    // SAFETY: the caller promises p points to len writable elements, unaliased during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// An optional caller array: None when `p` is NULL and `len` 0 (absent), else as `slice`.
///
/// # Safety
/// As `slice`.
unsafe fn opt_slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<Option<&'a [T]>> {
    if p.is_null() && len == 0 {
        return Ok(None);
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { slice(p, len, what) }.map(Some)
}

/// Packs payloads back to back into `buf` and writes each length (or `KALOS_NO_PAYLOAD`) to
/// `lens`. The caller has checked that `buf` holds their total and `lens` one entry each.
fn pack_payloads<'a>(payloads: impl Iterator<Item = Option<&'a [u8]>>, buf: &mut [u8], lens: &mut [u32]) {
    let mut off = 0;
    for (len, p) in lens.iter_mut().zip(payloads) {
        match p {
            None => *len = KALOS_NO_PAYLOAD,
            Some(p) => {
                buf[off..off + p.len()].copy_from_slice(p);
                off += p.len();
                *len = p.len() as u32;
            }
        }
    }
}

/// # Safety
/// `h` must be NULL or a live handle from `kalos_open`.
unsafe fn handle<'a>(h: *const kalos_handle) -> Result<&'a Kalos> {
    if h.is_null() {
        return Err(null("handle"));
    }
    // SAFETY: the caller promises h came from kalos_open; closed handles are never freed (only
    // emptied), so reading the magic and the store is valid after a close too, and no close runs
    // concurrently with this call (the API's contract).
    let hd = unsafe { &*h };
    if hd.magic.load(Ordering::Acquire) != HANDLE_LIVE {
        return Err(Error::new(Status::Closed, "the handle was closed (kalos_close) or is not a Kalos handle"));
    }
    // SAFETY: see above: no close writes `inner` while a call runs.
    match unsafe { &*hd.inner.get() } {
        Some(k) => Ok(k),
        None => Err(Error::new(Status::Closed, "the handle was closed (kalos_close)")),
    }
}

/// Opens the store `name` (1-200 chars of `[A-Za-z0-9._-]`) in the role `opts->role` and
/// writes a new handle to `*out`.
///
/// - `opts` may be NULL for the defaults (role auto; creating then fails without `dim`).
/// - The caller owns `*out` and must release it with `kalos_close`.
/// - Role server/auto (when it becomes the server) starts the server thread in this process;
///   closing that handle stops the server and other clients get `KALOS_SERVER_GONE`.
///
/// # Safety
/// `name` must be a NUL-terminated string; `opts` NULL or initialised by `kalos_options_init`;
/// `out` a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn kalos_open(name: *const c_char, opts: *const kalos_options, out: *mut *mut kalos_handle) -> kalos_status {
    guard(|| {
        if name.is_null() {
            return Err(null("name"));
        }
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: name is non-NULL and NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) }.to_str().map_err(|_| Error::new(Status::InvalidName, "store name is not UTF-8"))?;
        // SAFETY: opts is NULL or initialised per the contract.
        let o = unsafe { read_options(opts) }?;
        let k = Kalos::open(name, &o)?;
        let h = Box::into_raw(Box::new(kalos_handle { magic: AtomicU64::new(HANDLE_LIVE), inner: UnsafeCell::new(Some(Box::new(k))) }));
        // SAFETY: out is non-NULL and writable.
        unsafe { *out = h };
        Ok(())
    })
}

/// Closes a handle and releases the store it holds. For the handle that runs the server, stops
/// the server thread and removes the store's name. NULL is a no-op, and so is a second close of
/// the same handle: a closed handle keeps 16 bytes (never freed) so that a second close, or any
/// other call on it (which returns `KALOS_CLOSED`), is detected instead of touching freed memory.
/// No other thread may be inside a call on the handle while it is closed.
///
/// # Safety
/// `h` must be NULL or a handle from `kalos_open` (closed or not).
#[no_mangle]
pub unsafe extern "C" fn kalos_close(h: *mut kalos_handle) {
    if h.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: h came from Box::into_raw in kalos_open and is never freed (contract).
        let hd = unsafe { &*h };
        if hd.magic.compare_exchange(HANDLE_LIVE, HANDLE_CLOSED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        // SAFETY: this thread won the close; no call runs on the handle meanwhile (contract).
        if let Some(k) = unsafe { (*hd.inner.get()).take() } {
            k.close();
        }
    }));
}

/// # Safety
/// `p` NULL or a valid `kalos_recall_params` of at least its `struct_size`.
unsafe fn read_recall_params(p: *const kalos_recall_params) -> Result<RecallOptions> {
    let mut o = RecallOptions::default();
    if p.is_null() {
        return Ok(o);
    }
    // SAFETY: non-NULL, valid per contract.
    let p = unsafe { &*p };
    // Callers built before the filter fields pass the shorter struct: they get no filter.
    let size = p.struct_size as usize;
    if size < std::mem::offset_of!(kalos_recall_params, filter) {
        return Err(Error::new(Status::InvalidArgument, "recall params struct_size too small; call kalos_recall_params_init"));
    }
    let has = |end: usize| size >= end;
    if has(std::mem::offset_of!(kalos_recall_params, consistency)) {
        // SAFETY: caller promises filter_len readable bytes.
        if let Some(f) = unsafe { opt_slice(p.filter, p.filter_len, "params.filter") }? {
            crate::filter::Expr::decode(f)?;
            o.filter = Some(f.to_vec());
        }
    }
    // SAFETY: caller promises namespaces_len readable entries.
    if let Some(ns) = unsafe { opt_slice(p.namespaces, p.namespaces_len, "params.namespaces") }? {
        if ns.len() > MAX_FILTER_NAMESPACES {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("namespace filter has {} entries; at most {MAX_FILTER_NAMESPACES}", ns.len()),
            ));
        }
        o.namespaces = Some(ns.to_vec());
    }
    if p.recency_weight != 0.0 {
        o.recency = Some(Recency { weight: p.recency_weight, half_life_ms: p.recency_half_life_ms });
    }
    if p.timeout_ms > 0 {
        o.timeout_ms = Some(p.timeout_ms);
    }
    if has(std::mem::size_of::<kalos_recall_params>()) {
        set_consistency(&mut o, p.consistency)?;
        if !p.min_seqs.is_null() || p.min_seqs_len > 0 {
            // SAFETY: caller promises min_seqs_len readable entries.
            o.min_seqs = Some(unsafe { slice(p.min_seqs, p.min_seqs_len, "params.min_seqs") }?.to_vec());
        }
    }
    Ok(o)
}

/// Sets the cluster options of `KALOS_RECALL_*` flags (the C ABI's and the Java binding's
/// `consistency`); unknown flags are `InvalidArgument`.
pub(super) fn set_consistency(o: &mut RecallOptions, flags: u32) -> Result<()> {
    if flags & !(KALOS_RECALL_READ_YOUR_WRITES | KALOS_RECALL_ALLOW_STALE) != 0 {
        return Err(Error::new(Status::InvalidArgument, format!("unknown consistency flags {flags:#x}")));
    }
    o.read_your_writes = flags & KALOS_RECALL_READ_YOUR_WRITES != 0;
    o.allow_stale = flags & KALOS_RECALL_ALLOW_STALE != 0;
    Ok(())
}

/// Recalls the top-`k` memories for one query of `query_len` (= dim) floats.
///
/// Writes up to `k` ids and scores (best first; ties by lower id) and the number written to
/// `*count` (`min(k, matching memories)`). `ids_len` and `scores_len` must be ≥ k.
/// `params` may be NULL. Scores: ip and cosine higher is better; l2 is the squared distance.
/// Thread-safe.
///
/// # Safety
/// `h` a live handle; `query` `query_len` readable floats; `ids`/`scores` writable for their
/// lengths; `count` writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall(
    h: *const kalos_handle,
    query: *const f32,
    query_len: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
    count: *mut usize,
) -> kalos_status {
    guard(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        // SAFETY: contract of this function (the same as recall_one's).
        let n = unsafe { recall_one(h, query, query_len, k, params, ids, ids_len, scores, scores_len) }?;
        // SAFETY: non-NULL, writable.
        unsafe { *count = n };
        Ok(())
    })
}

/// `kalos_recall`, also writing how far behind its log the answering replica was (cluster
/// mode, with `KALOS_RECALL_ALLOW_STALE` in `params->consistency`): `*lag_entries` log entries
/// known not applied and `*lag_ms` milliseconds since it last heard from the log (0 while
/// connected); both 0 outside cluster mode or without the flag. Outputs are written on success
/// only. Thread-safe.
///
/// # Safety
/// As `kalos_recall`; `lag_entries` and `lag_ms` writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_lag(
    h: *const kalos_handle,
    query: *const f32,
    query_len: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
    count: *mut usize,
    lag_entries: *mut u64,
    lag_ms: *mut u64,
) -> kalos_status {
    guard(|| {
        if count.is_null() || lag_entries.is_null() || lag_ms.is_null() {
            return Err(null(if count.is_null() {
                "count"
            } else if lag_entries.is_null() {
                "lag_entries"
            } else {
                "lag_ms"
            }));
        }
        // SAFETY: contract of this function (the same as recall_one's).
        let (n, lag) = unsafe { recall_one_lag(h, query, query_len, k, params, ids, ids_len, scores, scores_len) }?;
        let lag = lag.unwrap_or_default();
        // SAFETY: non-NULL, writable.
        unsafe {
            *count = n;
            *lag_entries = lag.entries;
            *lag_ms = lag.ms;
        }
        Ok(())
    })
}

/// Cluster mode: writes, per shard (index = shard), the log sequence of this handle's last
/// acknowledged write into `seqs` (0 = none) and the number of entries into `*count`; pass them
/// as `kalos_recall_params::min_seqs` to read these writes through another host. `*count` is 0
/// outside cluster mode and before the first write. `KALOS_BUFFER_TOO_SMALL` when `seqs_len`
/// is below the count (`*count` then holds the count needed). Thread-safe.
///
/// # Safety
/// `h` a live handle; `seqs` writable for `seqs_len` entries (NULL allowed when `seqs_len` is
/// 0); `count` writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_last_write_seqs(h: *const kalos_handle, seqs: *mut u64, seqs_len: usize, count: *mut usize) -> kalos_status {
    guard(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        let s = h.write_seqs();
        if s.len() > seqs_len {
            // SAFETY: non-NULL, writable.
            unsafe { *count = s.len() };
            return Err(Error::new(Status::BufferTooSmall, format!("{} sequence entries; seqs_len is {seqs_len}", s.len())));
        }
        if !s.is_empty() {
            // SAFETY: contract of this function: seqs_len >= s.len() writable entries.
            let out = unsafe { slice_mut(seqs, seqs_len, "seqs") }?;
            out[..s.len()].copy_from_slice(&s);
        }
        // SAFETY: non-NULL, writable.
        unsafe { *count = s.len() };
        Ok(())
    })
}

/// `kalos_recall` for the arguments in `args` (see `kalos_recall_args`): the same checks,
/// results and errors, and the hit count in `args->count` (written on success only). Thread-safe for
/// distinct `args` structs; one struct must not be used by two calls at once.
///
/// # Safety
/// `args` NULL (the call returns `KALOS_NULL_POINTER`) or a writable `kalos_recall_args` of at
/// least its `struct_size` bytes whose fields satisfy `kalos_recall`'s contract.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_with(args: *mut kalos_recall_args) -> kalos_status {
    guard(|| {
        if args.is_null() {
            return Err(null("args"));
        }
        // SAFETY: non-NULL, writable, at least struct_size bytes per the contract; only fields
        // inside the size checked below are touched.
        let a = unsafe { &mut *args };
        if (a.struct_size as usize) < std::mem::size_of::<kalos_recall_args>() {
            return Err(Error::new(Status::InvalidArgument, "recall args struct_size too small; call kalos_recall_args_init"));
        }
        // SAFETY: the fields carry kalos_recall's contract (this function's).
        a.count = unsafe { recall_one(a.handle, a.query, a.query_len, a.k, a.params, a.ids, a.ids_len, a.scores, a.scores_len) }?;
        Ok(())
    })
}

/// Fills `args` with zeros and NULLs, `k` = 10, and sets `struct_size`. Pass
/// `sizeof(struct kalos_recall_args)` as `size`; at most `size` bytes are written (see
/// `kalos_options_init`). NULL, or `size` below 4, is a no-op. Thread-safe.
///
/// # Safety
/// `args` must be NULL or point to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_args_init(args: *mut kalos_recall_args, size: usize) {
    let a = kalos_recall_args {
        struct_size: std::mem::size_of::<kalos_recall_args>() as u32,
        k: 10,
        handle: std::ptr::null(),
        query: std::ptr::null(),
        query_len: 0,
        params: std::ptr::null(),
        ids: std::ptr::null_mut(),
        ids_len: 0,
        scores: std::ptr::null_mut(),
        scores_len: 0,
        count: 0,
    };
    // SAFETY: the caller's contract, passed on.
    unsafe { super::abi::write_prefix(args, a, size) };
}

/// One recall for `kalos_recall` and `kalos_recall_with`; returns the hit count.
///
/// # Safety
/// As `recall_one_lag`.
#[allow(clippy::too_many_arguments)]
unsafe fn recall_one(
    h: *const kalos_handle,
    query: *const f32,
    query_len: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
) -> Result<usize> {
    // SAFETY: contract of this function.
    unsafe { recall_one_lag(h, query, query_len, k, params, ids, ids_len, scores, scores_len) }.map(|(n, _)| n)
}

/// One recall; returns the hit count and, for a stale-read recall, the replica's lag.
///
/// # Safety
/// `h` a live handle; `query` `query_len` readable floats; `params` NULL or valid;
/// `ids`/`scores` writable for their lengths (NULL is reported as an error).
#[allow(clippy::too_many_arguments)]
unsafe fn recall_one_lag(
    h: *const kalos_handle,
    query: *const f32,
    query_len: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
) -> Result<(usize, Option<crate::client::Lag>)> {
    // SAFETY: contract of this function.
    let h = unsafe { handle(h) }?;
    // SAFETY: contract of this function.
    let q = unsafe { slice(query, query_len, "query") }?;
    // SAFETY: contract of this function.
    let o = unsafe { read_recall_params(params) }?;
    check_k(k as usize)?;
    if ids_len < k as usize || scores_len < k as usize {
        return Err(Error::new(Status::BufferTooSmall, format!("ids_len {ids_len} and scores_len {scores_len} must be at least k = {k}")));
    }
    // SAFETY: contract of this function.
    let ids = unsafe { slice_mut(ids, ids_len, "ids") }?;
    // SAFETY: contract of this function.
    let scores = unsafe { slice_mut(scores, scores_len, "scores") }?;
    h.recall_lag(q, k as usize, &o, ids, scores)
}

/// Recalls the top-`k` for each of `nq` queries (`queries_len` = nq × dim floats, row-major).
///
/// Query i's hits are at `ids[i*k ..]`/`scores[i*k ..]` and its hit count at `counts[i]`;
/// `ids_len`, `scores_len` ≥ nq × k and `counts_len` ≥ nq. The server runs concurrent queries
/// as one batch. Thread-safe. The queries are checked finite while they are copied into the
/// request slot; a request of 1 MiB or more is copied by up to 8 threads that the call spawns
/// and joins before it returns (at most half the CPUs; `KALOS_COPY_THREADS=1` keeps the copy on
/// the calling thread), with streaming stores on x86_64 (`KALOS_COPY_NT=0` turns them off).
///
/// # Safety
/// As `kalos_recall`, with the batch sizes above.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_batch(
    h: *const kalos_handle,
    queries: *const f32,
    queries_len: usize,
    nq: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
    counts: *mut usize,
    counts_len: usize,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let q = unsafe { slice(queries, queries_len, "queries") }?;
        // SAFETY: contract of this function.
        let o = unsafe { read_recall_params(params) }?;
        check_k(k as usize)?;
        let need = nq.saturating_mul(k as usize);
        if ids_len < need || scores_len < need || counts_len < nq {
            return Err(Error::new(
                Status::BufferTooSmall,
                format!("need ids/scores of {need} and counts of {nq}; got {ids_len}/{scores_len}/{counts_len}"),
            ));
        }
        // SAFETY: contract of this function.
        let ids = unsafe { slice_mut(ids, ids_len, "ids") }?;
        // SAFETY: contract of this function.
        let scores = unsafe { slice_mut(scores, scores_len, "scores") }?;
        // SAFETY: contract of this function.
        let counts = unsafe { slice_mut(counts, counts_len, "counts") }?;
        h.recall_batch_into(q, nq, k as usize, &o, ids, scores, counts)
    })
}

/// Like `kalos_recall`, and also returns each hit's payload.
///
/// Payloads are packed back to back into `payload_buf`; `payload_lens[i]` is hit i's length or
/// `KALOS_NO_PAYLOAD`. `payload_lens_len` must be ≥ k. If `payload_buf_len` is too small the call
/// returns `KALOS_BUFFER_TOO_SMALL` and writes the needed size to `*payload_needed` (if not NULL);
/// on success `*payload_needed` gets the bytes used.
///
/// # Safety
/// As `kalos_recall`; `payload_buf` writable for `payload_buf_len` bytes (NULL if 0);
/// `payload_lens` writable for `payload_lens_len`; `payload_needed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_recall_payloads(
    h: *const kalos_handle,
    query: *const f32,
    query_len: usize,
    k: u32,
    params: *const kalos_recall_params,
    ids: *mut u64,
    ids_len: usize,
    scores: *mut f32,
    scores_len: usize,
    payload_buf: *mut u8,
    payload_buf_len: usize,
    payload_lens: *mut u32,
    payload_lens_len: usize,
    count: *mut usize,
    payload_needed: *mut usize,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let q = unsafe { slice(query, query_len, "query") }?;
        // SAFETY: contract of this function.
        let o = unsafe { read_recall_params(params) }?;
        if count.is_null() {
            return Err(null("count"));
        }
        check_k(k as usize)?;
        let k_ = k as usize;
        if ids_len < k_ || scores_len < k_ || payload_lens_len < k_ {
            return Err(Error::new(Status::BufferTooSmall, format!("ids_len, scores_len and payload_lens_len must be at least k = {k}")));
        }
        let hits = h.recall_with_payloads(q, k_, &o)?;
        let needed: usize = hits.iter().map(|x| x.payload.as_ref().map_or(0, |p| p.len())).sum();
        if !payload_needed.is_null() {
            // SAFETY: non-NULL, writable per contract.
            unsafe { *payload_needed = needed };
        }
        if needed > payload_buf_len {
            return Err(Error::new(Status::BufferTooSmall, format!("payloads need {needed} bytes; payload_buf_len is {payload_buf_len}")));
        }
        // SAFETY: contract of this function.
        let ids = unsafe { slice_mut(ids, ids_len, "ids") }?;
        // SAFETY: contract of this function.
        let scores = unsafe { slice_mut(scores, scores_len, "scores") }?;
        // SAFETY: contract of this function.
        let lens = unsafe { slice_mut(payload_lens, payload_lens_len, "payload_lens") }?;
        // SAFETY: contract of this function.
        let buf = unsafe { slice_mut(payload_buf, payload_buf_len, "payload_buf") }?;
        for (i, hit) in hits.iter().enumerate() {
            ids[i] = hit.id;
            scores[i] = hit.score;
        }
        pack_payloads(hits.iter().map(|h| h.payload.as_deref()), buf, lens);
        // SAFETY: non-NULL, writable.
        unsafe { *count = hits.len() };
        Ok(())
    })
}

/// Inserts or replaces `ids_len` memories. `vectors_len` must be ids_len × dim. A repeated id
/// within one call: the last occurrence wins. `params` may be NULL (namespace 0, no payload,
/// no expiry). Returns once the write is applied (and, with a data directory, durable per the
/// sync policy); every later recall from any process sees it. Thread-safe.
///
/// # Safety
/// `ids`, `vectors` readable for their lengths; `params` NULL or initialised, with its arrays
/// readable for their lengths.
#[no_mangle]
pub unsafe extern "C" fn kalos_upsert(
    h: *const kalos_handle,
    ids: *const u64,
    ids_len: usize,
    vectors: *const f32,
    vectors_len: usize,
    params: *const kalos_upsert_params,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let ids = unsafe { slice(ids, ids_len, "ids") }?;
        // SAFETY: contract of this function.
        let vectors = unsafe { slice(vectors, vectors_len, "vectors") }?;
        let mut o = UpsertOptions::default();
        let mut payload_storage: Vec<Option<&[u8]>> = Vec::new();
        let mut field_storage: Vec<Vec<crate::meta::Field>> = Vec::new();
        if !params.is_null() {
            // SAFETY: non-NULL, initialised per contract.
            let p = unsafe { &*params };
            let size = p.struct_size as usize;
            if size < std::mem::offset_of!(kalos_upsert_params, fields) {
                return Err(Error::new(Status::InvalidArgument, "upsert params struct_size too small; call kalos_upsert_params_init"));
            }
            if size >= std::mem::size_of::<kalos_upsert_params>() && (!p.fields.is_null() || p.fields_len > 0) {
                // SAFETY: contract of this function.
                let b = unsafe { slice(p.fields, p.fields_len, "params.fields") }?;
                field_storage = crate::meta::decode_fields_block(b, ids.len())?;
            }
            o.namespaces = if p.namespaces.is_null() {
                Namespaces::One(p.namespace_id)
            } else {
                // SAFETY: contract of this function.
                Namespaces::PerItem(unsafe { slice(p.namespaces, p.namespaces_len, "params.namespaces") }?)
            };
            if !p.payload_lens.is_null() {
                // SAFETY: contract of this function.
                let lens = unsafe { slice(p.payload_lens, p.payload_lens_len, "params.payload_lens") }?;
                // SAFETY: contract of this function.
                let data = unsafe { slice(p.payloads, p.payloads_len, "params.payloads") }?;
                if lens.len() != ids.len() {
                    return Err(Error::new(Status::InvalidArgument, format!("{} payload lengths for {} ids", lens.len(), ids.len())));
                }
                let mut off = 0usize;
                for &l in lens {
                    if l == KALOS_NO_PAYLOAD {
                        payload_storage.push(None);
                    } else {
                        let end = off.checked_add(l as usize).filter(|&e| e <= data.len()).ok_or_else(|| {
                            Error::new(Status::InvalidArgument, format!("payload lengths sum past payloads_len {}", data.len()))
                        })?;
                        payload_storage.push(Some(&data[off..end]));
                        off = end;
                    }
                }
                o.payloads = Some(payload_storage);
            }
            o.ttl_ms = p.ttl_ms;
            o.expires_ms = if p.expires_at_ms == 0 { NEVER } else { p.expires_at_ms };
            o.timeout_ms = if p.timeout_ms == 0 { None } else { Some(p.timeout_ms) };
        }
        if !field_storage.is_empty() {
            o.fields = Some(&field_storage);
        }
        h.upsert(ids, vectors, &o)
    })
}

/// Deletes `ids_len` ids, all or nothing: if any id is unknown nothing is deleted and the call
/// returns `KALOS_NOT_FOUND` naming it. Writes the number deleted to `*deleted` (may be NULL).
///
/// # Safety
/// `ids` readable for `ids_len`; `deleted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_delete(h: *const kalos_handle, ids: *const u64, ids_len: usize, deleted: *mut u64) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let ids = unsafe { slice(ids, ids_len, "ids") }?;
        let n = h.delete(ids)?;
        if !deleted.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *deleted = n };
        }
        Ok(())
    })
}

/// Deletes every memory in namespace `ns`; writes the count to `*deleted` (may be NULL).
///
/// # Safety
/// `deleted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_delete_namespace(h: *const kalos_handle, ns: u64, deleted: *mut u64) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        let n = h.delete_namespace(ns)?;
        if !deleted.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *deleted = n };
        }
        Ok(())
    })
}

/// Deletes every memory; writes the count to `*deleted` (may be NULL).
///
/// # Safety
/// `deleted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_clear(h: *const kalos_handle, deleted: *mut u64) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        let n = h.clear()?;
        if !deleted.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *deleted = n };
        }
        Ok(())
    })
}

/// Deletes every memory that matches the metadata filter expression `filter` (binary form,
/// docs/FORMATS.md) and, when `namespaces` is not NULL, lies in one of its `namespaces_len`
/// namespaces (at most 64). The server evaluates the filter, so the same memories are deleted
/// whichever process asks. Writes the number deleted to `*deleted` (may be NULL). A malformed
/// expression is `KALOS_INVALID_ARGUMENT` and deletes nothing. Thread-safe.
///
/// # Safety
/// `filter` readable for `filter_len` bytes (NULL gives `KALOS_NULL_POINTER`); `namespaces`
/// NULL or readable for `namespaces_len`; `deleted` NULL or writable. Nothing is kept after
/// the call.
#[no_mangle]
pub unsafe extern "C" fn kalos_delete_where(
    h: *const kalos_handle,
    namespaces: *const u64,
    namespaces_len: usize,
    filter: *const u8,
    filter_len: usize,
    deleted: *mut u64,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        if filter.is_null() {
            return Err(Error::new(Status::NullPointer, "filter is NULL"));
        }
        // SAFETY: contract of this function.
        let f = unsafe { slice(filter, filter_len, "filter") }?;
        let ns = if namespaces.is_null() {
            None
        } else {
            // SAFETY: contract of this function.
            Some(unsafe { slice(namespaces, namespaces_len, "namespaces") }?)
        };
        let n = h.delete_where(ns, f)?;
        if !deleted.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *deleted = n };
        }
        Ok(())
    })
}

/// Fetches the metadata fields of memories by id, each as `count u16 | (name, value)*`
/// (docs/FORMATS.md, "Metadata fields"), packed into `buf` with one length per id in `lens`.
/// `*needed` (may be NULL) gets the bytes needed, also when the call returns
/// `KALOS_BUFFER_TOO_SMALL`. An unknown id fails the call with `KALOS_NOT_FOUND` naming it.
/// Thread-safe.
///
/// # Safety
/// `ids` readable for `ids_len`; `buf` writable for `buf_len` (may be NULL when `buf_len` is
/// 0); `lens` writable for `lens_len` (≥ `ids_len`); `needed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_get_fields(
    h: *const kalos_handle,
    ids: *const u64,
    ids_len: usize,
    buf: *mut u8,
    buf_len: usize,
    lens: *mut u32,
    lens_len: usize,
    needed: *mut usize,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let ids = unsafe { slice(ids, ids_len, "ids") }?;
        if lens_len < ids.len() {
            return Err(Error::new(Status::BufferTooSmall, format!("lens_len {lens_len} < {}", ids.len())));
        }
        let recs = h.get(ids)?;
        let enc: Vec<Vec<u8>> = recs
            .iter()
            .map(|r| {
                let mut b = Vec::new();
                crate::meta::encode_item(&mut b, &r.fields);
                b
            })
            .collect();
        let total: usize = enc.iter().map(|b| b.len()).sum();
        if !needed.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *needed = total };
        }
        if total > buf_len {
            return Err(Error::new(Status::BufferTooSmall, format!("fields need {total} bytes; buf_len is {buf_len}")));
        }
        // SAFETY: contract of this function.
        let l = unsafe { slice_mut(lens, lens_len, "lens") }?;
        // SAFETY: contract of this function.
        let out = unsafe { slice_mut(buf, buf_len, "buf") }?;
        let mut o = 0;
        for (i, b) in enc.iter().enumerate() {
            out[o..o + b.len()].copy_from_slice(b);
            o += b.len();
            l[i] = b.len() as u32;
        }
        Ok(())
    })
}

/// Fetches memories by id. An unknown id fails the whole call with `KALOS_NOT_FOUND` naming it.
///
/// - `vectors` (may be NULL): ids_len × dim floats, the vectors as written.
/// - `namespaces` (may be NULL): ids_len namespaces.
/// - payloads (may be NULL when `payload_lens` is NULL): packed into `payload_buf`, lengths in
///   `payload_lens` (`KALOS_NO_PAYLOAD` = none). `*payload_needed` (may be NULL) gets the bytes
///   needed, also when the call returns `KALOS_BUFFER_TOO_SMALL`.
///
/// # Safety
/// Every non-NULL buffer writable for its length; `ids` readable for `ids_len`.
#[no_mangle]
pub unsafe extern "C" fn kalos_get(
    h: *const kalos_handle,
    ids: *const u64,
    ids_len: usize,
    vectors: *mut f32,
    vectors_len: usize,
    namespaces: *mut u64,
    namespaces_len: usize,
    payload_buf: *mut u8,
    payload_buf_len: usize,
    payload_lens: *mut u32,
    payload_lens_len: usize,
    payload_needed: *mut usize,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: contract of this function.
        let ids = unsafe { slice(ids, ids_len, "ids") }?;
        let n = ids.len();
        let dim = h.dim();
        if !vectors.is_null() && vectors_len < n * dim {
            return Err(Error::new(Status::BufferTooSmall, format!("vectors_len {vectors_len} < {n} x {dim}")));
        }
        if !namespaces.is_null() && namespaces_len < n {
            return Err(Error::new(Status::BufferTooSmall, format!("namespaces_len {namespaces_len} < {n}")));
        }
        if !payload_lens.is_null() && payload_lens_len < n {
            return Err(Error::new(Status::BufferTooSmall, format!("payload_lens_len {payload_lens_len} < {n}")));
        }
        let recs = h.get(ids)?;
        let needed: usize = recs.iter().map(|r| r.payload.as_ref().map_or(0, |p| p.len())).sum();
        if !payload_needed.is_null() {
            // SAFETY: non-NULL, writable.
            unsafe { *payload_needed = needed };
        }
        if !payload_lens.is_null() && needed > payload_buf_len {
            return Err(Error::new(Status::BufferTooSmall, format!("payloads need {needed} bytes; payload_buf_len is {payload_buf_len}")));
        }
        if !vectors.is_null() {
            // SAFETY: checked length; writable per contract.
            let v = unsafe { slice_mut(vectors, vectors_len, "vectors") }?;
            for (i, r) in recs.iter().enumerate() {
                v[i * dim..(i + 1) * dim].copy_from_slice(&r.vector);
            }
        }
        if !namespaces.is_null() {
            // SAFETY: checked length; writable per contract.
            let v = unsafe { slice_mut(namespaces, namespaces_len, "namespaces") }?;
            for (i, r) in recs.iter().enumerate() {
                v[i] = r.namespace;
            }
        }
        if !payload_lens.is_null() {
            // SAFETY: checked lengths; writable per contract.
            let lens = unsafe { slice_mut(payload_lens, payload_lens_len, "payload_lens") }?;
            // SAFETY: as above.
            let buf = unsafe { slice_mut(payload_buf, payload_buf_len, "payload_buf") }?;
            pack_payloads(recs.iter().map(|r| r.payload.as_deref()), buf, lens);
        }
        Ok(())
    })
}

/// # Safety
/// `p` NULL or a valid `kalos_list_params` of at least its `struct_size`, its arrays readable
/// for their lengths.
unsafe fn read_list_params(p: *const kalos_list_params) -> Result<ListOptions> {
    let mut o = ListOptions::default();
    if p.is_null() {
        return Ok(o);
    }
    // SAFETY: non-NULL, valid per contract.
    let p = unsafe { &*p };
    if (p.struct_size as usize) < std::mem::size_of::<kalos_list_params>() {
        return Err(Error::new(Status::InvalidArgument, "list params struct_size too small; call kalos_list_params_init"));
    }
    o.after = match p.has_after {
        0 => None,
        1 => Some(p.after),
        v => return Err(Error::new(Status::InvalidArgument, format!("list params has_after = {v}; expected 0 or 1"))),
    };
    // SAFETY: caller promises namespaces_len readable entries.
    o.namespaces = unsafe { opt_slice(p.namespaces, p.namespaces_len, "params.namespaces") }?.map(<[u64]>::to_vec);
    // SAFETY: caller promises filter_len readable bytes.
    o.filter = unsafe { opt_slice(p.filter, p.filter_len, "params.filter") }?.map(<[u8]>::to_vec);
    if p.timeout_ms > 0 {
        o.timeout_ms = Some(p.timeout_ms);
    }
    Ok(o)
}

/// Lists the ids of the live memories that `params` selects (namespaces, filter expression,
/// cursor; NULL = every memory from the smallest id), in ascending order: the first `ids_len`
/// of them go to `ids`, their number to `*count`, and the number of selected memories with a
/// larger id than the last one written to `*remaining` (may be NULL). Expired memories are not
/// listed.
///
/// Paging: the listing is complete when `*count < ids_len` or `*remaining == 0`; otherwise set
/// `params->has_after = 1` and `params->after` to the last id written and call again. A memory
/// that lives and matches throughout is listed exactly once; writes between pages show in later
/// pages as they happen; no id is listed twice. `ids` may be NULL with `ids_len` 0: the call
/// then only counts (`*remaining` = every selected memory after the cursor). Each request scans
/// the whole table once, and a page larger than one slot's reply (slot_bytes / 8 ids) takes
/// several requests, so pages of thousands of ids are cheap and pages of one are not.
///
/// Errors: a malformed filter or more than 64 namespaces is `KALOS_INVALID_ARGUMENT` and sends
/// nothing; a filter too large for the slot is `KALOS_TOO_LARGE`. Outputs are written on
/// success only. Nothing is kept after the call. Thread-safe.
///
/// # Safety
/// `params` NULL or initialised by `kalos_list_params_init`, its arrays readable for their
/// lengths; `ids` writable for `ids_len` entries (NULL only with `ids_len` 0); `count` writable
/// (NULL gives `KALOS_NULL_POINTER`); `remaining` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_list(
    h: *const kalos_handle,
    params: *const kalos_list_params,
    ids: *mut u64,
    ids_len: usize,
    count: *mut usize,
    remaining: *mut u64,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        if count.is_null() {
            return Err(null("count"));
        }
        // SAFETY: contract of this function.
        let o = unsafe { read_list_params(params) }?;
        // SAFETY: contract of this function.
        let out = unsafe { slice_mut(ids, ids_len, "ids") }?;
        let (got, rest) = h.list(&o, ids_len)?;
        out[..got.len()].copy_from_slice(&got);
        // SAFETY: non-NULL, writable.
        unsafe { *count = got.len() };
        if !remaining.is_null() {
            // SAFETY: non-NULL, writable per contract.
            unsafe { *remaining = rest };
        }
        Ok(())
    })
}

/// Fills `*out` with the server's statistics. Set `out->struct_size = sizeof(kalos_stats_info)`
/// first; a caller built against an older, shorter `kalos_stats_info` gets the fields it knows
/// (only `struct_size` bytes are written).
///
/// # Safety
/// `out` writable for `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn kalos_stats(h: *const kalos_handle, out: *mut kalos_stats_info) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: out non-NULL; struct_size is its first field.
        let size = unsafe { (*out).struct_size } as usize;
        if size < STATS_V1_BYTES {
            return Err(Error::new(Status::InvalidArgument, format!("out->struct_size = {size}; set it to sizeof(kalos_stats_info)")));
        }
        let s = h.stats()?;
        let full = std::mem::size_of::<kalos_stats_info>();
        let info = kalos_stats_info {
            struct_size: size.min(full) as u32,
            engine: s.engine as u32,
            count: s.count,
            capacity: s.capacity,
            dim: s.dim as u32,
            metric: s.metric as u32,
            dtype: s.dtype as u32,
            _reserved: 0,
            requests: s.requests,
            queries: s.queries,
            batches: s.batches,
            errors: s.errors,
            p50_ns: s.p50_ns,
            p99_ns: s.p99_ns,
            queue_depth: s.queue_depth,
            server_pid: s.server_pid,
            epoch: s.epoch,
            payload_bytes: s.payload_bytes,
            uptime_ms: s.uptime_ms,
            engine_fallbacks: s.engine_fallbacks,
            engine_name: c_text(&s.engine_name),
            fallback_reason: c_text(&s.fallback_reason),
            rerank_queries: s.rerank_queries,
            rerank_uncertain: s.rerank_uncertain,
        };
        // SAFETY: out is writable for `size` bytes (the caller's contract) and at least
        // STATS_V1_BYTES (checked above); we copy the first min(size, full) bytes of info.
        unsafe { std::ptr::copy_nonoverlapping(&info as *const kalos_stats_info as *const u8, out as *mut u8, size.min(full)) };
        Ok(())
    })
}

/// Copies the server's request counters by op and status into `out[0..n]`: one
/// `kalos_op_count` for each (op, status) pair that counted a request since the server
/// started, ordered by op, then status. The counters are read with one stats request (itself
/// counted under `KALOS_OP_STATS`, from the next call on).
///
/// `*needed` (may be NULL) gets n, also when the call returns `KALOS_BUFFER_TOO_SMALL`
/// (`out_len < n`; `out` is then left unwritten). Pass `out` NULL and `out_len` 0 to ask for n
/// only: that returns `KALOS_BUFFER_TOO_SMALL` once any request was counted. More pairs may
/// appear between two calls: size `out` with room to spare, or call again with the new
/// `*needed`.
///
/// Threading: as every call on a handle; the counters are the server's, shared by all clients.
///
/// # Safety
/// `out` writable for `out_len` entries (or NULL with `out_len` 0); `needed` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_stats_ops(
    h: *const kalos_handle,
    out: *mut kalos_op_count,
    out_len: usize,
    needed: *mut usize,
) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        // SAFETY: writable for out_len entries per contract; NULL only with out_len 0.
        let out = unsafe { slice_mut(out, out_len, "out") }?;
        let s = h.stats()?;
        let n = s.requests_by.len();
        if !needed.is_null() {
            // SAFETY: non-NULL, writable per contract.
            unsafe { *needed = n };
        }
        if out.len() < n {
            return Err(Error::new(Status::BufferTooSmall, format!("{n} op counters; out_len is {out_len}")));
        }
        for (o, c) in out.iter_mut().zip(&s.requests_by) {
            *o = kalos_op_count { op: c.op, status: c.status as kalos_status, count: c.count };
        }
        Ok(())
    })
}

/// Stable name of an op code ("recall", "upsert", "delete", "delete_namespace", "get",
/// "stats", "clear", "delete_where", "list"), the same names as kalosd's metrics; "unknown"
/// for other values. The string is static: never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn kalos_op_name(op: u32) -> *const c_char {
    static NAMES: once_cell::sync::Lazy<Vec<std::ffi::CString>> =
        once_cell::sync::Lazy::new(|| (0..=KALOS_OP_LIST).map(|op| std::ffi::CString::new(crate::wire::op_name(op)).unwrap()).collect());
    NAMES.get(op as usize).map_or(c"unknown".as_ptr(), |n| n.as_ptr())
}

/// The store's vector dimension, written to `*dim`.
///
/// # Safety
/// `dim` writable.
#[no_mangle]
pub unsafe extern "C" fn kalos_dim(h: *const kalos_handle, dim: *mut u32) -> kalos_status {
    guard(|| {
        // SAFETY: contract of this function.
        let h = unsafe { handle(h) }?;
        if dim.is_null() {
            return Err(null("dim"));
        }
        // SAFETY: non-NULL, writable.
        unsafe { *dim = h.dim() as u32 };
        Ok(())
    })
}

/// Stable name of a status code ("OK", "SERVER_GONE", ...); "UNKNOWN" for other values.
/// The string is static: never free it.
#[no_mangle]
pub extern "C" fn kalos_status_str(status: kalos_status) -> *const c_char {
    static NAMES: once_cell::sync::Lazy<Vec<std::ffi::CString>> =
        once_cell::sync::Lazy::new(|| Status::ALL.iter().map(|s| std::ffi::CString::new(s.name()).unwrap()).collect());
    if status >= 0 && (status as usize) < Status::ALL.len() {
        NAMES[status as usize].as_ptr()
    } else {
        c"UNKNOWN".as_ptr()
    }
}

/// The library version, e.g. "0.1.0". Static: never free it.
#[no_mangle]
pub extern "C" fn kalos_version() -> *const c_char {
    static V: once_cell::sync::Lazy<std::ffi::CString> = once_cell::sync::Lazy::new(|| std::ffi::CString::new(crate::VERSION).unwrap());
    V.as_ptr()
}

/// Converts a Rust result into a status code, recording the message (for bindings built on the
/// Rust API, e.g. JNI).
pub fn status_of(r: &Result<()>) -> kalos_status {
    match r {
        Ok(()) => kalos_status_code::KALOS_OK as kalos_status,
        Err(e) => {
            set_last_error(e);
            e.status as kalos_status
        }
    }
}
