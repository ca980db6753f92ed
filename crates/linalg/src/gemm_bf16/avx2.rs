//! The widening paths of both bf16 GEMMs, for CPUs without AVX-512 BF16: bf16 is widened to
//! f32 (a 16-bit shift) while packing, and an f32 FMA micro-kernel does the arithmetic, as a
//! BLIS-style sgemm does. With AVX2 + FMA (Haswell to Alder Lake, Zen 1-3) it is 6 rows × 16
//! columns (12 accumulators, 2 panel loads and 6 broadcasts per 12 FMAs); with AVX-512F
//! (Skylake-SP to Ice Lake and Sapphire Rapids capped below BF16) 12 rows × 32 columns in 512
//! bits ([`zmm`]: 24 accumulators, two panels side by side). Both layouts of `b` pack into the
//! same panels: (N, K) by 8 × 8 transposes in registers, (K, N) by plain widening.
//!
//! `b` is packed 256 columns at a time (16-column panels, K-major, over all of K), in parallel,
//! and shared by a grid of (120 rows × 128 columns) tasks over rayon. Each task sweeps K in
//! 256-deep blocks: it widens its rows of `a` (row-major, read by broadcasts), then accumulates
//! into an f32 tile of its outputs, which is added or written to `out` once at the end — rounded
//! once to bf16 for a bf16 output, as the other paths do. Each element's K sum runs in one order
//! (K blocks in turn, each in K order, one FMA a step) whatever the split and whichever width:
//! both kernels give the same bits. A task's two buffers (180 KiB) are a per-thread scratch
//! allocated once.
//!
//! Rows past M read zeros and columns past N are zero in the panel; neither is written out.

use super::nn::{Block, Layout, Out, OutPtr};
use super::{bf16, widen, Dims, Isa};
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows of the AVX2 micro-kernel ([`zmm::MR`] for the 512-bit one).
const MR: usize = 6;
/// Columns of a packed panel of `b`.
const NR: usize = 16;
/// Rows and columns of out per task, and K per block.
const MB: usize = 120;
const NB: usize = 128;
const KC: usize = 256;
// A task's rows are whole panels of either kernel: the scratch holds their zero rows.
const _: () = assert!(MB.is_multiple_of(MR) && MB.is_multiple_of(zmm::MR));

