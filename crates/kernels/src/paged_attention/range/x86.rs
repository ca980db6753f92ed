//! The tile's two products on x86. Scores: eight keys at a time per query head, eight 256-bit
//! sums over the head dimension folded into one vector of eight scores by two rounds of
//! `vhaddps` and one cross-lane add (a single dot would fold its own sum alone). Σ p·v: the
//! head's output columns in registers (64 in eight 256-bit vectors, or 128 in eight 512-bit
//! ones with AVX-512), each position's probability broadcast once and its value row read once.
//! Head dims not a multiple of 8 take the plain loops (with FMA).

use super::super::{Task, MAX_GROUP};
use super::{plain_scores, plain_weighted, range_body, Lanes};
use std::arch::x86_64::*;

/// AVX2 + FMA: 256-bit vectors.
pub(super) struct Ymm;

/// AVX-512 F: Σ p·v in 512-bit vectors (scores as [`Ymm`]).
pub(super) struct Zmm;

/// [`range_body`] with AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn avx2(
    t: &Task,
    r: usize,
    h: usize,
    range: std::ops::Range<usize>,
    acc: &mut [f32],
    ml: &mut [f32; 2 * MAX_GROUP],
    scratch: &mut [f32],
) {
    range_body::<Ymm, true>(t, r, h, range, acc, ml, scratch)
}

/// [`range_body`] with AVX-512 F, AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2 and FMA.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn avx512(
    t: &Task,
    r: usize,
    h: usize,
    range: std::ops::Range<usize>,
    acc: &mut [f32],
    ml: &mut [f32; 2 * MAX_GROUP],
    scratch: &mut [f32],
) {
    range_body::<Zmm, true>(t, r, h, range, acc, ml, scratch)
}

impl Lanes for Ymm {
    #[inline(always)]
    unsafe fn scores(qh: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]) {
        scores8(qh, keys, scale, out)
    }

    #[inline(always)]
    unsafe fn weighted(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
        weighted8(p, values, dst)
    }
}

impl Lanes for Zmm {
    #[inline(always)]
    unsafe fn scores(qh: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]) {
        scores8(qh, keys, scale, out)
    }

    #[inline(always)]
    unsafe fn weighted(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
        if dst.len().is_multiple_of(16) {
            weighted16(p, values, dst)
        } else {
            weighted8(p, values, dst)
        }
    }
}

/// out[i] = scale · (qh · keys[i]), eight keys at a time (a last group of fewer repeats its last
/// key in the spare lanes and keeps only its own scores).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn scores8(qh: &[f32], keys: &[&[f32]], scale: f32, out: &mut [f32]) {
    let hd = qh.len();
    if !hd.is_multiple_of(8) {
        return plain_scores::<true>(qh, keys, scale, out);
    }
    let n = out.len();
    assert!(n <= keys.len() && keys.iter().all(|k| k.len() == hd));
    let q = qh.as_ptr();
    for i in (0..n).step_by(8) {
        let mut k = [q; 8];
        for j in 0..8 {
            k[j] = keys[(i + j).min(n - 1)].as_ptr();
        }
        let mut a = [_mm256_setzero_ps(); 8];
        for c in (0..hd).step_by(8) {
            let qv = _mm256_loadu_ps(q.add(c));
            for j in 0..8 {
                a[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j].add(c)), a[j]);
            }
        }
        let mut s = [0.0f32; 8];
        _mm256_storeu_ps(
            s.as_mut_ptr(),
            _mm256_mul_ps(fold8(&a), _mm256_set1_ps(scale)),
        );
        let m = (n - i).min(8);
        out[i..i + m].copy_from_slice(&s[..m]);
    }
}

/// Lane j of the result = the sum of a[j]'s eight lanes.
#[inline(always)]
unsafe fn fold8(a: &[__m256; 8]) -> __m256 {
    // [a0 01, a0 23, a1 01, a1 23 | a0 45, a0 67, a1 45, a1 67], and so on.
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    // [a0 0123, a1 0123, a2 0123, a3 0123 | a0 4567, a1 4567, a2 4567, a3 4567].
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
    _mm256_add_ps(lo, hi)
}

/// dst = Σ_i p[i] · values[i] in 256-bit vectors: 64 columns at a time, then 32, then 8.
#[inline(always)]
unsafe fn weighted8(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
    let hd = dst.len();
    if !hd.is_multiple_of(8) {
        return plain_weighted::<true>(p, values, dst);
    }
    assert!(p.len() <= values.len() && values.iter().all(|v| v.len() == hd));
    let mut c0 = 0;
    while c0 + 64 <= hd {
        columns8::<8>(p, values, c0, dst);
        c0 += 64;
    }
    while c0 + 32 <= hd {
        columns8::<4>(p, values, c0, dst);
        c0 += 32;
    }
    while c0 < hd {
        columns8::<1>(p, values, c0, dst);
        c0 += 8;
    }
}

/// dst[c0..c0 + 8N] = Σ_i p[i] · values[i][c0..c0 + 8N], in N 256-bit sums.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn columns8<const N: usize>(p: &[f32], values: &[&[f32]], c0: usize, dst: &mut [f32]) {
    let mut a = [_mm256_setzero_ps(); N];
    for (pi, v) in p.iter().zip(values) {
        let (pv, v) = (_mm256_set1_ps(*pi), v.as_ptr().add(c0));
        for j in 0..N {
            a[j] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.add(8 * j)), a[j]);
        }
    }
    for j in 0..N {
        _mm256_storeu_ps(dst.as_mut_ptr().add(c0 + 8 * j), a[j]);
    }
}

/// As [`weighted8`] in 512-bit vectors (HD a multiple of 16): 128 columns, then 64, then 16.
#[inline(always)]
unsafe fn weighted16(p: &[f32], values: &[&[f32]], dst: &mut [f32]) {
    let hd = dst.len();
    assert!(hd.is_multiple_of(16));
    assert!(p.len() <= values.len() && values.iter().all(|v| v.len() == hd));
    let mut c0 = 0;
    while c0 + 128 <= hd {
        columns16::<8>(p, values, c0, dst);
        c0 += 128;
    }
    while c0 + 64 <= hd {
        columns16::<4>(p, values, c0, dst);
        c0 += 64;
    }
    while c0 < hd {
        columns16::<1>(p, values, c0, dst);
        c0 += 16;
    }
}

/// dst[c0..c0 + 16N] = Σ_i p[i] · values[i][c0..c0 + 16N], in N 512-bit sums.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn columns16<const N: usize>(p: &[f32], values: &[&[f32]], c0: usize, dst: &mut [f32]) {
    let mut a = [_mm512_setzero_ps(); N];
    for (pi, v) in p.iter().zip(values) {
        let (pv, v) = (_mm512_set1_ps(*pi), v.as_ptr().add(c0));
        for j in 0..N {
            a[j] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(v.add(16 * j)), a[j]);
        }
    }
    for j in 0..N {
        _mm512_storeu_ps(dst.as_mut_ptr().add(c0 + 16 * j), a[j]);
    }
}
