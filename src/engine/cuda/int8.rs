//! The int8 scan on the GPU (`scan = "int8"`; docs/GPU.md, "8-bit scan"): an 8-bit copy of
//! every row on the device (per-row scale, quantized there by `quantize_rows` exactly as
//! src/engine/quant.rs does), scanned by a build of the single-query kernel over codes for
//! the best `R` rows by approximate score; those are re-scored exactly on the host from the
//! store's f32 rows by the CPU engine's re-ranking step, which also counts uncertain answers.
//!
//! The device keeps the full-precision table too: batches, multi-query passes and dimensions
//! the int8 kernel does not serve (above 1536) scan it exactly.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::compile::{Geometry, KernelSpec, KMAX, NT};
use super::kernels::{Kernels, ScanFns};
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
    /// Scratch: the query's codes as the kernel reads them, and the scan's candidates.
    qf: Vec<f32>,
    cands: Vec<Hit>,
}

impl Int8 {
    /// Compiles the int8 scan's kernels for `spec` (the store's), when the dimension is one the
    /// GPU int8 scan serves; None otherwise.
    pub(super) fn load(ctx: &Arc<cudarc::driver::CudaContext>, spec: &KernelSpec, rerank: u32) -> Result<Option<Int8>> {
        let g = Geometry::of_codes(spec.dim);
        if !g.qreg {
            return Ok(None);
        }
        let spec = KernelSpec { codes: true, ..spec.clone() };
        let (module, fns) = Kernels::load_codes(ctx, &spec, g.byval, g.dp)?;
        Ok(Some(Int8 {
            fns,
            _module: module,
            dp8: g.dp,
            d_codes: DevBuf::empty(),
            d_scales: DevBuf::empty(),
            rerank,
            qf: Vec::new(),
            cands: Vec::new(),
        }))
    }

    /// Device bytes of one row.
    pub(super) fn row_bytes(&self) -> usize {
        self.dp8 + 4
    }
}

impl CudaEngine {
    /// Quantizes `m` staged rows (their numbers at `rows`, f32 values at `vals` on the device)
    /// into the codes; ordered before the staging buffer's reuse by the caller's sync.
    pub(super) fn quantize_staged(&mut self, rows: u64, vals: u64, m: usize) -> Result<()> {
        let Some(c) = &self.int8 else { return Ok(()) };
        let (mut a_rows, mut a_vals, mut mm, mut dp8, mut dc, mut ds) = (rows, vals, m as u32, c.dp8 as u32, c.d_codes.ptr, c.d_scales.ptr);
        let mut args = kargs![a_rows, a_vals, mm, dp8, dc, ds];
        let blocks = (m * 32).div_ceil(NT as usize).clamp(1, 4096) as u32;
        // SAFETY: `args` points at the six locals above, quantize_rows' parameters in order; the
        // staged rows are below the table's length, within the codes' and scales' capacity.
        ck("launch quantize_rows", unsafe {
            sys::cuLaunchKernel(self.kern.quantize_rows, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    /// Whether a single query takes the int8 scan: its kernels are loaded and the re-rank count
    /// for `k` fits one kernel's selection (else the exact scan answers, exactly).
    pub(super) fn takes_int8(&self, k: usize) -> bool {
        self.int8.as_ref().is_some_and(|c| quant::rerank_count(c.rerank, k) <= KMAX)
    }

    /// One query by the int8 scan: the best R rows by approximate score on the GPU, re-ranked
    /// exactly on the host (the CPU engine's step, which counts uncertain answers).
    pub(super) fn search_one_int8(&mut self, store: &Store, req: &SearchRequest<'_>, q: &[f32], out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let c = self.int8.as_mut().expect("takes_int8 checked");
        let r = quant::rerank_count(c.rerank, req.k);
        let mut qf = std::mem::take(&mut c.qf);
        let mut cands = std::mem::take(&mut c.cands);
        let code = self.hybrid.cpu.query_code(q);
        qf.clear();
        qf.extend(code.codes[..self.dim].iter().map(|&x| x as f32));
        let scale = code.scale;
        let res = self.scan_one(store, req, &qf, r, Some(scale), &mut cands);
        let res = res.map(|()| {
            // Every row left out scored at most the R-th candidate's approximate key.
            let full = cands.len() == r;
            let floor = cands.last().map_or(f32::NEG_INFINITY, |h| if self.metric == Metric::L2 { -h.score } else { h.score });
            super::super::reset_out(out, 1);
            self.hybrid.cpu.rerank_candidates(store, req, &cands, full, floor, &mut out[0]);
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
