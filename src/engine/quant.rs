//! The 8-bit scan (`scan = "int8"`): scalar quantization of rows and queries, the error bound
//! of a quantized score, and the exact re-ranking step that every engine shares.
//!
//! # Quantization
//! Each row is quantized with its own scale (per-vector, symmetric): `s = max|x_i| / 127`,
//! `x̃_i = round(x_i / s)` in −127..=127, so `x ≈ s·x̃`. A query is quantized the same way. The
//! approximate score is exact integer arithmetic plus one multiply:
//! `q·x ≈ s_q·s_x·Σ q̃_i x̃_i`.
//!
//! Per-vector against per-dimension scales, measured on all-MiniLM-L6-v2 embeddings of man page
//! sentences (15,384 rows, 1,000 held-out queries; `tests/quality/int8_recall.py --simulate`,
//! numbers in docs/BENCHMARKS.md, "8-bit scan"): at the same re-rank count both give the same
//! recall@10 (R = 10: 0.9950 against 0.9939, equal from R = 16 up; the embeddings are unit
//! vectors whose coordinates share one range), and
//! per-vector needs no table-wide statistics, so a row quantizes on its own when it is written
//! and nothing is re-quantized when new rows widen a dimension's range.
//!
//! # Error bound
//! With `q = s_q q̃ + e_q` and `x = s_x x̃ + e_x` (`|e| ≤ s/2` per coordinate):
//! `q·x − s_q s_x q̃·x̃ = q·e_x + e_q·(s_x x̃)`, so
//! `|q·x − approx| ≤ s_x (‖q‖₁ + s_q ‖x̃‖₁) / 2`, plus the f32 rounding of both scores.
//! [`QueryCode::bound`] evaluates it with the table-wide maxima of `s_x` and `s_x‖x̃‖₁`, which
//! bounds the error of every row, scored or not.
//!
//! # Re-ranking and the "uncertain" count
//! An engine keeps the `R` best rows by approximate key, re-scores those exactly from the
//! full-precision rows and returns the best `k` by exact key ([`rerank`]). A row left out had an
//! approximate key at most the `R`-th candidate's (`floor`), so its exact key is at most
//! `floor + bound`. When the `k`-th exact key is at least that, the answer is provably the
//! exact top-k; otherwise the query counts as *uncertain* (a true neighbour may have been
//! missed) in the server's stats (`rerank_uncertain`).

use super::TopK;
use crate::types::{Metric, Recency};

/// Largest quantized magnitude (symmetric range, so −128 is never produced).
pub(crate) const QMAX: f32 = 127.0;

/// Largest magnitude of the GPU's 4-bit first-pass codes (kernels/table.cu, `quantize_rows`).
pub(crate) const QMAX4: f32 = 7.0;

/// Row stride of quantized codes: rows are zero-padded to a multiple of this many bytes, so SIMD
/// kernels (16 and 32 lanes) never need a tail.
pub(crate) const CODE_ALIGN: usize = 32;

/// Bytes per row of quantized codes for `dim` dimensions.
pub(crate) fn code_stride(dim: usize) -> usize {
    dim.div_ceil(CODE_ALIGN) * CODE_ALIGN
}

/// Re-rank count for `k` results when the option `rerank` is `opt` (0 = adapt): `max(8k, 64)`,
/// never fewer than `k`. The default was chosen with `tests/quality/int8_recall.py`
/// (docs/BENCHMARKS.md, "8-bit scan").
pub(crate) fn rerank_count(opt: u32, k: usize) -> usize {
    if opt == 0 {
        (8 * k).max(64)
    } else {
        (opt as usize).max(k)
    }
}

/// Quantizes `x` into `out` (`out.len() ≥ x.len()`; the rest of `out` is zeroed). Returns the
/// scale `s` (`x ≈ s·out`) and `‖out‖₁ = Σ|out_i|`. A zero vector gets scale 0 and zero codes.
pub(crate) fn quantize_row(x: &[f32], out: &mut [i8]) -> (f32, u32) {
    let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    out.fill(0);
    if m == 0.0 || !m.is_finite() {
        return (0.0, 0);
    }
    let s = m / QMAX;
    let inv = QMAX / m;
    let mut l1 = 0u32;
    for (o, &v) in out.iter_mut().zip(x) {
        let c = (v * inv).round().clamp(-QMAX, QMAX) as i8;
        l1 += c.unsigned_abs() as u32;
        *o = c;
    }
    (s, l1)
}

