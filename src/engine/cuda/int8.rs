//! The int8 scan on the GPU (`scan = "int8"`; docs/GPU.md, "8-bit scan"): an 8-bit copy of
//! every row on the device (per-row scale, quantized there by `quantize_rows` exactly as
//! src/engine/quant.rs does), scanned by a build of the single-query kernel over codes for
//! the best `R` rows by approximate score; those are re-scored exactly on the host from the
//! store's f32 rows by the CPU engine's re-ranking step, which also counts uncertain answers.
//!
//! With the 4-bit first pass (`KALOS_INT8_NIBBLE`, off by default; dimensions up to 1024) the
//! scan reads 4-bit codes instead (half the bytes a row): the kernel keeps the best R4 rows by
//! 4-bit score, re-scores those from the 8-bit codes in its merging block and returns the best R
//! of them, which the host re-scores exactly as above.
//!
//! The device keeps the full-precision table too: batches, multi-query passes and dimensions
//! the int8 kernel does not serve (above 1536) scan it exactly.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::compile::{Codes, Geometry, KernelSpec, KMAX, NT};
use super::kernels::{Kernels, ScanFns};
use super::single::Pass;
use super::{ck, CudaEngine, DevBuf};
use crate::engine::quant;
use crate::error::Result;
use crate::store::Store;
use crate::types::{Hit, Metric};
use crate::wire::SearchRequest;

/// The device side of the int8 scan.
pub(super) struct Int8 {
    pub(super) fns: ScanFns,
    _module: Arc<cudarc::driver::CudaModule>,
    /// Bytes of one row of codes (the dimension padded to 16).
    pub(super) dp8: usize,
    /// `cap_rows` rows of codes, and each row's scale (grown with the table's other columns by
    /// `ensure_capacity`).
    pub(super) d_codes: DevBuf,
    pub(super) d_scales: DevBuf,
    /// Option `rerank` (0: adapt to k).
    rerank: u32,
    /// The 4-bit first pass, when on and the dimension is one it serves.
    pub(super) nib: Option<Nib>,
    /// Scratch: the query's codes as the kernel reads them, and the scan's candidates.
    qf: Vec<f32>,
    cands: Vec<Hit>,
}

/// The int8 scan's 4-bit first pass on the device.
pub(super) struct Nib {
    pub(super) fns: ScanFns,
    _module: Arc<cudarc::driver::CudaModule>,
    /// Query values the kernel reads (the dimension padded to 32).
    pub(super) dp: usize,
    /// Bytes of one row of 4-bit codes (`dp / 2`) and `cap_rows` such rows.
    pub(super) row_bytes: usize,
    pub(super) d_codes: DevBuf,
    /// Candidates of the pass (R4), re-scored from the 8-bit codes in the kernel.
    pub(super) count: usize,
}

/// The most candidates the first pass keeps (`KALOS_INT8_NIBBLE`): one merging block re-scores
/// them, a thread each.
pub(super) const MAX_NIBBLE_COUNT: usize = NT as usize;

impl Int8 {
    /// Compiles the int8 scan's kernels for `spec` (the store's), when the dimension is one the
    /// GPU int8 scan serves; None otherwise.
    pub(super) fn load(ctx: &Arc<cudarc::driver::CudaContext>, spec: &KernelSpec, rerank: u32) -> Result<Option<Int8>> {
        let g = Geometry::of_codes(spec.dim);
        if !g.qreg {
            return Ok(None);
        }
        let s8 = KernelSpec { codes: Codes::Int8, ..spec.clone() };
        let (module, fns) = Kernels::load_codes(ctx, &s8, g.byval, g.dp)?;
        // Off unless KALOS_INT8_NIBBLE asks for it: its answers are seldom proved exact
        // (docs/GPU.md, "8-bit scan").
        let count = crate::config::tuning_or_default().int8_nibble.unwrap_or(0).min(MAX_NIBBLE_COUNT);
        let gn = Geometry::of_nibbles(spec.dim);
        let nib = if count >= 2 && gn.qreg {
            let sn = KernelSpec { codes: Codes::Nibble, ..spec.clone() };
            let (module, fns) = Kernels::load_codes(ctx, &sn, gn.byval, gn.dp)?;
            Some(Nib { fns, _module: module, dp: gn.dp, row_bytes: gn.dp / 2, d_codes: DevBuf::empty(), count })
        } else {
            None
        };
        Ok(Some(Int8 {
            fns,
            _module: module,
            dp8: g.dp,
            d_codes: DevBuf::empty(),
            d_scales: DevBuf::empty(),
            rerank,
            nib,
            qf: Vec::new(),
            cands: Vec::new(),
        }))
    }

