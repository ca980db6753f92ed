//! The backward pass as backend ops: the head (final norm, fused classifier and loss), each
//! block from the last to the first, then the embedding. Ops accumulate into gradients, so the
//! residual stream's gradient `dact.residual` is carried down through every block and each
//! block's scratch is zeroed before use; parameter gradients accumulate across micro-steps
//! (zeroed per step).
//!
//! Example: inside `Head`, `backward::head(model, state, arena, dloss)` returns the summed loss;
//! then `backward::block(model, state, arena, l)` in `Backward(l)` for l = L-1..0 and
//! `backward::embed`.

use crate::TrainState;
use comm::ReduceOp;
use engine::arena::Arena;
use engine::backend::ops::*;
use engine::backend::TrainOps;
use engine::backend::{DType, Tensor};
use engine::forward::{attn_shape, block_input, final_norm, rope_shape, widened};
use engine::model::{BlockActs, Model};
use kernels::classifier::shard::RowReduce;
use plan_frugal::family::{Norm, Positions};
use plan_frugal::key::Work;
use plan_frugal::units::{Role, UnitKind};
use plan_frugal::Key;

/// What one block's backward shares: the model, its gradients and the pass's sizes.
pub(crate) struct Grad<'a, B: TrainOps> {
    pub(crate) model: &'a Model,
    pub(crate) state: &'a TrainState,
    pub(crate) arena: &'a Arena<B>,
    pub(crate) be: &'a B,
    pub(crate) kind: UnitKind,
    pub(crate) n: usize,
    /// LoRA: each matrix's adapter output, as this block's backward reads it.
    lora_u: [Option<Tensor>; 4],
}

