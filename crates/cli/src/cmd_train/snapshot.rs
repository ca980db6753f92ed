//! `frugal train --save-every N --out DIR [--keep K]` and `--resume DIR`: the training loop's side
//! of `train::snapshot` — checking the flags, opening the snapshot once for every rank, restoring
//! each rank's trainer and data loader, and saving after every N-th step. Every precision
//! snapshots: bf16/fp16 runs save their fp32 master weights, Adam state (offloaded or not) and the
//! fp16 loss scaler, and resume only with the same precision and scaler.
//!
//! What it does not do: any file format work (the engine's `snapshot` module does).
//!
//! Example: `frugal train --steps 6 --save-every 3 --out run1`, then after a crash
//! `frugal train --steps 6 --out run1 --resume run1` continues from `run1/step-000003`.

use super::Args;
use anyhow::{bail, Context};
use std::time::Duration;
use train::snapshot::{self, RunState, SaveOptions, Snapshot};
use train::Trainer;

/// A test hook: `STEP,SECONDS` pauses the save after STEP for SECONDS just before its manifest
/// commits it, so a test can kill the process mid-save.
const PAUSE_ENV: &str = "FRUGAL_TEST_SNAPSHOT_PAUSE";

/// Opens `--resume`'s snapshot (every file checked) and refuses it if this run differs.
pub fn open(args: &Args, config: &train::TrainConfig) -> anyhow::Result<Option<Snapshot>> {
    let Some(path) = &args.resume else {
        return Ok(None);
    };
    let snap = Snapshot::open(path).with_context(|| format!("--resume {}", path.display()))?;
    for (dir, why) in &snap.skipped {
        eprintln!(
            "warning: --resume {}: {} is damaged ({why}); resuming from the newest intact \
             snapshot, {}",
            path.display(),
            dir.display(),
            snap.dir.display()
        );
    }
    // The run's identity (model, optimizer, schedule, global batch, seed, precision and loss
    // scaler) must be the snapshot's; ranks, ZeRO stage and offload may differ.
    snap.check_compatible(config, args.seed)?;
    if snap.state.step >= args.steps {
        bail!(
            "--resume {}: the snapshot is at step {}, and --steps is {}: nothing is left to train",
            snap.dir.display(),
            snap.state.step,
            args.steps
        );
    }
    Ok(Some(snap))
}

/// Fills a freshly built rank from the snapshot and moves its loader to the saved position.
pub fn restore(
    snap: &Snapshot,
    trainer: &mut Trainer,
    loader: &mut data::Loader,
) -> anyhow::Result<()> {
    let run = snap.restore(trainer)?;
    loader
        .seek(run.loader)
        .with_context(|| format!("--resume {}: the data loader", snap.dir.display()))?;
    Ok(())
}

/// Saves a snapshot when the step just taken is a multiple of `--save-every`.
pub fn maybe_save(
    args: &Args,
    trainer: &mut Trainer,
    loader: &data::Loader,
    data_id: u64,
) -> anyhow::Result<()> {
    let (Some(every), Some(out)) = (args.save_every, &args.out) else {
        return Ok(());
    };
    if trainer.step % every != 0 {
        return Ok(());
    }
    save_now(args, trainer, loader, data_id, out).map(|_| ())
}

/// Saves a snapshot of the step just taken into `out` (every rank calls it); its folder.
pub fn save_now(
    args: &Args,
    trainer: &mut Trainer,
    loader: &data::Loader,
    data_id: u64,
    out: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let run = RunState {
        loader: loader.position(),
        seed: args.seed,
        data: Some(data_id),
    };
    let options = SaveOptions {
        keep: args.keep,
        pause_before_commit: test_pause(trainer.step),
    };
    snapshot::save(trainer, out, &run, &options)
        .with_context(|| format!("saving the snapshot of step {}", trainer.step))
}

fn test_pause(step: u64) -> Option<Duration> {
    let value = std::env::var(PAUSE_ENV).ok()?;
    let (at, seconds) = value.split_once(',')?;
    (at.trim().parse::<u64>().ok()? == step)
        .then(|| Duration::from_secs_f64(seconds.trim().parse().unwrap_or(0.0)))
}
