//! `frugal generate`: text from a trained (or exported, or quantized) model with the inference
//! engine: KV cache, weights in a storage format (`--weights`, quantized on load), a quantized KV
//! cache (`--kv-dtype`), speculative decoding with a draft model (`--draft`), and the planned
//! bytes beside the measured ones. `--kv-cache off` is the reference that recomputes the whole
//! prefix for every token (fp32, no cache).
//!
//! Example: `frugal generate --model run1 --prompt "ROMEO:" --max-new-tokens 64 --weights int4`.

use anyhow::{bail, Context};
use infer::sample::Sampling;
use infer::{spec, Worker};
use models::ModelSource;
use plan::buffer::{Category, Device};
use plan_frugal::{ServeSetup, WeightFormat};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Instant;
use term::{group_digits, Table};

mod reference;
mod storage;
mod tp;

pub use storage::{weight_format, Storage};

const EXAMPLES: &str = "\
Examples:
  frugal generate --model run1 --prompt \"ROMEO:\" --max-new-tokens 64
  frugal generate --model run1 --prompt \"ROMEO:\" --weights int4 --kv-dtype int8 --json
  frugal generate --model run1 --prompt \"ROMEO:\" --draft small-run --draft-tokens 4
  frugal generate --model run1 --prompt \"ROMEO:\" --draft run1 --draft-weights int4
  frugal generate --model run1 --prompt \"ROMEO:\" --weights nf4 --save-quantized run1-nf4
  frugal generate --model SmolLM2-135M-Instruct.Q4_1.gguf --chat \"Hi\" --tp 3
  frugal generate --model run1 --prompt \"ROMEO:\" --kv-cache off      (the reference)";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// A training --out folder or snapshot, a Hugging Face folder, a quantized folder, or a
    /// GGUF file (llama.cpp's; its embedded tokenizer and chat template are used).
    #[arg(long)]
    pub model: PathBuf,
    /// Text to continue (the model's own tokenizer encodes it; a BOS token first if the model
    /// adds one).
    #[arg(long, default_value = "ROMEO:")]
    pub prompt: String,
    /// A chat message instead of --prompt: the model's chat template (from its GGUF file or
    /// tokenizer_config.json) turns it into the prompt, ending where the assistant's answer
    /// begins.
    #[arg(long, conflicts_with = "prompt")]
    pub chat: Option<String>,
    /// The system message of a --chat prompt.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub storage: Storage,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub kv_block: u64,
    /// `off`: recompute the whole prefix for every token (the fp32 reference, no cache).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub kv_cache: String,
    /// A draft model (same tokenizer) for speculative decoding.
    #[arg(long)]
    pub draft: Option<PathBuf>,
    /// The draft's weight storage (default: as --weights). `--draft` may name the target's own
    /// folder with `--draft-weights int4`: a quantized copy of the model drafts for itself.
    #[arg(long, requires = "draft")]
    pub draft_weights: Option<String>,
    /// Tokens the draft proposes per target step.
    #[arg(long, default_value_t = 4, requires = "draft")]
    pub draft_tokens: usize,
    /// Sample among the k most likely tokens (default: greedy).
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling: sample only among the fewest most likely tokens whose probability
    /// reaches P (with --top-k, among its k; default 1: all of them).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the quantized weights here (config.json + weights.frugal), to load later.
    #[arg(long)]
    pub save_quantized: Option<PathBuf>,
    /// Tensor-parallel ranks (threads of this process): attention heads, the MLP and the
    /// vocabulary split across them as Megatron-LM splits them, each rank's bytes planned and
    /// measured.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// With --tp: threads (ranks in this process) or mpi (one rank per process under
    /// `mpirun -n N`; a frugal built with `--features mpi`).
    #[arg(long, default_value = "threads")]
    pub comm: comm::Transport,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.temperature.is_nan() || args.temperature <= 0.0 {
        bail!("--temperature must be positive");
    }
    if args.tp == 0 {
        bail!("--tp 0: give at least one tensor-parallel rank (1: the whole model on one)");
    }
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!(
            "--top-p {}: give a probability above 0 and at most 1",
            args.top_p
        );
    }
    plan::validate::check_kv_block(args.kv_block)?;
    if args.draft.is_some() && !(1..=32).contains(&args.draft_tokens) {
        bail!(
            "--draft-tokens {}: the draft proposes 1 to 32 tokens a step (4 is usual)",
            args.draft_tokens
        );
    }
    let model = ModelSource::at(&args.model)?;
    let tok = model.tokenizer()?;
    let source = model.load()?;
    let text = match &args.chat {
        Some(message) => models::chat::render(&tok, args.system.as_deref(), message)
            .map_err(|e| anyhow::anyhow!("--chat: {e:#}; give the whole prompt with --prompt"))?,
        None => args.prompt.clone(),
    };
    let mut prompt: Vec<u32> = tok.bos().into_iter().collect();
    prompt.extend(tok.encode(&text));
    if prompt.is_empty() {
        bail!("--prompt is empty: generation needs at least one token");
    }
    if tok.vocab_size() as u64 > source.config.shape.vocab {
        bail!(
            "--model {}: its tokenizer has {} tokens, more than the model's {} embedding rows",
            args.model.display(),
            tok.vocab_size(),
            source.config.shape.vocab
        );
    }
    let shape = &source.config.shape;
    let context = prompt.len() + args.max_new_tokens;
    if context as u64 > shape.max_positions {
        bail!(
            "the prompt ({} tokens) plus --max-new-tokens {} is {context} tokens, longer than the \
             model's context of {}: shorten the prompt or generate fewer tokens",
            prompt.len(),
            args.max_new_tokens,
            shape.max_positions
        );
    }
    let vocab = tok.vocab_size() as usize;
    let sampling = Sampling {
        // --top-p alone samples over the whole vocabulary's nucleus.
        top_k: args.top_k.or((args.top_p < 1.0).then_some(vocab)),
        temperature: args.temperature,
        top_p: args.top_p,
        vocab_limit: Some(vocab),
    };
    if args.kv_cache == "off" {
        if args.storage.kv_dtype.is_some() {
            bail!(
                "--kv-dtype stores the KV cache, and --kv-cache off keeps none: give one of them"
            );
        }
        return reference::run(&args, &source, &tok, &prompt, sampling);
    }
    let (weights, kv) = args.storage.formats(&source)?;
    let mut setup = ServeSetup::generation(
        shape,
        1,
        context as u64,
        weights,
        kv,
        args.kv_block,
        infer::default_split_k(),
    );
    if args.draft.is_some() {
        let rows = args.draft_tokens.clamp(1, 32) as u64 + 1;
        setup.prefill_logit_rows = rows;
        setup.prefill_chunk = setup.prefill_chunk.max(rows);
    }
    if args.tp != 1 || args.comm == comm::Transport::Mpi {
        return tp::run(&args, &source, &tok, &prompt, setup, sampling);
    }
    let mut worker = source.worker(setup)?;
    if let Some(dir) = &args.save_quantized {
        save_quantized(&worker, dir)?;
    }
    // The draft is loaded (and quantized) before the clock starts.
    let mut draft = match &args.draft {
        Some(d) => {
            let draft_model = ModelSource::at(d)?;
            if draft_model.tokenizer()?.name() != tok.name() {
                bail!(
                    "--draft {}: its tokenizer differs from the model's; a draft must share the \
                     target's vocabulary",
                    d.display()
                );
            }
            let draft_src = draft_model
                .load()
                .with_context(|| format!("--draft {}", d.display()))?;
            let format = weight_format(
                args.draft_weights
                    .as_deref()
                    .or(args.storage.weights.as_deref()),
                args.storage.weight_group,
                &draft_src,
            )
            .with_context(|| format!("--draft {}", d.display()))?;
            let dsetup = ServeSetup::generation(
                &draft_src.config.shape,
                1,
                context as u64,
                format,
                kv,
                args.kv_block,
                1,
            );
            let draft = draft_src.worker(dsetup)?;
            spec::check_pair(&worker, &draft)?;
            Some(draft)
        }
        None => None,
    };
    let t0 = Instant::now();
    // Whether the worker ran a decode step (speculative decoding verifies drafts with
    // multi-row prefill steps; a run that ends at its first token decodes nothing).
    let (tokens, prefill_s, acceptance, decoded) = match &mut draft {
        Some(draft) => {
            let (out, stats) = spec::generate(
                &mut worker,
                draft,
                &prompt,
                args.max_new_tokens,
                args.draft_tokens,
                &sampling,
                args.seed,
            )?;
            (out, stats.prefill_s, Some(stats), false)
        }
        None => {
            let (out, prefill, decode_steps) = plain(
                &mut worker,
                &prompt,
                args.max_new_tokens,
                &sampling,
                args.seed,
                tok.eos(),
            )?;
            (out, prefill, None, decode_steps > 0)
        }
    };
    let total = t0.elapsed().as_secs_f64();
    // Generation ends at the end-of-sequence token (not printed), as llama.cpp's does.
    let mut tokens = tokens;
    if let Some(at) = tok.eos().and_then(|e| tokens.iter().position(|&t| t == e)) {
        tokens.truncate(at);
    }
    let text = tok.decode(&tokens).unwrap_or_default();
    let decode_s = (total - prefill_s).max(1e-9);
    let run = Run {
        prompt: &prompt,
        tokens: &tokens,
        text: &text,
        prefill_s,
        decode_s,
        acceptance,
        decoded,
    };
    report(&args, &worker, &run)
}

