//! `frugal train`: train a GPT-2 or Llama-style model on CPU with memory measured against the plan.
//!
//! With no flags it trains a small GPT-2-style model on the shipped Shakespeare corpus for a few
//! hundred steps (about two minutes on 2 cores), shows a progress bar (step, loss, tokens/s,
//! memory), then prints planned vs measured memory per category (equal, or the run fails) and a
//! generated sample. The flags become one validated `train::TrainConfig` in one step
//! (`config::validate`), which every rank clones; a value the engine cannot run is refused
//! there, before any data is read, never downgraded.
//!
//! Example: `frugal train --steps 50 --json --plot loss.svg --out run1`.

/// `frugal train --help`'s examples.
const EXAMPLES: &str = "\
Examples:
  frugal train                                    the default: gpt2-mini on Shakespeare, 500 steps
  frugal train --steps 50 --json --plot loss.svg  one JSON object and an SVG of the losses
  frugal train --model llama-tiny --precision bf16 --recompute sqrt
  frugal train --ranks 4 --zero 3                 four in-process ranks, everything sharded
  frugal train --ranks 2 --tp 2 --sp              tensor + sequence parallelism (Megatron)
  frugal train --ranks 8 --tp 2 --pp 2 --zero 1 --grad-accum 4
                                  3D: 2 stages x 2 replicas x 2 TP ranks, 1F1B over 4 micro-batches
  frugal train --save-every 100 --out run1        snapshots; SIGTERM/Ctrl-C saves one and stops
  frugal train --out run1 --resume run1           continue from run1's newest snapshot
  frugal train --data my.txt --device-memory 512MiB   refused before step one if it won't fit
  frugal train --model run1 --lora-rank 16 --lora-base nf4 --double-quant --out adapter --merge
                                  QLoRA over run1: PEFT adapter files and merged/
  frugal train --model model.gguf --lora-rank 8 --lora-base ggml --out ft
                                  LoRA over a GGUF model in its own quantized blocks, with its
                                  tokenizer (the same losses as over its values in fp32)
  mpirun -n 2 frugal train --comm mpi --zero 3    ranks as MPI processes (a --features mpi build)";

pub(crate) mod config;
mod device;
mod guard;
mod mpi;
mod precision;
mod report;
pub(crate) mod setup;
mod snapshot;
mod zero;

use comm::Collective;
use indicatif::{ProgressBar, ProgressStyle};
use plan::setup::{Attention, Optimizer, Precision, Recompute, ZeroStage};
use std::path::PathBuf;
use train::precision::ScalerConfig;
use train::Trainer;

