//! CUDA engine: the table mirrored in GPU memory (f32, f16 or bf16). Single queries: one fused
//! scan + radix-select kernel, a one-node CUDA graph whose by-value argument (params + query)
//! each request replaces. Batches: cuBLAS GEMM tiles, each filtered per query against a running
//! k-th-key bound into a bounded candidate buffer, then one select-and-sort kernel. See
//! docs/GPU.md for the design and the measured numbers.
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

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::sys as cb;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;

pub mod compile;
pub mod device;
mod lt;

pub(crate) use compile::MAX_GPU_DIM;
use compile::{
    KernelSpec, BATCH, CHUNK, FILTER_FU, FLAG_EXPIRY, FLAG_RECENCY, KMAX, MODULES, NS_INLINE, NT, PARAMS_BYTES, PARAMS_HEAD, PROF_OFF,
    SCAN, SMEM_MAIN, TABLE,
};

use super::cpu::CpuEngine;
use super::{Engine, EngineKind};
use crate::config::Options;
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{DirectOut, Dtype, Hit, Metric, SearchRequest, MAX_FILTER_NAMESPACES};

const NONE_U32: u32 = u32::MAX;
/// Bytes of GEMM score tile per batch step; `KALOS_TILE_MB` overrides (tuning). 96 MB beat 24
/// and 48 MB on the H200 (docs/history/gpu-sessions.md): larger GEMMs run faster than the L2 reuse
/// of a smaller tile saves.
const SCORE_TILE_BYTES: usize = 96 << 20;
/// The same for f16 score tiles, counted as f32 (the tile itself is half this; two of them when
/// pipelined): larger tiles mean fewer filter blocks, each paying its start-up once per tile.
/// H200, 1024 x 1M x 768 f16, pipelined, engine p50 (seventh session, gpu_probe): 96 MB 4.42 ms,
/// 192 MB 4.03 ms, 384 MB 3.84 ms (48 MB 4.92 ms).
const SCORE16_TILE_BYTES: usize = 384 << 20;
/// Candidate-buffer budget of one batch step.
const CAND_BYTES: usize = 256 << 20;
/// Filter steps per cruise segment (no barrier inside; `Params::fseg`, kernels/batch.cu
/// batch_filter_body); `KALOS_FILTER_SEG` sets it (0 or 1: a barrier every step). 16 measured
/// best: the engine took 3.63 instead of 3.85 ms per 1024 x 1M x 768 f16 batch on the H200.
/// It was off in the eighth session after intermittent CUDA_ERROR_ILLEGAL_INSTRUCTION in the
/// score16 suite: every thread read the query's bound from global memory while other blocks
/// raised it, so warps could disagree on whether to cruise and take different numbers of
/// barriers; the bound is now read once per block (docs/history/gpu-sessions.md, ninth session).
pub const FILTER_SEG: u32 = 16;
/// Single-query blocks per SM for large tables: 1M x 768 f16 went from 475 to 407 us on the H200
/// with 3 instead of 2.
const GRID_PER_SM: usize = 3;
/// Fewest rows per single-query block: small tables get more,
/// smaller blocks, each scanning its rows in one or two rounds of loads and selecting by rank
/// (64 beat 256 and 32 for 10k x 128 on the H200: GPU round trip 19.7 against 23.2 and 20.8 us).
const MIN_ROWS: usize = 64;
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
/// Score tile bytes (counted as f32, as SCORE16_TILE_BYTES) of a gated batch: 131072 rows for
/// 1024 queries. On the H200 (1024 x 1M x 768 f16, gated GEMMs + scans pipelined): 2.76 ms at
/// 131072 rows a tile, 2.94 at 98304, 3.08 at 65536 (docs/history/gpu-sessions.md, eleventh session).
const GATE_TILE_BYTES: usize = 512 << 20;
/// Candidates a query's buffer holds in a gated batch: the first tile's cut (up to 2k) and
/// every later row above the query's bound (about k per tile of the first tile's size on
/// random data); past it the batch is answered again from f32 tiles.
const GATE_CAP: usize = 2048;
/// Fewest rows of a gated batch's first tile (16384 was slower than 32768-65536 on the H200).
const GATE_FIRST_MIN: usize = 32768;

/// Largest k answered from f16 score tiles (their cuts keep up to 2k tied rows per filter block).
const SCORE16_MAX_K: usize = 256;

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
    ns: [u64; MAX_FILTER_NAMESPACES],
    /// Device address of the client's slot for the response body, or 0.
    dst: u64,
}
const _: () = assert!(std::mem::size_of::<Params>() <= PARAMS_BYTES);

// Params' head (n .. qscale) is what both by-value arguments start with (`ParamsHead` in
// kernels/common.cuh, whose size the kernel checks against the same PARAMS_HEAD).
const _: () = assert!(std::mem::offset_of!(Params, ns) == PARAMS_HEAD);

/// The compact by-value request of `scan_topk_c` (`struct ParamsC` in kernels/scan.cu), which
/// the query follows: Params' head, the response address and up to NS_INLINE namespaces, 104
/// bytes in place of Params' 640. A graph's kernel-node update copies the whole argument, and
/// on the H200 its size is most of the update's cost (docs/GPU.md).
#[repr(C)]
#[derive(Clone, Copy)]
struct ParamsC {
    head: [u8; PARAMS_HEAD],
    dst: u64,
    ns: [u64; NS_INLINE],
}
const PARAMS_C_BYTES: usize = std::mem::size_of::<ParamsC>();
const _: () = assert!(PARAMS_C_BYTES == 104);

impl ParamsC {
    /// The compact form of `p`, when its filter fits (else None).
    fn of(p: &Params) -> Option<ParamsC> {
        let nns = if p.nns == NONE_U32 { 0 } else { p.nns as usize };
        if nns > NS_INLINE {
            return None;
        }
        let mut c = ParamsC { head: [0; PARAMS_HEAD], dst: p.dst, ns: [0; NS_INLINE] };
        // SAFETY: Params is repr(C) plain data of at least PARAMS_HEAD bytes.
        c.head.copy_from_slice(unsafe { std::slice::from_raw_parts(p as *const Params as *const u8, PARAMS_HEAD) });
        c.ns[..nns].copy_from_slice(&p.ns[..nns]);
        Some(c)
    }
}

/// Device table columns (`struct Table` in the kernel), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct TableArg {
    vecs: u64,
    norms: u64,
    ids: u64,
    ns: u64,
    created: u64,
    expires: u64,
}

fn cu_err(what: &str, r: sys::CUresult) -> Error {
    let mut p: *const std::os::raw::c_char = std::ptr::null();
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
#[allow(dead_code)] // `bytes` documents the allocation (useful in a debugger)
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
        ck(&format!("cuMemAlloc({bytes} bytes) for {what}"), unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(16)) })?;
        Ok(DevBuf { ptr, bytes })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ptr != 0 {
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
        ck(&format!("cuMemHostAlloc({bytes})"), unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(64), flags) })?;
        Ok(HostBuf { ptr: p as *mut u8, bytes })
    }
    /// Device address of a buffer allocated with CU_MEMHOSTALLOC_DEVICEMAP.
    fn device_ptr(&self) -> Result<sys::CUdeviceptr> {
        let mut d: sys::CUdeviceptr = 0;
        ck("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut c_void, 0) })?;
        Ok(d)
    }
    fn slice(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            unsafe {
                sys::cuMemFreeHost(self.ptr as *mut c_void);
            }
        }
    }
}

/// An instantiated CUDA graph (and, for by-value graphs, its kernel node).
struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
}

/// Largest params + query block passed by value by default (dims up to 352 in f32 layout).
const BYVAL_MAX_BYTES: usize = 2048;

/// How a single query reaches the GPU (docs/GPU.md, "Launch").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SqMode {
    /// A one-node graph whose kernel takes params + query by value; each request updates the
    /// node's arguments and replays the graph (default up to BYVAL_MAX_BYTES).
    Graph,
    /// A graph of two nodes: a copy of params + query from pinned memory, then the kernel
    /// (larger dims).
    Copy,
}

