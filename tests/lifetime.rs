//! Store lifetime under role auto (client/mod.rs, "Store lifetime"): a store outlives the
//! process that opened it first. The processes here are this test binary run again in a child
//! mode (`KALOS_LIFETIME_CHILD`), each opening with role auto and no data_dir, so they keep the
//! store in `$XDG_DATA_HOME/kalos/<name>` (set to a temporary directory).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kalos::*;

const DIM: usize = 8;
const ROWS: u64 = 500;

fn uniq(tag: &str) -> String {
    format!("lt-{tag}-{}-{}", std::process::id(), rand::random::<u32>())
}

fn vector(id: u64) -> Vec<f32> {
    (0..DIM).map(|d| ((id * 31 + d as u64 * 7) % 97) as f32 + 1.0).collect()
}

fn payload(id: u64) -> Vec<u8> {
    format!("memory {id}").into_bytes()
}

/// A temporary XDG_DATA_HOME, removed (with every store in it) when dropped.
struct DataHome(PathBuf);

impl DataHome {
    fn new(tag: &str) -> DataHome {
        let p = std::env::temp_dir().join(format!("kalos-{}", uniq(tag)));
        std::fs::create_dir_all(&p).unwrap();
        DataHome(p)
    }
    fn store_dir(&self, name: &str) -> PathBuf {
        self.0.join("kalos").join(name)
    }
}

impl Drop for DataHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shm entries of `name` must be gone: a closed or taken-over store leaves nothing behind.
fn assert_no_shm(name: &str) {
    for f in [format!("/dev/shm/kalos.{name}"), format!("/dev/shm/kalos.{name}.lock")] {
        assert!(!Path::new(&f).exists(), "{f} was left behind");
    }
}

/// This test binary in child mode `mode` on store `name`.
fn spawn(mode: &str, name: &str, home: &DataHome, extra: &[(&str, &str)]) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("KALOS_LIFETIME_CHILD", mode)
        .env("KALOS_LIFETIME_NAME", name)
        .env("XDG_DATA_HOME", &home.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in extra {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// Waits (at most 60 s) for a line of the child's stdout that contains `want`; returns the
/// line from `want` on (the test harness prints its own text before a test's output).
fn wait_line(child: &mut Child, want: &str) -> String {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Drains the pipe to its end, so that the child never writes into a closed pipe.
        for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send(l);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                if let Some(i) = l.find(want) {
                    return l[i..].trim().to_string();
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("no {want:?} from the child within 60 s");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("child exited before printing {want:?}"),
        }
    }
}

fn finish(mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "child failed: {st}");
            return;
        }
        assert!(Instant::now() < deadline, "child did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn write_all(k: &Kalos) {
    let ids: Vec<u64> = (0..ROWS).collect();
    let vecs: Vec<f32> = ids.iter().flat_map(|&i| vector(i)).collect();
    let ns: Vec<u64> = ids.iter().map(|i| i % 3).collect();
    let pl: Vec<Vec<u8>> = ids.iter().map(|&i| payload(i)).collect();
    let o = UpsertOptions {
        namespaces: Namespaces::PerItem(&ns),
        payloads: Some(pl.iter().map(|p| Some(p.as_slice())).collect()),
        ..Default::default()
    };
    k.upsert(&ids, &vecs, &o).unwrap();
}

/// Every memory written by `write_all`, with its vector, namespace and payload.
fn check_all(k: &Kalos) {
    let ids: Vec<u64> = (0..ROWS).collect();
    let got = k.get(&ids).unwrap();
    assert_eq!(got.len(), ROWS as usize);
    for (i, r) in got.iter().enumerate() {
        let id = i as u64;
        assert_eq!(r.id, id);
        assert_eq!(r.vector, vector(id), "id {id}");
        assert_eq!(r.namespace, id % 3);
        assert_eq!(r.payload.as_deref(), Some(payload(id).as_slice()));
    }
    assert_eq!(k.stats().unwrap().count, ROWS);
    let hits = k.recall(&vector(7), 1, &RecallOptions::default()).unwrap();
    assert_eq!(hits[0].id, 7);
}

/// Child mode (a no-op in a normal test run). `write-exit`: open, write, exit. `read`: open,
/// check every memory, exit. `hold`: open, write, print "ready", wait for stdin to close, exit.
#[test]
fn child() {
    let Ok(mode) = std::env::var("KALOS_LIFETIME_CHILD") else { return };
    let name = std::env::var("KALOS_LIFETIME_NAME").unwrap();
    let ephemeral = std::env::var("KALOS_LIFETIME_EPHEMERAL").is_ok();
    let o = Options { dim: DIM as u32, metric: Metric::L2, ephemeral, ..Options::default() };
    let k = Kalos::open(&name, &o).unwrap();
    match mode.as_str() {
        "write-exit" => write_all(&k),
        "read" => check_all(&k),
        "hold" => {
            write_all(&k);
            println!("ready server={}", k.is_server());
            std::io::stdout().flush().unwrap();
            let mut s = String::new();
            while std::io::stdin().read_line(&mut s).unwrap_or(0) > 0 {}
        }
        m => panic!("unknown child mode {m}"),
    }
    k.close();
}

