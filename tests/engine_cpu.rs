//! The CPU engine against the float64 reference (`kalos::engine::reference_search`), on fresh
//! random data every run (the seed is printed; set KALOS_TEST_SEED to replay one).
//!
//! Ids are compared exactly wherever the reference score of a rank is more than a tolerance away
//! from every other score (true near-ties may legitimately swap in f32); exact duplicates are
//! true ties and must come out lower id first. Scores are compared within the tolerance.

use std::collections::HashMap;

use kalos::engine::cpu::{CpuEngine, Isa};
use kalos::engine::{reference_search, Engine};
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::types::{Filter, Hit, Metric, Recency};
use kalos::wire::{DirectOut, SearchRequest};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const METRICS: [Metric; 3] = [Metric::InnerProduct, Metric::Cosine, Metric::L2];
const NOW: u64 = 1_000_000_000;

fn rng(test: &str) -> StdRng {
    let seed: u64 = std::env::var("KALOS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (KALOS_TEST_SEED={seed} to replay)");
    StdRng::seed_from_u64(seed)
}

struct Data {
    ids: Vec<u64>,
    vecs: Vec<f32>,
    ns: Vec<u64>,
    created: Vec<u64>,
    expires: Vec<u64>,
}

/// `n` random rows: shuffled unique ids, namespaces 0..4, creation times within the last ~day.
fn data(r: &mut StdRng, n: usize, dim: usize) -> Data {
    let mut ids: Vec<u64> = (0..(3 * n as u64 + 1)).collect();
    ids.shuffle(r);
    ids.truncate(n);
    Data {
        ids,
        vecs: (0..n * dim).map(|_| r.random_range(-1.0f32..1.0)).collect(),
        ns: (0..n).map(|_| r.random_range(0..4u64)).collect(),
        created: (0..n).map(|_| NOW - r.random_range(0..86_400_000u64)).collect(),
        expires: vec![NEVER; n],
    }
}

fn store(d: &Data, dim: usize, metric: Metric) -> Store {
    let n = d.ids.len();
    let mut st = Store::new(dim, metric, n.max(1), 0);
    let items: Vec<UpsertItem<'_>> = (0..n)
        .map(|i| UpsertItem {
            fields: &[],
            id: d.ids[i],
            namespace: d.ns[i],
            vector: &d.vecs[i * dim..(i + 1) * dim],
            payload: None,
            created_ms: d.created[i],
            expires_ms: d.expires[i],
        })
        .collect();
    for chunk in items.chunks(4096) {
        st.validate_upsert(chunk).unwrap();
        st.apply_upsert(chunk);
    }
    st
}

