//! Snapshots on disk: save a run every N steps, resume it exactly, on the same or another number
//! of ranks and ZeRO stage. (The word "checkpoint" is kept for snapshots elsewhere in frugal too;
//! activation checkpointing is called "recompute".)
//!
//! A snapshot is the folder `OUT/step-000123/` holding
//! - `model.safetensors` + `config.json`: the full model with Hugging Face names (`io`), loadable
//!   by transformers as it is;
//! - `optim-rank-0000r-of-0000N.safetensors`: rank r's slice of every unit's fp32 weights and
//!   optimizer state (AdamW m, v or SGD momentum), with the unit layout in its metadata
//!   ([`shards`]);
//! - `train.json`: step, schedule position, data-loader position, seed, loss scaler, model,
//!   setup and world ([`state`]);
//! - `manifest.json`: every file's name, size and crc32, and the format version. It is written
//!   last and renamed into place: its presence commits the snapshot ([`files`]).
//!
//! Every rank calls [`save`] after the same step; rank 0 does the folder work, the ranks meet at
//! barriers so the manifest is written only after every shard is on disk. A crash at any point
//! leaves the previous snapshots whole; the next save deletes the partial folder. Only the newest
//! `keep` committed snapshots stay. [`Snapshot::open`] checks the manifest's version and every
//! file's size and checksum before anything is used; [`Snapshot::restore`] fills a trainer built
//! for any world.
//!
//! What it does not do: decide when to save (the training loop does) or read flags.
//!
//! Example:
//! ```no_run
//! # fn demo(trainer: &mut train::Trainer, next: &mut train::Trainer, seed: u64)
//! #     -> Result<(), train::snapshot::SnapshotError> {
//! use train::snapshot::{self, RunState, SaveOptions, Snapshot};
//! use std::path::Path;
//! let run = RunState { loader: data::LoaderPosition::default(), seed, data: None };
//! snapshot::save(trainer, Path::new("runs/a"), &run, &SaveOptions::default())?;
//! let snap = Snapshot::open(Path::new("runs/a"))?; // the newest committed snapshot
//! snap.check_compatible(&next.config, seed)?;
//! let run = snap.restore(next)?; // weights, optimizer state, step; seek the loader to run.loader
//! # Ok(()) }
//! ```

pub mod error;
pub mod files;
pub mod finished;
pub mod shards;
pub mod state;
pub mod whole;

pub use error::{Difference, SnapshotError};
pub use files::{FileEntry, Manifest, FORMAT_VERSION};
pub use state::{LossScalerState, RunState, TrainState};

use crate::precision::LossScaler;
use crate::{TrainConfig, Trainer};
use engine::backend::TrainOps;
use plan::setup::ZeroStage;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use engine::io::{CONFIG_FILE, WEIGHTS_FILE};
pub const STATE_FILE: &str = "train.json";

/// How saving behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct SaveOptions {
    /// Committed snapshots to keep (at least 1: the one just written).
    pub keep: usize,
    /// Wait this long after every file is written and before the manifest commits the snapshot:
    /// a test hook, so a test can kill the process in the middle of a save.
    pub pause_before_commit: Option<Duration>,
}

impl Default for SaveOptions {
    fn default() -> SaveOptions {
        SaveOptions {
            keep: 3,
            pause_before_commit: None,
        }
    }
}

