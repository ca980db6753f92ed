//! `frugal bench`: the engine's speed beside a baseline measured in the same run.
//!
//! `frugal bench train`: training throughput of the engine for a given shape, in tokens/s and
//! achieved GFLOP/s, with where the time goes, and optionally PyTorch's throughput on the same
//! model measured in the same run (`--baseline pytorch` runs dev/bench_pytorch.py), as a ratio.
//!
//! FLOPs per token follow the PaLM/nanoGPT convention: 6·N for the matmuls of forward and
//! backward (N = parameters except the position table; a tied token embedding counts once, as the
//! classifier; a mixture of experts counts its active experts only), plus 12·L·(NH·HD)·T for
//! attention scores and their weighted sum (latent attention: 6·L·NH·T·(qk + v)). Random token ids
//! are used: throughput does not depend on the text.
//!
//! `--precision bf16|fp16` times the mixed-precision step `frugal train --precision` runs (2-byte
//! weights and gradients, fp32 master weights; bf16 matmuls through `kernels::gemm_bf16`).
//!
//! Example: `frugal bench train --model gpt2-124m --batch 4 --seq 256 --steps 5 --baseline pytorch`,
//! or `frugal bench train --precision bf16` against `--precision fp32` for the bf16 speed-up.

mod comm;
mod generate;
mod pipeline;
mod python;
mod quality;
mod serve;
mod serve_http;

use anyhow::{bail, Context};
use engine::ModelConfig;
use plan::model::Family;
use plan::setup::{Attention, Precision, Recompute};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use train::Mixed;
use train::{Schedule, TrainConfig, Trainer};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand)]
pub enum What {
    /// Training throughput (tokens/s, GFLOP/s) for a model shape, optionally against PyTorch.
    Train(TrainArgs),
    /// Decode speed of random weights in a storage format against the measured memory bandwidth.
    Generate(generate::Args),
    /// Continuous batching over a synthetic request trace: throughput, latency, KV waste.
    Serve(serve::Args),
    /// What weight and KV quantization cost a trained model: KL vs fp32 and validation loss.
    Quality(quality::Args),
    /// The all-reduce of thread or MPI ranks against the memory bandwidth measured in the run.
    Comm(comm::Args),
    /// The 1F1B pipeline's idle fraction per stage against (p - 1)/(m + p - 1), same run.
    Pipeline(pipeline::Args),
}

const TRAIN_EXAMPLES: &str = "\
Examples:
  frugal bench train                                        gpt2-124m, 4 x 256 tokens, 5 steps
  frugal bench train --model gpt2-124m --baseline pytorch   against PyTorch in the same run
  frugal bench train --precision bf16 --recompute full --json";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = TRAIN_EXAMPLES)]
pub struct TrainArgs {
    /// A preset (gpt2-124m, gpt2-tiny, llama-tiny, ...) or an HF config.json.
    #[arg(long, default_value = "gpt2-124m")]
    pub model: String,
    #[arg(long, default_value_t = 4)]
    pub batch: u64,
    #[arg(long, default_value_t = 256)]
    pub seq: u64,
    /// Timed steps (after one untimed warm-up step).
    #[arg(long, default_value_t = 5)]
    pub steps: u64,
    /// Also run this baseline in the same run: pytorch (needs python3 with torch and transformers).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Threads PyTorch may use (the engine uses rayon's pool: RAYON_NUM_THREADS).
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// Weight/gradient precision of the timed step: fp32, bf16 or fp16 (as `frugal train`). bf16
    /// runs the fastest bf16 GEMM this CPU has (AMX tiles, AVX-512 BF16, AVX2 + FMA, or portable;
    /// named in the report); FRUGAL_ISA=avx512bf16, =avx2 or =portable caps every kernel, to
    /// compare paths on one machine (`paths` in --json lists what each kernel ran).
    #[arg(long, default_value_t = Precision::Fp32, value_parser = train::precision::engine_precision)]
    pub precision: Precision,
    /// Attention kernel: flash or eager (also spelled naive), as `frugal train`.
    #[arg(long, default_value_t = Attention::DEFAULT)]
    pub attention: Attention,
    /// Activation recompute, as `frugal train`.
    #[arg(long, default_value_t = Recompute::None)]
    pub recompute: Recompute,
    /// LoRA/QLoRA: time adapters of this rank over a frozen random base (as `frugal train`).
    #[arg(long)]
    pub lora_rank: Option<u32>,
    /// LoRA targets, as `frugal train`.
    #[arg(long, default_value = "all-linear", value_delimiter = ',')]
    pub lora_targets: Vec<String>,
    /// The frozen base's storage, as `frugal train`.
    #[arg(long, default_value_t = plan::setup::Dtype::Nf4)]
    pub lora_base: plan::setup::Dtype,
    /// nf4 base: bitsandbytes' double quantization.
    #[arg(long)]
    pub double_quant: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Train(a) => train(a),
        What::Generate(a) => generate::run(a),
        What::Serve(a) => serve::run(a),
        What::Quality(a) => quality::run(a),
        What::Comm(a) => comm::run(a),
        What::Pipeline(a) => pipeline::run(a),
    }
}

