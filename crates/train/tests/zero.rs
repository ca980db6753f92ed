//! ZeRO stages 0-3 on 1, 2 and 4 ranks (threads over the in-process communicator).
//!
//! Parity. With one micro-step, every stage reduces each unit's gradient as one rank-ordered sum
//! of the same per-rank values, computes the clipping norm from the same per-shard partial sums,
//! and updates element-wise, so stages 1-3 on N ranks are bit-identical to stage 0 on N ranks
//! (losses and every weight), recompute included. Against one rank of N×B rows the gradients
//! are summed across ranks instead of inside one kernel, so only the last bits may differ: 1e-5.
//! With K = 2 micro-steps stages 2-3 reduce-scatter every micro-step (a sum over ranks, then
//! over micro-steps) where stages 0-1 sum the micro-steps locally first: 1e-5 as well.
//!
//! Memory. Every rank measures exactly its plan: the peak, the breakdown at the peak and each
//! category's own peak; at stage 3 the persistent model state is 16Ψ/N bytes (Ψ padded elements).
//!
//! Communication. Per step and rank, stages 0-2 move 2(N−1)/N·Ψ bytes (plus the loss and norm
//! scalars), stage 3 the all-gathers of the forward (every unit, the tied embedding again for the
//! head) and of the backward (blocks), plus one reduce-scatter of Ψ.

mod common;

use comm::{Collective, CollectiveKind, CommStats};
use common::{
    assert_measured_equals_planned, config, deepseek_tiny, gpt2_tiny, llama_tiny, max_diff,
    mixtral_tiny, on_ranks, tokens,
};
use plan::setup::{Recompute, ZeroStage};
use plan::ModelShape;
use train::{TrainConfig, Trainer};

const SEQ: u64 = 16;
const ROWS: u64 = 4;
const STEPS: usize = 3;
const STAGES: [ZeroStage; 4] = [
    ZeroStage::Zero0,
    ZeroStage::Zero1,
    ZeroStage::Zero2,
    ZeroStage::Zero3,
];

/// What one run leaves: rank 0's losses, validation loss (on its own rows, so comparable at the
/// same rank count only) and full weights, and the bytes rank 0 moved in its last step.
struct Run {
    losses: Vec<f32>,
    val_loss: f32,
    weights: Vec<Vec<f32>>,
    step_comm: CommStats,
}

/// `STEPS` steps of `ROWS` global rows on `ranks` ranks at `zero`, checking on every rank that
/// the arena measured its plan and that all ranks agree.
fn run(cfg: &TrainConfig, ranks: u32, zero: ZeroStage) -> Run {
    let k = cfg.grad_accum as u64;
    let n = (ROWS * SEQ * k) as usize;
    let vocab = cfg.model.shape.vocab;
    let (x, y) = (tokens(n, vocab, 31), tokens(n, vocab, 32));
    let local = ROWS / u64::from(ranks);
    let mut cfg = cfg.clone();
    (cfg.batch, cfg.seq, cfg.ranks, cfg.zero) = (local, SEQ, ranks, zero);
    let mut out: Vec<Run> = on_ranks(ranks as usize, |c| {
        let rank = c.rank();
        let mut t = Trainer::with_comm(cfg.clone(), c).unwrap();
        t.init_weights(5);
        // Micro-step j of rank r takes rows (j·N + r)·B .. of the global batch.
        let rows = (local * SEQ) as usize;
        let mut micro = 0usize;
        let mut losses = Vec::new();
        let mut step_comm = CommStats::default();
        for _ in 0..STEPS {
            let before = t.comm_stats();
            let stats = t
                .step(&mut |i, o| {
                    let at = (micro % k as usize * ranks as usize + rank) * rows;
                    i.copy_from_slice(&x[at..at + rows]);
                    o.copy_from_slice(&y[at..at + rows]);
                    micro += 1;
                })
                .unwrap();
            step_comm = t.comm_stats().since(&before);
            losses.push(stats.loss);
        }
        check_memory(&t, rank);
        let val_loss = t.eval_loss(&x[..rows], &y[..rows]).unwrap();
        let weights = t.full_params().unwrap();
        Run {
            losses,
            val_loss,
            weights,
            step_comm,
        }
    });
    let l = &out[0].losses;
    assert!(l[STEPS - 1] < l[0], "training moves: {l:?}");
    for (rank, r) in out.iter().enumerate().skip(1) {
        assert_eq!(r.losses, out[0].losses, "rank {rank} saw another loss");
        assert_eq!(r.weights, out[0].weights, "rank {rank} holds other weights");
    }
    out.swap_remove(0)
}

