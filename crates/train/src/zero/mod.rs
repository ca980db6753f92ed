//! ZeRO stages 0-3 for one rank: what happens to the model state at each phase of the step.
//!
//! The plan (`plan_frugal::shards`) says which buffers exist and when they live; this module
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
//!   starts the all-gathers of the units the plan's gathers say are born there (one phase
//!   early: prefetch), finishes those the phase reads first, and points `Model::params` at the
//!   gathered copy the kernels of that phase read. The update writes the shard; nothing is
//!   gathered after it.
//!
//! Reductions keep the comm crate's rank order, and every stage reduces a unit's gradient as one
//! rank-ordered sum of the same per-rank values, so stages 0-3 on N ranks give bit-identical
//! weights with one micro-step. The gradient norm for clipping is the same at every stage: each
//! rank's sum of squares over its shard of every unit (f64, chunk order), all-reduced in rank
//! order. With K > 1 micro-steps stages 2-3 add K rank-ordered sums where stages 0-1 sum the K
//! micro-steps locally first: equal up to rounding, not bit for bit.
//!
//! Overlap: a started gather runs while the phase computes when the trainer's communicator is a
//! `comm::Overlapped` (stage 3 over several ranks, `TrainConfig::overlap_comm`); otherwise
//! `start` is the blocking gather and `finish` finds it done. The bytes are the same either way
//! (a gather copies bits), and so is the plan: the prefetched buffer lives from its birth.
//! Reductions stay blocking (an overlapped reduce-scatter would keep a full gradient alive a
//! phase longer, which the plan does not hold).
//!
//! What it does not do: allocate (the arena holds every buffer) or decide lifetimes (the plan).
//!
//! 2-byte precisions at every stage. fp16: the fp32 kernels read fp32, so every unit is
//! widened into the fp32 `gather.*` buffers on the stage-3 schedule, less the prefetch below
//! stage 3 (from the 2-byte full copy `params.<u>` at stages 0-2; at stage 3 the 2-byte shards
//! are all-gathered into the gather buffer's first half and widened in place), and gradients
//! take the stage-2 path: an fp32 span `grads.<u>`, reduced at its end (all-reduce at stage 0,
//! reduce-scatter above) and added, rounded once, into the 2-byte accumulator
//! `grads.shard.<u>` (full at stages 0-1). bf16 (`ActPolicy`'s `bf16_units`): no unit is
//! widened — stage 3 gathers the bits, only the vectors are widened (`gather::Slot`), and the
//! backward writes 2-byte gradients directly: into the accumulator at stages 0-1 (reduced once
//! in [`Sharding::reduce_grads`]), into a 2-byte span at 2-3 (reduce-scattered as bf16), the
//! vectors' fp32 gradients rounded in at the end of the unit's last phase. fp16 bits travel
//! through the collectives as bf16-typed words: gathers copy bits, they never add them.
//!
//! What each stage keeps where is `plan_frugal::StateRule`, the rule the plan emitted the
//! buffers from; this module asks it rather than deciding again. Every byte moves through the
//! backend's ops (collectives, conversions, accumulation), never through slices here.
//!
//! Example: the trainer calls `sharding.enter(phase, ..)` after `arena.enter(phase)` and
//! `sharding.leave(phase, ..)` before `arena.leave(phase)`.

use crate::optim::UnitSlice;
use comm::{Collective, Ticket};
use engine::arena::{Arena, BufId};
use engine::backend::TrainOps;
use engine::backend::{CommOp, DType};
use engine::error::EngineError;
use engine::model::Model;
use gather::Slot;
use plan::buffer::Phase;
use plan_frugal::shards::{self, StateRule};
use plan_frugal::Key;
use std::cell::Cell;
use std::ops::Range;

