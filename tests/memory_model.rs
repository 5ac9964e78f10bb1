//! Memory model end to end (issue 4 items 1-4 and the bad-input cases), through real servers and
//! clients: read-after-write across processes, exact namespace-filtered recall on a 1M-row table,
//! delete by namespace, payload round trips, TTL expiry and reclaim, the recency formula, and
//! bad input that must leave the store unchanged. Fresh random data every run (seed printed).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kalos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Kills a child server if the test panics (so a failing test never leaves a server running).
struct KillOnPanic(i32);
impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

fn rng() -> StdRng {
    let s: u64 = std::env::var("KALOS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("seed = {s} (rerun with KALOS_TEST_SEED={s})");
    StdRng::seed_from_u64(s)
}

fn server(name: &str, dim: u32, metric: Metric) -> Kalos {
    let o = Options { role: Role::Server, dim, metric, backend: Backend::Cpu, capacity: 1_100_000, ..Options::default() };
    Kalos::open(name, &o).unwrap()
}

fn uname(tag: &str) -> String {
    format!("mm-{tag}-{}-{}", std::process::id(), rand::random::<u16>())
}

// ----------------------------------------------------------------------------------------------
// Read-after-write across processes
// ----------------------------------------------------------------------------------------------

/// Runs only as a child (KALOS_MM_READER=<store name>): a separate process that, for each line
/// `+ id ns v0 v1 ...` or `- id ns` on stdin, recalls at once and answers `ok` or `FAIL why`.
#[test]
fn reader_helper() {
    let Ok(name) = std::env::var("KALOS_MM_READER") else { return };
    let k = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).unwrap();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            break;
        }
        let id: u64 = f[1].parse().unwrap();
        let ns: u64 = f[2].parse().unwrap();
        let q: Vec<f32> = if f.len() > 3 { f[3..].iter().map(|x| x.parse().unwrap()).collect() } else { vec![1.0; k.dim()] };
        let scoped = k.recall(&q, 8, &RecallOptions { namespaces: Some(vec![ns]), ..Default::default() }).unwrap();
        let all = k.recall(&q, 1024, &RecallOptions::default()).unwrap();
        let seen = scoped.iter().any(|h| h.id == id) && all.iter().any(|h| h.id == id);
        let ghost = scoped.iter().any(|h| h.id == id) || all.iter().any(|h| h.id == id);
        let verdict = match f[0] {
            "+" if seen => "ok".to_string(),
            "+" => format!("FAIL upserted id {id} not visible (scoped {scoped:?})"),
            "-" if !ghost => "ok".to_string(),
            _ => format!("FAIL deleted id {id} still returned"),
        };
        // A marker: the test harness may print "test reader_helper ... " on the same line.
        writeln!(out, "<<{verdict}>>").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn read_after_write_across_processes() {
    let mut rng = rng();
    let name = uname("raw");
    let dim = 16u32;
    // The server is a kalosd process, the writer is this process, the reader a third process.
    let mut srv = Command::new(env!("CARGO_BIN_EXE_kalosd"))
        .args(["serve", "--name", &name, "--dim", "16", "--metric", "ip", "--backend", "cpu", "--threads", "1", "--server-spin-us", "50"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut l = String::new();
    let _guard = KillOnPanic(srv.id() as i32);
    BufReader::new(srv.stdout.as_mut().unwrap()).read_line(&mut l).unwrap();
    assert!(l.contains("serving"), "{l}");
    let w = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).unwrap();
    let mut reader = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "reader_helper", "--nocapture", "--test-threads", "1"])
        .env("KALOS_MM_READER", &name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut rin = reader.stdin.take().unwrap();
    let mut rout = BufReader::new(reader.stdout.take().unwrap());
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut next_id = 1u64;
    let mut checks = 0;
    for _ in 0..300 {
        let line = if live.is_empty() || rng.random_bool(0.6) {
            let id = next_id;
            next_id += 1;
            let ns = rng.random_range(0..1_000_000u64);
            let v: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            w.upsert(&[id], &v, &UpsertOptions { namespaces: Namespaces::One(ns), ..Default::default() }).unwrap();
            live.push((id, ns));
            format!("+ {id} {ns} {}", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "))
        } else {
            let (id, ns) = live.swap_remove(rng.random_range(0..live.len()));
            assert_eq!(w.delete(&[id]).unwrap(), 1);
            format!("- {id} {ns}")
        };
        // The call above has returned: the other process must observe it immediately.
        writeln!(rin, "{line}").unwrap();
        rin.flush().unwrap();
        let mut ans = String::new();
        // Skip the test harness's own output.
        let verdict = loop {
            ans.clear();
            assert!(rout.read_line(&mut ans).unwrap() > 0, "reader process exited");
            if let (Some(a), Some(b)) = (ans.find("<<"), ans.find(">>")) {
                break ans[a + 2..b].to_string();
            }
        };
        assert_eq!(verdict, "ok", "after `{}`", &line[..line.len().min(40)]);
        checks += 1;
    }
    writeln!(rin).unwrap();
    drop(rin);
    let _ = reader.wait();
    drop(w);
    // SAFETY: plain kill(2) of our child.
    unsafe { libc::kill(srv.id() as i32, libc::SIGTERM) };
    assert!(srv.wait().unwrap().success());
    assert_eq!(checks, 300);
}

// ----------------------------------------------------------------------------------------------
// Namespace-filtered recall is exact on a 1M-row table
// ----------------------------------------------------------------------------------------------

fn brute(vecs: &[f32], ns: &[u64], dim: usize, q: &[f32], filter: Option<&[u64]>, k: usize) -> Vec<(f64, u64)> {
    let mut s: Vec<(f64, u64)> = (0..ns.len())
        .filter(|&r| filter.is_none_or(|f| f.contains(&ns[r])))
        .map(|r| (vecs[r * dim..(r + 1) * dim].iter().zip(q).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>(), r as u64))
        .collect();
    s.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
    s.truncate(k);
    s
}

#[test]
fn namespace_filter_is_exact_on_a_million_rows() {
    let mut rng = rng();
    let name = uname("ns1m");
    let dim = 16usize;
    let n = 1_000_000usize;
    let k = server(&name, dim as u32, Metric::InnerProduct);
    let vecs: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    // Namespace 7 holds exactly 0.1% of the rows (1000), namespace 8 holds 0.05%, the rest spread.
    let mut ns: Vec<u64> = (0..n).map(|_| rng.random_range(100..10_000u64)).collect();
    let mut rows: Vec<usize> = (0..n).collect();
    for i in 0..1500 {
        let j = rng.random_range(i..n);
        rows.swap(i, j);
        ns[rows[i]] = if i < 1000 { 7 } else { 8 };
    }
    let ids: Vec<u64> = (0..n as u64).collect();
    let t = Instant::now();
    for c in (0..n).step_by(8192) {
        let e = (c + 8192).min(n);
        k.upsert(&ids[c..e], &vecs[c * dim..e * dim], &UpsertOptions { namespaces: Namespaces::PerItem(&ns[c..e]), ..Default::default() })
            .unwrap();
    }
    eprintln!("loaded {n} rows in {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(k.stats().unwrap().count, n as u64);
    for qi in 0..6 {
        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let kk = [10usize, 100, 1000][qi % 3];
        for filter in [vec![7u64], vec![7, 8], vec![8, 123_456]] {
            let got = k.recall(&q, kk, &RecallOptions { namespaces: Some(filter.clone()), ..Default::default() }).unwrap();
            let want = brute(&vecs, &ns, dim, &q, Some(&filter), kk);
            assert_eq!(got.len(), want.len(), "filter {filter:?} k {kk}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g.score as f64 - w.0).abs() < 1e-4, "score {} vs {}", g.score, w.0);
                assert!(filter.contains(&ns[g.id as usize]), "id {} is outside the filter", g.id);
                if g.id != w.1 {
                    // Only a tie may reorder.
                    assert!(
                        (brute(&vecs[g.id as usize * dim..], &[0], dim, &q, None, 1)[0].0 - w.0).abs() < 1e-5,
                        "id {} vs {}",
                        g.id,
                        w.1
                    );
                }
            }
        }
    }
    // Unfiltered against brute force too (k = 10).
    let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let got: Vec<u64> = k.recall(&q, 10, &RecallOptions::default()).unwrap().iter().map(|h| h.id).collect();
    let want: Vec<u64> = brute(&vecs, &ns, dim, &q, None, 10).iter().map(|w| w.1).collect();
    assert_eq!(got, want);
    // Delete by namespace returns the count, and the namespace is gone.
    assert_eq!(k.delete_namespace(7).unwrap(), 1000);
    assert_eq!(k.delete_namespace(7).unwrap(), 0);
    assert!(k.recall(&q, 10, &RecallOptions { namespaces: Some(vec![7]), ..Default::default() }).unwrap().is_empty());
    assert_eq!(k.stats().unwrap().count, (n - 1000) as u64);
    assert_eq!(k.recall(&q, 1000, &RecallOptions { namespaces: Some(vec![8]), ..Default::default() }).unwrap().len(), 500);
    k.close();
}

// ----------------------------------------------------------------------------------------------
// Payloads, TTL, recency, bad input
// ----------------------------------------------------------------------------------------------

#[test]
fn payload_round_trip_through_recall_and_get() {
    let mut rng = rng();
    let name = uname("pay");
    let k = server(&name, 8, Metric::Cosine);
    let n = 200;
    let ids: Vec<u64> = (0..n).map(|_| rng.random()).collect();
    let vecs: Vec<f32> = (0..n * 8).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let payloads: Vec<Option<Vec<u8>>> = (0..n)
        .map(|i| match i % 4 {
            0 => None,
            1 => Some(Vec::new()),
            2 => Some((0..rng.random_range(1..65536)).map(|_| rng.random()).collect()),
            _ => Some(format!("memory {i}: the user prefers tea \u{1F375}").into_bytes()),
        })
        .collect();
    let refs: Vec<Option<&[u8]>> = payloads.iter().map(|p| p.as_deref()).collect();
    // 64 KiB payloads: upsert splits into several slot-sized requests.
    k.upsert(&ids, &vecs, &UpsertOptions { payloads: Some(refs), ..Default::default() }).unwrap();
    let want: HashMap<u64, Option<Vec<u8>>> = ids.iter().copied().zip(payloads.iter().cloned()).collect();
    for r in k.get(&ids).unwrap() {
        assert_eq!(r.payload, want[&r.id], "get payload of {}", r.id);
    }
    let mut seen = 0;
    for i in 0..20 {
        let hits = k.recall_with_payloads(&vecs[i * 8..(i + 1) * 8], 10, &RecallOptions::default()).unwrap();
        assert_eq!(hits[0].id, ids[i]);
        for h in hits {
            assert_eq!(h.payload, want[&h.id], "recall payload of {}", h.id);
            seen += 1;
        }
    }
    assert!(seen >= 200);
    k.close();
}

#[test]
fn ttl_expired_memories_are_never_returned_and_are_reclaimed() {
    let name = uname("ttl");
    let k = server(&name, 4, Metric::InnerProduct);
    let v = [1.0f32, 0.0, 0.0, 0.0];
    k.upsert(&[1, 2], &[v, v].concat(), &UpsertOptions { ttl_ms: 400, namespaces: Namespaces::One(5), ..Default::default() }).unwrap();
    k.upsert(&[3], &v, &UpsertOptions { namespaces: Namespaces::One(5), ..Default::default() }).unwrap();
    let exp = k.get(&[1]).unwrap()[0].expires_ms;
    let created = k.get(&[1]).unwrap()[0].created_ms;
    assert!(exp >= created + 400 && exp <= created + 401, "expires {exp} created {created}");
    assert_eq!(k.recall(&v, 10, &RecallOptions::default()).unwrap().len(), 3);
    // Poll across the expiry instant: once the wall clock is past it, 1 and 2 never come back.
    let t = Instant::now();
    let mut after = 0;
    while (t.elapsed() < Duration::from_millis(900) || after < 10) && t.elapsed() < Duration::from_secs(10) {
        let before_ms = kalos::types::now_unix_ms();
        let hits = k.recall(&v, 10, &RecallOptions { namespaces: Some(vec![5]), ..Default::default() }).unwrap();
        if before_ms >= exp {
            assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), vec![3], "expired memory returned");
            after += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(after > 10);
    // Reclaimed: the count drops within a housekeeping period.
    let t = Instant::now();
    while k.stats().unwrap().count != 1 {
        assert!(t.elapsed() < Duration::from_secs(3), "expired rows not reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(k.get(&[1]).unwrap_err().status, Status::NotFound);
    k.close();
}

#[test]
fn recency_weighting_matches_the_documented_formula() {
    let mut rng = rng();
    let name = uname("rec");
    let k = server(&name, 4, Metric::InnerProduct);
    let a: Vec<f32> = (0..4).map(|_| rng.random_range(0.1f32..1.0)).collect();
    let b: Vec<f32> = (0..4).map(|_| rng.random_range(0.1f32..1.0)).collect();
    k.upsert(&[1], &a, &UpsertOptions::default()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    k.upsert(&[2], &b, &UpsertOptions::default()).unwrap();
    let recs = k.get(&[1, 2]).unwrap();
    let q: Vec<f32> = (0..4).map(|_| rng.random_range(0.1f32..1.0)).collect();
    let (w, hl) = (0.4f32, 250.0f64);
    for _ in 0..5 {
        let t0 = kalos::types::now_unix_ms();
        let hits =
            k.recall(&q, 2, &RecallOptions { recency: Some(Recency { weight: w, half_life_ms: hl }), ..Default::default() }).unwrap();
        let t1 = kalos::types::now_unix_ms();
        assert_eq!(hits.len(), 2);
        for h in &hits {
            let r = recs.iter().find(|r| r.id == h.id).unwrap();
            let s: f64 = r.vector.iter().zip(&q).map(|(&x, &y)| x as f64 * y as f64).sum();
            // score' = (1 − w)·score + w·2^(−age/half_life), age = now − created (ms).
            let f = |now: u64| (1.0 - w as f64) * s + w as f64 * (-((now.saturating_sub(r.created_ms)) as f64) / hl).exp2();
            let (lo, hi) = (f(t1), f(t0));
            assert!(h.score as f64 >= lo - 1e-4 && h.score as f64 <= hi + 1e-4, "id {}: {} not in [{lo}, {hi}]", h.id, h.score);
        }
        let mut sorted = hits.clone();
        sorted.sort_by(|x, y| y.score.partial_cmp(&x.score).unwrap());
        assert_eq!(sorted, hits, "ordered by the weighted score");
        std::thread::sleep(Duration::from_millis(100));
    }
    k.close();
}

#[test]
fn bad_input_gets_a_clear_status_and_changes_nothing() {
    let name = uname("bad");
    let k = server(&name, 4, Metric::InnerProduct);
    let v = [1.0f32, 2.0, 3.0, 4.0];
    k.upsert(&[10, 11], &[v, v].concat(), &UpsertOptions { payloads: Some(vec![Some(b"ten"), None]), ..Default::default() }).unwrap();
    let before = k.get(&[10, 11]).unwrap();
    let check_unchanged = |what: &str| {
        assert_eq!(k.stats().unwrap().count, 2, "{what}");
        assert_eq!(k.get(&[10, 11]).unwrap(), before, "{what}");
    };
    // Expiry in the past.
    let e = k.upsert(&[12], &v, &UpsertOptions { expires_ms: 1000, ..Default::default() }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("past"), "{e}");
    check_unchanged("expiry in the past");
    // Payload too large (one past the limit), also for a replacement of an existing id.
    let big = vec![0u8; k.max_payload_bytes() + 1];
    let e = k.upsert(&[10], &v, &UpsertOptions { payloads: Some(vec![Some(&big)]), ..Default::default() }).unwrap_err();
    assert_eq!(e.status, Status::PayloadTooLarge, "{e}");
    assert!(e.message.contains("10"), "names the id: {e}");
    check_unchanged("payload too large");
    // Unknown id in get and in delete: reported by id, nothing deleted.
    let e = k.get(&[10, 999]).unwrap_err();
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains("999"), "{e}");
    let e = k.delete(&[11, 998]).unwrap_err();
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains("998"), "{e}");
    check_unchanged("unknown id in delete");
    k.close();
}

#[test]
fn bad_data_directories() {
    // A data directory that is a file, and one holding a different dimension.
    let base = std::env::temp_dir().join(format!("kalos-mm-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let o = Options { role: Role::Server, dim: 4, data_dir: Some(file), ..Options::default() };
    let e = Kalos::open(&uname("baddir"), &o).err().unwrap();
    assert_eq!(e.status, Status::Io, "{e}");
    let d = base.join("d");
    let o = Options { role: Role::Server, dim: 4, data_dir: Some(d.clone()), ..Options::default() };
    let k = Kalos::open(&uname("baddim"), &o).unwrap();
    k.upsert(&[1], &[1.0, 0.0, 0.0, 0.0], &UpsertOptions::default()).unwrap();
    k.close();
    let e = Kalos::open(&uname("baddim2"), &Options { dim: 8, ..o.clone() }).err().unwrap();
    assert_eq!(e.status, Status::DimensionMismatch, "{e}");
    // A corrupt directory (garbage log header) fails with Corrupt naming the file, and changes nothing.
    let wal = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "wal")).unwrap();
    let mut b = std::fs::read(&wal).unwrap();
    b[3] ^= 0xff;
    std::fs::write(&wal, &b).unwrap();
    let e = Kalos::open(&uname("badcrc"), &o).err().unwrap();
    assert_eq!(e.status, Status::Corrupt, "{e}");
    assert!(e.message.contains("wal-") && e.message.contains("offset 0"), "{e}");
    assert_eq!(std::fs::read(&wal).unwrap(), b);
    std::fs::remove_dir_all(&base).unwrap();
}
