//! Grouped int8 weights on the integer path: ggml's blocks repacked, a scale per group of 32
//! (or 16) and each group's minimum times the activations' sum over the group. AVX2 for a row
//! at a time (bound by its bytes), AVX-512 VNNI for batches (bound by the products).

use super::{dot32, hsum, QActs};
use std::arch::x86_64::*;

/// Grouped int8: each block's sum scaled by its activation scale and its group's weight scale
/// (per half block for groups of 16); the minima's share added at the end.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn outputs<const R: usize, const O: usize>(
    out: &mut [f32],
    q: &QActs,
    codes: &[i8],
    scales: &[f32],
    mins: Option<&[f32]>,
    group: usize,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let blocks = ic / 32;
    let groups = ic / group;
    let (acodes, ascales) = (q.codes.as_ptr(), q.scales.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    let wrow: [*const i8; O] = std::array::from_fn(|j| codes.as_ptr().add((o0 + j) * ic));
    let srow: [*const f32; O] = std::array::from_fn(|j| scales.as_ptr().add((o0 + j) * groups));
    for s in 0..blocks {
        let wv: [__m256i; O] =
            std::array::from_fn(|j| _mm256_loadu_si256(wrow[j].add(s * 32) as *const __m256i));
        let wabs: [__m256i; O] = std::array::from_fn(|j| _mm256_sign_epi8(wv[j], wv[j]));
        let dw: [__m256; O] = std::array::from_fn(|j| {
            if group == 16 {
                let (lo, hi) = (*srow[j].add(2 * s), *srow[j].add(2 * s + 1));
                _mm256_setr_ps(lo, lo, lo, lo, hi, hi, hi, hi)
            } else {
                _mm256_set1_ps(*srow[j].add(s))
            }
        });
        for r in 0..R {
            let a = _mm256_loadu_si256(acodes.add(r * ic + s * 32) as *const __m256i);
            let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
            for j in 0..O {
                let p = dot32(wabs[j], _mm256_sign_epi8(a, wv[j]));
                acc[j][r] = _mm256_fmadd_ps(p, _mm256_mul_ps(da, dw[j]), acc[j][r]);
            }
        }
    }
    for j in 0..O {
        let o = o0 + j;
        for r in 0..R {
            let mut total = hsum(acc[j][r]);
            if let Some(m) = mins {
                let sums = &q.group_sums[r * groups..(r + 1) * groups];
                total += min_share(&m[o * groups..(o + 1) * groups], sums);
            }
            out[r * oc + o] = total;
        }
    }
}

/// Σ_g min_g · sums_g.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn min_share(mins: &[f32], sums: &[f32]) -> f32 {
    let body = mins.len() / 8 * 8;
    let mut share = _mm256_setzero_ps();
    for g in (0..body).step_by(8) {
        let m = _mm256_loadu_ps(mins.as_ptr().add(g));
        share = _mm256_fmadd_ps(m, _mm256_loadu_ps(sums.as_ptr().add(g)), share);
    }
    let mut total = hsum(share);
    for g in body..mins.len() {
        total += mins[g] * sums[g];
    }
    total
}

/// As [`outputs`] for output rows `range` and `rows` activation rows, on AVX-512 VNNI: 64
/// weights a step, `vpdpbusd` on |w| and the activations with w's sign, 16 int32 lanes of which
/// each block of 32 fills 8 (a group of 16: 4), each lane scaled by its block's activation scale
/// times its group's weight scale. Sums run in another order than [`outputs`]'s.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; `q` holds `rows` (≤ `ROWS`) quantized rows of IC;
/// the weights hold the (OC, IC) matrix in groups of 16 or 32.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(in crate::qmatmul) unsafe fn vnni_rows(
    out: &mut [f32],
    q: &QActs,
    codes: &[i8],
    scales: &[f32],
    mins: Option<&[f32]>,
    group: usize,
    rows: usize,
    ic: usize,
    oc: usize,
    range: std::ops::Range<usize>,
) {
    assert!(rows <= super::ROWS && q.codes.len() >= rows * ic);
    let blocks = ic / 32;
    let groups = ic / group;
    let pairs = blocks / 2;
    // Lane k of a 64-weight step: block k / 8; its group k / 4 (16) or k / 8 (32).
    let by_block = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let by_quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let by_group = if group == 16 { by_quarter } else { by_block };
    let (acodes, ascales) = (q.codes.as_ptr(), q.scales.as_ptr());
    for o in range {
        let wrow = codes.as_ptr().add(o * ic);
        let srow = scales.as_ptr().add(o * groups);
        let mut acc = [_mm512_setzero_ps(); super::ROWS];
        for p in 0..pairs {
            let w = _mm512_loadu_si512(wrow.add(p * 64) as *const _);
            let wabs = _mm512_abs_epi8(w);
            let negative = _mm512_movepi8_mask(w);
            // The pair's 2 (or 4) weight scales, spread over the lanes (no load past them).
            let at = srow.add(p * 64 / group);
            let four = match group {
                16 => _mm_loadu_ps(at),
                _ => _mm_castpd_ps(_mm_load_sd(at as *const f64)),
            };
            let dw = _mm512_permutexvar_ps(by_group, _mm512_castps128_ps512(four));
            for r in 0..rows {
                let a = _mm512_loadu_si512(acodes.add(r * ic + p * 64) as *const _);
                let a = _mm512_mask_sub_epi8(a, negative, _mm512_setzero_si512(), a);
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs, a);
                let two = _mm_castpd_ps(_mm_load_sd(ascales.add(r * blocks + 2 * p) as *const f64));
                let da = _mm512_permutexvar_ps(by_block, _mm512_castps128_ps512(two));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(da, dw), acc[r]);
            }
        }
        for r in 0..rows {
            let mut total = _mm512_reduce_add_ps(acc[r]);
            if blocks % 2 == 1 {
                // The last block alone, 32 weights.
                let s = blocks - 1;
                let w = _mm256_loadu_si256(wrow.add(s * 32) as *const __m256i);
                let a = _mm256_loadu_si256(acodes.add(r * ic + s * 32) as *const __m256i);
                let dot = super::dot32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), dot);
                let da = *ascales.add(r * blocks + s);
                for (k, l) in lanes.iter().enumerate() {
                    total += l * da * *srow.add((s * 32 + 4 * k) / group);
                }
            }
            if let Some(m) = mins {
                let sums = &q.group_sums[r * groups..(r + 1) * groups];
                total += min_share(&m[o * groups..(o + 1) * groups], sums);
            }
            out[r * oc + o] = total;
        }
    }
}
