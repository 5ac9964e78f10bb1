//! Metadata fields in the data directory: they survive the log and snapshots (format version 2),
//! and directories written in format version 1 (tests/data/format-v1, written by the code
//! before fields existed) still open, with every row intact, and continue in version 2.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kalos::meta::{Field, Value};
use kalos::persist::{Persist, PersistOptions, WalOp};
use kalos::store::{Record, Store, UpsertItem, NEVER};
use kalos::{Backend, Kalos, Metric, Options, Role, SyncPolicy, UpsertOptions};
use rand::{Rng, SeedableRng};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kalos-pf-{tag}-{}-{}", std::process::id(), rand::random::<u32>()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A copy of a fixture directory with the modes a data directory must have.
fn fixture(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/format-v1").join(name);
    let dst = tmpdir(name);
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o700)).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        std::fs::copy(e.path(), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    dst
}

fn version_of(file: &Path) -> u32 {
    let b = std::fs::read(file).unwrap();
    u32::from_le_bytes(b[8..12].try_into().unwrap())
}

fn server(dir: &Path, tag: &str) -> Kalos {
    let o = Options {
        role: Role::Server,
        dim: 4,
        metric: Metric::InnerProduct,
        backend: Backend::Cpu,
        data_dir: Some(dir.to_path_buf()),
        ..Options::default()
    };
    Kalos::open(&format!("pf-{tag}-{}-{}", std::process::id(), rand::random::<u32>()), &o).unwrap()
}

