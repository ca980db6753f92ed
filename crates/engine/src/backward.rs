//! The backward pass: the head (final norm, fused classifier and loss), each block from the last
//! to the first, then the embedding. Kernels accumulate into gradients, so the residual stream's
//! gradient `dact.residual` is carried down through every block and each block's scratch is
//! zeroed before use; parameter gradients accumulate across micro-steps (zeroed per step).
//!
//! Example: inside `Head`, `backward::head(model, arena, dloss)` returns the summed loss; then
//! `backward::block(model, arena, l)` in `Backward(l)` for l = L-1..0 and `backward::embed`.

use crate::arena::{Arena, BufId, View, ViewMut};
use crate::forward::{block_input, final_norm};
use crate::model::{split_ranges, view_range, Model};
use kernels::{
    attention, classifier, convert, embedding, flash, gelu, gemm_bf16, layernorm, matmul, rmsnorm,
    rope, swiglu,
};
use plan::frugal::units::{Role, Unit, UnitKind};

/// A unit's gradient buffer cut into one mutable slice per role.
struct GradParts<'a> {
    parts: Vec<(Role, Option<&'a mut [f32]>)>,
}

impl<'a> GradParts<'a> {
    fn new(unit: &Unit, buf: &'a mut [f32]) -> GradParts<'a> {
        let ranges: Vec<_> = unit.views.iter().map(view_range).collect();
        let slices = split_ranges(buf, &ranges);
        let parts = unit
            .views
            .iter()
            .map(|v| v.role)
            .zip(slices.into_iter().map(Some));
        GradParts {
            parts: parts.collect(),
        }
    }

    fn take(&mut self, role: Role) -> &'a mut [f32] {
        self.take_opt(role)
            .unwrap_or_else(|| panic!("no gradient slice for {role:?}"))
    }

    fn take_opt(&mut self, role: Role) -> Option<&'a mut [f32]> {
        self.parts
            .iter_mut()
            .find(|(r, _)| *r == role)
            .and_then(|(_, s)| s.take())
    }
}

/// Accumulating norm backward into `dinp`: LayerNorm when `mean` is given, RMSNorm otherwise.
struct NormGrad<'a> {
    dinp: &'a mut [f32],
    dweight: &'a mut [f32],
    dbias: Option<&'a mut [f32]>,
    dout: &'a [f32],
    inp: &'a [f32],
    weight: &'a [f32],
    mean: Option<&'a [f32]>,
    rstd: &'a [f32],
}

fn norm_backward(g: NormGrad<'_>, n: usize, c: usize) {
    match g.mean {
        Some(mean) => {
            let dbias = g.dbias.expect("LayerNorm has a bias");
            let (dinp, dw, dout, inp, w) = (g.dinp, g.dweight, g.dout, g.inp, g.weight);
            layernorm::backward(dinp, dw, dbias, dout, inp, w, mean, g.rstd, n, c);
        }
        None => rmsnorm::backward(g.dinp, g.dweight, g.dout, g.inp, g.weight, g.rstd, n, c),
    }
}

