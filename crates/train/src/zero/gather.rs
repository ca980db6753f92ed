//! Filling the plan's gathers (`plan_frugal::shards::gathers`) and pointing the model at them:
//! a unit widened to fp32, its 2-byte bits all-gathered, or (2-byte units) its vectors widened
//! from the working copy or from the bits just gathered.
//!
//! A fill is two halves: `start` at the gather's birth, which starts its all-gather (the
//! prefetch: under `comm::Overlapped` it runs through the phase before the one that reads it),
//! and `finish` when the phase that first reads it is entered, which waits for the transfer and
//! does the local part (widening in place, the vectors' conversion). A slot left started when
//! its buffer dies is waited for then (`abandon`), so no transfer outlives its bytes.
//!
//! Example: `Sharding::enter` calls `start` for every gather born in the phase, `finish` for
//! every gather first read there, then `point` for every gather the phase reads.

use super::{Comm, Sharding};
use comm::Ticket;
use engine::arena::{Arena, BufId};
use engine::backend::TrainOps;
use engine::backend::{CommOp, DType, Tensor};
use engine::error::EngineError;
use engine::model::Model;
use plan_frugal::shards::{Gather, Holds};
use std::ops::Range;

/// One gather with its buffer and, for vectors widened beside bits, the bits' slot.
pub(super) struct Slot {
    pub gather: Gather,
    pub id: BufId,
    pub from: Option<usize>,
}

/// Each unit's vectors: (range in the unit, range among the vectors laid out one after another).
pub(super) fn vector_views(unit: &plan_frugal::Unit) -> Vec<(Range<usize>, Range<usize>)> {
    let usize_range = |r: Range<u64>| r.start as usize..r.end as usize;
    let layout = unit.vector_layout();
    layout
        .map(|(_, inside, compact)| (usize_range(inside), usize_range(compact)))
        .collect()
}

impl Sharding {
    /// Starts filling `slot` (number `i`) with unit `u`'s weights in the form its gather holds:
    /// the all-gather, if any, is started and its ticket kept until `finish`.
    pub(super) fn start<B: TrainOps>(
        &self,
        i: usize,
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        // A slot refilled before it was read (a pipeline stage's next forward) waits first.
        self.settle(i, comm)?;
        let slot = &self.gathers[i];
        let (u, id) = (slot.gather.unit, slot.id);
        let gather = match slot.gather.holds {
            Holds::Bits => {
                let half = self.half.expect("a bits gather holds 2-byte weights");
                let src = arena.tensor(self.param_shards[u], half);
                Some(CommOp::AllGather {
                    src,
                    dst: arena.tensor(id, half),
                })
            }
            Holds::Widened if self.rule.params_sharded() => {
                // fp32 shards gather into the buffer; 2-byte ones into its first half.
                let elem = self.half.unwrap_or(DType::F32);
                let full = arena.tensor(id, DType::F32);
                let src = arena.tensor(self.param_shards[u], elem);
                let dst = Tensor {
                    dtype: elem,
                    ..full
                };
                Some(CommOp::AllGather { src, dst })
            }
            Holds::Widened | Holds::Vectors(_) => None,
        };
        let ticket = match gather {
            // SAFETY: `id` lives from the gather's birth (now) to past its first reader, where
            // `finish` waits (or to its death, where `settle` does); nothing reads it before
            // `point`, which follows `finish`; the source shard is written only by the update,
            // after every pass; and the trainer drops its communicator before its arena.
            Some(op) => unsafe { arena.backend().start_collective(arena, comm, op)? },
            None => Ticket::DONE,
        };
        self.pending[i].set(Some(ticket));
        Ok(())
    }

    /// Finishes `slot` (number `i`) if it was started: waits for its transfer, then widens.
    pub(super) fn finish<B: TrainOps>(
        &self,
        i: usize,
        arena: &Arena<B>,
        comm: Comm<'_>,
    ) -> Result<(), EngineError> {
        let Some(ticket) = self.pending[i].take() else {
            return Ok(());
        };
        comm.wait(ticket)?;
        let slot = &self.gathers[i];
        let (be, u, id) = (arena.backend(), slot.gather.unit, slot.id);
        match slot.gather.holds {
            Holds::Bits => {}
            Holds::Vectors(_) => {
                let half = self.half.expect("2-byte units widen their vectors");
                let src = match slot.from {
                    Some(j) => {
                        self.settle(j, comm)?;
                        arena.tensor(self.gathers[j].id, half)
                    }
                    None => arena.tensor(self.param_store[u], half),
                };
                let dst = arena.tensor(id, DType::F32);
                for (inside, compact) in &self.vector_views[u] {
                    be.convert(arena, dst.slice(compact.clone()), src.slice(inside.clone()));
                }
            }
            Holds::Widened => match (self.half, self.rule.params_sharded()) {
                (None, _) => {}
                (Some(half), true) => be.widen_in_place(arena, arena.tensor(id, DType::F32), half),
                (Some(half), false) => {
                    let full = arena.tensor(id, DType::F32);
                    let store = arena.tensor(self.param_store[u], half);
                    be.convert(arena, full, store.prefix(full.len));
                }
            },
        }
        Ok(())
    }

    /// Waits for slot `i`'s transfer if one is in flight; its local part stays for `finish`
    /// (a bits slot has none).
    pub(super) fn settle(&self, i: usize, comm: Comm<'_>) -> Result<(), EngineError> {
        if let Some(ticket) = self.pending[i].get() {
            comm.wait(ticket)?;
            let done = !matches!(self.gathers[i].gather.holds, Holds::Bits);
            self.pending[i].set(done.then_some(Ticket::DONE));
        }
        Ok(())
    }

    /// Slot `i`'s buffer dies: a transfer still in flight is waited for and the fill dropped.
    pub(super) fn abandon(&self, i: usize, comm: Comm<'_>) -> Result<(), EngineError> {
        if let Some(ticket) = self.pending[i].take() {
            comm.wait(ticket)?;
        }
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
