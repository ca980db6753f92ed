//! Per-rank shard files (`optim-rank-00001-of-00004.safetensors`): each rank's slice of every
//! unit's fp32 weights and optimizer state, and the reassembly that lets a snapshot from N ranks
//! at any ZeRO stage resume on M ranks at any stage.
//!
//! Under bf16/fp16 the fp32 weights saved are the master weights and the state is AdamW's m and
//! v, read from the device arena or the host offload store (`--offload optimizer`) alike; the
//! 2-byte working copy is not saved: restoring rounds it from the master weights, which is what
//! every optimizer step leaves in it.
//!
//! Every unit is padded to a multiple of the world size N, so rank r's shard is elements
//! `r·S .. (r+1)·S` of the padded unit, S = padded / N — the slice ZeRO-1..3 ranks own. A rank
//! that holds a whole unit (stage 0, or weights below stage 3) writes just that slice, so all
//! stages write the same files. Loading concatenates the N shards of a unit in rank order, drops
//! the old padding, and copies into whatever this trainer holds: the whole unit (padding zeroed)
//! or its own shard of the new padded layout. What a rank holds is read off its buffer's length.
//! Tensors are named as the plan names the buffers (`params.h.0`, `opt.m.h.0`, `opt.v.h.0`,
//! `opt.momentum.h.0`); the unit layout is JSON in the file's metadata under `layout`.
//!
//! Example: `shards::rank_file_name(1, 4)` is `optim-rank-00001-of-00004.safetensors`.

use super::error::SnapshotError;
use crate::Trainer;
use engine::arena::BufId;
use engine::backend::DType;
use engine::backend::TrainOps;
use plan_frugal::shards::optimizer_keys;
use plan_frugal::units::{Unit, UnitKind};
use plan_frugal::Key;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

pub fn rank_file_name(rank: usize, world: usize) -> String {
    format!("optim-rank-{rank:05}-of-{world:05}.safetensors")
}

/// One unit as a shard file records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnitLayout {
    pub name: String,
    pub numel: u64,
    pub padded_numel: u64,
    pub shard_offset: u64,
    pub shard_numel: u64,
}

/// The `layout` metadata of a shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardLayout {
    pub rank: usize,
    pub world: usize,
    /// State tensors per unit besides `params` (`m`, `v` or `momentum`).
    pub states: Vec<String>,
    pub units: Vec<UnitLayout>,
}

/// The plan's buffer names of a unit: `params.<unit>` then its optimizer state (AdamW m, v or
/// SGD momentum), the names the shard files store them under.
pub(super) fn tensor_names<B: TrainOps>(trainer: &Trainer<B>, unit: UnitKind) -> Vec<String> {
    let mut names = vec![Key::Params(unit).to_string()];
    let optimizer = trainer.config.optimizer.plan_optimizer();
    names.extend(optimizer_keys(optimizer, unit).iter().map(Key::to_string));
    names
}

/// The optimizer state's short names (`m`, `v` or `momentum`), as the layout metadata lists them.
pub(super) fn state_names<B: TrainOps>(trainer: &Trainer<B>) -> Vec<String> {
    let optimizer = trainer.config.optimizer.plan_optimizer();
    let keys = optimizer_keys(optimizer, UnitKind::Embed);
    keys.iter()
        .map(|k| {
            let name = k.to_string();
            let name = name.trim_start_matches("opt.").trim_end_matches(".embed");
            name.to_string()
        })
        .collect()
}

/// Where this rank keeps unit `u`'s fp32 weights: the full `params.<u>`, or at ZeRO stage 3 its
/// `params.shard.<u>` (`Model::params` then points at a gather buffer that lives only in a phase);
/// under bf16/fp16 the master weights.
fn param_id<B: TrainOps>(trainer: &Trainer<B>, u: usize) -> BufId {
    if trainer.sharding.half.is_some() {
        return trainer.state.masters[u].master;
    }
    match trainer.sharding.rule.params_sharded() {
        true => trainer.sharding.param_shards()[u],
        false => trainer.model.params[u],
    }
}

