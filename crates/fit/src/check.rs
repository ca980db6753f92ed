//! The checks `fit` makes on a request before it builds a candidate: each error names the flag
//! and the fix. Example: `check_request(&shape, &FitRequest::new(32, 2048, 8, 80 << 30))?`.

use super::{space, FitRequest, Hardware};
use plan::{ModelShape, PlanError};

/// A request error naming `field` (the flag) and what to do.
pub(super) fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

/// The checks a training and a serving request share, made first: the model, the hardware, at
/// least one GPU and a device size (`example`: sizes the error suggests).
pub(super) fn check_machine(
    model: &ModelShape,
    hardware: &Hardware,
    gpus: u32,
    capacity_bytes: u64,
    example: &str,
) -> Result<(), PlanError> {
    model.validate()?;
    hardware.validate()?;
    if gpus == 0 {
        return Err(invalid("--gpus", "must be at least 1".into()));
    }
    if capacity_bytes == 0 {
        return Err(invalid(
            "--device-memory",
            format!("must be more than 0: e.g. {example}"),
        ));
    }
    Ok(())
}

/// Checks the request before any candidate is built; errors name the flag and the fix.
pub fn check_request(model: &ModelShape, r: &FitRequest) -> Result<(), PlanError> {
    check_machine(
        model,
        &r.hardware,
        r.gpus,
        r.capacity_bytes,
        "80GiB or 24GB",
    )?;
    if !(0.0..1.0).contains(&r.headroom) {
        return Err(invalid(
            "--headroom",
            format!(
                "{} is not a fraction in [0, 1): e.g. 0.05 keeps 5% free",
                r.headroom
            ),
        ));
    }
    if r.global_batch == 0 {
        return Err(invalid(
            "--batch",
            "must be at least 1 sequence per step".into(),
        ));
    }
    let mut probe = r.baseline();
    probe.dp = 1;
    probe.micro_batch = 1;
    probe.validate(model)?;
    if let Some(l) = &r.lora {
        if l.rank == 0 {
            return Err(invalid("--lora-rank", "must be at least 1".into()));
        }
        plan::lora::check_targets(model, &l.targets)?;
        plan::lora::check_rank(model, l.rank, &l.targets)?;
    }
    let layouts = space::layouts(model, r.gpus, r.hardware.gpus_per_node, &r.bounds);
    if layouts.is_empty() {
        return Err(invalid(
            "--tp",
            format!(
                "no tensor × pipeline layout of {} GPUs suits {} ({} heads, {} layers, {} GPUs per node): change --tp/--pp or --gpus",
                r.gpus, model.name, model.n_heads, model.n_layers, r.hardware.gpus_per_node
            ),
        ));
    }
    if !layouts.iter().any(|l| r.global_batch % l.dp as u64 == 0) {
        let dps: Vec<String> = layouts.iter().map(|l| l.dp.to_string()).collect();
        return Err(invalid(
            "--batch",
            format!(
                "{} sequences do not split evenly over the data-parallel ranks ({}): use a multiple of {}",
                r.global_batch,
                dps.join(", "),
                layouts.iter().map(|l| l.dp).min().unwrap_or(1)
            ),
        ));
    }
    Ok(())
}
