//! Exact CPU engine: SIMD scan + bounded top-k, multithreaded for large tables, blocked
//! (GEMM-style) kernel for batches of queries.
//!
//! # Shape of a search
//! The table is walked in blocks of rows. For each block:
//! 1. Row selection. With no namespace filter and no expiring rows the block is a dense range.
//!    Otherwise only the `namespaces` (and, when some row can expire, `expires_ms`) columns are
//!    read, and the matching row numbers are gathered; rows that do not match are never touched
//!    by the dot-product kernel, so a selective filter reads a small fraction of the vectors.
//! 2. Scores. One query: a per-row kernel (4 independent FMA accumulators, masked tail) that
//!    streams each row once; L2 is computed directly as `Σ(q−x)²`, which is as fast as the dot
//!    product for a memory-bound scan and has no cancellation error. Several queries: a
//!    register-blocked tile kernel computes a `Q×R` block of dot products (4 queries × 4 rows
//!    with AVX-512: 16 accumulators, each loaded value used 4 times) while the row block sits in
//!    L2, so the table is read from memory once per batch rather than once per query; L2 then
//!    uses `|q|² − 2q·x + |x|²` with the stored `|x|²`.
//! 3. Selection. Each score is compared with the query's current k-th best key and only
//!    candidates that can enter are pushed into the bounded heap ([`TopK`]). With recency
//!    weighting the upper bound `(1−w)·s + w` (the boost is at most 1) is tested first, so the
//!    `exp2` is only paid by rows that can still make the top-k.
//!
//! # Why `std::arch` and not a SIMD crate
//! simsimd / numkong give excellent single pair kernels (dot, l2 of two vectors), but what this
//! engine needs is different: a row-block tile kernel for batches (several queries × several rows
//! per pass, register blocked), fused with row gathering for filters and a threshold test per
//! score. Those would have to be written around the crate anyway, and both crates are C (or C++)
//! compiled by a build script, which adds a C toolchain dependency and a second FFI boundary to a
//! `cdylib` that must stay `panic = "unwind"`-clean. The kernels here are ~300 lines, the
//! AVX-512 intrinsics are stable in Rust (1.89+), and dispatch is one `is_x86_feature_detected!`
//! at construction. On aarch64 (and x86 without AVX2) the scalar kernel is written with 8
//! independent accumulators so LLVM vectorises it with the baseline SIMD (NEON / SSE2);
//! hand-written NEON was left out because it could not be compiled or tested on this machine.
//!
//! # Threads
//! A split scan runs on a persistent worker pool ([`super::pool::Pool`], `threads − 1`
//! workers; the server thread is one more). Rows are cut in chunks; each participant first
//! claims the chunk of its own index (so that, when the scheduler keeps threads on their
//! cores, a core re-reads the same slice request after request), then any chunk nobody has
//! claimed, so a worker that is asleep or descheduled on a busy machine never holds
//! the scan up: the others take its share. Each participant keeps its own top-k per query and
//! the server thread merges them (the merged result is the same whatever the split: selection
//! is a total order on (key, id)).
//!
//! When a split pays depends on whether the workers are awake:
//! - Hosts with at least `SPIN_MIN_CORES` cores: the workers busy-poll for the server's spin
//!   window (`server_spin_ns`) after each job, as the server thread does, then sleep, so an idle
//!   server still uses no CPU. Fan-out to awake workers costs 0.5 µs (3 or 7 workers) to 2 µs
//!   (14), so scans from 256 KiB of vectors up are split (a chunk of at least 64 KiB per
//!   participant). On the H200 host (16 cores): 10k×128 in 233 µs on one thread, 22.5 µs on
//!   15.
//! - Smaller hosts: the workers sleep right after each job, so a split pays a futex wake. The
//!   server's engine measures that wake (`Pool::wake_latency`) and its own single-query kernel's
//!   speed when it starts, and splits scans that take one thread at least three wakes
//!   (`calibrated_min_bytes`, bounded to 256 KiB..64 MiB; 8 MiB when the workers cannot be
//!   timed). Where a wake costs ~45 µs (a Zen 4 VM) that is several MiB; where it costs ~4 µs
//!   (a Xeon VM) ~300 KiB, and a 10k×128 table scans in ~95 µs on two threads against ~180 on
//!   one. A client waiting for a split scan on such a host spins yielding its core (see
//!   `client::slot`), so the worker runs there; a client that slept instead would pay the
//!   wake-up of an idle vCPU (~100 µs on the Xeon VM) on top of the scan. Left to itself the
//!   scheduler often wakes the worker on the server thread's own CPU instead, so an engine with
//!   a thread for every CPU pins the server thread and each worker apart when its pool starts
//!   ([`Pool::pin_apart`]; `KALOS_CPU_PIN=0` turns it off).
//!
//! `KALOS_CPU_PARALLEL_MIN_BYTES` and `KALOS_CPU_SPIN_NS` override both choices (`crate::config`).
//!
//! All scratch (heaps, score buffers, row lists) lives in the engine and is reused; a search
//! allocates nothing except the caller-facing result vectors on first use.

use super::pool::Pool;
use super::quant::{self, QuantStats, QueryCode};
use super::{recency_boost, Engine, EngineKind, TopK};
use crate::error::Result;
use crate::filter::Bitmap;
use crate::store::Store;
use crate::types::{Filter, Hit, Metric, Recency, Scan};
use crate::wire::SearchRequest;

mod kernels;
mod qkernels;

pub use kernels::Isa;
use kernels::{gemm, scores, Rows};
pub use qkernels::QIsa;