mod gather;
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
    /// What the stage, precision and offload keep where (the plan's rule).
    pub rule: StateRule,
    /// The 2-byte format of weights and gradients (bf16, fp16); `None` for fp32.
    pub half: Option<DType>,
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
    /// Grad spans: each unit's accumulated gradient (`grads.shard.<u>`).
    grad_shards: Vec<BufId>,
    /// Stage 3: each unit's weight shard.
    param_shards: Vec<BufId>,
    /// The plan's gathers and their buffers.
    gathers: Vec<Slot>,
    /// Each gather's fill started and not finished: the ticket of its transfer.
    pending: Vec<Cell<Option<Ticket>>>,
    /// Grad spans: the phases each unit's full gradient is first and last written in.
    grad_spans: Vec<(Phase, Phase)>,
    /// 2-byte units (`shards::direct_grads`): gradients written in 2 bytes directly.
    direct: bool,
    /// Each unit's vectors: (range in the unit, range in `gather.*.vectors`).
    vector_views: Vec<Vec<(Range<usize>, Range<usize>)>>,
    /// Each unit's `grads.<u>.vectors`, where the plan has it.
    grad_vectors: Vec<Option<BufId>>,
}

type Comm<'a> = &'a mut dyn Collective;

impl Sharding {
    /// Resolves the stage's buffers in `arena` (planned for `rule.world` ranks).
    pub fn new<B: TrainOps>(
        rule: StateRule,
        half: Option<DType>,
        rank: usize,
        model: &Model,
        arena: &Arena<B>,
    ) -> Sharding {
        let shape = &model.config.shape;
        let ids = |key: fn(plan_frugal::UnitKind) -> Key, on: bool| -> Vec<BufId> {
            let units = model.units.iter().filter(|_| on);
            units.map(|u| arena.id(key(u.kind))).collect()
        };
        let planned = match rule.gathers() {
            true => shards::gathers(shape, &model.units, model.policy, rule.params_sharded()),
            false => Vec::new(),
        };
        let slot_of = |key: Key| planned.iter().position(|g| g.key == key);
        let gathers: Vec<Slot> = (planned.iter())
            .map(|gather| Slot {
                id: arena.id(gather.key),
                from: match gather.holds {
                    shards::Holds::Vectors(Some(bits)) => Some(
                        slot_of(bits).expect("the bits a unit's vectors widen from are gathered"),
                    ),
                    _ => None,
                },
                gather: gather.clone(),
            })
            .collect();
        let world = rule.world as usize;
        Sharding {
            rule,
            half,
            param_store: ids(Key::Params, rule.is_half() && !rule.params_sharded()),
            underflow: Default::default(),
            rank,
            world,
            n_layers: shape.n_layers,
            shard_len: model
                .units
                .iter()
                .map(|u| shards::shard_numel(u, rule.world) as usize)
                .collect(),
            grad_shards: ids(Key::GradsShard, rule.grad_spans()),
            param_shards: ids(Key::ParamsShard, rule.params_sharded()),
            pending: gathers.iter().map(|_| Cell::new(None)).collect(),
            gathers,
            direct: shards::direct_grads(model.policy),
            vector_views: model.units.iter().map(gather::vector_views).collect(),
            grad_vectors: (model.units.iter())
                .map(|u| arena.try_id(Key::GradVectors(u.kind)))
                .collect(),
            grad_spans: model
                .units
                .iter()
                .map(|u| shards::grad_span(shape, u.kind))
                .collect(),
        }
    }

    /// The ZeRO stage.
    pub fn stage(&self) -> plan::setup::ZeroStage {
        self.rule.zero
    }

    /// Each unit's accumulated gradient (fp32 shard at stages 2-3; 2-byte, full at stages 0-1).
    pub fn grad_shards(&self) -> &[BufId] {
        &self.grad_shards
    }

    /// The element type of the working weights and the gradient accumulators.
    fn elem(&self) -> DType {
        self.half.unwrap_or(DType::F32)
    }

    /// This rank's elements of unit `u`.
    pub fn shard_range(&self, u: usize) -> Range<usize> {
        let s = self.shard_len[u];
        self.rank * s..(self.rank + 1) * s
    }

    /// The weights the optimizer writes: 2-byte `params.<u>` (bf16/fp16 at stages 0-2) or
    /// the stage-3 shards; empty for fp32 below stage 3 (those live in `Model::params`).
    pub fn working_weights(&self) -> &[BufId] {
        if self.rule.params_sharded() {
            &self.param_shards
        } else {
            &self.param_store
        }
    }

    /// Stage 3: each unit's weight shard (empty below stage 3).
    pub fn param_shards(&self) -> &[BufId] {
        &self.param_shards
    }

