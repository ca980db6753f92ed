//! ZeRO stages 0-3 for one rank: what happens to the model state at each phase of the step.
//!
//! The plan (`plan::frugal::shards`) says which buffers exist and when they live; this module
//! moves bytes between them through the rank's `Collective`:
//! - stage 0: after the micro-steps, every full gradient is all-reduced; every rank updates
//!   everything.
//! - stage 1: after the micro-steps, every full gradient is reduce-scattered in place (rank r's
//!   reduced shard lands in `grads.<u>[r·s .. (r+1)·s]`); the rank updates its shard of
//!   `params.<u>` with its shard of Adam m, v; then `params.<u>` is all-gathered in place.
//! - stage 2: a unit's full gradient is born zeroed in the first phase that writes it and
//!   reduce-scattered in place at the end of the last one, every micro-step; the rank adds its
//!   shard into `grads.shard.<u>`, and the arena frees the full gradient. Update and gather as
//!   stage 1.
//! - stage 3: as stage 2, and weights exist only as `params.shard.<u>`: entering a phase
//!   all-gathers the units the plan's gathers say are born there (one phase early: prefetch),
//!   and points `Model::params` at the gathered copy the kernels of that phase read. The
//!   update writes the shard; nothing is gathered after it.
//!
//! Reductions keep the comm crate's rank order, and every stage reduces a unit's gradient as one
//! rank-ordered sum of the same per-rank values, so stages 0-3 on N ranks give bit-identical
//! weights with one micro-step. The gradient norm for clipping is the same at every stage: each
//! rank's sum of squares over its shard of every unit (f64, chunk order), all-reduced in rank
//! order. With K > 1 micro-steps stages 2-3 add K rank-ordered sums where stages 0-1 sum the K
//! micro-steps locally first: equal up to rounding, not bit for bit.
//!
//! What it does not do: allocate (the arena holds every buffer), decide lifetimes (the plan), or
//! overlap communication with compute (the in-process collectives are synchronous; a prefetched
//! gather is planned and measured one phase early, but runs at that phase's start).
//!
//! Example: the trainer calls `sharding.enter(phase, ..)` after `arena.enter(phase)` and
//! `sharding.leave(phase, ..)` before `arena.leave(phase)`.

use crate::arena::{Arena, BufId};
use crate::error::EngineError;
use crate::model::Model;
use crate::optim::UnitSlice;
use comm::{Buf, BufMut, Collective, ReduceOp};
use plan::buffer::Phase;
use plan::frugal::shards::{self, Gather};
use plan::setup::ZeroStage;
use std::ops::Range;

mod weights;

/// Whether a pass runs the backward (training) or only the forward (validation, sampling):
/// a forward-only pass skips the backward's gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Training,
    ForwardOnly,
}

/// One rank's view of the sharded model state.
pub struct Sharding {
    pub stage: ZeroStage,
    pub rank: usize,
    pub world: usize,
    n_layers: u32,
    /// Elements of each unit's shard.
    shard_len: Vec<usize>,
    /// Stages 2-3: each unit's accumulated gradient shard.
    grad_shards: Vec<BufId>,
    /// Stage 3: each unit's weight shard.
    param_shards: Vec<BufId>,
    /// Stage 3: the plan's gathers and their buffers.
    gathers: Vec<(Gather, BufId)>,
    /// Stages 2-3: the phases each unit's full gradient is first and last written in.
    grad_spans: Vec<(Phase, Phase)>,
}

