//! `frugal fit`: which training setups fit a device's memory, ranked by predicted step time.
//!
//! Parses flags into a `fit::FitRequest` (reading `--model path/config.json` here), runs the
//! search, and prints the best few setups as a table, the remedies each applies, and why
//! the rest don't fit; `--json` prints one object. Not here: the search and the cost model
//! (`fit`). Example: `frugal fit --model llama3-8b --gpus 8 --device-memory 80GiB --batch 32`.

mod infer;
mod render;

use anyhow::bail;
use fit::{self, FitRequest, Hardware, LoraChoice, Runtime};
use plan::setup::{Attention, Optimizer, Precision};
use plan::{units, ModelShape};

const LONG_ABOUT: &str = "\
Search the training setups that fit a device's memory and rank them by predicted step time.

Candidates: every data × tensor × pipeline split of --gpus (TP inside a node, dividing the heads;
sequence parallelism on with TP), ZeRO stage 0-3 with offload none/optimizer/params (as DeepSpeed
allows), recompute none/selective/full/sqrt/every:K, every micro-batch dividing a rank's share of
the global batch (the rest accumulated, so the global batch never changes), flash and eager
attention, and with --allow-lora LoRA/QLoRA on bf16, int8 and nf4 bases (never chosen unasked:
it changes what is trained). Memory comes from the runtime profile (`formula` by default; a setup
the runtime does not model is reported as unsupported, not dropped). A setup fits when its total
(allocator reserve + CUDA context, what nvidia-smi shows) is at most --device-memory.

Step time: matmul FLOPs (6N per token + attention, plus the forward a recompute policy repeats)
at the GPU's peak × --mfu (the GEMMs' efficiency, 0.6), plus eager PyTorch's element-wise
kernels, the loss's fp32 passes and the optimizer's pass at 80% of the HBM bandwidth, 5 µs per
kernel, and never less than the host's dispatch of every kernel (20 µs each: small models' floor);
calibrated on the H200 calibration's eager step times (median error 7%). Data-parallel traffic
per the ZeRO paper (2Ψ per step for stages 0-2, 3Ψ for stage 3; ZeRO-2/3 repeat per micro-batch)
overlaps with compute; TP all-reduces, pipeline sends, the 1F1B bubble (p-1)/(m+p-1) and
offload's PCIe transfers and host Adam add on top. GPU figures are datasheet peaks (--gpu), not
measurements; override them with the flags above. `frugal plan --gpu` prints the same step time.

Candidates also try pure bf16 (no fp32 master copy) and 8-bit AdamW unless --keep-precision.
Ties (within 0.1%) go to the usual order of remedies: 1 smaller micro-batch + accumulation,
2 recompute, 3 higher ZeRO stage (not on one GPU: there it only carries offload), 4 offload,
5 flash attention, 6 pure bf16 / 8-bit Adam, then LoRA/QLoRA and TP/PP; fewer remedies first,
then earlier ones, then the lighter form of each. Without --allow-lora, a LoRA/QLoRA setup is
named when full fine-tuning does not fit or is at least 10x slower.

Headroom: a setup fits when its total is at most (1 - --headroom) × --device-memory (default 5%
kept free for fragmentation and other processes).

Inference (--infer): weight formats bf16, fp8, int8, int4 (groups of 128) and nf4 (64), and
for a GGUF file first its own tensor types (ggml, at the bytes its tensors take) × KV formats
bf16, fp8 and int8 × every tensor-parallel degree of --gpus × weights on the device or
offloaded to host memory (streamed block by block). Each answer shows its total per GPU at
--batch sequences of --seq tokens (default 1 × min(4096, positions)), the largest batch at that
context and the longest context at that batch, decode tokens/s (memory-bound: this rank's
weights and the batch's KV cache read at 80% of the HBM bandwidth, or the host link's for
offloaded weights; compute-bound past that) and the prefill time; ranked with setups on the
device before offloaded ones, a GGUF file's own types first, then by decode speed, then
fidelity. When only offload fits, it says how many GPUs serve the request without it.

