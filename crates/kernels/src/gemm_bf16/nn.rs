//! `out (M, N) (+)= a (M, K) · b (K, N)` with `b` row-major over N, read where it lies: no packed
//! copy of `b`. For the products whose `b` is large and K-major — the classifier's input
//! gradient `dl (rows, V) · wte (V, C)` reads the whole token table, whose packed copy
//! (`packed`) would be as large as the table itself — and for the backward GEMMs whose `b` is
//! an activation or a weight in its natural layout (no transposed copy).
//!
//! AVX-512 BF16: per K pair, two rows of `b` (32 columns each) are interleaved into the pair
//! layout `vdpbf16ps` wants with `vpunpck{l,h}wd` (columns land permuted within 128-bit lanes;
//! one two-source permute per tile puts them back), and a broadcast pair of each of 8 rows of
//! `a` multiplies both: 16 `vdpbf16ps` per 2 loads and 2 shuffles of `b`. Work is a grid of
//! 64-row × 128-column blocks over rayon, each sweeping K in blocks of 256 so its slice of `b`
//! (256 × 128 bf16 = 64 KiB) stays in L2 while every 8-row tile of the block reuses it.

use super::{bf16, widen};
use rayon::prelude::*;

/// Rows of `a` and columns of `b` per rayon task, and K per cache block.
const MB: usize = 64;
const NB: usize = 128;
const KB: usize = 256;

/// out (M,N) (+)= a (M,K) · b (K,N) on `avx512` (AVX-512 BF16, checked by the caller) or the
/// portable widening loop.
pub(super) fn gemm(
    out: &mut [f32],
    a: &[bf16],
    b: &[bf16],
    (m, n, k): (usize, usize, usize),
    add: bool,
    avx512: bool,
) {
    let blocks_n = n.div_ceil(NB);
    // One task per (64-row, 128-column) block; a task owns its rows' columns j0..j1 of out.
    let tasks: Vec<(usize, usize)> = (0..m.div_ceil(MB))
        .flat_map(|bi| (0..blocks_n).map(move |bj| (bi, bj)))
        .collect();
    let out_addr = out.as_mut_ptr() as usize;
    tasks.par_iter().for_each(|&(bi, bj)| {
        let (i0, j0) = (bi * MB, bj * NB);
        let blk = Block {
            i0,
            rows: MB.min(m - i0),
            j0,
            cols: NB.min(n - j0),
            n,
            k,
            add,
        };
        // SAFETY: the tasks' (rows, columns) blocks are disjoint, so no two write one element,
        // and every block lies inside out (M·N elements).
        let out = unsafe { std::slice::from_raw_parts_mut(out_addr as *mut f32, m * n) };
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: the caller checked AVX-512 BF16 on the running CPU.
            return unsafe { avx512::block(out, a, b, blk) };
        }
        let _ = avx512;
        portable_block(out, a, b, blk);
    });
}

/// Rows `i0..i0 + rows`, columns `j0..j0 + cols` of out.
#[derive(Clone, Copy)]
struct Block {
    i0: usize,
    rows: usize,
    j0: usize,
    cols: usize,
    n: usize,
    k: usize,
    add: bool,
}

