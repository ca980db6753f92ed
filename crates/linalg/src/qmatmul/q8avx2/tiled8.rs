//! int8 weights in tiles of eight output rows ([`crate::qmatmul::tiles::tile_codes8`]): output
//! `o0 + c` in lane `c` of every sum, so one convert and one multiply-add per activation row and
//! block serve eight outputs (sixteen, two tiles a 512-bit vector, at the AVX-512 levels), where
//! the row kernel spends a convert and a multiply-add per output. A tile's block is eight 32-byte
//! runs, one 4-byte run of codes a lane; each run meets its four activations broadcast to every
//! lane.
//!
//! The integer sums are exact, whatever forms them:
//! - with VNNI (`vpdpbusd`: unsigned × signed bytes), each weight run is flipped to unsigned
//!   (w + 128) once, for all the activation rows, and each row's sum starts from −128 × the
//!   block's code sum (`QActs::offsets`), which the offset adds back;
//! - with `vpmaddubsw` (AVX2, AVX-512 BW), |w| times the activation with w's sign (`vpsignb`; a
//!   mask at 512 bits, which has no `vpsignb`), the pair sums widened by `vpmaddwd` at once (two
//!   products of at most 128 × 127 come to 32512, near 16 bits' limit).
//!
//! Then every path does the same float operations per lane: Σ_blocks sum · d_a added in block
//! order, times the row's scale at the end. So every path gives the same bits, whatever the
//! activation rows beside them.

use super::{dot_add, QActs, Weights, EVEX, PAIRS, VEX};
use half::f16;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of one tile's block: eight outputs' 32.
const BLOCK: usize = 256;

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
    let Weights::Int8Tiled { codes, scales } = *w else {
        unreachable!("only int8 tiles run here")
    };
    assert!(R <= super::ROWS && q.codes.len() >= R * ic && q.offsets.len() >= R * ic / 32);
    assert!(range.start.is_multiple_of(8) && range.end.is_multiple_of(8) && range.end <= oc);
    assert!(codes.len() == oc * ic && scales.len() == oc);
    debug_assert!(!q.paired, "activations in their natural order");
    let mut o0 = range.start;
    let wide = WIDE && super::side_by_side(R);
    while wide && o0 + 16 <= range.end {
        pair::<R, V>(out, q, codes, scales, ic, oc, o0);
        o0 += 16;
    }
    while o0 < range.end {
        tile::<R, V>(out, q, codes, scales, ic, oc, o0);
        o0 += 8;
    }
}

// Eight outputs a sum (AVX2's `vpmaddubsw`, AVX-VNNI), or sixteen (AVX-512 VNNI, AVX-512 BW).
kernel_with!(tiles8_avx2, avx2, tiles::<R, PAIRS, false>);
kernel_with!(tiles8_vex, avxvnni, tiles::<R, VEX, false>);
kernel_with!(tiles8_vnni, avx512vnni, tiles::<R, EVEX, true>);
kernel_with!(tiles8_bw, avx512bw, tiles::<R, PAIRS, true>);

/// Four activation codes at `a`, in every 32-bit lane.
#[inline(always)]
unsafe fn four(a: *const i8) -> i32 {
    (a as *const i32).read_unaligned()
}

/// Tile `o0 / 8` (outputs `o0 .. o0 + 8`) for the `R` activation rows.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    codes: &[i8],
    scales: &[f16],
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let blocks = ic / 32;
    let wt = codes.as_ptr().add(o0 * ic);
    let (acodes, ascales, offsets) = (q.codes.as_ptr(), q.scales.as_ptr(), q.offsets.as_ptr());
    let ahead = super::Ahead::PAGE;
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..blocks {
        let w = wt.add(s * BLOCK);
        // The stream's lines ahead of their use ([`super::Ahead`]).
        ahead.lines(w as *const u8, BLOCK / 64);
        let mut v = [_mm256_setzero_si256(); 8];
        for k in 0..8 {
            v[k] = _mm256_loadu_si256((w as *const __m256i).add(k));
        }
        let m = ready::<V>(&v);
        for r in 0..R {
            let a = acodes.add(r * ic + s * 32);
            let sum = row_sum::<V>(&m, &v, a, *offsets.add(r * blocks + s));
            let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), da, acc[r]);
        }
    }
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().add(o0) as *const __m128i));
    for r in 0..R {
        let o = out.as_mut_ptr().add(r * oc + o0);
        _mm256_storeu_ps(o, _mm256_mul_ps(acc[r], dw));
    }
}

/// A tile block's eight signed weight runs as [`row_sum`] multiplies them: |w| for
/// `vpmaddubsw`, w + 128 for `vpdpbusd`; once for all the activation rows.
#[inline(always)]
pub(super) unsafe fn ready<const V: u8>(v: &[__m256i; 8]) -> [__m256i; 8] {
    let flip = _mm256_set1_epi8(-128);
    let mut m = [_mm256_setzero_si256(); 8];
    for k in 0..8 {
        m[k] = match V {
            PAIRS => _mm256_sign_epi8(v[k], v[k]),
            _ => _mm256_xor_si256(v[k], flip),
        };
    }
    m
}

