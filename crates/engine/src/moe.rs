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
use crate::backend::{Backend, MoeOp, MoeShape, Tensor};
use crate::forward::{widened, Ctx};
use crate::model::{BlockActs, Model, MoeWork};
use plan_frugal::acts::BlockDims;
use plan_frugal::units::Role;
use std::ops::Range;

pub fn shape(d: &BlockDims) -> MoeShape {
    MoeShape {
        n: d.n as usize,
        k: d.top_k as usize,
        experts: d.experts as usize,
    }
}

/// This pass's probs, route and gates.
pub fn tables(a: &BlockActs, d: &BlockDims) -> (Tensor, Tensor, Tensor) {
    let s = shape(d);
    let must = |t: Option<Tensor>| t.expect("a MoE block keeps its routing");
    (
        must(a.probs).prefix(s.n * s.experts),
        must(a.route).prefix(d.route_len() as usize),
        must(a.gates).prefix(s.rows()),
    )
}

/// Each expert's rows of the sorted layout (read back from the routing tables: host metadata).
pub fn expert_rows<B: Backend>(arena: &Arena<B>, route: Tensor, s: MoeShape) -> Vec<Range<usize>> {
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

pub fn work(model: &Model) -> MoeWork {
    model.moe.expect("a MoE model has its workspaces")
}

/// Rows `r` of a row-major tensor `width` wide.
pub fn rows(t: Tensor, r: &Range<usize>, width: usize) -> Tensor {
    t.slice(r.start * width..r.end * width)
}

/// Expert `x`'s matrix in a view of E stacked (rows, cols) matrices.
pub fn expert(t: Tensor, x: usize, numel: usize) -> Tensor {
    t.slice(x * numel..(x + 1) * numel)
}

/// The MoE MLP of one block: from `ln2` (written by `norm2`) to `out` = res2 + Σ gate · expert.
/// With `write_out` false (a recompute of a segment's last block, whose output is kept) it stops
/// after the activation; `forward_pass` adds to the load-balancing statistics.
/// `res2` and `out` are the residual stream's f32 rows (the saved tensors, or under bf16 their
/// working rows, rounded into the saved ones by the caller).
pub fn forward<B: Backend>(
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
    crate::backend::moe_ops(be).moe(arena, &op);
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
    crate::backend::moe_ops(be).moe(arena, &gather);
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
    crate::backend::moe_ops(be).moe(arena, &op);
    if d.shared > 0 {
        // The shared experts' output joins the routed one (through the free expert-order rows).
        let y = w.rows_out.prefix(n * c);
        let sh = d.shared as usize;
        let act = must_t(a.shared_fch_act).prefix(n * sh);
        cx.dense(y, act, cx.w(Role::SharedProjWeight), None, (n, sh));
        be.residual_add(arena, out.prefix(n * c), y);
    }
}

pub fn must_t(t: Option<Tensor>) -> Tensor {
    t.expect("the plan keeps the shared experts' tensors")
}

/// The shared experts' SwiGLU activation from their saved gate|up output.
pub fn shared_activation<B: Backend>(cx: &Ctx<'_, B>, a: &BlockActs) {
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
