//! A 3D-parallel trainer's communicators and the parts of the step that see the whole world: the
//! world of `ranks` = pp × dp × tp is laid out as Megatron's, tensor-parallel ranks fastest
//! (rank = (stage · dp + dp_rank) · tp + tp_rank): tensor-parallel groups of `tp` consecutive
//! ranks, data-parallel groups of the ranks of one stage with the same `tp_rank`, and each
//! pipeline's stages (`pp::Links`). ZeRO shards and reduces over the data-parallel group; the
//! model's own collectives run over the tensor-parallel group; the global gradient norm, the
//! any-rank flags and the memory report span the world.
//!
//! The norm counts a replicated weight (a norm, a row-parallel bias, learned positions) once:
//! its gradient is the same on every tensor-parallel rank, so only rank 0 of the group sums it;
//! and a tied embedding's copy on the last stage not at all.
//!
//! Example: `let comms = Comms::split(comm, Place::of(rank, 2, 2, 2))?;` then `comms.dp` for
//! ZeRO, `comms.tp` for the model.

use super::Trainer;
use crate::optim::UnitSlice;
use comm::Collective;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::model::view_range;
use plan_frugal::units::Role;

/// Where a rank sits in the 3D world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub tp_rank: u32,
    pub tp: u32,
    pub dp_rank: u32,
    pub dp: u32,
    pub stage: u32,
    pub pp: u32,
}

impl Place {
    pub fn of(rank: usize, tp: u32, dp: u32, pp: u32) -> Place {
        let rank = rank as u32;
        Place {
            tp_rank: rank % tp,
            tp,
            dp_rank: (rank / tp) % dp,
            dp,
            stage: rank / (tp * dp),
            pp,
        }
    }
}

/// The communicators of one rank.
pub(crate) struct Comms {
    /// The data-parallel group (the whole world without tensor or pipeline parallelism).
    pub dp: Box<dyn Collective>,
    /// The tensor-parallel group, the pipeline's links and the whole world (`None` without
    /// them).
    pub tp: Option<Box<dyn Collective>>,
    /// The ranks of the tensor-parallel group that share one key/value head (when there are
    /// fewer heads than ranks).
    pub kv: Option<Box<dyn Collective>>,
    pub pp: Option<engine::pp::Links>,
    pub world: Option<Box<dyn Collective>>,
}

impl Comms {
    /// Splits `world` into the groups of `place` (a collective every rank calls).
    pub fn split(
        mut world: Box<dyn Collective>,
        place: Place,
        kv_replicas: u32,
    ) -> Result<Comms, EngineError> {
        if place.tp <= 1 && place.pp <= 1 {
            return Ok(Comms {
                dp: world,
                tp: None,
                kv: None,
                pp: None,
                world: None,
            });
        }
        let rank = world.rank() as u32;
        let tp_group = world.split(rank / place.tp, rank)?;
        let dp_group = world.split(place.stage * place.tp + place.tp_rank, rank)?;
        let kv_group = match place.tp > 1 {
            true => Some(world.split(rank / kv_replicas.max(1), rank)?),
            false => None,
        };
        let pp = match place.pp > 1 {
            true => Some(engine::pp::Links::split(
                &mut *world,
                place.pp,
                place.tp * place.dp,
            )?),
            false => None,
        };
        Ok(Comms {
            dp: dp_group,
            tp: (place.tp > 1).then_some(tp_group),
            kv: kv_group.filter(|_| kv_replicas > 1),
            pp,
            world: Some(world),
        })
    }
}

impl<B: TrainOps> Trainer<B> {
    /// The communicator that spans every rank.
    pub(crate) fn world_comm(&mut self) -> &mut dyn Collective {
        match self.world.as_mut() {
            Some(w) => w,
            None => &mut self.comm,
        }
    }

    /// `slices` without what another rank counts in the global norm: on a tensor-parallel rank
    /// other than 0 the replicated views (rank 0 counts them), on the last pipeline stage its
    /// copy of a tied embedding (the first stage counts it).
    pub(crate) fn norm_share(&self, slices: &mut Vec<UnitSlice>) {
        let Some(share) = self.model.share.as_ref() else {
            return;
        };
        // The last stage's copy of a tied embedding is the first stage's.
        let copy =
            share.stage.is_last() && !share.stage.is_first() && share.whole.shape.tied_embeddings;
        let mut kept = Vec::with_capacity(slices.len());
        for (u, s) in slices.iter().enumerate() {
            if copy && self.model.units[u].kind == plan_frugal::units::UnitKind::Embed {
                continue;
            }
            let kv_elsewhere = self
                .model
                .tp
                .as_ref()
                .is_some_and(|tp| tp.kv_counted_elsewhere());
            if share.tp_rank == 0 && !kv_elsewhere {
                kept.push(*s);
                continue;
            }
            let mut at = 0;
            for view in &self.model.units[u].views {
                // What another rank counts: a replicated view (tp rank 0 does), or the rows of
                // a key/value head this rank shares (the first rank sharing it does).
                let range = view_range(view);
                let skip = match view.role {
                    _ if share.tp_rank != 0 && share.replicated(view.role) => Some(range),
                    Role::QkvWeight | Role::QkvBias if kv_elsewhere => {
                        let s = &self.model.config.shape;
                        let q = (s.n_heads as u64 * s.d_head) as usize;
                        let kv = (2 * s.n_kv_heads as u64 * s.d_head) as usize;
                        let width = view.shape.get(1).copied().unwrap_or(1) as usize;
                        Some(range.start + q * width..range.start + (q + kv) * width)
                    }
                    _ => None,
                };
                let Some(local) = skip.and_then(|r| s.local(r)) else {
                    continue;
                };
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
