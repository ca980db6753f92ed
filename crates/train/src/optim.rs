//! The optimizer step and its schedule: AdamW or SGD with momentum over every parameter unit,
//! warmup then cosine learning rate, clipping by the global gradient norm.
//!
//! Weight decay applies to matrices (embeddings and projections), not to biases or norm weights
//! (nanoGPT's grouping: `p.dim() >= 2`). Clipping follows `torch.nn.utils.clip_grad_norm_`:
//! scale = max_norm / (norm + 1e-6), applied only when below 1. The state buffers are the plan's
//! `opt.*` buffers; nothing is allocated here, and the arithmetic is the backend's ops.
//!
//! Example: `Schedule { lr: 6e-4, warmup_steps: 10, total_steps: 300, min_lr_ratio: 0.1 }.lr_at(0)`
//! is 6e-5 (step 1 of 10 of warmup).

use engine::arena::{Arena, BufId};
use engine::backend::TrainOps;
use engine::backend::{AdamW, DType, Sgd, Tensor};
use engine::model::{view_range, Model};

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

/// Where one unit's update reads and writes: elements `base .. base + params.len` of the unit,
/// found at `params` and `grads` (tensors of exactly those elements), with optimizer state
/// covering exactly them. Stage 0 updates whole units (`base` 0); ZeRO stages 1-3 update this
/// rank's shard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitSlice {
    pub params: Tensor,
    pub grads: Tensor,
    pub base: usize,
}

impl UnitSlice {
    /// Elements of the slice.
    pub fn len(&self) -> usize {
        self.params.len
    }

    pub fn is_empty(&self) -> bool {
        self.params.len == 0
    }

    /// The elements `r` of this slice (in its coordinates).
    pub fn part(&self, r: std::ops::Range<usize>) -> UnitSlice {
        UnitSlice {
            params: self.params.slice(r.clone()),
            grads: self.grads.slice(r.clone()),
            base: self.base + r.start,
        }
    }

    /// The part of parameter view `v` (a range of the unit) inside this slice, in the slice's
    /// coordinates (`None` when they do not meet).
    pub fn local(&self, v: std::ops::Range<usize>) -> Option<std::ops::Range<usize>> {
        let (lo, hi) = (v.start.max(self.base), v.end.min(self.base + self.len()));
        (lo < hi).then(|| lo - self.base..hi - self.base)
    }
}

/// The sum of squared gradients over `slices`: per-chunk f64 partial sums added in chunk order,
/// then slices in order, so the result does not depend on the thread count.
pub fn grad_sum_sq<B: TrainOps>(arena: &Arena<B>, slices: &[UnitSlice]) -> f64 {
    let be = arena.backend();
    slices
        .iter()
        .map(|s| be.sum_squares(arena, s.grads, 0.0).0)
        .sum()
}

/// Multiplies the gradients of `slices` by `scale`.
pub fn scale_grads<B: TrainOps>(arena: &Arena<B>, slices: &[UnitSlice], scale: f32) {
    for s in slices {
        arena.backend().scale(arena, s.grads, scale);
    }
}

/// One update of the elements `slices` name (one per unit, in unit order; `state` holds each
/// unit's optimizer buffers). AdamW and SGD are element-wise, so updating shards gives bit for
/// bit the values of updating whole units. `step` is 1-based (bias correction).
pub fn update_slices<B: TrainOps>(
    model: &Model,
    arena: &Arena<B>,
    state: &[Vec<BufId>],
    slices: &[UnitSlice],
    kind: OptimizerKind,
    lr: f32,
    step: u32,
) {
    let be = arena.backend();
    for (u, (unit, s)) in model.units.iter().zip(slices).enumerate() {
        let opt = |k: usize| arena.tensor(state[u][k], DType::F32);
        for view in &unit.views {
            let Some(local) = s.local(view_range(view)) else {
                continue;
            };
            let (params, grads) = (s.params.slice(local.clone()), s.grads.slice(local.clone()));
            let decays = view.shape.len() == 2;
            match kind {
                OptimizerKind::AdamW {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                } => {
                    let weight_decay = if decays { weight_decay } else { 0.0 };
                    let op = AdamW {
                        params,
                        grads,
                        m: opt(0).slice(local.clone()),
                        v: opt(1).slice(local),
                        opt: kernels::adamw::AdamW::new(lr, (beta1, beta2), eps, weight_decay),
                        step,
                    };
                    be.adamw(arena, &op);
                }
                OptimizerKind::Sgd {
                    momentum,
                    weight_decay,
                } => {
                    let weight_decay = if decays { weight_decay } else { 0.0 };
                    let op = Sgd {
                        params,
                        grads,
                        momentum: opt(0).slice(local),
                        opt: kernels::sgd::Sgd {
                            lr,
                            momentum,
                            weight_decay,
                        },
                    };
                    be.sgd(arena, &op);
                }
            }
        }
    }
}