/// Tests only: while this is set, CPU engines take slot queries
/// (`Engine::takes_slot_queries`; they copy and check them, as any engine that gets them must),
/// so that the server's slot-query path runs where there is no GPU.
#[doc(hidden)]
pub static TEST_SLOT_QUERIES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tests only: while this is set, CPU engines report themselves as a device engine
/// (`EngineKind::Cuda`), so that the server's fallback rules (an engine error other than the
/// request's own makes it fall back to a fresh CPU engine and count it in stats) run where there
/// is no GPU.
#[doc(hidden)]
pub static TEST_AS_DEVICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

// ---------------------------------------------------------------------------------------------
// Engine
// ---------------------------------------------------------------------------------------------

/// Rows per block for single queries (only amortises per-block work; nothing is reused).
const BLOCK_ROWS_SINGLE: usize = 1024;
/// Bytes of row data per block for batches: the block is re-read by every query tile, so it
/// must stay in L2 (1 MiB per core on the reference machine; half of it leaves room for queries).
const BLOCK_BYTES_BATCH: usize = 256 * 1024;
/// Queries scored per pass over a block in batched mode (bounds the score scratch).
const QUERY_CHUNK: usize = 64;
/// A metadata filter that lets through at most one row in this many is answered by gathering the
/// matching rows and scoring only them (no pass over the table's blocks).
const SPARSE_DIV: usize = 1000;
/// Size of the table above which a scan is split across threads when the pool's workers sleep
/// between jobs (private: cbindgen exports every `pub const` of the crate into include/kalos.h).
const DEFAULT_PARALLEL_MIN_BYTES: usize = 8 << 20;
/// The same when the workers stay awake for the server's spin window (hosts of at least
/// [`SPIN_MIN_CORES`] cores).
const SPIN_PARALLEL_MIN_BYTES: usize = 256 << 10;
/// Bounds of the split threshold calibrated on hosts whose workers sleep between jobs.
const CALIBRATED_MIN_BYTES: (usize, usize) = (256 << 10, 64 << 20);
/// Least bytes of vectors per participant of a split scan.
const MIN_BYTES_PER_THREAD: usize = 64 << 10;
/// Hosts with at least this many cores keep the pool's workers awake between requests (within
/// the server's spin window); smaller ones would starve the clients and the server thread.
pub(crate) const SPIN_MIN_CORES: usize = 8;
/// Participants whose first claim is "their own" chunk (a bit each in one word).
const OWN_CHUNKS: usize = 64;

/// Per-thread scratch. Aligned (and its `tops` padded) so that no two workers write to one
/// cache line: the headers hold lengths that change as a scan pushes candidates.
#[derive(Default)]
#[repr(align(128))]
struct Worker {
    tops: Vec<TopK>,
    scores: Vec<f32>,
    idx: Vec<u32>,
    /// Integer dot products of the int8 scan (one block of rows).
    dots: Vec<i32>,
}

impl Worker {
    fn prepare(&mut self, nq: usize, k: usize, score_len: usize) {
        if self.tops.capacity() < nq + 4 {
            // 4 spare TopK headers (32 bytes each) after the used ones: see the struct's doc.
            self.tops.reserve_exact(nq + 4 - self.tops.len());
        }
        while self.tops.len() < nq {
            self.tops.push(TopK::new(k));
        }
        for t in &mut self.tops[..nq] {
            t.reset(k);
        }
        if self.scores.len() < score_len {
            self.scores.resize(score_len, 0.0);
        }
        if self.dots.len() < score_len {
            self.dots.resize(score_len, 0);
        }
    }
}

/// Everything a worker reads (shared, read-only).
struct Ctx<'a> {
    /// Instruction set of the batched tile kernel.
    isa: Isa,
    /// Instruction set of the single-query streaming kernel (see [`CpuEngine::with_isa`]).
    scan_isa: Isa,
    metric: Metric,
    dim: usize,
    nq: usize,
    queries: &'a [f32],
    qnorms: &'a [f32],
    vectors: &'a [f32],
    norms: &'a [f32],
    ids: &'a [u64],
    namespaces: &'a [u64],
    created: &'a [u64],
    expires: &'a [u64],
    filter: &'a Filter,
    /// With a metadata filter: the rows the recall may return (namespaces, expression and
    /// expiry already applied).
    allowed: Option<&'a Bitmap>,
    check_expiry: bool,
    now_ms: u64,
    recency: Option<Recency>,
    block_rows: usize,
    /// The int8 scan: scores are approximate, from the quantized copy.
    quant: Option<QCtx<'a>>,
}

/// What the int8 scan reads besides [`Ctx`].
struct QCtx<'a> {
    isa: QIsa,
    stride: usize,
    codes: &'a [i8],
    scales: &'a [f32],
    /// One per query.
    queries: &'a [QueryCode],
}

/// The quantized copy of the table for the int8 scan, kept in step with the store by `sync`
/// (row r of the copy is row r of the store).
#[derive(Default)]
struct QuantTable {
    /// `len × stride` codes, each row zero-padded ([`quant::code_stride`]).
    codes: Vec<i8>,
    /// Per-row scale (`x ≈ scale·codes`).
    scales: Vec<f32>,
    stats: QuantStats,
}

