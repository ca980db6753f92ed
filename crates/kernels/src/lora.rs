//! LoRA's products: a frozen linear that fills a column range of a fused output, and the
//! low-rank adapter beside it.
//!
//! A fused view (Llama's q|k|v, gate|up) is several HF linears stacked by rows; each one is
//! stored (and dequantized) on its own, so its GEMM writes columns `col0 .. col0 + rows` of the
//! (N, OC) output ([`forward_cols`]) and its input gradient reads the same columns of the output
//! gradient ([`backward_input_cols`]). The frozen weight gets no gradient.
//!
//! The adapter of part p: out[:, p] += s · (x Aₚᵀ) Bₚᵀ with A (r, IC), B (rows, r), s = α / r.
//! The A's of one view sit side by side, so u = x A_catᵀ (N, r·parts) is one GEMM, kept for the
//! backward: dBₚ += s · dout[:, p]ᵀ uₚ, duₚ = s · dout[:, p] Bₚ, dA_cat += duᵀ x, dx += du A_cat.
//! [`reference`] holds the plain loops every product is tested against.
//!
//! ```
//! // One part of 1 row: out[:, 0] += 2 * (x · a) * b.
//! use kernels::lora::{adapter_forward, Part, Weights};
//! let (x, a, b) = ([1.0f32, 2.0], [3.0f32, 4.0], [0.5f32]);
//! let (mut out, mut u) = ([1.0f32], [0.0f32]);
//! let parts = [Part { b: &b, col0: 0, rows: 1 }];
//! let lora = Weights { a_cat: &a, parts: &parts, rank: 1, scale: 2.0 };
//! adapter_forward(&mut out, &mut u, &x, &lora, (1, 2, 1));
//! assert_eq!((u, out), ([11.0], [12.0]));
//! ```

use crate::matmul::capped::matmul;
pub use crate::matmul::{backward_input_cols, forward_cols};
use crate::matmul::{view, view_mut, Dims};
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// One targeted part: its B (rows, r) and where its rows sit in the fused output.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub b: &'a [f32],
    pub col0: usize,
    pub rows: usize,
}

fn par() -> Par {
    match rayon::current_num_threads() {
        1 => Par::Seq,
        n => Par::rayon(n),
    }
}

fn gemm(
    dst: MatMut<'_, f32>,
    accum: Accum,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    alpha: f32,
) {
    matmul(dst, accum, lhs, rhs, alpha, par());
}

/// u (N, w) = inp (N, IC) · a_catᵀ (w, IC) alone (a recompute that keeps the output).
pub fn adapter_u(u: &mut [f32], inp: &[f32], a_cat: &[f32], n: usize, ic: usize, w: usize) {
    assert!(u.len() == n * w && a_cat.len() == w * ic && inp.len() == n * ic);
    gemm(
        view_mut(u, n, w),
        Accum::Replace,
        view(inp, n, ic),
        view(a_cat, w, ic).transpose(),
        1.0,
    );
}

/// One view's adapters: the A's side by side (r·parts, IC), each part's B and place, the rank r
/// and the scale s = α / r.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub a_cat: &'a [f32],
    pub parts: &'a [Part<'a>],
    pub rank: usize,
    pub scale: f32,
}

/// u (N, r·parts) = inp · a_catᵀ, then out[:, p] += scale · uₚ · Bₚᵀ for every part.
pub fn adapter_forward(out: &mut [f32], u: &mut [f32], inp: &[f32], lora: &Weights, dims: Dims) {
    let (n, ic, oc) = dims;
    let (a_cat, parts, r, scale) = (lora.a_cat, lora.parts, lora.rank, lora.scale);
    let w = r * parts.len();
    assert!(out.len() == n * oc);
    adapter_u(u, inp, a_cat, n, ic, w);
    let u = view(u, n, w);
    for (p, part) in parts.iter().enumerate() {
        assert_eq!(part.b.len(), part.rows * r);
        let dst = view_mut(out, n, oc).submatrix_mut(0, part.col0, n, part.rows);
        let up = u.submatrix(0, p * r, n, r);
        gemm(
            dst,
            Accum::Add,
            up,
            view(part.b, part.rows, r).transpose(),
            scale,
        );
    }
}

