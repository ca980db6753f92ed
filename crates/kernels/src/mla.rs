//! Multi-head latent attention's row plumbing (DeepSeek-V2): the fused q|k|v rows the attention
//! kernels read, assembled from the queries, the key/value expansion and the shared RoPE key,
//! and taken apart again for the backward; RoPE on interleaved pairs (DeepSeek rotates
//! `(x[2i], x[2i+1])` as one complex number, where Llama rotates `x[i]` with `x[i + d/2]`); the
//! values taken out of (and their gradient put back into) the kernels' padded output.
//!
//! Layout: each head's query and key are `nope + rope` wide, nope first; the expansion row is
//! heads × `[k_nope (nope) | v (v)]`; the latent row is `[latent (rank) | k_rope (rope)]`. In
//! the fused row (width 3·H·(nope + rope)) a head's value fills its first `v` columns and the
//! rest are zero, so attention with head size `nope + rope` (scale 1/√(nope + rope), as HF)
//! gives each head's value output in its first `v` columns.
//!
//! ```
//! let d = kernels::mla::Dims { heads: 1, nope: 1, rope: 2, v: 1, rank: 1 };
//! let (q, kv, ckv) = ([1.0f32, 2.0, 3.0], [4.0f32, 5.0], [6.0f32, 7.0, 8.0]);
//! let mut qkv = [0.0f32; 9];
//! kernels::mla::assemble(&mut qkv, &q, &kv, &ckv, 1, d);
//! assert_eq!(qkv, [1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 5.0, 0.0, 0.0]);
//! ```

use rayon::prelude::*;

/// One layer's latent-attention sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// The key/value latent's rank.
    pub rank: usize,
}

impl Dims {
    pub fn qk(&self) -> usize {
        self.nope + self.rope
    }
    fn row(&self) -> usize {
        3 * self.heads * self.qk()
    }
    fn kv(&self) -> usize {
        self.heads * (self.nope + self.v)
    }
    fn ckv(&self) -> usize {
        self.rank + self.rope
    }
}

/// qkv (N, 3·H·qk) := queries `q` (N, H·qk), keys [k_nope | k_rope] and zero-padded values.
pub fn assemble(qkv: &mut [f32], q: &[f32], kv: &[f32], ckv: &[f32], n: usize, d: Dims) {
    let (hq, qk) = (d.heads * d.qk(), d.qk());
    assert!(qkv.len() == n * d.row() && q.len() == n * hq);
    assert!(kv.len() == n * d.kv() && ckv.len() == n * d.ckv());
    qkv.par_chunks_mut(d.row())
        .enumerate()
        .for_each(|(t, row)| {
            let (rq, rest) = row.split_at_mut(hq);
            let (rk, rv) = rest.split_at_mut(hq);
            rq.copy_from_slice(&q[t * hq..(t + 1) * hq]);
            let e = &kv[t * d.kv()..(t + 1) * d.kv()];
            let k_rope = &ckv[t * d.ckv() + d.rank..(t + 1) * d.ckv()];
            for h in 0..d.heads {
                let src = &e[h * (d.nope + d.v)..(h + 1) * (d.nope + d.v)];
                let k = &mut rk[h * qk..(h + 1) * qk];
                k[..d.nope].copy_from_slice(&src[..d.nope]);
                k[d.nope..].copy_from_slice(k_rope);
                let v = &mut rv[h * qk..(h + 1) * qk];
                v[..d.v].copy_from_slice(&src[d.nope..]);
                v[d.v..].fill(0.0);
            }
        });
}

