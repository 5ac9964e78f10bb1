//! Kalos CPU benchmark (issue 2, item 10). Run with `benches/run.sh` (or
//! `cargo bench --bench roundtrip -- [--quick] [--only TAG]`), not as a test.
//!
//! What it measures, all in one run on the same data:
//! 1. The machine's read-bandwidth floor: a sum over a 1 GiB buffer (≫ LLC), with 1 thread and
//!    with the engine's thread count, best of 5 passes.
//! 2. In-process CPU engine scan time per single query (k=10, ip) with 1 and N threads, next to
//!    the floor `table bytes / bandwidth`; and the batched kernel's per-query time.
//! 3. Round trip from a separate client process (this binary re-executed in client mode):
//!    p50/p99/p99.9 over many requests, with spinning (client and server spin windows of 1 s),
//!    futex-only waiting (both 0) and the options' default windows, for an empty table,
//!    10k×128, 100k×384 and 1M×128 f32, k=10.
//! 4. Idle CPU of `kalosd` after its spin window: utime+stime from /proc/<pid>/stat and the
//!    on-CPU nanoseconds from /proc/<pid>/task/*/schedstat over 3 s.
//! 5. Peers on the same .npy files, queries and k: numpy and faiss-cpu (benches/peers.py).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kalos::engine::cpu::CpuEngine;
use kalos::engine::Engine;
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::types::Filter;
use kalos::wire::SearchRequest;
use kalos::{Backend, Kalos, Metric, Options, RecallOptions, Role, UpsertOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const K: usize = 10;
const NQ: usize = 64;
const SPIN_NS: u64 = 1_000_000_000;

struct Config {
    tag: &'static str,
    rows: usize,
    dim: usize,
    /// Round trips per waiting mode.
    requests: usize,
    /// In-process scans per measurement.
    scans: usize,
}

fn configs(quick: bool) -> Vec<Config> {
    let q = |n: usize| if quick { (n / 10).max(20) } else { n };
    vec![
        Config { tag: "empty", rows: 0, dim: 128, requests: q(20_000), scans: 0 },
        Config { tag: "10k_128", rows: 10_000, dim: 128, requests: q(10_000), scans: q(2000) },
        Config { tag: "100k_384", rows: 100_000, dim: 384, requests: q(1000), scans: q(100) },
        Config { tag: "1M_128", rows: 1_000_000, dim: 128, requests: q(300), scans: q(30) },
    ]
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

// ------------------------------------------------------------------------------------------
// Read-bandwidth floor
// ------------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(x: &[f32]) -> f32 {
    sum_plain(x)
}

#[inline(always)]
fn sum_plain(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    let c = x.chunks_exact(32);
    for ch in c {
        for i in 0..32 {
            acc[i] += ch[i];
        }
    }
    acc.iter().sum()
}

fn sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        return unsafe { sum_avx2(x) };
    }
    sum_plain(x)
}

/// Nanoseconds for `threads` threads to sum disjoint parts of `buf` (spawn included, as in the engine).
fn timed_sum(buf: &[f32], threads: usize) -> f64 {
    let t0 = Instant::now();
    let per = buf.len().div_ceil(threads);
    let total: f32 = std::thread::scope(|s| {
        let hs: Vec<_> = buf.chunks(per).skip(1).map(|c| s.spawn(move || sum(c))).collect();
        sum(&buf[..per.min(buf.len())]) + hs.into_iter().map(|h| h.join().unwrap()).sum::<f32>()
    });
    std::hint::black_box(total);
    t0.elapsed().as_nanos() as f64
}

/// Best-of-5 read bandwidth (bytes/s) of `threads` threads summing disjoint parts of `buf`.
fn read_bandwidth(buf: &[f32], threads: usize) -> f64 {
    let mut best = 0.0f64;
    for _ in 0..5 {
        let per = buf.len() / threads;
        let t0 = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|i| s.spawn(move || sum(&buf[i * per..(i + 1) * per]))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(total);
        best = best.max((per * threads * 4) as f64 / dt);
    }
    best
}

