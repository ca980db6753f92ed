//! The forward pass, block by block, with the kernels: embedding, GPT-2 and Llama blocks, final
//! norm. Every tensor lives in the arena; this file only calls kernels on views of it.
//!
//! A pass may cover fewer rows than the buffers were planned for (`batch` ≤ micro-batch,
//! `seq` ≤ planned sequence: sampling runs one row of a growing prefix), so every view is cut to
//! the pass's length. GPT-2 blocks: LayerNorm, fused qkv with bias, attention, projection, GELU MLP.
//! Llama blocks: RMSNorm, fused q|k|v, RoPE on q and k, GQA attention, SwiGLU with fused gate|up.
//!
//! Example: `forward::embed(model, arena, b, t); for l in 0..L { forward::block(model, arena, l, b, t) }`
//! inside the arena's `Embed` and `Forward(l)` phases.

use crate::arena::{Arena, BufId};
use crate::model::Model;
use kernels::{attention, embedding, gelu, layernorm, matmul, residual, rmsnorm, rope, swiglu};
use plan::frugal::units::{Role, UnitKind};

/// Token (and position) embedding into `act.encoded`.
pub fn embed(model: &Model, arena: &Arena, batch: usize, seq: usize) {
    let h = &model.head;
    let (n, c) = (batch * seq, model.config.shape.d_model as usize);
    let tokens = arena.u32(h.tokens);
    let mut enc = arena.f32_mut(h.encoded);
    let p = arena.f32(model.params[0]);
    let wte = &p[model.unit_range(UnitKind::Embed, Role::TokenEmbedding)];
    let wpe = model
        .is_gpt2()
        .then(|| &p[model.unit_range(UnitKind::Embed, Role::PositionEmbedding)]);
    embedding::forward(&mut enc[..n * c], &tokens[..n], wte, wpe, batch, seq, c);
}

/// The residual stream entering block `layer`.
pub fn block_input(model: &Model, layer: usize) -> BufId {
    if layer == 0 {
        model.head.encoded
    } else {
        model.blocks[layer - 1].out
    }
}

/// Norm forward: LayerNorm when `mean` is planned (GPT-2), RMSNorm otherwise.
pub struct NormBufs {
    pub mean: Option<BufId>,
    pub rstd: BufId,
}

#[allow(clippy::too_many_arguments)]
pub fn norm_forward(
    model: &Model,
    arena: &Arena,
    out: &mut [f32],
    bufs: NormBufs,
    inp: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    n: usize,
) {
    let c = model.config.shape.d_model as usize;
    let mut rstd = arena.f32_mut(bufs.rstd);
    match bufs.mean {
        Some(mean) => {
            let mut mean = arena.f32_mut(mean);
            let bias = bias.expect("LayerNorm has a bias");
            layernorm::forward(out, &mut mean[..n], &mut rstd[..n], inp, weight, bias, n, c);
        }
        None => rmsnorm::forward(
            out,
            &mut rstd[..n],
            inp,
            weight,
            n,
            c,
            model.config.norm_eps,
        ),
    }
}

