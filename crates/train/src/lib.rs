//! Training over the engine core: the trainer (one rank's plan, arena, model and training state)
//! and its step, backward, ZeRO 0-3 (`zero`), recompute, mixed precision and the loss scaler
//! (`precision`), optimizers, offload, LoRA/QLoRA weights out as PEFT (`peft`), tensor, sequence
//! and pipeline parallel training, and snapshots. It never imports the inference crate.
//!
//! A step zeroes the gradients, runs K micro-steps (forward block by block, the head's fused loss,
//! backward block by block, embedding backward), each token's gradient scaled by 1 / (tokens in the
//! whole step) so accumulation equals one large batch, then clips by the global norm and updates.
//! A non-finite loss stops the step before the update, so the weights stay as they were.
//! With several ranks, `zero::Sharding` does what the ZeRO stage asks at each phase boundary
//! (gather, reduce-scatter) and after the micro-steps (reduce, sharded update, gather).
//!
//! bf16/fp16 (`Trainer::mixed`, see `Mixed`): 2-byte weights and gradients, fp32 master
//! weights and Adam state (optionally offloaded to the host), fp16 with a dynamic loss scaler
//! that skips a step on an overflow found on any rank.
//!
//! What it does not do: print, or pick defaults for the user. The files it touches are its own:
//! snapshots (`snapshot`), the disk offload store (`offload`) and the process's peak RSS
//! (`/proc/self/status`, in `memory`).
//!
//! Example:
//! ```no_run
//! use train::{TrainConfig, Trainer};
//! # fn shape() -> plan::ModelShape { unimplemented!() }
//! // fp32 on one rank, flash attention, AdamW: `TrainConfig::new`'s defaults; set any field.
//! let config = TrainConfig {
//!     recompute: plan::setup::Recompute::Full,
//!     ..TrainConfig::new(engine::ModelConfig::from_shape(shape()).unwrap(), 4, 64)
//! };
//! let mut trainer = Trainer::new(config).unwrap();
//! trainer.init_weights(1337);
//! let (x, y) = (vec![0u32; 256], vec![1u32; 256]);
//! let stats = trainer.step(&mut |i, t| { i.copy_from_slice(&x); t.copy_from_slice(&y) }).unwrap();
//! assert!(stats.loss.is_finite());
//! ```

use crate::offload::OffloadStore;
use crate::optim::UnitSlice;
use crate::precision::LossScaler;
use crate::zero::{Pass, Sharding};
use comm::Collective;
use cpu::Cpu;
use engine::arena::{Arena, Measured};
use engine::backend::DType;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::forward;
use engine::model::Model;
use plan::buffer::{MemoryPlan, Phase};
use plan::setup::TrainSetup;
use std::time::{Duration, Instant};

pub mod backward;
mod build;
mod config;
mod memory;
mod mixed;
mod mla_backward;
mod moe_backward;
pub mod offload;
pub mod optim;
mod passes;
pub mod peft;
mod pipeline;
pub mod precision;
pub mod recompute;
pub mod run;
pub mod snapshot;
mod state;
pub mod testkit;
mod tp;
pub mod zero;
pub use config::{base_fingerprint, check_capacity, LoraConfig, StepStats, Timings, TrainConfig};
pub use memory::{MemoryBreakdown, RankMemory};
pub use mixed::Mixed;
pub use optim::{OptimizerKind, Schedule};
pub use state::{MasterState, TrainState};

pub struct Trainer<B: TrainOps = Cpu> {
    /// This rank's link to the others of its data-parallel group (every rank without tensor
    /// parallelism; `comm::Solo` for a world of one; `comm::Overlapped` under ZeRO-3 with
    /// `overlap_comm`), counting its bytes. Declared first so it is dropped first: a gather
    /// still in flight finishes before the arena it writes is freed.
    pub(crate) comm: comm::Counted<Box<dyn Collective>>,
    pub config: TrainConfig,
    pub plan: MemoryPlan,
    pub arena: Arena<B>,
    /// Weights and the forward's wiring.
    pub model: Model,
    /// Gradients, the backward's tensors and the optimizer state.
    pub state: TrainState,
    /// Optimizer steps taken.
    pub step: u64,
    pub timings: Timings,
    /// What the ZeRO stage shards and when it communicates.
    pub sharding: Sharding,
    /// Bytes this rank moved in its last optimizer step (ring model; zero on a single rank).
    pub last_step_comm: comm::CommStats,
    /// Tensor parallelism: the whole world (`train::tp`), and this rank's place in it.
    world: Option<comm::Counted<Box<dyn Collective>>>,
    world_rank: usize,
    /// fp16: the dynamic loss scaler.
    pub scaler: Option<LossScaler>,
    /// `--offload optimizer`: master weights and Adam moments on the host (RAM or a file).
    pub offload: Option<OffloadStore>,
    /// Steps skipped on an overflow so far.
    pub skipped_steps: u64,
    last_skipped: bool,
    /// The micro-batch's inputs and targets, reused by every step.
    batch: (Vec<u32>, Vec<u32>),
    /// Each unit's slice of the update, reused by every step.
    slices: Vec<UnitSlice>,
    /// The micro-batch of the step being run (LoRA dropout draws its masks from it).
    micro: u32,
}

