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

/// The largest latent rank the inference kernels take (their per-task scratch is on the stack).
pub const MAX_RANK: usize = 1024;

/// RoPE on interleaved pairs, each row at its own position: in every row (`row_width` wide) the
/// `rope` columns after `offset` of each of `heads` heads `stride` apart (queries: H heads of
/// nope + rope after nope; the cached RoPE key: one head after the latent).
#[allow(clippy::too_many_arguments)]
pub fn rope_at(
    x: &mut [f32],
    positions: &[u32],
    row_width: usize,
    (heads, stride, offset): (usize, usize, usize),
    rope: usize,
    theta: f32,
) {
    assert!(x.len() >= positions.len() * row_width);
    for (row, &p) in x.chunks_exact_mut(row_width).zip(positions) {
        for i in 0..rope / 2 {
            let inv_freq = 1.0 / theta.powf((2 * i) as f32 / rope as f32);
            let (sin, cos) = (p as f32 * inv_freq).sin_cos();
            for h in 0..heads {
                let at = h * stride + offset + 2 * i;
                let (re, im) = (row[at], row[at + 1]);
                row[at] = re * cos - im * sin;
                row[at + 1] = re * sin + im * cos;
            }
        }
    }
}

/// An element type a latent cache holds.
pub trait CacheElem: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl CacheElem for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
}

impl CacheElem for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> half::bf16 {
        half::bf16::from_f32(x)
    }
}

/// Stores each row of `ckv` (N, rank + rope: the normed latent and the rotated RoPE key) in its
/// cache slot (block, slot) of a paged cache of `block` tokens per block.
pub fn latent_write<T: CacheElem>(
    cache: &mut [T],
    ckv: &[f32],
    slots: &[(u32, u32)],
    block: usize,
    width: usize,
) {
    for (row, &(b, s)) in ckv.chunks_exact(width).zip(slots) {
        let at = (b as usize * block + s as usize) * width;
        for (dst, &x) in cache[at..at + width].iter_mut().zip(row) {
            *dst = T::from_f32(x);
        }
    }
}

/// One query row's sequence in a paged latent cache: its block table and the tokens it sees.
#[derive(Clone, Copy, Debug)]
pub struct LatentRow<'a> {
    pub blocks: &'a [u32],
    pub len: usize,
}