impl<B: TrainOps> Grad<'_, B> {
    /// The block this backward runs.
    pub(crate) fn layer(&self) -> usize {
        match self.kind {
            UnitKind::Block(l) => l as usize,
            other => panic!("a block backward in {other:?}"),
        }
    }

    pub(crate) fn w(&self, role: Role) -> Tensor {
        self.model.weight(self.arena, self.kind, role)
    }

    /// The gradient of a model weight (`None` under LoRA: the base is frozen).
    pub(crate) fn g(&self, role: Role) -> Option<Tensor> {
        let frozen = self.model.lora.is_some();
        (!frozen).then(|| self.state.grad(self.model, self.arena, self.kind, role))
    }

    fn g_opt(&self, role: Role) -> Option<Tensor> {
        let frozen = self.model.lora.is_some();
        let g = || self.state.try_grad(self.model, self.arena, self.kind, role);
        (!frozen).then(g).flatten()
    }

    /// dinp, dW (+ db) += the backward of `out = inp W (+ b)`: the one choke point of the
    /// block's projections (bf16 GEMMs when `inp` is stored bf16).
    pub(crate) fn linear(
        &self,
        dinp: Tensor,
        dout: Tensor,
        inp: Tensor,
        roles: (Role, Role),
        ic: usize,
    ) {
        let n = self.n;
        if let (Some(lora), UnitKind::Block(layer)) = (&self.model.lora, self.kind) {
            let u = self.lora_u[engine::lora::matrix_index(roles.0)];
            let grad = |role| self.state.grad(self.model, self.arena, self.kind, role);
            let io = (dinp, dout, inp);
            let layer = layer as usize;
            return lora.linear_backward(self.model, self.arena, layer, roles.0, io, u, &grad, n);
        }
        let weights = (self.w(roles.0), self.g(roles.0).expect("a trained weight"));
        self.dense(dinp, dout, inp, weights, self.g_opt(roles.1), (n, ic));
    }

    /// dinp, dW (+ db) += the backward of `out = inp W (+ b)` for plain weight and gradient
    /// tensors (an expert's rows of a fused view), over `n` rows.
    pub(crate) fn dense(
        &self,
        dinp: Tensor,
        dout: Tensor,
        inp: Tensor,
        (weight, dweight): (Tensor, Tensor),
        dbias: Option<Tensor>,
        (n, ic): (usize, usize),
    ) {
        let shape = LinearShape {
            n,
            ic,
            oc: dout.len / n,
        };
        let bf16 = (inp.dtype == DType::Bf16).then(|| {
            self.state
                .bf16
                .expect("bf16 matmul inputs have backward GEMM scratch")
        });
        let op = LinearBackward {
            kind: LinearKind::Dense,
            dinp,
            dweight,
            dbias,
            dout,
            inp: inp.prefix(n * ic),
            weight,
            shape,
            bf16,
        };
        self.be.linear_backward(self.arena, &op);
    }

    /// `dact.ln` += the input gradient of an MLP `proj(act(fc(ln2)))` whose output gradient is
    /// `dout` (every row), from its saved `fch` and `fch_act` (`widths`: fc's output and the
    /// activation's); its weight (and bias, where the unit has one) gradients accumulate. The
    /// block's dense MLP and DeepSeek's shared experts.
    pub(crate) fn mlp_into_dln(
        &self,
        (fch, fch_act): (Tensor, Tensor),
        (ln2, dout): (Tensor, Tensor),
        [fc, proj]: [(Role, Role); 2],
        (fc_w, f): (usize, usize),
    ) {
        let (state, arena, be, n) = (self.state, self.arena, self.be, self.n);
        let c = self.model.config.shape.d_model as usize;
        let fch = widened(arena, fch, n * fc_w, self.model.work.f32_in);
        // The scratch is sized for the widest layer: this MLP's part of it.
        let (dfch_act, dfch) = (state.dfch_act.prefix(n * f), state.dfch.prefix(n * fc_w));
        be.fill(arena, dfch_act, 0.0);
        self.linear(dfch_act, dout, fch_act, proj, f);
        be.fill(arena, dfch, 0.0);
        let op = ActivationBackward {
            dinp: dfch,
            inp: fch,
            dout: dfch_act,
            kind: self.model.design.mlp,
            n,
            width: f,
        };
        be.activation_backward(arena, &op);
        self.linear(state.dln.prefix(n * c), dfch, ln2, fc, c);
    }

    /// The key and value rows of the block's q|k|v weight gradient, then of its bias: what a
    /// key/value head shared by tensor-parallel ranks sums over them.
    fn kv_rows(&self) -> [Option<Tensor>; 2] {
        let s = &self.model.config.shape;
        let q = s.n_heads as usize * s.d_head as usize;
        let kv = 2 * s.n_kv_heads as usize * s.d_head as usize;
        let c = s.d_model as usize;
        let w = self
            .g(Role::QkvWeight)
            .map(|t| t.slice(q * c..(q + kv) * c));
        let b = self.g_opt(Role::QkvBias).map(|t| t.slice(q..q + kv));
        [w, b]
    }

    /// dinp += the norm's backward of `dout`; its weight (and bias) gradients accumulate.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm(
        &self,
        dinp: Tensor,
        dout: Tensor,
        inp: Tensor,
        roles: (Role, Role),
        a: NormSaved,
    ) {
        let c = self.model.config.shape.d_model as usize;
        let (dweight, dbias) = (self.g(roles.0), self.g_opt(roles.1));
        // Sequence parallelism: this rank's rows give part of the weight gradient; it is
        // computed apart, summed over the group, then added.
        let sp = self.model.sp.filter(|_| dweight.is_some());
        let (dw, db) = match sp {
            Some(sp) => {
                self.be.fill(self.arena, sp.dnorm, 0.0);
                let (w, b) = (sp.dnorm.slice(0..c), sp.dnorm.slice(c..2 * c));
                (Some(w), dbias.map(|_| b))
            }
            None => (dweight, dbias),
        };
        let kind = match self.model.design.norm {
            Norm::LayerNorm => NormGradKind::Layer {
                mean: a.mean.expect("LayerNorm keeps a mean"),
                dbias: db,
            },
            Norm::RmsNorm => NormGradKind::Rms,
        };
        let rows = engine::sp::rows(self.model, self.n).1;
        let op = NormBackward {
            dinp: dinp.prefix(rows * c),
            dweight: dw,
            dout: dout.prefix(rows * c),
            // The residual stream saved in bf16 is widened for the f32 kernel.
            inp: widened(self.arena, inp, rows * c, self.model.work.resid_in),
            weight: self.w(roles.0),
            rstd: a.rstd.prefix(rows),
            kind: match kind {
                NormGradKind::Layer { mean, dbias } => NormGradKind::Layer {
                    mean: mean.prefix(rows),
                    dbias,
                },
                rms => rms,
            },
            n: rows,
            c,
        };
        self.be.norm_backward(self.arena, &op);
        if let (Some(sp), Some(dweight)) = (sp, dweight) {
            let tp = self.model.tp.as_ref().expect("a tensor-parallel group");
            tp.all_reduce(self.arena, sp.dnorm);
            self.be
                .residual_add(self.arena, dweight, sp.dnorm.slice(0..c));
            if let Some(dbias) = dbias {
                self.be
                    .residual_add(self.arena, dbias, sp.dnorm.slice(c..2 * c));
            }
        }
    }
}

