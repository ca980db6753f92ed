//! A mixture-of-experts MLP (Mixtral) as backend ops, in the forward and the backward: the
//! router (a linear layer to E logits, softmax, top-k, gates renormalised over the k choices),
//! the dropless expert-order layout of `kernels::moe` (N·k rows whatever the routing, so the
//! plan's buffers are static: the plan sizes `fch`, `fch_act` and their gradients for N·k rows),
//! each expert's SwiGLU MLP as plain `Linear` ops on its rows, and the gated sum back into
//! token order. Nothing is dropped: no capacity factor, no overflow.
//!
//! Saved for the backward: `probs`, `route`, `gates` (4 bytes each) and, as for a dense MLP,
//! `ln2`, `fch` and `fch_act` (N·k rows). The experts' outputs are not kept: the backward
//! reruns the down projections into `work.moe_in` for the gates' gradient (one expert GEMM in
//! ten, instead of N·k·C floats per block). The load-balancing loss (HF's
//! `load_balancing_loss_func`: counts and probability sums over every MoE layer's rows) is
//! accumulated by the forward pass in `work.moe_aux`; its gradient, E·countₑ / rows² for every
//! probability, is set in the head and added in each router's backward.
//!
//! Example: `forward::block_with` calls `moe::forward(&cx, acts, write_out, forward_pass)` in
//! place of the dense MLP.

use crate::arena::Arena;
use crate::backend::ops::Activation;
use crate::backend::ops::ActivationBackward;
use crate::backend::{Backend, MoeOp, MoeShape, Tensor};
use crate::backward::{Grad, NormSaved};
use crate::forward::{widened, Ctx};
use crate::model::{BlockActs, Model, MoeWork};
use crate::train::TrainState;
use plan::frugal::acts::BlockDims;
use plan::frugal::units::Role;
use std::ops::Range;

fn shape(d: &BlockDims) -> MoeShape {
    MoeShape {
        n: d.n as usize,
        k: d.top_k as usize,
        experts: d.experts as usize,
    }
}

/// This pass's probs, route and gates.
fn tables(a: &BlockActs, d: &BlockDims) -> (Tensor, Tensor, Tensor) {
    let s = shape(d);
    let must = |t: Option<Tensor>| t.expect("a MoE block keeps its routing");
    (
        must(a.probs).prefix(s.n * s.experts),
        must(a.route).prefix(d.route_len() as usize),
        must(a.gates).prefix(s.rows()),
    )
}

/// Each expert's rows of the sorted layout (read back from the routing tables: host metadata).
pub(crate) fn expert_rows<B: Backend>(
    arena: &Arena<B>,
    route: Tensor,
    s: MoeShape,
) -> Vec<Range<usize>> {
    let at = 3 * s.rows();
    let offsets = route.slice(at..at + s.experts + 1);
    let mut bytes = vec![0u8; 4 * offsets.len];
    arena.backend().download_bytes(arena, offsets, &mut bytes);
    let o: Vec<usize> = bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    (0..s.experts).map(|x| o[x]..o[x + 1]).collect()
}

fn work(model: &Model) -> MoeWork {
    model.moe.expect("a MoE model has its workspaces")
}

/// Rows `r` of a row-major tensor `width` wide.
fn rows(t: Tensor, r: &Range<usize>, width: usize) -> Tensor {
    t.slice(r.start * width..r.end * width)
}

/// Expert `x`'s matrix in a view of E stacked (rows, cols) matrices.
fn expert(t: Tensor, x: usize, numel: usize) -> Tensor {
    t.slice(x * numel..(x + 1) * numel)
}

