//! Several queries in one pass over the table (docs/GPU.md, "Multi-query pass"): up to
//! `MQ_MAXQ` queries that share a filter, f16 or bf16 storage, k <= `MQ_KMAX`. `scan_multi1/2/4`
//! (kernels/multi.cu) read each row once and score it for 8, 16 or 32 queries with tensor-core
//! MMA, each query keeping its own candidates behind its own bound; `multi_merge` then merges
//! each query's candidates in one block per query. Concurrent single requests the server
//! gathered into one batch cost about one scan instead of one scan each.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::compile::{MQ_CAP, MQ_KMAX, MQ_MAXQ, MQ_OUT_STRIDE, NT, PARAMS_BYTES, SMEM_MAIN};
use super::{ck, grow, CudaEngine, DevBuf, HostBuf, Params};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{Dtype, Hit, Metric};
use crate::wire::SearchRequest;

/// Fewest queries the multi-query pass takes (one query takes the single-query path).
pub(super) const MQ_MIN: usize = 2;
/// Default of `KALOS_MULTI_MAXQ`: larger batches go to the batch path (tensor-core GEMM), which
/// answers 17 to 32 queries sooner than `scan_multi4` on the H200 (docs/BENCHMARKS.md).
pub(super) const DEFAULT_MULTI_MAXQ: usize = 16;

/// Dynamic shared memory of `scan_multi` for `qn` queries and padded rows of `dp` elements
/// (mirrors kernels/multi.cu): both query parts, the candidates, the compaction output, then
/// four words per query.
pub(super) fn scan_smem(qn: usize, dp: usize) -> usize {
    let dpm = dp.div_ceil(32) * 32;
    let qs = if dpm.is_multiple_of(64) { dpm + 32 } else { dpm };
    2 * qn * qs * 2 + qn * MQ_CAP * 8 + MQ_KMAX * 8 + qn * 16
}

/// Bytes of one pass's input: Params, qscale and qnorm per query, the queries as f32.
fn in_bytes(dp: usize) -> usize {
    PARAMS_BYTES + 8 * MQ_MAXQ + MQ_MAXQ * dp * 4
}

/// The multi-query kernels (f16 / bf16 storage) and, per variant, blocks per SM at its shared
/// memory (0: the variant does not fit this device).
pub(super) struct MultiKernels {
    /// scan_multi1, scan_multi2, scan_multi4: 8, 16 and 32 queries.
    pub(super) scan: [sys::CUfunction; 3],
    pub(super) merge: sys::CUfunction,
}

/// Buffers of the multi-query pass, allocated at the first pass.
pub(super) struct Multi {
    pub(super) kern: Option<MultiKernels>,
    /// Resident blocks per SM of each scan variant (0: does not fit).
    pub(super) per_sm: [u32; 3],
    h_in: Option<HostBuf>,
    d_in: DevBuf,
    d_ckey: DevBuf,
    d_crow: DevBuf,
    /// One bound per query, 0 between passes (multi_merge resets it).
    d_bound: DevBuf,
    h_out: Option<HostBuf>,
    d_out: sys::CUdeviceptr,
    /// Passes run (for the engine's report).
    pub(super) passes: u64,
    pub(super) queries: u64,
    /// The most queries one pass takes (`KALOS_MULTI_MAXQ`, at most MQ_MAXQ).
    pub(super) max_q: usize,
}

impl Multi {
    pub(super) fn new(kern: Option<MultiKernels>) -> Multi {
        Multi {
            kern,
            per_sm: [0; 3],
            h_in: None,
            d_in: DevBuf::empty(),
            d_ckey: DevBuf::empty(),
            d_crow: DevBuf::empty(),
            d_bound: DevBuf::empty(),
            h_out: None,
            d_out: 0,
            passes: 0,
            queries: 0,
            max_q: crate::config::tuning_or_default().multi_maxq.unwrap_or(DEFAULT_MULTI_MAXQ).min(MQ_MAXQ),
        }
    }
}

/// The variant for `nq` queries: index into `scan` (0: 8 queries, 1: 16, 2: 32).
fn variant(nq: usize) -> usize {
    match nq {
        0..=8 => 0,
        9..=16 => 1,
        _ => 2,
    }
}

