//! kalosd: serve a Kalos store from the command line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kalos::npy::{self, NpyData};
use kalos::*;

mod data;
mod doctor;

const HELP: &str = "\
kalosd: serve a Kalos memory store over POSIX shared memory.

USAGE:
  kalosd serve --name NAME --dim D [options]   create the store and serve until SIGTERM/SIGINT
  kalosd stats --name NAME                     print the statistics of a running store
  kalosd import (--data-dir DIR | --name NAME) --dim D --vectors V.npy [--ids I.npy]
                [--namespaces N.npy] [--payloads P.jsonl] [--metric M]
                                               bulk-load memories (see docs/FORMATS.md)
  kalosd export --data-dir DIR --vectors V.npy --ids I.npy [--namespaces N.npy]
                [--payloads P.jsonl] [--dtype f32|f16]
                                               write every memory of a stopped store's data dir
  kalosd repair --data-dir DIR                 recover what is intact after corruption
  kalosd doctor [--compile] [--arch sm_XX]...  what this machine offers: driver, CUDA version,
                                               NVRTC (version and path), GPUs, /dev/shm space;
                                               --compile also compiles every kernel variant the
                                               engine can request (sm_80, sm_90 and the GPU's
                                               own, or each --arch) and exits 0 only when all
                                               compiled; needs NVRTC, no GPU
  kalosd --help                                this text

SERVE OPTIONS:
  --name NAME            store name: 1-200 chars of [A-Za-z0-9._-] (segment /dev/shm/kalos.NAME)
  --dim D                vector dimension (required)
  --metric M             ip | cosine | l2                       (default cosine)
  --capacity N           maximum number of memories             (default 1048576)
  --dtype T              f32 | f16 | bf16 (GPU table storage)   (default f32)
  --backend B            cpu | cuda | auto                      (default auto; env KALOS_BACKEND)
  --load FILE.npy        vectors to load at start: float32/float16, shape (n, D)
  --ids FILE.npy         ids for --load: uint64/int64, shape (n,)  (default 0..n-1)
  --namespaces FILE.npy  namespaces for --load: uint64, shape (n,) (default all 0)
  --synthetic N          fill with N synthetic memories instead: clustered unit vectors,
                         ids 0..N-1, namespace = id % 100 (a user), payload text per memory
  --seed S               seed for --synthetic                   (default: time)
  --data-dir DIR         write-ahead log + snapshots directory (default: memory only)
  --sync P               always | interval | never               (default always)
  --sync-interval-ms MS  fsync interval for --sync interval       (default 100)
  --slots N              request slots                           (default 32)
  --slot-bytes N         bytes per slot                          (default 1048576)
  --max-payload N        largest payload in bytes                (default 65536)
  --threads N            CPU engine threads, 0 = all cores       (default 0)
  --server-spin-us US    busy-poll window after a request        (default 2000)
  --mode OCTAL           segment permissions                     (default 600)
  --stats-every S        print stats every S seconds (0 = never) (default 0)

IMPORT / EXPORT / REPAIR (docs/DURABILITY.md, docs/FORMATS.md):
  import --data-dir works offline on a directory no server holds (LOCKED otherwise): it recovers
  the directory, adds the rows and commits them with one new snapshot, so an import is
  all-or-nothing. import --name sends the rows to a running server through a client (the server
  stamps creation times; rows are acknowledged chunk by chunk). Rows whose expires_ms has passed
  are skipped and counted. export needs the directory offline too. repair keeps the intact
  prefix, moves the original files to DIR/repair-<unix ms>/ and prints what it found.

On SIGTERM or SIGINT the server stops cleanly: pending requests get SERVER_GONE, the segment is
removed, the data directory (if any) is synced, and final stats are printed.
Exit status: 0 on a clean stop, 1 on a usage error, 2 when the store cannot be served.
";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

struct Args {
    v: Vec<String>,
}

