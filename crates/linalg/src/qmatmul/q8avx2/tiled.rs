//! int4 weights in tiles of eight output rows ([`crate::qmatmul::tiles`]) on the AVX2 integer
//! path: output `o0 + c` in lane `c` of every sum, so one convert, one scale and one
//! multiply-add per activation row and sub-block serve the tile's eight outputs (the row kernel
//! of [`super::int4`] spends them per output). A tile's sub-block is four 32-byte runs, one
//! 4-byte run of codes a lane; each run meets its four activations broadcast to every lane.
//!
//! Each output's sum is Σ_s (sub-block s's integer sum) · d_a,s · d_w,s added in order of s, less
//! its zero point's share Σ_g d_w,g · zero_g · (row r's scaled code sum over g) added in order of
//! g: the same order whatever the number of activation rows, so an output's value does not
//! depend on the rows beside it.

use super::{dot_add, QActs, PAIRS};
use half::f16;
use std::arch::x86_64::*;

/// Tile `o0 / 8` (outputs `o0 .. o0 + 8`) for the `R` activation rows, quantized in natural
/// order (not paired) with their code sums per weight group.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    codes: &[u8],
    scales: &[f16],
    zeros: Option<&[u8]>,
    group: usize,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let (blocks, groups, per_group) = (ic / 32, ic / group, group / 32);
    debug_assert!(o0.is_multiple_of(8) && o0 + 8 <= oc && !q.paired);
    debug_assert!(q.codes.len() >= R * ic && q.group_sums.len() >= R * groups);
    let wt = codes.as_ptr().add(o0 * ic / 2);
    let st = scales.as_ptr().add(o0 * groups) as *const __m128i;
    let zt = zeros.map(|z| z.as_ptr().add(o0 * groups));
    let (acodes, ascales, asums) = (q.codes.as_ptr(), q.scales.as_ptr(), q.group_sums.as_ptr());
    let low = _mm256_set1_epi8(0x0F);
    let ahead = super::Ahead::int4();
    let mut acc = [_mm256_setzero_ps(); R];
    let mut zacc = [_mm256_setzero_ps(); R];
    for g in 0..groups {
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(st.add(g)));
        for s in g * per_group..(g + 1) * per_group {
            // The stream's lines ahead of their use ([`super::Ahead`]).
            ahead.lines(wt.add(s * 128), 2);
            let w = wt.add(s * 128) as *const __m256i;
            let v: [__m256i; 4] = [
                _mm256_loadu_si256(w),
                _mm256_loadu_si256(w.add(1)),
                _mm256_loadu_si256(w.add(2)),
                _mm256_loadu_si256(w.add(3)),
            ];
            let wl = v.map(|v| _mm256_and_si256(v, low));
            let wh = v.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
            for r in 0..R {
                let a = acodes.add(r * ic + s * 32);
                let sum = block_sum::<V>(&wl, &wh, a);
                let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(da, dw), acc[r]);
            }
        }
        let z = match zt {
            Some(z) => {
                let z8 = _mm_loadl_epi64(z.add(g * 8) as *const __m128i);
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z8))
            }
            None => _mm256_set1_ps(8.0),
        };
        let dz = _mm256_mul_ps(dw, z);
        for r in 0..R {
            let sums = _mm256_broadcast_ss(&*asums.add(r * groups + g));
            zacc[r] = _mm256_fmadd_ps(dz, sums, zacc[r]);
        }
    }
    for r in 0..R {
        let o = out.as_mut_ptr().add(r * oc + o0);
        _mm256_storeu_ps(o, _mm256_sub_ps(acc[r], zacc[r]));
    }
}

/// One sub-block's eight integer sums: lane c = Σ over output c's 32 codes × the row's
/// activations at `a`. With `vpmaddubsw` the pair sums add in 16-bit lanes until the end (at
/// most 8 · 2 · 15 · 127 = 30480: no saturation), then `vpmaddwd` widens them once.
#[inline(always)]
unsafe fn block_sum<const V: u8>(wl: &[__m256i; 4], wh: &[__m256i; 4], a: *const i8) -> __m256i {
    // Activations 4k .. 4k + 4 (low nibbles) and 16 + 4k .. 16 + 4k + 4 (high), in every lane.
    let lo = |k: usize| _mm256_set1_epi32((a.add(4 * k) as *const i32).read_unaligned());
    let hi = |k: usize| _mm256_set1_epi32((a.add(16 + 4 * k) as *const i32).read_unaligned());
    if V == PAIRS {
        let mut s = _mm256_maddubs_epi16(wl[0], lo(0));
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wh[0], hi(0)));
        for k in 1..4 {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wl[k], lo(k)));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wh[k], hi(k)));
        }
        return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
    }
    let mut s = _mm256_setzero_si256();
    for k in 0..4 {
        s = dot_add::<V>(s, wl[k], lo(k));
        s = dot_add::<V>(s, wh[k], hi(k));
    }
    s
}
