//! The trainer: one rank's plan, arena and model, and the training step over the plan's phases.
//!
//! A step zeroes the gradients, runs K micro-steps (forward block by block, the head's fused loss,
//! backward block by block, embedding backward), each token's gradient scaled by 1 / (tokens in the
//! whole step) so accumulation equals one large batch, then clips by the global norm and updates.
//! A non-finite loss stops the step before the update, so the weights stay as they were.
//!
//! What it does not do: read files (the CLI and `io` do), print, or pick defaults for the user.
//!
//! Example: `let mut t = Trainer::new(cfg)?; t.init_weights(1337); let stats = t.step(&mut next)?;`

use crate::arena::{Arena, BufId, Measured};
use crate::config::ModelConfig;
use crate::error::EngineError;
use crate::model::Model;
use crate::optim::{self, OptimizerKind, Schedule};
use crate::{backward, forward, init};
use plan::buffer::{Device, MemoryPlan, Phase};
use plan::frugal::ActShape;
use plan::setup::{Attention, Offload, Precision, Recompute, TrainSetup, ZeroStage};
use std::time::{Duration, Instant};

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
    /// Data-parallel ranks (ZeRO stage 0: every rank holds everything, gradients all-reduced).
    pub ranks: u32,
    /// Activation recompute policy (the plan says what is kept and when the rest is rebuilt).
    pub recompute: Recompute,
    /// Attention kernel: materialised (`Eager`) or flash.
    pub attention: Attention,
}

impl TrainConfig {
    /// The planner's view of this run (per rank: fp32, ZeRO stage 0).
    pub fn setup(&self) -> TrainSetup {
        TrainSetup {
            precision: Precision::Fp32,
            optimizer: self.optimizer.plan_optimizer(),
            zero: ZeroStage::Zero0,
            dp: self.ranks,
            tp: 1,
            pp: 1,
            sp: false,
            micro_batch: self.batch,
            seq: self.seq,
            grad_accum: self.grad_accum,
            recompute: self.recompute,
            attention: self.attention,
            offload: Offload::None,
            lora: None,
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
}

pub struct Trainer {
    pub config: TrainConfig,
    pub plan: MemoryPlan,
    pub arena: Arena,
    pub model: Model,
    opt_state: Vec<Vec<BufId>>,
    /// Optimizer steps taken.
    pub step: u64,
    pub timings: Timings,
    /// This rank's link to the others; `None` for a single rank.
    comm: Option<Box<dyn comm::Collective>>,
}

/// Plans one rank's step and refuses it, before anything is allocated, when it exceeds
/// `device_memory_bytes`, with the plan's breakdown and the `fit` advisor's cheapest fix.
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

impl Trainer {
    /// Plans the run, refuses it if it does not fit, then carves the arena (zeroed weights).
    pub fn new(config: TrainConfig) -> Result<Trainer, EngineError> {
        let plan = check_capacity(&config)?;
        let shape = &config.model.shape;
        let setup = config.setup();
        let arena = Arena::new(&plan, Device::Gpu, config.device_memory_bytes)?;
        let units = plan::frugal::param_units(shape, setup.dp)?;
        let act_shape = ActShape {
            batch: config.batch,
            seq: config.seq,
        };
        let policy = plan::frugal::ActPolicy::of(&setup);
        let model = Model::new(config.model.clone(), units, &arena, act_shape, policy);
        let opt_state = optim::state_ids(&model, &arena, config.optimizer);
        for ids in &opt_state {
            ids.iter().for_each(|&id| arena.f32_mut(id).fill(0.0));
        }
        Ok(Trainer {
            config,
            plan,
            arena,
            model,
            opt_state,
            step: 0,
            timings: Timings::default(),
            comm: None,
        })
    }

    /// A trainer for one rank of a data-parallel world: `comm`'s world size must equal
    /// `config.ranks`. Every rank starts from the same weights when given the same seed.
    pub fn with_comm(
        config: TrainConfig,
        comm: Box<dyn comm::Collective>,
    ) -> Result<Trainer, EngineError> {
        assert_eq!(
            comm.world_size(),
            config.ranks as usize,
            "one communicator per rank"
        );
        let mut trainer = Trainer::new(config)?;
        trainer.comm = Some(comm);
        Ok(trainer)
    }

    /// This rank's index (0 without a communicator).
    pub fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, |c| c.rank())
    }

    /// Sums `loss_sum` over the ranks (so every rank sees the same, NaN included), then the
    /// gradients, in the comm crate's fixed rank order.
    fn all_reduce(&mut self, loss_sum: f64) -> Result<f64, EngineError> {
        let Some(comm) = self.comm.as_mut() else {
            return Ok(loss_sum);
        };
        let mut loss = [loss_sum as f32];
        comm.all_reduce(loss.as_mut_slice().into(), comm::ReduceOp::Sum)?;
        if loss[0].is_finite() {
            for &id in &self.model.grads {
                let mut grads = self.arena.f32_mut(id);
                comm.all_reduce((&mut grads[..]).into(), comm::ReduceOp::Sum)?;
            }
        }
        Ok(f64::from(loss[0]))
    }

    pub fn init_weights(&mut self, seed: u64) {
        init::fill(&self.model, &self.arena, seed);
    }

    /// Tokens of one micro-batch.
    pub fn micro_tokens(&self) -> usize {
        (self.config.batch * self.config.seq) as usize
    }