    /// Device bytes of one row.
    pub(super) fn row_bytes(&self) -> usize {
        self.dp8 + 4 + self.nib.as_ref().map_or(0, |n| n.row_bytes)
    }

    /// The first pass's candidate count for `r` re-ranked rows, when it takes the query: its
    /// 8-bit stage must keep fewer rows than the pass (the last output slot carries the pass's
    /// cut).
    pub(super) fn nibble_count(&self, r: usize) -> Option<usize> {
        self.nib.as_ref().map(|n| n.count).filter(|&c| r < c)
    }
}

impl CudaEngine {
    /// Quantizes `m` staged rows (their numbers at `rows`, f32 values at `vals` on the device)
    /// into the codes; ordered before the staging buffer's reuse by the caller's sync.
    pub(super) fn quantize_staged(&mut self, rows: u64, vals: u64, m: usize) -> Result<()> {
        let Some(c) = &self.int8 else { return Ok(()) };
        let (mut a_rows, mut a_vals, mut mm, mut dp8, mut dc, mut ds) = (rows, vals, m as u32, c.dp8 as u32, c.d_codes.ptr, c.d_scales.ptr);
        let (mut dpn, mut dn) = c.nib.as_ref().map_or((0u32, 0u64), |n| (n.row_bytes as u32, n.d_codes.ptr));
        let mut args = kargs![a_rows, a_vals, mm, dp8, dc, ds, dpn, dn];
        let blocks = (m * 32).div_ceil(NT as usize).clamp(1, 4096) as u32;
        // SAFETY: `args` points at the eight locals above, quantize_rows' parameters in order; the
        // staged rows are below the table's length, within the codes', scales' and 4-bit codes'
        // capacity (dn is 0 without the first pass).
        ck("launch quantize_rows", unsafe {
            sys::cuLaunchKernel(self.kern.quantize_rows, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    /// Whether a single query takes the int8 scan: its kernels are loaded and the re-rank count
    /// for `k` fits one kernel's selection (else the exact scan answers, exactly).
    pub(super) fn takes_int8(&self, k: usize) -> bool {
        self.int8.as_ref().is_some_and(|c| quant::rerank_count(c.rerank, k) <= KMAX)
    }

    /// One query by the int8 scan: the best R rows by approximate score on the GPU (through the
    /// 4-bit first pass when it takes R), re-ranked exactly on the host (the CPU engine's step,
    /// which counts uncertain answers).
    pub(super) fn search_one_int8(&mut self, store: &Store, req: &SearchRequest<'_>, q: &[f32], out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let c = self.int8.as_mut().expect("takes_int8 checked");
        let r = quant::rerank_count(c.rerank, req.k);
        let r4 = c.nibble_count(r);
        let mut qf = std::mem::take(&mut c.qf);
        let mut cands = std::mem::take(&mut c.cands);
        let code = self.hybrid.cpu.query_code(q);
        qf.clear();
        qf.extend(code.codes[..self.dim].iter().map(|&x| x as f32));
        let scale = code.scale;
        let (pass, k) = match r4 {
            Some(r4) => (Pass::Nibble { scale, kf: r }, r4),
            None => (Pass::Int8 { scale }, r),
        };
        let res = self.scan_one(store, req, &qf, k, pass, &mut cands);
        let res = res.map(|nib| {
            let key = |score: f32| if self.metric == Metric::L2 { -score } else { score };
            // Every row left out scored at most the R-th candidate's approximate key; with the
            // first pass, a row it left out scored at most its last candidate's 4-bit key.
            let full = cands.len() == r;
            let floor = cands.last().map_or(f32::NEG_INFINITY, |h| key(h.score));
            let first = nib.filter(|n| n.count == k).map(|n| key(n.floor_score));
            self.stats.nibble_queries += nib.is_some() as u64;
            super::super::reset_out(out, 1);
            self.hybrid.cpu.rerank_candidates(store, req, &cands, full, floor, first, &mut out[0]);
            if let Some(d) = req.direct {
                d.write_hits(&out[0]);
            }
        });
        let c = self.int8.as_mut().expect("takes_int8 checked");
        c.qf = qf;
        c.cands = cands;
        res
    }
}