impl QuantTable {
    /// Re-quantizes the rows in `dirty` (those below `store.len()`) and any row past the copy's
    /// old length; shrinks with the store. An empty copy is rebuilt whole (engine start, load).
    fn sync(&mut self, store: &Store, dirty: &[u32]) {
        let (dim, len) = (store.dim(), store.len());
        let stride = quant::code_stride(dim);
        let old = self.scales.len();
        if old == 0 || len == 0 {
            self.stats = QuantStats::default();
        }
        self.codes.resize(len * stride, 0);
        self.scales.resize(len, 0.0);
        let v = store.vectors();
        let put = |r: usize, t: &mut QuantTable| {
            let (s, l1) = quant::quantize_row(&v[r * dim..(r + 1) * dim], &mut t.codes[r * stride..(r + 1) * stride]);
            t.scales[r] = s;
            t.stats.add(s, l1);
        };
        for &r in dirty.iter().filter(|&&r| (r as usize) < len.min(old)) {
            put(r as usize, self);
        }
        for r in old.min(len)..len {
            put(r, self);
        }
    }
}

pub struct CpuEngine {
    threads: usize,
    isa: Isa,
    scan_isa: Isa,
    par_min_bytes: usize,
    /// How long the pool's workers stay awake after a job (0: they sleep at once).
    spin: std::time::Duration,
    /// Pin the server thread and each worker to CPUs of their own when the pool starts
    /// ([`Pool::pin_apart`]): server engines whose workers sleep between jobs, unless
    /// `KALOS_CPU_PIN=0`.
    pin: bool,
    /// Started on the first split scan (`threads − 1` workers).
    pool: Option<Pool>,
    workers: Vec<Worker>,
    qnorms: Vec<f32>,
    scan: Scan,
    /// Option `rerank` (0 = adapt to k).
    rerank: u32,
    qisa: QIsa,
    quant: QuantTable,
    qcodes: Vec<QueryCode>,
    /// Re-ranking scratch: candidates, and the shared step's buffers and exact selection.
    cands: Vec<(u32, u64)>,
    rr: quant::RerankScratch,
    /// Queries answered by the int8 scan, and those of them whose answer was uncertain.
    reranked: u64,
    uncertain: u64,
}

/// `&mut [Worker]` shared with the pool's participants, each of which touches only the entry
/// of its own index.
struct WorkerSlots(*mut Worker, usize);
// SAFETY: entries are handed out by participant index, which `Pool::run` keeps distinct within
// a job, and the slice outlives the job (run returns only after every participant has left).
unsafe impl Sync for WorkerSlots {}
impl WorkerSlots {
    /// # Safety
    /// At most one live reference per index at a time (one per participant of a job).
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, i: usize) -> &mut Worker {
        assert!(i < self.1, "participant index {i} beyond {} workers", self.1);
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { &mut *self.0.add(i) }
    }
}

impl CpuEngine {
    /// `threads` = 0 picks the number of available cores. Uses the best instruction set of this CPU.
    pub fn new(threads: usize) -> CpuEngine {
        CpuEngine::with_isa(threads, Isa::detect())
    }

    /// The engine a server runs: `threads` as in [`CpuEngine::new`]; on hosts of at least
    /// `SPIN_MIN_CORES` cores the workers stay awake for `spin_ns` after each scan (the
    /// server's own spin window), which lets tables from 256 KiB up be split across cores.
    pub fn for_server(threads: usize, spin_ns: u64) -> CpuEngine {
        let tune = crate::config::tuning_or_default();
        let mut e = CpuEngine::new(threads);
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let spin_ns = tune.cpu_spin_ns.unwrap_or(if cores >= SPIN_MIN_CORES { spin_ns } else { 0 });
        e.spin = std::time::Duration::from_nanos(spin_ns);
        let env_threads = tune.cpu_threads;
        if let Some(t) = env_threads {
            e.threads = t;
        }
        if let Some(isa) = tune.cpu_scan_isa.as_deref() {
            let want = match isa {
                "avx512" => Isa::Avx512,
                "avx2" => Isa::Avx2,
                _ => Isa::Scalar,
            };
            if Isa::available().contains(&want) {
                e.scan_isa = want;
                e.qisa = QIsa::for_isa(want);
            }
        }
        if spin_ns == 0 && e.threads > 1 && tune.cpu_parallel_min_bytes.is_none() {
            if let Some(b) = calibrated_split(e.threads, e.scan_isa) {
                e.par_min_bytes = b;
            }
        }
        if spin_ns > 0 {
            if threads == 0 && env_threads.is_none() {
                // Leave a core to the clients: awake workers on every core would compete with
                // a spinning client for the last one.
                e.threads = cores.saturating_sub(1).max(1);
            }
            if tune.cpu_parallel_min_bytes.is_none() {
                e.par_min_bytes = SPIN_PARALLEL_MIN_BYTES;
            }
        }
        // Only an engine with a thread for every core: shards' engines share the cores.
        e.pin = spin_ns == 0 && tune.cpu_pin && e.threads >= cores;
        e
    }

    /// Forces an instruction set (tests and benchmarks). Falls back to scalar if `isa` is not
    /// supported by this CPU, so it is always safe.
    pub fn with_isa(threads: usize, isa: Isa) -> CpuEngine {
        let threads = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        let avail = Isa::available();
        let isa = if avail.contains(&isa) { isa } else { Isa::Scalar };
        // Single-query scans use AVX2 where 512-bit operations run as two halves
        // (`kernels::halves_512_bit_ops`); AVX-512 always keeps the batched tile kernel, where
        // its 32 registers allow the 4×4 tile.
        let scan_isa = if isa == Isa::Avx512 && avail.contains(&Isa::Avx2) && kernels::halves_512_bit_ops() { Isa::Avx2 } else { isa };
        let par_min_bytes = crate::config::tuning_or_default().cpu_parallel_min_bytes.unwrap_or(DEFAULT_PARALLEL_MIN_BYTES);
        CpuEngine {
            threads,
            isa,
            scan_isa,
            par_min_bytes,
            spin: std::time::Duration::ZERO,
            pin: false,
            pool: None,
            workers: Vec::new(),
            qnorms: Vec::new(),
            scan: Scan::Exact,
            rerank: 0,
            qisa: QIsa::for_isa(isa),
            quant: QuantTable::default(),
            qcodes: Vec::new(),
            cands: Vec::new(),
            rr: quant::RerankScratch::default(),
            reranked: 0,
            uncertain: 0,
        }
    }