/// Final norm, fused classifier + cross-entropy (forward and backward), norm backward into
/// `dact.residual`. Returns the sum of the per-token losses; `dloss` scales each token's gradient
/// (1 / tokens of the whole step, so accumulation equals one big batch).
pub fn head(model: &Model, arena: &Arena, dloss: f32) -> f32 {
    let s = &model.shape;
    let (n, c, v) = (
        (s.batch * s.seq) as usize,
        model.config.shape.d_model as usize,
        model.config.shape.vocab as usize,
    );
    final_norm(model, arena, s.batch as usize, s.seq as usize);
    let h = &model.head;
    let head_idx = model.unit_index(UnitKind::Head);
    let head_unit = &model.units[head_idx];
    let (lm_unit, lm_range) = model.lm_head();
    let params_head = arena.f32(model.params[head_idx]);
    let params_lm = arena.f32(model.params[lm_unit]);
    let mut grads_head = arena.f32_mut(model.grads[head_idx]);
    let mut head_parts = GradParts::new(head_unit, &mut grads_head);
    let mut grads_embed = (lm_unit == 0).then(|| arena.f32_mut(model.grads[0]));
    let dlm: &mut [f32] = match grads_embed.as_mut() {
        Some(g) => &mut g[lm_range.clone()],
        None => head_parts.take(Role::LmHead),
    };
    let mut dlnf = arena.f32_mut(h.dlnf);
    dlnf.fill(0.0);
    let lnf = arena.f32(h.lnf);
    let loss_sum = {
        let mut losses = arena.f32_mut(h.losses);
        let targets = arena.u32(h.targets);
        let mut scratch = arena.f32_mut(h.classifier);
        let wte = &params_lm[lm_range];
        classifier::forward_backward(
            &mut losses,
            &mut dlnf,
            dlm,
            &lnf,
            wte,
            &targets,
            &mut scratch,
            n,
            c,
            v,
            dloss,
        )
    };
    let mut dres = arena.f32_mut(h.dresidual);
    dres.fill(0.0);
    let last = arena.f32(model.blocks[model.blocks.len() - 1].out);
    let mean = h.lnf_mean.map(|m| arena.f32(m));
    let rstd = arena.f32(h.lnf_rstd);
    let weight = &params_head[model.unit_range(UnitKind::Head, Role::FinalNormWeight)];
    let grad = NormGrad {
        dinp: &mut dres,
        dweight: head_parts.take(Role::FinalNormWeight),
        dbias: head_parts.take_opt(Role::FinalNormBias),
        dout: &dlnf,
        inp: &last,
        weight,
        mean: mean.as_deref(),
        rstd: &rstd,
    };
    norm_backward(grad, n, c);
    loss_sum
}

/// Block `layer` backward: first rebuilds what the recompute policy did not keep, then reads
/// `dact.residual` as the gradient of its output and leaves the gradient of its input there;
/// accumulates the block's parameter gradients.
pub fn block(model: &Model, arena: &Arena, layer: usize) {
    crate::recompute::before_backward(model, arena, layer);
    let kind = UnitKind::Block(layer as u32);
    let idx = model.unit_index(kind);
    let p = arena.f32(model.params[idx]);
    let w = |role: Role| &p[model.unit_range(kind, role)];
    let mut grads = arena.f32_mut(model.grads[idx]);
    let mut g = GradParts::new(&model.units[idx], &mut grads);
    let mut dres = arena.f32_mut(model.head.dresidual);
    mlp(model, arena, layer, &w, &mut g, &mut dres);
    attention(model, arena, layer, &w, &mut g, &mut dres);
}

/// MLP half: out = res2 + proj(act(fc(norm2(res2)))); turns d(out) into d(res2) in `dres`.
fn mlp<'a>(
    model: &Model,
    arena: &Arena,
    layer: usize,
    w: &dyn Fn(Role) -> &'a [f32],
    g: &mut GradParts<'_>,
    dres: &mut [f32],
) {
    let d = model.dims(model.shape.batch as usize, model.shape.seq as usize);
    let (n, c, fc_w, f) = (d.n as usize, d.c as usize, d.fc as usize, d.fc_act as usize);
    let (a, h) = (model.blocks[layer], &model.head);
    let (mut dln, mut dfch, mut dfch_act) = (
        arena.f32_mut(h.dln),
        arena.f32_mut(h.dfch),
        arena.f32_mut(h.dfch_act),
    );
    let fch = matmul_output(model, arena, a.fch, n * fc_w);
    dfch_act.fill(0.0);
    let lin = Linear {
        dinp: &mut dfch_act,
        dweight: g.take(Role::FcProjWeight),
        dbias: g.take_opt(Role::FcProjBias),
        dout: dres,
        inp: a.fch_act,
        weight: w(Role::FcProjWeight),
    };
    linear_backward(model, arena, lin, n, f);
    dfch.fill(0.0);
    if model.is_gpt2() {
        gelu::backward(&mut dfch, &fch, &dfch_act);
    } else {
        swiglu::backward(&mut dfch, &fch, &dfch_act, n, f);
    }
    dln.fill(0.0);
    let lin = Linear {
        dinp: &mut dln,
        dweight: g.take(Role::FcWeight),
        dbias: g.take_opt(Role::FcBias),
        dout: &dfch[..n * fc_w],
        inp: a.ln2,
        weight: w(Role::FcWeight),
    };
    linear_backward(model, arena, lin, n, c);
    let res2 = arena.f32(a.res2);
    let (mean, rstd) = (a.ln2_mean.map(|m| arena.f32(m)), arena.f32(a.ln2_rstd));
    let grad = NormGrad {
        dinp: dres,
        dweight: g.take(Role::Norm2Weight),
        dbias: g.take_opt(Role::Norm2Bias),
        dout: &dln,
        inp: &res2,
        weight: w(Role::Norm2Weight),
        mean: mean.as_deref(),
        rstd: &rstd,
    };
    norm_backward(grad, n, c);
}