// ------------------------------------------------------------------------------------------
// Client mode (separate process)
// ------------------------------------------------------------------------------------------

fn client_main(args: &[String]) {
    let name = &args[0];
    let n: usize = args[1].parse().unwrap();
    let spin: u64 = args[2].parse().unwrap();
    let dim: usize = args[3].parse().unwrap();
    let o = Options { role: Role::Client, client_spin_ns: spin, timeout_ms: 120_000, ..Options::default() };
    let c = Kalos::open(name, &o).expect("client open");
    let mut r = StdRng::seed_from_u64(7);
    let qs: Vec<f32> = (0..NQ * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let ro = RecallOptions::default();
    let (mut ids, mut scores) = (vec![0u64; K], vec![0f32; K]);
    let warm = (n / 10).clamp(10, 2000);
    for i in 0..warm {
        c.recall_into(&qs[(i % NQ) * dim..(i % NQ + 1) * dim], K, &ro, &mut ids, &mut scores).unwrap();
    }
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let q = &qs[(i % NQ) * dim..(i % NQ + 1) * dim];
        let t0 = Instant::now();
        c.recall_into(q, K, &ro, &mut ids, &mut scores).unwrap();
        lat.push(t0.elapsed().as_nanos() as f64);
    }
    let l = sorted(lat);
    let mean = l.iter().sum::<f64>() / l.len() as f64;
    println!("RESULT {} {} {} {} {}", l.len(), pct(&l, 0.5), pct(&l, 0.99), pct(&l, 0.999), mean);
}

/// How the client and the server wait: both spinning for a second, both sleeping at once, or
/// with the options' defaults (what a user gets).
#[derive(Clone, Copy)]
enum Wait {
    Spin,
    Futex,
    Default,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Futex => "futex",
            Wait::Default => "default",
        }
    }
}

/// Round trip through a server in this process and a client in a child process.
fn roundtrip(cfg: &Config, vecs: &[f32], threads: usize, wait: Wait) -> Option<[f64; 4]> {
    let name = format!("bench-{}-{}-{}", std::process::id(), cfg.tag, wait.name());
    let (server_spin, client_spin) = match wait {
        Wait::Spin => (SPIN_NS, SPIN_NS),
        Wait::Futex => (0, 0),
        Wait::Default => (Options::default().server_spin_ns, Options::default().client_spin_ns),
    };
    let o = Options {
        role: Role::Server,
        dim: cfg.dim as u32,
        metric: Metric::InnerProduct,
        backend: Backend::Cpu,
        capacity: cfg.rows.max(1) as u64,
        server_spin_ns: server_spin,
        threads: threads as u32,
        timeout_ms: 120_000,
        ..Options::default()
    };
    let s = Kalos::open(&name, &o).expect("server open");
    let chunk = 4096;
    for (ci, rows) in vecs.chunks(chunk * cfg.dim).enumerate() {
        let ids: Vec<u64> = (0..rows.len() / cfg.dim).map(|i| (ci * chunk + i) as u64).collect();
        s.upsert(&ids, rows, &UpsertOptions::default()).expect("upsert");
    }
    let st = s.stats().expect("stats");
    assert_eq!(st.count as usize, cfg.rows, "server holds every row");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["client", &name, &cfg.requests.to_string(), &client_spin.to_string(), &cfg.dim.to_string()])
        .output()
        .expect("spawn client");
    let text = String::from_utf8_lossy(&out.stdout);
    s.close();
    let line = text.lines().find(|l| l.starts_with("RESULT"));
    match line {
        Some(l) => {
            let f: Vec<f64> = l.split_whitespace().skip(2).map(|x| x.parse().unwrap()).collect();
            Some([f[0], f[1], f[2], f[3]])
        }
        None => {
            eprintln!("client failed: {}\n{}", text, String::from_utf8_lossy(&out.stderr));
            None
        }
    }
}

// ------------------------------------------------------------------------------------------
// In-process scan
// ------------------------------------------------------------------------------------------