/// The default model: a GPT-2 block design sized so the default run (500 steps of 4 x 128 tokens)
/// takes about two minutes on 2 cores: measured 2 min 0 s, loss 10.83 -> 5.07, validation 6.08,
/// 2138 tokens/s (with the vectorised classifier and GELU kernels). `--model` takes a preset or a
/// config.json instead.
pub const DEFAULT_MODEL: &str = "gpt2-mini";

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Model: a preset (gpt2-mini, gpt2-tiny, llama-tiny, mixtral-tiny, deepseek-tiny, gpt2-124m,
    /// ...), an HF config.json, a folder with config.json (and model.safetensors, to continue
    /// from its weights), or a GGUF file (its weights, dequantized, and its tokenizer).
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    /// Rows per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch: u64,
    /// Tokens per row.
    #[arg(long, default_value_t = 128)]
    pub seq: u64,
    /// Peak learning rate (linear warmup, then cosine decay to a tenth).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    /// Warmup steps [default: 20, or --steps when fewer]
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Micro-batches per optimizer step (the loss is normalised by the step's token count).
    #[arg(long, default_value_t = 1)]
    pub grad_accum: u32,
    /// adamw or sgd (momentum 0.9).
    #[arg(long, default_value_t = Optimizer::AdamW)]
    pub optimizer: Optimizer,
    /// Clip the global gradient norm to this value (0 turns clipping off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f32,
    /// Seed of the weights, the data order and the sample.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Refuse to start if the step's memory exceeds this (e.g. 512MiB, 2GB).
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Training text: a UTF-8 file or a folder of .txt files (default: the shipped Shakespeare).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write the trained weights (model.safetensors, HF names) and config.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object (steps, tokens, losses, tokens/s, planned and measured bytes).
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot of train and validation loss against the step.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Validation loss every this many steps (and at the end).
    #[arg(long, default_value_t = 50)]
    pub val_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, default_value_t = 8)]
    pub val_batches: usize,
    /// Tokens to generate at the end (0: no sample).
    #[arg(long, default_value_t = 64)]
    pub sample_tokens: usize,
    /// Sample among the k most likely tokens (0: greedy).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Write the first validation batch's tokens and the trained model's logits on it to this
    /// safetensors file (dev/check_hf_logits.py compares them with HF transformers).
    #[arg(long, hide = true)]
    pub save_val_logits: Option<PathBuf>,
    #[arg(long, default_value = "cpu", help = plan_frugal::device::Device::help())]
    pub device: plan_frugal::device::Device,
    /// Data-parallel ranks, as threads in this process: each takes its share of every global
    /// batch (--batch rows each); how gradients and state are shared is --zero's choice.
    #[arg(long, default_value_t = 1)]
    pub ranks: u32,
    /// Tensor-parallel ranks per model replica (Megatron): each of --tp consecutive ranks holds
    /// 1/T of every block's heads and MLP and of the vocabulary; --ranks N gives N/T
    /// data-parallel replicas, each reading --batch rows, with --zero over them.
    #[arg(long, default_value_t = 1)]
    pub tp: u32,
    /// Sequence parallelism (Megatron, with --tp T): the residual stream and the norms hold
    /// 1/T of the rows on each rank, gathered around the tensor-parallel GEMMs (--seq must
    /// divide by T).
    #[arg(long)]
    pub sp: bool,
    /// Pipeline stages (layers split into contiguous stages, the embedding on the first, the
    /// head on the last): each step's --grad-accum micro-batches run 1F1B, so --ranks N gives
    /// N/(T·P) data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    pub pp: u32,
    /// ZeRO stage: 0 all-reduces gradients; 1 shards the optimizer state; 2 also the gradients
    /// (each unit's full gradient freed after its reduce-scatter); 3 also the weights (gathered
    /// per unit for its forward and backward).
    #[arg(long, default_value_t = ZeroStage::Zero0)]
    pub zero: ZeroStage,
    /// Activation recompute: none, full, every:K, sqrt, selective (Megatron's: the attention
    /// probabilities) or keep-matmuls (keep the matmul outputs, recompute norms, attention core
    /// and activation).
    #[arg(long, default_value_t = Recompute::None)]
    pub recompute: Recompute,
    /// fp32, bf16 (2-byte weights and gradients, fp32 master weights and Adam state) or fp16
    /// (the same with dynamic loss scaling).
    #[arg(long, default_value_t = Precision::Fp32, value_parser = train::precision::engine_precision)]
    pub precision: Precision,
    /// fp16's dynamic loss scaler: torch (GradScaler's defaults) or deepspeed (its fp16
    /// block's defaults). Default torch; only with --precision fp16.
    #[arg(long)]
    pub loss_scaler: Option<ScalerConfig>,
    /// Attention kernel: flash (no T×T matrix kept) or eager (also spelled naive).
    #[arg(long, default_value_t = Attention::DEFAULT)]
    pub attention: Attention,
    /// Offload: none, optimizer (bf16/fp16 master weights and Adam moments in host RAM, stepped
    /// there) or optimizer:disk[=PATH] (in a memory-mapped file; default <--out>/ or the temp
    /// directory).
    #[arg(long, default_value = "none")]
    pub offload: config::OffloadArg,
    /// Save a snapshot every N steps into --out DIR/step-NNNNNN/ (weights, each rank's optimizer
    /// shard, data position, config; committed by its manifest).
    #[arg(long)]
    pub save_every: Option<u64>,
    /// Snapshots to keep (older ones are deleted once a new one is committed).
    #[arg(long, default_value_t = 3)]
    pub keep: usize,
    /// Resume from a snapshot folder, or an --out folder (its newest snapshot); any --ranks and
    /// --zero, the same model, optimizer, schedule, global batch and seed.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// LoRA rank: train low-rank adapters over a frozen base (PEFT's LoRA; QLoRA with
    /// --lora-base nf4). Only the adapters get gradients and optimizer state.
    #[arg(long)]
    pub lora_rank: Option<u32>,
    /// LoRA scaling α: the adapters add (α/r)·B·A·x (default: the rank, a scale of 1).
    #[arg(long)]
    pub lora_alpha: Option<f32>,
    /// Linear layers that get adapters: HF module names (q_proj,v_proj,...; c_attn,c_proj,c_fc
    /// for GPT-2) or all-linear.
    #[arg(
        long,
        default_value = "all-linear",
        value_delimiter = ',',
        requires = "lora_rank"
    )]
    pub lora_targets: Vec<String>,
    /// How the frozen base's block matrices are stored: fp32, bf16, int8, nf4 (bitsandbytes'
    /// QLoRA) or ggml (a GGUF file's own blocks, exactly: 0.75-1.0 bytes a 4-bit weight).
    #[arg(long, default_value_t = plan::setup::Dtype::Bf16, requires = "lora_rank")]
    pub lora_base: plan::setup::Dtype,
    /// nf4 base: bitsandbytes' double quantization of the absmax (4.127 bits per weight).
    #[arg(long)]
    pub double_quant: bool,
    /// Dropout on each adapter's input while training (PEFT's lora_dropout; 0: none).
    #[arg(long, default_value_t = 0.0)]
    pub lora_dropout: f32,
    /// With --lora-rank and --out: also write the merged model (W + (α/r)·B·A over the base as
    /// stored) to OUT/merged as a Hugging Face folder.
    #[arg(long)]
    pub merge: bool,
    /// How ranks talk: threads (--ranks N in this process) or mpi (one process per rank under
    /// `mpirun -n N`; a frugal built with --features mpi).
    #[arg(long, default_value = "threads")]
    pub comm: comm::Transport,
    /// Seconds a rank waits in a collective for the others before the run fails naming the
    /// call (a stalled or dead rank never hangs the others).
    #[arg(long, default_value_t = 60)]
    pub comm_timeout: u64,
    /// ZeRO-3: run the data-parallel collectives on a thread of their own, so each unit's
    /// prefetched all-gather overlaps the computation of the phase before it (DeepSpeed's
    /// overlap_comm): true, false (blocking), or auto, on when this node runs no more ranks
    /// than it has cores. Losses and bytes are the same either way.
    #[arg(long, default_value_t = mpi::Overlap::Auto)]
    pub overlap_comm: mpi::Overlap,
    /// Start a new run in an --out folder that holds another run's snapshots, deleting them
    /// (without it such a folder is refused: continue it with --resume instead).
    #[arg(long)]
    pub overwrite: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.device {
        plan_frugal::device::Device::Cpu => {}
        #[cfg(feature = "cuda")]
        plan_frugal::device::Device::Cuda => return device::run::<cuda::Cuda>(&args),
        #[cfg(not(feature = "cuda"))]
        plan_frugal::device::Device::Cuda => return device::not_built(&args),
    }
    match args.comm {
        comm::Transport::Mpi => mpi::run(args),
        comm::Transport::Threads => run_on(args, None),
    }
}

