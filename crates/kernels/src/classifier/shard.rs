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

use super::{chunk_backward, chunk_logits, scale_row};
use crate::fastmath::{exp_shifted_sum, row_max};
use rayon::prelude::*;

/// How `reduce` combines a statistics slice over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowReduce {
    Max,
    Sum,
}

/// The slices a rank's classifier reads and writes: per-row losses (N, the same on every rank
/// once reduced), the partial input gradient dinp (N, C), its weight gradient (V, C) (`None`:
/// frozen), inp (N, C), its weight rows wte (V, C), the global targets (N), scratch
/// (chunk_rows, V) and `stats` (3 × chunk_rows).
pub struct Shard<'a> {
    pub losses: &'a mut [f32],
    pub dinp: &'a mut [f32],
    pub dwte: Option<&'a mut [f32]>,
    pub inp: &'a [f32],
    pub wte: &'a [f32],
    pub targets: &'a [u32],
    pub scratch: &'a mut [f32],
    pub stats: &'a mut [f32],
}

/// Runs the vocab-parallel classifier over `n` rows of width `c` against this rank's `v` rows
/// starting at id `first`; returns the sum of the losses (every rank the same).
pub fn forward_backward(
    s: Shard<'_>,
    (n, c, v): (usize, usize, usize),
    first: usize,
    dloss: f32,
    reduce: &mut dyn FnMut(&mut [f32], RowReduce),
) -> f32 {
    let Shard {
        losses,
        dinp,
        mut dwte,
        inp,
        wte,
        targets,
        scratch,
        stats,
    } = s;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn two_vocabulary_shards_give_the_whole_classifiers_loss_and_gradients() {
        let (n, c, v, chunk) = (37, 8, 29, 16);
        let mut rng = Rng::new(3);
        let inp = to_f32(&rng.vec(n * c));
        let wte = to_f32(&rng.vec(v * c));
        let targets: Vec<u32> = (0..n).map(|_| rng.below(v as u32)).collect();
        let dloss = 1.0 / n as f32;
        let (mut losses, mut dinp, mut dwte) = (vec![0.0; n], vec![0.0; n * c], vec![0.0; v * c]);
        let mut scratch = vec![0.0; chunk * v];
        let whole = super::super::forward_backward(
            &mut losses,
            &mut dinp,
            Some(&mut dwte),
            &inp,
            &wte,
            &targets,
            &mut scratch,
            n,
            c,
            v,
            dloss,
        );
        let shards = [(0usize, 15usize), (15, 14)];
        let ranks = TwoRanks::new();
        let results: Vec<_> = std::thread::scope(|s| {
            let joins: Vec<_> = (shards.iter().enumerate())
                .map(|(r, &(first, rows))| {
                    let (inp, wte, targets) = (&inp, &wte, &targets);
                    let ranks = &ranks;
                    s.spawn(move || {
                        let mut reduce = |buf: &mut [f32], op| ranks.reduce(r, buf, op);
                        let (mut losses, mut dinp) = (vec![0.0; n], vec![0.0; n * c]);
                        let mut dwte = vec![0.0; rows * c];
                        let (mut scratch, mut stats) =
                            (vec![0.0; chunk * rows], vec![0.0; 3 * chunk]);
                        let shard = Shard {
                            losses: &mut losses,
                            dinp: &mut dinp,
                            dwte: Some(&mut dwte),
                            inp,
                            wte: &wte[first * c..(first + rows) * c],
                            targets,
                            scratch: &mut scratch,
                            stats: &mut stats,
                        };
                        let sum = forward_backward(shard, (n, c, rows), first, dloss, &mut reduce);
                        (sum, losses, dinp, dwte)
                    })
                })
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let rel = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-3);
        for (sum, l, _, _) in &results {
            assert!(rel(*sum, whole) < 1e-5, "{sum} vs {whole}");
            (l.iter().zip(&losses)).for_each(|(a, b)| assert!(rel(*a, *b) < 1e-5));
        }
        let dinp_sum: Vec<f32> = (results[0].2.iter().zip(&results[1].2))
            .map(|(a, b)| a + b)
            .collect();
        let dwte_cat: Vec<f32> = [results[0].3.clone(), results[1].3.clone()].concat();
        assert_close("dinp", &to_f64(&dinp_sum), &to_f64(&dinp), 1e-5);
        assert_close("dwte", &to_f64(&dwte_cat), &to_f64(&dwte), 1e-5);
    }
}
