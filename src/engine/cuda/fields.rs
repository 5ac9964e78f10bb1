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

use std::ffi::c_void;

use cudarc::driver::sys;

use super::compile::NT;
use super::table::TableArg;
use super::{ck, CudaEngine, DevBuf, HostBuf};
use crate::error::Result;
use crate::filter::program::{cell, Ins, Program};
use crate::filter::Bitmap;
use crate::meta::{ColumnData, FieldType};
use crate::store::Store;

/// Most matching rows `filter_eval` lists for the host.
pub(super) const LIST_CAP: usize = 65536;
/// A filter matching at most one row in this many is scored on the CPU from its row list.
pub(super) const SPARSE_DIV: usize = 1000;

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
    /// expires, for `sc_cap` rows.
    sc: [DevBuf; 6],
    sc_cap: usize,
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
        }
    }
}

/// How a filtered search goes on.
pub(super) enum FilterPlan {
    /// The filter reads a tags field: the CPU engine answers.
    Cpu,
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

    /// Evaluates `prog` over the table's rows on the GPU: fills the mask and decides the plan
    /// (`list_on_host`: a sparse filter's rows come back to the host, else they stay listed on
    /// the device).
    pub(super) fn eval_filter(&mut self, prog: &Program, list_on_host: bool) -> Result<FilterPlan> {
        let t0 = std::time::Instant::now();
        self.fcols.last_ns = [0; 2];
        let n = self.table.len;
        if self.fcols.d_mask.bytes < n.div_ceil(32) * 4 {
            return Ok(FilterPlan::Cpu);
        }
        if prog.ins.iter().any(|i| {
            i.op >= crate::filter::program::P_EXISTS
                && i.op <= crate::filter::program::P_BOOL_SET
                && self.fcols.cols.get(i.col as usize).is_none_or(|c| c.is_none())
        }) {
            return Ok(FilterPlan::Cpu);
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
        grow(&mut self.fcols.d_prog, buf.len(), "filter program")?;
        grow(&mut self.fcols.d_list, LIST_CAP * 4, "filter row list")?;
        grow(&mut self.fcols.d_count, 4, "filter count")?;
        if self.fcols.h_prog.as_ref().is_none_or(|h| h.bytes < buf.len()) {
            self.fcols.h_prog = Some(HostBuf::new(buf.len().next_power_of_two())?);
        }
        if self.fcols.h_out.is_none() {
            self.fcols.h_out = Some(HostBuf::new(4 + LIST_CAP * 4)?);
        }
        let h_prog = self.fcols.h_prog.as_mut().expect("allocated above");
        // The previous filter's upload is complete: every eval ends with a stream sync.
        h_prog.slice()[..buf.len()].copy_from_slice(&buf);
        let (hp, hout) = (h_prog.ptr as *const c_void, self.fcols.h_out.as_ref().expect("allocated above").ptr as *mut c_void);
        // SAFETY: pinned source of buf.len() bytes into d_prog (at least as large), on the
        // engine's stream; the 4-byte count reset is within d_count.
        unsafe {
            ck("filter program upload", sys::cuMemcpyHtoDAsync_v2(self.fcols.d_prog.ptr, hp, buf.len(), self.stream))?;
            ck("filter count reset", sys::cuMemsetD32Async(self.fcols.d_count.ptr, 0, 1, self.stream))?;
        }
        let base = self.fcols.d_prog.ptr;
        let (mut a_prog, mut a_consts, mut a_cols) = (base, base + o_consts as u64, base + o_cols as u64);
        let mut nins = ni as u32;
        let mut nn = n as u32;
        let mut mask = self.fcols.d_mask.ptr;
        let mut list = self.fcols.d_list.ptr;
        let mut cap = LIST_CAP as u32;
        let mut count = self.fcols.d_count.ptr;
        let mut args = kargs![a_prog, nins, a_consts, a_cols, nn, mask, list, cap, count];
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        // SAFETY: `args` points at the nine locals above, filter_eval's parameters in order; the
        // program reads columns that hold the table's n rows, the mask holds cap_rows >= n bits.
        // Then the count and (at most LIST_CAP) rows into the pinned h_out, which holds both.
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
        self.sync_stream()?;
        self.fcols.last_ns[0] = ns_since(t0);
        let out = self.fcols.h_out.as_mut().expect("allocated above").slice();
        let m = u32::from_le_bytes(out[..4].try_into().expect("4 bytes")) as usize;
        if m == 0 {
            return Ok(FilterPlan::Empty);
        }
        if m <= LIST_CAP && m.saturating_mul(SPARSE_DIV) <= n && !list_on_host {
            return Ok(FilterPlan::Sparse(m));
        }
        if m <= LIST_CAP && m.saturating_mul(SPARSE_DIV) <= n {
            // SAFETY: the first m <= LIST_CAP rows of d_list into h_out past the count.
            unsafe {
                ck(
                    "filter rows",
                    sys::cuMemcpyDtoHAsync_v2((hout as *mut u8).add(4) as *mut c_void, self.fcols.d_list.ptr, m * 4, self.stream),
                )?;
            }
            self.sync_stream()?;
            let out = self.fcols.h_out.as_mut().expect("allocated above").slice();
            let mut rows: Vec<u32> =
                out[4..4 + m * 4].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
            rows.sort_unstable();
            self.fcols.last_ns[1] = ns_since(t0) - self.fcols.last_ns[0];
            return Ok(FilterPlan::Rows(rows));
        }
        Ok(FilterPlan::Mask)
    }
}

impl CudaEngine {
    /// Gathers the `m` rows the last `eval_filter` listed on the device into the compact table
    /// (grown as needed) and returns its columns for the single-query kernel.
    pub(super) fn gather_sparse(&mut self, m: usize) -> Result<TableArg> {
        let row16 = self.dp * self.esize / 16;
        if self.fcols.sc_cap < m {
            let cap = m.next_power_of_two();
            let sizes = [cap * row16 * 16, cap * 4, cap * 8, cap * 8, cap * 8, cap * 8];
            for (b, bytes) in self.fcols.sc.iter_mut().zip(sizes) {
                *b = DevBuf::new(bytes, "sparse filter rows")?;
            }
            self.fcols.sc_cap = cap;
            // Graphs of the compact table hold the old buffers' addresses.
            self.sq.graphs.clear();
        }
        let t = self.table_arg();
        let [v, nr, id, ns, cr, ex] = self.fcols.sc.each_ref().map(|b| b.ptr);
        let (mut list, mut count, mut cap, mut nv16) = (self.fcols.d_list.ptr, self.fcols.d_count.ptr, m as u32, row16 as u32);
        let (mut s_v, mut s_n, mut s_i, mut s_ns, mut s_c, mut s_e) = (t.vecs, t.norms, t.ids, t.ns, t.created, t.expires);
        let (mut d_v, mut d_n, mut d_i, mut d_ns, mut d_c, mut d_e) = (v, nr, id, ns, cr, ex);
        let mut args = kargs![list, count, cap, nv16, s_v, s_n, s_i, s_ns, s_c, s_e, d_v, d_n, d_i, d_ns, d_c, d_e];
        let blocks = (m * row16).div_ceil(NT as usize).clamp(1, 1024) as u32;
        // SAFETY: `args` points at the 16 locals above, gather_rows' parameters in order; the
        // list holds m <= LIST_CAP rows of the table (filter_eval, this stream), the compact
        // buffers hold sc_cap >= m rows.
        ck("launch gather_rows", unsafe {
            sys::cuLaunchKernel(self.kern.gather_rows, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
        })?;
        Ok(TableArg { vecs: v, norms: nr, ids: id, ns, created: cr, expires: ex, mask: 0, rscale: 0 })
    }
}

fn ns_since(t: std::time::Instant) -> u32 {
    t.elapsed().as_nanos().min(u32::MAX as u128) as u32
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
