//! Plan speed: how many training and inference plans the formula runtime answers per second, and
//! the phase-timeline sweep against the plain per-phase scan it replaced (baseline, same run).
//!
//! `fit` weighs over 10,000 setups a second, so one plan must take well under 100 µs.
//! Run: `cargo bench -p plan --bench plan_speed` (prints one line per case).

use plan::setup::*;
use plan::{formula, infer, presets, Device, Lifetime, MemoryPlan, Phase};
use std::hint::black_box;
use std::time::Instant;

fn setup() -> TrainSetup {
    TrainSetup {
        zero: ZeroStage::Zero3,
        dp: 8,
        recompute: Recompute::Sqrt,
        ..TrainSetup::new(4, 2048)
    }
}

/// Runs `f` `n` times and returns seconds per call (best of three rounds).
fn time<F: FnMut()>(n: u32, mut f: F) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(start.elapsed().as_secs_f64() / n as f64);
    }
    best
}

/// The baseline: the peak found by scanning every buffer at every phase (O(phases × buffers)).
fn naive_peak(plan: &MemoryPlan) -> u64 {
    let n = plan.n_layers;
    Phase::training_timeline(n)
        .into_iter()
        .map(|p| {
            let o = p.ordinal(n);
            plan.buffers
                .iter()
                .filter(|b| b.device == Device::Gpu)
                .filter(|b| match b.lifetime {
                    Lifetime::Persistent => true,
                    Lifetime::Span { born, dies } => born.ordinal(n) <= o && o <= dies.ordinal(n),
                })
                .map(|b| b.bytes)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

fn main() {
    println!("case                                   per call     per second   vs baseline");
    for name in [
        "gpt2-124m",
        "llama3.1-8b",
        "llama3.1-70b",
        "llama3.1-405b",
        "deepseek-v3",
    ] {
        let model = presets::by_name(name).unwrap();
        let s = TrainSetup {
            seq: 2048.min(model.max_positions),
            ..setup()
        };
        let est_s = time(2000, || {
            black_box(formula::training_estimate(black_box(&model), black_box(&s)).unwrap());
        });
        let plan = formula::training_plan(&model, &s).unwrap();
        assert_eq!(naive_peak(&plan), plan.peak_bytes(Device::Gpu));
        let sweep_s = time(2000, || {
            black_box(black_box(&plan).peak_bytes(Device::Gpu));
        });
        let naive_s = time(2000, || {
            black_box(naive_peak(black_box(&plan)));
        });
        println!(
            "train {name:<32} {:>8.1} µs {:>12.0}   peak sweep {:.1}× faster than scan ({} buffers)",
            est_s * 1e6,
            1.0 / est_s,
            naive_s / sweep_s,
            plan.buffers.len()
        );
        let inf = InferSetup {
            weight_group: Some(128),
            kv_block: Some(16),
            ..InferSetup::new(Dtype::Int4, Dtype::Fp8, 8, 4096.min(model.max_positions))
        };
        let inf_s = time(2000, || {
            black_box(infer::inference_estimate(black_box(&model), black_box(&inf)).unwrap());
        });
        println!(
            "infer {name:<32} {:>8.1} µs {:>12.0}",
            inf_s * 1e6,
            1.0 / inf_s
        );
    }
}
