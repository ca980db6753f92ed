//! What ZeRO costs on 4 ranks: step time of each stage against stage 0, and the bytes each rank
//! moves per step (the comm crate's ring counters) against the ZeRO paper's 2Ψ (stages 0-2) and
//! 3Ψ (stage 3), both with the ring's (N−1)/N factor. Goal: stage 3 ≤ 1.15× stage 0.
//!
//! Each stage runs its 4 rank threads for a warm-up step and then STEPS timed steps; stages
//! alternate round by round (0, 1, 2, 3, 0, 1, ...) so a shared machine's load hits all alike, and
//! each ratio is the median over rounds. Prints a table; no assertions.
//! Run: `cargo bench -p engine --bench zero [-- RANKS ROUNDS]` (defaults 4 ranks, 5 rounds).

use comm::Collective;
use engine::ModelConfig;
use plan::model::Family;
use plan::setup::ZeroStage;
use plan::ModelShape;
use std::time::Instant;
use train::{TrainConfig, Trainer};

const STAGES: [ZeroStage; 4] = [
    ZeroStage::Zero0,
    ZeroStage::Zero1,
    ZeroStage::Zero2,
    ZeroStage::Zero3,
];

/// A small GPT-2: 4 blocks of width 256, a 4k vocabulary (blocks, not the classifier, dominate).
fn shape() -> ModelShape {
    ModelShape {
        name: "gpt2-bench".into(),
        family: Family::Gpt2,
        n_layers: 4,
        d_model: 256,
        n_heads: 4,
        n_kv_heads: 4,
        d_head: 64,
        d_ff: 1024,
        vocab: 4096,
        max_positions: 128,
        tied_embeddings: true,
        moe: None,
        mla: None,
        sliding_window: None,
    }
}

fn config(ranks: u32, zero: ZeroStage) -> TrainConfig {
    TrainConfig {
        ranks,
        zero,
        attention: plan::setup::Attention::Eager,
        ..TrainConfig::new(ModelConfig::from_shape(shape()).unwrap(), 2, 128)
    }
}

/// Seconds of one step (rank 0's wall time, after a warm-up) and rank 0's bytes sent in it.
fn measure(ranks: u32, zero: ZeroStage) -> (f64, u64) {
    let out = train::testkit::on_ranks(ranks as usize, |c| {
        let rank = c.rank() as u32;
        let mut t = Trainer::with_comm(config(ranks, zero), c).unwrap();
        t.init_weights(1);
        let step = |t: &mut Trainer| {
            t.step(&mut |x, y| {
                let n = x.len() as u32;
                (0..n).for_each(|i| x[i as usize] = (i * 7919 + rank) % 4096);
                (0..n).for_each(|i| y[i as usize] = (i * 104_729 + rank) % 4096);
            })
            .unwrap();
        };
        step(&mut t);
        let started = Instant::now();
        step(&mut t);
        (
            started.elapsed().as_secs_f64(),
            t.last_step_comm.total_sent_bytes(),
        )
    });
    out[0]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let ranks: u32 = args.first().map_or(4, |a| a.parse().expect("RANKS"));
    let rounds: usize = args.get(1).map_or(5, |a| a.parse().expect("ROUNDS"));
    let units = plan_frugal::param_units(&shape(), ranks).unwrap();
    let psi_bytes: u64 = units.iter().map(|u| 4 * u.padded_numel).sum();
    let threads = rayon::current_num_threads();
    println!(
        "gpt2-bench (4 x 256, vocab 4096, Ψ = {} parameters), {ranks} ranks of 2 x 128 tokens, \
         {threads} rayon threads, {rounds} rounds",
        psi_bytes / 4
    );
    let mut secs = vec![Vec::new(); STAGES.len()];
    let mut bytes = vec![0u64; STAGES.len()];
    for _ in 0..rounds {
        for (i, &zero) in STAGES.iter().enumerate() {
            let (s, b) = measure(ranks, zero);
            secs[i].push(s);
            bytes[i] = b;
        }
    }
    let ratios =
        |i: usize| -> Vec<f64> { secs[i].iter().zip(&secs[0]).map(|(a, b)| a / b).collect() };
    println!("stage  step ms (median)  vs stage 0  sent bytes/step  vs paper");
    let n = f64::from(ranks);
    for (i, zero) in STAGES.iter().enumerate() {
        let volumes = if *zero == ZeroStage::Zero3 { 3.0 } else { 2.0 };
        let paper = volumes * psi_bytes as f64 * (n - 1.0) / n;
        println!(
            "{:>5}  {:>15.1}  {:>9.3}x  {:>15}  {:>6.3}x {}Ψ(N-1)/N",
            *zero as u8,
            median(secs[i].clone()) * 1e3,
            median(ratios(i)),
            bytes[i],
            bytes[i] as f64 / paper,
            volumes
        );
    }
}
