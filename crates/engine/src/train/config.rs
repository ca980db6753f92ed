//! What a training run is built from ([`TrainConfig`], the one validated run config every rank
//! clones), what one step reports ([`StepStats`], [`Timings`]), and the capacity check that plans
//! the run exactly as it will run and refuses it before anything is allocated.
//!
//! Example: `let plan = check_capacity(&TrainConfig { device_memory_bytes: Some(1 << 30), ..cfg })?;`

use super::Mixed;
use crate::config::ModelConfig;
use crate::error::EngineError;
use crate::optim::{OptimizerKind, Schedule};
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
    /// Data-parallel ranks (one `Trainer` each, built with [`Trainer::with_comm`]).
    pub ranks: u32,
    /// What the ranks share: 0 every rank holds everything and gradients are all-reduced; 1-3
    /// shard the optimizer state, then the gradients, then the weights.
    pub zero: ZeroStage,
    /// Activation recompute policy (the plan says what is kept and when the rest is rebuilt).
    pub recompute: Recompute,
    /// Attention kernel: materialised (`Eager`) or flash.
    pub attention: Attention,
    /// Weight precision, fp16's loss scaler and optimizer offload.
    pub mixed: Mixed,
}

impl TrainConfig {
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
            ranks: 1,
            zero: ZeroStage::Zero0,
            recompute: Recompute::None,
            attention: Attention::DEFAULT,
            mixed: Mixed::fp32(),
        }
    }

    /// The planner's view of this run, per rank: the one setup the capacity check, the arena and
    /// `frugal plan --runtime frugal` all plan.
    pub fn setup(&self) -> TrainSetup {
        TrainSetup {
            precision: self.mixed.precision,
            optimizer: self.optimizer.plan_optimizer(),
            zero: self.zero,
            dp: self.ranks,
            grad_accum: self.grad_accum,
            recompute: self.recompute,
            attention: self.attention,
            offload: self.mixed.offload,
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
/// and refuses it, before anything is allocated, when it exceeds `device_memory_bytes`, with the
/// plan's breakdown and the `fit` advisor's cheapest fix.
pub fn check_capacity(config: &TrainConfig) -> Result<MemoryPlan, EngineError> {
    let shape = &config.model.shape;
    let setup = config.setup();
    let plan = plan::frugal::training_plan(shape, &setup)?;
    let Some(capacity_bytes) = config.device_memory_bytes else {
        return Ok(plan);
    };
    let needed_bytes = plan::frugal::assign_offsets(&plan, Device::Gpu)
        .slab_bytes
        .max(plan.peak_bytes(Device::Gpu));
    if needed_bytes <= capacity_bytes {
        return Ok(plan);
    }
    // The advisor searches setups this engine runs (its `frugal` runtime).
    let runtime = plan::fit::Runtime::Frugal;
    let fix = plan::fit::cheapest_fix(shape, &setup, capacity_bytes, runtime);
    Err(EngineError::DoesNotFit {
        needed_bytes,
        capacity_bytes,
        category_peak_bytes: plan.category_peaks(Device::Gpu),
        advice: fix.map(|s| s.description),
    })
}