/// The engine config `--model` names (any kind `model::ModelSource` resolves).
pub fn model_config(spec: &str) -> anyhow::Result<ModelConfig> {
    models::ModelSource::resolve(spec)?.config()
}

/// FLOPs of one training token (see the module comment).
pub fn flops_per_token(model: &ModelConfig, seq: u64) -> f64 {
    let s = &model.shape;
    let units = plan_frugal::param_units(s, 1).expect("a buildable model");
    let mut n: u64 = units.iter().map(|u| u.numel).sum();
    if s.family == Family::Gpt2 {
        n -= s.max_positions * s.d_model;
    }
    // A mixture of experts multiplies only by its active experts.
    n -= s.param_count() - s.active_param_count();
    // Scores over the query/key width, the weighted sum over the value width (MLA: nope + rope
    // and v; otherwise both the head size): 6·L·NH·T·(dk + dv) = 12·L·NH·HD·T.
    let (dk, dv) = s.mla.as_ref().map_or((s.d_head, s.d_head), |a| {
        (a.qk_nope_head_dim + a.qk_rope_head_dim, a.v_head_dim)
    });
    let attn = 6 * u64::from(s.n_layers) * u64::from(s.n_heads) * (dk + dv) * seq;
    6.0 * n as f64 + attn as f64
}

/// The engine's own GEMM on the step's linear shapes at `rows` = batch × seq, measured now:
/// FLOPs over seconds, each shape weighted by how often the step runs it (every block's
/// projections, the head once). fp32 (and fp16, whose kernels are f32): `kernels::matmul`
/// forward and backward; bf16: `gemm_bf16::forward`, then the backward as the engine runs it
/// (`gemm_nn` for the input gradient, the output gradient transposed, `gemm_nn` for the weight
/// gradient). The yardstick `gflops` is held to: what this machine's GEMM of that precision
/// does on these shapes in this run.
fn gemm_gflops(model: &ModelConfig, rows: usize, bf16: bool) -> f64 {
    let s = &model.shape;
    let (c, hd) = (s.d_model as usize, s.d_head as usize);
    let qkv = (s.n_heads as usize + 2 * s.n_kv_heads as usize) * hd;
    let swiglu = s.family != Family::Gpt2;
    let fc = if swiglu {
        2 * s.d_ff as usize
    } else {
        s.d_ff as usize
    };
    let layers = s.n_layers as f64;
    let shapes = [
        (c, qkv, layers),
        (s.n_heads as usize * hd, c, layers),
        (c, fc, layers),
        (s.d_ff as usize, c, layers),
        (c, s.vocab as usize, 1.0),
    ];
    let (mut flops, mut secs) = (0.0, 0.0);
    for (ic, oc, times) in shapes {
        let inp = vec![0.5f32; rows * ic];
        let w = vec![0.01f32; oc * ic];
        let mut out = vec![0.0f32; rows * oc];
        let (mut dinp, mut dw) = (vec![0.0f32; rows * ic], vec![0.0f32; oc * ic]);
        let half = |x: &[f32]| -> Vec<kernels::gemm_bf16::bf16> {
            x.iter()
                .map(|&v| kernels::gemm_bf16::bf16::from_f32(v))
                .collect()
        };
        let (inp_h, w_h, g) = (half(&inp), half(&w), half(&out));
        let mut gt = g.clone();
        let add = kernels::gemm_bf16::Accum::Add;
        // One untimed pass touches every page; the best of three timed ones counts.
        let mut best = f64::MAX;
        for round in 0..4 {
            let started = Instant::now();
            if bf16 {
                kernels::gemm_bf16::forward(&mut out, &inp_h, &w_h, None, rows, ic, oc);
                kernels::gemm_bf16::gemm_nn(&mut dinp, &g, &w_h, (rows, ic, oc), add);
                kernels::gemm_bf16::transpose(&mut gt, &g, rows, oc);
                kernels::gemm_bf16::gemm_nn(&mut dw, &gt, &inp_h, (oc, ic, rows), add);
            } else {
                kernels::matmul::forward(&mut out, &inp, &w, None, (rows, ic, oc));
                kernels::matmul::backward(&mut dinp, &mut dw, None, &out, &inp, &w, (rows, ic, oc));
            }
            if round > 0 {
                best = best.min(started.elapsed().as_secs_f64());
            }
        }
        secs += best * times;
        flops += 6.0 * (rows * ic * oc) as f64 * times;
    }
    flops / secs / 1e9
}