    /// After `arena.enter(phase)`: starts the gathers born here (the next phase's prefetch
    /// runs while this one computes), finishes those first read here, and repoints the model's
    /// weights; with gradient spans, zeroes the full gradients born here.
    pub fn enter<B: TrainOps>(
        &self,
        phase: Phase,
        pass: Pass,
        model: &mut Model,
        grads: &[BufId],
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let at = phase.ordinal(self.n_layers);
        let runs = |g: &shards::Gather| {
            let backward = g.used_from.ordinal(self.n_layers) > Phase::Head.ordinal(self.n_layers);
            !(backward && pass == Pass::ForwardOnly)
        };
        for (i, slot) in self.gathers.iter().enumerate() {
            if slot.gather.born == phase && runs(&slot.gather) {
                self.start(i, arena, comm)?;
            }
        }
        for (i, slot) in self.gathers.iter().enumerate() {
            let g = &slot.gather;
            if g.used_from == phase && runs(g) {
                self.finish(i, arena, comm)?;
            }
            let (from, to) = (
                g.used_from.ordinal(self.n_layers),
                g.dies.ordinal(self.n_layers),
            );
            if from <= at && at <= to {
                Sharding::point(slot, model);
            }
        }
        if self.rule.grad_spans() && pass == Pass::Training {
            let be = arena.backend();
            for (u, &(first, _)) in self.grad_spans.iter().enumerate() {
                // A direct gradient at stages 0-1 is the accumulator itself.
                if first != phase {
                    continue;
                }
                if !self.is_accumulator() {
                    be.fill(arena, arena.tensor(grads[u], self.grad_type()), 0.0);
                }
                if let Some(v) = self.grad_vectors[u] {
                    be.fill(arena, arena.tensor(v, DType::F32), 0.0);
                }
            }
        }
        Ok(())
    }

    /// The element type of unit `u`'s gradient as the backward writes it.
    fn grad_type(&self) -> DType {
        match self.direct {
            true => self.elem(),
            false => DType::F32,
        }
    }

    /// Whether the backward writes unit `u`'s gradient straight into its accumulator (a direct
    /// 2-byte gradient at stages 0-1).
    fn is_accumulator(&self) -> bool {
        self.direct && !self.rule.grad_acc_sharded()
    }

    /// Before `arena.leave(phase)`: with gradient spans, reduces the full gradients that die
    /// here (all-reduce at stage 0, reduce-scatter above) and adds this rank's part into the
    /// unit's accumulator (rounded once into 2 bytes under bf16/fp16).
    pub fn leave<B: TrainOps>(
        &self,
        phase: Phase,
        grads: &[BufId],
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        for (i, slot) in self.gathers.iter().enumerate() {
            if slot.gather.dies == phase {
                self.abandon(i, comm)?;
            }
        }
        if !self.rule.grad_spans() {
            return Ok(());
        }
        let be = arena.backend();
        for (u, &(_, last)) in self.grad_spans.iter().enumerate() {
            if last != phase {
                continue;
            }
            if let Some(v) = self.grad_vectors[u] {
                // The vectors' fp32 gradients, rounded into the unit's 2-byte gradient.
                let vectors = arena.tensor(v, DType::F32);
                let dst = arena.tensor(grads[u], self.elem());
                for (inside, compact) in &self.vector_views[u] {
                    let (d, v) = (dst.slice(inside.clone()), vectors.slice(compact.clone()));
                    be.accumulate(arena, d, v);
                }
            }
            if self.is_accumulator() {
                continue; // reduced once after the micro-steps (`reduce_grads`)
            }
            let full = arena.tensor(grads[u], self.grad_type());
            match self.rule.optimizer_sharded() {
                false => be.collective(arena, comm, CommOp::AllReduce(full))?,
                true => be.collective(arena, comm, CommOp::ReduceScatterInPlace(full))?,
            }
            let range = match self.rule.optimizer_sharded() {
                false => 0..full.len,
                true => self.shard_range(u),
            };
            let acc = arena.tensor(self.grad_shards[u], self.elem());
            let at = match self.rule.grad_acc_sharded() {
                false => range.start,
                true => 0,
            };
            let mine = full.slice(range.clone());
            if let Some(stats) = self.underflow.borrow_mut().as_mut() {
                stats.merge(&be.underflow(arena, mine));
            }
            be.accumulate(arena, acc.slice(at..at + range.len()), mine);
        }
        Ok(())
    }