/// Arena ids of unit `u`'s weights then optimizer state (`tensor_names`' order); `None` when
/// they live in the offload store.
fn arena_ids<B: TrainOps>(trainer: &Trainer<B>, u: usize) -> Option<Vec<BufId>> {
    if trainer.offload.is_some() {
        return None;
    }
    let mut ids = vec![param_id(trainer, u)];
    match trainer.sharding.half {
        Some(_) => ids.extend([trainer.state.masters[u].m, trainer.state.masters[u].v]),
        None => ids.extend(trainer.state.opt[u].iter().copied()),
    }
    Some(ids)
}

/// Calls `f(k, held)` for each of unit `u`'s tensors (k in `tensor_names`' order).
pub(super) fn for_each_held<B: TrainOps>(
    trainer: &Trainer<B>,
    u: usize,
    mut f: impl FnMut(usize, &[f32]),
) {
    match (arena_ids(trainer, u), trainer.offload.as_ref()) {
        (Some(ids), _) => ids.iter().enumerate().for_each(|(k, &id)| {
            let t = trainer.arena.tensor(id, DType::F32);
            let mut host = vec![0.0f32; t.len];
            trainer
                .arena
                .backend()
                .download(&trainer.arena, t, &mut host);
            f(k, &host)
        }),
        (None, Some(store)) => store
            .unit_view(u)
            .iter()
            .enumerate()
            .for_each(|(k, held)| f(k, held)),
        (None, None) => unreachable!("state lives in the arena or the offload store"),
    }
}

/// Calls `f(held)` on unit `u`'s tensor `k` (in `tensor_names`' order), writable.
pub(super) fn with_held_mut<B: TrainOps>(
    trainer: &mut Trainer<B>,
    u: usize,
    k: usize,
    f: impl FnOnce(&mut [f32]),
) {
    if let Some(ids) = arena_ids(trainer, u) {
        let (arena, be) = (&trainer.arena, trainer.arena.backend());
        let t = arena.tensor(ids[k], DType::F32);
        let mut host = vec![0.0f32; t.len];
        be.download(arena, t, &mut host);
        f(&mut host);
        be.upload(arena, t, &host);
        return;
    }
    let store = trainer
        .offload
        .as_mut()
        .expect("state lives in the arena or the offload store");
    let s = store.unit(u);
    f([s.master, s.m, s.v][k]);
}

/// Which elements of the padded unit a buffer of `len` elements holds on `rank`.
pub(super) fn held_span(len: usize, unit: &Unit, rank: usize, world: usize) -> Range<usize> {
    let padded = unit.padded_numel as usize;
    if len == padded {
        return 0..padded;
    }
    assert_eq!(
        len * world,
        padded,
        "{}: a whole unit or one shard",
        unit.name
    );
    rank * len..(rank + 1) * len
}

/// This rank's shard file: its slice of every unit's weights and optimizer state.
pub fn shard_bytes<B: TrainOps>(trainer: &Trainer<B>) -> Vec<u8> {
    let (rank, world) = (trainer.sharding.rank, trainer.sharding.world);
    let model = &trainer.model;
    let mut tensors: Vec<(String, Vec<u8>)> = Vec::new();
    let mut units = Vec::new();
    for (u, unit) in model.units.iter().enumerate() {
        let shard = unit.padded_numel as usize / world;
        let own = rank * shard..(rank + 1) * shard;
        let names = tensor_names(trainer, unit.kind);
        for_each_held(trainer, u, |k, buf| {
            let held = held_span(buf.len(), unit, rank, world);
            let slice = &buf[own.start - held.start..own.end - held.start];
            let bytes = slice.iter().flat_map(|x| x.to_le_bytes()).collect();
            tensors.push((names[k].clone(), bytes));
        });
        units.push(UnitLayout {
            name: unit.name.clone(),
            numel: unit.numel,
            padded_numel: unit.padded_numel,
            shard_offset: own.start as u64,
            shard_numel: shard as u64,
        });
    }
    let layout = ShardLayout {
        rank,
        world,
        states: state_names(trainer),
        units,
    };
    serialize(&tensors, &layout)
}

