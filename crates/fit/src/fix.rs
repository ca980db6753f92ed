//! The engine's question when a run does not fit: what is the nearest setup that does?
//!
//! Nearest means fewest remedies, earlier ones in the usual order, then the lightest form of each
//! (a micro-batch halved before quartered, ZeRO-1 before ZeRO-3), then the most headroom. The
//! search keeps the GPU count, the global batch, precision, optimizer and LoRA choice, and never
//! undoes a remedy the setup already has (no lower ZeRO stage, no less offload, no eager attention
//! for flash). Not here: step-time ranking ([`super::search`]). Example:
//! `cheapest_fix(&model, &setup, 80 << 30, Runtime::Formula).map(|s| s.description)` is
//! `Some("use --recompute full: total 41.20 GiB <= 80.00 GiB")`.

use super::{remedy, space, Bounds, Memory, Outcome, Remedy, Runtime, Weighed};
use plan::{ModelShape, TrainSetup};
use serde::Serialize;

/// A setup that fits, and how it differs from the one asked for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Suggestion {
    pub setup: TrainSetup,
    /// Empty when the setup asked for already fits.
    pub remedies: Vec<Remedy>,
    /// `frugal plan`/`train` flags that apply the remedies, e.g. `--recompute full`.
    pub flags: String,
    pub memory: Memory,
    pub capacity_bytes: u64,
    /// One line for people: `use --zero 3: total 14.20 GiB <= 80.00 GiB`.
    pub description: String,
}

use plan::units::human_bytes as human;

/// The nearest setup to `setup` whose total memory under `runtime` is at most `capacity_bytes`,
/// or `None` when no setup in reach fits (or `setup` is invalid for `model`).
pub fn cheapest_fix(
    model: &ModelShape,
    setup: &TrainSetup,
    capacity_bytes: u64,
    runtime: Runtime,
) -> Option<Suggestion> {
    setup.validate(model).ok()?;
    let gpus = setup.dp * setup.tp * setup.pp;
    let bounds = Bounds {
        min_zero: Some(setup.zero),
        min_offload: Some(setup.offload),
        flash_only: setup.attention == plan::setup::Attention::Flash,
        ..Bounds::default()
    };
    let lora = [setup.lora.clone()];
    let states = [(setup.precision, setup.optimizer)];
    let fixed = space::Fixed {
        template: setup,
        global_batch: setup.dp as u64 * setup.micro_batch * setup.grad_accum as u64,
        gpus,
        gpus_per_node: 8,
        bounds: &bounds,
        lora: &lora,
        states: &states,
    };
    let mut best: Option<(super::TieKey, u64, Weighed)> = None;
    space::for_each_candidate(model, &fixed, |s| {
        let remedies = Remedy::of(setup, s);
        let key = remedy::tie_key(&remedies, s);
        if best.as_ref().is_some_and(|(k, ..)| *k < key) {
            return;
        }
        let Ok(e) = runtime.estimate(model, s) else {
            return;
        };
        let memory = Memory::of(&e);
        if memory.total_bytes > capacity_bytes {
            return;
        }
        let better = best
            .as_ref()
            .is_none_or(|(k, total, _)| (&key, memory.total_bytes) < (k, *total));
        if better {
            let w = Weighed {
                setup: s.clone(),
                remedies,
                outcome: Outcome::TooBig { memory },
            };
            best = Some((key, memory.total_bytes, w));
        }
    });
    let (_, _, w) = best?;
    let memory = w.memory()?;
    let flags = remedy::flags(&w.setup, &w.remedies);
    let verdict = format!(
        "total {} <= {}",
        human(memory.total_bytes),
        human(capacity_bytes)
    );
    let description = if w.remedies.is_empty() {
        format!("already fits: {verdict}")
    } else {
        format!("use {flags}: {verdict}")
    };
    Some(Suggestion {
        setup: w.setup,
        remedies: w.remedies,
        flags,
        memory,
        capacity_bytes,
        description,
    })
}
