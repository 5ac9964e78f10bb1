//! The engine's kernels: every module compiled for the device (compile.rs), loaded into the
//! context, and the functions the engine launches, each named after its kernel.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaModule};

use super::batch::filter_smem;
use super::ck;
use super::compile::{self, KernelSpec, BATCH, KMAX, MODULES, MULTI, SCAN, SMEM_MAIN, TABLE};
use super::multi::MultiKernels;
use crate::error::{Error, Result, Status};

/// The single-query kernels of one build of kernels/scan.cu (the exact scan, or the int8
/// scan's over codes).
#[derive(Clone, Copy)]
pub(super) struct ScanFns {
    pub(super) topk: sys::CUfunction,
    /// The by-value single-query kernel (None when params + query exceed 4 KiB).
    pub(super) topk_v: Option<sys::CUfunction>,
    /// The by-value kernel with the compact argument (graph mode only).
    pub(super) topk_c: Option<sys::CUfunction>,
}

/// Kernel functions of the loaded modules (kernels/scan.cu, batch.cu, table.cu).
pub(super) struct Kernels {
    pub(super) scan: ScanFns,
    pub(super) batch_filter: sys::CUfunction,
    /// batch_filter over f16 score tiles (f16 storage, `Batch::score16`).
    pub(super) batch_filter_h: sys::CUfunction,
    pub(super) batch_tighten: sys::CUfunction,
    pub(super) batch_final: sys::CUfunction,
    pub(super) gate_bias: sys::CUfunction,
    pub(super) gate_scan: sys::CUfunction,
    pub(super) scatter_rows: sys::CUfunction,
    pub(super) col_scatter: sys::CUfunction,
    pub(super) filter_eval: sys::CUfunction,
    /// filter_eval with the program in its launch parameters (at most `FPROG_MAX` bytes).
    pub(super) filter_eval_v: sys::CUfunction,
    pub(super) quantize_rows: sys::CUfunction,
    pub(super) gather_rows: sys::CUfunction,
    pub(super) convert_queries: sys::CUfunction,
    pub(super) check_queries: sys::CUfunction,
    /// The multi-query pass (kernels/multi.cu; f16 and bf16 storage only).
    pub(super) multi: Option<MultiKernels>,
}