    /// After the micro-steps: without gradient spans, stage 0 all-reduces and stage 1
    /// reduce-scatters every full gradient (spans were reduced during the backward); with them,
    /// the same for the 2-byte accumulators written directly (`shards::direct_grads`).
    pub fn reduce_grads<B: TrainOps>(
        &self,
        grads: &[BufId],
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let whole: Vec<(BufId, DType)> = match self.rule.grad_spans() {
            true => (0..grads.len())
                .filter(|_| self.is_accumulator())
                .map(|u| (grads[u], self.elem()))
                .collect(),
            false => grads.iter().map(|&id| (id, DType::F32)).collect(),
        };
        for (id, dtype) in whole {
            let t = arena.tensor(id, dtype);
            let op = match self.rule.optimizer_sharded() {
                false => CommOp::AllReduce(t),
                true => CommOp::ReduceScatterInPlace(t),
            };
            arena.backend().collective(arena, comm, op)?;
        }
        Ok(())
    }

    /// Sets the gradients a step accumulates into to zero.
    pub fn zero_grads<B: TrainOps>(&self, grads: &[BufId], arena: &Arena<B>) {
        let (ids, dtype) = match self.rule.grad_spans() {
            true => (&self.grad_shards[..], self.elem()),
            false => (grads, DType::F32),
        };
        for &id in ids {
            arena.backend().fill(arena, arena.tensor(id, dtype), 0.0);
        }
    }

    /// The elements of each unit this rank's norm sums over: its shard (at stage 0 too, so the
    /// norm is computed alike at every stage).
    pub fn norm_slices<B: TrainOps>(
        &self,
        model: &Model,
        grads: &[BufId],
        arena: &Arena<B>,
        out: &mut Vec<UnitSlice>,
    ) {
        out.clear();
        for u in 0..model.units.len() {
            let mut s = self.update_slice(model, grads, arena, u);
            if !self.rule.optimizer_sharded() {
                let r = self.shard_range(u);
                s.params = s.params.slice(r.clone());
                s.grads = s.grads.slice(r.clone());
                s.base = r.start;
            }
            out.push(s);
        }
    }

    /// What this rank's optimizer updates in unit `u`: everything at stage 0, its shard above.
    pub fn update_slice<B: TrainOps>(
        &self,
        model: &Model,
        grads: &[BufId],
        arena: &Arena<B>,
        u: usize,
    ) -> UnitSlice {
        let r = self.shard_range(u);
        let full = self.shard_len[u] * self.world;
        let (base, len) = match self.rule.optimizer_sharded() {
            false => (0, full),
            true => (r.start, r.len()),
        };
        let elem = self.elem();
        let params = if self.rule.params_sharded() {
            arena.tensor(self.param_shards[u], elem).prefix(len)
        } else if self.half.is_some() {
            arena
                .tensor(self.param_store[u], elem)
                .slice(base..base + len)
        } else {
            arena.tensor(model.params[u], elem).slice(base..base + len)
        };
        let grads = if !self.rule.grad_spans() {
            arena.tensor(grads[u], DType::F32).slice(base..base + len)
        } else if self.rule.grad_acc_sharded() {
            arena.tensor(self.grad_shards[u], elem).prefix(len)
        } else {
            arena
                .tensor(self.grad_shards[u], elem)
                .slice(base..base + len)
        };
        UnitSlice {
            params,
            grads,
            base,
        }
    }

    /// After the update: stages 1-2 all-gather every updated unit in place.
    pub fn after_update<B: TrainOps>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        if !self.rule.gathers_after_update() {
            return Ok(());
        }
        let ids = match self.half {
            Some(_) => &self.param_store[..],
            None => &model.params[..],
        };
        for &id in ids {
            let t = arena.tensor(id, self.elem());
            arena
                .backend()
                .collective(arena, comm, CommOp::AllGatherInPlace(t))?;
        }
        Ok(())
    }
}
