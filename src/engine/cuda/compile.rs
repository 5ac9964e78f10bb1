//! Kernel compilation: the one place that assembles the kernel source and its NVRTC options.
//!
//! The engine ([`super::CudaEngine`]) and `kalosd doctor --compile` both go through
//! [`KernelSpec::options`] and [`compile_cubin`], so the compile check exercises exactly what
//! a server compiles. Every constant the kernels share with Rust is defined here and passed to
//! NVRTC as a `-D` define; `kernels/common.cuh` refuses to compile without them.

use std::ffi::CString;

use crate::error::{Error, Result, Status};
use crate::types::{Dtype, Metric, MAX_FILTER_NAMESPACES, MAX_K};

/// Headers every kernel module includes: (include name, source), embedded in the library.
pub const HEADERS: &[(&str, &str)] = &[("common.cuh", include_str!("../../../kernels/common.cuh"))];

/// One kernel module: a source file compiled to its own CUBIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Module {
    pub name: &'static str,
    pub src: &'static str,
    /// Its code paths depend on the dimension's [`Geometry`] (else the dimension only sets loop
    /// bounds and buffer strides).
    pub by_geometry: bool,
    /// It holds the `PROF=1` phase timestamps.
    pub profiled: bool,
}

/// Single-query fused scan + top-k.
pub const SCAN: Module = Module { name: "scan", src: include_str!("../../../kernels/scan.cu"), by_geometry: true, profiled: true };
/// Batches: selection from GEMM score tiles, gated tiles.
pub const BATCH: Module = Module { name: "batch", src: include_str!("../../../kernels/batch.cu"), by_geometry: false, profiled: false };
/// Table updates and batch query preparation.
pub const TABLE: Module = Module { name: "table", src: include_str!("../../../kernels/table.cu"), by_geometry: false, profiled: false };
/// Several queries in one pass over the table (f16 and bf16 storage; empty for f32).
pub const MULTI: Module = Module { name: "multi", src: include_str!("../../../kernels/multi.cu"), by_geometry: false, profiled: false };
/// Every kernel module the engine loads.
pub const MODULES: [Module; 4] = [SCAN, BATCH, TABLE, MULTI];

