//! Metadata filters on the GPU: the store's field columns mirrored as cells (one u64 and one
//! presence byte per row, `src/filter/program.rs`), a filter compiled to a cell program and
//! evaluated by `filter_eval` (kernels/table.cu) into a bitmap of matching rows, which every
//! scan kernel reads through `Table::mask` (docs/GPU.md, "Metadata filters").
//!
//! A filter that lets through at most one row in [`SPARSE_DIV`] (and at most [`LIST_CAP`]
//! rows) is not scanned for: a single query gathers those rows into a compact table on the
//! device (`gather_rows`) and scans only that; a batch takes them back to the host, where the
//! CPU engine scores only them. A filter on a tags field has no cell form and runs wholly on
//! the CPU engine.
//!
//! A single query whose filter program was seen before (same bytes, same table generation and
//! length bucket) does not wait for the count: the plan the last count called for is enqueued
//! behind the evaluation at once ([`Guess`]), and the count, read once the answer is in,
//! confirms it (or shows that the compact table was too small: then the mask, already complete,
//! answers).

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};

use cudarc::driver::sys;

use super::compile::NT;
use super::table::TableArg;
use super::{ck, ns_since, CudaEngine, DevBuf, HostBuf};
use crate::error::{Error, Result, Status};
use crate::filter::program::{cell, Ins, Program};
use crate::filter::Bitmap;
use crate::meta::{ColumnData, FieldType};
use crate::store::Store;

/// Most matching rows `filter_eval` lists for the host.
pub(super) const LIST_CAP: usize = 65536;
/// A filter matching at most one row in this many is scored on the CPU from its row list.
pub(super) const SPARSE_DIV: usize = 1000;
/// Fewest rows of the compact table a predicted sparse filter is gathered and scanned for.
const SPARSE_MIN_ROWS: usize = 256;
/// Filter programs whose last count is remembered (the memory is cleared when it fills).
const PLAN_MEMORY: usize = 4096;
/// What `h_out`'s count word holds until the count's copy lands.
const COUNT_PENDING: u32 = u32::MAX;

/// Whether `m` matching rows of `n` make a sparse filter (its rows listed, not scanned for).
pub(super) fn is_sparse(m: usize, n: usize) -> bool {
    m <= LIST_CAP && m.saturating_mul(SPARSE_DIV) <= n
}

/// How a single query with a filter seen before goes on, from the filter's last count `last`
/// over a table of `n` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Guess {
    /// Not seen, or it matched nothing: evaluate and wait for the count (an empty answer needs
    /// no scan).
    Wait,
    /// Dense: the masked scan, enqueued behind the evaluation.
    Mask,
    /// Sparse: the gather of up to this many listed rows and the compact scan of as many,
    /// enqueued behind the evaluation (twice the last count, in powers of two).
    Sparse(usize),
}

impl Guess {
    pub(super) fn of(last: Option<u32>, n: usize) -> Guess {
        match last.map(|m| m as usize) {
            None | Some(0) => Guess::Wait,
            Some(m) if is_sparse(m, n) => Guess::Sparse(m.saturating_mul(2).next_power_of_two().clamp(SPARSE_MIN_ROWS, LIST_CAP)),
            Some(_) => Guess::Mask,
        }
    }
}

/// The key a filter program's last count is remembered by: its instructions and constants, the
/// table's generation (bumped when the table moves) and its length's power-of-two bucket.
fn plan_key(prog: &[u8], gen: u64, n: usize) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prog.hash(&mut h);
    gen.hash(&mut h);
    n.next_power_of_two().hash(&mut h);
    h.finish()
}

/// A filter program as `filter_eval` reads it: instructions | constants (8-aligned) | column
/// pointers (vals, has) per column.
pub(super) struct DevProg {
    buf: Vec<u8>,
    o_consts: usize,
    o_cols: usize,
    nins: usize,
    /// `plan_key` of the program.
    pub(super) key: u64,
}

struct DevCol {
    vals: DevBuf,
    has: DevBuf,
}