fn check_memory(t: &Trainer, rank: usize) {
    let plan = &t.plan;
    let what = format!("rank {rank} at {:?}", t.sharding.stage());
    assert_measured_equals_planned(t, &what);
    if t.sharding.stage() == ZeroStage::Zero3 {
        let psi: u64 = t.model.units.iter().map(|u| u.padded_numel).sum();
        let state = plan.model_state_bytes();
        assert_eq!(state, 16 * psi / t.sharding.world as u64, "{what}: 16Ψ/N");
    }
}

fn close(a: &Run, b: &Run, what: &str) {
    for (x, y) in a.losses.iter().zip(&b.losses) {
        assert!((x - y).abs() < 1e-5, "{what}: loss {x} vs {y}");
    }
    let err = max_diff(&a.weights, &b.weights);
    assert!(err < 1e-5, "{what}: weights differ by {err:e}");
}

fn exact(a: &Run, b: &Run, what: &str) {
    assert_eq!(a.losses, b.losses, "{what}: losses");
    assert_eq!(
        a.val_loss.to_bits(),
        b.val_loss.to_bits(),
        "{what}: validation"
    );
    assert!(
        a.weights == b.weights,
        "{what}: weights differ by {:e}",
        max_diff(&a.weights, &b.weights)
    );
}

#[test]
fn every_stage_on_1_2_4_ranks_follows_the_single_rank_trajectory() {
    for shape in [gpt2_tiny(), llama_tiny(), mixtral_tiny(), deepseek_tiny()] {
        let cfg = config(shape.clone(), ROWS, SEQ);
        let single = run(&cfg, 1, ZeroStage::Zero0);
        for ranks in [1, 2, 4] {
            let stage0 = run(&cfg, ranks, ZeroStage::Zero0);
            // A rank's load-balancing loss is over its own rows (Mixtral's): the stages agree
            // bit for bit on a rank count, but not with one rank of the whole batch.
            if cfg.model.router_aux_coef == 0.0 {
                let what = format!("{} stage 0 x{ranks}", shape.name);
                close(&stage0, &single, &what);
            }
            for zero in &STAGES[1..] {
                let r = run(&cfg, ranks, *zero);
                exact(&r, &stage0, &format!("{} {zero:?} x{ranks}", shape.name));
                check_comm(&shape, &r.step_comm, ranks, *zero, 1);
            }
        }
    }
}

#[test]
fn recompute_and_accumulation_keep_parity_at_every_stage() {
    let shape = gpt2_tiny();
    let mut cfg = config(shape.clone(), ROWS, SEQ);
    cfg.recompute = Recompute::Full;
    let stage0 = run(&cfg, 4, ZeroStage::Zero0);
    for zero in &STAGES[1..] {
        let r = run(&cfg, 4, *zero);
        exact(&r, &stage0, &format!("full recompute {zero:?}"));
        check_comm(&shape, &r.step_comm, 4, *zero, 1);
    }
    cfg.recompute = Recompute::None;
    cfg.grad_accum = 2;
    let stage0 = run(&cfg, 2, ZeroStage::Zero0);
    exact(
        &run(&cfg, 2, ZeroStage::Zero1),
        &stage0,
        "accumulation stage 1",
    );
    for zero in [ZeroStage::Zero2, ZeroStage::Zero3] {
        let r = run(&cfg, 2, zero);
        close(&r, &stage0, &format!("accumulation {zero:?}"));
        check_comm(&shape, &r.step_comm, 2, zero, 2);
    }
}