impl Args {
    fn get(&self, key: &str) -> Option<&str> {
        self.v.iter().position(|a| a == key).and_then(|i| self.v.get(i + 1)).map(|s| s.as_str())
    }
    fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> T {
        match self.get(key) {
            None => default,
            Some(s) => s.parse().unwrap_or_else(|_| usage(&format!("{key} expects a number, got {s:?}"))),
        }
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("kalosd: {msg}\n\n{HELP}");
    std::process::exit(1)
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("kalosd: {e}");
    std::process::exit(2)
}

fn print_stats(s: &Stats) {
    println!(
        "count={} capacity={} dim={} engine={} requests={} queries={} batches={} errors={} p50_us={:.1} p99_us={:.1} queue_depth={} payload_bytes={} uptime_ms={} fallbacks={}",
        s.count,
        s.capacity,
        s.dim,
        s.engine_name,
        s.requests,
        s.queries,
        s.batches,
        s.errors,
        s.p50_ns as f64 / 1e3,
        s.p99_ns as f64 / 1e3,
        s.queue_depth,
        s.payload_bytes,
        s.uptime_ms,
        s.engine_fallbacks
    );
}

/// Deterministic synthetic memories: 64 topic centroids, each memory a noisy copy of one, so
/// recall has real structure to find (near neighbours share a topic).
fn synthetic(k: &Kalos, n: usize, dim: usize, seed: u64) -> Result<usize> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let topics = 64;
    let centroids: Vec<f32> = (0..topics * dim).map(|_| rnd() as f32).collect();
    const WORDS: [&str; 8] = ["prefers", "mentioned", "asked about", "is allergic to", "works on", "visited", "likes", "plans"];
    const THINGS: [&str; 8] = ["green tea", "Rust", "Lisbon", "peanuts", "the Q3 report", "jazz", "hiking", "a trip to Kyoto"];
    let chunk = 2048;
    let mut i = 0;
    while i < n {
        let j = (i + chunk).min(n);
        let mut vecs = Vec::with_capacity((j - i) * dim);
        let mut ns = Vec::with_capacity(j - i);
        let mut texts = Vec::with_capacity(j - i);
        for id in i..j {
            let t = id % topics;
            for d in 0..dim {
                vecs.push(centroids[t * dim + d] + 0.35 * rnd() as f32);
            }
            ns.push((id % 100) as u64);
            texts.push(format!("user {} {} {} (memory {id}, topic {t})", id % 100, WORDS[t % 8], THINGS[(t / 8) % 8]).into_bytes());
        }
        let ids: Vec<u64> = (i as u64..j as u64).collect();
        let payloads: Vec<Option<&[u8]>> = texts.iter().map(|t| Some(t.as_slice())).collect();
        let o = UpsertOptions { namespaces: Namespaces::PerItem(&ns), payloads: Some(payloads), ..Default::default() };
        k.upsert(&ids, &vecs, &o)?;
        i = j;
    }
    Ok(n)
}

