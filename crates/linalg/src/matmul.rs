//! Linear layer: `out = inp @ weight^T + bias`, weight in `nn.Linear` layout (OC, IC).
//!
//! The fast kernels call the crate's AVX-512 GEMM from the `avx512` level up, else faer's (a
//! plain loop without AVX2), one sequential GEMM per rayon thread on a slab of the output
//! ([`gemm`]); the bias gradient (a column sum) runs in column blocks. [`reference`] holds
//! llm.c-style triple loops, generic over [`Real`], against which the GEMM path is tested and
//! benchmarked (`cargo bench --bench matmul`).
//!
//! ```
//! // dinp += dout @ weight, dweight += dout^T @ inp, dbias += colsum(dout)
//! let (inp, weight, dout) = ([1.0f32, 2.0], [3.0f32, 4.0], [1.0f32]); // N = 1, IC = 2, OC = 1
//! let (mut dinp, mut dweight, mut dbias) = ([0.0f32; 2], [0.0f32; 2], [0.0f32]);
//! linalg::matmul::backward(&mut dinp, &mut dweight, Some(&mut dbias), &dout, &inp, &weight, (1, 2, 1));
//! assert_eq!((dinp, dweight, dbias), ([3.0, 4.0], [1.0, 2.0], [1.0]));
//! ```

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod capped;

/// This thread's share of [`crate::warm_threads`]: the crate's kernel's panel, and faer's
/// packing buffer, which faer makes on a thread's first product (on x86, twice the L3 it
/// detects: 600 MiB of address space where a guest reports 300 MiB).
pub(crate) fn warm_thread() {
    #[cfg(target_arch = "x86_64")]
    avx512::warm_thread();
    // faer runs only from AVX2 up (`capped::path`).
    if crate::cpu::detected() < crate::cpu::Level::Avx2 {
        return;
    }
    // One sequential product past faer's small-matrix kernels.
    let (a, b, mut c) = (
        vec![0.0f32; 64 * 64],
        vec![0.0f32; 64 * 64],
        vec![0.0f32; 64 * 64],
    );
    let (lhs, rhs) = (view(&a, 64, 64), view(&b, 64, 64));
    let dst = view_mut(&mut c, 64, 64);
    faer::linalg::matmul::matmul(dst, Accum::Replace, lhs, rhs, 1.0, Par::Seq);
    // faer leaves the registers' upper halves dirty (see `capped::clean_upper`).
    capped::clean_upper();
}

use crate::matmul::capped::matmul;
use crate::Real;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Columns per rayon task in the bias-gradient pass.
const COLS: usize = 64;

/// Row-major (rows, cols) view of a slice.
#[inline]
pub fn view(x: &[f32], rows: usize, cols: usize) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice(x, rows, cols)
}

/// Mutable row-major (rows, cols) view of a slice.
#[inline]
pub fn view_mut(x: &mut [f32], rows: usize, cols: usize) -> MatMut<'_, f32> {
    MatMut::from_row_major_slice_mut(x, rows, cols)
}

/// Below this many multiply-adds a GEMM runs on one thread: forking costs more than it saves.
const SEQ_MACS: usize = 1 << 18;

/// dst = lhs @ rhs (`Accum::Replace`) or dst += lhs @ rhs (`Accum::Add`). From the `avx512`
/// level up, a large product runs the crate's own kernel over all threads ([`capped`]); the
/// rest run as one sequential GEMM (faer's, or the plain loop without AVX2) per rayon thread
/// on a slab of dst cut along its longer side (lhs rows or rhs columns follow). Measured faster
/// than faer's own `Par::rayon` on 2 cores for every GPT-2 124M shape: one fork/join per GEMM
/// instead of faer's synchronisation per packed panel (`cargo bench -p kernels --bench matmul`).
pub fn gemm(dst: MatMut<'_, f32>, accum: Accum, lhs: MatRef<'_, f32>, rhs: MatRef<'_, f32>) {
    let threads = rayon::current_num_threads();
    let macs = dst.nrows() * dst.ncols() * lhs.ncols();
    if capped::own_kernel(&dst, &lhs) {
        // The crate's own kernel splits the rows itself, over packed operands all threads share.
        matmul(dst, accum, lhs, rhs, 1.0, Par::rayon(threads));
    } else if threads == 1 || macs < SEQ_MACS {
        matmul(dst, accum, lhs, rhs, 1.0, Par::Seq);
    } else {
        gemm_split(dst, accum, lhs, rhs, threads);
    }
}

/// Slab boundaries are rounded up to this many rows/columns (a whole number of SIMD vectors).
const SLAB_ALIGN: usize = 16;