/// Threads per block of every kernel.
pub(crate) const NT: u32 = 256;
/// Most rows one single-query block scores (its keys are held in shared memory).
pub(crate) const CHUNK: usize = 4096;
/// Largest k.
pub(crate) const KMAX: usize = MAX_K;
/// Bytes reserved for `Params` in a request block (the query follows).
pub(crate) const PARAMS_BYTES: usize = 640;
/// `Params`' fields before the namespace list: the head both by-value arguments start with.
pub(crate) const PARAMS_HEAD: usize = 72;
/// Dynamic shared memory of the search kernels before the query copy: the chunk keys share the
/// first `MCAP * 8` bytes with the merge input (keys and rows), then `KMAX * 16` bytes of merge
/// output (keys, rows and ids).
pub(crate) const SMEM_MAIN: usize = MCAP * 8 + KMAX * 16;
/// Offset of the kernel's phase timestamps in the single-query output buffer (`PROF=1`).
pub(crate) const PROF_OFF: usize = 8 + KMAX * 12;
pub(crate) const FLAG_EXPIRY: u32 = 1;
pub(crate) const FLAG_RECENCY: u32 = 2;
/// Single query: each block keeps at most `KCUT` candidates and the merge flags an answer the
/// cut could have changed (the int8 scan's R candidates; kernels/scan.cu).
pub(crate) const FLAG_CUT: u32 = 4;
/// Candidates a block keeps under `FLAG_CUT`.
pub(crate) const KCUT: usize = 16;
/// Candidates the single-query merge takes into shared memory.
pub(crate) const MCAP: usize = 4096;
const _: () = assert!(CHUNK * 4 <= MCAP * 8, "the chunk keys live in the merge input's shared memory");
/// Set in the single-query count word when a `FLAG_CUT` answer may miss rows.
pub(crate) const CUT_FLAG: u32 = 0x8000_0000;
/// Largest filter program (`src/engine/cuda/fields.rs`, `DevProg`) `filter_eval_v` takes by
/// value in its launch parameters; larger ones are uploaded for `filter_eval`.
pub(crate) const FPROG_MAX: usize = 256;
/// Namespaces the compact single-query argument carries.
pub(crate) const NS_INLINE: usize = 4;
/// 16-byte score loads per thread per step of `batch_filter` (a step is NT * FU * 4 rows).
/// FU=2 with two steps in flight and 5 blocks per SM beat FU=4 and FU=8 on the H200
/// (steady-state filter 1.33 ms against 1.58 and 2.52 for 1024 x 1M f16).
pub(crate) const FILTER_FU: usize = 2;
/// Candidates each query of a multi-query pass keeps in shared memory per block
/// (kernels/multi.cu; at most NT: they are ranked directly).
pub(crate) const MQ_CAP: usize = 256;
/// Rows a multi-query block scores per round: 16 per warp.
pub(crate) const MQ_ROUND: usize = NT as usize / 32 * 16;
/// Largest k of a multi-query pass: a round's candidates never overflow a compacted buffer.
pub(crate) const MQ_KMAX: usize = MQ_CAP - MQ_ROUND;
/// Queries of the widest multi-query pass (`scan_multi4`: 4 MMA tiles of 8).
pub(crate) const MQ_MAXQ: usize = 32;
/// Bytes of one query's output of a multi-query pass: count, pad, ids, scores, padding.
pub(crate) const MQ_OUT_STRIDE: usize = 8 + 12 * MQ_KMAX + 16;
/// Largest by-value kernel argument (Params + query): the classic 4 KiB parameter space.
pub(crate) const MAX_ARG_BYTES: usize = 4096;
/// Largest dimension the GPU engine takes (the query must fit in shared memory).
pub(crate) const MAX_GPU_DIM: usize = 8192;
/// The oldest NVRTC (major, minor) the kernels are checked with; CI compiles every variant with
/// it (`nvidia-cuda-nvrtc==13.0.48`) and with the newest.
pub const OLDEST_NVRTC: (i32, i32) = (13, 0);
/// The oldest driver CUDA version (`cuDriverGetVersion`) the engine runs on: 13.0.
pub const OLDEST_DRIVER: i32 = 13000;

/// How a vector dimension shapes the scan kernel: the padded row, how many lanes share a row,
/// whether the query slice lives in registers and how many rows each lane group keeps in flight.
/// Computed here once and handed to the kernel as defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Elements per 16-byte load (4 for f32, 8 for f16/bf16).
    pub vec: usize,
    /// Padded row length in elements (16-byte rows).
    pub dp: usize,
    /// 16-byte vectors per row.
    pub nv: usize,
    /// Lanes sharing one row (1..32).
    pub gs: usize,
    /// 16-byte loads per lane per row.
    pub nch: usize,
    /// The lane's query slice is held in registers (else read from shared memory).
    pub qreg: bool,
    /// Rows in flight per lane group before pipelining halves it.
    pub ru0: usize,
    /// Params and the query fit in the by-value kernel argument (`scan_topk_v` exists).
    pub byval: bool,
}

impl Geometry {
    pub fn of(dim: usize, dtype: Dtype) -> Geometry {
        Geometry::with_vec(dim, if dtype == Dtype::F32 { 4 } else { 8 })
    }

    /// The int8 scan's codes (16 per 16-byte load). The GPU int8 scan serves the dimensions
    /// whose geometry holds the query slice in registers (`qreg`: up to 1536).
    pub fn of_codes(dim: usize) -> Geometry {
        Geometry::with_vec(dim, 16)
    }

    /// The int8 scan's 4-bit first pass (32 codes per 16-byte load): the dimensions whose
    /// geometry holds the query slice in registers (up to 1024).
    pub fn of_nibbles(dim: usize) -> Geometry {
        Geometry::with_vec(dim, 32)
    }

