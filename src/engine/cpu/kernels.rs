//! The CPU engine's kernels: dot products and squared distances of one query or a block of
//! queries against rows of the table, in scalar code and with AVX2+FMA or AVX-512 (chosen at run
//! time by [`Isa`]).

/// Instruction set used by the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA (256-bit).
    Avx2,
    /// AVX-512F (512-bit, masked tails).
    Avx512,
}

impl Isa {
    /// Best instruction set this CPU supports.
    pub fn detect() -> Isa {
        *Isa::available().last().unwrap()
    }
    /// Every instruction set this CPU can run, worst first (tests compare them all).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Isa::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// Whether this CPU executes 512-bit operations as two 256-bit halves (AMD family 19h, Zen 4):
/// there a single-query scan streams no faster with AVX-512 than with AVX2 and measured ~20%
/// slower (100k×384, 7.1 vs 8.6 ms), so scans use AVX2. Intel cores with AVX-512 scan ~15%
/// faster with it (Xeon, 100k×384: 10.6 against 12.5 ms on one thread).
pub fn halves_512_bit_ops() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let (v, f) = (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1));
        let amd = (v.ebx, v.edx, v.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163); // "AuthenticAMD"
        let base = (f.eax >> 8) & 0xf;
        let family = if base == 0xf { base + ((f.eax >> 20) & 0xff) } else { base };
        amd && family == 0x19
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Rows of one block: a dense range or a gathered list (filters, expiry).
#[derive(Clone, Copy)]
pub(super) enum Rows<'a> {
    Range(usize, usize),
    Idx(&'a [u32]),
}

impl Rows<'_> {
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        match *self {
            Rows::Range(_, n) => n,
            Rows::Idx(v) => v.len(),
        }
    }
    #[inline(always)]
    pub(super) fn get(&self, j: usize) -> usize {
        match *self {
            Rows::Range(s, _) => s + j,
            Rows::Idx(v) => v[j] as usize,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

mod scalar {
    use super::Rows;

    #[inline(always)]
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        // 8 independent accumulators: LLVM turns this into SIMD with the baseline ISA.
        let mut acc = [0.0f32; 8];
        let ca = a.chunks_exact(8);
        let cb = b.chunks_exact(8);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (x, y) in ra.iter().zip(rb) {
            s += x * y;
        }
        s
    }

    #[inline(always)]
    pub fn l2(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0.0f32; 8];
        let ca = a.chunks_exact(8);
        let cb = b.chunks_exact(8);
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                let d = x[i] - y[i];
                acc[i] += d * d;
            }
        }
        let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (x, y) in ra.iter().zip(rb) {
            let d = x - y;
            s += d * d;
        }
        s
    }

    pub fn scores(l2sq: bool, q: &[f32], vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
        for (j, o) in out.iter_mut().enumerate().take(rows.len()) {
            let r = rows.get(j);
            let x = &vecs[r * dim..(r + 1) * dim];
            *o = if l2sq { l2(q, x) } else { dot(q, x) };
        }
    }

    pub fn gemm(qs: &[f32], nq: usize, vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
        let n = rows.len();
        for j in 0..n {
            let r = rows.get(j);
            let x = &vecs[r * dim..(r + 1) * dim];
            for a in 0..nq {
                out[a * n + j] = dot(&qs[a * dim..(a + 1) * dim], x);
            }
        }
    }
}

