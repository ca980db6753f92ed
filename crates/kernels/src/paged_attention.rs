//! Attention of new tokens over a paged KV cache (vLLM's PagedAttention layout), with keys and
//! values stored as f32, bf16, int8 or fp8 e4m3 (dynamic scale per token and head), and the KV
//! range optionally split across tasks with a log-sum-exp merge (FlashDecoding's split-K), so one
//! sequence with few KV heads still uses every core.
//!
//! Layout of one layer's cache: element (block b, KV head h, slot s, d) at
//! `((b·NKV + h)·BLOCK + s)·HD + d`; the scale of (b, h, s) at `(b·NKV + h)·BLOCK + s`. A
//! sequence's block table lists its blocks in order; token `p` is slot `p % BLOCK` of block
//! `table[p / BLOCK]`.
//!
//! [`write`] stores a token's keys or values (quantizing: int8 `scale = absmax/127`, fp8
//! `scale = absmax/448`, round to nearest even). [`attend`] computes, for each query row, causal
//! attention over its sequence's first `len` tokens: each (row, KV head, split) task runs an
//! online softmax over its range for the KV head's group of query heads, reading each key and
//! value once for the whole group; with one split per (row, head) it writes the output directly
//! ("head-parallel"), otherwise partial (max, sum, accumulator) triples go to `partials` and a
//! second pass merges them. [`reference`] is the plain two-pass softmax in f64.
//!
//! ```
//! use kernels::paged_attention::{attend, write, KvShape, KvSlice, KvSliceMut, RowCtx};
//! let shape = KvShape { n_heads: 1, n_kv_heads: 1, head_dim: 2, block: 4 };
//! let (mut k, mut v) = (vec![0.0f32; 8], vec![0.0f32; 8]);
//! write(&mut KvSliceMut::F32(&mut k), &[1.0, 0.0], 0, 0, &shape);
//! write(&mut KvSliceMut::F32(&mut v), &[3.0, 4.0], 0, 0, &shape);
//! let mut out = [0.0f32; 2];
//! let rows = [RowCtx { blocks: &[0], start: 0, len: 1 }];
//! attend(&mut out, &[1.0, 0.0], 2, &rows, &KvSlice::F32(&k), &KvSlice::F32(&v), &shape, 1, &mut []);
//! assert_eq!(out, [3.0, 4.0]);
//! ```

use crate::par::SyncPtr;
use half::bf16;
use range::{run_range, scratch_len, with_scratch};
use rayon::prelude::*;

mod range;

/// Query heads per KV head the kernel handles (its per-task stack arrays).
pub const MAX_GROUP: usize = 128;
/// Largest head dimension.
pub const MAX_HEAD_DIM: usize = 256;

/// Sizes of one layer's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block.
    pub block: usize,
}

impl KvShape {
    fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// f32 elements of `partials` that [`attend`] needs for `rows` rows and `splits` splits.
    pub fn partials_len(&self, rows: usize, splits: usize) -> usize {
        if splits <= 1 {
            return 0;
        }
        rows * self.n_kv_heads * splits * self.group() * (self.head_dim + 2)
    }

    fn check(&self) {
        assert!(
            self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads),
            "heads"
        );
        assert!(
            self.group() <= MAX_GROUP,
            "at most {MAX_GROUP} query heads per KV head"
        );
        assert!(
            self.head_dim <= MAX_HEAD_DIM && self.head_dim > 0,
            "head dim"
        );
        assert!(self.block > 0, "block size");
    }
}

/// One layer's keys or values, read.
#[derive(Clone, Copy, Debug)]
pub enum KvSlice<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    Int8 { codes: &'a [i8], scales: &'a [f32] },
    Fp8 { codes: &'a [u8], scales: &'a [f32] },
}

/// One layer's keys or values, written.
#[derive(Debug)]
pub enum KvSliceMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
    Int8 {
        codes: &'a mut [i8],
        scales: &'a mut [f32],
    },
    Fp8 {
        codes: &'a mut [u8],
        scales: &'a mut [f32],
    },
}

/// A query row's sequence: its block table and the tokens it sees, `start..len` (`len` is its
/// position + 1; `start` is 0, or `len - window` under a sliding window, whose blocks before it
/// may already be freed).
#[derive(Clone, Copy, Debug)]
pub struct RowCtx<'a> {
    pub blocks: &'a [u32],
    pub start: usize,
    pub len: usize,
}

