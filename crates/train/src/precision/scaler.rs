//! Dynamic loss scaling for `--precision fp16`, in the two semantics people compare against:
//! PyTorch's `torch.amp.GradScaler` and DeepSpeed's `DynamicLossScaler`, with their defaults.
//!
//! - **torch**: scale 2^16; an overflow multiplies it by 0.5 and resets the growth tracker; 2000
//!   consecutive clean steps multiply it by 2 (only if the result is finite). Torch has no floor;
//!   here a scale that would fall below the smallest normal f32 (2^-126, where halving stops
//!   being exact and the run is dead anyway) is [`PrecisionError::ScaleAtMinimum`].
//! - **deepspeed** (`deepspeed/runtime/fp16/loss_scaler.py`, fp16 config defaults):
//!   `initial_scale_power` 16, `loss_scale_window` 1000, `hysteresis` 2, `min_loss_scale` 1,
//!   `consecutive_hysteresis` false. An overflow with hysteresis left only decrements it;
//!   otherwise the scale halves (never below the minimum), and an overflow when the scale
//!   already sits at the minimum is the error DeepSpeed raises. The scale doubles when
//!   `(iter - last_overflow_iter) % window == 0` after a clean step, which also restores the
//!   hysteresis (with `consecutive_hysteresis`, every clean step restores it).
//!
//! Either way every overflow skips the step. In data parallel the caller first reduces its local
//! "found inf" with `comm::Collective::any`, so all ranks skip together and their scalers stay
//! identical. The whole state is plain data ([`ScalerState`], serde) for snapshots.
//!
//! ```
//! use train::precision::{LossScaler, StepDecision};
//! let mut scaler = LossScaler::torch();
//! assert_eq!(scaler.scale(), 65536.0);
//! assert_eq!(scaler.update(true).unwrap(), StepDecision::Skip);
//! assert_eq!((scaler.scale(), scaler.state().skipped_steps), (32768.0, 1));
//! ```

use super::PrecisionError;
use serde::{Deserialize, Serialize};

/// What to do with this step's gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDecision {
    /// Gradients are finite: unscale them and run the optimizer.
    Apply,
    /// Some gradient overflowed (on some rank): leave weights and optimizer state untouched.
    Skip,
}

/// `torch.amp.GradScaler`'s knobs, with its names.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchScaling {
    pub init_scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u32,
}

impl Default for TorchScaling {
    fn default() -> Self {
        TorchScaling {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// DeepSpeed's `fp16` config block, with its names.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeepSpeedScaling {
    pub initial_scale_power: u32,
    pub loss_scale_window: u64,
    /// Overflows tolerated before backing off (DeepSpeed's `delayed_shift`).
    pub hysteresis: u32,
    pub consecutive_hysteresis: bool,
    pub min_loss_scale: f64,
    /// DeepSpeed's `scale_factor`, not exposed in its config.
    pub scale_factor: f64,
}

impl Default for DeepSpeedScaling {
    fn default() -> Self {
        DeepSpeedScaling {
            initial_scale_power: 16,
            loss_scale_window: 1000,
            hysteresis: 2,
            consecutive_hysteresis: false,
            min_loss_scale: 1.0,
            scale_factor: 2.0,
        }
    }
}

/// Which semantics, with its settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScalerConfig {
    Torch(TorchScaling),
    DeepSpeed(DeepSpeedScaling),
}

impl ScalerConfig {
    /// `torch` or `deepspeed`, as `--loss-scaler` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            ScalerConfig::Torch(_) => "torch",
            ScalerConfig::DeepSpeed(_) => "deepspeed",
        }
    }
}

/// `torch` or `deepspeed`, each with its library's defaults.
impl std::str::FromStr for ScalerConfig {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "torch" => Ok(ScalerConfig::Torch(TorchScaling::default())),
            "deepspeed" => Ok(ScalerConfig::DeepSpeed(DeepSpeedScaling::default())),
            _ => Err("use torch (GradScaler's defaults) or deepspeed (its fp16 block's)".into()),
        }
    }
}

impl std::fmt::Display for ScalerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that changes from step to step; restoring it resumes the scaler exactly.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalerState {
    /// The current loss scale (a power of two under both defaults).
    pub scale: f64,
    /// torch: consecutive clean steps since the last overflow or growth.
    pub growth_tracker: u32,
    /// deepspeed: `cur_iter`, updates so far.
    pub iter: u64,
    /// deepspeed: `last_overflow_iter` (-1 before the first overflow).
    pub last_overflow_iter: i64,
    /// deepspeed: `cur_hysteresis`, overflows left before the next back-off.
    pub hysteresis_left: u32,
    /// Steps skipped because of an overflow.
    pub skipped_steps: u64,
}

/// A dynamic loss scaler; see the module doc for the two semantics.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    config: ScalerConfig,
    state: ScalerState,
}

impl LossScaler {
    /// `torch.amp.GradScaler()` with its defaults.
    pub fn torch() -> LossScaler {
        Self::new(ScalerConfig::Torch(TorchScaling::default())).expect("defaults are valid")
    }

    /// DeepSpeed's dynamic loss scaler with the `fp16` config defaults.
    pub fn deepspeed() -> LossScaler {
        Self::new(ScalerConfig::DeepSpeed(DeepSpeedScaling::default())).expect("defaults are valid")
    }

    /// A scaler in its initial state; refuses settings that cannot scale.
    pub fn new(config: ScalerConfig) -> Result<LossScaler, PrecisionError> {
        check_config(&config)?;
        let state = match config {
            ScalerConfig::Torch(t) => ScalerState {
                scale: f64::from(t.init_scale),
                growth_tracker: 0,
                iter: 0,
                last_overflow_iter: -1,
                hysteresis_left: 0,
                skipped_steps: 0,
            },
            ScalerConfig::DeepSpeed(d) => ScalerState {
                scale: 2f64.powi(d.initial_scale_power as i32),
                growth_tracker: 0,
                iter: 0,
                last_overflow_iter: -1,
                hysteresis_left: d.hysteresis,
                skipped_steps: 0,
            },
        };
        Ok(LossScaler { config, state })
    }