/// The adapter's backward: dBₚ (rows, r) += scale · dout[:, p]ᵀ uₚ, du (N, r·parts) = scale ·
/// dout[:, p] Bₚ (scratch, overwritten), dA_cat += duᵀ inp, dinp += du · a_cat.
#[allow(clippy::too_many_arguments)]
pub fn adapter_backward(
    dinp: &mut [f32],
    da_cat: &mut [f32],
    db: &mut [&mut [f32]],
    du: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    u: &[f32],
    lora: &Weights,
    (n, ic, oc): Dims,
) {
    let (a_cat, parts, r, scale) = (lora.a_cat, lora.parts, lora.rank, lora.scale);
    let w = r * parts.len();
    assert!(du.len() == n * w && u.len() == n * w && da_cat.len() == w * ic);
    assert!(db.len() == parts.len() && dinp.len() == n * ic && dout.len() == n * oc);
    let g = view(dout, n, oc);
    let uv = view(u, n, w);
    for (p, (part, dbp)) in parts.iter().zip(db.iter_mut()).enumerate() {
        let gp = g.submatrix(0, part.col0, n, part.rows);
        let dbv = view_mut(dbp, part.rows, r);
        gemm(
            dbv,
            Accum::Add,
            gp.transpose(),
            uv.submatrix(0, p * r, n, r),
            scale,
        );
        let dup = view_mut(du, n, w).submatrix_mut(0, p * r, n, r);
        gemm(dup, Accum::Replace, gp, view(part.b, part.rows, r), scale);
    }
    let duv = view(du, n, w);
    gemm(
        view_mut(da_cat, w, ic),
        Accum::Add,
        duv.transpose(),
        view(inp, n, ic),
        1.0,
    );
    gemm(
        view_mut(dinp, n, ic),
        Accum::Add,
        duv,
        view(a_cat, w, ic),
        1.0,
    );
}

/// Whether element `i` survives dropout `p` under `seed`: a SplitMix64 finalizer of
/// (seed, i) against p·2⁶⁴, so the forward, a recompute and the backward draw the same mask
/// without storing it.
#[inline]
pub fn kept(seed: u64, i: usize, p: f32) -> bool {
    let mut z = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 >= f64::from(p) * (1u64 << 53) as f64
}

/// Elements per rayon task of the dropout passes.
const DROP_TASK: usize = 1 << 14;

/// out = x ⊙ mask / (1 − p) (inverted dropout, PEFT's `nn.Dropout` in training).
pub fn dropout(out: &mut [f32], x: &[f32], p: f32, seed: u64) {
    assert_eq!(out.len(), x.len());
    let scale = 1.0 / (1.0 - p);
    out.par_chunks_mut(DROP_TASK)
        .zip(x.par_chunks(DROP_TASK))
        .enumerate()
        .for_each(|(t, (o, x))| {
            for (j, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                *o = if kept(seed, t * DROP_TASK + j, p) {
                    x * scale
                } else {
                    0.0
                };
            }
        });
}

/// dinp += dx ⊙ mask / (1 − p): the dropout's backward with the forward's mask.
pub fn dropout_backward(dinp: &mut [f32], dx: &[f32], p: f32, seed: u64) {
    assert_eq!(dinp.len(), dx.len());
    let scale = 1.0 / (1.0 - p);
    dinp.par_chunks_mut(DROP_TASK)
        .zip(dx.par_chunks(DROP_TASK))
        .enumerate()
        .for_each(|(t, (d, g))| {
            for (j, (d, &g)) in d.iter_mut().zip(g).enumerate() {
                if kept(seed, t * DROP_TASK + j, p) {
                    *d += g * scale;
                }
            }
        });
}

/// Plain loops.
pub mod reference {
    use super::{Dims, Weights};