/// A task's widened rows of `a` (MB × KC) and output tile (MB × NB), both f32.
struct Scratch {
    a: Vec<f32>,
    c: Vec<f32>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            a: vec![0.0; MB * KC],
            c: vec![0.0; MB * NB],
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// Gives this thread its task scratch now (see [`crate::warm_threads`]).
pub(super) fn warm_thread() {
    SCRATCH.with(|cell| {
        if let Ok(mut s) = cell.try_borrow_mut() {
            s.get_or_insert_with(Scratch::new);
        }
    });
}

/// Columns of `b` packed at a time, once per call, and shared by every task over them: the
/// packed copy is at most 256 × K f32 (768 KiB at K = 768).
const NC: usize = 256;

thread_local! {
    /// The calling thread's packed panels of `b`, grown once to the largest 256 × K.
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// out (M,N) (+)= a (M,K) · b, `b` in `layout`, by the 512-bit kernel for [`Isa::Avx512`], else
/// the AVX2 one.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and AVX-512F for [`Isa::Avx512`].
pub(super) unsafe fn gemm(
    out: Out<'_>,
    a: &[bf16],
    b: &[bf16],
    dims: Dims,
    mode: (bool, Layout),
    isa: Isa,
) {
    let (add, layout) = mode;
    let (m, n, k) = dims;
    let out = OutPtr::of(out, m * n);
    let call = Call {
        a,
        m,
        n,
        k,
        add,
        out,
        layout,
        wide: isa == Isa::Avx512,
    };
    // Both layouts pack once per block of 256 columns, shared by the row tasks: (N, K) by
    // transposes, (K, N) by plain widening.
    PACKED.with(|cell| {
        let mut buf = cell.borrow_mut();
        let most = NC.min(n).div_ceil(NR) * NR * k;
        if buf.len() < most {
            buf.resize(most, 0.0);
        }
        for c0 in (0..n).step_by(NC) {
            let cols = NC.min(n - c0);
            let packed = &mut buf[..cols.div_ceil(NR) * NR * k];
            packed
                .par_chunks_mut(NR * k)
                .enumerate()
                .for_each(|(q, panel)| {
                    let first = c0 + q * NR;
                    let width = NR.min(n - first);
                    // SAFETY: the caller checked the CPU; the panel holds K × 16 f32.
                    unsafe {
                        match layout {
                            Layout::Nt => pack_b_nt(panel, b, k, first, width),
                            Layout::Nn => pack_b_nn(panel, b, (n, k), first, width),
                        }
                    }
                });
            run_tasks(call, packed, c0, cols);
        }
    });
}

/// One GEMM's operands and shape.
#[derive(Clone, Copy)]
struct Call<'a> {
    a: &'a [bf16],
    m: usize,
    n: usize,
    k: usize,
    add: bool,
    out: OutPtr,
    layout: Layout,
    wide: bool,
}

/// The (120 rows × 128 columns) tasks over columns `c0..c0 + cols` of out; `packed`: those
/// columns' panels of `b` over all of K.
fn run_tasks(c: Call<'_>, packed: &[f32], c0: usize, cols: usize) {
    let blocks_n = cols.div_ceil(NB);
    (0..c.m.div_ceil(MB) * blocks_n)
        .into_par_iter()
        .for_each(|task| {
            let dims = (c.m, c.n, c.k);
            let t = Block::of(task, (MB, NB), (c0, cols), dims, (c.add, c.layout), c.out);
            // This task's panels within the shared block.
            let packed = &packed[(t.j0 - c0) * c.k..];
            SCRATCH.with(|cell| {
                let mut cell = cell.borrow_mut();
                let s = cell.get_or_insert_with(Scratch::new);
                // SAFETY: the caller checked the CPU; the tasks' blocks of out are disjoint and
                // inside its M·N elements.
                unsafe {
                    match c.wide {
                        true => zmm::task_run(s, c.a, packed, t),
                        false => task_run(s, c.a, packed, t),
                    }
                };
            });
        });
}

/// One task: rows and columns of out.
type Task = Block;

#[target_feature(enable = "avx2,fma")]
unsafe fn task_run(s: &mut Scratch, a: &[bf16], packed: &[f32], t: Task) {
    let (row_panels, col_panels) = (t.rows.div_ceil(MR), t.cols.div_ceil(NR));
    for k0 in (0..t.k).step_by(KC) {
        let kc = KC.min(t.k - k0);
        pack_a(&mut s.a, a, t, (k0, kc), MR);
        for q in 0..col_panels {
            // The panel spans all of K (16 f32 a step).
            let bp = packed.as_ptr().add(q * t.k * NR + k0 * NR);
            for p in 0..row_panels {
                let ap = s.a.as_ptr().add(p * MR * kc);
                let cp = s.c.as_mut_ptr().add(p * MR * NB + q * NR);
                kernel_6x16(kc, ap, bp, cp, k0 == 0);
            }
        }
    }
    write_out(&s.c, t);
}

/// c (6, 16; row stride NB) (+)= a panel (6 rows of kc, row-major) · b panel (kc × 16).
#[inline(always)]
unsafe fn kernel_6x16(kc: usize, ap: *const f32, bp: *const f32, cp: *mut f32, first: bool) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            acc_r[0] = _mm256_loadu_ps(cp.add(r * NB));
            acc_r[1] = _mm256_loadu_ps(cp.add(r * NB + 8));
        }
    }
    for kk in 0..kc {
        let b0 = _mm256_loadu_ps(bp.add(kk * NR));
        let b1 = _mm256_loadu_ps(bp.add(kk * NR + 8));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm256_broadcast_ss(&*ap.add(r * kc + kk));
            acc_r[0] = _mm256_fmadd_ps(x, b0, acc_r[0]);
            acc_r[1] = _mm256_fmadd_ps(x, b1, acc_r[1]);
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        _mm256_storeu_ps(cp.add(r * NB), acc_r[0]);
        _mm256_storeu_ps(cp.add(r * NB + 8), acc_r[1]);
    }
}

mod zmm;

/// 8 bf16 at `p` widened to 8 f32.
#[inline(always)]
unsafe fn widen8(p: *const bf16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// The task's rows of `a`, K `k0..k0 + kc`, widened into `dst` row-major (row stride kc);
/// rows up to a whole panel of `mr` past the task's last are zeros.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a(dst: &mut [f32], a: &[bf16], t: Task, (k0, kc): (usize, usize), mr: usize) {
    let body = kc / 8 * 8;
    for r in 0..t.rows.div_ceil(mr) * mr {
        let row = &mut dst[r * kc..(r + 1) * kc];
        if r >= t.rows {
            row.fill(0.0);
            continue;
        }
        let src = &a[(t.i0 + r) * t.k + k0..][..kc];
        for kk in (0..body).step_by(8) {
            _mm256_storeu_ps(row.as_mut_ptr().add(kk), widen8(src.as_ptr().add(kk)));
        }
        for kk in body..kc {
            row[kk] = widen(src[kk]);
        }
    }
}

