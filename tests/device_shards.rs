//! Device shards (option `device_shards`): the sharded engine against one CPU engine over the
//! same table, through random writes (upserts that replace and move memories between shards,
//! deletes, namespace deletes, expiry, clears that retype fields) and random recalls (k, batch,
//! namespace lists, metadata expressions, recency). Vectors and queries hold small integers, so
//! for ip and l2 every score is exact in f32 whatever the summation order, and the sharded answer
//! must equal the single engine's bit for bit, ties included (lower id first); cosine scores
//! must agree to rounding. Then through the API: a sharded server against an unsharded one,
//! restart from the log, the options' errors, and a failing shard (never a partial answer). The
//! seed is printed; KALOS_TEST_SEED replays one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kalos::engine::cpu::CpuEngine;
use kalos::engine::shard::{shard_of_key, ShardedEngine};
use kalos::engine::{reference_search, Engine, EngineKind};
use kalos::filter::{Cmp, Expr};
use kalos::meta::{Field, Value};
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::wire::request::Namespaces;
use kalos::wire::SearchRequest;
use kalos::{Backend, Error, Filter, Hit, Kalos, Metric, Options, Placement, RecallOptions, Recency, Role, Status, UpsertOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NOW: u64 = 1_000_000_000;
const DIM: usize = 8;

fn rng(test: &str) -> StdRng {
    let seed: u64 = std::env::var("KALOS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (KALOS_TEST_SEED={seed} to replay)");
    StdRng::seed_from_u64(seed)
}

fn int_vec(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-3i32..=3) as f32).collect()
}

/// `n` shards of one-thread CPU engines whose threads sleep between jobs (the caller then sleeps
/// while it waits for them), or poll for `spin` after each (the caller polls too).
fn sharded_spin(n: usize, placement: Placement, st: &Store, spin: Duration) -> ShardedEngine {
    ShardedEngine::new(n, placement, st, spin, Arc::new(|_, _: &Store| Ok(Box::new(CpuEngine::new(1)) as Box<dyn Engine>))).unwrap()
}

fn sharded(n: usize, placement: Placement, st: &Store) -> ShardedEngine {
    sharded_spin(n, placement, st, Duration::ZERO)
}

fn fields(r: &mut StdRng, retyped: bool) -> Vec<Field> {
    let mut f = Vec::new();
    if r.random_bool(0.8) {
        let v = r.random_range(0..5i64);
        f.push(Field::new("n", if retyped { Value::Keyword(format!("k{v}")) } else { Value::Int(v) }));
    }
    if r.random_bool(0.6) {
        f.push(Field::new("user", Value::Keyword(["ann", "bob", "cyd"][r.random_range(0..3)].into())));
    }
    if r.random_bool(0.5) {
        f.push(Field::new(
            "tags",
            Value::Tags((0..r.random_range(0..3)).map(|_| ["a", "b", "c"][r.random_range(0..3)].to_string()).collect()),
        ));
    }
    f
}

fn random_filter(r: &mut StdRng, retyped: bool) -> Filter {
    let base = match r.random_range(0..3) {
        0 => Filter::all(),
        1 => Filter::new(&[r.random_range(0..6u64)]).unwrap(),
        _ => Filter::new(&(0..r.random_range(1..4)).map(|_| r.random_range(0..7u64)).collect::<Vec<_>>()).unwrap(),
    };
    let expr = match r.random_range(0..5) {
        0 => Expr::Cmp(Cmp::Eq, "user".into(), Value::Keyword("ann".into())),
        1 if !retyped => Expr::Cmp(Cmp::Gte, "n".into(), Value::Int(r.random_range(0..5))),
        1 => Expr::Cmp(Cmp::Eq, "n".into(), Value::Keyword(format!("k{}", r.random_range(0..5)))),
        2 => Expr::Contains("tags".into(), Value::Keyword("b".into())),
        3 => Expr::Not(Box::new(Expr::Exists("user".into()))),
        _ => return base,
    };
    base.with_expr(&expr.encode()).unwrap()
}

