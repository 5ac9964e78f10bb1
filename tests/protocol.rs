//! Slot protocol: races, deadlines, abandoned requests, hostile clients, dead clients, parking.

mod raw_slot;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kalos::shm::{self, Segment};
use kalos::*;
use rand::{Rng, SeedableRng};
use raw_slot::raw_call;

fn uniq(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("rt-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn server(name: &str, dim: u32, f: impl FnOnce(&mut Options)) -> Kalos {
    let mut o = Options { role: Role::Server, dim, metric: Metric::InnerProduct, ..Options::default() };
    f(&mut o);
    Kalos::open(name, &o).unwrap()
}

fn client(name: &str, f: impl FnOnce(&mut Options)) -> Kalos {
    let mut o = Options { role: Role::Client, ..Options::default() };
    f(&mut o);
    Kalos::open(name, &o).unwrap()
}

fn seed() -> u64 {
    let s = std::env::var("KALOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::rng().random());
    eprintln!("seed {s}");
    s
}

#[test]
fn state_word_packing() {
    let w = shm::pack(4_000_000, (1 << 24) + 5, shm::SLOT_SUBMITTED);
    assert_eq!(shm::pid_of(w), 4_000_000);
    assert_eq!(shm::gen_of(w), 5, "generation wraps at 24 bits");
    assert_eq!(shm::state_of(w), shm::SLOT_SUBMITTED);
    let d = shm::with_state(w, shm::SLOT_DONE);
    assert_eq!((shm::pid_of(d), shm::gen_of(d), shm::state_of(d)), (4_000_000, 5, shm::SLOT_DONE));
}

/// Many threads on one handle with fewer slots than threads: every claim is exclusive, and each
/// thread gets the answer to its own query (a unique one-hot vector → its own id).
#[test]
fn many_threads_few_slots_each_gets_its_own_answer() {
    let name = uniq("threads");
    let dim = 64;
    let s = server(&name, dim, |o| o.slots = 2);
    let n = 64u64;
    let mut vecs = vec![0f32; (n as usize) * dim as usize];
    for i in 0..n as usize {
        vecs[i * dim as usize + i] = 1.0;
    }
    let ids: Vec<u64> = (0..n).map(|i| 1000 + i).collect();
    s.upsert(&ids, &vecs, &UpsertOptions::default()).unwrap();
    let c = Arc::new(client(&name, |o| o.client_spin_ns = 0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for r in 0..300usize {
                    let i = (t * 7 + r) % 64;
                    let mut q = vec![0f32; 64];
                    q[i] = 1.0;
                    let h = c.recall(&q, 1, &RecallOptions::default()).unwrap();
                    assert_eq!(h[0].id, 1000 + i as u64, "thread {t} request {r}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = c.stats().unwrap();
    assert!(st.queries >= 2400);
    assert!(st.batches <= st.requests, "batches {} requests {}", st.batches, st.requests);
}

/// A client that times out never later reads someone else's result, and its slot is recycled.
#[test]
fn timed_out_request_is_withdrawn_and_later_calls_are_correct() {
    let name = uniq("timeout");
    let dim = 256u32;
    let rows = 60_000usize;
    let s = server(&name, dim, |o| {
        o.slots = 1;
        o.capacity = rows as u64;
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let vecs: Vec<f32> = (0..rows * dim as usize).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ids: Vec<u64> = (0..rows as u64).collect();
    for ch in (0..rows).collect::<Vec<_>>().chunks(2048) {
        s.upsert(&ids[ch[0]..ch[0] + ch.len()], &vecs[ch[0] * dim as usize..(ch[0] + ch.len()) * dim as usize], &UpsertOptions::default())
            .unwrap();
    }
    let c = client(&name, |o| o.client_spin_ns = 0);
    let mut timeouts = 0;
    for i in 0..20 {
        let q = &vecs[i * dim as usize..(i + 1) * dim as usize];
        // A 1 ms deadline against a scan of 60k x 256: usually too short.
        match c.recall(q, 5, &RecallOptions { timeout_ms: Some(1), ..Default::default() }) {
            Err(e) => {
                assert_eq!(e.status, Status::Timeout);
                timeouts += 1;
            }
            Ok(h) => assert_eq!(h.len(), 5),
        }
        // The next, unhurried call must get the answer to ITS query (its own row ranks first
        // among near-equals only when it is the best; check against the exact reference).
        let j = (i * 7919) % rows;
        let q2 = &vecs[j * dim as usize..(j + 1) * dim as usize];
        let h = c.recall(q2, 1, &RecallOptions { timeout_ms: Some(10_000), ..Default::default() }).unwrap();
        let best = (0..rows)
            .map(|r| (vecs[r * dim as usize..(r + 1) * dim as usize].iter().zip(q2).map(|(a, b)| (a * b) as f64).sum::<f64>(), r))
            .max_by(|a, b| a.0.partial_cmp(&b.0).unwrap())
            .unwrap();
        assert_eq!(h[0].id, best.1 as u64, "answer belongs to this request");
    }
    eprintln!("{timeouts} of 20 short-deadline calls timed out");
    // With one slot, a leaked slot would make this time out.
    assert!(c.stats().is_ok());
}

/// Garbage written into a claimed slot is answered with an error; the server keeps serving.
#[test]
fn hostile_client_garbage_gets_errors_and_server_survives() {
    let name = uniq("hostile");
    let s = server(&name, 8, |o| {
        o.slots = 4;
        o.slot_bytes = 8192;
        o.max_payload_bytes = 1024;
    });
    s.upsert(&[1, 2], &[1., 0., 0., 0., 0., 0., 0., 0., 0., 1., 0., 0., 0., 0., 0., 0.], &UpsertOptions::default()).unwrap();
    let seg = Segment::attach(&name).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let mut errors = 0;
    for round in 0..400 {
        // Random bytes; half the time start with a valid op code so the parsers get exercised.
        let len = rng.random_range(0..seg.data_bytes());
        let mut junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if len >= 4 && round % 2 == 0 {
            // Every op but CLEAR (which a client may legitimately send) and unknown ones.
            let op: u32 = [1, 2, 3, 4, 5, 6, 8, 9, 0xdead][rng.random_range(0..9)];
            junk[..4].copy_from_slice(&op.to_le_bytes());
            if len >= 8 && op == 1 {
                junk[4..8].copy_from_slice(&(rng.random_range(0..2000u32)).to_le_bytes());
            }
        }
        // A lying length (beyond the data area) must be clamped, not trusted.
        let claimed_len = if round % 5 == 0 { u32::MAX } else { len as u32 };
        if raw_call(&seg, round, &junk, claimed_len).0 != 0 {
            errors += 1;
        }
    }
    assert!(errors > 300, "garbage should almost always be rejected ({errors} errors)");
    // Everyone else is still served, and the table is intact.
    let c = client(&name, |_| {});
    let recs = c.get(&[1, 2]).unwrap();
    assert_eq!(recs[0].vector, vec![1., 0., 0., 0., 0., 0., 0., 0.]);
    assert_eq!(recs[1].vector, vec![0., 1., 0., 0., 0., 0., 0., 0.]);
    assert!(c.recall(&[1., 0., 0., 0., 0., 0., 0., 0.], 2, &RecallOptions::default()).is_ok());
    assert!(c.stats().unwrap().count >= 2, "stats still answer");
}

/// A slot claimed by a process that died is reclaimed by the server's housekeeping.
#[test]
fn slots_of_dead_clients_are_reclaimed() {
    let name = uniq("reclaim");
    let s = server(&name, 4, |o| o.slots = 1);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let seg = Segment::attach(&name).unwrap();
    let slot = seg.slot(0);
    let w = slot.state.load(Ordering::Acquire);
    slot.state.store(shm::pack(dead_pid, shm::gen_of(w) + 1, shm::SLOT_CLAIMED), Ordering::SeqCst);
    // The only slot is held by a dead process: a call can only succeed once it is reclaimed.
    let t0 = Instant::now();
    let st = s.stats();
    assert!(st.is_ok(), "{st:?}");
    eprintln!("reclaimed after {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(2));
}

/// Every error path of the Rust API leaves the store unchanged.
#[test]
fn bad_input_changes_nothing() {
    let name = uniq("bad");
    let s = server(&name, 3, |o| {
        o.capacity = 2;
        o.max_payload_bytes = 8;
    });
    let u = UpsertOptions::default();
    assert_eq!(s.upsert(&[1], &[1., 2.], &u).unwrap_err().status, Status::DimensionMismatch);
    assert_eq!(s.upsert(&[1], &[1., f32::NAN, 2.], &u).unwrap_err().status, Status::NonFinite);
    let big = [0u8; 9];
    let pu = UpsertOptions { payloads: Some(vec![Some(&big[..])]), ..Default::default() };
    assert_eq!(s.upsert(&[1], &[1., 2., 3.], &pu).unwrap_err().status, Status::PayloadTooLarge);
    let past = UpsertOptions { expires_ms: 1, ..Default::default() };
    assert_eq!(s.upsert(&[1], &[1., 2., 3.], &past).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(s.upsert(&[1, 2, 3], &[1.; 9], &u).unwrap_err().status, Status::StoreFull);
    assert_eq!(s.stats().unwrap().count, 0);
    s.upsert(&[1, 2], &[1., 0., 0., 0., 1., 0.], &u).unwrap();
    assert_eq!(s.recall(&[1., 0., 0.], 0, &RecallOptions::default()).unwrap_err().status, Status::KOutOfRange);
    assert_eq!(s.recall(&[1., 0., 0.], 1025, &RecallOptions::default()).unwrap_err().status, Status::KOutOfRange);
    assert_eq!(s.recall(&[1., 0.], 1, &RecallOptions::default()).unwrap_err().status, Status::DimensionMismatch);
    assert_eq!(s.recall(&[f32::INFINITY, 0., 0.], 1, &RecallOptions::default()).unwrap_err().status, Status::NonFinite);
    let e = s.delete(&[1, 77]).unwrap_err();
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains("77"));
    assert_eq!(s.get(&[78]).unwrap_err().status, Status::NotFound);
    assert_eq!(s.stats().unwrap().count, 2);
    let l2_recency = RecallOptions { recency: Some(Recency { weight: 2.0, half_life_ms: 1.0 }), ..Default::default() };
    assert_eq!(s.recall(&[1., 0., 0.], 1, &l2_recency).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(Kalos::open("no such/name", &Options::default()).err().unwrap().status, Status::InvalidName);
    s.close();
    assert_eq!(s.recall(&[1., 0., 0.], 1, &RecallOptions::default()).unwrap_err().status, Status::Closed);
}

/// A request larger than a slot is refused with TOO_LARGE (or split, for upserts and batches).
#[test]
fn large_calls_are_split_or_refused() {
    let name = uniq("split");
    let dim = 32usize;
    let s = server(&name, dim as u32, |o| {
        o.slot_bytes = 8192;
        o.slots = 2; // a slot not given back after an error would starve the calls below
        o.max_payload_bytes = 4096;
        o.capacity = 10_000;
    });
    let n = 2000usize; // 2000 x 32 x 4 = 256 KB: many slot-sized chunks
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let v: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ids: Vec<u64> = (0..n as u64).collect();
    s.upsert(&ids, &v, &UpsertOptions::default()).unwrap();
    assert_eq!(s.stats().unwrap().count, n as u64);
    let nq = 300;
    let res = s.recall_batch(&v[..nq * dim], nq, 3, &RecallOptions::default()).unwrap();
    for (i, hits) in res.iter().enumerate() {
        let single = s.recall(&v[i * dim..(i + 1) * dim], 3, &RecallOptions::default()).unwrap();
        // Same ids; scores may differ in the last bits (the batch kernel sums in another order).
        assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), single.iter().map(|h| h.id).collect::<Vec<_>>(), "batch row {i}");
        for (a, b) in hits.iter().zip(&single) {
            assert!((a.score - b.score).abs() <= 1e-5 * (1.0 + b.score.abs()), "batch row {i}: {a:?} vs {b:?}");
        }
    }
    // A non-finite value in a later chunk (the check runs while each chunk is copied into its
    // slot): NON_FINITE naming the value's index in the whole batch; the slot is given back, so
    // with 2 slots the next calls still find one.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut qs = v[..nq * dim].to_vec();
        let at = 250 * dim + 7;
        qs[at] = bad;
        let e = s.recall_batch(&qs, nq, 3, &RecallOptions::default()).unwrap_err();
        assert_eq!(e.status, Status::NonFinite, "{}", e.message);
        assert!(e.message.ends_with(&format!("at index {at}")), "{}", e.message);
    }
    for _ in 0..20 {
        assert_eq!(s.recall_batch(&v[..nq * dim], nq, 3, &RecallOptions::default()).unwrap(), res);
    }
    // k=1000 hits need 12 KB of response: more than a slot.
    assert_eq!(s.recall(&v[..dim], 1000, &RecallOptions::default()).unwrap_err().status, Status::TooLarge);
}

/// Requests of 64 KiB and more are copied into the server's mirror (one region, for the first
/// large request of a server batch; the others into pooled buffers). Several clients sending
/// large batches and large upserts at once: every answer must be its own and right.
#[test]
fn concurrent_large_requests_each_get_their_own_answer() {
    let name = uniq("large");
    let dim = 64usize;
    let s = server(&name, dim as u32, |o| {
        o.slot_bytes = 1 << 20;
        o.slots = 8;
        o.capacity = 50_000;
    });
    let n = 4000usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let v: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ids: Vec<u64> = (0..n as u64).collect();
    s.upsert(&ids, &v, &UpsertOptions::default()).unwrap();
    let v = Arc::new(v);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (name, v) = (name.clone(), v.clone());
            std::thread::spawn(move || {
                let c = client(&name, |_| {});
                for round in 0..20 {
                    // 400 queries x 64 x 4 = 100 KB: a large request. Each thread asks for other
                    // rows, so a mixed-up answer shows as a wrong top hit.
                    let q0 = (t * 997 + round * 131) % (n - 400);
                    let res = c.recall_batch(&v[q0 * dim..(q0 + 400) * dim], 400, 2, &RecallOptions::default()).unwrap();
                    for (i, hits) in res.iter().enumerate().step_by(37) {
                        // A stored row's best match is itself (ip of random rows: |x|^2 wins by far).
                        assert_eq!(hits[0].id, (q0 + i) as u64, "thread {t} round {round} query {i}");
                    }
                    // A large upsert from another thread in the same server batch: new ids.
                    let base = 100_000 + (t * 100 + round) as u64 * 1000;
                    let nid: Vec<u64> = (base..base + 300).collect();
                    c.upsert(&nid, &v[..300 * dim], &UpsertOptions::default()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.stats().unwrap().count, (n + 4 * 20 * 300) as u64);
}

/// Large batches for an engine that takes slot queries (the CUDA engine copies them to the
/// device by DMA and checks them there, normalising cosine queries there too; here a CPU engine
/// forced to take them copies, checks and normalises them itself): the server copies only the
/// header. Answers must be those of the copying path, and a bad batch (a NaN, a wrong length, an
/// all-zero cosine query) must get its error without hurting anyone else: the engine (here posing
/// as a device engine, as the CUDA engine would be) must not be given up for a request's error.
#[test]
fn slot_queries_are_answered_and_checked() {
    kalos::engine::cpu::TEST_SLOT_QUERIES.store(true, Ordering::Relaxed);
    kalos::engine::cpu::TEST_AS_DEVICE.store(true, Ordering::Relaxed);
    let dim = 64usize;
    let n = 3000usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let v: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ids: Vec<u64> = (0..n as u64).collect();
    for metric in [Metric::InnerProduct, Metric::L2, Metric::Cosine] {
        let name = uniq("slotq");
        let mut o = Options {
            role: Role::Server,
            dim: dim as u32,
            metric,
            slot_bytes: 1 << 20,
            slots: 4,
            backend: Backend::Cpu,
            ..Options::default()
        };
        o.capacity = 10_000;
        let s = Kalos::open(&name, &o).unwrap();
        s.upsert(&ids, &v, &UpsertOptions::default()).unwrap();
        // 400 stored rows as queries (100 KB, a large request): each one's best match is itself.
        let c = client(&name, |_| {});
        let res = c.recall_batch(&v[100 * dim..500 * dim], 400, 3, &RecallOptions::default()).unwrap();
        for (i, hits) in res.iter().enumerate() {
            assert_eq!(hits[0].id, 100 + i as u64, "{metric:?} query {i}");
            assert_eq!(hits.len(), 3);
            if metric == Metric::Cosine {
                // Each query normalised: its own row scores 1.
                assert!((hits[0].score - 1.0).abs() < 1e-5, "query {i}: {}", hits[0].score);
            }
        }
        if metric == Metric::Cosine {
            // The same queries scaled by 3 (or split into small, copied requests) answer the same.
            let v3: Vec<f32> = v[100 * dim..500 * dim].iter().map(|x| x * 3.0).collect();
            let r3 = c.recall_batch(&v3, 400, 3, &RecallOptions::default()).unwrap();
            let small = c.recall_batch(&v[100 * dim..110 * dim], 10, 3, &RecallOptions::default()).unwrap();
            for i in 0..400 {
                assert_eq!(r3[i].iter().map(|h| h.id).collect::<Vec<_>>(), res[i].iter().map(|h| h.id).collect::<Vec<_>>());
                for (a, b) in r3[i].iter().zip(&res[i]) {
                    assert!((a.score - b.score).abs() < 1e-6);
                }
            }
            assert_eq!(&small[..], &res[..10]);
        }
        // A namespace filter in the header (the queries start after it).
        let f = RecallOptions { namespaces: Some(vec![0, 7]), ..RecallOptions::default() };
        let res2 = c.recall_batch(&v[100 * dim..500 * dim], 400, 3, &f).unwrap();
        assert_eq!(res, res2);
        // Raw requests: the client library would refuse these, a hostile client need not.
        let seg = Segment::attach(&name).unwrap();
        let header = |nq: u32| {
            let mut h = Vec::new();
            for x in [kalos::wire::OP_RECALL, 3, nq, 0, u32::MAX] {
                h.extend_from_slice(&x.to_le_bytes());
            }
            h.extend_from_slice(&0f32.to_le_bytes());
            h.extend_from_slice(&1f64.to_le_bytes());
            h
        };
        let mut req = header(400);
        for x in &v[..400 * dim] {
            req.extend_from_slice(&x.to_le_bytes());
        }
        let (st, _) = raw_call(&seg, 0, &req, req.len() as u32);
        assert_eq!(st, 0, "a well-formed raw batch");
        let bad_at = 4 + 28 + (123 * dim + 5) * 4;
        req[bad_at..bad_at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        let (st, body) = raw_call(&seg, 0, &req, req.len() as u32);
        assert_eq!(st, Status::NonFinite as u32, "{}", String::from_utf8_lossy(&body));
        assert!(String::from_utf8_lossy(&body).contains(&format!("index {}", 123 * dim + 5)), "{}", String::from_utf8_lossy(&body));
        req.truncate(req.len() - 4);
        let (st, body) = raw_call(&seg, 0, &req, req.len() as u32);
        assert_eq!(st, Status::DimensionMismatch as u32, "{}", String::from_utf8_lossy(&body));
        // An all-zero query: an error for cosine only.
        let mut req = header(400);
        for (j, x) in v[..400 * dim].iter().enumerate() {
            let x = if j / dim == 77 { 0.0 } else { *x };
            req.extend_from_slice(&x.to_le_bytes());
        }
        let (st, body) = raw_call(&seg, 0, &req, req.len() as u32);
        if metric == Metric::Cosine {
            assert_eq!(st, Status::InvalidArgument as u32, "{}", String::from_utf8_lossy(&body));
            assert!(String::from_utf8_lossy(&body).contains("all zeros"), "{}", String::from_utf8_lossy(&body));
        } else {
            assert_eq!(st, 0, "{}", String::from_utf8_lossy(&body));
        }
        // The server still serves, on the same engine.
        let res3 = c.recall_batch(&v[100 * dim..500 * dim], 400, 3, &RecallOptions::default()).unwrap();
        assert_eq!(res, res3);
        let st = s.stats().unwrap();
        assert_eq!(st.engine_fallbacks, 0);
    }
}

/// Resident set size of this process, bytes.
fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A hostile recall whose answer could never fit its slot (32766 queries, k = 1024: a 400 MB
/// reply through a 1 MiB slot) is refused before any work: the server's memory does not grow by
/// the hundreds of megabytes the answer would take, and it keeps serving.
#[test]
fn a_recall_whose_reply_cannot_fit_the_slot_is_refused_before_any_work() {
    let name = uniq("oversize");
    let dim = 4usize;
    let s = server(&name, dim as u32, |o| o.backend = Backend::Cpu);
    let ids: Vec<u64> = (1..=2000).collect();
    let v: Vec<f32> = (0..2000 * dim).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    s.upsert(&ids, &v, &UpsertOptions::default()).unwrap();
    let seg = Segment::attach(&name).unwrap();
    let nq = 32766u32;
    let mut req = Vec::new();
    for x in [kalos::wire::OP_RECALL, 1024, nq, 0, u32::MAX] {
        req.extend_from_slice(&x.to_le_bytes());
    }
    req.extend_from_slice(&0f32.to_le_bytes());
    req.extend_from_slice(&1f64.to_le_bytes());
    for i in 0..nq as usize * dim {
        req.extend_from_slice(&((i % 5) as f32).to_le_bytes());
    }
    assert!(req.len() <= seg.data_bytes(), "the request itself fits the slot");
    let before = rss_bytes();
    let (st, body) = raw_call(&seg, 0, &req, req.len() as u32);
    let grew = rss_bytes().saturating_sub(before);
    assert_eq!(st, Status::TooLarge as u32, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("reply"), "{}", String::from_utf8_lossy(&body));
    assert!(grew < 64 << 20, "the server's memory grew by {} MB for a refused request", grew >> 20);
    // The store still answers an honest client.
    let c = client(&name, |_| {});
    assert_eq!(c.recall(&v[..dim], 5, &RecallOptions::default()).unwrap().len(), 5);
    drop(c);
    s.close();
}

/// Options under which the largest payload could never travel (a memory of dimension 60000 and a
/// 100 kB payload through 300 kB slots) are refused at open, naming the values; the same store
/// with room for one memory opens and takes it.
#[test]
fn options_that_can_never_carry_the_largest_payload_are_refused_at_open() {
    let name = uniq("never");
    let mut o = Options { role: Role::Server, dim: 60_000, backend: Backend::Cpu, ..Options::default() };
    o.slot_bytes = 300_000;
    o.max_payload_bytes = 100_000;
    let Err(e) = Kalos::open(&name, &o) else { panic!("a store whose largest payload cannot fit a slot opened") };
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    for v in ["slot_bytes = 300000", "60000", "max_payload_bytes = 100000"] {
        assert!(e.message.contains(v), "{v} not in {}", e.message);
    }
    o.slot_bytes = 400_000;
    let s = Kalos::open(&name, &o).unwrap();
    let v = vec![0.5f32; 60_000];
    let payload = vec![7u8; 100_000];
    let up = UpsertOptions { payloads: Some(vec![Some(&payload[..])]), ..UpsertOptions::default() };
    s.upsert(&[1], &v, &up).unwrap();
    assert_eq!(s.get(&[1]).unwrap()[0].payload.as_deref(), Some(&payload[..]));
    s.close();
}