/// The backward of [`assemble`]: `dq` := the queries' gradient, `dkv` := the expansion's,
/// and the RoPE key's columns of `dckv` := the sum over heads (its latent columns untouched).
pub fn disassemble(
    dq: &mut [f32],
    dkv: &mut [f32],
    dckv: &mut [f32],
    dqkv: &[f32],
    n: usize,
    d: Dims,
) {
    let (hq, qk) = (d.heads * d.qk(), d.qk());
    assert!(dqkv.len() == n * d.row() && dq.len() == n * hq);
    assert!(dkv.len() == n * d.kv() && dckv.len() == n * d.ckv());
    for t in 0..n {
        let row = &dqkv[t * d.row()..(t + 1) * d.row()];
        let (rq, rest) = row.split_at(hq);
        let (rk, rv) = rest.split_at(hq);
        dq[t * hq..(t + 1) * hq].copy_from_slice(rq);
        let e = &mut dkv[t * d.kv()..(t + 1) * d.kv()];
        let k_rope = &mut dckv[t * d.ckv() + d.rank..(t + 1) * d.ckv()];
        k_rope.fill(0.0);
        for h in 0..d.heads {
            let dst = &mut e[h * (d.nope + d.v)..(h + 1) * (d.nope + d.v)];
            let k = &rk[h * qk..(h + 1) * qk];
            dst[..d.nope].copy_from_slice(&k[..d.nope]);
            dst[d.nope..].copy_from_slice(&rv[h * qk..h * qk + d.v]);
            for (g, &x) in k_rope.iter_mut().zip(&k[d.nope..]) {
                *g += x;
            }
        }
    }
}

/// RoPE on interleaved pairs of the `rope` columns after `nope` in each of the first `2·H`
/// heads (queries and keys) of fused rows `row_width` wide, at positions 0..T of each of B
/// sequences; `inverse` rotates back (the backward). Angles are position × θ^(−2i/rope).
#[allow(clippy::too_many_arguments)]
pub fn rope_interleaved(
    x: &mut [f32],
    (b, t): (usize, usize),
    d: Dims,
    row_width: usize,
    theta: f32,
    inverse: bool,
) {
    assert_eq!(x.len(), b * t * row_width);
    let half = d.rope / 2;
    x.par_chunks_mut(row_width)
        .enumerate()
        .for_each(|(r, row)| {
            let pos = (r % t) as f32;
            for i in 0..half {
                // As HF: inv_freq in f32, then the angle pos × inv_freq in f32.
                let inv_freq = 1.0 / theta.powf((2 * i) as f32 / d.rope as f32);
                let angle = pos * inv_freq;
                let (sin, cos) = (angle.sin(), angle.cos());
                let sin = if inverse { -sin } else { sin };
                for h in 0..2 * d.heads {
                    let at = h * d.qk() + d.nope + 2 * i;
                    let (re, im) = (row[at], row[at + 1]);
                    row[at] = re * cos - im * sin;
                    row[at + 1] = re * sin + im * cos;
                }
            }
        });
}

/// out (N, H·v) := each head's first `v` columns of the kernels' output (N, H·qk).
pub fn take_values(out: &mut [f32], padded: &[f32], n: usize, d: Dims) {
    let (qk, w) = (d.qk(), d.heads * d.v);
    for t in 0..n {
        for h in 0..d.heads {
            let src = &padded[t * d.heads * qk + h * qk..][..d.v];
            out[t * w + h * d.v..][..d.v].copy_from_slice(src);
        }
    }
}

/// padded (N, H·qk) := the values' gradient `dout` (N, H·v) in each head's first `v` columns,
/// zero elsewhere.
pub fn put_values(padded: &mut [f32], dout: &[f32], n: usize, d: Dims) {
    let (qk, w) = (d.qk(), d.heads * d.v);
    padded.fill(0.0);
    for t in 0..n {
        for h in 0..d.heads {
            let dst = &mut padded[t * d.heads * qk + h * qk..][..d.v];
            dst.copy_from_slice(&dout[t * w + h * d.v..][..d.v]);
        }
    }
}