/// A query quantized for the int8 scan, with what the error bound needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueryCode {
    /// Codes widened to i16, zero-padded to [`code_stride`] (kernels multiply i16 pairs).
    pub codes: Vec<i16>,
    /// `q ≈ scale·codes`.
    pub scale: f32,
    /// `‖q‖₁` of the f32 query.
    pub abs_sum: f32,
    /// `max|q_i|`.
    pub abs_max: f32,
}

impl QueryCode {
    /// Quantizes `q` (reusing this value's buffer).
    pub(crate) fn set(&mut self, q: &[f32]) {
        let stride = code_stride(q.len());
        let mut tmp = vec![0i8; stride];
        let (scale, _) = quantize_row(q, &mut tmp);
        self.codes.clear();
        self.codes.extend(tmp.iter().map(|&c| c as i16));
        self.scale = scale;
        self.abs_sum = q.iter().map(|v| v.abs()).sum();
        self.abs_max = q.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    }

    /// Bound on `|q·x − approx(q·x)|` for every row of a table whose largest row scale is
    /// `max_scale` and largest `s_x‖x̃‖₁` is `max_scaled_l1` ([`QuantStats`]), including the f32
    /// rounding of the exact and the approximate score (`dim` terms each).
    pub(crate) fn bound(&self, dim: usize, t: &QuantStats) -> f32 {
        let quant = 0.5 * (t.max_scale * self.abs_sum + self.scale * t.max_scaled_l1);
        (quant + 2.0 * self.rounding(dim, t)) * (1.0 + 1e-5)
    }

    /// The f32 rounding of one score of `dim` terms: |x_i| ≤ 127.5·s_x, so
    /// Σ|q_i x_i| ≤ ‖q‖₁·127.5·max_scale, and each f32 dot product of `dim` terms is off by at
    /// most dim·ε of that (an approximate score's integer sum is exact, its two multiplies 2ε).
    fn rounding(&self, dim: usize, t: &QuantStats) -> f32 {
        (dim as f32 + 2.0) * f32::EPSILON * self.abs_sum * (QMAX + 0.5) * t.max_scale
    }

    /// As [`QueryCode::bound`], for the GPU's 4-bit first pass (`KALOS_INT8_NIBBLE`): each
    /// row's codes `round(x_i · 7 / max|x|)` with scale `s₄ = 127 s_x / 7`, scored with the
    /// query's 8-bit codes. With `|e₄| ≤ s₄/2` per coordinate the error is at most
    /// `s₄‖q‖₁/2 + s_q‖s₄x̂‖₁/2`, and `‖s₄x̂‖₁ ≤ ‖x‖₁ + dim·s₄/2 ≤ s_x‖x̃‖₁ + dim·(s_x + s₄)/2`;
    /// plus the f32 rounding of both scores and of `s₄` itself (a few ε of the approximate
    /// score, at most `(‖q‖₁ + dim·s_q/2)·7.5·s₄`).
    pub(crate) fn bound4(&self, dim: usize, t: &QuantStats) -> f32 {
        let s4 = t.max_scale * (QMAX / QMAX4);
        let l1 = t.max_scaled_l1 + dim as f32 * (t.max_scale + s4) / 2.0;
        let quant = 0.5 * (s4 * self.abs_sum + self.scale * l1);
        let approx = (self.abs_sum + dim as f32 * self.scale / 2.0) * (QMAX4 + 0.5) * s4;
        (quant + 2.0 * self.rounding(dim, t) + 8.0 * f32::EPSILON * approx) * (1.0 + 1e-5)
    }
}

/// Table-wide maxima for the error bound. They only grow between rebuilds (a deleted row may
/// leave them larger than needed, which keeps the bound valid).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct QuantStats {
    pub max_scale: f32,
    pub max_scaled_l1: f32,
}

