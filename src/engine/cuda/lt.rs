//! cuBLASLt for gated batch tiles (kernels/batch.cu, "Gated tiles"): one GEMM per score tile
//! whose epilogue adds a per-query bias and clamps at zero (RELU_BIAS), so that a tile is zero
//! wherever a row can no longer enter its query's top k and the filter becomes a scan for
//! nonzero halves. The library is looked up on first use, every symbol before any call (cudarc
//! panics on a missing one); without it batches keep the plain GEMM + filter path.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::catch_unwind;

use cudarc::cublaslt::sys as lt;
use cudarc::driver::sys;

use super::{ck, DevBuf};
use crate::error::{Error, Result, Status};

/// cuBLASLt workspace (the heuristics below may pick kernels that use up to this much).
const WORKSPACE: usize = 32 << 20;
/// Shapes kept. The last tile's rows change with the table's size, so untimed shapes come and
/// go; timed ones (full tiles, one per batch size) stay, at most MAX_TIMED, so that a table
/// growing between batches never makes a full tile's shape be timed again.
const MAX_SHAPES: usize = 24;
const MAX_TIMED: usize = 8;
/// Every symbol this module calls, resolved before the first call.
const SYMBOLS: [&str; 12] = [
    "cublasLtCreate",
    "cublasLtDestroy",
    "cublasLtMatmulDescCreate",
    "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute",
    "cublasLtMatrixLayoutCreate",
    "cublasLtMatrixLayoutDestroy",
    "cublasLtMatmulPreferenceCreate",
    "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute",
    "cublasLtMatmulAlgoGetHeuristic",
    "cublasLtMatmul",
];

fn ckl(what: &str, r: lt::cublasStatus_t) -> Result<()> {
    if r == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Status::Cuda, format!("{what} failed: {r:?}")))
    }
}

/// Sets attribute `attr` of matmul descriptor `desc` to the bytes of `v`.
///
/// # Safety
/// `desc` must be a live descriptor and `T` the attribute's documented type.
unsafe fn desc_set<T>(desc: lt::cublasLtMatmulDesc_t, attr: lt::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    ckl(
        "cublasLtMatmulDescSetAttribute",
        lt::cublasLtMatmulDescSetAttribute(desc, attr, v as *const T as *const c_void, std::mem::size_of::<T>()),
    )
}

/// True when libcublasLt loads and has every symbol this module calls.
pub(super) fn present() -> bool {
    // SAFETY: loading a shared library and looking symbols up runs no code of it but its
    // initialisers (the same library cuBLAS itself loads); a panic becomes `false`.
    catch_unwind(|| unsafe {
        lt::is_culib_present() && SYMBOLS.iter().all(|s| lt::culib().get::<unsafe extern "C" fn()>(s.as_bytes()).is_ok())
    })
    .unwrap_or(false)
}

/// Matrix layouts and the chosen algorithm of one GEMM shape.
struct Shape {
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    timed: bool,
}

impl Drop for Shape {
    fn drop(&mut self) {
        for l in [self.a, self.b, self.d] {
            if !l.is_null() {
                // SAFETY: a layout this Shape created and owns.
                unsafe { lt::cublasLtMatrixLayoutDestroy(l) };
            }
        }
    }
}

/// A cuBLASLt handle with the gated GEMM's descriptor (f16 inputs and output, f32 accumulation,
/// op(A) = the queries, B = a table tile, D = ldm x rows: each row's scores for every query
/// contiguous) and its workspace. Used on the server thread only, like the engine that owns it.
pub(super) struct Lt {
    h: lt::cublasLtHandle_t,
    desc: lt::cublasLtMatmulDesc_t,
    pref: lt::cublasLtMatmulPreference_t,
    ws: DevBuf,
    dp: usize,
    shapes: HashMap<(usize, usize, usize), Shape>,
    /// Algorithms timed per full-tile shape (for the engine report).
    pub tuned: Vec<String>,
}

