//! The fused classifier on bf16 operands (`--precision bf16`), chunked over rows as
//! [`super::forward_backward`]: the token table `wte` (V, C) is the 2-byte working copy, read in
//! place (no f32 copy of the table, no packed copy of it). Per chunk of `rows`:
//!
//! 1. `x` = the chunk's input rounded to bf16;
//! 2. `logitsᵀ (V, rows) = wte · xᵀ` (`gemm_bf16::gemm_nt` with the table as `a`, so only the
//!    chunk's rows are packed);
//! 3. per column (one input row): max, exp and the sum of exponentials (f64, in fixed block
//!    order), the loss, and `dloss * (softmax - onehot)` rounded to bf16 as `dlᵀ (V, rows)`,
//!    written over the f32 logits it is computed from (each block of vocabulary rows into its
//!    own first half, then moved together: the logits' first half);
//! 4. `dl (rows, V)`, its transpose, into the logits' second half; `dinp += dl · wte` (f32) and
//!    `dwte += dlᵀ · x` (`gemm_bf16::gemm_nn` and `gemm_nn_bf16`, both reading their `b` in
//!    place), f32 accumulation; the table's gradient is 2-byte and each chunk's part is added
//!    and rounded once (`N / rows` roundings an element per pass), so no f32 V×C copy exists.
//!
//! This is torch autocast's classifier (bf16 operands, f32 accumulation; the softmax in f32 as
//! HF upcasts logits for the loss) without the N×V logits. The scratch is one 4-byte aligned
//! region of [`scratch_bytes_per_row`] a row: V f32 logits (later `dlᵀ` and `dl`, 2 bytes each)
//! and C bf16 inputs, carved here: what the f32 classifier's logits take, plus 2C.

use super::shard::RowReduce;
use super::{check, Io, VocabShard};
use crate::convert::{bf16_bits, f32_to_bf16};
use crate::fastmath::{exp_with, simd_fn};
use crate::gemm_bf16::{gemm_nn, gemm_nn_bf16, gemm_nt, transpose, Accum};
use half::bf16;
use rayon::prelude::*;

/// Vocabulary rows per rayon task of the column softmax.
const VB: usize = 1024;

/// Scratch bytes per row of a chunk: V f32 logits (then V bf16 `dlᵀ` and V bf16 `dl`), C bf16
/// inputs.
pub fn scratch_bytes_per_row(c: usize, v: usize) -> usize {
    4 * v + 2 * c
}

/// Rows of a chunk `scratch` (bf16 elements) holds.
pub fn scratch_rows(scratch: &[bf16], c: usize, v: usize) -> usize {
    2 * scratch.len() / scratch_bytes_per_row(c, v)
}

/// The parts of a chunk's scratch, `rows` rows each.
struct Parts<'a> {
    /// rows·V f32 logits; the same bytes hold rows·V bf16 `dlᵀ`, then rows·V bf16 `dl`.
    logits: &'a mut [f32],
    x: &'a mut [bf16],
}

fn carve(raw: &mut [bf16], rows: usize, c: usize, v: usize) -> Parts<'_> {
    assert!(
        rows >= 1,
        "the bf16 classifier's scratch holds at least one row"
    );
    let (logits, rest) = raw.split_at_mut(2 * rows * v);
    assert_eq!(
        logits.as_ptr() as usize % 4,
        0,
        "the scratch is 4-byte aligned"
    );
    // SAFETY: 2·rows·V bf16 are the bytes of rows·V f32, 4-byte aligned (checked), and every
    // bit pattern is an f32; the slice borrows `raw` for its lifetime.
    let logits = unsafe { std::slice::from_raw_parts_mut(logits.as_mut_ptr().cast(), rows * v) };
    Parts {
        logits,
        x: &mut rest[..rows * c],
    }
}

/// The same bytes as bf16 (the logits region reused for `dl`).
fn as_bf16(x: &mut [f32]) -> &mut [bf16] {
    // SAFETY: bf16 has no invalid bit patterns and a 2-byte alignment the f32 slice exceeds;
    // the result covers exactly the slice's bytes and borrows it.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), 2 * x.len()) }
}

/// logits (rows, V) f32 of `inp` (rows, C) against `wte` (V, C), into the first rows·V f32 of
/// `scratch` (the inputs rounded to bf16 inside it first): the forward-only head.
pub fn logits(scratch: &mut [bf16], inp: &[f32], wte: &[bf16], rows: usize, c: usize, v: usize) {
    assert!(inp.len() == rows * c && wte.len() == v * c);
    let p = carve(scratch, rows, c, v);
    f32_to_bf16(p.x, inp);
    crate::gemm_bf16::forward(p.logits, p.x, wte, None, rows, c, v);
}

