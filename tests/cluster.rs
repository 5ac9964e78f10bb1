//! Cluster mode end to end (docs/CLUSTER.md), on one machine: 3 nats-server processes forming a
//! JetStream cluster, and kalosd processes with separate store names and data directories.
//!
//! Needs `nats-server` (v2.15.3, `go install github.com/nats-io/nats-server/v2@v2.15.3`): on
//! PATH, in `$(go env GOPATH)/bin`, or named by `KALOS_NATS_SERVER`. Without it the tests say so
//! and pass, except under CI (`CI` set), where they fail.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kalos::wire::cluster::shard_of;
use kalos::{Hit, Kalos, Metric, Namespaces, Options, RecallOptions, Role, Status, UpsertOptions};

const DIM: usize = 8;
const SHARDS: u32 = 3;
/// Which shards each host holds: every shard on two hosts, every host missing one.
const HOLD: [&str; 3] = ["0,1", "1,2", "2,0"];

/// The tests are heavy (6 servers each): one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn nats_server() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KALOS_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(gp) = Command::new("go").args(["env", "GOPATH"]).output().ok().filter(|o| o.status.success()) {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&gp.stdout).trim()).join("bin"));
    }
    dirs.into_iter().map(|d| d.join("nats-server")).find(|p| p.is_file())
}