Examples:
  frugal fit --model llama3-8b --gpus 8 --device-memory 80GiB --batch 32 --seq 2048
  frugal fit --model llama2-7b --gpus 1 --gpu rtx4090 --batch 8 --seq 1024 --allow-lora
  frugal fit --model llama3-70b --gpus 16 --gpu h200 --batch-tokens 1048576 --seq 4096 --top 10
  frugal fit --model path/to/config.json --gpus 8 --device-memory 40GiB --json
  frugal fit --infer --model llama2-70b --device-memory 24GiB --gpus 1 --json
  frugal fit --infer --model llama3-8b --gpu rtx4090 --batch 8 --seq 8192";

/// Search the setups that fit and rank them by predicted step time.
#[derive(clap::Args)]
// after_help, not long_about: the subcommand's doc comment in main.rs replaces long_about.
#[command(after_help = LONG_ABOUT)]
#[command(group(clap::ArgGroup::new("global").args(["batch", "batch_tokens"])))]
pub struct Args {
    /// A preset (llama3-8b, llama2-7b, gpt2-124m, mixtral-8x7b, ...) or a path to an HF config.json.
    #[arg(long, value_name = "NAME|PATH")]
    model: String,
    /// GPUs in all (split into data × tensor × pipeline parallel groups by the search).
    #[arg(long, default_value_t = 1)]
    gpus: u32,
    /// Usable memory per GPU (80GiB, 80GB, 24GiB); default: the --gpu's capacity.
    #[arg(long, value_name = "SIZE")]
    device_memory: Option<String>,
    /// GPU for speeds and default memory: h100 (the default), h200, a100-80g, a100-40g, l40s,
    /// rtx4090.
    #[arg(long)]
    gpu: Option<String>,
    /// Global batch: sequences per optimizer step over all GPUs (default: one per GPU).
    #[arg(long)]
    batch: Option<u64>,
    /// Global batch in tokens (1M, 524288): a multiple of --seq.
    #[arg(long, value_name = "COUNT")]
    batch_tokens: Option<String>,
    /// Sequence length; default min(2048, the model's positions).
    #[arg(long)]
    seq: Option<u64>,
    /// fp32, amp-bf16, amp-fp16, bf16, fp16 or pure-bf16 (as `frugal plan`).
    #[arg(long, default_value_t = Precision::Bf16)]
    precision: Precision,
    /// adamw, adamw8bit or sgd.
    #[arg(long, default_value_t = Optimizer::AdamW)]
    optimizer: Optimizer,
    /// The attention you run today: with eager, flash counts as a remedy.
    #[arg(long, default_value_t = Attention::DEFAULT)]
    attention: Attention,
    /// Memory model: formula (every setup), pytorch (one GPU, plain PyTorch), frugal (this engine).
    #[arg(long, default_value = "formula")]
    runtime: String,
    /// Keep --precision and --optimizer: propose neither pure bf16 (no fp32 master copy) nor
    /// 8-bit AdamW.
    #[arg(long)]
    keep_precision: bool,
    /// Also propose LoRA/QLoRA (bf16, int8 and nf4 bases): it trains adapters, not the model.
    #[arg(long)]
    allow_lora: bool,
    /// LoRA rank when --allow-lora.
    #[arg(long, default_value_t = 16, requires = "allow_lora")]
    lora_rank: u32,
    /// LoRA target modules (comma-separated HF names, or all-linear) when --allow-lora.
    #[arg(
        long,
        default_value = "all-linear",
        value_delimiter = ',',
        requires = "allow_lora"
    )]
    lora_targets: Vec<String>,
    /// Pin the tensor-parallel degree instead of searching it.
    #[arg(long)]
    tp: Option<u32>,
    /// Pin the pipeline-parallel degree instead of searching it.
    #[arg(long)]
    pp: Option<u32>,
    /// The GEMMs' efficiency: the fraction of the tensor-core peak matmuls reach (element-wise
    /// kernels, the optimizer and dispatch are modelled apart).
    #[arg(long, default_value_t = fit::hardware::DEFAULT_MFU)]
    mfu: f64,
    /// fp32 matmuls on TF32 tensor cores (`torch.backends.cuda.matmul.allow_tf32 = True`).
    #[arg(long)]
    tf32: bool,
    /// Peak dense TFLOP/s of one GPU (overrides --gpu's, for every precision).
    #[arg(long)]
    tflops: Option<f64>,
    /// HBM bandwidth of one GPU (4.8TB/s for an H200): overrides --gpu's, for decode and the
    /// element-wise kernels.
    #[arg(long, value_name = "RATE")]
    hbm_bandwidth: Option<String>,
    /// GPU-to-GPU bandwidth in a node per direction (450GB/s for NVLink 4, 32GB/s for PCIe 4).
    #[arg(long, value_name = "RATE")]
    link_bandwidth: Option<String>,
    /// Network bandwidth per GPU between nodes per direction (50GB/s = 400 Gb/s InfiniBand).
    #[arg(long, value_name = "RATE")]
    inter_node_bandwidth: Option<String>,
    /// Host-to-GPU bandwidth per direction, for offload (64GB/s for PCIe 5 x16).
    #[arg(long, value_name = "RATE")]
    host_link_bandwidth: Option<String>,
    /// GPUs per node (one NVLink domain, one host).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Optimizer elements the host's CPU Adam updates per second per node (offload).
    #[arg(long, value_name = "COUNT", default_value = "2B")]
    host_adam_rate: String,
    /// How many of the best setups to show (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    top: u64,
    /// Keep this fraction of --device-memory free (fragmentation, other processes): a setup
    /// fits when its total is at most (1 - headroom) × the capacity.
    #[arg(long, default_value_t = 0.05)]
    headroom: f64,
    /// Advise on inference instead of training: the weight format, KV format, TP degree or
    /// weight offload that serve --batch sequences of --seq tokens, the largest batch and
    /// context each holds, decode tokens/s and prefill time.
    #[arg(long)]
    infer: bool,
    /// With --infer: only this weight format (bf16, fp8, int8, int4, nf4; ggml: a GGUF file's own
    /// tensor types, which a GGUF model is weighed in first).
    #[arg(long)]
    weights: Option<plan::setup::Dtype>,
    /// With --infer: only this KV-cache format (bf16, fp8, int8).
    #[arg(long)]
    kv_dtype: Option<plan::setup::Dtype>,
    /// Host memory per node (512GiB): offloaded state of every rank on the node, or the model
    /// copies while loading; with --infer, offloaded weights. Default unlimited.
    #[arg(long, value_name = "SIZE")]
    host_memory: Option<String>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Print the config of the fastest fitting setup the format expresses (one data-parallel
    /// group, AdamW or SGD, no or full recompute) instead of tables:
    /// `frugal fit ... --emit deepspeed > ds_config.json`; the command that plans it back
    /// goes to stderr.
    #[arg(long, value_enum, conflicts_with_all = ["json", "infer"])]
    emit: Option<configs::emit::Target>,
    /// A config.json's text given directly (the web page's pasted config).
    #[arg(skip)]
    pub config_text: Option<String>,
}