/// A norm's saved statistics.
#[derive(Clone, Copy)]
pub(crate) struct NormSaved {
    pub(crate) mean: Option<Tensor>,
    pub(crate) rstd: Tensor,
}

/// Final norm, fused classifier + cross-entropy (forward and backward), norm backward into
/// `dact.residual`. Returns the sum of the per-token losses; `dloss` scales each token's gradient
/// (1 / tokens of the whole step, so accumulation equals one big batch).
pub fn head<B: TrainOps>(model: &Model, state: &TrainState, arena: &Arena<B>, dloss: f32) -> f32 {
    let s = &model.shape;
    let (b, t) = (s.batch as usize, s.seq as usize);
    let shape = &model.config.shape;
    let (n, c, v) = (b * t, shape.d_model as usize, shape.vocab as usize);
    let be = arena.backend();
    final_norm(model, arena, b, t);
    let (lm_kind, lm_role) = model.lm_head();
    be.fill(arena, state.dlnf, 0.0);
    // bf16 (`ActPolicy::bf16_units`): the weight is the bf16 working copy, and the backend
    // runs the classifier on bf16 operands.
    let h = &model.head;
    let op = Classifier {
        losses: state.losses,
        dlnf: state.dlnf,
        dweight: (model.lora.is_none()).then(|| state.grad(model, arena, lm_kind, lm_role)),
        lnf: h.lnf,
        weight: model.lm_weight(arena),
        targets: state.targets,
        scratch: h.classifier,
        n,
        c,
        v,
        dloss,
    };
    let loss_sum = match &model.tp {
        Some(tp) => {
            let stats = arena.key_tensor(Key::Work(Work::TpStats), DType::F32);
            let mut reduce = |buf: &mut [f32], op: RowReduce| {
                let op = match op {
                    RowReduce::Max => ReduceOp::Max,
                    RowReduce::Sum => ReduceOp::Sum,
                };
                tp.reduce_host(buf, op);
            };
            let shard = ClassifierShard {
                first: tp.vocab.0 as usize,
                stats,
                reduce: &mut reduce,
            };
            engine::backend::tp_ops(be).classifier_shard(arena, &op, shard)
        }
        None => be.classifier(arena, &op),
    };
    // Each rank's classifier rows gave part of the input gradient (this rank's rows of it under
    // sequence parallelism).
    let dlnf = engine::sp::sum_input_grad(model, arena, state.dlnf.prefix(n * c));
    crate::moe_backward::balance(model, state, arena, n, dloss);
    be.fill(arena, state.dresidual, 0.0);
    let g = Grad {
        model,
        state,
        arena,
        be,
        kind: UnitKind::Head,
        n,
        lora_u: [None; 4],
    };
    let last = state.blocks[state.blocks.len() - 1].out;
    let saved = NormSaved {
        mean: h.lnf_mean,
        rstd: h.lnf_rstd,
    };
    let roles = (Role::FinalNormWeight, Role::FinalNormBias);
    g.norm(state.dresidual, dlnf, last, roles, saved);
    loss_sum
}

/// Block `layer` backward: first rebuilds what the recompute policy did not keep, then reads
/// `dact.residual` as the gradient of its output and leaves the gradient of its input there;
/// accumulates the block's parameter gradients.
pub fn block<B: TrainOps>(model: &Model, state: &TrainState, arena: &Arena<B>, layer: usize) {
    crate::recompute::before_backward(model, state, arena, layer);
    let g = Grad {
        model,
        state,
        arena,
        be: arena.backend(),
        kind: UnitKind::Block(layer as u32),
        n: (model.shape.batch * model.shape.seq) as usize,
        lora_u: state.blocks[layer].lora_u,
    };
    let a = state.blocks[layer];
    mlp(&g, &a);
    let inp = block_input(model, &state.blocks, layer);
    if model.design.mla {
        return crate::mla_backward::backward(&g, &a, inp);
    }
    attention(&g, &a, inp);
}

