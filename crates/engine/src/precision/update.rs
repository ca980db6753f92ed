//! The bf16/fp16 optimizer step inside the trainer: the norm and overflow check over the 2-byte
//! accumulated gradients, and AdamW on the fp32 master weights writing the 2-byte working copy,
//! over the slices of each unit this rank updates (its shard at ZeRO stages 1-3).
//!
//! It does not decide whether to skip (the trainer asks the loss scaler, after every rank has
//! said whether it found an overflow) nor move bytes between ranks (`zero::Sharding`).
//!
//! Example: `let (sum_sq, inf) = grad_stats(arena, half, &slices);` then, unless skipped,
//! `master_update(model, arena, half, &states, &slices, step)` (or `unit_update` per unit with
//! the offload store's `UnitState`).

use super::master::{adamw_master_step, Grads, MasterStep, Working};
use crate::arena::{Arena, BufId};
use crate::model::{view_range, Model};
use crate::offload::UnitState;
use crate::optim::UnitSlice;
use crate::zero::{as_f16, as_f16_mut, Half};
use kernels::adamw::AdamW;
use plan::frugal::units::Unit;
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// Sum of squares (f64, chunk order, so independent of the thread count) and whether any value
/// is inf or NaN, over the 2-byte gradients `slices` name.
pub fn grad_stats(arena: &Arena, half: Half, slices: &[UnitSlice]) -> (f64, bool) {
    let mut sum_sq = 0.0f64;
    let mut found_inf = false;
    let mut buf = vec![0.0f32; CHUNK];
    for s in slices {
        let grads = arena.bf16(s.grads);
        for c in grads[s.grads_at..s.grads_at + s.len].chunks(CHUNK) {
            let x = &mut buf[..c.len()];
            half.widen(x, c);
            found_inf |= x.iter().any(|v| !v.is_finite());
            sum_sq += x.iter().map(|&g| f64::from(g) * f64::from(g)).sum::<f64>();
        }
    }
    (sum_sq, found_inf)
}

/// Every 2-byte gradient value of `slices`, widened (for the fp16 underflow report).
pub fn widened(arena: &Arena, half: Half, slices: &[UnitSlice]) -> Vec<f32> {
    let mut out = Vec::new();
    for s in slices {
        let grads = arena.bf16(s.grads);
        let g = &grads[s.grads_at..s.grads_at + s.len];
        let start = out.len();
        out.resize(start + g.len(), 0.0);
        half.widen(&mut out[start..], g);
    }
    out
}

/// Arena ids of one unit's master weights and Adam moments.
#[derive(Clone, Copy, Debug)]
pub struct MasterState {
    pub master: BufId,
    pub m: BufId,
    pub v: BufId,
}

/// One AdamW step of every slice, with master weights and moments in the device arena.
pub fn master_update(
    model: &Model,
    arena: &Arena,
    half: Half,
    states: &[MasterState],
    slices: &[UnitSlice],
    k: MasterStep,
) {
    for (u, (unit, s)) in model.units.iter().zip(slices).enumerate() {
        let st = states[u];
        let (mut master, mut m, mut v) = (
            arena.f32_mut(st.master),
            arena.f32_mut(st.m),
            arena.f32_mut(st.v),
        );
        let state = UnitState {
            master: &mut master,
            m: &mut m,
            v: &mut v,
        };
        unit_update(unit, s, arena, half, state, k);
    }
}

/// One AdamW step of one unit's slice `s`: `state` covers the slice's elements (in the device
/// arena or the host offload store); gradients are multiplied by `k.grad_multiplier`
/// (1 / loss scale × clip factor) first; the working copy gets the new master weights rounded.
/// Matrices decay, vectors do not (as `optim::update_slices`).
pub fn unit_update(
    unit: &Unit,
    s: &UnitSlice,
    arena: &Arena,
    half: Half,
    state: UnitState<'_>,
    k: MasterStep,
) {
    let (master, m, v) = (state.master, state.m, state.v);
    let mut params = arena.bf16_mut(s.params);
    let grads = arena.bf16(s.grads);
    {
        for view in &unit.views {
            let r = view_range(view);
            let (lo, hi) = (r.start.max(s.base), r.end.min(s.base + s.len));
            if lo >= hi {
                continue;
            }
            let l = lo - s.base..hi - s.base;
            let p = &mut params[s.params_at + l.start..s.params_at + l.end];
            let g = &grads[s.grads_at + l.start..s.grads_at + l.end];
            let decays = view.shape.len() == 2;
            let opt = AdamW {
                weight_decay: if decays { k.opt.weight_decay } else { 0.0 },
                ..k.opt
            };
            let step = MasterStep { opt, ..k };
            let (g, w) = match half {
                Half::Bf16 => (Grads::Bf16(g), Working::Bf16(p)),
                Half::F16 => (Grads::F16(as_f16(g)), Working::F16(as_f16_mut(p))),
            };
            let (mm, vv) = (&mut m[l.clone()], &mut v[l.clone()]);
            adamw_master_step(&mut master[l], mm, vv, g, Some(w), step);
        }
    }
}

/// Zeroes `xs` in parallel (Adam moments at start-up).
pub fn zero(xs: &mut [f32]) {
    xs.par_chunks_mut(CHUNK).for_each(|c| c.fill(0.0));
}
