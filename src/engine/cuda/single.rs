//! Single queries (docs/GPU.md, "Single-query path"): one fused scan + top-k kernel
//! (kernels/scan.cu) per request, replayed as a CUDA graph: a one-node graph whose by-value
//! argument (params + query) each request replaces, or for larger dims a copy node and the
//! kernel. The kernel writes its results to mapped pinned memory and publishes a sequence
//! number there, on which the server thread spins.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::driver::sys;

use super::compile::{Codes, CHUNK, CUT_FLAG, FLAG_CUT, KCUT, KMAX, MCAP, NS_INLINE, NT, PARAMS_BYTES, PARAMS_HEAD, PROF_OFF, SMEM_MAIN};
use super::kernels::ScanFns;
use super::table::TableArg;
use super::{ck, cu_err, CudaEngine, DevBuf, HostBuf, Params, NONE_U32};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{Hit, Metric};
use crate::wire::{DirectOut, SearchRequest};

/// Single-query blocks per SM for large tables: 1M x 768 f16 went from 475 to 407 us on the H200
/// with 3 instead of 2.
const GRID_PER_SM: usize = 3;
/// Fewest rows per single-query block: small tables get more,
/// smaller blocks, each scanning its rows in one or two rounds of loads and selecting by rank
/// (64 beat 256 and 32 for 10k x 128 on the H200: GPU round trip 19.7 against 23.2 and 20.8 us).
const MIN_ROWS: usize = 64;
/// Largest params + query block passed by value (dims up to 352 in f32 layout).
pub(super) const BYVAL_MAX_BYTES: usize = 2048;
/// Longest wait for the GPU to answer one single query before the engine gives up on it (a
/// hung kernel must not hang the server and its clients forever).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The compact by-value request of `scan_topk_c` (`struct ParamsC` in kernels/scan.cu), which
/// the query follows: Params' head, the response address and up to NS_INLINE namespaces, 112
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
const _: () = assert!(PARAMS_C_BYTES == 112);

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

/// An instantiated CUDA graph (and, for by-value graphs, its kernel node).
pub(super) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the graph and its executable are this Graph's own (null when never created),
        // destroyed once; an executable graph still in flight is freed by the driver when it
        // completes.
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

/// How a single query reaches the GPU (docs/GPU.md, "Launch").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SqMode {
    /// A one-node graph whose kernel takes params + query by value; each request updates the
    /// node's arguments and replays the graph (up to BYVAL_MAX_BYTES).
    Graph,
    /// A graph of two nodes: a copy of params + query from pinned memory, then the kernel
    /// (larger dims).
    Copy,
}

/// State of the single-query path.
pub(super) struct Single {
    pub(super) mode: SqMode,
    /// Params + query as the copy node reads them (pinned), and their device copy.
    pub(super) h_in: HostBuf,
    pub(super) d_in: DevBuf,
    /// Results of the single-query kernel: pinned host memory the kernel writes directly
    /// (count, sequence word, ids, scores); `d_out` is its device address.
    pub(super) h_out: HostBuf,
    pub(super) d_out: sys::CUdeviceptr,
    /// Sequence number of the last request (published by the kernel after its results).
    pub(super) seq: u32,
    /// The flat candidate array the blocks append to (`cand_cap` lists of KMAX entries).
    pub(super) d_ckey: DevBuf,
    pub(super) d_crow: DevBuf,
    /// Merge control of the single-query kernel: [ticket, bound, candidates appended, 0].
    pub(super) d_ticket: DevBuf,
    pub(super) cand_cap: usize,
    /// Single-query graphs by (grid, compact argument, table: 0 plain, 1 masked, 2 compact,
    /// codes the kernel reads), with the table generation they were built for.
    pub(super) graphs: HashMap<(u32, bool, u8, Codes), (u64, Graph)>,
    /// A table scanned in place of the device table (a sparse filter's compact rows, with the
    /// compact table's own mask) and the rows scanned.
    pub(super) table_override: Option<(TableArg, usize)>,
    /// Set while a query the `FLAG_CUT` merge flagged is scanned again without the cut.
    pub(super) no_cut: bool,
}

