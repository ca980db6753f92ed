//! int4 weights on the AVX2 integer path: codes 0..15 two a byte in the stored nibble order,
//! an fp16 scale and (asymmetric) a zero point per group; the zero point's share is
//! subtracted once per output. Pairs of blocks share one 32-byte load where [`super::paired`]
//! holds; otherwise one block at a time.

use super::{dot32, dot_add, hsum, pair_nibbles, QActs, PAIRS};
use half::f16;
use std::arch::x86_64::*;

/// Outputs `o0 .. o0 + O` for the `R` activation rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn outputs<const R: usize, const O: usize, const V: u8>(
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
    let groups = ic / group;
    let wrow: [*const u8; O] = std::array::from_fn(|j| codes.as_ptr().add((o0 + j) * ic / 2));
    let srow: [*const u16; O] =
        std::array::from_fn(|j| scales.as_ptr().add((o0 + j) * groups) as *const u16);
    let acc = match q.paired {
        true => pairs::<R, O, V>(q, wrow, srow, group, ic),
        false => blocks::<R, O, V>(q, wrow, srow, group, ic),
    };
    for j in 0..O {
        let o = o0 + j;
        let z = zeros.map(|z| &z[o * groups..(o + 1) * groups]);
        let shares = zero_shares::<R>(srow[j], z, &q.group_sums, groups);
        for r in 0..R {
            out[r * oc + o] = hsum(acc[j][r]) - shares[r];
        }
    }
}

/// The scaled sums of two blocks at a time: one 32-byte load holds both blocks' nibbles.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn pairs<const R: usize, const O: usize, const V: u8>(
    q: &QActs,
    wrow: [*const u8; O],
    srow: [*const u16; O],
    group: usize,
    ic: usize,
) -> [[__m256; R]; O] {
    let blocks = ic / 32;
    let acodes = q.codes.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    // Group 32: the pair's two scales, each over its four lanes.
    let spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    let pscales = q.pair_scales.as_ptr();
    for p in 0..blocks / 2 {
        let (lo, hi) = pair_nibbles(wrow, p, ic);
        let mut dw = [_mm256_setzero_ps(); O];
        for j in 0..O {
            dw[j] = if group == 32 {
                let two = (srow[j].add(2 * p) as *const i32).read_unaligned();
                let d = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(two)));
                _mm256_permutevar8x32_ps(d, spread)
            } else {
                let h = _mm_cvtsi32_si128(i32::from(*srow[j].add(p * 64 / group)));
                _mm256_broadcastss_ps(_mm_cvtph_ps(h))
            };
        }
        for r in 0..R {
            let a = acodes.add(r * ic + p * 64) as *const __m256i;
            let (a0, a1) = (_mm256_loadu_si256(a), _mm256_loadu_si256(a.add(1)));
            let da = _mm256_loadu_ps(pscales.add((r * blocks / 2 + p) * 8));
            for j in 0..O {
                // Lanes 0-3 sum block 2p, lanes 4-7 block 2p + 1 (each i16 of the pair sums
                // at most 2 · 2 · 15 · 127 = 7620: no saturation).
                let sum = if V == PAIRS {
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo[j], a0),
                        _mm256_maddubs_epi16(hi[j], a1),
                    );
                    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
                } else {
                    let sum = dot_add::<V>(_mm256_setzero_si256(), lo[j], a0);
                    dot_add::<V>(sum, hi[j], a1)
                };
                let d = _mm256_mul_ps(da, dw[j]);
                acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), d, acc[j][r]);
            }
        }
    }
    acc
}

/// The scaled sums one block at a time (rows of an odd number of blocks, groups of 96 …).
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn blocks<const R: usize, const O: usize, const V: u8>(
    q: &QActs,
    wrow: [*const u8; O],
    srow: [*const u16; O],
    group: usize,
    ic: usize,
) -> [[__m256; R]; O] {
    let (blocks, groups) = (ic / 32, ic / group);
    let (acodes, ascales) = (q.codes.as_ptr(), q.scales.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    let per_group = group / 32;
    let low = _mm_set1_epi8(0x0F);
    // Eight groups' scales at a time, widened by F16C.
    let mut dws = [[0.0f32; 8]; O];
    for g in 0..groups {
        if g % 8 == 0 {
            for j in 0..O {
                load_scales(&mut dws[j], srow[j].add(g), 8.min(groups - g));
            }
        }
        let dw: [__m256; O] = std::array::from_fn(|j| _mm256_set1_ps(dws[j][g % 8]));
        for s in g * per_group..(g + 1) * per_group {
            let wv: [__m256i; O] = std::array::from_fn(|j| {
                let v = _mm_loadu_si128(wrow[j].add(s * 16) as *const __m128i);
                let lo = _mm_and_si128(v, low);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), low);
                _mm256_set_m128i(hi, lo)
            });
            for r in 0..R {
                let a = _mm256_loadu_si256(acodes.add(r * ic + s * 32) as *const __m256i);
                let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
                for j in 0..O {
                    let d = _mm256_mul_ps(da, dw[j]);
                    acc[j][r] = _mm256_fmadd_ps(dot32::<V>(wv[j], a), d, acc[j][r]);
                }
            }
        }
    }
    acc
}

/// `n` (≤ 8) fp16 scales at `src` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_scales(dst: &mut [f32; 8], src: *const u16, n: usize) {
    if n == 8 {
        let h = _mm_loadu_si128(src as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_cvtph_ps(h));
    } else {
        for (i, d) in dst.iter_mut().enumerate().take(n) {
            *d = f16::from_bits(*src.add(i)).to_f32();
        }
    }
}

/// The zero point's share of one output for each of the `R` activation rows: Σ_g scale_g ·
/// zero_g · sums[r]_g, with `sums` holding `groups` sums a row. The weights' scale × zero is
/// widened once for all rows; each row's sum runs in the same order whatever `R`.
#[inline(always)]
unsafe fn zero_shares<const R: usize>(
    scales: *const u16,
    zeros: Option<&[u8]>,
    sums: &[f32],
    groups: usize,
) -> [f32; R] {
    assert!(sums.len() >= R * groups);
    let body = groups / 8 * 8;
    let mut share = [_mm256_setzero_ps(); R];
    for g in (0..body).step_by(8) {
        let d = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(g) as *const __m128i));
        let z = match zeros {
            Some(z) => _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                z.as_ptr().add(g) as *const __m128i
            ))),
            None => _mm256_set1_ps(8.0),
        };
        let dz = _mm256_mul_ps(d, z);
        for (r, share) in share.iter_mut().enumerate() {
            let s = _mm256_loadu_ps(sums.as_ptr().add(r * groups + g));
            *share = _mm256_fmadd_ps(dz, s, *share);
        }
    }
    std::array::from_fn(|r| {
        let mut total = hsum(share[r]);
        for g in body..groups {
            let z = zeros.map_or(8, |z| z[g]) as f32;
            total += f16::from_bits(*scales.add(g)).to_f32() * z * sums[r * groups + g];
        }
        total
    })
}
