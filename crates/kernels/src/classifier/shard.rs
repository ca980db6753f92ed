//! The vocab-parallel fused classifier (Megatron's `vocab_parallel_cross_entropy`, chunked as
//! [`super::forward_backward`]): each rank holds the rows `first..first + V` of the output
//! projection, computes its (chunk_rows, V) slice of the logits and never sees another's. Per
//! chunk three reductions over the ranks make the softmax whole: the row maximum (max), then the
//! sum of exponentials and the target's logit (sum; the rank holding the target contributes it,
//! the others zero). Each rank then turns its slice into `dloss * (softmax - onehot)` and
//! accumulates its partial input gradient (the caller sums `dinp` over the ranks) and its own
//! rows of the weight gradient.
//!
//! The reductions are the caller's (`reduce`), so the kernel knows no communicator; one rank with
//! an identity `reduce` is the unsharded classifier up to rounding.

use super::{chunk_backward, chunk_logits, scale_row, Io, VocabShard};
use crate::fastmath::{exp_shifted_sum, row_max};
use rayon::prelude::*;

/// How `reduce` combines a statistics slice over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowReduce {
    Max,
    Sum,
}

/// Runs the vocab-parallel classifier over `n` rows of width `c` against this rank's `v` rows
/// (`io.wte`, its gradient `io.dwte`) starting at id `shard.first`; `io.dinp` is this rank's
/// partial input gradient, `io.targets` the global ids. Returns the sum of the losses (every
/// rank the same).
pub fn forward_backward(
    io: Io<'_, f32>,
    (n, c, v): (usize, usize, usize),
    dloss: f32,
    shard: VocabShard<'_>,
) -> f32 {
    let (losses, dinp, mut dwte, inp, wte, targets, scratch) = io.parts();
    let VocabShard {
        first,
        stats,
        reduce,
    } = shard;
    assert!(losses.len() == n && inp.len() == n * c && wte.len() == v * c && targets.len() == n);
    assert!(dinp.len() == n * c && dwte.as_ref().is_none_or(|d| d.len() == v * c));
    let rows = (scratch.len() / v).min(stats.len() / 3);
    assert!(rows >= 1, "scratch and stats hold at least one row");
    let own = |tgt: u32| (tgt as usize).checked_sub(first).filter(|&i| i < v);
    let mut total = 0.0f64;
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        let x = &inp[i0 * c..(i0 + cr) * c];
        let logits = &mut scratch[..cr * v];
        chunk_logits(logits, x, wte, cr, c, v);
        let tgts = &targets[i0..i0 + cr];
        let (max, rest) = stats.split_at_mut(cr);
        (logits.par_chunks(v).zip(max.par_iter_mut())).for_each(|(row, m)| *m = row_max(row));
        reduce(max, RowReduce::Max);
        let (sums, rest) = rest.split_at_mut(cr);
        let target = &mut rest[..cr];
        (logits.par_chunks_mut(v).zip(sums.par_iter_mut()))
            .zip(target.par_iter_mut().zip(tgts.par_iter()))
            .zip(max.par_iter())
            .for_each(|(((row, sum), (t, &tgt)), &m)| {
                *t = own(tgt).map_or(0.0, |i| row[i]);
                *sum = exp_shifted_sum(row, m) as f32;
            });
        reduce(&mut stats[cr..3 * cr], RowReduce::Sum);
        let (max, rest) = stats.split_at(cr);
        let (sums, target) = rest.split_at(cr);
        for i in 0..cr {
            let loss = f64::from(max[i]) + f64::from(sums[i]).ln() - f64::from(target[i]);
            losses[i0 + i] = loss as f32;
            total += f64::from(losses[i0 + i]);
        }
        (logits.par_chunks_mut(v).zip(sums.par_iter()))
            .zip(tgts.par_iter())
            .for_each(|((row, &sum), &tgt)| {
                scale_row(row, (f64::from(dloss) / f64::from(sum)) as f32);
                if let Some(i) = own(tgt) {
                    row[i] -= dloss;
                }
            });
        let dx = &mut dinp[i0 * c..(i0 + cr) * c];
        chunk_backward(logits, x, wte, (dx, dwte.as_deref_mut()), (cr, c, v));
    }
    total as f32
}