/// `b` (K, N): the panel of columns `first..first + width` (≤ 16), K-major (16 f32 per K),
/// zeros past N.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_nn(
    dst: &mut [f32],
    b: &[bf16],
    (n, k): (usize, usize),
    first: usize,
    width: usize,
) {
    for kk in 0..k {
        let src = &b[kk * n + first..][..width];
        let d = &mut dst[kk * NR..(kk + 1) * NR];
        if width == NR {
            _mm256_storeu_ps(d.as_mut_ptr(), widen8(src.as_ptr()));
            _mm256_storeu_ps(d.as_mut_ptr().add(8), widen8(src.as_ptr().add(8)));
        } else {
            for (l, x) in d.iter_mut().enumerate() {
                *x = if l < width { widen(src[l]) } else { 0.0 };
            }
        }
    }
}

/// `b` (N, K): the panel of columns `first..first + width` (≤ 16), as `pack_b_nn`'s, each 8
/// columns × 8 K transposed in registers; ragged edges element by element.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_nt(dst: &mut [f32], b: &[bf16], k: usize, first: usize, width: usize) {
    let body = k / 8 * 8;
    let panel = dst.as_mut_ptr();
    for half in 0..2 {
        let c0 = half * 8;
        let live = width.saturating_sub(c0).min(8);
        let col = |l: usize| &b[(first + c0 + l) * k..][..k];
        if live == 8 {
            let rows: [&[bf16]; 8] = std::array::from_fn(col);
            for kk in (0..body).step_by(8) {
                let v: [__m256; 8] = std::array::from_fn(|l| widen8(rows[l].as_ptr().add(kk)));
                let tr = transpose8(v);
                for (x, &vec) in tr.iter().enumerate() {
                    _mm256_storeu_ps(panel.add((kk + x) * NR + half * 8), vec);
                }
            }
        }
        let from = if live == 8 { body } else { 0 };
        for kk in from..k {
            for l in 0..8 {
                let x = if l < live { widen(col(l)[kk]) } else { 0.0 };
                *panel.add(kk * NR + half * 8 + l) = x;
            }
        }
    }
}

/// Rows r0..r7 (8 f32 each) → columns: out[x] = [r0[x], r1[x], .., r7[x]].
#[inline(always)]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// The tile into out: added or written, f32 or rounded once to bf16.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn write_out(c: &[f32], t: Task) {
    let body = t.cols / 8 * 8;
    for r in 0..t.rows {
        let tile = &c[r * NB..r * NB + t.cols];
        let at = (t.i0 + r) * t.n + t.j0;
        match t.out {
            OutPtr::F32(base) => {
                let o = std::slice::from_raw_parts_mut((base as *mut f32).add(at), t.cols);
                for j in (0..body).step_by(8) {
                    let mut v = _mm256_loadu_ps(tile.as_ptr().add(j));
                    if t.add {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(o.as_ptr().add(j)));
                    }
                    _mm256_storeu_ps(o.as_mut_ptr().add(j), v);
                }
                for j in body..t.cols {
                    o[j] = if t.add { o[j] + tile[j] } else { tile[j] };
                }
            }
            OutPtr::Bf16(base) => {
                let o = std::slice::from_raw_parts_mut((base as *mut bf16).add(at), t.cols);
                for j in (0..body).step_by(8) {
                    let mut v = _mm256_loadu_ps(tile.as_ptr().add(j));
                    if t.add {
                        v = _mm256_add_ps(v, widen8(o.as_ptr().add(j)));
                    }
                    _mm_storeu_si128(o.as_mut_ptr().add(j) as *mut __m128i, round8(v));
                }
                for j in body..t.cols {
                    let sum = if t.add {
                        widen(o[j]) + tile[j]
                    } else {
                        tile[j]
                    };
                    o[j] = bf16::from_bits(crate::convert::bf16_bits(sum));
                }
            }
        }
    }
}

/// 8 f32 rounded to bf16 bits with `convert::bf16_bits`'s integer rule: nearest even, NaN kept
/// quiet (not `vcvtneps2bf16`'s subnormal flush), so every path writes the same bits.
#[inline(always)]
unsafe fn round8(v: __m256) -> __m128i {
    let bits = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
    let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias));
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
    let abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
    let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
    let out = _mm256_blendv_epi8(rounded, quiet, nan);
    _mm_packus_epi32(
        _mm256_castsi256_si128(out),
        _mm256_extracti128_si256::<1>(out),
    )
}