    /// Chooses the scan (option `scan`) and the int8 scan's re-rank count (option `rerank`,
    /// 0 = adapt to k). Takes effect at the next `sync`, which builds the quantized copy.
    pub fn set_scan(&mut self, scan: Scan, rerank: u32) {
        self.scan = scan;
        self.rerank = rerank;
        if scan == Scan::Exact {
            self.quant = QuantTable::default();
        }
    }

    /// The integer kernels' instruction set (tests force one with [`CpuEngine::with_isa`]).
    pub fn qisa(&self) -> QIsa {
        self.qisa
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }
    /// Threads of a split scan whose workers stay awake between requests (1 when they sleep,
    /// or there is only one thread): what a cost model may count on for the next request.
    pub fn awake_participants(&self) -> usize {
        if self.spin.is_zero() {
            1
        } else {
            self.threads
        }
    }
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The split threshold in force ([`CpuEngine::set_parallel_min_bytes`]).
    pub fn parallel_min_bytes(&self) -> usize {
        self.par_min_bytes
    }

    /// Tables with fewer bytes of vectors than this are scanned by the calling thread alone
    /// (0 = always split when `threads` > 1). Also settable with `KALOS_CPU_PARALLEL_MIN_BYTES`.
    pub fn set_parallel_min_bytes(&mut self, bytes: usize) {
        self.par_min_bytes = bytes;
    }

    /// The int8 scan's second step: the candidates in `workers[0].tops` (the best `kscan` rows
    /// of each query by approximate key) are re-scored exactly with the kernels and arithmetic
    /// of the exact scan (so an answer equals the exact scan's whenever the true top-k is among
    /// the candidates), and the best `req.k` go to `out`. Counts uncertain answers
    /// ([`quant::rerank`]).
    fn rerank_into(&mut self, store: &Store, req: &SearchRequest<'_>, kscan: usize, out: &mut [Vec<Hit>]) {
        for (qi, o) in out.iter_mut().enumerate().take(req.nq) {
            let top = &mut self.workers[0].tops[qi];
            let full = top.len() == kscan;
            let floor = top.threshold();
            self.cands.clear();
            self.cands.extend(top.sorted().into_iter().map(|(_, id)| (store.row_of(id).expect("candidate id in the store") as u32, id)));
            self.rerank_one(store, req, qi, full, floor, None, o);
        }
    }

    /// Quantizes a single query for the int8 scan (kept for [`CpuEngine::rerank_candidates`]).
    pub(crate) fn query_code(&mut self, q: &[f32]) -> &QueryCode {
        if self.qcodes.is_empty() {
            self.qcodes.push(QueryCode::default());
        }
        self.qcodes[0].set(q);
        &self.qcodes[0]
    }

