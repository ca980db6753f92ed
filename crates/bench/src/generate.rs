//! `frugal bench generate`: decode speed of a model shape with random weights built directly in
//! the storage format (a 7B-shaped int4 model needs its 3.8 GB only, never an fp32 copy), against
//! the machine's memory bandwidth measured in the same run (a streaming read of 256 MiB on every
//! core), and optionally against llama.cpp on the same weights or HF transformers' `generate`
//! (`--baseline`, run after frugal's own measurement with the memory freed).
//!
//! Decode at small batch reads every weight once per step, so the step's bytes (every matrix but
//! the token embedding, of which only the batch's rows are read, unless it is also the tied head,
//! and the routed experts, of which only those the batch's tokens reach; the fp32 vectors; and the
//! KV cache the step attends over) divided by its time, over the measured bandwidth, is how close
//! the engine runs to the machine's limit (`bandwidth_fraction`).
//! The speed is the median of back-to-back steps; the fraction is the median over steps that
//! each follow a streaming read, each against that read's rate (the machine is shared and its
//! bandwidth drifts). The prompt's prefill is reported apart.
//!
//! Example: `frugal bench generate --model llama2-7b --weights int4 --batch 1 --json`.

use crate::model_config;
use anyhow::{bail, Context};
use infer::blocks::SeqId;
use infer::group::Group;
use infer::{SplitK, Worker};
use plan::buffer::Device;
use plan_frugal::serve::is_matrix;
use plan_frugal::units::Role;
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;
use term::group_digits;

const EXAMPLES: &str = "\
Examples:
  frugal bench generate                                       llama2-7b shape, int4 g32, batch 1
  frugal bench generate --weights int8 --batch 8 --json
  frugal bench generate --model gpt2-124m --weights f32 --new-tokens 32
  frugal bench generate --model tinyllama-1.1b --tp 2                 two tensor-parallel ranks
  frugal bench generate --model llama2-7b --save /tmp/q7b     also write the weights (dev/bench_llamacpp.py)";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// A preset, an HF config.json, or a folder with a config.json (its shape; random weights).
    #[arg(long, default_value = "llama2-7b")]
    pub model: String,
    /// f32, bf16, int8, int4, int4-asym, nf4 or ggml (int8 codes, an fp32 scale and minimum
    /// per --weight-group of 32 or 16: the layout a GGUF file's blocks run in).
    #[arg(long, default_value = "int4")]
    pub weights: String,
    #[arg(long, default_value_t = 32)]
    pub weight_group: u64,
    /// f32, bf16, int8 or fp8.
    #[arg(long, default_value = "f32")]
    pub kv_dtype: String,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    #[arg(long, default_value_t = 32)]
    pub prompt_len: u64,
    /// Decode steps timed (after one untimed step).
    #[arg(long, default_value_t = 16)]
    pub new_tokens: u64,
    #[arg(long, default_value_t = 16)]
    pub kv_block: u64,
    /// Split-K decode attention: auto, off or a split count.
    #[arg(long, default_value = "auto")]
    pub split_k: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write config.json and weights.frugal (the random weights) here, for outside baselines.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Also run a baseline in the same run: llama.cpp (dev/bench_llamacpp.py: the same weights
    /// as a GGUF; int4 g32, bf16, f32) or hf (dev/bench_hf_generate.py: transformers' generate;
    /// f32, bf16). Needs python3 with llama-cpp-python and gguf, or torch and transformers.
    #[arg(long)]
    pub baseline: Option<String>,
    /// Tensor-parallel ranks (threads of this process; each holds its share of the heads, the
    /// MLP and the vocabulary, built at random as the whole model is).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `--split-k`.
pub fn split_k(s: &str) -> anyhow::Result<SplitK> {
    Ok(match s {
        "auto" => SplitK::Auto,
        "off" => SplitK::Off,
        n => match n.parse::<usize>() {
            Ok(k) if k >= 1 => SplitK::Fixed(k),
            _ => bail!("--split-k {n}: use auto, off or a count of at least 1"),
        },
    })
}

/// The CPU's model name (`/proc/cpuinfo`), the threads and the instruction-set level in force.
pub fn cpu_name() -> String {
    let name = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{name}, {} threads, {}",
        rayon::current_num_threads(),
        kernels::cpu::level().name()
    )
}

