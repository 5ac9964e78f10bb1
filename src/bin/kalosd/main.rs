//! kalosd: serve a Kalos store from the command line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Parser, Subcommand};
use kalos::npy::{self, NpyData};
use kalos::*;

#[cfg(feature = "cluster")]
mod cluster;
mod data;
mod doctor;
mod json;
mod metrics;
mod query;

/// kalosd: serve a Kalos memory store over POSIX shared memory.
///
/// Exit status: 0 on success (a clean stop), 1 when the command fails (the store cannot be
/// served, a file is bad), 2 on a usage error (an unknown or malformed option).
/// Logs go to stderr, one `key=value` line per event; `KALOS_LOG` sets the level
/// (`error`, `warn`, `info` (default), `debug`, `trace`, or per module: `kalosd=debug`).
#[derive(Parser, Debug)]
#[command(name = "kalosd", version, about = "Serve a Kalos memory store over POSIX shared memory", long_about = None)]
#[command(after_help = "Exit status: 0 on success, 1 when the command fails, 2 on a usage error.\n\
    Logs: stderr, one key=value line per event; KALOS_LOG=error|warn|info|debug|trace sets the level (default info).\n\
    Formats: docs/FORMATS.md; durability: docs/DURABILITY.md; configuration: docs/CONFIG.md.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the store and serve it until SIGTERM or SIGINT
    ///
    /// On SIGTERM or SIGINT the server stops cleanly: pending requests get SERVER_GONE, the
    /// segment is removed, the data directory (if any) is synced, and final stats are printed.
    Serve(Box<ServeArgs>),
    /// Print the statistics of a running store
    Stats(StatsArgs),
    /// Bulk-load memories into a data directory (offline) or a running store (docs/FORMATS.md)
    ///
    /// --data-dir works offline on a directory no server holds (LOCKED otherwise): it recovers
    /// the directory, adds the rows and commits them with one new snapshot, so an import is
    /// all-or-nothing. --name sends the rows to a running server through a client (the server
    /// stamps creation times; rows are acknowledged chunk by chunk). Rows whose expires_ms has
    /// passed are skipped and counted.
    Import(data::ImportArgs),
    /// Write every memory of a stopped store's data directory to .npy and .jsonl files
    Export(data::ExportArgs),
    /// Recover what is intact of a damaged data directory
    ///
    /// Keeps the intact prefix, moves the original files to `DIR/repair-<unix ms>/` and prints
    /// what it found.
    Repair(data::RepairArgs),
    /// Send JSON-lines requests to a running store: recall, upsert, delete, get (with filters)
    ///
    /// Reads one request object per line from stdin and writes one response object per line to
    /// stdout, e.g. {"op": "recall", "query": [..], "k": 5, "filter": {"user": "ann"}} or
    /// {"op": "delete", "filter": {"n": {"$lt": 3}}}. Exits 1 when any request failed.
    Query(query::QueryArgs),
    /// Show what this machine offers: driver, CUDA version, NVRTC, GPUs, /dev/shm space
    ///
    /// --compile also compiles every kernel variant the engine can request (sm_80, sm_90 and
    /// the GPU's own, or each --arch) and exits 0 only when all compiled; it needs NVRTC, no GPU.
    Doctor(DoctorArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Store name: 1-200 chars of [A-Za-z0-9._-] (segment /dev/shm/kalos.NAME)
    #[arg(long)]
    name: String,
    /// Vector dimension
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    dim: u32,
    /// Similarity: ip, cosine or l2
    #[arg(long, default_value = "cosine", value_parser = parse_metric)]
    metric: Metric,
    /// Maximum number of memories
    #[arg(long, default_value_t = Options::default().capacity)]
    capacity: u64,
    /// GPU table storage: f32, f16 or bf16
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// Engine: cpu, cuda or auto (with auto, KALOS_BACKEND decides)
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    backend: Backend,
    /// Scan: exact, or int8 (8-bit scan of a quantized copy, the best --rerank candidates
    /// re-scored exactly; CPU engine)
    #[arg(long, default_value = "exact", value_parser = parse_scan)]
    scan: Scan,
    /// Candidates re-scored exactly per query with --scan int8 (0 = adapt to k: max(8k, 64))
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=kalos::config::MAX_RERANK as i64))]
    rerank: u32,
    /// Split the table into N shards, each with its own engine and thread, scanned in parallel
    /// and merged exactly (0 = one table, or one per GPU of --gpus)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=kalos::config::MAX_DEVICE_SHARDS as i64))]
    device_shards: u32,
    /// GPUs of a CUDA store: all, or a list of device ordinals (e.g. 0,1); more than one
    /// shards the table over them (default: device 0)
    #[arg(long, value_parser = parse_gpus)]
    gpus: Option<u64>,
    /// Shard placement: id (balanced) or namespace (namespace-scoped recalls scan only the
    /// shards that hold those namespaces)
    #[arg(long, default_value = "id", value_parser = parse_placement)]
    placement: Placement,
    /// Vectors to load at start: float32/float16 .npy of shape (n, D)
    #[arg(long, value_name = "FILE.npy", conflicts_with = "synthetic")]
    load: Option<PathBuf>,
    /// Ids for --load: uint64/int64 .npy of shape (n,) (default 0..n-1)
    #[arg(long, value_name = "FILE.npy", requires = "load")]
    ids: Option<PathBuf>,
    /// Namespaces for --load: uint64 .npy of shape (n,) (default all 0)
    #[arg(long, value_name = "FILE.npy", requires = "load")]
    namespaces: Option<PathBuf>,
    /// Fill with N synthetic memories: clustered unit vectors, ids 0..N-1, namespace = id % 100
    #[arg(long, value_name = "N")]
    synthetic: Option<usize>,
    /// Seed for --synthetic (default: the time)
    #[arg(long, requires = "synthetic")]
    seed: Option<u64>,
    /// Write-ahead log + snapshots directory (default: memory only)
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// WAL fsync policy: always, interval or never
    #[arg(long, default_value = "always", value_parser = parse_sync)]
    sync: SyncPolicy,
    /// fsync interval for --sync interval, ms
    #[arg(long, default_value_t = Options::default().sync_interval_ms)]
    sync_interval_ms: u64,
    /// Request slots (requests in flight at once)
    #[arg(long, default_value_t = Options::default().slots)]
    slots: u32,
    /// Bytes per slot: bounds one request or response
    #[arg(long, default_value_t = Options::default().slot_bytes)]
    slot_bytes: u32,
    /// Largest payload in bytes
    #[arg(long, default_value_t = Options::default().max_payload_bytes)]
    max_payload: u32,
    /// CPU engine threads, 0 = all cores
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Server busy-poll window after a request, µs
    #[arg(long, default_value_t = Options::default().server_spin_ns / 1000)]
    server_spin_us: u64,
    /// Segment permissions, octal
    #[arg(long, default_value = "600", value_parser = parse_mode)]
    mode: u32,
    /// Log the stats every S seconds (0 = never)
    #[arg(long, default_value_t = 0, value_name = "S")]
    stats_every: u64,
    /// Serve Prometheus metrics over HTTP at ADDR (GET /metrics), e.g. 127.0.0.1:9464
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Cluster mode: replicate and shard the store through NATS JetStream at these URLs
    /// (comma-separated, e.g. nats://10.0.0.1:4222,nats://10.0.0.2:4222; docs/CLUSTER.md)
    #[arg(long, value_name = "URLS", requires_all = ["shards", "node"], conflicts_with_all = ["load", "synthetic"])]
    cluster: Option<String>,
    /// Cluster mode: the shards this host holds, e.g. 0,2
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "cluster")]
    shards: Vec<u32>,
    /// Cluster mode: the store's shard count (the same on every host)
    #[arg(long, default_value_t = 3, value_name = "S", requires = "cluster")]
    shard_count: u32,
    /// Cluster mode: the store's name in the cluster, the same on every host (default: --name;
    /// hosts sharing a machine need distinct --name values)
    #[arg(long, value_name = "NAME", requires = "cluster", value_parser = parse_cluster_store)]
    cluster_store: Option<String>,
    /// Cluster mode: this host's name, unique in the cluster (its consumers are named for it)
    #[arg(long, value_name = "NAME", requires = "cluster", value_parser = parse_cluster_store)]
    node: Option<String>,
    /// Cluster mode: JetStream replicas of each shard's log (1 to 5; odd)
    #[arg(long, default_value_t = 3, requires = "cluster")]
    replicas: usize,
    /// Cluster mode: how long a write waits for the log's acknowledgement, ms (then UNAVAILABLE); keep it below the clients' deadline (5 s by default)
    #[arg(long, default_value_t = 4000, requires = "cluster")]
    write_timeout_ms: u64,
}

