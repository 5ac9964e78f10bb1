//! CUDA engine: the table mirrored in GPU memory (f32, f16 or bf16). Single queries: one fused
//! scan + radix-select kernel, a one-node CUDA graph whose by-value argument (params + query)
//! each request replaces. Batches: cuBLAS GEMM tiles, each filtered per query against a running
//! k-th-key bound into a bounded candidate buffer, then one select-and-sort kernel. See
//! docs/GPU.md for the design and the measured numbers.
//!
//! Files: this one holds the engine (creation, the [`Engine`] impl, shared helpers);
//! `kernels.rs` loads the compiled kernels, `table.rs` mirrors the table, `single.rs` answers
//! single queries, `batch.rs` batches, `gate.rs` (with `lt.rs`, cuBLASLt) gated batch tiles and
//! `report.rs` keeps the counters it prints on drop. `compile.rs` assembles the kernel source
//! and NVRTC options; `device.rs` reports the driver and GPUs.
//!
//! Safety rules of this module:
//! - Nothing here runs before [`probe`] has found the driver, NVRTC and cuBLAS libraries
//!   (cudarc panics when a dynamically loaded library or symbol is missing). Every entry point
//!   also runs under `catch_unwind`, so a missing symbol becomes a `BACKEND_UNAVAILABLE` or
//!   `CUDA` status, never a panic across the server thread.
//! - The engine is created and used on the server thread only: the context is bound there, and
//!   the graphs are captured and replayed there.
//! - Everything a request needs is allocated ahead (pinned staging, candidate lists, outputs);
//!   a request allocates nothing on the GPU. Buffers grow only in `sync`/`reserve`.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::sys as cb;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

/// The argument array of a kernel launch: a pointer to each argument (each a local the array
/// must not outlive; `cuLaunchKernel` and kernel nodes copy the values when called). Defined
/// before the submodules, which use it.
macro_rules! kargs {
    ($($a:ident),* $(,)?) => {
        [$(&mut $a as *mut _ as *mut c_void),*]
    };
}

mod batch;
pub mod compile;
pub mod device;
mod fields;
mod gate;
mod int8;
mod kernels;
mod lt;
mod multi;
mod report;
mod single;
mod table;

pub use batch::FILTER_SEG;
use batch::{Batch, SCORE16_TILE_BYTES, SCORE_TILE_BYTES};
pub(crate) use compile::MAX_GPU_DIM;
use compile::{Codes, KernelSpec, FILTER_FU, FLAG_EXPIRY, FLAG_RECENCY, NT, PARAMS_BYTES, PARAMS_HEAD, PROF_OFF};
use gate::Gate;
use kernels::Kernels;
use multi::Multi;
use report::Stats;
use single::{Single, SqMode, BYVAL_MAX_BYTES};
use table::DevTable;

use super::cpu::CpuEngine;
use super::{Engine, EngineKind};
use crate::config::Options;
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{Dtype, Hit, Metric, Scan, MAX_FILTER_NAMESPACES};
use crate::wire::SearchRequest;

const NONE_U32: u32 = u32::MAX;
/// Default work (rows × dim × queries) under which the hybrid engine answers on the CPU.
/// Measured on the H200 machine against the SIMD CPU engine (docs/history/gpu-sessions.md, commit
/// 771b4ca, client p50 at dim 128): 256 rows CPU 9.8 µs / GPU 27.7 µs, 2048 rows 41.8 / 28.3 µs,
/// so the two meet near 1,250 rows × 128 dims (160 k values). Override with `KALOS_GPU_MIN_WORK`.
pub(crate) const DEFAULT_GPU_MIN_WORK: usize = 160 * 1024;
/// Bytes of f32 vectors per participant of an awake CPU split scan up to which a single query
/// stays on the CPU engine (hosts of >= 8 cores, see `CpuEngine::for_server`). Measured on the
/// H200 host (16 cores, 15 participants; docs/history/gpu-sessions.md, "CPU engine on the host"),
/// client p50 CPU / GPU: 2k rows × 128 f32 19.3 / 21.0 µs, 4k 22.1 / 21.1, 8k 26.6 / 18.7, so
/// they meet near 4k rows × 128 (2 MiB, ~128 KiB a participant).
/// `KALOS_GPU_MIN_SPLIT_BYTES` overrides it (0: the pool never takes a GPU-sized table).
const CPU_SPLIT_BYTES_PER_THREAD: usize = 128 << 10;

/// Request parameters as the kernels read them (`struct Params` in kernels/common.cuh).
#[repr(C)]
#[derive(Clone, Copy)]
struct Params {
    n: u32,
    k: u32,
    nns: u32,
    flags: u32,
    now_ms: u64,
    w: f32,
    qnorm: f32,
    hl: f64,
    grid: u32,
    chunk: u32,
    ntiles: u32,
    /// batch_filter: steps per cruise segment, no barrier inside (<= 1: a barrier every step).
    fseg: u32,
    seq: u32,
    qscale: f32,
    /// The int8 scan's 4-bit first pass: candidates its 8-bit stage keeps (`k` is the pass's).
    kf: u32,
    _pad: u32,
    ns: [u64; MAX_FILTER_NAMESPACES],
    /// Device address of the client's slot for the response body, or 0.
    dst: u64,
}
const _: () = assert!(std::mem::size_of::<Params>() <= PARAMS_BYTES);

