//! `frugal train`'s flags to one validated `train::TrainConfig`, in one step (ripgrep's raw →
//! validated args): clap has already parsed every value into the `plan::setup` enums (one
//! spelling set with `plan`, `fit` and `bench`); this module checks what depends on several flags
//! or on the model, resolves the model and the offload file, and plans the run exactly as it will
//! run, refusing it before any data is read if it does not fit `--device-memory`. Every rank
//! clones the result; nothing is parsed twice.
//!
//! Example: `let run = config::validate(&args)?; Trainer::new(run.config.clone())?`.

use super::Args;
use anyhow::{bail, Context};
use plan::setup::{Offload, Optimizer, Precision, ZeroStage};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use train::Mixed;
use train::{OptimizerKind, Schedule, TrainConfig};

/// `--offload none|optimizer|optimizer:disk[=PATH]`.
#[derive(Clone, Debug, PartialEq)]
pub enum OffloadArg {
    None,
    /// Master weights and Adam moments in host RAM.
    Ram,
    /// In a memory-mapped file: PATH, or `<--out>/optimizer_state.bin` (the temp directory
    /// without `--out`); with several ranks each gets its own (`Mixed::store_path`).
    Disk(Option<PathBuf>),
}

impl FromStr for OffloadArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => OffloadArg::None,
            "optimizer" => OffloadArg::Ram,
            "optimizer:disk" => OffloadArg::Disk(None),
            _ => match s.strip_prefix("optimizer:disk=") {
                Some(path) if !path.is_empty() => OffloadArg::Disk(Some(PathBuf::from(path))),
                _ => {
                    return Err(
                        "use none, optimizer (host RAM) or optimizer:disk[=PATH] (a \
                         memory-mapped file)"
                            .into(),
                    )
                }
            },
        })
    }
}

/// The run every rank builds, and the saved weights it starts from (an HF folder or a GGUF
/// file).
pub struct Validated {
    pub config: TrainConfig,
    pub weights: Option<PathBuf>,
    /// The model's tokenizer: the data, the sample and `--out`'s tokenizer files use it.
    pub tokenizer: data::Tokenizer,
}

/// The engine's optimizer for `--optimizer` (SGD with nanoGPT-style momentum 0.9).
fn optimizer(kind: Optimizer) -> OptimizerKind {
    match kind {
        Optimizer::Sgd => OptimizerKind::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        // 8-bit Adam is refused by the engine's plan, naming the flag.
        Optimizer::AdamW | Optimizer::AdamW8bit => OptimizerKind::adamw_default(),
    }
}

/// Precision, loss scaler and offload as the engine takes them; bad combinations name the flags.
fn mixed(args: &Args) -> anyhow::Result<Mixed> {
    let loss_scaler = match (args.loss_scaler, args.precision) {
        (None, Precision::Fp16) => Some("torch".parse().expect("a scaler name")),
        (Some(s), Precision::Fp16) => Some(s),
        (Some(s), _) => bail!(
            "--loss-scaler {s} needs --precision fp16: fp32 and bf16 have fp32's exponent range \
             and are not loss-scaled"
        ),
        (None, _) => None,
    };
    let (offload, offload_path) = match &args.offload {
        OffloadArg::None => (Offload::None, None),
        OffloadArg::Ram => (Offload::Optimizer, None),
        OffloadArg::Disk(path) => (Offload::Optimizer, Some(disk_path(path.as_deref(), args)?)),
    };
    if offload != Offload::None && args.precision == Precision::Fp32 {
        bail!(
            "--offload optimizer needs --precision bf16 or fp16: the host steps fp32 master \
             weights of 2-byte working weights"
        );
    }
    if args.optimizer == Optimizer::AdamW8bit {
        bail!("--optimizer adamw8bit: the engine trains with adamw or sgd");
    }
    Ok(Mixed {
        precision: args.precision,
        loss_scaler,
        offload,
        offload_path,
    })
}

/// Where `optimizer:disk` keeps its file: PATH, `<--out>/optimizer_state.bin`, or the temp
/// directory (named after this process).
fn disk_path(path: Option<&Path>, args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(path) = path {
        return Ok(path.to_path_buf());
    }
    Ok(match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating --out {}", dir.display()))?;
            dir.join("optimizer_state.bin")
        }
        None => {
            std::env::temp_dir().join(format!("frugal-{}-optimizer_state.bin", std::process::id()))
        }
    })
}

/// The most in-process ranks: each is a thread with its own stack and slab.
pub const MAX_RANKS: u32 = 1024;

