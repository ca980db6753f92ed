//! The AVX-512 VNNI path for int4 weights (llama.cpp's approach): each activation row is
//! quantized once per call to int8 in sub-blocks of 32 (scale absmax/127, round to nearest
//! even), then `vpdpbusd` multiplies 64 unsigned 4-bit codes by 64 signed 8-bit activations and
//! sums them in groups of four into 16 int32 lanes per instruction: 128 weights in two
//! instructions, against 8 FMAs on the f32 path. Each 128-weight chunk's lanes are scaled by the
//! weight's group scale times the activation's sub-block scale; the zero point's share,
//! Σ_g scale_g · zero_g · Σ_{sub-blocks of g} d_a Σ q_a, is subtracted once per output row.
//!
//! The int8 activations live in a per-thread scratch that grows once to the largest row set
//! seen (8 rows × IC bytes and their scales), as faer's GEMM keeps its own workspace: kernel
//! internals, not tensors of the engine's plan. Requires IC to be a multiple of 128.

use super::ROWS;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

/// One call's activations in the kernel's order, chunk-major so a chunk's rows sit at fixed
/// offsets from one pointer: for each 128-value chunk and each row, 64 low-half bytes (values
/// 0..16 of each of 4 sub-blocks) then 64 high-half bytes (values 16..32), and the 16 lanes'
/// activation scales (lane k: sub-block k/4); per row and group the scaled sum of codes.
#[derive(Default)]
pub(super) struct QActs {
    pub codes: Vec<i8>,
    pub lane_scales: Vec<f32>,
    pub group_sums: Vec<f32>,
}

thread_local! {
    /// This thread's activation scratches: one per product running on it at once (a rayon
    /// task stolen while a product waits runs another), kept for reuse.
    static SCRATCH: RefCell<Vec<QActs>> = const { RefCell::new(Vec::new()) };
}

/// Quantizes `rows` rows of `a` (IC each) for groups of `group`.
pub(super) fn quantize(q: &mut QActs, a: &[f32], rows: usize, ic: usize, group: usize) {
    let chunks = ic / 128;
    q.codes.resize(rows * ic, 0);
    q.lane_scales.resize(rows * chunks * 16, 0.0);
    q.group_sums.resize(rows * (ic / group), 0.0);
    q.group_sums.fill(0.0);
    for r in 0..rows {
        let row = &a[r * ic..(r + 1) * ic];
        for s in 0..ic / 32 {
            let x = &row[s * 32..(s + 1) * 32];
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let (c, j) = (s / 4, s % 4);
            let base = (c * rows + r) * 128;
            let mut sum = 0i32;
            for (i, v) in x.iter().enumerate() {
                let code = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                sum += i32::from(code);
                let at = if i < 16 {
                    j * 16 + i
                } else {
                    64 + j * 16 + i - 16
                };
                q.codes[base + at] = code;
            }
            for k in 0..4 {
                q.lane_scales[(c * rows + r) * 16 + j * 4 + k] = d;
            }
            q.group_sums[r * (ic / group) + s * 32 / group] += d * sum as f32;
        }
    }
}

/// The activations as the kernel sees them (x̂ = d_a · q), for the tests' exact comparison.
pub(super) fn dequantized(a: &[f32], rows: usize, ic: usize) -> Vec<f32> {
    let mut q = QActs::default();
    quantize(&mut q, a, rows, ic, 128);
    let mut out = vec![0.0f32; rows * ic];
    for r in 0..rows {
        for s in 0..ic / 32 {
            let (c, j) = (s / 4, s % 4);
            let d = q.lane_scales[(c * rows + r) * 16 + j * 4];
            for i in 0..32 {
                let at = if i < 16 {
                    j * 16 + i
                } else {
                    64 + j * 16 + i - 16
                };
                out[r * ic + s * 32 + i] = d * f32::from(q.codes[(c * rows + r) * 128 + at]);
            }
        }
    }
    out
}

/// Runs `f` with one of this thread's activation scratches: a product nested inside another
/// on this thread (a rayon task stolen while waiting) takes the next, so once the threads have
/// run as deep as they nest no product allocates.
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut QActs) -> R) -> R {
    let mut q = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    let out = f(&mut q);
    SCRATCH.with(|s| s.borrow_mut().push(q));
    out
}

/// # Safety
/// The CPU must have AVX-512 F, BW and VNNI; `q` holds `rows` quantized rows of IC (a multiple
/// of 128); codes, scales and zeros hold the (OC, IC) int4 matrix.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
pub(super) unsafe fn rows(
    out: &mut [f32],
    q: &QActs,
    codes: &[u8],
    scales: &[half::f16],
    zeros: Option<&[u8]>,
    group: usize,
    rows: usize,
    ic: usize,
    oc: usize,
    range: Range<usize>,
) {
    let w = Int4 {
        codes,
        scales,
        zeros,
        group,
    };
    by_rows!(rows, rows_n(out, q, &w, ic, oc, range))
}