/// Saves `trainer`'s state after its last step into `out/step-NNNNNN/`; every rank calls it.
/// Returns the committed snapshot's folder.
pub fn save<B: TrainOps>(
    trainer: &mut Trainer<B>,
    out: &Path,
    run: &RunState,
    options: &SaveOptions,
) -> Result<PathBuf, SnapshotError> {
    let (rank, world) = (trainer.rank(), trainer.config.ranks as usize);
    let dir = out.join(files::step_dir_name(trainer.step));
    if rank == 0 {
        std::fs::create_dir_all(out)
            .map_err(SnapshotError::io(format!("creating {}", out.display())))?;
        files::clean_partial(out)?;
        files::fresh_dir(out, &dir)?;
    }
    trainer.barrier()?;
    if trainer.model.share.is_some() {
        return save_whole(trainer, out, &dir, run, options);
    }
    let shard_name = shards::rank_file_name(rank, world);
    let own = files::write_file(&dir, &shard_name, &shards::shard_bytes(trainer))?;
    trainer.barrier()?;
    // Stage 3 keeps only shards of the weights, and stages 1-2 under bf16/fp16 only shards of
    // the master weights: gathering them is a collective every rank joins.
    let stage = trainer.sharding.stage();
    let sharded_master = trainer.sharding.half.is_some() && stage != ZeroStage::Zero0;
    let gathered = match (stage, rank) {
        (ZeroStage::Zero3, _) | (_, 0) => Some(trainer.full_params()?),
        _ if sharded_master => Some(trainer.full_params()?),
        _ => None,
    };
    if let Some(units) = gathered.filter(|_| rank == 0) {
        let mut entries = write_rank0_files(trainer, &units, &dir, run)?;
        for r in 0..world {
            entries.push(match r {
                0 => own.clone(),
                _ => files::entry_of(&dir, &shards::rank_file_name(r, world))?,
            });
        }
        commit(out, &dir, trainer.step, entries, options)?;
    }
    // No rank returns before the snapshot is committed (or rank 0's failure reaches it).
    trainer.barrier()?;
    Ok(dir)
}

/// [`save`] of a tensor- or pipeline-parallel run: the whole model's weights and optimizer state
/// put together from every rank (a collective), written by rank 0 as one shard file of a world
/// of one ([`whole`]).
fn save_whole<B: TrainOps>(
    trainer: &mut Trainer<B>,
    out: &Path,
    dir: &Path,
    run: &RunState,
    options: &SaveOptions,
) -> Result<PathBuf, SnapshotError> {
    let tensors = whole::tensors(trainer)?;
    if trainer.rank() == 0 {
        let share = trainer.model.share.as_ref().expect("a parallel run");
        let slices: Vec<&[f32]> = tensors[0].iter().map(Vec::as_slice).collect();
        let hf = engine::io::export_views(&share.whole_units, &slices);
        let weights = engine::io::tensors_to_safetensors(hf);
        let state = TrainState::of(trainer, run);
        let state_json = serde_json::to_string_pretty(&state).expect("train state serialises");
        let name = shards::rank_file_name(0, 1);
        let entries = vec![
            files::write_file(dir, WEIGHTS_FILE, &weights)?,
            files::write_file(dir, CONFIG_FILE, share.whole.to_hf_json().as_bytes())?,
            files::write_file(dir, STATE_FILE, state_json.as_bytes())?,
            files::write_file(dir, &name, &whole::shard_bytes(trainer, &tensors))?,
        ];
        commit(out, dir, trainer.step, entries, options)?;
    }
    trainer.barrier()?;
    Ok(dir.to_path_buf())
}

/// Rank 0's last act: the manifest of `entries` renamed into place (after the test hook's
/// pause), then the older snapshots beyond `keep` deleted.
fn commit(
    out: &Path,
    dir: &Path,
    step: u64,
    entries: Vec<FileEntry>,
    options: &SaveOptions,
) -> Result<(), SnapshotError> {
    if let Some(pause) = options.pause_before_commit {
        std::thread::sleep(pause);
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        step,
        files: entries,
    };
    files::commit(dir, &manifest)?;
    files::prune(out, options.keep.max(1))
}

/// The gathered model (HF names) from every unit's full weights, its config.json, and
/// train.json.
fn write_rank0_files<B: TrainOps>(
    trainer: &Trainer<B>,
    units: &[Vec<f32>],
    dir: &Path,
    run: &RunState,
) -> Result<Vec<FileEntry>, SnapshotError> {
    let model = &trainer.model;
    let slices: Vec<&[f32]> = units.iter().map(Vec::as_slice).collect();
    let weights = engine::io::tensors_to_safetensors(engine::io::export_units(model, &slices));
    let state = TrainState::of(trainer, run);
    let state_json = serde_json::to_string_pretty(&state).expect("train state serialises");
    Ok(vec![
        files::write_file(dir, WEIGHTS_FILE, &weights)?,
        files::write_file(dir, CONFIG_FILE, model.config.to_hf_json().as_bytes())?,
        files::write_file(dir, STATE_FILE, state_json.as_bytes())?,
    ])
}