/// Refuses flags that cannot work together, before anything is built.
fn check_flags(args: &Args) -> anyhow::Result<()> {
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if args.ranks == 0 {
        bail!("--ranks 0: at least one rank is needed");
    }
    if args.ranks > MAX_RANKS {
        bail!(
            "--ranks {}: in-process ranks are threads of this process, at most {MAX_RANKS}; \
             use fewer ranks",
            args.ranks
        );
    }
    for (flag, value) in [("--batch", args.batch), ("--seq", args.seq)] {
        if value == 0 {
            bail!("{flag} 0: use {flag} 1 or more");
        }
    }
    if args.grad_accum == 0 {
        bail!("--grad-accum 0: use --grad-accum 1 or more (1 is no accumulation)");
    }
    if !(args.grad_clip.is_finite() && args.grad_clip >= 0.0) {
        bail!(
            "--grad-clip {}: use a positive norm such as 1.0, or 0 to turn clipping off",
            args.grad_clip
        );
    }
    if args.val_every == 0 {
        bail!("--val-every 0: evaluate every N >= 1 steps (the run's end is always evaluated)");
    }
    if args.val_batches == 0 {
        bail!("--val-batches 0: evaluate on at least one batch");
    }
    if args.lr <= 0.0 || !args.lr.is_finite() {
        bail!("--lr {} must be a positive number", args.lr);
    }
    if args.zero == ZeroStage::Zero3 && args.ranks > 1 && args.save_val_logits.is_some() {
        bail!("--save-val-logits needs whole weights on rank 0: use --zero 2 or less with --ranks > 1");
    }
    if let Some(every) = args.save_every {
        if every == 0 {
            bail!("--save-every 0: save every N >= 1 steps, or leave the flag out");
        }
        if args.out.is_none() {
            bail!("--save-every needs --out DIR: snapshots are written to DIR/step-NNNNNN/");
        }
    }
    if args.tp == 0 {
        bail!("--tp 0: use --tp 1 (no tensor parallelism) or more");
    }
    if args.pp == 0 {
        bail!("--pp 0: use --pp 1 (no pipeline) or more stages");
    }
    let model_ranks = args.tp * args.pp;
    if args.ranks % model_ranks != 0 {
        bail!(
            "--ranks {} is not a multiple of --tp {} x --pp {} = {model_ranks}: the ranks form \
             replicas of {model_ranks} (use --ranks {})",
            args.ranks,
            args.tp,
            args.pp,
            model_ranks * (args.ranks / model_ranks).max(1)
        );
    }
    if args.tp > 1 || args.pp > 1 {
        let what = if args.tp > 1 { "tensor" } else { "pipeline" };
        for (set, flag) in [
            (args.save_val_logits.is_some(), "--save-val-logits"),
            (args.lora_rank.is_some(), "--lora-rank"),
        ] {
            if set {
                bail!(
                    "{flag} with --tp {} --pp {}: not built for {what}-parallel runs yet (use \
                     --tp 1 --pp 1)",
                    args.tp,
                    args.pp
                );
            }
        }
    }
    if args.comm_timeout == 0 {
        bail!("--comm-timeout 0: give the seconds a rank may wait for the others (60 by default)");
    }
    if args.keep == 0 {
        bail!("--keep 0: keep at least the newest snapshot (--keep 1)");
    }
    Ok(())
}

/// `--lora-*` as the engine takes them (`None` without `--lora-rank`); flags that need LoRA,
/// or an nf4 base, are refused without it.
fn lora(args: &Args) -> anyhow::Result<Option<train::LoraConfig>> {
    let Some(rank) = args.lora_rank else {
        for (set, flag) in [
            (args.lora_dropout != 0.0, "--lora-dropout"),
            (args.lora_alpha.is_some(), "--lora-alpha"),
            (args.double_quant, "--double-quant"),
            (args.merge, "--merge"),
        ] {
            if set {
                bail!("{flag} needs --lora-rank R (LoRA adapters over a frozen base)");
            }
        }
        return Ok(None);
    };
    if rank == 0 {
        bail!("--lora-rank 0: use a rank of 1 or more (8-64 are usual)");
    }
    if args.double_quant && args.lora_base != plan::setup::Dtype::Nf4 {
        bail!("--double-quant quantizes nf4's absmax: use it with --lora-base nf4");
    }
    if args.merge && args.out.is_none() {
        bail!("--merge needs --out DIR: the merged model is written to DIR/merged");
    }
    let alpha = args.lora_alpha.unwrap_or(rank as f32);
    if !(alpha.is_finite() && alpha > 0.0) {
        bail!("--lora-alpha {alpha}: use a positive scale such as the rank or twice it");
    }
    Ok(Some(train::LoraConfig {
        plan: plan::setup::Lora {
            rank,
            targets: args.lora_targets.clone(),
            base: args.lora_base,
            double_quant: args.double_quant,
            dropout: args.lora_dropout,
            ggml: None,
        },
        alpha,
        base_weights: None,
    }))
}