impl Kernels {
    /// Compiles every module for `spec`, loads them into `ctx` and looks up the kernels
    /// (`byval`: the by-value single-query kernels exist), then raises each kernel's dynamic
    /// shared memory limit to what it is launched with (`dp` floats of query, batch_filter's
    /// `fstep` rows per step). The modules are returned too: they must outlive the functions.
    pub(super) fn load(
        ctx: &Arc<CudaContext>,
        spec: &KernelSpec,
        byval: bool,
        dp: usize,
        fstep: usize,
    ) -> Result<(Vec<Arc<CudaModule>>, Kernels)> {
        // The modules compile in parallel (NVRTC is thread-safe): start-up waits for the slowest.
        let cubins: Vec<Result<Vec<u8>>> = std::thread::scope(|s| {
            let jobs: Vec<_> = MODULES.iter().map(|m| s.spawn(|| spec.compile(m))).collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(Error::new(Status::Internal, "the kernel compile panicked"))))
                .collect()
        });
        let mut modules = Vec::with_capacity(MODULES.len());
        for (m, cubin) in MODULES.iter().zip(cubins) {
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(cubin?))
                .map_err(|e| Error::new(Status::Cuda, format!("loading the {}.cu CUBIN: {e:?}", m.name)))?;
            modules.push(module);
        }
        let getf = |m: compile::Module, n: &str| -> Result<sys::CUfunction> {
            let i = MODULES.iter().position(|x| *x == m).unwrap_or(0);
            let f = modules[i].load_function(n).map_err(|e| Error::new(Status::Cuda, format!("kernel {n} ({}.cu): {e:?}", m.name)))?;
            Ok(f.cu_function())
        };
        let scan = scan_fns(&modules[MODULES.iter().position(|x| *x == SCAN).unwrap_or(0)], byval)?;
        let k = Kernels {
            scan,
            batch_filter: getf(BATCH, "batch_filter")?,
            batch_filter_h: getf(BATCH, "batch_filter_h")?,
            batch_tighten: getf(BATCH, "batch_tighten")?,
            batch_final: getf(BATCH, "batch_final")?,
            gate_bias: getf(BATCH, "gate_bias")?,
            gate_scan: getf(BATCH, "gate_scan")?,
            scatter_rows: getf(TABLE, "scatter_rows")?,
            col_scatter: getf(TABLE, "col_scatter")?,
            filter_eval: getf(TABLE, "filter_eval")?,
            filter_eval_v: getf(TABLE, "filter_eval_v")?,
            quantize_rows: getf(TABLE, "quantize_rows")?,
            gather_rows: getf(TABLE, "gather_rows")?,
            convert_queries: getf(TABLE, "convert_queries")?,
            check_queries: getf(TABLE, "check_queries")?,
            multi: if spec.dtype == crate::types::Dtype::F32 {
                None
            } else {
                Some(MultiKernels {
                    scan: [getf(MULTI, "scan_multi1")?, getf(MULTI, "scan_multi2")?, getf(MULTI, "scan_multi4")?],
                    merge: getf(MULTI, "multi_merge")?,
                })
            },
        };
        let smem_scan = SMEM_MAIN + dp * 4;
        let smem_filter = filter_smem(KMAX, fstep);
        k.scan.set_smem(smem_scan)?;
        for (f, bytes) in [
            (Some(k.batch_filter), smem_filter),
            (Some(k.batch_filter_h), smem_filter),
            (Some(k.batch_tighten), smem_scan),
            (Some(k.batch_final), smem_scan),
        ] {
            let Some(f) = f else { continue };
            // SAFETY: `f` is a function of a module loaded above (kept alive by `modules`); the
            // attribute is a plain integer setting.
            ck("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            })?;
        }
        Ok((modules, k))
    }

    /// Compiles and loads the int8 scan's single-query kernels (`spec.codes`); the query copy
    /// takes `dp` floats of shared memory.
    pub(super) fn load_codes(ctx: &Arc<CudaContext>, spec: &KernelSpec, byval: bool, dp: usize) -> Result<(Arc<CudaModule>, ScanFns)> {
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(spec.compile(&SCAN)?))
            .map_err(|e| Error::new(Status::Cuda, format!("loading the int8 scan.cu CUBIN: {e:?}")))?;
        let fns = scan_fns(&module, byval)?;
        fns.set_smem(SMEM_MAIN + dp * 4)?;
        Ok((module, fns))
    }
}

/// The single-query kernels of a loaded scan module (`byval`: the by-value ones exist).
fn scan_fns(m: &Arc<CudaModule>, byval: bool) -> Result<ScanFns> {
    let getf = |n: &str| -> Result<sys::CUfunction> {
        Ok(m.load_function(n).map_err(|e| Error::new(Status::Cuda, format!("kernel {n} (scan.cu): {e:?}")))?.cu_function())
    };
    let topk_v = if byval { Some(getf("scan_topk_v")?) } else { None };
    // Graph mode sends requests filtered by at most NS_INLINE namespaces with the compact
    // argument (112 bytes in place of 640): on the H200 at 10k x 128 f32 its server p50 was
    // 14.6-14.7 us against 14.8-16.1 with the full argument (docs/BENCHMARKS.md).
    let topk_c = topk_v.map(|_| getf("scan_topk_c")).transpose()?;
    Ok(ScanFns { topk: getf("scan_topk")?, topk_v, topk_c })
}

impl ScanFns {
    /// Raises each kernel's dynamic shared memory limit to `bytes`.
    fn set_smem(&self, bytes: usize) -> Result<()> {
        for f in [Some(self.topk), self.topk_v, self.topk_c].into_iter().flatten() {
            // SAFETY: `f` is a function of a loaded module (kept alive by the engine); the
            // attribute is a plain integer setting.
            ck("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            })?;
        }
        Ok(())
    }
}
