//! int4 tiles two at a time in 512-bit vectors, at the AVX-512 levels: tiles t and t + 1
//! (outputs `o0 .. o0 + 16`) side by side, one 256-bit half each, so one convert, one scale and
//! one multiply-add per activation row and sub-block serve sixteen outputs, and at eight rows
//! the sums, the unpacked weights and the accumulators all stay in the 32 registers. Each
//! output's integer sums, scales and order of adds are [`super::tiled`]'s: the same bits.

use super::{QActs, Weights, EVEX, PAIRS};
use std::arch::x86_64::*;
use std::ops::Range;

/// The tiles in `range` for the `R` activation rows, two at a time (a last odd one by
/// [`super::tiled::tile`]), the sums by `V` (`vpdpbusd` or `vpmaddubsw`) in 512 bits.
#[inline(always)]
unsafe fn tiles<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    w: &Weights,
    ic: usize,
    oc: usize,
    range: Range<usize>,
) {
    let Weights::Int4Tiled {
        codes,
        scales,
        zeros,
        group,
    } = *w
    else {
        unreachable!("only tiles run here")
    };
    assert!(R <= super::ROWS && q.codes.len() >= R * ic);
    assert!(range.start.is_multiple_of(8) && range.end.is_multiple_of(8));
    let mut o0 = range.start;
    while o0 + 16 <= range.end {
        pair::<R, V>(out, q, codes, scales, zeros, group, ic, oc, o0);
        o0 += 16;
    }
    if o0 < range.end {
        super::tiled::tile::<R, V>(out, q, codes, scales, zeros, group, ic, oc, o0);
    }
}

// AVX-512 VNNI's `vpdpbusd`, and AVX-512 BW's `vpmaddubsw` (a CPU without VNNI).
kernel_with!(tiles_vnni, avx512vnni, tiles::<R, EVEX>);
kernel_with!(tiles_bw, avx512bw, tiles::<R, PAIRS>);

/// Tiles `o0 / 8` and `o0 / 8 + 1` for the `R` activation rows (quantized in natural order, with
/// their code sums per weight group).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pair<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    codes: &[u8],
    scales: &[half::f16],
    zeros: Option<&[u8]>,
    group: usize,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let (blocks, groups, per_group) = (ic / 32, ic / group, group / 32);
    debug_assert!(o0.is_multiple_of(8) && o0 + 16 <= oc && !q.paired);
    debug_assert!(q.group_sums.len() >= R * groups);
    // A tile is 8 rows of IC / 2 bytes; its scales (and zero points) 8 a group.
    let wa = codes.as_ptr().add(o0 * ic / 2);
    let wb = wa.add(4 * ic);
    let sa = scales.as_ptr().add(o0 * groups) as *const __m128i;
    let sb = scales.as_ptr().add((o0 + 8) * groups) as *const __m128i;
    let zt = zeros.map(|z| {
        (
            z.as_ptr().add(o0 * groups),
            z.as_ptr().add((o0 + 8) * groups),
        )
    });
    let (acodes, ascales, asums) = (q.codes.as_ptr(), q.scales.as_ptr(), q.group_sums.as_ptr());
    let low = _mm512_set1_epi8(0x0F);
    let ahead = super::Ahead::int4();
    let mut acc = [_mm512_setzero_ps(); R];
    let mut zacc = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        let h = _mm256_castsi128_si256(_mm_loadu_si128(sa.add(g)));
        let dw = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(h, _mm_loadu_si128(sb.add(g))));
        for s in g * per_group..(g + 1) * per_group {
            for w in [wa, wb] {
                ahead.lines(w.add(s * 128), 2);
            }
            let (a, b) = (
                wa.add(s * 128) as *const __m256i,
                wb.add(s * 128) as *const __m256i,
            );
            let v: [__m512i; 4] = std::array::from_fn(|k| {
                let lo = _mm512_castsi256_si512(_mm256_loadu_si256(a.add(k)));
                _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b.add(k)))
            });
            let wl = v.map(|v| _mm512_and_si512(v, low));
            let wh = v.map(|v| _mm512_and_si512(_mm512_srli_epi16::<4>(v), low));
            for r in 0..R {
                let sum = block_sum::<V>(&wl, &wh, acodes.add(r * ic + s * 32));
                let da = _mm512_set1_ps(*ascales.add(r * blocks + s));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(da, dw), acc[r]);
            }
        }
        let z = match zt {
            Some((za, zb)) => {
                let za = _mm_loadl_epi64(za.add(g * 8) as *const __m128i);
                let zb = _mm_loadl_epi64(zb.add(g * 8) as *const __m128i);
                _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(za, zb)))
            }
            None => _mm512_set1_ps(8.0),
        };
        let dz = _mm512_mul_ps(dw, z);
        for r in 0..R {
            let sums = _mm512_set1_ps(*asums.add(r * groups + g));
            zacc[r] = _mm512_fmadd_ps(dz, sums, zacc[r]);
        }
    }
    for r in 0..R {
        let o = out.as_mut_ptr().add(r * oc + o0);
        _mm512_storeu_ps(o, _mm512_sub_ps(acc[r], zacc[r]));
    }
}

/// One sub-block's sixteen integer sums, as [`super::tiled`]'s eight: lane c = Σ over output
/// c's 32 codes × the row's activations at `a` (pair sums in 16-bit lanes at most 30480).
#[inline(always)]
unsafe fn block_sum<const V: u8>(wl: &[__m512i; 4], wh: &[__m512i; 4], a: *const i8) -> __m512i {
    let lo = |k: usize| _mm512_set1_epi32((a.add(4 * k) as *const i32).read_unaligned());
    let hi = |k: usize| _mm512_set1_epi32((a.add(16 + 4 * k) as *const i32).read_unaligned());
    if V == PAIRS {
        let mut s = _mm512_maddubs_epi16(wl[0], lo(0));
        s = _mm512_add_epi16(s, _mm512_maddubs_epi16(wh[0], hi(0)));
        for k in 1..4 {
            s = _mm512_add_epi16(s, _mm512_maddubs_epi16(wl[k], lo(k)));
            s = _mm512_add_epi16(s, _mm512_maddubs_epi16(wh[k], hi(k)));
        }
        return _mm512_madd_epi16(s, _mm512_set1_epi16(1));
    }
    let mut s = _mm512_setzero_si512();
    for k in 0..4 {
        s = _mm512_dpbusd_epi32(s, wl[k], lo(k));
        s = _mm512_dpbusd_epi32(s, wh[k], hi(k));
    }
    s
}