    fn with_vec(dim: usize, vec: usize) -> Geometry {
        let dp = dim.div_ceil(vec) * vec;
        let nv = dp / vec;
        let gs = match nv {
            17.. => 32,
            9..=16 => 16,
            5..=8 => 8,
            3..=4 => 4,
            2 => 2,
            _ => 1,
        };
        let nch = nv.div_ceil(gs);
        let ru0 = if nch >= 12 { 1 } else { (12 / nch).min(8) };
        Geometry { vec, dp, nv, gs, nch, qreg: nch * vec <= 48, ru0, byval: PARAMS_BYTES + dp * 4 <= MAX_ARG_BYTES }
    }

    /// What tells two dimensions' kernels apart beyond loop and unroll counts: the lanes per
    /// row, the query slice in registers or shared memory, a pipelined scan (more than one row
    /// in flight per lane group) and the by-value argument. Dimensions of one class compile the
    /// same code paths.
    fn class(&self) -> (usize, bool, bool, bool) {
        (self.gs, self.qreg, self.ru0 > 1, self.byval)
    }
}

/// One specialisation of the kernels, as a server requests it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// Target architecture, e.g. "sm_90".
    pub arch: String,
    pub dim: usize,
    pub dtype: Dtype,
    pub metric: Metric,
    /// Per-request phase timestamps (`KALOS_PROF=1`).
    pub prof: bool,
    /// What the scan reads instead of the table's rows: the int8 scan's single-query kernels
    /// over codes; `dtype` is then the store's and unused by the kernel.
    pub codes: Codes,
}

/// The rows a scan kernel reads (`KernelSpec::codes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codes {
    /// The table's rows in the store's dtype.
    None,
    /// The int8 scan's 8-bit codes (scan.cu, `DTYPE` 3).
    Int8,
    /// The int8 scan's 4-bit first pass (scan.cu, `DTYPE` 4): 4-bit codes, the best candidates
    /// re-scored from the 8-bit codes in the kernel.
    Nibble,
}

impl KernelSpec {
    /// The NVRTC options for this specialisation: the target, the shared constants, the
    /// dimension's geometry, dtype and metric.
    pub fn options(&self) -> Vec<String> {
        let g = match self.codes {
            Codes::None => Geometry::of(self.dim, self.dtype),
            Codes::Int8 => Geometry::of_codes(self.dim),
            Codes::Nibble => Geometry::of_nibbles(self.dim),
        };
        // The kernels tell only l2 apart: cosine rows are stored normalised and scored as ip.
        let metric = if self.metric == Metric::L2 { 2 } else { 0 };
        let defines: [(&str, u64); 31] = [
            ("NT", NT as u64),
            ("CHUNK", CHUNK as u64),
            ("KMAX", KMAX as u64),
            ("MAXNS", MAX_FILTER_NAMESPACES as u64),
            ("PARAMS_BYTES", PARAMS_BYTES as u64),
            ("PARAMS_HEAD", PARAMS_HEAD as u64),
            ("SMEM_MAIN", SMEM_MAIN as u64),
            ("PROF_OFF", PROF_OFF as u64),
            ("FLAG_EXPIRY", FLAG_EXPIRY as u64),
            ("FLAG_RECENCY", FLAG_RECENCY as u64),
            ("FLAG_CUT", FLAG_CUT as u64),
            ("KCUT", KCUT as u64),
            ("MCAP", MCAP as u64),
            ("CUT_FLAG", CUT_FLAG as u64),
            ("FPROG_MAX", FPROG_MAX as u64),
            ("NS_INLINE", NS_INLINE as u64),
            ("FU", FILTER_FU as u64),
            ("MQ_CAP", MQ_CAP as u64),
            ("MQ_KMAX", MQ_KMAX as u64),
            ("MQ_MAXQ", MQ_MAXQ as u64),
            ("MQ_OUT_STRIDE", MQ_OUT_STRIDE as u64),
            ("DIM", self.dim as u64),
            (
                "DTYPE",
                match self.codes {
                    Codes::None => self.dtype as u64,
                    Codes::Int8 => 3,
                    Codes::Nibble => 4,
                },
            ),
            ("METRIC", metric),
            ("VEC", g.vec as u64),
            ("DP", g.dp as u64),
            ("NV", g.nv as u64),
            ("GS", g.gs as u64),
            ("NCH", g.nch as u64),
            ("QREG", g.qreg as u64),
            ("RU0", g.ru0 as u64),
        ];
        let mut v = vec![format!("--gpu-architecture={}", self.arch), "--std=c++17".into(), "-default-device".into()];
        v.extend(defines.iter().map(|(k, x)| format!("-D{k}={x}")));
        v.push(format!("-DBYVAL={}", g.byval as u32));
        v.push(format!("-DPROF={}", self.prof as u32));
        v
    }

