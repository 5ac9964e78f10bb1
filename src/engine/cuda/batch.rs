//! Batches (docs/GPU.md, "Batch path"): queries in groups; for each group the table is cut
//! into tiles, each scored by one cuBLAS GEMM (f32 accumulation; f32 or, for f16 storage, f16
//! score tiles) and filtered per query against a running k-th-key bound into a bounded
//! candidate buffer (kernels/batch.cu); a final kernel selects and sorts each query's top k.
//! f16 batches can pipeline GEMM and filter on two streams and gate their tiles (gate.rs).

use std::ffi::c_void;

use cudarc::cublas::sys as cb;
use cudarc::driver::sys;

use super::compile::{KMAX, NT, PARAMS_BYTES, SMEM_MAIN};
use super::gate::{GATE_CAP, GATE_FIRST_MIN, GATE_TILE_BYTES};
use super::{align_up, ck, ckb, grow, CudaEngine, DevBuf, Params, NONE_U32};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{Dtype, Hit, Metric};
use crate::wire::SearchRequest;

/// Bytes of GEMM score tile per batch step. 96 MB beat 24 and 48 MB on the H200
/// (docs/history/gpu-sessions.md): larger GEMMs run faster than the L2 reuse of a smaller tile
/// saves.
pub(super) const SCORE_TILE_BYTES: usize = 96 << 20;
/// The same for f16 score tiles, counted as f32 (the tile itself is half this; two of them when
/// pipelined): larger tiles mean fewer filter blocks, each paying its start-up once per tile.
/// H200, 1024 x 1M x 768 f16, pipelined, engine p50 (docs/history/gpu-sessions.md, seventh
/// session, gpu_probe): 96 MB 4.42 ms, 192 MB 4.03 ms, 384 MB 3.84 ms (48 MB 4.92 ms).
pub(super) const SCORE16_TILE_BYTES: usize = 384 << 20;
/// Candidate-buffer budget of one batch step.
const CAND_BYTES: usize = 256 << 20;
/// Filter steps per cruise segment (no barrier inside; `Params::fseg`, kernels/batch.cu
/// batch_filter_body; 0 or 1: a barrier every step). 16 measured best: the engine took 3.63
/// instead of 3.85 ms per 1024 x 1M x 768 f16 batch on the H200. Cruising relies on every warp
/// of a block agreeing on the query's bound, which the kernel therefore reads once per block
/// (docs/history/gpu-sessions.md, ninth session).
pub const FILTER_SEG: u32 = 16;
/// Largest k answered from f16 score tiles (their cuts keep up to 2k tied rows per filter block).
const SCORE16_MAX_K: usize = 256;

/// Batch settings, the score type of the batch in progress, and the batch buffers.
pub(super) struct Batch {
    /// Grown to the largest batch seen (ensure_batch); None before the first batch.
    pub(super) bufs: Option<BatchBufs>,
    /// f16 storage: batches with ip / cosine, no recency and k <= 256 score into f16 tiles
    /// (f32 accumulation, output rounded: half the tile traffic of f32 tiles) and stay exact:
    /// cuts keep ties and the survivors are rescored in f32 (kernels/batch.cu, "Batches").
    /// Cleared for good when a batch overflows the f16 range (that batch is answered again from
    /// f32 tiles).
    pub(super) score16: bool,
    /// Score type of the batch in progress (gemm_one, filter_tile read it).
    pub(super) tile16: bool,
    /// Rows per score tile: this many bytes of f32 scores for the batch's queries (f16 tiles
    /// hold half the bytes), `tile16_bytes` for f16 tiles.
    pub(super) tile_bytes: usize,
    pub(super) tile16_bytes: usize,
    /// Rows per step of a batch_filter block (NT * FU * 4).
    pub(super) fstep: usize,
    /// Pipelined batches (GEMM and filter on two streams).
    pub(super) pipe: bool,
    /// Filter steps per cruise segment (`FILTER_SEG`).
    pub(super) filter_seg: u32,
    /// SMs the GEMMs of a pipelined batch may use (cublasSetSmCountTarget; `sms` = all),
    /// leaving the rest to the filters; tuning probes only.
    pub(super) gemm_sms: usize,
    /// The handle's current SM count target (0 = all, the cuBLAS default).
    pub(super) sm_target: i32,
}