/// `nq` random queries, normalised for cosine as the server does.
fn queries(r: &mut StdRng, nq: usize, dim: usize, metric: Metric) -> Vec<f32> {
    let mut q: Vec<f32> = (0..nq * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    if metric == Metric::Cosine {
        for row in q.chunks_exact_mut(dim) {
            let n = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            row.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
        }
    }
    q
}

fn tol(w: f64, dim: usize) -> f64 {
    2e-5 * (1.0 + w.abs()) + 2e-6 * dim as f64
}

/// Checks `got` against the f64 reference for every query of `req`.
fn check(st: &Store, req: &SearchRequest<'_>, got: &[Vec<Hit>], what: &str) {
    assert_eq!(got.len(), req.nq, "{what}: one result list per query");
    let mut full_req = req.clone();
    full_req.k = st.len().max(1);
    let full = reference_search(st, &full_req);
    let dim = st.dim();
    for qi in 0..req.nq {
        let all = &full[qi];
        let g = &got[qi];
        let n = req.k.min(all.len());
        assert_eq!(g.len(), n, "{what} q{qi}: expected min(k={}, eligible={}) hits", req.k, all.len());
        let truth: HashMap<u64, f64> = all.iter().map(|&(s, id)| (id, s)).collect();
        let mut seen = std::collections::HashSet::new();
        // uniform[i]: every row with exactly all[i]'s score has the same vector (exact-tie groups
        // are contiguous in `all`).
        let vec_of = |id: u64| st.row_of(id).map(|r| &st.vectors()[r * dim..(r + 1) * dim]);
        let mut uniform = vec![true; all.len()];
        let mut a = 0;
        while a < all.len() {
            let mut b = a + 1;
            while b < all.len() && all[b].0 == all[a].0 {
                b += 1;
            }
            if b - a > 1 {
                let v0 = vec_of(all[a].1);
                let u = (a + 1..b).all(|x| vec_of(all[x].1) == v0);
                uniform[a..b].iter_mut().for_each(|x| *x = u);
            }
            a = b;
        }
        for i in 0..n {
            let (w, wid) = all[i];
            let t = tol(w, dim);
            let h = g[i];
            assert!(seen.insert(h.id), "{what} q{qi}: id {} returned twice", h.id);
            let s_true = *truth
                .get(&h.id)
                .unwrap_or_else(|| panic!("{what} q{qi} rank {i}: id {} is not eligible (filtered, expired or deleted)", h.id));
            assert!((s_true - w).abs() <= t, "{what} q{qi} rank {i}: id {} has true score {s_true}, rank needs {w} (id {wid})", h.id);
            assert!((h.score as f64 - s_true).abs() <= t, "{what} q{qi} rank {i}: score {} vs reference {s_true}", h.score);
            // Exact id unless some other eligible row is within the tolerance without being an
            // exact tie of the same vector (those are ordered by id on both sides). Two different
            // vectors can tie exactly in f64 and not in f32 (l2, dim 1: x1 + x2 == 2q exactly,
            // the engine's |x|^2 - 2x.q + |q|^2 rounds the two differently; seed
            // 8793620987344945785 hit it).
            let mut ambiguous = false;
            let mut j = i;
            while j > 0 && (all[j - 1].0 - w).abs() <= t {
                j -= 1;
                ambiguous |= all[j].0 != w || !uniform[j];
            }
            let mut j = i + 1;
            while j < all.len() && (all[j].0 - w).abs() <= t {
                ambiguous |= all[j].0 != w || !uniform[j];
                j += 1;
            }
            if !ambiguous {
                assert_eq!(h.id, wid, "{what} q{qi} rank {i}: id {} but the reference has {wid} (score {w})", h.id);
            }
        }
    }
}

fn run(e: &mut CpuEngine, st: &Store, req: &SearchRequest<'_>) -> Vec<Vec<Hit>> {
    let mut out = vec![vec![Hit { id: 999, score: 0.0 }]; 7]; // stale content must be replaced
    e.search(st, req, &mut out).unwrap();
    out
}

fn req<'a>(q: &'a [f32], nq: usize, k: usize, f: &'a Filter) -> SearchRequest<'a> {
    SearchRequest { queries: q, nq, k, filter: f, recency: None, now_ms: NOW, direct: None, slot: None }
}

#[test]
fn every_metric_dim_size_k_and_isa() {
    let mut r = rng("every_metric_dim_size_k_and_isa");
    let all = Filter::all();
    for &dim in &[1usize, 3, 17, 128, 384, 769] {
        for &n in &[0usize, 1, 7, 1000] {
            let d = data(&mut r, n, dim);
            for m in METRICS {
                let st = store(&d, dim, m);
                let q = queries(&mut r, 3, dim, m);
                for &k in &[1usize, 10, 1024] {
                    for isa in Isa::available() {
                        let mut e = CpuEngine::with_isa(1, isa);
                        let what = format!("{} dim {dim} n {n} k {k} {isa:?}", m.name());
                        let single = run(&mut e, &st, &req(&q[..dim], 1, k, &all));
                        check(&st, &req(&q[..dim], 1, k, &all), &single, &format!("{what} single"));
                        let batch = run(&mut e, &st, &req(&q, 3, k, &all));
                        check(&st, &req(&q, 3, k, &all), &batch, &format!("{what} batch"));
                    }
                }
            }
        }
    }
}

#[test]
fn large_table_threaded_batched_and_single_agree() {
    let mut r = rng("large_table_threaded_batched_and_single_agree");
    let all = Filter::all();
    let (n, dim) = (50_000usize, 128usize);
    let d = data(&mut r, n, dim);
    for m in METRICS {
        let st = store(&d, dim, m);
        let nq = 6;
        let q = queries(&mut r, nq, dim, m);
        for &k in &[1usize, 10, 1024] {
            let mut one = CpuEngine::new(1);
            let mut two = CpuEngine::new(2);
            two.set_parallel_min_bytes(0);
            let mut three = CpuEngine::new(3);
            three.set_parallel_min_bytes(0);
            let what = format!("{} n {n} k {k}", m.name());
            let b1 = run(&mut one, &st, &req(&q, nq, k, &all));
            check(&st, &req(&q, nq, k, &all), &b1, &format!("{what} batch x1"));
            // Same kernels on each row: the split must not change a single bit.
            assert_eq!(run(&mut two, &st, &req(&q, nq, k, &all)), b1, "{what}: batch x2 != x1");
            assert_eq!(run(&mut three, &st, &req(&q, nq, k, &all)), b1, "{what}: batch x3 != x1");
            for qi in 0..nq {
                let qq = &q[qi * dim..(qi + 1) * dim];
                let s1 = run(&mut one, &st, &req(qq, 1, k, &all));
                assert_eq!(run(&mut two, &st, &req(qq, 1, k, &all)), s1, "{what}: single x2 != x1");
                // Batched and single use different kernels: compare through the reference, and
                // the scores directly.
                check(&st, &req(qq, 1, k, &all), &s1, &format!("{what} single q{qi}"));
                for (a, b) in s1[0].iter().zip(&b1[qi]) {
                    assert!((a.score - b.score).abs() as f64 <= tol(a.score as f64, dim), "{what} q{qi}: single {a:?} batch {b:?}");
                }
            }
        }
    }
}

#[test]
fn ties_lower_id_first() {
    let mut r = rng("ties_lower_id_first");
    let all = Filter::all();
    for m in METRICS {
        for &dim in &[3usize, 17, 128] {
            // 40 distinct vectors, each stored 5 times under shuffled ids.
            let base = data(&mut r, 40, dim);
            let mut d = data(&mut r, 200, dim);
            for i in 0..200 {
                let src = i % 40;
                d.vecs[i * dim..(i + 1) * dim].copy_from_slice(&base.vecs[src * dim..(src + 1) * dim]);
            }
            let st = store(&d, dim, m);
            let q = queries(&mut r, 4, dim, m);
            for isa in Isa::available() {
                let mut e = CpuEngine::with_isa(1, isa);
                for &k in &[1usize, 3, 7, 10, 1024] {
                    let what = format!("{} dim {dim} k {k} {isa:?}", m.name());
                    for (nq, label) in [(1usize, "single"), (4, "batch")] {
                        let rq = req(&q[..nq * dim], nq, k, &all);
                        let got = run(&mut e, &st, &rq);
                        check(&st, &rq, &got, &format!("{what} {label}"));
                        for hits in &got {
                            for w in hits.windows(2) {
                                if w[0].score == w[1].score {
                                    assert!(w[0].id < w[1].id, "{what} {label}: tie {:?} before {:?}", w[0], w[1]);
                                }
                            }
                        }
                    }
                }
                // k = 1: the best group's lowest id, exactly.
                let got = run(&mut e, &st, &req(&q[..dim], 1, 1, &all));
                let want = reference_search(&st, &req(&q[..dim], 1, 1, &all));
                assert_eq!(got[0][0].id, want[0][0].1, "{} dim {dim} {isa:?}: k=1 tie", m.name());
            }
        }
    }
}

#[test]
fn deletes_and_k_above_count() {
    let mut r = rng("deletes_and_k_above_count");
    let all = Filter::all();
    let dim = 17;
    for m in METRICS {
        let d = data(&mut r, 3000, dim);
        let mut st = store(&d, dim, m);
        let mut victims = d.ids.clone();
        victims.shuffle(&mut r);
        victims.truncate(1500);
        st.delete(&victims).unwrap();
        assert_eq!(st.len(), 1500);
        let q = queries(&mut r, 2, dim, m);
        let mut e = CpuEngine::new(2);
        e.set_parallel_min_bytes(0);
        for &k in &[1usize, 10, 1024] {
            let got = run(&mut e, &st, &req(&q, 2, k, &all));
            check(&st, &req(&q, 2, k, &all), &got, &format!("{} after delete k {k}", m.name()));
            for h in got.iter().flatten() {
                assert!(!victims.contains(&h.id), "deleted id {} returned", h.id);
            }
        }
        // k above the count returns the count.
        let victims: Vec<u64> = st.ids()[..1490].to_vec();
        st.delete(&victims).unwrap();
        let got = run(&mut e, &st, &req(&q[..dim], 1, 1024, &all));
        assert_eq!(got[0].len(), 10);
        check(&st, &req(&q[..dim], 1, 1024, &all), &got, &format!("{} 10 rows k 1024", m.name()));
        st.clear();
        let got = run(&mut e, &st, &req(&q, 2, 10, &all));
        assert_eq!(got, vec![Vec::<Hit>::new(), Vec::new()], "empty table gives empty lists");
    }
}

#[test]
fn namespace_filters_expiry_and_recency() {
    let mut r = rng("namespace_filters_expiry_and_recency");
    let dim = 33;
    let n = 20_000;
    for m in METRICS {
        let mut d = data(&mut r, n, dim);
        // A quarter of the rows expire: some already (≤ now, including exactly now), some later.
        for i in 0..n {
            if i % 4 == 0 {
                d.expires[i] = NOW - 1000 + r.random_range(0..2000u64);
            }
        }
        d.expires[8] = NOW;
        // One rare namespace (selective filter).
        for i in (0..n).step_by(997) {
            d.ns[i] = 77;
        }
        let st = store(&d, dim, m);
        assert!(st.has_expiring());
        let q = queries(&mut r, 5, dim, m);
        let filters = [
            Filter::all(),
            Filter::new(&[2]).unwrap(),
            Filter::new(&[77]).unwrap(),
            Filter::new(&[0, 3, 77]).unwrap(),
            Filter::new(&[5, 6]).unwrap(),
            Filter::new(&(100..120).chain([1]).collect::<Vec<_>>()).unwrap(),
        ];
        let recencies = if m == Metric::L2 {
            vec![None]
        } else {
            vec![
                None,
                Some(Recency { weight: 0.2, half_life_ms: 3_600_000.0 }),
                Some(Recency { weight: 1.0, half_life_ms: 1000.0 }),
                Some(Recency { weight: 0.9, half_life_ms: 1e7 }),
            ]
        };
        for isa in Isa::available() {
            for threads in [1usize, 2] {
                let mut e = CpuEngine::with_isa(threads, isa);
                e.set_parallel_min_bytes(0);
                for f in &filters {
                    for rec in &recencies {
                        for &k in &[1usize, 10, 1024] {
                            for nq in [1usize, 5] {
                                let mut rq = req(&q[..nq * dim], nq, k, f);
                                rq.recency = *rec;
                                let got = run(&mut e, &st, &rq);
                                let what =
                                    format!("{} {isa:?} x{threads} filter {:?} recency {rec:?} k {k} nq {nq}", m.name(), f.namespaces);
                                check(&st, &rq, &got, &what);
                                for h in got.iter().flatten() {
                                    let row = st.row_of(h.id).unwrap();
                                    assert!(f.matches(st.namespaces()[row]), "{what}: namespace filter leaked id {}", h.id);
                                    assert!(st.expires_ms()[row] > NOW, "{what}: expired id {} returned", h.id);
                                }
                                if f.namespaces.as_deref() == Some(&[5, 6][..]) {
                                    assert!(got.iter().all(|h| h.is_empty()), "{what}: no row matches");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn test_harness_can_fail() {
    // The checker must reject a wrong answer: swap two well-separated hits and drop a score.
    let mut r = rng("test_harness_can_fail");
    let dim = 16;
    let d = data(&mut r, 500, dim);
    let st = store(&d, dim, Metric::InnerProduct);
    let q = queries(&mut r, 1, dim, Metric::InnerProduct);
    let all = Filter::all();
    let rq = req(&q, 1, 10, &all);
    let good = run(&mut CpuEngine::new(1), &st, &rq);
    check(&st, &rq, &good, "good");
    let mut bad = good.clone();
    bad[0].swap(0, 9);
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&st, &rq, &bad, "swapped"))).is_err());
    let mut bad = good.clone();
    bad[0][3].score += 0.01;
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&st, &rq, &bad, "score"))).is_err());
    let mut bad = good;
    bad[0].pop();
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&st, &rq, &bad, "short"))).is_err());
}