/// The GPU speeds come from when `--gpu` is not given.
const DEFAULT_GPU: &str = "h100";

/// Without `--gpu`, which GPU the speeds assume, and the known GPU of `--device-memory`'s size
/// the user more likely has.
fn gpu_note(args: &Args, hw: &Hardware, capacity_bytes: u64) -> Option<String> {
    if args.gpu.is_some() || args.hbm_bandwidth.is_some() || args.tflops.is_some() {
        return None;
    }
    let g = &hw.gpu;
    let mut note = format!(
        "no --gpu given: speeds assume an {} ({:.2} TB/s of HBM, {:.0} TFLOP/s bf16)",
        g.name,
        g.hbm_bytes_per_s / 1e12,
        g.bf16_flops / 1e12
    );
    let same_size = fit::GPUS
        .iter()
        .find(|o| o.memory_bytes.abs_diff(capacity_bytes) < (1 << 30) && o.name != g.name);
    match same_size {
        Some(o) if capacity_bytes.abs_diff(g.memory_bytes) >= (1 << 30) => note.push_str(&format!(
            "; a {} device is more likely an {}: pass --gpu {}",
            term::human_bytes(capacity_bytes),
            o.name,
            o.name
        )),
        _ => note.push_str("; pass --gpu NAME (h100, h200, a100-80g, a100-40g, l40s, rtx4090)"),
    }
    Some(note)
}