/// A committed snapshot, every file checked against the manifest.
pub struct Snapshot {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub state: TrainState,
    /// config.json (HF).
    pub hf_config: String,
    /// Shard files in rank order: (name, bytes).
    shards: Vec<(String, Vec<u8>)>,
    /// Newer snapshots of the folder that were damaged and passed over: (folder, why).
    pub skipped: Vec<(PathBuf, String)>,
}

impl Snapshot {
    /// Opens the snapshot `path` names (a snapshot folder, or a run's `--out` folder: its newest
    /// committed snapshot) and checks the format version and every file's size and crc32.
    ///
    /// From a run's folder a damaged newest snapshot is passed over for the newest intact one,
    /// which lists it in [`Snapshot::skipped`]; when none is intact the newest one's error is
    /// returned. A snapshot folder named itself is opened as it is or refused.
    pub fn open(path: &Path) -> Result<Snapshot, SnapshotError> {
        if let Err(e) = std::fs::metadata(path) {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Err(SnapshotError::Missing { path: path.into() });
            }
        }
        if files::is_committed(path) {
            return Snapshot::open_dir(path.to_path_buf());
        }
        let mut skipped: Vec<(PathBuf, SnapshotError)> = Vec::new();
        for (_, dir) in files::committed(path)?.into_iter().rev() {
            match Snapshot::open_dir(dir.clone()) {
                Ok(mut snap) => {
                    snap.skipped = skipped
                        .into_iter()
                        .map(|(d, e)| (d, e.to_string()))
                        .collect();
                    return Ok(snap);
                }
                Err(e) => skipped.push((dir, e)),
            }
        }
        match skipped.into_iter().next() {
            Some((_, newest_error)) => Err(newest_error),
            None => Err(SnapshotError::NotFound { path: path.into() }),
        }
    }

    fn open_dir(dir: PathBuf) -> Result<Snapshot, SnapshotError> {
        let manifest = files::read_manifest(&dir)?;
        let mut read = std::collections::HashMap::new();
        for entry in &manifest.files {
            read.insert(entry.name.clone(), files::read_verified(&dir, entry)?);
        }
        let mut take = |name: &str| {
            read.remove(name).ok_or_else(|| SnapshotError::BadManifest {
                path: dir.join(files::MANIFEST),
                reason: format!("it lists no {name}"),
            })
        };
        let state_bytes = take(STATE_FILE)?;
        let state: TrainState =
            serde_json::from_slice(&state_bytes).map_err(|e| SnapshotError::BadContents {
                path: dir.join(STATE_FILE),
                reason: format!("not a train state: {e}"),
            })?;
        if manifest.step != state.step {
            return Err(SnapshotError::BadManifest {
                path: dir.join(files::MANIFEST),
                reason: format!(
                    "it lists step {} and the train state is step {}",
                    manifest.step, state.step
                ),
            });
        }
        // A renamed folder would resume at, and list as, a step it is not.
        let named = dir
            .file_name()
            .and_then(|n| files::parse_step(&n.to_string_lossy()));
        if let Some(named) = named.filter(|&n| n != state.step) {
            return Err(SnapshotError::BadContents {
                path: dir.join(STATE_FILE),
                reason: format!(
                    "it is step {}'s state, but its folder is named for step {named}; rename \
                     the folder {}",
                    state.step,
                    files::step_dir_name(state.step)
                ),
            });
        }
        let hf_config = String::from_utf8_lossy(&take(CONFIG_FILE)?).into_owned();
        take(WEIGHTS_FILE)?;
        // A tensor- or pipeline-parallel run writes one shard file of the whole model.
        let world = state.world.shard_files.unwrap_or(state.world.ranks) as usize;
        let shards = (0..world)
            .map(|r| {
                let name = shards::rank_file_name(r, world);
                take(&name).map(|bytes| (name, bytes))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Snapshot {
            dir,
            manifest,
            state,
            hf_config,
            shards,
            skipped: Vec::new(),
        })
    }

    /// Refuses a trainer whose model or training setup (its weight precision and loss scaler
    /// included) differs from the snapshot's, listing every difference. The world (ranks, ZeRO
    /// stage, rows per rank, optimizer offload) may differ.
    pub fn check_compatible(&self, config: &TrainConfig, seed: u64) -> Result<(), SnapshotError> {
        self.check_run(config, seed, self.state.run.data)
    }

    /// [`Snapshot::check_compatible`], and the training data's identity (`RunState::data`) too:
    /// a snapshot that recorded one refuses other data.
    pub fn check_run(
        &self,
        config: &TrainConfig,
        seed: u64,
        data: Option<u64>,
    ) -> Result<(), SnapshotError> {
        let run = RunState {
            loader: self.state.loader_position(),
            seed,
            // A snapshot from before data identities were recorded accepts any data.
            data: self.state.run.data.and(data),
        };
        let this_run = TrainState::of_config(config, self.state.step, &run);
        let differences = self.state.differences(&this_run);
        if differences.is_empty() {
            return Ok(());
        }
        Err(SnapshotError::Mismatch {
            path: self.dir.clone(),
            differences,
        })
    }

    /// Every unit's whole fp32 weights (unpadded), reassembled from the shard files of any
    /// world and checked against `units`: what a forward-only `Runner` loads (`frugal export`).
    pub fn weights(&self, units: &[plan_frugal::Unit]) -> Result<Vec<Vec<f32>>, SnapshotError> {
        shards::weights(&self.dir, &self.shards, units)
    }

    /// The model the snapshot holds, from its config.json.
    pub fn model_config(&self) -> Result<engine::ModelConfig, SnapshotError> {
        let name = self.dir.join(CONFIG_FILE).display().to_string();
        Ok(engine::ModelConfig::from_hf_json(&self.hf_config, &name)?)
    }

    /// Ranks the snapshot was taken on (one shard file each).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Fills `trainer` (any world, any stage, offloaded or not) with the snapshot's weights
    /// (bf16/fp16: the fp32 master weights and the 2-byte copy rounded from them), optimizer
    /// state, loss scaler and step; returns the loop's state (seek the data loader to `loader`).
    pub fn restore<B: TrainOps>(
        &self,
        trainer: &mut Trainer<B>,
    ) -> Result<RunState, SnapshotError> {
        let scaler = self.scaler_for(trainer)?;
        shards::restore(
            trainer,
            &self.dir,
            &self.shards,
            shards::Parts::WeightsAndOptimizer,
        )?;
        trainer.step = self.state.step;
        if let Some(scaler) = scaler {
            trainer.skipped_steps = scaler.state().skipped_steps;
            trainer.scaler = Some(scaler);
        }
        Ok(RunState {
            loader: self.state.loader_position(),
            seed: self.state.run.seed,
            data: self.state.run.data,
        })
    }

    /// The saved loss scaler with the trainer's settings, checked before anything is written:
    /// an fp16 trainer needs the snapshot's scaler, any other trainer a snapshot without one.
    fn scaler_for<B: TrainOps>(
        &self,
        trainer: &Trainer<B>,
    ) -> Result<Option<LossScaler>, SnapshotError> {
        let bad = |reason: String| SnapshotError::BadContents {
            path: self.dir.join(STATE_FILE),
            reason,
        };
        match (&trainer.scaler, &self.state.loss_scaler) {
            (None, None) => Ok(None),
            (Some(ours), Some(saved)) => LossScaler::restore(*ours.config(), saved.state)
                .map(Some)
                .map_err(|e| bad(format!("its loss scaler: {e}"))),
            (Some(_), None) => Err(bad(
                "it holds no loss scaler state, and this fp16 run needs one: resume with the \
                 snapshot's --precision"
                    .into(),
            )),
            (None, Some(_)) => Err(bad(
                "it holds an fp16 loss scaler, and this run has none: resume with --precision fp16"
                    .into(),
            )),
        }
    }
}