    /// Compiles this specialisation of `module` to a CUBIN.
    pub fn compile(&self, module: &Module) -> Result<Vec<u8>> {
        compile_cubin(module.name, module.src, &self.options())
    }

    /// A short label for reports: "sm_90 f16 l2 dim=768".
    pub fn label(&self) -> String {
        format!(
            "{} {} {} dim={}{}",
            self.arch,
            match self.codes {
                Codes::None => self.dtype.name(),
                Codes::Int8 => "int8",
                Codes::Nibble => "int4+int8",
            },
            self.metric.name(),
            self.dim,
            if self.prof { " prof" } else { "" }
        )
    }
}

/// One dimension of every dimension class of `dtype` (see [`Geometry`]), ascending: the largest
/// of its class, whose unrolled loops need the most registers. Compiling these compiles every
/// code path a dimension can select.
pub fn dim_classes(dtype: Dtype) -> Vec<usize> {
    classes_of(|d| Some(Geometry::of(d, dtype)))
}

/// As [`dim_classes`], for the int8 scan's kernels (the dimensions it serves on the GPU).
pub fn code_dim_classes() -> Vec<usize> {
    classes_of(|d| Some(Geometry::of_codes(d)).filter(|g| g.qreg))
}

/// As [`dim_classes`], for the int8 scan's 4-bit first pass.
pub fn nibble_dim_classes() -> Vec<usize> {
    classes_of(|d| Some(Geometry::of_nibbles(d)).filter(|g| g.qreg))
}

fn classes_of(geo: impl Fn(usize) -> Option<Geometry>) -> Vec<usize> {
    let mut last: Vec<((usize, bool, bool, bool), usize)> = Vec::new();
    for dim in 1..=MAX_GPU_DIM {
        let Some(g) = geo(dim) else { continue };
        let c = g.class();
        match last.iter_mut().find(|e| e.0 == c) {
            Some(e) => e.1 = dim,
            None => last.push((c, dim)),
        }
    }
    let mut dims: Vec<usize> = last.iter().map(|e| e.1).collect();
    dims.sort_unstable();
    dims
}

/// Every (module, specialisation) production code can request for the given architectures:
/// each dtype and metric class (ip and cosine compile the same code; l2 differs), for the scan
/// module every dimension class and the profiling build (`KALOS_PROF=1`), for the others the
/// smallest and the largest dimension. `quick` keeps only the smallest and the largest
/// dimension class everywhere: both ends of every choice a [`Geometry`] makes (the query slice
/// in registers or in shared memory, by-value arguments or not) in about a third of the compile
/// time (the scan module's dimension classes take most of it).
pub fn all_variants(archs: &[String], quick: bool) -> Vec<(Module, KernelSpec)> {
    let ends = |mut d: Vec<usize>| {
        if quick && d.len() > 2 {
            d = vec![d[0], d[d.len() - 1]];
        }
        d
    };
    let mut v = Vec::new();
    for arch in archs {
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            for module in MODULES {
                let dims = if module.by_geometry { ends(dim_classes(dtype)) } else { vec![1, MAX_GPU_DIM] };
                for metric in [Metric::InnerProduct, Metric::L2] {
                    for &dim in &dims {
                        v.push((module, KernelSpec { arch: arch.clone(), dim, dtype, metric, prof: false, codes: Codes::None }));
                    }
                }
                if module.profiled {
                    let spec =
                        KernelSpec { arch: arch.clone(), dim: 768, dtype, metric: Metric::InnerProduct, prof: true, codes: Codes::None };
                    v.push((module, spec));
                }
            }
        }
        // The int8 scan: the scan module over codes (the store's dtype does not enter it).
        for metric in [Metric::InnerProduct, Metric::L2] {
            for dim in ends(code_dim_classes()) {
                v.push((SCAN, KernelSpec { arch: arch.clone(), dim, dtype: Dtype::F16, metric, prof: false, codes: Codes::Int8 }));
            }
            for dim in ends(nibble_dim_classes()) {
                v.push((SCAN, KernelSpec { arch: arch.clone(), dim, dtype: Dtype::F16, metric, prof: false, codes: Codes::Nibble }));
            }
        }
        v.push((
            SCAN,
            KernelSpec { arch: arch.clone(), dim: 768, dtype: Dtype::F16, metric: Metric::InnerProduct, prof: true, codes: Codes::Int8 },
        ));
    }
    v
}