impl Trainer<Cpu> {
    /// A trainer for a world of one rank on the CPU: plans the run, refuses it if it does not
    /// fit, then carves the arena (zeroed weights).
    pub fn new(config: TrainConfig) -> Result<Trainer, EngineError> {
        Trainer::with_comm(config, Box::new(comm::Solo::new()))
    }

    /// A trainer for one rank of a data-parallel world on the CPU: `comm`'s world size must
    /// equal `config.ranks`. Every rank starts from the same weights when given the same seed.
    pub fn with_comm(
        config: TrainConfig,
        comm: Box<dyn Collective>,
    ) -> Result<Trainer, EngineError> {
        Trainer::on(Cpu::new(), config, comm)
    }
}

impl<B: TrainOps> Trainer<B> {
    /// The planner's view of this trainer's run, its ZeRO stage and precision included.
    pub fn setup(&self) -> TrainSetup {
        self.config.setup()
    }

    /// Weight precision, loss scaler and offload of this run.
    pub fn mixed(&self) -> &Mixed {
        &self.config.mixed
    }

    /// This rank's index in the world (0 without a communicator).
    pub fn rank(&self) -> usize {
        self.world_rank
    }

    /// Sums `loss_sum` over the ranks (so every rank sees the same, NaN included), then
    /// reduces the gradients as the ZeRO stage says, in the comm crate's fixed rank order.
    fn all_reduce(&mut self, loss_sum: f64) -> Result<f64, EngineError> {
        // One rank keeps its f64 sum; several agree on the f32 sum in rank order.
        let loss = if self.comm.world_size() == 1 {
            loss_sum
        } else {
            let mut loss = [loss_sum as f32];
            (self.comm).all_reduce(loss.as_mut_slice().into(), comm::ReduceOp::Sum)?;
            f64::from(loss[0])
        };
        if loss.is_finite() {
            (self.sharding).reduce_grads(&self.state.grads, &self.arena, &mut self.comm)?;
        }
        Ok(loss)
    }

    /// Enters `phase`: the arena makes its buffers live, then the ZeRO stage gathers weights and
    /// zeroes gradients born there.
    pub fn enter_phase(&mut self, phase: Phase, pass: Pass) -> Result<(), EngineError> {
        self.arena.enter(phase);
        let grads = &self.state.grads;
        let (model, arena, comm) = (&mut self.model, &self.arena, &mut self.comm);
        (self.sharding).enter(phase, pass, model, grads, arena, comm)
    }

    /// Leaves `phase`: the ZeRO stage reduce-scatters gradients finished there, then the arena
    /// frees what dies there.
    pub fn leave_phase(&mut self, phase: Phase) -> Result<(), EngineError> {
        let grads = &self.state.grads;
        (self.sharding).leave(phase, grads, &self.arena, &mut self.comm)?;
        self.arena.leave(phase);
        Ok(())
    }

    /// Tokens of one micro-batch.
    pub fn micro_tokens(&self) -> usize {
        (self.config.batch * self.config.seq) as usize
    }

