//! `frugal bench serve`: continuous batching over a synthetic request trace (log-normal prompt
//! and output lengths, seeded; every request arrives at once, as vLLM's throughput benchmark) on
//! a paged KV pool sized from a byte budget: throughput, latency percentiles, the KV waste of
//! the paged pool against a contiguous max-length cache on the same trace, the largest number of
//! sequences run at once against the plan's prediction (the scheduler's rule replayed on the
//! trace's lengths, `schedule::simulate`), and planned against measured peak bytes.
//!
//! Example: `frugal bench serve --model gpt2-124m --requests 64 --kv-block 16 --json`.

use crate::generate::cpu_name;
use crate::model_config;
use anyhow::bail;
use infer::sample::Sampling;
use infer::schedule::{self, Request};
use infer::Worker;
use plan::buffer::Device;
use plan_frugal::{KvFormat, ServeSetup, WeightFormat};
use serde_json::json;
use term::group_digits;

const EXAMPLES: &str = "\
Examples:
  frugal bench serve                                    gpt2-124m, int8, 48 requests
  frugal bench serve --requests 200 --kv-budget 64MiB --max-seqs 32 --json
  frugal bench serve --model llama-tiny --weights f32 --kv-dtype int8
  frugal bench serve --shared-prefix 200                 a common system prompt, cached once
  frugal bench serve --http --model SmolLM2-135M-Instruct.Q4_1.gguf --requests 16 --weights f32
                                                        the same trace against frugal serve";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// A preset, an HF config.json, or a folder with one (random weights of that shape).
    #[arg(long, default_value = "gpt2-124m")]
    pub model: String,
    #[arg(long, default_value = "int8")]
    pub weights: String,
    #[arg(long, default_value_t = 32)]
    pub weight_group: u64,
    #[arg(long, default_value = "f32")]
    pub kv_dtype: String,
    #[arg(long, default_value_t = 48)]
    pub requests: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub kv_block: u64,
    /// Bytes of the KV pool (e.g. 64MiB); default: room for --max-seqs sequences of the
    /// trace's mean length.
    #[arg(long)]
    pub kv_budget: Option<String>,
    /// Most sequences a decode step runs.
    #[arg(long, default_value_t = 16)]
    pub max_seqs: u64,
    /// Mean prompt and output lengths of the log-normal trace (σ = 0.6 in log space; ShareGPT's
    /// conversations average a few hundred tokens).
    #[arg(long, default_value_t = 128)]
    pub prompt_mean: u64,
    #[arg(long, default_value_t = 128)]
    pub output_mean: u64,
    /// Longest sequence (prompt + output) a request may have; default min(1024, positions).
    #[arg(long)]
    pub context: Option<u64>,
    /// Tokens of a common prompt (a system prompt) every request starts with: cached once,
    /// forked by each request, its last partial block copied on first write.
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
    /// Send the trace to `frugal serve` over HTTP on 127.0.0.1 (started here with --model, a
    /// model on disk): throughput, time to first token and per output token, p50 and p99.
    #[arg(long)]
    pub http: bool,
    /// With --http: stop after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// With --http: serve disaggregated, this many prefill workers shipping KV to the decode
    /// worker (`frugal serve --prefill-ranks`); 0 co-located.
    #[arg(long, default_value_t = 0)]
    pub prefill_ranks: usize,
    /// With --http and --prefill-ranks: the prefill workers' cores (default half the machine's).
    #[arg(long)]
    pub prefill_threads: Option<usize>,
    /// With --http: serve on this many tensor-parallel ranks (`frugal serve --tp`).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// With --http: this many decode workers sharing the requests (`frugal serve
    /// --decode-ranks`).
    #[arg(long, default_value_t = 1)]
    pub decode_ranks: usize,
}

/// A log-normal draw with this mean (σ in log space), clamped to [1, max].
fn lognormal(rng: &mut data::SplitMix64, mean: f64, sigma: f64, max: u64) -> u64 {
    let u1 = infer::sample::uniform(rng).max(1e-12);
    let u2 = infer::sample::uniform(rng);
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    let mu = mean.ln() - sigma * sigma / 2.0;
    ((mu + sigma * z).exp().round() as u64).clamp(1, max)
}

/// The seeded trace (each prompt after the shared prefix, if any).
pub fn trace(a: &Args, vocab: u64, context: u64) -> Vec<Request> {
    let mut rng = data::SplitMix64::new(a.seed);
    let prefix: Vec<u32> = (0..a.shared_prefix)
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect();
    let room = context - a.shared_prefix;
    (0..a.requests)
        .map(|_| {
            let p = lognormal(&mut rng, a.prompt_mean as f64, 0.6, room / 2);
            let o = lognormal(&mut rng, a.output_mean as f64, 0.6, room - p);
            let mut prompt = prefix.clone();
            prompt.extend((0..p).map(|_| (rng.next_u64() % vocab) as u32));
            Request {
                prompt,
                max_new: o as usize,
            }
        })
        .collect()
}