/// A lone query's response body written by the engine into the offered slot area is the wire
/// format the client parses (count, ids, scores) and matches the hits it returns; a body that
/// would not fit is left to the server; batches never write.
#[test]
fn direct_body_matches_hits() {
    let mut r = rng("direct_body_matches_hits");
    let all = Filter::all();
    let dim = 17;
    let d = data(&mut r, 300, dim);
    let st = store(&d, dim, Metric::InnerProduct);
    let q = queries(&mut r, 2, dim, Metric::InnerProduct);
    let mut e = CpuEngine::new(1);
    for &k in &[1usize, 10, 300] {
        let mut slot = vec![0xA5u8; 4 + 12 * 300 + 8];
        // SAFETY: slot is a live buffer borrowed for the view's life.
        let dout = unsafe { DirectOut::new(slot.as_mut_ptr(), slot.len()) };
        let rq = SearchRequest { direct: Some(&dout), ..req(&q[..dim], 1, k, &all) };
        let out = run(&mut e, &st, &rq);
        let n = out[0].len();
        assert_eq!(n, k);
        assert_eq!(dout.written(), 4 + 12 * n, "k {k}: body length");
        assert_eq!(u32::from_le_bytes(slot[..4].try_into().unwrap()) as usize, n);
        for (i, h) in out[0].iter().enumerate() {
            assert_eq!(u64::from_le_bytes(slot[4 + 8 * i..12 + 8 * i].try_into().unwrap()), h.id, "k {k} id {i}");
            let s = f32::from_le_bytes(slot[4 + 8 * n + 4 * i..8 + 8 * n + 4 * i].try_into().unwrap());
            assert_eq!(s.to_bits(), h.score.to_bits(), "k {k} score {i}");
        }
        assert_eq!(slot[4 + 12 * n], 0xA5, "k {k}: nothing written past the body");
    }
    // Too small an area: nothing written, the server encodes the response itself.
    let mut small = vec![0u8; 4 + 12 * 9];
    // SAFETY: small is a live buffer borrowed for the view's life.
    let dout = unsafe { DirectOut::new(small.as_mut_ptr(), small.len()) };
    let out = run(&mut e, &st, &SearchRequest { direct: Some(&dout), ..req(&q[..dim], 1, 10, &all) });
    assert_eq!(out[0].len(), 10);
    assert_eq!(dout.written(), 0);
    assert!(small.iter().all(|&b| b == 0));
    // A batch never writes a direct body (the server offers one only for a lone query anyway).
    let mut slot = vec![0u8; 4096];
    // SAFETY: slot is a live buffer borrowed for the view's life.
    let dout = unsafe { DirectOut::new(slot.as_mut_ptr(), slot.len()) };
    run(&mut e, &st, &SearchRequest { direct: Some(&dout), ..req(&q, 2, 10, &all) });
    assert_eq!(dout.written(), 0);
}