/// Per-row losses (N) and `dloss * d(sum of losses)` accumulated into dinp (N,C) f32 and the
/// 2-byte dwte (V,C) (`None`: frozen; each chunk's part added and rounded once); inp (N,C) f32,
/// wte (V,C) bf16, targets (N), (N, C, V) = `shape`. Returns the sum of the losses. With
/// `shard`, over this rank's `v` rows of the vocabulary: the losses are the whole vocabulary's,
/// `dinp` this rank's partial input gradient (the caller sums it over the ranks).
pub fn forward_backward(
    io: Io<'_, bf16>,
    (n, c, v): (usize, usize, usize),
    dloss: f32,
    mut shard: Option<VocabShard<'_>>,
) -> f32 {
    let (losses, dinp, mut dwte, inp, wte, targets, scratch) = io.parts();
    let rows = scratch_rows(scratch, c, v);
    let rows = match &shard {
        Some(sh) => rows.min(sh.stats.len() / 3),
        None => rows,
    };
    match &shard {
        // Targets are global ids; this rank holds `v` of them.
        Some(_) => assert!(
            losses.len() == n && inp.len() == n * c && wte.len() == v * c && targets.len() == n
        ),
        None => {
            _ = check(
                (losses.len(), inp.len(), wte.len(), rows * v),
                targets,
                (n, c, v),
            )
        }
    }
    assert!(rows >= 1, "the scratch holds at least one row");
    let s = carve(scratch, rows, c, v);
    assert!(dinp.len() == n * c && dwte.as_ref().is_none_or(|d| d.len() == v * c));
    let mut sum = 0.0f64;
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        let x = &mut s.x[..cr * c];
        f32_to_bf16(x, &inp[i0 * c..(i0 + cr) * c]);
        let lt = &mut s.logits[..v * cr];
        gemm_nt(lt, wte, x, (v, cr, c), Accum::Replace);
        let (ls, ts) = (&mut losses[i0..i0 + cr], &targets[i0..i0 + cr]);
        sum += softmax_xent_cols(lt, ls, ts, dloss, shard.as_mut());
        let (dl_t, dl) = as_bf16(lt).split_at_mut(v * cr);
        transpose(dl, dl_t, v, cr);
        gemm_nn(
            &mut dinp[i0 * c..(i0 + cr) * c],
            dl,
            wte,
            (cr, c, v),
            Accum::Add,
        );
        if let Some(dwte) = dwte.as_deref_mut() {
            gemm_nn_bf16(dwte, dl_t, x, (v, c, cr), Accum::Add);
        }
    }
    sum as f32
}

