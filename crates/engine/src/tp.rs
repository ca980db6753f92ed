//! Tensor parallelism inside the model (Megatron-LM): one rank's link to the others of its
//! tensor-parallel group (the whole model its share is cut from is `share::Share`).
//!
//! The model a tensor-parallel rank builds is its share (`plan_frugal::tp::rank_shape`: its
//! heads, its slice of the MLP and of the vocabulary), so the forward and backward run the
//! single-rank ops on it; the few places where the ranks' partial results meet call this
//! module: the embedding and each row-parallel projection all-reduce their output (forward),
//! each column-parallel projection all-reduces its input gradient (backward), the classifier
//! reduces its per-row statistics and then its input gradient, and forward-only logits are
//! gathered whole on the host. Biases of row-parallel projections and learned positions are
//! added by rank 0 alone before the sum.
//!
//! The ops run inside a phase and return nothing, so a failed collective is kept
//! ([`TensorParallel::check`] returns it after the pass) and the collectives after it are
//! skipped: every rank's step then fails with the communicator's error, none waits forever.
//!
//! Example: `if let Some(tp) = &model.tp { tp.all_reduce(arena, out) }` after a row-parallel
//! GEMM.

use crate::arena::Arena;
use crate::backend::{Backend, CommOp, Tensor};
use crate::error::EngineError;
use crate::share::Share;
use comm::{Buf, BufMut, Collective, CommError, ReduceOp};
use plan_frugal::tp;
use plan_frugal::units::Unit;
use std::cell::RefCell;

/// One rank of a tensor-parallel group.
pub struct TensorParallel {
    pub rank: u32,
    pub size: u32,
    /// The vocabulary rows `(first id, rows)` this rank's embedding and classifier hold.
    pub vocab: (u64, u64),
    comm: Group,
    failed: RefCell<Option<CommError>>,
    /// Fewer key/value heads than ranks: the ranks sharing this rank's head, and
    /// `work.tp_kv` (the head's gradient set aside while a micro-step's is summed).
    kv: Option<(Group, Tensor)>,
}

/// A communicator shared by `&self` methods (the ops of a pass take the model by reference).
type Group = RefCell<comm::Counted<Box<dyn Collective>>>;

impl TensorParallel {
    /// Rank `comm.rank()` of a group of `comm.world_size()` over a model of `vocab` ids.
    pub fn new(vocab: u64, comm: Box<dyn Collective>) -> TensorParallel {
        let (rank, size) = (comm.rank() as u32, comm.world_size() as u32);
        TensorParallel {
            rank,
            size,
            vocab: tp::vocab_range(vocab, size, rank),
            comm: RefCell::new(comm::Counted::new(comm)),
            failed: RefCell::new(None),
            kv: None,
        }
    }

    /// Makes this rank's key/value head one it shares with the ranks of `group`.
    pub fn share_kv(&mut self, group: Box<dyn Collective>, scratch: Tensor) {
        self.kv = Some((RefCell::new(comm::Counted::new(group)), scratch));
    }

    /// Around a block's q|k|v weight gradient (`rows`: its key and value rows, then those of
    /// its bias): `before` sets the accumulated rows aside and zeroes them, so the backward
    /// writes one micro-step's part; `after` sums that part over the ranks sharing the head and
    /// adds the rest back. Nothing when the heads split over the ranks.
    pub fn kv_before<B: Backend>(&self, arena: &Arena<B>, rows: [Option<Tensor>; 2]) {
        let Some((_, scratch)) = &self.kv else { return };
        let be = arena.backend();
        let mut at = 0;
        for t in rows.into_iter().flatten() {
            be.convert(arena, scratch.slice(at..at + t.len), t);
            be.fill(arena, t, 0.0);
            at += t.len;
        }
    }

    pub fn kv_after<B: crate::backend::TrainOps>(
        &self,
        arena: &Arena<B>,
        rows: [Option<Tensor>; 2],
    ) {
        let Some((group, scratch)) = &self.kv else {
            return;
        };
        let be = arena.backend();
        let mut at = 0;
        for t in rows.into_iter().flatten() {
            if self.failed.borrow().is_none() {
                let op = CommOp::AllReduce(t);
                if let Err(e) = be.collective(arena, &mut *group.borrow_mut(), op) {
                    *self.failed.borrow_mut() = Some(e);
                }
            }
            // The rows set aside, added back (rounded once into a 2-byte gradient).
            be.accumulate(arena, t, scratch.slice(at..at + t.len));
            at += t.len;
        }
    }

    /// Whether this rank's key/value head is shared and another rank of its group counts it in
    /// the global norm.
    pub fn kv_counted_elsewhere(&self) -> bool {
        self.kv
            .as_ref()
            .is_some_and(|(g, _)| g.borrow().rank() != 0)
    }

    fn run(&self, f: impl FnOnce(&mut dyn Collective) -> Result<(), CommError>) {
        if self.failed.borrow().is_some() {
            return;
        }
        if let Err(e) = f(&mut *self.comm.borrow_mut()) {
            *self.failed.borrow_mut() = Some(e);
        }
    }

    /// Sums `t` over the group, in rank order, in place.
    pub fn all_reduce<B: Backend>(&self, arena: &Arena<B>, t: Tensor) {
        self.run(|c| arena.backend().collective(arena, c, CommOp::AllReduce(t)));
    }

    /// Any collective over arena tensors of this group.
    pub fn collective<B: Backend>(&self, arena: &Arena<B>, op: CommOp) {
        self.run(|c| arena.backend().collective(arena, c, op));
    }

    /// Reduces a host slice over the group in place.
    pub fn reduce_host(&self, buf: &mut [f32], op: ReduceOp) {
        self.run(|c| c.all_reduce(BufMut::F32(buf), op));
    }

    /// Every rank's `mine` (equal lengths), in rank order, into `all`.
    pub fn gather_host(&self, mine: &[f32], all: &mut [f32]) {
        self.run(|c| c.all_gather(Buf::F32(mine), BufMut::F32(all)));
    }

    /// The first collective failure since the last check, if any (the pass is then void).
    pub fn check(&self) -> Result<(), EngineError> {
        match self.failed.borrow_mut().take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Every rank's share of each unit (`mine`, this rank's, in the order of `units`) put
    /// together into the whole model's units (`share.whole_units` of the same kinds, in the
    /// same order): a collective over the group.
    pub fn gather_units(
        &self,
        share: &Share,
        units: &[Unit],
        mine: &[Vec<f32>],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let shares = share.tp_units()?;
        let mut out = Vec::with_capacity(units.len());
        for (u, unit) in units.iter().enumerate() {
            // Shares differ in length (the vocabulary slices): gather them padded to the longest.
            let width = shares.iter().map(|s| s[u].numel).max().unwrap_or(0) as usize;
            let mut padded = mine[u][..unit.numel as usize].to_vec();
            padded.resize(width, 0.0);
            let mut all = vec![0.0f32; width * self.size as usize];
            self.gather_host(&padded, &mut all);
            self.check()?;
            let whole = &share.whole_units[share.whole_index(unit.kind)];
            let mut values = vec![0.0f32; whole.padded_numel as usize];
            for (r, theirs) in shares.iter().enumerate() {
                let part = &all[r * width..][..theirs[u].numel as usize];
                share.put_unit(&theirs[u], r as u32, part, &mut values);
            }
            out.push(values);
        }
        Ok(out)
    }
}