/// The run fails, with `--json` too, when a category or the peak differs from the plan.
fn check_plan(planned: [u64; 6], peak: u64, m: &engine::arena::Measured) -> anyhow::Result<()> {
    if planned != m.category_peak_bytes || peak != m.peak_bytes {
        bail!("measured memory differs from the plan: a bug in the engine or the plan");
    }
    Ok(())
}

/// What one generation did, for the report.
struct Run<'a> {
    prompt: &'a [u32],
    tokens: &'a [u32],
    text: &'a str,
    prefill_s: f64,
    decode_s: f64,
    acceptance: Option<spec::SpecStats>,
    /// Whether a decode step ran: the plan's decode phase is compared only then.
    decoded: bool,
}

/// Prefill then greedy/sampled decode with the worker alone, up to `n` tokens or `eos`; returns
/// the tokens, the prefill's seconds and the decode steps run.
fn plain(
    worker: &mut Worker,
    prompt: &[u32],
    n: usize,
    sampling: &Sampling,
    seed: u64,
    eos: Option<u32>,
) -> anyhow::Result<(Vec<u32>, f64, usize)> {
    let mut rng = data::SplitMix64::new(seed);
    let seq = worker.new_sequence();
    let mut logits = Vec::new();
    let t0 = Instant::now();
    worker.prefill(seq, prompt, &mut logits)?;
    let prefill = t0.elapsed().as_secs_f64();
    let (mut out, mut steps) = (Vec::with_capacity(n), 0);
    for i in 0..n {
        let t = infer::sample::pick(&logits, sampling, &mut rng);
        out.push(t);
        if Some(t) == eos {
            break;
        }
        if i + 1 < n {
            worker.decode(&[seq], &[t], &mut logits)?;
            steps += 1;
        }
    }
    worker.free(seq);
    Ok((out, prefill, steps))
}