pub(super) struct BatchBufs {
    d_qf32: DevBuf,
    pub(super) d_q: DevBuf,
    /// bf16 storage: the queries' residual (q - bf16(q), in bf16), scored by a second GEMM
    /// (empty otherwise).
    d_qlo: DevBuf,
    d_qn: DevBuf,
    d_params: DevBuf,
    d_scores: DevBuf,
    /// The second score tile of a pipelined batch (the GEMM of tile t+1 writes it while tile t
    /// is filtered; empty when not pipelined).
    d_scores2: DevBuf,
    pub(super) d_bkey: DevBuf,
    pub(super) d_brow: DevBuf,
    pub(super) d_bcnt: DevBuf,
    d_oids: DevBuf,
    d_oscores: DevBuf,
    d_ocnt: DevBuf,
    d_thr: DevBuf,
    /// Gated tiles: each query's bias (f16), -(bound - margin) (gate_bias).
    d_bias: DevBuf,
    /// f16 score tiles: set by batch_filter_h when a score overflowed the f16 range.
    pub(super) d_overflow: DevBuf,
}

impl BatchBufs {
    fn empty() -> BatchBufs {
        BatchBufs {
            d_qf32: DevBuf::empty(),
            d_q: DevBuf::empty(),
            d_qlo: DevBuf::empty(),
            d_qn: DevBuf::empty(),
            d_params: DevBuf::empty(),
            d_scores: DevBuf::empty(),
            d_scores2: DevBuf::empty(),
            d_bkey: DevBuf::empty(),
            d_brow: DevBuf::empty(),
            d_bcnt: DevBuf::empty(),
            d_oids: DevBuf::empty(),
            d_oscores: DevBuf::empty(),
            d_ocnt: DevBuf::empty(),
            d_thr: DevBuf::empty(),
            d_bias: DevBuf::empty(),
            d_overflow: DevBuf::empty(),
        }
    }
}

/// One query group's batch_filter launch shape: queries, rows per block, candidate-buffer
/// capacity and cut level per query, dynamic shared memory.
struct FilterStep {
    m: usize,
    span: usize,
    cap: usize,
    high: usize,
    smem: u32,
}

/// Dynamic shared memory of batch_filter for `kx` kept rows per cut (k, or 2k for f16 tiles,
/// whose cuts keep ties) and `fstep` rows per step: survivor slots sb = kx + fstep * 3 / 2, then
/// kx selection slots, (key, row) each (the kernel's layout).
pub(super) fn filter_smem(kx: usize, fstep: usize) -> usize {
    (2 * kx + fstep * 3 / 2) * 8
}

/// A score tile size given in MB (tuning probes), within 4 MB..1 GB.
fn tile_mb_bytes(mb: usize) -> usize {
    mb.clamp(4, 1024) << 20
}

impl CudaEngine {
    /// Tuning probes only: batch pipelining, the GEMMs' SM count (0 = all), f16 score tiles
    /// (f16 storage; ignored otherwise), the score tile's size in MB (0: the defaults) and the
    /// filter's cruise segment in steps (0 or 1: off).
    #[doc(hidden)]
    pub fn set_batch_tuning(&mut self, pipe: bool, gemm_sms: usize, score16: bool, tile_mb: usize, filter_seg: u32) {
        let b = &mut self.batch;
        b.pipe = pipe;
        b.filter_seg = filter_seg;
        (b.tile_bytes, b.tile16_bytes) = match tile_mb {
            0 => (SCORE_TILE_BYTES, SCORE16_TILE_BYTES),
            mb => (tile_mb_bytes(mb), tile_mb_bytes(mb)),
        };
        b.gemm_sms = if gemm_sms == 0 { self.sms } else { gemm_sms.min(self.sms) };
        b.score16 = score16 && self.dtype == Dtype::F16;
    }

    /// Tuning probes only: engine time (ns) of the last batched search.
    #[doc(hidden)]
    pub fn last_batch_ns(&self) -> u64 {
        self.stats.batch_times.last().map_or(0, |&(_, t)| t)
    }