impl QuantStats {
    pub(crate) fn add(&mut self, scale: f32, l1: u32) {
        self.max_scale = self.max_scale.max(scale);
        self.max_scaled_l1 = self.max_scaled_l1.max(scale * l1 as f32);
    }
}

/// Converts a bound on a raw score error (`q·x`) into one on the engine's key: L2 keys are
/// `−(|q|² − 2q·x + |x|²)` (twice the error), recency-weighted keys scale by `1 − w`.
pub(crate) fn key_bound(metric: Metric, recency: Option<Recency>, raw: f32) -> f32 {
    let b = if metric == Metric::L2 { 2.0 * raw } else { raw };
    match recency {
        Some(r) => (1.0 - r.weight) * b,
        None => b,
    }
}

/// Full-precision rows for the exact re-scoring of [`rerank`]: the store's f32 rows, or a
/// device table's f16 / bf16 copy read back to the host (row-major, `dim` values a row).
#[derive(Clone, Copy)]
#[allow(dead_code)] // read by device engines that re-score on the host
pub(crate) enum FullRows<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
    Bf16(&'a [half::bf16]),
}

#[allow(dead_code)] // as FullRows
impl FullRows<'_> {
    /// `q·x_row` (or `|q − x_row|²` when `l2`), accumulated in f64 and rounded once.
    pub(crate) fn score(&self, q: &[f32], row: usize, l2: bool) -> f32 {
        let d = q.len();
        fn go<T: Copy>(q: &[f32], x: &[T], l2: bool, f: impl Fn(T) -> f32) -> f32 {
            let mut s = 0.0f64;
            for (&a, &b) in q.iter().zip(x) {
                let b = f(b) as f64;
                s += if l2 { (a as f64 - b).powi(2) } else { a as f64 * b };
            }
            s as f32
        }
        match *self {
            FullRows::F32(v) => go(q, &v[row * d..(row + 1) * d], l2, |x| x),
            FullRows::F16(v) => go(q, &v[row * d..(row + 1) * d], l2, f32::from),
            FullRows::Bf16(v) => go(q, &v[row * d..(row + 1) * d], l2, f32::from),
        }
    }
}

/// Where a query's candidate list was cut ([`rerank`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cut {
    /// Some matching row was left out (the candidate selection was full).
    pub full: bool,
    /// Approximate key of the worst candidate: every row left out had at most this.
    pub floor: f32,
    /// Bound on |exact key − approximate key| of any row ([`key_bound`]).
    pub bound: f32,
    /// A first pass before the candidates (the GPU's 4-bit codes) left matching rows out: the
    /// 4-bit key of its last candidate, which no row it left out exceeded, and the bound on
    /// |exact key − 4-bit key| of any row.
    pub first: Option<(f32, f32)>,
}

/// Buffers of [`rerank`], reused across queries; `top` holds the answer after each call.
pub(crate) struct RerankScratch {
    rows: Vec<u32>,
    keys: Vec<f32>,
    pub top: TopK,
}

impl Default for RerankScratch {
    fn default() -> RerankScratch {
        RerankScratch { rows: Vec::new(), keys: Vec::new(), top: TopK::new(0) }
    }
}

/// The shared re-ranking step. `cands` are one query's candidates (row, id), any order;
/// `exact_key(rows, keys)` writes the exact key of each row (larger is better: the engine's
/// internal key, recency included). Leaves the best `k` by exact key (ties: lower id) in
/// `scratch.top` and returns whether the answer is *uncertain*: the candidate list was cut and
/// the `k`-th exact key (or any, with fewer than `k` candidates) is below `floor + bound`, so a
/// row left out might beat it.
pub(crate) fn rerank(
    cands: &[(u32, u64)],
    k: usize,
    cut: Cut,
    scratch: &mut RerankScratch,
    exact_key: impl FnOnce(&[u32], &mut [f32]),
) -> bool {
    let RerankScratch { rows, keys, top } = scratch;
    top.reset(k);
    rows.clear();
    rows.extend(cands.iter().map(|c| c.0));
    keys.clear();
    keys.resize(rows.len(), 0.0);
    exact_key(rows, keys);
    for (c, &key) in cands.iter().zip(keys.iter()) {
        top.push(key, c.1);
    }
    let kth = if top.len() < k { f32::NEG_INFINITY } else { top.threshold() };
    // A NaN bound or floor counts as uncertain.
    let below = |reach: f32| !matches!(kth.partial_cmp(&reach), Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal));
    (cut.full && below(cut.floor + cut.bound)) || cut.first.is_some_and(|(f, b)| below(f + b))
}

