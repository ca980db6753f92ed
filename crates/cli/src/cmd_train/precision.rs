//! `frugal train --precision fp32|bf16|fp16 [--loss-scaler torch|deepspeed]`: the report's
//! precision and offload fields (loss scale, skipped steps, fp16 underflow, host bytes). The
//! flags themselves are validated in `config`.
//!
//! It does not train or print; `cmd_train` calls it.
//!
//! Example: `frugal train --precision fp16 --loss-scaler deepspeed` trains with fp16 weights and
//! gradients, fp32 master weights and DeepSpeed's dynamic loss scaler (initial scale 2^16,
//! window 1000, hysteresis 2); the report says the final scale, the skipped steps and the
//! fraction of gradient values fp16 flushed to zero or left subnormal.

use engine::backend::TrainOps;
use plan::setup::Precision;
use serde_json::{json, Value};
use train::{StepStats, Trainer};

/// The report's `offload` object: the host bytes the plan counts and the store holds.
pub fn offload_json<B: TrainOps>(t: &Trainer<B>) -> Value {
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
pub fn offload_line<B: TrainOps>(t: &Trainer<B>) -> String {
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
        term::human_bytes(planned),
        term::human_bytes(store.bytes())
    )
}

/// The progress bar's precision part: the loss scale and skipped steps under fp16.
pub fn bar<B: TrainOps>(stats: &StepStats, trainer: &Trainer<B>) -> String {
    match stats.loss_scale {
        Some(scale) => format!(" | scale {scale} | skipped {}", trainer.skipped_steps),
        None => String::new(),
    }
}

/// The report's `precision` object: the precision, and under fp16 the scale the next step uses,
/// the skipped steps and the last step's underflow.
pub fn json<B: TrainOps>(t: &Trainer<B>) -> Value {
    let underflow = t.underflow().map(|u| {
        json!({
            "values": u.total,
            "flushed_to_zero_fraction": u.flushed_fraction(),
            "subnormal_fraction": u.subnormal_fraction(),
            "overflow_fraction": u.overflow_fraction(),
        })
    });
    json!({
        "precision": t.mixed().precision.to_string(),
        "loss_scaler": t.scaler.as_ref().map(|s| s.config().name()),
        "loss_scale": t.scaler.as_ref().map(|s| s.scale()),
        "skipped_steps": t.skipped_steps,
        "underflow": underflow,
    })
}

/// The report's human line (empty for fp32).
pub fn line<B: TrainOps>(t: &Trainer<B>) -> String {
    let name = t.mixed().precision.to_string();
    let Some(scaler) = t.scaler.as_ref() else {
        return match t.mixed().precision {
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
