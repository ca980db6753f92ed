//! Seeded weight initialisation as GPT-2 / HF `_init_weights`: matrices and embeddings from
//! N(0, 0.02), residual output projections (attention `c_proj`/`o_proj`, MLP `c_proj`/`down_proj`)
//! from N(0, 0.02/sqrt(2L)), biases zero, norm weights one.
//!
//! The generator is SplitMix64 (the data crate's) with Box–Muller, so a seed gives the same
//! weights on every machine; it does not reproduce torch's generator (golden tests load torch's
//! weights instead). Each unit draws from its own stream (seed, unit index), so a unit's values do
//! not depend on the others' sizes.
//!
//! Example: `init::fill_unit(&model, 0, &mut host_buffer, 1337)`; the trainer and the runner
//! upload each unit where they keep it.

use crate::model::{view_range, Model};
use data::SplitMix64;
use plan_frugal::units::{Role, Unit};

/// Standard normal samples from SplitMix64 via Box–Muller.
pub struct Normal {
    rng: SplitMix64,
    spare: Option<f64>,
}

impl Normal {
    pub fn new(seed: u64) -> Normal {
        Normal {
            rng: SplitMix64::new(seed),
            spare: None,
        }
    }

    /// Uniform in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        // 53 random bits in (0, 1]: never 0, so ln is finite.
        ((self.rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    pub fn sample(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let r = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * angle.sin());
        r * angle.cos()
    }
}

/// Initialises unit `u` into `params` (the whole padded unit): the same values whether the unit
/// lives in the arena or, under ZeRO stage 3, is built on the host and cut into shards.
pub fn fill_unit(model: &Model, u: usize, params: &mut [f32], seed: u64) {
    fill(
        &model.units[u],
        u,
        model.config.shape.n_layers,
        params,
        seed,
    );
}

/// [`fill_unit`] for unit `unit`, the `u`-th of a model of `n_layers` blocks. LoRA adapters
/// start as PEFT's: A Kaiming-uniform (bound 1/√fan_in, torch's `kaiming_uniform_(a=√5)`), B
/// zero, so the adapted model starts equal to its base.
pub fn fill(unit: &Unit, u: usize, n_layers: u32, params: &mut [f32], seed: u64) {
    let std = 0.02;
    let residual_std = std / (2.0 * f64::from(n_layers)).sqrt();
    let mut normal = Normal::new(seed ^ (u as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    params.fill(0.0);
    for view in &unit.views {
        let p = &mut params[view_range(view)];
        match view.role {
            Role::Norm1Weight | Role::Norm2Weight | Role::FinalNormWeight => p.fill(1.0),
            Role::LoraA(_) => {
                let bound = 1.0 / (view.shape[1] as f64).sqrt();
                p.iter_mut()
                    .for_each(|x| *x = ((2.0 * normal.uniform() - 1.0) * bound) as f32);
            }
            Role::LoraB(_) => p.fill(0.0),
            Role::AttnProjWeight | Role::FcProjWeight => {
                p.iter_mut()
                    .for_each(|x| *x = (normal.sample() * residual_std) as f32);
            }
            _ if view.shape.len() == 2 => {
                p.iter_mut()
                    .for_each(|x| *x = (normal.sample() * std) as f32);
            }
            _ => p.fill(0.0),
        }
    }
}