/// Stores `src` (NKV·HD: every KV head of one token) at slot `slot` of block `block`.
pub fn write(cache: &mut KvSliceMut, src: &[f32], block: usize, slot: usize, shape: &KvShape) {
    let (nkv, hd) = (shape.n_kv_heads, shape.head_dim);
    assert_eq!(src.len(), nkv * hd, "one token's KV heads");
    assert!(slot < shape.block);
    for (h, x) in src.chunks_exact(hd).enumerate() {
        let at = (block * nkv + h) * shape.block + slot;
        let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        match cache {
            KvSliceMut::F32(c) => c[at * hd..][..hd].copy_from_slice(x),
            KvSliceMut::Bf16(c) => {
                for (d, v) in c[at * hd..][..hd].iter_mut().zip(x) {
                    *d = bf16::from_f32(*v);
                }
            }
            KvSliceMut::Int8 { codes, scales } => {
                let scale = absmax / 127.0;
                scales[at] = scale;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                for (d, v) in codes[at * hd..][..hd].iter_mut().zip(x) {
                    *d = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
            }
            KvSliceMut::Fp8 { codes, scales } => {
                let scale = absmax / 448.0;
                scales[at] = scale;
                let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
                for (d, v) in codes[at * hd..][..hd].iter_mut().zip(x) {
                    *d = crate::fp8::e4m3_from_f32(v * inv);
                }
            }
        }
    }
}

/// Copies block `from` to block `to` (copy-on-write of a shared block).
pub fn copy_block(cache: &mut KvSliceMut, from: usize, to: usize, shape: &KvShape) {
    let n = shape.n_kv_heads * shape.block;
    let hd = shape.head_dim;
    match cache {
        KvSliceMut::F32(c) => c.copy_within(from * n * hd..(from + 1) * n * hd, to * n * hd),
        KvSliceMut::Bf16(c) => c.copy_within(from * n * hd..(from + 1) * n * hd, to * n * hd),
        KvSliceMut::Int8 { codes, scales } => {
            codes.copy_within(from * n * hd..(from + 1) * n * hd, to * n * hd);
            scales.copy_within(from * n..(from + 1) * n, to * n);
        }
        KvSliceMut::Fp8 { codes, scales } => {
            codes.copy_within(from * n * hd..(from + 1) * n * hd, to * n * hd);
            scales.copy_within(from * n..(from + 1) * n, to * n);
        }
    }
}

impl KvSlice<'_> {
    /// Token (b, h, s) widened into `dst` (HD).
    #[inline(always)]
    fn load(&self, at: usize, hd: usize, dst: &mut [f32]) {
        match *self {
            KvSlice::F32(c) => dst.copy_from_slice(&c[at * hd..][..hd]),
            KvSlice::Bf16(c) => {
                for (d, v) in dst.iter_mut().zip(&c[at * hd..][..hd]) {
                    *d = f32::from_bits((v.to_bits() as u32) << 16);
                }
            }
            KvSlice::Int8 { codes, scales } => {
                let s = scales[at];
                for (d, v) in dst.iter_mut().zip(&codes[at * hd..][..hd]) {
                    *d = s * *v as f32;
                }
            }
            KvSlice::Fp8 { codes, scales } => {
                let s = scales[at];
                for (d, v) in dst.iter_mut().zip(&codes[at * hd..][..hd]) {
                    *d = s * crate::fp8::E4M3[*v as usize];
                }
            }
        }
    }
}

