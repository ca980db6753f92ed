//! What recompute costs: step time of each `--recompute` policy against `none`, measured in the
//! same run on the same model and batch, with the activation peak the arena measured (equal to
//! the plan's). Full recompute runs one more forward of every block (target ≤ 1.35× the step
//! time of none); selective reruns only norms, the attention core and the MLP activation.
//!
//! Each policy's steps alternate with steps of a `none` trainer kept alive beside it, so a shared
//! machine's load hits both alike; the ratio is the median over those pairs. Prints a table; no
//! assertions. Run: `cargo bench -p engine --bench recompute [-- MODEL BATCH SEQ STEPS ATTENTION]`
//! (defaults: gpt2-124m 4 256 3 naive; ATTENTION is naive or flash).

use engine::ModelConfig;

use plan::buffer::Category;
use plan::setup::{Attention, Recompute};
use std::time::Instant;
use train::{Schedule, TrainConfig, Trainer};

/// A trainer fed the same fixed batch every step.
struct Run {
    trainer: Trainer,
    x: Vec<u32>,
    y: Vec<u32>,
}

impl Run {
    fn new(cfg: TrainConfig) -> Run {
        let vocab = cfg.model.shape.vocab.min(50257) as u32;
        let mut trainer = Trainer::new(cfg).expect("a runnable setup");
        trainer.init_weights(1);
        let n = trainer.micro_tokens() as u32;
        let x = (0..n).map(|i| i.wrapping_mul(7919) % vocab).collect();
        let y = (0..n).map(|i| i.wrapping_mul(104_729) % vocab).collect();
        let mut run = Run { trainer, x, y };
        run.step(); // warm-up
        run.trainer.timings = train::Timings::default();
        run
    }

    /// Seconds of one optimizer step.
    fn step(&mut self) -> f64 {
        let (x, y) = (&self.x, &self.y);
        let started = Instant::now();
        self.trainer
            .step(&mut |i, o| {
                i.copy_from_slice(x);
                o.copy_from_slice(y);
            })
            .expect("a step");
        started.elapsed().as_secs_f64()
    }

    fn activations_bytes(&self) -> u64 {
        self.trainer.measured().category_peak_bytes[Category::Activations as usize]
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn name(r: Recompute) -> String {
    match r {
        Recompute::Every(k) => format!("every:{k}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let model = arg(0, "gpt2-124m");
    let (batch, seq) = (arg(1, "4").parse().unwrap(), arg(2, "256").parse().unwrap());
    let steps: usize = arg(3, "3").parse().unwrap();
    let attention = match arg(4, "naive").as_str() {
        "flash" => Attention::Flash,
        _ => Attention::Eager,
    };
    let shape = plan::presets::by_name(&model).expect("a preset name");
    let config = |recompute| TrainConfig {
        schedule: Schedule::constant(1e-4),
        recompute,
        attention,
        ..TrainConfig::new(ModelConfig::from_shape(shape.clone()).unwrap(), batch, seq)
    };
    let threads = rayon::current_num_threads();
    println!(
        "{model} batch {batch} seq {seq} attention {attention:?}, {threads} threads; steps of \
         each policy alternate with steps of none ({steps} pairs after a warm-up): x none is the \
         median of the pairs' ratios; extra fwd = (backward blocks - none's) / none's forward blocks"
    );
    println!(
        "{:>10} {:>10} {:>8} {:>10} {:>16} {:>8}",
        "recompute", "step ms", "x none", "extra fwd", "activations MiB", "x none"
    );
    let mut none = Run::new(config(Recompute::None));
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for r in [
        Recompute::Selective,
        Recompute::Full,
        Recompute::Every(2),
        Recompute::Sqrt,
    ] {
        let mut run = Run::new(config(r));
        none.trainer.timings = train::Timings::default();
        let (mut secs, mut ratios) = (Vec::new(), Vec::new());
        for _ in 0..steps {
            let base = none.step();
            let s = run.step();
            secs.push(s);
            ratios.push(s / base);
        }
        let (t, t0) = (run.trainer.timings, none.trainer.timings);
        let extra = (t.backward_blocks.as_secs_f64() - t0.backward_blocks.as_secs_f64())
            / t0.forward_blocks.as_secs_f64();
        let (acts, acts0) = (run.activations_bytes(), none.activations_bytes());
        println!(
            "{:>10} {:>10.0} {:>7.2}x {:>10.2} {:>16.1} {:>7.2}x",
            name(r),
            median(secs) * 1e3,
            median(ratios),
            extra,
            mib(acts),
            acts as f64 / acts0 as f64
        );
    }
    println!(
        "{:>10} {:>30.1} MiB of activations",
        "none",
        mib(none.activations_bytes())
    );
}
