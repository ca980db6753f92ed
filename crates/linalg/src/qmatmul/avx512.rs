//! The AVX-512 path of [`super::matmul`]: 16 f32 lanes, up to [`super::ROWS`] accumulators (one
//! per activation row) fed by each weight vector, a horizontal sum per output: f32, bf16, and
//! int8 whose rows are not whole blocks of 32. int4, nf4 and ggml's blocks run on the integer
//! kernels (`vnni`, `q8avx2`) from AVX2 up.

use super::stored::scalar_tail;
use super::{QWeight, Rows};
use std::arch::x86_64::*;
use std::ops::Range;

/// Independent accumulator chains per row (an FMA's 4-cycle latency would otherwise bound a
/// single chain to one vector per 4 cycles, below the memory's rate), picked statically so they
/// stay in registers. The same for every row count: a row's sum is the same whether it runs
/// alone (decode) or with others (a verification step), so greedy outputs do not depend on it.
const CH: usize = 2;

/// # Safety
/// The CPU must have AVX-512 F and BW; `out` holds (rows, OC), `p.a` (rows, IC), `p.w`
/// (OC, IC).
#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
pub(super) unsafe fn rows(out: &mut [f32], p: Rows, range: Range<usize>) {
    by_rows!(p.rows, rows_n(out, p, range))
}

#[target_feature(enable = "avx512f,avx512bw,f16c,fma")]
unsafe fn rows_n<const R: usize>(out: &mut [f32], p: Rows, range: Range<usize>) {
    let Rows { a, w, ic, oc, .. } = p;
    let ap = a.as_ptr();
    for o in range {
        let mut acc = [[_mm512_setzero_ps(); CH]; R];
        let mut tail = [0.0f32; R];
        let mut row_scale = 1.0f32;
        let body = ic / 16 * 16;
        match *w {
            QWeight::F32(wt) => {
                let wp = wt.as_ptr().add(o * ic);
                for i in (0..body).step_by(16) {
                    let x = _mm512_loadu_ps(wp.add(i));
                    if (i / 16) % 2 == 0 {
                        fma_rows::<R, 0>(&mut acc, x, ap, ic, i);
                    } else {
                        fma_rows::<R, 1>(&mut acc, x, ap, ic, i);
                    }
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| wt[o * ic + i]);
            }
            QWeight::Bf16(wt) => {
                let wp = wt.as_ptr().add(o * ic) as *const __m256i;
                for i in (0..body).step_by(16) {
                    let h = _mm256_loadu_si256(wp.byte_add(2 * i));
                    let x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
                    if (i / 16) % 2 == 0 {
                        fma_rows::<R, 0>(&mut acc, x, ap, ic, i);
                    } else {
                        fma_rows::<R, 1>(&mut acc, x, ap, ic, i);
                    }
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| wt[o * ic + i].to_f32());
            }
            QWeight::Int8 { codes, scales } => {
                let cp = codes.as_ptr().add(o * ic) as *const __m128i;
                for i in (0..body).step_by(16) {
                    if i % 64 == 0 {
                        // The next row, a cache line at a time, while this one is read.
                        let next = (cp as *const i8).wrapping_add(ic + i);
                        _mm_prefetch::<_MM_HINT_T0>(next);
                    }
                    let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(cp.byte_add(i)));
                    let x = _mm512_cvtepi32_ps(q);
                    if (i / 16) % 2 == 0 {
                        fma_rows::<R, 0>(&mut acc, x, ap, ic, i);
                    } else {
                        fma_rows::<R, 1>(&mut acc, x, ap, ic, i);
                    }
                }
                scalar_tail::<R>(&mut tail, a, ic, body, |i| codes[o * ic + i] as f32);
                row_scale = scales[o].to_f32();
            }
            // int4, grouped and nf4 weights run on the integer paths (`matmul_on` routes them);
            // a direct call still gets the right sum.
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
            let mut sum = acc[r][0];
            for c in &acc[r][1..] {
                sum = _mm512_add_ps(sum, *c);
            }
            out[r * oc + o] = row_scale * (_mm512_reduce_add_ps(sum) + tail[r]);
        }
    }
}

/// acc[r] += x · a[r][i..i+16].
#[inline(always)]
unsafe fn fma_rows<const R: usize, const C: usize>(
    acc: &mut [[__m512; CH]; R],
    x: __m512,
    ap: *const f32,
    ic: usize,
    i: usize,
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        acc[C] = _mm512_fmadd_ps(x, _mm512_loadu_ps(ap.add(r * ic + i)), acc[C]);
    }
}
