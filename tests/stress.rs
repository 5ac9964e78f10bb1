//! Threads and processes at once against one server (issue #26, defect 4): client threads of
//! this process and of other processes claim slots, recall, write, withdraw requests at short
//! deadlines, and some processes are SIGKILLed while they hold a slot. Checked throughout:
//!
//! - every answer a live client gets is exact: recalls of a fixed table against a brute-force
//!   reference, and each worker's own namespace (which only it writes) against its own model;
//! - no call blocks past its deadline (plus `SLACK`), including on a handle with a long spin;
//! - a call with a generous deadline never times out (a leaked slot would make it);
//! - every slot a killed process held is reclaimed, and at the end every slot is free.
//!
//! Environment: `KALOS_STRESS_SECS` (default 3) runs it longer; `KALOS_SEED` repeats a run's
//! data and choices (the interleavings differ).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kalos::shm::{self, Segment};
use kalos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIM: usize = 16;
const ROWS: usize = 1500;
const K: usize = 8;
/// Rows each worker keeps in its own namespace, at most.
const OWN_ROWS: u64 = 16;
/// How far past its deadline a call may return (scheduling noise on a loaded 2-core machine).
const SLACK: Duration = Duration::from_millis(750);
/// The deadline of an unhurried call: it must never expire.
const UNHURRIED_MS: u64 = 10_000;

fn seed() -> u64 {
    std::env::var("KALOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

fn secs() -> f64 {
    std::env::var("KALOS_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0)
}

/// The fixed table, namespace 0: the same in every process for a seed.
struct Table {
    ids: Vec<u64>,
    vecs: Vec<f32>,
}

impl Table {
    fn new(seed: u64) -> Table {
        let mut rng = StdRng::seed_from_u64(seed);
        Table {
            ids: (0..ROWS as u64).map(|i| 1_000_000 + i * 3).collect(),
            vecs: (0..ROWS * DIM).map(|_| rng.random_range(-1.0..1.0)).collect(),
        }
    }
}

/// Exact top k of `rows` for `q` by inner product in f64: (score, id), best first, ties by id.
fn reference<'a>(rows: impl Iterator<Item = (u64, &'a [f32])>, q: &[f32], k: usize) -> Vec<(f64, u64)> {
    let mut all: Vec<(f64, u64)> = rows.map(|(id, v)| (v.iter().zip(q).map(|(a, b)| *a as f64 * *b as f64).sum(), id)).collect();
    all.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    all.truncate(k);
    all
}

/// An answer agrees with the reference when it has `k` hits (fewer where the reference has
/// fewer rows), every score matches at its rank and the ids match wherever the reference has no
/// near-tie at that rank. `want` is the reference's top `k + 1`: the k-th best row and the next
/// one may be a near-tie, and then either may come last.
fn agree(hits: &[Hit], want: &[(f64, u64)], k: usize) -> std::result::Result<(), String> {
    if hits.len() != want.len().min(k) {
        return Err(format!("{} hits, want {}", hits.len(), want.len().min(k)));
    }
    for (i, (h, w)) in hits.iter().zip(want).enumerate() {
        let tol = 1e-4 * (1.0 + w.0.abs());
        if (h.score as f64 - w.0).abs() > tol {
            return Err(format!("rank {i}: score {} (id {}), want {} (id {})", h.score, h.id, w.0, w.1));
        }
        let tie = (i > 0 && (want[i - 1].0 - w.0).abs() < tol) || (i + 1 < want.len() && (want[i + 1].0 - w.0).abs() < tol);
        if !tie && h.id != w.1 {
            return Err(format!("rank {i}: id {}, want {}", h.id, w.1));
        }
    }
    Ok(())
}

/// [`agree`] against the reference top `k + 1` of `rows`.
fn exact<'a>(hits: &[Hit], rows: impl Iterator<Item = (u64, &'a [f32])>, q: &[f32], k: usize) -> std::result::Result<(), String> {
    agree(hits, &reference(rows, q, k + 1), k)
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    calls: u64,
    withdrawn: u64,
    writes: u64,
    /// The longest a call took past its deadline (zero when none did).
    late: Duration,
}