    /// Copies a batch into the arena, refusing ids the model has no embedding for.
    pub(crate) fn load_batch(
        &mut self,
        inputs: &[u32],
        targets: &[u32],
    ) -> Result<(), EngineError> {
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
        let be = self.arena.backend();
        // A pipeline stage holds the ids only where it embeds, the targets where it has the head.
        if self.model.runs_embedding() {
            be.upload_ids(&self.arena, self.model.head.tokens, inputs);
        }
        if self.model.runs_head() {
            be.upload_ids(&self.arena, self.state.targets, targets);
        }
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
        // LoRA dropout: one mask per (rank, step, micro-batch), redrawn the same by a recompute
        // and by a resumed run; evaluation runs without it.
        let seed = [self.comm.rank() as u64, self.step, u64::from(self.micro)]
            .iter()
            .fold(0x6C6F_7261_u64, |h, &x| {
                (h ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
            });
        if let Some(lora) = &self.model.lora {
            lora.dropout_seed.set(Some(seed));
        }
        let n_layers = self.config.model.shape.n_layers;
        let mut clock = Instant::now();
        let mut lap = |slot: &mut Duration| {
            let now = Instant::now();
            *slot += now - clock;
            clock = now;
        };
        let mut times = self.timings;
        let pass = Pass::Training;
        self.enter_phase(Phase::Embed, pass)?;
        forward::embed(&self.model, &self.arena, b, t);
        self.leave_phase(Phase::Embed)?;
        lap(&mut times.embed);
        for l in 0..n_layers {
            self.enter_phase(Phase::Forward(l), pass)?;
            forward::block(&self.model, &self.arena, l as usize, b, t);
            self.leave_phase(Phase::Forward(l))?;
        }
        lap(&mut times.forward_blocks);
        self.enter_phase(Phase::Head, pass)?;
        let loss_sum = backward::head(&self.model, &self.state, &self.arena, dloss);
        self.leave_phase(Phase::Head)?;
        lap(&mut times.head);
        for l in (0..n_layers).rev() {
            self.enter_phase(Phase::Backward(l), pass)?;
            backward::block(&self.model, &self.state, &self.arena, l as usize);
            self.leave_phase(Phase::Backward(l))?;
        }
        lap(&mut times.backward_blocks);
        self.enter_phase(Phase::EmbedBackward, pass)?;
        backward::embed(&self.model, &self.state, &self.arena);
        self.leave_phase(Phase::EmbedBackward)?;
        lap(&mut times.embed_backward);
        self.timings = times;
        self.check_tp()?;
        if let Some(lora) = &self.model.lora {
            lora.dropout_seed.set(None);
        }
        Ok(loss_sum)
    }

    /// Sets the gradients a step accumulates into to zero (start of a step): the full
    /// gradients at ZeRO stages 0-1, this rank's gradient shards at stages 2-3.
    pub fn zero_grads(&mut self) {
        if self.sharding.half == Some(DType::F16) {
            *self.sharding.underflow.borrow_mut() = Some(Default::default());
        }
        self.sharding.zero_grads(&self.state.grads, &self.arena);
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
        let tokens = (n * k * self.config.dp() as usize) as u64;
        let comm_before = self.comm_stats();
        let loss_scale = self.scaler.as_ref().map(|s| s.scale());
        // fp16: every token's gradient is multiplied by the loss scale (the seed of the
        // backward), so small gradients stay above fp16's smallest subnormal.
        let dloss = loss_scale.unwrap_or(1.0) / tokens as f32;
        self.zero_grads();
        let (mut inputs, mut targets) = std::mem::take(&mut self.batch);
        let mut loss_sum = 0.0f64;
        // A pipeline stage runs its micro-batches under 1F1B (`train::pipeline`).
        let piped = self.model.pp.is_some();
        if piped {
            match self.pipeline_steps(next_batch, (&mut inputs, &mut targets), dloss) {
                Ok(sum) => loss_sum = sum,
                Err(e) => {
                    self.batch = (inputs, targets);
                    return Err(e);
                }
            }
        }
        for micro in (0..k).filter(|_| !piped) {
            self.micro = micro as u32;
            next_batch(&mut inputs, &mut targets);
            let micro = self.forward_backward(&inputs, &targets, dloss);
            match micro {
                Ok(l) => loss_sum += f64::from(l),
                Err(e) => {
                    self.batch = (inputs, targets);
                    return Err(e);
                }
            }
        }
        self.batch = (inputs, targets);
        let loss_sum = self.all_reduce(loss_sum)?;
        let loss = (loss_sum / tokens as f64) as f32;
        let lr = self.config.schedule.lr_at(self.step);
        // Uniform guessing scores ln(V); a loss three times that is a diverged run, not
        // training (nanoGPT's runs start near ln(V) and only fall).
        let bound = 3.0 * (self.config.model.shape.vocab as f32).ln();
        if !loss.is_finite() || loss > bound {
            return Err(EngineError::NonFiniteLoss {
                step: self.step,
                loss,
                suggested_lr: self.config.schedule.lr / 10.0,
            });
        }
        let grad_norm = self.apply_update(lr)?;
        self.last_step_comm = self.comm_stats().since(&comm_before);
        let stats = StepStats {
            step: self.step,
            loss,
            lr,
            grad_norm,
            tokens,
            loss_scale,
            skipped: self.last_skipped,
        };
        self.step += 1;
        Ok(stats)
    }

    /// Clips and applies the optimizer to the accumulated gradients; returns the unclipped norm.
    /// A non-finite gradient norm stops before any weight changes. The norm is global: each rank
    /// sums the squares of its shard of every unit, and the sums are all-reduced in rank order.
    pub fn apply_update(&mut self, lr: f32) -> Result<f32, EngineError> {
        let started = Instant::now();
        self.arena.enter(Phase::Optimizer);
        let result = match self.sharding.half {
            Some(_) => self.apply_half_update(lr),
            None => {
                let mut slices = std::mem::take(&mut self.slices);
                let result = self.fp32_update_on(lr, &mut slices);
                self.slices = slices;
                result
            }
        };
        self.arena.leave(Phase::Optimizer);
        self.timings.optimizer += started.elapsed();
        result
    }

    fn fp32_update_on(&mut self, lr: f32, slices: &mut Vec<UnitSlice>) -> Result<f32, EngineError> {
        let (model, grads, arena) = (&self.model, &self.state.grads, &self.arena);
        self.sharding.norm_slices(model, grads, arena, slices);
        self.norm_share(slices);
        let sum_sq = optim::grad_sum_sq(arena, slices);
        let sum_sq = engine::share::sum_f64(self.world_comm(), sum_sq)?;
        let norm = sum_sq.sqrt() as f32;
        if !norm.is_finite() {
            return Err(EngineError::NonFiniteGradient {
                step: self.step,
                suggested_lr: self.config.schedule.lr / 10.0,
            });
        }
        self.update_slices(slices);
        let (model, arena) = (&self.model, &self.arena);
        if let Some(max_norm) = self.config.grad_clip {
            let scale = max_norm / (norm + 1e-6);
            if scale < 1.0 {
                optim::scale_grads(arena, slices, scale);
            }
        }
        let t = (self.step + 1) as u32;
        let (state, kind) = (&self.state.opt, self.config.optimizer);
        optim::update_slices(model, arena, state, slices, kind, lr, t);
        self.sharding.after_update(model, arena, &mut self.comm)?;
        Ok(norm)
    }

    /// Each unit's slice of the update into `out` (this rank's shard above stage 0).
    pub(crate) fn update_slices(&self, out: &mut Vec<UnitSlice>) {
        out.clear();
        for u in 0..self.model.units.len() {
            let s = (self.sharding).update_slice(&self.model, &self.state.grads, &self.arena, u);
            out.push(s);
        }
    }

    /// Per-category peaks measured by the arena so far.
    pub fn measured(&self) -> Measured {
        self.arena.measured()
    }

    /// Bytes this rank has moved so far, per collective (zero on a single rank).
    pub fn comm_stats(&self) -> comm::CommStats {
        self.comm.stats()
    }

    /// Time this rank has spent blocked in its data-parallel collectives so far: every blocking
    /// call, and of an overlapped gather only its start and its wait.
    pub fn comm_blocked(&self) -> Duration {
        self.comm.blocked()
    }

    /// Whether the data-parallel collectives run on a thread of their own (ZeRO-3 with
    /// `overlap_comm` over several ranks).
    pub fn comm_overlapped(&self) -> bool {
        self.config.overlap_comm && self.sharding.rule.params_sharded() && self.sharding.world > 1
    }

    /// fp16: how this rank's fp32 gradients of the last step fared when rounded to fp16 at the
    /// loss scale (measured on each unit's scaled fp32 gradient before it is added into the
    /// fp16 accumulator): the fractions flushed to zero and left subnormal.
    pub fn underflow(&self) -> Option<crate::precision::UnderflowStats> {
        *self.sharding.underflow.borrow()
    }

    /// Waits for every rank (a snapshot commits only after every rank's shard is on disk).
    pub fn barrier(&mut self) -> Result<(), EngineError> {
        Ok(self.world_comm().barrier()?)
    }

    /// Whether `flag` is true on any rank; every rank calls it after the same step, so all
    /// agree (e.g. to stop on a signal only one thread saw first).
    pub fn any_rank(&mut self, flag: bool) -> Result<bool, EngineError> {
        let world = self.world_comm();
        if world.world_size() == 1 {
            return Ok(flag);
        }
        Ok(world.all_gather_u64(&[u64::from(flag)])?.contains(&1))
    }

    /// bf16/fp16: each unit's master weights and Adam moments (this rank's part; empty when
    /// offloaded).
    pub fn masters(&self) -> &[MasterState] {
        &self.state.masters
    }
}
