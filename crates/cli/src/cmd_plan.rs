//! `frugal plan`: memory per device of a training or inference setup, before anything runs.
//!
//! Parses flags into a validated `plan` setup (reading `--model path/config.json` here, since the
//! plan crate never touches files), asks a runtime profile for the estimate, and prints a table
//! per category (GiB and GB side by side), `--json` as docs/cli.md specifies, and `--plot` as an
//! SVG of memory over the step. Example:
//! `frugal plan --model llama3-8b --train --zero 3 --gpus 8 --batch 4 --seq 2048 --json`.

mod gguf;
mod plot;
mod pytorch;
mod render;

use anyhow::{anyhow, bail};
use fit::report::{self, Report};
use gguf::{ggml_base, gguf_blocks, gguf_file};
use plan::setup::{
    Attention, Convention, Dtype, InferSetup, Lora, Offload, Optimizer, Precision, Recompute,
    TrainSetup, ZeroStage,
};
use plan::{formula, infer, units, Estimate, ModelShape, PlanError};
use plan_frugal::device::Device;
use plan_frugal::WeightFormat;
use std::path::PathBuf;

/// `frugal plan --help`'s text (set on the subcommand in `main.rs`: its summary there would
/// replace a `long_about` given here).
pub const LONG_ABOUT: &str = "\
Memory per device of a training or inference setup, before anything runs.

The plan is a list of buffers (parameters, gradients, optimizer state, activations, KV cache,
communication buckets and workspaces), each born and freed at a phase of the step: forward layer
by layer, head and loss, backward, optimizer step. The peak is the largest sum of live bytes.
Sizes print in GiB (2^30 bytes) and GB (10^9 bytes), labelled as such.

Runtimes: `pytorch` replays what PyTorch and HF transformers allocate op by op,
the caching allocator's reserve and the CUDA context; `formula` is the analytic model of the
papers (ZeRO, Korthikanti et al. 2022 activations); `frugal` is this project's engine,
exact to the byte. The default, `auto`, asks `pytorch` first (plain PyTorch and DDP, DeepSpeed
ZeRO 0-3 with optimizer offload, PEFT LoRA/QLoRA, HF inference) and falls back to `formula`
where `pytorch` refuses the setup (tensor or pipeline parallelism, parameter offload, KV formats
HF does not cache, ...), printing the reason. `--params 7B` (a bare parameter count) always uses
`formula` and counts model states only (no shape, no activations).

Convention (`formula` only): `deepspeed` (default) counts what DeepSpeed allocates, the fp32
copy of the gradient partition its step makes included; `paper` is the ZeRO paper's 2 + 2 + 12
bytes per parameter, the classic table (`--params 7B --zero 2 --gpus 8 --convention paper`:
26.25 GB). Under ZeRO-2/3 with `--offload optimizer` no gradient partition stays on the device.

Precision: fp32; amp-bf16 / amp-fp16 (fp32 weights, autocast); bf16 / fp16 (16-bit weights and
gradients, fp32 master weights and optimizer state, as DeepSpeed and Megatron); pure-bf16 (bf16
weights and bf16 optimizer state, no master copy).

Examples:
  frugal plan --params 7B --train --zero 2 --gpus 8 --convention paper
      the classic ZeRO table: 26.25 GB of model states per GPU
  frugal plan --model llama3-8b --train --precision amp-bf16 --zero 3 --gpus 8 \\
      --batch 4 --seq 2048 --recompute full --json
  frugal plan --model llama2-7b --infer --weights int4 --weight-group 128 --kv-dtype fp8 \\
      --batch 8 --seq 4096
  frugal plan --model path/to/config.json --train --lora-rank 16 \\
      --lora-targets q_proj,v_proj --lora-base nf4 --device-memory 24GiB
  frugal plan --model gpt2-124m --train --batch 8 --seq 1024 --plot memory.svg";

