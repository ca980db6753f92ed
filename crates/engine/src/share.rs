//! Where a rank's model sits in the whole model: its tensor-parallel share of every unit
//! (`plan_frugal::tp`) and its pipeline stage's units (`plan_frugal::pp`). Initialisation,
//! saving and the global norm go through this map, so a rank's units are cut from, and put back
//! into, the units of the whole model (`plan_frugal::param_units` of it) as one rank would hold
//! them.
//!
//! Example: `share.take_unit(&model.units[u], &whole_values, &mut mine)` after filling the whole
//! unit `share.whole_index(model.units[u].kind)` from the seed.

use crate::config::ModelConfig;
use crate::error::EngineError;
use plan_frugal::pp::{self, Stage};
use plan_frugal::tp::{self, Split};
use plan_frugal::units::{Role, Unit, UnitKind};

/// This rank's place in the whole model.
pub struct Share {
    /// The whole model: its config (saved with the model) and units.
    pub whole: ModelConfig,
    pub whole_units: Vec<Unit>,
    pub tp_rank: u32,
    pub tp_size: u32,
    pub stage: Stage,
}

impl Share {
    pub fn new(
        whole: ModelConfig,
        (tp_rank, tp_size): (u32, u32),
        stage: Stage,
    ) -> Result<Share, EngineError> {
        let whole_units = plan_frugal::param_units(&whole.shape, 1)?;
        Ok(Share {
            whole,
            whole_units,
            tp_rank,
            tp_size,
            stage,
        })
    }

    /// The model this rank computes with: its stage's layers, its tensor-parallel share.
    pub fn rank_config(&self) -> ModelConfig {
        let staged = pp::shape(&self.whole.shape, self.stage);
        ModelConfig {
            shape: tp::rank_shape(&staged, self.tp_size, self.tp_rank),
            ..self.whole.clone()
        }
    }

    /// The index in the whole model's units of this rank's unit `kind`.
    pub fn whole_index(&self, kind: UnitKind) -> usize {
        let whole = self.stage.whole_kind(kind);
        (self.whole_units.iter().position(|u| u.kind == whole))
            .expect("every unit is in the whole model")
    }

    pub fn split(&self, role: Role, rank: u32) -> Split {
        tp::split(&self.whole.shape, role, self.tp_size, rank)
    }

    /// This rank's share (`unit`, padded) of the whole unit's values `whole`.
    pub fn take_unit(&self, unit: &Unit, whole: &[f32], part: &mut [f32]) {
        let w = &self.whole_units[self.whole_index(unit.kind)];
        part.fill(0.0);
        for view in &unit.views {
            let wv = w.view(view.role);
            let src = &whole[wv.offset as usize..][..wv.numel() as usize];
            let dst = &mut part[view.offset as usize..][..view.numel() as usize];
            tp::take(&self.split(view.role, self.tp_rank), &wv.shape, src, dst);
        }
    }

    /// Writes tensor-parallel rank `rank`'s share `part` of `unit` into the whole unit's values.
    pub fn put_unit(&self, unit: &Unit, rank: u32, part: &[f32], whole: &mut [f32]) {
        let w = &self.whole_units[self.whole_index(unit.kind)];
        for view in &unit.views {
            let wv = w.view(view.role);
            let src = &part[view.offset as usize..][..view.numel() as usize];
            let dst = &mut whole[wv.offset as usize..][..wv.numel() as usize];
            tp::put(&self.split(view.role, rank), &wv.shape, src, dst);
        }
    }

    /// Whether `role` is whole on every tensor-parallel rank (its gradient is the same on each,
    /// counted once in the global norm: on rank 0).
    pub fn replicated(&self, role: Role) -> bool {
        self.split(role, self.tp_rank) == Split::Whole
    }

    /// The units every tensor-parallel rank of this stage holds, in rank order.
    pub fn tp_units(&self) -> Result<Vec<Vec<Unit>>, EngineError> {
        let staged = pp::shape(&self.whole.shape, self.stage);
        let tied = self.whole.shape.tied_embeddings;
        (0..self.tp_size)
            .map(|r| {
                let units = match self.tp_size {
                    1 => plan_frugal::param_units(&staged, 1)?,
                    _ => tp::units(&staged, self.tp_size, r, 1)?,
                };
                Ok(units
                    .into_iter()
                    .filter(|u| self.stage.holds(u.kind, tied))
                    .collect())
            })
            .collect()
    }
}

/// `x` summed over the ranks in rank order; one rank keeps its f64 as it is. Two f32 words (value
/// and rounding residue) carry ~48 bits of each rank's f64 sum.
pub fn sum_f64(comm: &mut dyn comm::Collective, x: f64) -> Result<f64, crate::EngineError> {
    if comm.world_size() == 1 {
        return Ok(x);
    }
    let hi = x as f32;
    let mut words = [hi, (x - f64::from(hi)) as f32];
    comm.all_reduce(words.as_mut_slice().into(), comm::ReduceOp::Sum)?;
    Ok(f64::from(words[0]) + f64::from(words[1]))
}