/// Which build of the single-query kernel a search runs, and how it reaches the GPU.
#[derive(Clone, Copy)]
struct Path {
    fns: ScanFns,
    /// Query floats the kernel reads.
    dp: usize,
    mode: SqMode,
    codes: Codes,
}

/// Which single-query scan a search takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Pass {
    /// The exact scan of the table's rows.
    Exact,
    /// The int8 scan over 8-bit codes; `scale` is the query's (`q` holds its integer codes).
    Int8 { scale: f32 },
    /// The int8 scan's 4-bit first pass: `k` candidates by 4-bit score, the best `kf` of them
    /// by 8-bit score returned.
    Nibble { scale: f32, kf: usize },
}

impl Pass {
    fn codes(self) -> Codes {
        match self {
            Pass::Exact => Codes::None,
            Pass::Int8 { .. } => Codes::Int8,
            Pass::Nibble { .. } => Codes::Nibble,
        }
    }
}

/// The 4-bit first pass's own cut, as its kernel reports it: how many candidates it kept (the
/// pass's `k` when some matching row was left out) and the 4-bit score of the last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct NibbleCut {
    pub(super) count: usize,
    pub(super) floor_score: f32,
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
    fn grid_for(&self, n: usize, k: usize) -> u32 {
        // Blocks: GRID_PER_SM per SM for large tables, fewer (but each with >= MIN_ROWS rows)
        // for small ones; never more than CHUNK rows per block. Sized from the power-of-two
        // bucket of n so that the captured graph is reused while the table grows or shrinks.
        let nb = n.next_power_of_two().max(1);
        let min_rows = if k > 64 { (4 * k).min(CHUNK) } else { MIN_ROWS };
        let g = nb.div_ceil(min_rows).min(GRID_PER_SM * self.sms).max(nb.div_ceil(CHUNK)).max(1);
        g as u32
    }

    fn ensure_cand(&mut self, lists: usize) -> Result<()> {
        if lists <= self.sq.cand_cap {
            return Ok(());
        }
        let cap = lists.next_power_of_two();
        self.sq.d_ckey = DevBuf::new(cap * KMAX * 4, "candidates")?;
        self.sq.d_crow = DevBuf::new(cap * KMAX * 4, "candidates")?;
        self.sq.cand_cap = cap;
        self.sq.graphs.clear();
        Ok(())
    }

    /// Pointers of the single-query kernel's arguments after the first (the input buffer
    /// address in copy mode, the by-value params + query otherwise).
    fn scan_tail(&self, codes: Codes) -> (TableArg, [u64; 4]) {
        let mut tab = self.sq.table_override.map_or_else(|| self.table_arg(), |(t, _)| t);
        if let Some(c) = self.int8.as_ref().filter(|_| codes != Codes::None) {
            tab.vecs = c.d_codes.ptr;
            tab.rscale = c.d_scales.ptr;
            if let Some(n) = c.nib.as_ref().filter(|_| codes == Codes::Nibble) {
                tab.vecs = n.d_codes.ptr;
                tab.codes8 = c.d_codes.ptr;
            }
        }
        (tab, [self.sq.d_ckey.ptr, self.sq.d_crow.ptr, self.sq.d_ticket.ptr, self.sq.d_out])
    }

    /// The single-query path of the exact scan, the int8 scan or its 4-bit first pass.
    fn sq_path(&self, codes: Codes) -> Result<Path> {
        let coded = |fns: ScanFns, dp: usize| {
            let mode = if fns.topk_v.is_none() || PARAMS_BYTES + dp * 4 > BYVAL_MAX_BYTES { SqMode::Copy } else { SqMode::Graph };
            Path { fns, dp, mode, codes }
        };
        let missing = || Error::new(Status::Internal, "the int8 scan's kernels are not loaded");
        match codes {
            Codes::None => Ok(Path { fns: self.kern.scan, dp: self.dp, mode: self.sq.mode, codes }),
            Codes::Int8 => self.int8.as_ref().map(|c| coded(c.fns, c.dp8)).ok_or_else(missing),
            Codes::Nibble => self.int8.as_ref().and_then(|c| c.nib.as_ref()).map(|n| coded(n.fns, n.dp)).ok_or_else(missing),
        }
    }

    /// Builds the single-query graph for `grid` blocks. Copy mode: captured H2D(params + query)
    /// → scan_topk. Graph mode: one scan_topk_v (`compact`: scan_topk_c) kernel node, whose
    /// by-value argument each request replaces (`cuGraphExecKernelNodeSetParams`).
    fn build_graph(&mut self, grid: u32, compact: bool, path: Path) -> Result<Graph> {
        let smem = (SMEM_MAIN + path.dp * 4) as u32;
        let in_bytes = PARAMS_BYTES + path.dp * 4;
        let (mut tab, mut tail) = self.scan_tail(path.codes);
        // SAFETY: every handle written is a field of the Graph returned (which destroys it) or a
        // local out-pointer; the kernel arguments point at locals alive across the calls that
        // copy them (add kernel node, capture of the launch); h_in and d_in hold in_bytes; the
        // capture is ended on every path before anything else runs on the stream.
        unsafe {
            if path.mode == SqMode::Graph {
                let f = if compact { path.fns.topk_c } else { path.fns.topk_v };
                let f = f.ok_or_else(|| Error::new(Status::Internal, "by-value kernel missing"))?;
                let mut graph: sys::CUgraph = std::ptr::null_mut();
                ck("graph create", sys::cuGraphCreate(&mut graph, 0))?;
                let mut g = Graph { graph, exec: std::ptr::null_mut(), node: std::ptr::null_mut() };
                let mut args = scan_arg_ptrs(self.sq.h_in.ptr as *mut c_void, &mut tab, &mut tail);
                let kp = kernel_node(f, grid, smem, args.as_mut_ptr());
                ck("graph add kernel", sys::cuGraphAddKernelNode_v2(&mut g.node, g.graph, std::ptr::null(), 0, &kp))?;
                ck("graph instantiate", sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0))?;
                ck("graph upload", sys::cuGraphUpload(g.exec, self.stream))?;
                return Ok(g);
            }
            ck("begin capture", sys::cuStreamBeginCapture_v2(self.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))?;
            let body = (|| -> Result<()> {
                ck("capture H2D", sys::cuMemcpyHtoDAsync_v2(self.sq.d_in.ptr, self.sq.h_in.ptr as *const c_void, in_bytes, self.stream))?;
                let mut a_in = self.sq.d_in.ptr;
                let mut args = scan_arg_ptrs(&mut a_in as *mut u64 as *mut c_void, &mut tab, &mut tail);
                ck(
                    "capture scan_topk",
                    sys::cuLaunchKernel(path.fns.topk, grid, 1, 1, NT, 1, 1, smem, self.stream, args.as_mut_ptr(), std::ptr::null_mut()),
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

    pub(super) fn search_one(&mut self, store: &Store, req: &SearchRequest<'_>, q: &[f32]) -> Result<Vec<Hit>> {
        let mut hits = Vec::new();
        self.scan_one(store, req, q, req.k.min(KMAX), Pass::Exact, &mut hits)?;
        Ok(hits)
    }

    /// One single-query kernel: the best `k` rows for `q` into `hits`. With the int8 scan's
    /// passes, `q` holds the query's integer codes and the kernel ranks rows by approximate score
    /// (never written to the client's slot: they are re-ranked first); the 4-bit first pass
    /// returns its best `kf` of `k` candidates by 8-bit score, and its own cut.
    pub(super) fn scan_one(
        &mut self,
        store: &Store,
        req: &SearchRequest<'_>,
        q: &[f32],
        k: usize,
        pass: Pass,
        hits: &mut Vec<Hit>,
    ) -> Result<Option<NibbleCut>> {
        let n = self.sq.table_override.map_or(self.table.len, |(_, n)| n);
        let path = self.sq_path(pass.codes())?;
        let grid = self.grid_for(n, k);
        let chunk = n.div_ceil(grid as usize).max(1) as u32;
        self.ensure_cand(grid as usize)?;
        let mut p = self.fill_params(req, store, n, k, grid, chunk);
        // The int8 scan's R candidates: when every block's R would overflow the merge's shared
        // memory, blocks keep KCUT each and the rare answer the cut could change is scanned again.
        let cut = pass != Pass::Exact && !self.sq.no_cut && k > KCUT && grid as usize * k > MCAP && grid as usize * KCUT >= 4 * k;
        if cut {
            p.flags |= FLAG_CUT;
        }
        if self.metric == Metric::L2 {
            p.qnorm = q.iter().map(|x| x * x).sum();
        }
        match pass {
            Pass::Int8 { scale } => p.qscale = scale,
            Pass::Nibble { scale, kf } => {
                p.qscale = scale;
                p.kf = kf as u32;
            }
            Pass::Exact => {
                let qmax = q.iter().fold(0f32, |m, x| m.max(x.abs()));
                p.qscale = if qmax > 0.0 { qmax } else { 1.0 };
            }
        }
        self.sq.seq = self.sq.seq.wrapping_add(1).max(1);
        p.seq = self.sq.seq;
        // The kernel also writes the response body into the client's slot when it is mapped.
        let direct = req.direct.filter(|_| pass == Pass::Exact).and_then(|d| {
            let (h, len) = self.slots;
            let (host, cap) = d.dma_target();
            let off = host.checked_sub(h)?;
            (self.slots_dev != 0 && cap >= DirectOut::body_len(k) && off.checked_add(DirectOut::body_len(k))? <= len)
                .then_some((d, self.slots_dev + off as u64))
        });
        if let Some((_, dst)) = direct {
            p.dst = dst;
        }
        // Graph mode sends the compact argument when the filter fits it.
        let pc = if path.mode == SqMode::Graph && path.fns.topk_c.is_some() { ParamsC::of(&p) } else { None };
        let table = if self.sq.table_override.is_some() { 2 } else { (self.fcols.active_mask != 0) as u8 };
        let key = (grid, pc.is_some(), table, path.codes);
        if self.sq.graphs.get(&key).is_none_or(|(g, _)| *g != self.table.gen) {
            self.sq.graphs.remove(&key);
            let g = self.build_graph(grid, key.1, path)?;
            self.sq.graphs.insert(key, (self.table.gen, g));
        }
        put_request(self.sq.h_in.slice(), &p, pc.as_ref(), q, path.dp);
        let t0 = std::time::Instant::now();
        let smem = (SMEM_MAIN + path.dp * 4) as u32;
        let (mut tab, mut tail) = self.scan_tail(path.codes);
        let mut args = scan_arg_ptrs(self.sq.h_in.ptr as *mut c_void, &mut tab, &mut tail);
        match path.mode {
            SqMode::Graph => {
                let g = &self.sq.graphs.get(&key).unwrap().1;
                let f = if key.1 { path.fns.topk_c } else { path.fns.topk_v };
                let f = f.ok_or_else(|| Error::new(Status::Internal, "by-value kernel missing"))?;
                let kp = kernel_node(f, grid, smem, args.as_mut_ptr());
                // SAFETY: the graph's own kernel node, same kernel and shape as built; the new
                // arguments point at h_in (this request's params + query) and at locals alive
                // across the call, which copies them.
                ck("graph set params", unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, g.node, &kp) })?;
                // SAFETY: an instantiated graph of the engine's, on its own stream.
                ck("graph launch", unsafe { sys::cuGraphLaunch(g.exec, self.stream) })?;
                self.stats.compact_sq += key.1 as u64;
            }
            SqMode::Copy => {
                let exec = self.sq.graphs.get(&key).unwrap().1.exec;
                // SAFETY: an instantiated graph of the engine's, built for the current table
                // generation and candidate buffers, on its own stream.
                ck("graph launch", unsafe { sys::cuGraphLaunch(exec, self.stream) })?;
            }
        }
        let t_api = t0.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.wait_published(p.seq)?;
        if self.stats.rtt.len() < self.stats.rtt.capacity() {
            self.stats.rtt.push(t0.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            self.stats.rtt_api.push(t_api);
        }
        if let Some(v) = self.stats.prof.as_mut() {
            // SAFETY: h_out holds PROF_OFF + 128 bytes; the kernel wrote 8 stamps and the
            // merge's candidate counts before publishing.
            let st: [u64; 9] =
                std::array::from_fn(|i| unsafe { std::ptr::read_volatile((self.sq.h_out.ptr.add(PROF_OFF) as *const u64).add(i)) });
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
        // SAFETY: h_out holds PROF_OFF = 8 + 12 * KMAX >= 8 + 12 * k bytes, written by the kernel
        // before it published p.seq (wait_published's acquire fence orders the reads after it).
        let out = unsafe { std::slice::from_raw_parts(self.sq.h_out.ptr as *const u8, 8 + 12 * k) };
        let word = u32::from_le_bytes(out[0..4].try_into().unwrap());
        if cut && word & CUT_FLAG != 0 {
            self.stats.cut_retries += 1;
            self.sq.no_cut = true;
            let r = self.scan_one(store, req, q, k, pass, hits);
            self.sq.no_cut = false;
            return r;
        }
        self.stats.cut_queries += cut as u64;
        let count = word as usize;
        let most = if let Pass::Nibble { kf, .. } = pass { kf } else { k };
        if count > most {
            return Err(Error::new(Status::Cuda, format!("GPU returned {count} hits for k = {most}")));
        }
        hits.clear();
        let so = 8 + 8 * k;
        for i in 0..count {
            let id = u64::from_le_bytes(out[8 + 8 * i..16 + 8 * i].try_into().unwrap());
            let score = f32::from_le_bytes(out[so + 4 * i..so + 4 * i + 4].try_into().unwrap());
            hits.push(Hit { id, score });
        }
        if let Some((d, _)) = direct {
            d.mark_written(DirectOut::body_len(count));
            self.stats.direct_writes += 1;
        }
        // The 4-bit pass's cut travels in slot k - 1 (its kf < k results come first).
        Ok(matches!(pass, Pass::Nibble { .. }).then(|| {
            let l = k - 1;
            let count = u64::from_le_bytes(out[8 + 8 * l..16 + 8 * l].try_into().unwrap()) as usize;
            let floor_score = f32::from_le_bytes(out[so + 4 * l..so + 4 * l + 4].try_into().unwrap());
            NibbleCut { count, floor_score }
        }))
    }

    /// Spins until the kernel has published sequence number `seq` (the server thread polls
    /// anyway; a stream synchronisation would add microseconds). A failed kernel, one that
    /// finished without publishing, and no answer within ANSWER_TIMEOUT are errors.
    fn wait_published(&self, seq: u32) -> Result<()> {
        // SAFETY: h_out holds PROF_OFF + 128 bytes; offset 4 is the sequence word.
        let word = unsafe { self.sq.h_out.ptr.add(4) as *const u32 };
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
            if !i.is_multiple_of(256) {
                continue;
            }
            // SAFETY: the engine's own stream.
            let r = unsafe { sys::cuStreamQuery(self.stream) };
            if r == sys::CUresult::CUDA_SUCCESS {
                // SAFETY: as above.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::compile::FLAG_EXPIRY;
    use crate::types::MAX_FILTER_NAMESPACES;

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
            kf: 9,
            _pad: 0,
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
