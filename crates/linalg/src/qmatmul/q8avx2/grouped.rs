//! Grouped weights on the AVX2 integer path: ggml's blocks repacked (int8 codes, or 4-bit ones
//! two per byte), a scale per group of 32 (or 16) and each group's minimum times the
//! activations' sum over the group; and nf4, 4-bit codes looked up in a table of signed bytes,
//! a scale per group of 32 or more and no minima.

use super::{dot32, hsum, prefetch_next, Codes, QActs, FAR};
use std::arch::x86_64::*;

/// One call's stored weights: the codes at `base`, their table of signed bytes and its unit
/// (nf4; unused otherwise), and a scale per group of `group`.
#[derive(Clone, Copy)]
pub(super) struct Stored<'a> {
    pub base: *const u8,
    pub table: [i8; 16],
    pub unit: f32,
    pub scales: &'a [f32],
    pub group: usize,
}

/// Grouped int8 and nf4: each block's sum scaled by its activation scale and its group's weight
/// scale (per half block for groups of 16); the minima's share added at the end. nf4 runs two
/// blocks a load where the activations are paired (`super::nf4`), else one block at a time.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn outputs<const R: usize, const O: usize, const V: u8>(
    out: &mut [f32],
    q: &QActs,
    codes: Codes,
    scales: &[f32],
    mins: Option<&[f32]>,
    group: usize,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let (plain, unit) = ([0; 16], 1.0);
    let at = |base, (table, unit)| Stored {
        base,
        table,
        unit,
        scales,
        group,
    };
    let acc = match codes {
        Codes::I8(c) => {
            sums::<R, O, BYTES, V>(q, at(c.as_ptr() as *const u8, (plain, unit)), ic, o0)
        }
        Codes::U4(c) => sums::<R, O, NIBBLES, V>(q, at(c.as_ptr(), (plain, unit)), ic, o0),
        Codes::Lut4 { codes, table, unit } if q.paired => {
            super::nf4::pairs::<R, O, V>(q, at(codes.as_ptr(), (table, unit)), ic, o0)
        }
        Codes::Lut4 { codes, table, unit } => {
            sums::<R, O, TABLE, V>(q, at(codes.as_ptr(), (table, unit)), ic, o0)
        }
    };
    let groups = ic / group;
    for j in 0..O {
        let o = o0 + j;
        for r in 0..R {
            let mut total = hsum(acc[j][r]);
            if let Some(m) = mins {
                let sums = &q.group_sums[r * groups..(r + 1) * groups];
                total += min_share(&m[o * groups..(o + 1) * groups], sums, group == 32);
            }
            out[r * oc + o] = total;
        }
    }
}

/// Codes one signed byte each.
const BYTES: u8 = 0;
/// Codes 0..15 two a byte, multiplied as unsigned values.
const NIBBLES: u8 = 1;
/// Codes 0..15 two a byte, each a table's signed byte.
const TABLE: u8 = 2;

/// The scaled block sums of outputs `o0 .. o0 + O` for the `R` activation rows, over codes at
/// `base` laid out as `CODES` says; with `TABLE`, each code looked up in `table` and each
/// group's scale times `unit`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn sums<const R: usize, const O: usize, const CODES: u8, const V: u8>(
    q: &QActs,
    w: Stored,
    ic: usize,
    o0: usize,
) -> [[__m256; R]; O] {
    let (base, table, unit, scales, group) = (w.base, w.table, w.unit, w.scales, w.group);
    let (nibbles, signed) = (CODES != BYTES, CODES != NIBBLES);
    let blocks = ic / 32;
    let groups = ic / group;
    // Blocks of 32 a group (groups of 32 or more; 16 is two groups a block).
    let per_group = (group / 32).max(1);
    let (acodes, ascales) = (q.codes.as_ptr(), q.scales.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); R]; O];
    let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
    let row_bytes = if nibbles { ic / 2 } else { ic };
    let wrow: [*const u8; O] = std::array::from_fn(|j| base.add((o0 + j) * row_bytes));
    let srow: [*const f32; O] = std::array::from_fn(|j| scales.as_ptr().add((o0 + j) * groups));
    let low = _mm_set1_epi8(0x0F);
    // Long rows: the next pass's rows asked for a line at a time (see `prefetch_next`).
    let (block_bytes, far) = (row_bytes / blocks, row_bytes >= FAR);
    for s in 0..blocks {
        if far && (s * block_bytes).is_multiple_of(64) {
            for row in wrow {
                prefetch_next(row, s * block_bytes, O * row_bytes);
            }
        }
        // Each weight's magnitude (unsigned), and the codes whose signs the activations take.
        let wv: [__m256i; O] = std::array::from_fn(|j| {
            if nibbles {
                let v = _mm_loadu_si128(wrow[j].add(s * 16) as *const __m128i);
                let lo = _mm_and_si128(v, low);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), low);
                _mm256_set_m128i(hi, lo)
            } else {
                _mm256_loadu_si256(wrow[j].add(s * 32) as *const __m256i)
            }
        });
        let wv: [__m256i; O] = match CODES {
            TABLE => std::array::from_fn(|j| _mm256_shuffle_epi8(lut, wv[j])),
            _ => wv,
        };
        let wabs: [__m256i; O] = std::array::from_fn(|j| match signed {
            false => wv[j],
            true => _mm256_sign_epi8(wv[j], wv[j]),
        });
        let dw: [__m256; O] = std::array::from_fn(|j| {
            if group == 16 {
                let (lo, hi) = (*srow[j].add(2 * s), *srow[j].add(2 * s + 1));
                _mm256_setr_ps(lo, lo, lo, lo, hi, hi, hi, hi)
            } else if CODES == TABLE {
                _mm256_set1_ps(*srow[j].add(s / per_group) * unit)
            } else {
                _mm256_set1_ps(*srow[j].add(s / per_group))
            }
        });
        for r in 0..R {
            let a = _mm256_loadu_si256(acodes.add(r * ic + s * 32) as *const __m256i);
            let da = _mm256_broadcast_ss(&*ascales.add(r * blocks + s));
            for j in 0..O {
                let a = match signed {
                    false => a,
                    true => _mm256_sign_epi8(a, wv[j]),
                };
                let p = dot32::<V>(wabs[j], a);
                acc[j][r] = _mm256_fmadd_ps(p, _mm256_mul_ps(da, dw[j]), acc[j][r]);
            }
        }
    }
    acc
}

/// Σ_g min_g · sums_g: for ggml's blocks of 32 (`ggml`) one fused multiply-add a block in
/// order, as ggml's Q4_1 and Q5_1 dot products accumulate it; otherwise eight lanes at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn min_share(mins: &[f32], sums: &[f32], ggml: bool) -> f32 {
    if ggml {
        return mins
            .iter()
            .zip(sums)
            .fold(0.0, |acc, (m, s)| m.mul_add(*s, acc));
    }
    let body = mins.len() / 8 * 8;
    let mut share = _mm256_setzero_ps();
    for g in (0..body).step_by(8) {
        let m = _mm256_loadu_ps(mins.as_ptr().add(g));
        share = _mm256_fmadd_ps(m, _mm256_loadu_ps(sums.as_ptr().add(g)), share);
    }
    let mut total = hsum(share);
    for g in body..mins.len() {
        total += mins[g] * sums[g];
    }
    total
}
