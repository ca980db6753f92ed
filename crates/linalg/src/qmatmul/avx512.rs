//! The AVX-512 path of [`super::matmul`]: 16 f32 lanes, up to [`super::ROWS`] accumulators (one
//! per activation row) fed by each dequantized weight vector, a horizontal sum per output. Int4
//! expands 16 bytes (one 32-weight sub-block) to 16 lanes of codes, split into low and high
//! nibbles, and subtracts the zero point in integers (or, symmetric, looks its value up with one
//! `vpermps`). nf4 and ggml's blocks run on the integer kernel (`q8avx2`) from AVX2 up.

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
            QWeight::Int4 {
                codes,
                scales,
                zeros: Some(zeros),
                group,
            } => {
                let groups = ic / group;
                let g0 = o * groups;
                let mask = _mm512_set1_epi32(0xF);
                let mut sc = [0.0f32; 16];
                for g in 0..groups {
                    if g % 16 == 0 {
                        load_scales_f16(&mut sc, &scales[g0 + g..g0 + groups.min(g + 16)]);
                    }
                    let d = _mm512_set1_ps(sc[g % 16]);
                    let z = _mm512_set1_epi32(zeros[g0 + g] as i32);
                    for s in (0..group).step_by(32) {
                        let col = g * group + s;
                        let bytes = codes.as_ptr().add((o * ic + col) / 2) as *const __m128i;
                        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes));
                        let lo = _mm512_sub_epi32(_mm512_and_si512(q, mask), z);
                        let hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), z);
                        let (lo, hi) = (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi));
                        sub_block::<R>(&mut acc, lo, hi, d, ap, ic, col);
                    }
                }
            }
            QWeight::Int4 {
                codes,
                scales,
                zeros: None,
                group,
            } => {
                // Symmetric: the codes' values q − 8 are a 16-entry table, scaled per group.
                let levels: [f32; 16] = std::array::from_fn(|i| i as f32 - 8.0);
                let groups = ic / group;
                let g0 = o * groups;
                let mut sc = [0.0f32; 16];
                for g in 0..groups {
                    if g % 16 == 0 {
                        load_scales_f16(&mut sc, &scales[g0 + g..g0 + groups.min(g + 16)]);
                    }
                    let lut =
                        _mm512_mul_ps(_mm512_loadu_ps(levels.as_ptr()), _mm512_set1_ps(sc[g % 16]));
                    table_group::<R>(&mut acc, codes, lut, ap, o, ic, g * group, group);
                }
            }
            // Grouped, tiled and nf4 weights run on the integer path (`matmul_on` routes them); a
            // direct call still gets the right sum.
            QWeight::Grouped { .. }
            | QWeight::Grouped4 { .. }
            | QWeight::Int4Tiled { .. }
            | QWeight::Nf4 { .. } => {
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

/// acc[r] += Σ over the group's sub-blocks of lut[code] · a[r], the group's scale already in
/// the table.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn table_group<const R: usize>(
    acc: &mut [[__m512; CH]; R],
    codes: &[u8],
    lut: __m512,
    ap: *const f32,
    o: usize,
    ic: usize,
    start: usize,
    group: usize,
) {
    let mask = _mm512_set1_epi32(0xF);
    for col in (start..start + group).step_by(32) {
        let bytes = codes.as_ptr().add((o * ic + col) / 2) as *const __m128i;
        if col % 128 == 0 {
            // The next row's matching line, while this one is read.
            _mm_prefetch::<_MM_HINT_T0>((bytes as *const i8).wrapping_add(ic / 2));
        }
        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes));
        let lo = _mm512_permutexvar_ps(_mm512_and_si512(q, mask), lut);
        let hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = ap.add(r * ic + col);
            acc[0] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(p), acc[0]);
            acc[1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(p.add(16)), acc[1]);
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

/// acc[r] += d · (lo · a[r][col..col+16] + hi · a[r][col+16..col+32]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn sub_block<const R: usize>(
    acc: &mut [[__m512; CH]; R],
    lo: __m512,
    hi: __m512,
    d: __m512,
    ap: *const f32,
    ic: usize,
    col: usize,
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let p = ap.add(r * ic + col);
        let t = _mm512_mul_ps(lo, _mm512_loadu_ps(p));
        let t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(p.add(16)), t);
        acc[0] = _mm512_fmadd_ps(t, d, acc[0]);
    }
}

/// Up to 16 fp16 scales widened into `sc`.
#[inline(always)]
unsafe fn load_scales_f16(sc: &mut [f32; 16], src: &[half::f16]) {
    if src.len() == 16 {
        let h = _mm256_loadu_si256(src.as_ptr() as *const __m256i);
        _mm512_storeu_ps(sc.as_mut_ptr(), _mm512_cvtph_ps(h));
    } else {
        for (d, s) in sc.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}