// Params' head (n .. kf) is what both by-value arguments start with (`ParamsHead` in
// kernels/common.cuh, whose size the kernel checks against the same PARAMS_HEAD).
const _: () = assert!(std::mem::offset_of!(Params, ns) == PARAMS_HEAD);

fn cu_err(what: &str, r: sys::CUresult) -> Error {
    let mut p: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static NUL-terminated string into `p` (a
    // valid out-pointer) or fails; `p` is read only on success and when not null.
    let name = unsafe {
        if sys::cuGetErrorString(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    let status = if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY { Status::StoreFull } else { Status::Cuda };
    Error::new(status, format!("{what}: {name} ({r:?})"))
}

#[inline]
fn ck(what: &str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(cu_err(what, r))
    }
}

fn ckb(what: &str, r: cb::cublasStatus_t) -> Result<()> {
    if r == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Status::Cuda, format!("{what}: cuBLAS {r:?}")))
    }
}

/// Device memory; freed on drop.
struct DevBuf {
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DevBuf {
    fn empty() -> DevBuf {
        DevBuf { ptr: 0, bytes: 0 }
    }
    fn new(bytes: usize, what: &str) -> Result<DevBuf> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the allocation is owned by the DevBuf returned.
        ck(&format!("cuMemAlloc({bytes} bytes) for {what}"), unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(16)) })?;
        Ok(DevBuf { ptr, bytes })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: an allocation of cuMemAlloc this DevBuf owns, freed once; the engine
            // synchronises its streams before it drops buffers a queued kernel may use.
            unsafe {
                sys::cuMemFree_v2(self.ptr);
            }
        }
    }
}

/// Page-locked host memory (flags 0: cached, fast for the CPU to read back); freed on drop.
struct HostBuf {
    ptr: *mut u8,
    bytes: usize,
}

impl HostBuf {
    fn new(bytes: usize) -> Result<HostBuf> {
        Self::with_flags(bytes, 0)
    }
    fn with_flags(bytes: usize, flags: u32) -> Result<HostBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the allocation is owned by the HostBuf returned.
        ck(&format!("cuMemHostAlloc({bytes})"), unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(64), flags) })?;
        Ok(HostBuf { ptr: p as *mut u8, bytes })
    }
    /// Device address of a buffer allocated with CU_MEMHOSTALLOC_DEVICEMAP.
    fn device_ptr(&self) -> Result<sys::CUdeviceptr> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `self.ptr` is a live cuMemHostAlloc allocation; `d` is a valid out-pointer.
        ck("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut c_void, 0) })?;
        Ok(d)
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points at `bytes` bytes of live pinned memory this HostBuf owns; the
        // exclusive borrow of self keeps the slice the only Rust reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: an allocation of cuMemHostAlloc this HostBuf owns, freed once.
            unsafe {
                sys::cuMemFreeHost(self.ptr as *mut c_void);
            }
        }
    }
}

/// Replaces `buf` by one of at least `bytes` when it is smaller. The old buffer is freed first
/// (the peak stays one copy); if the allocation fails, `buf` is left empty and the next call
/// tries again.
fn grow(buf: &mut DevBuf, bytes: usize, what: &str) -> Result<()> {
    if buf.ptr != 0 && buf.bytes >= bytes {
        return Ok(());
    }
    *buf = DevBuf::empty();
    *buf = DevBuf::new(bytes, what)?;
    Ok(())
}