/// Attention half: res2 = inp + proj(attention(qkv(norm1(inp)))); turns d(res2) into d(inp).
fn attention<'a>(
    model: &Model,
    arena: &Arena,
    layer: usize,
    w: &dyn Fn(Role) -> &'a [f32],
    g: &mut GradParts<'_>,
    dres: &mut [f32],
) {
    let s = &model.config.shape;
    let d = model.dims(model.shape.batch as usize, model.shape.seq as usize);
    let (n, c, qkv_w, atty_w) = (d.n as usize, d.c as usize, d.qkv as usize, d.atty as usize);
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let (nh, nkv, hd) = (s.n_heads as usize, s.n_kv_heads as usize, s.d_head as usize);
    let (a, h) = (model.blocks[layer], &model.head);
    let qkv = matmul_output(model, arena, a.qkv, n * qkv_w);
    let (mut datty, mut dqkv, mut dln) = (
        arena.f32_mut(h.datty),
        arena.f32_mut(h.dqkv),
        arena.f32_mut(h.dln),
    );
    datty.fill(0.0);
    let lin = Linear {
        dinp: &mut datty,
        dweight: g.take(Role::AttnProjWeight),
        dbias: g.take_opt(Role::AttnProjBias),
        dout: dres,
        inp: a.atty,
        weight: w(Role::AttnProjWeight),
    };
    linear_backward(model, arena, lin, n, atty_w);
    dqkv.fill(0.0);
    match (a.att, a.lse, h.datt) {
        (Some(att), _, Some(datt)) => {
            let (att, mut datt) = (arena.f32(att), arena.f32_mut(datt));
            attention::backward(&mut dqkv, &mut datt, &datty, &qkv, &att, b, t, nh, nkv, hd);
        }
        (None, Some(lse), _) => {
            let lse = arena.f32(lse);
            let atty = matmul_input(model, arena, a.atty, n * atty_w);
            flash::backward(&mut dqkv, &datty, &atty, &lse, &qkv, b, t, nh, nkv, hd);
        }
        _ => panic!("the plan keeps neither att (with dact.att) nor lse"),
    }
    if !model.is_gpt2() {
        rope::backward_rows(
            &mut dqkv[..],
            b,
            t,
            nh + nkv,
            hd,
            qkv_w,
            model.config.rope_theta,
        );
    }
    dln.fill(0.0);
    let lin = Linear {
        dinp: &mut dln,
        dweight: g.take(Role::QkvWeight),
        dbias: g.take_opt(Role::QkvBias),
        dout: &dqkv[..n * qkv_w],
        inp: a.ln1,
        weight: w(Role::QkvWeight),
    };
    linear_backward(model, arena, lin, n, c);
    let inp = arena.f32(block_input(model, layer));
    let (mean, rstd) = (a.ln1_mean.map(|m| arena.f32(m)), arena.f32(a.ln1_rstd));
    let grad = NormGrad {
        dinp: dres,
        dweight: g.take(Role::Norm1Weight),
        dbias: g.take_opt(Role::Norm1Bias),
        dout: &dln,
        inp: &inp,
        weight: w(Role::Norm1Weight),
        mean: mean.as_deref(),
        rstd: &rstd,
    };
    norm_backward(grad, n, c);
}

/// One linear layer's backward: accumulates `dinp` (N,IC), `dweight` (OC,IC) and `dbias` (OC)
/// from `dout` (N,OC), the saved input `inp` and `weight` (OC,IC).
struct Linear<'s> {
    dinp: &'s mut [f32],
    dweight: &'s mut [f32],
    dbias: Option<&'s mut [f32]>,
    dout: &'s [f32],
    inp: BufId,
    weight: &'s [f32],
}

