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
//!
//! The output is f32, or bf16 ([`Out::Bf16`]: a 2-byte gradient accumulated directly): each
//! element is widened, its whole K sum added in f32 and the result rounded once (round to
//! nearest even, as `convert::bf16_bits`), so a bf16 output sweeps all of K in one block.

use super::{bf16, widen, Dims};
use rayon::prelude::*;

/// Rows of `a` and columns of `b` per rayon task, and K per cache block.
const MB: usize = 64;
const NB: usize = 128;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const KB: usize = 256;

/// How `b` lies: (N, K) with K contiguous (`gemm_nt`), or (K, N) with N contiguous (`gemm_nn`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Layout {
    Nt,
    Nn,
}

/// Where the product goes: M·N f32, or M·N bf16 rounded once per call.
pub(super) enum Out<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

/// The output's base address and element type, shared by the tasks.
#[derive(Clone, Copy)]
pub(super) enum OutPtr {
    F32(usize),
    Bf16(usize),
}

impl OutPtr {
    /// The address of `out`, which must hold `len` elements.
    pub(super) fn of(out: Out<'_>, len: usize) -> OutPtr {
        match out {
            Out::F32(o) => {
                assert_eq!(o.len(), len);
                OutPtr::F32(o.as_mut_ptr() as usize)
            }
            Out::Bf16(o) => {
                assert_eq!(o.len(), len);
                OutPtr::Bf16(o.as_mut_ptr() as usize)
            }
        }
    }
}

/// out (M,N) (+)= a (M,K) · b (K,N) on `avx512` (AVX-512 BF16, checked by the caller) or the
/// portable widening loop.
pub(super) fn gemm(out: Out<'_>, a: &[bf16], b: &[bf16], dims: Dims, add: bool, avx512: bool) {
    let (m, n, k) = dims;
    let out = OutPtr::of(out, m * n);
    let blocks_n = n.div_ceil(NB);
    // One task per (64-row, 128-column) block; a task owns its rows' columns j0..j1 of out.
    (0..m.div_ceil(MB) * blocks_n)
        .into_par_iter()
        .for_each(|task| {
            let mode = (add, Layout::Nn);
            let blk = Block::of(task, (MB, NB), (0, n), (m, n, k), mode, out);
            // SAFETY (both calls): the tasks' (rows, columns) blocks are disjoint, so no two write
            // one element, and every block lies inside out (M·N elements, checked above).
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                // SAFETY: the caller checked AVX-512 BF16 on the running CPU.
                return unsafe { avx512::block(a, b, blk) };
            }
            let _ = avx512;
            unsafe { portable_block(a, b, blk) };
        });
}

/// Rows `i0..i0 + rows`, columns `j0..j0 + cols` of out (M, N), K deep: one task of a GEMM
/// (this module's, and the AVX2 and AMX kernels').
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub i0: usize,
    pub rows: usize,
    pub j0: usize,
    pub cols: usize,
    pub n: usize,
    pub k: usize,
    pub add: bool,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub layout: Layout,
    pub out: OutPtr,
}

impl Block {
    /// Task `task` of the grid of `mb` × `nb` blocks over columns `c0..c0 + cols` of out.
    pub(super) fn of(
        task: usize,
        (mb, nb): (usize, usize),
        (c0, cols): (usize, usize),
        (m, n, k): Dims,
        (add, layout): (bool, Layout),
        out: OutPtr,
    ) -> Block {
        let blocks_n = cols.div_ceil(nb);
        let (i0, j0) = ((task / blocks_n) * mb, c0 + (task % blocks_n) * nb);
        let (rows, cols) = (mb.min(m - i0), nb.min(c0 + cols - j0));
        Block {
            i0,
            rows,
            j0,
            cols,
            n,
            k,
            add,
            layout,
            out,
        }
    }
}

/// # Safety
/// The block lies inside the output, and no other thread writes it during the call.
unsafe fn portable_block(a: &[bf16], b: &[bf16], t: Block) {
    let mut acc = [0.0f32; NB];
    let acc = &mut acc[..t.cols];
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
        let at = i * t.n + t.j0;
        match t.out {
            OutPtr::F32(base) => {
                let o = std::slice::from_raw_parts_mut((base as *mut f32).add(at), t.cols);
                for (d, &s) in o.iter_mut().zip(acc.iter()) {
                    *d = if t.add { *d + s } else { s };
                }
            }
            OutPtr::Bf16(base) => {
                let o = std::slice::from_raw_parts_mut((base as *mut bf16).add(at), t.cols);
                for (d, &s) in o.iter_mut().zip(acc.iter()) {
                    let sum = if t.add { widen(*d) + s } else { s };
                    *d = bf16::from_bits(crate::convert::bf16_bits(sum));
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx512::{store_bf16, store_f32};

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{bf16, Block, OutPtr, KB};
    use std::arch::x86_64::*;

    const MR: usize = 8;

    /// # Safety
    /// The CPU must support avx512f, avx512bw and avx512bf16; the block lies inside the slices.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn block(a: &[bf16], b: &[bf16], t: Block) {
        // A bf16 output is rounded once: all of K in one block.
        let kb = match t.out {
            OutPtr::F32(_) => KB,
            OutPtr::Bf16(_) => t.k,
        };
        for k0 in (0..t.k).step_by(kb) {
            let kn = kb.min(t.k - k0);
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
                        out: t.out,
                    };
                    tile_8x32(a, b, tile);
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
        out: OutPtr,
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn tile_8x32(a: &[bf16], b: &[bf16], t: Tile) {
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
                let at = (t.i0 + r) * t.n + t.j0 + col;
                match t.out {
                    OutPtr::F32(base) => store_f32((base as *mut f32).add(at), mask, v, t.add),
                    OutPtr::Bf16(base) => store_bf16((base as *mut u16).add(at), mask, v, t.add),
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(in crate::gemm_bf16) unsafe fn store_f32(
        dst: *mut f32,
        mask: __mmask16,
        v: __m512,
        add: bool,
    ) {
        let v = match add {
            true => _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst)),
            false => v,
        };
        _mm512_mask_storeu_ps(dst, mask, v);
    }

    /// Widens 16 bf16 (exact), adds `v` in f32 and rounds back to nearest even with
    /// `convert::bf16_bits`'s integer rule (NaN kept quiet), not `vcvtneps2bf16`, which flushes
    /// subnormals: the portable path's bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(in crate::gemm_bf16) unsafe fn store_bf16(
        dst: *mut u16,
        mask: __mmask16,
        v: __m512,
        add: bool,
    ) {
        let v = match add {
            true => {
                let old = _mm256_maskz_loadu_epi16(mask, dst as *const i16);
                let wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(old), 16);
                _mm512_add_ps(v, _mm512_castsi512_ps(wide))
            }
            false => v,
        };
        let bits = _mm512_castps_si512(v);
        let lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        let bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
        let rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
        let quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
        let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
        let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
        let out = _mm512_mask_blend_epi32(nan, rounded, quiet);
        _mm256_mask_storeu_epi16(dst as *mut i16, mask, _mm512_cvtepi32_epi16(out));
    }
}
