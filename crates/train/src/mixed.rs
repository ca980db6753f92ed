//! Mixed precision and optimizer offload in the trainer: the run's `Mixed` settings, the
//! bf16/fp16 optimizer step (norm and overflow over the 2-byte gradients, the loss scaler's
//! verdict, AdamW on the fp32 master weights in the arena or the host offload store), and the
//! construction of the master-weight state.
//!
//! It does not move gradients between ranks (`zero::Sharding`) or touch the fp32 path.
//!
//! Example: `Trainer::new(TrainConfig { mixed: Mixed::fp16(scaler), ..cfg })?`.

use super::Trainer;
use crate::offload::OffloadStore;
use crate::optim::{OptimizerKind, UnitSlice};
use crate::precision::update as half_update;
use crate::precision::{MasterStep, ScalerConfig, StepDecision};
use comm::Collective;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::model::Model;
use plan::setup::{Offload, Precision};
use plan_frugal::StateRule;

/// Weight precision and offload of a run (`Mixed::fp32()`: everything fp32, nothing offloaded).
#[derive(Clone, Debug, PartialEq)]
pub struct Mixed {
    pub precision: Precision,
    /// fp16 only: the dynamic loss scaler's settings (torch or DeepSpeed defaults).
    pub loss_scaler: Option<ScalerConfig>,
    /// `Offload::Optimizer` (bf16/fp16): master weights and Adam moments live on the host,
    /// where the optimizer steps them.
    pub offload: Offload,
    /// With `Offload::Optimizer`: keep them in a memory-mapped file created here (it must not
    /// exist) instead of host RAM.
    pub offload_path: Option<std::path::PathBuf>,
}

impl Mixed {
    pub fn fp32() -> Mixed {
        Mixed {
            precision: Precision::Fp32,
            loss_scaler: None,
            offload: Offload::None,
            offload_path: None,
        }
    }

    /// bf16 weights and gradients, fp32 master weights, no loss scaling.
    pub fn bf16() -> Mixed {
        Mixed {
            precision: Precision::Bf16,
            ..Mixed::fp32()
        }
    }

    /// fp16 weights and gradients, fp32 master weights, `scaler`'s dynamic loss scaling.
    pub fn fp16(scaler: ScalerConfig) -> Mixed {
        Mixed {
            precision: Precision::Fp16,
            loss_scaler: Some(scaler),
            ..Mixed::fp32()
        }
    }
}

impl Mixed {
    /// Rank `rank`'s store file: `offload_path` itself in a world of one, else with the rank
    /// before the extension (`state.bin` → `state.rank1.bin`), so ranks never share a file.
    pub fn store_path(&self, rank: usize, world: usize) -> Option<std::path::PathBuf> {
        let path = self.offload_path.as_ref()?;
        if world == 1 {
            return Some(path.clone());
        }
        let stem = path
            .file_stem()
            .map_or_else(Default::default, |s| s.to_os_string());
        let mut name = stem;
        name.push(format!(".rank{rank}"));
        if let Some(ext) = path.extension() {
            name.push(".");
            name.push(ext);
        }
        Some(path.with_file_name(name))
    }
}

impl<B: TrainOps> Trainer<B> {
    /// The bf16/fp16 update: norm and overflow over the 2-byte gradients (every rank agrees on
    /// both), the scaler's verdict (fp16: skip the step on an overflow anywhere), then AdamW on
    /// the fp32 master weights, rounding the working copy. Returns the unscaled norm (NaN when
    /// the step was skipped).
    pub(super) fn apply_half_update(&mut self, lr: f32) -> Result<f32, EngineError> {
        self.last_skipped = false;
        let mut slices = std::mem::take(&mut self.slices);
        let result = self.half_update_on(lr, &mut slices);
        self.slices = slices;
        result
    }

    fn half_update_on(&mut self, lr: f32, slices: &mut Vec<UnitSlice>) -> Result<f32, EngineError> {
        let (model, grads, arena) = (&self.model, &self.state.grads, &self.arena);
        self.sharding.norm_slices(model, grads, arena, slices);
        self.norm_share(slices);
        let (sum_sq, found_inf) = half_update::grad_stats(arena, slices);
        let sum_sq = engine::share::sum_f64(self.world_comm(), sum_sq)?;
        let found_inf = self.comm.any(found_inf)?;
        let used_scale = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        if let Some(scaler) = self.scaler.as_mut() {
            if scaler.update(found_inf)? == StepDecision::Skip {
                self.skipped_steps += 1;
                self.last_skipped = true;
                return Ok(f32::NAN);
            }
        }
        let norm = (sum_sq.sqrt() / f64::from(used_scale)) as f32;
        if !norm.is_finite() {
            return Err(EngineError::NonFiniteGradient {
                step: self.step,
                suggested_lr: self.config.schedule.lr / 10.0,
            });
        }
        let clip = match self.config.grad_clip {
            Some(max_norm) => (max_norm / (norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        let OptimizerKind::AdamW {
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.config.optimizer
        else {
            unreachable!("the plan refuses bf16/fp16 without AdamW");
        };
        let opt = kernels::adamw::AdamW::new(lr, (beta1, beta2), eps, weight_decay);
        self.update_slices(slices);
        let (model, arena) = (&self.model, &self.arena);
        let k = MasterStep {
            opt,
            step: (self.step + 1) as u32,
            grad_multiplier: clip / used_scale,
        };
        match self.offload.as_mut() {
            // On a GPU the 2-byte gradient slice would be copied to the host here and the
            // working copy back after; on this CPU engine both sides are RAM.
            Some(store) => {
                for (u, s) in slices.iter().enumerate() {
                    let unit = &model.units[u];
                    half_update::unit_update_host(unit, s, arena, store.unit(u), k);
                }
            }
            None => half_update::master_update(model, arena, &self.state.masters, slices, k),
        }
        self.sharding.after_update(model, arena, &mut self.comm)?;
        Ok(norm)
    }
}

/// The host store of every unit's master weights and Adam moments (this rank's part: whole
/// units at stage 0, shards above), in RAM or in rank `rank`'s file (`Mixed::store_path`).
pub(super) fn offload_store(
    model: &Model,
    rule: StateRule,
    (rank, world): (usize, usize),
    mixed: &Mixed,
) -> Result<OffloadStore, EngineError> {
    let numels: Vec<u64> = model
        .units
        .iter()
        .map(|u| match rule.optimizer_sharded() {
            false => u.padded_numel,
            true => plan_frugal::shards::shard_numel(u, rule.world),
        })
        .collect();
    // One file per rank of the world (tensor-parallel ranks share a data-parallel rank).
    Ok(match &mixed.store_path(rank, world) {
        Some(path) => OffloadStore::on_disk(path, &numels)?,
        None => OffloadStore::in_memory(&numels),
    })
}