    /// Tuning probes only: SMs of the device.
    #[doc(hidden)]
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// Makes every batch buffer large enough for `nq` queries, `k` results, a score tile of
    /// `tile_rows` rows and `buf_cap` candidates per query. Each buffer only grows, by its own
    /// byte size: a 1024-query batch (short, wide tiles) and an 8-query one (long tiles) need
    /// about the same bytes, so alternating them reallocates nothing (freeing and allocating
    /// every buffer at each switch cost ~5 ms on the H200). The sizes stay bounded: the score
    /// tile by `tile_bytes` (or one 4M-row column), the candidates by CAND_BYTES.
    fn ensure_batch(&mut self, nq: usize, k: usize, tile_rows: usize, buf_cap: usize, pipe: bool) -> Result<()> {
        let (dim, dp, esize, bf16, tile16) = (self.dim, self.dp, self.esize, self.dtype == Dtype::Bf16, self.batch.tile16);
        let b = self.batch.bufs.get_or_insert_with(BatchBufs::empty);
        let nqp = nq.next_power_of_two();
        grow(&mut b.d_qf32, nqp * dim * 4, "batch queries")?;
        grow(&mut b.d_q, nqp * dp * esize, "batch queries")?;
        if bf16 {
            grow(&mut b.d_qlo, nqp * dp * esize, "batch query residuals")?;
        }
        grow(&mut b.d_qn, nqp * 4, "query norms")?;
        grow(&mut b.d_params, PARAMS_BYTES, "batch params")?;
        // f16 tiles: 2 bytes a score (columns padded to 8 rows: tile_ld).
        let sbytes = nq * align_up(tile_rows, 8) * if tile16 { 2 } else { 4 };
        grow(&mut b.d_scores, sbytes, "score tile")?;
        if pipe {
            grow(&mut b.d_scores2, sbytes, "second score tile")?;
        }
        grow(&mut b.d_bkey, nqp * buf_cap * 4, "batch candidates")?;
        grow(&mut b.d_brow, nqp * buf_cap * 4, "batch candidates")?;
        grow(&mut b.d_bcnt, nqp * 4, "batch candidate counts")?;
        grow(&mut b.d_oids, nqp * k * 8, "batch ids")?;
        grow(&mut b.d_oscores, nqp * k * 4, "batch scores")?;
        grow(&mut b.d_ocnt, nqp * 4, "batch counts")?;
        grow(&mut b.d_thr, nqp * 4, "batch thresholds")?;
        grow(&mut b.d_bias, nqp * 2, "batch gate biases")?;
        // [f16 overflow bits, first non-finite query value and first all-zero cosine query of a
        // slot batch (check_queries)]
        grow(&mut b.d_overflow, 12, "batch overflow flag")?;
        Ok(())
    }

    /// Leading dimension of a score tile of `rows` rows: columns start 16-byte aligned for the
    /// filter's vector loads (4 f32 or 8 f16 scores).
    fn tile_ld(&self, rows: usize) -> usize {
        align_up(rows, if self.batch.tile16 { 8 } else { 4 })
    }

    /// One GEMM: scores[rows x m] (column-major, ld = ldc >= rows) = table[row0..row0+rows] · queries.
    /// For bf16 storage a second GEMM adds the query residual's scores (d_qlo, beta = 1).
    fn gemm_tile(&self, d_q: u64, d_scores: u64, row0: usize, rows: usize, m: usize, ldc: usize) -> Result<()> {
        self.gemm_one(d_q, 0.0, d_scores, row0, rows, m, ldc)?;
        match self.batch.bufs.as_ref().map(|b| b.d_qlo.ptr).filter(|&p| p != 0) {
            Some(lo) => self.gemm_one(lo, 1.0, d_scores, row0, rows, m, ldc),
            None => Ok(()),
        }
    }

    /// scores = table[row0..row0+rows] · queries + beta * scores (see gemm_tile).
    #[allow(clippy::too_many_arguments)]
    fn gemm_one(&self, d_q: u64, beta: f32, d_scores: u64, row0: usize, rows: usize, m: usize, ldc: usize) -> Result<()> {
        let alpha = 1.0f32;
        let a = self.table.d_vecs.ptr + (row0 * self.dp * self.esize) as u64;
        // SAFETY: a, d_q and d_scores are device buffers of at least rows*dp, m*dp and ldc*m
        // elements (ensure_capacity; ensure_batch sizes the score tile for the tile's rows, of
        // which ldc = align_up(rows, 4) is at most), on the engine's stream.
        unsafe {
            if self.dtype == Dtype::F32 {
                ckb(
                    "cublasSgemm",
                    cb::cublasSgemm_v2(
                        self.blas,
                        cb::cublasOperation_t::CUBLAS_OP_T,
                        cb::cublasOperation_t::CUBLAS_OP_N,
                        rows as i32,
                        m as i32,
                        self.dp as i32,
                        &alpha,
                        a as *const f32,
                        self.dp as i32,
                        d_q as *const f32,
                        self.dp as i32,
                        &beta,
                        d_scores as *mut f32,
                        ldc as i32,
                    ),
                )
            } else {
                let ty = if self.dtype == Dtype::F16 { cb::cudaDataType::CUDA_R_16F } else { cb::cudaDataType::CUDA_R_16BF };
                ckb(
                    "cublasGemmEx",
                    cb::cublasGemmEx(
                        self.blas,
                        cb::cublasOperation_t::CUBLAS_OP_T,
                        cb::cublasOperation_t::CUBLAS_OP_N,
                        rows as i32,
                        m as i32,
                        self.dp as i32,
                        &alpha as *const f32 as *const c_void,
                        a as *const c_void,
                        ty,
                        self.dp as i32,
                        d_q as *const c_void,
                        ty,
                        self.dp as i32,
                        &beta as *const f32 as *const c_void,
                        d_scores as *mut c_void,
                        if self.batch.tile16 { cb::cudaDataType::CUDA_R_16F } else { cb::cudaDataType::CUDA_R_32F },
                        ldc as i32,
                        cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    ),
                )
            }
        }
    }