/// A shard file of `tensors` (name, little-endian f32 bytes) with `layout` in its metadata.
pub(super) fn serialize(tensors: &[(String, Vec<u8>)], layout: &ShardLayout) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, bytes)| {
            let view =
                TensorView::new(Dtype::F32, vec![bytes.len() / 4], bytes).expect("sizes agree");
            (name.clone(), view)
        })
        .collect();
    let metadata = HashMap::from([(
        "layout".to_string(),
        serde_json::to_string(layout).expect("a layout serialises"),
    )]);
    safetensors::serialize(views, Some(metadata)).expect("in-memory serialisation succeeds")
}

/// What to restore from the shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parts {
    /// Weights and optimizer state: resuming a run (the optimizers must match).
    WeightsAndOptimizer,
    /// Weights only: exporting or evaluating (any optimizer).
    Weights,
}

/// A parsed shard file and its layout.
pub(super) struct Shard<'a> {
    name: &'a str,
    tensors: SafeTensors<'a>,
    layout: ShardLayout,
}

pub(super) fn parse<'a>(
    dir: &Path,
    name: &'a str,
    bytes: &'a [u8],
) -> Result<Shard<'a>, SnapshotError> {
    let bad = |reason: String| SnapshotError::BadContents {
        path: dir.join(name),
        reason,
    };
    let (_, meta) = SafeTensors::read_metadata(bytes)
        .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let layout = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("layout"))
        .ok_or_else(|| bad("no layout in the metadata".into()))?;
    let layout: ShardLayout =
        serde_json::from_str(layout).map_err(|e| bad(format!("bad layout metadata: {e}")))?;
    let tensors =
        SafeTensors::deserialize(bytes).map_err(|e| bad(format!("not safetensors: {e}")))?;
    Ok(Shard {
        name,
        tensors,
        layout,
    })
}

