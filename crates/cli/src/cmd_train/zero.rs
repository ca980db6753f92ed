//! `frugal train --zero 0|1|2|3 --ranks N`: the stage flag, and what a stage-3 run must do while
//! its ranks are still alive.
//!
//! At stage 3 no rank holds whole weights: the sample and the saved model need every unit
//! gathered, a collective all ranks join. So each rank, right after its training loop, runs the
//! same seeded generation and gathers the full weights for `--out`; rank 0 keeps the results.
//! Stages 0-2 hold full weights everywhere, and rank 0 does this alone after the others end.
//!
//! Example: `frugal train --ranks 4 --zero 3 --steps 20`.

use super::Args;
use anyhow::{bail, Context};
use engine::Trainer;
use plan::setup::ZeroStage;

/// The stage `--zero` asks for; above 3 is an error, never a lower stage.
pub fn stage(args: &Args) -> anyhow::Result<ZeroStage> {
    Ok(match args.zero {
        0 => ZeroStage::Zero0,
        1 => ZeroStage::Zero1,
        2 => ZeroStage::Zero2,
        3 => ZeroStage::Zero3,
        other => bail!(
            "invalid --zero {other}: ZeRO has stages 0, 1, 2 and 3 (3 shards weights, gradients \
             and optimizer state over the --ranks)"
        ),
    })
}

/// Refuses flag combinations a stage cannot honour.
pub fn check_flags(args: &Args) -> anyhow::Result<()> {
    if stage(args)? == ZeroStage::Zero3 && args.ranks > 1 && args.save_val_logits.is_some() {
        bail!("--save-val-logits needs whole weights on rank 0: use --zero 2 or less with --ranks > 1");
    }
    Ok(())
}

/// What rank 0 needs after training that, at stage 3, every rank must help compute.
#[derive(Default)]
pub struct Finished {
    pub sample: Option<String>,
    /// Every unit's full weights, in unit order (for `--out`).
    pub weights: Option<Vec<Vec<f32>>>,
}

/// At stage 3: the sample and (with `--out`) the gathered weights; nothing below stage 3.
pub fn finish(
    trainer: &mut Trainer,
    tokenizer: &data::Tokenizer,
    args: &Args,
) -> anyhow::Result<Finished> {
    // 2-byte runs save their fp32 master weights, sharded above stage 0: gather them.
    if trainer.sharding.stage != ZeroStage::Zero3 && trainer.sharding.half.is_none() {
        return Ok(Finished::default());
    }
    let sample = if args.sample_tokens > 0 {
        Some(super::generate(trainer, tokenizer, args)?)
    } else {
        None
    };
    let weights = match args.out {
        Some(_) => Some(trainer.full_params()?),
        None => None,
    };
    Ok(Finished { sample, weights })
}

/// Writes `--out`'s model from rank 0's trainer, or from the gathered weights at stage 3.
pub fn save(trainer: &Trainer, finished: &Finished, dir: &std::path::Path) -> anyhow::Result<()> {
    let context = || format!("saving the model to {}", dir.display());
    match &finished.weights {
        Some(units) => {
            let slices: Vec<&[f32]> = units.iter().map(|u| &u[..]).collect();
            let tensors = engine::io::export_units(&trainer.model, &slices);
            engine::io::save_pretrained_tensors(&trainer.model, tensors, dir).with_context(context)
        }
        None => {
            engine::io::save_pretrained(&trainer.model, &trainer.arena, dir).with_context(context)
        }
    }
}

/// Refuses starting stage 3 from a saved model's weights (loading writes whole units, which
/// stage 3 never holds; a later change can load and cut them into shards).
pub fn check_weights(zero: ZeroStage, weights: Option<&std::path::Path>) -> anyhow::Result<()> {
    if let (ZeroStage::Zero3, Some(path)) = (zero, weights) {
        bail!(
            "--zero 3 cannot start from the saved weights in {} yet: train with --zero 2 or \
             less, or from a preset or a config.json without weights",
            path.display()
        );
    }
    Ok(())
}
