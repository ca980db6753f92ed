//! The training loop, the same on every backend and for every driver: optimizer steps over a
//! loader, the validation loss every `val_every` steps (and after the last), the loss curves and
//! the tokens and seconds they took. What a driver adds around a step (snapshots, a stop on
//! SIGTERM, a progress bar) comes through [`Hooks`]; the loop itself neither prints nor saves.
//!
//! Example:
//! ```no_run
//! # fn demo(trainer: &mut train::Trainer, loader: &mut data::Loader, val: &data::ValBatches)
//! # -> Result<(), engine::EngineError> {
//! let plan = train::run::Schedule { steps: 100, val_every: 50, val_batches: 8 };
//! let ran = train::run::run(trainer, loader, val, &plan, &mut train::run::Silent)?;
//! println!("loss {:?} -> {:?}", ran.curves.train.first(), ran.curves.train.last());
//! # Ok(()) }
//! ```

use crate::{StepStats, Trainer};
use engine::backend::TrainOps;
use engine::EngineError;
use std::time::Instant;

/// How many steps to run and how often to measure the validation loss.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// The step to stop after (a resumed trainer starts from its own step).
    pub steps: u64,
    /// Validation every this many steps, and after the last one.
    pub val_every: u64,
    /// Validation batches per evaluation (a data-parallel run passes its replicas' share times
    /// the replicas, so every rank count evaluates the same tokens).
    pub val_batches: usize,
}

/// Train and validation loss against the step.
#[derive(Clone, Debug, Default)]
pub struct Curves {
    pub train: Vec<(u64, f32)>,
    pub val: Vec<(u64, f32)>,
}

/// What the loop leaves behind.
#[derive(Clone, Debug, Default)]
pub struct Ran {
    pub curves: Curves,
    /// Tokens of the global batches (all ranks).
    pub tokens: u64,
    pub seconds: f64,
}

/// What a driver does around the steps. Both methods default to nothing.
pub trait Hooks<B: TrainOps> {
    /// The driver's error: the engine's, or one of its own (an interruption, a failed save).
    type Error: From<EngineError>;

    /// Right after step `trainer.step` (before its validation): save a snapshot, stop the run by
    /// returning an error.
    fn stepped(
        &mut self,
        trainer: &mut Trainer<B>,
        loader: &data::Loader,
        stats: &StepStats,
    ) -> Result<(), Self::Error> {
        let _ = (trainer, loader, stats);
        Ok(())
    }

    /// After the step and its validation, if any: show progress.
    fn progress(&mut self, trainer: &Trainer<B>, stats: &StepStats, ran: &Ran) {
        let _ = (trainer, stats, ran);
    }

    /// Between validation batches: whether a stop was asked for (on every rank alike: a
    /// collective where ranks must agree). The validation is then dropped and [`Hooks::stop`]
    /// called.
    fn interrupted(&mut self, trainer: &mut Trainer<B>) -> Result<bool, Self::Error> {
        let _ = trainer;
        Ok(false)
    }

    /// A stop asked for during a validation: end the run as [`Hooks::stepped`] would (a
    /// snapshot and an error), or return to let the loop go on.
    fn stop(&mut self, trainer: &mut Trainer<B>, loader: &data::Loader) -> Result<(), Self::Error> {
        let _ = (trainer, loader);
        Ok(())
    }
}

/// Hooks that do nothing.
pub struct Silent;

impl<B: TrainOps> Hooks<B> for Silent {
    type Error = EngineError;
}

/// The mean loss over the first `max_batches` validation batches (at least one).
pub fn val_loss<B: TrainOps>(
    trainer: &mut Trainer<B>,
    val: &data::ValBatches,
    max_batches: usize,
) -> Result<f32, EngineError> {
    let n = trainer.micro_tokens();
    let (mut x, mut y) = (vec![0u32; n], vec![0u32; n]);
    let batches = val.n_batches().min(max_batches.max(1));
    let mut sum = 0.0f64;
    for i in 0..batches {
        val.fill_batch(i, &mut x, &mut y);
        sum += f64::from(trainer.eval_loss(&x, &y)?);
    }
    Ok((sum / batches as f64) as f32)
}

/// [`val_loss`], asking `hooks` before each batch after the first whether to stop (`None`).
fn val_loss_unless_stopped<B: TrainOps, H: Hooks<B>>(
    trainer: &mut Trainer<B>,
    val: &data::ValBatches,
    max_batches: usize,
    hooks: &mut H,
) -> Result<Option<f32>, H::Error> {
    let n = trainer.micro_tokens();
    let (mut x, mut y) = (vec![0u32; n], vec![0u32; n]);
    let batches = val.n_batches().min(max_batches.max(1));
    let mut sum = 0.0f64;
    for i in 0..batches {
        if i > 0 && hooks.interrupted(trainer)? {
            return Ok(None);
        }
        val.fill_batch(i, &mut x, &mut y);
        sum += f64::from(trainer.eval_loss(&x, &y)?);
    }
    Ok(Some((sum / batches as f64) as f32))
}

/// Steps `trainer` from its current step to `schedule.steps`. A fresh LoRA run's curve starts
/// with the base's validation loss at step 0 (its adapters start at B = 0).
pub fn run<B: TrainOps, H: Hooks<B>>(
    trainer: &mut Trainer<B>,
    loader: &mut data::Loader,
    val: &data::ValBatches,
    schedule: &Schedule,
    hooks: &mut H,
) -> Result<Ran, H::Error> {
    let mut ran = Ran::default();
    if trainer.model.lora.is_some() && trainer.step == 0 {
        let loss = val_loss(trainer, val, schedule.val_batches)?;
        ran.curves.val.push((0, loss));
    }
    let started = Instant::now();
    for step in trainer.step..schedule.steps {
        let stats = trainer.step(&mut |x, y| {
            loader.next_batch(x, y);
        })?;
        ran.tokens += stats.tokens;
        ran.curves.train.push((step + 1, stats.loss));
        hooks.stepped(trainer, loader, &stats)?;
        if (step + 1) % schedule.val_every.max(1) == 0 || step + 1 == schedule.steps {
            match val_loss_unless_stopped(trainer, val, schedule.val_batches, hooks)? {
                Some(loss) => ran.curves.val.push((step + 1, loss)),
                None => hooks.stop(trainer, loader)?,
            }
        }
        ran.seconds = started.elapsed().as_secs_f64();
        hooks.progress(trainer, &stats, &ran);
    }
    ran.seconds = started.elapsed().as_secs_f64();
    Ok(ran)
}