    /// The re-ranking step for candidates another engine found (the GPU's int8 scan) for the
    /// single query `q` of `req`, quantized last by [`CpuEngine::query_code`]: `cands` are
    /// the best rows by approximate score (`full`: some matching row was left out, and every
    /// row left out had at most the approximate key `floor`). `first`: the candidates came
    /// through a 4-bit first pass that left matching rows out, none of which had a 4-bit key
    /// above this. The best `req.k` go to `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rerank_candidates(
        &mut self,
        store: &Store,
        req: &SearchRequest<'_>,
        cands: &[Hit],
        full: bool,
        floor: f32,
        first: Option<f32>,
        out: &mut Vec<Hit>,
    ) {
        self.cands.clear();
        self.cands.extend(cands.iter().filter_map(|h| store.row_of(h.id).map(|r| (r as u32, h.id))));
        self.rerank_one(store, req, 0, full, floor, first, out);
    }

    /// Re-ranks `self.cands`, query `qi`'s candidates (row, id), into `o`.
    #[allow(clippy::too_many_arguments)]
    fn rerank_one(
        &mut self,
        store: &Store,
        req: &SearchRequest<'_>,
        qi: usize,
        full: bool,
        floor: f32,
        first: Option<f32>,
        o: &mut Vec<Hit>,
    ) {
        let (dim, metric, nq) = (store.dim(), store.metric(), req.nq);
        let l2 = metric == Metric::L2;
        let (vectors, norms, created) = (store.vectors(), store.norms(), store.created_ms());
        let (isa, scan_isa) = (self.isa, self.scan_isa);
        let q = &req.queries[qi * dim..(qi + 1) * dim];
        let bound = quant::key_bound(metric, req.recency, self.qcodes[qi].bound(dim, &self.quant.stats));
        let qnorm = if l2 && nq > 1 { self.qnorms[qi] } else { 0.0 };
        let exact_key = |rows: &[u32], keys: &mut [f32]| {
            // The exact scan's arithmetic: a lone query streams rows (L2 as Σ(q−x)²), a batch
            // uses the tile kernel (L2 as |q|² − 2q·x + |x|²).
            if nq == 1 {
                scores(scan_isa, l2, q, vectors, dim, Rows::Idx(rows), keys);
                if l2 {
                    keys.iter_mut().for_each(|s| *s = -*s);
                }
            } else {
                gemm(isa, q, 1, vectors, dim, Rows::Idx(rows), keys);
                if l2 {
                    for (s, &r) in keys.iter_mut().zip(rows) {
                        *s = -(qnorm - 2.0 * *s + norms[r as usize]).max(0.0);
                    }
                }
            }
            if let Some(rc) = req.recency {
                for (s, &r) in keys.iter_mut().zip(rows) {
                    *s = (1.0 - rc.weight) * *s + rc.weight * recency_boost(req.now_ms, created[r as usize], rc.half_life_ms);
                }
            }
        };
        let first = first.map(|f| (f, quant::key_bound(metric, req.recency, self.qcodes[qi].bound4(dim, &self.quant.stats))));
        let uncertain = quant::rerank(&self.cands, req.k, quant::Cut { full, floor, bound, first }, &mut self.rr, exact_key);
        self.rr.top.drain_hits_into(metric, o);
        self.reranked += 1;
        self.uncertain += uncertain as u64;
    }

    /// Number of workers for a scan of `rows` rows of `dim` values by `nq` queries.
    fn plan_threads(&self, rows: usize, dim: usize, nq: usize, block_rows: usize) -> usize {
        if self.threads <= 1 {
            return 1;
        }
        // Batches do nq× the arithmetic on the same bytes; count a little of that as size.
        let work = rows.saturating_mul(dim).saturating_mul(4).saturating_mul(nq.min(8));
        if work < self.par_min_bytes {
            return 1;
        }
        let by_bytes = work / MIN_BYTES_PER_THREAD;
        let by_rows = if nq == 1 { rows / 16 } else { rows.div_ceil(block_rows.max(16)) };
        self.threads.min(by_bytes).min(by_rows).max(1)
    }

    /// [`Engine::search`] with the rows a metadata filter allows already known (`None`: the
    /// request has no filter): the CUDA engine evaluates a filter on the GPU and passes a very
    /// selective one's rows here, to be scored on the CPU.
    pub fn search_allowed(
        &mut self,
        store: &Store,
        req: &SearchRequest<'_>,
        allowed: Option<Bitmap>,
        out: &mut Vec<Vec<Hit>>,
    ) -> Result<()> {
        let mut host = Vec::new();
        let req = &super::with_host_queries(req, &mut host)?;
        let dim = store.dim();
        let nq = req.nq;
        let metric = store.metric();
        let len = store.len();
        super::reset_out(out, nq);
        if nq == 0 || req.k == 0 || len == 0 || dim == 0 {
            return Ok(());
        }
        assert!(req.queries.len() >= nq * dim, "query buffer shorter than nq * dim");
        let k = req.k;
        let int8 = self.scan == Scan::Int8;
        // The int8 scan keeps the best `kscan` rows by approximate key for re-ranking.
        let kscan = if int8 { quant::rerank_count(self.rerank, k) } else { k };
        if int8 {
            assert_eq!(self.quant.scales.len(), len, "the quantized copy is out of step with the store (sync missed)");
            while self.qcodes.len() < nq {
                self.qcodes.push(QueryCode::default());
            }
            for (qc, q) in self.qcodes.iter_mut().zip(req.queries[..nq * dim].chunks_exact(dim)) {
                qc.set(q);
            }
        }

        self.qnorms.clear();
        if metric == Metric::L2 && (nq > 1 || int8) {
            self.qnorms.extend(req.queries[..nq * dim].chunks_exact(dim).map(|q| q.iter().map(|x| x * x).sum::<f32>()));
        }
        let block_rows = if nq == 1 { BLOCK_ROWS_SINGLE } else { (BLOCK_BYTES_BATCH / (dim * 4)).clamp(16, 1024) & !3 };
        let score_len = block_rows * nq.min(QUERY_CHUNK);
        let matching = allowed.as_ref().map(|b| b.count());
        if matching == Some(0) {
            return Ok(());
        }
        // A very selective filter: only the matching rows are gathered and scored.
        let sparse = matching.is_some_and(|m| m.saturating_mul(SPARSE_DIV) <= len);
        // Bytes a row costs the scan: 4 per value, 1 in the int8 scan.
        let t = if sparse { 1 } else { self.plan_threads(len, if int8 { dim.div_ceil(4) } else { dim }, nq, block_rows) };
        while self.workers.len() < t {
            self.workers.push(Worker::default());
        }
        for w in &mut self.workers[..t] {
            w.prepare(nq, kscan, score_len);
        }

        let ctx = Ctx {
            isa: self.isa,
            scan_isa: self.scan_isa,
            metric,
            dim,
            nq,
            queries: req.queries,
            qnorms: &self.qnorms,
            vectors: store.vectors(),
            norms: store.norms(),
            ids: store.ids(),
            namespaces: store.namespaces(),
            created: store.created_ms(),
            expires: store.expires_ms(),
            filter: req.filter,
            allowed: allowed.as_ref(),
            check_expiry: store.has_expiring(),
            now_ms: req.now_ms,
            recency: req.recency,
            block_rows,
            quant: int8.then(|| QCtx {
                isa: self.qisa,
                stride: quant::code_stride(dim),
                codes: &self.quant.codes,
                scales: &self.quant.scales,
                queries: &self.qcodes[..nq],
            }),
        };

        if sparse {
            let list = allowed.as_ref().map(|b| b.rows()).unwrap_or_default();
            let w = &mut self.workers[0];
            for part in list.chunks(block_rows) {
                score_rows(&ctx, &mut w.tops, &mut w.scores, &mut w.dots, Rows::Idx(part));
            }
        } else if t == 1 {
            scan(&ctx, &mut self.workers[0], 0, len);
        } else {
            // Chunks: one per participant for tables of at most 1 MiB a participant, ~1 MiB
            // ones for larger tables (dynamic balance). A
            // participant claims the chunk of its own index first (a bit of `own`), then any
            // unclaimed one of those, then the rest from `next`.
            let per = len.div_ceil(t);
            let mib = ((1usize << 20) / (dim * 4)).max(1).div_ceil(block_rows) * block_rows;
            let chunk = if len * dim * 4 <= (t << 20) { per } else { mib.min(per) }.max(1);
            let nchunks = len.div_ceil(chunk);
            let nown = nchunks.min(OWN_CHUNKS);
            let own = std::sync::atomic::AtomicU64::new(0);
            let next = std::sync::atomic::AtomicUsize::new(nown);
            let slots = WorkerSlots(self.workers.as_mut_ptr(), t);
            let ctx = &ctx;
            let work = |idx: usize| {
                if idx >= t {
                    return; // a pool larger than this scan's plan
                }
                // SAFETY: `idx` is this participant's own index (distinct within the job).
                let w = unsafe { slots.get(idx) };
                let mut run = |c: usize| scan(ctx, w, c * chunk, ((c + 1) * chunk).min(len));
                let claim = |c: usize| own.fetch_or(1 << c, std::sync::atomic::Ordering::Relaxed) & (1 << c) == 0;
                if idx < nown && claim(idx) {
                    run(idx);
                }
                for c in 0..nown {
                    if own.load(std::sync::atomic::Ordering::Relaxed) & (1 << c) == 0 && claim(c) {
                        run(c);
                    }
                }
                loop {
                    let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if c >= nchunks {
                        break;
                    }
                    run(c);
                }
            };
            let (spin, workers) = (self.spin, self.threads - 1);
            let pin = self.pin;
            let pool = self.pool.get_or_insert_with(|| {
                let p = Pool::new(workers, spin);
                if pin {
                    p.pin_apart();
                }
                p
            });
            pool.run(&work);
            let (first, rest) = self.workers[..t].split_first_mut().unwrap();
            for w in rest.iter() {
                for qi in 0..nq {
                    first.tops[qi].merge(&w.tops[qi]);
                }
            }
        }
        if int8 {
            self.rerank_into(store, req, kscan, out);
        } else {
            for (qi, o) in out.iter_mut().enumerate() {
                self.workers[0].tops[qi].drain_hits_into(metric, o);
            }
        }
        // A lone query's response body goes straight into the client's slot when offered.
        if let (1, Some(d)) = (nq, req.direct) {
            d.write_hits(&out[0]);
        }
        Ok(())
    }
}