/// Memory plan of a training or inference setup, per device.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["model", "params"])))]
#[command(group(clap::ArgGroup::new("mode").args(["train", "infer"])))]
pub struct Args {
    /// A preset (llama3-8b, llama2-7b, gpt2-124m, mixtral-8x7b, deepseek-v3, ...) or a path to an
    /// HF config.json (gpt2, llama, mistral, qwen2, mixtral, deepseek_v2/v3).
    #[arg(long, value_name = "NAME|PATH")]
    model: Option<String>,
    /// A bare parameter count (7B, 1.5B, 124M) for the ZeRO paper's model-state formulas.
    #[arg(long, value_name = "COUNT", allow_hyphen_values = true)]
    params: Option<String>,
    /// Plan a training step (the default).
    #[arg(long)]
    train: bool,
    /// Plan inference: weights, KV cache, prefill and decode.
    #[arg(long)]
    infer: bool,
    /// fp32, amp-bf16, amp-fp16, bf16, fp16 or pure-bf16.
    #[arg(long, default_value_t = Precision::Bf16)]
    precision: Precision,
    /// adamw, adamw8bit or sgd (with momentum).
    #[arg(long, default_value_t = Optimizer::AdamW)]
    optimizer: Optimizer,
    /// ZeRO stage 0-3: 1 shards optimizer state, 2 also gradients, 3 also parameters.
    #[arg(long, default_value_t = ZeroStage::Zero0)]
    zero: ZeroStage,
    /// Data-parallel GPUs (the ranks ZeRO shards over; `--ranks` as `frugal train` says it).
    #[arg(long, visible_alias = "ranks", default_value_t = 1)]
    gpus: u32,
    /// Tensor-parallel degree (divides the query heads; key/value heads split over it, or each
    /// replicates on the ranks that share it).
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Pipeline-parallel degree (1F1B schedule; the busiest stage is reported).
    #[arg(long, default_value_t = 1)]
    pp: u32,
    /// Sequence parallelism along the tensor-parallel group (Megatron).
    #[arg(long)]
    sp: bool,
    /// Micro-batch size per GPU (training) or concurrent sequences (inference).
    #[arg(long, default_value_t = 1)]
    batch: u64,
    /// Sequence length (training) or context length (inference); default min(2048, positions).
    #[arg(long)]
    seq: Option<u64>,
    /// Micro-batches accumulated per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: u32,
    /// none, full, every:K, sqrt, selective (Megatron's: the attention core) or keep-matmuls
    /// (keep the matmul outputs, recompute the rest).
    #[arg(long, default_value_t = Recompute::None)]
    recompute: Recompute,
    /// flash (no T×T matrix kept) or eager (also spelled naive).
    #[arg(long, default_value_t = Attention::DEFAULT)]
    attention: Attention,
    /// none, optimizer (ZeRO-Offload: optimizer state in host memory) or params (also weights).
    #[arg(long, default_value_t = Offload::None)]
    offload: Offload,
    /// LoRA rank; enables LoRA (frozen base, trainable adapters).
    #[arg(long)]
    lora_rank: Option<u32>,
    /// Linear layers that get adapters, comma-separated HF names, or all-linear.
    #[arg(long, default_value = "q_proj,v_proj", value_delimiter = ',')]
    lora_targets: Vec<String>,
    /// Frozen base weights: bf16, int8 (LLM.int8) or nf4 (QLoRA).
    #[arg(long, default_value_t = Dtype::Bf16)]
    lora_base: Dtype,
    /// LoRA dropout on the adapters' input (the frugal runtime plans its scratch when > 0).
    #[arg(long, default_value_t = 0.0)]
    lora_dropout: f32,
    /// Inference weight format: fp32, fp16, bf16, fp8, int8, int4, nf4, or ggml (a GGUF file's
    /// blocks as the frugal runtime holds them: int8 codes, an fp32 scale and minimum per 32, or
    /// 16 in a file with Q6_K).
    /// Default: bf16; with the frugal runtime, a quantized GGUF file's own blocks (ggml).
    #[arg(long)]
    weights: Option<Dtype>,
    /// Weights per quantization scale (default: int8 one scale per output row, int4 128 as
    /// GPTQ/AWQ, nf4 64 as bitsandbytes).
    #[arg(long)]
    weight_group: Option<u64>,
    /// nf4 weights with bitsandbytes' double quantization (bnb_4bit_use_double_quant; HF's
    /// default is off).
    #[arg(long)]
    double_quant: bool,
    /// KV-cache format: bf16, fp16, fp8 or int8.
    #[arg(long, default_value_t = Dtype::Bf16)]
    kv_dtype: Dtype,
    /// Paged KV cache with blocks of this many tokens (vLLM uses 16); default contiguous.
    #[arg(long)]
    kv_block: Option<u64>,
    /// Model-state accounting of the formula runtime: deepspeed (what DeepSpeed allocates: the
    /// step's fp32 gradient partition, no device gradients under ZeRO-2/3 offload) or paper
    /// (the ZeRO paper's 2 + 2 + 12 bytes, as the classic table). `paper` plans with formula.
    #[arg(long, default_value_t = Convention::Deepspeed)]
    convention: Convention,
    /// auto, pytorch (PyTorch + HF transformers on CUDA), formula (analytic) or frugal (this
    /// engine). auto: pytorch unless it refuses the setup, then formula, and says why; a
    /// quantized GGUF file's --infer plan is formula's, in the file's own tensor types.
    #[arg(long, default_value = "auto")]
    runtime: String,
    #[arg(long, default_value = "cpu", help = plan_frugal::device::Device::help())]
    device: plan_frugal::device::Device,
    /// Print one JSON object (its fields: docs/cli.md) instead of tables.
    #[arg(long)]
    json: bool,
    /// Write memory over the step's phases, stacked by category, to this SVG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// GPU the predicted step time is for (training with --model): h100, h200, a100-80g,
    /// a100-40g, l40s, rtx4090 (as `frugal fit --gpu`).
    #[arg(long, default_value = "h100")]
    gpu: String,
    /// fp32 matmuls on TF32 tensor cores, for the step time (`allow_tf32 = True`).
    #[arg(long)]
    tf32: bool,
    /// A config.json's text given directly (the web page's pasted config), read instead of
    /// the file `--model` names.
    #[arg(skip)]
    pub config_text: Option<String>,
    /// Say whether the plan fits a device of this size (80GiB, 80GB, 24GiB).
    #[arg(long, value_name = "SIZE")]
    device_memory: Option<String>,
    /// Read the training setup from DeepSpeed's ds_config.json: ZeRO stage, offload, bf16/fp16,
    /// micro-batch and accumulation over --gpus, activation checkpointing, bucket sizes.
    /// "auto" takes the flag's value; a flag that disagrees with the file is an error.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["accelerate", "infer"])]
    deepspeed: Option<PathBuf>,
    /// Read the training setup from accelerate's config YAML (FSDP, DeepSpeed or DDP);
    /// the micro-batch stays --batch (it is the training script's).
    #[arg(long, value_name = "FILE", conflicts_with = "infer")]
    accelerate: Option<PathBuf>,
    /// A ds_config.json's text given directly (the web page's pasted config).
    #[arg(skip)]
    pub deepspeed_text: Option<String>,
}

