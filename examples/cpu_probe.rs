//! In-process probe of the CPU engine's split scan (no IPC): p50 of one single-query search on
//! an `n x dim` f32 table for several thread counts, and the worker pool's fan-out alone (an
//! empty job). A tuning aid for the engine choice (docs/history/gpu-sessions.md, "CPU engine on the
//! host").
//!   cargo run --release --example cpu_probe -- [n] [dim] [threads,...] [ip|l2] [exact|int8]
use std::time::{Duration, Instant};

use kalos::engine::cpu::CpuEngine;
use kalos::engine::pool::Pool;
use kalos::engine::Engine;
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::types::{Filter, Metric, Scan};
use kalos::wire::SearchRequest;
use rand::{Rng, SeedableRng};

fn p50(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let dim: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let threads: Vec<usize> = a
        .get(3)
        .map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, cores.saturating_sub(1).max(1)]);
    // Fewer searches on large tables (each is milliseconds): ~3000 on small ones.
    let iters = (3_000_000_000usize / (n * dim * 4).max(1)).clamp(60, 3000);
    let warm = iters / 6;
    let mut r = rand::rngs::StdRng::seed_from_u64(rand::random());
    let vecs: Vec<f32> = (0..n * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let metric = if a.get(4).map(String::as_str) == Some("l2") { Metric::L2 } else { Metric::InnerProduct };
    let int8 = a.get(5).map(String::as_str) == Some("int8");
    let mut st = Store::new(dim, metric, n.max(1), 0);
    let items: Vec<UpsertItem<'_>> = (0..n)
        .map(|i| UpsertItem {
            fields: &[],
            id: i as u64,
            namespace: 0,
            vector: &vecs[i * dim..(i + 1) * dim],
            payload: None,
            created_ms: 0,
            expires_ms: NEVER,
        })
        .collect();
    for c in items.chunks(4096) {
        st.validate_upsert(c).unwrap();
        st.apply_upsert(c);
    }
    let qs: Vec<f32> = (0..64 * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let all = Filter::all();
    let mut out = Vec::new();
    for &t in &threads {
        let mut e = CpuEngine::for_server(t, 2_000_000_000);
        e.set_parallel_min_bytes(if t > 1 { 0 } else { usize::MAX });
        if int8 {
            e.set_scan(Scan::Int8, 0);
            e.sync(&st, &[]).unwrap();
        }
        let mut lat = Vec::new();
        for i in 0..iters {
            let q = &qs[(i % 64) * dim..(i % 64 + 1) * dim];
            let rq = SearchRequest { queries: q, nq: 1, k: 10, filter: &all, recency: None, now_ms: 0, direct: None, slot: None };
            let t0 = Instant::now();
            e.search(&st, &rq, &mut out).unwrap();
            if i >= warm {
                lat.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let (m, p99) = p50(lat);
        println!("cpu_probe n={n} dim={dim} {metric:?} threads={t} ({}): search p50 {m:.1} us p99 {p99:.1} us", e.describe());
    }
    for &t in &threads {
        if t < 2 {
            continue;
        }
        let mut p = Pool::new(t - 1, Duration::from_secs(2));
        let mut lat = Vec::new();
        for i in 0..iters {
            let t0 = Instant::now();
            p.run(&|_| {});
            if i >= warm {
                lat.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let (m, p99) = p50(lat);
        println!("cpu_probe pool of {} workers: empty job p50 {m:.2} us p99 {p99:.2} us", t - 1);
    }
}