/// Runs `l` in fp32, or under bf16 matmul inputs as two `gemm_bf16` GEMMs (AVX-512 BF16 when the
/// CPU has it) on bf16 operands: dinp += dout·W and dW += doutᵀ·inp, as torch autocast does
/// (dout rounded to bf16, f32 accumulation into the f32 gradient span). `gemm_nt` wants both
/// operands row-major over K, hence the transposes into the planned `work.bw.*` scratch.
fn linear_backward(model: &Model, arena: &Arena, l: Linear<'_>, n: usize, ic: usize) {
    let oc = l.dout.len() / n;
    let h = &model.head;
    let (Some(s), Some(wb)) = (h.work_bw, h.work_w_bf16) else {
        let inp = matmul_input(model, arena, l.inp, n * ic);
        return matmul::backward(
            l.dinp, l.dweight, l.dbias, l.dout, &inp, l.weight, n, ic, oc,
        );
    };
    let (mut g, mut gt) = (arena.bf16_mut(s.dout), arena.bf16_mut(s.dout_t));
    let (g, gt) = (&mut g[..n * oc], &mut gt[..oc * n]);
    convert::f32_to_bf16(g, l.dout);
    let (mut w, mut wt) = (arena.bf16_mut(wb), arena.bf16_mut(s.w_t));
    let (w, wt) = (&mut w[..oc * ic], &mut wt[..ic * oc]);
    convert::f32_to_bf16(w, l.weight);
    gemm_bf16::transpose(wt, w, oc, ic);
    gemm_bf16::gemm_nt(
        &mut l.dinp[..n * ic],
        g,
        wt,
        n,
        ic,
        oc,
        gemm_bf16::Accum::Add,
    );
    gemm_bf16::transpose(gt, g, n, oc);
    let mut xt = arena.bf16_mut(s.inp_t);
    let xt = &mut xt[..ic * n];
    gemm_bf16::transpose(xt, &arena.bf16(l.inp)[..n * ic], n, ic);
    gemm_bf16::gemm_nt(l.dweight, gt, xt, oc, ic, n, gemm_bf16::Accum::Add);
    if let Some(db) = l.dbias {
        for row in l.dout.chunks_exact(oc) {
            for (d, &x) in db.iter_mut().zip(row) {
                *d += x;
            }
        }
    }
}

/// A saved matmul input as f32: the tensor itself, or (bf16 matmul inputs) widened into
/// `work.f32`, which only one input may hold at a time.
pub(crate) enum Input<'a> {
    F32(View<'a, f32>),
    Widened(ViewMut<'a, f32>, usize),
}

impl std::ops::Deref for Input<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Input::F32(v) => v,
            Input::Widened(v, len) => &v[..*len],
        }
    }
}

fn matmul_input<'a>(model: &Model, arena: &'a Arena, id: BufId, len: usize) -> Input<'a> {
    widened(model, arena, id, len, model.head.work_f32)
}

/// A saved matmul output (`qkv`, `fch`) as f32: the tensor itself, or (bf16 activations)
/// widened into `work.f32_in`, so that `work.f32` stays free for a matmul input or for the
/// kernel's own output.
pub(crate) fn matmul_output<'a>(
    model: &Model,
    arena: &'a Arena,
    id: BufId,
    len: usize,
) -> Input<'a> {
    widened(model, arena, id, len, model.head.work_f32_in)
}

fn widened<'a>(
    model: &Model,
    arena: &'a Arena,
    id: BufId,
    len: usize,
    scratch: Option<BufId>,
) -> Input<'a> {
    match scratch {
        Some(work) if model.policy.bf16_matmul_inputs => {
            let mut work = arena.f32_mut(work);
            convert::bf16_to_f32(&mut work[..len], &arena.bf16(id)[..len]);
            Input::Widened(work, len)
        }
        _ => Input::F32(arena.f32(id)),
    }
}

/// Embedding backward: scatters `dact.residual` into the token (and position) table gradients.
pub fn embed(model: &Model, arena: &Arena) {
    let (b, t) = (model.shape.batch as usize, model.shape.seq as usize);
    let c = model.config.shape.d_model as usize;
    let mut grads = arena.f32_mut(model.grads[0]);
    let mut g = GradParts::new(&model.units[0], &mut grads);
    let dwte = g.take(Role::TokenEmbedding);
    let dwpe = g.take_opt(Role::PositionEmbedding);
    let dres = arena.f32(model.head.dresidual);
    let tokens = arena.u32(model.head.tokens);
    embedding::backward(dwte, dwpe, &dres, &tokens, b, t, c);
}
