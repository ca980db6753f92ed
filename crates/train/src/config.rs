//! What a training run is built from ([`TrainConfig`], the one validated run config every rank
//! clones), what one step reports ([`StepStats`], [`Timings`]), and the capacity check that plans
//! the run exactly as it will run and refuses it before anything is allocated.
//!
//! Example: `let plan = check_capacity(&TrainConfig { device_memory_bytes: Some(1 << 30), ..cfg })?;`

use super::Mixed;
use crate::optim::{OptimizerKind, Schedule};
use engine::backend::Feature;
use engine::capacity::{HostMemory, Limit, NoFit};
use engine::config::ModelConfig;
use engine::error::EngineError;
use plan::buffer::{Device, MemoryPlan};
use plan::setup::{Attention, Recompute, TrainSetup, ZeroStage};
use std::time::Duration;

/// Wall time spent in each part of the step, summed over the run: where the time goes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    pub embed: Duration,
    pub forward_blocks: Duration,
    /// Final norm, classifier and loss, forward and backward.
    pub head: Duration,
    pub backward_blocks: Duration,
    pub embed_backward: Duration,
    /// Norm, clipping and the optimizer update.
    pub optimizer: Duration,
}

/// Everything a training run is built from (validated by the CLI, checked again by the plan).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelConfig,
    /// Rows per micro-batch.
    pub batch: u64,
    pub seq: u64,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
    pub optimizer: OptimizerKind,
    pub schedule: Schedule,
    /// Clip the global gradient norm to this value.
    pub grad_clip: Option<f32>,
    /// Refuse to start when the arena's slab would exceed this many bytes.
    pub device_memory_bytes: Option<u64>,
    /// The RAM this process may take (the CPU backend's slabs are host RAM): refuse to start
    /// when every rank's slab and host-offloaded state together exceed it. `TrainConfig::new`
    /// reads it from the machine (`capacity::host_available`).
    pub host_memory: Option<HostMemory>,
    /// Ranks in all (one `Trainer` each, built with [`Trainer::with_comm`]): `tp` × the
    /// data-parallel ranks.
    pub ranks: u32,
    /// Tensor-parallel ranks per model replica (1: none); consecutive ranks form a group.
    pub tp: u32,
    /// Sequence parallelism over each tensor-parallel group (Megatron).
    pub sp: bool,
    /// Pipeline stages (1: none); `grad_accum` is the micro-batches of the 1F1B schedule.
    pub pp: u32,
    /// What the ranks share: 0 every rank holds everything and gradients are all-reduced; 1-3
    /// shard the optimizer state, then the gradients, then the weights.
    pub zero: ZeroStage,
    /// Activation recompute policy (the plan says what is kept and when the rest is rebuilt).
    pub recompute: Recompute,
    /// Attention kernel: materialised (`Eager`) or flash.
    pub attention: Attention,
    /// Weight precision, fp16's loss scaler and optimizer offload.
    pub mixed: Mixed,
    /// LoRA/QLoRA: a frozen base and trainable adapters (`None`: full training).
    pub lora: Option<LoraConfig>,
    /// ZeRO-3 over several ranks: run the data-parallel collectives on a thread of their own
    /// (`comm::Overlapped`), so each unit's prefetched all-gather overlaps the phase before the
    /// one that reads it (DeepSpeed's `overlap_comm`). Bits and bytes are the same either way.
    pub overlap_comm: bool,
}

/// A LoRA run: what the plan sees (rank, targets, base format) and the scaling α.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    pub plan: plan::setup::Lora,
    /// The adapters' output is scaled by α / r (PEFT's `lora_alpha`).
    pub alpha: f32,
    /// A fingerprint of the frozen base's weight files ([`base_fingerprint`]) when the base is
    /// a saved model: a snapshot records it and a resume on another base is refused.
    pub base_weights: Option<u64>,
}

/// A fingerprint of a saved model's weight files (`paths`, in order): CRC-32 of their bytes, and
/// of their sizes, as one number. The files are streamed, never held whole.
pub fn base_fingerprint(paths: &[std::path::PathBuf]) -> std::io::Result<u64> {
    use std::io::Read;
    let mut data = crc32fast::Hasher::new();
    let mut sizes = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut file = std::fs::File::open(path)?;
        let mut len = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            data.update(&buf[..n]);
            len += n as u64;
        }
        sizes.update(&len.to_le_bytes());
    }
    Ok((u64::from(sizes.finalize()) << 32) | u64::from(data.finalize()))
}

impl TrainConfig {
    /// What this run needs of a backend beyond the forward pass and training: the model's
    /// layers and the run's options, checked at set-up (`engine::backend::require`).
    pub fn needs(&self) -> Vec<Feature> {
        let mut needs = engine::backend::model_needs(&self.model.shape);
        let wants = [
            (self.lora.is_some(), Feature::Lora),
            (self.tp > 1, Feature::TensorParallel),
            (self.ranks > 1, Feature::Ranks),
            (self.attention == Attention::Eager, Feature::EagerAttention),
            (
                self.mixed.offload != plan::setup::Offload::None,
                Feature::OptimizerOffload,
            ),
        ];
        needs.extend(wants.into_iter().filter(|w| w.0).map(|w| w.1));
        needs
    }

