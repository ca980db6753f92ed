//! nf4 weights in int4's tiles of eight output rows ([`crate::qmatmul::tiles`]): a tile block's
//! four 32-byte runs unpack as int4's, and `vpshufb` looks each code up in the 16 levels held as
//! signed bytes ([`super::lut4`]). That gives the block's weights in int8's tile order (run k's
//! low nibbles are each output's weights 4k .. 4k + 4, int8's run k; its high ones int8's run
//! k + 4), so the block multiplies as int8's tiles ([`super::tiled8`]): eight outputs a sum,
//! sixteen (two tiles) in 512 bits at the AVX-512 levels. Each block's integer sum is scaled by
//! the row's block scale times its group's scale times the table's unit, added in block order:
//! every path gives the same bits, whatever the activation rows beside them.

use super::tiled8::{ready, ready512, row_sum, row_sum512};
use super::{QActs, Weights, EVEX, PAIRS, VEX};
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of one tile's block: eight outputs' 16.
const BLOCK: usize = 128;

/// The tiles in `range` for the `R` activation rows; with `WIDE` two at a time in 512 bits (a
/// last odd one in 256), the sums by `V`.
#[inline(always)]
unsafe fn tiles<const R: usize, const V: u8, const WIDE: bool>(
    out: &mut [f32],
    q: &QActs,
    w: &Weights,
    ic: usize,
    oc: usize,
    range: Range<usize>,
) {
    let Weights::Nf4Tiled {
        codes,
        scales,
        table,
        unit,
        group,
    } = *w
    else {
        unreachable!("only nf4 tiles run here")
    };
    assert!(R <= super::ROWS && q.codes.len() >= R * ic && q.offsets.len() >= R * ic / 32);
    assert!(range.start.is_multiple_of(8) && range.end.is_multiple_of(8) && range.end <= oc);
    assert!(group.is_multiple_of(32) && group > 0 && ic.is_multiple_of(group));
    assert!(codes.len() == oc * ic / 2 && scales.len() == oc * ic / group);
    debug_assert!(!q.paired, "activations in their natural order");
    let lut = _mm_loadu_si128(table.as_ptr() as *const __m128i);
    let t = Tiles {
        codes: codes.as_ptr(),
        scales: scales.as_ptr(),
        group,
        ic,
        oc,
    };
    let mut o0 = range.start;
    let wide = WIDE && super::side_by_side(R);
    while wide && o0 + 16 <= range.end {
        pair::<R, V>(out, q, &t, lut, unit, o0);
        o0 += 16;
    }
    while o0 < range.end {
        tile::<R, V>(out, q, &t, lut, unit, o0);
        o0 += 8;
    }
}

// Eight outputs a sum (AVX2's `vpmaddubsw`, AVX-VNNI), or sixteen (AVX-512 VNNI, AVX-512 BW).
kernel_with!(tiles_nf4_avx2, avx2, tiles::<R, PAIRS, false>);
kernel_with!(tiles_nf4_vex, avxvnni, tiles::<R, VEX, false>);
kernel_with!(tiles_nf4_vnni, avx512vnni, tiles::<R, EVEX, true>);
kernel_with!(tiles_nf4_bw, avx512bw, tiles::<R, PAIRS, true>);

/// The tiled matrix: codes (a tile 8 rows of IC / 2 bytes) and scales (a tile's 8 a group).
struct Tiles {
    codes: *const u8,
    scales: *const f32,
    group: usize,
    ic: usize,
    oc: usize,
}

