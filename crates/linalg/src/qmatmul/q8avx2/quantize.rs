//! Activations as the integer kernels multiply them: int8 in blocks of 32, per block a scale and
//! code sum, per weight group the scaled code sum ([`QActs`]).

use super::{hsum_i32, QActs};
use half::f16;
use std::arch::x86_64::*;

/// Quantizes `rows` rows of `a` (IC each, a multiple of 32) for weight groups of `group` (a
/// multiple of 32 dividing IC; IC itself for one scale per row), in pairs of blocks when `pair`
/// (int4 and nf4 weights, where [`paired`] holds). With `ggml` the blocks are ggml's `block_q8_1`,
/// as its `quantize_row_q8_1` writes them for the dot products of its Q4_0 … Q8_0 blocks: the
/// multiplier 127 / absmax, codes rounded to nearest even, and the scale and the scaled code sum
/// rounded to fp16 — so a product over weights in ggml's blocks of 32 sees the activations
/// llama.cpp's sees. Otherwise the scale stays f32.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::qmatmul) unsafe fn quantize(
    q: &mut QActs,
    a: &[f32],
    rows: usize,
    ic: usize,
    group: usize,
    pair: bool,
    ggml: bool,
) {
    assert!(
        !ggml || group == 32,
        "ggml's activation blocks serve groups of 32"
    );
    assert!(ic.is_multiple_of(32) && (group == 16 || group.is_multiple_of(32)));
    assert!(ic.is_multiple_of(group));
    let blocks = ic / 32;
    q.paired = pair && paired(ic, group);
    if q.paired {
        q.pair_scales.resize(rows * blocks * 4, 0.0);
    }
    q.codes.resize(rows * ic, 0);
    q.scales.resize(rows * blocks, 0.0);
    q.offsets.resize(rows * blocks, 0);
    q.group_sums.resize(rows * (ic / group), 0.0);
    q.group_sums.fill(0.0);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for r in 0..rows {
        for s in 0..blocks {
            let p = a.as_ptr().add(r * ic + s * 32);
            let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(x[0], abs), _mm256_and_ps(x[1], abs)),
                _mm256_max_ps(_mm256_and_ps(x[2], abs), _mm256_and_ps(x[3], abs)),
            );
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            let d = amax / 127.0;
            let inv = match ggml {
                true if amax != 0.0 => 127.0 / amax,
                false if d > 0.0 => 1.0 / d,
                _ => 0.0,
            };
            // A block below 3.7e-37 has no finite 1 / scale: it counts as zeros, next to nothing
            // a sum of normal values holds.
            let (d, inv) = if inv.is_finite() {
                (d, inv)
            } else {
                (0.0, 0.0)
            };
            let inv = _mm256_set1_ps(inv);
            // cvtps rounds to nearest even (the default MXCSR mode), as `round_ties_even`. The
            // codes of finite activations lie in ±127 already; the clamp keeps those of an
            // activation that is not finite there too (cvtps gives i32::MIN).
            let (top, bottom) = (_mm256_set1_epi32(127), _mm256_set1_epi32(-127));
            let v: [__m256i; 4] = std::array::from_fn(|i| {
                let c = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], inv));
                _mm256_max_epi32(_mm256_min_epi32(c, top), bottom)
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            let lo = _mm256_packs_epi32(v[0], v[1]);
            let hi = _mm256_packs_epi32(v[2], v[3]);
            let bytes = _mm256_packs_epi16(lo, hi);
            // The packs work within 128-bit lanes: put the eight 4-byte runs back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            _mm256_storeu_si256(
                q.codes.as_mut_ptr().add(r * ic + s * 32) as *mut __m256i,
                bytes,
            );
            if q.paired && s % 2 == 1 {
                // [x.lo, y.lo] and [x.hi, y.hi] for blocks x = s - 1 and y = s.
                let at = q.codes.as_mut_ptr().add(r * ic + (s - 1) * 32) as *mut __m256i;
                let x = _mm256_loadu_si256(at);
                _mm256_storeu_si256(at, _mm256_permute2x128_si256::<0x20>(x, bytes));
                _mm256_storeu_si256(at.add(1), _mm256_permute2x128_si256::<0x31>(x, bytes));
                let d0 = q.scales[r * blocks + s - 1];
                let ps = &mut q.pair_scales[(r * blocks + s - 1) * 4..][..8];
                ps[..4].fill(d0);
                ps[4..].fill(d);
            }
            let total = hsum_i32(sum);
            q.offsets[r * blocks + s] = -128 * total;
            if ggml {
                // ggml keeps the block's scale, and its code sum times the scale, as fp16.
                let fp16 = |x: f32| f16::from_f32(x).to_f32();
                q.scales[r * blocks + s] = fp16(d);
                q.group_sums[r * blocks + s] = fp16(d * total as f32);
                continue;
            }
            q.scales[r * blocks + s] = d;
            if group == 16 {
                let sums = &mut q.group_sums[r * (ic / 16) + 2 * s..][..2];
                sums[0] = d * hsum_i32(_mm256_add_epi32(v[0], v[1])) as f32;
                sums[1] = d * hsum_i32(_mm256_add_epi32(v[2], v[3])) as f32;
            } else {
                q.group_sums[r * (ic / group) + s * 32 / group] += d * total as f32;
            }
        }
    }
}

/// Whether int4 and nf4 products run on pairs of blocks: IC whole pairs, and each pair within
/// one group or (groups of 32) one group a block.
pub(in crate::qmatmul) fn paired(ic: usize, group: usize) -> bool {
    ic.is_multiple_of(64) && (group == 32 || group.is_multiple_of(64))
}

/// The activations as the kernel sees them (x̂ = d_a · q), for the tests' exact comparison.
pub(in crate::qmatmul) fn dequantized(a: &[f32], rows: usize, ic: usize) -> Vec<f32> {
    let mut q = QActs::default();
    // SAFETY: only called where the AVX2 path runs (the tests check the CPU first).
    unsafe { quantize(&mut q, a, rows, ic, ic, false, false) };
    q.codes
        .iter()
        .enumerate()
        .map(|(i, &c)| q.scales[i / 32] * f32::from(c))
        .collect()
}