/// The run over thread ranks (`process` `None`), or as this process's rank of an MPI job.
fn run_on(args: Args, process: Option<Box<dyn Collective>>) -> anyhow::Result<()> {
    let rank0 = process.as_ref().is_none_or(|c| c.rank() == 0);
    let shared = setup::prepare(&args, rank0)?;
    guard::install_signal_handlers()?;
    let ranks = args.ranks as usize;
    let is_comm = |e: &anyhow::Error| {
        matches!(
            e.downcast_ref::<engine::EngineError>(),
            Some(engine::EngineError::Comm(_))
        )
    };
    let results = match process {
        Some(comm) => vec![run_rank(&shared, &args, comm)?],
        None => engine::world::launch(
            ranks,
            std::time::Duration::from_secs(args.comm_timeout),
            |comm| run_rank(&shared, &args, comm),
            is_comm,
        )?,
    };
    // Under MPI only rank 0's process reports and writes.
    let Some(mut first) = results.into_iter().next().flatten() else {
        return Ok(());
    };
    if let Some(dir) = &args.out {
        // The model's own tokenizer files beside its weights (GPT-2's models write none).
        let save_tokenizer = |dir: &std::path::Path| {
            shared
                .tokenizer
                .save_hf(dir)
                .map_err(|e| anyhow::anyhow!("saving the tokenizer to {}: {e}", dir.display()))
        };
        match first.trainer.model.lora.is_some() {
            true => save_lora(
                &first.trainer,
                first.finished.weights.as_deref(),
                &args,
                dir,
            )?,
            false => zero::save(&first.trainer, &first.finished, dir)?,
        }
        save_tokenizer(dir)?;
        train::snapshot::finished::record(dir, first.trainer.step)
            .map_err(|e| anyhow::anyhow!("saving the model's step in {}: {e}", dir.display()))?;
        if args.merge {
            save_tokenizer(&dir.join("merged"))?;
        }
    }
    // The sample comes after the save: a signal during it never costs the trained model.
    let sample = match first.finished.sample.take() {
        Some(sample) => Some(sample),
        None if args.sample_tokens > 0 => Some(setup::sample(
            &mut first.trainer,
            &shared.tokenizer,
            &args,
            true,
        )?),
        None => None,
    };
    if let Some(path) = &args.plot {
        report::plot(path, &first.ran.curves)?;
    }
    if let Some(path) = &args.save_val_logits {
        setup::save_val_logits(&mut first.trainer, &first.val, path)?;
    }
    for rank in &first.memory {
        report::check_planned_equals_measured(rank)?;
    }
    let summary = report::Summary {
        trainer: &first.trainer,
        memory: &first.memory,
        ran: &first.ran,
        sample: sample.as_deref(),
    };
    if args.json {
        println!("{}", report::json(&summary));
    } else {
        print!("{}", report::human(&summary, &args));
    }
    Ok(())
}