fn save_quantized(worker: &Worker, dir: &std::path::Path) -> anyhow::Result<()> {
    if let WeightFormat::Ggml { .. } = worker.setup.weights {
        bail!(
            "--save-quantized with --weights ggml: the GGUF file is already the compact copy of \
             these weights; pass it as --model, or save another format (int8, int4, nf4)"
        );
    }
    // A folder that holds a model would load its quantized copy from then on, silently.
    let held = [
        "model.safetensors",
        "model.safetensors.index.json",
        "manifest.json",
    ];
    let snapshots = std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("step-"))
    });
    let held = held.iter().find(|f| dir.join(f).exists()).copied();
    if let Some(file) = held.or(snapshots.then_some("step-NNNNNN snapshots")) {
        bail!(
            "--save-quantized {}: the folder holds a model ({file}), which would load as the \
             quantized copy from then on; save it to a folder of its own",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--save-quantized {}", dir.display()))?;
    std::fs::write(dir.join("config.json"), worker.config.to_hf_json())
        .with_context(|| format!("--save-quantized {}", dir.display()))?;
    infer::file::save(worker, &dir.join(infer::file::FILE_NAME))?;
    Ok(())
}

/// The per-category fields of the CLI contract, for the plan or the measurement.
pub fn per_device(cats: [u64; 6], peak: u64) -> Map<String, Value> {
    let mut m = Map::new();
    for c in Category::ALL {
        m.insert(c.json_field().into(), json!(cats[c as usize]));
    }
    m.insert("peak_bytes".into(), json!(peak));
    m
}

/// The plan of the phases that ran: prefill and decode, or prefill alone.
fn phases_run(worker: &Worker, decoded: bool) -> ([u64; 6], u64) {
    match decoded {
        true => (
            worker.plan.category_peaks(Device::Gpu),
            worker.plan.peak_bytes(Device::Gpu),
        ),
        false => {
            let prefill = worker.plan.timeline(Device::Gpu)[0].1;
            (prefill, prefill.iter().sum())
        }
    }
}

fn report(args: &Args, worker: &Worker, run: &Run<'_>) -> anyhow::Result<()> {
    let Run {
        prompt,
        tokens,
        text,
        prefill_s,
        decode_s,
        acceptance,
        decoded,
    } = *run;
    let (planned, planned_peak) = phases_run(worker, decoded);
    let m = worker.measured();
    let prefill_tps = if prefill_s > 0.0 {
        prompt.len() as f64 / prefill_s
    } else {
        0.0
    };
    let decode_tps = tokens.len() as f64 / decode_s;
    if args.json {
        let v = json!({
            "tokens": tokens,
            "text": text,
            "weights": worker.setup.weights.name(),
            "weight_group": worker.setup.weights.group(),
            "kv_dtype": worker.setup.kv.name(),
            "prompt_tokens": prompt.len(),
            "prompt_token_ids": prompt,
            "prefill_tokens_per_s": prefill_tps,
            "decode_tokens_per_s": decode_tps,
            "planned": per_device(planned, planned_peak),
            "measured": per_device(m.category_peak_bytes, m.peak_bytes),
            "acceptance_rate": acceptance.map(|s| s.acceptance_rate()),
            "target_steps": acceptance.map(|s| s.target_steps),
        });
        println!("{v}");
        return check_plan(planned, planned_peak, &m);
    }
    match &args.chat {
        Some(_) => println!("{text}"),
        None => println!("{}{}", args.prompt, text),
    }
    let mut t = Table::new(&["bytes", "planned", "measured"]);
    for c in Category::ALL {
        let (p, q) = (planned[c as usize], m.category_peak_bytes[c as usize]);
        if p > 0 || q > 0 {
            t.row(vec![c.label().into(), group_digits(p), group_digits(q)]);
        }
    }
    t.row(vec![
        "peak".into(),
        group_digits(planned_peak),
        group_digits(m.peak_bytes),
    ]);
    eprintln!();
    eprintln!(
        "weights {} · KV {} · prefill {} tokens at {prefill_tps:.1} tokens/s · decode {} tokens at {decode_tps:.1} tokens/s",
        worker.setup.weights.name(),
        worker.setup.kv.name(),
        prompt.len(),
        tokens.len()
    );
    match acceptance {
        Some(s) if s.drafted == 0 => eprintln!("speculative: no draft tokens proposed"),
        Some(s) => eprintln!(
            "speculative: {} of {} draft tokens accepted ({:.0}%), {} target steps",
            s.accepted,
            s.drafted,
            100.0 * s.acceptance_rate(),
            s.target_steps
        ),
        None => {}
    }
    eprint!("{}", t.render());
    check_plan(planned, planned_peak, &m)
}