/// out (N, H·v) = each row's heads attending over its sequence's cached latents, the key/value
/// expansion absorbed (DeepSeek's MLA decode): per head h, the query's nope part is mapped into
/// the latent space by h's key rows of `w_kvb` (H·(nope + v), rank), scores are
/// (q_lat · c + q_rope · k_rope) × `scale` with an online softmax, and the weighted latent is
/// expanded by h's value rows. Equal to expanding every cached latent into keys and values.
#[allow(clippy::too_many_arguments)]
pub fn latent_attention<T: CacheElem>(
    out: &mut [f32],
    q: &[f32],
    cache: &[T],
    rows: &[LatentRow<'_>],
    block: usize,
    w_kvb: &[f32],
    d: Dims,
    scale: f32,
) {
    let (h, qk, r, width) = (d.heads, d.qk(), d.rank, d.rank + d.rope);
    assert!(r <= MAX_RANK, "latent rank {r} > {MAX_RANK}");
    assert!(out.len() >= rows.len() * h * d.v && q.len() >= rows.len() * h * qk);
    let per_head = d.nope + d.v;
    out[..rows.len() * h * d.v]
        .par_chunks_mut(d.v)
        .enumerate()
        .for_each(|(task, o)| {
            let (row, head) = (task / h, task % h);
            let qh = &q[row * h * qk + head * qk..][..qk];
            let (q_nope, q_rope) = qh.split_at(d.nope);
            let w = &w_kvb[head * per_head * r..(head + 1) * per_head * r];
            let mut q_lat = [0.0f32; MAX_RANK];
            for (dn, &x) in q_nope.iter().enumerate() {
                for (ql, &wv) in q_lat[..r].iter_mut().zip(&w[dn * r..(dn + 1) * r]) {
                    *ql += x * wv;
                }
            }
            let mut acc = [0.0f32; MAX_RANK];
            let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            let seq = rows[row];
            for j in 0..seq.len {
                let slot = seq.blocks[j / block] as usize * block + j % block;
                let e = &cache[slot * width..(slot + 1) * width];
                let mut s = 0.0f32;
                for (a, b) in q_lat[..r].iter().zip(&e[..r]) {
                    s += a * b.to_f32();
                }
                for (a, b) in q_rope.iter().zip(&e[r..]) {
                    s += a * b.to_f32();
                }
                let s = s * scale;
                let m = max.max(s);
                let (old, p) = ((max - m).exp(), (s - m).exp());
                sum = sum * old + p;
                for (a, b) in acc[..r].iter_mut().zip(&e[..r]) {
                    *a = *a * old + p * b.to_f32();
                }
                max = m;
            }
            let wv = &w[d.nope * r..];
            for (e, out) in o.iter_mut().enumerate() {
                let row_w = &wv[e * r..(e + 1) * r];
                let dot: f32 = row_w.iter().zip(&acc[..r]).map(|(a, b)| a * b).sum();
                *out = dot / sum;
            }
        });
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

    #[test]
    fn absorbed_latent_attention_equals_attention_over_the_expanded_keys_and_values() {
        let (n_seq, bs) = (6, 4);
        let mut rng = Rng::new(11);
        let mut f = |k: usize| -> Vec<f32> { rng.vec(k).into_iter().map(|v| v as f32).collect() };
        let w = f(D.heads * (D.nope + D.v) * D.rank);
        let latents = f(n_seq * (D.rank + D.rope));
        let q = f(D.heads * D.qk());
        // Blocks 1 then 0: a shuffled table.
        let table = [1u32, 0];
        let mut cache = vec![0.0f32; 2 * bs * (D.rank + D.rope)];
        let slots: Vec<(u32, u32)> = (0..n_seq)
            .map(|j| (table[j / bs], (j % bs) as u32))
            .collect();
        latent_write(&mut cache, &latents, &slots, bs, D.rank + D.rope);
        let scale = 1.0 / (D.qk() as f32).sqrt();
        let mut out = vec![0.0; D.heads * D.v];
        let rows = [LatentRow {
            blocks: &table,
            len: n_seq,
        }];
        latent_attention(&mut out, &q, &cache, &rows, bs, &w, D, scale);
        let per = D.nope + D.v;
        for h in 0..D.heads {
            let qh = &q[h * D.qk()..(h + 1) * D.qk()];
            let expand = |j: usize, row: usize| -> f32 {
                let c = &latents[j * (D.rank + D.rope)..][..D.rank];
                (0..D.rank)
                    .map(|i| w[(h * per + row) * D.rank + i] * c[i])
                    .sum()
            };
            let scores: Vec<f32> = (0..n_seq)
                .map(|j| {
                    let kpe = &latents[j * (D.rank + D.rope) + D.rank..][..D.rope];
                    let nope: f32 = (0..D.nope).map(|x| qh[x] * expand(j, x)).sum();
                    let pe: f32 = (0..D.rope).map(|x| qh[D.nope + x] * kpe[x]).sum();
                    (nope + pe) * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f32 = p.iter().sum();
            for e in 0..D.v {
                let want: f32 = (0..n_seq).map(|j| p[j] / z * expand(j, D.nope + e)).sum();
                let got = out[h * D.v + e];
                assert!(
                    (got - want).abs() < 1e-5,
                    "head {h} value {e}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn rope_at_a_row_position_equals_the_training_rope_at_that_position() {
        let (t, w) = (5, D.row());
        let mut rng = Rng::new(2);
        let x: Vec<f32> = rng.vec(t * w).into_iter().map(|v| v as f32).collect();
        let mut train = x.clone();
        rope_interleaved(&mut train, (1, t), D, w, 500.0, false);
        let mut at = x.clone();
        let positions: Vec<u32> = (0..t as u32).collect();
        rope_at(
            &mut at,
            &positions,
            w,
            (2 * D.heads, D.qk(), D.nope),
            D.rope,
            500.0,
        );
        assert_eq!(at, train);
    }
}