    /// A run of `model` with the defaults every command shares: fp32, ZeRO 0 on one rank, no
    /// recompute, flash attention, AdamW at a constant 1e-3 clipped at 1, one micro-batch.
    pub fn new(model: ModelConfig, batch: u64, seq: u64) -> TrainConfig {
        TrainConfig {
            model,
            batch,
            seq,
            grad_accum: 1,
            optimizer: OptimizerKind::adamw_default(),
            schedule: Schedule::constant(1e-3),
            grad_clip: Some(1.0),
            device_memory_bytes: None,
            host_memory: engine::capacity::host_available(),
            ranks: 1,
            tp: 1,
            sp: false,
            pp: 1,
            zero: ZeroStage::Zero0,
            recompute: Recompute::None,
            attention: Attention::DEFAULT,
            mixed: Mixed::fp32(),
            lora: None,
            overlap_comm: true,
        }
    }

    /// Data-parallel ranks: the ranks over the tensor-parallel and pipeline degrees.
    pub fn dp(&self) -> u32 {
        (self.ranks / (self.tp.max(1) * self.pp.max(1))).max(1)
    }

    /// The planner's view of this run, per rank: the one setup the capacity check, the arena and
    /// `frugal plan --runtime frugal` all plan.
    pub fn setup(&self) -> TrainSetup {
        TrainSetup {
            precision: self.mixed.precision,
            optimizer: self.optimizer.plan_optimizer(),
            zero: self.zero,
            dp: self.dp(),
            tp: self.tp.max(1),
            sp: self.sp,
            pp: self.pp.max(1),
            grad_accum: self.grad_accum,
            recompute: self.recompute,
            attention: self.attention,
            offload: self.mixed.offload,
            lora: self.lora.as_ref().map(|l| l.plan.clone()),
            ..TrainSetup::new(self.batch, self.seq)
        }
    }
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// 0-based index of the step.
    pub step: u64,
    /// Mean loss over every token of the step.
    pub loss: f32,
    pub lr: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    pub tokens: u64,
    /// fp16: the loss scale this step's backward used.
    pub loss_scale: Option<f32>,
    /// fp16: the step found an overflow and left the weights as they were.
    pub skipped: bool,
}

/// Plans one rank's step exactly as it will run (precision, ZeRO stage and offload included)
/// and refuses it, before anything is allocated, when one rank's slab exceeds
/// `device_memory_bytes` or every rank's slab and host-offloaded state together exceed
/// `host_memory`, with the plan's breakdown at its peak and the `fit` advisor's cheapest
/// fix.
pub fn check_capacity(config: &TrainConfig) -> Result<MemoryPlan, EngineError> {
    check_capacity_of(config, 0, 0)
}

/// [`check_capacity`] for tensor-parallel rank `tp_rank` of pipeline stage `stage` (a
/// vocabulary slice may be a row narrower than rank 0's; stages hold different layers).
pub fn check_capacity_of(
    config: &TrainConfig,
    tp_rank: u32,
    stage: u32,
) -> Result<MemoryPlan, EngineError> {
    let shape = &config.model.shape;
    let setup = config.setup();
    let (tp, pp) = (config.tp.max(1), config.pp.max(1));
    if config.ranks % (tp * pp) != 0 {
        let reason = format!(
            "{} ranks do not split into {pp} pipeline stages of tensor-parallel groups of {tp}: \
             use --ranks a multiple of --tp x --pp = {}",
            config.ranks,
            tp * pp
        );
        let invalid = plan::PlanError::Invalid {
            field: "ranks".into(),
            reason,
        };
        return Err(invalid.into());
    }
    let plan = plan_frugal::training_plan_of(shape, &setup, tp_rank, stage)?;
    // One rank's slab: at least the peak (the sum of `at_peak`), more where the layout leaves gaps.
    let slab_bytes = plan_frugal::assign_offsets(&plan, Device::Gpu)
        .slab_bytes
        .max(plan.peak_bytes(Device::Gpu));
    let host_bytes = match config.mixed.offload_path {
        // A memory-mapped file: the page cache, not this process's RAM, holds it.
        Some(_) => 0,
        None => plan.peak_bytes(Device::Host),
    };
    let (phase, at_peak) = plan.at_peak(Device::Gpu);
    let no_fit = |limit: Limit, needed_bytes: u64, capacity_bytes: u64, ranks: u32| {
        // The advisor searches setups this engine runs (its `frugal` runtime), for one rank's
        // share of the capacity.
        let per_rank = capacity_bytes / u64::from(ranks);
        // No remedy in reach saves a factor of 100; skip the search (seconds on huge models).
        let fix = (needed_bytes / 100 <= capacity_bytes)
            .then(|| fit::cheapest_fix(shape, &setup, per_rank, fit::Runtime::Frugal))
            .flatten();
        EngineError::DoesNotFit(Box::new(NoFit {
            limit,
            needed_bytes,
            capacity_bytes,
            ranks,
            at_peak,
            phase,
            layout_bytes: slab_bytes - at_peak.iter().sum::<u64>(),
            host_bytes,
            advice: fix.map(|s| s.description),
        }))
    };
    if let Some(capacity_bytes) = config.device_memory_bytes {
        if slab_bytes > capacity_bytes {
            return Err(no_fit(Limit::Device, slab_bytes, capacity_bytes, 1));
        }
    }
    if let Some(host) = &config.host_memory {
        let total = (slab_bytes + host_bytes).saturating_mul(u64::from(config.ranks));
        if total > host.bytes {
            let limit = Limit::HostRam {
                source: host.source.clone(),
            };
            return Err(no_fit(limit, total, host.bytes, config.ranks));
        }
    }
    Ok(plan)
}
