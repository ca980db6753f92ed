//! The f32 GEMM under the capability cap: every f32 product in this crate (linear layers,
//! attention, flash tiles, LoRA) calls [`matmul`], with faer's signature. From `avx512` up, a
//! product of at least [`OWN_MACS`] multiply-adds into a row-major `dst` runs this crate's
//! AVX-512 kernel ([`super::avx512`]); the rest run faer, which picks its own kernel from the
//! CPU, so a cap below what faer would pick runs the level's kernel instead: faer's own AVX2
//! kernel (`private-gemm-x86`, the crate faer calls) at `avx2`, a plain loop at `portable`.
//! A CPU without AVX2 (x86 or another architecture: Arm) runs the plain loop too, never faer:
//! faer's kernels there (`gemm`'s scalar and NEON ones) allocate on the heap in every product,
//! and a training step allocates nothing.
//!
//! Not here: the bf16 GEMM (`gemm_bf16`), which has kernels of its own per level.

use crate::cpu::{self, Level};
use faer::{Accum, MatMut, MatRef, Par};

/// Which kernel runs f32 GEMMs at the current level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// This crate's AVX-512 kernel for large products, faer's for the rest.
    Avx512,
    /// faer's choice (AVX-512 on a CPU that has it, else AVX2 + FMA).
    Faer,
    /// faer's AVX2 + FMA kernel, asked for by name on a CPU that has AVX-512.
    FaerAvx2,
    /// Plain loops.
    Portable,
}

impl Path {
    /// The path's name in reports: `avx512`, `faer-avx512`, `faer-avx2` or `portable`.
    pub fn name(self) -> &'static str {
        match self {
            Path::Avx512 => "avx512",
            Path::Faer if cpu::detected() >= Level::Avx512 => "faer-avx512",
            // faer runs only from AVX2 up ([`path`]).
            Path::Faer | Path::FaerAvx2 => "faer-avx2",
            Path::Portable => "portable",
        }
    }
}

/// The path at the current level: faer's own choice unless the cap is below it; the plain loop
/// on a CPU without AVX2, x86 or not.
pub fn path() -> Path {
    match cpu::level() {
        Level::Portable => Path::Portable,
        Level::Avx2 | Level::Avx2Vnni if cpu::detected() >= Level::Avx512 => Path::FaerAvx2,
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 | Level::Avx512Vnni | Level::Avx512Bf16 | Level::Amx => Path::Avx512,
        _ => Path::Faer,
    }
}

/// dst = alpha · lhs · rhs (`Replace`) or dst += alpha · lhs · rhs (`Add`), as
/// `faer::linalg::matmul::matmul`, on [`path`].
pub fn matmul(
    dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
    par: Par,
) {
    match path() {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if alpha == 1.0 && large(&dst, &lhs) => {
            // SAFETY: the level (avx512 or above) guarantees AVX-512 F; `own` checked the stride.
            unsafe { super::avx512::gemm(dst, accum, lhs, rhs, par.degree()) }
        }
        Path::Faer | Path::Avx512 => faer::linalg::matmul::matmul(dst, accum, lhs, rhs, alpha, par),
        #[cfg(target_arch = "x86_64")]
        Path::FaerAvx2 => avx2(dst, accum, lhs, rhs, alpha, par),
        _ => return portable(dst, accum, lhs, rhs, alpha, par),
    }
    clean_upper();
}

/// Products from this many multiply-adds on run the crate's AVX-512 kernel; below, packing
/// costs more than it saves and faer's small-matrix kernels run them.
pub const OWN_MACS: usize = 1 << 21;

/// Whether a product is one for the crate's own kernel: large enough, into a row-major `dst`.
fn large(dst: &MatMut<'_, f32>, lhs: &MatRef<'_, f32>) -> bool {
    dst.col_stride() == 1 && dst.nrows() * dst.ncols() * lhs.ncols() >= OWN_MACS
}