impl CudaEngine {
    /// Raises each multi-query kernel's shared-memory limit and records how many of its blocks
    /// fit an SM (0 where a variant does not fit the device at this dimension).
    pub(super) fn init_multi(&mut self) -> Result<()> {
        let Some(k) = &self.multi.kern else { return Ok(()) };
        let mut optin = 0;
        // SAFETY: the context is bound to this thread; `optin` is a valid out-pointer.
        ck("cuCtxGetDevice", unsafe {
            let mut dev = 0;
            let r = sys::cuCtxGetDevice(&mut dev);
            if r == sys::CUresult::CUDA_SUCCESS {
                sys::cuDeviceGetAttribute(&mut optin, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)
            } else {
                r
            }
        })?;
        // SAFETY: `merge` is a function of a loaded module; the attribute is a plain integer.
        ck("cuFuncSetAttribute", unsafe {
            sys::cuFuncSetAttribute(k.merge, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM_MAIN as i32)
        })?;
        let mut per_sm = [0u32; 3];
        for (i, &f) in k.scan.iter().enumerate() {
            let smem = scan_smem(8 << i, self.dp);
            if smem > optin as usize {
                continue;
            }
            let mut blocks = 0;
            // SAFETY: `f` is a function of a loaded module; `blocks` is a valid out-pointer.
            unsafe {
                ck(
                    "cuFuncSetAttribute",
                    sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32),
                )?;
                ck(
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                    sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut blocks, f, NT as i32, smem),
                )?;
            }
            per_sm[i] = blocks.max(0) as u32;
        }
        self.multi.per_sm = per_sm;
        Ok(())
    }

    /// True when a batch of `req.nq` queries is answered by multi-query passes.
    pub(super) fn takes_multi(&self, req: &SearchRequest<'_>) -> bool {
        self.multi.kern.is_some()
            && matches!(self.dtype, Dtype::F16 | Dtype::Bf16)
            && req.nq >= MQ_MIN
            && req.nq <= self.multi.max_q
            && req.k <= MQ_KMAX
            && self.multi.per_sm[variant(req.nq)] > 0
    }

    fn ensure_multi(&mut self, grid: usize, k: usize) -> Result<()> {
        if self.multi.h_in.is_none() {
            self.multi.h_in = Some(HostBuf::new(in_bytes(self.dp))?);
            self.multi.d_in = DevBuf::new(in_bytes(self.dp), "multi-query input")?;
            self.multi.d_bound = DevBuf::new(MQ_MAXQ * 4, "multi-query bounds")?;
            // SAFETY: d_bound holds MQ_MAXQ words; the engine's own stream.
            ck("memset bounds", unsafe { sys::cuMemsetD32Async(self.multi.d_bound.ptr, 0, MQ_MAXQ, self.stream) })?;
            let out = HostBuf::with_flags(MQ_MAXQ * MQ_OUT_STRIDE, 0x02 /* CU_MEMHOSTALLOC_DEVICEMAP */)?;
            self.multi.d_out = out.device_ptr()?;
            self.multi.h_out = Some(out);
        }
        // Each query's candidate list: grid * k entries, padded to a multiple of 4.
        let bytes = MQ_MAXQ * (grid * k).div_ceil(4) * 4 * 4;
        grow(&mut self.multi.d_ckey, bytes, "multi-query candidates")?;
        grow(&mut self.multi.d_crow, bytes, "multi-query candidates")?;
        Ok(())
    }

    /// Answers `req` (2..=MQ_MAXQ host queries sharing its filter, k <= MQ_KMAX) with one pass
    /// of scan_multi and one multi_merge.
    pub(super) fn search_multi(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let (n, nq, k, dim, dp) = (self.table.len, req.nq, req.k, self.dim, self.dp);
        let v = variant(nq);
        let kern = self.multi.kern.as_ref().ok_or_else(|| Error::new(Status::Internal, "multi-query kernels missing"))?;
        let (scan, merge) = (kern.scan[v], kern.merge);
        // As many blocks as are resident at once, each with a contiguous slice of at least one
        // round of rows.
        let rows_per_round = NT as usize / 32 * 16;
        let grid = (self.multi.per_sm[v] as usize * self.sms).min(n.div_ceil(rows_per_round)).max(1);
        let chunk = n.div_ceil(grid);
        self.ensure_multi(grid, k)?;
        let p: Params = self.fill_params(req, store, n, k, grid as u32, chunk as u32);
        {
            let h = self.multi.h_in.as_mut().ok_or_else(|| Error::new(Status::Internal, "multi-query input missing"))?.slice();
            // SAFETY: Params is repr(C) plain data.
            let pb = unsafe { std::slice::from_raw_parts(&p as *const Params as *const u8, std::mem::size_of::<Params>()) };
            h[..pb.len()].copy_from_slice(pb);
            for (i, q) in req.queries.chunks_exact(dim).take(nq).enumerate() {
                let qmax = q.iter().fold(0f32, |m, x| m.max(x.abs()));
                let scale = if qmax > 0.0 { qmax } else { 1.0 };
                let qn: f32 = if self.metric == Metric::L2 { q.iter().map(|x| x * x).sum() } else { 0.0 };
                h[PARAMS_BYTES + 4 * i..PARAMS_BYTES + 4 * i + 4].copy_from_slice(&scale.to_le_bytes());
                let o = PARAMS_BYTES + 4 * MQ_MAXQ + 4 * i;
                h[o..o + 4].copy_from_slice(&qn.to_le_bytes());
                let base = PARAMS_BYTES + 8 * MQ_MAXQ + i * dp * 4;
                for (j, c) in h[base..base + dp * 4].chunks_exact_mut(4).enumerate() {
                    c.copy_from_slice(&q.get(j).copied().unwrap_or(0.0).to_le_bytes());
                }
            }
        }
        let used = PARAMS_BYTES + 8 * MQ_MAXQ + nq * dp * 4;
        let h_in = self.multi.h_in.as_ref().map(|h| h.ptr).unwrap_or(std::ptr::null_mut());
        let mut a_in = self.multi.d_in.ptr;
        let mut a_nq = nq as u32;
        let mut tab = self.table_arg();
        let (mut a_ck, mut a_cr, mut a_b, mut a_out) =
            (self.multi.d_ckey.ptr, self.multi.d_crow.ptr, self.multi.d_bound.ptr, self.multi.d_out);
        let smem = scan_smem(8 << v, dp) as u32;
        // SAFETY: h_in holds in_bytes(dp) >= used bytes of pinned memory, d_in as many; the
        // argument arrays point at locals alive across the launches (the driver copies them at
        // launch); the candidate buffers were sized by ensure_multi for `grid` blocks and k;
        // d_bound holds MQ_MAXQ words and h_out MQ_MAXQ outputs; all on the engine's stream.
        unsafe {
            ck("multi H2D", sys::cuMemcpyHtoDAsync_v2(a_in, h_in as *const c_void, used, self.stream))?;
            let mut args: [*mut c_void; 6] = [
                &mut a_in as *mut u64 as *mut c_void,
                &mut a_nq as *mut u32 as *mut c_void,
                &mut tab as *mut _ as *mut c_void,
                &mut a_ck as *mut u64 as *mut c_void,
                &mut a_cr as *mut u64 as *mut c_void,
                &mut a_b as *mut u64 as *mut c_void,
            ];
            ck(
                "scan_multi",
                sys::cuLaunchKernel(scan, grid as u32, 1, 1, NT, 1, 1, smem, self.stream, args.as_mut_ptr(), std::ptr::null_mut()),
            )?;
            let mut margs: [*mut c_void; 6] = [
                &mut a_in as *mut u64 as *mut c_void,
                &mut tab as *mut _ as *mut c_void,
                &mut a_ck as *mut u64 as *mut c_void,
                &mut a_cr as *mut u64 as *mut c_void,
                &mut a_b as *mut u64 as *mut c_void,
                &mut a_out as *mut u64 as *mut c_void,
            ];
            ck(
                "multi_merge",
                sys::cuLaunchKernel(
                    merge,
                    nq as u32,
                    1,
                    1,
                    NT,
                    1,
                    1,
                    SMEM_MAIN as u32,
                    self.stream,
                    margs.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )?;
        }
        self.sync_stream()?;
        let h_out = self.multi.h_out.as_mut().ok_or_else(|| Error::new(Status::Internal, "multi-query output missing"))?.slice();
        out.resize_with(nq, Vec::new);
        out.truncate(nq);
        for (i, hits) in out.iter_mut().enumerate() {
            let o = &h_out[i * MQ_OUT_STRIDE..(i + 1) * MQ_OUT_STRIDE];
            let count = u32::from_le_bytes(o[0..4].try_into().unwrap_or_default()) as usize;
            if count > k {
                return Err(Error::new(Status::Cuda, format!("the multi-query pass returned {count} hits for k = {k}")));
            }
            hits.clear();
            let so = 8 + 8 * k;
            for j in 0..count {
                let id = u64::from_le_bytes(o[8 + 8 * j..16 + 8 * j].try_into().unwrap_or_default());
                let score = f32::from_le_bytes(o[so + 4 * j..so + 4 * j + 4].try_into().unwrap_or_default());
                hits.push(Hit { id, score });
            }
        }
        self.multi.passes += 1;
        self.multi.queries += nq as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_cover_every_batch_size_they_take() {
        for nq in MQ_MIN..=MQ_MAXQ {
            assert!(8 << variant(nq) >= nq, "{nq} queries in the {}-query variant", 8 << variant(nq));
        }
        assert_eq!(variant(8), 0);
        assert_eq!(variant(9), 1);
        assert_eq!(variant(32), 2);
    }

    #[test]
    fn shared_memory_of_the_common_shapes_fits_an_h100_class_block() {
        // 227 KiB of opt-in shared memory per block on sm_90.
        assert!(scan_smem(32, 768) <= 227 << 10);
        assert!(scan_smem(8, 4096) <= 227 << 10);
        assert!(MQ_KMAX + NT as usize / 32 * 16 <= MQ_CAP && MQ_CAP <= NT as usize);
    }
}