/// Split thresholds calibrated in this process, by (threads, scan kernel): the wake-up and the
/// kernel's speed belong to the machine, so a later server engine (another store, the CPU engine
/// that takes over from a failed GPU one) reuses them instead of timing them again.
static CALIBRATED: std::sync::Mutex<Vec<((usize, Isa), usize)>> = std::sync::Mutex::new(Vec::new());

/// [`calibrated_min_bytes`] for `threads` participants, measured once per process (a failed
/// measurement is not kept: the next engine tries again). The calibration's pool is dropped: a
/// server whose table never needs a split never keeps a sleeping worker (the pool starts with
/// the first split scan).
fn calibrated_split(threads: usize, isa: Isa) -> Option<usize> {
    let mut done = CALIBRATED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, b)) = done.iter().find(|(key, _)| *key == (threads, isa)) {
        return Some(b);
    }
    let b = calibrated_min_bytes(&mut Pool::new(threads - 1, std::time::Duration::ZERO), isa)?;
    done.push(((threads, isa), b));
    Some(b)
}

/// The split threshold of a pool whose workers sleep between jobs, from this machine's own
/// costs: a split scan pays a fan-out (a futex wake, `Pool::wake_latency`) to halve the work,
/// so it is chosen for scans that take one thread at least three fan-outs at the single-query
/// kernel's measured speed. `None` when the workers could not be timed.
fn calibrated_min_bytes(pool: &mut Pool, isa: Isa) -> Option<usize> {
    let wake = pool.wake_latency(15)?;
    // 4 MiB of rows: past a core's L2 on the machines measured, like the tables worth splitting.
    const DIM: usize = 128;
    let rows = (4 << 20) / (DIM * 4);
    let table: Vec<f32> = (0..rows * DIM).map(|i| (i % 7) as f32 * 0.25).collect();
    let q = vec![0.5f32; DIM];
    let mut out = vec![0f32; rows];
    let mut best = std::time::Duration::MAX;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        kernels::scores(isa, false, &q, &table, DIM, Rows::Range(0, rows), &mut out);
        std::hint::black_box(&out);
        best = best.min(t0.elapsed());
    }
    let bytes_per_s = (rows * DIM * 4) as f64 / best.as_secs_f64().max(1e-9);
    let b = 3.0 * wake.as_secs_f64() * bytes_per_s;
    Some((b as usize).clamp(CALIBRATED_MIN_BYTES.0, CALIBRATED_MIN_BYTES.1))
}

