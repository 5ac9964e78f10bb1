//! Search engines: one trait, a CPU implementation (always present) and a CUDA one (when a GPU
//! and the CUDA libraries are found at run time); [`router`] picks the one that serves.
//!
//! Score contract, shared by every engine:
//! - ip: `q·x`; cosine: `q̂·x̂` (both higher is better); l2: `|q−x|²` (lower is better).
//! - With recency weighting (ip/cosine only): `s' = (1−w)·s + w·2^(−age_ms/half_life_ms)`,
//!   `age_ms = max(0, now_ms − created_ms)`.
//! - Rows with `expires_ms ≤ now_ms` and rows outside the namespace filter are never returned.
//! - Results are sorted best first; ties are broken by the lower id. A query returns
//!   `min(k, matching rows)` hits.
//!
//! [`router`]: crate::engine::router

pub mod cpu;
pub mod cuda;
pub mod pool;
pub(crate) mod quant;
pub mod router;
pub mod shard;

use crate::error::Result;
use crate::store::{Store, UpsertItem};
use crate::types::{Hit, Metric};
use crate::wire::SearchRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Cpu = 1,
    Cuda = 2,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Cpu => "cpu",
            EngineKind::Cuda => "cuda",
        }
    }
}

pub trait Engine: Send {
    fn kind(&self) -> EngineKind;
    /// Human-readable description (e.g. "cpu-avx2x2" or "cuda-sm90-f16").
    fn describe(&self) -> String;
    /// Brings the engine's own copy of the table (if any) up to date: `dirty` lists rows whose
    /// contents changed since the last sync (rows ≥ `store.len()` are gone and must be ignored).
    fn sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()>;
    /// Exact top-k for every query in `req`; `out` is resized to `req.nq`, each entry sorted best
    /// first.
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()>;
    /// Makes room for `rows` rows before a write is applied, so that running out of (GPU)
    /// memory fails the write with a clear status and leaves the table unchanged.
    fn reserve(&mut self, _rows: usize) -> Result<()> {
        Ok(())
    }
    /// Makes room for the upsert of `items` into `store` (before it is applied): by default
    /// [`Engine::reserve`] for the table's rows once the new ids are added. Engines that split
    /// the table override it to reserve where the rows will go.
    fn reserve_for(&mut self, store: &Store, items: &[UpsertItem<'_>]) -> Result<()> {
        let mut fresh = std::collections::HashSet::new();
        let new_rows = items.iter().filter(|it| store.row_of(it.id).is_none() && fresh.insert(it.id)).count();
        self.reserve(store.len() + new_rows)
    }
    /// Offers the shared-memory region `[base, base + len)` that holds the clients' slots, for
    /// engines that must prepare it before writing single-query responses straight into them
    /// ([`SearchRequest::direct`]; the CUDA engine maps it for the device, the CPU engine needs
    /// nothing). Returns whether it did. The region must stay mapped for the engine's life (the
    /// server holds the segment). Default: nothing to do.
    fn attach_slots(&mut self, _base: *mut u8, _len: usize) -> bool {
        false
    }
    /// Offers the engine a server-owned host region, `[base, base + len)`, that stays mapped for
    /// the engine's life: the server copies large requests there, so a query batch may lie in it
    /// (`SearchRequest::queries`). An engine may register it for DMA (and must unregister it when
    /// dropped). Returns whether it did.
    fn attach_staging(&mut self, _base: *mut u8, _len: usize) -> bool {
        false
    }
    /// Whether the server may leave a large batch's queries in the client's slot
    /// ([`SearchRequest::slot`]) instead of copying them: the engine then copies and checks them
    /// itself. Every engine must still answer such a request (the default path copies them).
    fn takes_slot_queries(&self) -> bool {
        false
    }
    /// Queries answered by the int8 scan (`scan = "int8"`) since the engine started, and those
    /// of them whose answer was uncertain (a true neighbour may have been missed:
    /// `quant::rerank`). Engines that scan exactly report (0, 0).
    fn rerank_counts(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Makes `out` hold `nq` empty hit lists, keeping the lists (and their capacity) it already has:
/// the server passes the same `out` to every search, so a batch's lists are not reallocated.
pub fn reset_out(out: &mut Vec<Vec<Hit>>, nq: usize) {
    out.truncate(nq);
    for o in out.iter_mut() {
        o.clear();
    }
    out.resize_with(nq, Vec::new);
}

/// `req` with its slot queries ([`SearchRequest::slot`]) copied into `buf` and checked finite, for
/// code that reads `req.queries`; `req` itself when it has none.
pub fn with_host_queries<'a>(req: &SearchRequest<'a>, buf: &'a mut Vec<f32>) -> Result<SearchRequest<'a>> {
    match req.slot {
        None => Ok(req.clone()),
        Some(s) => {
            *buf = s.copy_checked()?;
            Ok(SearchRequest { queries: buf, slot: None, ..req.clone() })
        }
    }
}

/// Spare entries (16 bytes each) at the end of every heap: the CPU engine's workers each push
/// into their own heap, and without the spare space two small heaps allocated one after the
/// other share a cache line that both cores keep writing (false sharing).
const HEAP_PAD: usize = 8;

/// Bounded selection of the best `k` (key, id) pairs: larger key is better, ties go to the
/// lower id. Keys are "internal" scores (for L2 the negated distance).
pub struct TopK {
    k: usize,
    /// Min-heap on (key, -id): the root is the worst kept entry.
    heap: Vec<(f32, u64)>,
}

#[inline]
fn worse(a: (f32, u64), b: (f32, u64)) -> bool {
    // a is worse than b
    a.0 < b.0 || (a.0 == b.0 && a.1 > b.1)
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK { k, heap: Vec::with_capacity(k + HEAP_PAD) }
    }
    pub fn reset(&mut self, k: usize) {
        self.k = k;
        self.heap.clear();
        if self.heap.capacity() < k + HEAP_PAD {
            self.heap.reserve_exact(k + HEAP_PAD);
        }
    }
    pub fn len(&self) -> usize {
        self.heap.len()
    }
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
    /// Key a candidate must beat (or tie with a lower id) to enter; `-inf` until full.
    #[inline]
    pub fn threshold(&self) -> f32 {
        if self.heap.len() < self.k {
            f32::NEG_INFINITY
        } else {
            self.heap[0].0
        }
    }
    #[inline]
    pub fn push(&mut self, key: f32, id: u64) {
        let e = (key, id);
        if self.heap.len() < self.k {
            self.heap.push(e);
            let mut i = self.heap.len() - 1;
            while i > 0 {
                let p = (i - 1) / 2;
                if worse(self.heap[i], self.heap[p]) {
                    self.heap.swap(i, p);
                    i = p;
                } else {
                    break;
                }
            }
        } else if worse(self.heap[0], e) {
            self.heap[0] = e;
            let n = self.heap.len();
            let mut i = 0;
            loop {
                let l = 2 * i + 1;
                let r = l + 1;
                let mut m = i;
                if l < n && worse(self.heap[l], self.heap[m]) {
                    m = l;
                }
                if r < n && worse(self.heap[r], self.heap[m]) {
                    m = r;
                }
                if m == i {
                    break;
                }
                self.heap.swap(i, m);
                i = m;
            }
        }
    }
    /// Merges another selection into this one.
    pub fn merge(&mut self, other: &TopK) {
        for &(k, id) in &other.heap {
            self.push(k, id);
        }
    }
    /// Best first.
    pub fn sorted(&self) -> Vec<(f32, u64)> {
        let mut v = self.heap.clone();
        v.sort_unstable_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        v
    }
    /// Best first into `out` (cleared first), converted for `metric`; empties the selection.
    /// Unlike [`TopK::into_hits`] it allocates nothing once `out` has grown.
    pub fn drain_hits_into(&mut self, metric: Metric, out: &mut Vec<Hit>) {
        self.heap.sort_unstable_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        out.clear();
        out.extend(self.heap.iter().map(|&(key, id)| Hit { id, score: key_to_score(metric, key) }));
        self.heap.clear();
    }
    /// Best first, converted to caller-facing hits for `metric`.
    pub fn into_hits(&self, metric: Metric) -> Vec<Hit> {
        self.sorted().into_iter().map(|(key, id)| Hit { id, score: key_to_score(metric, key) }).collect()
    }
}

/// Internal key → caller-facing score (L2 keys are negated distances).
#[inline]
pub fn key_to_score(metric: Metric, key: f32) -> f32 {
    if metric == Metric::L2 {
        -key
    } else {
        key
    }
}

/// The recency term `2^(−age/half_life)`.
#[inline]
pub fn recency_boost(now_ms: u64, created_ms: u64, half_life_ms: f64) -> f32 {
    let age = now_ms.saturating_sub(created_ms) as f64;
    (-age / half_life_ms).exp2() as f32
}

/// Straightforward float64 search over the store. It is the reference the tests compare every
/// engine against; it is not used to serve requests.
pub fn reference_search(store: &Store, req: &SearchRequest<'_>) -> Vec<Vec<(f64, u64)>> {
    let dim = store.dim();
    let metric = store.metric();
    let mut out = Vec::with_capacity(req.nq);
    for qi in 0..req.nq {
        let q = &req.queries[qi * dim..(qi + 1) * dim];
        let mut all: Vec<(f64, u64)> = Vec::new();
        let allowed = store.filter_rows(req.filter, req.now_ms);
        for row in 0..store.len() {
            if !allowed.get(row) {
                continue;
            }
            let x = &store.vectors()[row * dim..(row + 1) * dim];
            let mut s = match metric {
                Metric::L2 => -q.iter().zip(x).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum::<f64>(),
                _ => q.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>(),
            };
            if let Some(r) = req.recency {
                let age = req.now_ms.saturating_sub(store.created_ms()[row]) as f64;
                s = (1.0 - r.weight as f64) * s + r.weight as f64 * (-age / r.half_life_ms).exp2();
            }
            all.push((s, store.ids()[row]));
        }
        all.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        all.truncate(req.k);
        out.push(all.into_iter().map(|(s, id)| (if metric == Metric::L2 { -s } else { s }, id)).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_out_empties_and_keeps_the_lists() {
        let mut out: Vec<Vec<Hit>> = (0..4).map(|i| vec![Hit { id: i, score: 1.0 }; 10]).collect();
        let ptrs: Vec<*const Hit> = out.iter().map(|v| v.as_ptr()).collect();
        reset_out(&mut out, 3);
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|v| v.is_empty() && v.capacity() >= 10));
        assert!(out.iter().zip(&ptrs).all(|(v, &p)| v.as_ptr() == p), "the lists were reallocated");
        reset_out(&mut out, 5);
        assert_eq!(out.len(), 5);
        assert!(out.iter().all(|v| v.is_empty()));
        assert_eq!(out[0].as_ptr(), ptrs[0]);
    }

    #[test]
    fn topk_keeps_best_and_breaks_ties_by_lower_id() {
        let mut t = TopK::new(3);
        for (k, id) in [(1.0, 5), (3.0, 9), (3.0, 2), (2.0, 1), (3.0, 7), (0.5, 0)] {
            t.push(k, id);
        }
        assert_eq!(t.sorted(), vec![(3.0, 2), (3.0, 7), (3.0, 9)]);
        let mut u = TopK::new(2);
        u.push(4.0, 100);
        t.merge(&u);
        assert_eq!(t.sorted(), vec![(4.0, 100), (3.0, 2), (3.0, 7)]);
    }
}