impl Drop for Graph {
    fn drop(&mut self) {
        unsafe {
            if !self.exec.is_null() {
                sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// Longest wait for the GPU to answer one single query before the engine gives up on it (a
/// hung kernel must not hang the server and its clients forever).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// True when the driver, NVRTC and cuBLAS libraries can be loaded (nothing else is touched).
pub fn libraries_present() -> bool {
    catch_unwind(|| unsafe {
        cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() && cudarc::cublas::sys::is_culib_present()
    })
    .unwrap_or(false)
}

/// Checks that a usable GPU is present: libraries load and at least one device answers.
pub fn probe() -> Result<(i32, i32, String)> {
    if !libraries_present() {
        return Err(Error::new(
            Status::BackendUnavailable,
            "CUDA is not available: the driver (libcuda), NVRTC or cuBLAS library was not found",
        ));
    }
    catch_unwind(|| -> Result<(i32, i32, String)> {
        ck("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| Error::new(Status::BackendUnavailable, format!("no usable GPU: {}", e.message)))?;
        let mut ver = 0;
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
        ck("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })
            .map_err(|e| Error::new(Status::BackendUnavailable, e.message))?;
        if n < 1 {
            return Err(Error::new(Status::BackendUnavailable, "no CUDA device found"));
        }
        let mut dev = 0;
        ck("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, 0) })?;
        let attr = |a| {
            let mut v = 0;
            unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
            v
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        let mut name = [0 as std::os::raw::c_char; 128];
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 127, dev) };
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
/// small to pay for a GPU round trip on the CPU engine (see [`DEFAULT_GPU_MIN_WORK`]).
pub fn create_auto(opts: &Options, store: &Store) -> Result<Box<dyn Engine>> {
    create_with(opts, store, true)
}

fn create_with(opts: &Options, store: &Store, hybrid: bool) -> Result<Box<dyn Engine>> {
    let cc = probe()?;
    if store.dim() > MAX_GPU_DIM {
        return Err(Error::new(
            Status::BackendUnavailable,
            format!("the CUDA engine supports dim <= {MAX_GPU_DIM}; this store has {}", store.dim()),
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| CudaEngine::new(opts, store, cc, hybrid))) {
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
    match catch_unwind(AssertUnwindSafe(|| CudaEngine::new(opts, store, cc, false))) {
        Ok(r) => r,
        Err(_) => Err(Error::new(Status::BackendUnavailable, "the CUDA engine failed to start (a CUDA library function is missing)")),
    }
}

struct BatchBufs {
    d_qf32: DevBuf,
    d_q: DevBuf,
    /// bf16 storage: the queries' residual (q - bf16(q), in bf16), scored by a second GEMM
    /// (empty otherwise).
    d_qlo: DevBuf,
    d_qn: DevBuf,
    d_params: DevBuf,
    d_scores: DevBuf,
    /// The second score tile of a pipelined batch (the GEMM of tile t+1 writes it while tile t
    /// is filtered; empty when not pipelined).
    d_scores2: DevBuf,
    d_bkey: DevBuf,
    d_brow: DevBuf,
    d_bcnt: DevBuf,
    d_oids: DevBuf,
    d_oscores: DevBuf,
    d_ocnt: DevBuf,
    d_thr: DevBuf,
    /// Gated tiles: each query's bias (f16), -(bound - margin) (gate_bias).
    d_bias: DevBuf,
    /// f16 score tiles: set by batch_filter_h when a score overflowed the f16 range.
    d_overflow: DevBuf,
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

pub struct CudaEngine {
    _ctx: Arc<CudaContext>,
    _modules: Vec<Arc<cudarc::driver::CudaModule>>,
    f_scan: sys::CUfunction,
    /// The by-value single-query kernel (None when params + query exceed 4 KiB).
    f_scan_v: Option<sys::CUfunction>,
    /// `scan_topk_c`: the by-value kernel with the compact argument (graph mode only).
    f_scan_c: Option<sys::CUfunction>,
    /// Single queries sent with the compact argument (for the report).
    compact_sq: u64,
    sq_mode: SqMode,
    f_filter: sys::CUfunction,
    /// batch_filter over f16 score tiles (f16 storage, `score16`).
    f_filter_h: sys::CUfunction,
    /// f16 storage: batches with ip / cosine, no recency and k <= 256 score into f16 tiles
    /// (f32 accumulation, output rounded: half the tile traffic of f32 tiles) and stay exact:
    /// cuts keep ties and the survivors are rescored in f32 (kernels/batch.cu, "Batches").
    /// `KALOS_SCORE16=0` turns it off; cleared for good when a batch overflows the f16 range
    /// (that batch is answered again from f32 tiles).
    score16: bool,
    /// Score type of the batch in progress (gemm_one, filter_tile, profile_batch read it).
    tile16: bool,
    /// Batches answered again from f32 tiles after an f16 overflow (the engine report).
    score16_overflows: u64,
    f_tighten: sys::CUfunction,
    f_final: sys::CUfunction,
    f_gate_bias: sys::CUfunction,
    f_gate_scan: sys::CUfunction,
    /// Gated tiles (kernels/batch.cu, "Gated tiles"): f16 batches with no filter score every tile
    /// after the first with a cuBLASLt GEMM that zeroes the rows below each query's bound, and
    /// gate_scan collects the rest. `lt` is set up on the first such batch.
    lt: Option<lt::Lt>,
    /// Why gated tiles are off for this engine's life (`KALOS_GATE=0`, cuBLASLt missing or
    /// failed); None while they may be used.
    gate_off: Option<String>,
    /// Batches answered with gated tiles (for the report).
    gated_batches: u64,
    /// Rows of a gated batch's first tile (`KALOS_GATE_FIRST`, tuning; default n * k / 160).
    gate_first: Option<usize>,
    /// The batch in progress uses gated tiles (search_batch answers it again without them if it
    /// fails).
    gating: bool,
    /// Score tile bytes of a gated batch (counted as f32, like tile16_bytes).
    gate_tile_bytes: usize,
    /// Rows per score tile: this many bytes of f32 scores for the batch's queries (f16 tiles
    /// hold half the bytes), `tile16_bytes` for f16 tiles.
    tile_bytes: usize,
    tile16_bytes: usize,
    /// Rows per step of a batch_filter block (NT * FU * 4).
    fstep: usize,
    batch_profile: bool,
    f_scatter: sys::CUfunction,
    f_convq: sys::CUfunction,
    f_checkq: sys::CUfunction,
    stream: sys::CUstream,
    /// Batches: the filters run on this second, high-priority stream, beside the next tile's
    /// GEMM on `stream` (two score tiles, ordered by `ev`; see search_batch_tiles).
    fstream: sys::CUstream,
    /// [GEMM done with score tile 0, 1; filter done with score tile 0, 1].
    ev: [sys::CUevent; 4],
    /// Pipelined batches (`KALOS_BATCH_PIPE=0` turns it off).
    pipe: bool,
    /// Filter steps per cruise segment (`FILTER_SEG`).
    filter_seg: u32,
    /// SMs the GEMMs of a pipelined batch may use (cublasSetSmCountTarget; 0 = all), leaving
    /// the rest to the filters (`KALOS_GEMM_SMS`).
    gemm_sms: usize,
    /// The handle's current SM count target (0 = all, the cuBLAS default).
    sm_target: i32,
    blas: cb::cublasHandle_t,
    cc: (i32, i32),
    sms: usize,
    dim: usize,
    dp: usize,
    esize: usize,
    dtype: Dtype,
    metric: Metric,
    store_cap: usize,
    limit_bytes: usize,
    // Table mirror.
    cap_rows: usize,
    len: usize,
    d_vecs: DevBuf,
    d_norms: DevBuf,
    d_ids: DevBuf,
    d_ns: DevBuf,
    d_created: DevBuf,
    d_expires: DevBuf,
    gen: u64,
    // Single-query path.
    h_in: HostBuf,
    d_in: DevBuf,
    /// Results of the single-query kernel: pinned host memory the kernel writes directly
    /// (count, sequence word, ids, scores); `d_out` is its device address.
    h_out: HostBuf,
    d_out: sys::CUdeviceptr,
    seq: u32,
    /// GPU round trips (graph launch -> results published), ns, for the drop-time report.
    rtt: Vec<u32>,
    /// Host time of the launch calls alone (set params + launch), beside each `rtt` entry.
    rtt_api: Vec<u32>,
    /// KALOS_PROF=1: per request, the kernel's phase durations (ns) from its timestamps.
    prof: Option<Vec<[u32; 9]>>,
    /// Engine time of each batched search (ns), reported with KALOS_CUDA_REPORT.
    batch_times: Vec<(usize, u64)>,
    d_ckey: DevBuf,
    d_crow: DevBuf,
    /// Merge control of the single-query kernel: [ticket, bound, candidates appended, 0].
    d_ticket: DevBuf,
    cand_cap: usize,
    /// Single-query graphs by (grid, compact argument).
    graphs: HashMap<(u32, bool), (u64, Graph)>,
    // Sync staging.
    h_stage: HostBuf,
    d_stage: DevBuf,
    stage_rows: usize,
    batch: Option<BatchBufs>,
    hybrid: bool,
    min_work: usize,
    /// Single queries on tables up to this many bytes of f32 vectors go to the CPU engine's
    /// awake split scan (hybrid only; 0 where its workers sleep between requests).
    min_split_bytes: usize,
    cpu: CpuEngine,
    last_cpu: bool,
    failed: Option<String>,
    /// Test hook (KALOS_CUDA_FAULT_AFTER=n): the n+1-th GPU search fails with a CUDA error.
    fault_after: Option<u64>,
    searches: u64,
    /// Single-query grid: blocks per SM for large tables, fewest rows per block for small ones
    /// (GRID_PER_SM, MIN_ROWS).
    grid_per_sm: usize,
    min_rows: usize,
    /// The clients' slots (host address, length), registered with CUDA and mapped at
    /// `slots_dev` (0 = not mapped): single-query kernels write response bodies there.
    slots: (usize, usize),
    slots_dev: u64,
    /// The server's staging region (host address, length; 0 = none), registered with CUDA: a
    /// batch whose queries lie in it is copied to the device from there, with no staging copy.
    staging: (usize, usize),
    /// Single-query responses written straight into a client's slot (for the report).
    direct_writes: u64,
    /// Large ip/l2 batches are copied to the device straight from the client's slot and checked
    /// there (`Engine::takes_slot_queries`); `KALOS_SLOT_DMA=0` turns it off (the server then
    /// copies them into its mirror first).
    slot_dma: bool,
    /// Batches answered from queries in a client's slot (for the report).
    slot_batches: u64,
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
fn filter_smem(kx: usize, fstep: usize) -> usize {
    (2 * kx + fstep * 3 / 2) * 8
}

/// A score tile size given in MB (`KALOS_TILE_MB`, tuning probes), within 4 MB..1 GB.
fn tile_mb_bytes(mb: usize) -> usize {
    mb.clamp(4, 1024) << 20
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// The argument array of a kernel launch: a pointer to each argument (each a local the array
/// must not outlive; `cuLaunchKernel` and kernel nodes copy the values when called).
macro_rules! kargs {
    ($($a:ident),* $(,)?) => {
        [$(&mut $a as *mut _ as *mut c_void),*]
    };
}

/// Argument pointer array of scan_topk / scan_topk_v / scan_topk_c: `first` points at the first
/// argument's value (the device input address, or the by-value params + query bytes).
fn scan_arg_ptrs(first: *mut c_void, tab: &mut TableArg, tail: &mut [u64; 4]) -> [*mut c_void; 6] {
    let [a, b, c, d] = tail;
    [
        first,
        tab as *mut TableArg as *mut c_void,
        a as *mut u64 as *mut c_void,
        b as *mut u64 as *mut c_void,
        c as *mut u64 as *mut c_void,
        d as *mut u64 as *mut c_void,
    ]
}

fn kernel_node(f: sys::CUfunction, grid: u32, smem: u32, args: *mut *mut c_void) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: f,
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: NT,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        kernelParams: args,
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Writes Params (or, with `compact`, its ParamsC form) and the query (zero-padded to `dp`
/// floats) as the kernels read them.
fn put_request(buf: &mut [u8], p: &Params, compact: Option<&ParamsC>, q: &[f32], dp: usize) {
    let at = if let Some(c) = compact {
        // SAFETY: ParamsC is repr(C) plain data.
        let pb = unsafe { std::slice::from_raw_parts(c as *const ParamsC as *const u8, PARAMS_C_BYTES) };
        buf[..PARAMS_C_BYTES].copy_from_slice(pb);
        PARAMS_C_BYTES
    } else {
        // SAFETY: Params is repr(C) plain data.
        let pb = unsafe { std::slice::from_raw_parts(p as *const Params as *const u8, std::mem::size_of::<Params>()) };
        buf[..pb.len()].copy_from_slice(pb);
        PARAMS_BYTES
    };
    let qb = &mut buf[at..at + dp * 4];
    for (i, c) in qb.chunks_exact_mut(4).enumerate() {
        let v = if i < q.len() { q[i] } else { 0.0 };
        c.copy_from_slice(&v.to_le_bytes());
    }
}

impl CudaEngine {
    fn new(opts: &Options, store: &Store, cc: (i32, i32, String), hybrid: bool) -> Result<CudaEngine> {
        // Spin while waiting for the GPU: the server thread is a polling thread anyway, and a
        // blocking wait adds tens of microseconds per request.
        unsafe {
            let mut dev = 0;
            if sys::cuDeviceGet(&mut dev, 0) == sys::CUresult::CUDA_SUCCESS {
                sys::cuDevicePrimaryCtxSetFlags_v2(dev, sys::CUctx_flags::CU_CTX_SCHED_SPIN as u32);
            }
        }
        let ctx = CudaContext::new(0).map_err(|e| Error::new(Status::BackendUnavailable, format!("CUDA context: {e:?}")))?;
        ctx.bind_to_thread().map_err(|e| Error::new(Status::Cuda, format!("bind context: {e:?}")))?;
        unsafe { ctx.disable_event_tracking() };
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::new(Status::Cuda, format!("{e:?}")))? as usize;
        let tune = crate::config::tuning_or_default();
        let dim = store.dim();
        let dtype = opts.dtype;
        let metric = store.metric();
        let spec = KernelSpec { arch: format!("sm_{}{}", cc.0, cc.1), dim, dtype, metric, prof: tune.prof };
        let prof = spec.prof;
        let geo = compile::Geometry::of(dim, dtype);
        let dp = geo.dp;
        let fstep = NT as usize * FILTER_FU * 4;
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
        let f_scan = getf(SCAN, "scan_topk")?;
        let f_scan_v = if geo.byval { Some(getf(SCAN, "scan_topk_v")?) } else { None };
        // Graph mode sends requests filtered by at most NS_INLINE namespaces with the compact
        // argument (104 bytes in place of 640): on the H200 at 10k x 128 f32 its server p50 was
        // 14.6-14.7 us against 14.8-16.1 with the full argument (docs/BENCHMARKS.md).
        let f_scan_c = f_scan_v.map(|_| getf(SCAN, "scan_topk_c")).transpose()?;
        // By value for small queries, a copy node for larger ones: at 768 dims the copy graph's
        // round trip was 1.3-2.9 us shorter on the H200 (three runs); at 128 dims they tie.
        let sq_mode = if f_scan_v.is_none() || PARAMS_BYTES + dp * 4 > BYVAL_MAX_BYTES { SqMode::Copy } else { SqMode::Graph };
        let f_filter = getf(BATCH, "batch_filter")?;
        let f_filter_h = getf(BATCH, "batch_filter_h")?;
        let f_tighten = getf(BATCH, "batch_tighten")?;
        let f_final = getf(BATCH, "batch_final")?;
        let f_gate_bias = getf(BATCH, "gate_bias")?;
        let f_gate_scan = getf(BATCH, "gate_scan")?;
        let f_scatter = getf(TABLE, "scatter_rows")?;
        let f_convq = getf(TABLE, "convert_queries")?;
        let f_checkq = getf(TABLE, "check_queries")?;
        let smem_scan = SMEM_MAIN + dp * 4;
        let smem_filter = filter_smem(KMAX, fstep);
        for (f, bytes) in [
            (Some(f_scan), smem_scan),
            (f_scan_v, smem_scan),
            (f_scan_c, smem_scan),
            (Some(f_filter), smem_filter),
            (Some(f_filter_h), smem_filter),
            (Some(f_tighten), smem_scan),
            (Some(f_final), smem_scan),
        ] {
            let Some(f) = f else { continue };
            ck("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(f, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            })?;
        }
        let mut stream: sys::CUstream = std::ptr::null_mut();
        ck("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
        // The filter stream gets the highest priority: a filter block waiting for an SM is
        // scheduled before the next GEMM's blocks.
        let (mut least, mut greatest) = (0i32, 0i32);
        ck("cuCtxGetStreamPriorityRange", unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) })?;
        let mut fstream: sys::CUstream = std::ptr::null_mut();
        ck("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(&mut fstream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, greatest)
        })?;
        let mut ev: [sys::CUevent; 4] = [std::ptr::null_mut(); 4];
        for e in ev.iter_mut() {
            ck("cuEventCreate", unsafe { sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) })?;
        }
        let mut blas: cb::cublasHandle_t = std::ptr::null_mut();
        ckb("cublasCreate", unsafe { cb::cublasCreate_v2(&mut blas) })?;
        ckb("cublasSetStream", unsafe { cb::cublasSetStream_v2(blas, stream as cb::cudaStream_t) })?;
        // Plain f32 math: no TF32 (results for f32 storage must equal an f32 scan's ranking).
        ckb("cublasSetMathMode", unsafe { cb::cublasSetMathMode(blas, cb::cublasMath_t::CUBLAS_DEFAULT_MATH) })?;
        let (free, _total) = ctx.mem_get_info().map_err(|e| Error::new(Status::Cuda, format!("{e:?}")))?;
        let limit_bytes = if opts.gpu_memory_bytes > 0 { opts.gpu_memory_bytes as usize } else { free / 10 * 9 };
        let stage_rows = ((16usize << 20) / (dim * 4 + 48)).max(1);
        let stage_bytes = stage_rows * (dim * 4 + 48) + 1024;
        let cpu = CpuEngine::for_server(opts.threads as usize, opts.server_spin_ns);
        let mut e = CudaEngine {
            _ctx: ctx.clone(),
            _modules: modules.clone(),
            f_scan,
            f_scan_v,
            f_scan_c,
            compact_sq: 0,
            sq_mode,
            f_filter,
            f_filter_h,
            // f16 storage only: cuBLAS has no bf16 x bf16 -> f16 GEMM (with bf16 storage it
            // failed the batch on the H200, and the engine fell back to the CPU).
            score16: dtype == Dtype::F16,
            tile16: false,
            score16_overflows: 0,
            f_tighten,
            f_final,
            f_gate_bias,
            f_gate_scan,
            lt: None,
            gate_off: None,
            gated_batches: 0,
            gate_first: None,
            gating: false,
            gate_tile_bytes: GATE_TILE_BYTES,
            tile_bytes: SCORE_TILE_BYTES,
            tile16_bytes: SCORE16_TILE_BYTES,
            fstep,
            batch_profile: false,
            f_scatter,
            f_convq,
            f_checkq,
            stream,
            fstream,
            ev,
            pipe: true,
            filter_seg: FILTER_SEG,
            gemm_sms: sms,
            sm_target: 0,
            blas,
            cc: (cc.0, cc.1),
            sms,
            dim,
            dp,
            esize: if dtype == Dtype::F32 { 4 } else { 2 },
            dtype,
            metric,
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
            h_in: HostBuf::new(PARAMS_BYTES + dp * 4)?,
            d_in: DevBuf::new(PARAMS_BYTES + dp * 4, "query")?,
            h_out: HostBuf::with_flags(PROF_OFF + 128, 0x02 /* CU_MEMHOSTALLOC_DEVICEMAP */)?,
            prof: if prof { Some(Vec::with_capacity(1 << 16)) } else { None },
            d_out: 0,
            seq: 0,
            rtt: Vec::with_capacity(1 << 16),
            rtt_api: Vec::with_capacity(1 << 16),
            batch_times: Vec::new(),
            d_ckey: DevBuf::empty(),
            d_crow: DevBuf::empty(),
            d_ticket: DevBuf::new(16, "merge control")?,
            cand_cap: 0,
            graphs: HashMap::new(),
            h_stage: HostBuf::new(stage_bytes)?,
            d_stage: DevBuf::new(stage_bytes, "staging")?,
            stage_rows,
            batch: None,
            hybrid,
            min_work: work_threshold(),
            min_split_bytes: split_threshold(cpu.awake_participants()),
            cpu,
            last_cpu: false,
            failed: None,
            fault_after: tune.cuda_fault_after,
            searches: 0,
            grid_per_sm: GRID_PER_SM,
            min_rows: MIN_ROWS,
            slots: (0, 0),
            slots_dev: 0,
            slot_dma: true,
            slot_batches: 0,
            staging: (0, 0),
            direct_writes: 0,
        };
        e.d_out = e.h_out.device_ptr()?;
        ck("memset ticket", unsafe { sys::cuMemsetD8Async(e.d_ticket.ptr, 0, 16, e.stream) })?;
        let max_rows = e.limit_bytes / e.row_bytes();
        let initial = store.len().max(store.capacity().min(1 << 16).min(max_rows)).max(1);
        e.ensure_capacity(initial)?;
        e.sync_stream()?;
        Ok(e)
    }

    /// Tuning probes only: batch pipelining, the GEMMs' SM count (0 = all), f16 score tiles
    /// (f16 storage; ignored otherwise), the score tile's size in MB (0: the defaults) and the
    /// filter's cruise segment in steps (0 or 1: off).
    #[doc(hidden)]
    pub fn set_batch_tuning(&mut self, pipe: bool, gemm_sms: usize, score16: bool, tile_mb: usize, filter_seg: u32) {
        self.pipe = pipe;
        self.filter_seg = filter_seg;
        (self.tile_bytes, self.tile16_bytes) = match tile_mb {
            0 => (SCORE_TILE_BYTES, SCORE16_TILE_BYTES),
            mb => (tile_mb_bytes(mb), tile_mb_bytes(mb)),
        };
        self.gemm_sms = if gemm_sms == 0 { self.sms } else { gemm_sms.min(self.sms) };
        self.score16 = score16 && self.dtype == Dtype::F16;
    }

    /// Tuning probes only: engine time (ns) of the last batched search.
    #[doc(hidden)]
    pub fn last_batch_ns(&self) -> u64 {
        self.batch_times.last().map_or(0, |&(_, t)| t)
    }

    /// Tuning probes only: SMs of the device.
    #[doc(hidden)]
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    fn sync_stream(&self) -> Result<()> {
        ck("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(self.stream) })
    }

    fn row_bytes(&self) -> usize {
        self.dp * self.esize + 4 + 8 * 4
    }

    /// Makes room for `rows` rows (doubling), copying the rows present. On failure the table is
    /// unchanged and the error is `STORE_FULL` with the reason.
    fn ensure_capacity(&mut self, rows: usize) -> Result<()> {
        if rows <= self.cap_rows {
            return Ok(());
        }
        let mut new_cap = rows.max(self.cap_rows.saturating_mul(2)).min(self.store_cap.max(rows));
        let max_rows = self.limit_bytes / self.row_bytes();
        if rows > max_rows {
            return Err(Error::new(
                Status::StoreFull,
                format!(
                    "the GPU table cannot grow to {rows} rows: {} bytes of GPU memory allowed (option gpu_memory_bytes) hold {max_rows} rows",
                    self.limit_bytes
                ),
            ));
        }
        new_cap = new_cap.min(max_rows);
        let alloc = |bytes: usize, w: &str| DevBuf::new(bytes, w);
        let vecs = alloc(new_cap * self.dp * self.esize, "table vectors")?;
        let norms = alloc(new_cap * 4, "norms")?;
        let ids = alloc(new_cap * 8, "ids")?;
        let ns = alloc(new_cap * 8, "namespaces")?;
        let created = alloc(new_cap * 8, "created")?;
        let expires = alloc(new_cap * 8, "expires")?;
        let n = self.len;
        if n > 0 {
            let copy = |dst: &DevBuf, src: &DevBuf, bytes: usize| {
                ck("grow copy", unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, self.stream) })
            };
            copy(&vecs, &self.d_vecs, n * self.dp * self.esize)?;
            copy(&norms, &self.d_norms, n * 4)?;
            copy(&ids, &self.d_ids, n * 8)?;
            copy(&ns, &self.d_ns, n * 8)?;
            copy(&created, &self.d_created, n * 8)?;
            copy(&expires, &self.d_expires, n * 8)?;
            self.sync_stream()?;
        }
        self.d_vecs = vecs;
        self.d_norms = norms;
        self.d_ids = ids;
        self.d_ns = ns;
        self.d_created = created;
        self.d_expires = expires;
        self.cap_rows = new_cap;
        self.gen += 1;
        self.graphs.clear();
        Ok(())
    }

    fn table_arg(&self) -> TableArg {
        TableArg {
            vecs: self.d_vecs.ptr,
            norms: self.d_norms.ptr,
            ids: self.d_ids.ptr,
            ns: self.d_ns.ptr,
            created: self.d_created.ptr,
            expires: self.d_expires.ptr,
        }
    }

    fn do_sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        let n = store.len();
        self.ensure_capacity(n)?;
        let mut rows: Vec<u32> = dirty.iter().copied().filter(|&r| (r as usize) < n).collect();
        rows.sort_unstable();
        rows.dedup();
        let dim = self.dim;
        let sr = self.stage_rows;
        // Staging layout (offsets for `sr` rows): rows u32 | norms f32 | ids | ns | created | expires | vecs f32.
        let o_rows = 0usize;
        let o_norms = align_up(o_rows + sr * 4, 16);
        let o_ids = align_up(o_norms + sr * 4, 16);
        let o_ns = o_ids + sr * 8;
        let o_cr = o_ns + sr * 8;
        let o_ex = o_cr + sr * 8;
        let o_v = align_up(o_ex + sr * 8, 16);
        for chunk in rows.chunks(sr) {
            let m = chunk.len();
            {
                let buf = self.h_stage.slice();
                let put = |buf: &mut [u8], off: usize, b: &[u8]| buf[off..off + b.len()].copy_from_slice(b);
                for (i, &r) in chunk.iter().enumerate() {
                    let r = r as usize;
                    put(buf, o_rows + i * 4, &(r as u32).to_le_bytes());
                    put(buf, o_norms + i * 4, &store.norms()[r].to_le_bytes());
                    put(buf, o_ids + i * 8, &store.ids()[r].to_le_bytes());
                    put(buf, o_ns + i * 8, &store.namespaces()[r].to_le_bytes());
                    put(buf, o_cr + i * 8, &store.created_ms()[r].to_le_bytes());
                    put(buf, o_ex + i * 8, &store.expires_ms()[r].to_le_bytes());
                    let v = &store.vectors()[r * dim..(r + 1) * dim];
                    let dst = &mut buf[o_v + i * dim * 4..o_v + (i + 1) * dim * 4];
                    // SAFETY: f32 -> bytes of the same length.
                    dst.copy_from_slice(unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, dim * 4) });
                }
            }
            let used = o_v + m * dim * 4;
            ck("stage copy", unsafe { sys::cuMemcpyHtoDAsync_v2(self.d_stage.ptr, self.h_stage.ptr as *const c_void, used, self.stream) })?;
            let base = self.d_stage.ptr;
            let mut a_rows = base + o_rows as u64;
            let mut a_norms = base + o_norms as u64;
            let mut a_ids = base + o_ids as u64;
            let mut a_ns = base + o_ns as u64;
            let mut a_cr = base + o_cr as u64;
            let mut a_ex = base + o_ex as u64;
            let mut a_v = base + o_v as u64;
            let mut mm = m as u32;
            let mut dv = self.d_vecs.ptr;
            let mut dn = self.d_norms.ptr;
            let mut di = self.d_ids.ptr;
            let mut dns = self.d_ns.ptr;
            let mut dc = self.d_created.ptr;
            let mut de = self.d_expires.ptr;
            let mut args = kargs![a_rows, a_norms, a_ids, a_ns, a_cr, a_ex, a_v, mm, dv, dn, di, dns, dc, de];
            let blocks = ((m * self.dp).div_ceil(NT as usize)).clamp(1, 4096) as u32;
            ck("launch scatter_rows", unsafe {
                sys::cuLaunchKernel(self.f_scatter, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
            })?;
            // The staging buffer is reused by the next chunk.
            self.sync_stream()?;
        }
        self.len = n;
        Ok(())
    }

    fn grid_for(&self, n: usize, k: usize) -> u32 {
        // Blocks: about two per SM for large tables, fewer (but each with >= `min_rows` rows)
        // for small ones; never more than CHUNK rows per block. Sized from the power-of-two
        // bucket of n so that the captured graph is reused while the table grows or shrinks.
        let nb = n.next_power_of_two().max(1);
        let min_rows = if k > 64 { (4 * k).min(CHUNK) } else { self.min_rows };
        let g = nb.div_ceil(min_rows).min(self.grid_per_sm * self.sms).max(nb.div_ceil(CHUNK)).max(1);
        g as u32
    }

    fn ensure_cand(&mut self, lists: usize) -> Result<()> {
        if lists <= self.cand_cap {
            return Ok(());
        }
        let cap = lists.next_power_of_two();
        self.d_ckey = DevBuf::new(cap * KMAX * 4, "candidates")?;
        self.d_crow = DevBuf::new(cap * KMAX * 4, "candidates")?;
        self.cand_cap = cap;
        self.graphs.clear();
        Ok(())
    }

    /// Pointers of the single-query kernel's arguments after the first (the input buffer
    /// address in copy mode, the by-value params + query otherwise).
    fn scan_tail(&self) -> (TableArg, [u64; 4]) {
        (self.table_arg(), [self.d_ckey.ptr, self.d_crow.ptr, self.d_ticket.ptr, self.d_out])
    }

    /// Builds the single-query graph for `grid` blocks. Copy mode: captured H2D(params + query)
    /// → scan_topk. Graph mode: one scan_topk_v (`compact`: scan_topk_c) kernel node, whose
    /// by-value argument each request replaces (`cuGraphExecKernelNodeSetParams`).
    fn build_graph(&mut self, grid: u32, compact: bool) -> Result<Graph> {
        let smem = (SMEM_MAIN + self.dp * 4) as u32;
        let in_bytes = PARAMS_BYTES + self.dp * 4;
        let (mut tab, mut tail) = self.scan_tail();
        unsafe {
            if self.sq_mode == SqMode::Graph {
                let f = if compact { self.f_scan_c } else { self.f_scan_v };
                let f = f.ok_or_else(|| Error::new(Status::Internal, "by-value kernel missing"))?;
                let mut graph: sys::CUgraph = std::ptr::null_mut();
                ck("graph create", sys::cuGraphCreate(&mut graph, 0))?;
                let mut g = Graph { graph, exec: std::ptr::null_mut(), node: std::ptr::null_mut() };
                let mut args = scan_arg_ptrs(self.h_in.ptr as *mut c_void, &mut tab, &mut tail);
                let kp = kernel_node(f, grid, smem, args.as_mut_ptr());
                ck("graph add kernel", sys::cuGraphAddKernelNode_v2(&mut g.node, g.graph, std::ptr::null(), 0, &kp))?;
                ck("graph instantiate", sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0))?;
                ck("graph upload", sys::cuGraphUpload(g.exec, self.stream))?;
                return Ok(g);
            }
            ck("begin capture", sys::cuStreamBeginCapture_v2(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))?;
            let body = (|| -> Result<()> {
                ck("capture H2D", sys::cuMemcpyHtoDAsync_v2(self.d_in.ptr, self.h_in.ptr as *const c_void, in_bytes, self.stream))?;
                let mut a_in = self.d_in.ptr;
                let mut args = scan_arg_ptrs(&mut a_in as *mut u64 as *mut c_void, &mut tab, &mut tail);
                ck(
                    "capture scan_topk",
                    sys::cuLaunchKernel(self.f_scan, grid, 1, 1, NT, 1, 1, smem, self.stream, args.as_mut_ptr(), std::ptr::null_mut()),
                )?;
                Ok(())
            })();
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            let r_end = sys::cuStreamEndCapture(self.stream, &mut graph);
            body?;
            ck("end capture", r_end)?;
            let mut g = Graph { graph, exec: std::ptr::null_mut(), node: std::ptr::null_mut() };
            ck("graph instantiate", sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0))?;
            ck("graph upload", sys::cuGraphUpload(g.exec, self.stream))?;
            Ok(g)
        }
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
            fseg: self.filter_seg,
            seq: 0,
            qscale: 1.0,
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

    fn search_one(&mut self, store: &Store, req: &SearchRequest<'_>, q: &[f32]) -> Result<Vec<Hit>> {
        let n = self.len;
        let k = req.k.min(KMAX);
        let grid = self.grid_for(n, k);
        let chunk = n.div_ceil(grid as usize).max(1) as u32;
        self.ensure_cand(grid as usize)?;
        let mut p = self.fill_params(req, store, n, k, grid, chunk);
        if self.metric == Metric::L2 {
            p.qnorm = q.iter().map(|x| x * x).sum();
        }
        let qmax = q.iter().fold(0f32, |m, x| m.max(x.abs()));
        p.qscale = if qmax > 0.0 { qmax } else { 1.0 };
        self.seq = self.seq.wrapping_add(1).max(1);
        p.seq = self.seq;
        // The kernel also writes the response body into the client's slot when it is mapped.
        let direct = req.direct.and_then(|d| {
            let (h, len) = self.slots;
            let off = (d.host as usize).checked_sub(h)?;
            (self.slots_dev != 0 && d.cap >= DirectOut::body_len(k) && off.checked_add(DirectOut::body_len(k))? <= len)
                .then_some((d, self.slots_dev + off as u64))
        });
        if let Some((_, dst)) = direct {
            p.dst = dst;
        }
        // Graph mode sends the compact argument when the filter fits it.
        let pc = if self.sq_mode == SqMode::Graph && self.f_scan_c.is_some() { ParamsC::of(&p) } else { None };
        let key = (grid, pc.is_some());
        if self.graphs.get(&key).is_none_or(|(g, _)| *g != self.gen) {
            self.graphs.remove(&key);
            let g = self.build_graph(grid, key.1)?;
            self.graphs.insert(key, (self.gen, g));
        }
        let dp = self.dp;
        put_request(self.h_in.slice(), &p, pc.as_ref(), q, dp);
        let t0 = std::time::Instant::now();
        let smem = (SMEM_MAIN + self.dp * 4) as u32;
        let (mut tab, mut tail) = self.scan_tail();
        let mut args = scan_arg_ptrs(self.h_in.ptr as *mut c_void, &mut tab, &mut tail);
        match self.sq_mode {
            SqMode::Graph => {
                let g = &self.graphs.get(&key).unwrap().1;
                let f = if key.1 { self.f_scan_c } else { self.f_scan_v };
                let f = f.ok_or_else(|| Error::new(Status::Internal, "by-value kernel missing"))?;
                let kp = kernel_node(f, grid, smem, args.as_mut_ptr());
                ck("graph set params", unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, g.node, &kp) })?;
                ck("graph launch", unsafe { sys::cuGraphLaunch(g.exec, self.stream) })?;
                self.compact_sq += key.1 as u64;
            }
            SqMode::Copy => {
                let exec = self.graphs.get(&key).unwrap().1.exec;
                ck("graph launch", unsafe { sys::cuGraphLaunch(exec, self.stream) })?;
            }
        }
        let t_api = t0.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.wait_published(p.seq)?;
        if self.rtt.len() < self.rtt.capacity() {
            self.rtt.push(t0.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            self.rtt_api.push(t_api);
        }
        if let Some(v) = self.prof.as_mut() {
            // SAFETY: h_out holds PROF_OFF + 128 bytes; the kernel wrote 8 stamps and the
            // merge's candidate counts before publishing.
            let st: [u64; 9] =
                std::array::from_fn(|i| unsafe { std::ptr::read_volatile((self.h_out.ptr.add(PROF_OFF) as *const u64).add(i)) });
            if v.len() < v.capacity() {
                let mut a: [u32; 9] = [0; 9];
                for i in 0..7 {
                    a[i] = st[i + 1].saturating_sub(st[i]).min(u32::MAX as u64) as u32;
                }
                a[7] = (st[8] >> 32) as u32;
                a[8] = st[8] as u32;
                v.push(a);
            }
        }
        let out = unsafe { std::slice::from_raw_parts(self.h_out.ptr as *const u8, 8 + 12 * k) };
        let count = u32::from_le_bytes(out[0..4].try_into().unwrap()) as usize;
        if count > k {
            return Err(Error::new(Status::Cuda, format!("GPU returned {count} hits for k = {k}")));
        }
        let mut hits = Vec::with_capacity(count);
        let so = 8 + 8 * k;
        for i in 0..count {
            let id = u64::from_le_bytes(out[8 + 8 * i..16 + 8 * i].try_into().unwrap());
            let score = f32::from_le_bytes(out[so + 4 * i..so + 4 * i + 4].try_into().unwrap());
            hits.push(Hit { id, score });
        }
        if let Some((d, _)) = direct {
            d.written.set(DirectOut::body_len(count));
            self.direct_writes += 1;
        }
        Ok(hits)
    }

    /// Spins until the kernel has published sequence number `seq` (the server thread polls
    /// anyway; a stream synchronisation would add microseconds). A failed kernel, one that
    /// finished without publishing, and no answer within ANSWER_TIMEOUT are errors.
    fn wait_published(&self, seq: u32) -> Result<()> {
        let word = unsafe { self.h_out.ptr.add(4) as *const u32 };
        let t0 = std::time::Instant::now();
        let mut i = 0u32;
        loop {
            // SAFETY: h_out is live pinned memory; the kernel writes this word (volatile).
            if unsafe { std::ptr::read_volatile(word) } == seq {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                return Ok(());
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i % 256 != 0 {
                continue;
            }
            let r = unsafe { sys::cuStreamQuery(self.stream) };
            if r == sys::CUresult::CUDA_SUCCESS {
                if unsafe { std::ptr::read_volatile(word) } == seq {
                    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                    return Ok(());
                }
                return Err(Error::new(Status::Cuda, "the search kernel finished without publishing its results"));
            } else if r != sys::CUresult::CUDA_ERROR_NOT_READY {
                return Err(cu_err("search kernel", r));
            }
            if t0.elapsed() > ANSWER_TIMEOUT {
                return Err(Error::new(Status::Cuda, format!("the GPU did not answer a query within {} s", ANSWER_TIMEOUT.as_secs())));
            }
        }
    }

    /// Makes every batch buffer large enough for `nq` queries, `k` results, a score tile of
    /// `tile_rows` rows and `buf_cap` candidates per query. Each buffer only grows, by its own
    /// byte size: a 1024-query batch (short, wide tiles) and an 8-query one (long tiles) need
    /// about the same bytes, so alternating them reallocates nothing (it used to free and
    /// allocate every buffer at each switch, ~5 ms on the H200). The sizes stay bounded: the
    /// score tile by `tile_bytes` (or one 4M-row column), the candidates by CAND_BYTES.
    fn ensure_batch(&mut self, nq: usize, k: usize, tile_rows: usize, buf_cap: usize, pipe: bool) -> Result<()> {
        let (dim, dp, esize, bf16, tile16) = (self.dim, self.dp, self.esize, self.dtype == Dtype::Bf16, self.tile16);
        let b = self.batch.get_or_insert_with(BatchBufs::empty);
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
        align_up(rows, if self.tile16 { 8 } else { 4 })
    }

    /// One GEMM: scores[rows x m] (column-major, ld = ldc >= rows) = table[row0..row0+rows] · queries.
    /// For bf16 storage a second GEMM adds the query residual's scores (d_qlo, beta = 1).
    fn gemm_tile(&self, d_q: u64, d_scores: u64, row0: usize, rows: usize, m: usize, ldc: usize) -> Result<()> {
        self.gemm_one(d_q, 0.0, d_scores, row0, rows, m, ldc)?;
        match self.batch.as_ref().map(|b| b.d_qlo.ptr).filter(|&p| p != 0) {
            Some(lo) => self.gemm_one(lo, 1.0, d_scores, row0, rows, m, ldc),
            None => Ok(()),
        }
    }

    /// scores = table[row0..row0+rows] · queries + beta * scores (see gemm_tile).
    #[allow(clippy::too_many_arguments)]
    fn gemm_one(&self, d_q: u64, beta: f32, d_scores: u64, row0: usize, rows: usize, m: usize, ldc: usize) -> Result<()> {
        let alpha = 1.0f32;
        let a = self.d_vecs.ptr + (row0 * self.dp * self.esize) as u64;
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
                        if self.tile16 { cb::cudaDataType::CUDA_R_16F } else { cb::cudaDataType::CUDA_R_32F },
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
    fn search_batch(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        // f16 score tiles where rounding a score is monotone in the key (ip / cosine without
        // recency: the key is the score itself; l2 adds each row's norm, recency each row's
        // boost) and the tie room of a cut fits (k <= 256; kernels/batch.cu, "Batches").
        if req.slot.is_some() {
            self.slot_batches += 1;
        }
        self.tile16 = self.score16 && self.metric != Metric::L2 && req.recency.is_none() && req.k <= SCORE16_MAX_K;
        let mut r = self.search_batch_tiles(store, req, out);
        let gate_failed = match &r {
            Err(e) if self.gating && !e.status.is_request_error() => Some(e.message.clone()),
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
            self.gate_off = Some(format!("a gated batch failed: {m}"));
            self.lt = None;
            r = self.search_batch_tiles(store, req, out);
        }
        if let Ok(Some(bits)) = r {
            // Bit 1: a score beyond the f16 range (vectors of large norm): answer again from f32
            // tiles, and keep to them for this engine's life. Bit 2: a tie group larger than a
            // cut's room (many equal scores near the k-th): this batch only.
            if bits & 1 != 0 {
                self.score16 = false;
            }
            self.tile16 = false;
            self.score16_overflows += 1;
            r = self.search_batch_tiles(store, req, out);
        }
        self.tile16 = false;
        if r.is_err() {
            // A pipelined batch may have left filters queued on the second stream: let them
            // finish before anything reuses the buffers (the error is already reported).
            // SAFETY: the engine's own stream.
            unsafe { sys::cuStreamSynchronize(self.fstream) };
        }
        r.map(|_| ())
    }

    /// search_batch with the score type of `self.tile16`. Ok(Some(bits)): an f16 batch
    /// overflowed (bits as in search_batch), `out` holds nothing and the batch must be answered
    /// again from f32 tiles.
    fn search_batch_tiles(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<Option<u32>> {
        let t_start = std::time::Instant::now();
        let n = self.len;
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
        let kx = if self.tile16 { 2 * k } else { k };
        let mut nqt = nq_all.min(1024);
        // Gated tiles: f16 tiles, pipelined, and no filter, recency or expiry (every row's key
        // is its score), with cuBLASLt at hand.
        self.gating = false;
        let plain = |e: &Self| {
            let p = e.fill_params(req, store, n, k, 0, 0);
            p.flags == 0 && p.nns == NONE_U32
        };
        let lt_ok = self.tile16 && self.pipe && plain(self) && self.lt_ready();
        let tile_bytes = match (lt_ok, self.tile16) {
            (true, _) => self.gate_tile_bytes,
            (false, true) => self.tile16_bytes,
            (false, false) => self.tile_bytes,
        };
        // Filter blocks: one per query and span of a tile's rows, at least ~4 per SM in all.
        let sms = self.sms;
        let fstep = self.fstep;
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
        self.gating = gated;
        // Gated: a first tile of `first` rows sets the bounds (plain GEMM + filter), then gated
        // tiles of `tile` rows. Rows passing a bound: about k * (n - first) / first a query on
        // random data.
        // Default n * k / 160 rows (~160 rows passing a query's bound on random data); 65536 at
        // 1M rows and k = 10, the best of 16k-131k rows on the H200 (docs/history/gpu-sessions.md).
        let first = if gated { self.gate_first.unwrap_or(n * k / 160).clamp(GATE_FIRST_MIN.min(tile), tile) / fstep * fstep } else { tile };
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
        let pipe = self.pipe && self.tile16 && ntiles > 1;
        // Gated tiles hold align_up(m, 8) scores a row.
        self.ensure_batch(if gated { align_up(nqt, 8) } else { nqt }, k, tile, cap, pipe)?;
        if gated {
            self.gated_batches += 1;
        }
        let b = self.batch.as_ref().unwrap();
        let (d_qf32, d_q, d_qn, d_params, d_scores) = (b.d_qf32.ptr, b.d_q.ptr, b.d_qn.ptr, b.d_params.ptr, b.d_scores.ptr);
        let d_scores2 = b.d_scores2.ptr;
        let sm_target = if pipe && self.gemm_sms < self.sms { self.gemm_sms as i32 } else { 0 };
        if sm_target != self.sm_target {
            // Only when KALOS_GEMM_SMS asks for it (no gain measured): the default path never
            // calls it, so a cuBLAS without the symbol cannot fail a batch.
            // SAFETY: a plain setting of the engine's cuBLAS handle (0 = every SM).
            ckb("cublasSetSmCountTarget", unsafe { cb::cublasSetSmCountTarget(self.blas, sm_target) })?;
            self.sm_target = sm_target;
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
        // Host-side phases for KALOS_BATCH_PROFILE: until the first GEMM is queued, and after
        // the last group's results are back.
        let (mut t_params, mut t_staged, mut t_inputs, mut t_queued, mut t_synced) = (None, None, None, None, None);
        super::reset_out(out, nq_all);
        for q0 in (0..nq_all).step_by(nqt) {
            let m = (nq_all - q0).min(nqt);
            // Queries in the client's slot (req.slot) are copied to the device as they are and
            // checked there (check_queries); host queries were checked by the server.
            let slot = req.slot.map(|sq| (sq.ptr as usize + q0 * dim * 4, m * dim));
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
                t_params.get_or_insert_with(|| t_start.elapsed());
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
                        sys::cuLaunchKernel(self.f_checkq, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut()),
                    )?;
                } else if sb != 0 && qa >= sb && qa + qs.len() * 4 <= sb + sl {
                    // Already in registered memory (the server's private copy of the request).
                    ck("H2D queries", sys::cuMemcpyHtoDAsync_v2(d_qf32, qs.as_ptr() as *const c_void, qs.len() * 4, self.stream))?;
                } else if qs.len() * 4 <= self.h_stage.bytes {
                    // Through pinned memory: a pageable copy of a 3 MB batch costs ~1 ms.
                    std::ptr::copy_nonoverlapping(qs.as_ptr() as *const u8, self.h_stage.ptr, qs.len() * 4);
                    ck("H2D queries", sys::cuMemcpyHtoDAsync_v2(d_qf32, self.h_stage.ptr as *const c_void, qs.len() * 4, self.stream))?;
                } else {
                    ck("H2D queries", sys::cuMemcpyHtoD_v2(d_qf32, qs.as_ptr() as *const c_void, qs.len() * 4))?;
                }
                t_staged.get_or_insert_with(|| t_start.elapsed());
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
                        sys::cuLaunchKernel(self.f_convq, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut()),
                    )?;
                }
                ck("reset thresholds", sys::cuMemsetD8Async(d_thr, 0, m * 4, self.stream))?;
                ck("reset overflow flag", sys::cuMemsetD8Async(d_ovf, 0, 4, self.stream))?;
                ck("reset counts", sys::cuMemsetD8Async(d_bcnt, 0, m * 4, self.stream))?;
            }
            t_inputs.get_or_insert_with(|| t_start.elapsed());
            let mut tab = self.table_arg();
            let (mut a_in, mut a_bk, mut a_br, mut a_bc, mut a_thr) = (d_params, d_bkey, d_brow, d_bcnt, d_thr);
            let (mut a_cap, mut a_high) = (cap as u32, high as u32);
            let (mut a_ties, mut a_ovf, mut a_q16) = (self.tile16 as u32, d_ovf, d_q);
            let fs = FilterStep { m, span, cap, high, smem: fsmem };
            for (t, &(row0, rows)) in tiles.iter().enumerate() {
                let (buf, fst) = match (pipe, t % 2) {
                    (false, _) => (d_scores, self.stream),
                    (true, 0) => (d_scores, self.fstream),
                    (true, _) => (d_scores2, self.fstream),
                };
                // SAFETY (the event calls below): events and streams are the engine's own, alive
                // until Drop; waits are recorded on the streams, nothing blocks the host.
                if pipe && t >= 2 {
                    // The filter of tile t-2 has finished reading this score tile.
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2 + t % 2], 0) })?;
                }
                let gt = gated && t > 0;
                if gt && t == 1 {
                    // The biases follow the bounds tile 0's filter left (on fstream).
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2], 0) })?;
                    let (mut a_thr, mut a_bk, mut a_bc, mut a_cap, mut a_m, mut a_bias) =
                        (d_thr, d_bkey, d_bcnt, cap as u32, m as u32, d_bias);
                    let mut args = kargs![a_thr, a_bk, a_bc, a_cap, a_m, a_bias];
                    // SAFETY: d_thr, d_bcnt and d_bias hold >= m entries, d_bkey m * cap (ensure_batch).
                    ck("launch gate_bias", unsafe {
                        sys::cuLaunchKernel(
                            self.f_gate_bias,
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
                t_queued.get_or_insert_with(|| t_start.elapsed());
                if pipe {
                    // Everything queued on `stream` so far (inputs, resets, this GEMM) comes
                    // before this tile's filter.
                    ck("cuEventRecord", unsafe { sys::cuEventRecord(self.ev[t % 2], self.stream) })?;
                    ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.fstream, self.ev[t % 2], 0) })?;
                }
                if gt {
                    self.gate_scan(buf, fst, row0, rows, m, cap)?;
                } else {
                    let fblocks = self.filter_tile(&fs, buf, fst, row0, rows)?;
                    // With one filter block per query the filter cuts the buffers itself.
                    if fblocks > 1 && t + 1 < ntiles {
                        let mut targs = kargs![a_in, tab, a_bk, a_br, a_bc, a_cap, a_high, a_thr, a_ties, a_ovf];
                        ck("launch batch_tighten", unsafe {
                            sys::cuLaunchKernel(
                                self.f_tighten,
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
                    ck("cuEventRecord", unsafe { sys::cuEventRecord(self.ev[2 + t % 2], self.fstream) })?;
                }
            }
            if pipe {
                // batch_final and the copies back follow the last filter.
                ck("cuStreamWaitEvent", unsafe { sys::cuStreamWaitEvent(self.stream, self.ev[2 + (ntiles - 1) % 2], 0) })?;
            }
            let (mut a_oi, mut a_os, mut a_oc) = (d_oids, d_osc, d_ocnt);
            let mut margs = kargs![a_in, tab, a_bk, a_br, a_bc, a_cap, a_oi, a_os, a_oc, a_ties, a_q16];
            // SAFETY: as above; the host vectors hold nqt * k ids/scores and nqt counts.
            unsafe {
                ck(
                    "launch batch_final",
                    sys::cuLaunchKernel(
                        self.f_final,
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
            t_synced = Some(t_start.elapsed());
            for i in 0..m {
                let c = counts[i] as usize;
                if c > k {
                    return Err(Error::new(Status::Cuda, format!("GPU returned {c} hits for k = {k} (candidate buffer overflow?)")));
                }
                out[q0 + i].extend((0..c).map(|j| Hit { id: ids[i * k + j], score: scores[i * k + j] }));
            }
        }
        if self.batch_times.len() < 1 << 16 {
            self.batch_times.push((nq_all, t_start.elapsed().as_nanos() as u64));
        }
        if self.batch_profile {
            let fs = FilterStep { m: nq_all.min(nqt), span, cap, high, smem: fsmem };
            let whole = t_start.elapsed();
            eprintln!(
                "kalos batch host phases: params copied at {:.3} ms, queries staged at {:.3} ms, inputs queued at {:.3} ms, first GEMM queued after {:.3} ms, results back at {:.3} ms, search done at {:.3} ms",
                t_params.unwrap_or_default().as_secs_f64() * 1e3,
                t_staged.unwrap_or_default().as_secs_f64() * 1e3,
                t_inputs.unwrap_or_default().as_secs_f64() * 1e3,
                t_queued.unwrap_or_default().as_secs_f64() * 1e3,
                t_synced.unwrap_or_default().as_secs_f64() * 1e3,
                whole.as_secs_f64() * 1e3
            );
            // Plain tiles of `tile` rows (a gated batch starts with a shorter first tile).
            self.profile_batch(&fs, tile, n.div_ceil(tile), whole)?;
        }
        Ok(None)
    }

    /// True when the gated tiles' cuBLASLt is set up (on first use; a failure turns gating off
    /// for good, with the reason in `gate_off`).
    fn lt_ready(&mut self) -> bool {
        if self.lt.is_some() {
            return true;
        }
        if self.gate_off.is_some() {
            return false;
        }
        if !lt::present() {
            self.gate_off = Some("libcublasLt (or one of its functions) was not found".into());
            return false;
        }
        match lt::Lt::new(self.dp) {
            Ok(l) => {
                self.lt = Some(l);
                true
            }
            Err(e) => {
                self.gate_off = Some(e.message);
                false
            }
        }
    }

    /// One gated tile (kernels/batch.cu, "Gated tiles"): out = max(0, queries · rows + bias) in
    /// f16, align_up(m, 8) scores a row, on `stream`; `tune`: a full tile (its shape's
    /// algorithms are timed the first time).
    #[allow(clippy::too_many_arguments)]
    fn gemm_gated(&mut self, d_q: u64, d_bias: u64, out: u64, row0: usize, rows: usize, m: usize, tune: bool) -> Result<()> {
        let rows0 = self.d_vecs.ptr + (row0 * self.dp * self.esize) as u64;
        let stream = self.stream;
        let lt = self.lt.as_mut().ok_or_else(|| Error::new(Status::Internal, "gated tile without cuBLASLt"))?;
        lt.gemm(d_q, rows0, d_bias, out, m, align_up(m, 8), rows, stream, tune)
    }

    /// Launches gate_scan over a gated tile (rows `row0..row0+rows`), appending its nonzero
    /// scores to the candidate buffers (`cap` per query).
    fn gate_scan(&self, scores: u64, stream: sys::CUstream, row0: usize, rows: usize, m: usize, cap: usize) -> Result<()> {
        let b = self.batch.as_ref().ok_or_else(|| Error::new(Status::Internal, "batch buffers missing"))?;
        let ldm = align_up(m, 8);
        let n16 = (ldm * rows / 8) as u64;
        let (mut a_d, mut a_n16, mut a_ldm, mut a_m, mut a_row0) = (scores, n16, ldm as u32, m as u32, row0 as u32);
        let (mut a_bk, mut a_br, mut a_bc, mut a_cap, mut a_ovf) = (b.d_bkey.ptr, b.d_brow.ptr, b.d_bcnt.ptr, cap as u32, b.d_overflow.ptr);
        let mut args = kargs![a_d, a_n16, a_ldm, a_m, a_row0, a_bk, a_br, a_bc, a_cap, a_ovf];
        let blocks = (self.sms * 8).min((n16 as usize).div_ceil(NT as usize)).max(1) as u32;
        // SAFETY: `scores` holds ldm * rows halves (ensure_batch with align_up(nqt, 8) queries),
        // the candidate buffers m * cap entries and m counts.
        ck("launch gate_scan", unsafe {
            sys::cuLaunchKernel(self.f_gate_scan, blocks, 1, 1, NT, 1, 1, 0, stream, args.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    /// Launches batch_filter over one score tile (rows `row0..row0+rows`, in d_scores with
    /// ld = align_up(rows, 4)); returns the number of blocks per query.
    fn filter_tile(&self, fs: &FilterStep, scores: u64, stream: sys::CUstream, row0: usize, rows: usize) -> Result<u32> {
        let b = self.batch.as_ref().ok_or_else(|| Error::new(Status::Internal, "batch buffers missing"))?;
        let mut tab = self.table_arg();
        let (mut a_in, mut a_qn, mut a_sc, mut a_bk, mut a_br, mut a_bc, mut a_thr) =
            (b.d_params.ptr, b.d_qn.ptr, scores, b.d_bkey.ptr, b.d_brow.ptr, b.d_bcnt.ptr, b.d_thr.ptr);
        let (mut a_ld, mut a_row0, mut a_rows, mut a_span) = (self.tile_ld(rows) as u32, row0 as u32, rows as u32, fs.span as u32);
        let mut a_ovf = b.d_overflow.ptr;
        let (mut a_cap, mut a_high) = (fs.cap as u32, fs.high as u32);
        let mut args = kargs![a_in, a_qn, tab, a_sc, a_ld, a_row0, a_rows, a_span, a_bk, a_br, a_bc, a_cap, a_high, a_thr, a_ovf];
        let blocks = rows.div_ceil(fs.span) as u32;
        // batch_filter takes the first 14 arguments, batch_filter_h all 15.
        let f = if self.tile16 { self.f_filter_h } else { self.f_filter };
        // SAFETY: every pointer argument is a live device buffer sized by ensure_batch for
        // fs.m queries, `rows` <= tile rows and fs.cap candidates per query.
        ck("launch batch_filter", unsafe {
            sys::cuLaunchKernel(f, blocks, fs.m as u32, 1, NT, 1, 1, fs.smem, stream, args.as_mut_ptr(), std::ptr::null_mut())
        })?;
        Ok(blocks)
    }

    /// Tuning aid (`KALOS_BATCH_PROFILE=1`): after a batch, times the GEMMs of one query group
    /// alone and the filter alone (re-run over the last tile with the final thresholds: the
    /// steady state of every tile but the first few), to set against the whole batch's time.
    fn profile_batch(&mut self, fs: &FilterStep, tile: usize, ntiles: usize, whole: std::time::Duration) -> Result<()> {
        let (d_q, d_scores) = {
            let b = self.batch.as_ref().unwrap();
            (b.d_q.ptr, b.d_scores.ptr)
        };
        let t0 = std::time::Instant::now();
        for t in 0..ntiles {
            let row0 = t * tile;
            let rows = (self.len - row0).min(tile);
            self.gemm_tile(d_q, d_scores, row0, rows, fs.m, self.tile_ld(rows))?;
        }
        self.sync_stream()?;
        let gemms = t0.elapsed();
        let row0 = (ntiles - 1) * tile;
        let rows = self.len - row0;
        self.gemm_tile(d_q, d_scores, row0, rows, fs.m, self.tile_ld(rows))?;
        self.sync_stream()?;
        let d_bcnt = self.batch.as_ref().unwrap().d_bcnt.ptr;
        let t1 = std::time::Instant::now();
        for _ in 0..ntiles {
            // Empty candidate buffers each time (the thresholds stay final): re-filtering the same
            // tile into kept buffers appends the same rows again, and duplicate rows break the
            // selection's "ids are unique" rule (the likely cause of the illegal address this
            // profile hit on the H200: a cut of duplicates keeps more than k, past its slots).
            // SAFETY: d_bcnt holds fs.m counts (ensure_batch).
            ck("reset counts", unsafe { sys::cuMemsetD8Async(d_bcnt, 0, fs.m * 4, self.stream) })?;
            self.filter_tile(fs, d_scores, self.stream, row0, rows)?;
        }
        self.sync_stream()?;
        let filters = t1.elapsed();
        eprintln!(
            "kalos batch profile: {} queries x {} rows, {ntiles} tiles of {tile} rows: whole search {:.3} ms, GEMMs alone {:.3} ms, steady-state filters alone {:.3} ms ({} rows last tile)",
            fs.m,
            self.len,
            whole.as_secs_f64() * 1e3,
            gemms.as_secs_f64() * 1e3,
            filters.as_secs_f64() * 1e3,
            rows
        );
        Ok(())
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
        if !self.rtt.is_empty() && crate::config::tuning_or_default().cuda_report {
            let mut v = self.rtt.clone();
            v.sort_unstable();
            let mut a = self.rtt_api.clone();
            a.sort_unstable();
            eprintln!(
                "kalos cuda engine ({}): {} single-query GPU round trips (graph launch -> results in host memory): p50 {:.1} us, p99 {:.1} us (of which the launch calls on the host p50 {:.1} us; mode {:?}, {} with the compact argument); {} responses written into the client's slot by the kernel",
                self.describe(),
                v.len(),
                v[v.len() / 2] as f64 / 1000.0,
                v[(v.len() * 99) / 100] as f64 / 1000.0,
                a[a.len() / 2] as f64 / 1000.0,
                self.sq_mode,
                self.compact_sq,
                self.direct_writes
            );
        }
        if !self.batch_times.is_empty() && crate::config::tuning_or_default().cuda_report {
            // Per batch size: a benchmark's 1024-query batches and its small recall checks apart.
            let mut sizes: Vec<usize> = self.batch_times.iter().map(|&(nq, _)| nq).collect();
            sizes.sort_unstable();
            sizes.dedup();
            for nq in sizes {
                let mut v: Vec<u64> = self.batch_times.iter().filter(|&&(m, _)| m == nq).map(|&(_, t)| t).collect();
                v.sort_unstable();
                eprintln!(
                    "kalos cuda engine ({}): {} batched searches of {} queries, engine time p50 {:.3} ms, min {:.3} ms, max {:.3} ms",
                    self.describe(),
                    v.len(),
                    nq,
                    v[v.len() / 2] as f64 / 1e6,
                    v[0] as f64 / 1e6,
                    v[v.len() - 1] as f64 / 1e6
                );
            }
            eprintln!(
                "kalos cuda engine ({}): batch score tiles {}; {} batch(es) answered again from f32 tiles after an f16 overflow; {} batch(es) copied to the device from the client's slot; {} gated batch(es){}{}",
                self.describe(),
                if self.score16 { "f16" } else if self.dtype == Dtype::F32 { "f32" } else { "f32 (f16 off or overflowed)" },
                self.score16_overflows,
                self.slot_batches,
                self.gated_batches,
                self.gate_off.as_ref().map_or(String::new(), |m| format!(" (gating off: {m})")),
                self.lt.as_ref().map_or(String::new(), |l| if l.tuned.is_empty() { String::new() } else { format!("; gated GEMM {}", l.tuned.join("; ")) })
            );
        }
        if let Some(v) = self.prof.as_ref().filter(|v| !v.is_empty()) {
            let p50 = |i: usize| {
                let mut x: Vec<u32> = v.iter().map(|a| a[i]).collect();
                x.sort_unstable();
                x[x.len() / 2] as f64 / 1000.0
            };
            eprintln!(
                "kalos cuda kernel phases ({}), p50 of {}: block-0 scan {:.1} us, block-0 select {:.1} us, wait for the last block {:.1} us, final merge {:.1} us (read bound {:.1}, compact {:.1}, rank+write {:.1}), publish fence {:.1} us; merge candidates {:.0}, survivors {:.0}",
                self.describe(),
                v.len(),
                p50(0),
                p50(1),
                p50(2),
                p50(3) + p50(4) + p50(5),
                p50(3),
                p50(4),
                p50(5),
                p50(6),
                p50(7) * 1000.0,
                p50(8) * 1000.0
            );
        }
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamSynchronize(self.fstream);
            if self.slots_dev != 0 {
                sys::cuMemHostUnregister(self.slots.0 as *mut c_void);
            }
            if self.staging.0 != 0 {
                sys::cuMemHostUnregister(self.staging.0 as *mut c_void);
            }
            self.graphs.clear();
            self.batch = None;
            self.lt = None;
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
        if self.hybrid {
            s.push_str(if self.last_cpu { "-auto(last:cpu)" } else { "-auto(last:gpu)" });
        }
        s
    }
    fn sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        self.guarded("sync", |e| e.do_sync(store, dirty))
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
        self.slots_dev != 0 && self.slot_dma
    }
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let work = store.len().saturating_mul(self.dim).saturating_mul(req.nq);
        if self.hybrid && (work < self.min_work || (req.nq == 1 && work.saturating_mul(4) <= self.min_split_bytes)) {
            self.last_cpu = true;
            return self.cpu.search(store, req, out);
        }
        // Slot queries go to the device straight from the slot (search_batch); a single query
        // takes the by-value path, which needs them on the host.
        let mut host = Vec::new();
        let req = &if req.nq == 1 { super::with_host_queries(req, &mut host)? } else { req.clone() };
        self.last_cpu = false;
        if self.len != store.len() {
            return Err(Error::new(Status::Internal, format!("GPU table has {} rows, the store {}", self.len, store.len())));
        }
        if self.len == 0 {
            out.clear();
            out.resize(req.nq, Vec::new());
            return Ok(());
        }
        self.guarded("search", |e| {
            e.searches += 1;
            if e.fault_after.is_some_and(|n| e.searches > n) {
                return Err(Error::new(Status::Cuda, "injected fault (KALOS_CUDA_FAULT_AFTER)"));
            }
            if req.nq == 1 {
                let h = e.search_one(store, req, &req.queries[..e.dim])?;
                out.clear();
                out.push(h);
                Ok(())
            } else {
                e.search_batch(store, req, out)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(nns: u32) -> Params {
        let mut ns = [0u64; MAX_FILTER_NAMESPACES];
        for (i, x) in ns.iter_mut().enumerate() {
            *x = 1000 + i as u64;
        }
        Params {
            n: 10_000,
            k: 10,
            nns,
            flags: FLAG_EXPIRY,
            now_ms: 1_700_000_000_123,
            w: 0.25,
            qnorm: 3.5,
            hl: 60_000.0,
            grid: 256,
            chunk: 40,
            ntiles: 1,
            fseg: 7,
            seq: 41,
            qscale: 1.5,
            ns,
            dst: 0xdead_beef_0000,
        }
    }

    /// The compact argument carries Params' head byte for byte, the response address and the
    /// filter, and is refused for a filter it cannot hold (scan_topk_v takes those).
    #[test]
    fn compact_argument_mirrors_params() {
        for nns in [NONE_U32, 1, NS_INLINE as u32] {
            let p = params(nns);
            let c = ParamsC::of(&p).expect("fits");
            // SAFETY: Params is repr(C) plain data.
            let pb = unsafe { std::slice::from_raw_parts(&p as *const Params as *const u8, std::mem::size_of::<Params>()) };
            assert_eq!(&c.head[..], &pb[..PARAMS_HEAD]);
            assert_eq!(c.dst, p.dst);
            let used = if nns == NONE_U32 { 0 } else { nns as usize };
            assert_eq!(&c.ns[..used], &p.ns[..used]);
            assert!(c.ns[used..].iter().all(|&x| x == 0));
            // The request block as the compact kernel reads it: ParamsC, then the query.
            let mut buf = vec![0u8; PARAMS_BYTES + 8 * 4];
            let q = [1.0f32, -2.0, 3.0];
            put_request(&mut buf, &p, Some(&c), &q, 8);
            assert_eq!(&buf[..PARAMS_HEAD], &pb[..PARAMS_HEAD]);
            assert_eq!(&buf[PARAMS_HEAD..PARAMS_HEAD + 8], &p.dst.to_le_bytes());
            let qf: Vec<f32> =
                buf[PARAMS_C_BYTES..PARAMS_C_BYTES + 32].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(qf, [1.0, -2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        }
        assert!(ParamsC::of(&params(NS_INLINE as u32 + 1)).is_none());
        assert!(ParamsC::of(&params(64)).is_none());
    }
}