/// The training setup of the flags, read over by a DeepSpeed or accelerate config when one is
/// given; `hidden` resolves the config's `"auto"` bucket sizes.
fn train_setup(
    args: &Args,
    seq: u64,
    hidden: Option<u64>,
) -> anyhow::Result<(TrainSetup, Option<report::ConfigSource>)> {
    let given = flag_setup(args, seq)?;
    let default = TrainSetup {
        lora: given.lora.clone(),
        convention: given.convention,
        attention: given.attention,
        ..TrainSetup::new(1, seq)
    };
    let flags = configs::Flags {
        given: &given,
        default: &default,
    };
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))
    };
    let (read, file) = if let Some(text) = &args.deepspeed_text {
        let r = configs::deepspeed::read(text, "the pasted ds_config", &flags, hidden)?;
        (r, "pasted ds_config".to_string())
    } else if let Some(path) = &args.deepspeed {
        let origin = path.display().to_string();
        let r = configs::deepspeed::read(&read(path)?, &origin, &flags, hidden)?;
        (r, origin)
    } else if let Some(path) = &args.accelerate {
        let origin = path.display().to_string();
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        let r = configs::accelerate::read(&read(path)?, &origin, dir, &flags, hidden)?;
        (r, origin)
    } else {
        return Ok((given, None));
    };
    let source = report::ConfigSource {
        file,
        summary: read.summary,
        not_planned: read.not_planned,
    };
    Ok((read.setup, Some(source)))
}