fn train(a: TrainArgs) -> anyhow::Result<()> {
    if a.steps == 0 || a.batch == 0 || a.seq == 0 {
        bail!("--steps, --batch and --seq must be at least 1");
    }
    if let Some(other) = a.baseline.as_deref().filter(|b| *b != "pytorch") {
        bail!("--baseline {other}: the only baseline is pytorch");
    }
    if a.baseline.is_some() && a.lora_rank.is_some() {
        bail!("--baseline with --lora-rank: there is no PyTorch LoRA baseline; leave one out");
    }
    if a.baseline.is_some() {
        check_pytorch()?;
    }
    if a.lora_rank.is_some() && a.lora_base == plan::setup::Dtype::Ggml {
        bail!(
            "--lora-base ggml: bench train runs random weights, and a ggml base is a GGUF file's \
             own blocks; time it with frugal train --model FILE.gguf --lora-base ggml, or bench \
             another base (nf4, int8, bf16, fp32)"
        );
    }
    let model = model_config(&a.model)?;
    if let Some(rank) = a.lora_rank {
        plan::lora::check_rank(&model.shape, rank, &a.lora_targets)?;
    }
    let config = TrainConfig {
        schedule: Schedule::constant(1e-4),
        recompute: a.recompute,
        attention: a.attention,
        mixed: Mixed {
            precision: a.precision,
            ..Mixed::fp32()
        },
        lora: a.lora_rank.map(|rank| train::LoraConfig {
            base_weights: None,
            plan: plan::setup::Lora {
                rank,
                targets: a.lora_targets.clone(),
                base: a.lora_base,
                double_quant: a.double_quant,
                dropout: 0.0,
                ggml: None,
            },
            alpha: rank as f32,
        }),
        ..TrainConfig::new(model.clone(), a.batch, a.seq)
    };
    let mut trainer = Trainer::new(config)?;
    trainer.init_weights(1);
    if a.lora_rank.is_some() {
        return lora_bench(&a, trainer);
    }
    let n = trainer.micro_tokens();
    let mut rng = data::SplitMix64::new(7);
    let vocab = model.shape.vocab.min(50257);
    let x: Vec<u32> = (0..n).map(|_| rng.next_below(vocab) as u32).collect();
    let y: Vec<u32> = (0..n).map(|_| rng.next_below(vocab) as u32).collect();
    let mut feed = |i: &mut [u32], o: &mut [u32]| {
        i.copy_from_slice(&x);
        o.copy_from_slice(&y);
    };
    trainer.step(&mut feed)?;
    trainer.timings = train::Timings::default();
    let started = Instant::now();
    let mut progress = term::PlainProgress::new("bench train", a.steps, a.json);
    for step in 0..a.steps {
        trainer.step(&mut feed)?;
        progress.tick(step + 1, "");
    }
    let seconds = started.elapsed().as_secs_f64();
    let tokens_per_s = (n as u64 * a.steps) as f64 / seconds;
    let gflops = tokens_per_s * flops_per_token(&model, a.seq) / 1e9;
    let baseline = match a.baseline.as_deref() {
        None => None,
        Some("pytorch") => Some(pytorch(&model, &a)?),
        Some(other) => bail!("--baseline {other}: the only baseline is pytorch"),
    };
    let bf16_gemm = a.precision == Precision::Bf16;
    let gemm = gemm_gflops(&model, n, bf16_gemm);
    let gemm_precision = if bf16_gemm { "bf16" } else { "fp32" };
    // The kernel behind the step's GEMMs at the instruction-set level in force (FRUGAL_ISA).
    let gemm_path = match bf16_gemm {
        true => kernels::gemm_bf16::best_isa().name(),
        false => kernels::matmul::capped::path().name(),
    };
    let t = trainer.timings;
    let parts = [
        ("embed", t.embed),
        ("forward blocks", t.forward_blocks),
        ("head (classifier fwd+bwd)", t.head),
        ("backward blocks", t.backward_blocks),
        ("embed backward", t.embed_backward),
        ("optimizer", t.optimizer),
    ];
    if a.json {
        let profile: serde_json::Map<_, _> = parts
            .iter()
            .map(|(k, d)| (k.to_string(), json!(d.as_secs_f64() / a.steps as f64)))
            .collect();
        let v = json!({
            "model": model.shape.name, "batch": a.batch, "seq": a.seq, "steps": a.steps,
            "precision": a.precision.to_string(),
            "attention": a.attention.to_string(),
            "recompute": a.recompute.to_string(),
            "tokens_per_s": tokens_per_s, "gflops": gflops,
            "gemm_gflops": gemm, "gemm_precision": gemm_precision, "gemm_path": gemm_path,
            "gflops_over_gemm": gflops / gemm,
            "cpu": generate::cpu_name(),
            "isa": kernels::cpu::level().name(),
            "paths": generate::kernel_paths(),
            "flops_per_token": flops_per_token(&model, a.seq),
            "step_seconds": profile,
            "pytorch_tokens_per_s": baseline,
            "ratio": baseline.map(|b| tokens_per_s / b),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_human(&a, &model, tokens_per_s, gflops, &parts, baseline);
    println!(
        "  the engine's {gemm_precision} GEMM ({gemm_path}) on the step's shapes, same run: {gemm:.1} GFLOP/s; the step reaches {:.2} of it",
        gflops / gemm
    );
    Ok(())
}

/// A LoRA step on random tokens: tokens/s, and the measured peak against the plan.
fn lora_bench(a: &TrainArgs, mut trainer: Trainer) -> anyhow::Result<()> {
    let n = trainer.micro_tokens();
    let mut rng = data::SplitMix64::new(7);
    let vocab = trainer.config.model.shape.vocab.min(50257);
    let x: Vec<u32> = (0..n).map(|_| rng.next_below(vocab) as u32).collect();
    let mut feed = |i: &mut [u32], o: &mut [u32]| {
        i.copy_from_slice(&x);
        o.copy_from_slice(&x);
    };
    trainer.step(&mut feed)?;
    let started = Instant::now();
    let mut progress = term::PlainProgress::new("bench train", a.steps, a.json);
    for step in 0..a.steps {
        trainer.step(&mut feed)?;
        progress.tick(step + 1, "");
    }
    let tokens_per_s = (n as u64 * a.steps) as f64 / started.elapsed().as_secs_f64();
    let planned = trainer.plan.peak_bytes(plan::buffer::Device::Gpu);
    let measured = trainer.measured().peak_bytes;
    let lora = trainer.model.lora.as_ref().expect("a LoRA trainer");
    let trained: u64 = trainer.model.units.iter().map(|u| u.numel).sum();
    if a.json {
        let v = json!({
            "model": trainer.config.model.shape.name, "batch": a.batch, "seq": a.seq,
            "steps": a.steps, "recompute": a.recompute.to_string(),
            "lora_rank": lora.setup.rank, "lora_base": lora.format.name(),
            "trained_params": trained, "tokens_per_s": tokens_per_s,
            "planned_peak_bytes": planned, "measured_peak_bytes": measured,
            "cpu": generate::cpu_name(), "paths": generate::kernel_paths(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "frugal LoRA step, {} at batch {} x seq {} ({} timed steps, r {} on {}, {} base, recompute {})",
            trainer.config.model.shape.name, a.batch, a.seq, a.steps, lora.setup.rank,
            lora.setup.targets.join(","), lora.format.name(), a.recompute
        );
        println!(
            "  {tokens_per_s:.1} tokens/s; {trained} trained parameters; peak measured {measured} bytes \
             ({:.2} GB) = planned {planned} bytes: {}",
            measured as f64 / 1e9,
            if measured == planned { "equal" } else { "DIFFERENT" }
        );
        println!("  CPU: {}", generate::cpu_name());
    }
    if measured != planned {
        bail!("the measured peak ({measured} bytes) differs from the plan ({planned} bytes)");
    }
    Ok(())
}

fn print_human(
    a: &TrainArgs,
    model: &ModelConfig,
    tokens_per_s: f64,
    gflops: f64,
    parts: &[(&str, Duration)],
    baseline: Option<f64>,
) {
    println!(
        "frugal train step, {} at batch {} x seq {} ({} timed steps, {}, {} attention, recompute {}, AdamW)",
        model.shape.name, a.batch, a.seq, a.steps, a.precision, a.attention, a.recompute
    );
    println!(
        "  {tokens_per_s:.0} tokens/s, {gflops:.1} GFLOP/s achieved \
         (FLOPs/token = 6N + 12·L·NH·HD·T = {:.3e})",
        flops_per_token(model, a.seq)
    );
    let total: f64 = parts.iter().map(|(_, d)| d.as_secs_f64()).sum();
    let mut table = term::Table::new(&["where the time goes", "ms/step", "share"]);
    for (name, d) in parts {
        let s = d.as_secs_f64();
        table.row(vec![
            name.to_string(),
            format!("{:.1}", 1e3 * s / a.steps as f64),
            format!("{:.1}%", 100.0 * s / total),
        ]);
    }
    print!("{}", table.render());
    if let Some(b) = baseline {
        println!(
            "PyTorch ({} threads, fp32, same model and step): {b:.0} tokens/s; frugal / PyTorch = {:.2}x",
            a.threads,
            tokens_per_s / b
        );
    }
}

/// Runs dev/bench_pytorch.py on the same model and shape; returns its tokens/s.
/// Before frugal's own benchmark runs: python3 imports torch and transformers, or the error says
/// which is missing.
fn check_pytorch() -> anyhow::Result<()> {
    let out = Command::new("python3")
        .args(["-c", "import torch, transformers"])
        .output()
        .context("--baseline pytorch: running python3 (is it installed and on PATH?)")?;
    if !out.status.success() {
        bail!(
            "--baseline pytorch: python3 cannot import torch and transformers (pip install torch \
             transformers), checked before the benchmark:\n{}",
            python::failure(&out)
        );
    }
    Ok(())
}

fn pytorch(model: &ModelConfig, a: &TrainArgs) -> anyhow::Result<f64> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev/bench_pytorch.py");
    if !script.exists() {
        bail!(
            "--baseline pytorch needs {} (run from a clone of the repository)",
            script.display()
        );
    }
    let config = std::env::temp_dir().join(format!("frugal-bench-{}.json", std::process::id()));
    std::fs::write(&config, model.to_hf_json()).context("writing the model's config.json")?;
    let out = Command::new("python3")
        .arg(&script)
        .args(["--config", &config.display().to_string()])
        .args(["--batch", &a.batch.to_string(), "--seq", &a.seq.to_string()])
        .args([
            "--steps",
            &a.steps.to_string(),
            "--threads",
            &a.threads.to_string(),
        ])
        .output()
        .context("running python3 (is it installed?)")?;
    let _ = std::fs::remove_file(&config);
    if !out.status.success() {
        bail!(
            "dev/bench_pytorch.py failed (does python3 have torch and transformers?):\n{}",
            python::failure(&out)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .context("dev/bench_pytorch.py printed no JSON")?;
    v["tokens_per_s"]
        .as_f64()
        .context("dev/bench_pytorch.py's JSON has no tokens_per_s")
}