/// out (rows, NH·HD): row r's query heads (the first NH·HD values of `q`'s row of `q_width`)
/// attend over tokens `rows[r].start..rows[r].len` of their sequence.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    out: &mut [f32],
    q: &[f32],
    q_width: usize,
    rows: &[RowCtx],
    k: &KvSlice,
    v: &KvSlice,
    shape: &KvShape,
    splits: usize,
    partials: &mut [f32],
) {
    shape.check();
    let (nh, nkv, hd, g) = (
        shape.n_heads,
        shape.n_kv_heads,
        shape.head_dim,
        shape.group(),
    );
    let n = rows.len();
    assert!(out.len() == n * nh * hd && q.len() == n * q_width && q_width >= nh * hd);
    let splits = splits.max(1);
    let args = Task {
        q,
        q_width,
        rows,
        k,
        v,
        shape,
    };
    if splits == 1 {
        let dst = SyncPtr(out.as_mut_ptr());
        (0..n * nkv).into_par_iter().for_each(|t| {
            let (r, h) = (t / nkv, t % nkv);
            // SAFETY: task (r, h) writes only row r's heads h·G..(h+1)·G, disjoint from every
            // other task's; `out` outlives the loop.
            let acc = unsafe {
                std::slice::from_raw_parts_mut(dst.get().add((r * nh + h * g) * hd), g * hd)
            };
            let mut ml = [0.0f32; 2 * MAX_GROUP];
            with_scratch(scratch_len(g, hd), |sc| {
                run_range(&args, r, h, rows[r].start..rows[r].len, acc, &mut ml, sc)
            });
            for (gi, a) in acc.chunks_exact_mut(hd).enumerate() {
                let inv = if ml[MAX_GROUP + gi] > 0.0 {
                    1.0 / ml[MAX_GROUP + gi]
                } else {
                    0.0
                };
                a.iter_mut().for_each(|x| *x *= inv);
            }
        });
        return;
    }
    let per = g * (hd + 2);
    assert!(partials.len() >= shape.partials_len(n, splits), "partials");
    partials[..n * nkv * splits * per]
        .par_chunks_mut(per)
        .enumerate()
        .for_each(|(t, part)| {
            let (rh, s) = (t / splits, t % splits);
            let (r, h) = (rh / nkv, rh % nkv);
            let (start, len) = (rows[r].start, rows[r].len - rows[r].start);
            let (p0, p1) = (start + len * s / splits, start + len * (s + 1) / splits);
            let (ml_out, acc) = part.split_at_mut(2 * g);
            let mut ml = [0.0f32; 2 * MAX_GROUP];
            with_scratch(scratch_len(g, hd), |sc| {
                run_range(&args, r, h, p0..p1, acc, &mut ml, sc)
            });
            ml_out[..g].copy_from_slice(&ml[..g]);
            ml_out[g..].copy_from_slice(&ml[MAX_GROUP..MAX_GROUP + g]);
        });
    let partials = &partials[..n * nkv * splits * per];
    out.par_chunks_mut(g * hd).enumerate().for_each(|(rh, o)| {
        let parts = &partials[rh * splits * per..(rh + 1) * splits * per];
        for gi in 0..g {
            let m = parts
                .chunks_exact(per)
                .map(|p| p[gi])
                .fold(f32::NEG_INFINITY, f32::max);
            let dst = &mut o[gi * hd..(gi + 1) * hd];
            dst.fill(0.0);
            let mut l = 0.0f32;
            for p in parts.chunks_exact(per) {
                if p[g + gi] == 0.0 {
                    continue;
                }
                let w = (p[gi] - m).exp();
                l += w * p[g + gi];
                let acc = &p[2 * g + gi * hd..2 * g + (gi + 1) * hd];
                for (d, a) in dst.iter_mut().zip(acc) {
                    *d += w * a;
                }
            }
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            dst.iter_mut().for_each(|x| *x *= inv);
        }
    });
}

struct Task<'a> {
    q: &'a [f32],
    q_width: usize,
    rows: &'a [RowCtx<'a>],
    k: &'a KvSlice<'a>,
    v: &'a KvSlice<'a>,
    shape: &'a KvShape,
}

/// The plain two-pass softmax in f64 over dequantized keys and values (the tests' oracle).
pub fn reference(
    out: &mut [f32],
    q: &[f32],
    q_width: usize,
    rows: &[RowCtx],
    k: &KvSlice,
    v: &KvSlice,
    shape: &KvShape,
) {
    let (nh, nkv, hd, g, blk) = (
        shape.n_heads,
        shape.n_kv_heads,
        shape.head_dim,
        shape.group(),
        shape.block,
    );
    let mut kb = vec![0.0f32; hd];
    let mut vb = vec![0.0f32; hd];
    for (r, row) in rows.iter().enumerate() {
        for head in 0..nh {
            let h = head / g;
            let qh = &q[r * q_width + head * hd..][..hd];
            let mut scores = Vec::with_capacity(row.len - row.start);
            for pos in row.start..row.len {
                let at = (row.blocks[pos / blk] as usize * nkv + h) * blk + pos % blk;
                k.load(at, hd, &mut kb);
                let d: f64 = qh
                    .iter()
                    .zip(&kb)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                scores.push(d / (hd as f64).sqrt());
            }
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let o = &mut out[(r * nh + head) * hd..][..hd];
            let mut acc = vec![0.0f64; hd];
            for (pos, wp) in (row.start..).zip(&w) {
                let at = (row.blocks[pos / blk] as usize * nkv + h) * blk + pos % blk;
                v.load(at, hd, &mut vb);
                for (a, x) in acc.iter_mut().zip(&vb) {
                    *a += wp / total * f64::from(*x);
                }
            }
            for (d, a) in o.iter_mut().zip(acc) {
                *d = a as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests;