/// Process A opens with auto, writes and exits; process B, started afterwards, reads every
/// memory: the store is durable by default, in the XDG data directory.
#[test]
fn a_writes_and_exits_then_b_reads_every_memory() {
    let home = DataHome::new("ab");
    let name = uniq("ab");
    finish(spawn("write-exit", &name, &home, &[]));
    assert!(home.store_dir(&name).is_dir(), "the store lives in $XDG_DATA_HOME/kalos/<name>");
    assert_no_shm(&name);
    finish(spawn("read", &name, &home, &[]));
    assert_no_shm(&name);
}

/// Opens `name` in this process with role auto on the same files as the children.
fn open_here(name: &str, home: &DataHome, ephemeral: bool) -> Kalos {
    let data_dir = (!ephemeral).then(|| home.store_dir(name));
    let o = Options { dim: DIM as u32, metric: Metric::L2, data_dir, ephemeral, timeout_ms: 10_000, ..Options::default() };
    Kalos::open(name, &o).unwrap()
}

/// A serves the store; this process attaches with auto. When A exits cleanly (or is killed),
/// this process takes the store over from its files and keeps every memory, on the same handle.
fn survivor_keeps_the_store(kill: bool) {
    let home = DataHome::new("tk");
    let name = uniq(if kill { "kill" } else { "exit" });
    let mut a = spawn("hold", &name, &home, &[]);
    assert_eq!(wait_line(&mut a, "ready"), "ready server=true");
    let k = open_here(&name, &home, false);
    assert!(!k.is_server(), "A serves; this handle attached as a client");
    assert!(k.takes_over());
    check_all(&k);
    if kill {
        a.kill().unwrap();
        a.wait().unwrap();
    } else {
        drop(a.stdin.take());
        finish(a);
    }
    // The first call after A is gone takes the store over and is answered by the new server.
    check_all(&k);
    assert!(k.is_server(), "this process now serves the store");
    k.upsert(&[ROWS], &vector(ROWS), &UpsertOptions::default()).unwrap();
    assert_eq!(k.stats().unwrap().count, ROWS + 1);
    k.close();
    assert_no_shm(&name);
    // And the write made after the takeover is durable too: a later process sees it.
    let k = open_here(&name, &home, false);
    assert_eq!(k.stats().unwrap().count, ROWS + 1);
    k.close();
    assert_no_shm(&name);
}

#[test]
fn survivor_takes_over_when_the_server_process_exits() {
    survivor_keeps_the_store(false);
}

#[test]
fn survivor_takes_over_when_the_server_process_is_killed() {
    survivor_keeps_the_store(true);
}

/// An ephemeral auto store lives exactly as long as its server: it writes no files, and when
/// its server exits the other handles get SERVER_GONE instead of an empty store.
#[test]
fn ephemeral_store_ends_with_its_server() {
    let home = DataHome::new("eph");
    let name = uniq("eph");
    let mut a = spawn("hold", &name, &home, &[("KALOS_LIFETIME_EPHEMERAL", "1")]);
    assert_eq!(wait_line(&mut a, "ready"), "ready server=true");
    let k = open_here(&name, &home, true);
    assert!(!k.takes_over());
    assert_eq!(k.stats().unwrap().count, ROWS);
    drop(a.stdin.take());
    finish(a);
    let e = k.stats().unwrap_err();
    assert_eq!(e.status, Status::ServerGone, "{}", e.message);
    assert!(!home.0.join("kalos").exists(), "an ephemeral store writes no files");
    k.close();
    assert_no_shm(&name);
}

/// Role server keeps its explicit meaning: the store lives in this process, in memory unless a
/// data_dir is given, and its clients never take it over.
#[test]
fn role_server_stays_in_process_and_memory_only() {
    let name = uniq("srv");
    let s = Kalos::open(&name, &Options { role: Role::Server, dim: DIM as u32, ..Options::default() }).unwrap();
    assert!(s.is_server() && !s.takes_over());
    let c = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).unwrap();
    assert!(!c.takes_over());
    s.close();
    assert_eq!(c.stats().unwrap_err().status, Status::ServerGone);
    c.close();
    assert_no_shm(&name);
}

/// A client of a store nobody serves gets NOT_FOUND naming the segment's real path.
#[test]
fn missing_store_names_its_segment_path() {
    let name = uniq("none");
    let e = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).err().unwrap();
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains(&format!("/dev/shm/kalos.{name} does not exist")), "{}", e.message);
}