/// logitsᵀ (V, w) of w rows: each column's loss into `losses` (w), and
/// `dlᵀ = bf16(dloss * (softmax - onehot))` (V, w) per column into the first half of `lt`'s
/// bytes. Returns the sum of the losses. With a vocabulary shard the max, the sums and the
/// target logits are reduced over the ranks (the sums as f32, as the ranks exchange them).
fn softmax_xent_cols(
    lt: &mut [f32],
    losses: &mut [f32],
    targets: &[u32],
    dloss: f32,
    mut shard: Option<&mut VocabShard<'_>>,
) -> f64 {
    let w = losses.len();
    let v = lt.len() / w;
    let first = shard.as_ref().map_or(0, |s| s.first);
    let own = |t: u32| (t as usize).checked_sub(first).filter(|&i| i < v);
    let mut target_logit: Vec<f32> = (targets.iter().enumerate())
        .map(|(j, &t)| own(t).map_or(0.0, |i| lt[i * w + j]))
        .collect();
    let mut max = lt
        .par_chunks(VB * w)
        .map(|blk| {
            let mut m = vec![f32::NEG_INFINITY; w];
            col_max(blk, &mut m);
            m
        })
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, &y)| *x = x.max(y));
            a
        })
        .expect("a vocabulary of at least one row");
    if let Some(sh) = shard.as_deref_mut() {
        (sh.reduce)(&mut max, RowReduce::Max);
    }
    // Block partial sums, added in block order: the same bits on any thread count.
    let partial: Vec<Vec<f64>> = lt
        .par_chunks_mut(VB * w)
        .map(|blk| {
            let mut s = vec![0.0f64; w];
            col_exp_sum(blk, &max, &mut s);
            s
        })
        .collect();
    let mut sums = vec![0.0f64; w];
    for p in &partial {
        sums.iter_mut().zip(p).for_each(|(s, &x)| *s += x);
    }
    if let Some(sh) = shard {
        let (sum32, target) = sh.stats[..2 * w].split_at_mut(w);
        sums.iter()
            .zip(sum32.iter_mut())
            .for_each(|(&s, d)| *d = s as f32);
        target.copy_from_slice(&target_logit);
        (sh.reduce)(&mut sh.stats[..2 * w], RowReduce::Sum);
        let (sum32, target) = sh.stats[..2 * w].split_at(w);
        sums.iter_mut()
            .zip(sum32)
            .for_each(|(d, &s)| *d = f64::from(s));
        target_logit.copy_from_slice(target);
    }
    let mut total = 0.0f64;
    let mut scale = vec![0.0f32; w];
    for j in 0..w {
        let lse = max[j] as f64 + sums[j].ln();
        losses[j] = (lse - target_logit[j] as f64) as f32;
        total += losses[j] as f64;
        scale[j] = (dloss as f64 / sums[j]) as f32;
    }
    // The targets' exponentials, before their bytes hold bf16 (the target logits are spent).
    let target_exp = &mut target_logit;
    for (j, &t) in targets.iter().enumerate() {
        if let Some(i) = own(t) {
            target_exp[j] = lt[i * w + j];
        }
    }
    // Each block rounds into the first half of its own bytes; the halves then move together.
    lt.par_chunks_mut(VB * w)
        .for_each(|blk| col_scale_round(blk, &scale));
    let dl_t = as_bf16(lt);
    for blk in 1..v.div_ceil(VB) {
        let (from, len) = (2 * blk * VB * w, VB.min(v - blk * VB) * w);
        dl_t.copy_within(from..from + len, blk * VB * w);
    }
    for (j, (&t, &e)) in targets.iter().zip(target_exp.iter()).enumerate() {
        if let Some(i) = own(t) {
            dl_t[i * w + j] = bf16::from_bits(bf16_bits(e * scale[j] - dloss));
        }
    }
    total
}

simd_fn! {
    /// max[j] = max over the block's rows of blk[r·w + j] (w = max.len()).
    fn col_max(blk: &[f32], max: &mut [f32]) = col_max_body;
}

#[inline(always)]
fn col_max_body<const FMA: bool>(blk: &[f32], max: &mut [f32]) {
    for row in blk.chunks_exact(max.len()) {
        for (m, &x) in max.iter_mut().zip(row) {
            *m = if x > *m { x } else { *m };
        }
    }
}

simd_fn! {
    /// blk[r·w + j] = exp(blk[r·w + j] - max[j]); sums[j] += each, in f64.
    fn col_exp_sum(blk: &mut [f32], max: &[f32], sums: &mut [f64]) = col_exp_sum_body;
}

#[inline(always)]
fn col_exp_sum_body<const FMA: bool>(blk: &mut [f32], max: &[f32], sums: &mut [f64]) {
    for row in blk.chunks_exact_mut(max.len()) {
        for ((x, &m), s) in row.iter_mut().zip(max).zip(sums.iter_mut()) {
            let e = exp_with::<FMA>(*x - m);
            *x = e;
            *s += e as f64;
        }
    }
}

simd_fn! {
    /// bf16 element r·w + j of blk's bytes = bf16(blk[r·w + j] · scale[j]): the block rounded
    /// into its own first half.
    fn col_scale_round(blk: &mut [f32], scale: &[f32]) = col_scale_round_body;
}

/// Columns per piece of [`col_scale_round`]: rounded on the stack, then stored.
const PIECE: usize = 256;

#[inline(always)]
fn col_scale_round_body<const FMA: bool>(blk: &mut [f32], scale: &[f32]) {
    let w = scale.len();
    let mut piece = [bf16::ZERO; PIECE];
    for r in 0..blk.len() / w {
        for j0 in (0..w).step_by(PIECE) {
            let at = r * w + j0;
            let cols = PIECE.min(w - j0);
            let src = &blk[at..at + cols];
            for ((d, &x), &s) in piece.iter_mut().zip(src).zip(&scale[j0..]) {
                *d = bf16::from_bits(bf16_bits(x * s));
            }
            // bf16 elements at..at + cols are the bytes of f32 elements at / 2 .. (at + cols) / 2,
            // all read already (this piece or before): nothing unread is overwritten.
            as_bf16(blk)[at..at + cols].copy_from_slice(&piece[..cols]);
        }
    }
}