/// Walks rows `r0..r1` and feeds every candidate into `tops[..nq]`.
fn scan(c: &Ctx<'_>, w: &mut Worker, r0: usize, r1: usize) {
    let Worker { tops, scores: sbuf, idx, dots } = w;
    let all_ns = c.filter.namespaces.is_none();
    let mut b0 = r0;
    while b0 < r1 {
        let n = c.block_rows.min(r1 - b0);
        let rows = if c.allowed.is_none() && all_ns && !c.check_expiry {
            Rows::Range(b0, n)
        } else {
            idx.clear();
            match c.allowed {
                // A metadata filter: its bitmap already holds the namespace and expiry conditions.
                Some(bm) => idx.extend((b0..b0 + n).filter(|&r| bm.get(r)).map(|r| r as u32)),
                None => {
                    // Read only the namespace / expiry columns; gather the rows that qualify.
                    let ns = &c.namespaces[b0..b0 + n];
                    let ex = &c.expires[b0..b0 + n];
                    for j in 0..n {
                        if (all_ns || c.filter.matches(ns[j])) && (!c.check_expiry || ex[j] > c.now_ms) {
                            idx.push((b0 + j) as u32);
                        }
                    }
                }
            }
            if idx.is_empty() {
                b0 += n;
                continue;
            }
            if idx.len() == n {
                Rows::Range(b0, n)
            } else {
                Rows::Idx(idx)
            }
        };
        score_rows(c, tops, sbuf, dots, rows);
        b0 += n;
    }
}

/// Scores `rows` for every query and feeds the candidates into `tops[..nq]`.
fn score_rows(c: &Ctx<'_>, tops: &mut [TopK], sbuf: &mut [f32], dbuf: &mut [i32], rows: Rows<'_>) {
    let dim = c.dim;
    let l2 = c.metric == Metric::L2;
    let m = rows.len();
    if let Some(qc) = &c.quant {
        // Approximate dot products from the 8-bit copy; L2 keys from |q|² − 2q·x + |x|².
        let (s, d) = (&mut sbuf[..m], &mut dbuf[..m]);
        for (a, q) in qc.queries.iter().enumerate() {
            qkernels::dots(qc.isa, &q.codes, qc.codes, qc.stride, rows, d);
            for (j, (o, &dot)) in s.iter_mut().zip(d.iter()).enumerate() {
                *o = dot as f32 * (q.scale * qc.scales[rows.get(j)]);
            }
            let qnorm = if l2 { Some(c.qnorms[a]) } else { None };
            select(c, &mut tops[a], rows, s, qnorm);
        }
        return;
    }
    if c.nq == 1 {
        let s = &mut sbuf[..m];
        scores(c.scan_isa, l2, &c.queries[..dim], c.vectors, dim, rows, s);
        select(c, &mut tops[0], rows, s, None);
    } else {
        let mut a0 = 0;
        while a0 < c.nq {
            let qn = QUERY_CHUNK.min(c.nq - a0);
            let s = &mut sbuf[..qn * m];
            gemm(c.isa, &c.queries[a0 * dim..(a0 + qn) * dim], qn, c.vectors, dim, rows, s);
            for a in 0..qn {
                let qnorm = if l2 { Some(c.qnorms[a0 + a]) } else { None };
                select(c, &mut tops[a0 + a], rows, &s[a * m..(a + 1) * m], qnorm);
            }
            a0 += qn;
        }
    }
}

/// Turns raw scores into keys (larger is better) and pushes the ones that can enter `top`.
/// `qnorm` is `Some(|q|²)` when `s` holds dot products of an L2 store (batched path); for an L2
/// store with `qnorm = None`, `s` already holds squared distances.
#[inline]
fn select(c: &Ctx<'_>, top: &mut TopK, rows: Rows<'_>, s: &[f32], qnorm: Option<f32>) {
    let mut thr = top.threshold();
    let l2 = c.metric == Metric::L2;
    let key_of = |j: usize, row: usize| -> f32 {
        if !l2 {
            s[j]
        } else {
            match qnorm {
                None => -s[j],
                Some(qn) => -(qn - 2.0 * s[j] + c.norms[row]).max(0.0),
            }
        }
    };
    match c.recency {
        None if !l2 => {
            // Hot path: inner product / cosine.
            for (j, &key) in s.iter().enumerate() {
                if key >= thr {
                    top.push(key, c.ids[rows.get(j)]);
                    thr = top.threshold();
                }
            }
        }
        None => {
            for j in 0..s.len() {
                let row = rows.get(j);
                let key = key_of(j, row);
                if key >= thr {
                    top.push(key, c.ids[row]);
                    thr = top.threshold();
                }
            }
        }
        Some(r) => {
            let w = r.weight;
            for j in 0..s.len() {
                let row = rows.get(j);
                let base = key_of(j, row);
                // The boost is at most 1 and rounding is monotone, so this bounds the final key.
                if (1.0 - w) * base + w * 1.0 < thr {
                    continue;
                }
                let key = (1.0 - w) * base + w * recency_boost(c.now_ms, c.created[row], r.half_life_ms);
                if key >= thr {
                    top.push(key, c.ids[row]);
                    thr = top.threshold();
                }
            }
        }
    }
}