/// Whether [`matmul`] runs this product on the crate's own kernel (which then splits the work
/// over rayon's threads itself when asked for more than one).
pub(crate) fn own_kernel(dst: &MatMut<'_, f32>, lhs: &MatRef<'_, f32>) -> bool {
    path() == Path::Avx512 && large(dst, lhs)
}

/// Clears the upper halves of the vector registers (`vzeroupper`) on a CPU with AVX. faer
/// returns with them dirty, and then every legacy-SSE instruction on this thread (the scalar
/// code the crates build for baseline x86-64: a loss's `exp` loop, sampling) waits on them: a
/// validation loss's scalar cross-entropy ran 50x slower after one faer product on the same
/// thread (Intel Xeon with AMX).
#[inline]
pub(crate) fn clean_upper() {
    #[cfg(target_arch = "x86_64")]
    if cpu::detected() >= Level::Avx2 {
        // SAFETY: the CPU has AVX (implied by AVX2, checked above).
        unsafe { std::arch::x86_64::_mm256_zeroupper() }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2(
    mut dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
    par: Par,
) {
    let (m, n, k) = (dst.nrows(), dst.ncols(), lhs.ncols());
    assert!(
        lhs.nrows() == m && rhs.nrows() == k && rhs.ncols() == n,
        "matmul shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if accum == Accum::Replace {
            dst.fill(0.0);
        }
        return;
    }
    use private_gemm_x86 as pg;
    let threads = if m * n * k >= 4096 * 4 {
        par.degree()
    } else {
        1
    };
    // SAFETY: the pointers and strides are the views' own (shapes checked above); the CPU has
    // AVX2 and FMA (the level is at least avx2); faer calls this function the same way.
    unsafe {
        pg::gemm(
            pg::DType::F32,
            pg::IType::U64,
            pg::InstrSet::Avx256,
            m,
            n,
            k,
            dst.as_ptr_mut() as *mut (),
            dst.row_stride(),
            dst.col_stride(),
            std::ptr::null(),
            std::ptr::null(),
            pg::DstKind::Full,
            match accum {
                Accum::Replace => pg::Accum::Replace,
                Accum::Add => pg::Accum::Add,
            },
            lhs.as_ptr() as *const (),
            lhs.row_stride(),
            lhs.col_stride(),
            false,
            std::ptr::null(),
            0,
            rhs.as_ptr() as *const (),
            rhs.row_stride(),
            rhs.col_stride(),
            false,
            &raw const alpha as *const (),
            threads,
        );
    }
}

/// Products from this many multiply-adds on split their rows over `par`'s threads on the
/// plain loop.
const PAR_MACS: usize = 1 << 16;

/// The plain loop ([`portable_rows`]), its rows split over `par`'s threads when the product
/// is large: each row's sums run in the same order either way, so the split changes no bits.
fn portable(
    dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
    par: Par,
) {
    use rayon::prelude::*;
    let (m, n, k) = (dst.nrows(), dst.ncols(), lhs.ncols());
    assert!(
        lhs.nrows() == m && rhs.nrows() == k && rhs.ncols() == n,
        "matmul shapes"
    );
    let threads = par.degree();
    if threads < 2 || m < 2 || m * n * k < PAR_MACS {
        return portable_rows(dst, accum, lhs, rhs, alpha);
    }
    // A few runs of rows a thread, so threads running at different speeds even out.
    let chunk = m.div_ceil(4 * threads);
    dst.par_row_chunks_mut(chunk)
        .enumerate()
        .for_each(|(c, rows)| {
            let lhs = lhs.subrows(c * chunk, rows.nrows());
            portable_rows(rows, accum, lhs, rhs, alpha);
        });
}

/// The plain loop on one thread: each row of dst accumulates `alpha · lhs[i][p] · rhs[p]` over
/// p, over contiguous rows where dst and rhs have them (the loop then vectorises with SSE2).
fn portable_rows(
    mut dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
) {
    let (m, n, k) = (dst.nrows(), dst.ncols(), lhs.ncols());
    if accum == Accum::Replace {
        dst.fill(0.0);
    }
    if n == 0 {
        return;
    }
    if dst.col_stride() == 1 && rhs.col_stride() == 1 {
        for i in 0..m {
            // SAFETY: row i of dst and row p of rhs are n contiguous elements (column stride 1)
            // inside their views; dst's row is the only one borrowed mutably.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.ptr_at_mut(i, 0), n) };
            for p in 0..k {
                let x = alpha * lhs[(i, p)];
                let row = unsafe { std::slice::from_raw_parts(rhs.ptr_at(p, 0), n) };
                for (o, &r) in out.iter_mut().zip(row) {
                    *o += x * r;
                }
            }
        }
        return;
    }
    if lhs.col_stride() == 1 && rhs.row_stride() == 1 {
        // Rows of lhs and columns of rhs contiguous (a weight read transposed): dot products
        // in 8 partial sums.
        for i in 0..m {
            // SAFETY: row i of lhs and column j of rhs are k contiguous elements in their views.
            let a = unsafe { std::slice::from_raw_parts(lhs.ptr_at(i, 0), k) };
            for j in 0..n {
                let b = unsafe { std::slice::from_raw_parts(rhs.ptr_at(0, j), k) };
                let mut acc = [0.0f32; 8];
                let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
                let tail: f32 = ac
                    .remainder()
                    .iter()
                    .zip(bc.remainder())
                    .map(|(x, y)| x * y)
                    .sum();
                for (x, y) in ac.zip(bc) {
                    for l in 0..8 {
                        acc[l] += x[l] * y[l];
                    }
                }
                dst[(i, j)] += alpha * (acc.iter().sum::<f32>() + tail);
            }
        }
        return;
    }
    for i in 0..m {
        for p in 0..k {
            let x = alpha * lhs[(i, p)];
            for j in 0..n {
                dst[(i, j)] += x * rhs[(p, j)];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{view, view_mut};
    use crate::testutil::{to_f32, Rng};

    /// A (rows, cols) view of `x`, row-major or (`t`) column-major: the transpose of a row-major
    /// view of the other shape.
    fn of(x: &[f32], (rows, cols): (usize, usize), t: bool) -> MatRef<'_, f32> {
        match t {
            false => view(x, rows, cols),
            true => view(x, cols, rows).transpose(),
        }
    }

    /// [`of`], mutable.
    fn of_mut(x: &mut [f32], (rows, cols): (usize, usize), t: bool) -> MatMut<'_, f32> {
        match t {
            false => view_mut(x, rows, cols),
            true => view_mut(x, cols, rows).transpose_mut(),
        }
    }

    /// The plain loop split over threads gives the serial loop's bits, for both accumulations,
    /// row-major and transposed operands, and a column-major dst.
    #[test]
    fn the_split_plain_loop_keeps_the_serial_bits() {
        let (m, n, k) = (37, 48, 40);
        assert!(m * n * k >= PAR_MACS);
        let mut rng = Rng::new(5);
        let (a, b, c0) = (
            to_f32(&rng.vec(m * k)),
            to_f32(&rng.vec(k * n)),
            to_f32(&rng.vec(m * n)),
        );
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for accum in [Accum::Replace, Accum::Add] {
            for (ta, tb, tc) in [
                (false, false, false),
                (true, true, false),
                (true, false, true),
            ] {
                let (lhs, rhs) = (of(&a, (m, k), ta), of(&b, (k, n), tb));
                let (mut split, mut serial) = (c0.clone(), c0.clone());
                portable(
                    of_mut(&mut split, (m, n), tc),
                    accum,
                    lhs,
                    rhs,
                    0.5,
                    Par::rayon(4),
                );
                portable_rows(of_mut(&mut serial, (m, n), tc), accum, lhs, rhs, 0.5);
                assert_eq!(bits(&split), bits(&serial), "{accum:?} {ta} {tb} {tc}");
            }
        }
    }
}
