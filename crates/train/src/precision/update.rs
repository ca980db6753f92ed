//! The bf16/fp16 optimizer step inside the trainer: the norm and overflow check over the 2-byte
//! accumulated gradients, and AdamW on the fp32 master weights writing the 2-byte working copy,
//! over the slices of each unit this rank updates (its shard at ZeRO stages 1-3), as backend ops.
//!
//! It does not decide whether to skip (the trainer asks the loss scaler, after every rank has
//! said whether it found an overflow) nor move bytes between ranks (`zero::Sharding`).
//!
//! Example: `let (sum_sq, inf) = grad_stats(arena, &slices);` then, unless skipped,
//! `master_update(model, arena, &states, &slices, step)` (or `unit_update_host` per unit with
//! the offload store's `UnitState`).

use super::master::MasterStep;
use crate::offload::UnitState;
use crate::optim::UnitSlice;
use crate::MasterState;
use engine::arena::Arena;
use engine::backend::TrainOps;
use engine::backend::{DType, MasterAdamW, MasterAdamWHost};
use engine::model::{view_range, Model};
use kernels::adamw::AdamW;
use plan_frugal::units::{ParamView, Unit};

/// Sum of squares (f64, chunk order, so independent of the thread count) and whether any value
/// is inf or NaN, over the 2-byte gradients `slices` name.
pub fn grad_stats<B: TrainOps>(arena: &Arena<B>, slices: &[UnitSlice]) -> (f64, bool) {
    let (mut sum_sq, mut found_inf) = (0.0f64, false);
    for s in slices {
        let (sum, inf) = arena.backend().sum_squares(arena, s.grads, sum_sq);
        (sum_sq, found_inf) = (sum, found_inf | inf);
    }
    (sum_sq, found_inf)
}

/// `k` for view `view`: matrices decay, vectors do not (as `optim::update_slices`).
fn view_step(view: &ParamView, k: MasterStep) -> MasterStep {
    let decays = view.shape.len() == 2;
    let opt = AdamW {
        weight_decay: if decays { k.opt.weight_decay } else { 0.0 },
        ..k.opt
    };
    MasterStep { opt, ..k }
}

/// One AdamW step of every slice, with master weights and moments in the device arena.
pub fn master_update<B: TrainOps>(
    model: &Model,
    arena: &Arena<B>,
    states: &[MasterState],
    slices: &[UnitSlice],
    k: MasterStep,
) {
    for (u, (unit, s)) in model.units.iter().zip(slices).enumerate() {
        let st = states[u];
        let f32_of = |id| arena.tensor(id, DType::F32);
        let (master, m, v) = (f32_of(st.master), f32_of(st.m), f32_of(st.v));
        for view in &unit.views {
            let Some(l) = s.local(view_range(view)) else {
                continue;
            };
            let op = MasterAdamW {
                master: master.slice(l.clone()),
                m: m.slice(l.clone()),
                v: v.slice(l.clone()),
                grads: s.grads.slice(l.clone()),
                working: s.params.slice(l),
                step: view_step(view, k),
            };
            arena.backend().master_adamw(arena, &op);
        }
    }
}

/// One AdamW step of one unit's slice `s` with `state` (the slice's elements) in host memory:
/// gradients are multiplied by `k.grad_multiplier` (1 / loss scale × clip factor) first; the
/// working copy gets the new master weights rounded.
pub fn unit_update_host<B: TrainOps>(
    unit: &Unit,
    s: &UnitSlice,
    arena: &Arena<B>,
    state: UnitState<'_>,
    k: MasterStep,
) {
    let (master, m, v) = (state.master, state.m, state.v);
    for view in &unit.views {
        let Some(l) = s.local(view_range(view)) else {
            continue;
        };
        let op = MasterAdamWHost {
            master: &mut master[l.clone()],
            m: &mut m[l.clone()],
            v: &mut v[l.clone()],
            grads: s.grads.slice(l.clone()),
            working: s.params.slice(l),
            step: view_step(view, k),
        };
        arena.backend().master_adamw_host(arena, op);
    }
}
