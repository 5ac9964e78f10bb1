//! Exact CPU engine (placeholder scalar version; replaced by the SIMD engine).

use super::{Engine, EngineKind, TopK};
use crate::error::Result;
use crate::store::Store;
use crate::types::{Hit, Metric, SearchRequest};

pub struct CpuEngine {
    threads: usize,
}

impl CpuEngine {
    /// `threads` = 0 picks the number of available cores.
    pub fn new(threads: usize) -> CpuEngine {
        let threads = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        CpuEngine { threads }
    }
}

impl Engine for CpuEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Cpu
    }
    fn describe(&self) -> String {
        format!("cpu-scalar-x{}", self.threads)
    }
    fn sync(&mut self, _store: &Store, _dirty: &[u32]) -> Result<()> {
        Ok(())
    }
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> Result<()> {
        let dim = store.dim();
        out.clear();
        for qi in 0..req.nq {
            let q = &req.queries[qi * dim..(qi + 1) * dim];
            let qn: f32 = q.iter().map(|x| x * x).sum();
            let mut t = TopK::new(req.k);
            for row in 0..store.len() {
                if !req.filter.matches(store.namespaces()[row]) || store.expires_ms()[row] <= req.now_ms {
                    continue;
                }
                let x = &store.vectors()[row * dim..(row + 1) * dim];
                let d: f32 = q.iter().zip(x).map(|(a, b)| a * b).sum();
                let mut key = match store.metric() {
                    Metric::L2 => -(qn - 2.0 * d + store.norms()[row]).max(0.0),
                    _ => d,
                };
                if let Some(r) = req.recency {
                    key = (1.0 - r.weight) * key + r.weight * super::recency_boost(req.now_ms, store.created_ms()[row], r.half_life_ms);
                }
                t.push(key, store.ids()[row]);
            }
            out.push(t.into_hits(store.metric()));
        }
        Ok(())
    }
}
