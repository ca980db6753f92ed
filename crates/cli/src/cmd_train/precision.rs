//! `frugal train --precision fp32|bf16|fp16 [--loss-scaler torch|deepspeed]`: parsing the flags
//! into the engine's `Mixed`, refusing combinations the engine cannot honour yet, and the
//! report's precision fields (loss scale, skipped steps, fp16 underflow).
//!
//! It does not train or print; `cmd_train` calls it.
//!
//! Example: `frugal train --precision fp16 --loss-scaler deepspeed` trains with fp16 weights and
//! gradients, fp32 master weights and DeepSpeed's dynamic loss scaler (initial scale 2^16,
//! window 1000, hysteresis 2); the report says the final scale, the skipped steps and the
//! fraction of gradient values fp16 flushed to zero or left subnormal.

use super::Args;
use anyhow::{bail, Context};
use engine::precision::{DeepSpeedScaling, ScalerConfig, TorchScaling};
use engine::train::Mixed;
use engine::{StepStats, Trainer};
use plan::setup::{Offload, Precision};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The weight precision and loss scaler the flags ask for; bad values name the flag and the
/// accepted ones.
pub fn mixed(args: &Args, rank: usize) -> anyhow::Result<Mixed> {
    let precision = match args.precision.as_str() {
        "fp32" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        "fp16" => Precision::Fp16,
        other => bail!(
            "invalid --precision {other}: use fp32, bf16 (bf16 weights and gradients, fp32 \
             master weights) or fp16 (the same with dynamic loss scaling)"
        ),
    };
    let loss_scaler = match (args.loss_scaler.as_deref(), precision) {
        (None, Precision::Fp16) | (Some("torch"), Precision::Fp16) => {
            Some(ScalerConfig::Torch(TorchScaling::default()))
        }
        (Some("deepspeed"), Precision::Fp16) => {
            Some(ScalerConfig::DeepSpeed(DeepSpeedScaling::default()))
        }
        (Some(other), Precision::Fp16) => {
            bail!("invalid --loss-scaler {other}: use torch or deepspeed")
        }
        (Some(s), _) => bail!(
            "--loss-scaler {s} needs --precision fp16: fp32 and bf16 have fp32's exponent range \
             and are not loss-scaled"
        ),
        (None, _) => None,
    };
    let (offload, offload_path) = offload(args, rank)?;
    if offload != Offload::None && precision == Precision::Fp32 {
        bail!(
            "--offload {} needs --precision bf16 or fp16: the host steps fp32 master weights of \
             2-byte working weights",
            args.offload
        );
    }
    Ok(Mixed {
        precision,
        loss_scaler,
        offload,
        offload_path,
    })
}

/// `--offload none|optimizer|optimizer:disk[=PATH]`: the disk file defaults to
/// `<--out>/optimizer_state.rank<R>.bin`, or the temp directory without `--out`.
fn offload(args: &Args, rank: usize) -> anyhow::Result<(Offload, Option<PathBuf>)> {
    let name = format!("optimizer_state.rank{rank}.bin");
    Ok(match args.offload.as_str() {
        "none" => (Offload::None, None),
        "optimizer" => (Offload::Optimizer, None),
        "optimizer:disk" => {
            let path = match &args.out {
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating --out {}", dir.display()))?;
                    dir.join(name)
                }
                None => std::env::temp_dir().join(format!("frugal-{}-{name}", std::process::id())),
            };
            (Offload::Optimizer, Some(path))
        }
        other => match other.strip_prefix("optimizer:disk=") {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                let path = if args.ranks > 1 {
                    path.with_extension(format!("rank{rank}.bin"))
                } else {
                    path
                };
                (Offload::Optimizer, Some(path))
            }
            _ => bail!(
                "invalid --offload {other}: use none, optimizer (host RAM) or optimizer:disk[=PATH] \
                 (a memory-mapped file)"
            ),
        },
    })
}

/// The report's `offload` object: the host bytes the plan counts and the store holds.
pub fn offload_json(t: &Trainer) -> Value {
    let Some(store) = t.offload.as_ref() else {
        return Value::Null;
    };
    json!({
        "planned_host_bytes": t.plan.peak_bytes(plan::buffer::Device::Host),
        "host_store_bytes": store.bytes(),
        "path": store.path().map(|p| p.display().to_string()),
    })
}

/// The report's offload line (empty without offload).
pub fn offload_line(t: &Trainer) -> String {
    let Some(store) = t.offload.as_ref() else {
        return String::new();
    };
    let planned = t.plan.peak_bytes(plan::buffer::Device::Host);
    let place = match store.path() {
        Some(p) => format!("in {}", p.display()),
        None => "in host RAM".into(),
    };
    format!(
        "optimizer offloaded {place}: master weights, m and v {} planned, {} held (each unit \
         rounded up to 64 bytes)\n",
        crate::output::human_bytes(planned),
        crate::output::human_bytes(store.bytes())
    )
}

/// Refuses bad --precision, --loss-scaler and --offload values before anything is built.
pub fn check_flags(args: &Args) -> anyhow::Result<()> {
    mixed(args, 0).map(|_| ())
}

/// Refuses starting a 2-byte run from saved weights (loading writes fp32 units, not master
/// weights and their 2-byte copy).
pub fn check_weights(args: &Args, weights: Option<&std::path::Path>) -> anyhow::Result<()> {
    if let (true, Some(path)) = (args.precision != "fp32", weights) {
        bail!(
            "--precision {} cannot start from the saved weights in {} yet: use --precision fp32, \
             or a preset or a config.json without weights",
            args.precision,
            path.display()
        );
    }
    Ok(())
}

/// The progress bar's precision part: the loss scale and skipped steps under fp16.
pub fn bar(stats: &StepStats, trainer: &Trainer) -> String {
    match stats.loss_scale {
        Some(scale) => format!(" | scale {scale} | skipped {}", trainer.skipped_steps),
        None => String::new(),
    }
}

/// The report's `precision` object: the precision, and under fp16 the scale the next step uses,
/// the skipped steps and the last step's underflow.
pub fn json(t: &Trainer) -> Value {
    let underflow = t.underflow().map(|u| {
        json!({
            "values": u.total,
            "flushed_to_zero_fraction": u.flushed_fraction(),
            "subnormal_fraction": u.subnormal_fraction(),
            "overflow_fraction": u.overflow_fraction(),
        })
    });
    json!({
        "precision": format!("{:?}", t.mixed.precision).to_lowercase(),
        "loss_scaler": t.scaler.as_ref().map(|s| s.config().name()),
        "loss_scale": t.scaler.as_ref().map(|s| s.scale()),
        "skipped_steps": t.skipped_steps,
        "underflow": underflow,
    })
}

/// The report's human line (empty for fp32).
pub fn line(t: &Trainer) -> String {
    let name = format!("{:?}", t.mixed.precision).to_lowercase();
    let Some(scaler) = t.scaler.as_ref() else {
        return match t.mixed.precision {
            Precision::Fp32 => String::new(),
            _ => format!("precision {name}: 2-byte weights and gradients, fp32 master weights\n"),
        };
    };
    let mut out = format!(
        "precision {name}: loss scale {} ({} scaler), {} skipped step(s)\n",
        scaler.scale(),
        scaler.config().name(),
        t.skipped_steps
    );
    if let Some(u) = t.underflow() {
        out.push_str(&format!(
            "fp16 underflow at the last step's scale: {:.4}% of {} gradient values flushed to \
             zero, {:.4}% subnormal\n",
            100.0 * u.flushed_fraction(),
            u.total,
            100.0 * u.subnormal_fraction()
        ));
    }
    out
}