/// The one validated run of `args`; refuses it before any data is read if it does not fit.
pub fn validate(args: &Args) -> anyhow::Result<Validated> {
    check_flags(args)?;
    let source = models::ModelSource::resolve(&args.model)?;
    let (model, weights) = (source.config()?, source.training_weights()?);
    // The model's own tokenizer (an HF folder's tokenizer.json), else GPT-2's.
    let tokenizer = source.tokenizer()?;
    let vocab = tokenizer.vocab_size();
    if u64::from(vocab) > model.shape.vocab {
        bail!(
            "the model's vocabulary ({}) is smaller than its tokenizer's ({vocab}, {}): token \
             ids would fall outside the embedding; use a model with vocab_size >= {vocab}",
            model.shape.vocab,
            tokenizer.name()
        );
    }
    if let Some(rank) = args.lora_rank {
        // The rule `plan` and `fit` apply: no wider than the smaller side of a targeted matrix.
        plan::lora::check_rank(&model.shape, rank, &args.lora_targets)?;
    }
    if args.sample_tokens as u64 > model.shape.max_positions {
        bail!(
            "--sample-tokens {} is longer than the model's context of {} tokens: use {} or less",
            args.sample_tokens,
            model.shape.max_positions,
            model.shape.max_positions
        );
    }
    if args.seq > model.shape.max_positions {
        bail!(
            "--seq {} is longer than the model's {} positions: use --seq {} or less",
            args.seq,
            model.shape.max_positions,
            model.shape.max_positions
        );
    }
    let device_memory_bytes = match &args.device_memory {
        Some(text) => Some(plan::units::parse_bytes(text, "--device-memory")?),
        None => None,
    };
    let mut lora = lora(args)?;
    // A ggml base holds the GGUF file's own blocks: their layout comes from the file.
    if let Some(l) = lora
        .as_mut()
        .filter(|l| l.plan.base == plan::setup::Dtype::Ggml)
    {
        l.plan.ggml = Some(
            models::ggml_base(weights.as_deref())
                .with_context(|| format!("--lora-base ggml with --model {}", args.model))?,
        );
    }
    // A LoRA base from a saved model: its weights' fingerprint goes into every snapshot.
    if let (Some(l), Some(dir)) = (lora.as_mut(), &weights) {
        let files = models::saved::weight_files(dir)
            .with_context(|| format!("--model {}", dir.display()))?;
        let fingerprint = train::base_fingerprint(&files)
            .with_context(|| format!("reading the weights of --model {}", dir.display()))?;
        l.base_weights = Some(fingerprint);
    }
    let optimizer = match (optimizer(args.optimizer), &lora) {
        // Adapters train without weight decay, as PEFT runs under HF Trainer's default.
        (
            OptimizerKind::AdamW {
                beta1, beta2, eps, ..
            },
            Some(_),
        ) => OptimizerKind::AdamW {
            beta1,
            beta2,
            eps,
            weight_decay: 0.0,
        },
        (kind, _) => kind,
    };
    let config = TrainConfig {
        grad_accum: args.grad_accum,
        optimizer,
        lora,
        schedule: Schedule {
            lr: args.lr,
            warmup_steps: warmup(args)?,
            total_steps: args.steps,
            min_lr_ratio: 0.1,
        },
        grad_clip: (args.grad_clip > 0.0).then_some(args.grad_clip),
        device_memory_bytes,
        ranks: args.ranks,
        tp: args.tp,
        sp: args.sp,
        pp: args.pp,
        zero: args.zero,
        recompute: args.recompute,
        attention: args.attention,
        mixed: mixed(args)?,
        // Thread ranks all run on this node; under MPI `mpi::run` has already decided.
        overlap_comm: args.overlap_comm.resolve(args.ranks as usize),
        ..TrainConfig::new(model, args.batch, args.seq)
    };
    // The run exactly as it will run: a bf16 run is refused on its own bf16 peak.
    train::check_capacity(&config)?;
    Ok(Validated {
        config,
        weights,
        tokenizer,
    })
}

/// `--warmup`, at most `--steps` (the default, 20, shortens to a shorter run).
fn warmup(args: &Args) -> anyhow::Result<u64> {
    match args.warmup {
        Some(w) if w > args.steps => bail!(
            "--warmup {w} is longer than the run's --steps {}: the learning rate would never \
             reach --lr; use --warmup {} or less",
            args.steps,
            args.steps
        ),
        Some(w) => Ok(w),
        None => Ok(20.min(args.steps)),
    }
}