/// latent (N, rank) := the latent columns of `ckv` (N, rank + rope); with `back`, the other way.
pub fn latent(latent: &mut [f32], ckv: &mut [f32], n: usize, d: Dims, back: bool) {
    let w = d.ckv();
    for t in 0..n {
        let (l, c) = (
            &mut latent[t * d.rank..(t + 1) * d.rank],
            &mut ckv[t * w..t * w + d.rank],
        );
        if back {
            c.copy_from_slice(l);
        } else {
            l.copy_from_slice(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    const D: Dims = Dims {
        heads: 3,
        nope: 4,
        rope: 4,
        v: 3,
        rank: 5,
    };

    #[test]
    fn disassemble_is_the_adjoint_of_assemble() {
        // <assemble(q, kv, ckv), g> = <q, dq> + <kv, dkv> + <k_rope, dk_rope> for any g.
        let n = 4;
        let mut rng = Rng::new(9);
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let q = f(rng.vec(n * D.heads * D.qk()));
        let kv = f(rng.vec(n * D.kv()));
        let ckv = f(rng.vec(n * D.ckv()));
        let g = f(rng.vec(n * D.row()));
        let mut qkv = vec![0.0; n * D.row()];
        assemble(&mut qkv, &q, &kv, &ckv, n, D);
        let (mut dq, mut dkv, mut dckv) = (vec![0.0; q.len()], vec![0.0; kv.len()], ckv.clone());
        disassemble(&mut dq, &mut dkv, &mut dckv, &g, n, D);
        let dot =
            |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum::<f64>();
        let pe = |x: &[f32]| -> Vec<f32> {
            x.chunks(D.ckv())
                .flat_map(|r| r[D.rank..].to_vec())
                .collect()
        };
        let lhs = dot(&qkv, &g);
        let rhs = dot(&q, &dq) + dot(&kv, &dkv) + dot(&pe(&ckv), &pe(&dckv));
        assert!((lhs - rhs).abs() < 1e-4, "{lhs} vs {rhs}");
        // The latent columns of dckv are left as they were.
        for (a, b) in ckv.chunks(D.ckv()).zip(dckv.chunks(D.ckv())) {
            assert_eq!(a[..D.rank], b[..D.rank]);
        }
    }

    #[test]
    fn interleaved_rope_rotates_pairs_and_its_inverse_undoes_it() {
        let (b, t) = (2, 5);
        let w = D.row();
        let mut rng = Rng::new(4);
        let x: Vec<f32> = rng.vec(b * t * w).into_iter().map(|v| v as f32).collect();
        let mut y = x.clone();
        rope_interleaved(&mut y, (b, t), D, w, 10_000.0, false);
        // Position 0 is unrotated; the nope columns and the value heads are never touched.
        assert_eq!(y[..w], x[..w]);
        let row = w; // position 1
        assert_eq!(y[row..row + D.nope], x[row..row + D.nope]);
        assert_eq!(
            y[row + 2 * D.heads * D.qk()..2 * w],
            x[row + 2 * D.heads * D.qk()..2 * w]
        );
        let (re, im) = (x[row + D.nope], x[row + D.nope + 1]);
        let (s, c) = 1f32.sin_cos();
        assert!((y[row + D.nope] - (re * c - im * s)).abs() < 1e-6);
        // Rotations keep the norm of each pair; the inverse restores the input.
        rope_interleaved(&mut y, (b, t), D, w, 10_000.0, true);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn values_out_and_back_keep_their_columns() {
        let n = 2;
        let padded: Vec<f32> = (0..n * D.heads * D.qk()).map(|i| i as f32).collect();
        let mut v = vec![0.0; n * D.heads * D.v];
        take_values(&mut v, &padded, n, D);
        let mut back = vec![9.0; padded.len()];
        put_values(&mut back, &v, n, D);
        for (i, (&p, &b)) in padded.iter().zip(&back).enumerate() {
            let col = i % D.qk();
            assert_eq!(b, if col < D.v { p } else { 0.0 });
        }
    }
}