/// The MoE MLP of one block: from `ln2` (written by `norm2`) to `out` = res2 + Σ gate · expert.
/// With `write_out` false (a recompute of a segment's last block, whose output is kept) it stops
/// after the activation; `forward_pass` adds to the load-balancing statistics.
/// `res2` and `out` are the residual stream's f32 rows (the saved tensors, or under bf16 their
/// working rows, rounded into the saved ones by the caller).
pub(crate) fn forward<B: Backend>(
    cx: &Ctx<'_, B>,
    a: &BlockActs,
    (res2, out): (Tensor, Tensor),
    write_out: bool,
    count: bool,
) {
    let (model, arena, be, d) = (cx.model, cx.arena, cx.be, cx.d);
    let w = work(model);
    let s = shape(&d);
    let (n, c, fc, f) = (s.n, d.c as usize, d.fc as usize, d.fc_act as usize);
    let (probs, route, gates) = tables(a, &d);
    cx.dense(probs, a.ln2, cx.w(Role::RouterWeight), None, (n, c));
    let aux = count.then(|| w.aux.prefix(2 * s.experts));
    let op = MoeOp::Route {
        probs,
        gates,
        route,
        shape: s,
        routing: model.config.routing,
        aux,
    };
    be.moe(arena, &op);
    let experts = expert_rows(arena, route, s);
    let rows_in = w.rows_in.prefix(s.rows() * c);
    let src = a.ln2.prefix(n * c);
    let gather = MoeOp::Gather {
        dst: rows_in,
        src,
        route,
        shape: s,
        c,
    };
    be.moe(arena, &gather);
    let w_fc = cx.w(Role::ExpertsFcWeight);
    for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let out = rows(a.fch, r, fc);
        let weight = expert(w_fc, x, fc * c);
        cx.produce(out, r.len() * fc, |dst| {
            cx.dense(dst, rows(rows_in, r, c), weight, None, (r.len(), c))
        });
    }
    cx.activation(a);
    if d.shared > 0 {
        let width = 2 * d.shared as usize;
        cx.produce(must_t(a.shared_fch), n * width, |dst| {
            cx.dense(dst, a.ln2, cx.w(Role::SharedFcWeight), None, (n, c))
        });
        shared_activation(cx, a);
    }
    if !write_out {
        return;
    }
    let w_proj = cx.w(Role::ExpertsProjWeight);
    let y = w.rows_out.prefix(s.rows() * c);
    for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let weight = expert(w_proj, x, c * f);
        let inp = rows(a.fch_act, r, f);
        cx.dense(rows(y, r, c), inp, weight, None, (r.len(), f));
    }
    let op = MoeOp::Combine {
        out: out.prefix(n * c),
        residual: Some(res2.prefix(n * c)),
        y,
        gates: Some(gates),
        route,
        shape: s,
        c,
    };
    be.moe(arena, &op);
    if d.shared > 0 {
        // The shared experts' output joins the routed one (through the free expert-order rows).
        let y = w.rows_out.prefix(n * c);
        let sh = d.shared as usize;
        let act = must_t(a.shared_fch_act).prefix(n * sh);
        cx.dense(y, act, cx.w(Role::SharedProjWeight), None, (n, sh));
        be.residual_add(arena, out.prefix(n * c), y);
    }
}

fn must_t(t: Option<Tensor>) -> Tensor {
    t.expect("the plan keeps the shared experts' tensors")
}

/// The shared experts' SwiGLU activation from their saved gate|up output.
pub(crate) fn shared_activation<B: Backend>(cx: &Ctx<'_, B>, a: &BlockActs) {
    let (n, s) = (cx.d.n as usize, cx.d.shared as usize);
    let inp = widened(
        cx.arena,
        must_t(a.shared_fch),
        n * 2 * s,
        cx.model.work.f32_in,
    );
    cx.produce(must_t(a.shared_fch_act), n * s, |out| {
        let op = Activation {
            out,
            inp,
            kind: cx.model.design.mlp,
            n,
            width: s,
        };
        cx.be.activation(cx.arena, &op);
    });
}

/// In the head: the micro-batch's load-balancing loss from the forward's statistics, and the
/// gradient every router probability receives from it (weighted by the config's coefficient
/// and scaled like the token losses: `dloss` × the micro-batch's `n` tokens), into
/// `work.moe_aux`. A no-op for a dense model or a coefficient of 0.
pub(crate) fn balance<B: Backend>(
    model: &Model,
    state: &TrainState,
    arena: &Arena<B>,
    n: usize,
    dloss: f32,
) {
    let (Some(w), coef) = (model.moe, model.config.router_aux_coef) else {
        return;
    };
    let e = model.config.shape.moe.as_ref().map_or(0, |m| m.n_experts) as usize;
    let mut stats = vec![0.0f32; 2 * e];
    let be = arena.backend();
    be.download(arena, w.aux.prefix(2 * e), &mut stats);
    let first = model.config.shape.moe.as_ref().map_or(0, |m| m.first_dense);
    let layers = f64::from(model.config.shape.n_layers - first);
    let mut dprob = vec![0.0f32; e];
    let loss = kernels::moe::balance_loss(&stats, e, layers * n as f64, &mut dprob);
    state.balance_loss.set(loss as f32);
    let scale = coef * n as f32 * dloss;
    dprob.iter_mut().for_each(|g| *g *= scale);
    be.upload(arena, w.aux.slice(2 * e..3 * e), &dprob);
}