fn flag_setup(args: &Args, seq: u64) -> anyhow::Result<TrainSetup> {
    Ok(TrainSetup {
        precision: args.precision,
        optimizer: args.optimizer,
        zero: args.zero,
        dp: args.gpus,
        tp: args.tp,
        pp: args.pp,
        sp: args.sp,
        micro_batch: args.batch,
        seq,
        grad_accum: args.grad_accum,
        recompute: args.recompute,
        attention: args.attention,
        offload: args.offload,
        lora: args.lora_rank.map(|rank| Lora {
            rank,
            targets: args.lora_targets.clone(),
            base: args.lora_base,
            double_quant: args.double_quant,
            dropout: args.lora_dropout,
            ggml: ggml_base(args),
        }),
        convention: args.convention,
        zero_buffers: plan::setup::ZeroBuffers::DEEPSPEED,
    })
}

fn infer_setup(args: &Args, seq: u64, runtime: &str) -> anyhow::Result<InferSetup> {
    // ggml weights take a GGUF file's own group, as generate does; the frugal runtime runs a
    // quantized GGUF file's blocks by default.
    let file = gguf_file(args).filter(|_| matches!(args.weights, None | Some(Dtype::Ggml)));
    let file_format = file.as_ref().and_then(|s| s.own_format().ok().flatten());
    let (file_group, nibbles) = match file_format {
        Some(WeightFormat::Ggml { group, nibbles }) => (Some(group), nibbles),
        _ => (None, plan::roles::Roles::NONE),
    };
    let weights = match (args.weights, file_group, runtime) {
        (Some(w), _, _) => w,
        (None, Some(_), "frugal" | "formula") => Dtype::Ggml,
        (None, _, _) => Dtype::Bf16,
    };
    Ok(InferSetup {
        weights,
        weight_group: match (weights, file_group) {
            (Dtype::Ggml, Some(g)) => Some(g),
            _ => args.weight_group,
        },
        ggml_nibbles: match weights {
            Dtype::Ggml => nibbles,
            _ => plan::roles::Roles::NONE,
        },
        // The formula runtime counts a GGUF file's own bytes for its ggml weights.
        ggml_file_bytes: match (weights, runtime, &file) {
            (Dtype::Ggml, "formula", Some(f)) => f.ggml_file()?.map(|f| f.bytes),
            _ => None,
        },
        double_quant: args.double_quant,
        kv_dtype: args.kv_dtype,
        batch: args.batch,
        seq,
        kv_block: args.kv_block,
        tp: args.tp,
        attention: args.attention,
    })
}

fn train_estimate(runtime: &str, m: &ModelShape, s: &TrainSetup) -> anyhow::Result<Estimate> {
    Ok(match runtime {
        "formula" => formula::training_estimate(m, s)?,
        "pytorch" => {
            s.validate(m)?;
            plan_pytorch::training_estimate(m, s)?
        }
        // The engine's own checks: it runs what `frugal train` runs (optimizer offload at
        // ZeRO 0 included), so DeepSpeed's rules do not apply.
        "frugal" => plan_frugal::training_estimate(m, s)?,
        other => bail!(
            "invalid --runtime: '{other}' is not a runtime: use auto, pytorch, formula or frugal"
        ),
    })
}

/// The report of `model` under `runtime`.
fn model_report(
    args: &Args,
    model: &ModelShape,
    seq: u64,
    runtime: &str,
) -> anyhow::Result<Report> {
    let device = args.device;
    if args.infer && device != Device::Cpu {
        bail!(
            "--device {} plans training on its backend; inference runs on the CPU backend only",
            device.name()
        );
    }
    Ok(if args.infer {
        let setup = infer_setup(args, seq, runtime)?;
        let est = match runtime {
            "formula" => infer::inference_estimate(model, &setup)?,
            "pytorch" => pytorch::pytorch_inference(model, &setup)?,
            "frugal" => plan_frugal::serve::inference_estimate(
                model,
                &setup,
                ::infer::default_split_k(),
            )?,
            other => bail!("invalid --runtime: '{other}' is not a runtime: use auto, pytorch, formula or frugal"),
        };
        let mut r = report::inference(runtime, Some(model), 0, &setup, &est);
        if runtime == "frugal" {
            let split_k = ::infer::default_split_k();
            r.rank_peaks = plan_frugal::serve::rank_peaks(model, &setup, split_k)?;
        }
        r
    } else {
        let (setup, config) = train_setup(args, seq, Some(model.d_model))?;
        let mut est = train_estimate(runtime, model, &setup)?;
        if device != Device::Cpu {
            if runtime != "frugal" {
                bail!(
                    "--device {} is the frugal runtime's backend: add --runtime frugal (the \
                     pytorch and formula runtimes plan a GPU already)",
                    device.name()
                );
            }
            est = device.estimate(est);
        }
        let mut hw = fit::Hardware::of(fit::gpu_by_name(&args.gpu)?);
        hw.tf32 = args.tf32;
        let mut r = report::training(runtime, Some(model), 0, &setup, &est);
        r.config = config;
        if runtime == "frugal" {
            r.rank_peaks = report::rank_peaks(model, &setup)?;
        }
        r.step_time = Some(fit::step_time(model, &setup, &hw));
        r.gpu = Some(hw.gpu.name.to_string());
        // A setup over the device's memory: the nearest one that fits, as the advisor finds it.
        if let Some(size) = &args.device_memory {
            let capacity = units::parse_bytes(size, "--device-memory")?;
            if r.per_device.total_bytes > capacity {
                let runtime = fit::Runtime::parse(runtime)?;
                r.fix = fit::cheapest_fix(model, &setup, capacity, runtime);
            }
        }
        r
    })
}