/// Every kernel dispatch and the path it took at the instruction-set level in force.
pub fn kernel_paths() -> serde_json::Value {
    kernels::paths()
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A buffer for streaming reads: 256 MiB (far past any cache) of distinct values (identical
/// pages could be merged by the host and read from cache).
pub fn read_buffer() -> Vec<f32> {
    let mut rng = data::SplitMix64::new(0x5eed);
    (0..1usize << 26)
        .map(|_| (rng.next_u64() >> 40) as f32)
        .collect()
}

/// One streaming read of `buf` on every core, in bytes/s.
pub fn read_rate(buf: &[f32]) -> f64 {
    let t = Instant::now();
    std::hint::black_box(kernels::stream::read_all(buf));
    std::mem::size_of_val(buf) as f64 / t.elapsed().as_secs_f64()
}

/// Bytes one decode step of `batch` rows reads: weights (see the module docs) and, for each
/// sequence of `cached` tokens, its KV.
pub fn step_bytes(s: &plan::ModelShape, setup: &ServeSetup, batch: u64, cached: u64) -> u64 {
    let mut bytes = 0;
    let units = plan_frugal::param_units(s, 1).expect("a buildable model");
    for unit in &units {
        for v in &unit.views {
            let (rows, cols) = (v.shape[0], v.shape.get(1).copied().unwrap_or(1));
            if !is_matrix(v.role) {
                bytes += 4 * v.numel();
                continue;
            }
            let (c, sc, z) = setup.weights.matrix_bytes(v.role, rows, cols);
            let whole = c + sc + z;
            bytes += match v.role {
                Role::TokenEmbedding if !s.tied_embeddings => whole / rows * batch,
                Role::ExpertsFcWeight | Role::ExpertsProjWeight => reached(s, batch, whole),
                _ => whole,
            };
        }
    }
    bytes + batch * cached * setup.block_bytes(s) / setup.kv_block
}

/// Of `bytes` of routed experts, what a step of `batch` tokens reads: the experts its tokens
/// reach, `k` each (exactly `k` at batch 1; at larger batches the number expected when each
/// token draws its `k` of `E` experts uniformly, `E·(1 − (1 − k/E)^batch)`).
fn reached(s: &plan::ModelShape, batch: u64, bytes: u64) -> u64 {
    let Some(e) = &s.moe else {
        return bytes;
    };
    let (n, k) = (f64::from(e.n_experts), f64::from(e.n_active));
    let experts = n * (1.0 - (1.0 - k / n).powf(batch as f64));
    (bytes as f64 * experts / n).round() as u64
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.batch == 0 || a.prompt_len == 0 || a.new_tokens == 0 {
        bail!("--batch, --prompt-len and --new-tokens must be at least 1");
    }
    let config = model_config(&a.model)?;
    let weights = WeightFormat::parse(&a.weights, Some(a.weight_group))?;
    if a.baseline.as_deref() == Some("llama.cpp") && matches!(weights, WeightFormat::Ggml { .. }) {
        bail!(
            "--baseline llama.cpp runs these same bytes from a GGUF file it is given; it takes \
             --weights int4, int8, bf16 or f32 (compare ggml on a real GGUF file with \
             `frugal generate --model FILE --json`)"
        );
    }
    let kv = KvFormat::parse(&a.kv_dtype)?;
    plan::validate::check_kv_block(a.kv_block)?;
    // Prompt, one untimed step, the timed steps, then as many paired with bandwidth reads.
    let context = a
        .new_tokens
        .checked_mul(2)
        .and_then(|n| n.checked_add(a.prompt_len))
        .and_then(|n| n.checked_add(1))
        .unwrap_or(u64::MAX);
    if context > config.shape.max_positions {
        bail!(
            "--prompt-len {} and --new-tokens {} need {context} positions (the prompt, an \
             untimed step, then twice the new tokens: timed alone and beside bandwidth reads); \
             the model has {}: lower --prompt-len or --new-tokens",
            a.prompt_len,
            a.new_tokens,
            config.shape.max_positions
        );
    }
    let setup = ServeSetup::generation(
        &config.shape,
        a.batch,
        context,
        weights,
        kv,
        a.kv_block,
        infer::default_split_k(),
    );
    let shape = config.shape.clone();
    let (sk, seed) = (split_k(&a.split_k)?, a.seed);
    let t = Instant::now();
    let mut worker = match a.tp {
        0 => bail!("--tp 0: give at least one tensor-parallel rank"),
        1 => {
            let mut w = Worker::new_in_ram(config, setup)?;
            w.split_k = sk;
            w.fill_random(seed);
            Group::single(w)
        }
        tp => {
            if a.save.is_some() || a.baseline.is_some() {
                bail!("--tp {tp}: --save and --baseline take the whole model (--tp 1)");
            }
            models::tp::check_fit(&shape, &setup, tp)?;
            let load: infer::group::Load = std::sync::Arc::new(move |w: &mut Worker| {
                w.split_k = sk;
                w.fill_random(seed);
                Ok(())
            });
            Group::start(config, setup, tp, load)?
        }
    };
    let fill_s = t.elapsed().as_secs_f64();
    if let Some(b) = a.baseline.as_deref() {
        if !matches!(b, "llama.cpp" | "hf") {
            bail!("--baseline {b}: use llama.cpp or hf");
        }
    }
    let save = match (&a.save, a.baseline.as_deref()) {
        (Some(d), _) => Some(d.clone()),
        (None, Some("llama.cpp")) => {
            Some(std::env::temp_dir().join(format!("frugal-gguf-{}", std::process::id())))
        }
        _ => None,
    };
    if let Some(dir) = &save {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("config.json"), worker.config.to_hf_json())?;
        infer::file::save(&worker, &dir.join(infer::file::FILE_NAME))?;
    }
    let buf = read_buffer();
    read_rate(&buf);
    let vocab = shape.vocab;
    let mut rng = data::SplitMix64::new(a.seed);
    let mut token = || (rng.next_u64() % vocab) as u32;
    let seqs: Vec<SeqId> = (0..a.batch).map(|_| worker.new_sequence()).collect();
    let mut logits = Vec::new();
    let t = Instant::now();
    for &s in &seqs {
        let prompt: Vec<u32> = (0..a.prompt_len).map(|_| token()).collect();
        worker.prefill(s, &prompt, &mut logits)?;
    }
    let prefill_s = t.elapsed().as_secs_f64();
    // Timed decode steps back to back (the speed), then steps alternating with streaming reads,
    // so each is compared with the bandwidth of the moment (the machine is shared and its rate
    // drifts; a read just before a step also leaves the caches as cold as a real decode finds
    // them).
    let cached = a.prompt_len + a.new_tokens;
    // The whole model's bytes: each rank reads its share, together the model once.
    let bytes = step_bytes(&shape, &setup, a.batch, cached);
    let (mut steps, mut rates, mut fractions) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..=a.new_tokens {
        let feed: Vec<u32> = seqs.iter().map(|_| token()).collect();
        let t = Instant::now();
        worker.decode(&seqs, &feed, &mut logits)?;
        if i > 0 {
            steps.push(t.elapsed().as_secs_f64());
        }
    }
    for _ in 0..a.new_tokens {
        let feed: Vec<u32> = seqs.iter().map(|_| token()).collect();
        let rate = read_rate(&buf);
        let t = Instant::now();
        worker.decode(&seqs, &feed, &mut logits)?;
        let secs = t.elapsed().as_secs_f64();
        rates.push(rate);
        fractions.push(bytes as f64 / secs / rate);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (step, bandwidth, fraction) = (
        median(&mut steps),
        median(&mut rates),
        median(&mut fractions),
    );
    let planned_peak = worker.plan.peak_bytes(Device::Gpu);
    let planned: Vec<u64> = (0..a.tp as u32)
        .map(|r| plan_frugal::serve_plan_rank(&shape, &setup, a.tp as u32, r))
        .map(|p| p.map(|p| p.peak_bytes(Device::Gpu)))
        .collect::<Result<_, _>>()?;
    let cpu = cpu_name();
    let shape_config = worker.config.to_hf_json();
    let threads = rayon::current_num_threads();
    let weights_bytes = worker.plan.persistent_bytes(plan::buffer::Category::Params);
    let name = shape.name.clone();
    // The baseline gets the machine's memory to itself.
    let measured: Vec<u64> = worker.finish().iter().map(|m| m.peak_bytes).collect();
    drop(buf);
    let baseline = match a.baseline.as_deref() {
        Some(b) => Some(run_baseline(
            b,
            &a,
            save.as_deref(),
            &shape_config,
            threads,
        )?),
        None => None,
    };
    if a.save.is_none() {
        if let Some(dir) = &save {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let base_tps = baseline
        .as_ref()
        .and_then(|v| v["decode_tokens_per_s"].as_f64());
    let decode_tps = a.batch as f64 / step;
    if a.json {
        let v = json!({
            "model": name,
            "weights": weights.name(),
            "weight_group": weights.group(),
            "kv_dtype": kv.name(),
            "batch": a.batch,
            "prompt_len": a.prompt_len,
            "new_tokens": a.new_tokens,
            "prefill_tokens_per_s": (a.batch * a.prompt_len) as f64 / prefill_s,
            "decode_tokens_per_s": decode_tps,
            "decode_step_s": step,
            "bytes_per_step": bytes,
            "bytes_per_token": bytes / a.batch,
            "bandwidth_bytes_per_s": bandwidth,
            "bandwidth_fraction": fraction,
            "tp": a.tp,
            "planned_peak_bytes": planned_peak,
            "measured_peak_bytes": measured[0],
            "ranks_planned_peak_bytes": planned,
            "ranks_measured_peak_bytes": measured,
            "weights_bytes": weights_bytes,
            "fill_s": fill_s,
            "cpu": cpu,
            "isa": kernels::cpu::level().name(),
            "paths": kernel_paths(),
            "baseline": a.baseline,
            "baseline_result": baseline,
            "decode_ratio_vs_baseline": base_tps.map(|b| decode_tps / b),
        });
        println!("{v}");
    } else {
        println!(
            "{} · weights {} · KV {} · batch {} · {cpu}",
            name,
            weights.name(),
            kv.name(),
            a.batch
        );
        println!(
            "prefill {:.1} tokens/s · decode {:.2} tokens/s ({:.1} ms a step)",
            (a.batch * a.prompt_len) as f64 / prefill_s,
            a.batch as f64 / step,
            step * 1e3
        );
        println!(
            "{} bytes a step, {:.2} GB/s against a measured read of {:.2} GB/s: {:.0}% of the bandwidth",
            group_digits(bytes),
            bytes as f64 / step / 1e9,
            bandwidth / 1e9,
            100.0 * fraction
        );
        for (r, (p, m)) in planned.iter().zip(&measured).enumerate() {
            let rank = if a.tp > 1 {
                format!("rank {r} ")
            } else {
                String::new()
            };
            println!(
                "memory: {rank}planned {} bytes, measured {}",
                group_digits(*p),
                group_digits(*m)
            );
        }
        if let (Some(name), Some(b)) = (a.baseline.as_deref(), base_tps) {
            println!(
                "{name} on the same shape and threads: decode {b:.2} tokens/s; frugal / {name} = {:.2}x",
                decode_tps / b
            );
        }
    }
    if measured != planned {
        bail!("measured memory differs from the plan: a bug in the engine or the plan");
    }
    Ok(())
}

/// Runs a dev/ baseline script; returns its JSON line.
fn run_baseline(
    name: &str,
    a: &Args,
    saved: Option<&std::path::Path>,
    config_json: &str,
    threads: usize,
) -> anyhow::Result<serde_json::Value> {
    let dev = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev");
    let mut cmd = std::process::Command::new("python3");
    let common = [
        "--prompt-len".to_string(),
        a.prompt_len.to_string(),
        "--new-tokens".to_string(),
        a.new_tokens.to_string(),
        "--threads".to_string(),
        threads.to_string(),
    ];
    let config_file = std::env::temp_dir().join(format!("frugal-hf-{}.json", std::process::id()));
    match name {
        "llama.cpp" => {
            let dir = saved.expect("saved weights for llama.cpp");
            cmd.arg(dev.join("bench_llamacpp.py"))
                .args(["--dir", &dir.display().to_string()])
                .args(["--batch", &a.batch.to_string()]);
        }
        _ => {
            let dtype = match a.weights.as_str() {
                "f32" | "bf16" => a.weights.as_str(),
                w => bail!("--baseline hf runs f32 or bf16 weights, not {w}"),
            };
            std::fs::write(&config_file, config_json)?;
            cmd.arg(dev.join("bench_hf_generate.py"))
                .args([
                    "--config",
                    &config_file.display().to_string(),
                    "--dtype",
                    dtype,
                ])
                .args(["--batch", &a.batch.to_string()]);
        }
    }
    let out = cmd
        .args(common)
        .output()
        .context("running python3 for the baseline (is it installed and on PATH?)")?;
    let _ = std::fs::remove_file(&config_file);
    if !out.status.success() {
        bail!(
            "the {name} baseline failed:\n{}",
            crate::python::failure(&out)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("the {name} baseline printed no JSON"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_step_reads_the_experts_its_tokens_reach() {
        let s = plan::presets::by_name("deepseek-v2-lite").unwrap();
        // 6 of 64 routed experts a token: one token reads 6/64 of them, many tokens nearly all.
        assert_eq!(super::reached(&s, 1, 64_000), 6_000);
        let many = super::reached(&s, 256, 64_000);
        assert!(many > 63_900 && many <= 64_000, "{many}");
        let dense = plan::presets::by_name("llama2-7b").unwrap();
        assert_eq!(super::reached(&dense, 1, 64_000), 64_000);
    }
}
