//! Flash against materialised attention inside the model: step time and the arena's measured
//! activation peak (equal to the plan's) of a whole training step, for T = 256…2048, in one run.
//! The kernels' own bench (`cargo bench -p kernels --bench attention`) times attention alone.
//!
//! Model: GPT-2 124M's blocks (C 768, NH 12, HD 64, V 50257) with L blocks (default 4, to keep
//! T = 2048 quick on 2 cores) and positions extended to the longest T; batch 1; no recompute.
//! Prints a table; no assertions.
//! Run: `cargo bench -p engine --bench attention [-- LAYERS T...]`.

use engine::ModelConfig;

use plan::buffer::Category;
use plan::setup::{Attention, Recompute};
use plan::ModelShape;
use std::time::Instant;
use train::{Schedule, TrainConfig, Trainer};

const STEPS: usize = 2;

/// Median seconds of `STEPS` steps after a warm-up, and the measured activation peak in bytes.
fn measure(shape: &ModelShape, seq: u64, attention: Attention) -> (f64, u64) {
    let cfg = TrainConfig {
        schedule: Schedule::constant(1e-4),
        recompute: Recompute::None,
        attention,
        ..TrainConfig::new(ModelConfig::from_shape(shape.clone()).unwrap(), 1, seq)
    };
    let mut t = Trainer::new(cfg).expect("a runnable setup");
    t.init_weights(1);
    let n = t.micro_tokens() as u32;
    let x: Vec<u32> = (0..n).map(|i| i.wrapping_mul(7919) % 50257).collect();
    let y: Vec<u32> = (0..n).map(|i| i.wrapping_mul(104_729) % 50257).collect();
    let mut feed = |i: &mut [u32], o: &mut [u32]| {
        i.copy_from_slice(&x);
        o.copy_from_slice(&y);
    };
    t.step(&mut feed).expect("warm-up step");
    let mut secs: Vec<f64> = (0..STEPS)
        .map(|_| {
            let started = Instant::now();
            t.step(&mut feed).expect("timed step");
            started.elapsed().as_secs_f64()
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    let acts = t.measured().category_peak_bytes[Category::Activations as usize];
    (secs[STEPS / 2], acts)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let layers = args.first().copied().unwrap_or(4) as u32;
    let ts = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        vec![256, 512, 1024, 2048]
    };
    let mut shape = plan::presets::by_name("gpt2-124m").unwrap();
    shape.n_layers = layers;
    shape.max_positions = shape.max_positions.max(*ts.iter().max().unwrap());
    let threads = rayon::current_num_threads();
    println!(
        "GPT-2 124M blocks x {layers}, batch 1, {threads} threads; step = forward + backward + \
         AdamW, median of {STEPS} after a warm-up; activations = measured peak (== plan)"
    );
    println!(
        "{:>6} {:>10} {:>10} {:>8} {:>12} {:>12} {:>9}",
        "T", "naive ms", "flash ms", "speedup", "naive MiB", "flash MiB", "mem ratio"
    );
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for t in ts {
        let (naive_s, naive_b) = measure(&shape, t, Attention::Eager);
        let (flash_s, flash_b) = measure(&shape, t, Attention::Flash);
        println!(
            "{t:>6} {:>10.0} {:>10.0} {:>7.2}x {:>12.1} {:>12.1} {:>8.2}x",
            naive_s * 1e3,
            flash_s * 1e3,
            naive_s / flash_s,
            mib(naive_b),
            mib(flash_b),
            naive_b as f64 / flash_b as f64
        );
    }
}