/// The MoE MLP's backward: turns d(out) in `dresidual` into d(res2), accumulating the router's
/// and every expert's weight gradients.
pub(crate) fn backward<B: Backend>(g: &Grad<'_, B>, a: &BlockActs) {
    let (model, state, arena, be) = (g.model, g.state, g.arena, g.be);
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let cx = Ctx::new(model, arena, g.layer(), b, t);
    let d = cx.d;
    let w = work(model);
    let s = shape(&d);
    let (n, c, fc, f, nk) = (
        s.n,
        d.c as usize,
        d.fc as usize,
        d.fc_act as usize,
        s.rows(),
    );
    let (probs, route, gates) = tables(a, &d);
    let experts = expert_rows(arena, route, s);
    let (dgates, dprobs) = (
        state.dgates.expect("MoE gradients").prefix(nk),
        state.dprobs.expect("MoE gradients").prefix(n * s.experts),
    );
    let dres = state.dresidual.prefix(n * c);
    let dy = w.rows_out.prefix(nk * c);
    let gather = |dst, src| {
        let op = MoeOp::Gather {
            dst,
            src,
            route,
            shape: s,
            c,
        };
        be.moe(arena, &op);
    };
    gather(dy, dres);
    // The experts' outputs again (into work.moe_in) for the gates' gradient.
    let (w_fc, w_proj) = (g.w(Role::ExpertsFcWeight), g.w(Role::ExpertsProjWeight));
    let grad = |role| g.g(role).expect("a trained expert");
    let (g_fc, g_proj) = (grad(Role::ExpertsFcWeight), grad(Role::ExpertsProjWeight));
    let y = w.rows_in.prefix(nk * c);
    for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let weight = expert(w_proj, x, c * f);
        let inp = rows(a.fch_act, r, f);
        cx.produce(rows(y, r, c), r.len() * c, |dst| {
            cx.dense(dst, inp, weight, None, (r.len(), f))
        });
    }
    be.fill(arena, dgates, 0.0);
    let op = MoeOp::GateGrads {
        dgates,
        a: dy,
        b: y,
        route,
        shape: s,
        w: c,
    };
    be.moe(arena, &op);
    let op = MoeOp::ScaleRows {
        x: dy,
        gates,
        route,
        shape: s,
        w: c,
    };
    be.moe(arena, &op);
    let dfch_act = state.dfch_act.prefix(nk * f);
    be.fill(arena, dfch_act, 0.0);
    for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let weights = (expert(w_proj, x, c * f), expert(g_proj, x, c * f));
        let (dinp, inp) = (rows(dfch_act, r, f), rows(a.fch_act, r, f));
        g.dense(dinp, rows(dy, r, c), inp, weights, None, (r.len(), f));
    }
    let fch = widened(arena, a.fch, nk * fc, model.work.f32_in);
    let dfch = state.dfch.prefix(nk * fc);
    be.fill(arena, dfch, 0.0);
    let op = ActivationBackward {
        dinp: dfch,
        inp: fch,
        dout: dfch_act,
        kind: model.design.mlp,
        n: nk,
        width: f,
    };
    be.activation_backward(arena, &op);
    let xs = w.rows_in.prefix(nk * c);
    gather(xs, a.ln2.prefix(n * c));
    let dxs = w.rows_out.prefix(nk * c);
    be.fill(arena, dxs, 0.0);
    for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let weights = (expert(w_fc, x, fc * c), expert(g_fc, x, fc * c));
        let dout = rows(dfch, r, fc);
        g.dense(
            rows(dxs, r, c),
            dout,
            rows(xs, r, c),
            weights,
            None,
            (r.len(), c),
        );
    }
    let dln = state.dln.prefix(n * c);
    be.fill(arena, dln, 0.0);
    let op = MoeOp::Combine {
        out: dln,
        residual: None,
        y: dxs,
        gates: None,
        route,
        shape: s,
        c,
    };
    be.moe(arena, &op);
    if d.shared > 0 {
        shared_backward(g, a, &d);
    }
    be.fill(arena, dprobs, 0.0);
    let e = s.experts;
    let on = model.config.router_aux_coef > 0.0;
    let op = MoeOp::RouteBackward {
        dlogits: dprobs,
        dgates,
        probs,
        route,
        shape: s,
        gating: model.config.routing.gating,
        dprob: on.then(|| w.aux.slice(2 * e..3 * e)),
    };
    be.moe(arena, &op);
    let router = (g.w(Role::RouterWeight), grad(Role::RouterWeight));
    g.dense(dln, dprobs, a.ln2, router, None, (n, c));
    let saved = NormSaved {
        mean: a.ln2_mean,
        rstd: a.ln2_rstd,
    };
    let norm2 = (Role::Norm2Weight, Role::Norm2Bias);
    g.norm(state.dresidual, state.dln, a.res2, norm2, saved);
}

/// The shared experts' backward: their weight gradients, and their input gradient added to
/// `dact.ln` (d(out) is `dresidual`). Their units have no MLP biases.
fn shared_backward<B: Backend>(g: &Grad<'_, B>, a: &BlockActs, d: &BlockDims) {
    let s = d.shared as usize;
    let roles = [
        (Role::SharedFcWeight, Role::FcBias),
        (Role::SharedProjWeight, Role::FcProjBias),
    ];
    let saved = (must_t(a.shared_fch), must_t(a.shared_fch_act));
    g.mlp_into_dln(saved, (a.ln2, g.state.dresidual), roles, (2 * s, s));
}