/// True when an NVRTC library can be loaded (nothing else is touched).
pub fn nvrtc_present() -> bool {
    // SAFETY: is_culib_present only tries to load the library; a panic (none expected) is caught.
    std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

/// The loaded NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(Error::new(Status::BackendUnavailable, "NVRTC (libnvrtc.so) was not found on the library search path"));
    }
    let (mut major, mut minor) = (0, 0);
    // A missing symbol panics in cudarc: caught, and reported below.
    let r = std::panic::catch_unwind(move || {
        // SAFETY: the library is present (checked above); the two out-pointers are valid locals.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (r, major, minor)
    });
    match r {
        Ok((cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS, major, minor)) => Ok((major, minor)),
        Ok((r, _, _)) => Err(Error::new(Status::Cuda, format!("nvrtcVersion: {r:?}"))),
        Err(_) => Err(Error::new(Status::BackendUnavailable, "the NVRTC library lacks nvrtcVersion")),
    }
}

/// Checks that the loaded NVRTC is one the kernels support (13.0 or newer).
pub fn check_nvrtc() -> Result<(i32, i32)> {
    let v = nvrtc_version()?;
    if v < OLDEST_NVRTC {
        return Err(Error::new(
            Status::BackendUnavailable,
            format!(
                "NVRTC {}.{} is not supported: the CUDA engine needs NVRTC {}.{} or newer (CUDA 13; CUDA 12 is not supported)",
                v.0, v.1, OLDEST_NVRTC.0, OLDEST_NVRTC.1
            ),
        ));
    }
    Ok(v)
}

/// Path of the first mapped file of this process whose name contains `needle`
/// (e.g. "libnvrtc"), from /proc/self/maps: where a dynamically loaded library came from.
pub fn loaded_from(needle: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| std::path::Path::new(p).file_name().is_some_and(|f| f.to_string_lossy().contains(needle)))
        .map(String::from)
}

