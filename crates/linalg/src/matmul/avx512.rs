//! The AVX-512 f32 GEMM: `dst (M,N) (+)= lhs (M,K) · rhs (K,N)`, any strides in and a row-major
//! `dst`, as BLIS's sgemm does it. An f32 FMA micro-kernel of 12 rows × 32 columns (24
//! accumulators, 2 panel loads and 12 broadcasts per 24 FMAs) runs over packed operands:
//! `rhs` in 32-column panels, K-major, packed once per (1024 columns × 256 K) block and shared
//! by every thread; `lhs` in 12-row panels, K-major, packed by the thread that uses it, into a
//! 12 KiB scratch that stays in L1 while the block's panels of `rhs` stream from L2.
//!
//! Threads split the rows of `dst` in balanced runs of whole panels. Each element's K sum runs
//! in one order (K blocks in turn, each in K order) whatever the split, so results do not
//! depend on the thread count. Rows past M read zeros; columns past N are masked off.

use faer::{Accum, MatMut, MatRef};
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// The micro-kernel's rows and columns.
const MR: usize = 12;
const NR: usize = 32;
/// Steps of K ahead that the kernel asks for its panel of `rhs` (a prefetch into L1).
const PF: usize = 8;
/// K per block, and columns of `rhs` per packed block (256 × 1024 f32 = 1 MiB).
const KC: usize = 256;
const NC: usize = 1024;
/// Row runs per thread: small enough that rayon evens out cores running at different speeds.
const RUNS_PER_THREAD: usize = 16;

thread_local! {
    /// The calling thread's packed blocks of `rhs`, each grown once to the largest: one per
    /// product running on the thread at once (rayon may run a product nested in another's
    /// wait), taken for the call and put back.
    static PACKED_B: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
    /// A worker's packed panel of `lhs` (MR × KC).
    static PANEL_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Gives this thread its `lhs` panel now (see [`crate::warm_threads`]).
pub(crate) fn warm_thread() {
    PANEL_A.with(|cell| {
        if let Ok(mut panel) = cell.try_borrow_mut() {
            if panel.len() < MR * KC {
                panel.resize(MR * KC, 0.0);
            }
        }
    });
}

/// A strided operand.
#[derive(Clone, Copy)]
struct View {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// The row-major output.
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    rs: isize,
}

// SAFETY: the pointers are the caller's views, read (View) or written in disjoint row runs (Dst)
// only while `gemm` runs.
unsafe impl Send for View {}
unsafe impl Sync for View {}
unsafe impl Send for Dst {}
unsafe impl Sync for Dst {}

/// dst = lhs · rhs (`Replace`) or dst += lhs · rhs (`Add`), split for `threads` of rayon's
/// threads (faer's `Par::rayon(threads)`; 1: on this thread alone).
///
/// # Safety
/// The CPU must support AVX-512 F; `dst` must have column stride 1.
pub(crate) unsafe fn gemm(
    mut dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    threads: usize,
) {
    let (m, n, k) = (dst.nrows(), dst.ncols(), lhs.ncols());
    assert!(
        lhs.nrows() == m && rhs.nrows() == k && rhs.ncols() == n && dst.col_stride() == 1,
        "matmul shapes"
    );
    // Row runs write disjoint rows only if rows do not overlap (faer's views guarantee it).
    debug_assert!(m <= 1 || dst.row_stride().unsigned_abs() >= n);
    let c = Dst {
        ptr: dst.as_ptr_mut(),
        rs: dst.row_stride(),
    };
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if accum == Accum::Replace {
            dst.fill(0.0);
        }
        return;
    }
    let a = View {
        ptr: lhs.as_ptr(),
        rs: lhs.row_stride(),
        cs: lhs.col_stride(),
    };
    let b = View {
        ptr: rhs.as_ptr(),
        rs: rhs.row_stride(),
        cs: rhs.col_stride(),
    };
    let need = KC.min(k) * NC.min(n).next_multiple_of(NR);
    // Taken, not borrowed: a GEMM nested in this one on this thread (rayon ran it while this
    // one waited) takes another, which stays for the next.
    let mut buf = PACKED_B
        .with(|pool| pool.borrow_mut().pop())
        .unwrap_or_default();
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    blocks(&mut buf[..need], (a, b, c), (m, n, k), accum, threads);
    PACKED_B.with(|pool| pool.borrow_mut().push(buf));
}