/// One worker: random calls on `k` until `until`, every answer checked. `wid` names its own
/// namespace (`wid + 1`) and id range; nobody else writes there.
fn worker(k: &Kalos, table: &Table, wid: u64, seed: u64, until: Instant) -> std::result::Result<Counts, String> {
    let mut rng = StdRng::seed_from_u64(seed ^ wid.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let ns = wid + 1;
    let base = (wid + 1) << 32;
    let mut own: HashMap<u64, Vec<f32>> = HashMap::new();
    let mut c = Counts::default();
    let table_only = RecallOptions { namespaces: Some(vec![0]), timeout_ms: Some(UNHURRIED_MS), ..Default::default() };
    let late = std::cell::Cell::new(Duration::ZERO);
    let timed = |deadline_ms: u64, what: &str, t0: Instant| -> std::result::Result<(), String> {
        let took = t0.elapsed();
        late.set(late.get().max(took.saturating_sub(Duration::from_millis(deadline_ms))));
        if took > Duration::from_millis(deadline_ms) + SLACK {
            return Err(format!("{what} with a {deadline_ms} ms deadline returned after {took:?}"));
        }
        Ok(())
    };
    let query = |rng: &mut StdRng| -> Vec<f32> { (0..DIM).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let table_rows = || table.ids.iter().copied().zip(table.vecs.chunks(DIM));
    while Instant::now() < until {
        c.calls += 1;
        match rng.random_range(0..10) {
            // An unhurried recall of the table.
            0..=2 => {
                let q = query(&mut rng);
                let t0 = Instant::now();
                let hits = k.recall(&q, K, &table_only).map_err(|e| format!("recall: {e}"))?;
                timed(UNHURRIED_MS, "recall", t0)?;
                exact(&hits, table_rows(), &q, K).map_err(|e| format!("recall of the table: {e}"))?;
            }
            // A batch at a deadline it often misses: withdrawn, or answered exactly.
            3..=4 => {
                let nq = rng.random_range(16..96);
                let qs: Vec<f32> = (0..nq).flat_map(|_| query(&mut rng)).collect();
                let ms = rng.random_range(0..4);
                let o = RecallOptions { timeout_ms: Some(ms), ..table_only.clone() };
                let t0 = Instant::now();
                let r = k.recall_batch(&qs, nq, K, &o);
                timed(ms, "a batch recall", t0)?;
                match r {
                    Ok(res) => {
                        for (i, hits) in res.iter().enumerate() {
                            exact(hits, table_rows(), &qs[i * DIM..(i + 1) * DIM], K).map_err(|e| format!("batch query {i}: {e}"))?;
                        }
                    }
                    Err(e) if e.status == Status::Timeout => c.withdrawn += 1,
                    Err(e) => return Err(format!("batch recall: {e}")),
                }
            }
            // A write of its own namespace, sometimes at a deadline it may miss: then `get`
            // says whether it ran.
            5..=6 => {
                let id = base + rng.random_range(0..OWN_ROWS);
                let v = query(&mut rng);
                let ms = if rng.random_bool(0.3) { rng.random_range(0..3) } else { UNHURRIED_MS };
                let o = UpsertOptions { namespaces: Namespaces::One(ns), timeout_ms: Some(ms), ..Default::default() };
                let t0 = Instant::now();
                let r = k.upsert(&[id], &v, &o);
                timed(ms, "an upsert", t0)?;
                c.writes += 1;
                match r {
                    Ok(()) => {
                        own.insert(id, v);
                    }
                    Err(e) if e.status == Status::Timeout && ms < UNHURRIED_MS => {
                        c.withdrawn += 1;
                        let back = k.get(&[id]);
                        match back {
                            Ok(recs) if recs[0].vector == v => {
                                own.insert(id, v);
                            }
                            Ok(recs) if own.get(&id) == Some(&recs[0].vector) => {}
                            Err(e) if e.status == Status::NotFound && !own.contains_key(&id) => {}
                            other => return Err(format!("after a withdrawn upsert of {id}: {other:?}")),
                        }
                    }
                    Err(e) => return Err(format!("upsert: {e}")),
                }
            }
            // A delete of one of its own rows.
            7 => {
                let Some(&id) = own.keys().next() else { continue };
                let n = k.delete_timeout(&[id], Some(UNHURRIED_MS)).map_err(|e| format!("delete: {e}"))?;
                if n != 1 {
                    return Err(format!("delete of {id} deleted {n}"));
                }
                own.remove(&id);
                c.writes += 1;
            }
            // A recall of its own namespace: exactly its own rows.
            _ => {
                let q = query(&mut rng);
                let o = RecallOptions { namespaces: Some(vec![ns]), timeout_ms: Some(UNHURRIED_MS), ..Default::default() };
                let hits = k.recall(&q, K, &o).map_err(|e| format!("recall of its own rows: {e}"))?;
                exact(&hits, own.iter().map(|(id, v)| (*id, &v[..])), &q, K).map_err(|e| format!("recall of its own rows: {e}"))?;
            }
        }
    }
    // At the end its namespace holds exactly what it wrote.
    let mut ids: Vec<u64> = own.keys().copied().collect();
    ids.sort_unstable();
    if !ids.is_empty() {
        let recs = k.get(&ids).map_err(|e| format!("final get: {e}"))?;
        for (id, r) in ids.iter().zip(&recs) {
            if r.vector != own[id] {
                return Err(format!("row {id} holds {:?}, want {:?}", r.vector, own[id]));
            }
        }
    }
    c.late = late.get();
    Ok(c)
}

fn client(name: &str, spin_ns: u64) -> Kalos {
    Kalos::open(name, &Options { role: Role::Client, client_spin_ns: spin_ns, ..Options::default() }).unwrap()
}

/// Runs `threads` workers on one handle of this process: their counts, or the first failure.
fn run_workers(
    k: Arc<Kalos>,
    table: Arc<Table>,
    wids: std::ops::Range<u64>,
    seed: u64,
    until: Instant,
) -> std::result::Result<Counts, String> {
    let hs: Vec<_> = wids
        .map(|wid| {
            let (k, table) = (k.clone(), table.clone());
            std::thread::spawn(move || worker(&k, &table, wid, seed, until))
        })
        .collect();
    let mut total = Counts::default();
    for h in hs {
        let c = h.join().map_err(|_| "a worker panicked".to_string())??;
        total.calls += c.calls;
        total.withdrawn += c.withdrawn;
        total.writes += c.writes;
        total.late = total.late.max(c.late);
    }
    Ok(total)
}

/// Runs only as a child (KALOS_STRESS_CHILD="<name> <seed> <first wid> <ms to run>"): two
/// workers on one handle; prints `<<ok calls withdrawn writes late_us>>` or `<<FAIL why>>`.
#[test]
fn stress_child() {
    let Ok(arg) = std::env::var("KALOS_STRESS_CHILD") else { return };
    let f: Vec<&str> = arg.split_whitespace().collect();
    let (name, seed, wid, ms): (&str, u64, u64, u64) = (f[0], f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap());
    let until = Instant::now() + Duration::from_millis(ms);
    let k = Arc::new(client(name, 0));
    match run_workers(k, Arc::new(Table::new(seed)), wid..wid + 2, seed, until) {
        Ok(c) => println!("<<ok {} {} {} {}>>", c.calls, c.withdrawn, c.writes, c.late.as_micros()),
        Err(e) => {
            println!("<<FAIL {e}>>");
            std::process::exit(1);
        }
    }
}

fn spawn_child(name: &str, seed: u64, wid: u64, ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stress_child", "--nocapture", "--test-threads", "1"])
        .env("KALOS_STRESS_CHILD", format!("{name} {seed} {wid} {ms}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The child's verdict line (its whole output is read, so that the child never writes into a
/// closed pipe).
fn verdict(child: &mut Child) -> String {
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut v = "no verdict".to_string();
    for line in out.lines().map_while(|l| l.ok()) {
        if let (Some(a), Some(b)) = (line.find("<<"), line.find(">>")) {
            v = line[a + 2..b].to_string();
        }
    }
    v
}

/// Slots whose state word names `pid` and is not free: (slot, state).
fn held_by(seg: &Segment, pid: u32) -> Vec<(usize, u64)> {
    (0..seg.slot_count())
        .filter_map(|i| {
            let w = seg.slot(i).state.load(Ordering::Acquire);
            (shm::pid_of(w) == pid && shm::state_of(w) != shm::SLOT_FREE).then_some((i, shm::state_of(w)))
        })
        .collect()
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) of a child this test spawned and has not yet waited for.
    unsafe { libc::kill(c.id() as i32, sig) };
}

/// Kills children on a panic, so a failing test leaves none behind.
struct Reaper(Vec<Child>);
impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn threads_and_processes_claim_withdraw_and_die_and_every_answer_stays_exact() {
    let seed = seed();
    let run = Duration::from_secs_f64(secs());
    eprintln!("seed {seed} (KALOS_SEED={seed} repeats the data), {run:?}");
    let name = format!("stress-{}-{}", std::process::id(), rand::random::<u16>());
    let table = Arc::new(Table::new(seed));
    let o = Options {
        role: Role::Server,
        dim: DIM as u32,
        metric: Metric::InnerProduct,
        backend: Backend::Cpu,
        slots: 4,
        capacity: 1 << 16,
        threads: 1,
        ..Options::default()
    };
    let srv = Kalos::open(&name, &o).unwrap();
    srv.upsert(&table.ids, &table.vecs, &UpsertOptions::default()).unwrap();
    let seg = Segment::attach(&name).unwrap();
    let until = Instant::now() + run;
    let mut kids = Reaper(Vec::new());
    // Two processes of two workers each, alive to the end.
    for p in 0..2u64 {
        kids.0.push(spawn_child(&name, seed, 100 + 2 * p, run.as_millis() as u64));
    }
    // This process: two workers on one handle, one on a handle with a 1 s spin.
    let shared = Arc::new(client(&name, 0));
    let spinning = Arc::new(client(&name, 1_000_000_000));
    let local = {
        let t = table.clone();
        let a = std::thread::spawn(move || run_workers(shared, t, 0..2, seed, until));
        let t = table.clone();
        let b = std::thread::spawn(move || run_workers(spinning, t, 2..3, seed, until));
        (a, b)
    };
    // Meanwhile, processes that are killed while they hold a slot.
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut killed, mut killed_holding, mut states) = (0u32, 0u32, [0u32; 6]);
    let mut victim_wid = 1000u64;
    while Instant::now() + Duration::from_millis(400) < until {
        let mut v = spawn_child(&name, seed, victim_wid, 60_000);
        victim_wid += 2;
        std::thread::sleep(Duration::from_millis(rng.random_range(80..250)));
        // Stop it, and kill it only while it holds a slot (a few tries), else kill it anyway.
        let mut held = Vec::new();
        for _ in 0..50 {
            signal(&v, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(2));
            held = held_by(&seg, v.id());
            if !held.is_empty() {
                break;
            }
            signal(&v, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(rng.random_range(1..5)));
        }
        let pid = v.id();
        signal(&v, libc::SIGKILL);
        v.wait().unwrap();
        killed += 1;
        if !held.is_empty() {
            killed_holding += 1;
        }
        for &(_, st) in &held {
            states[st as usize] += 1;
        }
        // The server's housekeeping (every 250 ms) reclaims what it held.
        let t0 = Instant::now();
        while !held_by(&seg, pid).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(3), "slots {:?} of killed client {pid} were not reclaimed", held_by(&seg, pid));
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let (a, b) = local;
    let ca = a.join().unwrap().unwrap_or_else(|e| panic!("a worker of this process: {e}"));
    let cb = b.join().unwrap().unwrap_or_else(|e| panic!("the spinning worker: {e}"));
    let (mut child_calls, mut late) = (0u64, ca.late.max(cb.late));
    for (i, c) in kids.0.iter_mut().enumerate() {
        let v = verdict(c);
        assert!(c.wait().unwrap().success() && v.starts_with("ok"), "live child {i}: {v}");
        let n: Vec<u64> = v.split_whitespace().skip(1).filter_map(|n| n.parse().ok()).collect();
        child_calls += n[0];
        late = late.max(Duration::from_micros(n[3]));
    }
    // Every slot is free once every client is done: none was leaked.
    let t0 = Instant::now();
    loop {
        let busy: Vec<u64> = (0..seg.slot_count())
            .map(|i| seg.slot(i).state.load(Ordering::Acquire))
            .filter(|w| shm::state_of(*w) != shm::SLOT_FREE)
            .collect();
        if busy.is_empty() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "slots left busy: {busy:x?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "calls: this process {} ({} withdrawn, {} writes), spinning handle {} ({} withdrawn), live children {}; at most {late:?} past a deadline; \
         {killed} clients killed, {killed_holding} while holding a slot (claimed {}, submitted {}, processing {}, done {}, abandoned {})",
        ca.calls, ca.withdrawn, ca.writes, cb.calls, cb.withdrawn, child_calls, states[1], states[2], states[3], states[4], states[5]
    );
    assert!(killed >= 3 && killed_holding * 2 >= killed, "too few kills landed while a slot was held: {killed_holding} of {killed}");
    assert!(ca.withdrawn + cb.withdrawn > 0, "no request was withdrawn");
    assert!(srv.stats().is_ok());
}
