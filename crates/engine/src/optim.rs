//! The optimizer step and its schedule: AdamW or SGD with momentum over every parameter unit,
//! warmup then cosine learning rate, clipping by the global gradient norm.
//!
//! Weight decay applies to matrices (embeddings and projections), not to biases or norm weights
//! (nanoGPT's grouping: `p.dim() >= 2`). Clipping follows `torch.nn.utils.clip_grad_norm_`:
//! scale = max_norm / (norm + 1e-6), applied only when below 1. The state buffers are the plan's
//! `opt.*` buffers; nothing is allocated here.
//!
//! Example: `Schedule { lr: 6e-4, warmup_steps: 10, total_steps: 300, min_lr_ratio: 0.1 }.lr_at(0)`
//! is 6e-5 (step 1 of 10 of warmup).

use crate::arena::{Arena, BufId};
use crate::model::{view_range, Model};
use kernels::{adamw, sgd};
use rayon::prelude::*;

/// Elements per rayon task in the norm and scaling passes (memory bound: big chunks).
const CHUNK: usize = 1 << 16;

/// Which update rule, with its hyperparameters (learning rate comes from the schedule).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    AdamW {
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    },
    Sgd {
        momentum: f32,
        weight_decay: f32,
    },
}

impl OptimizerKind {
    /// GPT-2/nanoGPT's AdamW: betas (0.9, 0.95), eps 1e-8, weight decay 0.1.
    pub fn adamw_default() -> OptimizerKind {
        OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }

    pub fn plan_optimizer(self) -> plan::setup::Optimizer {
        match self {
            OptimizerKind::AdamW { .. } => plan::setup::Optimizer::AdamW,
            OptimizerKind::Sgd { .. } => plan::setup::Optimizer::Sgd,
        }
    }
}

/// Linear warmup to `lr`, then cosine decay to `lr * min_lr_ratio` at `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub lr: f32,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub min_lr_ratio: f32,
}

impl Schedule {
    /// A constant learning rate (golden tests compare against torch without a scheduler).
    pub fn constant(lr: f32) -> Schedule {
        Schedule {
            lr,
            warmup_steps: 0,
            total_steps: 0,
            min_lr_ratio: 1.0,
        }
    }

    /// Learning rate of the 0-based `step`.
    pub fn lr_at(&self, step: u64) -> f32 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f32 / self.warmup_steps as f32;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps);
        if decay_steps == 0 {
            return self.lr;
        }
        let progress = ((step - self.warmup_steps) as f32 / decay_steps as f32).min(1.0);
        let coeff = 0.5 * (1.0 + (std::f32::consts::PI * progress).cos());
        let min_lr = self.lr * self.min_lr_ratio;
        min_lr + coeff * (self.lr - min_lr)
    }
}

/// The global L2 norm of all gradients (padding is zero, so it does not count).
pub fn grad_norm(model: &Model, arena: &Arena) -> f32 {
    let sum_sq: f64 = model
        .grads
        .iter()
        .map(|&id| {
            // Per-chunk f64 partial sums, added in chunk order: the same result on any thread count.
            let partials: Vec<f64> = arena
                .f32(id)
                .par_chunks(CHUNK)
                .map(|c| c.iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>())
                .collect();
            partials.iter().sum::<f64>()
        })
        .sum();
    sum_sq.sqrt() as f32
}

/// Multiplies every gradient by `scale`.
pub fn scale_grads(model: &Model, arena: &Arena, scale: f32) {
    for &id in &model.grads {
        arena
            .f32_mut(id)
            .par_chunks_mut(CHUNK)
            .for_each(|c| c.iter_mut().for_each(|g| *g *= scale));
    }
}

/// Arena ids of each unit's optimizer state, in the plan's order.
pub fn state_ids(model: &Model, arena: &Arena, kind: OptimizerKind) -> Vec<Vec<BufId>> {
    let optimizer = kind.plan_optimizer();
    model
        .units
        .iter()
        .map(|u| {
            plan::frugal::optimizer_buffer_names(optimizer, &u.name)
                .iter()
                .map(|name| arena.id(name))
                .collect()
        })
        .collect()
}

/// One update of every parameter with learning rate `lr`; `step` is 1-based (bias correction).
pub fn update(
    model: &Model,
    arena: &Arena,
    state: &[Vec<BufId>],
    kind: OptimizerKind,
    lr: f32,
    step: u32,
) {
    for (u, unit) in model.units.iter().enumerate() {
        let mut params = arena.f32_mut(model.params[u]);
        let grads = arena.f32(model.grads[u]);
        let mut bufs: Vec<_> = state[u].iter().map(|&id| arena.f32_mut(id)).collect();
        for view in &unit.views {
            let r = view_range(view);
            let decays = view.shape.len() == 2;
            let (p, g) = (&mut params[r.clone()], &grads[r.clone()]);
            match (kind, bufs.as_mut_slice()) {
                (
                    OptimizerKind::AdamW {
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    },
                    [m, v],
                ) => {
                    let weight_decay = if decays { weight_decay } else { 0.0 };
                    let opt = adamw::AdamW {
                        lr,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    };
                    adamw::update(p, g, &mut m[r.clone()], &mut v[r], opt, step);
                }
                (
                    OptimizerKind::Sgd {
                        momentum,
                        weight_decay,
                    },
                    [buf],
                ) => {
                    let weight_decay = if decays { weight_decay } else { 0.0 };
                    let opt = sgd::Sgd {
                        lr,
                        momentum,
                        weight_decay,
                    };
                    sgd::update(p, g, &mut buf[r], opt);
                }
                _ => unreachable!("optimizer state matches the plan's optimizer"),
            }
        }
    }
}