fn build_store(vecs: &[f32], dim: usize) -> Store {
    let n = vecs.len() / dim;
    let mut st = Store::new(dim, Metric::InnerProduct, n, 0);
    for c0 in (0..n).step_by(4096) {
        let items: Vec<UpsertItem<'_>> = (c0..(c0 + 4096).min(n))
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
        st.apply_upsert(&items);
    }
    st
}

/// Per-query scan times in ns (sorted) for `nq`-query calls.
fn scan_times(e: &mut CpuEngine, st: &Store, qs: &[f32], nq: usize, iters: usize) -> Vec<f64> {
    let dim = st.dim();
    let f = Filter::all();
    let mut out = Vec::new();
    let mut lat = Vec::with_capacity(iters);
    for i in 0..iters + 3 {
        let q0 = (i * nq) % (NQ - nq + 1);
        let req = SearchRequest {
            queries: &qs[q0 * dim..(q0 + nq) * dim],
            nq,
            k: K,
            filter: &f,
            recency: None,
            now_ms: 0,
            direct: None,
            slot: None,
        };
        let t0 = Instant::now();
        e.search(st, &req, &mut out).unwrap();
        if i >= 3 {
            lat.push(t0.elapsed().as_nanos() as f64 / nq as f64);
        }
    }
    sorted(lat)
}

// ------------------------------------------------------------------------------------------
// Idle CPU of kalosd
// ------------------------------------------------------------------------------------------

fn proc_cpu(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" of the command name: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0) + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    let mut ns = 0u64;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                ns += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    (ticks, ns)
}

