//! `dst (C,R) = src (R,C)ᵀ` for bf16: the backward's output gradient and the classifier's logit
//! gradient, for GEMMs whose `a` has its reduction axis strided.

use super::bf16;
use rayon::prelude::*;

/// Rows and columns of `src` per transpose tile: 64 × 64 bf16 = 8 KiB read and 8 KiB written,
/// so the strided side stays in L1 instead of missing cache on every element.
const TB: usize = 64;

/// dst (C,R) = src (R,C)ᵀ, in 64 × 64 tiles, one rayon task per 64 rows of `dst`.
pub fn transpose(dst: &mut [bf16], src: &[bf16], rows: usize, cols: usize) {
    assert!(dst.len() == rows * cols && src.len() == rows * cols);
    if rows == 0 || cols == 0 {
        return;
    }
    dst.par_chunks_mut(TB * rows)
        .enumerate()
        .for_each(|(blk, d)| {
            let (j0, nj) = (blk * TB, d.len() / rows);
            for i0 in (0..rows).step_by(TB) {
                let ni = TB.min(rows - i0);
                // Whole 8 × 8 blocks in registers, the ragged edges element by element.
                let (ni8, nj8) = (ni / 8 * 8, nj / 8 * 8);
                for jj in (0..nj8).step_by(8) {
                    for ii in (0..ni8).step_by(8) {
                        let from = (i0 + ii) * cols + j0 + jj;
                        let to = jj * rows + i0 + ii;
                        transpose_8x8(&mut d[to..], &src[from..], rows, cols);
                    }
                }
                for jj in 0..nj {
                    let skip = if jj < nj8 { ni8 } else { 0 };
                    let col = &mut d[jj * rows + i0..][..ni];
                    for (ii, x) in col.iter_mut().enumerate().skip(skip) {
                        *x = src[(i0 + ii) * cols + j0 + jj];
                    }
                }
            }
        });
}

/// dst[c·dst_stride + r] = src[r·src_stride + c] for r, c < 8: on x86-64 three rounds of SSE2
/// unpacks (16-, 32-, 64-bit) over eight 16-byte rows, elsewhere the plain loop.
#[inline]
fn transpose_8x8(dst: &mut [bf16], src: &[bf16], dst_stride: usize, src_stride: usize) {
    assert!(src.len() > 7 * src_stride + 7 && dst.len() > 7 * dst_stride + 7);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86-64; the eight rows of 8 elements on both sides lie inside the
    // slices (asserted above).
    unsafe {
        use std::arch::x86_64::*;
        let row = |r: usize| _mm_loadu_si128(src.as_ptr().add(r * src_stride) as *const __m128i);
        let r: [__m128i; 8] = std::array::from_fn(row);
        let a: [__m128i; 8] = std::array::from_fn(|i| match i % 2 {
            0 => _mm_unpacklo_epi16(r[i], r[i + 1]),
            _ => _mm_unpackhi_epi16(r[i - 1], r[i]),
        });
        // b[0..4]: from rows 0-3, b[4..8]: from rows 4-7; columns (2j, 2j + 1) in b[j], b[4 + j].
        let b = [
            _mm_unpacklo_epi32(a[0], a[2]),
            _mm_unpackhi_epi32(a[0], a[2]),
            _mm_unpacklo_epi32(a[1], a[3]),
            _mm_unpackhi_epi32(a[1], a[3]),
            _mm_unpacklo_epi32(a[4], a[6]),
            _mm_unpackhi_epi32(a[4], a[6]),
            _mm_unpacklo_epi32(a[5], a[7]),
            _mm_unpackhi_epi32(a[5], a[7]),
        ];
        let base = dst.as_mut_ptr();
        let at = |c: usize| base.add(c * dst_stride) as *mut __m128i;
        for j in 0..4 {
            let (even, odd) = (
                _mm_unpacklo_epi64(b[j], b[4 + j]),
                _mm_unpackhi_epi64(b[j], b[4 + j]),
            );
            _mm_storeu_si128(at(2 * j), even);
            _mm_storeu_si128(at(2 * j + 1), odd);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for r in 0..8 {
        for c in 0..8 {
            dst[c * dst_stride + r] = src[r * src_stride + c];
        }
    }
}
