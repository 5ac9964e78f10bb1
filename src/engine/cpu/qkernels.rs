//! Integer dot products of the int8 scan: a query's codes (widened to i16) against rows of 8-bit
//! codes, in scalar code, AVX2 (`vpmaddwd`) or AVX-512 VNNI (`vpdpwssd`), chosen at run time.
//! Rows are zero-padded to [`crate::engine::quant::CODE_ALIGN`] bytes, so no kernel has a tail;
//! the sums are exact (|code| ≤ 127: a row of up to 133,000 dimensions fits an i32).

use super::kernels::Rows;

/// Instruction set of the integer kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QIsa {
    Scalar,
    /// AVX2: sign-extend 16 codes to i16, `vpmaddwd`, add.
    Avx2,
    /// AVX-512 BW + VNNI: sign-extend 32 codes to i16, `vpdpwssd`.
    Avx512Vnni,
}

impl QIsa {
    /// Every integer kernel this CPU can run, worst first.
    pub fn available() -> Vec<QIsa> {
        #[allow(unused_mut)]
        let mut v = vec![QIsa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                v.push(QIsa::Avx2);
            }
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni") {
                v.push(QIsa::Avx512Vnni);
            }
        }
        v
    }
    /// The best one at most as wide as the float kernels' `isa` (so `KALOS_CPU_SCAN_ISA` and
    /// the tests' forced ISAs apply to both).
    pub fn for_isa(isa: super::Isa) -> QIsa {
        let want = match isa {
            super::Isa::Scalar => QIsa::Scalar,
            super::Isa::Avx2 => QIsa::Avx2,
            super::Isa::Avx512 => QIsa::Avx512Vnni,
        };
        QIsa::available().into_iter().rfind(|&q| q as u8 <= want as u8).unwrap_or(QIsa::Scalar)
    }
    pub fn name(self) -> &'static str {
        match self {
            QIsa::Scalar => "scalar",
            QIsa::Avx2 => "avx2",
            QIsa::Avx512Vnni => "vnni",
        }
    }
}

/// `out[j] = Σ q[i]·codes[rows[j]·stride + i]` over `stride` values (`q.len() == stride`).
pub(super) fn dots(isa: QIsa, q: &[i16], codes: &[i8], stride: usize, rows: Rows<'_>, out: &mut [i32]) {
    assert!(q.len() == stride && stride.is_multiple_of(32) && out.len() >= rows.len());
    for j in 0..rows.len() {
        assert!((rows.get(j) + 1) * stride <= codes.len(), "row {} past the codes", rows.get(j));
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA was detected at run time before it was selected (QIsa::available);
        // every row lies inside `codes` and `q` holds `stride` values (asserted above).
        QIsa::Avx512Vnni => unsafe { x86::dots_vnni(q, codes, stride, rows, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        QIsa::Avx2 => unsafe { x86::dots_avx2(q, codes, stride, rows, out) },
        _ => {
            for (j, o) in out.iter_mut().enumerate().take(rows.len()) {
                let x = &codes[rows.get(j) * stride..(rows.get(j) + 1) * stride];
                *o = q.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Rows;
    use std::arch::x86_64::*;

    /// Four rows at a time (four independent accumulator chains); a short last group repeats
    /// its last row.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dots_avx2(q: &[i16], codes: &[i8], stride: usize, rows: Rows<'_>, out: &mut [i32]) {
        let (qp, base, n) = (q.as_ptr(), codes.as_ptr(), rows.len());
        let mut j = 0;
        while j < n {
            let m = (n - j).min(4);
            let x: [*const i8; 4] = core::array::from_fn(|t| base.add(rows.get(j + t.min(m - 1)) * stride));
            let mut acc = [_mm256_setzero_si256(); 4];
            let mut i = 0;
            while i < stride {
                let qv = _mm256_loadu_si256(qp.add(i) as *const __m256i);
                for r in 0..4 {
                    let xv = _mm256_cvtepi8_epi16(_mm_loadu_si128(x[r].add(i) as *const __m128i));
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(qv, xv));
                }
                i += 16;
            }
            for r in 0..m {
                let s = _mm_add_epi32(_mm256_castsi256_si128(acc[r]), _mm256_extracti128_si256(acc[r], 1));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
                out[j + r] = _mm_cvtsi128_si32(s);
            }
            j += m;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dots_vnni(q: &[i16], codes: &[i8], stride: usize, rows: Rows<'_>, out: &mut [i32]) {
        let (qp, base, n) = (q.as_ptr(), codes.as_ptr(), rows.len());
        let mut j = 0;
        while j < n {
            let m = (n - j).min(4);
            let x: [*const i8; 4] = core::array::from_fn(|t| base.add(rows.get(j + t.min(m - 1)) * stride));
            let mut acc = [_mm512_setzero_si512(); 4];
            let mut i = 0;
            while i < stride {
                let qv = _mm512_loadu_si512(qp.add(i) as *const __m512i);
                for r in 0..4 {
                    let xv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(x[r].add(i) as *const __m256i));
                    acc[r] = _mm512_dpwssd_epi32(acc[r], qv, xv);
                }
                i += 32;
            }
            for r in 0..m {
                out[j + r] = _mm512_reduce_add_epi32(acc[r]);
            }
            j += m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn every_kernel_gives_the_exact_integer_sum() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for stride in [32usize, 64, 416, 800] {
            let n = 11;
            let codes: Vec<i8> = (0..n * stride).map(|_| rng.random_range(-127..=127)).collect();
            let q: Vec<i16> = (0..stride).map(|_| rng.random_range(-127..=127)).collect();
            let idx = [10u32, 0, 3, 3, 7];
            for rows in [Rows::Range(0, n), Rows::Range(2, 5), Rows::Idx(&idx)] {
                let want: Vec<i32> = (0..rows.len())
                    .map(|j| q.iter().zip(&codes[rows.get(j) * stride..]).map(|(&a, &b)| a as i32 * b as i32).sum())
                    .collect();
                for isa in QIsa::available() {
                    let mut out = vec![0; rows.len()];
                    dots(isa, &q, &codes, stride, rows, &mut out);
                    assert_eq!(out, want, "{isa:?} stride {stride}");
                }
            }
        }
    }
}