/// Compiles one kernel source with NVRTC to a CUBIN (the options name the architecture). On a
/// compile error the message holds the options and NVRTC's log.
pub fn compile_cubin(name: &str, src: &str, opts: &[String]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::sys as nv;
    if !nvrtc_present() {
        return Err(Error::new(Status::BackendUnavailable, "NVRTC (libnvrtc.so) was not found on the library search path"));
    }
    let csrc = CString::new(src).map_err(|_| Error::new(Status::Internal, "kernel source holds a NUL"))?;
    let cname = CString::new(format!("{name}.cu")).map_err(|_| Error::new(Status::Internal, "kernel name holds a NUL"))?;
    let copts = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<CString>, _>>()
        .map_err(|_| Error::new(Status::Internal, "an NVRTC option holds a NUL"))?;
    let popts: Vec<*const std::os::raw::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let hsrc: Vec<CString> = HEADERS
        .iter()
        .map(|h| CString::new(h.1))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::new(Status::Internal, "a kernel header holds a NUL"))?;
    let hname: Vec<CString> = HEADERS
        .iter()
        .map(|h| CString::new(h.0))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::new(Status::Internal, "a kernel header name holds a NUL"))?;
    let phsrc: Vec<*const std::os::raw::c_char> = hsrc.iter().map(|c| c.as_ptr()).collect();
    let phname: Vec<*const std::os::raw::c_char> = hname.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: NVRTC is loaded (checked above); every pointer passed is a live NUL-terminated
    // string or a buffer of the size NVRTC reported; the program is destroyed on every path.
    unsafe {
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        let r = nv::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), cname.as_ptr(), HEADERS.len() as i32, phsrc.as_ptr(), phname.as_ptr());
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::new(Status::Cuda, format!("nvrtcCreateProgram({name}): {r:?}")));
        }
        let r = nv::nvrtcCompileProgram(prog, popts.len() as i32, popts.as_ptr());
        let mut log_size = 0usize;
        nv::nvrtcGetProgramLogSize(prog, &mut log_size);
        let mut log = vec![0u8; log_size.max(1)];
        nv::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut _);
        let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim().to_string();
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            nv::nvrtcDestroyProgram(&mut prog);
            return Err(Error::new(
                Status::Cuda,
                format!("NVRTC failed to compile {name}.cu ({}): {r:?}\n{}", opts.join(" "), log_errors(&log)),
            ));
        }
        let mut size = 0usize;
        let r = nv::nvrtcGetCUBINSize(prog, &mut size);
        if r != nv::nvrtcResult::NVRTC_SUCCESS || size == 0 {
            nv::nvrtcDestroyProgram(&mut prog);
            return Err(Error::new(Status::Cuda, format!("nvrtcGetCUBINSize({name}): {r:?}")));
        }
        let mut cubin = vec![0u8; size];
        let r = nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _);
        nv::nvrtcDestroyProgram(&mut prog);
        if r != nv::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::new(Status::Cuda, format!("nvrtcGetCUBIN({name}): {r:?}")));
        }
        Ok(cubin)
    }
}