/// Checks the shards against this trainer's units and optimizer before anything is written.
/// `optimizer_states`: how many state tensors per unit this run's optimizer keeps, when the
/// optimizer state is restored too.
pub(super) fn check_layouts(
    dir: &Path,
    shards: &[Shard<'_>],
    units: &[Unit],
    optimizer_states: Option<usize>,
) -> Result<(), SnapshotError> {
    let world = shards.len();
    let expected_states = shards[0].layout.states.clone();
    for (r, s) in shards.iter().enumerate() {
        let bad = |reason: String| SnapshotError::BadContents {
            path: dir.join(s.name),
            reason,
        };
        if s.layout.rank != r || s.layout.world != world {
            return Err(bad(format!(
                "holds rank {} of {}, expected rank {r} of {world}",
                s.layout.rank, s.layout.world
            )));
        }
        if s.layout.states != expected_states {
            return Err(bad("optimizer state differs from rank 0's".into()));
        }
        let same = s.layout.units.len() == units.len()
            && s.layout.units.iter().zip(units).all(|(a, b)| {
                a.name == b.name
                    && a.numel == b.numel
                    && a.shard_numel * world as u64 == a.padded_numel
            });
        if !same {
            return Err(bad("its parameter units differ from this model's".into()));
        }
    }
    let Some(ours) = optimizer_states else {
        return Ok(());
    };
    if expected_states.len() != ours {
        return Err(SnapshotError::BadContents {
            path: dir.join(shards[0].name),
            reason: format!(
                "holds optimizer state {expected_states:?}, this run's optimizer keeps {ours} buffers per unit"
            ),
        });
    }
    Ok(())
}

pub(super) fn to_f32(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The whole (unpadded) tensor `name` of unit `u`: the shards' slices in rank order.
pub(super) fn assemble(
    dir: &Path,
    shards: &[Shard<'_>],
    u: usize,
    name: &str,
) -> Result<Vec<f32>, SnapshotError> {
    let numel = shards[0].layout.units[u].numel as usize;
    let mut full = Vec::with_capacity(shards[0].layout.units[u].padded_numel as usize);
    for s in shards {
        let bad = |reason: String| SnapshotError::BadContents {
            path: dir.join(s.name),
            reason,
        };
        let t = s
            .tensors
            .tensor(name)
            .map_err(|_| bad(format!("missing tensor {name}")))?;
        let want = s.layout.units[u].shard_numel as usize;
        if t.dtype() != Dtype::F32 || t.shape() != [want] {
            return Err(bad(format!("{name} is not {want} f32 values")));
        }
        full.extend(to_f32(t.data()));
    }
    full.truncate(numel);
    Ok(full)
}

/// Every unit's whole weights (unpadded) from the shard files (`(name, bytes)` in rank order),
/// checked against `units` first.
pub fn weights(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    units: &[Unit],
) -> Result<Vec<Vec<f32>>, SnapshotError> {
    let shards = files
        .iter()
        .map(|(name, bytes)| parse(dir, name, bytes))
        .collect::<Result<Vec<_>, _>>()?;
    check_layouts(dir, &shards, units, None)?;
    (0..units.len())
        .map(|u| assemble(dir, &shards, u, &Key::Params(units[u].kind).to_string()))
        .collect()
}

/// Fills this trainer's weights and optimizer state from the shard files (`(name, bytes)` in
/// rank order), whatever world and stage they were written on.
pub fn restore<B: TrainOps>(
    trainer: &mut Trainer<B>,
    dir: &Path,
    files: &[(String, Vec<u8>)],
    parts: Parts,
) -> Result<(), SnapshotError> {
    let shards = files
        .iter()
        .map(|(name, bytes)| parse(dir, name, bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let states = (parts == Parts::WeightsAndOptimizer).then(|| state_names(trainer).len());
    if trainer.model.share.is_some() {
        return super::whole::restore(trainer, dir, &shards, parts, states);
    }
    check_layouts(dir, &shards, &trainer.model.units, states)?;
    let (rank, world) = (trainer.sharding.rank, trainer.sharding.world);
    // Everything is read and checked before the first write, so a bad file changes nothing.
    let mut staged = Vec::new();
    for (u, unit) in trainer.model.units.iter().enumerate() {
        let names = tensor_names(trainer, unit.kind);
        let n_tensors = match parts {
            Parts::WeightsAndOptimizer => names.len(),
            Parts::Weights => 1,
        };
        for (k, name) in names.iter().enumerate().take(n_tensors) {
            staged.push((u, k, assemble(dir, &shards, u, name)?));
        }
    }
    for (u, k, full) in staged {
        let unit = trainer.model.units[u].clone();
        with_held_mut(trainer, u, k, |buf| {
            let held = held_span(buf.len(), &unit, rank, world);
            for (i, slot) in held.zip(buf.iter_mut()) {
                // Padding (past the unit's numel) is zero, as a fresh arena's is.
                *slot = full.get(i).copied().unwrap_or(0.0);
            }
        });
        if k == 0 {
            round_working_copy(trainer, u, &full);
        }
    }
    Ok(())
}

/// bf16/fp16: unit `u`'s 2-byte working copy (whole below stage 3, this rank's shard at stage 3)
/// := its restored master weights `full` (unpadded) rounded, as each optimizer step leaves it.
pub(super) fn round_working_copy<B: TrainOps>(trainer: &Trainer<B>, u: usize, full: &[f32]) {
    let Some(half) = trainer.sharding.half else {
        return;
    };
    let unit = &trainer.model.units[u];
    let (rank, world) = (trainer.sharding.rank, trainer.sharding.world);
    let mut padded = full.to_vec();
    padded.resize(unit.padded_numel as usize, 0.0);
    let id = trainer.sharding.working_weights()[u];
    let working = trainer.arena.tensor(id, half);
    let held = held_span(working.len, unit, rank, world);
    trainer
        .arena
        .backend()
        .upload(&trainer.arena, working, &padded[held]);
}