/// Exact keys of `rows` from [`FullRows`] for `metric` (the engine-independent scorer a device
/// engine may use on the host): ip / cosine `q·x` (cosine rows are stored normalised), l2
/// `−|q−x|²`, then recency weighting with `created` and `now_ms`.
#[allow(clippy::too_many_arguments)]
#[allow(dead_code)] // as FullRows
pub(crate) fn exact_keys(
    full: FullRows<'_>,
    metric: Metric,
    q: &[f32],
    rows: &[u32],
    created: &[u64],
    recency: Option<Recency>,
    now_ms: u64,
    out: &mut [f32],
) {
    let l2 = metric == Metric::L2;
    for (o, &r) in out.iter_mut().zip(rows) {
        let s = full.score(q, r as usize, l2);
        let base = if l2 { -s } else { s };
        *o = match recency {
            None => base,
            Some(rc) => (1.0 - rc.weight) * base + rc.weight * super::recency_boost(now_ms, created[r as usize], rc.half_life_ms),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn rows_round_trip_within_half_a_step_and_pad_with_zeros() {
        let x = [0.5f32, -1.0, 0.25, 0.0, 1e-3];
        let mut c = vec![9i8; code_stride(x.len())];
        let (s, l1) = quantize_row(&x, &mut c);
        assert_eq!(s, 1.0 / 127.0);
        assert_eq!(&c[..5], &[64, -127, 32, 0, 0]);
        assert!(c[5..].iter().all(|&v| v == 0));
        assert_eq!(l1, 64 + 127 + 32);
        for (a, &b) in x.iter().zip(&c) {
            assert!((a - s * b as f32).abs() <= s / 2.0 + 1e-7);
        }
        assert_eq!(quantize_row(&[0.0; 4], &mut c), (0.0, 0));
        assert!(c.iter().all(|&v| v == 0));
    }

    #[test]
    fn the_bound_holds_for_every_row_and_is_not_vacuous() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let dim = 384;
        let n = 2000;
        let rows: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0f32..1.0) * rng.random_range(0.0f32..1.0)).collect();
        let stride = code_stride(dim);
        let mut codes = vec![0i8; n * stride];
        let mut scales = vec![0f32; n];
        let mut st = QuantStats::default();
        for r in 0..n {
            let (s, l1) = quantize_row(&rows[r * dim..(r + 1) * dim], &mut codes[r * stride..(r + 1) * stride]);
            scales[r] = s;
            st.add(s, l1);
        }
        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut qc = QueryCode::default();
        qc.set(&q);
        let b = qc.bound(dim, &st);
        let mut worst = 0.0f64;
        for r in 0..n {
            let exact: f64 = q.iter().zip(&rows[r * dim..(r + 1) * dim]).map(|(&a, &b)| a as f64 * b as f64).sum();
            let dot: i32 = qc.codes[..dim].iter().zip(&codes[r * stride..r * stride + dim]).map(|(&a, &b)| a as i32 * b as i32).sum();
            let approx = dot as f64 * qc.scale as f64 * scales[r] as f64;
            worst = worst.max((exact - approx).abs());
        }
        assert!(worst <= b as f64, "error {worst} above the bound {b}");
        // Worst case against typical: the bound is a few times the largest error seen, not orders
        // of magnitude above it.
        assert!((b as f64) < 50.0 * worst, "bound {b} vs largest error {worst}");
    }

    #[test]
    fn the_four_bit_bound_holds_for_every_row() {
        // The GPU's first pass (kernels/table.cu quantize_rows): codes round(x · 7 / max|x|),
        // scored with the query's 8-bit codes at scale (max|x| / 127) · (127 / 7), in f32.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (dim, n) = (200, 2000);
        let rows: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0f32..1.0) * rng.random_range(0.0f32..1.0)).collect();
        let mut c8 = vec![0i8; code_stride(dim)];
        let mut st = QuantStats::default();
        let mut quant = Vec::new();
        for r in 0..n {
            let x = &rows[r * dim..(r + 1) * dim];
            let (s, l1) = quantize_row(x, &mut c8);
            st.add(s, l1);
            let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let c4: Vec<i32> = x.iter().map(|&v| (v * (QMAX4 / m)).round().clamp(-QMAX4, QMAX4) as i32).collect();
            quant.push((s, c4));
        }
        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut qc = QueryCode::default();
        qc.set(&q);
        let b4 = qc.bound4(dim, &st);
        let mut worst = 0.0f64;
        for (r, (s, c4)) in quant.iter().enumerate() {
            let exact: f64 = q.iter().zip(&rows[r * dim..(r + 1) * dim]).map(|(&a, &b)| a as f64 * b as f64).sum();
            let dot: i32 = qc.codes[..dim].iter().zip(c4).map(|(&a, &b)| a as i32 * b).sum();
            let approx = (dot as f32 * (qc.scale * (s * (QMAX / QMAX4)))) as f64;
            worst = worst.max((exact - approx).abs());
        }
        assert!(worst <= b4 as f64, "error {worst} above the bound {b4}");
        assert!(b4 > qc.bound(dim, &st) && (b4 as f64) < 50.0 * worst, "bound {b4} vs largest error {worst}");
    }

    #[test]
    fn rerank_count_adapts_to_k() {
        assert_eq!(rerank_count(0, 1), 64);
        assert_eq!(rerank_count(0, 10), 80);
        assert_eq!(rerank_count(0, 100), 800);
        assert_eq!(rerank_count(16, 100), 100);
        assert_eq!(rerank_count(500, 10), 500);
    }

    #[test]
    fn rerank_orders_by_exact_key_and_flags_answers_inside_the_bound() {
        let cands = [(0u32, 10u64), (1, 11), (2, 12), (3, 13)];
        let exact = [0.5f32, 0.9, 0.7, 0.1];
        let mut sc = RerankScratch::default();
        let mut run = |full, floor, bound| {
            let key = |r: &[u32], k: &mut [f32]| r.iter().zip(k).for_each(|(&r, k)| *k = exact[r as usize]);
            let u = rerank(&cands, 2, Cut { full, floor, bound, first: None }, &mut sc, key);
            (u, sc.top.sorted())
        };
        // k-th exact key 0.7; rows left out are at most 0.6 + 0.05: certain.
        assert_eq!(run(true, 0.6, 0.05), (false, vec![(0.9, 11), (0.7, 12)]));
        // A left-out row could reach 0.6 + 0.2 > 0.7: uncertain.
        assert!(run(true, 0.6, 0.2).0);
        // Nothing was left out: certain whatever the bound.
        assert!(!run(false, 0.6, 10.0).0);
        assert!(run(true, 0.6, f32::NAN).0);
    }

    #[test]
    fn full_rows_score_every_dtype() {
        let q = [1.0f32, 2.0, -1.0];
        let x = [0.5f32, 0.25, 1.0, 2.0, 0.0, 0.0];
        let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let b: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        for f in [FullRows::F32(&x), FullRows::F16(&h), FullRows::Bf16(&b)] {
            assert_eq!(f.score(&q, 0, false), 0.0);
            assert_eq!(f.score(&q, 1, false), 2.0);
            assert_eq!(f.score(&q, 1, true), 1.0 + 4.0 + 1.0);
        }
        let mut out = [0.0; 2];
        exact_keys(FullRows::F32(&x), Metric::L2, &q, &[1, 0], &[0, 0], None, 0, &mut out);
        assert_eq!(out, [-6.0, -(0.25 + 3.0625 + 4.0)]);
    }
}