impl Engine for CpuEngine {
    fn kind(&self) -> EngineKind {
        if TEST_AS_DEVICE.load(std::sync::atomic::Ordering::Relaxed) {
            return EngineKind::Cuda;
        }
        EngineKind::Cpu
    }
    fn takes_slot_queries(&self) -> bool {
        TEST_SLOT_QUERIES.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn describe(&self) -> String {
        match self.scan {
            Scan::Exact => format!("cpu-{}-x{}", self.isa.name(), self.threads),
            Scan::Int8 => format!("cpu-{}-x{}-int8-{}", self.isa.name(), self.threads, self.qisa.name()),
        }
    }
    fn sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        // The exact scan reads the store's own columns: nothing to mirror. The int8 scan keeps
        // its quantized copy in step.
        if self.scan == Scan::Int8 {
            self.quant.sync(store, dirty);
        }
        Ok(())
    }
    fn rerank_counts(&self) -> (u64, u64) {
        (self.reranked, self.uncertain)
    }
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        // A metadata filter is evaluated once, over the field columns, into a bitmap of the
        // rows the scan may score (a pre-filter: rows outside it are never scored).
        let allowed = req.filter.expr.as_ref().map(|_| store.filter_rows(req.filter, req.now_ms));
        self.search_allowed(store, req, allowed, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::reference_search;
    use crate::store::{UpsertItem, NEVER};
    use rand::{Rng, SeedableRng};

    fn naive_dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn kernels_match_f64_for_every_isa_and_odd_dims() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for &dim in &[1usize, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 128, 129, 384, 769] {
            let n = 13;
            let vecs: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let qs: Vec<f32> = (0..5 * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let idx: Vec<u32> = vec![12, 0, 5, 5, 7, 3];
            for isa in Isa::available() {
                for rows in [Rows::Range(0, n), Rows::Range(3, 9), Rows::Idx(&idx)] {
                    let m = rows.len();
                    let mut out = vec![0.0; m];
                    let tol = 1e-4 * (dim as f64).sqrt();
                    scores(isa, false, &qs[..dim], &vecs, dim, rows, &mut out);
                    for j in 0..m {
                        let r = rows.get(j);
                        let want = naive_dot(&qs[..dim], &vecs[r * dim..(r + 1) * dim]);
                        assert!((out[j] as f64 - want).abs() < tol, "{isa:?} dot dim {dim}: {} vs {want}", out[j]);
                    }
                    scores(isa, true, &qs[..dim], &vecs, dim, rows, &mut out);
                    for j in 0..m {
                        let r = rows.get(j);
                        let want: f64 =
                            qs[..dim].iter().zip(&vecs[r * dim..(r + 1) * dim]).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
                        assert!((out[j] as f64 - want).abs() < tol, "{isa:?} l2 dim {dim}: {} vs {want}", out[j]);
                    }
                    for nq in 1..=5 {
                        let mut g = vec![f32::NAN; nq * m];
                        gemm(isa, &qs[..nq * dim], nq, &vecs, dim, rows, &mut g);
                        for a in 0..nq {
                            for j in 0..m {
                                let r = rows.get(j);
                                let want = naive_dot(&qs[a * dim..(a + 1) * dim], &vecs[r * dim..(r + 1) * dim]);
                                assert!((g[a * m + j] as f64 - want).abs() < tol, "{isa:?} gemm nq {nq} dim {dim} q{a} row {r}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn describe_names_isa_and_threads() {
        let e = CpuEngine::new(2);
        assert_eq!(e.describe(), format!("cpu-{}-x2", Isa::detect().name()));
        assert_eq!(CpuEngine::with_isa(1, Isa::Scalar).describe(), "cpu-scalar-x1");
    }

    /// A table of `vecs.len() / dim` rows, ids 0.., row i created at `created(i)`.
    fn table_of(vecs: &[f32], dim: usize, mut created: impl FnMut(usize) -> u64) -> Store {
        let rows = vecs.len() / dim;
        let mut st = Store::new(dim, Metric::InnerProduct, rows, 0);
        let items: Vec<UpsertItem<'_>> = (0..rows)
            .map(|i| UpsertItem {
                fields: &[],
                id: i as u64,
                namespace: 0,
                vector: &vecs[i * dim..(i + 1) * dim],
                payload: None,
                created_ms: created(i),
                expires_ms: NEVER,
            })
            .collect();
        st.apply_upsert(&items);
        st
    }

    #[test]
    fn the_calibrated_split_threshold_is_within_its_bounds_and_measured_once() {
        let mut pool = Pool::new(1, std::time::Duration::ZERO);
        // None only when the worker could not be timed (a machine too loaded to wake it).
        if let Some(b) = calibrated_min_bytes(&mut pool, Isa::detect()) {
            assert!((CALIBRATED_MIN_BYTES.0..=CALIBRATED_MIN_BYTES.1).contains(&b), "{b}");
        }
        if let Some(b) = calibrated_split(2, Isa::Scalar) {
            assert_eq!(calibrated_split(2, Isa::Scalar), Some(b), "a second engine reuses the first one's threshold");
        }
    }

    #[test]
    fn recency_bound_prunes_but_keeps_exact_result() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dim = 8;
        let vecs: Vec<f32> = (0..5000 * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let st = table_of(&vecs, dim, |_| rng.random_range(0..1_000_000));
        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let f = Filter::all();
        let req = SearchRequest {
            queries: &q,
            nq: 1,
            k: 10,
            filter: &f,
            recency: Some(Recency { weight: 0.3, half_life_ms: 50_000.0 }),
            now_ms: 1_000_000,
            direct: None,
            slot: None,
        };
        let mut out = Vec::new();
        CpuEngine::new(1).search(&st, &req, &mut out).unwrap();
        let want = reference_search(&st, &req);
        let got: Vec<u64> = out[0].iter().map(|h| h.id).collect();
        let exp: Vec<u64> = want[0].iter().map(|h| h.1).collect();
        assert_eq!(got, exp);
    }
}