/// Every (NC columns × KC) block in turn: pack it, then run the row panels over it.
fn blocks(
    buf: &mut [f32],
    (a, b, c): (View, View, Dst),
    (m, n, k): (usize, usize, usize),
    accum: Accum,
    threads: usize,
) {
    let row_panels = m.div_ceil(MR);
    let parallel = threads > 1;
    let runs = match parallel {
        true => (threads * RUNS_PER_THREAD).min(row_panels),
        false => 1,
    };
    for j0 in (0..n).step_by(NC) {
        let cols = NC.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let packed = &mut buf[..cols.div_ceil(NR) * NR * kc];
            // SAFETY (both closures): the caller checked the CPU and the shapes.
            let pack = |(q, panel): (usize, &mut [f32])| unsafe {
                pack_b(panel, b, (k0, kc), (j0 + q * NR, NR.min(cols - q * NR)));
            };
            if parallel {
                packed.par_chunks_mut(NR * kc).enumerate().for_each(pack);
            } else {
                packed.chunks_mut(NR * kc).enumerate().for_each(pack);
            }
            let packed = &*packed;
            let load = k0 > 0 || accum == Accum::Add;
            let rows = |r: usize| {
                let (p0, p1) = (r * row_panels / runs, (r + 1) * row_panels / runs);
                PANEL_A.with(|cell| {
                    let mut own = Vec::new();
                    let mut guard = cell.try_borrow_mut();
                    let panel = match guard.as_mut() {
                        Ok(v) => &mut **v,
                        Err(_) => &mut own,
                    };
                    if panel.len() < MR * KC {
                        panel.resize(MR * KC, 0.0);
                    }
                    for p in p0..p1 {
                        let (i0, rows) = (p * MR, MR.min(m - p * MR));
                        // SAFETY: the CPU has AVX-512 F; row runs are disjoint rows of dst.
                        unsafe {
                            pack_a(panel, a, (i0, rows), (k0, kc));
                            row_panel(panel, packed, c, (i0, rows), (j0, cols), kc, load);
                        }
                    }
                });
            };
            if parallel {
                (0..runs).into_par_iter().for_each(rows);
            } else {
                rows(0);
            }
        }
    }
}

/// One 12-row panel of `lhs` times every panel of the packed block, into dst.
#[target_feature(enable = "avx512f")]
unsafe fn row_panel(
    ap: &[f32],
    packed: &[f32],
    c: Dst,
    (i0, rows): (usize, usize),
    (j0, cols): (usize, usize),
    kc: usize,
    load: bool,
) {
    let mut tile = [0.0f32; MR * NR];
    for q in 0..cols.div_ceil(NR) {
        let width = NR.min(cols - q * NR);
        let bp = packed.as_ptr().add(q * NR * kc);
        let at = c.ptr.offset(i0 as isize * c.rs + (j0 + q * NR) as isize);
        if rows == MR {
            kernel(kc, ap.as_ptr(), bp, (at, c.rs), width, load);
            continue;
        }
        // A ragged last panel runs on a stack tile, copied in and out for its rows.
        for r in 0..rows {
            let src = at.offset(r as isize * c.rs);
            std::ptr::copy_nonoverlapping(src, tile.as_mut_ptr().add(r * NR), width);
        }
        kernel(
            kc,
            ap.as_ptr(),
            bp,
            (tile.as_mut_ptr(), NR as isize),
            width,
            load,
        );
        for r in 0..rows {
            let dst = at.offset(r as isize * c.rs);
            std::ptr::copy_nonoverlapping(tile.as_ptr().add(r * NR), dst, width);
        }
    }
}

/// c (12 rows of `width` ≤ 32 columns, row stride `ldc`) = (c if `load`) + ap (K-major, 12 a
/// step) · bp (K-major, 32 a step), over `kc` steps.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn kernel(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    (c, ldc): (*mut f32, isize),
    width: usize,
    load: bool,
) {
    let m0: __mmask16 = if width >= 16 {
        0xFFFF
    } else {
        (1u16 << width) - 1
    };
    let m1: __mmask16 = if width >= NR {
        0xFFFF
    } else if width > 16 {
        (1u16 << (width - 16)) - 1
    } else {
        0
    };
    // The tile's rows come from memory while the loop runs, not before it (`prefetchw`: they
    // will be written).
    for r in 0..MR {
        let row = c.offset(r as isize * ldc) as *const i8;
        _mm_prefetch::<_MM_HINT_ET0>(row);
        _mm_prefetch::<_MM_HINT_ET0>(row.wrapping_add(64));
    }
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for kk in 0..kc {
        let b0 = _mm512_loadu_ps(bp.add(kk * NR));
        let b1 = _mm512_loadu_ps(bp.add(kk * NR + 16));
        // Past the panel's end on its last steps: an address only, never read.
        let ahead = bp.wrapping_add((kk + PF) * NR) as *const i8;
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.add(64));
        let x = ap.add(kk * MR);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let s = _mm512_set1_ps(*x.add(r));
            acc_r[0] = _mm512_fmadd_ps(s, b0, acc_r[0]);
            acc_r[1] = _mm512_fmadd_ps(s, b1, acc_r[1]);
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let row = c.offset(r as isize * ldc);
        let (mut v0, mut v1) = (acc_r[0], acc_r[1]);
        if load {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row.wrapping_add(16)), v1);
        }
        _mm512_mask_storeu_ps(row, m0, v0);
        _mm512_mask_storeu_ps(row.wrapping_add(16), m1, v1);
    }
}