impl Lt {
    /// Sets up cuBLASLt for tables of `dp` halves a row. Call only after [`present`].
    pub fn new(dp: usize) -> Result<Lt> {
        let mut l = Lt {
            h: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            pref: std::ptr::null_mut(),
            ws: DevBuf::empty(),
            dp,
            shapes: HashMap::new(),
            tuned: Vec::new(),
        };
        // SAFETY: plain cuBLASLt object creation; every pointer written is a field of `l`, whose
        // Drop releases what was created if a later step fails.
        unsafe {
            ckl("cublasLtCreate", lt::cublasLtCreate(&mut l.h))?;
            ckl(
                "cublasLtMatmulDescCreate",
                lt::cublasLtMatmulDescCreate(&mut l.desc, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType::CUDA_R_32F),
            )?;
            desc_set(l.desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
            desc_set(l.desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
            desc_set(
                l.desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            )?;
            ckl("cublasLtMatmulPreferenceCreate", lt::cublasLtMatmulPreferenceCreate(&mut l.pref))?;
            let wsb = WORKSPACE as u64;
            ckl(
                "cublasLtMatmulPreferenceSetAttribute",
                lt::cublasLtMatmulPreferenceSetAttribute(
                    l.pref,
                    lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &wsb as *const u64 as *const c_void,
                    8,
                ),
            )?;
        }
        l.ws = DevBuf::new(WORKSPACE, "cuBLASLt workspace")?;
        Ok(l)
    }

    /// out[q + r * ldm] = f16(max(0, queries[q] · table[row0 + r] + bias[q])) for q < m, r < rows,
    /// on `stream`. `q16`: m queries of dp halves; `rows0`: the tile's first table row (device
    /// address); `bias`: m halves; `out`: ldm * rows halves (ldm >= m, a multiple of 8). With
    /// `tune`, a shape seen for the first time has each of cuBLASLt's candidate algorithms timed
    /// once on these buffers (the heuristic's first choice was 0.24 ms slower per 1M rows on the
    /// H200; at most MAX_TIMED shapes, later ones take the heuristic's choice) — the streams must
    /// be idle then.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &mut self,
        q16: u64,
        rows0: u64,
        bias: u64,
        out: u64,
        m: usize,
        ldm: usize,
        rows: usize,
        stream: sys::CUstream,
        tune: bool,
    ) -> Result<()> {
        let key = (m, ldm, rows);
        if !self.shapes.contains_key(&key) {
            if self.shapes.len() >= MAX_SHAPES {
                self.shapes.retain(|_, s| s.timed);
            }
            let timed = self.shapes.values().filter(|s| s.timed).count();
            let s = self.shape(q16, rows0, bias, out, m, ldm, rows, stream, tune && timed < MAX_TIMED)?;
            self.shapes.insert(key, s);
        }
        let s = &self.shapes[&key];
        self.run(s, &s.algo, q16, rows0, bias, out, stream)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        s: &Shape,
        algo: &lt::cublasLtMatmulAlgo_t,
        q16: u64,
        rows0: u64,
        bias: u64,
        out: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: the descriptor, layouts and workspace are this Lt's own; the caller passes
        // device buffers of the sizes `gemm` documents; the bias pointer attribute is read by
        // the matmul call that follows on this thread.
        unsafe {
            desc_set(self.desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
            ckl(
                "cublasLtMatmul",
                lt::cublasLtMatmul(
                    self.h,
                    self.desc,
                    &one as *const f32 as *const c_void,
                    q16 as *const c_void,
                    s.a,
                    rows0 as *const c_void,
                    s.b,
                    &zero as *const f32 as *const c_void,
                    out as *const c_void,
                    s.d,
                    out as *mut c_void,
                    s.d,
                    algo,
                    self.ws.ptr as *mut c_void,
                    self.ws.bytes,
                    stream as lt::cudaStream_t,
                ),
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn shape(
        &mut self,
        q16: u64,
        rows0: u64,
        bias: u64,
        out: u64,
        m: usize,
        ldm: usize,
        rows: usize,
        stream: sys::CUstream,
        tune: bool,
    ) -> Result<Shape> {
        let mut s = Shape {
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
            timed: false,
        };
        let f16 = lt::cudaDataType::CUDA_R_16F;
        // SAFETY: layouts written into `s` (destroyed by its Drop on any error below); the
        // heuristic writes at most the 8 results asked for.
        let (res, n) = unsafe {
            ckl("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut s.a, f16, self.dp as u64, m as u64, self.dp as i64))?;
            ckl("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut s.b, f16, self.dp as u64, rows as u64, self.dp as i64))?;
            ckl("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut s.d, f16, m as u64, rows as u64, ldm as i64))?;
            let mut res: [lt::cublasLtMatmulHeuristicResult_t; 8] = std::mem::zeroed();
            let mut n = 0i32;
            ckl(
                "cublasLtMatmulAlgoGetHeuristic",
                lt::cublasLtMatmulAlgoGetHeuristic(self.h, self.desc, s.a, s.b, s.d, s.d, self.pref, 8, res.as_mut_ptr(), &mut n),
            )?;
            (res, n.clamp(0, 8) as usize)
        };
        if n == 0 {
            return Err(Error::new(Status::Cuda, format!("cuBLASLt has no RELU_BIAS GEMM for {m} x {rows} x {}", self.dp)));
        }
        let mut best = (0usize, f32::INFINITY);
        if tune && n > 1 {
            let mut times = Vec::with_capacity(n);
            for (i, r) in res[..n].iter().enumerate() {
                let t = self.time(&s, &r.algo, q16, rows0, bias, out, stream)?;
                times.push(format!("{t:.3}"));
                if t < best.1 {
                    best = (i, t);
                }
            }
            self.tuned.push(format!("{m} x {rows}: algorithm {} of {n} (ms: {})", best.0, times.join(" ")));
            s.timed = true;
        }
        s.algo = res[best.0].algo;
        Ok(s)
    }

    /// Milliseconds of one GEMM with `algo` (after one untimed run), or infinity when that
    /// algorithm fails to run.
    #[allow(clippy::too_many_arguments)]
    fn time(
        &self,
        s: &Shape,
        algo: &lt::cublasLtMatmulAlgo_t,
        q16: u64,
        rows0: u64,
        bias: u64,
        out: u64,
        stream: sys::CUstream,
    ) -> Result<f32> {
        let mut ev: [sys::CUevent; 2] = [std::ptr::null_mut(); 2];
        // SAFETY: the events this call creates, all destroyed before it returns (whichever step
        // fails); the stream is the engine's own.
        unsafe {
            let mut ms = f32::INFINITY;
            let res = (|| -> Result<()> {
                for e in ev.iter_mut() {
                    ck("cuEventCreate", sys::cuEventCreate(e, 0))?;
                }
                if self.run(s, algo, q16, rows0, bias, out, stream).is_ok() {
                    sys::cuEventRecord(ev[0], stream);
                    let ok = self.run(s, algo, q16, rows0, bias, out, stream).is_ok();
                    sys::cuEventRecord(ev[1], stream);
                    let r = sys::cuEventSynchronize(ev[1]);
                    if ok && r == sys::CUresult::CUDA_SUCCESS {
                        sys::cuEventElapsedTime_v2(&mut ms, ev[0], ev[1]);
                    }
                    ck("GEMM timing", r)?;
                }
                Ok(())
            })();
            for e in ev.into_iter().filter(|e| !e.is_null()) {
                sys::cuEventDestroy_v2(e);
            }
            res.map(|()| ms)
        }
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.shapes.clear();
        // SAFETY: objects this Lt created (null when creation stopped before them).
        unsafe {
            if !self.pref.is_null() {
                lt::cublasLtMatmulPreferenceDestroy(self.pref);
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
            if !self.h.is_null() {
                lt::cublasLtDestroy(self.h);
            }
        }
    }
}
