//! Gated batch tiles (kernels/batch.cu, "Gated tiles"; docs/GPU.md): f16 batches with no
//! filter score every tile after the first with a cuBLASLt GEMM (lt.rs) that zeroes the rows
//! below each query's bound, and gate_scan collects the rest. batch.rs decides when a batch is
//! gated and launches gate_bias between the first tile and the gated ones.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::compile::NT;
use super::{align_up, ck, lt, CudaEngine};
use crate::error::{Error, Result, Status};

/// Score tile bytes (counted as f32, as SCORE16_TILE_BYTES) of a gated batch: 131072 rows for
/// 1024 queries. On the H200 (1024 x 1M x 768 f16, gated GEMMs + scans pipelined): 2.76 ms at
/// 131072 rows a tile, 2.94 at 98304, 3.08 at 65536 (docs/history/gpu-sessions.md, eleventh session).
pub(super) const GATE_TILE_BYTES: usize = 512 << 20;
/// Candidates a query's buffer holds in a gated batch: the first tile's cut (up to 2k) and
/// every later row above the query's bound (about k per tile of the first tile's size on
/// random data); past it the batch is answered again from f32 tiles.
pub(super) const GATE_CAP: usize = 2048;
/// Fewest rows of a gated batch's first tile (16384 was slower than 32768-65536 on the H200).
pub(super) const GATE_FIRST_MIN: usize = 32768;

/// Gating state.
pub(super) struct Gate {
    /// cuBLASLt, set up on the first batch that may be gated.
    pub(super) lt: Option<lt::Lt>,
    /// Why gated tiles are off for this engine's life (cuBLASLt missing or failed); None while
    /// they may be used.
    pub(super) off: Option<String>,
    /// The batch in progress uses gated tiles (search_batch answers it again without them if it
    /// fails).
    pub(super) active: bool,
}

impl CudaEngine {
    /// True when the gated tiles' cuBLASLt is set up (on first use; a failure turns gating off
    /// for good, with the reason in `gate.off`).
    pub(super) fn lt_ready(&mut self) -> bool {
        if self.gate.lt.is_some() {
            return true;
        }
        if self.gate.off.is_some() {
            return false;
        }
        if !lt::present() {
            self.gate.off = Some("libcublasLt (or one of its functions) was not found".into());
            return false;
        }
        match lt::Lt::new(self.dp) {
            Ok(l) => {
                self.gate.lt = Some(l);
                true
            }
            Err(e) => {
                self.gate.off = Some(e.message);
                false
            }
        }
    }

    /// One gated tile (kernels/batch.cu, "Gated tiles"): out = max(0, queries · rows + bias) in
    /// f16, align_up(m, 8) scores a row, on `stream`; `tune`: a full tile (its shape's
    /// algorithms are timed the first time).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_gated(&mut self, d_q: u64, d_bias: u64, out: u64, row0: usize, rows: usize, m: usize, tune: bool) -> Result<()> {
        let rows0 = self.table.d_vecs.ptr + (row0 * self.dp * self.esize) as u64;
        let stream = self.stream;
        let lt = self.gate.lt.as_mut().ok_or_else(|| Error::new(Status::Internal, "gated tile without cuBLASLt"))?;
        lt.gemm(d_q, rows0, d_bias, out, m, align_up(m, 8), rows, stream, tune)
    }

    /// Launches gate_scan over a gated tile (rows `row0..row0+rows`), appending its nonzero
    /// scores to the candidate buffers (`cap` per query).
    pub(super) fn gate_scan(&self, scores: u64, stream: sys::CUstream, row0: usize, rows: usize, m: usize, cap: usize) -> Result<()> {
        let b = self.batch.bufs.as_ref().ok_or_else(|| Error::new(Status::Internal, "batch buffers missing"))?;
        let ldm = align_up(m, 8);
        let n16 = (ldm * rows / 8) as u64;
        let (mut a_d, mut a_n16, mut a_ldm, mut a_m, mut a_row0) = (scores, n16, ldm as u32, m as u32, row0 as u32);
        let (mut a_bk, mut a_br, mut a_bc, mut a_cap, mut a_ovf) = (b.d_bkey.ptr, b.d_brow.ptr, b.d_bcnt.ptr, cap as u32, b.d_overflow.ptr);
        let mut args = kargs![a_d, a_n16, a_ldm, a_m, a_row0, a_bk, a_br, a_bc, a_cap, a_ovf];
        let blocks = (self.sms * 8).min((n16 as usize).div_ceil(NT as usize)).max(1) as u32;
        // SAFETY: `scores` holds ldm * rows halves (ensure_batch with align_up(nqt, 8) queries),
        // the candidate buffers m * cap entries and m counts.
        ck("launch gate_scan", unsafe {
            sys::cuLaunchKernel(self.kern.gate_scan, blocks, 1, 1, NT, 1, 1, 0, stream, args.as_mut_ptr(), std::ptr::null_mut())
        })
    }
}