/// What one rank's training loop leaves behind.
struct Trained {
    trainer: Trainer,
    val: data::ValBatches,
    /// The loss curves, tokens and seconds of the steps.
    ran: train::run::Ran,
    /// What ZeRO stage 3 computed with every rank before they ended.
    finished: zero::Finished,
    /// Every rank's planned and measured bytes, gathered over the communicator.
    memory: Vec<train::RankMemory>,
}

/// One rank from start to end: build, train, the collective end of the run (stage 3's sample and
/// weights, every rank's memory for the report). Rank 0 returns its run; the others nothing.
fn run_rank(
    shared: &setup::Shared,
    args: &Args,
    comm: Box<dyn Collective>,
) -> anyhow::Result<Option<Trained>> {
    let rank = comm.rank();
    let built = setup::build_rank(shared, args, comm)?;
    let bar = if rank == 0 {
        progress_bar(args)
    } else {
        ProgressBar::hidden()
    };
    let mut trained = train_loop(built, args, bar)?;
    trained.finished = zero::finish(&mut trained.trainer, &shared.tokenizer, args)?;
    trained.memory = trained.trainer.gather_memory()?;
    Ok((rank == 0).then_some(trained))
}

/// What the CLI does around each step of `train::run`: snapshots, the stop on SIGTERM/Ctrl-C,
/// and the progress bar (rank 0, or the only rank).
struct CliHooks<'a> {
    args: &'a Args,
    data_id: u64,
    bar: ProgressBar,
    plain: term::PlainProgress,
}

