//! In-process probe of device shards (`engine::shard`) played by CPU engines: p50 / p99 of a
//! single-query search and of a 16-query batch on an `n x dim` f32 table, for one CPU engine of
//! one thread against S shards of one thread each, with the shard threads sleeping between jobs
//! (what hosts of fewer than 8 cores get) and busy-polling for 2 ms after each job (hosts of 8 or
//! more). Rounds alternate between the variants so each sees the same machine load. Prints what
//! sharding costs per recall (the hand-off to the shard threads and the merge) next to what it
//! splits (the scan).
//!   cargo run --release --example shard_probe -- [n] [dim] [shards,...]
use std::sync::Arc;
use std::time::{Duration, Instant};

use kalos::engine::cpu::CpuEngine;
use kalos::engine::shard::ShardedEngine;
use kalos::engine::Engine;
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::types::{Filter, Metric, Placement};
use kalos::wire::SearchRequest;
use rand::{Rng, SeedableRng};

fn pct(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[(v.len() - 1) * p / 100]
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dim: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(128);
    let shards: Vec<usize> = a.get(3).map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect()).unwrap_or_else(|| vec![2, 4]);
    let mut r = rand::rngs::StdRng::seed_from_u64(rand::random());
    let x: Vec<f32> = (0..n * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let mut st = Store::new(dim, Metric::InnerProduct, n, 0);
    for c in (0..n).step_by(4096) {
        let items: Vec<UpsertItem<'_>> = (c..n.min(c + 4096))
            .map(|i| UpsertItem {
                id: i as u64,
                namespace: 0,
                vector: &x[i * dim..(i + 1) * dim],
                payload: None,
                created_ms: 0,
                expires_ms: NEVER,
                fields: &[],
            })
            .collect();
        st.apply_upsert(&items);
    }
    let dirty = st.take_dirty();
    let mut variants: Vec<(String, Box<dyn Engine>)> = vec![("one engine".into(), Box::new(CpuEngine::new(1)))];
    for &s in &shards {
        for (spin, what) in [(Duration::ZERO, "sleeping"), (Duration::from_millis(2), "polling")] {
            let f = Arc::new(|_: usize, _: &Store| Ok(Box::new(CpuEngine::new(1)) as Box<dyn Engine>));
            let e = ShardedEngine::new(s, Placement::Id, &st, spin, f).unwrap();
            variants.push((format!("{s} shards, {what}"), Box::new(e)));
        }
    }
    for (_, e) in &mut variants {
        e.sync(&st, &dirty).unwrap();
    }
    let variants_polling: Vec<bool> = variants.iter().map(|(name, _)| name.ends_with("polling")).collect();
    let qs: Vec<f32> = (0..64 * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let all = Filter::all();
    let table_bytes = n * dim * 4;
    let rounds = (2_000_000_000 / table_bytes.max(1)).clamp(20, 2000);
    let mut lat: Vec<[Vec<f64>; 2]> = variants.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    let mut out = Vec::new();
    for round in 0..rounds {
        for (vi, (_, e)) in variants.iter_mut().enumerate() {
            for (bi, nq) in [1usize, 16].into_iter().enumerate() {
                let o = (round % 4) * 16 * dim;
                let req = SearchRequest {
                    queries: &qs[o..o + nq * dim],
                    nq,
                    k: 10,
                    filter: &all,
                    recency: None,
                    now_ms: 0,
                    direct: None,
                    slot: None,
                };
                let t = Instant::now();
                e.search(&st, &req, &mut out).unwrap();
                lat[vi][bi].push(t.elapsed().as_secs_f64() * 1e6);
            }
            // A polling variant's threads spin for 2 ms after its last job: let that pass before
            // the next variant runs, so no variant is timed beside another's spinning threads.
            if variants_polling[vi] {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
    }
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    println!("shard probe: {n} x {dim} f32 ({:.1} MB), k = 10, {rounds} rounds, {cores} cores", table_bytes as f64 / 1e6);
    println!("| engine | single p50 µs | single p99 µs | batch 16 p50 µs | batch 16 p99 µs |");
    println!("|---|---|---|---|---|");
    for ((name, _), l) in variants.iter().zip(&mut lat) {
        let (s, b) = l.split_at_mut(1);
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
            pct(&mut s[0], 50),
            pct(&mut s[0], 99),
            pct(&mut b[0], 50),
            pct(&mut b[0], 99)
        );
    }
}