fn portable_block(out: &mut [f32], a: &[bf16], b: &[bf16], t: Block) {
    let mut acc = vec![0.0f32; t.cols];
    for i in t.i0..t.i0 + t.rows {
        acc.fill(0.0);
        let ar = &a[i * t.k..][..t.k];
        for (p, &x) in ar.iter().enumerate() {
            let x = widen(x);
            let br = &b[p * t.n + t.j0..][..t.cols];
            for (s, &y) in acc.iter_mut().zip(br) {
                *s += x * widen(y);
            }
        }
        let o = &mut out[i * t.n + t.j0..][..t.cols];
        for (d, &s) in o.iter_mut().zip(&acc) {
            *d = if t.add { *d + s } else { s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{bf16, Block, KB};
    use std::arch::x86_64::*;

    const MR: usize = 8;

    /// # Safety
    /// The CPU must support avx512f, avx512bw and avx512bf16; the block lies inside the slices.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn block(out: &mut [f32], a: &[bf16], b: &[bf16], t: Block) {
        for k0 in (0..t.k).step_by(KB) {
            let kn = KB.min(t.k - k0);
            // The first K block replaces (or adds into) out; later ones add their part.
            let add = t.add || k0 > 0;
            for c0 in (0..t.cols).step_by(32) {
                for r0 in (0..t.rows).step_by(MR) {
                    let tile = Tile {
                        i0: t.i0 + r0,
                        mr: MR.min(t.rows - r0),
                        j0: t.j0 + c0,
                        nc: 32.min(t.cols - c0),
                        k0,
                        kn,
                        n: t.n,
                        k: t.k,
                        add,
                    };
                    tile_8x32(out, a, b, tile);
                }
            }
        }
    }

    #[derive(Clone, Copy)]
    struct Tile {
        i0: usize,
        mr: usize,
        j0: usize,
        nc: usize,
        k0: usize,
        kn: usize,
        n: usize,
        k: usize,
        add: bool,
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn tile_8x32(out: &mut [f32], a: &[bf16], b: &[bf16], t: Tile) {
        // Rows past the edge repeat the last valid row; their results are not stored.
        let rows: [*const u16; MR] = std::array::from_fn(|r| {
            a.as_ptr().add((t.i0 + r.min(t.mr - 1)) * t.k + t.k0) as *const u16
        });
        let cmask: __mmask32 = if t.nc == 32 { !0 } else { (1u32 << t.nc) - 1 };
        let brow = |p: usize| b.as_ptr().add((t.k0 + p) * t.n + t.j0) as *const i16;
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let pairs = t.kn / 2;
        for q in 0..pairs {
            let r0 = _mm512_maskz_loadu_epi16(cmask, brow(2 * q));
            let r1 = _mm512_maskz_loadu_epi16(cmask, brow(2 * q + 1));
            // Per 128-bit lane: columns 0-3 (lo) and 4-7 (hi) of that lane's 8, as K pairs.
            let w0: __m512bh = std::mem::transmute(_mm512_unpacklo_epi16(r0, r1));
            let w1: __m512bh = std::mem::transmute(_mm512_unpackhi_epi16(r0, r1));
            for r in 0..MR {
                let pair = (rows[r].add(2 * q) as *const i32).read_unaligned();
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
            }
        }
        if t.kn % 2 == 1 {
            // The last K row pairs with zeros.
            let p = t.kn - 1;
            let r0 = _mm512_maskz_loadu_epi16(cmask, brow(p));
            let z = _mm512_setzero_si512();
            let w0: __m512bh = std::mem::transmute(_mm512_unpacklo_epi16(r0, z));
            let w1: __m512bh = std::mem::transmute(_mm512_unpackhi_epi16(r0, z));
            for r in 0..MR {
                let last = i32::from(*rows[r].add(p));
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(last));
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
            }
        }
        // lo holds columns {0-3, 8-11, 16-19, 24-27}, hi {4-7, 12-15, 20-23, 28-31}.
        let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let second =
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        for (r, acc_r) in acc.iter().enumerate().take(t.mr) {
            let halves = [
                _mm512_permutex2var_ps(acc_r[0], first, acc_r[1]),
                _mm512_permutex2var_ps(acc_r[0], second, acc_r[1]),
            ];
            for (h, &v) in halves.iter().enumerate() {
                let col = 16 * h;
                if col >= t.nc {
                    break;
                }
                let cols = 16.min(t.nc - col);
                let mask: __mmask16 = if cols == 16 { !0 } else { (1u16 << cols) - 1 };
                let dst = out.as_mut_ptr().add((t.i0 + r) * t.n + t.j0 + col);
                let v = if t.add {
                    _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst))
                } else {
                    v
                };
                _mm512_mask_storeu_ps(dst, mask, v);
            }
        }
    }
}
