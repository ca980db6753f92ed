//! The register-tiled AVX-512 BF16 kernel: `b` (N, K) is packed once per call into panels of 16
//! columns, each K pair of a column side by side (`[b[j][2p], b[j][2p+1]]` for j in the panel),
//! so one `vdpbf16ps` multiplies a broadcast pair of one row of `a` by 16 columns and adds both
//! products into 16 f32 accumulators. A micro-tile is 8 rows × 2 panels (16 accumulators, 2 panel
//! loads and 8 broadcasts per 16 `vdpbf16ps`): compute-bound, where the dot-product tiles load
//! one vector per two multiply-adds. `b` is packed 512 columns at a time into a per-thread
//! buffer that grows once to at most 512 × K (kernel-internal, like faer's scratch); packing
//! reads `b` once, against M / 8 reads of it by the kernel. Each block of columns is then a grid
//! of (64 rows, 32 columns) tasks, so a GEMM of few rows still splits over every thread.
//!
//! Rows past M repeat the last row and columns past N are zero in the panel; neither is stored.

use super::bf16;
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// From this many rows of `a` the packing pays for itself.
pub(super) const MIN_ROWS: usize = 64;
const LANES: usize = 16;
const MR: usize = 8;
/// Rows of `a` per rayon task.
const MB: usize = 64;
/// Columns of `b` packed at a time: the packed copy is at most 512 × K bf16 (768 KiB at
/// K = 768), whatever N is (the classifier's N is the vocabulary).
const NC: usize = 512;

thread_local! {
    static PACKED: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// u16 elements of one packed panel of K (rounded up to a pair).
fn panel_len(k: usize) -> usize {
    k.div_ceil(2) * 2 * LANES
}

fn pack(dst: &mut [u16], b: &[bf16], n: usize, k: usize) {
    let len = panel_len(k);
    dst.par_chunks_mut(len).enumerate().for_each(|(p, panel)| {
        panel.fill(0);
        for l in 0..LANES.min(n - p * LANES) {
            let row = &b[(p * LANES + l) * k..][..k];
            for (q, x) in row.iter().enumerate() {
                panel[(q / 2) * 2 * LANES + 2 * l + q % 2] = x.to_bits();
            }
        }
    });
}

/// out (M, N) (+)= a (M, K) · b (N, K)ᵀ.
///
/// # Safety
/// The CPU must support avx512f, avx512bw and avx512bf16.
pub(super) unsafe fn gemm(
    out: &mut [f32],
    a: &[bf16],
    b: &[bf16],
    (m, n, k): (usize, usize, usize),
    add: bool,
) {
    let len = panel_len(k);
    PACKED.with(|cell| {
        let mut buf = cell.borrow_mut();
        let most = NC.min(n).div_ceil(LANES) * len;
        if buf.len() < most {
            buf.resize(most, 0);
        }
        let out_addr = out.as_mut_ptr() as usize;
        for c0 in (0..n).step_by(NC) {
            let cols = NC.min(n - c0);
            let panels = cols.div_ceil(LANES);
            let packed = &mut buf[..panels * len];
            pack(packed, &b[c0 * k..(c0 + cols) * k], cols, k);
            let packed = &*packed;
            // One task per (64 rows of a, pair of panels): disjoint blocks of out.
            let pairs = panels.div_ceil(2);
            (0..m.div_ceil(MB) * pairs)
                .into_par_iter()
                .for_each(|task| {
                    let (i0, p0) = ((task / pairs) * MB, (task % pairs) * 2);
                    // SAFETY: the tasks' blocks of out are disjoint and inside its M·N elements.
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(out_addr as *mut f32, m * n) };
                    for r0 in (i0..m.min(i0 + MB)).step_by(MR) {
                        let tile = Tile {
                            i0: r0,
                            mr: MR.min(m - r0),
                            p0,
                            np: 2.min(panels - p0),
                            c0,
                            cols,
                            n,
                            k,
                            add,
                        };
                        // SAFETY: the caller checked the CPU; the tile lies inside the slices.
                        unsafe { tile_8x32(out, a, packed, tile) };
                    }
                });
        }
    });
}

#[derive(Clone, Copy)]
struct Tile {
    /// First row of a (and of out).
    i0: usize,
    mr: usize,
    /// First panel within the packed block, and panels in the tile (1 or 2).
    p0: usize,
    np: usize,
    /// The packed block's first column of out and its width.
    c0: usize,
    cols: usize,
    n: usize,
    k: usize,
    add: bool,
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile_8x32(o: &mut [f32], a: &[bf16], packed: &[u16], t: Tile) {
    let len = panel_len(t.k);
    let rows: [*const u16; MR] =
        std::array::from_fn(|r| a.as_ptr().add((t.i0 + r.min(t.mr - 1)) * t.k) as *const u16);
    // A second panel past N repeats the first; its results are not stored.
    let p1 = if t.np == 2 { t.p0 + 1 } else { t.p0 };
    let (b0, b1) = (
        packed.as_ptr().add(t.p0 * len),
        packed.as_ptr().add(p1 * len),
    );
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let pairs = t.k / 2;
    for q in 0..pairs {
        let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b0.add(q * 32) as *const _));
        let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b1.add(q * 32) as *const _));
        for r in 0..MR {
            let pair = (rows[r].add(2 * q) as *const i32).read_unaligned();
            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
        }
    }
    if t.k % 2 == 1 {
        // The last K element pairs with a zero (the panel holds zero there too).
        let q = pairs;
        let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b0.add(q * 32) as *const _));
        let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b1.add(q * 32) as *const _));
        for r in 0..MR {
            let last = i32::from(*rows[r].add(t.k - 1));
            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(last));
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w1);
        }
    }
    for (r, acc_r) in acc.iter().enumerate().take(t.mr) {
        for (c, &v) in acc_r.iter().enumerate().take(t.np) {
            let within = (t.p0 + c) * LANES;
            let (col, cols) = (t.c0 + within, LANES.min(t.cols - within));
            let mask: __mmask16 = if cols == LANES {
                !0
            } else {
                (1u16 << cols) - 1
            };
            let dst = o.as_mut_ptr().add((t.i0 + r) * t.n + col);
            let v = if t.add {
                _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, dst))
            } else {
                v
            };
            _mm512_mask_storeu_ps(dst, mask, v);
        }
    }
}