/// Builds the report `args` ask for.
pub fn build_report(args: &Args) -> anyhow::Result<Report> {
    if args.gpus == 0 {
        bail!("invalid --gpus: must be at least 1 (the data-parallel ranks ZeRO shards over)");
    }
    let report = match (&args.model, &args.params) {
        (Some(spec), _) => {
            let model =
                models::ModelSource::resolve_or_text(spec, args.config_text.as_deref())?.shape()?;
            let seq = args.seq.unwrap_or(2048.min(model.max_positions));
            let paper = args.convention == Convention::Paper && !args.infer;
            if paper && (args.runtime == "pytorch" || args.runtime == "frugal") {
                bail!(
                    "invalid --convention paper with --runtime {}: that runtime replays what the \
                     process allocates; the paper's accounting is the formula runtime's: use \
                     --runtime formula (or drop --convention)",
                    args.runtime
                );
            }
            if paper && args.runtime == "auto" {
                let mut r = model_report(args, &model, seq, "formula")?;
                r.runtime_note = Some(
                    "--convention paper is the formula runtime's accounting; planned with formula"
                        .into(),
                );
                r
            } else if args.runtime == "auto" && args.infer && gguf_blocks(args) {
                let mut r = model_report(args, &model, seq, "formula")?;
                r.runtime_note = Some(
                    "a GGUF file's own tensor types (ggml, at the bytes its tensors take) are \
                     the formula runtime's; --runtime pytorch plans transformers' load, which \
                     dequantizes them"
                        .into(),
                );
                r
            } else if args.runtime == "auto" {
                match model_report(args, &model, seq, "pytorch") {
                    Err(e) => match e.downcast_ref::<PlanError>() {
                        Some(PlanError::Unsupported { .. }) => {
                            let mut r = model_report(args, &model, seq, "formula")?;
                            r.runtime_note = Some(format!("{e}; planned with formula instead"));
                            r
                        }
                        _ => return Err(e),
                    },
                    ok => ok?,
                }
            } else {
                model_report(args, &model, seq, &args.runtime)?
            }
        }
        (None, Some(count)) => {
            let n = units::parse_count(count, "--params")?;
            if n == 0 {
                return Err(anyhow!(
                    "--params {count}: a model has at least one parameter; write e.g. 7B or 124M"
                ));
            }
            if args.infer {
                let setup = infer_setup(args, args.seq.unwrap_or(0), "formula")?;
                let est = infer::weights_only_estimate(n, setup.weights);
                report::inference("formula", None, n, &setup, &est)
            } else {
                let (setup, config) = train_setup(args, args.seq.unwrap_or(2048), None)?;
                let est = formula::model_states_estimate(n, &setup)?;
                let mut r = report::training("formula", None, n, &setup, &est);
                r.config = config;
                r
            }
        }
        (None, None) => return Err(anyhow!("give --model NAME|PATH or --params COUNT")),
    };
    let Some(size) = &args.device_memory else {
        return Ok(report);
    };
    Ok(report.with_device_memory(units::parse_bytes(size, "--device-memory")?))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = build_report(&args)?;
    if let Some(path) = &args.plot {
        plot::write_svg(&report, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render::render(&report));
    }
    Ok(())
}