fn ns_since(t: std::time::Instant) -> u32 {
    t.elapsed().as_nanos().min(u32::MAX as u128) as u32
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// True when the driver, NVRTC and cuBLAS libraries can be loaded (nothing else is touched).
pub fn libraries_present() -> bool {
    // SAFETY: is_culib_present only tries to load each library; a panic becomes `false`.
    catch_unwind(|| unsafe {
        cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() && cudarc::cublas::sys::is_culib_present()
    })
    .unwrap_or(false)
}

/// Checks that a usable GPU is present: libraries load and at least one device answers.
/// Returns device 0's compute capability and name.
pub fn probe() -> Result<(i32, i32, String)> {
    probe_device(0)
}

/// CUDA devices present (0 when the driver or the libraries are missing).
pub fn device_count() -> usize {
    if !libraries_present() {
        return 0;
    }
    catch_unwind(|| {
        // SAFETY: the driver library is loaded (checked above); cuInit takes no pointers.
        if unsafe { sys::cuInit(0) } != sys::CUresult::CUDA_SUCCESS {
            return 0;
        }
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer.
        if unsafe { sys::cuDeviceGetCount(&mut n) } != sys::CUresult::CUDA_SUCCESS {
            return 0;
        }
        n.max(0) as usize
    })
    .unwrap_or(0)
}

/// Free memory of device `ordinal`, in bytes (creates its primary context on this thread).
pub fn device_free_memory(ordinal: i32) -> Result<usize> {
    probe_device(ordinal)?;
    let ctx = CudaContext::new(ordinal as usize).map_err(|e| Error::new(Status::BackendUnavailable, format!("CUDA context: {e:?}")))?;
    let (free, _total) = ctx.mem_get_info().map_err(|e| Error::new(Status::Cuda, format!("{e:?}")))?;
    Ok(free)
}

/// [`probe`] for device `ordinal`: its compute capability and name, or why it cannot serve.
pub fn probe_device(ordinal: i32) -> Result<(i32, i32, String)> {
    if !libraries_present() {
        return Err(Error::new(
            Status::BackendUnavailable,
            "CUDA is not available: the driver (libcuda), NVRTC or cuBLAS library was not found",
        ));
    }
    catch_unwind(|| -> Result<(i32, i32, String)> {
        // SAFETY: the driver library is loaded (checked above); cuInit takes no pointers.
        ck("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| Error::new(Status::BackendUnavailable, format!("no usable GPU: {}", e.message)))?;
        let mut ver = 0;
        // SAFETY: `ver` is a valid out-pointer.
        ck("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut ver) })?;
        if ver < compile::OLDEST_DRIVER {
            return Err(Error::new(
                Status::BackendUnavailable,
                format!(
                    "the CUDA driver supports CUDA {}.{}; the CUDA engine needs a driver for CUDA {}.{} or newer (CUDA 12 is not supported)",
                    ver / 1000,
                    ver % 1000 / 10,
                    compile::OLDEST_DRIVER / 1000,
                    compile::OLDEST_DRIVER % 1000 / 10
                ),
            ));
        }
        compile::check_nvrtc()?;
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer.
        ck("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })
            .map_err(|e| Error::new(Status::BackendUnavailable, e.message))?;
        if n < 1 {
            return Err(Error::new(Status::BackendUnavailable, "no CUDA device found"));
        }
        if ordinal < 0 || ordinal >= n {
            return Err(Error::new(Status::BackendUnavailable, format!("no CUDA device {ordinal} (this host has {n})")));
        }
        let mut dev = 0;
        // SAFETY: 0 <= ordinal < the device count; `dev` is a valid out-pointer.
        ck("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
        let attr = |a| {
            let mut v = 0;
            // SAFETY: `dev` is a device handle the driver gave; `v` is a valid out-pointer.
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
            v
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        let mut name = [0 as std::os::raw::c_char; 128];
        // SAFETY: the buffer holds 128 bytes and the driver writes at most 127 and a NUL.
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 127, dev) };
        // SAFETY: `name` is NUL-terminated (zero-initialised, and the driver writes at most 127
        // bytes of its 128).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        Ok((major, minor, name))
    })
    .unwrap_or_else(|_| Err(Error::new(Status::BackendUnavailable, "the CUDA driver library lacks a required function")))
}

fn work_threshold() -> usize {
    crate::config::tuning_or_default().gpu_min_work.unwrap_or(DEFAULT_GPU_MIN_WORK)
}

/// Largest table (bytes of f32 vectors) whose single queries the hybrid engine leaves to an
/// awake CPU split scan with `participants` threads (1: the CPU pool sleeps between requests,
/// nothing beyond `work_threshold`).
fn split_threshold(participants: usize) -> usize {
    if participants < 2 {
        return 0;
    }
    let per = crate::config::tuning_or_default().gpu_min_split_bytes.unwrap_or(CPU_SPLIT_BYTES_PER_THREAD);
    per.saturating_mul(participants)
}

/// Creates the CUDA engine on the calling (server) thread, or says why it cannot. Every request
/// runs on the GPU (backend `cuda`).
pub fn create(opts: &Options, store: &Store) -> Result<Box<dyn Engine>> {
    create_with(opts, store, false)
}

/// The engine for backend `auto`: the CUDA engine with a cost model that answers requests too
/// small to pay for a GPU round trip on the CPU engine (see `DEFAULT_GPU_MIN_WORK`).
pub fn create_auto(opts: &Options, store: &Store) -> Result<Box<dyn Engine>> {
    create_with(opts, store, true)
}

fn create_with(opts: &Options, store: &Store, hybrid: bool) -> Result<Box<dyn Engine>> {
    create_on(opts, store, 0, hybrid)
}

/// The CUDA engine on device `ordinal`, created on the calling thread (a device shard's thread:
/// `engine::shard`); `hybrid` as in [`create_auto`].
pub fn create_on(opts: &Options, store: &Store, ordinal: i32, hybrid: bool) -> Result<Box<dyn Engine>> {
    let cc = probe_device(ordinal)?;
    if store.dim() > MAX_GPU_DIM {
        return Err(Error::new(
            Status::BackendUnavailable,
            format!("the CUDA engine supports dim <= {MAX_GPU_DIM}; this store has {}", store.dim()),
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| CudaEngine::new(opts, store, cc, hybrid, ordinal))) {
        Ok(Ok(e)) => Ok(Box::new(e)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::new(Status::BackendUnavailable, "the CUDA engine failed to start (a CUDA library function is missing)")),
    }
}

/// The concrete CUDA engine, for in-process tuning probes (examples/gpu_probe.rs) that change
/// its batch settings between searches. Servers use [`create`] / [`create_auto`].
#[doc(hidden)]
pub fn create_engine(opts: &Options, store: &Store) -> Result<CudaEngine> {
    let cc = probe()?;
    match catch_unwind(AssertUnwindSafe(|| CudaEngine::new(opts, store, cc, false, 0))) {
        Ok(r) => r,
        Err(_) => Err(Error::new(Status::BackendUnavailable, "the CUDA engine failed to start (a CUDA library function is missing)")),
    }
}

/// Backend `auto`: requests too small to pay for a GPU round trip go to the CPU engine.
struct Hybrid {
    /// Backend `auto` (else every request runs on the GPU).
    on: bool,
    min_work: usize,
    /// Single queries on tables up to this many bytes of f32 vectors go to the CPU engine's
    /// awake split scan (0 where its workers sleep between requests).
    min_split_bytes: usize,
    cpu: CpuEngine,
    /// The last search ran on the CPU engine (for `describe`).
    last_cpu: bool,
}

pub struct CudaEngine {
    _ctx: Arc<CudaContext>,
    _modules: Vec<Arc<cudarc::driver::CudaModule>>,
    kern: Kernels,
    stream: sys::CUstream,
    /// Batches: the filters run on this second, high-priority stream, beside the next tile's
    /// GEMM on `stream` (two score tiles, ordered by `ev`; see search_batch_tiles).
    fstream: sys::CUstream,
    /// [GEMM done with score tile 0, 1; filter done with score tile 0, 1].
    ev: [sys::CUevent; 4],
    blas: cb::cublasHandle_t,
    cc: (i32, i32),
    sms: usize,
    dim: usize,
    dp: usize,
    esize: usize,
    dtype: Dtype,
    metric: Metric,
    /// The table mirror and its upload staging.
    table: DevTable,
    fcols: fields::DevFields,
    /// Single-query path.
    sq: Single,
    /// Batch path: settings, the batch in progress, buffers.
    batch: Batch,
    /// Gated batch tiles.
    gate: Gate,
    /// Multi-query passes (small batches of f16 / bf16 storage).
    multi: Multi,
    /// The int8 scan's device side (option `scan = "int8"`, dimensions up to 1536).
    int8: Option<int8::Int8>,
    /// Counters and timings for the reports printed on drop.
    stats: Stats,
    hybrid: Hybrid,
    failed: Option<String>,
    /// Test hook (KALOS_CUDA_FAULT_AFTER=n): the n+1-th GPU search fails with a CUDA error.
    fault_after: Option<u64>,
    searches: u64,
    /// The clients' slots (host address, length), registered with CUDA and mapped at
    /// `slots_dev` (0 = not mapped): single-query kernels write response bodies there, and a
    /// large batch's queries are copied to the device straight from the client's slot and checked
    /// there (`Engine::takes_slot_queries`).
    slots: (usize, usize),
    slots_dev: u64,
    /// The server's staging region (host address, length; 0 = none), registered with CUDA: a
    /// batch whose queries lie in it is copied to the device from there, with no staging copy.
    staging: (usize, usize),
}

impl CudaEngine {
    fn new(opts: &Options, store: &Store, cc: (i32, i32, String), hybrid: bool, ordinal: i32) -> Result<CudaEngine> {
        // Spin while waiting for the GPU: the server thread is a polling thread anyway, and a
        // blocking wait adds tens of microseconds per request.
        // SAFETY: the driver is initialised (probe ran cuInit); `dev` is a valid out-pointer; the
        // flags are set before the primary context is created below.
        unsafe {
            let mut dev = 0;
            if sys::cuDeviceGet(&mut dev, ordinal) == sys::CUresult::CUDA_SUCCESS {
                sys::cuDevicePrimaryCtxSetFlags_v2(dev, sys::CUctx_flags::CU_CTX_SCHED_SPIN as u32);
            }
        }
        let ctx = CudaContext::new(ordinal as usize).map_err(|e| Error::new(Status::BackendUnavailable, format!("CUDA context: {e:?}")))?;
        ctx.bind_to_thread().map_err(|e| Error::new(Status::Cuda, format!("bind context: {e:?}")))?;
        // SAFETY: the engine creates no CudaSlice (its memory is DevBuf / HostBuf through the
        // driver API, ordered on its own streams), so no cudarc allocation relies on tracking.
        unsafe { ctx.disable_event_tracking() };
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::new(Status::Cuda, format!("{e:?}")))? as usize;
        let tune = crate::config::tuning_or_default();
        let dim = store.dim();
        let dtype = opts.dtype;
        let metric = store.metric();
        let spec = KernelSpec { arch: format!("sm_{}{}", cc.0, cc.1), dim, dtype, metric, prof: tune.prof, codes: Codes::None };
        let prof = spec.prof;
        let geo = compile::Geometry::of(dim, dtype);
        let dp = geo.dp;
        let fstep = NT as usize * FILTER_FU * 4;
        let (modules, mut kern) = Kernels::load(&ctx, &spec, geo.byval, dp, fstep)?;
        // By value for small queries, a copy node for larger ones: at 768 dims the copy graph's
        // round trip was 1.3-2.9 us shorter on the H200 (three runs); at 128 dims they tie.
        let sq_mode = if kern.scan.topk_v.is_none() || PARAMS_BYTES + dp * 4 > BYVAL_MAX_BYTES { SqMode::Copy } else { SqMode::Graph };
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer; the stream is destroyed in Drop.
        ck("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
        // The filter stream gets the highest priority: a filter block waiting for an SM is
        // scheduled before the next GEMM's blocks.
        let (mut least, mut greatest) = (0i32, 0i32);
        // SAFETY: two valid out-pointers.
        ck("cuCtxGetStreamPriorityRange", unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
        let mut fstream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `fstream` is a valid out-pointer; the stream is destroyed in Drop.
        ck("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(&mut fstream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, greatest)
        })?;
        let mut ev: [sys::CUevent; 4] = [std::ptr::null_mut(); 4];
        for e in ev.iter_mut() {
            // SAFETY: `e` is a valid out-pointer; the events are destroyed in Drop.
            ck("cuEventCreate", unsafe { sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })?;
        }
        let mut blas: cb::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: `blas` is a valid out-pointer; the handle is destroyed in Drop.
        ckb("cublasCreate", unsafe { cb::cublasCreate_v2(&mut blas) })?;
        // SAFETY: the handle and stream just created, both alive until Drop.
        ckb("cublasSetStream", unsafe { cb::cublasSetStream_v2(blas, stream as cb::cudaStream_t) })?;
        // Plain f32 math: no TF32 (results for f32 storage must equal an f32 scan's ranking).
        // SAFETY: a plain setting of the handle just created.
        ckb("cublasSetMathMode", unsafe { cb::cublasSetMathMode(blas, cb::cublasMath_t::CUBLAS_DEFAULT_MATH) })?;
        let (free, _total) = ctx.mem_get_info().map_err(|e| Error::new(Status::Cuda, format!("{e:?}")))?;
        let limit_bytes = if opts.gpu_memory_bytes > 0 { opts.gpu_memory_bytes as usize } else { free / 10 * 9 };
        let stage_rows = ((16usize << 20) / (dim * 4 + 48)).max(1);
        let stage_bytes = stage_rows * (dim * 4 + 48) + 1024;
        let mut cpu = CpuEngine::for_server(opts.threads as usize, opts.server_spin_ns);
        // The int8 scan: codes on the device for single queries; the CPU engine keeps the host
        // side (the error bound's statistics, the exact re-ranking) and answers what it takes.
        let int8 = if opts.scan == Scan::Int8 {
            cpu.set_scan(Scan::Int8, opts.rerank);
            int8::Int8::load(&ctx, &spec, opts.rerank)?
        } else {
            None
        };
        let dq = int8.as_ref().map_or(dp, |c| c.dp8.max(dp).max(c.nib.as_ref().map_or(0, |n| n.dp)));
        let multi = Multi::new(kern.multi.take());
        let mut e = CudaEngine {
            _ctx: ctx.clone(),
            _modules: modules.clone(),
            kern,
            stream,
            fstream,
            ev,
            blas,
            cc: (cc.0, cc.1),
            sms,
            dim,
            dp,
            esize: if dtype == Dtype::F32 { 4 } else { 2 },
            dtype,
            metric,
            batch: Batch {
                bufs: None,
                // f16 storage only: cuBLAS has no bf16 x bf16 -> f16 GEMM (with bf16 storage it
                // failed the batch on the H200, and the engine fell back to the CPU).
                score16: dtype == Dtype::F16,
                tile16: false,
                tile_bytes: SCORE_TILE_BYTES,
                tile16_bytes: SCORE16_TILE_BYTES,
                fstep,
                pipe: true,
                filter_seg: FILTER_SEG,
                gemm_sms: sms,
                sm_target: 0,
            },
            gate: Gate { lt: None, off: None, active: false },
            multi,
            sq: Single {
                mode: sq_mode,
                h_in: HostBuf::new(PARAMS_BYTES + dq * 4)?,
                d_in: DevBuf::new(PARAMS_BYTES + dq * 4, "query")?,
                h_out: HostBuf::with_flags(PROF_OFF + 128, 0x02 /* CU_MEMHOSTALLOC_DEVICEMAP */)?,
                d_out: 0,
                seq: 0,
                d_ckey: DevBuf::empty(),
                d_crow: DevBuf::empty(),
                d_ticket: DevBuf::new(16, "merge control")?,
                cand_cap: 0,
                graphs: Default::default(),
                table_override: None,
                no_cut: false,
            },
            stats: Stats {
                compact_sq: 0,
                direct_writes: 0,
                rtt: Vec::with_capacity(1 << 16),
                rtt_api: Vec::with_capacity(1 << 16),
                prof: if prof { Some(Vec::with_capacity(1 << 16)) } else { None },
                batch_times: Vec::new(),
                score16_overflows: 0,
                gated_batches: 0,
                slot_batches: 0,
                filter_phases: Vec::new(),
                filter_guesses: [0; 2],
                cut_queries: 0,
                cut_retries: 0,
                nibble_queries: 0,
            },
            fcols: fields::DevFields::new(),
            int8,
            table: DevTable {
                store_cap: store.capacity(),
                limit_bytes,
                cap_rows: 0,
                len: 0,
                d_vecs: DevBuf::empty(),
                d_norms: DevBuf::empty(),
                d_ids: DevBuf::empty(),
                d_ns: DevBuf::empty(),
                d_created: DevBuf::empty(),
                d_expires: DevBuf::empty(),
                gen: 0,
                h_stage: HostBuf::new(stage_bytes)?,
                d_stage: DevBuf::new(stage_bytes, "staging")?,
                stage_rows,
            },
            hybrid: Hybrid {
                on: hybrid,
                min_work: work_threshold(),
                min_split_bytes: split_threshold(cpu.awake_participants()),
                cpu,
                last_cpu: false,
            },
            failed: None,
            fault_after: tune.cuda_fault_after,
            searches: 0,
            slots: (0, 0),
            slots_dev: 0,
            staging: (0, 0),
        };
        e.sq.d_out = e.sq.h_out.device_ptr()?;
        e.init_multi()?;
        // SAFETY: d_ticket holds 16 bytes; the engine's own stream.
        ck("memset ticket", unsafe { sys::cuMemsetD8Async(e.sq.d_ticket.ptr, 0, 16, e.stream) })?;
        let max_rows = e.table.limit_bytes / e.row_bytes();
        let initial = store.len().max(store.capacity().min(1 << 16).min(max_rows)).max(1);
        e.ensure_capacity(initial)?;
        e.sync_stream()?;
        Ok(e)
    }

    /// A recall with a metadata filter (docs/GPU.md, "Metadata filters"): a small table or a
    /// filter on a tags field goes to the CPU engine; otherwise the filter is evaluated on the
    /// GPU, and either its few rows are scored on the CPU or the scan runs with its mask. A
    /// single query whose filter was seen before does not wait for the evaluation
    /// (`search_guessed`).
    fn search_filtered(&mut self, store: &Store, req: &SearchRequest<'_>, e: &crate::filter::Expr, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let work = store.len().saturating_mul(self.dim).saturating_mul(req.nq);
        let prog = crate::filter::program::compile(e, store.fields());
        let small = self.hybrid.on && work < self.hybrid.min_work;
        let (Some(prog), false, false) = (prog, small, self.table.len == 0) else {
            self.hybrid.last_cpu = true;
            return self.hybrid.cpu.search(store, req, out);
        };
        if self.table.len != store.len() {
            return Err(Error::new(Status::Internal, format!("GPU table has {} rows, the store {}", self.table.len, store.len())));
        }
        let t0 = std::time::Instant::now();
        let Some(dp) = self.filter_prog(&prog) else {
            // A tags field: no cell form.
            self.hybrid.last_cpu = true;
            let r = self.hybrid.cpu.search(store, req, out);
            self.record_filter(report::FILTER_CPU, [0, 0, ns_since(t0)]);
            return r;
        };
        let guess = if req.nq == 1 { self.fcols.guess(dp.key, self.table.len) } else { fields::Guess::Wait };
        if guess != fields::Guess::Wait {
            return self.search_guessed(store, req, &dp, guess, out);
        }
        let plan = self.guarded("filter", |e| e.eval_filter(&dp, req.nq > 1))?;
        let t_score = std::time::Instant::now();
        let tag = match &plan {
            fields::FilterPlan::Empty => report::FILTER_EMPTY,
            fields::FilterPlan::Rows(_) | fields::FilterPlan::Sparse(_) => report::FILTER_ROWS,
            fields::FilterPlan::Mask => report::FILTER_MASK,
        };
        let r = self.run_filter_plan(plan, store, req, out);
        let [a, b] = self.fcols.last_ns;
        self.record_filter(tag, [a, b, ns_since(t_score)]);
        r
    }

    fn record_filter(&mut self, tag: u8, ns: [u32; 3]) {
        if self.stats.filter_phases.len() < 1 << 16 {
            self.stats.filter_phases.push((tag, ns));
        }
    }

    /// One query with a filter seen before, planned from the filter's last count with no wait
    /// for this one: the evaluation and the plan's scan enqueued back to back, the count read
    /// once the answer is in. A dense guess scans with the mask, which is exact whatever the
    /// count; a sparse guess gathers and scans a compact table of `rows` rows, exact when the
    /// count is at most `rows`, else the query is scanned again with the (complete) mask.
    fn search_guessed(
        &mut self,
        store: &Store,
        req: &SearchRequest<'_>,
        dp: &fields::DevProg,
        guess: fields::Guess,
        out: &mut Vec<Vec<Hit>>,
    ) -> Result<()> {
        let mut host = Vec::new();
        let req = super::with_host_queries(req, &mut host)?;
        self.hybrid.last_cpu = false;
        let t0 = std::time::Instant::now();
        let mut ns = [0u32; 3];
        let mut tag = report::FILTER_GUESS_MASK;
        let r = self.guarded("search", |e| {
            e.enqueue_eval(dp)?;
            ns[0] = ns_since(t0);
            let n = e.table.len;
            let m = match guess {
                fields::Guess::Sparse(rows) => {
                    let t = e.gather_sparse(rows)?;
                    ns[1] = ns_since(t0) - ns[0];
                    e.sq.table_override = Some((t, rows));
                    let h = e.search_one(store, &req, &req.queries[..e.dim]);
                    e.sq.table_override = None;
                    let h = h?;
                    let m = e.read_count()?;
                    if m <= rows {
                        tag = report::FILTER_GUESS_SPARSE;
                        out.clear();
                        out.push(h);
                    } else {
                        // More rows than the compact table took: the mask has them all.
                        tag = report::FILTER_GUESS_RESCAN;
                        e.scan_masked(store, &req, out)?;
                    }
                    m
                }
                _ => {
                    e.scan_masked(store, &req, out)?;
                    e.read_count()?
                }
            };
            let right = match guess {
                fields::Guess::Sparse(_) => m > 0 && fields::is_sparse(m, n),
                _ => !fields::is_sparse(m, n),
            };
            e.stats.filter_guesses[right as usize] += 1;
            Ok(())
        });
        ns[2] = ns_since(t0).saturating_sub(ns[0]).saturating_sub(ns[1]);
        self.record_filter(tag, ns);
        r
    }

    /// The scan of the full table under the filter's mask (the last evaluation's).
    fn scan_masked(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        self.fcols.active_mask = self.fcols.d_mask_ptr();
        let r = self.dispatch(store, req, out);
        self.fcols.active_mask = 0;
        r
    }

    /// Answers a filtered search as `eval_filter` planned it.
    fn run_filter_plan(&mut self, plan: fields::FilterPlan, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        match plan {
            fields::FilterPlan::Empty => {
                super::reset_out(out, req.nq);
                Ok(())
            }
            fields::FilterPlan::Rows(rows) => {
                self.hybrid.last_cpu = true;
                let allowed = fields::allowed_rows(store, &rows, req);
                self.hybrid.cpu.search_allowed(store, req, Some(allowed), out)
            }
            fields::FilterPlan::Sparse(m) => {
                // One query: its few rows gathered on the device and scanned exactly there.
                let mut host = Vec::new();
                let req = super::with_host_queries(req, &mut host)?;
                self.hybrid.last_cpu = false;
                self.guarded("search", |e| {
                    let t = e.gather_sparse(m)?;
                    e.sq.table_override = Some((t, m));
                    let h = e.search_one(store, &req, &req.queries[..e.dim]);
                    e.sq.table_override = None;
                    out.clear();
                    out.push(h?);
                    Ok(())
                })
            }
            fields::FilterPlan::Mask => {
                let mut host = Vec::new();
                let req = &if req.nq == 1 { super::with_host_queries(req, &mut host)? } else { req.clone() };
                self.hybrid.last_cpu = false;
                self.guarded("search", |e| e.scan_masked(store, req, out))
            }
        }
    }

    /// Runs a search on the GPU by the path its size takes: one query, a fused multi-query pass
    /// or a batch (a single query's values must be on the host).
    fn dispatch(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        if req.nq == 1 && self.takes_int8(req.k) {
            self.search_one_int8(store, req, &req.queries[..self.dim], out)
        } else if req.nq == 1 {
            let h = self.search_one(store, req, &req.queries[..self.dim])?;
            out.clear();
            out.push(h);
            Ok(())
        } else if self.takes_multi(req) {
            let mut host = Vec::new();
            let req = super::with_host_queries(req, &mut host)?;
            self.search_multi(store, &req, out)
        } else {
            self.search_batch(store, req, out)
        }
    }

    fn sync_stream(&self) -> Result<()> {
        // SAFETY: the engine's own stream, alive until Drop.
        ck("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    fn fill_params(&self, req: &SearchRequest<'_>, store: &Store, n: usize, k: usize, grid: u32, chunk: u32) -> Params {
        let mut p = Params {
            n: n as u32,
            k: k as u32,
            nns: NONE_U32,
            flags: 0,
            now_ms: req.now_ms,
            w: 0.0,
            qnorm: 0.0,
            hl: 1.0,
            grid,
            chunk,
            ntiles: 1,
            fseg: self.batch.filter_seg,
            seq: 0,
            qscale: 1.0,
            kf: 0,
            _pad: 0,
            ns: [0; MAX_FILTER_NAMESPACES],
            dst: 0,
        };
        if let Some(v) = &req.filter.namespaces {
            p.nns = v.len() as u32;
            p.ns[..v.len()].copy_from_slice(v);
        }
        if store.has_expiring() {
            p.flags |= FLAG_EXPIRY;
        }
        if let Some(r) = req.recency {
            p.flags |= FLAG_RECENCY;
            p.w = r.weight;
            p.hl = r.half_life_ms;
        }
        p
    }

    fn guarded<T>(&mut self, what: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if let Some(m) = &self.failed {
            return Err(Error::new(Status::Cuda, format!("the CUDA engine failed earlier: {m}")));
        }
        let r = match catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(r) => r,
            Err(_) => Err(Error::new(Status::Cuda, format!("{what}: a CUDA library call panicked"))),
        };
        if let Err(e) = &r {
            // Out of memory on growth leaves the engine usable; anything else poisons it (a
            // sticky CUDA error makes every later call fail).
            // A bad query in a client's slot (found on the device: non-finite, or an all-zero
            // cosine query) is the request's error only.
            if !e.status.is_request_error() && e.status != Status::StoreFull {
                self.failed = Some(e.message.clone());
            }
        }
        r
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        self.report();
        // SAFETY: every handle below is the engine's own and released once: the streams are
        // synchronised first, so no queued work uses a buffer, graph or handle freed after.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamSynchronize(self.fstream);
            if self.slots_dev != 0 {
                sys::cuMemHostUnregister(self.slots.0 as *mut c_void);
            }
            if self.staging.0 != 0 {
                sys::cuMemHostUnregister(self.staging.0 as *mut c_void);
            }
            self.sq.graphs.clear();
            self.batch.bufs = None;
            self.gate.lt = None;
            if !self.blas.is_null() {
                cb::cublasDestroy_v2(self.blas);
            }
            sys::cuStreamDestroy_v2(self.stream);
            sys::cuStreamDestroy_v2(self.fstream);
            for e in self.ev {
                sys::cuEventDestroy_v2(e);
            }
        }));
    }
}

// SAFETY: the engine is created and used on the server thread only (the trait needs Send so the
// box can be handed to that thread before first use; every CUDA handle here is used there).
unsafe impl Send for CudaEngine {}

impl Engine for CudaEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Cuda
    }
    fn describe(&self) -> String {
        let mut s = format!("cuda-sm{}{}-{}", self.cc.0, self.cc.1, self.dtype.name());
        if self.int8.is_some() {
            s.push_str("-int8");
        }
        if self.hybrid.on {
            s.push_str(if self.hybrid.last_cpu { "-auto(last:cpu)" } else { "-auto(last:gpu)" });
        }
        s
    }
    fn sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        // The CPU engine mirrors nothing for the exact scan; for the int8 scan, its host codes.
        self.hybrid.cpu.sync(store, dirty)?;
        self.guarded("sync", |e| e.do_sync(store, dirty))
    }
    fn rerank_counts(&self) -> (u64, u64) {
        self.hybrid.cpu.rerank_counts()
    }
    fn reserve(&mut self, rows: usize) -> Result<()> {
        self.guarded("reserve", |e| e.ensure_capacity(rows))
    }
    fn attach_slots(&mut self, base: *mut u8, len: usize) -> bool {
        if self.slots_dev != 0 || base.is_null() || len == 0 {
            return self.slots_dev != 0;
        }
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: [base, base + len) is a live shared mapping the server keeps for the
            // engine's life (the trait's contract); registering pins it and maps it for the
            // device (flags: DEVICEMAP 0x2 | PORTABLE 0x1); Drop unregisters it.
            unsafe {
                if sys::cuMemHostRegister_v2(base as *mut c_void, len, 0x3) != sys::CUresult::CUDA_SUCCESS {
                    return 0;
                }
                let mut d: sys::CUdeviceptr = 0;
                if sys::cuMemHostGetDevicePointer_v2(&mut d, base as *mut c_void, 0) != sys::CUresult::CUDA_SUCCESS || d == 0 {
                    sys::cuMemHostUnregister(base as *mut c_void);
                    return 0;
                }
                d
            }
        }));
        self.slots_dev = r.unwrap_or(0);
        if self.slots_dev != 0 {
            self.slots = (base as usize, len);
        }
        self.slots_dev != 0
    }
    fn attach_staging(&mut self, base: *mut u8, len: usize) -> bool {
        if self.staging.0 != 0 || base.is_null() || len == 0 {
            return self.staging.0 != 0;
        }
        let ok = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: [base, base + len) is a live mapping the server keeps for the engine's life
            // (the trait's contract); registering pins it (flags 0: host-side DMA source only);
            // Drop unregisters it.
            unsafe { sys::cuMemHostRegister_v2(base as *mut c_void, len, 0) == sys::CUresult::CUDA_SUCCESS }
        }))
        .unwrap_or(false);
        if ok {
            self.staging = (base as usize, len);
        }
        ok
    }
    fn takes_slot_queries(&self) -> bool {
        self.slots_dev != 0
    }
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let work = store.len().saturating_mul(self.dim).saturating_mul(req.nq);
        if let Some(fx) = &req.filter.expr {
            return self.search_filtered(store, req, &fx.expr, out);
        }
        if self.hybrid.on && (work < self.hybrid.min_work || (req.nq == 1 && work.saturating_mul(4) <= self.hybrid.min_split_bytes)) {
            self.hybrid.last_cpu = true;
            return self.hybrid.cpu.search(store, req, out);
        }
        // Slot queries go to the device straight from the slot (search_batch); a single query
        // takes the by-value path, which needs them on the host.
        let mut host = Vec::new();
        let req = &if req.nq == 1 { super::with_host_queries(req, &mut host)? } else { req.clone() };
        self.hybrid.last_cpu = false;
        if self.table.len != store.len() {
            return Err(Error::new(Status::Internal, format!("GPU table has {} rows, the store {}", self.table.len, store.len())));
        }
        if self.table.len == 0 {
            out.clear();
            out.resize(req.nq, Vec::new());
            return Ok(());
        }
        self.guarded("search", |e| {
            e.searches += 1;
            if e.fault_after.is_some_and(|n| e.searches > n) {
                return Err(Error::new(Status::Cuda, "injected fault (KALOS_CUDA_FAULT_AFTER)"));
            }
            e.dispatch(store, req, out)
        })
    }
}