/// The device's copy of the field columns and the buffers of filter evaluation.
pub(super) struct DevFields {
    /// Per store column (same index); None for a tags column.
    cols: Vec<Option<DevCol>>,
    /// The type of each column mirrored (a store emptied and refilled may type them anew).
    tys: Vec<FieldType>,
    /// Rows of room in every column and the mask (the table's `cap_rows`).
    cap: usize,
    d_mask: DevBuf,
    d_list: DevBuf,
    d_count: DevBuf,
    d_prog: DevBuf,
    d_stage: DevBuf,
    /// Pinned: the program on its way to the device, and the count and rows on their way back.
    h_prog: Option<HostBuf>,
    h_out: Option<HostBuf>,
    /// `Table::mask` of the kernels launched now: `d_mask` while a filtered search runs, else 0.
    pub(super) active_mask: u64,
    /// The last evaluation's phases (ns): the kernel with its count read back, the row list
    /// read back (0 when not read).
    pub(super) last_ns: [u32; 2],
    /// The compact table of a sparse filter's rows: vectors, norms, ids, namespaces, created,
    /// expires, for `sc_cap` rows, and its mask (`sc_cap` bits).
    sc: [DevBuf; 7],
    sc_cap: usize,
    /// Each filter program's last count, by `plan_key`.
    counts: HashMap<u64, u32>,
    /// The key of the evaluation enqueued last.
    last_key: u64,
    /// An evaluation was enqueued and its count not yet read (its copies may be in flight).
    in_flight: bool,
}

impl DevFields {
    pub(super) fn d_mask_ptr(&self) -> u64 {
        self.d_mask.ptr
    }
    pub(super) fn new() -> DevFields {
        DevFields {
            cols: Vec::new(),
            tys: Vec::new(),
            cap: 0,
            d_mask: DevBuf::empty(),
            d_list: DevBuf::empty(),
            d_count: DevBuf::empty(),
            d_prog: DevBuf::empty(),
            d_stage: DevBuf::empty(),
            h_prog: None,
            h_out: None,
            active_mask: 0,
            last_ns: [0; 2],
            sc: std::array::from_fn(|_| DevBuf::empty()),
            sc_cap: 0,
            counts: HashMap::new(),
            last_key: 0,
            in_flight: false,
        }
    }

    /// How a single query with the filter program `key` goes on (see [`Guess`]).
    pub(super) fn guess(&self, key: u64, n: usize) -> Guess {
        Guess::of(self.counts.get(&key).copied(), n)
    }

    /// Remembers `m`, the count of the evaluation enqueued last.
    fn remember(&mut self, m: u32) {
        if self.counts.len() >= PLAN_MEMORY && !self.counts.contains_key(&self.last_key) {
            self.counts.clear();
        }
        self.counts.insert(self.last_key, m);
    }
}

/// How a filtered search goes on.
pub(super) enum FilterPlan {
    /// No row matches.
    Empty,
    /// Few rows match: these (before namespaces and expiry), scored on the CPU.
    Rows(Vec<u32>),
    /// Few rows match (this many, before namespaces and expiry), listed on the device.
    Sparse(usize),
    /// The mask holds the matching rows: scan with it.
    Mask,
}

fn grow(b: &mut DevBuf, bytes: usize, what: &str) -> Result<()> {
    if b.bytes < bytes {
        *b = DevBuf::new(bytes.next_power_of_two(), what)?;
    }
    Ok(())
}