    /// Copies a batch into the arena, refusing ids the model has no embedding for.
    fn load_batch(&mut self, inputs: &[u32], targets: &[u32]) -> Result<(), EngineError> {
        let n = self.micro_tokens();
        assert!(
            inputs.len() == n && targets.len() == n,
            "a batch is batch * seq tokens"
        );
        let vocab = self.config.model.shape.vocab;
        if let Some((i, &id)) = inputs
            .iter()
            .chain(targets)
            .enumerate()
            .find(|(_, &id)| u64::from(id) >= vocab)
        {
            return Err(EngineError::Data(format!(
                "token id {id} (at position {}) is beyond the model's vocabulary of {vocab}; \
                 use a model whose vocabulary covers the tokenizer",
                i % n
            )));
        }
        self.arena
            .u32_mut(self.model.head.tokens)
            .copy_from_slice(inputs);
        self.arena
            .u32_mut(self.model.head.targets)
            .copy_from_slice(targets);
        Ok(())
    }

    /// Forward and backward of one micro-batch, accumulating into the gradients. Returns the sum
    /// of the token losses; `dloss` scales each token's gradient.
    pub fn forward_backward(
        &mut self,
        inputs: &[u32],
        targets: &[u32],
        dloss: f32,
    ) -> Result<f32, EngineError> {
        self.load_batch(inputs, targets)?;
        let (b, t) = (self.config.batch as usize, self.config.seq as usize);
        let n_layers = self.config.model.shape.n_layers;
        let (model, arena, times) = (&self.model, &mut self.arena, &mut self.timings);
        let mut clock = Instant::now();
        let mut lap = |slot: &mut Duration| {
            let now = Instant::now();
            *slot += now - clock;
            clock = now;
        };
        arena.enter(Phase::Embed);
        forward::embed(model, arena, b, t);
        arena.leave(Phase::Embed);
        lap(&mut times.embed);
        for l in 0..n_layers {
            arena.enter(Phase::Forward(l));
            forward::block(model, arena, l as usize, b, t);
            arena.leave(Phase::Forward(l));
        }
        lap(&mut times.forward_blocks);
        arena.enter(Phase::Head);
        let loss_sum = backward::head(model, arena, dloss);
        arena.leave(Phase::Head);
        lap(&mut times.head);
        for l in (0..n_layers).rev() {
            arena.enter(Phase::Backward(l));
            backward::block(model, arena, l as usize);
            arena.leave(Phase::Backward(l));
        }
        lap(&mut times.backward_blocks);
        arena.enter(Phase::EmbedBackward);
        backward::embed(model, arena);
        arena.leave(Phase::EmbedBackward);
        lap(&mut times.embed_backward);
        Ok(loss_sum)
    }

    /// Sets every gradient to zero (start of a step).
    pub fn zero_grads(&mut self) {
        use rayon::prelude::*;
        for &id in &self.model.grads {
            self.arena
                .f32_mut(id)
                .par_chunks_mut(1 << 16)
                .for_each(|c| c.fill(0.0));
        }
    }

    /// One optimizer step over `grad_accum` micro-batches drawn from `next_batch`.
    pub fn step(
        &mut self,
        next_batch: &mut dyn FnMut(&mut [u32], &mut [u32]),
    ) -> Result<StepStats, EngineError> {
        let n = self.micro_tokens();
        let k = self.config.grad_accum as usize;
        // Every rank scales by the tokens of the whole global step, so the all-reduced sum is
        // the mean over the global batch.
        let tokens = (n * k * self.config.ranks as usize) as u64;
        self.zero_grads();
        let (mut inputs, mut targets) = (vec![0u32; n], vec![0u32; n]);
        let mut loss_sum = 0.0f64;
        for _ in 0..k {
            next_batch(&mut inputs, &mut targets);
            loss_sum += f64::from(self.forward_backward(&inputs, &targets, 1.0 / tokens as f32)?);
        }
        let loss_sum = self.all_reduce(loss_sum)?;
        let loss = (loss_sum / tokens as f64) as f32;
        let lr = self.config.schedule.lr_at(self.step);
        if !loss.is_finite() {
            return Err(EngineError::NonFiniteLoss {
                step: self.step,
                loss,
                suggested_lr: self.config.schedule.lr / 10.0,
            });
        }
        let grad_norm = self.apply_update(lr)?;
        let stats = StepStats {
            step: self.step,
            loss,
            lr,
            grad_norm,
            tokens,
        };
        self.step += 1;
        Ok(stats)
    }

    /// Clips and applies the optimizer to the accumulated gradients; returns the unclipped norm.
    /// A non-finite gradient norm stops before any weight changes.
    pub fn apply_update(&mut self, lr: f32) -> Result<f32, EngineError> {
        let started = Instant::now();
        self.arena.enter(Phase::Optimizer);
        let (model, arena) = (&self.model, &self.arena);
        let norm = optim::grad_norm(model, arena);
        if !norm.is_finite() {
            self.arena.leave(Phase::Optimizer);
            return Err(EngineError::NonFiniteGradient {
                step: self.step,
                suggested_lr: self.config.schedule.lr / 10.0,
            });
        }
        if let Some(max_norm) = self.config.grad_clip {
            let scale = max_norm / (norm + 1e-6);
            if scale < 1.0 {
                optim::scale_grads(model, arena, scale);
            }
        }
        let t = (self.step + 1) as u32;
        optim::update(model, arena, &self.opt_state, self.config.optimizer, lr, t);
        self.arena.leave(Phase::Optimizer);
        self.timings.optimizer += started.elapsed();
        Ok(norm)
    }

    /// Per-category peaks measured by the arena so far.
    pub fn measured(&self) -> Measured {
        self.arena.measured()
    }

    /// Waits for every rank (a snapshot commits only after every rank's shard is on disk).
    pub fn barrier(&mut self) -> Result<(), EngineError> {
        match self.comm.as_mut() {
            Some(comm) => Ok(comm.barrier()?),
            None => Ok(()),
        }
    }
}