struct Int4<'a> {
    codes: &'a [u8],
    scales: &'a [half::f16],
    zeros: Option<&'a [u8]>,
    group: usize,
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
unsafe fn rows_n<const R: usize>(
    out: &mut [f32],
    q: &QActs,
    w: &Int4,
    ic: usize,
    oc: usize,
    range: Range<usize>,
) {
    assert!(R <= ROWS);
    // From 4 activation rows on, two output rows at a time: each activation vector loaded
    // serves both (at 8 rows the activations outgrow L1, and their reloads, not the arithmetic,
    // set the pace). Fewer rows stream one weight row at a time, which the prefetcher prefers.
    let mut o = range.start;
    while R >= 4 && o + 2 <= range.end {
        outputs::<R, 2>(out, q, w, ic, oc, o);
        o += 2;
    }
    while o < range.end {
        outputs::<R, 1>(out, q, w, ic, oc, o);
        o += 1;
    }
}

/// Output rows `o0 .. o0 + O` for the `R` activation rows. Each output's sum runs in the same
/// order whatever `O` and `R`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn outputs<const R: usize, const O: usize>(
    out: &mut [f32],
    q: &QActs,
    w: &Int4,
    ic: usize,
    oc: usize,
    o0: usize,
) {
    let (codes, scales, zeros, group) = (w.codes, w.scales, w.zeros, w.group);
    let chunks = ic / 128;
    let groups = ic / group;
    let mask = _mm512_set1_epi8(0x0F);
    // Lane k of a chunk belongs to sub-block k/4; its group's index within the chunk's scales.
    let idx = match group {
        32 => _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        64 => _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _ => _mm512_setzero_si512(),
    };
    let per_chunk = 128 / group.min(128);
    let mut acc = [[_mm512_setzero_ps(); R]; O];
    let wrow: [*const u8; O] = std::array::from_fn(|j| codes.as_ptr().add((o0 + j) * ic / 2));
    let srow: [*const u16; O] =
        std::array::from_fn(|j| scales.as_ptr().add((o0 + j) * groups) as *const u16);
    for c in 0..chunks {
        let mut lo = [_mm512_setzero_si512(); O];
        let mut hi = [_mm512_setzero_si512(); O];
        let mut wd = [_mm512_setzero_ps(); O];
        for j in 0..O {
            // The same chunk of the next pass's rows (the rows this task reads next).
            let ahead = wrow[j].wrapping_add(c * 64 + O * ic / 2);
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            let v = _mm512_loadu_si512(wrow[j].add(c * 64) as *const __m512i);
            lo[j] = _mm512_and_si512(v, mask);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            wd[j] = if group >= 128 {
                let g = c * 128 / group;
                let h = _mm_cvtsi32_si128(i32::from(*srow[j].add(g)));
                _mm512_broadcastss_ps(_mm_cvtph_ps(h))
            } else {
                let sp = srow[j].add(c * per_chunk);
                let h = if per_chunk == 4 {
                    _mm_loadl_epi64(sp as *const __m128i)
                } else {
                    _mm_cvtsi32_si128((sp as *const i32).read_unaligned())
                };
                _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)))
            };
        }
        for r in 0..R {
            let a = q.codes.as_ptr().add((c * R + r) * 128) as *const __m512i;
            let (a_lo, a_hi) = (_mm512_loadu_si512(a), _mm512_loadu_si512(a.add(1)));
            let da = _mm512_loadu_ps(q.lane_scales.as_ptr().add((c * R + r) * 16));
            for j in 0..O {
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], a_lo);
                let p = _mm512_dpbusd_epi32(p, hi[j], a_hi);
                acc[j][r] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(da, wd[j]), acc[j][r]);
            }
        }
    }
    for j in 0..O {
        let o = o0 + j;
        for (r, acc) in acc[j].iter().enumerate() {
            let sums = q.group_sums.as_ptr().add(r * groups);
            let mut share = _mm512_setzero_ps();
            let body = groups / 16 * 16;
            for g in (0..body).step_by(16) {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(srow[j].add(g) as *const __m256i));
                let z = match zeros {
                    Some(z) => _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                        z.as_ptr().add(o * groups + g) as *const __m128i,
                    ))),
                    None => _mm512_set1_ps(8.0),
                };
                share = _mm512_fmadd_ps(_mm512_mul_ps(d, z), _mm512_loadu_ps(sums.add(g)), share);
            }
            let mut zero_share = _mm512_reduce_add_ps(share);
            for g in body..groups {
                let z = zeros.map_or(8, |z| z[o * groups + g]) as f32;
                zero_share += half::f16::from_bits(*srow[j].add(g)).to_f32() * z * *sums.add(g);
            }
            out[r * oc + o] = _mm512_reduce_add_ps(*acc) - zero_share;
        }
    }
}