    /// Batched search: queries in groups of `nqt`; for each group the table is cut in tiles of
    /// `tile` rows, each tile scored by one GEMM (cuBLAS, f32 accumulation; plain SGEMM for f32
    /// storage) and filtered per query against a running threshold into a bounded candidate
    /// buffer (kernels/batch.cu, "Batches"); a final kernel selects and sorts each query's top k.
    pub(super) fn search_batch(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        // f16 score tiles where rounding a score is monotone in the key (ip / cosine without
        // recency: the key is the score itself; l2 adds each row's norm, recency each row's
        // boost) and the tie room of a cut fits (k <= 256; kernels/batch.cu, "Batches").
        if req.slot.is_some() {
            self.stats.slot_batches += 1;
        }
        self.batch.tile16 = self.batch.score16 && self.metric != Metric::L2 && req.recency.is_none() && req.k <= SCORE16_MAX_K;
        let mut r = self.search_batch_tiles(store, req, out);
        let gate_failed = match &r {
            Err(e) if self.gate.active && !e.status.is_request_error() => Some(e.message.clone()),
            _ => None,
        };
        if let Some(m) = gate_failed {
            // A gated batch failed (cuBLASLt): answer it again without gating, and keep gating
            // off for this engine's life. A fault of the GPU itself fails the second try too; a
            // bad query (the request's own error) is no failure of gating.
            // SAFETY: the engine's own streams.
            unsafe {
                sys::cuStreamSynchronize(self.fstream);
                sys::cuStreamSynchronize(self.stream);
            }
            self.gate.off = Some(format!("a gated batch failed: {m}"));
            self.gate.lt = None;
            r = self.search_batch_tiles(store, req, out);
        }
        if let Ok(Some(bits)) = r {
            // Bit 1: a score beyond the f16 range (vectors of large norm): answer again from f32
            // tiles, and keep to them for this engine's life. Bit 2: a tie group larger than a
            // cut's room (many equal scores near the k-th): this batch only.
            if bits & 1 != 0 {
                self.batch.score16 = false;
            }
            self.batch.tile16 = false;
            self.stats.score16_overflows += 1;
            r = self.search_batch_tiles(store, req, out);
        }
        self.batch.tile16 = false;
        if r.is_err() {
            // A pipelined batch may have left filters queued on the second stream: let them
            // finish before anything reuses the buffers (the error is already reported).
            // SAFETY: the engine's own stream.
            unsafe { sys::cuStreamSynchronize(self.fstream) };
        }
        r.map(|_| ())
    }

