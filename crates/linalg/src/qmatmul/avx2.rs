//! The AVX2 + FMA path of [`super::matmul`]: as the AVX-512 one with 8 lanes. int4, nf4 and
//! ggml's blocks run on the integer kernel (`q8avx2`) from this level up.

use super::stored::scalar_tail;
use super::{QWeight, Rows};
use std::arch::x86_64::*;
use std::ops::Range;

/// # Safety
/// The CPU must have AVX2, FMA and F16C; `out` holds (rows, OC), `p.a` (rows, IC), `p.w`
/// (OC, IC).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(out: &mut [f32], p: Rows, range: Range<usize>) {
    by_rows!(p.rows, rows_n(out, p, range))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_n<const R: usize>(out: &mut [f32], p: Rows, range: Range<usize>) {
    let Rows { a, w, ic, oc, .. } = p;
    let ap = a.as_ptr();
    for o in range {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut tail = [0.0f32; R];
        let mut row_scale = 1.0f32;
        let body = ic / 8 * 8;
        match *w {
            QWeight::F32(wt) => {
                let wp = wt.as_ptr().add(o * ic);
                for i in (0..body).step_by(8) {
                    fma_rows::<R>(&mut acc, _mm256_loadu_ps(wp.add(i)), ap, ic, i);
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| wt[o * ic + i]);
            }
            QWeight::Bf16(wt) => {
                let wp = wt.as_ptr().add(o * ic) as *const __m128i;
                for i in (0..body).step_by(8) {
                    let h = _mm_loadu_si128(wp.byte_add(2 * i));
                    let x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                    fma_rows::<R>(&mut acc, x, ap, ic, i);
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| wt[o * ic + i].to_f32());
            }
            QWeight::Int8 { codes, scales } => {
                let cp = codes.as_ptr().add(o * ic);
                for i in (0..body).step_by(8) {
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(cp.add(i) as *const __m128i));
                    fma_rows::<R>(&mut acc, _mm256_cvtepi32_ps(q), ap, ic, i);
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| codes[o * ic + i] as f32);
                row_scale = scales[o].to_f32();
            }
            // int4, grouped and nf4 weights run on the integer path (`matmul_on` routes them); a
            // direct call still gets the right sum.
            QWeight::Int4 { .. }
            | QWeight::Grouped { .. }
            | QWeight::Grouped4 { .. }
            | QWeight::Int4Tiled { .. }
            | QWeight::Int8Tiled { .. }
            | QWeight::Nf4 { .. }
            | QWeight::Nf4Tiled { .. } => {
                scalar_tail::<R>(&mut tail, a, ic, 0, |i| w.at(o, i, ic));
            }
        }
        for r in 0..R {
            out[r * oc + o] = row_scale * (hsum(acc[r]) + tail[r]);
        }
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[inline(always)]
unsafe fn fma_rows<const R: usize>(
    acc: &mut [__m256; R],
    x: __m256,
    ap: *const f32,
    ic: usize,
    i: usize,
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        *acc = _mm256_fmadd_ps(x, _mm256_loadu_ps(ap.add(r * ic + i)), *acc);
    }
}