pub fn percentile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.requests == 0 || a.max_seqs == 0 {
        bail!("--requests and --max-seqs must be at least 1");
    }
    plan::validate::check_kv_block(a.kv_block)?;
    let ranks = a.prefill_ranks > 0 || a.prefill_threads.is_some() || a.tp != 1;
    if !a.http && (ranks || a.decode_ranks != 1) {
        bail!(
            "--tp, --prefill-ranks, --prefill-threads and --decode-ranks serve over HTTP: add --http"
        );
    }
    if a.http {
        return crate::serve_http::run(a);
    }
    let config = model_config(&a.model)?;
    let weights = WeightFormat::parse(&a.weights, Some(a.weight_group))?;
    let kv = KvFormat::parse(&a.kv_dtype)?;
    let context = a.context.unwrap_or(1024).min(config.shape.max_positions);
    if context < 2 + 2 * a.shared_prefix {
        bail!("--context must be at least 2 tokens past twice --shared-prefix");
    }
    let requests = trace(&a, config.shape.vocab, context);
    let base = ServeSetup::generation(
        &config.shape,
        a.max_seqs,
        context,
        weights,
        kv,
        a.kv_block,
        infer::default_split_k(),
    );
    let block_bytes = base.block_bytes(&config.shape);
    let budget = match &a.kv_budget {
        Some(s) => plan::units::parse_bytes(s, "kv-budget")?,
        None => block_bytes * a.max_seqs * (a.prompt_mean + a.output_mean).div_ceil(a.kv_block),
    };
    let kv_blocks = budget / block_bytes;
    if kv_blocks == 0 {
        bail!(
            "--kv-budget {budget} bytes holds no KV block ({} bytes for {} tokens): raise it",
            group_digits(block_bytes),
            a.kv_block
        );
    }
    let setup = ServeSetup { kv_blocks, ..base };
    let window = infer::window_everywhere(&config);
    let planned = schedule::simulate(&requests, &setup, window, a.shared_prefix as usize)?;
    let mut worker = Worker::new_in_ram(config, setup)?;
    worker.fill_random(a.seed);
    let prefix = a.shared_prefix as usize;
    let r = schedule::run(&mut worker, &requests, prefix, &Sampling::greedy(), a.seed)?;
    let m = worker.measured();
    let planned_peak = worker.plan.peak_bytes(Device::Gpu);
    let tps = r.stats.generated_tokens as f64 / r.seconds;
    let (p50, p90, p99) = (
        percentile(&r.latencies_s, 0.5),
        percentile(&r.latencies_s, 0.9),
        percentile(&r.latencies_s, 0.99),
    );
    let ttft = percentile(&r.first_token_s, 0.5);
    if a.json {
        let v = json!({
            "model": worker.config.shape.name,
            "weights": weights.name(),
            "kv_dtype": kv.name(),
            "requests": a.requests,
            "kv_block": a.kv_block,
            "kv_blocks": kv_blocks,
            "kv_budget_bytes": budget,
            "seconds": r.seconds,
            "generated_tokens": r.stats.generated_tokens,
            "throughput_tokens_per_s": tps,
            "latency_p50_s": p50, "latency_p90_s": p90, "latency_p99_s": p99,
            "first_token_p50_s": ttft,
            "kv_waste_fraction": r.stats.kv_waste_fraction(),
            "contiguous_waste_fraction": r.stats.contiguous_waste_fraction(),
            "max_concurrent": r.stats.max_concurrent,
            "planned_max_concurrent": planned.max_concurrent,
            "shared_prefix": a.shared_prefix,
            "peak_blocks": r.stats.peak_blocks,
            "peak_blocks_unshared": r.stats.peak_blocks_unshared,
            "preemptions": r.stats.preemptions,
            "planned_preemptions": planned.preemptions,
            "decode_steps": r.stats.decode_steps,
            "planned_peak_bytes": planned_peak,
            "measured_peak_bytes": m.peak_bytes,
            "cpu": cpu_name(),
        });
        println!("{v}");
    } else {
        println!(
            "{} · {} requests · weights {} · KV {} in {} blocks of {} tokens · {}",
            worker.config.shape.name,
            a.requests,
            weights.name(),
            kv.name(),
            kv_blocks,
            a.kv_block,
            cpu_name()
        );
        println!(
            "{} tokens in {:.1} s: {tps:.1} tokens/s; latency p50 {p50:.2} s, p90 {p90:.2} s, p99 {p99:.2} s; first token p50 {ttft:.2} s",
            r.stats.generated_tokens, r.seconds
        );
        println!(
            "KV waste {:.1}% paged, {:.1}% for a contiguous cache of {context} tokens per sequence",
            100.0 * r.stats.kv_waste_fraction(),
            100.0 * r.stats.contiguous_waste_fraction()
        );
        if a.shared_prefix > 0 {
            println!(
                "shared prompt of {} tokens: at most {} blocks held, {} without sharing",
                a.shared_prefix, r.stats.peak_blocks, r.stats.peak_blocks_unshared
            );
        }
        println!(
            "at most {} sequences at once (planned {}), {} preemptions (planned {}); peak {} bytes (planned {})",
            r.stats.max_concurrent,
            planned.max_concurrent,
            r.stats.preemptions,
            planned.preemptions,
            group_digits(m.peak_bytes),
            group_digits(planned_peak)
        );
    }
    if m.peak_bytes != planned_peak || r.stats != planned {
        bail!(
            "the run differs from its plan (memory or schedule): a bug in the engine or the plan"
        );
    }
    Ok(())
}
