//! The client of `scripts/cluster-demo.sh`: writes memories through one kalosd of a cluster,
//! recalls them through the others (read-your-writes, forwarded, scatter-gather), and measures
//! acknowledged writes/s and recall latency percentiles (docs/BENCHMARKS.md, "Cluster").
//!
//!   cargo run --release --example cluster_client -- --hosts a,b,c --shards 3 --holds 0,1:1,2:2,0
//!       [--rows 20000] [--dim 64] [--queries 2000] [--single NAME]
//!
//!   ... --phase load --rows N     N single writes through the first host; prints their token
//!   ... --phase wait --token T    times until the first host has applied token T (catch-up)
//!
//! `--hosts`: the local store names of the cluster's kalosd (one per host, same machine);
//! `--holds`: the shards each of them holds, in the same order. `--single`: a plain single-host
//! kalosd of the same dimension, measured the same way for comparison.

use std::time::{Duration, Instant};

use kalos::wire::cluster::shard_of;
use kalos::*;

fn arg(v: &[String], key: &str) -> Option<String> {
    v.iter().position(|a| a == key).and_then(|i| v.get(i + 1)).cloned()
}

fn vector(seed: u64, dim: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 20_000) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

fn pct(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

fn open(name: &str) -> Kalos {
    Kalos::open(name, &Options { role: Role::Client, timeout_ms: 10_000, ..Options::default() }).unwrap_or_else(|e| {
        eprintln!("cluster_client: cannot attach to {name:?}: {e}");
        std::process::exit(2)
    })
}

/// Times `n` calls of `f`, returning (p50 µs, p99 µs).
fn time(n: usize, mut f: impl FnMut(usize)) -> (f64, f64) {
    let mut t = Vec::with_capacity(n);
    for i in 0..n {
        let t0 = Instant::now();
        f(i);
        t.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    pct(t)
}

/// Acknowledged writes/s: `n` single upserts, then `n` rows in batches of 256.
fn writes(k: &Kalos, dim: usize, first_id: u64, n: usize, ns_of: impl Fn(u64) -> u64) -> (f64, f64) {
    let t0 = Instant::now();
    for i in 0..n as u64 {
        let id = first_id + i;
        k.upsert(&[id], &vector(id, dim), &UpsertOptions { namespaces: Namespaces::One(ns_of(id)), ..Default::default() }).unwrap();
    }
    let single = n as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for c in 0..n.div_ceil(256) as u64 {
        let ids: Vec<u64> = (0..256).map(|i| first_id + n as u64 + c * 256 + i).collect();
        let ns: Vec<u64> = ids.iter().map(|&i| ns_of(i)).collect();
        let vecs: Vec<f32> = ids.iter().flat_map(|&i| vector(i, dim)).collect();
        k.upsert(&ids, &vecs, &UpsertOptions { namespaces: Namespaces::PerItem(&ns), ..Default::default() }).unwrap();
    }
    (single, (n.div_ceil(256) * 256) as f64 / t0.elapsed().as_secs_f64())
}

fn main() {
    let v: Vec<String> = std::env::args().collect();
    let hosts: Vec<String> = arg(&v, "--hosts").unwrap_or_else(|| "a,b,c".into()).split(',').map(String::from).collect();
    let shards: u32 = arg(&v, "--shards").and_then(|s| s.parse().ok()).unwrap_or(3);
    let holds: Vec<Vec<u32>> = arg(&v, "--holds")
        .unwrap_or_else(|| "0,1:1,2:2,0".into())
        .split(':')
        .map(|h| h.split(',').map(|s| s.parse().unwrap()).collect())
        .collect();
    let rows: usize = arg(&v, "--rows").and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let nq: usize = arg(&v, "--queries").and_then(|s| s.parse().ok()).unwrap_or(2_000);
    let single = arg(&v, "--single");
    match arg(&v, "--phase").as_deref() {
        Some("load") => {
            let k = open(&hosts[0]);
            let t0 = Instant::now();
            for i in 0..rows as u64 {
                let id = 3_000_000 + i;
                k.upsert(&[id], &vector(id, k.dim()), &UpsertOptions { namespaces: Namespaces::One(id % 64), ..Default::default() })
                    .unwrap();
            }
            let t = k.write_seqs().iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
            println!("loaded {rows} single writes in {:.2} s; token={t}", t0.elapsed().as_secs_f64());
            return;
        }
        Some("wait") => {
            let k = open(&hosts[0]);
            let token: Vec<u64> = arg(&v, "--token").expect("--token").split(',').map(|s| s.parse().unwrap()).collect();
            let t0 = Instant::now();
            for &s in &holds[0] {
                let ns = (0u64..).find(|&n| shard_of(n, shards) == s).unwrap();
                let o = RecallOptions {
                    namespaces: Some(vec![ns]),
                    min_seqs: Some(token.clone()),
                    timeout_ms: Some(300_000),
                    ..Default::default()
                };
                k.recall(&vector(1, k.dim()), 1, &o).unwrap();
            }
            println!("caught up in {:.3} s", t0.elapsed().as_secs_f64());
            return;
        }
        _ => {}
    }
    let ks: Vec<Kalos> = hosts.iter().map(|h| open(h)).collect();
    let dim = ks[0].dim();
    let (a, b) = (&ks[0], &ks[1]);
    // A namespace of a shard B holds, and one of a shard B does not hold.
    let ns_in = |s: u32| (0u64..).find(|&n| shard_of(n, shards) == s).unwrap();
    let held_b = holds[1][0];
    let not_b = (0..shards).find(|s| !holds[1].contains(s));

    // 1. Write through A, read through B at once with A's write token.
    let ns = ns_in(held_b);
    a.upsert(
        &[1],
        &vector(1, dim),
        &UpsertOptions { namespaces: Namespaces::One(ns), payloads: Some(vec![Some(b"likes green tea")]), ..Default::default() },
    )
    .unwrap();
    let token = a.write_seqs();
    let o = RecallOptions { namespaces: Some(vec![ns]), min_seqs: Some(token.clone()), ..Default::default() };
    let hit = &b.recall_with_payloads(&vector(1, dim), 1, &o).unwrap()[0];
    println!(
        "wrote id 1 (namespace {ns}, shard {held_b}) through {}, token {token:?}; read through {}: id {} {:?}",
        hosts[0],
        hosts[1],
        hit.id,
        String::from_utf8_lossy(hit.payload.as_deref().unwrap_or_default())
    );

    // 2. Load and measure acknowledged writes.
    let ns_of = |id: u64| id % 64;
    let (w1, wb) = writes(a, dim, 1_000_000, rows / 2, ns_of);
    println!("acked writes/s through {}: single {w1:.0}, batches of 256 {wb:.0}", hosts[0]);
    let token = a.write_seqs();
    let sync = RecallOptions { min_seqs: Some(token.clone()), timeout_ms: Some(60_000), ..Default::default() };
    for k in &ks {
        k.recall(&vector(7, dim), 1, &sync).unwrap(); // every replica has applied the load
    }

    // 3. Recall latency through B: local (a held shard), forwarded (a shard B does not hold),
    // scatter-gather (unscoped).
    let q = |i: usize| vector(5_000_000 + i as u64, dim);
    let local = RecallOptions { namespaces: Some(vec![ns_in(held_b)]), ..Default::default() };
    let (l50, l99) = time(nq, |i| drop(b.recall(&q(i), 10, &local).unwrap()));
    println!("recall k=10 through {}: local shard          p50 {l50:.0} µs  p99 {l99:.0} µs", hosts[1]);
    if let Some(s) = not_b {
        let fwd = RecallOptions { namespaces: Some(vec![ns_in(s)]), ..Default::default() };
        let (f50, f99) = time(nq, |i| drop(b.recall(&q(i), 10, &fwd).unwrap()));
        println!("recall k=10 through {}: forwarded (shard {s})  p50 {f50:.0} µs  p99 {f99:.0} µs", hosts[1]);
    }
    let (s50, s99) = time(nq, |i| drop(b.recall(&q(i), 10, &RecallOptions::default()).unwrap()));
    println!("recall k=10 through {}: scatter-gather       p50 {s50:.0} µs  p99 {s99:.0} µs", hosts[1]);
    let ryw = RecallOptions { namespaces: Some(vec![ns_in(held_b)]), read_your_writes: true, ..Default::default() };
    let (r50, r99) = time(nq.min(500), |i| {
        b.upsert(
            &[2_000_000 + i as u64],
            &vector(i as u64, dim),
            &UpsertOptions { namespaces: Namespaces::One(ns_in(held_b)), ..Default::default() },
        )
        .unwrap();
        drop(b.recall(&q(i), 10, &ryw).unwrap());
    });
    println!("write + read-your-writes recall through {}: p50 {r50:.0} µs  p99 {r99:.0} µs", hosts[1]);

    if let Some(name) = single {
        let s = open(&name);
        let (w1, wb) = writes(&s, dim, 1_000_000, rows / 2, ns_of);
        println!("single-host kalosd {name}: acked writes/s single {w1:.0}, batches of 256 {wb:.0}");
        let (p50, p99) = time(nq, |i| drop(s.recall(&q(i), 10, &local).unwrap()));
        println!("single-host kalosd {name}: recall k=10 scoped p50 {p50:.0} µs  p99 {p99:.0} µs");
        let (p50, p99) = time(nq, |i| drop(s.recall(&q(i), 10, &RecallOptions::default()).unwrap()));
        println!("single-host kalosd {name}: recall k=10 unscoped p50 {p50:.0} µs  p99 {p99:.0} µs");
    }
    std::thread::sleep(Duration::from_millis(10));
}