impl CudaEngine {
    /// Copies `bytes` from host memory to the device (the engine's stream; pageable `src`).
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: `dst` is a device buffer of at least src.len() bytes (callers size it first);
        // a pageable source is copied out before the call returns.
        ck("field upload", unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream) })
    }

    /// Brings the device's field cells up to date: new columns and a moved table in full, else
    /// the `rows` that changed (sorted, all below the store's length).
    pub(super) fn sync_fields(&mut self, store: &Store, rows: &[u32]) -> Result<()> {
        let cols = store.fields().columns();
        let n = store.len();
        let cap = self.table.cap_rows;
        if self.fcols.cap != cap {
            self.fcols.cols.clear();
            self.fcols.tys.clear();
            self.fcols.d_mask = DevBuf::new(cap.div_ceil(32) * 4, "filter mask")?;
            self.fcols.cap = cap;
            // Graphs of masked scans hold the old mask's address.
            self.sq.graphs.clear();
        }
        // Columns are only ever appended, unless the store was emptied: then start over.
        let same = self.fcols.tys.len() <= cols.len() && self.fcols.tys.iter().zip(cols).all(|(t, c)| *t == c.ty);
        if !same {
            self.fcols.cols.clear();
            self.fcols.tys.clear();
        }
        for (i, c) in cols.iter().enumerate() {
            if matches!(c.data, ColumnData::Tags(_)) {
                if self.fcols.cols.len() <= i {
                    self.fcols.cols.push(None);
                    self.fcols.tys.push(c.ty);
                }
                continue;
            }
            let fresh = self.fcols.cols.len() <= i;
            if fresh {
                let vals = DevBuf::new(cap * 8, "field values")?;
                let has = DevBuf::new(cap, "field presence")?;
                self.fcols.cols.push(Some(DevCol { vals, has }));
                self.fcols.tys.push(c.ty);
            }
            let all: Vec<u32>;
            let which: &[u32] = if fresh {
                all = (0..n as u32).collect();
                &all
            } else {
                rows
            };
            if which.is_empty() {
                continue;
            }
            let m = which.len();
            let mut stage = Vec::with_capacity(m * 13);
            for &r in which {
                stage.extend_from_slice(&r.to_le_bytes());
            }
            for &r in which {
                stage.extend_from_slice(&cell(&c.data, r as usize).map_or(0, |x| x.0).to_le_bytes());
            }
            for &r in which {
                stage.push(cell(&c.data, r as usize).is_some_and(|x| x.1) as u8);
            }
            // rows u32[m] | vals u64[m] (at 4m, 8-aligned below) | has u8[m]
            let o_vals = (m * 4).next_multiple_of(8);
            let mut staged = vec![0u8; o_vals + m * 9];
            staged[..m * 4].copy_from_slice(&stage[..m * 4]);
            staged[o_vals..o_vals + m * 8].copy_from_slice(&stage[m * 4..m * 12]);
            staged[o_vals + m * 8..].copy_from_slice(&stage[m * 12..]);
            grow(&mut self.fcols.d_stage, staged.len(), "field staging")?;
            self.upload(self.fcols.d_stage.ptr, &staged)?;
            let col = self.fcols.cols[i].as_ref().expect("a cell column");
            let base = self.fcols.d_stage.ptr;
            let (mut a_rows, mut a_vals, mut a_has) = (base, base + o_vals as u64, base + (o_vals + m * 8) as u64);
            let mut mm = m as u32;
            let (mut dv, mut dh) = (col.vals.ptr, col.has.ptr);
            let mut args = kargs![a_rows, a_vals, a_has, mm, dv, dh];
            let blocks = m.div_ceil(256).clamp(1, 4096) as u32;
            // SAFETY: `args` points at the six locals above, col_scatter's parameters in order;
            // every staged row is below n <= cap, the rows of the column buffers.
            ck("launch col_scatter", unsafe {
                sys::cuLaunchKernel(self.kern.col_scatter, blocks, 1, 1, 256, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
            })?;
            // The staging buffer is reused by the next column.
            self.sync_stream()?;
        }
        Ok(())
    }

    /// Lays `prog` out as `filter_eval` reads it, or None when the CPU engine must answer it (a
    /// tags field, or a mask that does not cover the table).
    pub(super) fn filter_prog(&self, prog: &Program) -> Option<DevProg> {
        let n = self.table.len;
        if self.fcols.d_mask.bytes < n.div_ceil(32) * 4 {
            return None;
        }
        if prog.ins.iter().any(|i| {
            i.op >= crate::filter::program::P_EXISTS
                && i.op <= crate::filter::program::P_BOOL_SET
                && self.fcols.cols.get(i.col as usize).is_none_or(|c| c.is_none())
        }) {
            return None;
        }
        // prog ins | consts (8-aligned) | column pointers (vals, has) per column
        let ni = prog.ins.len();
        let o_consts = (ni * std::mem::size_of::<Ins>()).next_multiple_of(8);
        let o_cols = o_consts + prog.consts.len() * 8;
        let mut buf = vec![0u8; o_cols + self.fcols.cols.len() * 16];
        for (j, i) in prog.ins.iter().enumerate() {
            for (w, x) in [i.op, i.col, i.a, i.b].iter().enumerate() {
                buf[j * 16 + w * 4..j * 16 + w * 4 + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
        for (j, c) in prog.consts.iter().enumerate() {
            buf[o_consts + j * 8..o_consts + j * 8 + 8].copy_from_slice(&c.to_le_bytes());
        }
        for (j, c) in self.fcols.cols.iter().enumerate() {
            let (v, h) = c.as_ref().map_or((0, 0), |c| (c.vals.ptr, c.has.ptr));
            buf[o_cols + j * 16..o_cols + j * 16 + 8].copy_from_slice(&v.to_le_bytes());
            buf[o_cols + j * 16 + 8..o_cols + j * 16 + 16].copy_from_slice(&h.to_le_bytes());
        }
        let key = plan_key(&buf[..o_cols], self.table.gen, n);
        Some(DevProg { buf, o_consts, o_cols, nins: ni, key })
    }

    /// Enqueues the evaluation of `dp` on the engine's stream: the program's upload, the count's
    /// reset, `filter_eval` (the mask, the count and the row list on the device) and the count's
    /// copy into `h_out` (where a sentinel waits until it lands). Nothing waits for it here.
    pub(super) fn enqueue_eval(&mut self, dp: &DevProg) -> Result<()> {
        self.fcols.last_ns = [0; 2];
        if self.fcols.in_flight {
            // An earlier evaluation's upload may still read h_prog (its search failed before
            // its count was read).
            self.sync_stream()?;
            self.fcols.in_flight = false;
        }
        let n = self.table.len;
        let len = dp.buf.len();
        grow(&mut self.fcols.d_prog, len, "filter program")?;
        grow(&mut self.fcols.d_list, LIST_CAP * 4, "filter row list")?;
        grow(&mut self.fcols.d_count, 4, "filter count")?;
        if self.fcols.h_prog.as_ref().is_none_or(|h| h.bytes < len) {
            self.fcols.h_prog = Some(HostBuf::new(len.next_power_of_two())?);
        }
        if self.fcols.h_out.is_none() {
            self.fcols.h_out = Some(HostBuf::new(4 + LIST_CAP * 4)?);
        }
        // Nothing on the stream reads h_prog or writes h_out now: every evaluation's count is
        // read back (the copies before it done) or the stream synchronised above.
        self.fcols.h_prog.as_mut().expect("allocated above").slice()[..len].copy_from_slice(&dp.buf);
        let out = self.fcols.h_out.as_mut().expect("allocated above").slice();
        out[..4].copy_from_slice(&COUNT_PENDING.to_le_bytes());
        let (hp, hout) = (self.fcols.h_prog.as_ref().expect("allocated above").ptr as *const c_void, out.as_mut_ptr() as *mut c_void);
        self.fcols.in_flight = true;
        self.fcols.last_key = dp.key;
        // SAFETY: pinned source of `len` bytes into d_prog (at least as large), on the engine's
        // stream; the 4-byte count reset is within d_count.
        unsafe {
            ck("filter program upload", sys::cuMemcpyHtoDAsync_v2(self.fcols.d_prog.ptr, hp, len, self.stream))?;
            ck("filter count reset", sys::cuMemsetD32Async(self.fcols.d_count.ptr, 0, 1, self.stream))?;
        }
        let base = self.fcols.d_prog.ptr;
        let (mut a_prog, mut a_consts, mut a_cols) = (base, base + dp.o_consts as u64, base + dp.o_cols as u64);
        let mut nins = dp.nins as u32;
        let mut nn = n as u32;
        let mut mask = self.fcols.d_mask.ptr;
        let mut list = self.fcols.d_list.ptr;
        let mut cap = LIST_CAP as u32;
        let mut count = self.fcols.d_count.ptr;
        let mut args = kargs![a_prog, nins, a_consts, a_cols, nn, mask, list, cap, count];
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        // SAFETY: `args` points at the nine locals above, filter_eval's parameters in order; the
        // program reads columns that hold the table's n rows, the mask holds cap_rows >= n bits
        // (filter_prog checked). Then the count into the pinned h_out's first 4 bytes.
        unsafe {
            ck(
                "launch filter_eval",
                sys::cuLaunchKernel(
                    self.kern.filter_eval,
                    blocks,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    self.stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )?;
            ck("filter count", sys::cuMemcpyDtoHAsync_v2(hout, self.fcols.d_count.ptr, 4, self.stream))?;
        }
        Ok(())
    }

    /// The count of the evaluation enqueued last. Callers read it after something enqueued
    /// later on the stream has been seen to finish (a scan's published results), so the copy
    /// has landed; if the sentinel is still there, the stream is synchronised first.
    pub(super) fn read_count(&mut self) -> Result<usize> {
        let p = self.fcols.h_out.as_ref().expect("enqueue_eval allocated it").ptr as *const u32;
        // SAFETY: h_out is live pinned memory of at least 4 bytes, 4-aligned; the DMA engine
        // writes the word whole (volatile read).
        let mut m = unsafe { std::ptr::read_volatile(p) };
        if m == COUNT_PENDING {
            self.sync_stream()?;
            // SAFETY: as above; the stream is idle.
            m = unsafe { std::ptr::read_volatile(p) };
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        self.fcols.in_flight = false;
        if m == COUNT_PENDING {
            return Err(Error::new(Status::Cuda, "the filter's match count did not come back from the device"));
        }
        self.fcols.remember(m);
        Ok(m as usize)
    }

    /// Evaluates `dp` over the table's rows on the GPU, waits for the count and decides the
    /// plan (`list_on_host`: a sparse filter's rows come back to the host, else they stay listed
    /// on the device).
    pub(super) fn eval_filter(&mut self, dp: &DevProg, list_on_host: bool) -> Result<FilterPlan> {
        let t0 = std::time::Instant::now();
        self.enqueue_eval(dp)?;
        self.sync_stream()?;
        let m = self.read_count()?;
        self.fcols.last_ns[0] = ns_since(t0);
        let n = self.table.len;
        if m == 0 {
            return Ok(FilterPlan::Empty);
        }
        if !is_sparse(m, n) {
            return Ok(FilterPlan::Mask);
        }
        if !list_on_host {
            return Ok(FilterPlan::Sparse(m));
        }
        let hout = self.fcols.h_out.as_mut().expect("allocated by enqueue_eval").slice().as_mut_ptr();
        // SAFETY: the first m <= LIST_CAP rows of d_list into h_out past the count (h_out holds
        // 4 + LIST_CAP * 4 bytes).
        unsafe {
            ck("filter rows", sys::cuMemcpyDtoHAsync_v2(hout.add(4) as *mut c_void, self.fcols.d_list.ptr, m * 4, self.stream))?;
        }
        self.sync_stream()?;
        let out = self.fcols.h_out.as_mut().expect("allocated by enqueue_eval").slice();
        let mut rows: Vec<u32> = out[4..4 + m * 4].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
        rows.sort_unstable();
        self.fcols.last_ns[1] = ns_since(t0) - self.fcols.last_ns[0];
        Ok(FilterPlan::Rows(rows))
    }
}

impl CudaEngine {
    /// Gathers up to `rows` of the rows the last evaluation listed on the device (its count,
    /// read there, bounds them) into the compact table (grown as needed), with a mask of the
    /// rows gathered, and returns its columns for the single-query kernel, which scans `rows`
    /// rows of it.
    pub(super) fn gather_sparse(&mut self, rows: usize) -> Result<TableArg> {
        let row16 = self.dp * self.esize / 16;
        if self.fcols.sc_cap < rows {
            let cap = rows.next_power_of_two();
            let sizes = [cap * row16 * 16, cap * 4, cap * 8, cap * 8, cap * 8, cap * 8, cap.div_ceil(32) * 4];
            for (b, bytes) in self.fcols.sc.iter_mut().zip(sizes) {
                *b = DevBuf::new(bytes, "sparse filter rows")?;
            }
            self.fcols.sc_cap = cap;
            // Graphs of the compact table hold the old buffers' addresses.
            self.sq.graphs.clear();
        }
        let t = self.table_arg();
        let [v, nr, id, ns, cr, ex, cm] = self.fcols.sc.each_ref().map(|b| b.ptr);
        let (mut list, mut count, mut cap, mut nv16) = (self.fcols.d_list.ptr, self.fcols.d_count.ptr, rows as u32, row16 as u32);
        let (mut s_v, mut s_n, mut s_i, mut s_ns, mut s_c, mut s_e) = (t.vecs, t.norms, t.ids, t.ns, t.created, t.expires);
        let (mut d_v, mut d_n, mut d_i, mut d_ns, mut d_c, mut d_e, mut d_m) = (v, nr, id, ns, cr, ex, cm);
        let mut args = kargs![list, count, cap, nv16, s_v, s_n, s_i, s_ns, s_c, s_e, d_v, d_n, d_i, d_ns, d_c, d_e, d_m];
        let blocks = (rows * row16).div_ceil(NT as usize).clamp(1, 1024) as u32;
        // SAFETY: `args` points at the 17 locals above, gather_rows' parameters in order; the
        // list holds min(count, LIST_CAP) rows of the table (filter_eval, earlier on this
        // stream) and the kernel gathers at most rows <= LIST_CAP of them; the compact buffers
        // hold sc_cap >= rows rows, and the mask sc_cap bits.
        ck("launch gather_rows", unsafe {
            sys::cuLaunchKernel(self.kern.gather_rows, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
        })?;
        Ok(TableArg { vecs: v, norms: nr, ids: id, ns, created: cr, expires: ex, mask: cm, rscale: 0 })
    }
}

/// The rows of `rows` a request may return (those in its namespaces and not expired), as a
/// bitmap over the store's rows.
pub(super) fn allowed_rows(store: &Store, rows: &[u32], req: &crate::engine::SearchRequest<'_>) -> Bitmap {
    let ns = store.namespaces();
    let ex = store.expires_ms();
    let mut b = Bitmap { words: vec![0u64; store.len().div_ceil(64)], len: store.len() };
    for &r in rows {
        let r = r as usize;
        if req.filter.matches(ns[r]) && ex[r] > req.now_ms {
            b.words[r / 64] |= 1 << (r % 64);
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_means_at_most_one_row_in_sparse_div_and_a_listable_count() {
        assert!(is_sparse(0, 10));
        assert!(is_sparse(1, SPARSE_DIV));
        assert!(!is_sparse(1, SPARSE_DIV - 1));
        assert!(is_sparse(1000, 1_000_000));
        assert!(!is_sparse(1001, 1_000_000));
        assert!(is_sparse(LIST_CAP, LIST_CAP * SPARSE_DIV));
        assert!(!is_sparse(LIST_CAP + 1, usize::MAX));
        assert!(!is_sparse(usize::MAX, usize::MAX));
    }

    /// A guessed compact table always has room for the last count's rows (so a filter whose
    /// count holds still is answered from it), within the device's row list.
    #[test]
    fn guesses_follow_the_last_count() {
        let n = 1_000_000;
        assert_eq!(Guess::of(None, n), Guess::Wait);
        assert_eq!(Guess::of(Some(0), n), Guess::Wait);
        assert_eq!(Guess::of(Some(1001), n), Guess::Mask);
        assert_eq!(Guess::of(Some(500_000), n), Guess::Mask);
        assert_eq!(Guess::of(Some(1), n), Guess::Sparse(SPARSE_MIN_ROWS));
        assert_eq!(Guess::of(Some(100), n), Guess::Sparse(256));
        assert_eq!(Guess::of(Some(129), n), Guess::Sparse(512));
        assert_eq!(Guess::of(Some(1000), n), Guess::Sparse(2048));
        let big = LIST_CAP * SPARSE_DIV;
        assert_eq!(Guess::of(Some(LIST_CAP as u32), big), Guess::Sparse(LIST_CAP));
        assert_eq!(Guess::of(Some(LIST_CAP as u32 + 1), big), Guess::Mask);
        for m in (1..=LIST_CAP).step_by(97).chain([LIST_CAP - 1, LIST_CAP]) {
            match Guess::of(Some(m as u32), big) {
                Guess::Sparse(rows) => assert!(m <= rows && rows <= LIST_CAP && rows.is_power_of_two(), "{m} -> {rows}"),
                g => panic!("{m}: {g:?}"),
            }
        }
    }

    #[test]
    fn plan_keys_separate_programs_generations_and_length_buckets() {
        let p = [1u8, 2, 3, 4];
        let k = plan_key(&p, 7, 1000);
        assert_eq!(k, plan_key(&p, 7, 1000));
        assert_eq!(k, plan_key(&p, 7, 600), "same power-of-two bucket");
        assert_ne!(k, plan_key(&p, 7, 1025));
        assert_ne!(k, plan_key(&p, 8, 1000));
        assert_ne!(k, plan_key(&[1, 2, 3, 5], 7, 1000));
    }

    /// The count read back is what the next guess for the same key follows; a full memory is
    /// cleared rather than grown.
    #[test]
    fn counts_are_remembered_per_key() {
        let mut f = DevFields::new();
        let n = 1_000_000;
        f.last_key = 11;
        f.remember(50_000);
        assert_eq!(f.guess(11, n), Guess::Mask);
        assert_eq!(f.guess(12, n), Guess::Wait);
        f.remember(40);
        assert_eq!(f.guess(11, n), Guess::Sparse(256));
        f.remember(0);
        assert_eq!(f.guess(11, n), Guess::Wait);
        for k in 0..PLAN_MEMORY as u64 {
            f.last_key = 1000 + k;
            f.remember(5000);
        }
        assert!(f.counts.len() <= PLAN_MEMORY);
        assert_eq!(f.guess(1000 + PLAN_MEMORY as u64 - 1, n), Guess::Mask);
    }
}
