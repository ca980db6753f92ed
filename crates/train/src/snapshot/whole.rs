//! Snapshots of tensor- and pipeline-parallel runs: their weights and optimizer state are put
//! together into the whole model's units (every tensor-parallel rank's share, every stage's
//! units, each data-parallel shard) and written by rank 0 as one shard file of a world of one
//! (`optim-rank-00000-of-00001.safetensors`), with the whole model's names. Such a snapshot
//! resumes on any world: tensor-parallel degree, stages, data-parallel ranks and ZeRO stage; and a
//! snapshot of any world resumes a parallel run, whose ranks cut their share out of the whole
//! units the shards reassemble (`share::Share::take_unit`).
//!
//! Example: `whole::tensors(trainer)?` on every rank, then `whole::shard_bytes(trainer, &t)` on
//! rank 0.

use super::error::SnapshotError;
use super::shards::{self, Parts, Shard, ShardLayout, UnitLayout};
use crate::Trainer;
use comm::{Buf, BufMut, Collective};
use engine::backend::TrainOps;
use std::path::Path;

/// Every tensor (`params`, then the optimizer state) of every unit of the whole model, padded
/// as a world of one pads it: `out[k][w]`. A collective every rank calls.
pub fn tensors<B: TrainOps>(trainer: &mut Trainer<B>) -> Result<Vec<Vec<Vec<f32>>>, SnapshotError> {
    let n_units = trainer.model.units.len();
    let n_tensors = shards::tensor_names(trainer, plan_frugal::UnitKind::Embed).len();
    let mut out = Vec::with_capacity(n_tensors);
    for k in 0..n_tensors {
        // This rank's units whole: its data-parallel shards gathered.
        let mut local = Vec::with_capacity(n_units);
        for u in 0..n_units {
            let padded = trainer.model.units[u].padded_numel as usize;
            let mut held = Vec::new();
            shards::for_each_held(trainer, u, |i, buf| {
                if i == k {
                    held = buf.to_vec();
                }
            });
            let mut full = vec![0.0f32; padded];
            match held.len() == padded {
                true => full.copy_from_slice(&held),
                false => (trainer.comm)
                    .all_gather(Buf::F32(&held), BufMut::F32(&mut full))
                    .map_err(engine::EngineError::from)?,
            }
            local.push(full);
        }
        let share = trainer
            .model
            .share
            .as_ref()
            .expect("a tensor- or pipeline-parallel run");
        let stage = match &trainer.model.tp {
            Some(tp) => tp.gather_units(share, &trainer.model.units, &local)?,
            None => local,
        };
        out.push(match &trainer.model.pp {
            Some(pp) => pp.gather_units(share, &trainer.model.units, stage)?,
            None => stage,
        });
    }
    Ok(out)
}

/// The shard file of a world of one holding the whole model's `tensors` (from [`tensors`]).
pub fn shard_bytes<B: TrainOps>(trainer: &Trainer<B>, tensors: &[Vec<Vec<f32>>]) -> Vec<u8> {
    let share = trainer
        .model
        .share
        .as_ref()
        .expect("a tensor- or pipeline-parallel run");
    let mut files = Vec::new();
    let mut units = Vec::new();
    for (w, unit) in share.whole_units.iter().enumerate() {
        for (k, name) in shards::tensor_names(trainer, unit.kind)
            .into_iter()
            .enumerate()
        {
            let bytes = tensors[k][w].iter().flat_map(|x| x.to_le_bytes()).collect();
            files.push((name, bytes));
        }
        units.push(UnitLayout {
            name: unit.name.clone(),
            numel: unit.numel,
            padded_numel: unit.padded_numel,
            shard_offset: 0,
            shard_numel: unit.padded_numel,
        });
    }
    let layout = ShardLayout {
        rank: 0,
        world: 1,
        states: shards::state_names(trainer),
        units,
    };
    shards::serialize(&files, &layout)
}

/// Fills a tensor- or pipeline-parallel trainer from shard files of any world: each whole unit
/// reassembled, this rank's share of it cut out, then what this rank holds of that share.
pub(super) fn restore<B: TrainOps>(
    trainer: &mut Trainer<B>,
    dir: &Path,
    files: &[Shard<'_>],
    parts: Parts,
    states: Option<usize>,
) -> Result<(), SnapshotError> {
    let share = trainer
        .model
        .share
        .take()
        .expect("a tensor- or pipeline-parallel run");
    let result = restore_with(trainer, &share, dir, files, parts, states);
    trainer.model.share = Some(share);
    result
}

fn restore_with<B: TrainOps>(
    trainer: &mut Trainer<B>,
    share: &engine::share::Share,
    dir: &Path,
    files: &[Shard<'_>],
    parts: Parts,
    states: Option<usize>,
) -> Result<(), SnapshotError> {
    shards::check_layouts(dir, files, &share.whole_units, states)?;
    let (rank, world) = (trainer.sharding.rank, trainer.sharding.world);
    // Everything is read and checked before the first write, so a bad file changes nothing.
    let mut staged = Vec::new();
    for (u, unit) in trainer.model.units.iter().enumerate() {
        let w = share.whole_index(unit.kind);
        let names = shards::tensor_names(trainer, share.whole_units[w].kind);
        let n_tensors = match parts {
            Parts::WeightsAndOptimizer => names.len(),
            Parts::Weights => 1,
        };
        for (k, name) in names.iter().enumerate().take(n_tensors) {
            let mut whole = shards::assemble(dir, files, w, name)?;
            whole.resize(share.whole_units[w].padded_numel as usize, 0.0);
            let mut mine = vec![0.0f32; unit.padded_numel as usize];
            share.take_unit(unit, &whole, &mut mine);
            staged.push((u, k, mine));
        }
    }
    for (u, k, mine) in staged {
        let unit = trainer.model.units[u].clone();
        shards::with_held_mut(trainer, u, k, |buf| {
            let held = shards::held_span(buf.len(), &unit, rank, world);
            buf.copy_from_slice(&mine[held]);
        });
        if k == 0 {
            shards::round_working_copy(trainer, u, &mine[..unit.numel as usize]);
        }
    }
    Ok(())
}