/// Tile `o0 / 8` (outputs `o0 .. o0 + 8`) for the `R` activation rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    t: &Tiles,
    lut: __m128i,
    unit: f32,
    o0: usize,
) {
    let (ic, group) = (t.ic, t.group);
    let (blocks, groups, per_group) = (ic / 32, ic / group, group / 32);
    let wt = t.codes.add(o0 * ic / 2);
    let st = t.scales.add(o0 * groups);
    let (acodes, ascales, offsets) = (q.codes.as_ptr(), q.scales.as_ptr(), q.offsets.as_ptr());
    let (lut, low, unit) = (
        _mm256_broadcastsi128_si256(lut),
        _mm256_set1_epi8(0x0F),
        _mm256_set1_ps(unit),
    );
    let ahead = super::Ahead::PAGE;
    let mut acc = [_mm256_setzero_ps(); R];
    for g in 0..groups {
        let dw = _mm256_mul_ps(_mm256_loadu_ps(st.add(g * 8)), unit);
        for s in g * per_group..(g + 1) * per_group {
            let w = wt.add(s * BLOCK);
            // The stream's lines ahead of their use ([`super::Ahead`]).
            ahead.lines(w, BLOCK / 64);
            let mut v = [_mm256_setzero_si256(); 8];
            for k in 0..4 {
                let n = _mm256_loadu_si256((w as *const __m256i).add(k));
                v[k] = _mm256_shuffle_epi8(lut, _mm256_and_si256(n, low));
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(n), low);
                v[k + 4] = _mm256_shuffle_epi8(lut, high);
            }
            let m = ready::<V>(&v);
            for r in 0..R {
                let a = acodes.add(r * ic + s * 32);
                let sum = row_sum::<V>(&m, &v, a, *offsets.add(r * blocks + s));
                let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(da, dw), acc[r]);
            }
        }
    }
    for r in 0..R {
        _mm256_storeu_ps(out.as_mut_ptr().add(r * t.oc + o0), acc[r]);
    }
}

/// Tiles `o0 / 8` and `o0 / 8 + 1` for the `R` activation rows, one 256-bit half each.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pair<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    t: &Tiles,
    lut: __m128i,
    unit: f32,
    o0: usize,
) {
    let (ic, group) = (t.ic, t.group);
    let (blocks, groups, per_group) = (ic / 32, ic / group, group / 32);
    let wa = t.codes.add(o0 * ic / 2);
    let wb = wa.add(4 * ic);
    let (sa, sb) = (t.scales.add(o0 * groups), t.scales.add((o0 + 8) * groups));
    let (acodes, ascales, offsets) = (q.codes.as_ptr(), q.scales.as_ptr(), q.offsets.as_ptr());
    let (lut, low, unit) = (
        _mm512_broadcast_i32x4(lut),
        _mm512_set1_epi8(0x0F),
        _mm512_set1_ps(unit),
    );
    let ahead = super::Ahead::PAGE;
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        // Tile a's eight scales, then tile b's (64-bit lanes: `vinsertf32x8` is AVX-512 DQ).
        let ta = _mm256_castps_pd(_mm256_loadu_ps(sa.add(g * 8)));
        let tb = _mm256_castps_pd(_mm256_loadu_ps(sb.add(g * 8)));
        let both = _mm512_insertf64x4::<1>(_mm512_castpd256_pd512(ta), tb);
        let dw = _mm512_mul_ps(_mm512_castpd_ps(both), unit);
        for s in g * per_group..(g + 1) * per_group {
            let (a, b) = (wa.add(s * BLOCK), wb.add(s * BLOCK));
            ahead.lines(a, BLOCK / 64);
            ahead.lines(b, BLOCK / 64);
            let mut v = [_mm512_setzero_si512(); 8];
            for k in 0..4 {
                let lo = _mm256_loadu_si256((a as *const __m256i).add(k));
                let hi = _mm256_loadu_si256((b as *const __m256i).add(k));
                let n = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                v[k] = _mm512_shuffle_epi8(lut, _mm512_and_si512(n, low));
                let high = _mm512_and_si512(_mm512_srli_epi16::<4>(n), low);
                v[k + 4] = _mm512_shuffle_epi8(lut, high);
            }
            let (m, neg) = ready512::<V>(&v);
            for r in 0..R {
                let x = acodes.add(r * ic + s * 32);
                let sum = row_sum512::<V>(&m, &neg, x, *offsets.add(r * blocks + s));
                let d = _mm512_mul_ps(_mm512_set1_ps(*ascales.add(r * blocks + s)), dw);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d, acc[r]);
            }
        }
    }
    for r in 0..R {
        _mm512_storeu_ps(out.as_mut_ptr().add(r * t.oc + o0), acc[r]);
    }
}