fn idle_cpu(kalosd: &Path, spin_us: u64) -> Option<String> {
    let name = format!("bench-idle-{}-{spin_us}", std::process::id());
    let mut child = Command::new(kalosd)
        .args(["serve", "--name", &name, "--dim", "8", "--metric", "ip", "--backend", "cpu", "--server-spin-us", &spin_us.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let o = Options { role: Role::Client, timeout_ms: 10_000, ..Options::default() };
    let t0 = Instant::now();
    let c = loop {
        match Kalos::open(&name, &o) {
            Ok(c) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                let _ = child.kill();
                return Some(format!("could not attach to kalosd: {e}"));
            }
        }
    };
    c.upsert(&[1], &[1.0; 8], &UpsertOptions::default()).ok()?;
    for _ in 0..100 {
        c.recall(&[1.0; 8], 1, &RecallOptions::default()).ok()?;
    }
    // Give the spin window 0.5 s to end, then watch for 3 s.
    std::thread::sleep(Duration::from_millis(500));
    let (t_a, ns_a) = proc_cpu(child.id());
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let (t_b, ns_b) = proc_cpu(child.id());
    let wall = w0.elapsed().as_secs_f64();
    drop(c);
    // SAFETY: kill takes no pointers; the pid is our own child's.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    let ms = (ns_b - ns_a) as f64 / 1e6;
    Some(format!(
        "idle kalosd --server-spin-us {spin_us}, over {wall:.2} s after its spin window: utime+stime {} ticks ({} ms at 100 Hz), on-CPU {ms:.3} ms from schedstat ({:.4}% of one core)",
        t_b - t_a,
        (t_b - t_a) * 10,
        100.0 * ms / 1e3 / wall
    ))
}

// ------------------------------------------------------------------------------------------

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd).args(args).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.first().map(|s| s.as_str()) == Some("client") {
        return client_main(&args[1..]);
    }
    if args.first().map(|s| s.as_str()) == Some("probe") {
        return probe(&args[1..]);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<String> = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1).cloned());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("KALOS_BENCH_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target/bench-data"));
    std::fs::create_dir_all(&dir).unwrap();

    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    println!("# Kalos CPU benchmark");
    println!("date      {}", sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]));
    println!("commit    {}", sh("git", &["-C", root.to_str().unwrap(), "rev-parse", "--short", "HEAD"]));
    println!("machine   {model}, {threads} cores, engine {}", CpuEngine::new(threads).describe());
    let served = CpuEngine::for_server(0, Options::default().server_spin_ns);
    println!(
        "server's engine {}: scans of at least {} KiB of vectors are split across threads",
        served.describe(),
        served.parallel_min_bytes() >> 10
    );
    drop(served);
    println!("k = {K}, metric ip, f32, queries uniform[-1,1], {} mode", if quick { "quick" } else { "full" });
    println!();

    // 1. Bandwidth floor.
    let buf: Vec<f32> = vec![1.0; 256 << 20]; // 1 GiB, touched by the fill
    let bw1 = read_bandwidth(&buf, 1);
    let bwn = read_bandwidth(&buf, threads);
    drop(buf);
    println!("read bandwidth (1 GiB sum, best of 5): 1 thread {:.1} GB/s, {threads} threads {:.1} GB/s", bw1 / 1e9, bwn / 1e9);
    println!();

    let mut table: Vec<String> = Vec::new();
    let mut scan_rows: Vec<String> = Vec::new();
    let mut r = StdRng::seed_from_u64(42);
    let mut tags = Vec::new();
    for cfg in configs(quick) {
        if only.as_deref().is_some_and(|o| o != cfg.tag) {
            continue;
        }
        let vecs: Vec<f32> = (0..cfg.rows * cfg.dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
        let mut qr = StdRng::seed_from_u64(7); // the client uses the same queries
        let qs: Vec<f32> = (0..NQ * cfg.dim).map(|_| qr.random_range(-1.0f32..1.0)).collect();
        if cfg.rows > 0 {
            kalos::npy::write_f32(&dir.join(format!("{}_x.npy", cfg.tag)), &[cfg.rows, cfg.dim], &vecs).unwrap();
            kalos::npy::write_f32(&dir.join(format!("{}_q.npy", cfg.tag)), &[NQ, cfg.dim], &qs).unwrap();
            tags.push(format!("{}:{}", cfg.tag, cfg.scans.max(20)));

            // 2. In-process scan.
            let st = build_store(&vecs, cfg.dim);
            let bytes = (cfg.rows * cfg.dim * 4) as f64;
            let mut e1 = CpuEngine::new(1);
            let mut en = CpuEngine::new(threads);
            // Interleaved rounds, so the floor and the scan see the same machine load: a plain
            // sum over the table's own memory (1 and N threads), then a single-query scan.
            let (mut f1, mut s1, mut f_n, mut sn) = (vec![], vec![], vec![], vec![]);
            for _ in 0..cfg.scans {
                f1.push(timed_sum(st.vectors(), 1));
                s1.push(scan_times(&mut e1, &st, &qs, 1, 1)[0]);
                f_n.push(timed_sum(st.vectors(), threads));
                sn.push(scan_times(&mut en, &st, &qs, 1, 1)[0]);
            }
            let (f1, s1, f_n, sn) = (sorted(f1), sorted(s1), sorted(f_n), sorted(sn));
            let b16 = scan_times(&mut en, &st, &qs, 16, (cfg.scans / 8).max(5));
            // Top-10 ids of query 0 for the peers to compare.
            let f = Filter::all();
            let mut out = Vec::new();
            en.search(
                &st,
                &SearchRequest { queries: &qs[..cfg.dim], nq: 1, k: K, filter: &f, recency: None, now_ms: 0, direct: None, slot: None },
                &mut out,
            )
            .unwrap();
            let ids: Vec<u64> = out[0].iter().map(|h| h.id).collect();
            kalos::npy::write_u64(&dir.join(format!("{}_ids.npy", cfg.tag)), &ids).unwrap();
            drop(st);
            let cell = |s: &[f64], f: &[f64]| {
                format!("{:.0} / {:.0} = {:.2}× (min {:.2}×)", pct(s, 0.5) / 1e3, pct(f, 0.5) / 1e3, pct(s, 0.5) / pct(f, 0.5), s[0] / f[0])
            };
            scan_rows.push(format!(
                "| {} | {:.1} MB | {} | {} | {:.1} | {:.1} GB/s |",
                cfg.tag,
                bytes / 1e6,
                cell(&s1, &f1),
                cell(&sn, &f_n),
                pct(&b16, 0.5) / 1e3,
                bytes / pct(&f_n, 0.5),
            ));
            println!("{}", scan_rows.last().unwrap());
        }
        // 3. Round trips.
        for wait in [Wait::Spin, Wait::Futex, Wait::Default] {
            if let Some([p50, p99, p999, mean]) = roundtrip(&cfg, &vecs, threads, wait) {
                let row = format!(
                    "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    cfg.tag,
                    wait.name(),
                    cfg.requests,
                    p50 / 1e3,
                    p99 / 1e3,
                    p999 / 1e3,
                    mean / 1e3
                );
                println!("{row}");
                table.push(row);
            }
        }
        let _ = std::io::stdout().flush();
    }

    // 4. Idle CPU.
    let kalosd = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("kalosd");
    let idle = if kalosd.exists() {
        [2000, 0].iter().map(|&us| idle_cpu(&kalosd, us).unwrap_or_else(|| "idle check failed".into())).collect::<Vec<_>>().join("\n")
    } else {
        format!("{} not built; run `cargo build --release --bin kalosd`", kalosd.display())
    };

    // 5. Peers.
    let lib = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("libkalos.so");
    let peers = Command::new("python3")
        .env("KALOS_LIB", &lib)
        .arg(root.join("benches/peers.py"))
        .arg(&dir)
        .args(&tags)
        .output()
        .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .unwrap_or_else(|e| format!("python3 not available: {e}"));

    println!();
    println!("## Round trip from a separate process (µs), k={K}");
    println!("| table | waiting | requests | p50 | p99 | p99.9 | mean |");
    println!("|---|---|---|---|---|---|---|");
    for r in &table {
        println!("{r}");
    }
    println!();
    println!("## In-process CPU scan, single query k={K}: scan p50 / floor p50 (µs); floor = plain sum over the same table, interleaved");
    println!(
        "| table | bytes | 1 thread | {threads} threads | batch of 16, µs per query ({threads} thr) | floor bandwidth ({threads} thr) |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &scan_rows {
        println!("{r}");
    }
    println!();
    println!("## Peers (same data, queries, k; single query p50 / p99 in µs)");
    print!("{peers}");
    println!();
    println!("## Idle server");
    println!("{idle}");
}