fn parse_rate(text: &str, field: &str) -> anyhow::Result<f64> {
    let bytes = text.trim().trim_end_matches("/s");
    Ok(units::parse_bytes(bytes, field)? as f64)
}

fn hardware(args: &Args) -> anyhow::Result<Hardware> {
    let mut hw = Hardware::of(fit::gpu_by_name(
        args.gpu.as_deref().unwrap_or(DEFAULT_GPU),
    )?);
    hw.mfu = args.mfu;
    hw.tf32 = args.tf32;
    hw.gpus_per_node = args.gpus_per_node;
    if let Some(t) = args.tflops {
        (hw.gpu.bf16_flops, hw.gpu.fp32_flops) = (t * 1e12, t * 1e12);
    }
    if let Some(r) = &args.hbm_bandwidth {
        hw.gpu.hbm_bytes_per_s = parse_rate(r, "--hbm-bandwidth")?;
    }
    if let Some(r) = &args.link_bandwidth {
        hw.gpu.intra_node_bytes_per_s = parse_rate(r, "--link-bandwidth")?;
    }
    if let Some(r) = &args.inter_node_bandwidth {
        hw.gpu.inter_node_bytes_per_s = parse_rate(r, "--inter-node-bandwidth")?;
    }
    if let Some(r) = &args.host_link_bandwidth {
        hw.gpu.host_link_bytes_per_s = parse_rate(r, "--host-link-bandwidth")?;
    }
    hw.host_adam_elems_per_s = units::parse_count(&args.host_adam_rate, "--host-adam-rate")? as f64;
    Ok(hw)
}

/// The hardware, the device's capacity (`--device-memory`, or the GPU's) and the model (a preset,
/// a config.json path, or the page's pasted config) the flags name.
fn machine_and_model(args: &Args) -> anyhow::Result<(Hardware, u64, ModelShape)> {
    let hw = hardware(args)?;
    let capacity_bytes = match &args.device_memory {
        Some(s) => units::parse_bytes(s, "--device-memory")?,
        None => hw.gpu.memory_bytes,
    };
    let model =
        models::ModelSource::resolve_or_text(&args.model, args.config_text.as_deref())?.shape()?;
    Ok((hw, capacity_bytes, model))
}

fn host_memory(args: &Args) -> anyhow::Result<Option<u64>> {
    args.host_memory
        .as_deref()
        .map(|s| units::parse_bytes(s, "--host-memory"))
        .transpose()
        .map_err(Into::into)
}

/// Raw flags → a checked request (the model loaded, sizes parsed, the global batch in sequences).
pub fn build_request(args: &Args) -> anyhow::Result<(ModelShape, FitRequest)> {
    if args.gpus == 0 {
        bail!("invalid --gpus: must be at least 1 (the GPUs to split into data, tensor and pipeline groups)");
    }
    let (hw, capacity_bytes, model) = machine_and_model(args)?;
    let seq = args.seq.unwrap_or(2048.min(model.max_positions));
    if seq == 0 {
        bail!("invalid --seq: must be at least 1 token");
    }
    let global_batch = match (&args.batch_tokens, args.batch) {
        (Some(t), _) => {
            let tokens = units::parse_count(t, "--batch-tokens")?;
            if tokens % seq != 0 || tokens == 0 {
                bail!("invalid --batch-tokens: {tokens} tokens are not a whole number of {seq}-token sequences: use a multiple of --seq");
            }
            tokens / seq
        }
        (None, Some(b)) => b,
        (None, None) => args.gpus as u64,
    };
    let request = FitRequest {
        precision: args.precision,
        optimizer: args.optimizer,
        global_batch,
        seq,
        gpus: args.gpus,
        capacity_bytes,
        headroom: args.headroom,
        host_capacity_bytes: host_memory(args)?,
        hardware: hw,
        runtime: Runtime::parse(&args.runtime)?,
        attention: args.attention,
        keep_states: args.keep_precision,
        lora: args.allow_lora.then(|| LoraChoice {
            rank: args.lora_rank,
            targets: args.lora_targets.clone(),
        }),
        bounds: fit::Bounds {
            tp: args.tp,
            pp: args.pp,
            ..fit::Bounds::default()
        },
    };
    fit::check_request(&model, &request)?;
    Ok((model, request))
}

