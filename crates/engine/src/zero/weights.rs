//! Whole weights in and out of a sharded trainer: seeded initialisation and the full copy of
//! every unit (for export, comparison and sampling after training).
//!
//! Below stage 3 every rank holds full `params.<u>`, so both are local. At stage 3 a rank holds
//! only its shards: initialisation builds each unit on the host (the same values on every rank:
//! same seed, same stream per unit) and keeps this rank's shard; `full_params` all-gathers every
//! unit into host vectors, a collective every rank must call. Both run outside the step, so
//! their host vectors are not part of the plan (as DeepSpeed's consolidation on save is not).
//!
//! Example: `trainer.init_weights(1337); ...; let units = trainer.full_params()?;`

use super::Half;
use crate::error::EngineError;
use crate::init;
use crate::train::Trainer;
use comm::{Buf, BufMut, Collective};
use plan::setup::ZeroStage;

impl Trainer {
    /// Initialises every weight from `seed` (identical on every rank and at every stage).
    pub fn init_weights(&mut self, seed: u64) {
        if let Some(half) = self.sharding.half {
            self.init_half(seed, half);
            return;
        }
        if self.sharding.stage != ZeroStage::Zero3 {
            init::fill(&self.model, &self.arena, seed);
            return;
        }
        for u in 0..self.model.units.len() {
            let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
            init::fill_unit(&self.model, u, &mut full, seed);
            let id = self.sharding.param_shards()[u];
            let range = self.sharding.shard_range(u);
            self.arena.f32_mut(id).copy_from_slice(&full[range]);
        }
    }

    /// bf16/fp16: the fp32 master weights (this rank's part) from the seeded values, and the
    /// 2-byte working copy rounded from them.
    fn init_half(&mut self, seed: u64, half: Half) {
        let stage = self.sharding.stage;
        for u in 0..self.model.units.len() {
            let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
            init::fill_unit(&self.model, u, &mut full, seed);
            let shard = self.sharding.shard_range(u);
            let master = match stage {
                ZeroStage::Zero0 => &full[..],
                _ => &full[shard.clone()],
            };
            match self.offload.as_mut() {
                Some(store) => store.unit(u).master.copy_from_slice(master),
                None => self
                    .arena
                    .f32_mut(self.masters[u].master)
                    .copy_from_slice(master),
            }
            let (id, working) = match stage {
                ZeroStage::Zero3 => (self.sharding.param_shards()[u], &full[shard]),
                _ => (self.sharding.param_store[u], &full[..]),
            };
            half.narrow(&mut self.arena.bf16_mut(id), working);
        }
    }

    /// Every unit's full (padded) weights, in unit order (bf16/fp16: the fp32 master weights).
    /// Above stage 0 with 2-byte weights, and at stage 3, this is a collective.
    pub fn full_params(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let n_units = self.model.units.len();
        if self.sharding.half.is_some() {
            let mut out = Vec::with_capacity(n_units);
            for u in 0..n_units {
                let in_arena;
                let master: &[f32] = match self.offload.as_mut() {
                    Some(store) => store.unit(u).master,
                    None => {
                        in_arena = self.arena.f32(self.masters[u].master);
                        &in_arena
                    }
                };
                let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
                match self.sharding.stage {
                    ZeroStage::Zero0 => full.copy_from_slice(master),
                    _ => self
                        .comm
                        .all_gather(Buf::F32(master), BufMut::F32(&mut full))?,
                }
                out.push(full);
            }
            return Ok(out);
        }
        if self.sharding.stage != ZeroStage::Zero3 {
            let units = (0..n_units).map(|u| self.arena.f32(self.model.params[u]).to_vec());
            return Ok(units.collect());
        }
        let mut out = Vec::with_capacity(n_units);
        for u in 0..n_units {
            let shard = self.arena.f32(self.sharding.param_shards()[u]);
            let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
            self.comm
                .all_gather(Buf::F32(&shard), BufMut::F32(&mut full))?;
            out.push(full);
        }
        Ok(out)
    }
}