#[derive(clap::Args, Debug)]
struct StatsArgs {
    /// Store name
    #[arg(long)]
    name: String,
    /// Print one JSON object instead of key=value pairs
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// Also compile every kernel variant with the NVRTC found
    #[arg(long)]
    compile: bool,
    /// With --compile: only the smallest and the largest dimension class of each kernel module,
    /// dtype and metric (about a third of the compile time)
    #[arg(long, requires = "compile")]
    quick: bool,
    /// Architecture to compile for (repeatable), e.g. sm_90
    #[arg(long, value_parser = parse_arch)]
    arch: Vec<String>,
}

fn parse_metric(s: &str) -> std::result::Result<Metric, String> {
    Metric::parse(s).map_err(|e| e.message)
}
fn parse_dtype(s: &str) -> std::result::Result<Dtype, String> {
    Dtype::parse(s).map_err(|e| e.message)
}
fn parse_scan(s: &str) -> std::result::Result<Scan, String> {
    Scan::parse(s).map_err(|e| e.message)
}
fn parse_gpus(s: &str) -> std::result::Result<u64, String> {
    if s == "all" {
        return Ok(kalos::config::GPUS_ALL);
    }
    let mut mask = 0u64;
    for part in s.split(',') {
        match part.trim().parse::<u32>() {
            Ok(d) if d < 64 => mask |= 1 << d,
            _ => return Err(format!("expected all or device ordinals 0-63 separated by commas, got {part:?}")),
        }
    }
    Ok(mask)
}
fn parse_placement(s: &str) -> std::result::Result<Placement, String> {
    Placement::parse(s).map_err(|e| e.message)
}
fn parse_backend(s: &str) -> std::result::Result<Backend, String> {
    Backend::parse(s).map_err(|e| e.message)
}
fn parse_sync(s: &str) -> std::result::Result<SyncPolicy, String> {
    match s {
        "always" => Ok(SyncPolicy::Always),
        "interval" => Ok(SyncPolicy::Interval),
        "never" => Ok(SyncPolicy::Never),
        _ => Err("expected always, interval or never".into()),
    }
}
fn parse_mode(s: &str) -> std::result::Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m & !0o777 == 0 => Ok(m),
        _ => Err("expected octal permission bits, e.g. 600".into()),
    }
}
fn parse_arch(s: &str) -> std::result::Result<String, String> {
    if s.starts_with("sm_") && s.len() > 3 && s[3..].bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_string())
    } else {
        Err("expected an architecture such as sm_90".into())
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Logs the failure and exits with status 1.
fn fail(e: impl std::fmt::Display) -> ! {
    log::error!("{e}");
    std::process::exit(1)
}

/// Logs as `ts_ms=… level=… target=… msg="…"` lines on stderr, filtered by `KALOS_LOG`.
fn init_logs() {
    use std::io::Write;
    env_logger::Builder::new()
        .parse_filters(&std::env::var("KALOS_LOG").unwrap_or_else(|_| "info".into()))
        .format(|f, r| {
            let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            writeln!(f, "ts_ms={ts} level={} target={} msg={:?}", r.level().as_str().to_lowercase(), r.target(), r.args().to_string())
        })
        .target(env_logger::Target::Stderr)
        .init();
}

fn print_stats(s: &Stats) {
    println!(
        "count={} capacity={} dim={} engine={} requests={} queries={} batches={} errors={} p50_us={:.1} p99_us={:.1} queue_depth={} payload_bytes={} uptime_ms={} fallbacks={} rerank_queries={} rerank_uncertain={}",
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
        s.engine_fallbacks,
        s.rerank_queries,
        s.rerank_uncertain
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

/// The stats as one JSON object (`kalosd stats --json`).
fn stats_json(s: &Stats) -> serde_json::Value {
    serde_json::json!({
        "count": s.count,
        "capacity": s.capacity,
        "dim": s.dim,
        "metric": Metric::from_u32(s.metric as u32).map(|m| m.name()).unwrap_or("unknown"),
        "engine": s.engine_name,
        "fallback_reason": s.fallback_reason,
        "engine_fallbacks": s.engine_fallbacks,
        "requests": s.requests,
        "queries": s.queries,
        "batches": s.batches,
        "errors": s.errors,
        "p50_us": s.p50_ns as f64 / 1e3,
        "p99_us": s.p99_ns as f64 / 1e3,
        "queue_depth": s.queue_depth,
        "payload_bytes": s.payload_bytes,
        "uptime_ms": s.uptime_ms,
        "server_pid": s.server_pid,
        "wal_bytes": s.wal_bytes,
        "rerank_queries": s.rerank_queries,
        "rerank_uncertain": s.rerank_uncertain,
        "last_snapshot_unix_ms": (s.last_snapshot_unix_ms != 0).then_some(s.last_snapshot_unix_ms),
        "requests_by": s.requests_by.iter().map(|c| serde_json::json!({
            "op": op_name(c.op),
            "status": Status::from_u32(c.status).name(),
            "count": c.count,
        })).collect::<Vec<_>>(),
    })
}

fn load(k: &Kalos, a: &ServeArgs, dim: usize) -> Result<usize> {
    if let Some(n) = a.synthetic {
        let seed = a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        });
        return synthetic(k, n, dim, seed);
    }
    let Some(vp) = &a.load else { return Ok(0) };
    let (vals, n) = data::read_vectors(vp, dim)?;
    let ids: Vec<u64> = match &a.ids {
        None => (0..n as u64).collect(),
        Some(p) => match npy::read(p)?.data {
            NpyData::U64(x) if x.len() == n => x,
            _ => return Err(Error::new(Status::InvalidArgument, format!("{}: ids must be {n} uint64/int64 values", p.display()))),
        },
    };
    let ns: Option<Vec<u64>> = match &a.namespaces {
        None => None,
        Some(p) => match npy::read(p)?.data {
            NpyData::U64(x) if x.len() == n => Some(x),
            _ => return Err(Error::new(Status::InvalidArgument, format!("{}: namespaces must be {n} uint64 values", p.display()))),
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

/// Opens the store as its server: in cluster mode through the NATS layer, which then gets an
/// internal client handle on the store.
fn open_store(name: &str, o: &Options, a: &ServeArgs) -> Kalos {
    let Some(url) = &a.cluster else { return Kalos::open(name, o).unwrap_or_else(|e| fail(e)) };
    #[cfg(feature = "cluster")]
    {
        let cfg = cluster::Config {
            store: a
                .cluster_store
                .clone()
                .map_or_else(|| parse_cluster_store(name), Ok)
                .unwrap_or_else(|e| fail(format!("--cluster-store (default --name): {e}"))),
            url: url.clone(),
            shards: a.shard_count,
            hold: a.shards.clone(),
            node: a.node.clone().unwrap_or_default(),
            replicas: a.replicas,
            write_timeout: Duration::from_millis(a.write_timeout_ms),
            metric: a.metric,
        };
        let layer = cluster::Layer::start(cfg).unwrap_or_else(|e| fail(e));
        let k = Kalos::open_cluster_server(name, o, layer.clone()).unwrap_or_else(|e| fail(e));
        let internal = Options { role: Role::Client, timeout_ms: 30_000, ..Options::default() };
        layer.set_local(std::sync::Arc::new(Kalos::open(name, &internal).unwrap_or_else(|e| fail(e))));
        log::info!("cluster: {url} node={} shards={:?} of {}", a.node.as_deref().unwrap_or(""), a.shards, a.shard_count);
        k
    }
    #[cfg(not(feature = "cluster"))]
    fail(format!("--cluster {url}: this kalosd was built without the cluster feature"))
}

/// A cluster store name: it becomes part of NATS subjects and stream names.
fn parse_cluster_store(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(format!("{s:?}: 1 to 64 characters of [A-Za-z0-9_-]"));
    }
    Ok(s.to_string())
}

fn serve(a: &ServeArgs) {
    let name = a.name.as_str();
    let dim = a.dim;
    let o = Options {
        role: Role::Server,
        dim,
        metric: a.metric,
        dtype: a.dtype,
        backend: a.backend,
        scan: a.scan,
        rerank: a.rerank,
        device_shards: a.device_shards,
        placement: a.placement,
        gpus: a.gpus.unwrap_or(0),
        sync: a.sync,
        capacity: a.capacity,
        slots: a.slots,
        slot_bytes: a.slot_bytes,
        max_payload_bytes: a.max_payload,
        threads: a.threads,
        sync_interval_ms: a.sync_interval_ms,
        server_spin_ns: a.server_spin_us.saturating_mul(1000),
        mode: a.mode,
        data_dir: a.data_dir.clone(),
        ..Options::default()
    };

    // SAFETY: installing async-signal-safe handlers that only store to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let k = std::sync::Arc::new(open_store(name, &o, a));
    match load(&k, a, dim as usize) {
        Ok(0) => {}
        Ok(n) => log::info!("loaded {n} vectors"),
        Err(e) => {
            k.close();
            fail(e)
        }
    }
    let s = k.stats().unwrap_or_else(|e| fail(e));
    let metrics = match a.metrics {
        None => None,
        Some(addr) => match metrics::Endpoint::start(addr, k.clone(), &STOP) {
            Ok(m) => {
                log::info!("metrics at http://{}/metrics", m.addr());
                Some(m)
            }
            Err(e) => {
                k.close();
                fail(format!("--metrics {addr}: {e}"))
            }
        },
    };
    // The first line on stdout says the store serves (scripts and tests wait for it).
    println!(
        "kalosd: serving {name:?} dim={dim} metric={} count={} engine={} pid={}",
        o.metric.name(),
        s.count,
        s.engine_name,
        std::process::id()
    );
    log::info!(
        "serving {name:?} dim={dim} metric={} count={} engine={} pid={}",
        o.metric.name(),
        s.count,
        s.engine_name,
        std::process::id()
    );
    if !s.fallback_reason.is_empty() {
        log::warn!("serving from the CPU engine: {}", s.fallback_reason);
    }
    let mut ticks = 0u64;
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        ticks += 1;
        if a.stats_every > 0 && ticks.is_multiple_of(a.stats_every * 20) {
            if let Ok(s) = k.stats() {
                print_stats(&s);
            }
        }
    }
    log::info!("stopping");
    if let Some(m) = metrics {
        m.stop();
    }
    if let Ok(s) = k.stats() {
        print_stats(&s);
    }
    k.close();
    println!("kalosd: stopped");
}

fn stats(a: &StatsArgs) {
    let o = Options { role: Role::Client, timeout_ms: 2000, ..Options::default() };
    let k = Kalos::open(&a.name, &o).unwrap_or_else(|e| fail(e));
    let s = k.stats().unwrap_or_else(|e| fail(e));
    if a.json {
        println!("{}", stats_json(&s));
    } else {
        print_stats(&s);
    }
}

fn main() {
    let cli = Cli::parse();
    init_logs();
    match cli.cmd {
        Cmd::Serve(a) => serve(&a),
        Cmd::Stats(a) => stats(&a),
        Cmd::Import(a) => data::import(&a),
        Cmd::Export(a) => data::export(&a),
        Cmd::Repair(a) => data::repair(&a),
        Cmd::Query(a) => std::process::exit(query::run(&a)),
        Cmd::Doctor(a) => std::process::exit(doctor::run(a.compile, a.quick, a.arch)),
    }
}