/// Transformer block `layer` forward: saves what its backward needs, writes its output.
pub fn block(model: &Model, arena: &Arena, layer: usize, batch: usize, seq: usize) {
    let s = &model.config.shape;
    let d = model.dims(batch, seq);
    let (n, c, qkv_w, atty_w) = (d.n as usize, d.c as usize, d.qkv as usize, d.atty as usize);
    let (fc_w, f) = (d.fc as usize, d.fc_act as usize);
    let (nh, nkv, hd) = (s.n_heads as usize, s.n_kv_heads as usize, s.d_head as usize);
    let a = model.blocks[layer];
    let kind = UnitKind::Block(layer as u32);
    let unit = &model.units[model.unit_index(kind)];
    let p = arena.f32(model.params[model.unit_index(kind)]);
    let w = |role: Role| &p[model.unit_range(kind, role)];
    let bias = |role: Role| unit.has(role).then(|| w(role));
    let inp = arena.f32(block_input(model, layer));
    let inp = &inp[..n * c];

    let mut ln1 = arena.f32_mut(a.ln1);
    let norm1 = NormBufs {
        mean: a.ln1_mean,
        rstd: a.ln1_rstd,
    };
    let ln1 = &mut ln1[..n * c];
    norm_forward(
        model,
        arena,
        ln1,
        norm1,
        inp,
        w(Role::Norm1Weight),
        bias(Role::Norm1Bias),
        n,
    );
    let mut qkv = arena.f32_mut(a.qkv);
    let qkv = &mut qkv[..n * qkv_w];
    matmul::forward(
        qkv,
        ln1,
        w(Role::QkvWeight),
        bias(Role::QkvBias),
        n,
        c,
        qkv_w,
    );
    if !model.is_gpt2() {
        rope::forward_rows(
            qkv,
            batch,
            seq,
            nh + nkv,
            hd,
            qkv_w,
            model.config.rope_theta,
        );
    }
    let mut att = arena.f32_mut(a.att);
    let mut atty = arena.f32_mut(a.atty);
    let atty = &mut atty[..n * atty_w];
    attention::forward(
        atty,
        &mut att[..d.att as usize],
        qkv,
        batch,
        seq,
        nh,
        nkv,
        hd,
    );
    let mut res2 = arena.f32_mut(a.res2);
    let res2 = &mut res2[..n * c];
    let proj_b = bias(Role::AttnProjBias);
    matmul::forward(res2, atty, w(Role::AttnProjWeight), proj_b, n, atty_w, c);
    residual::accumulate(res2, inp);

    let mut ln2 = arena.f32_mut(a.ln2);
    let ln2 = &mut ln2[..n * c];
    let norm2 = NormBufs {
        mean: a.ln2_mean,
        rstd: a.ln2_rstd,
    };
    norm_forward(
        model,
        arena,
        ln2,
        norm2,
        res2,
        w(Role::Norm2Weight),
        bias(Role::Norm2Bias),
        n,
    );
    let mut fch = arena.f32_mut(a.fch);
    let fch = &mut fch[..n * fc_w];
    matmul::forward(fch, ln2, w(Role::FcWeight), bias(Role::FcBias), n, c, fc_w);
    let mut fch_act = arena.f32_mut(a.fch_act);
    let fch_act = &mut fch_act[..n * f];
    if model.is_gpt2() {
        gelu::forward(fch_act, fch);
    } else {
        swiglu::forward(fch_act, fch, n, f);
    }
    let mut out = arena.f32_mut(a.out);
    let out = &mut out[..n * c];
    let fcproj_b = bias(Role::FcProjBias);
    matmul::forward(out, fch_act, w(Role::FcProjWeight), fcproj_b, n, f, c);
    residual::accumulate(out, res2);
}

/// Final norm of the last block's output into `act.lnf`.
pub fn final_norm(model: &Model, arena: &Arena, batch: usize, seq: usize) {
    let (n, c) = (batch * seq, model.config.shape.d_model as usize);
    let h = &model.head;
    let head = model.unit_index(UnitKind::Head);
    let p = arena.f32(model.params[head]);
    let weight = &p[model.unit_range(UnitKind::Head, Role::FinalNormWeight)];
    let bias = model
        .is_gpt2()
        .then(|| &p[model.unit_range(UnitKind::Head, Role::FinalNormBias)]);
    let last = arena.f32(model.blocks[model.blocks.len() - 1].out);
    let mut lnf = arena.f32_mut(h.lnf);
    let bufs = NormBufs {
        mean: h.lnf_mean,
        rstd: h.lnf_rstd,
    };
    norm_forward(
        model,
        arena,
        &mut lnf[..n * c],
        bufs,
        &last[..n * c],
        weight,
        bias,
        n,
    );
}