fn gemm_split(
    dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    parts: usize,
) {
    let (m, n) = (dst.nrows(), dst.ncols());
    let long = m.max(n);
    let first = parts / 2;
    let at = (long * first / parts).div_ceil(SLAB_ALIGN) * SLAB_ALIGN;
    if parts == 1 || at == 0 || at >= long {
        matmul(dst, accum, lhs, rhs, 1.0, Par::Seq);
        return;
    }
    if m >= n {
        let (d0, d1) = dst.split_at_row_mut(at);
        let (l0, l1) = lhs.split_at_row(at);
        rayon::join(
            || gemm_split(d0, accum, l0, rhs, first),
            || gemm_split(d1, accum, l1, rhs, parts - first),
        );
    } else {
        let (d0, d1) = dst.split_at_col_mut(at);
        let (r0, r1) = rhs.split_at_col(at);
        rayon::join(
            || gemm_split(d0, accum, lhs, r0, first),
            || gemm_split(d1, accum, lhs, r1, parts - first),
        );
    }
}

/// A linear layer's sizes (N, IC, OC): inp (N, IC), weight (OC, IC), out (N, OC).
pub type Dims = (usize, usize, usize);

/// out (N,OC), inp (N,IC), weight (OC,IC), bias (OC).
pub fn forward(out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, dims: Dims) {
    forward_cols(out, inp, weight, bias, dims, (0, dims.2));
}

/// out[:, col0 .. col0 + rows] = inp (N, IC) · weightᵀ (rows, IC) (+ bias (rows)); out (N, OC).
pub fn forward_cols(
    out: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    (n, ic, oc): Dims,
    (col0, rows): (usize, usize),
) {
    assert!(out.len() == n * oc && inp.len() == n * ic && weight.len() == rows * ic);
    assert!(col0 + rows <= oc);
    let accum = match bias {
        Some(bias) => {
            assert_eq!(bias.len(), rows);
            out.par_chunks_mut(oc)
                .for_each(|row| row[col0..col0 + rows].copy_from_slice(bias));
            Accum::Add
        }
        None => Accum::Replace,
    };
    let dst = view_mut(out, n, oc).submatrix_mut(0, col0, n, rows);
    gemm(
        dst,
        accum,
        view(inp, n, ic),
        view(weight, rows, ic).transpose(),
    );
}

/// dinp (N, IC) += dout[:, col0 .. col0 + rows] · weight (rows, IC); dout (N, OC).
pub fn backward_input_cols(
    dinp: &mut [f32],
    dout: &[f32],
    weight: &[f32],
    (n, ic, oc): (usize, usize, usize),
    (col0, rows): (usize, usize),
) {
    assert!(dinp.len() == n * ic && dout.len() == n * oc && weight.len() == rows * ic);
    let g = view(dout, n, oc).submatrix(0, col0, n, rows);
    gemm(view_mut(dinp, n, ic), Accum::Add, g, view(weight, rows, ic));
}

/// Accumulates dinp (N,IC), dweight (OC,IC), dbias (OC) from dout (N,OC).
pub fn backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    (n, ic, oc): Dims,
) {
    assert!(dinp.len() == n * ic && inp.len() == n * ic && dout.len() == n * oc);
    assert!(dweight.len() == oc * ic && weight.len() == oc * ic);
    let g = view(dout, n, oc);
    gemm(view_mut(dinp, n, ic), Accum::Add, g, view(weight, oc, ic));
    gemm(
        view_mut(dweight, oc, ic),
        Accum::Add,
        g.transpose(),
        view(inp, n, ic),
    );
    if let Some(dbias) = dbias {
        assert_eq!(dbias.len(), oc);
        dbias
            .par_chunks_mut(COLS)
            .enumerate()
            .for_each(|(blk, db)| {
                for row in dout.chunks_exact(oc) {
                    for (d, &g) in db.iter_mut().zip(&row[blk * COLS..]) {
                        *d += g;
                    }
                }
            });
    }
}

/// Plain loops, generic over the float type.
pub mod reference {
    use super::{Dims, Real};

    pub fn forward<F: Real>(
        out: &mut [F],
        inp: &[F],
        weight: &[F],
        bias: Option<&[F]>,
        dims: Dims,
    ) {
        let (n, ic, oc) = dims;
        for i in 0..n {
            let x = &inp[i * ic..][..ic];
            for o in 0..oc {
                let mut acc = bias.map_or(F::zero(), |b| b[o]);
                for (&a, &w) in x.iter().zip(&weight[o * ic..][..ic]) {
                    acc += a * w;
                }
                out[i * oc + o] = acc;
            }
        }
    }

    pub fn backward<F: Real>(
        dinp: &mut [F],
        dweight: &mut [F],
        mut dbias: Option<&mut [F]>,
        dout: &[F],
        inp: &[F],
        weight: &[F],
        (n, ic, oc): Dims,
    ) {
        for i in 0..n {
            for o in 0..oc {
                let g = dout[i * oc + o];
                for k in 0..ic {
                    dinp[i * ic + k] += weight[o * ic + k] * g;
                    dweight[o * ic + k] += inp[i * ic + k] * g;
                }
                if let Some(db) = dbias.as_deref_mut() {
                    db[o] += g;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