/// Sharded and single engine give the same answer to `req`.
fn same(sh: &mut ShardedEngine, one: &mut CpuEngine, st: &Store, req: &SearchRequest<'_>, metric: Metric, what: &str) {
    let (mut a, mut b) = (vec![vec![Hit { id: 7, score: 7.0 }]; 3], Vec::new());
    sh.search(st, req, &mut a).unwrap();
    one.search(st, req, &mut b).unwrap();
    assert_eq!(a.len(), req.nq, "{what}: one list per query");
    for (qi, (x, y)) in a.iter().zip(&b).enumerate() {
        if metric == Metric::Cosine {
            assert_eq!(x.len(), y.len(), "{what} q{qi}: hit counts differ");
            for (i, (h, g)) in x.iter().zip(y).enumerate() {
                assert!((h.score - g.score).abs() <= 1e-5, "{what} q{qi} rank {i}: score {} vs {}", h.score, g.score);
            }
        } else {
            assert_eq!(x, y, "{what} q{qi}: sharded and single engine differ");
        }
    }
    if metric != Metric::Cosine && req.recency.is_none() {
        let want = reference_search(st, req);
        for (qi, (x, w)) in a.iter().zip(&want).enumerate() {
            let ids: Vec<u64> = w.iter().map(|&(_, id)| id).collect();
            assert_eq!(x.iter().map(|h| h.id).collect::<Vec<_>>(), ids, "{what} q{qi}: ids differ from the reference");
        }
    }
}

#[test]
fn random_writes_and_recalls_match_one_engine() {
    let mut r = rng("random_writes_and_recalls_match_one_engine");
    for metric in [Metric::InnerProduct, Metric::L2, Metric::Cosine] {
        for (shards, placement, spin_ms) in
            [(2, Placement::Id, 0), (3, Placement::Namespace, 0), (5, Placement::Id, 1), (4, Placement::Namespace, 0)]
        {
            let mut st = Store::new(DIM, metric, 100_000, 0);
            let mut sh = sharded_spin(shards, placement, &st, Duration::from_millis(spin_ms));
            let mut one = CpuEngine::new(1);
            let mut retyped = false;
            let mut recalls = 0;
            for round in 0..70 {
                let what = format!("{} x{shards} {placement:?} round {round}", metric.name());
                match r.random_range(0..20) {
                    0..=10 => {
                        let n = r.random_range(1..300);
                        let ids: Vec<u64> = (0..n).map(|_| r.random_range(0..1500u64)).collect();
                        let vecs = int_vec(&mut r, n * DIM);
                        let fs: Vec<Vec<Field>> = (0..n).map(|_| fields(&mut r, retyped)).collect();
                        let items: Vec<UpsertItem<'_>> = (0..n)
                            .map(|i| UpsertItem {
                                id: ids[i],
                                namespace: r.random_range(0..6),
                                vector: &vecs[i * DIM..(i + 1) * DIM],
                                payload: None,
                                created_ms: NOW - r.random_range(0..10_000_000),
                                expires_ms: if r.random_bool(0.1) { NOW - 500 + r.random_range(0..1000) } else { NEVER },
                                fields: &fs[i],
                            })
                            .collect();
                        // All-zero vectors cannot be written under cosine.
                        if st.validate_upsert(&items).is_err() {
                            continue;
                        }
                        sh.reserve_for(&st, &items).unwrap();
                        st.apply_upsert(&items);
                    }
                    11..=14 if !st.is_empty() => {
                        let ids: Vec<u64> = (0..r.random_range(1..100)).map(|_| st.ids()[r.random_range(0..st.len())]).collect();
                        st.delete_present(&ids);
                    }
                    15 => {
                        st.delete_namespace(r.random_range(0..6));
                    }
                    16 => {
                        st.purge_expired(NOW);
                    }
                    17 if round > 20 => {
                        // A clear forgets the field types: "n" comes back as a keyword.
                        st.clear();
                        retyped = !retyped;
                    }
                    _ => {}
                }
                let dirty = st.take_dirty();
                sh.sync(&st, &dirty).unwrap();
                one.sync(&st, &dirty).unwrap();
                assert_eq!(sh.shard_lens().iter().sum::<usize>(), st.len(), "{what}: shards hold every row once");
                for _ in 0..4 {
                    let nq = [1, 1, 3, 17][r.random_range(0..4)];
                    let k = [1, 5, 40, 2000][r.random_range(0..4)];
                    let q = int_vec(&mut r, nq * DIM);
                    if metric == Metric::Cosine && q.chunks(DIM).any(|c| c.iter().all(|&x| x == 0.0)) {
                        continue;
                    }
                    let q: Vec<f32> = if metric == Metric::Cosine {
                        q.chunks(DIM)
                            .flat_map(|c| {
                                let n = c.iter().map(|&x| x * x).sum::<f32>().sqrt();
                                c.iter().map(move |&x| x / n).collect::<Vec<_>>()
                            })
                            .collect()
                    } else {
                        q
                    };
                    let f = random_filter(&mut r, retyped);
                    let recency =
                        (metric != Metric::L2 && r.random_bool(0.3)).then_some(Recency { weight: 0.3, half_life_ms: 3_600_000.0 });
                    let req = SearchRequest { queries: &q, nq, k, filter: &f, recency, now_ms: NOW, direct: None, slot: None };
                    same(&mut sh, &mut one, &st, &req, metric, &format!("{what} nq {nq} k {k} filter {:?}", f.namespaces));
                    recalls += 1;
                }
            }
            assert!(recalls > 200, "too few recalls checked ({recalls})");
        }
    }
}

