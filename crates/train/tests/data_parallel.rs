//! Data parallelism at ZeRO stage 0: N ranks (threads joined by the in-process communicator) of
//! B rows each follow the trajectory of one rank of N×B rows, and each rank's measured memory is
//! its plan (dp = N) to the byte. Mixtral runs without its load-balancing loss here (a rank's
//! is over its own rows, as under HF + DDP, so it is not the big batch's).

mod common;

use comm::Collective;
use common::{
    assert_measured_equals_planned, config, deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny,
    on_ranks, tokens,
};
use engine::io::{HfTensor, Which};
use plan::ModelShape;
use train::Trainer;

const SEQ: u64 = 16;

/// Losses of 3 steps and the final weights, for `ranks` ranks of `rows / ranks` rows each.
fn run(shape: &ModelShape, ranks: u32, rows: u64) -> (Vec<f32>, Vec<HfTensor>) {
    let n = (rows * SEQ) as usize;
    let (x, y) = (tokens(n, shape.vocab, 21), tokens(n, shape.vocab, 22));
    let local = rows / u64::from(ranks);
    let mut cfg = config(shape.clone(), local, SEQ);
    cfg.ranks = ranks;
    // Each rank's load-balancing loss is its own rows' (as HF's under DDP): not the whole
    // batch's, so a mixture of experts follows one rank's trajectory only without it.
    cfg.model.router_aux_coef = 0.0;
    let mut out: Vec<(Vec<f32>, Vec<HfTensor>)> = on_ranks(ranks as usize, |c| {
        let rank = c.rank();
        let mut t = Trainer::with_comm(cfg.clone(), c).unwrap();
        t.init_weights(5);
        // Rank r takes rows r*B..(r+1)*B of the global batch.
        let span = (rank as u64 * local * SEQ) as usize..((rank as u64 + 1) * local * SEQ) as usize;
        let mut losses = Vec::new();
        for _ in 0..3 {
            let s = t
                .step(&mut |i, o| {
                    i.copy_from_slice(&x[span.clone()]);
                    o.copy_from_slice(&y[span.clone()]);
                })
                .unwrap();
            losses.push(s.loss);
        }
        assert_measured_equals_planned(&t, &format!("rank {rank}"));
        (losses, t.export(Which::Params))
    });
    for (rank, (losses, weights)) in out.iter().enumerate().skip(1) {
        assert_eq!(losses, &out[0].0, "rank {rank} saw another loss");
        assert_eq!(weights, &out[0].1, "rank {rank} holds other weights");
    }
    out.swap_remove(0)
}

#[test]
fn two_and_four_ranks_follow_the_single_rank_trajectory() {
    for shape in [gpt2_tiny(), llama_tiny(), mixtral_tiny(), deepseek_tiny()] {
        let (losses_1, weights_1) = run(&shape, 1, 4);
        for ranks in [2, 4] {
            let (losses, weights) = run(&shape, ranks, 4);
            // The same tokens and normalisation; gradients are summed across ranks in rank order
            // instead of inside one GEMM, so only the last bits may differ.
            for (a, b) in losses.iter().zip(&losses_1) {
                assert!((a - b).abs() < 1e-5, "{} ranks: loss {a} vs {b}", ranks);
            }
            for (a, b) in weights.iter().zip(&weights_1) {
                let err = a
                    .data
                    .iter()
                    .zip(&b.data)
                    .map(|(p, q)| (p - q).abs())
                    .fold(0.0, f32::max);
                assert!(err < 1e-5, "{} ranks: {} differs by {err:e}", ranks, a.name);
            }
        }
    }
}

#[test]
fn a_rank_that_fails_stops_the_others_with_an_error_not_a_hang() {
    let mut cfg = config(gpt2_tiny(), 1, SEQ);
    cfg.ranks = 2;
    // Rank 1's batch holds an id beyond the vocabulary.
    let results = on_ranks(2, |c| common::step_with_rank_1_bad(cfg.clone(), c, |_| 1));
    common::assert_rank_failure_named(&results, 1);
}