/// The lines of an NVRTC log that matter: each error with the source line and caret after it
/// (at most 40 lines), or the whole log when it names no error.
fn log_errors(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let mut keep = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.contains("error") {
            keep.extend(lines[i..(i + 3).min(lines.len())].iter().copied());
        }
    }
    if keep.is_empty() {
        return log.to_string();
    }
    keep.truncate(40);
    keep.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_known_dims() {
        let g = Geometry::of(128, Dtype::F32);
        assert_eq!((g.dp, g.nv, g.gs, g.nch, g.qreg, g.ru0, g.byval), (128, 32, 32, 1, true, 8, true));
        let g = Geometry::of(768, Dtype::F16);
        assert_eq!((g.dp, g.nv, g.gs, g.nch, g.qreg, g.ru0, g.byval), (768, 96, 32, 3, true, 4, true));
        let g = Geometry::of(3, Dtype::F32);
        assert_eq!((g.dp, g.gs, g.nch), (4, 1, 1));
        let g = Geometry::of(MAX_GPU_DIM, Dtype::F32);
        assert_eq!((g.gs, g.nch, g.qreg, g.ru0, g.byval), (32, 64, false, 1, false));
    }

    #[test]
    fn dim_classes_cover_every_class() {
        for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            let dims = dim_classes(dtype);
            let covered: std::collections::HashSet<_> = dims.iter().map(|&d| Geometry::of(d, dtype).class()).collect();
            let all: std::collections::HashSet<_> = (1..=MAX_GPU_DIM).map(|d| Geometry::of(d, dtype).class()).collect();
            assert_eq!(covered, all, "{dtype:?}");
            assert_eq!(dims.len(), covered.len(), "one dimension per class");
            assert_eq!(*dims.last().unwrap(), MAX_GPU_DIM);
        }
    }

    #[test]
    fn code_classes_cover_every_register_geometry() {
        let g = Geometry::of_codes(768);
        assert_eq!((g.vec, g.dp, g.nv, g.gs, g.nch, g.qreg, g.byval), (16, 768, 48, 32, 2, true, true));
        let g = Geometry::of_nibbles(768);
        assert_eq!((g.vec, g.dp, g.nv, g.gs, g.nch, g.qreg), (32, 768, 24, 32, 1, true));
        let v = all_variants(&["sm_90".to_string()], false);
        // (geometry, its dimension classes, the variants' codes, the largest dimension served)
        type Case = (fn(usize) -> Geometry, Vec<usize>, Codes, usize);
        let cases: [Case; 2] = [
            (Geometry::of_codes, code_dim_classes(), Codes::Int8, 1536),
            (Geometry::of_nibbles, nibble_dim_classes(), Codes::Nibble, 1024),
        ];
        for (geo, dims, codes, top) in cases {
            assert!(geo(top).qreg && !geo(top + 1).qreg, "{codes:?}");
            let covered: std::collections::HashSet<_> = dims.iter().map(|&d| geo(d).class()).collect();
            let all: std::collections::HashSet<_> = (1..=MAX_GPU_DIM).map(geo).filter(|g| g.qreg).map(|g| g.class()).collect();
            assert_eq!(covered, all, "{codes:?}");
            assert_eq!(*dims.last().unwrap(), top);
            for metric in [Metric::InnerProduct, Metric::L2] {
                assert!(v.iter().any(|(m, s)| *m == SCAN && s.codes == codes && s.metric == metric && s.dim == top), "{codes:?}");
            }
        }
    }

    #[test]
    fn quick_variants_keep_both_ends_of_every_geometry_choice() {
        let arch = ["sm_80".to_string()];
        let (full, quick) = (all_variants(&arch, false), all_variants(&arch, true));
        let scans = |v: &[(Module, KernelSpec)]| v.iter().filter(|(m, _)| *m == SCAN).count();
        assert!(scans(&quick) * 3 < scans(&full), "{} of {} scan variants", scans(&quick), scans(&full));
        assert!(quick.iter().all(|q| full.contains(q)));
        for m in MODULES {
            for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
                for metric in [Metric::InnerProduct, Metric::L2] {
                    let mine: Vec<&KernelSpec> = quick
                        .iter()
                        .filter(|(x, s)| *x == m && s.dtype == dtype && s.metric == metric && s.codes == Codes::None)
                        .map(|(_, s)| s)
                        .collect();
                    assert!(!mine.is_empty(), "{} {dtype:?} {metric:?}", m.name);
                    if m.by_geometry {
                        let geo: Vec<Geometry> = mine.iter().map(|s| Geometry::of(s.dim, dtype)).collect();
                        assert!(geo.iter().any(|g| g.qreg) && geo.iter().any(|g| !g.qreg), "{} {dtype:?}", m.name);
                        assert!(geo.iter().any(|g| g.byval) && geo.iter().any(|g| !g.byval), "{} {dtype:?}", m.name);
                    }
                }
            }
        }
        assert!(quick.iter().any(|(_, s)| s.prof) && quick.iter().any(|(_, s)| s.codes == Codes::Int8 && s.dim == 1536));
    }

    #[test]
    fn every_module_includes_the_common_header() {
        for m in MODULES {
            assert!(m.src.contains("#include \"common.cuh\""), "{}", m.name);
        }
        let v = all_variants(&["sm_90".to_string()], false);
        for m in MODULES {
            assert!(v.iter().any(|(x, _)| *x == m), "{} is never compiled", m.name);
        }
    }

    #[test]
    fn options_define_every_shared_constant_once() {
        let s = KernelSpec { arch: "sm_90".into(), dim: 768, dtype: Dtype::F16, metric: Metric::Cosine, prof: false, codes: Codes::None };
        let o = s.options();
        assert!(o.contains(&"--gpu-architecture=sm_90".to_string()));
        assert!(o.contains(&"-DMETRIC=0".to_string()), "cosine compiles as ip");
        assert!(o.contains(&"-DBYVAL=1".to_string()));
        let names: Vec<&str> = o.iter().filter_map(|x| x.strip_prefix("-D")).map(|x| x.split('=').next().unwrap()).collect();
        let mut uniq = names.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(names.len(), uniq.len(), "a define given twice: {names:?}");
        // Every define the kernels require (their #error guard) is given.
        let guard = HEADERS[0].1.lines().find(|l| l.starts_with("#if !defined(")).expect("the kernel's define guard");
        for part in guard.split("defined(").skip(1) {
            let name = part.split(')').next().unwrap();
            assert!(names.contains(&name), "the kernel needs -D{name}");
        }
    }
}
