//! Whole weights in and out of a sharded trainer: seeded initialisation and the full copy of
//! every unit (for export, comparison and sampling after training).
//!
//! Each unit is built on the host from the seed (the same values on every rank: same seed, same
//! stream per unit) and uploaded where this rank keeps it: whole below stage 3, its shard at
//! stage 3; under bf16/fp16 the fp32 master weights (whole at stage 0, the shard above, in the
//! arena or the offload store) and the 2-byte working copy rounded from them. `full_params`
//! downloads every unit, all-gathering the shards where a rank holds only its own (a collective
//! every rank must call). Both run outside the step, so their host vectors are not part of the
//! plan (as DeepSpeed's consolidation on save is not).
//!
//! Example: `trainer.init_weights(1337); ...; let units = trainer.full_params()?;`

use crate::Trainer;
use comm::{Buf, BufMut, Collective};
use engine::backend::DType;
use engine::backend::TrainOps;
use engine::error::EngineError;
use engine::init;
use plan_frugal::units::Unit;

impl<B: TrainOps> Trainer<B> {
    /// Initialises every weight from `seed` (identical on every rank and at every stage).
    /// Under LoRA the adapters start as PEFT's and the frozen base from `seed` as a full model
    /// would, packed in its format (`lora::base::init_random`).
    /// Tensor parallelism: each rank takes its share of the whole model's values.
    pub fn init_weights(&mut self, seed: u64) {
        for u in 0..self.model.units.len() {
            let mut full = vec![0.0f32; self.model.units[u].padded_numel as usize];
            match &self.model.share {
                Some(share) => {
                    // The whole model's unit, from its own stream, cut to this rank's share.
                    let w = share.whole_index(self.model.units[u].kind);
                    let whole = &share.whole_units[w];
                    let mut values = vec![0.0f32; whole.padded_numel as usize];
                    let n_layers = share.whole.shape.n_layers;
                    init::fill(whole, w, n_layers, &mut values, seed);
                    share.take_unit(&self.model.units[u], &values, &mut full);
                }
                None => init::fill_unit(&self.model, u, &mut full, seed),
            }
            self.upload_unit(u, &full);
        }
        if self.model.lora.is_some() {
            engine::lora::base::init_random(&self.model, &self.arena, seed);
        }
    }

    /// Loads saved weights into this rank, wherever it keeps them: whole or as its ZeRO-3
    /// shard, as fp32 or as bf16/fp16 masters with the working copy rounded from them, and
    /// under tensor or pipeline parallelism its share of the whole model's units. `read` gets
    /// the whole model's unit layout and returns every unit's values (an HF folder's or a GGUF
    /// file's), each tensor checked before any weight changes.
    pub fn load_whole(
        &mut self,
        read: impl FnOnce(&[Unit]) -> Result<Vec<Vec<f32>>, EngineError>,
    ) -> Result<(), EngineError> {
        let mut values: Vec<Vec<f32>> = match &self.model.share {
            Some(share) => {
                let whole = read(&share.whole_units)?;
                (self.model.units.iter())
                    .map(|unit| {
                        let w = share.whole_index(unit.kind);
                        let mut padded = whole[w].clone();
                        padded.resize(share.whole_units[w].padded_numel as usize, 0.0);
                        let mut mine = vec![0.0f32; unit.padded_numel as usize];
                        share.take_unit(unit, &padded, &mut mine);
                        mine
                    })
                    .collect()
            }
            None => read(&self.model.units)?,
        };
        for (u, v) in values.iter_mut().enumerate() {
            v.resize(self.model.units[u].padded_numel as usize, 0.0);
            self.upload_unit(u, v);
        }
        Ok(())
    }

    /// Writes unit `u`'s whole (padded) fp32 weights `full` where this rank keeps them.
    pub(crate) fn upload_unit(&mut self, u: usize, full: &[f32]) {
        let rule = self.sharding.rule;
        let shard = self.sharding.shard_range(u);
        let be = self.arena.backend();
        let Some(half) = self.sharding.half else {
            let (id, values) = match rule.params_sharded() {
                true => (self.sharding.param_shards()[u], &full[shard]),
                false => (self.model.params[u], full),
            };
            be.upload(&self.arena, self.arena.tensor(id, DType::F32), values);
            return;
        };
        let master = match rule.optimizer_sharded() {
            false => full,
            true => &full[shard.clone()],
        };
        match self.offload.as_mut() {
            Some(store) => store.unit(u).master.copy_from_slice(master),
            None => {
                let t = self.arena.tensor(self.state.masters[u].master, DType::F32);
                be.upload(&self.arena, t, master);
            }
        }
        let working = match rule.params_sharded() {
            true => &full[shard],
            false => full,
        };
        let id = self.sharding.working_weights()[u];
        be.upload(&self.arena, self.arena.tensor(id, half), working);
    }

    /// Every unit's full (padded) weights, in unit order (bf16/fp16: the fp32 master weights).
    /// Above stage 0 with 2-byte weights, and at stage 3, this is a collective.
    pub fn full_params(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let n_units = self.model.units.len();
        let mut out = Vec::with_capacity(n_units);
        for u in 0..n_units {
            let padded = self.model.units[u].padded_numel as usize;
            let (mine, sharded) = self.held_weights(u);
            let mut full = vec![0.0f32; padded];
            match sharded {
                false => full.copy_from_slice(&mine),
                true => self
                    .comm
                    .all_gather(Buf::F32(&mine), BufMut::F32(&mut full))?,
            }
            out.push(full);
        }
        Ok(out)
    }

    /// The whole model's weights in its units (`Share::whole_units`), put together from every
    /// tensor-parallel rank's share and every pipeline stage's units:
    /// [`Trainer::full_params`] without either. A collective.
    pub fn whole_params(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let mine = self.full_params()?;
        let Some(share) = &self.model.share else {
            return Ok(mine);
        };
        let stage_units = match &self.model.tp {
            Some(tp) => tp.gather_units(share, &self.model.units, &mine)?,
            None => mine,
        };
        match &self.model.pp {
            Some(pp) => pp.gather_units(share, &self.model.units, stage_units),
            None => Ok(stage_units),
        }
    }

    /// This rank's fp32 weights of unit `u` (the master weights under bf16/fp16), and whether
    /// they are only its shard.
    fn held_weights(&self, u: usize) -> (Vec<f32>, bool) {
        let rule = self.sharding.rule;
        let be = self.arena.backend();
        let download = |id| {
            let t = self.arena.tensor(id, DType::F32);
            let mut v = vec![0.0f32; t.len];
            be.download(&self.arena, t, &mut v);
            v
        };
        if self.sharding.half.is_some() {
            let master = match self.offload.as_ref() {
                Some(store) => store.unit_view(u)[0].to_vec(),
                None => download(self.state.masters[u].master),
            };
            return (master, rule.optimizer_sharded());
        }
        match rule.params_sharded() {
            true => (download(self.sharding.param_shards()[u]), true),
            false => (download(self.model.params[u]), false),
        }
    }
}
