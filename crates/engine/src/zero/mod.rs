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
//! 2-byte precisions (bf16, fp16) at every stage: the kernels read and write fp32, so every unit
//! is widened into the fp32 `gather.*` buffers on the stage-3 schedule (from the 2-byte full copy
//! `params.<u>` at stages 0-2; at stage 3 the 2-byte shards are all-gathered into the gather
//! buffer's first half and widened in place), and gradients take the stage-2 path: an fp32 span
//! `grads.<u>`, reduced at its end (all-reduce at stage 0, reduce-scatter above) and added,
//! rounded once, into the 2-byte accumulator `grads.shard.<u>` (full at stages 0-1). fp16 bits
//! travel through the collectives as bf16-typed words: gathers copy bits, they never add them.
//!
//! Example: the trainer calls `sharding.enter(phase, ..)` after `arena.enter(phase)` and
//! `sharding.leave(phase, ..)` before `arena.leave(phase)`.

use crate::arena::{Arena, BufId};
use crate::error::EngineError;
use crate::model::Model;
use crate::optim::UnitSlice;
use comm::{Buf, BufMut, Collective, ReduceOp};
use half::{bf16, f16};
use plan::buffer::Phase;
use plan::frugal::shards::{self, Gather};
use plan::setup::{Precision, ZeroStage};
use std::ops::Range;

mod weights;

/// Whether a pass runs the backward (training) or only the forward (validation, sampling):
/// a forward-only pass skips the backward's gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Training,
    ForwardOnly,
}

/// The 2-byte format of weights and gradients, when not fp32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

impl Half {
    pub fn of(precision: Precision) -> Option<Half> {
        match precision {
            Precision::Bf16 => Some(Half::Bf16),
            Precision::Fp16 => Some(Half::F16),
            _ => None,
        }
    }

    /// Widens 2-byte `bits` into `out`.
    pub fn widen(self, out: &mut [f32], bits: &[bf16]) {
        match self {
            Half::Bf16 => kernels::convert::bf16_to_f32(out, bits),
            Half::F16 => kernels::convert::f16_to_f32(out, as_f16(bits)),
        }
    }

    /// Rounds `x` (round to nearest even) to this format's bits.
    pub fn narrow(self, out: &mut [bf16], x: &[f32]) {
        match self {
            Half::Bf16 => kernels::convert::f32_to_bf16(out, x),
            Half::F16 => kernels::convert::f32_to_f16(as_f16_mut(out), x),
        }
    }

    /// `acc += g`, rounded once per element.
    fn add_into(self, acc: &mut [bf16], g: &[f32]) {
        use rayon::prelude::*;
        let chunk = 1 << 14;
        acc.par_chunks_mut(chunk)
            .zip(g.par_chunks(chunk))
            .for_each(|(a, g)| match self {
                Half::Bf16 => a
                    .iter_mut()
                    .zip(g)
                    .for_each(|(a, &g)| *a = bf16::from_f32(a.to_f32() + g)),
                Half::F16 => as_f16_mut(a)
                    .iter_mut()
                    .zip(g)
                    .for_each(|(a, &g)| *a = f16::from_f32(a.to_f32() + g)),
            });
    }

    /// A 2-byte element's value.
    fn value(self, bits: bf16) -> f32 {
        match self {
            Half::Bf16 => bits.to_f32(),
            Half::F16 => f16::from_bits(bits.to_bits()).to_f32(),
        }
    }
}

/// fp16 bits held in a bf16-typed slice (both are repr(transparent) u16).
pub fn as_f16(bits: &[bf16]) -> &[f16] {
    // SAFETY: same size, alignment and validity (every u16 is a valid f16).
    unsafe { std::slice::from_raw_parts(bits.as_ptr() as *const f16, bits.len()) }
}

/// Mutable [`as_f16`].
pub fn as_f16_mut(bits: &mut [bf16]) -> &mut [f16] {
    // SAFETY: as in `as_f16`.
    unsafe { std::slice::from_raw_parts_mut(bits.as_mut_ptr() as *mut f16, bits.len()) }
}

