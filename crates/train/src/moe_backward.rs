//! The mixture-of-experts MLP's backward and load-balancing loss, from `engine::moe`'s forward
//! saves.

use crate::backward::{Grad, NormSaved};
use crate::TrainState;
use engine::arena::Arena;
use engine::backend::ops::ActivationBackward;
use engine::backend::MoeOp;
use engine::backend::TrainOps;
use engine::forward::{widened, Ctx};
use engine::model::{BlockActs, Model};
use engine::moe::{expert, expert_rows, must_t, rows, shape, tables, work};
use plan_frugal::acts::BlockDims;
use plan_frugal::units::Role;

/// In the head: the micro-batch's load-balancing loss from the forward's statistics, and the
/// gradient every router probability receives from it (weighted by the config's coefficient
/// and scaled like the token losses: `dloss` × the micro-batch's `n` tokens), into
/// `work.moe_aux`. A no-op for a dense model or a coefficient of 0.
pub fn balance<B: TrainOps>(
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
pub fn backward<B: TrainOps>(g: &Grad<'_, B>, a: &BlockActs) {
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
        engine::backend::moe_ops(be).moe(arena, &op);
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
    engine::backend::moe_ops(be).moe(arena, &op);
    let op = MoeOp::ScaleRows {
        x: dy,
        gates,
        route,
        shape: s,
        w: c,
    };
    engine::backend::moe_ops(be).moe(arena, &op);
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
    engine::backend::moe_ops(be).moe(arena, &op);
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
    engine::backend::moe_ops(be).moe(arena, &op);
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
fn shared_backward<B: TrainOps>(g: &Grad<'_, B>, a: &BlockActs, d: &BlockDims) {
    let s = d.shared as usize;
    let roles = [
        (Role::SharedFcWeight, Role::FcBias),
        (Role::SharedProjWeight, Role::FcProjBias),
    ];
    let saved = (must_t(a.shared_fch), must_t(a.shared_fch_act));
    g.mlp_into_dln(saved, (a.ln2, g.state.dresidual), roles, (2 * s, s));
}
