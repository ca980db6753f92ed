//! `frugal bench pipeline`: the 1F1B schedule's bubble, measured. `--stages P` thread ranks,
//! each a pipeline stage with its own one-thread pool (one core per stage where the machine has
//! them), train a model whose stages cost about the same (a Llama-style stack of `--layers`
//! blocks, small vocabulary, random tokens) for `--steps` steps of m micro-batches, for each m of
//! `--micro`. A stage's idle fraction is the part of the schedule's window (the longest
//! stage's time in the schedule; every stage starts it together) it did not compute: its
//! waits inside exchanges with its neighbours, and the tail after it finished. It is shown
//! beside the bubble of a balanced 1F1B pipeline, (p − 1)/(m + p − 1), from the same run.
//!
//! Example: `frugal bench pipeline --stages 2 --micro 2,4,8 --json`.

use anyhow::Context;
use comm::Collective;
use engine::ModelConfig;
use plan::model::{Family, ModelShape};
use serde_json::json;
use train::{TrainConfig, Trainer};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Pipeline stages (thread ranks).
    #[arg(long, default_value_t = 2)]
    pub stages: u32,
    /// Micro-batches per step to measure, comma-separated.
    #[arg(long, default_value = "2,4,8", value_delimiter = ',')]
    pub micro: Vec<u32>,
    /// Blocks of the model (split evenly over the stages).
    #[arg(long, default_value_t = 8)]
    pub layers: u32,
    /// Hidden size of the model (wide enough that the GEMMs, not the stash copies, are the
    /// stages' work).
    #[arg(long, default_value_t = 512)]
    pub d_model: u64,
    #[arg(long, default_value_t = 4)]
    pub batch: u64,
    #[arg(long, default_value_t = 128)]
    pub seq: u64,
    /// Timed steps per m (after one untimed warm-up step).
    #[arg(long, default_value_t = 3)]
    pub steps: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A Llama-style model whose classifier costs a fraction of a block (vocabulary 512), so the
/// stages are balanced and the bubble is the schedule's.
fn model(a: &Args) -> ModelShape {
    ModelShape {
        name: format!("pipeline-bench-{}x{}", a.layers, a.d_model),
        family: Family::Llama,
        n_layers: a.layers,
        d_model: a.d_model,
        n_heads: 4,
        n_kv_heads: 4,
        d_head: a.d_model / 4,
        d_ff: a.d_model * 8 / 3 / 64 * 64,
        vocab: 512,
        max_positions: a.seq,
        tied_embeddings: false,
        moe: None,
        mla: None,
        sliding_window: None,
    }
}

/// Each stage's (idle, scheduled) seconds over the timed steps with `m` micro-batches.
fn measure(a: &Args, m: u32) -> anyhow::Result<Vec<(f64, f64)>> {
    let shape = model(a);
    let mut cfg = TrainConfig::new(ModelConfig::from_shape(shape.clone())?, a.batch, a.seq);
    (cfg.ranks, cfg.pp, cfg.grad_accum) = (a.stages, a.stages, m);
    let run = |c: Box<dyn Collective>| -> anyhow::Result<(f64, f64)> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        pool.install(|| {
            let mut t = Trainer::with_comm(cfg.clone(), c)?;
            t.init_weights(7);
            let mut rng = data::SplitMix64::new(11);
            let mut next = |x: &mut [u32], y: &mut [u32]| {
                for v in x.iter_mut().chain(y.iter_mut()) {
                    *v = rng.next_below(shape.vocab) as u32;
                }
            };
            t.step(&mut next)?;
            let (idle0, total0) = t.pipeline_time().context("a pipeline stage")?;
            for _ in 0..a.steps {
                t.step(&mut next)?;
            }
            let (idle, total) = t.pipeline_time().context("a pipeline stage")?;
            Ok(((idle - idle0).as_secs_f64(), (total - total0).as_secs_f64()))
        })
    };
    let timeout = std::time::Duration::from_secs(120);
    let is_comm = |e: &anyhow::Error| {
        matches!(
            e.downcast_ref::<engine::EngineError>(),
            Some(engine::EngineError::Comm(_))
        )
    };
    engine::world::launch(a.stages as usize, timeout, run, is_comm)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.stages < 2 || a.stages > a.layers {
        anyhow::bail!(
            "--stages {} over --layers {}: a pipeline needs 2 or more stages and a layer each",
            a.stages,
            a.layers
        );
    }
    if a.micro.contains(&0) {
        anyhow::bail!("--micro 0: every step runs at least one micro-batch");
    }
    let cpu = crate::generate::cpu_name();
    let p = f64::from(a.stages);
    let mut rows = Vec::new();
    for &m in &a.micro {
        let stages = measure(&a, m)?;
        let bubble = (p - 1.0) / (f64::from(m) + p - 1.0);
        // Every stage starts its schedule together (the last step's norm all-reduce lines them
        // up); the window is the longest stage's, a stage's idle what it did not compute in it.
        let window = stages.iter().map(|s| s.1).fold(0.0, f64::max);
        let idle: Vec<f64> = stages.iter().map(|(i, t)| 1.0 - (t - i) / window).collect();
        rows.push((m, bubble, idle));
    }
    if a.json {
        let rows: Vec<_> = (rows.iter())
            .map(|(m, bubble, idle)| json!({"micro_batches": m, "bubble": bubble, "idle_fraction": idle}))
            .collect();
        let out = json!({"stages": a.stages, "model": model(&a).name, "cpu": cpu, "runs": rows});
        println!("{out}");
        return Ok(());
    }
    println!(
        "1F1B over {} stages of {} ({} x {} tokens per micro-batch), {}",
        a.stages,
        model(&a).name,
        a.batch,
        a.seq,
        cpu
    );
    let mut table = term::Table::new(&["micro-batches", "(p-1)/(m+p-1)", "idle per stage"]);
    for (m, bubble, idle) in &rows {
        let idle: Vec<String> = idle.iter().map(|f| format!("{:.1}%", 100.0 * f)).collect();
        table.row(vec![
            m.to_string(),
            format!("{:.1}%", 100.0 * bubble),
            idle.join("  "),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}
