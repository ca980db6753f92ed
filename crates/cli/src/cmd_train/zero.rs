//! `frugal train --zero 0|1|2|3 --ranks N`: the stage flag, and what a stage-3 run must do while
//! its ranks are still alive.
//!
//! At stage 3 (and under tensor or pipeline parallelism, or with sharded master weights) no rank holds whole weights: the sample and the saved model need every unit
//! gathered, a collective all ranks join. So each rank, right after its training loop, runs the
//! same seeded generation and gathers the full weights for `--out`; rank 0 keeps the results.
//! Stages 0-2 hold full weights everywhere, and rank 0 does this alone after the others end.
//!
//! Example: `frugal train --ranks 4 --zero 3 --steps 20`.

use super::Args;
use anyhow::Context;
use plan::setup::ZeroStage;
use train::Trainer;

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
    let parallel = trainer.model.share.is_some();
    if trainer.sharding.stage() != ZeroStage::Zero3 && trainer.sharding.half.is_none() && !parallel
    {
        return Ok(Finished::default());
    }
    let sample = if args.sample_tokens > 0 {
        Some(super::setup::sample(trainer, tokenizer, args, false)?)
    } else {
        None
    };
    let weights = match args.out {
        Some(_) => Some(trainer.whole_params()?),
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
            // Tensor or pipeline parallelism: the ranks' shares were put together into the
            // whole model.
            if let Some(share) = &trainer.model.share {
                let tensors = engine::io::export_views(&share.whole_units, &slices);
                return engine::io::save_hf(&share.whole, tensors, dir).with_context(context);
            }
            let tensors = engine::io::export_units(&trainer.model, &slices);
            engine::io::save_pretrained_tensors(&trainer.model, tensors, dir).with_context(context)
        }
        None => {
            engine::io::save_pretrained(&trainer.model, &trainer.arena, dir).with_context(context)
        }
    }
}