    /// search_batch with the score type of `self.batch.tile16`. Ok(Some(bits)): an f16 batch
    /// overflowed (bits as in search_batch), `out` holds nothing and the batch must be answered
    /// again from f32 tiles.
    fn search_batch_tiles(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<Option<u32>> {
        let t_start = std::time::Instant::now();
        let n = self.table.len;
        let dim = self.dim;
        let k = req.k.min(KMAX);
        let nq_all = req.nq;
        // Rows per tile and queries per group, so that the score tile stays ~tile_bytes and the
        // candidate buffers (high + k per filter block of a tile, per query) within CAND_BYTES.
        // A buffer past `high` entries is cut back to its top k, which also makes thr[q] the
        // true k-th key of the rows seen so far: small, so the threshold tightens within the
        // first few tiles and later filter blocks mostly append nothing.
        let high = (4 * k).max(256);
        // Rows a filter block keeps per cut: k, or with f16 tiles up to 2k (ties kept).
        let kx = if self.batch.tile16 { 2 * k } else { k };
        let mut nqt = nq_all.min(1024);
        // Gated tiles: f16 tiles, pipelined, and no filter, recency or expiry (every row's key
        // is its score), with cuBLASLt at hand.
        self.gate.active = false;
        let plain = |e: &Self| {
            let p = e.fill_params(req, store, n, k, 0, 0);
            p.flags == 0 && p.nns == NONE_U32
        };
        let lt_ok = self.batch.tile16 && self.batch.pipe && plain(self) && self.lt_ready();
        let tile_bytes = match (lt_ok, self.batch.tile16) {
            (true, _) => GATE_TILE_BYTES,
            (false, true) => self.batch.tile16_bytes,
            (false, false) => self.batch.tile_bytes,
        };
        // Filter blocks: one per query and span of a tile's rows, at least ~4 per SM in all.
        let sms = self.sms;
        let fstep = self.batch.fstep;
        let sizes = |nqt: usize| {
            let tile = (tile_bytes / (nqt * 4) / fstep * fstep).clamp(fstep, 1 << 22).min(align_up(n, fstep));
            let span = align_up(tile.div_ceil((4 * sms).div_ceil(nqt).max(1)), fstep);
            let gx = tile.div_ceil(span);
            let cap = high + gx * kx;
            (tile, span, gx, cap)
        };
        while nqt > 1 && nqt * sizes(nqt).3 * 8 > CAND_BYTES {
            nqt /= 2;
        }
        let (tile, span, gx, cap) = sizes(nqt);
        let gated = lt_ok && n > tile;
        self.gate.active = gated;
        // Gated: a first tile of `first` rows sets the bounds (plain GEMM + filter), then gated
        // tiles of `tile` rows. Rows passing a bound: about k * (n - first) / first a query on
        // random data.
        // Default n * k / 160 rows (~160 rows passing a query's bound on random data); 65536 at
        // 1M rows and k = 10, the best of 16k-131k rows on the H200 (docs/history/gpu-sessions.md).
        let first = if gated { (n * k / 160).clamp(GATE_FIRST_MIN.min(tile), tile) / fstep * fstep } else { tile };
        let tiles: Vec<(usize, usize)> = if gated {
            std::iter::once((0, first)).chain((first..n).step_by(tile).map(|r0| (r0, (n - r0).min(tile)))).collect()
        } else {
            (0..n.div_ceil(tile)).map(|t| (t * tile, (n - t * tile).min(tile))).collect()
        };
        let ntiles = tiles.len();
        // Gated: room for the first tile's cut and 4x the rows expected to pass the bounds.
        let cap = if gated {
            cap.max(GATE_CAP).max(kx + 4 * k * (n - first).div_ceil(first)).min(CAND_BYTES / (8 * align_up(nqt, 8)))
        } else {
            cap
        };
        // Pipelined: the GEMM of tile t+1 (stream) runs while tile t is filtered (fstream),
        // into the other of two score tiles. f16 tiles only: with f32 tiles it was slower on the
        // H200 (1024 x 1M x 768 f16 storage, engine p50 6.04 -> 6.45 ms; with f16 tiles 5.03 ->
        // 4.77 ms; docs/history/gpu-sessions.md, seventh session).
        let pipe = self.batch.pipe && self.batch.tile16 && ntiles > 1;
        // Gated tiles hold align_up(m, 8) scores a row.
        self.ensure_batch(if gated { align_up(nqt, 8) } else { nqt }, k, tile, cap, pipe)?;
        if gated {
            self.stats.gated_batches += 1;
        }
        let b = self.batch.bufs.as_ref().unwrap();
        let (d_qf32, d_q, d_qn, d_params, d_scores) = (b.d_qf32.ptr, b.d_q.ptr, b.d_qn.ptr, b.d_params.ptr, b.d_scores.ptr);
        let d_scores2 = b.d_scores2.ptr;
        let sm_target = if pipe && self.batch.gemm_sms < self.sms { self.batch.gemm_sms as i32 } else { 0 };
        if sm_target != self.batch.sm_target {
            // Only when a tuning probe asks for it (set_batch_tuning; no gain measured): the
            // default path never calls it, so a cuBLAS without the symbol cannot fail a batch.
            // SAFETY: a plain setting of the engine's cuBLAS handle (0 = every SM).
            ckb("cublasSetSmCountTarget", unsafe { cb::cublasSetSmCountTarget(self.blas, sm_target) })?;
            self.batch.sm_target = sm_target;
        }
        let d_qlo = Some(b.d_qlo.ptr).filter(|&p| p != 0);
        let (d_bkey, d_brow, d_bcnt, d_oids, d_osc, d_ocnt) =
            (b.d_bkey.ptr, b.d_brow.ptr, b.d_bcnt.ptr, b.d_oids.ptr, b.d_oscores.ptr, b.d_ocnt.ptr);
        let (d_thr, d_ovf, d_bias) = (b.d_thr.ptr, b.d_overflow.ptr, b.d_bias.ptr);
        // [f16 overflow bits, first non-finite slot query value, first all-zero cosine slot query]
        let mut flags = [0u32; 3];
        let smem = SMEM_MAIN as u32;
        let fsmem = filter_smem(kx, fstep) as u32;
        let mut ids = vec![0u64; nqt * k];
        let mut scores = vec![0f32; nqt * k];
        let mut counts = vec![0u32; nqt];
        crate::engine::reset_out(out, nq_all);
        for q0 in (0..nq_all).step_by(nqt) {
            let m = (nq_all - q0).min(nqt);
            // Queries in the client's slot (req.slot) are copied to the device as they are and
            // checked there (check_queries); host queries were checked by the server.
            let slot = req.slot.and_then(|sq| sq.dma_addr(q0 * dim)).map(|(addr, _)| (addr, m * dim));
            let qs: &[f32] = if slot.is_some() { &[] } else { &req.queries[q0 * dim..(q0 + m) * dim] };
            let qn: Vec<f32> =
                qs.chunks_exact(dim).map(|r| if self.metric == Metric::L2 { r.iter().map(|x| x * x).sum() } else { 0.0 }).collect();
            let p = self.fill_params(req, store, n, k, gx as u32, span as u32);
            // SAFETY: Params is repr(C) plain data; every device buffer below was sized by
            // ensure_batch for nqt >= m queries, `tile` rows and `cap` candidates per query.
            unsafe {
                let pb = std::slice::from_raw_parts(&p as *const Params as *const u8, std::mem::size_of::<Params>());
                // Async: a pageable source is staged before the call returns, so the host does
                // not wait for the copy; `p` outlives this group's sync_stream anyway.
                ck("H2D params", sys::cuMemcpyHtoDAsync_v2(d_params, pb.as_ptr() as *const c_void, pb.len(), self.stream))?;
                let (sb, sl) = self.staging;
                let qa = qs.as_ptr() as usize;
                let (hb, hl) = self.slots;
                if let Some((sa, vals)) = slot {
                    // Straight from the client's slot (registered by attach_slots; the server
                    // bounds-checked the range against the slot).
                    if !(hb != 0 && sa >= hb && sa + vals * 4 <= hb + hl) {
                        return Err(Error::new(Status::Internal, "slot queries outside the registered slots"));
                    }
                    ck("H2D queries", sys::cuMemcpyHtoDAsync_v2(d_qf32, sa as *const c_void, vals * 4, self.stream))?;
                    ck("reset query check", sys::cuMemsetD32Async(d_ovf + 4, NONE_U32, 2, self.stream))?;
                    // l2: |q|^2; cosine: 1 / |q| for convert_queries (and an all-zero query check).
                    let norms = match self.metric {
                        Metric::L2 => 1u32,
                        Metric::Cosine => 2,
                        Metric::InnerProduct => 0,
                    };
                    let (mut a_src, mut a_m, mut a_qn, mut a_norms, mut a_bad) = (d_qf32, m as u32, d_qn, norms, d_ovf + 4);
                    let mut args = kargs![a_src, a_m, a_qn, a_norms, a_bad];
                    let blocks = (m * 32).div_ceil(NT as usize) as u32;
                    ck(
                        "launch check_queries",
                        sys::cuLaunchKernel(
                            self.kern.check_queries,
                            blocks,
                            1,
                            1,
                            NT,
                            1,
                            1,
                            0,
                            self.stream,
                            args.as_mut_ptr(),
                            std::ptr::null_mut(),
                        ),
                    )?;
                } else if sb != 0 && qa >= sb && qa + qs.len() * 4 <= sb + sl {
                    // Already in registered memory (the server's private copy of the request).
                    ck("H2D queries", sys::cuMemcpyHtoDAsync_v2(d_qf32, qs.as_ptr() as *const c_void, qs.len() * 4, self.stream))?;
                } else if qs.len() * 4 <= self.table.h_stage.bytes {
                    // Through pinned memory: a pageable copy of a 3 MB batch costs ~1 ms.
                    std::ptr::copy_nonoverlapping(qs.as_ptr() as *const u8, self.table.h_stage.ptr, qs.len() * 4);
                    ck(
                        "H2D queries",
                        sys::cuMemcpyHtoDAsync_v2(d_qf32, self.table.h_stage.ptr as *const c_void, qs.len() * 4, self.stream),
                    )?;
                } else {
                    ck("H2D queries", sys::cuMemcpyHtoD_v2(d_qf32, qs.as_ptr() as *const c_void, qs.len() * 4))?;
                }
                if slot.is_none() {
                    ck("H2D norms", sys::cuMemcpyHtoD_v2(d_qn, qn.as_ptr() as *const c_void, m * 4))?;
                }
                let blocks = ((m * self.dp).div_ceil(NT as usize)).clamp(1, 4096) as u32;
                for (dst, lo) in [(Some(d_q), 0u32), (d_qlo, 1u32)] {
                    let Some(mut a_dst) = dst else { continue };
                    // Cosine queries from the slot are scaled by check_queries' 1 / |q| (the
                    // server normalised all others).
                    let scale = if slot.is_some() && self.metric == Metric::Cosine { d_qn } else { 0 };
                    let (mut a_src, mut a_m, mut a_lo, mut a_scale) = (d_qf32, m as u32, lo, scale);
                    let mut args = kargs![a_src, a_m, a_dst, a_lo, a_scale];
                    ck(
                        "launch convert_queries",
                        sys::cuLaunchKernel(
                            self.kern.convert_queries,
                            blocks,
                            1,
                            1,
                            NT,
                            1,
                            1,
                            0,
                            self.stream,
                            args.as_mut_ptr(),
                            std::ptr::null_mut(),
                        ),
                    )?;
                }
                ck("reset thresholds", sys::cuMemsetD8Async(d_thr, 0, m * 4, self.stream))?;
                ck("reset overflow flag", sys::cuMemsetD8Async(d_ovf, 0, 4, self.stream))?;
                ck("reset counts", sys::cuMemsetD8Async(d_bcnt, 0, m * 4, self.stream))?;
            }
            let mut tab = self.table_arg();
            let (mut a_in, mut a_bk, mut a_br, mut a_bc, mut a_thr) = (d_params, d_bkey, d_brow, d_bcnt, d_thr);
            let (mut a_cap, mut a_high) = (cap as u32, high as u32);
            let (mut a_ties, mut a_ovf, mut a_q16) = (self.batch.tile16 as u32, d_ovf, d_q);
            let fs = FilterStep { m, span, cap, high, smem: fsmem };
            for (t, &(row0, rows)) in tiles.iter().enumerate() {
                let (buf, fst) = match (pipe, t % 2) {
                    (false, _) => (d_scores, self.stream),
                    (true, 0) => (d_scores, self.fstream),
                    (true, _) => (d_scores2, self.fstream),
                };
                // The event calls below use the engine's own events and streams, alive until Drop;
                // waits are recorded on the streams, nothing blocks the host.
                if pipe && t >= 2 {
                    // The filter of tile t-2 has finished reading this score tile.
                    // SAFETY: the engine's own stream and event (see above).
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2 + t % 2], 0) })?;
                }
                let gt = gated && t > 0;
                if gt && t == 1 {
                    // The biases follow the bounds tile 0's filter left (on fstream).
                    // SAFETY: the engine's own stream and event.
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2], 0) })?;
                    let (mut a_thr, mut a_bk, mut a_bc, mut a_cap, mut a_m, mut a_bias) =
                        (d_thr, d_bkey, d_bcnt, cap as u32, m as u32, d_bias);
                    let mut args = kargs![a_thr, a_bk, a_bc, a_cap, a_m, a_bias];
                    // SAFETY: d_thr, d_bcnt and d_bias hold >= m entries, d_bkey m * cap (ensure_batch).
                    ck("launch gate_bias", unsafe {
                        sys::cuLaunchKernel(
                            self.kern.gate_bias,
                            m.div_ceil(NT as usize) as u32,
                            1,
                            1,
                            NT,
                            1,
                            1,
                            0,
                            self.stream,
                            args.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    })?;
                }
                if gt {
                    self.gemm_gated(d_q, d_bias, buf, row0, rows, m, rows == tile)?;
                } else {
                    // Columns start 16-byte aligned for the filter's vector loads.
                    self.gemm_tile(d_q, buf, row0, rows, m, self.tile_ld(rows))?;
                }
                if pipe {
                    // Everything queued on `stream` so far (inputs, resets, this GEMM) comes
                    // before this tile's filter.
                    // SAFETY: the engine's own event and stream.
                    ck("cuEventRecord", unsafe { sys::cuEventRecord(self.ev[t % 2], self.stream) })?;
                    // SAFETY: the engine's own stream and event.
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.fstream, self.ev[t % 2], 0) })?;
                }
                if gt {
                    self.gate_scan(buf, fst, row0, rows, m, cap)?;
                } else {
                    let fblocks = self.filter_tile(&fs, buf, fst, row0, rows)?;
                    // With one filter block per query the filter cuts the buffers itself.
                    if fblocks > 1 && t + 1 < ntiles {
                        let mut targs = kargs![a_in, tab, a_bk, a_br, a_bc, a_cap, a_high, a_thr, a_ties, a_ovf];
                        // SAFETY: `targs` points at locals holding batch_tighten's parameters in
                        // order; the buffers hold m queries' `cap` candidates (ensure_batch).
                        ck("launch batch_tighten", unsafe {
                            sys::cuLaunchKernel(
                                self.kern.batch_tighten,
                                m as u32,
                                1,
                                1,
                                NT,
                                1,
                                1,
                                smem,
                                fst,
                                targs.as_mut_ptr(),
                                std::ptr::null_mut(),
                            )
                        })?;
                    }
                }
                if pipe {
                    // SAFETY: the engine's own event and stream.
                    ck("cuEventRecord", unsafe { sys::cuEventRecord(self.ev[2 + t % 2], self.fstream) })?;
                }
            }
            if pipe {
                // batch_final and the copies back follow the last filter.
                // SAFETY: the engine's own stream and event.
                ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2 + (ntiles - 1) % 2], 0) })?;
            }
            let (mut a_oi, mut a_os, mut a_oc) = (d_oids, d_osc, d_ocnt);
            let mut margs = kargs![a_in, tab, a_bk, a_br, a_bc, a_cap, a_oi, a_os, a_oc, a_ties, a_q16];
            // SAFETY: `margs` points at locals holding batch_final's parameters in order, device
            // buffers sized by ensure_batch for m queries; the host vectors hold nqt * k ids and
            // scores, nqt counts and 3 flags, and are not touched before sync_stream below.
            unsafe {
                ck(
                    "launch batch_final",
                    sys::cuLaunchKernel(
                        self.kern.batch_final,
                        m as u32,
                        1,
                        1,
                        NT,
                        1,
                        1,
                        smem,
                        self.stream,
                        margs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    ),
                )?;
                ck("D2H ids", sys::cuMemcpyDtoHAsync_v2(ids.as_mut_ptr() as *mut c_void, d_oids, m * k * 8, self.stream))?;
                ck("D2H scores", sys::cuMemcpyDtoHAsync_v2(scores.as_mut_ptr() as *mut c_void, d_osc, m * k * 4, self.stream))?;
                ck("D2H counts", sys::cuMemcpyDtoHAsync_v2(counts.as_mut_ptr() as *mut c_void, d_ocnt, m * 4, self.stream))?;
                ck("D2H overflow flag", sys::cuMemcpyDtoHAsync_v2(flags.as_mut_ptr() as *mut c_void, d_ovf, 12, self.stream))?;
            }
            self.sync_stream()?;
            // A non-finite value in slot queries fails the batch, before the overflow bits
            // (which it would set: a NaN score must not turn f16 tiles off for good).
            if slot.is_some() && flags[1] != NONE_U32 {
                out.clear();
                return Err(Error::new(
                    Status::NonFinite,
                    format!("query holds a non-finite value at index {}", q0 * dim + flags[1] as usize),
                ));
            }
            if slot.is_some() && flags[2] != NONE_U32 {
                out.clear();
                return Err(Error::new(Status::InvalidArgument, "a cosine query must not be all zeros"));
            }
            let ovf = flags[0];
            if ovf != 0 {
                out.clear();
                return Ok(Some(ovf));
            }
            for i in 0..m {
                let c = counts[i] as usize;
                if c > k {
                    return Err(Error::new(Status::Cuda, format!("GPU returned {c} hits for k = {k} (candidate buffer overflow?)")));
                }
                out[q0 + i].extend((0..c).map(|j| Hit { id: ids[i * k + j], score: scores[i * k + j] }));
            }
        }
        if self.stats.batch_times.len() < 1 << 16 {
            self.stats.batch_times.push((nq_all, t_start.elapsed().as_nanos() as u64));
        }
        Ok(None)
    }

    /// Launches batch_filter over one score tile (rows `row0..row0+rows`, in d_scores with
    /// ld = align_up(rows, 4)); returns the number of blocks per query.
    fn filter_tile(&self, fs: &FilterStep, scores: u64, stream: sys::CUstream, row0: usize, rows: usize) -> Result<u32> {
        let b = self.batch.bufs.as_ref().ok_or_else(|| Error::new(Status::Internal, "batch buffers missing"))?;
        let mut tab = self.table_arg();
        let (mut a_in, mut a_qn, mut a_sc, mut a_bk, mut a_br, mut a_bc, mut a_thr) =
            (b.d_params.ptr, b.d_qn.ptr, scores, b.d_bkey.ptr, b.d_brow.ptr, b.d_bcnt.ptr, b.d_thr.ptr);
        let (mut a_ld, mut a_row0, mut a_rows, mut a_span) = (self.tile_ld(rows) as u32, row0 as u32, rows as u32, fs.span as u32);
        let mut a_ovf = b.d_overflow.ptr;
        let (mut a_cap, mut a_high) = (fs.cap as u32, fs.high as u32);
        let mut args = kargs![a_in, a_qn, tab, a_sc, a_ld, a_row0, a_rows, a_span, a_bk, a_br, a_bc, a_cap, a_high, a_thr, a_ovf];
        let blocks = rows.div_ceil(fs.span) as u32;
        // batch_filter takes the first 14 arguments, batch_filter_h all 15.
        let f = if self.batch.tile16 { self.kern.batch_filter_h } else { self.kern.batch_filter };
        // SAFETY: every pointer argument is a live device buffer sized by ensure_batch for
        // fs.m queries, `rows` <= tile rows and fs.cap candidates per query.
        ck("launch batch_filter", unsafe {
            sys::cuLaunchKernel(f, blocks, fs.m as u32, 1, NT, 1, 1, fs.smem, stream, args.as_mut_ptr(), std::ptr::null_mut())
        })?;
        Ok(blocks)
    }
}