type Comm<'a> = Option<&'a mut (dyn Collective + 'static)>;

impl Sharding {
    /// Resolves the stage's buffers in `arena` (planned for `world` ranks).
    pub fn new(
        stage: ZeroStage,
        rank: usize,
        world: usize,
        model: &Model,
        arena: &Arena,
    ) -> Sharding {
        let shape = &model.config.shape;
        let sharded_grads = matches!(stage, ZeroStage::Zero2 | ZeroStage::Zero3);
        let ids = |name: fn(&str) -> String, on: bool| -> Vec<BufId> {
            let units = model.units.iter().filter(|_| on);
            units.map(|u| arena.id(&name(&u.name))).collect()
        };
        let gathers = if stage == ZeroStage::Zero3 {
            let g = shards::gathers(shape, model.policy);
            g.into_iter()
                .map(|g| {
                    let id = arena.id(&g.name);
                    (g, id)
                })
                .collect()
        } else {
            Vec::new()
        };
        Sharding {
            stage,
            rank,
            world,
            n_layers: shape.n_layers,
            shard_len: model
                .units
                .iter()
                .map(|u| shards::shard_numel(u, world as u32) as usize)
                .collect(),
            grad_shards: ids(shards::grads_shard_name, sharded_grads),
            param_shards: ids(shards::params_shard_name, stage == ZeroStage::Zero3),
            gathers,
            grad_spans: model
                .units
                .iter()
                .map(|u| shards::grad_span(shape, u.kind))
                .collect(),
        }
    }

    fn sharded_grads(&self) -> bool {
        matches!(self.stage, ZeroStage::Zero2 | ZeroStage::Zero3)
    }

    /// This rank's elements of unit `u`.
    pub fn shard_range(&self, u: usize) -> Range<usize> {
        let s = self.shard_len[u];
        self.rank * s..(self.rank + 1) * s
    }

    /// Stage 3: each unit's weight shard (empty below stage 3).
    pub fn param_shards(&self) -> &[BufId] {
        &self.param_shards
    }

    /// After `arena.enter(phase)`: stage 3 gathers what is born here and repoints the model's
    /// weights; stages 2-3 zero the full gradients born here.
    pub fn enter(
        &self,
        phase: Phase,
        pass: Pass,
        model: &mut Model,
        arena: &Arena,
        mut comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let at = phase.ordinal(self.n_layers);
        for (g, id) in &self.gathers {
            let backward = g.used_from.ordinal(self.n_layers) > Phase::Head.ordinal(self.n_layers);
            if g.born == phase && !(backward && pass == Pass::ForwardOnly) {
                let shard = arena.f32(self.param_shards[g.unit]);
                let mut full = arena.f32_mut(*id);
                match comm.as_deref_mut() {
                    Some(c) => c.all_gather(Buf::F32(&shard), BufMut::F32(&mut full))?,
                    None => full.copy_from_slice(&shard),
                }
            }
            let (from, to) = (
                g.used_from.ordinal(self.n_layers),
                g.dies.ordinal(self.n_layers),
            );
            if from <= at && at <= to {
                model.params[g.unit] = *id;
            }
        }
        if self.sharded_grads() && pass == Pass::Training {
            for (u, &(first, _)) in self.grad_spans.iter().enumerate() {
                if first == phase {
                    arena.f32_mut(model.grads[u]).fill(0.0);
                }
            }
        }
        Ok(())
    }

    /// Before `arena.leave(phase)`: stages 2-3 reduce-scatter the full gradients that die here
    /// and add this rank's shard into the unit's gradient shard.
    pub fn leave(
        &self,
        phase: Phase,
        model: &Model,
        arena: &Arena,
        mut comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        if !self.sharded_grads() {
            return Ok(());
        }
        for (u, &(_, last)) in self.grad_spans.iter().enumerate() {
            if last != phase {
                continue;
            }
            let mut full = arena.f32_mut(model.grads[u]);
            if let Some(c) = comm.as_deref_mut() {
                c.reduce_scatter_in_place(BufMut::F32(&mut full), ReduceOp::Sum)?;
            }
            let mut acc = arena.f32_mut(self.grad_shards[u]);
            let mine = &full[self.shard_range(u)];
            acc.iter_mut().zip(mine).for_each(|(a, &g)| *a += g);
        }
        Ok(())
    }

    /// After the micro-steps: stage 0 all-reduces, stage 1 reduce-scatters every full gradient
    /// (stages 2-3 reduced during the backward).
    pub fn reduce_grads(
        &self,
        model: &Model,
        arena: &Arena,
        comm: &mut dyn Collective,
    ) -> Result<(), EngineError> {
        if self.sharded_grads() {
            return Ok(());
        }
        for &id in &model.grads {
            let grads = BufMut::F32(&mut arena.f32_mut(id));
            match self.stage {
                ZeroStage::Zero0 => comm.all_reduce(grads, ReduceOp::Sum)?,
                _ => comm.reduce_scatter_in_place(grads, ReduceOp::Sum)?,
            }
        }
        Ok(())
    }

    /// Sets the gradients a step accumulates into to zero.
    pub fn zero_grads(&self, model: &Model, arena: &Arena) {
        use rayon::prelude::*;
        let ids = if self.sharded_grads() {
            &self.grad_shards
        } else {
            &model.grads
        };
        for &id in ids {
            arena
                .f32_mut(id)
                .par_chunks_mut(1 << 16)
                .for_each(|c| c.fill(0.0));
        }
    }

    /// The elements of each unit this rank's norm sums over: its shard (at stage 0 too, so the
    /// norm is computed alike at every stage).
    pub fn norm_slices(&self, model: &Model) -> Vec<UnitSlice> {
        (0..model.units.len())
            .map(|u| {
                let mut s = self.update_slice(model, u);
                if self.stage == ZeroStage::Zero0 {
                    let r = self.shard_range(u);
                    (s.params_at, s.grads_at, s.base, s.len) = (r.start, r.start, r.start, r.len());
                }
                s
            })
            .collect()
    }

    /// What this rank's optimizer updates in unit `u`: everything at stage 0, its shard above.
    pub fn update_slice(&self, model: &Model, u: usize) -> UnitSlice {
        let r = self.shard_range(u);
        let full = self.shard_len[u] * self.world;
        let (base, len) = match self.stage {
            ZeroStage::Zero0 => (0, full),
            _ => (r.start, r.len()),
        };
        let (params, params_at) = match self.stage {
            ZeroStage::Zero3 => (self.param_shards[u], 0),
            _ => (model.params[u], base),
        };
        let (grads, grads_at) = if self.sharded_grads() {
            (self.grad_shards[u], 0)
        } else {
            (model.grads[u], base)
        };
        UnitSlice {
            params,
            params_at,
            grads,
            grads_at,
            base,
            len,
        }
    }

    /// After the update: stages 1-2 all-gather every updated unit in place.
    pub fn after_update(
        &self,
        model: &Model,
        arena: &Arena,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let (ZeroStage::Zero1 | ZeroStage::Zero2, Some(c)) = (self.stage, comm) else {
            return Ok(());
        };
        for &id in &model.params {
            c.all_gather_in_place(BufMut::F32(&mut arena.f32_mut(id)))?;
        }
        Ok(())
    }
}