/// Lane c: output c's integer sum over a tile block, its weight runs `v` (signed, run k holding
/// each output's weights 4k .. 4k + 4) and `m` ([`ready`]) against one activation row's 32
/// codes at `a`. VNNI's sum starts from the row's block `offset` (−128 × its code sum).
#[inline(always)]
pub(super) unsafe fn row_sum<const V: u8>(
    m: &[__m256i; 8],
    v: &[__m256i; 8],
    a: *const i8,
    offset: i32,
) -> __m256i {
    let mut sum = match V {
        PAIRS => _mm256_setzero_si256(),
        _ => _mm256_set1_epi32(offset),
    };
    for k in 0..8 {
        let x = _mm256_set1_epi32(four(a.add(4 * k)));
        sum = match V {
            PAIRS => {
                let p = _mm256_maddubs_epi16(m[k], _mm256_sign_epi8(x, v[k]));
                _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
            }
            _ => dot_add::<V>(sum, m[k], x),
        };
    }
    sum
}

/// Tiles `o0 / 8` and `o0 / 8 + 1` for the `R` activation rows, one 256-bit half each.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pair<const R: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    codes: &[i8],
    scales: &[f16],
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let blocks = ic / 32;
    let wa = codes.as_ptr().add(o0 * ic);
    let wb = wa.add(8 * ic);
    let (acodes, ascales, offsets) = (q.codes.as_ptr(), q.scales.as_ptr(), q.offsets.as_ptr());
    let ahead = super::Ahead::PAGE;
    let mut acc = [_mm512_setzero_ps(); R];
    for s in 0..blocks {
        let (a, b) = (wa.add(s * BLOCK), wb.add(s * BLOCK));
        ahead.lines(a as *const u8, BLOCK / 64);
        ahead.lines(b as *const u8, BLOCK / 64);
        let mut v = [_mm512_setzero_si512(); 8];
        for k in 0..8 {
            let lo = _mm256_loadu_si256((a as *const __m256i).add(k));
            let hi = _mm256_loadu_si256((b as *const __m256i).add(k));
            v[k] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        }
        let (m, neg) = ready512::<V>(&v);
        for r in 0..R {
            let x = acodes.add(r * ic + s * 32);
            let sum = row_sum512::<V>(&m, &neg, x, *offsets.add(r * blocks + s));
            let da = _mm512_set1_ps(*ascales.add(r * blocks + s));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), da, acc[r]);
        }
    }
    let dw = _mm512_cvtph_ps(_mm256_loadu_si256(scales.as_ptr().add(o0) as *const __m256i));
    for r in 0..R {
        let o = out.as_mut_ptr().add(r * oc + o0);
        _mm512_storeu_ps(o, _mm512_mul_ps(acc[r], dw));
    }
}

/// [`ready`] for two tiles side by side in 512 bits: |w| and w's sign as a mask (AVX-512 has no
/// `vpsignb`), or w + 128.
#[inline(always)]
pub(super) unsafe fn ready512<const V: u8>(v: &[__m512i; 8]) -> ([__m512i; 8], [__mmask64; 8]) {
    let flip = _mm512_set1_epi8(-128);
    let (mut m, mut neg) = ([_mm512_setzero_si512(); 8], [0 as __mmask64; 8]);
    for k in 0..8 {
        (m[k], neg[k]) = match V {
            PAIRS => (_mm512_abs_epi8(v[k]), _mm512_movepi8_mask(v[k])),
            _ => (_mm512_xor_si512(v[k], flip), 0),
        };
    }
    (m, neg)
}

/// [`row_sum`] for two tiles side by side in 512 bits (lane c: output c of sixteen).
#[inline(always)]
pub(super) unsafe fn row_sum512<const V: u8>(
    m: &[__m512i; 8],
    neg: &[__mmask64; 8],
    a: *const i8,
    offset: i32,
) -> __m512i {
    let zero = _mm512_setzero_si512();
    let mut sum = match V {
        PAIRS => zero,
        _ => _mm512_set1_epi32(offset),
    };
    for k in 0..8 {
        let x = _mm512_set1_epi32(four(a.add(4 * k)));
        sum = match V {
            PAIRS => {
                let signed = _mm512_mask_sub_epi8(x, neg[k], zero, x);
                let p = _mm512_maddubs_epi16(m[k], signed);
                _mm512_add_epi32(sum, _mm512_madd_epi16(p, _mm512_set1_epi16(1)))
            }
            _ => _mm512_dpbusd_epi32(sum, m[k], x),
        };
    }
    sum
}
