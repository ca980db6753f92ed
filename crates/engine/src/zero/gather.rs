//! Filling the plan's gathers (`plan::frugal::shards::gathers`) and pointing the model at them:
//! a unit widened to fp32, its 2-byte bits all-gathered, or (2-byte units) its vectors widened
//! from the working copy or from the bits just gathered.
//!
//! Example: `Sharding::enter` calls `fill` for every gather born in the phase, then `point` for
//! every gather the phase reads.

use super::{Comm, Sharding};
use crate::arena::{Arena, BufId};
use crate::backend::{Backend, CommOp, DType, Tensor};
use crate::error::EngineError;
use crate::model::Model;
use plan::frugal::shards::{Gather, Holds};
use std::ops::Range;

/// One gather with its buffer and, for vectors widened beside bits, the bits' buffer.
pub(super) struct Slot {
    pub gather: Gather,
    pub id: BufId,
    pub from: Option<BufId>,
}

/// Each unit's vectors: (range in the unit, range among the vectors laid out one after another).
pub(super) fn vector_views(unit: &plan::frugal::Unit) -> Vec<(Range<usize>, Range<usize>)> {
    let usize_range = |r: Range<u64>| r.start as usize..r.end as usize;
    let layout = unit.vector_layout();
    layout
        .map(|(_, inside, compact)| (usize_range(inside), usize_range(compact)))
        .collect()
}

impl Sharding {
    /// Fills `slot` with unit `u`'s weights in the form its gather holds.
    pub(super) fn fill<B: Backend>(
        &self,
        slot: &Slot,
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let (be, u, id) = (arena.backend(), slot.gather.unit, slot.id);
        match slot.gather.holds {
            Holds::Bits => {
                let half = self.half.expect("a bits gather holds 2-byte weights");
                let src = arena.tensor(self.param_shards[u], half);
                let dst = arena.tensor(id, half);
                be.collective(arena, comm, CommOp::AllGather { src, dst })?;
            }
            Holds::Vectors(_) => {
                let half = self.half.expect("2-byte units widen their vectors");
                let src = match slot.from {
                    Some(bits) => arena.tensor(bits, half),
                    None => arena.tensor(self.param_store[u], half),
                };
                let dst = arena.tensor(id, DType::F32);
                for (inside, compact) in &self.vector_views[u] {
                    be.convert(arena, dst.slice(compact.clone()), src.slice(inside.clone()));
                }
            }
            Holds::Widened => self.fill_widened(u, id, arena, comm)?,
        }
        Ok(())
    }

    /// Gather buffer `id` with unit `u`'s full fp32 weights.
    fn fill_widened<B: Backend>(
        &self,
        u: usize,
        id: BufId,
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let be = arena.backend();
        let full = arena.tensor(id, DType::F32);
        let Some(half) = self.half else {
            let src = arena.tensor(self.param_shards[u], DType::F32);
            be.collective(arena, comm, CommOp::AllGather { src, dst: full })?;
            return Ok(());
        };
        if !self.rule.params_sharded() {
            let store = arena.tensor(self.param_store[u], half);
            be.convert(arena, full, store.prefix(full.len));
            return Ok(());
        }
        // The 2-byte shards gather into the buffer's first half, then widen in place.
        let src = arena.tensor(self.param_shards[u], half);
        let bits = Tensor {
            dtype: half,
            ..full
        };
        be.collective(arena, comm, CommOp::AllGather { src, dst: bits })?;
        be.widen_in_place(arena, full, half);
        Ok(())
    }

    /// Points the model at `slot` for the phases that read it.
    pub(super) fn point(slot: &Slot, model: &mut Model) {
        let u = slot.gather.unit;
        match slot.gather.holds {
            Holds::Widened | Holds::Bits => model.params[u] = slot.id,
            Holds::Vectors(_) => model.vectors[u] = Some(slot.id),
        }
    }
}