/// Generates the per-ISA kernels: `scores` (one query against a block of rows, dot or L2) and
/// `gemm` (a batch of queries against a block of rows, register-blocked `Q×R` tiles).
#[cfg(target_arch = "x86_64")]
macro_rules! x86_kernels {
    (
        mod $m:ident, feature = $feat:literal, lanes = $L:literal, vec = $V:ty,
        zero = $zero:path, load = $load:path, fma = $fma:path, add = $add:path, sub = $sub:path, mul = $mul:path,
        tail_load = $tail:ident, hsum = $hsum:ident, tile = ($R:literal, $Q:literal)
    ) => {
        pub mod $m {
            use super::super::Rows;
            #[allow(unused_imports)]
            use super::*;

            /// Squared Euclidean distances of `R` rows from the query `q` (`dim` values each):
            /// one accumulator per row, so `R` independent FMA chains (see `scores`).
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn l2_rows<const R: usize>(q: *const f32, x: &[*const f32; R], dim: usize, out: &mut [f32; R]) {
                let mut acc = [$zero(); R];
                let mut i = 0;
                while i + $L <= dim {
                    let qv = $load(q.add(i));
                    for r in 0..R {
                        let d = $sub(qv, $load(x[r].add(i)));
                        acc[r] = $fma(d, d, acc[r]);
                    }
                    i += $L;
                }
                if i < dim {
                    let rem = dim - i;
                    let qv = $tail(q.add(i), rem);
                    for r in 0..R {
                        let d = $sub(qv, $tail(x[r].add(i), rem));
                        acc[r] = $fma(d, d, acc[r]);
                    }
                }
                for r in 0..R {
                    out[r] = $hsum(acc[r]);
                }
            }

            /// One query against every row of `rows` (dot, or squared distance when `l2sq`).
            #[target_feature(enable = $feat)]
            pub unsafe fn scores(l2sq: bool, q: &[f32], vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
                let n = rows.len();
                assert!(out.len() >= n && q.len() >= dim);
                let (qp, base) = (q.as_ptr(), vecs.as_ptr());
                // Eight rows at a time: eight independent FMA chains (a per-row kernel is bound
                // by its own chain's latency and the horizontal sum, ~45 cycles per 128-dim row
                // on Zen 4 and Sapphire Rapids). A short last group repeats its last row, so
                // every row is scored by the same instruction sequence wherever it falls: a
                // split scan gives bit-identical scores.
                let mut j = 0;
                while j < n {
                    let m = (n - j).min(8);
                    let x: [*const f32; 8] = core::array::from_fn(|t| {
                        let r = rows.get(j + t.min(m - 1));
                        debug_assert!((r + 1) * dim <= vecs.len());
                        base.add(r * dim)
                    });
                    let mut o = [0f32; 8];
                    if l2sq {
                        l2_rows::<8>(qp, &x, dim, &mut o);
                    } else {
                        let mut t = [[0f32; 8]; 1];
                        tile::<8, 1>(qp, &x, dim, &mut t);
                        o = t[0];
                    }
                    out.get_unchecked_mut(j..j + m).copy_from_slice(&o[..m]);
                    j += m;
                }
            }

            /// `Q` queries (consecutive, stride `dim`) × `R` rows of dot products; `out[a][r]`.
            #[target_feature(enable = $feat)]
            #[inline]
            unsafe fn tile<const R: usize, const Q: usize>(q: *const f32, x: &[*const f32; R], dim: usize, out: &mut [[f32; R]; Q]) {
                let mut acc = [[$zero(); R]; Q];
                let mut i = 0;
                while i + $L <= dim {
                    let mut xv = [$zero(); R];
                    for r in 0..R {
                        xv[r] = $load(x[r].add(i));
                    }
                    for a in 0..Q {
                        let qv = $load(q.add(a * dim + i));
                        for r in 0..R {
                            acc[a][r] = $fma(qv, xv[r], acc[a][r]);
                        }
                    }
                    i += $L;
                }
                if i < dim {
                    let rem = dim - i;
                    let mut xv = [$zero(); R];
                    for r in 0..R {
                        xv[r] = $tail(x[r].add(i), rem);
                    }
                    for a in 0..Q {
                        let qv = $tail(q.add(a * dim + i), rem);
                        for r in 0..R {
                            acc[a][r] = $fma(qv, xv[r], acc[a][r]);
                        }
                    }
                }
                for a in 0..Q {
                    for r in 0..R {
                        out[a][r] = $hsum(acc[a][r]);
                    }
                }
            }

            /// `nq` queries against every row of `rows`: `out[a * n + j]` = q_a · x_{rows[j]}.
            #[target_feature(enable = $feat)]
            pub unsafe fn gemm(qs: &[f32], nq: usize, vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
                let n = rows.len();
                assert!(out.len() >= nq * n && qs.len() >= nq * dim);
                let base = vecs.as_ptr();
                let qp = qs.as_ptr();
                let row_ptr = |j: usize| -> *const f32 {
                    let r = rows.get(j);
                    debug_assert!((r + 1) * dim <= vecs.len());
                    base.add(r * dim)
                };
                let op = out.as_mut_ptr();
                let mut a0 = 0;
                while a0 + $Q <= nq {
                    let q = qp.add(a0 * dim);
                    let mut j = 0;
                    while j + $R <= n {
                        let mut x = [std::ptr::null(); $R];
                        for r in 0..$R {
                            x[r] = row_ptr(j + r);
                        }
                        let mut t = [[0.0f32; $R]; $Q];
                        tile::<$R, $Q>(q, &x, dim, &mut t);
                        for a in 0..$Q {
                            for r in 0..$R {
                                *op.add((a0 + a) * n + j + r) = t[a][r];
                            }
                        }
                        j += $R;
                    }
                    while j < n {
                        let x = [row_ptr(j)];
                        let mut t = [[0.0f32; 1]; $Q];
                        tile::<1, $Q>(q, &x, dim, &mut t);
                        for a in 0..$Q {
                            *op.add((a0 + a) * n + j) = t[a][0];
                        }
                        j += 1;
                    }
                    a0 += $Q;
                }
                while a0 < nq {
                    let q = qp.add(a0 * dim);
                    let mut j = 0;
                    while j + $R <= n {
                        let mut x = [std::ptr::null(); $R];
                        for r in 0..$R {
                            x[r] = row_ptr(j + r);
                        }
                        let mut t = [[0.0f32; $R]; 1];
                        tile::<$R, 1>(q, &x, dim, &mut t);
                        for r in 0..$R {
                            *op.add(a0 * n + j + r) = t[0][r];
                        }
                        j += $R;
                    }
                    while j < n {
                        // The same tile arithmetic as every other score of the batch, so equal
                        // rows get bit-equal scores wherever they fall (ties stay exact).
                        let x = [row_ptr(j)];
                        let mut t = [[0.0f32; 1]; 1];
                        tile::<1, 1>(q, &x, dim, &mut t);
                        *op.add(a0 * n + j) = t[0][0];
                        j += 1;
                    }
                    a0 += 1;
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tail512(p: *const f32, n: usize) -> __m512 {
        _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p)
    }
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn hsum512(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tail256(p: *const f32, n: usize) -> __m256 {
        let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskload_ps(p, m)
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    x86_kernels!(mod avx512, feature = "avx512f", lanes = 16, vec = __m512,
        zero = _mm512_setzero_ps, load = _mm512_loadu_ps, fma = _mm512_fmadd_ps, add = _mm512_add_ps,
        sub = _mm512_sub_ps, mul = _mm512_mul_ps, tail_load = tail512, hsum = hsum512, tile = (4, 4));
    // 16 ymm registers: 2 rows × 4 queries = 8 accumulators + 2 row vectors + 1 query vector.
    x86_kernels!(mod avx2, feature = "avx2,fma", lanes = 8, vec = __m256,
        zero = _mm256_setzero_ps, load = _mm256_loadu_ps, fma = _mm256_fmadd_ps, add = _mm256_add_ps,
        sub = _mm256_sub_ps, mul = _mm256_mul_ps, tail_load = tail256, hsum = hsum256, tile = (2, 4));
}

/// One query against a block of rows.
#[inline]
pub(super) fn scores(isa: Isa, l2sq: bool, q: &[f32], vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    match isa {
        // SAFETY: the ISA was detected at run time before it was selected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512::scores(l2sq, q, vecs, dim, rows, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA was detected at run time before it was selected.
        Isa::Avx2 => unsafe { x86::avx2::scores(l2sq, q, vecs, dim, rows, out) },
        _ => scalar::scores(l2sq, q, vecs, dim, rows, out),
    }
}

/// A batch of queries against a block of rows (dot products, query-major output).
#[inline]
pub(super) fn gemm(isa: Isa, qs: &[f32], nq: usize, vecs: &[f32], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    match isa {
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512::gemm(qs, nq, vecs, dim, rows, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86::avx2::gemm(qs, nq, vecs, dim, rows, out) },
        _ => scalar::gemm(qs, nq, vecs, dim, rows, out),
    }
}