/// `probe ROWS DIM`: alternates a plain sum over the table and single-thread scans (min of 10
/// each), the quickest A/B under a noisy machine.
fn probe(args: &[String]) {
    let rows: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dim: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(384);
    let mut r = StdRng::seed_from_u64(42);
    let vecs: Vec<f32> = (0..rows * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let qs: Vec<f32> = (0..NQ * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let st = build_store(&vecs, dim);
    drop(vecs);
    let mut e = CpuEngine::new(1);
    let mut es: Vec<CpuEngine> = kalos::engine::cpu::Isa::available().into_iter().map(|i| CpuEngine::with_isa(1, i)).collect();
    let (mut bs, mut bt) = (f64::MAX, f64::MAX);
    let mut bi = vec![f64::MAX; es.len()];
    for _ in 0..10 {
        let t0 = Instant::now();
        std::hint::black_box(sum(st.vectors()));
        bs = bs.min(t0.elapsed().as_secs_f64() * 1e6);
        bt = bt.min(scan_times(&mut e, &st, &qs, 1, 1)[0] / 1e3);
        for (i, e) in es.iter_mut().enumerate() {
            bi[i] = bi[i].min(scan_times(e, &st, &qs, 1, 1)[0] / 1e3);
        }
    }
    println!("probe {rows}x{dim}: sum {bs:.0} us, scan {bt:.0} us, ratio {:.2}", bt / bs);
    for (i, e) in es.iter().enumerate() {
        println!("  {}: {:.0} us", e.describe(), bi[i]);
    }
    for nq in [4usize, 16, 64] {
        let b = scan_times(&mut e, &st, &qs, nq, 5)[0] / 1e3;
        println!("  batch {nq} x1: {b:.1} us/query, {:.2} GFLOP/s", 2.0 * (rows * dim) as f64 / b / 1e3);
    }
}