#[test]
fn namespace_placement_keeps_a_namespace_on_one_shard() {
    let mut st = Store::new(DIM, Metric::InnerProduct, 10_000, 0);
    let mut sh = sharded(4, Placement::Namespace, &st);
    let v = vec![1.0f32; DIM];
    // Namespace 3 alone: all its rows on the shard its hash names.
    let items: Vec<UpsertItem<'_>> = (0..500)
        .map(|id| UpsertItem { id, namespace: 3, vector: &v, payload: None, created_ms: NOW, expires_ms: NEVER, fields: &[] })
        .collect();
    sh.reserve_for(&st, &items).unwrap();
    st.apply_upsert(&items);
    let d = st.take_dirty();
    sh.sync(&st, &d).unwrap();
    let want = shard_of_key(3, 4);
    let lens = sh.shard_lens();
    assert_eq!(lens[want], 500, "{lens:?}");
    assert_eq!(lens.iter().sum::<usize>(), 500);
    // Moving the memories to another namespace moves them to that namespace's shard.
    let other = (0..64u64).find(|&n| shard_of_key(n, 4) != want).unwrap();
    let moved: Vec<UpsertItem<'_>> = items.iter().take(200).map(|it| UpsertItem { namespace: other, ..it.clone() }).collect();
    sh.reserve_for(&st, &moved).unwrap();
    st.apply_upsert(&moved);
    let d = st.take_dirty();
    sh.sync(&st, &d).unwrap();
    let lens = sh.shard_lens();
    assert_eq!((lens[want], lens[shard_of_key(other, 4)]), (300, 200), "{lens:?}");
    // Id placement spreads one namespace over every shard.
    let mut st2 = Store::new(DIM, Metric::InnerProduct, 10_000, 0);
    let mut by_id = sharded(4, Placement::Id, &st2);
    st2.apply_upsert(&items);
    let d = st2.take_dirty();
    by_id.sync(&st2, &d).unwrap();
    assert!(by_id.shard_lens().iter().all(|&n| (75..=175).contains(&n)), "{:?}", by_id.shard_lens());
}

/// A CPU engine that fails on demand.
struct Flaky {
    inner: CpuEngine,
    fail_search: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
}