/// The bytes of one step against the stage's formula.
fn check_comm(shape: &ModelShape, got: &CommStats, ranks: u32, zero: ZeroStage, k: u64) {
    let units = plan_frugal::param_units(shape, ranks).unwrap();
    let ring = |kind, bytes: u64| CommStats::ring_bytes(kind, bytes, ranks as usize);
    let (ag, rs) = (CollectiveKind::AllGather, CollectiveKind::ReduceScatter);
    let psi_bytes = |it: &mut dyn Iterator<Item = &plan_frugal::Unit>| -> u64 {
        it.map(|u| 4 * u.padded_numel).sum()
    };
    let (mut gathered, mut scattered) = (0, 0);
    for u in &units {
        let bytes = 4 * u.padded_numel;
        match zero {
            ZeroStage::Zero0 => {}
            ZeroStage::Zero1 => {
                (gathered, scattered) = (gathered + ring(ag, bytes), scattered + ring(rs, bytes))
            }
            ZeroStage::Zero2 => {
                (gathered, scattered) =
                    (gathered + ring(ag, bytes), scattered + k * ring(rs, bytes))
            }
            ZeroStage::Zero3 => {
                let backward = matches!(u.kind, plan_frugal::UnitKind::Block(_));
                let again =
                    backward || (u.kind == plan_frugal::UnitKind::Embed && shape.tied_embeddings);
                gathered += k * ring(ag, bytes) * if again { 2 } else { 1 };
                scattered += k * ring(rs, bytes);
            }
        }
    }
    let what = format!("{} {zero:?} x{ranks}", shape.name);
    assert_eq!(
        got.all_gather.sent_bytes, gathered,
        "{what}: all-gather bytes"
    );
    assert_eq!(
        got.reduce_scatter.sent_bytes, scattered,
        "{what}: reduce-scatter bytes"
    );
    let psi = psi_bytes(&mut units.iter());
    let reduced = if zero == ZeroStage::Zero0 {
        units
            .iter()
            .map(|u| ring(CollectiveKind::AllReduce, 4 * u.padded_numel))
            .sum()
    } else {
        0
    };
    // Besides the gradients, only the loss (4 bytes) and the norm (8 bytes) are all-reduced.
    let scalars = ring(CollectiveKind::AllReduce, 4) + ring(CollectiveKind::AllReduce, 8);
    assert_eq!(
        got.all_reduce.sent_bytes,
        reduced + scalars,
        "{what}: all-reduce bytes"
    );
    if ranks > 1 && k == 1 && zero != ZeroStage::Zero3 {
        let ratio = got.total_sent_bytes() as f64
            / (2.0 * psi as f64 * f64::from(ranks - 1) / f64::from(ranks));
        assert!((ratio - 1.0).abs() < 1e-3, "{what}: {ratio} × 2Ψ(N-1)/N");
    }
}

#[test]
fn overlapped_stage_3_is_the_blocking_one_bit_for_bit() {
    // The prefetch on the link's own thread (`overlap_comm`, the default) against blocking
    // gathers: the same bits, bytes moved and measured memory, in every form a gather holds
    // (fp32 widened, bf16 bits and vectors, fp16 bits widened in place), recompute included.
    let torch = train::precision::ScalerConfig::Torch(Default::default());
    let cases = [
        (gpt2_tiny(), train::Mixed::fp32(), Recompute::None),
        (llama_tiny(), train::Mixed::bf16(), Recompute::Full),
        (gpt2_tiny(), train::Mixed::fp16(torch), Recompute::None),
    ];
    for (shape, mixed, recompute) in cases {
        let mut cfg = config(shape.clone(), ROWS, SEQ);
        (cfg.mixed, cfg.recompute) = (mixed.clone(), recompute);
        let overlapped = run(&cfg, 2, ZeroStage::Zero3);
        cfg.overlap_comm = false;
        let blocking = run(&cfg, 2, ZeroStage::Zero3);
        let what = format!("{} {:?} {recompute:?}", shape.name, mixed.precision);
        exact(&overlapped, &blocking, &what);
        assert_eq!(overlapped.step_comm, blocking.step_comm, "{what}");
    }
}

#[test]
fn a_rank_that_fails_mid_gather_stops_the_others() {
    let mut cfg = config(gpt2_tiny(), 1, SEQ);
    (cfg.ranks, cfg.zero) = (2, ZeroStage::Zero3);
    let results: Vec<Result<(), engine::EngineError>> = on_ranks(2, |c| {
        let rank = c.rank();
        let mut t = Trainer::with_comm(cfg.clone(), c)?;
        t.init_weights(1);
        let step = |t: &mut Trainer, bad: u32| {
            t.step(&mut |i, o| {
                i.fill(bad);
                o.fill(1);
            })
        };
        step(&mut t, 3)?;
        // In step 2, rank 1's batch holds an id beyond the vocabulary: it returns before its
        // first gather, while rank 0 waits in it.
        step(&mut t, if rank == 1 { 96 } else { 3 }).map(|_| ())
    });
    common::assert_rank_failure_named(&results, 1);
}
