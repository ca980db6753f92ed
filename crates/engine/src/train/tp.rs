//! A tensor-parallel trainer's communicators and the parts of the step that see the whole world:
//! with `tp` > 1 the world of `ranks` splits into tensor-parallel groups of `tp` consecutive
//! ranks (Megatron's order: rank = dp_rank · tp + tp_rank) and data-parallel groups of the ranks
//! with the same `tp_rank`. ZeRO shards and reduces over the data-parallel group; the model's
//! own collectives run over the tensor-parallel group; the global gradient norm, the
//! any-rank flags and the memory report span the world.
//!
//! The norm counts a replicated weight (a norm, a row-parallel bias, learned positions) once:
//! its gradient is the same on every tensor-parallel rank, so only rank 0 of the group sums it.
//!
//! Example: `let comms = Comms::split(comm, 2)?;` then `comms.dp` for ZeRO, `comms.tp` for the
//! model.

use super::Trainer;
use crate::backend::Backend;
use crate::error::EngineError;
use crate::model::view_range;
use crate::optim::UnitSlice;
use comm::Collective;

/// The communicators of one rank.
pub(crate) struct Comms {
    /// The data-parallel group (the whole world without tensor parallelism).
    pub dp: Box<dyn Collective>,
    /// The tensor-parallel group and the whole world (`None` without tensor parallelism).
    pub tp: Option<Box<dyn Collective>>,
    pub world: Option<Box<dyn Collective>>,
}

impl Comms {
    /// Splits `world` into groups of `tp` ranks (a collective every rank calls).
    pub fn split(mut world: Box<dyn Collective>, tp: usize) -> Result<Comms, EngineError> {
        if tp <= 1 {
            return Ok(Comms {
                dp: world,
                tp: None,
                world: None,
            });
        }
        let rank = world.rank();
        let tp_group = world.split((rank / tp) as u32, rank as u32)?;
        let dp_group = world.split((rank % tp) as u32, rank as u32)?;
        Ok(Comms {
            dp: dp_group,
            tp: Some(tp_group),
            world: Some(world),
        })
    }
}

impl<B: Backend> Trainer<B> {
    /// The communicator that spans every rank.
    pub(crate) fn world_comm(&mut self) -> &mut dyn Collective {
        match self.world.as_mut() {
            Some(w) => w,
            None => &mut self.comm,
        }
    }

    /// On a tensor-parallel rank other than 0, `slices` without the replicated views (rank 0
    /// counts them in the norm); as they are otherwise.
    pub(crate) fn norm_share(&self, slices: &mut Vec<UnitSlice>) {
        let Some(tp) = self.model.tp.as_ref().filter(|tp| tp.rank != 0) else {
            return;
        };
        let mut kept = Vec::with_capacity(slices.len());
        for (u, s) in slices.iter().enumerate() {
            let mut at = 0;
            for view in &self.model.units[u].views {
                let Some(local) = s.local(view_range(view)) else {
                    continue;
                };
                if !tp.replicated(view.role) {
                    continue;
                }
                kept.push(s.part(at..local.start));
                at = local.end;
            }
            kept.push(s.part(at..s.len()));
        }
        kept.retain(|s| !s.is_empty());
        *slices = kept;
    }

    /// Fails the step if a tensor-parallel collective inside the pass failed.
    pub(crate) fn check_tp(&self) -> Result<(), EngineError> {
        match &self.model.tp {
            Some(tp) => tp.check(),
            None => Ok(()),
        }
    }
}