/// One rank's view of the sharded model state.
pub struct Sharding {
    pub stage: ZeroStage,
    /// 2-byte weights and gradients (bf16, fp16); `None` for fp32.
    pub half: Option<Half>,
    /// 2-byte precisions at stages 0-2: each unit's full 2-byte weights `params.<u>`.
    param_store: Vec<BufId>,
    /// fp16: this step's gradients classified against fp16's range as they are rounded into
    /// the accumulators (`None` when not measuring).
    pub underflow: std::cell::RefCell<Option<crate::precision::UnderflowStats>>,
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

type Comm<'a> = &'a mut dyn Collective;

impl Sharding {
    /// Resolves the stage's buffers in `arena` (planned for `world` ranks).
    pub fn new(
        stage: ZeroStage,
        half: Option<Half>,
        rank: usize,
        world: usize,
        model: &Model,
        arena: &Arena,
    ) -> Sharding {
        let shape = &model.config.shape;
        let sharded_grads = matches!(stage, ZeroStage::Zero2 | ZeroStage::Zero3) || half.is_some();
        let ids = |name: fn(&str) -> String, on: bool| -> Vec<BufId> {
            let units = model.units.iter().filter(|_| on);
            units.map(|u| arena.id(&name(&u.name))).collect()
        };
        let gathers = if stage == ZeroStage::Zero3 || half.is_some() {
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
        let stored_params = half.is_some() && stage != ZeroStage::Zero3;
        Sharding {
            stage,
            half,
            param_store: ids(shards::params_name, stored_params),
            underflow: Default::default(),
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

    /// Whether full gradients are fp32 spans reduced into `grad_shards` as each unit finishes
    /// (stages 2-3, and every stage with 2-byte gradients).
    fn sharded_grads(&self) -> bool {
        matches!(self.stage, ZeroStage::Zero2 | ZeroStage::Zero3) || self.half.is_some()
    }

    /// Each unit's accumulated gradient (fp32 shard at stages 2-3; 2-byte, full at stages 0-1).
    pub fn grad_shards(&self) -> &[BufId] {
        &self.grad_shards
    }

    /// Fills gather buffer `id` with unit `u`'s full fp32 weights.
    fn fill_gather(
        &self,
        u: usize,
        id: BufId,
        arena: &Arena,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let Some(half) = self.half else {
            let shard = arena.f32(self.param_shards[u]);
            let mut full = arena.f32_mut(id);
            comm.all_gather(Buf::F32(&shard), BufMut::F32(&mut full))?;
            return Ok(());
        };
        if self.stage != ZeroStage::Zero3 {
            let store = arena.bf16(self.param_store[u]);
            half.widen(&mut arena.f32_mut(id), &store);
            return Ok(());
        }
        let n = arena.f32(id).len();
        {
            let shard = arena.bf16(self.param_shards[u]);
            let mut bits = arena.bf16_mut(id);
            comm.all_gather(Buf::Bf16(&shard), BufMut::Bf16(&mut bits[..n]))?;
        }
        // Widen in place from the back: element i's 2 bytes sit in word i / 2 <= i, which
        // the descending loop has not overwritten yet.
        let mut words = arena.u32_mut(id);
        for i in (0..n).rev() {
            let w = words[i / 2];
            let b = if i % 2 == 0 { w & 0xffff } else { w >> 16 };
            words[i] = half.value(bf16::from_bits(b as u16)).to_bits();
        }
        Ok(())
    }

    /// This rank's elements of unit `u`.
    pub fn shard_range(&self, u: usize) -> Range<usize> {
        let s = self.shard_len[u];
        self.rank * s..(self.rank + 1) * s
    }

    /// The weights the optimizer writes: 2-byte `params.<u>` (bf16/fp16 at stages 0-2) or
    /// the stage-3 shards; empty for fp32 below stage 3 (those live in `Model::params`).
    pub fn working_weights(&self) -> &[BufId] {
        if self.stage == ZeroStage::Zero3 {
            &self.param_shards
        } else {
            &self.param_store
        }
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
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let at = phase.ordinal(self.n_layers);
        for (g, id) in &self.gathers {
            let backward = g.used_from.ordinal(self.n_layers) > Phase::Head.ordinal(self.n_layers);
            if g.born == phase && !(backward && pass == Pass::ForwardOnly) {
                self.fill_gather(g.unit, *id, arena, comm)?;
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
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        if !self.sharded_grads() {
            return Ok(());
        }
        for (u, &(_, last)) in self.grad_spans.iter().enumerate() {
            if last != phase {
                continue;
            }
            let mut full = arena.f32_mut(model.grads[u]);
            match self.stage {
                ZeroStage::Zero0 => comm.all_reduce(BufMut::F32(&mut full), ReduceOp::Sum)?,
                _ => comm.reduce_scatter_in_place(BufMut::F32(&mut full), ReduceOp::Sum)?,
            }
            if let Some(half) = self.half {
                let range = match self.stage {
                    ZeroStage::Zero0 => 0..full.len(),
                    _ => self.shard_range(u),
                };
                let mut acc = arena.bf16_mut(self.grad_shards[u]);
                let at = match self.stage {
                    ZeroStage::Zero0 | ZeroStage::Zero1 => range.start,
                    _ => 0,
                };
                if let Some(stats) = self.underflow.borrow_mut().as_mut() {
                    // Scaled already (the loss scale seeded the backward): measure at 1.
                    let s = crate::precision::UnderflowStats::measure(&full[range.clone()], 1.0);
                    stats.merge(&s);
                }
                half.add_into(&mut acc[at..at + range.len()], &full[range]);
                continue;
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
            // 0.0f32 is all-zero bits: it zeroes 2-byte buffers too (their slot's words).
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
            _ if self.half.is_some() => (self.param_store[u], base),
            _ => (model.params[u], base),
        };
        let stage01 = matches!(self.stage, ZeroStage::Zero0 | ZeroStage::Zero1);
        let (grads, grads_at) = if self.half.is_some() && stage01 {
            (self.grad_shards[u], base)
        } else if self.sharded_grads() {
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
        let (ZeroStage::Zero1 | ZeroStage::Zero2, c) = (self.stage, comm) else {
            return Ok(());
        };
        if self.half.is_some() {
            for &id in &self.param_store {
                c.all_gather_in_place(BufMut::Bf16(&mut arena.bf16_mut(id)))?;
            }
            return Ok(());
        }
        for &id in &model.params {
            c.all_gather_in_place(BufMut::F32(&mut arena.f32_mut(id)))?;
        }
        Ok(())
    }
}
