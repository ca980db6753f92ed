//! nf4 on the AVX2 integer path two blocks at a time, as int4's pairs: one 32-byte load holds
//! both blocks' codes (low nibbles: each block's weights 0..16, high: 16..32), `vpshufb` looks
//! each code up in the table of signed bytes ([`super::lut4`]), the weights' signs move onto the
//! activations, and the two halves' four-product sums add in int32 (a signed pair sum can reach
//! 2 · 127 · 127, so two are never added in int16). Lanes 0-3 hold block 2p, lanes 4-7 block
//! 2p + 1, scaled by their own activation scales; rows of one block at a time take
//! `grouped::sums`.

use super::grouped::Stored;
use super::{dot_add, pair_nibbles, QActs};
use std::arch::x86_64::*;

/// The scaled sums of outputs `o0 .. o0 + O` for the `R` activation rows (quantized in pairs),
/// over 4-bit codes at `base`, each group's scale times `unit`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn pairs<const R: usize, const O: usize, const V: u8>(
    q: &QActs,
    w: Stored,
    ic: usize,
    o0: usize,
) -> [[__m256; R]; O] {
    let (base, table, unit, scales, group) = (w.base, w.table, w.unit, w.scales, w.group);
    debug_assert!(q.paired);
    let (blocks, groups) = (ic / 32, ic / group);
    let acodes = q.codes.as_ptr();
    let pscales = q.pair_scales.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    let wrow: [*const u8; O] = std::array::from_fn(|j| base.add((o0 + j) * ic / 2));
    let srow: [*const f32; O] = std::array::from_fn(|j| scales.as_ptr().add((o0 + j) * groups));
    for p in 0..blocks / 2 {
        let (codes_lo, codes_hi) = pair_nibbles(wrow, p, ic);
        let lo: [__m256i; O] = std::array::from_fn(|j| _mm256_shuffle_epi8(lut, codes_lo[j]));
        let hi: [__m256i; O] = std::array::from_fn(|j| _mm256_shuffle_epi8(lut, codes_hi[j]));
        let mut dw = [_mm256_setzero_ps(); O];
        for j in 0..O {
            dw[j] = if group == 32 {
                let (a, b) = (*srow[j].add(2 * p) * unit, *srow[j].add(2 * p + 1) * unit);
                _mm256_setr_ps(a, a, a, a, b, b, b, b)
            } else {
                _mm256_set1_ps(*srow[j].add(p * 64 / group) * unit)
            };
        }
        let lo_abs: [__m256i; O] = std::array::from_fn(|j| _mm256_sign_epi8(lo[j], lo[j]));
        let hi_abs: [__m256i; O] = std::array::from_fn(|j| _mm256_sign_epi8(hi[j], hi[j]));
        for r in 0..R {
            let a = acodes.add(r * ic + p * 64) as *const __m256i;
            let (a0, a1) = (_mm256_loadu_si256(a), _mm256_loadu_si256(a.add(1)));
            let da = _mm256_loadu_ps(pscales.add((r * blocks / 2 + p) * 8));
            for j in 0..O {
                let first = _mm256_sign_epi8(a0, lo[j]);
                let second = _mm256_sign_epi8(a1, hi[j]);
                let sum = dot_add::<V>(_mm256_setzero_si256(), lo_abs[j], first);
                let sum = dot_add::<V>(sum, hi_abs[j], second);
                let d = _mm256_mul_ps(da, dw[j]);
                acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, acc[j][r]);
            }
        }
    }
    acc
}
