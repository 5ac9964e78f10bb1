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

use super::compile::{FPROG_MAX, NT};
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
/// What `h_out`'s count word holds until `filter_eval` writes the count there.
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

/// The key a filter program's last count is remembered by: its instructions, constants and the
/// columns it reads (`prog`), the table's generation (bumped when the table moves) and its
/// length's power-of-two bucket.
fn plan_key(prog: &[u8], gen: u64, n: usize) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prog.hash(&mut h);
    gen.hash(&mut h);
    n.next_power_of_two().hash(&mut h);
    h.finish()
}

/// A filter program as `filter_eval` reads it: instructions | constants (8-aligned) | column
/// pointers (vals, has) of each column it reads ([`DevProg::lay_out`]).
pub(super) struct DevProg {
    buf: Vec<u8>,
    o_consts: usize,
    o_cols: usize,
    nins: usize,
    /// `plan_key` of the program.
    pub(super) key: u64,
}

impl DevProg {
    /// `prog` laid out for `filter_eval`: its instructions, with each leaf's column renumbered
    /// to its place among the columns the program reads (in order of first use), its constants,
    /// and the (vals, has) device pointers of those columns alone (`col_ptrs` of a store
    /// column), so that a program over a few fields of a store with many stays small enough for
    /// `filter_eval_v`'s launch parameters. Keyed ([`plan_key`]) by the instructions and
    /// constants and the store columns they read, `gen` and `n`.
    fn lay_out(prog: &Program, col_ptrs: impl Fn(u32) -> (u64, u64), gen: u64, n: usize) -> DevProg {
        let is_leaf = |op: u32| (crate::filter::program::P_EXISTS..=crate::filter::program::P_BOOL_SET).contains(&op);
        let mut used: Vec<u32> = Vec::new();
        let ni = prog.ins.len();
        let o_consts = (ni * std::mem::size_of::<Ins>()).next_multiple_of(8);
        let o_cols = o_consts + prog.consts.len() * 8;
        let mut buf = vec![0u8; o_cols];
        for (j, i) in prog.ins.iter().enumerate() {
            let col = if is_leaf(i.op) {
                match used.iter().position(|&c| c == i.col) {
                    Some(at) => at as u32,
                    None => {
                        used.push(i.col);
                        used.len() as u32 - 1
                    }
                }
            } else {
                i.col
            };
            for (w, x) in [i.op, col, i.a, i.b].iter().enumerate() {
                buf[j * 16 + w * 4..j * 16 + w * 4 + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
        for (j, c) in prog.consts.iter().enumerate() {
            buf[o_consts + j * 8..o_consts + j * 8 + 8].copy_from_slice(&c.to_le_bytes());
        }
        let mut ident = buf.clone();
        for &c in &used {
            let (v, h) = col_ptrs(c);
            buf.extend_from_slice(&v.to_le_bytes());
            buf.extend_from_slice(&h.to_le_bytes());
            ident.extend_from_slice(&c.to_le_bytes());
        }
        let key = plan_key(&ident, gen, n);
        DevProg { buf, o_consts, o_cols, nins: ni, key }
    }
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
    /// `filter_eval`'s two counts and two block tallies (u32 each): an evaluation of parity p
    /// sums into count p and zeroes count and tally 1 - p for the next one.
    d_count: DevBuf,
    /// Evaluations launched: the next one's parity is `evals & 1`.
    evals: u64,
    d_prog: DevBuf,
    d_stage: DevBuf,
    /// Pinned: a program of more than `FPROG_MAX` bytes on its way to the device, and the count
    /// (written by `filter_eval` through `h_out_dev`) and rows on their way back.
    h_prog: Option<HostBuf>,
    h_out: Option<HostBuf>,
    h_out_dev: u64,
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
            evals: 0,
            d_prog: DevBuf::empty(),
            d_stage: DevBuf::empty(),
            h_prog: None,
            h_out: None,
            h_out_dev: 0,
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
        let cols = &self.fcols.cols;
        let dp = DevProg::lay_out(prog, |c| cols[c as usize].as_ref().map_or((0, 0), |c| (c.vals.ptr, c.has.ptr)), self.table.gen, n);
        Some(dp)
    }

    /// Enqueues the evaluation of `dp` on the engine's stream: `filter_eval_v` with the program
    /// in its launch parameters, or, for a program of more than `FPROG_MAX` bytes, its upload
    /// and `filter_eval`. The kernel leaves the mask, the count and the row list on the device
    /// and writes the count into `h_out` (where a sentinel waits until it lands). Nothing waits
    /// for it here.
    pub(super) fn enqueue_eval(&mut self, dp: &DevProg) -> Result<()> {
        self.fcols.last_ns = [0; 2];
        if self.fcols.in_flight {
            // An earlier evaluation may still read h_prog or write h_out's count (its search
            // failed before its count was read).
            self.sync_stream()?;
            self.fcols.in_flight = false;
        }
        let n = self.table.len;
        let len = dp.buf.len();
        grow(&mut self.fcols.d_list, LIST_CAP * 4, "filter row list")?;
        if self.fcols.d_count.bytes < 16 {
            grow(&mut self.fcols.d_count, 16, "filter count")?;
            // SAFETY: the 4 words of the new d_count, on the engine's stream (before any
            // evaluation that reads them). The first evaluation is of parity 0.
            ck("filter count reset", unsafe { sys::cuMemsetD32Async(self.fcols.d_count.ptr, 0, 4, self.stream) })?;
            self.fcols.evals = 0;
        }
        if self.fcols.h_out.is_none() {
            let h = HostBuf::with_flags(4 + LIST_CAP * 4, 0x02 /* CU_MEMHOSTALLOC_DEVICEMAP */)?;
            self.fcols.h_out_dev = h.device_ptr()?;
            self.fcols.h_out = Some(h);
        }
        // Nothing on the stream reads h_prog or writes h_out now: every evaluation's count is
        // read back (its kernel done) or the stream synchronised above.
        let out = self.fcols.h_out.as_mut().expect("allocated above").slice();
        out[..4].copy_from_slice(&COUNT_PENDING.to_le_bytes());
        self.fcols.in_flight = true;
        self.fcols.last_key = dp.key;
        let mut nins = dp.nins as u32;
        let mut nn = n as u32;
        let mut mask = self.fcols.d_mask.ptr;
        let mut list = self.fcols.d_list.ptr;
        let mut cap = LIST_CAP as u32;
        let mut counts = self.fcols.d_count.ptr;
        let mut par = (self.fcols.evals & 1) as u32;
        let mut host_count = self.fcols.h_out_dev;
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        let r = if len <= FPROG_MAX {
            let mut prog = [0u64; FPROG_MAX / 8];
            for (w, c) in prog.iter_mut().zip(dp.buf.chunks(8)) {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                *w = u64::from_le_bytes(b);
            }
            let (mut o_consts, mut o_cols) = (dp.o_consts as u32, dp.o_cols as u32);
            let mut args = kargs![prog, nins, o_consts, o_cols, nn, mask, list, cap, counts, par, host_count];
            // SAFETY: `args` points at the eleven locals above, filter_eval_v's parameters in
            // order (the program as FPROG_MAX bytes, copied by the launch); the program reads
            // columns that hold the table's n rows, the mask holds cap_rows >= n bits
            // (filter_prog checked), d_count holds the 4 words, and h_out_dev is the device
            // address of h_out's first 4 bytes.
            unsafe {
                sys::cuLaunchKernel(
                    self.kern.filter_eval_v,
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
                )
            }
        } else {
            grow(&mut self.fcols.d_prog, len, "filter program")?;
            if self.fcols.h_prog.as_ref().is_none_or(|h| h.bytes < len) {
                self.fcols.h_prog = Some(HostBuf::new(len.next_power_of_two())?);
            }
            self.fcols.h_prog.as_mut().expect("allocated above").slice()[..len].copy_from_slice(&dp.buf);
            let hp = self.fcols.h_prog.as_ref().expect("allocated above").ptr as *const c_void;
            // SAFETY: pinned source of `len` bytes into d_prog (at least as large), on the
            // engine's stream.
            ck("filter program upload", unsafe { sys::cuMemcpyHtoDAsync_v2(self.fcols.d_prog.ptr, hp, len, self.stream) })?;
            let base = self.fcols.d_prog.ptr;
            let (mut a_prog, mut a_consts, mut a_cols) = (base, base + dp.o_consts as u64, base + dp.o_cols as u64);
            let mut args = kargs![a_prog, nins, a_consts, a_cols, nn, mask, list, cap, counts, par, host_count];
            // SAFETY: `args` points at the eleven locals above, filter_eval's parameters in
            // order; as for filter_eval_v, with the program uploaded into d_prog above.
            unsafe {
                sys::cuLaunchKernel(self.kern.filter_eval, blocks, 1, 1, 256, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
            }
        };
        ck("launch filter_eval", r)?;
        self.fcols.evals += 1;
        Ok(())
    }

    /// d_count's count word of the evaluation launched last (gather_rows reads it).
    fn last_count_ptr(&self) -> u64 {
        self.fcols.d_count.ptr + 4 * ((self.fcols.evals.wrapping_sub(1)) & 1)
    }

    /// The count of the evaluation enqueued last. Callers read it after something enqueued
    /// later on the stream has been seen to finish (a scan's published results), so the kernel
    /// has written it; if the sentinel is still there, the stream is synchronised first.
    pub(super) fn read_count(&mut self) -> Result<usize> {
        let p = self.fcols.h_out.as_ref().expect("enqueue_eval allocated it").ptr as *const u32;
        // SAFETY: h_out is live pinned memory of at least 4 bytes, 4-aligned; filter_eval's
        // last block writes the word whole (volatile read).
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
        let (mut list, mut count, mut cap, mut nv16) = (self.fcols.d_list.ptr, self.last_count_ptr(), rows as u32, row16 as u32);
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
        Ok(TableArg { vecs: v, norms: nr, ids: id, ns, created: cr, expires: ex, mask: cm, rscale: 0, codes8: 0 })
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

    /// The laid-out program reads the same cells as the program: each leaf's renumbered column
    /// leads to the pointers of the store column it named, other instructions and the constants
    /// are unchanged, and only the columns read are listed. Programs that differ only in the
    /// columns they read are keyed apart.
    #[test]
    fn laid_out_programs_list_only_the_columns_they_read() {
        use crate::filter::program::{P_AND, P_CODE_IN, P_EXISTS, P_I64_RANGE, P_NOT, P_OR};
        let ins = |op, col, a, b| Ins { op, col, a, b };
        let prog = Program {
            ins: vec![
                ins(P_I64_RANGE, 7, 0, 0),
                ins(P_CODE_IN, 2, 2, 3),
                ins(P_OR, 0, 0, 0),
                ins(P_EXISTS, 7, 0, 0),
                ins(P_NOT, 0, 0, 0),
                ins(P_AND, 0, 0, 0),
            ],
            consts: vec![5, 9, 1, 4, 8],
        };
        let ptrs = |c: u32| (0x1000 + c as u64 * 0x10, 0x9000 + c as u64);
        let dp = DevProg::lay_out(&prog, ptrs, 3, 1000);
        let word = |o: usize| u32::from_le_bytes(dp.buf[o..o + 4].try_into().unwrap());
        let dword = |o: usize| u64::from_le_bytes(dp.buf[o..o + 8].try_into().unwrap());
        assert_eq!(dp.nins, 6);
        assert_eq!(dp.o_consts, 6 * 16);
        assert_eq!(dp.o_cols, dp.o_consts + 5 * 8);
        assert_eq!(dp.buf.len(), dp.o_cols + 2 * 16, "two columns read: 7, then 2");
        let used = [7u32, 2];
        for (j, i) in prog.ins.iter().enumerate() {
            assert_eq!([word(j * 16), word(j * 16 + 8), word(j * 16 + 12)], [i.op, i.a, i.b]);
            let col = word(j * 16 + 4);
            if (P_EXISTS..=crate::filter::program::P_BOOL_SET).contains(&i.op) {
                assert_eq!(used[col as usize], i.col, "instruction {j}");
                let at = dp.o_cols + col as usize * 16;
                assert_eq!((dword(at), dword(at + 8)), ptrs(i.col));
            } else {
                assert_eq!(col, i.col);
            }
        }
        for (j, &c) in prog.consts.iter().enumerate() {
            assert_eq!(dword(dp.o_consts + j * 8), c);
        }
        assert!(dp.buf.len() <= FPROG_MAX, "a typical program goes by value");
        assert_eq!(DevProg::lay_out(&prog, ptrs, 3, 1000).key, dp.key);
        let mut other = Program { ins: prog.ins.clone(), consts: prog.consts.clone() };
        other.ins[0].col = 6;
        other.ins[3].col = 6;
        let od = DevProg::lay_out(&other, ptrs, 3, 1000);
        assert_eq!(od.buf[..od.o_cols], dp.buf[..dp.o_cols], "same instructions once renumbered");
        assert_ne!(od.key, dp.key, "a program over other columns is another program");
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