#[test]
fn a_format_v1_log_opens_and_continues_in_v2() {
    let dir = fixture("wal-only");
    let wal = dir.join("wal-0000000000000000.wal");
    assert_eq!(version_of(&wal), 1);
    let k = server(&dir, "v1wal");
    let want: Vec<u64> = (0..40u64).filter(|&i| i != 3 && i != 4 && i % 3 != 2).chain([100]).collect();
    assert_eq!(k.stats().unwrap().count as usize, want.len());
    for rec in k.get(&want).unwrap() {
        if rec.id == 100 {
            assert_eq!((rec.namespace, rec.vector.clone(), rec.payload.clone()), (9, vec![1., 2., 3., 4.], Some(vec![0, 255])));
            assert_eq!(rec.expires_ms, 4_102_444_800_000);
            continue;
        }
        let i = rec.id as f32;
        assert_eq!(rec.vector, vec![4. * i / 10., (4. * i + 1.) / 10., (4. * i + 2.) / 10., (4. * i + 3.) / 10.], "id {}", rec.id);
        assert_eq!(rec.namespace, rec.id % 3);
        assert_eq!(rec.payload, (rec.id % 5 != 0).then(|| format!("row {}", rec.id).into_bytes()));
        assert!(rec.fields.is_empty());
    }
    // New writes carry fields; the log continues in format version 2.
    let f = vec![vec![Field::new("kind", Value::Keyword("fact".into())), Field::new("n", Value::Int(7))]];
    k.upsert(&[500], &[0.5; 4], &UpsertOptions { fields: Some(&f), ..Default::default() }).unwrap();
    k.close();
    assert_eq!(version_of(&wal), 2);
    let k = server(&dir, "v1wal2");
    assert_eq!(k.stats().unwrap().count as usize, want.len() + 1);
    assert_eq!(k.get(&[500]).unwrap()[0].fields, f[0]);
    assert_eq!(k.get(&[100]).unwrap()[0].payload, Some(vec![0, 255]));
    k.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A crash while the next log of a version 1 chain was being created leaves it shorter than its
/// header: the open rewrites that header for the next log (its own generation, this build's
/// version) and leaves the version 1 log before it as it is, so the directory opens again.
#[test]
fn a_torn_header_after_a_format_v1_log_is_rewritten_as_the_next_log() {
    let dir = fixture("wal-only");
    let wal0 = dir.join("wal-0000000000000000.wal");
    let wal1 = dir.join("wal-0000000000000001.wal");
    std::fs::write(&wal1, [0u8; 40]).unwrap();
    std::fs::set_permissions(&wal1, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = server(&dir, "v1torn");
    let count = k.stats().unwrap().count;
    assert_eq!(count, 26, "the rows of the version 1 log");
    k.upsert(&[600], &[0.25; 4], &UpsertOptions::default()).unwrap();
    k.close();
    let b = std::fs::read(&wal1).unwrap();
    assert_eq!(version_of(&wal1), 2);
    assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), 1, "the rewritten header names its own generation");
    assert_eq!(version_of(&wal0), 1, "the log before it is left as it was");
    let k = server(&dir, "v1torn2");
    assert_eq!(k.stats().unwrap().count, count + 1);
    assert_eq!(k.get(&[600]).unwrap()[0].vector, vec![0.25; 4]);
    k.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_format_v1_snapshot_and_log_open() {
    let dir = fixture("snap-wal");
    assert_eq!(version_of(&dir.join("snap-0000000000000001.snap")), 1);
    let k = server(&dir, "v1snap");
    let want = [1000u64, 1001, 1003, 1004, 1005, 1006, 1007, 2000, 2001];
    assert_eq!(k.stats().unwrap().count as usize, want.len());
    for rec in k.get(&want).unwrap() {
        match rec.id {
            2000 => {
                assert_eq!((rec.namespace, rec.vector.clone(), rec.payload.clone()), (4, vec![1., 0., 0., 0.], Some(b"wal a".to_vec())))
            }
            2001 => assert_eq!((rec.namespace, rec.vector.clone(), rec.payload.clone()), (4, vec![0., 1., 0., 0.], None)),
            id => {
                let j = (id - 1000) as f32;
                assert_eq!(rec.vector, vec![4. * j - 5., 4. * j - 4., 4. * j - 3., 4. * j - 2.]);
                let (ns, p) = if id == 1001 { (5, Some(b"snap row".to_vec())) } else { (0, None) };
                assert_eq!((rec.namespace, rec.payload.clone()), (ns, p), "id {id}");
            }
        }
    }
    k.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

fn random_fields(r: &mut rand::rngs::StdRng) -> Vec<Field> {
    let mut f = Vec::new();
    if r.random() {
        f.push(Field::new("user", Value::Keyword(format!("u{}", r.random_range(0..5)))));
    }
    if r.random() {
        let mut t: Vec<String> = (0..r.random_range(1..4)).map(|i| format!("t{i}")).collect();
        t.sort();
        f.push(Field::new("tags", Value::Tags(t)));
    }
    if r.random() {
        f.push(Field::new("n", Value::Int(r.random())));
    }
    if r.random() {
        f.push(Field::new("x", Value::Float(r.random_range(-1e9..1e9))));
    }
    if r.random() {
        f.push(Field::new("ok", Value::Bool(r.random())));
    }
    if r.random() {
        f.push(Field::new("at", Value::Timestamp(r.random_range(0..i64::MAX))));
    }
    f
}

fn table(s: &Store) -> Vec<Record> {
    let mut v: Vec<Record> = s.records().collect();
    v.sort_by_key(|r| r.id);
    for r in &mut v {
        r.fields.sort_by(|a, b| a.name.cmp(&b.name));
    }
    v
}

#[test]
fn fields_survive_the_log_and_snapshots() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tmpdir("rt");
    let po = PersistOptions { sync: SyncPolicy::Always, sync_interval_ms: 50 };
    let dim = 3;
    let mut st = Store::new(dim, Metric::L2, 1 << 20, 1024);
    let (mut p, _) = Persist::open(&dir, dim, Metric::L2, &po, &mut st).unwrap();
    for round in 0..6 {
        let n = r.random_range(1..200);
        let ids: Vec<u64> = (0..n).map(|_| r.random_range(0..500)).collect();
        let vecs: Vec<f32> = (0..n * dim).map(|_| r.random_range(-1.0..1.0)).collect();
        let fl: Vec<Vec<Field>> = (0..n).map(|_| random_fields(&mut r)).collect();
        let items: Vec<UpsertItem<'_>> = (0..n)
            .map(|i| UpsertItem {
                id: ids[i],
                namespace: 0,
                vector: &vecs[i * dim..(i + 1) * dim],
                payload: None,
                created_ms: 1,
                expires_ms: NEVER,
                fields: &fl[i],
            })
            .collect();
        st.validate_upsert(&items).unwrap();
        p.append(&WalOp::Upsert(&items)).unwrap();
        st.apply_upsert(&items);
        let del: Vec<u64> = ids.iter().copied().filter(|_| r.random_range(0..5) == 0).collect();
        p.append(&WalOp::Delete(&del)).unwrap();
        st.delete_present(&del);
        p.commit().unwrap();
        if round == 3 {
            p.snapshot(&st).unwrap();
        }
    }
    let want = table(&st);
    assert!(want.iter().any(|r| !r.fields.is_empty()));
    drop(p);
    let mut again = Store::new(dim, Metric::L2, 1 << 20, 1024);
    let (mut p, _) = Persist::open(&dir, dim, Metric::L2, &po, &mut again).unwrap();
    assert_eq!(table(&again), want, "snapshot + log replay");
    p.snapshot(&again).unwrap();
    drop(p);
    let snaps: Vec<PathBuf> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "snap")).collect();
    assert!(!snaps.is_empty() && snaps.iter().all(|s| version_of(s) == 2));
    let mut third = Store::new(dim, Metric::L2, 1 << 20, 1024);
    let _ = Persist::open(&dir, dim, Metric::L2, &po, &mut third).unwrap();
    assert_eq!(table(&third), want, "snapshot alone");
    std::fs::remove_dir_all(&dir).unwrap();
}