/// `lhs` rows `i0..i0 + rows`, K `k0..k0 + kc`, into `dst` K-major (12 a step), zeros past
/// the last row.
#[target_feature(enable = "avx512f")]
unsafe fn pack_a(dst: &mut [f32], a: View, (i0, rows): (usize, usize), (k0, kc): (usize, usize)) {
    let base = a.ptr.offset(i0 as isize * a.rs + k0 as isize * a.cs);
    if a.rs == 1 {
        // Columns contiguous (a transposed operand): 12 in a row per step.
        for kk in 0..kc {
            let src = base.offset(kk as isize * a.cs);
            let d = &mut dst[kk * MR..(kk + 1) * MR];
            std::ptr::copy_nonoverlapping(src, d.as_mut_ptr(), rows);
            d[rows..].fill(0.0);
        }
        return;
    }
    if a.cs == 1 {
        // Rows contiguous: 16 × 16 blocks (12 rows and 4 of zeros) transposed in registers.
        let body = kc / 16 * 16;
        for kk in (0..body).step_by(16) {
            let v = std::array::from_fn(|r| match r < rows {
                true => _mm512_loadu_ps(base.offset(r as isize * a.rs).add(kk)),
                false => _mm512_setzero_ps(),
            });
            for (x, col) in transpose16(v).iter().enumerate() {
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add((kk + x) * MR), 0x0FFF, *col);
            }
        }
        for r in 0..MR {
            for kk in body..kc {
                dst[kk * MR + r] = match r < rows {
                    true => *base.offset(r as isize * a.rs).add(kk),
                    false => 0.0,
                };
            }
        }
        return;
    }
    for r in 0..MR {
        if r >= rows {
            for kk in 0..kc {
                dst[kk * MR + r] = 0.0;
            }
            continue;
        }
        let src = base.offset(r as isize * a.rs);
        for kk in 0..kc {
            dst[kk * MR + r] = *src.offset(kk as isize * a.cs);
        }
    }
}

/// `rhs` columns `j0..j0 + width`, K `k0..k0 + kc`, into one panel K-major (32 a step), zeros
/// past the last column.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(dst: &mut [f32], b: View, (k0, kc): (usize, usize), (j0, width): (usize, usize)) {
    let base = b.ptr.offset(k0 as isize * b.rs + j0 as isize * b.cs);
    if b.cs == 1 {
        // Rows contiguous: 32 in a row per step.
        let mask = if width >= NR {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        let (m0, m1) = (mask as __mmask16, (mask >> 16) as __mmask16);
        for kk in 0..kc {
            let src = base.offset(kk as isize * b.rs);
            let d = dst.as_mut_ptr().add(kk * NR);
            _mm512_storeu_ps(d, _mm512_maskz_loadu_ps(m0, src));
            _mm512_storeu_ps(d.add(16), _mm512_maskz_loadu_ps(m1, src.wrapping_add(16)));
        }
        return;
    }
    if b.rs == 1 {
        // Columns contiguous (a weight read transposed): 16 × 16 blocks transposed in registers.
        let body = kc / 16 * 16;
        for half in 0..2 {
            let col = |j: usize| base.offset((half * 16 + j) as isize * b.cs);
            let live = width.saturating_sub(half * 16).min(16);
            for kk in (0..body).step_by(16) {
                let v = std::array::from_fn(|j| match j < live {
                    true => _mm512_loadu_ps(col(j).add(kk)),
                    false => _mm512_setzero_ps(),
                });
                for (x, row) in transpose16(v).iter().enumerate() {
                    _mm512_storeu_ps(dst.as_mut_ptr().add((kk + x) * NR + half * 16), *row);
                }
            }
            for j in 0..16 {
                for kk in body..kc {
                    dst[kk * NR + half * 16 + j] = match j < live {
                        true => *col(j).add(kk),
                        false => 0.0,
                    };
                }
            }
        }
        return;
    }
    for j in 0..NR {
        if j >= width {
            for kk in 0..kc {
                dst[kk * NR + j] = 0.0;
            }
            continue;
        }
        let src = base.offset(j as isize * b.cs);
        for kk in 0..kc {
            dst[kk * NR + j] = *src.offset(kk as isize * b.rs);
        }
    }
}

/// Rows r0..r15 (16 f32 each) → columns: out[x] = [r0[x], r1[x], .., r15[x]].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved, then within each 128-bit lane columns of 4 rows: u[4g + c]
    // holds, in lane l, column 4l + c of rows 4g..4g + 4.
    let t: [__m512; 16] = std::array::from_fn(|i| match i % 2 {
        0 => _mm512_unpacklo_ps(r[i], r[i + 1]),
        _ => _mm512_unpackhi_ps(r[i - 1], r[i]),
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (g, c) = (i / 4, i % 4);
        let (x, y) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
        match c % 2 {
            0 => _mm512_shuffle_ps::<0x44>(x, y),
            _ => _mm512_shuffle_ps::<0xEE>(x, y),
        }
    });
    // Lanes gathered across the row groups: even lanes (0x88) and odd lanes (0xDD).
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let p = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let q = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
        let r = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let s = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(p, r);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(q, s);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(p, r);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(q, s);
    }
    out
}
