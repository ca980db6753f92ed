//! A mixture-of-experts MLP in an inference step (Mixtral): the router in fp32 (its weights are
//! kept as fp32, as llama.cpp keeps `ffn_gate_inp`), top-k with the training engine's kernels,
//! the step's rows gathered into expert order, each expert's quantized gate|up and down matrices
//! run as `qlinear` on its rows (a row range of the stacked matrix: every storage format keeps
//! a row's codes and scales together), the gated sum back into token order, and the shared
//! experts beside them (DeepSeek). Dropless as in training: N·k routed rows per step.
//!
//! Example: `step::run` calls `self.moe_mlp(kind, weights, n, ln, proj)` for a MoE layer.

use super::{step_tensor, UnitWeights, Worker};
use engine::backend::ops::Activation;
use engine::backend::InferOps;
use engine::backend::{MoeOp, MoeShape, QLinear, QMatrix, Tensor};
use plan_frugal::units::Role;
use plan_frugal::{StepAct, StepKind};
use std::ops::Range;

/// Rows `r` of a stored matrix (its codes, scales and zero points per row).
fn rows_of(m: QMatrix, r: Range<usize>) -> QMatrix {
    // The ranges a backend's own layout was decided by (`QMatrix::row_block`).
    assert!(
        r.start % m.row_block == 0 && r.len() == m.row_block,
        "an expert's rows"
    );
    let part = |t: Tensor| {
        assert_eq!(t.len % m.rows, 0, "a matrix's storage is whole rows");
        let per = t.len / m.rows;
        t.slice(r.start * per..r.end * per)
    };
    QMatrix {
        codes: part(m.codes),
        scales: m.scales.map(part),
        zeros: m.zeros.map(part),
        rows: r.len(),
        row_block: r.len(),
        ..m
    }
}

impl<B: InferOps> Worker<B> {
    /// Whether block `l` has a mixture of experts.
    pub(crate) fn is_moe(&self, l: u32) -> bool {
        self.design.moe
            && self
                .config
                .shape
                .moe
                .as_ref()
                .is_some_and(|e| l >= e.first_dense)
    }

    /// proj (n, C) := the MoE MLP of `ln`'s rows.
    pub(crate) fn moe_mlp(
        &self,
        kind: StepKind,
        w: &UnitWeights,
        n: usize,
        ln: Tensor,
        proj: Tensor,
    ) {
        let (a, be) = (&self.arena, self.arena.backend());
        let s = &self.config.shape;
        let e = s.moe.as_ref().expect("a MoE layer");
        let c = s.d_model as usize;
        let shape = MoeShape {
            n,
            k: e.n_active as usize,
            experts: e.n_experts as usize,
        };
        let get = |t| step_tensor(a, kind, t).expect("a MoE step tensor");
        let probs = get(StepAct::Probs).prefix(n * shape.experts);
        let route_len = 3 * shape.rows() + shape.experts + 1;
        let route = get(StepAct::Route).prefix(route_len);
        let gates = get(StepAct::Gates).prefix(shape.rows());
        let (rows_in, rows_out) = (get(StepAct::MoeIn), get(StepAct::MoeOut));
        let (fch, fch_act) = (get(StepAct::Fch), get(StepAct::FchAct));
        let ln = ln.prefix(n * c);
        let linear = |out: Tensor, inp: Tensor, weight: QMatrix, rows: usize| {
            let op = QLinear {
                out,
                inp,
                weight,
                bias: None,
                n: rows,
            };
            be.qlinear(a, &op);
        };
        let router = QMatrix {
            format: plan_frugal::serve::WeightFormat::F32,
            codes: w.vector(Role::RouterWeight).expect("the router (fp32)"),
            scales: None,
            zeros: None,
            rows: shape.experts,
            cols: c,
            row_block: shape.experts,
        };
        linear(probs, ln, router, n);
        let op = MoeOp::Route {
            probs,
            gates,
            route,
            shape,
            routing: self.config.routing,
            aux: None,
        };
        engine::backend::moe_ops(be).moe(a, &op);
        let experts = engine::moe::expert_rows(a, route, shape);
        let xs = rows_in.prefix(shape.rows() * c);
        let gather = MoeOp::Gather {
            dst: xs,
            src: ln,
            route,
            shape,
            c,
        };
        engine::backend::moe_ops(be).moe(a, &gather);
        let (w_fc, w_proj) = (
            w.matrix(Role::ExpertsFcWeight),
            w.matrix(Role::ExpertsProjWeight),
        );
        let f = e.d_ff_expert as usize;
        for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let weight = rows_of(w_fc, x * 2 * f..(x + 1) * 2 * f);
            let out = fch.slice(r.start * 2 * f..r.end * 2 * f);
            linear(out, xs.slice(r.start * c..r.end * c), weight, r.len());
        }
        let act = |out: Tensor, inp: Tensor, rows: usize, width: usize| {
            let op = Activation {
                out: out.prefix(rows * width),
                inp: inp.prefix(rows * 2 * width),
                kind: self.design.mlp,
                n: rows,
                width,
            };
            be.activation(a, &op);
        };
        act(fch_act, fch, shape.rows(), f);
        let y = rows_out.prefix(shape.rows() * c);
        for (x, r) in experts.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let weight = rows_of(w_proj, x * c..(x + 1) * c);
            let inp = fch_act.slice(r.start * f..r.end * f);
            linear(y.slice(r.start * c..r.end * c), inp, weight, r.len());
        }
        let out = proj.prefix(n * c);
        be.fill(a, out, 0.0);
        let combine = MoeOp::Combine {
            out,
            residual: None,
            y,
            gates: Some(gates),
            route,
            shape,
            c,
        };
        engine::backend::moe_ops(be).moe(a, &combine);
        if e.n_shared > 0 {
            let sh = e.n_shared as usize * f;
            linear(
                fch.prefix(n * 2 * sh),
                ln,
                w.matrix(Role::SharedFcWeight),
                n,
            );
            act(fch_act, fch, n, sh);
            let y = rows_out.prefix(n * c);
            linear(
                y,
                fch_act.prefix(n * sh),
                w.matrix(Role::SharedProjWeight),
                n,
            );
            be.residual_add(a, out, y);
        }
    }
}