    /// [`super::adapter_forward`] as loops.
    pub fn adapter_forward(
        out: &mut [f32],
        u: &mut [f32],
        inp: &[f32],
        lora: &Weights,
        dims: Dims,
    ) {
        let (n, ic, oc) = dims;
        let (a_cat, parts, r, scale) = (lora.a_cat, lora.parts, lora.rank, lora.scale);
        let w = r * parts.len();
        for i in 0..n {
            for k in 0..w {
                u[i * w + k] = (0..ic).map(|j| inp[i * ic + j] * a_cat[k * ic + j]).sum();
            }
            for (p, part) in parts.iter().enumerate() {
                for row in 0..part.rows {
                    let d: f32 = (0..r)
                        .map(|k| u[i * w + p * r + k] * part.b[row * r + k])
                        .sum();
                    out[i * oc + part.col0 + row] += scale * d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rng::SplitMix64;

    fn rand(n: usize, r: &mut SplitMix64) -> Vec<f32> {
        (0..n)
            .map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect()
    }

    #[test]
    fn dropout_keeps_about_one_minus_p_and_its_backward_uses_the_same_mask() {
        let n = 100_000;
        let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 1e-5).collect();
        let mut out = vec![0.0; n];
        dropout(&mut out, &x, 0.25, 42);
        let kept_count = out.iter().filter(|&&v| v != 0.0).count();
        assert!(
            (kept_count as f64 / n as f64 - 0.75).abs() < 0.01,
            "{kept_count}"
        );
        for (i, (&o, &xi)) in out.iter().zip(&x).enumerate() {
            assert!(o == 0.0 || (o - xi / 0.75).abs() < 1e-6, "{i}");
        }
        // d(sum(out ⊙ g))/dx = g ⊙ mask / (1 − p): the backward sees the forward's mask.
        let g = vec![2.0f32; n];
        let mut dx = vec![0.0; n];
        dropout_backward(&mut dx, &g, 0.25, 42);
        for (i, (&d, &o)) in dx.iter().zip(&out).enumerate() {
            assert_eq!(d == 0.0, o == 0.0, "{i}");
        }
        let mut other = vec![0.0; n];
        dropout(&mut other, &x, 0.25, 43);
        assert_ne!(other, out, "another seed, another mask");
    }

    /// The parts with B's `bs`, placed at `col0` with `rows` rows each.
    fn parts_of<'a>(bs: &'a [Vec<f32>], col0: &[usize], rows: &[usize]) -> Vec<Part<'a>> {
        (bs.iter().zip(col0).zip(rows))
            .map(|((b, &col0), &rows)| Part { b, col0, rows })
            .collect()
    }

    /// A loss L = Σ out ⊙ g through the frozen parts and the adapters, and its gradients by
    /// finite differences in f64-summed f32.
    #[test]
    fn adapter_backward_matches_finite_differences() {
        let mut rng = SplitMix64::new(3);
        let (n, ic, r, scale) = (5, 7, 2, 1.5f32);
        let rows = [3usize, 4];
        let oc = 9;
        let col0 = [1usize, 5];
        let x = rand(n * ic, &mut rng);
        let a = rand(2 * r * ic, &mut rng);
        let bs: Vec<Vec<f32>> = rows.iter().map(|&k| rand(k * r, &mut rng)).collect();
        let g = rand(n * oc, &mut rng);
        let loss = |x: &[f32], a: &[f32], bs: &[Vec<f32>]| -> f64 {
            let parts = parts_of(bs, &col0, &rows);
            let (mut out, mut u) = (vec![0.0; n * oc], vec![0.0; n * 2 * r]);
            let lora = Weights {
                a_cat: a,
                parts: &parts,
                rank: r,
                scale,
            };
            reference::adapter_forward(&mut out, &mut u, x, &lora, (n, ic, oc));
            out.iter()
                .zip(&g)
                .map(|(&o, &g)| f64::from(o) * f64::from(g))
                .sum()
        };
        let parts = parts_of(&bs, &col0, &rows);
        let (mut out, mut u) = (vec![0.0; n * oc], vec![0.0; n * 2 * r]);
        let lora = Weights {
            a_cat: &a,
            parts: &parts,
            rank: r,
            scale,
        };
        adapter_forward(&mut out, &mut u, &x, &lora, (n, ic, oc));
        let (mut dx, mut da) = (vec![0.0; n * ic], vec![0.0; a.len()]);
        let (mut db0, mut db1) = (vec![0.0; bs[0].len()], vec![0.0; bs[1].len()]);
        let mut du = vec![0.0; n * 2 * r];
        let mut db = [db0.as_mut_slice(), db1.as_mut_slice()];
        adapter_backward(
            &mut dx,
            &mut da,
            &mut db,
            &mut du,
            &g,
            &x,
            &u,
            &lora,
            (n, ic, oc),
        );
        let h = 1e-2f32;
        let check = |analytic: &[f32], bump: &dyn Fn(usize, f32) -> f64| {
            for (i, &d) in analytic.iter().enumerate() {
                let fd = (bump(i, h) - bump(i, -h)) / (2.0 * f64::from(h));
                assert!((fd - f64::from(d)).abs() < 2e-3, "{i}: fd {fd} vs {d}");
            }
        };
        check(&dx, &|i, e| {
            let mut x2 = x.clone();
            x2[i] += e;
            loss(&x2, &a, &bs)
        });
        check(&da, &|i, e| {
            let mut a2 = a.clone();
            a2[i] += e;
            loss(&x, &a2, &bs)
        });
        for p in 0..2 {
            let analytic = if p == 0 { db0.clone() } else { db1.clone() };
            check(&analytic, &|i, e| {
                let mut b2 = bs.clone();
                b2[p][i] += e;
                loss(&x, &a, &b2)
            });
        }
        // The frozen column products against the plain matmul on the whole matrix.
        let w = rand(oc * ic, &mut rng);
        let mut whole = vec![0.0; n * oc];
        crate::matmul::reference::forward(&mut whole, &x, &w, None, (n, ic, oc));
        let mut cols = vec![0.0; n * oc];
        for (c0, k) in [(0, 4), (4, 5)] {
            forward_cols(
                &mut cols,
                &x,
                &w[c0 * ic..(c0 + k) * ic],
                None,
                (n, ic, oc),
                (c0, k),
            );
        }
        for (a, b) in cols.iter().zip(&whole) {
            assert!((a - b).abs() < 1e-5);
        }
        let mut dx_cols = vec![0.0; n * ic];
        for (c0, k) in [(0, 4), (4, 5)] {
            backward_input_cols(
                &mut dx_cols,
                &g,
                &w[c0 * ic..(c0 + k) * ic],
                (n, ic, oc),
                (c0, k),
            );
        }
        let (mut dx_whole, mut dw) = (vec![0.0; n * ic], vec![0.0; oc * ic]);
        crate::matmul::reference::backward(&mut dx_whole, &mut dw, None, &g, &x, &w, (n, ic, oc));
        for (a, b) in dx_cols.iter().zip(&dx_whole) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