/// The persistent pool's split (awake workers, per-participant chunks for cache-sized tables,
/// ~1 MiB chunks beyond 64 of them for large ones) gives bit-identical results to one thread,
/// search after search on the same engine, with filters.
#[test]
fn pool_split_spinning_workers_match_one_thread() {
    let mut r = rng("pool_split_spinning_workers_match_one_thread");
    let all = Filter::all();
    let some = Filter::new(&[0, 2]).unwrap();
    // 700 rows: per-participant chunks; 140k x 128 (70 MiB): more than 64 chunks of ~1 MiB.
    for &(n, dim) in &[(700usize, 24usize), (10_000, 128), (140_000, 128)] {
        let d = data(&mut r, n, dim);
        for m in [Metric::InnerProduct, Metric::L2] {
            let st = store(&d, dim, m);
            let mut one = CpuEngine::new(1);
            let mut many = CpuEngine::for_server(5, 20_000_000);
            many.set_parallel_min_bytes(0);
            let q = queries(&mut r, 4, dim, m);
            for round in 0..6 {
                for f in [&all, &some] {
                    let k = [1usize, 10, 100][round % 3];
                    for nq in [1usize, 4] {
                        let rq = req(&q[..nq * dim], nq, k, f);
                        let want = run(&mut one, &st, &rq);
                        let got = run(&mut many, &st, &rq);
                        assert_eq!(got, want, "{} n {n} dim {dim} k {k} nq {nq} round {round}", m.name());
                        if round == 0 {
                            check(&st, &rq, &got, &format!("{} n {n} pool", m.name()));
                        }
                    }
                }
            }
        }
    }
}
