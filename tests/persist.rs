//! Durability at the library level: Persist + Store directly (byte-exact torn-tail checks,
//! corruption detection, repair, locking). Fresh random data every run; the seed is printed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use kalos::persist::{self, Persist, PersistOptions, WalOp, HEADER_BYTES};
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, PartialEq)]
struct Row {
    ns: u64,
    v: Vec<f32>,
    p: Option<Vec<u8>>,
    created: u64,
    expires: u64,
}

type Model = BTreeMap<u64, Row>;

fn seed() -> u64 {
    let s = std::env::var("KALOS_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("seed = {s} (rerun with KALOS_TEST_SEED={s})");
    s
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kalos-persist-{tag}-{}-{}", std::process::id(), rand::random::<u32>()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(sync: SyncPolicy) -> PersistOptions {
    PersistOptions { sync, sync_interval_ms: 50 }
}

fn new_store(dim: usize, metric: Metric) -> Store {
    Store::new(dim, metric, 1 << 22, 65536)
}

fn open(dir: &Path, dim: usize, metric: Metric) -> Result<(Persist, persist::Recovery, Store)> {
    let mut s = new_store(dim, metric);
    let (p, r) = Persist::open(dir, dim, metric, &opts(SyncPolicy::Always), &mut s)?;
    Ok((p, r, s))
}

/// One random operation, applied to the model, the log and the store the way the server does it.
enum Op {
    Upsert(Vec<(u64, Row)>),
    Delete(Vec<u64>),
    DeleteNs(u64),
    Clear,
}

fn random_op(rng: &mut StdRng, model: &Model, dim: usize, universe: u64) -> Op {
    let r: f64 = rng.random();
    let far = 4_000_000_000_000u64;
    if r < 0.70 || model.is_empty() {
        let n = if rng.random_bool(0.2) { rng.random_range(2..40) } else { 1 };
        let mut rows = Vec::new();
        for _ in 0..n {
            let id = rng.random_range(0..universe);
            let plen = rng.random_range(0..300);
            rows.push((
                id,
                Row {
                    ns: rng.random_range(0..5),
                    v: (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
                    p: if rng.random_bool(0.7) { Some((0..plen).map(|_| rng.random()).collect()) } else { None },
                    created: rng.random_range(1..1_000_000),
                    expires: if rng.random_bool(0.2) { far + rng.random_range(0..1000) } else { NEVER },
                },
            ));
        }
        Op::Upsert(rows)
    } else if r < 0.93 {
        let keys: Vec<u64> = model.keys().copied().collect();
        let n = rng.random_range(1..=keys.len().min(5));
        let mut ids: Vec<u64> = (0..n).map(|_| keys[rng.random_range(0..keys.len())]).collect();
        ids.dedup();
        Op::Delete(ids)
    } else if r < 0.99 {
        Op::DeleteNs(rng.random_range(0..5))
    } else {
        Op::Clear
    }
}

fn apply(op: &Op, model: &mut Model, p: &mut Persist, store: &mut Store) {
    match op {
        Op::Upsert(rows) => {
            let items: Vec<UpsertItem> = rows
                .iter()
                .map(|(id, r)| UpsertItem {
                    fields: &[],
                    id: *id,
                    namespace: r.ns,
                    vector: &r.v,
                    payload: r.p.as_deref(),
                    created_ms: r.created,
                    expires_ms: r.expires,
                })
                .collect();
            store.validate_upsert(&items).unwrap();
            p.append(&WalOp::Upsert(&items)).unwrap();
            store.apply_upsert(&items);
            for (id, r) in rows {
                model.insert(*id, r.clone());
            }
        }
        Op::Delete(ids) => {
            p.append(&WalOp::Delete(ids)).unwrap();
            store.delete(ids).unwrap();
            for id in ids {
                model.remove(id);
            }
        }
        Op::DeleteNs(ns) => {
            p.append(&WalOp::DeleteNamespace(*ns)).unwrap();
            store.delete_namespace(*ns);
            model.retain(|_, r| r.ns != *ns);
        }
        Op::Clear => {
            p.append(&WalOp::Clear).unwrap();
            store.clear();
            model.clear();
        }
    }
    p.commit().unwrap();
}

fn assert_matches(store: &Store, model: &Model, ctx: &str) {
    assert_eq!(store.len(), model.len(), "{ctx}: row count");
    for (id, r) in model {
        let g = store.get(*id).unwrap_or_else(|| panic!("{ctx}: id {id} missing"));
        assert_eq!(g.namespace, r.ns, "{ctx}: id {id} namespace");
        assert_eq!(g.payload, r.p, "{ctx}: id {id} payload");
        assert_eq!(g.created_ms, r.created, "{ctx}: id {id} created");
        assert_eq!(g.expires_ms, r.expires, "{ctx}: id {id} expires");
        for (a, b) in g.vector.iter().zip(&r.v) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{ctx}: id {id} vector {:?} vs {:?}", g.vector, r.v);
        }
    }
}

/// Copies the snapshots and logs of `a` into a fresh directory `b`, made 0700 as a data
/// directory must be.
fn copy_dir(a: &Path, b: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    let _ = std::fs::remove_dir_all(b);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(b).unwrap();
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() && e.file_name() != "LOCK" {
            std::fs::copy(e.path(), b.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn roundtrip_with_snapshots_and_reopen() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tmpdir("rt");
    for metric in [Metric::InnerProduct, Metric::Cosine, Metric::L2] {
        let _ = std::fs::remove_dir_all(&dir);
        let dim = 8;
        let mut model = Model::new();
        let (mut p, r, mut s) = open(&dir, dim, metric).unwrap();
        assert_eq!(r.snapshot_rows + r.records_replayed, 0);
        for round in 0..4 {
            for _ in 0..150 {
                let op = random_op(&mut rng, &model, dim, 300);
                apply(&op, &mut model, &mut p, &mut s);
            }
            if round % 2 == 1 {
                p.snapshot(&s).unwrap();
            }
            drop(p);
            let (p2, r, s2) = open(&dir, dim, metric).unwrap();
            assert!(r.torn_tail.is_none());
            assert_matches(&s2, &model, &format!("{metric:?} round {round}"));
            p = p2;
            s = s2;
        }
        // Only the newest generation is left behind.
        let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert_eq!(names.iter().filter(|n| n.ends_with(".snap")).count(), 1, "{names:?}");
        assert_eq!(names.iter().filter(|n| n.ends_with(".wal")).count(), 1, "{names:?}");
        drop(p);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn torn_tail_at_random_offsets_loses_only_the_cut_suffix() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tmpdir("torn");
    let dim = 6;
    let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
    let mut model = Model::new();
    // A snapshot in the middle, so the log replays on top of one.
    let mut states = Vec::new();
    for _ in 0..60 {
        let op = random_op(&mut rng, &model, dim, 100);
        apply(&op, &mut model, &mut p, &mut s);
    }
    p.snapshot(&s).unwrap();
    let log = p.log_path().to_path_buf();
    states.push((p.log_len(), model.clone()));
    for _ in 0..120 {
        let op = random_op(&mut rng, &model, dim, 100);
        apply(&op, &mut model, &mut p, &mut s);
        states.push((p.log_len(), model.clone()));
    }
    drop(p);
    let full = std::fs::metadata(&log).unwrap().len();
    let work = tmpdir("torn-work");
    for trial in 0..40 {
        copy_dir(&dir, &work);
        let cut = if trial == 0 { HEADER_BYTES as u64 } else { rng.random_range(HEADER_BYTES as u64..=full) };
        let wlog = work.join(log.file_name().unwrap());
        std::fs::OpenOptions::new().write(true).open(&wlog).unwrap().set_len(cut).unwrap();
        let (p2, r, s2) = open(&work, dim, Metric::InnerProduct).unwrap();
        // The state is the one after the last record that ends at or before the cut.
        let (end, want) = states.iter().rev().find(|(l, _)| *l <= cut).unwrap();
        assert_matches(&s2, want, &format!("cut at {cut}"));
        if *end == cut {
            assert!(r.torn_tail.is_none(), "cut at a record boundary is not torn: {:?}", r.torn_tail);
        } else {
            let t = r.torn_tail.clone().expect("a cut inside a record is reported");
            assert!(t.contains(&format!("offset {end}")) && t.contains(&format!("dropped {} bytes", cut - end)), "{t}");
        }
        // The truncation is made permanent and the log accepts new records.
        assert_eq!(std::fs::metadata(&wlog).unwrap().len(), *end);
        drop(p2);
        let (_, r3, s3) = open(&work, dim, Metric::InnerProduct).unwrap();
        assert!(r3.torn_tail.is_none());
        assert_eq!(s3.len(), want.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&work).unwrap();
}

/// Builds a directory with a log of `n` committed ops; returns (dir, log path, ends, states).
fn build_log(rng: &mut StdRng, tag: &str, n: usize, dim: usize) -> (PathBuf, PathBuf, Vec<(u64, Model)>) {
    let dir = tmpdir(tag);
    let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
    let mut model = Model::new();
    let mut states = vec![(p.log_len(), model.clone())];
    for _ in 0..n {
        let op = random_op(rng, &model, dim, 100);
        apply(&op, &mut model, &mut p, &mut s);
        states.push((p.log_len(), model.clone()));
    }
    let log = p.log_path().to_path_buf();
    drop(p);
    (dir, log, states)
}

#[test]
fn flipped_byte_mid_log_fails_open_with_file_and_offset_and_repair_keeps_the_prefix() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 5;
    for trial in 0..8 {
        let (dir, log, states) = build_log(&mut rng, "flip", 80, dim);
        let last_start = states[states.len() - 2].0;
        // A byte anywhere in the records before the last one.
        let pos = rng.random_range(HEADER_BYTES as u64..last_start);
        let mut b = std::fs::read(&log).unwrap();
        b[pos as usize] ^= 1 << rng.random_range(0..8);
        std::fs::write(&log, &b).unwrap();
        // The damaged record is the one whose byte range holds `pos`.
        let k = states.iter().rposition(|(l, _)| *l <= pos).unwrap();
        let rec_start = states[k].0;
        let e = open(&dir, dim, Metric::InnerProduct).err().expect("open must fail");
        assert_eq!(e.status, Status::Corrupt, "{e}");
        assert!(e.message.contains(&log.display().to_string()), "{e}");
        assert!(e.message.contains(&format!("offset {rec_start}")), "trial {trial}: flipped {pos}, want record at {rec_start}: {e}");
        assert_eq!(std::fs::read(&log).unwrap(), b, "a failed open changes nothing");
        // Repair: the intact prefix (records before the damaged one) survives; originals kept.
        let rep = persist::repair(&dir).unwrap();
        assert_eq!(rep.records_replayed as usize, k, "{rep:?}");
        assert!(rep.records_after_damage > 0, "{rep:?}");
        let backup = rep.backup.clone().unwrap();
        assert_eq!(std::fs::read(backup.join(log.file_name().unwrap())).unwrap(), b, "the damaged log is kept");
        let (_, r, s) = open(&dir, dim, Metric::InnerProduct).unwrap();
        assert!(r.torn_tail.is_none());
        assert_matches(&s, &states[k].1, "after repair");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn damaged_last_record_is_a_reported_torn_tail() {
    let mut rng = StdRng::seed_from_u64(seed());
    let (dir, log, states) = build_log(&mut rng, "last", 20, 4);
    let last_start = states[states.len() - 2].0;
    let full = states.last().unwrap().0;
    let pos = rng.random_range(last_start..full);
    let mut b = std::fs::read(&log).unwrap();
    b[pos as usize] ^= 0x10;
    std::fs::write(&log, &b).unwrap();
    let (_, r, s) = open(&dir, 4, Metric::InnerProduct).unwrap();
    let t = r.torn_tail.expect("reported");
    assert!(t.contains(&format!("offset {last_start}")), "{t}");
    assert_matches(&s, &states[states.len() - 2].1, "torn last record");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_snapshot_fails_open_and_repair_salvages_intact_blocks() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tmpdir("snap");
    let dim = 128;
    let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
    let mut model = Model::new();
    // ~6.6 MB of rows: two 4 MiB snapshot blocks.
    let n = 12_000u64;
    let vecs: Vec<f32> = (0..n as usize * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    for c in 0..(n / 500) {
        let items: Vec<UpsertItem> = (c * 500..(c + 1) * 500)
            .map(|i| UpsertItem {
                fields: &[],
                id: i,
                namespace: i % 3,
                vector: &vecs[i as usize * dim..(i as usize + 1) * dim],
                payload: None,
                created_ms: 1,
                expires_ms: NEVER,
            })
            .collect();
        p.append(&WalOp::Upsert(&items)).unwrap();
        s.apply_upsert(&items);
        p.commit().unwrap();
        for it in &items {
            model.insert(it.id, Row { ns: it.namespace, v: it.vector.to_vec(), p: None, created: 1, expires: NEVER });
        }
    }
    p.snapshot(&s).unwrap();
    // A few log records on top of the snapshot (no Clear or namespace delete: they could wipe
    // the snapshot's rows from the model and leave nothing for the repair to lose).
    let mut applied = 0;
    while applied < 10 {
        let op = random_op(&mut rng, &model, dim, n);
        if matches!(op, Op::Clear | Op::DeleteNs(_)) {
            continue;
        }
        apply(&op, &mut model, &mut p, &mut s);
        applied += 1;
    }
    drop(p);
    let snap = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "snap")).unwrap();
    let mut b = std::fs::read(&snap).unwrap();
    let pos = rng.random_range(HEADER_BYTES + 100..HEADER_BYTES + 4_000_000);
    b[pos] ^= 0x01;
    std::fs::write(&snap, &b).unwrap();
    let e = open(&dir, dim, Metric::InnerProduct).err().expect("corrupt snapshot fails the open");
    assert_eq!(e.status, Status::Corrupt);
    assert!(e.message.contains(&snap.display().to_string()) && e.message.contains(&format!("offset {HEADER_BYTES}")), "{e}");
    let rep = persist::repair(&dir).unwrap();
    assert!(rep.notes.iter().any(|n| n.contains("damaged block at offset")), "{rep:?}");
    let (_, _, s2) = open(&dir, dim, Metric::InnerProduct).unwrap();
    // Everything recovered is exactly right, and only the damaged block's rows are missing.
    assert_eq!(s2.len() as u64, rep.rows);
    assert!(!s2.is_empty() && s2.len() < model.len(), "{} of {}", s2.len(), model.len());
    let mut m2 = Model::new();
    for (id, r) in &model {
        if s2.get(*id).is_some() {
            m2.insert(*id, r.clone());
        }
    }
    assert_matches(&s2, &m2, "salvaged");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn locked_directory_and_shape_mismatch_and_missing_snapshot() {
    let dir = tmpdir("lock");
    let (p, _, _) = open(&dir, 4, Metric::Cosine).unwrap();
    let e = open(&dir, 4, Metric::Cosine).err().unwrap();
    assert_eq!(e.status, Status::Locked, "{e}");
    assert!(e.message.contains(&std::process::id().to_string()), "names the holder: {e}");
    drop(p);
    assert_eq!(open(&dir, 5, Metric::Cosine).err().unwrap().status, Status::DimensionMismatch);
    assert_eq!(open(&dir, 4, Metric::L2).err().unwrap().status, Status::InvalidArgument);
    // A snapshot that disappeared is corruption, never an empty store.
    let (mut p, _, s) = open(&dir, 4, Metric::Cosine).unwrap();
    p.snapshot(&s).unwrap();
    drop(p);
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap().path();
        if e.extension().is_some_and(|x| x == "snap") {
            std::fs::remove_file(e).unwrap();
        }
    }
    let e = open(&dir, 4, Metric::Cosine).err().unwrap();
    assert_eq!(e.status, Status::Corrupt, "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn server_level_lock_two_servers_one_data_dir() {
    let dir = tmpdir("srvlock");
    let name = format!("plock-{}", std::process::id());
    let o = Options { role: Role::Server, dim: 4, metric: Metric::InnerProduct, data_dir: Some(dir.clone()), ..Options::default() };
    let a = Kalos::open(&name, &o).unwrap();
    a.upsert(&[1], &[1., 2., 3., 4.], &UpsertOptions::default()).unwrap();
    let e = Kalos::open(&format!("{name}-b"), &o).err().expect("second server on the same data dir");
    assert_eq!(e.status, Status::Locked, "{e}");
    assert_eq!(a.stats().unwrap().count, 1, "the first server is unaffected");
    a.close();
    let b = Kalos::open(&format!("{name}-b"), &o).unwrap();
    assert_eq!(b.get(&[1]).unwrap()[0].vector, vec![1., 2., 3., 4.]);
    b.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_headers_fail_open_and_repair_reads_past_them() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 6;
    for which in ["snap", "wal"] {
        let dir = tmpdir(&format!("hdr-{which}"));
        let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
        let mut model = Model::new();
        for _ in 0..40 {
            let op = random_op(&mut rng, &model, dim, 200);
            apply(&op, &mut model, &mut p, &mut s);
        }
        p.snapshot(&s).unwrap();
        for _ in 0..40 {
            let op = random_op(&mut rng, &model, dim, 200);
            apply(&op, &mut model, &mut p, &mut s);
        }
        drop(p);
        let f = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == which)).unwrap();
        let mut b = std::fs::read(&f).unwrap();
        b[rng.random_range(8..40)] ^= 0x02; // inside the checksummed header fields
        std::fs::write(&f, &b).unwrap();
        let e = open(&dir, dim, Metric::InnerProduct).err().expect("a damaged header fails the open");
        assert_eq!(e.status, Status::Corrupt, "{e}");
        assert!(e.message.contains(&f.display().to_string()) && e.message.contains("offset 40"), "{e}");
        let rep = persist::repair(&dir).unwrap();
        assert!(rep.notes.iter().any(|n| n.contains("header unreadable")), "{rep:?}");
        let (_, _, s2) = open(&dir, dim, Metric::InnerProduct).unwrap();
        assert_matches(&s2, &model, &format!("repair past a damaged {which} header"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A crash while the FIRST background snapshot is written (no earlier snapshot): wal-0 and wal-1
/// must replay as one chain. (Found by tests/crash.rs: recovery used to call this Corrupt.)
#[test]
fn crash_during_first_background_snapshot_replays_wal0_and_wal1() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 5;
    let dir = tmpdir("bg-first");
    let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
    let mut model = Model::new();
    for _ in 0..40 {
        let op = random_op(&mut rng, &model, dim, 100);
        apply(&op, &mut model, &mut p, &mut s);
    }
    let wal0 = std::fs::read(dir.join("wal-0000000000000000.wal")).unwrap();
    p.start_snapshot(&s).unwrap(); // generation 1, written by a thread
    for _ in 0..40 {
        let op = random_op(&mut rng, &model, dim, 100);
        apply(&op, &mut model, &mut p, &mut s);
    }
    while p.snapshot_in_progress() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(p);
    // Recreate the state of a crash before the rename: wal-0 still there, no snap-1, a temp file.
    let crashed = tmpdir("bg-first-crash");
    copy_dir(&dir, &crashed);
    for e in std::fs::read_dir(&crashed).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().to_string();
        if n.starts_with("snap-") {
            std::fs::remove_file(crashed.join(n)).unwrap();
        }
    }
    std::fs::write(crashed.join("wal-0000000000000000.wal"), &wal0).unwrap();
    std::fs::write(crashed.join("snap-0000000000000001.snap.tmp"), b"half").unwrap();
    let (_p2, r, s2) = open(&crashed, dim, Metric::InnerProduct).unwrap();
    assert_eq!(r.generation, 0, "{r:?}");
    assert_matches(&s2, &model, "crash during the first background snapshot");
    for d in [&dir, &crashed] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// Crash states of a background snapshot: before its rename (the log chain old-snapshot + two
/// logs must replay), and after the rename but before the clean-up (the new snapshot wins and the
/// old generation is deleted).
#[test]
fn background_snapshot_crash_states_recover_the_log_chain() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 6;
    let dir = tmpdir("bg");
    let (mut p, _, mut s) = open(&dir, dim, Metric::Cosine).unwrap();
    let mut model = Model::new();
    for _ in 0..50 {
        let op = random_op(&mut rng, &model, dim, 150);
        apply(&op, &mut model, &mut p, &mut s);
    }
    p.snapshot(&s).unwrap(); // generation 1
    for _ in 0..50 {
        let op = random_op(&mut rng, &model, dim, 150);
        apply(&op, &mut model, &mut p, &mut s);
    }
    let model_at_bg = model.clone();
    p.start_snapshot(&s).unwrap(); // generation 2, written by a thread
    for _ in 0..50 {
        let op = random_op(&mut rng, &model, dim, 150);
        apply(&op, &mut model, &mut p, &mut s);
    }
    while p.snapshot_in_progress() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Files now: snap-1, wal-1, wal-2 (with records), snap-2 (renamed, not yet collected).
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .filter(|n: &String| n != "LOCK")
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&dir).len(), 4, "{:?}", names(&dir));
    // Crash before the rename: no snap-2.
    let before = tmpdir("bg-before");
    copy_dir(&dir, &before);
    for n in names(&before) {
        if n.starts_with("snap-0000000000000002") {
            std::fs::remove_file(before.join(n)).unwrap();
        }
    }
    std::fs::write(before.join("snap-0000000000000002.snap.tmp"), b"half a snapshot").unwrap();
    let (p2, r, s2) = open(&before, dim, Metric::Cosine).unwrap();
    assert_eq!((r.generation, r.records_replayed), (1, 100), "{r:?}");
    assert_matches(&s2, &model, "crash before the rename");
    drop(p2);
    assert!(!before.join("snap-0000000000000002.snap.tmp").exists(), "temp file removed");
    // Crash after the rename, before the clean-up: snapshot 2 + wal-2; old files deleted.
    let after = tmpdir("bg-after");
    copy_dir(&dir, &after);
    let (p3, r, s3) = open(&after, dim, Metric::Cosine).unwrap();
    assert_eq!((r.generation, r.snapshot_rows as usize, r.records_replayed), (2, model_at_bg.len(), 50), "{r:?}");
    assert_matches(&s3, &model, "crash after the rename");
    drop(p3);
    assert_eq!(names(&after), vec!["snap-0000000000000002.snap".to_string(), "wal-0000000000000002.wal".to_string()]);
    // A gap in the chain is corruption, never silent loss.
    let gap = tmpdir("bg-gap");
    copy_dir(&before, &gap);
    std::fs::remove_file(gap.join("wal-0000000000000001.wal")).unwrap();
    let e = open(&gap, dim, Metric::Cosine).err().unwrap();
    assert_eq!(e.status, Status::Corrupt, "{e}");
    assert!(e.message.contains("wal-0000000000000001.wal is missing"), "{e}");
    // The live handle collects the snapshot and cleans up on its own.
    drop(p);
    let (_, r, s4) = open(&dir, dim, Metric::Cosine).unwrap();
    assert_eq!(r.generation, 2);
    assert_matches(&s4, &model, "clean");
    for d in [&dir, &before, &after, &gap] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A log whose header is intact but names another generation than its file (a file copied or
/// renamed by hand) fails the open as CORRUPT; repair must treat it as damage, keep its records
/// and leave a directory that opens (found by tests/fuzz.rs: repair reported "no damage found").
#[test]
fn repair_fixes_a_log_header_naming_another_generation() {
    let mut rng = StdRng::seed_from_u64(seed());
    let (dir, _, states) = build_log(&mut rng, "gen-header", 12, 4);
    let model = &states.last().unwrap().1;
    let wal = dir.join("wal-0000000000000000.wal");
    let mut b = std::fs::read(&wal).unwrap();
    let h = persist::fuzz::decode_header(&b, false).unwrap();
    b[..HEADER_BYTES].copy_from_slice(&persist::fuzz::encode_header(false, persist::fuzz::Header { generation: 5, ..h }));
    std::fs::write(&wal, &b).unwrap();
    let e = open(&dir, 4, Metric::InnerProduct).err().expect("the open refuses the log");
    assert_eq!(e.status, Status::Corrupt, "{e}");
    let rep = persist::repair(&dir).unwrap();
    assert!(rep.backup.is_some(), "repair found the damage: {:?}", rep.notes);
    let (_, _, s) = open(&dir, 4, Metric::InnerProduct).unwrap();
    assert_matches(&s, model, "after repairing the header's generation");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes `ops` random operations and a snapshot into a fresh directory, rewrites the snapshot's
/// header with `tamper` (its checksum recomputed, so the header stays intact), and checks that
/// the open refuses the directory as CORRUPT, that repair finds the damage, and that the repaired
/// directory opens to every row written (`what` names the case).
fn tampered_snapshot_header_is_repaired(
    rng: &mut StdRng,
    metric: Metric,
    ops: usize,
    what: &str,
    tamper: impl FnOnce(persist::fuzz::Header) -> persist::fuzz::Header,
) {
    let dir = tmpdir("snap-header");
    let mut model = Model::new();
    {
        let (mut p, _, mut s) = open(&dir, 4, metric).unwrap();
        for _ in 0..ops {
            let op = random_op(rng, &model, 4, 40);
            apply(&op, &mut model, &mut p, &mut s);
        }
        p.snapshot(&s).unwrap();
    }
    let snap = dir.join("snap-0000000000000001.snap");
    let mut b = std::fs::read(&snap).unwrap();
    let h = persist::fuzz::decode_header(&b, true).unwrap();
    b[..HEADER_BYTES].copy_from_slice(&persist::fuzz::encode_header(true, tamper(h)));
    std::fs::write(&snap, &b).unwrap();
    let e = open(&dir, 4, metric).err().unwrap_or_else(|| panic!("{what}: the open accepted the directory"));
    assert_eq!(e.status, Status::Corrupt, "{what}: {e}");
    let rep = persist::repair(&dir).unwrap();
    assert!(rep.backup.is_some(), "{what}: repair found no damage: {:?}", rep.notes);
    let (_, _, s) = open(&dir, 4, metric).unwrap();
    assert_matches(&s, &model, &format!("after repairing {what}"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot whose intact header names another generation than its file: the same (also for
/// generation 2^64-1, which repair once took for its mark of an unreadable header).
#[test]
fn repair_fixes_a_snapshot_header_naming_another_generation() {
    let mut rng = StdRng::seed_from_u64(seed());
    for generation in [9, u64::MAX] {
        let what = format!("a snapshot header naming generation {generation}");
        tampered_snapshot_header_is_repaired(&mut rng, Metric::L2, 10, &what, |h| persist::fuzz::Header { generation, ..h });
    }
}

/// A snapshot whose intact header says sequence number 2^64 - 1 followed by a log that does not
/// continue it: the open refuses the log; repair took that sequence number for its mark of an
/// unreadable header, accepted the log and reported no damage (found by tests/fuzz.rs).
#[test]
fn repair_checks_a_log_against_a_snapshot_at_the_last_sequence_number() {
    let mut rng = StdRng::seed_from_u64(seed());
    let what = "a log that does not continue a snapshot at sequence number 2^64 - 1";
    tampered_snapshot_header_is_repaired(&mut rng, Metric::InnerProduct, 6, what, |h| persist::fuzz::Header { seq: u64::MAX, ..h });
}

/// Rows the store refuses (a vector that is not finite, or whose L2 norm passes f32) inside
/// checksum-intact files, in a log record beside a valid row and in a snapshot block: what a
/// store holds when such a vector was accepted on its way in. The open refuses the directory;
/// repair leaves out exactly those rows, naming them, and keeps every other row, the valid row of
/// the same record included.
#[test]
fn repair_keeps_every_valid_row_around_rows_the_store_refuses() {
    let mut rng = StdRng::seed_from_u64(seed());
    let (inf, huge, fine): (&[f32], &[f32], &[f32]) = (&[f32::INFINITY, 0.0, 1.0, 0.0], &[3e38; 4], &[0.5, -0.5, 0.25, 1.0]);
    let item = |id: u64, v: &'static [f32]| UpsertItem {
        fields: &[],
        id,
        namespace: 1,
        vector: v,
        payload: None,
        created_ms: 7,
        expires_ms: NEVER,
    };
    for in_snapshot in [false, true] {
        let dir = tmpdir("refused-rows");
        let mut model = Model::new();
        {
            let (mut p, _, mut s) = open(&dir, 4, Metric::L2).unwrap();
            for _ in 0..8 {
                let op = random_op(&mut rng, &model, 4, 40);
                apply(&op, &mut model, &mut p, &mut s);
            }
            let rows = [item(500, fine), item(1000, inf), item(1001, huge)];
            if in_snapshot {
                s.apply_upsert(&rows);
                p.snapshot(&s).unwrap();
            } else {
                p.append(&WalOp::Upsert(&rows)).unwrap();
                p.commit().unwrap();
                s.apply_upsert(&rows[..1]);
            }
            model.insert(500, Row { ns: 1, v: fine.to_vec(), p: None, created: 7, expires: NEVER });
            for _ in 0..8 {
                let op = random_op(&mut rng, &model, 4, 40);
                apply(&op, &mut model, &mut p, &mut s);
            }
        }
        let what = if in_snapshot { "snapshot" } else { "log" };
        assert!(open(&dir, 4, Metric::L2).is_err(), "{what}: the open accepted rows the store refuses");
        let rep = persist::repair(&dir).unwrap_or_else(|e| panic!("{what}: repair failed: {e}"));
        assert!(rep.backup.is_some(), "{what}: repair found nothing to repair: {:?}", rep.notes);
        for id in [1000, 1001] {
            assert!(rep.notes.iter().any(|n| n.contains(&format!("id {id}"))), "{what}: no note names id {id}: {:?}", rep.notes);
        }
        let (_, _, s) = open(&dir, 4, Metric::L2).unwrap();
        assert_matches(&s, &model, &format!("{what}: after repair"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A header (checksum intact) naming a dimension no store can have is not trusted by repair or
/// `dir_shape`: repair used it to size its snapshot buffer, 4 bytes per dimension per row (a
/// dimension of 2^30 asked for 4 GiB at once; found by tests/fuzz.rs).
#[test]
fn repair_refuses_a_header_dimension_beyond_max_dim() {
    for dim in [0u32, kalos::types::MAX_DIM as u32 + 1, 1 << 30, u32::MAX] {
        let dir = private_dir("huge-dim");
        let h = persist::fuzz::Header { dim, metric: 0, generation: 0, seq: 0 };
        std::fs::write(dir.join("wal-0000000000000000.wal"), persist::fuzz::encode_header(false, h)).unwrap();
        assert!(persist::dir_shape(&dir).unwrap().is_none(), "dim {dim}");
        assert_eq!(persist::repair(&dir).unwrap_err().status, Status::NotFound, "dim {dim}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Repair's note about a snapshot whose end block counts fewer rows than its blocks hold names
/// both counts (it subtracted them the wrong way round: a wrapped count of "lost" rows, or an
/// overflow panic in builds that check arithmetic; found by fuzz/).
#[test]
fn salvaging_a_snapshot_whose_end_block_undercounts_says_so() {
    let mut s = new_store(2, Metric::InnerProduct);
    let (v, p) = ([1.0f32, 2.0], Some(&b"x"[..]));
    let items: Vec<UpsertItem> =
        (0..2).map(|id| UpsertItem { fields: &[], id, namespace: 0, vector: &v, payload: p, created_ms: 1, expires_ms: NEVER }).collect();
    s.apply_upsert(&items);
    let mut b = persist::fuzz::encode_snapshot(&s, 1, 0);
    let end = b.len() - 20;
    b[end + 12..].copy_from_slice(&0u64.to_le_bytes());
    let crc = persist::crc32c_update(persist::crc32c(&b[end..end + 4]), &b[end + 8..]);
    b[end + 4..end + 8].copy_from_slice(&crc.to_le_bytes());
    let mut strict = new_store(2, Metric::InnerProduct);
    assert_eq!(persist::fuzz::load_snapshot(&b, &mut strict, false).unwrap_err().status, Status::Corrupt);
    let mut salvaged = new_store(2, Metric::InnerProduct);
    let l = persist::fuzz::load_snapshot(&b, &mut salvaged, true).unwrap();
    assert_eq!((l.rows, salvaged.len()), (2, 2));
    assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
    assert!(l.notes[0].ends_with("the end block says 0 rows; the blocks hold 2"), "{:?}", l.notes);
}

// Permissions, ownership and links (docs/DURABILITY.md, "Permissions and ownership").

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory made 0700 before Kalos sees it (as `mkdir -m 700` would).
fn private_dir(tag: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let d = tmpdir(tag);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    set_mode(&d, 0o700);
    d
}

fn random_ops(rng: &mut StdRng, n: usize, model: &mut Model, p: &mut Persist, s: &mut Store) {
    let dim = s.dim();
    for _ in 0..n {
        let op = random_op(rng, model, dim, 100);
        apply(&op, model, p, s);
    }
}

#[test]
fn created_data_dir_is_0700_and_every_file_0600() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 4;
    let base = tmpdir("modes");
    let dir = base.join("nested").join("data");
    let (mut p, _, mut s) = open(&dir, dim, Metric::L2).unwrap();
    let mut model = Model::new();
    random_ops(&mut rng, 30, &mut model, &mut p, &mut s);
    p.snapshot(&s).unwrap(); // snap-1 (through snap-1.snap.tmp) and wal-1
    random_ops(&mut rng, 30, &mut model, &mut p, &mut s);
    p.start_snapshot(&s).unwrap(); // snap-2 and wal-2, the snapshot written by a thread
    while p.snapshot_in_progress() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    random_ops(&mut rng, 10, &mut model, &mut p, &mut s);
    drop(p);
    assert_eq!(mode_of(&dir), 0o700, "the data directory {}", dir.display());
    let entries = |d: &Path| -> Vec<PathBuf> { std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).collect() };
    let files = entries(&dir);
    let has = |suffix: &str| files.iter().any(|f| f.to_string_lossy().ends_with(suffix));
    assert!(has("/LOCK") && has(".snap") && has(".wal"), "{files:?}");
    for f in &files {
        assert_eq!(mode_of(f), 0o600, "{}", f.display());
    }
    // Repair moves the files into a directory of its own and writes a new generation.
    let wal = files.iter().find(|f| f.extension().is_some_and(|x| x == "wal")).unwrap();
    std::fs::OpenOptions::new().append(true).open(wal).unwrap().write_all(&[1, 2, 3]).unwrap();
    let backup = persist::repair(&dir).unwrap().backup.expect("a torn tail is repaired");
    assert_eq!(mode_of(&backup), 0o700, "{}", backup.display());
    for f in entries(&dir).iter().filter(|f| **f != backup).chain(entries(&backup).iter()) {
        assert_eq!(mode_of(f), 0o600, "{}", f.display());
    }
    let (_, _, s2) = open(&dir, dim, Metric::L2).unwrap();
    assert_matches(&s2, &model, "after repair");
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn symlinks_in_the_data_directory_are_refused_never_followed() {
    use std::os::unix::fs::symlink;
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 4;
    let precious: &[u8] = b"precious: not Kalos data\n";
    let base = private_dir("links");
    let outside = |n: &str| -> PathBuf {
        let f = base.join(n);
        std::fs::write(&f, precious).unwrap();
        f
    };
    // The lock file.
    let dir = base.join("lock");
    std::fs::create_dir(&dir).unwrap();
    set_mode(&dir, 0o700);
    let target = outside("lock-target");
    symlink(&target, dir.join("LOCK")).unwrap();
    let e = open(&dir, dim, Metric::Cosine).err().expect("a LOCK that is a symlink is refused");
    assert_eq!(e.status, Status::PermissionDenied, "{e}");
    assert!(e.message.contains(&dir.join("LOCK").display().to_string()) && e.message.contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), precious, "the LOCK link's target is untouched");
    // A link placed where the next log, snapshot temporary or snapshot will be created.
    for (what, name) in
        [("log", "wal-0000000000000001.wal"), ("temporary", "snap-0000000000000001.snap.tmp"), ("snapshot", "snap-0000000000000001.snap")]
    {
        let dir = base.join(what);
        let (mut p, _, mut s) = open(&dir, dim, Metric::Cosine).unwrap();
        let mut model = Model::new();
        random_ops(&mut rng, 20, &mut model, &mut p, &mut s);
        let target = outside(&format!("{what}-target"));
        let link = dir.join(name);
        symlink(&target, &link).unwrap();
        let e = p.snapshot(&s).err().unwrap_or_else(|| panic!("{what}: a snapshot through a link must fail"));
        assert_eq!(e.status, Status::PermissionDenied, "{what}: {e}");
        assert!(e.message.contains(&link.display().to_string()) && e.message.contains("symbolic link"), "{what}: {e}");
        assert_eq!(std::fs::read(&target).unwrap(), precious, "{what}: the link's target is untouched");
        // The log keeps every write.
        random_ops(&mut rng, 20, &mut model, &mut p, &mut s);
        drop(p);
        if what == "temporary" {
            // A leftover temporary is deleted at open: the link itself, never its target.
            let (_, _, s2) = open(&dir, dim, Metric::Cosine).unwrap();
            assert_matches(&s2, &model, what);
            assert!(std::fs::symlink_metadata(&link).is_err(), "{what}: the link is removed");
        } else {
            let e = open(&dir, dim, Metric::Cosine).err().unwrap_or_else(|| panic!("{what}: open with the link in place"));
            assert_eq!(e.status, Status::PermissionDenied, "{what}: {e}");
            std::fs::remove_file(&link).unwrap();
            let (_, _, s2) = open(&dir, dim, Metric::Cosine).unwrap();
            assert_matches(&s2, &model, what);
        }
        assert_eq!(std::fs::read(&target).unwrap(), precious, "{what}: the link's target is untouched");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn data_dir_open_to_group_or_others_is_refused_unless_allowed() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dim = 4;
    let dir = tmpdir("perm");
    let (mut p, _, mut s) = open(&dir, dim, Metric::InnerProduct).unwrap();
    let mut model = Model::new();
    random_ops(&mut rng, 20, &mut model, &mut p, &mut s);
    drop(p);
    for mode in [0o755, 0o777, 0o750, 0o701] {
        set_mode(&dir, mode);
        let e = open(&dir, dim, Metric::InnerProduct).err().unwrap_or_else(|| panic!("mode {mode:04o} must be refused"));
        assert_eq!(e.status, Status::PermissionDenied, "{e}");
        let m = &e.message;
        assert!(m.contains(&dir.display().to_string()) && m.contains(&format!("mode {mode:04o}")) && m.contains("0700"), "{e}");
    }
    // KALOS_DATA_DIR_MODE allows more; kalosd reads it as the library does.
    let kalosd = |allow: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_kalosd"));
        c.args(["repair", "--data-dir", dir.to_str().unwrap()]).env_remove("KALOS_DATA_DIR_MODE");
        if let Some(a) = allow {
            c.env("KALOS_DATA_DIR_MODE", a);
        }
        let o = c.output().unwrap();
        (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    set_mode(&dir, 0o755);
    let (ok, out) = kalosd(None);
    assert!(!ok && out.contains("PERMISSION_DENIED") && out.contains("mode 0755"), "{out}");
    let (ok, out) = kalosd(Some("0755"));
    assert!(ok && out.contains("no damage found"), "{out}");
    set_mode(&dir, 0o777);
    let (ok, out) = kalosd(Some("0755"));
    assert!(!ok && out.contains("mode 0777") && out.contains("0755"), "{out}");
    set_mode(&dir, 0o700);
    let (_, _, s2) = open(&dir, dim, Metric::InnerProduct).unwrap();
    assert_matches(&s2, &model, "back to 0700");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn data_dir_of_another_user_is_refused() {
    let dir = private_dir("owner");
    if let Err(e) = std::os::unix::fs::chown(&dir, Some(65534), Some(65534)) {
        println!("SKIP data_dir_of_another_user_is_refused: cannot chown {} to uid 65534: {e}", dir.display());
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let e = open(&dir, 4, Metric::Cosine).err().expect("a directory of another user is refused");
    assert_eq!(e.status, Status::PermissionDenied, "{e}");
    assert!(e.message.contains(&dir.display().to_string()) && e.message.contains("uid 65534"), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing is created in it");
    std::fs::remove_dir_all(&dir).unwrap();
}
