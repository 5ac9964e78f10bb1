//! Durability benchmarks (not a test): upsert throughput by sync policy and batch size, recovery
//! time of a large table, and recall latency with a selective namespace filter vs unfiltered.
//!
//!     cargo run --release --example bench_durability -- [--rows 1000000] [--dim 384] [--secs 3]
//!         [--dir /tmp/kalos-bench] [--skip-upsert] [--skip-recovery] [--only-upsert] [--cleanup]
//!
//! Results go to stdout as Markdown table rows (docs/benchmarks/durability.md records them).
//! Server and client run in this process but talk through the shared-memory slots as usual.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kalos::persist::{Persist, PersistOptions};
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn arg<T: std::str::FromStr>(key: &str, default: T) -> T {
    let v: Vec<String> = std::env::args().collect();
    v.iter().position(|a| a == key).and_then(|i| v.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(default)
}
fn flag(key: &str) -> bool {
    std::env::args().any(|a| a == key)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn upsert_bench(base: &std::path::Path, dim: usize, secs: f64, sync: SyncPolicy, batch: usize, clients: usize) -> (f64, f64) {
    let dir = base.join(format!("up-{sync:?}-{batch}-{clients}"));
    let _ = std::fs::remove_dir_all(&dir);
    let name = format!("bench-dur-{}", std::process::id());
    let o = Options {
        role: Role::Server,
        dim: dim as u32,
        metric: Metric::Cosine,
        backend: Backend::Cpu,
        data_dir: Some(dir.clone()),
        sync,
        sync_interval_ms: 100,
        capacity: 1 << 24,
        ..Options::default()
    };
    let k = Kalos::open(&name, &o).unwrap();
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let total: Vec<(u64, Vec<f64>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                let name = name.clone();
                sc.spawn(move || {
                    let k = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).unwrap();
                    let mut rng = StdRng::seed_from_u64(c as u64);
                    let vecs: Vec<f32> = (0..batch * dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                    let mut n = 0u64;
                    let mut lat = Vec::new();
                    let mut id = (c as u64) << 40;
                    while Instant::now() < stop {
                        let ids: Vec<u64> = (id..id + batch as u64).collect();
                        id += batch as u64;
                        let t = Instant::now();
                        k.upsert(&ids, &vecs, &UpsertOptions { namespaces: Namespaces::One(c as u64), ..Default::default() }).unwrap();
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                        n += batch as u64;
                    }
                    (n, lat)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let n: u64 = total.iter().map(|t| t.0).sum();
    let mut lat: Vec<f64> = total.into_iter().flat_map(|t| t.1).collect();
    k.close();
    let _ = std::fs::remove_dir_all(&dir);
    (n as f64 / secs, pct(&mut lat, 0.5))
}

fn main() {
    let rows: usize = arg("--rows", 1_000_000);
    let dim: usize = arg("--dim", 384);
    let secs: f64 = arg("--secs", 3.0);
    let base = PathBuf::from(arg("--dir", std::env::temp_dir().join("kalos-bench").to_string_lossy().to_string()));
    std::fs::create_dir_all(&base).unwrap();
    println!("# kalos durability bench: rows={rows} dim={dim} secs={secs} dir={}", base.display());

    if !flag("--skip-upsert") {
        println!("\n| sync | batch | clients | vectors/s | p50 upsert µs |\n|---|---|---|---|---|");
        for (sync, batch, clients) in [
            (SyncPolicy::Always, 1, 1),
            (SyncPolicy::Always, 1, 8),
            (SyncPolicy::Always, 256, 1),
            (SyncPolicy::Interval, 1, 1),
            (SyncPolicy::Interval, 1, 8),
            (SyncPolicy::Interval, 256, 1),
            (SyncPolicy::Never, 1, 1),
            (SyncPolicy::Never, 256, 1),
        ] {
            let (vps, p50) = upsert_bench(&base, dim, secs, sync, batch, clients);
            println!("| {sync:?} | {batch} | {clients} | {vps:.0} | {p50:.0} |");
        }
        if flag("--only-upsert") {
            return;
        }
    }

    // Recovery: build a data directory of `rows` rows (90% in the snapshot, 10% in the log),
    // then time a server start on it (recovery + engine load) and the bare Persist::open.
    let dir = base.join("recovery");
    let metric = Metric::Cosine;
    if !flag("--skip-recovery") {
        let _ = std::fs::remove_dir_all(&dir);
        let t = Instant::now();
        let mut store = Store::new(dim, metric, rows + 1, 65536);
        let popts = PersistOptions { sync: SyncPolicy::Never, sync_interval_ms: 100 };
        let (mut p, _) = Persist::open(&dir, dim, metric, &popts, &mut store).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let chunk = 4096;
        let snap_rows = rows * 9 / 10;
        let mut vecs = vec![0f32; chunk * dim];
        for (lo, hi, logged) in [(0, snap_rows, false), (snap_rows, rows, true)] {
            if logged {
                // Everything so far goes into the snapshot; the rest is replayed from the log.
                let t = Instant::now();
                p.snapshot(&store).unwrap();
                println!(
                    "\nsnapshot of {} rows written (temp + fsync + rename + fsync dir) in {:.2}s",
                    store.len(),
                    t.elapsed().as_secs_f64()
                );
            }
            let mut i = lo;
            while i < hi {
                let e = (i + chunk).min(hi);
                vecs.iter_mut().for_each(|x| *x = rng.random_range(-1.0f32..1.0));
                let items: Vec<UpsertItem> = (i..e)
                    .map(|r| UpsertItem {
                        fields: &[],
                        id: r as u64,
                        namespace: (r % 1000) as u64,
                        vector: &vecs[(r - i) * dim..(r - i + 1) * dim],
                        payload: None,
                        created_ms: 1,
                        expires_ms: NEVER,
                    })
                    .collect();
                if logged {
                    p.append(&kalos::persist::WalOp::Upsert(&items)).unwrap();
                }
                store.apply_upsert(&items);
                if logged {
                    p.commit().unwrap();
                }
                i = e;
            }
        }
        assert_eq!(store.len(), rows);
        drop(p);
        drop(store);
        let size: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        println!("\nbuilt {rows}x{dim} data dir ({:.2} GB) in {:.1}s", size as f64 / 1e9, t.elapsed().as_secs_f64());
        // Drop the page cache effect as far as an unprivileged run can: nothing. Report as warm.
        let mut store = Store::new(dim, metric, rows + 1, 65536);
        let t = Instant::now();
        let (p, r) = Persist::open(&dir, dim, metric, &popts, &mut store).unwrap();
        assert_eq!(store.len(), rows, "recovered every row");
        let persist_s = t.elapsed().as_secs_f64();
        println!(
            "Persist::open: {:.2}s ({} snapshot rows, {} log records, {} log bytes), {:.0} rows/s",
            persist_s,
            r.snapshot_rows,
            r.records_replayed,
            r.log_bytes,
            rows as f64 / persist_s
        );
        // Background snapshot (what compaction does): the server-thread pause, then the total.
        let mut p = p;
        let t = Instant::now();
        p.start_snapshot(&store).unwrap();
        let pause = t.elapsed().as_secs_f64();
        drop(p); // waits for the snapshot thread and cleans up
        println!(
            "background snapshot of {rows} rows: server-thread pause {:.3}s (log switch + table copy), complete after {:.2}s",
            pause,
            t.elapsed().as_secs_f64()
        );
        drop(store);
    }
    // Full server start on the directory (recovery + CPU engine), then recall latency.
    let name = format!("bench-rec-{}", std::process::id());
    let o = Options {
        role: Role::Server,
        dim: dim as u32,
        metric,
        backend: Backend::Cpu,
        data_dir: Some(dir.clone()),
        capacity: (rows + 1) as u64,
        ..Options::default()
    };
    let t = Instant::now();
    let k = Kalos::open(&name, &o).unwrap();
    let open_s = t.elapsed().as_secs_f64();
    let st = k.stats().unwrap();
    println!(
        "server start with recovery from the full snapshot (Kalos::open, role server): {open_s:.2}s for {} rows, engine {}",
        st.count, st.engine_name
    );
    let mut rng = StdRng::seed_from_u64(9);
    println!("\n| recall (k=10) | rows scanned | queries | p50 µs | p99 µs |\n|---|---|---|---|---|");
    for (label, filter, nq) in [
        ("unfiltered", None, 20),
        ("namespace = 0.1% of rows", Some(vec![7u64]), 200),
        ("8 namespaces = 0.8%", Some((0..8).collect()), 200),
    ] {
        let mut lat = Vec::new();
        for _ in 0..nq {
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let t = Instant::now();
            let h = k.recall(&q, 10, &RecallOptions { namespaces: filter.clone(), ..Default::default() }).unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e6);
            assert_eq!(h.len(), 10);
        }
        let p50 = pct(&mut lat, 0.5);
        let p99 = pct(&mut lat, 0.99);
        println!("| {label} | {} | {nq} | {p50:.0} | {p99:.0} |", st.count);
    }
    k.close();
    if flag("--cleanup") {
        let _ = std::fs::remove_dir_all(&base);
    }
}
