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

/// Where one unit's update reads and writes: elements `base .. base + len` of the unit, found at
/// `params[params_at ..]` and `grads[grads_at ..]`, with optimizer state covering exactly them.
/// Stage 0 updates whole units (`base` 0); ZeRO stages 1-3 update this rank's shard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitSlice {
    pub params: BufId,
    pub params_at: usize,
    pub grads: BufId,
    pub grads_at: usize,
    pub base: usize,
    pub len: usize,
}

impl UnitSlice {
    /// The whole of unit `u` (no sharding).
    pub fn whole(model: &Model, arena: &Arena, u: usize) -> UnitSlice {
        let len = arena.f32(model.grads[u]).len();
        UnitSlice {
            params: model.params[u],
            params_at: 0,
            grads: model.grads[u],
            grads_at: 0,
            base: 0,
            len,
        }
    }
}

/// The sum of squared gradients over `slices`: per-chunk f64 partial sums added in chunk order,
/// then slices in order, so the result does not depend on the thread count.
pub fn grad_sum_sq(arena: &Arena, slices: &[UnitSlice]) -> f64 {
    slices
        .iter()
        .map(|s| {
            let grads = arena.f32(s.grads);
            let partials: Vec<f64> = grads[s.grads_at..s.grads_at + s.len]
                .par_chunks(CHUNK)
                .map(|c| c.iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>())
                .collect();
            partials.iter().sum::<f64>()
        })
        .sum()
}

/// The global L2 norm of all gradients of an unsharded model (padding is zero: it does not count).
pub fn grad_norm(model: &Model, arena: &Arena) -> f32 {
    let slices: Vec<_> = (0..model.units.len())
        .map(|u| UnitSlice::whole(model, arena, u))
        .collect();
    grad_sum_sq(arena, &slices).sqrt() as f32
}

/// Multiplies the gradients of `slices` by `scale`.
pub fn scale_grads(arena: &Arena, slices: &[UnitSlice], scale: f32) {
    for s in slices {
        arena.f32_mut(s.grads)[s.grads_at..s.grads_at + s.len]
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
    let slices: Vec<_> = (0..model.units.len())
        .map(|u| UnitSlice::whole(model, arena, u))
        .collect();
    update_slices(model, arena, state, &slices, kind, lr, step);
}

/// One update of the elements `slices` name (one per unit, in unit order). AdamW and SGD are
/// element-wise, so updating shards gives bit for bit the values of updating whole units.
pub fn update_slices(
    model: &Model,
    arena: &Arena,
    state: &[Vec<BufId>],
    slices: &[UnitSlice],
    kind: OptimizerKind,
    lr: f32,
    step: u32,
) {
    for (u, (unit, s)) in model.units.iter().zip(slices).enumerate() {
        let mut params = arena.f32_mut(s.params);
        let grads = arena.f32(s.grads);
        let mut bufs: Vec<_> = state[u].iter().map(|&id| arena.f32_mut(id)).collect();
        for view in &unit.views {
            // The part of the view inside this slice, in the slice's coordinates.
            let r = view_range(view);
            let (lo, hi) = (r.start.max(s.base), r.end.min(s.base + s.len));
            if lo >= hi {
                continue;
            }
            let local = lo - s.base..hi - s.base;
            let p = &mut params[s.params_at + local.start..s.params_at + local.end];
            let g = &grads[s.grads_at + local.start..s.grads_at + local.end];
            let decays = view.shape.len() == 2;
            step_view(kind, p, g, &mut bufs, local, decays, lr, step);
        }
    }
}

/// The update rule on one view's elements; `r` indexes the optimizer state.
#[allow(clippy::too_many_arguments)]
fn step_view(
    kind: OptimizerKind,
    p: &mut [f32],
    g: &[f32],
    bufs: &mut [crate::arena::ViewMut<'_, f32>],
    r: std::ops::Range<usize>,
    decays: bool,
    lr: f32,
    step: u32,
) {
    match (kind, bufs) {
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