/// `fit --infer`: the inference advisor's request from the flags.
fn infer_request(args: &Args) -> anyhow::Result<(ModelShape, fit::infer::InferRequest)> {
    if args.gpus == 0 {
        bail!("invalid --gpus: must be at least 1 (the GPUs tensor parallelism may use)");
    }
    let (hw, capacity_bytes, model) = machine_and_model(args)?;
    let seq = args.seq.unwrap_or(4096.min(model.max_positions));
    let host_bytes = host_memory(args)?;
    let r = fit::infer::InferRequest {
        batch: args.batch.unwrap_or(1),
        seq,
        gpus: args.gpus,
        capacity_bytes,
        headroom: args.headroom,
        host_bytes,
        hardware: hw,
        weights: args.weights,
        kv_dtype: args.kv_dtype,
        // (A file whose tensors cannot be weighed is planned in the other formats.)
        ggml_file: match args.config_text {
            Some(_) => None,
            None => models::ModelSource::resolve(&args.model)
                .and_then(|s| s.ggml_file())
                .ok()
                .flatten(),
        },
    };
    fit::infer::check(&model, &r)?;
    Ok((model, r))
}

/// The JSON object `frugal fit --json` prints (the web page's `/api/fit`).
pub fn json(args: &Args) -> anyhow::Result<serde_json::Value> {
    let top = args.top as usize;
    if args.infer {
        let (model, r) = infer_request(args)?;
        let advice = fit::infer::advise(&model, &r)?;
        let note = gpu_note(args, &r.hardware, r.capacity_bytes);
        return Ok(infer::to_json(&model, &r, &advice, top, note));
    }
    let (model, request) = build_request(args)?;
    let result = fit::search(&model, &request)?;
    let found = render::Found::of(&model, &request, &result);
    Ok(render::to_json(&found, top))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&args)?)?);
        return Ok(());
    }
    let top = args.top as usize;
    if args.infer {
        let (model, r) = infer_request(&args)?;
        let advice = fit::infer::advise(&model, &r)?;
        let note = gpu_note(&args, &r.hardware, r.capacity_bytes);
        print!("{}", infer::text(&model, &r, &advice, top, note));
        return Ok(());
    }
    let (model, request) = build_request(&args)?;
    let result = fit::search(&model, &request)?;
    if let Some(target) = args.emit {
        return emit(&args, target, &result);
    }
    let found = render::Found::of(&model, &request, &result);
    print!("{}", render::text(&found, top));
    Ok(())
}

/// `fit --emit`: the fastest fitting setup `target` expresses, as its config on stdout.
fn emit(args: &Args, target: configs::emit::Target, result: &fit::FitResult) -> anyhow::Result<()> {
    use configs::emit;
    let Some(best) = result
        .fitting
        .iter()
        .find(|w| emit::expresses(target, &w.setup))
    else {
        bail!(
            "no fitting setup that {target:?} expresses (one data-parallel group, AdamW or SGD, \
             no or full recompute, no LoRA): run without --emit to see what fits"
        );
    };
    let s = &best.setup;
    let file = match target {
        emit::Target::Deepspeed => {
            println!("{}", serde_json::to_string_pretty(&emit::deepspeed(s))?);
            "ds_config.json"
        }
        emit::Target::Accelerate => {
            print!("{}", emit::accelerate(s));
            "accelerate.yaml"
        }
    };
    let total = best.memory().map_or(0, |m| m.total_bytes);
    let mut back = emit::read_back(target, s, &args.model, file);
    back.extend(["--runtime".to_string(), args.runtime.clone()]);
    eprintln!(
        "{}: {} per GPU = {total} bytes\nplan it back (saved as {file}): frugal {}\n\
         its \"auto\" values (learning rate, weight decay, clipping) are filled by HF's Trainer \
         or accelerate",
        render::short_setup(s),
        term::human_bytes(total),
        back.join(" ")
    );
    if emit::checkpointing_in_script(target, s) {
        eprintln!(
            "with HF's Trainer also pass gradient_checkpointing=True (the model checkpoints its layers)"
        );
    }
    Ok(())
}