fn load(k: &Kalos, a: &Args, dim: usize) -> Result<usize> {
    if let Some(n) = a.get("--synthetic") {
        let n: usize = n.parse().unwrap_or_else(|_| usage("--synthetic expects a count"));
        let seed =
            a.num("--seed", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
        return synthetic(k, n, dim, seed);
    }
    let Some(vp) = a.get("--load") else { return Ok(0) };
    let (vals, n) = data::read_vectors(vp, dim)?;
    let ids: Vec<u64> = match a.get("--ids") {
        None => (0..n as u64).collect(),
        Some(p) => match npy::read(&PathBuf::from(p))?.data {
            NpyData::U64(x) if x.len() == n => x,
            _ => return Err(Error::new(Status::InvalidArgument, format!("{p}: ids must be {n} uint64/int64 values"))),
        },
    };
    let ns: Option<Vec<u64>> = match a.get("--namespaces") {
        None => None,
        Some(p) => match npy::read(&PathBuf::from(p))?.data {
            NpyData::U64(x) if x.len() == n => Some(x),
            _ => return Err(Error::new(Status::InvalidArgument, format!("{p}: namespaces must be {n} uint64 values"))),
        },
    };
    let chunk = 4096;
    let mut i = 0;
    while i < n {
        let j = (i + chunk).min(n);
        let mut o = UpsertOptions::default();
        if let Some(ns) = &ns {
            o.namespaces = Namespaces::PerItem(&ns[i..j]);
        }
        k.upsert(&ids[i..j], &vals[i * dim..j * dim], &o)?;
        i = j;
    }
    Ok(n)
}

fn serve(a: &Args) {
    let name = a.get("--name").unwrap_or_else(|| usage("serve needs --name"));
    let dim: u32 = a.num("--dim", 0);
    if dim == 0 {
        usage("serve needs --dim");
    }
    let mut o = Options { role: Role::Server, dim, ..Options::default() };
    if let Some(m) = a.get("--metric") {
        o.metric = Metric::parse(m).unwrap_or_else(|e| usage(&e.message));
    }
    if let Some(t) = a.get("--dtype") {
        o.dtype = Dtype::parse(t).unwrap_or_else(|e| usage(&e.message));
    }
    if let Some(b) = a.get("--backend") {
        o.backend = Backend::parse(b).unwrap_or_else(|e| usage(&e.message));
    }
    if let Some(s) = a.get("--sync") {
        o.sync = match s {
            "always" => SyncPolicy::Always,
            "interval" => SyncPolicy::Interval,
            "never" => SyncPolicy::Never,
            _ => usage("--sync is always, interval or never"),
        };
    }
    o.capacity = a.num("--capacity", o.capacity);
    o.slots = a.num("--slots", o.slots);
    o.slot_bytes = a.num("--slot-bytes", o.slot_bytes);
    o.max_payload_bytes = a.num("--max-payload", o.max_payload_bytes);
    o.threads = a.num("--threads", o.threads);
    o.sync_interval_ms = a.num("--sync-interval-ms", o.sync_interval_ms);
    o.server_spin_ns = a.num::<u64>("--server-spin-us", o.server_spin_ns / 1000) * 1000;
    if let Some(m) = a.get("--mode") {
        o.mode = u32::from_str_radix(m, 8).unwrap_or_else(|_| usage("--mode expects octal, e.g. 600"));
    }
    o.data_dir = a.get("--data-dir").map(PathBuf::from);
    let stats_every: u64 = a.num("--stats-every", 0);

    // SAFETY: installing async-signal-safe handlers that only store to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let k = Kalos::open(name, &o).unwrap_or_else(|e| fail(e));
    match load(&k, a, dim as usize) {
        Ok(0) => {}
        Ok(n) => eprintln!("kalosd: loaded {n} vectors"),
        Err(e) => {
            k.close();
            fail(e)
        }
    }
    let s = k.stats().unwrap_or_else(|e| fail(e));
    println!(
        "kalosd: serving {name:?} dim={dim} metric={} count={} engine={} pid={}",
        o.metric.name(),
        s.count,
        s.engine_name,
        std::process::id()
    );
    if !s.fallback_reason.is_empty() {
        eprintln!("kalosd: serving from the CPU engine: {}", s.fallback_reason);
    }
    let mut ticks = 0u64;
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        ticks += 1;
        if stats_every > 0 && ticks.is_multiple_of(stats_every * 20) {
            if let Ok(s) = k.stats() {
                print_stats(&s);
            }
        }
    }
    if let Ok(s) = k.stats() {
        print_stats(&s);
    }
    k.close();
    println!("kalosd: stopped");
}

fn stats(a: &Args) {
    let name = a.get("--name").unwrap_or_else(|| usage("stats needs --name"));
    let o = Options { role: Role::Client, timeout_ms: 2000, ..Options::default() };
    let k = Kalos::open(name, &o).unwrap_or_else(|e| fail(e));
    let s = k.stats().unwrap_or_else(|e| fail(e));
    print_stats(&s);
}

fn main() {
    let v: Vec<String> = std::env::args().skip(1).collect();
    if v.is_empty() || v.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return;
    }
    let a = Args { v: v[1..].to_vec() };
    match v[0].as_str() {
        "serve" => serve(&a),
        "stats" => stats(&a),
        "import" => data::import(&a),
        "export" => data::export(&a),
        "repair" => data::repair(&a),
        "doctor" => std::process::exit(doctor::run(&a.v)),
        c => usage(&format!("unknown command {c:?}")),
    }
}
