//! Shared by tests/copy_threads.rs and tests/copy_plain.rs: a large batch's queries are
//! checked and copied into the slot in chunks of 16384 values that several threads take from a
//! shared counter; every chunk arrives intact and the first bad value is the one reported,
//! whichever thread found it.

use kalos::*;
use rand::{Rng, SeedableRng};

/// Runs the checks on a fresh store named after `tag`. The caller sets the copy environment
/// first (`KALOS_COPY_THREADS` = `threads`, `KALOS_COPY_NT`): it is read once per process.
pub fn large_batches_are_copied_in_parts_and_checked(tag: &str, threads: usize) {
    let s = std::env::var("KALOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::rng().random());
    eprintln!("seed {s}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let name = format!("rt-{tag}-{}", std::process::id());
    let dim = 64usize;
    let o = Options {
        role: Role::Server,
        dim: dim as u32,
        metric: Metric::InnerProduct,
        slot_bytes: 4 << 20,
        slots: 2,
        capacity: 20_000,
        ..Options::default()
    };
    let st = Kalos::open(&name, &o).unwrap();
    let n = 3000usize;
    let v: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    st.upsert(&(0..n as u64).collect::<Vec<_>>(), &v, &UpsertOptions::default()).unwrap();
    // 5000 queries x 64 x 4 bytes = 1.28 MB: over the 1 MiB split threshold, 20 chunks of
    // 16384 values (`rows` = 256 queries each), taken by `threads` threads.
    let nq = 5000usize;
    let qs: Vec<f32> = (0..nq * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let rows = 16384 / dim;
    let chunks = nq.div_ceil(rows);
    assert!(threads >= 2);
    let res = st.recall_batch(&qs, nq, 4, &RecallOptions::default()).unwrap();
    assert_eq!(res.len(), nq);
    // Every chunk arrived intact: each row's answer is the single query's (checked on a spread
    // of rows, covering every chunk and both ends of each).
    let edges = (1..chunks).flat_map(|p| [p * rows - 1, p * rows]);
    for i in (0..nq).step_by(97).chain(edges).chain([0, nq - 1]) {
        let single = st.recall(&qs[i * dim..(i + 1) * dim], 4, &RecallOptions::default()).unwrap();
        assert_eq!(res[i].iter().map(|h| h.id).collect::<Vec<_>>(), single.iter().map(|h| h.id).collect::<Vec<_>>(), "row {i}");
    }
    // Bad values in two chunks: the error names the first, whichever thread found it first.
    // (early in the second chunk and late in the last; in the first and the last; at the start
    // of the last chunk; the very last value alone; in one chunk's last block and the next
    // chunk's first value)
    let last = (chunks - 1) * rows * dim;
    for (early, late) in [
        (rows * dim + 5, nq * dim - 70),
        (100, last + 63),
        (last, last + 1),
        (nq * dim - 1, nq * dim - 1),
        (3 * rows * dim - 2, 3 * rows * dim),
    ] {
        let mut b = qs.clone();
        b[late] = f32::INFINITY;
        b[early] = f32::NAN;
        let e = st.recall_batch(&b, nq, 4, &RecallOptions::default()).unwrap_err();
        assert_eq!(e.status, Status::NonFinite, "{}", e.message);
        assert!(e.message.ends_with(&format!("at index {}", early.min(late))), "{}", e.message);
    }
    // Both slots were given back after the errors.
    for _ in 0..3 {
        assert_eq!(st.recall_batch(&qs, nq, 4, &RecallOptions::default()).unwrap(), res);
    }
}
