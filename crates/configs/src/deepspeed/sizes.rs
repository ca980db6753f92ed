//! The sizes a ds_config.json sets: the batch triple and ZeRO's buffers.

use crate::{count, Setting};
use anyhow::{bail, Context};
use plan::setup::ZeroBuffers;
use serde_json::Value;

/// DeepSpeed's batch triple: micro-batch and accumulation from any two of the three.
pub(super) fn batch(
    origin: &str,
    v: &Value,
    micro: u64,
    gas: u32,
    dp: u32,
) -> anyhow::Result<(u64, u32)> {
    let get = |k: &str| count(origin, v.get(k), k);
    let m = match get("train_micro_batch_size_per_gpu")? {
        Setting::Auto => Some(micro),
        Setting::Is(n) => Some(n),
        Setting::Absent => None,
    };
    let g = match get("gradient_accumulation_steps")? {
        Setting::Auto => Some(gas as u64),
        Setting::Is(n) => Some(n),
        Setting::Absent => None,
    };
    let t = match get("train_batch_size")? {
        Setting::Is(n) => Some(n),
        Setting::Auto | Setting::Absent => None,
    };
    let dp = dp as u64;
    // Products past 64 bits are no batch anyone runs: refused, never wrapped.
    let mul = |a: u64, b: u64| {
        a.checked_mul(b).ok_or_else(|| {
            anyhow::anyhow!("{origin}: the batch settings multiply past 2^64: give real sizes")
        })
    };
    let (m, g) = match (m, g, t) {
        (Some(m), Some(g), Some(t)) if mul(mul(m, g)?, dp)? != t => bail!(
            "{origin}: train_batch_size {t} is not train_micro_batch_size_per_gpu {m} × \
             gradient_accumulation_steps {g} × {dp} GPUs (--gpus) = {}: fix one",
            m * g * dp
        ),
        (Some(m), Some(g), _) => (m, g),
        (Some(m), None, Some(t)) if m > 0 && t % mul(m, dp)? == 0 => (m, t / (m * dp)),
        (None, Some(g), Some(t)) if g > 0 && t % mul(g, dp)? == 0 => (t / (g * dp), g),
        (None, None, Some(t)) if t % dp == 0 => (t / dp, 1),
        (Some(m), None, None) => (m, 1),
        (_, _, Some(t)) => bail!(
            "{origin}: train_batch_size {t} does not divide into whole micro-batches on {dp} \
             GPUs (--gpus) with the other batch settings"
        ),
        (None, _, None) => bail!(
            "{origin}: give train_micro_batch_size_per_gpu or train_batch_size (\"auto\" takes --batch)"
        ),
    };
    if m == 0 || g == 0 {
        bail!("{origin}: the micro-batch and gradient_accumulation_steps must be at least 1");
    }
    let g = u32::try_from(g)
        .with_context(|| format!("{origin}: gradient_accumulation_steps {g} is too large"))?;
    Ok((m, g))
}

/// ZeRO's buffer sizes, `"auto"` as HF's Trainer fills them from the hidden size.
pub(super) fn buffers(
    origin: &str,
    zero: &Value,
    hidden: Option<u64>,
) -> anyhow::Result<ZeroBuffers> {
    let d = ZeroBuffers::DEEPSPEED;
    let h = hidden.unwrap_or(0);
    // The first of `keys` set (DeepSpeed also takes the names without `stage3_`); `"auto"` as
    // HF fills it from the model's hidden size, which a bare parameter count does not have.
    let pick = |keys: &[&str], default: u64, auto: u64| -> anyhow::Result<u64> {
        let key = keys
            .iter()
            .find(|k| zero.get(**k).is_some())
            .unwrap_or(&keys[0]);
        let name = format!("zero_optimization.{key}");
        Ok(match count(origin, zero.get(*key), &name)? {
            Setting::Absent => default,
            Setting::Auto if hidden.is_some() => auto,
            Setting::Auto => bail!(
                "{origin}: {name} is \"auto\", which needs the model's hidden size: plan with \
                 --model, or give a number"
            ),
            Setting::Is(n) => n,
        })
    };
    let sub_group = match count(origin, zero.get("sub_group_size"), "zero_optimization.sub_group_size")? {
        Setting::Absent => d.sub_group,
        Setting::Auto => bail!("{origin}: zero_optimization.sub_group_size cannot be \"auto\": give a count (DeepSpeed's default is 1e9)"),
        Setting::Is(0) => bail!("{origin}: zero_optimization.sub_group_size must be at least 1"),
        Setting::Is(n) => n,
    };
    Ok(ZeroBuffers {
        reduce_bucket: pick(&["reduce_bucket_size"], d.reduce_bucket, h * h)?,
        prefetch_bucket: pick(
            &["stage3_prefetch_bucket_size", "prefetch_bucket_size"],
            d.prefetch_bucket,
            (0.9 * (h * h) as f64) as u64,
        )?,
        persistence_threshold: pick(
            &[
                "stage3_param_persistence_threshold",
                "param_persistence_threshold",
            ],
            d.persistence_threshold,
            10 * h,
        )?,
        sub_group,
    })
}