/// `None` (after saying why) when nats-server is missing outside CI.
fn setup() -> Option<(std::sync::MutexGuard<'static, ()>, PathBuf)> {
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    match nats_server() {
        Some(p) => Some((g, p)),
        None if std::env::var_os("CI").is_some() => panic!("nats-server not found (go install github.com/nats-io/nats-server/v2@v2.15.3)"),
        None => {
            eprintln!("cluster tests skipped: nats-server not found (go install github.com/nats-io/nats-server/v2@v2.15.3)");
            None
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn tmpdir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!("kalos-cluster-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn kill9(c: &mut Child) {
    let _ = c.kill(); // SIGKILL
    let _ = c.wait();
}

/// Three nats-server processes in one JetStream cluster.
struct Nats {
    bin: PathBuf,
    dir: PathBuf,
    ports: Vec<u16>,
    cports: Vec<u16>,
    procs: Vec<Option<Child>>,
}

impl Nats {
    fn start(bin: &Path) -> Nats {
        let dir = tmpdir("nats");
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let cports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut n = Nats { bin: bin.to_path_buf(), dir, ports, cports, procs: Vec::new() };
        for i in 0..3 {
            let c = n.spawn(i);
            n.procs.push(Some(c));
        }
        // Ready when every server accepts connections and JetStream has a meta leader: the
        // kalosd layer retries stream creation until then.
        for &p in &n.ports {
            let t0 = Instant::now();
            while TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(t0.elapsed() < Duration::from_secs(20), "nats-server on {p} did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        n
    }

    fn spawn(&self, i: usize) -> Child {
        let routes: Vec<String> = self.cports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect();
        let log = std::fs::File::create(self.dir.join(format!("nats{i}.log"))).unwrap();
        Command::new(&self.bin)
            .args(["-n", &format!("n{i}"), "-a", "127.0.0.1", "-p", &self.ports[i].to_string(), "-js", "-sd"])
            .arg(self.dir.join(format!("js{i}")))
            .args([
                "--cluster_name",
                "kalos-test",
                "--cluster",
                &format!("nats://127.0.0.1:{}", self.cports[i]),
                "--routes",
                &routes.join(","),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server")
    }

    fn urls(&self) -> String {
        self.ports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            kill9(&mut c);
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        for i in 0..self.procs.len() {
            self.kill9(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One kalosd in cluster mode.
struct Host {
    name: String,
    hold: String,
    urls: String,
    data: PathBuf,
    store: String,
    child: Option<Child>,
    /// Everything it wrote to stderr, across restarts.
    log: Arc<Mutex<String>>,
    extra: Vec<String>,
}

impl Host {
    fn start(store: &str, node: &str, hold: &str, urls: &str, extra: &[&str]) -> Host {
        let data = tmpdir(&format!("data-{node}"));
        let mut perm = std::fs::metadata(&data).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o700);
        std::fs::set_permissions(&data, perm).unwrap();
        let mut h = Host {
            name: format!("{store}-{node}-{}", std::process::id()),
            hold: hold.into(),
            urls: urls.into(),
            data,
            store: store.into(),
            child: None,
            log: Arc::new(Mutex::new(String::new())),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        h.spawn();
        h
    }

    fn node(&self) -> &str {
        self.name.split('-').nth(1).unwrap()
    }

    fn spawn(&mut self) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kalosd"))
            .args(["serve", "--name", &self.name, "--dim", &DIM.to_string(), "--metric", "cosine", "--backend", "cpu"])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--cluster", &self.urls, "--cluster-store", &self.store, "--shard-count", &SHARDS.to_string()])
            .args(["--shards", &self.hold, "--node", self.node(), "--slots", "16"])
            .args(&self.extra)
            .env("KALOS_LOG", std::env::var("KALOS_TEST_LOG").unwrap_or("info".into()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kalosd");
        let err = c.stderr.take().unwrap();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let mut out = BufReader::new(c.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(first.starts_with("kalosd: serving"), "kalosd {}: {first:?}\n{}", self.name, self.log.lock().unwrap());
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        self.child = Some(c);
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill9(&mut c);
        }
    }

    fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    fn open(&self) -> Kalos {
        Kalos::open(&self.name, &Options { role: Role::Client, timeout_ms: 10_000, ..Options::default() }).unwrap()
    }

    fn holds(&self, s: u32) -> bool {
        self.hold.split(',').any(|x| x.parse::<u32>().unwrap() == s)
    }

    /// The sequences from which each of its shards started catching up, in order of the log.
    fn catch_up_starts(&self) -> Vec<(u32, u64)> {
        let log = self.log.lock().unwrap();
        log.lines()
            .filter_map(|l| {
                let rest = l.split("cluster: shard ").nth(1)?;
                let (s, tail) = rest.split_once(": catching up from log sequence ")?;
                Some((s.parse().ok()?, tail.trim_end_matches('"').parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if c.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            kill9(&mut c);
        }
        let _ = std::fs::remove_dir_all(&self.data);
        let _ = std::fs::remove_file(format!("/dev/shm/kalos.{}", self.name));
        let _ = std::fs::remove_file(format!("/dev/shm/kalos.{}.lock", self.name));
    }
}

/// A namespace whose shard is `s`.
fn ns_in(s: u32, nth: u64) -> u64 {
    (0..).filter(|&n| shard_of(n, SHARDS) == s).nth(nth as usize).unwrap()
}

fn vector(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..DIM)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 20_000) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

fn upsert_one(k: &Kalos, id: u64, ns: u64) -> kalos::Result<()> {
    k.upsert(&[id], &vector(id), &UpsertOptions { namespaces: Namespaces::One(ns), timeout_ms: Some(10_000), ..Default::default() })
}

/// Writes through `k` until one is acknowledged (the layer creates the streams at start).
fn first_write(k: &Kalos, id: u64, ns: u64) {
    let t0 = Instant::now();
    loop {
        match upsert_one(k, id, ns) {
            Ok(()) => return,
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                eprintln!("waiting for the cluster: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the cluster did not take a write within 30 s: {e}"),
        }
    }
}

/// Reads `ids` on `h` after its replicas applied `token` (per shard sequences): every id must
/// be there when its shard is held by `h`.
fn assert_all_present(h: &Host, token: &[u64], ids: &[(u64, u64)]) {
    let k = h.open();
    // A read-your-writes recall per held shard waits until the replica applied the token.
    for s in (0..SHARDS).filter(|&s| h.holds(s)) {
        let o = RecallOptions {
            namespaces: Some(vec![ns_in(s, 0)]),
            min_seqs: Some(token.to_vec()),
            timeout_ms: Some(30_000),
            ..Default::default()
        };
        k.recall(&vector(1), 1, &o).unwrap_or_else(|e| panic!("{}: shard {s} did not catch up: {e}\n{}", h.name, h.log.lock().unwrap()));
    }
    // The recall above may have been answered by another holder while this one caught up
    // (after a reconnection); `get` reads this host's own replica.
    let mine: Vec<u64> = ids.iter().filter(|(_, ns)| h.holds(shard_of(*ns, SHARDS))).map(|(id, _)| *id).collect();
    let t0 = Instant::now();
    for chunk in mine.chunks(256) {
        let got = loop {
            match k.get(chunk) {
                Ok(got) => break got,
                Err(e) if e.status == Status::NotFound && t0.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("{}: an acknowledged write is missing: {e}\n{}", h.name, h.log.lock().unwrap()),
            }
        };
        assert_eq!(got.len(), chunk.len());
    }
}

fn three_hosts(nats: &Nats, store: &str) -> Vec<Host> {
    ["a", "b", "c"].iter().zip(HOLD).map(|(n, hold)| Host::start(store, n, hold, &nats.urls(), &[])).collect()
}

#[test]
fn write_on_one_host_is_read_on_another() {
    let Some((_g, bin)) = setup() else { return };
    let nats = Nats::start(&bin);
    let hosts = three_hosts(&nats, "ryw");
    let (a, b) = (hosts[0].open(), hosts[1].open());
    first_write(&a, 1, ns_in(0, 0));
    // Shard 1 is held by A and B; shard 2 by B and C only (A forwards).
    for (id, s) in [(10u64, 1u32), (11, 2), (12, 0)] {
        let ns = ns_in(s, 1);
        upsert_one(&a, id, ns).unwrap();
        let token = a.write_seqs();
        assert!(token[s as usize] > 0, "the write token names shard {s}: {token:?}");
        // Read-your-writes through another host: the first recall returns it.
        let o = RecallOptions { namespaces: Some(vec![ns]), min_seqs: Some(token.clone()), timeout_ms: Some(10_000), ..Default::default() };
        let hits = b.recall(&vector(id), 3, &o).unwrap();
        assert_eq!(hits.first().map(|h| h.id), Some(id), "shard {s} through B: {hits:?}");
        // And through the writer's own handle with the read-your-writes flag.
        let o = RecallOptions { namespaces: Some(vec![ns]), read_your_writes: true, timeout_ms: Some(10_000), ..Default::default() };
        assert_eq!(a.recall(&vector(id), 1, &o).unwrap()[0].id, id);
    }
    // A token naming a shard the store does not have is refused, not ignored.
    let o = RecallOptions { min_seqs: Some(vec![0, 0, 0, 5]), timeout_ms: Some(10_000), ..Default::default() };
    let e = b.recall(&vector(1), 1, &o).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    // Without the option the write shows up too, eventually (polled).
    upsert_one(&a, 20, ns_in(2, 2)).unwrap();
    let t0 = Instant::now();
    let o = RecallOptions { namespaces: Some(vec![ns_in(2, 2)]), ..Default::default() };
    while b.recall(&vector(20), 1, &o).unwrap().first().map(|h| h.id) != Some(20) {
        assert!(t0.elapsed() < Duration::from_secs(10), "an acknowledged write never reached B");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A delete goes through the log as well.
    a.delete(&[10]).unwrap();
    let o = RecallOptions { namespaces: Some(vec![ns_in(1, 1)]), read_your_writes: true, ..Default::default() };
    assert!(a.recall(&vector(10), 3, &o).unwrap().iter().all(|h| h.id != 10));
}

/// A writer that sends single upserts through `k` until stopped, keeping what was acknowledged.
/// What a writer did: acknowledged (id, namespace), the statuses of refused writes, and the
/// write token of everything acknowledged.
type Written = (Vec<(u64, u64)>, Vec<Status>, Vec<u64>);

/// `last` follows the last acknowledged id.
fn writer(name: String, stop: Arc<AtomicBool>, first_id: u64, last: Arc<AtomicU64>) -> std::thread::JoinHandle<Written> {
    fn merge(token: &mut [u64], k: &Kalos) {
        for (s, q) in k.write_seqs().into_iter().enumerate() {
            token[s] = token[s].max(q);
        }
    }
    let open = |name: &str| Kalos::open(name, &Options { role: Role::Client, timeout_ms: 10_000, ..Options::default() });
    std::thread::spawn(move || {
        let (mut acked, mut errors) = (Vec::new(), Vec::new());
        let mut token = vec![0u64; SHARDS as usize];
        let mut k = open(&name).unwrap();
        let mut id = first_id;
        while !stop.load(Ordering::SeqCst) {
            let ns = id % 30;
            match upsert_one(&k, id, ns) {
                Ok(()) => {
                    acked.push((id, ns));
                    last.store(id, Ordering::SeqCst);
                }
                Err(e) => {
                    errors.push(e.status);
                    if e.status == Status::Unavailable {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if e.status == Status::ServerGone {
                        // The host was killed: reopen once its restart serves again.
                        merge(&mut token, &k);
                        k = loop {
                            match open(&name) {
                                Ok(k) => break k,
                                Err(_) => std::thread::sleep(Duration::from_millis(20)),
                            }
                        };
                    }
                }
            }
            id += 1;
        }
        merge(&mut token, &k);
        (acked, errors, token)
    })
}

#[test]
fn kill9_kalosd_during_writes_loses_no_acknowledged_write() {
    let Some((_g, bin)) = setup() else { return };
    let nats = Nats::start(&bin);
    let mut hosts = three_hosts(&nats, "crash");
    first_write(&hosts[2].open(), 1, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(hosts[2].name.clone(), stop.clone(), 1000, Arc::new(AtomicU64::new(0)));
    let mut restarts = 0;
    for round in 0..12 {
        std::thread::sleep(Duration::from_millis(400));
        // A, B and C in turn; C also takes the writes, so some are in flight when it dies.
        hosts[round % 3].restart();
        restarts += 1;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (acked, errors, token) = w.join().unwrap();
    assert!(restarts >= 10);
    assert!(acked.len() > 100, "only {} writes acknowledged ({} failed: {:?})", acked.len(), errors.len(), &errors[..errors.len().min(5)]);
    // The only failures: writes held by C when it was killed, and writes C refused while it
    // reconnected to NATS after a restart (never acknowledged, with a clear status).
    assert!(errors.iter().all(|&s| s == Status::ServerGone || s == Status::Unavailable), "{errors:?}");
    for h in &hosts {
        assert_all_present(h, &token, &acked);
    }
    // Each restart caught up from its checkpoint: after the first rounds, no shard started
    // from the beginning of its log again.
    for h in &hosts {
        let starts = h.catch_up_starts();
        let held = h.hold.split(',').count();
        assert_eq!(starts.len(), held * 5, "{}: {starts:?}", h.name);
        let later = &starts[held * 2..];
        assert!(later.iter().all(|&(_, from)| from > 1), "{}: a restart replayed its log from the start: {starts:?}", h.name);
    }
}

#[test]
fn kill9_one_nats_server_during_writes() {
    let Some((_g, bin)) = setup() else { return };
    let mut nats = Nats::start(&bin);
    let hosts = three_hosts(&nats, "broker");
    first_write(&hosts[0].open(), 1, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicU64::new(0));
    let w = writer(hosts[0].name.clone(), stop.clone(), 1000, last.clone());
    std::thread::sleep(Duration::from_millis(800));
    nats.kill9(0);
    let at_kill = last.load(Ordering::SeqCst);
    // Writes go on after the kill, through every host, once the shards whose stream leader
    // died have elected another (a few seconds; writes meanwhile are refused, never lost).
    let mut after_kill = Vec::new();
    let mut extra = vec![0u64; SHARDS as usize];
    for (i, h) in hosts.iter().enumerate() {
        let k = h.open();
        let t0 = Instant::now();
        while let Err(e) = upsert_one(&k, 900_000 + i as u64, 3) {
            assert!(t0.elapsed() < Duration::from_secs(20), "a write through {} after the broker died: {e}", h.name);
            assert_eq!(e.status, Status::Unavailable, "{e}");
        }
        after_kill.push((900_000 + i as u64, 3));
        for (s, q) in k.write_seqs().into_iter().enumerate() {
            extra[s] = extra[s].max(q);
        }
    }
    let t0 = Instant::now();
    while last.load(Ordering::SeqCst) <= at_kill + 10 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let (mut acked, errors, token) = w.join().unwrap();
    // Writes in flight while the stream leaders moved may be refused (UNAVAILABLE, never
    // acknowledged); the writer kept going.
    assert!(errors.iter().all(|&s| s == Status::Unavailable), "{errors:?}");
    assert!(acked.len() > 50, "{} acknowledged, {} failed", acked.len(), errors.len());
    assert!(
        acked.iter().any(|&(id, _)| id > at_kill + 10),
        "no write was acknowledged after the kill: {at_kill} {} {:?} {:?}",
        acked.len(),
        acked.last(),
        errors.len()
    );
    acked.extend(after_kill);
    let mut token = token;
    for (s, q) in extra.iter().enumerate() {
        token[s] = token[s].max(*q);
    }
    for h in &hosts {
        assert_all_present(h, &token, &acked);
    }
}

#[test]
fn scatter_gather_equals_single_host() {
    let Some((_g, bin)) = setup() else { return };
    let nats = Nats::start(&bin);
    let hosts = three_hosts(&nats, "scatter");
    let a = hosts[0].open();
    first_write(&a, 0, 0);
    let n = 3000u64;
    let ids: Vec<u64> = (0..n).collect();
    let ns: Vec<u64> = ids.iter().map(|i| i % 40).collect();
    let vecs: Vec<f32> = ids.iter().flat_map(|&i| vector(i)).collect();
    let payloads: Vec<Vec<u8>> = ids.iter().map(|i| format!("memory {i}").into_bytes()).collect();
    let pl: Vec<Option<&[u8]>> = payloads.iter().map(|p| Some(&p[..])).collect();
    let o =
        UpsertOptions { namespaces: Namespaces::PerItem(&ns), payloads: Some(pl.clone()), timeout_ms: Some(20_000), ..Default::default() };
    a.upsert(&ids, &vecs, &o).unwrap();
    let token = a.write_seqs();
    // The single host: the same rows in one plain store.
    let single_name = format!("scatter-single-{}", std::process::id());
    let single =
        Kalos::open(&single_name, &Options { role: Role::Server, dim: DIM as u32, metric: Metric::Cosine, ..Options::default() }).unwrap();
    single.upsert(&ids, &vecs, &UpsertOptions { namespaces: Namespaces::PerItem(&ns), payloads: Some(pl), ..Default::default() }).unwrap();
    let cases: Vec<Option<Vec<u64>>> = vec![None, Some(vec![3]), Some(vec![1, 2, 5, 8, 13, 21]), Some((0..40).collect())];
    for h in &hosts {
        let k = h.open();
        for (qi, scope) in cases.iter().enumerate() {
            for seed in 0..8u64 {
                let q = vector(10_000 + seed * 7 + qi as u64);
                let want = single.recall(&q, 10, &RecallOptions { namespaces: scope.clone(), ..Default::default() }).unwrap();
                let o = RecallOptions {
                    namespaces: scope.clone(),
                    min_seqs: Some(token.clone()),
                    timeout_ms: Some(20_000),
                    ..Default::default()
                };
                let got = k.recall(&q, 10, &o).unwrap();
                assert_eq!(got, want, "{} scope {scope:?}", h.name);
                let gp = k.recall_with_payloads(&q, 5, &o).unwrap();
                let wp = single.recall_with_payloads(&q, 5, &RecallOptions { namespaces: scope.clone(), ..Default::default() }).unwrap();
                assert_eq!(
                    gp.iter().map(|p| (p.id, p.payload.clone())).collect::<Vec<_>>(),
                    wp.iter().map(|p| (p.id, p.payload.clone())).collect::<Vec<_>>()
                );
            }
            // A batch of queries.
            let qs: Vec<f32> = (0..5).flat_map(|i| vector(20_000 + i)).collect();
            let o =
                RecallOptions { namespaces: scope.clone(), min_seqs: Some(token.clone()), timeout_ms: Some(20_000), ..Default::default() };
            let got: Vec<Vec<Hit>> = k.recall_batch(&qs, 5, 7, &o).unwrap();
            let want = single.recall_batch(&qs, 5, 7, &RecallOptions { namespaces: scope.clone(), ..Default::default() }).unwrap();
            assert_eq!(got, want);
        }
    }
    single.close();
}

/// A TCP proxy between one kalosd and one nats-server that the test can cut (close every
/// connection, refuse new ones) or black-hole (keep connections, forward nothing).
struct Proxy {
    port: u16,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

const PASS: u8 = 0;
const BLACKHOLE: u8 = 1;
const CUT: u8 = 2;

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (m, cs) = (mode.clone(), conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(down) = s else { continue };
                if m.load(Ordering::SeqCst) == CUT {
                    let _ = down.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                cs.lock().unwrap().extend([down.try_clone().unwrap(), up.try_clone().unwrap()]);
                for (mut from, mut to) in [(down.try_clone().unwrap(), up.try_clone().unwrap()), (up, down)] {
                    let m = m.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            match m.load(Ordering::SeqCst) {
                                PASS => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                                BLACKHOLE => {}
                                _ => break,
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, mode, conns }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        if mode == CUT {
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

#[test]
fn host_cut_off_from_nats_refuses_writes_within_its_deadline() {
    let Some((_g, bin)) = setup() else { return };
    let nats = Nats::start(&bin);
    let hosts = three_hosts(&nats, "part");
    // D reaches NATS only through the proxy; it holds shard 0 only.
    let proxy = Proxy::start(nats.ports[0]);
    let d_host = Host::start("part", "d", "0", &format!("nats://127.0.0.1:{}", proxy.port), &["--write-timeout-ms", "1500"]);
    let d = d_host.open();
    first_write(&d, 1, ns_in(0, 0));
    let k = hosts[0].open();
    first_write(&k, 2, ns_in(0, 0));
    let scope =
        RecallOptions { namespaces: Some(vec![ns_in(0, 0)]), read_your_writes: true, timeout_ms: Some(10_000), ..Default::default() };
    assert_eq!(d.recall(&vector(1), 1, &scope).unwrap()[0].id, 1);
    // D's own replica has applied it (the recall above may have been forwarded while D caught up).
    let t0 = Instant::now();
    while d.get(&[1, 2]).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "D never applied its shard's log");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Black hole: the connection stays up but nothing arrives; the write waits for its
    // acknowledgement until the write deadline (1.5 s) and is refused with UNAVAILABLE.
    proxy.set(BLACKHOLE);
    let t0 = Instant::now();
    let e = upsert_one(&d, 3, ns_in(0, 0)).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.status, Status::Unavailable, "{e}");
    assert!(e.message.contains("did not acknowledge") || e.message.contains("cut off"), "{e}");
    assert!(took < Duration::from_millis(5_000), "refused after {took:?}, past the write deadline");

    // Cut: the connection drops; writes are refused at once, saying the host is cut off. Until
    // the host notices, a write may still wait for its acknowledgement and be refused as
    // possibly logged (the client library may send it on reconnection): each attempt takes its
    // own id, and only the ones refused as not logged must stay out of the store.
    proxy.set(CUT);
    let t0 = Instant::now();
    let mut id = 100u64;
    let not_logged = loop {
        let e = upsert_one(&d, id, ns_in(0, 0)).unwrap_err();
        assert_eq!(e.status, Status::Unavailable, "{e}");
        if e.message.contains("cut off") {
            assert!(e.message.contains("not logged"), "{e}");
            break id;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "the host never noticed it was cut off: {e}");
        id += 1;
    };
    // Reads of its own shard: refused as possibly stale, unless the caller opts in; the
    // opt-in reply says how long the replica has been cut off.
    let plain = RecallOptions { namespaces: Some(vec![ns_in(0, 0)]), timeout_ms: Some(5_000), ..Default::default() };
    assert_eq!(d.recall(&vector(1), 1, &plain).unwrap_err().status, Status::Stale);
    std::thread::sleep(Duration::from_millis(50));
    let stale = RecallOptions { allow_stale: true, ..plain.clone() };
    let (mut ids, mut scores) = ([0u64; 1], [0f32; 1]);
    let (n, lag) = d.recall_lag(&vector(1), 1, &stale, &mut ids, &mut scores).unwrap();
    assert_eq!((n, ids[0]), (1, 1));
    assert!(lag.unwrap().ms > 0, "{lag:?}");
    // The other hosts kept writing meanwhile; once reconnected, D catches up and writes again.
    upsert_one(&k, 5, ns_in(0, 0)).unwrap();
    let token = k.write_seqs();
    proxy.set(PASS);
    let t0 = Instant::now();
    while let Err(e) = upsert_one(&d, 6, ns_in(0, 0)) {
        assert!(t0.elapsed() < Duration::from_secs(20), "D did not reconnect: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = RecallOptions { min_seqs: Some(token), ..scope };
    let got: HashMap<u64, f32> = d.recall(&vector(5), 10, &o).unwrap().into_iter().map(|h| (h.id, h.score)).collect();
    assert!(got.contains_key(&5), "{got:?}");
    // Write 3 was refused as possibly logged (black hole): either way is right. The write the
    // host refused as not logged must be nowhere.
    // D's own write 6 applied: anything sent before it on reconnection is applied too.
    let t0 = Instant::now();
    while d.get(&[6]).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "D never applied its write 6");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.get(&[not_logged]).unwrap_err().status, Status::NotFound, "write {not_logged} was refused as not logged");
    drop(hosts);
}
