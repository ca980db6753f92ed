//! A model split over tensor-parallel ranks in this process (`generate --tp`, `serve --tp`):
//! each rank cuts its share from the fp32 weights, after a check that the ranks' plans fit the
//! RAM the process may use.

use crate::Loaded;
use anyhow::bail;
use infer::Worker;
use plan::buffer::Device;
use plan_frugal::ServeSetup;

/// The fp32 weights each rank cuts its share from.
pub fn fp32_units<'a>(
    tp: usize,
    model: &std::path::Path,
    source: &'a Loaded,
) -> anyhow::Result<&'a [Vec<f32>]> {
    source.units().map_err(|_| {
        anyhow::anyhow!(
            "--tp {tp}: each rank cuts its share from the model's fp32 weights, and {} is stored \
             quantized; pass its fp32 folder, its Hugging Face folder or its GGUF file",
            model.display()
        )
    })
}

/// Refuses a split the model does not allow, or ranks whose plans together exceed the RAM this
/// process may use (every rank lives in it).
pub fn check_fit(shape: &plan::ModelShape, setup: &ServeSetup, tp: usize) -> anyhow::Result<()> {
    let mut total = 0;
    for r in 0..tp as u32 {
        let plan = plan_frugal::serve_plan_rank(shape, setup, tp as u32, r)?;
        total += plan.peak_bytes(Device::Gpu);
    }
    fits_in_host(
        total,
        &format!("--tp {tp}: the ranks'"),
        "store the weights smaller (--weights int8, int4 or nf4) or plan a shorter context",
    )
}

/// Refuses workers of this process whose plans need `total` bytes together when the process may
/// use less: `whose` names them (`"--tp 4: the ranks'"`), `fix` says what to change.
pub fn fits_in_host(total: u64, whose: &str, fix: &str) -> anyhow::Result<()> {
    match engine::capacity::host_available() {
        Some(host) if total > host.bytes => bail!(
            "{whose} plans need {} bytes together and this process may use {} ({}); {fix}",
            plan::units::group_digits(total),
            plan::units::group_digits(host.bytes),
            host.source
        ),
        _ => Ok(()),
    }
}

/// `tp` ranks serving `source` (`frugal serve --tp`), rank 0 driven by the caller.
pub fn group(
    model: &std::path::Path,
    source: Loaded,
    setup: ServeSetup,
    tp: usize,
) -> anyhow::Result<infer::group::Group> {
    fp32_units(tp, model, &source)?;
    let setup = ServeSetup {
        weights: source.narrow(setup.weights)?,
        ..setup
    };
    check_fit(&source.config.shape, &setup, tp)?;
    let config = source.config.clone();
    let units = std::sync::Arc::new(source);
    let load: infer::group::Load = std::sync::Arc::new(move |w: &mut Worker| units.load_whole(w));
    Ok(infer::group::Group::start(config, setup, tp, load)?)
}