impl train::run::Hooks<cpu::Cpu> for CliHooks<'_> {
    type Error = anyhow::Error;

    fn stepped(
        &mut self,
        trainer: &mut Trainer,
        loader: &data::Loader,
        _: &train::StepStats,
    ) -> anyhow::Result<()> {
        snapshot::maybe_save(self.args, trainer, loader, self.data_id)?;
        if trainer.any_rank(guard::stop_requested())? && trainer.step < self.args.steps {
            self.bar.finish_and_clear();
            return Err(interrupted(self.args, trainer, loader, self.data_id));
        }
        Ok(())
    }

    fn interrupted(&mut self, trainer: &mut Trainer) -> anyhow::Result<bool> {
        Ok(trainer.any_rank(guard::stop_requested())?)
    }

    fn stop(&mut self, trainer: &mut Trainer, loader: &data::Loader) -> anyhow::Result<()> {
        // After the last step the run ends anyway: its model is saved, without this validation.
        if trainer.step < self.args.steps {
            self.bar.finish_and_clear();
            return Err(interrupted(self.args, trainer, loader, self.data_id));
        }
        Ok(())
    }

    fn progress(&mut self, trainer: &Trainer, stats: &train::StepStats, ran: &train::run::Ran) {
        let message = format!(
            "loss {:.3} | {:.0} tok/s | peak {}{}",
            stats.loss,
            ran.tokens as f64 / ran.seconds,
            term::human_bytes(trainer.measured().peak_bytes),
            precision::bar(stats, trainer)
        );
        self.plain.tick(trainer.step, &format!("| {message} "));
        self.bar.set_message(message);
        self.bar.inc(1);
    }
}

/// The steps of one rank (`train::run` with the CLI's hooks).
fn train_loop(rank: setup::Rank, args: &Args, bar: ProgressBar) -> anyhow::Result<Trained> {
    let setup::Rank {
        mut trainer,
        data_id,
        mut loader,
        val,
    } = rank;
    // Rank-count independent: R ranks of B rows evaluate the same tokens as one of R×B.
    let replicas = (args.ranks / (args.tp.max(1) * args.pp.max(1))).max(1) as usize;
    let schedule = train::run::Schedule {
        steps: args.steps,
        val_every: args.val_every,
        val_batches: args.val_batches * replicas,
    };
    bar.set_position(trainer.step);
    let quiet = args.json || trainer.rank() != 0;
    let mut hooks = CliHooks {
        args,
        data_id,
        plain: term::PlainProgress::new("train", args.steps, quiet),
        bar,
    };
    let ran = train::run::run(&mut trainer, &mut loader, &val, &schedule, &mut hooks)?;
    hooks.bar.finish_and_clear();
    Ok(Trained {
        trainer,
        val,
        ran,
        finished: zero::Finished::default(),
        memory: Vec::new(),
    })
}

/// The error of a run stopped by SIGTERM/Ctrl-C after its step, with a snapshot saved to
/// `--out` (every rank joins the save) and the command that continues it.
fn interrupted(
    args: &Args,
    trainer: &mut Trainer,
    loader: &data::Loader,
    data_id: u64,
) -> anyhow::Error {
    let step = trainer.step;
    let Some(out) = &args.out else {
        return anyhow::anyhow!(
            "interrupted after step {step}; nothing was saved (give --out DIR to keep a \
             snapshot on interruption)"
        );
    };
    match snapshot::save_now(args, trainer, loader, data_id, out) {
        Ok(dir) => anyhow::anyhow!(
            "interrupted after step {step}; snapshot saved to {}: continue with the same flags \
             and --resume {}",
            dir.display(),
            out.display()
        ),
        Err(e) => e.context(format!(
            "interrupted after step {step}; the snapshot failed"
        )),
    }
}

fn progress_bar(args: &Args) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(args.steps);
    let style = ProgressStyle::with_template("{bar:30} step {pos}/{len} | {msg} | {elapsed}<{eta}")
        .expect("a valid template");
    bar.set_style(style);
    bar
}

/// `--out` of a LoRA run: PEFT's adapter files, and with `--merge` the merged model.
fn save_lora(
    trainer: &Trainer,
    gathered: Option<&[Vec<f32>]>,
    args: &Args,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let context = || format!("saving the adapters to {}", dir.display());
    train::peft::save_adapter(trainer, gathered, dir).with_context(context)?;
    if args.merge {
        let merged = dir.join("merged");
        train::peft::save_merged(trainer, gathered, &merged)
            .with_context(|| format!("saving the merged model to {}", merged.display()))?;
    }
    Ok(())
}
