//! Mixed precision for `--precision bf16|fp16`: the dynamic loss scaler (torch and DeepSpeed
//! semantics), gradient unscaling with the inf/NaN check, the fp32-master AdamW step that writes
//! the 2-byte working copy, and the fp16 underflow statistics the report shows.
//!
//! Pieces, each self-contained and used by the step loop (`train`):
//! - [`scaler`]: [`LossScaler`] decides apply/skip per step and moves the scale;
//! - [`grads`]: [`unscale_and_check`] and finite checks on f32/bf16/f16 gradients;
//! - [`master`]: [`adamw_master_step`] (bit-identical to `kernels::adamw::update` on f32 input);
//! - [`underflow`]: [`UnderflowStats`], what fp16 storage at a scale does to gradient values.
//!
//! Conversions themselves are `kernels::convert`. This module holds no buffers and never prints.
//!
//! ```
//! use train::precision::{unscale_and_check, LossScaler, StepDecision};
//! let mut scaler = LossScaler::deepspeed();
//! let mut grads = vec![65536.0f32, f32::INFINITY];
//! let found_inf = unscale_and_check(&mut grads, scaler.inv_scale());
//! assert_eq!(scaler.update(found_inf).unwrap(), StepDecision::Skip);
//! assert_eq!(scaler.scale(), 65536.0); // hysteresis 2: the first overflow keeps the scale
//! ```

pub mod grads;
pub mod scaler;
pub mod update;

pub use engine::precision::UnderflowStats;
pub use engine::precision::{
    adamw_master_step, master, underflow, Grads, MasterStep, PrecisionError, Working,
};
pub use grads::{any_non_finite, any_non_finite_bf16, any_non_finite_f16, unscale_and_check};
pub use scaler::{
    DeepSpeedScaling, LossScaler, ScalerConfig, ScalerState, StepDecision, TorchScaling,
};

/// `--precision` as this engine trains: fp32, bf16 or fp16. The planner's autocast policies
/// (autocast's amp-bf16 and amp-fp16, and pure-bf16) are PyTorch's, which `frugal plan` models.
pub fn engine_precision(s: &str) -> Result<plan::setup::Precision, String> {
    use plan::setup::Precision::{Bf16, Fp16, Fp32};
    match s.parse::<plan::setup::Precision>() {
        Ok(p @ (Fp32 | Bf16 | Fp16)) => Ok(p),
        Ok(_) => Err(format!(
            "{s} is one of PyTorch's precision policies (`frugal plan --precision {s}` plans \
             it); this engine trains in fp32, bf16 or fp16"
        )),
        Err(_) => Err("use fp32, bf16 or fp16".into()),
    }
}