impl Engine for Flaky {
    fn kind(&self) -> EngineKind {
        EngineKind::Cpu
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn sync(&mut self, store: &Store, dirty: &[u32]) -> kalos::Result<()> {
        if self.fail_sync.load(Ordering::SeqCst) {
            panic!("injected sync panic");
        }
        self.inner.sync(store, dirty)
    }
    fn search(&mut self, store: &Store, req: &SearchRequest<'_>, out: &mut Vec<Vec<Hit>>) -> kalos::Result<()> {
        if self.fail_search.load(Ordering::SeqCst) {
            return Err(Error::new(Status::Cuda, "injected device fault"));
        }
        self.inner.search(store, req, out)
    }
}

#[test]
fn a_failing_shard_fails_the_recall_never_a_partial_answer() {
    let fail_search = Arc::new(AtomicBool::new(false));
    let fail_sync = Arc::new(AtomicBool::new(false));
    let (fs, fy) = (fail_search.clone(), fail_sync.clone());
    let mut st = Store::new(DIM, Metric::InnerProduct, 10_000, 0);
    let mut sh = ShardedEngine::new(
        3,
        Placement::Id,
        &st,
        Duration::ZERO,
        Arc::new(move |i, _: &Store| {
            // Only shard 1 fails.
            let (a, b) = if i == 1 { (fs.clone(), fy.clone()) } else { Default::default() };
            Ok(Box::new(Flaky { inner: CpuEngine::new(1), fail_search: a, fail_sync: b }) as Box<dyn Engine>)
        }),
    )
    .unwrap();
    let mut r = rng("a_failing_shard_fails_the_recall_never_a_partial_answer");
    let v = int_vec(&mut r, 300 * DIM);
    let items: Vec<UpsertItem<'_>> = (0..300)
        .map(|i| UpsertItem {
            id: i as u64,
            namespace: 0,
            vector: &v[i * DIM..(i + 1) * DIM],
            payload: None,
            created_ms: NOW,
            expires_ms: NEVER,
            fields: &[],
        })
        .collect();
    st.apply_upsert(&items);
    let d = st.take_dirty();
    sh.sync(&st, &d).unwrap();
    let q = int_vec(&mut r, DIM);
    let all = Filter::all();
    let req = SearchRequest { queries: &q, nq: 1, k: 300, filter: &all, recency: None, now_ms: NOW, direct: None, slot: None };
    let mut out = Vec::new();
    sh.search(&st, &req, &mut out).unwrap();
    assert_eq!(out[0].len(), 300);
    fail_search.store(true, Ordering::SeqCst);
    let e = sh.search(&st, &req, &mut out).unwrap_err();
    assert_eq!(e.status, Status::Cuda);
    assert!(e.message.contains("device shard 1") && e.message.contains("injected device fault"), "{e}");
    fail_search.store(false, Ordering::SeqCst);
    sh.search(&st, &req, &mut out).unwrap();
    assert_eq!(out[0].len(), 300, "a search failure leaves the shards as they were");
    // A write that cannot reach a shard breaks the engine for good: no recall answers from a
    // table that misses that write.
    fail_sync.store(true, Ordering::SeqCst);
    st.delete_present(&(0..300).collect::<Vec<u64>>());
    let d = st.take_dirty();
    let e = sh.sync(&st, &d).unwrap_err();
    assert_eq!(e.status, Status::Panic, "{e}");
    fail_sync.store(false, Ordering::SeqCst);
    let e = sh.search(&st, &req, &mut out).unwrap_err();
    assert!(e.message.contains("out of date"), "{e}");
    assert!(sh.sync(&st, &[]).is_err());
}

fn open(name: &str, shards: u32, placement: Placement, dir: Option<std::path::PathBuf>) -> kalos::Result<Kalos> {
    let o = Options {
        role: Role::Server,
        dim: DIM as u32,
        metric: Metric::L2,
        backend: Backend::Cpu,
        capacity: 50_000,
        device_shards: shards,
        placement,
        data_dir: dir,
        ..Options::default()
    };
    Kalos::open(name, &o)
}

#[test]
fn a_sharded_server_answers_like_an_unsharded_one_and_restarts() {
    let mut r = rng("a_sharded_server_answers_like_an_unsharded_one_and_restarts");
    let tag = format!("{}-{}", std::process::id(), r.random::<u32>());
    let dir = std::env::temp_dir().join(format!("kalos-dshards-{tag}"));
    let plain = open(&format!("dsh-plain-{tag}"), 0, Placement::Id, None).unwrap();
    let sh = open(&format!("dsh-sharded-{tag}"), 3, Placement::Namespace, Some(dir.clone())).unwrap();
    assert!(sh.stats().unwrap().engine_name.starts_with("shards3x[cpu"), "{}", sh.stats().unwrap().engine_name);
    let n = 3000;
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 7 + 1).collect();
    let ns: Vec<u64> = (0..n).map(|_| r.random_range(0..9)).collect();
    let v = int_vec(&mut r, n * DIM);
    let payloads: Vec<Vec<u8>> = ids.iter().map(|id| format!("memory {id}").into_bytes()).collect();
    let pl: Vec<Option<&[u8]>> = payloads.iter().map(|p| Some(p.as_slice())).collect();
    for k in [&plain, &sh] {
        k.upsert(&ids, &v, &UpsertOptions { namespaces: Namespaces::PerItem(&ns), payloads: Some(pl.clone()), ..UpsertOptions::default() })
            .unwrap();
        k.delete(&ids[..300]).unwrap();
        k.delete_namespace(4).unwrap();
    }
    let check = |a: &Kalos, b: &Kalos, r: &mut StdRng| {
        for _ in 0..50 {
            let q = int_vec(r, DIM);
            let nsf: Vec<u64> = (0..r.random_range(0..3)).map(|_| r.random_range(0..9)).collect();
            let o = RecallOptions { namespaces: (!nsf.is_empty()).then(|| nsf.clone()), ..Default::default() };
            let x = a.recall_with_payloads(&q, 20, &o).unwrap();
            let y = b.recall_with_payloads(&q, 20, &o).unwrap();
            assert_eq!(x, y, "namespaces {nsf:?}");
        }
    };
    check(&plain, &sh, &mut r);
    drop(sh);
    // The log replays into a new sharded table.
    let sh = open(&format!("dsh-sharded2-{tag}"), 3, Placement::Namespace, Some(dir.clone())).unwrap();
    assert_eq!(sh.stats().unwrap().count, plain.stats().unwrap().count);
    check(&plain, &sh, &mut r);
    drop(sh);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn options_are_checked() {
    let tag = format!("{}-{}", std::process::id(), rand::random::<u32>());
    let e = open(&format!("dsh-big-{tag}"), 65, Placement::Id, None).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("device_shards = 65"), "{e}");
    // Sharded CUDA stores on a host without a GPU: a clear error under backend cuda; the CPU
    // engine under auto, with the reason in stats.
    if kalos::engine::cuda::device_count() == 0 {
        for (shards, gpus) in [(2, 0), (0, kalos::config::GPUS_ALL), (3, 0b11)] {
            let o = Options { role: Role::Server, dim: 4, backend: Backend::Cuda, device_shards: shards, gpus, ..Options::default() };
            let e = Kalos::open(&format!("dsh-cuda-{tag}"), &o).err().unwrap();
            assert_eq!(e.status, Status::BackendUnavailable, "{e}");
            let o = Options { backend: Backend::Auto, ..o };
            let k = Kalos::open(&format!("dsh-auto-{tag}"), &o).unwrap();
            let s = k.stats().unwrap();
            assert_eq!(s.engine_name.starts_with("shards"), shards > 1, "{}", s.engine_name);
            assert!(s.fallback_reason.contains("CUDA"), "{}", s.fallback_reason);
        }
    }
    // One shard is one table.
    let k = open(&format!("dsh-one-{tag}"), 1, Placement::Id, None).unwrap();
    assert!(!k.stats().unwrap().engine_name.starts_with("shards"));
}