/// MLP half: out = res2 + proj(act(fc(norm2(res2)))); turns d(out) into d(res2) in `dres`.
fn mlp<B: TrainOps>(g: &Grad<'_, B>, a: &BlockActs) {
    let (model, state, arena, be) = (g.model, g.state, g.arena, g.be);
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let d = model.dims(g.layer(), b, t);
    if d.experts > 0 {
        return crate::moe_backward::backward(g, a);
    }
    let dres = state.dresidual;
    be.fill(arena, state.dln, 0.0);
    let roles = [
        (Role::FcWeight, Role::FcBias),
        (Role::FcProjWeight, Role::FcProjBias),
    ];
    let widths = (d.fc as usize, d.fc_act as usize);
    // Sequence parallelism: the output gradient and ln2 gathered whole for the TP region.
    let local = (d.local * d.c) as usize;
    let dout = engine::sp::gathered_grad(model, arena, dres, local);
    let ln2 = engine::sp::gathered(model, arena, a.ln2, local);
    g.mlp_into_dln((a.fch, a.fch_act), (ln2, dout), roles, widths);
    let dln = engine::sp::sum_input_grad(model, arena, state.dln.prefix((d.n * d.c) as usize));
    let saved = NormSaved {
        mean: a.ln2_mean,
        rstd: a.ln2_rstd,
    };
    let norm2 = (Role::Norm2Weight, Role::Norm2Bias);
    g.norm(dres, dln, a.res2, norm2, saved);
}

/// Attention half: res2 = inp + proj(attention(qkv(norm1(inp)))); turns d(res2) into d(inp).
fn attention<B: TrainOps>(g: &Grad<'_, B>, a: &BlockActs, inp: Tensor) {
    let (model, state, arena, be) = (g.model, g.state, g.arena, g.be);
    let d = model.dims(
        g.layer(),
        model.shape.batch as usize,
        model.shape.seq as usize,
    );
    let (n, c, qkv_w, atty_w) = (d.n as usize, d.c as usize, d.qkv as usize, d.atty as usize);
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let qkv = widened(arena, a.qkv, n * qkv_w, model.work.f32_in);
    let dres = state.dresidual;
    be.fill(arena, state.datty, 0.0);
    let proj = (Role::AttnProjWeight, Role::AttnProjBias);
    let local = (d.local * d.c) as usize;
    let dout = engine::sp::gathered_grad(model, arena, dres, local);
    g.linear(state.datty, dout, a.atty, proj, atty_w);
    be.fill(arena, state.dqkv, 0.0);
    let kernel = match (a.att, a.lse, state.datt) {
        (Some(att), _, Some(datt)) => AttnGradKernel::Materialised { att, datt },
        (None, Some(lse), _) => AttnGradKernel::Flash {
            out: widened(arena, a.atty, n * atty_w, model.work.f32),
            lse,
        },
        _ => panic!("the plan keeps neither att (with dact.att) nor lse"),
    };
    let op = AttentionBackward {
        dqkv: state.dqkv,
        dout: state.datty,
        qkv,
        kernel,
        shape: attn_shape(model, g.kind, b, t),
    };
    be.attention_backward(arena, &op);
    if model.design.positions == Positions::Rope {
        be.rope_backward(arena, state.dqkv, rope_shape(model, b, t));
    }
    be.fill(arena, state.dln, 0.0);
    let qkv_roles = (Role::QkvWeight, Role::QkvBias);
    let ln1 = engine::sp::gathered(model, arena, a.ln1, local);
    // A key/value head shared by several tensor-parallel ranks: its gradient is their sum.
    let kv_rows = g.kv_rows();
    if let Some(tp) = &model.tp {
        tp.kv_before(arena, kv_rows);
    }
    g.linear(state.dln, state.dqkv.prefix(n * qkv_w), ln1, qkv_roles, c);
    if let Some(tp) = &model.tp {
        tp.kv_after(arena, kv_rows);
    }
    let dln = engine::sp::sum_input_grad(model, arena, state.dln.prefix(n * c));
    let saved = NormSaved {
        mean: a.ln1_mean,
        rstd: a.ln1_rstd,
    };
    let norm1 = (Role::Norm1Weight, Role::Norm1Bias);
    g.norm(dres, dln, inp, norm1, saved);
}

/// Embedding backward: scatters `dact.residual` into the token (and position) table gradients.
pub fn embed<B: TrainOps>(model: &Model, state: &TrainState, arena: &Arena<B>) {
    if model.lora.is_some() {
        return; // the embedding is frozen
    }
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let c = model.config.shape.d_model as usize;
    let local = engine::sp::rows(model, b * t).1 * c;
    let op = EmbeddingBackward {
        dwte: state.grad(model, arena, UnitKind::Embed, Role::TokenEmbedding),
        dwpe: state.try_grad(model, arena, UnitKind::Embed, Role::PositionEmbedding),
        dout: engine::sp::gathered_grad(model, arena, state.dresidual, local),
        tokens: model.head.tokens,
        batch: b,
        seq: t,
        c: model.config.shape.d_model as usize,
        shard: model.tp.as_ref().map(|tp| tp.vocab.0 as usize),
        order: arena.try_tensor(Key::Work(Work::EmbedOrder), DType::U32),
    };
    arena.backend().embedding_backward(arena, &op);
}