    /// A scaler resumed from a snapshot's state.
    pub fn restore(config: ScalerConfig, state: ScalerState) -> Result<LossScaler, PrecisionError> {
        check_config(&config)?;
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(PrecisionError::InvalidScaler {
                field: "scale",
                reason: format!(
                    "the saved loss scale {} is not a positive number",
                    state.scale
                ),
            });
        }
        Ok(LossScaler { config, state })
    }

    pub fn config(&self) -> &ScalerConfig {
        &self.config
    }

    pub fn state(&self) -> &ScalerState {
        &self.state
    }

    /// The factor the loss is multiplied by before backward.
    pub fn scale(&self) -> f32 {
        self.state.scale as f32
    }

    /// The factor gradients are multiplied by to undo the scale (computed as torch does: the
    /// reciprocal in f64, rounded once; exact for a power of two).
    pub fn inv_scale(&self) -> f32 {
        (1.0 / self.state.scale) as f32
    }

    /// Records one step's outcome; `found_inf` must already be reduced over all ranks.
    /// Errs when an overflow happens with the scale at its minimum (the run cannot go on).
    pub fn update(&mut self, found_inf: bool) -> Result<StepDecision, PrecisionError> {
        match self.config {
            ScalerConfig::Torch(t) => self.update_torch(t, found_inf)?,
            ScalerConfig::DeepSpeed(d) => self.update_deepspeed(d, found_inf)?,
        }
        if found_inf {
            self.state.skipped_steps += 1;
            Ok(StepDecision::Skip)
        } else {
            Ok(StepDecision::Apply)
        }
    }

    /// `torch._amp_update_scale_`, in f32 as torch keeps the scale.
    fn update_torch(&mut self, t: TorchScaling, found_inf: bool) -> Result<(), PrecisionError> {
        let s = &mut self.state;
        let scale = s.scale as f32;
        if found_inf {
            let next = scale * t.backoff_factor;
            if !next.is_normal() {
                return Err(PrecisionError::ScaleAtMinimum {
                    scaler: "torch",
                    scale: f64::from(scale),
                    update: s.iter,
                });
            }
            s.scale = f64::from(next);
            s.growth_tracker = 0;
        } else {
            let successful = s.growth_tracker + 1;
            if successful == t.growth_interval {
                let next = scale * t.growth_factor;
                if next.is_finite() {
                    s.scale = f64::from(next);
                }
                s.growth_tracker = 0;
            } else {
                s.growth_tracker = successful;
            }
        }
        s.iter += 1;
        Ok(())
    }

    /// `DynamicLossScaler.update_scale`, line for line.
    fn update_deepspeed(
        &mut self,
        d: DeepSpeedScaling,
        overflow: bool,
    ) -> Result<(), PrecisionError> {
        let s = &mut self.state;
        if overflow {
            if d.hysteresis == 1 || s.hysteresis_left == 1 {
                if s.scale == d.min_loss_scale {
                    return Err(PrecisionError::ScaleAtMinimum {
                        scaler: "deepspeed",
                        scale: s.scale,
                        update: s.iter,
                    });
                }
                s.scale = (s.scale / d.scale_factor).max(d.min_loss_scale);
            } else {
                s.hysteresis_left -= 1;
            }
            s.last_overflow_iter = s.iter as i64;
        } else {
            if d.consecutive_hysteresis {
                s.hysteresis_left = d.hysteresis;
            }
            let since = s.iter as i64 - s.last_overflow_iter;
            if since % d.loss_scale_window as i64 == 0 {
                if !d.consecutive_hysteresis {
                    s.hysteresis_left = d.hysteresis;
                }
                s.scale *= d.scale_factor;
            }
        }
        s.iter += 1;
        Ok(())
    }
}

fn check_config(config: &ScalerConfig) -> Result<(), PrecisionError> {
    let bad =
        |field: &'static str, reason: String| Err(PrecisionError::InvalidScaler { field, reason });
    match *config {
        ScalerConfig::Torch(t) => {
            if !(t.init_scale.is_normal() && t.init_scale > 0.0) {
                return bad(
                    "init_scale",
                    format!("{} is not a positive normal f32", t.init_scale),
                );
            }
            if !(t.growth_factor > 1.0 && t.backoff_factor > 0.0 && t.backoff_factor < 1.0) {
                let reason = format!(
                    "growth {} must exceed 1 and backoff {} lie in (0, 1)",
                    t.growth_factor, t.backoff_factor
                );
                return bad("growth_factor", reason);
            }
            if t.growth_interval == 0 {
                return bad("growth_interval", "must be at least 1 step".into());
            }
        }
        ScalerConfig::DeepSpeed(d) => {
            if d.initial_scale_power > 127 {
                let reason = format!("2^{} overflows f32; use 32 or less", d.initial_scale_power);
                return bad("initial_scale_power", reason);
            }
            if d.loss_scale_window == 0 || d.hysteresis == 0 {
                return bad(
                    "loss_scale_window",
                    "window and hysteresis must be >= 1".into(),
                );
            }
            if !(d.min_loss_scale > 0.0 && d.scale_factor > 1.0) {
                let reason = format!(
                    "min_loss_scale {} must be positive and scale_factor {} exceed 1",
                    d.min_loss_scale, d.scale_factor
                );
                return bad("min_loss_scale", reason);
            }
        }
    }
    Ok(())
}
