//! The forward pass, block by block, with the kernels: embedding, GPT-2 and Llama blocks, final
//! norm, and the pieces of a block the backward recomputes. Every tensor lives in the arena; this
//! file only calls kernels on views of it.
//!
//! A pass may cover fewer rows than the buffers were planned for (`batch` ≤ micro-batch,
//! `seq` ≤ planned sequence: sampling runs one row of a growing prefix), so every view is cut to
//! the pass's length. GPT-2 blocks: LayerNorm, fused qkv with bias, attention, projection, GELU MLP.
//! Llama blocks: RMSNorm, fused q|k|v, RoPE on q and k, GQA attention, SwiGLU with fused gate|up.
//! Attention is materialised (`att`, B·NH·T·T) or flash (`lse`, B·NH·T), as the plan chose.
//! A block is a fixed sequence of steps (norm1, qkv, attention core, projection, norm2, fc,
//! activation, fc projection); recompute (see `recompute`) reruns all or some of them into the
//! buffers the backward reads, with the same kernels, so the values are bit-identical.
//!
//! Example: `forward::embed(model, arena, b, t); for l in 0..L { forward::block(model, arena, l, b, t) }`
//! inside the arena's `Embed` and `Forward(l)` phases.

use crate::arena::{Arena, BufId, View};
use crate::backward;
use crate::model::{BlockActs, Model};
use kernels::{
    attention, convert, embedding, flash, gelu, gemm_bf16, layernorm, matmul, residual, rmsnorm,
    rope, swiglu,
};
use plan::frugal::acts::BlockDims;
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

/// The residual stream entering block `layer`, as its backward (and recompute) reads it.
pub fn block_input(model: &Model, layer: usize) -> BufId {
    if layer == 0 {
        model.head.encoded
    } else {
        model.blocks[layer - 1].out
    }
}

/// The residual stream entering block `layer` during the forward pass.
fn forward_input(model: &Model, layer: usize) -> BufId {
    if layer == 0 {
        model.head.encoded
    } else {
        model.forward_blocks[layer - 1].out
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

/// The buffers one run of a block reads and writes.
pub struct BlockPass {
    /// The block's input (the residual stream).
    pub inp: BufId,
    /// Where its tensors go.
    pub acts: BlockActs,
    /// Whether to compute the output (not when recomputing a segment's last block, whose output
    /// the forward pass kept).
    pub write_out: bool,
}

/// One block's weights and the pass's sizes, shared by the steps below.
struct Ctx<'a> {
    model: &'a Model,
    arena: &'a Arena,
    kind: UnitKind,
    params: View<'a, f32>,
    b: usize,
    t: usize,
    d: BlockDims,
}

impl<'a> Ctx<'a> {
    fn new(model: &'a Model, arena: &'a Arena, layer: usize, b: usize, t: usize) -> Ctx<'a> {
        let kind = UnitKind::Block(layer as u32);
        let params = arena.f32(model.params[model.unit_index(kind)]);
        let d = model.dims(b, t);
        Ctx {
            model,
            arena,
            kind,
            params,
            b,
            t,
            d,
        }
    }

    fn w(&self, role: Role) -> &[f32] {
        &self.params[self.model.unit_range(self.kind, role)]
    }

    fn bias(&self, role: Role) -> Option<&[f32]> {
        let unit = &self.model.units[self.model.unit_index(self.kind)];
        unit.has(role).then(|| self.w(role))
    }

    /// Rows × d_model.
    fn nc(&self) -> usize {
        (self.d.n * self.d.c) as usize
    }

    /// Norm of `inp` into `out` (with its statistics); `first` picks norm1 or norm2's weights.
    fn norm(&self, inp: BufId, out: BufId, stats: NormBufs, first: bool) {
        let (weight, bias) = if first {
            (Role::Norm1Weight, Role::Norm1Bias)
        } else {
            (Role::Norm2Weight, Role::Norm2Bias)
        };
        let inp = self.arena.f32(inp);
        let (m, a, n, nc) = (self.model, self.arena, self.d.n as usize, self.nc());
        let (w, b) = (self.w(weight), self.bias(bias));
        self.produce(out, nc, |dst| {
            norm_forward(m, a, dst, stats, &inp[..nc], w, b, n)
        });
    }

    /// Runs the f32 kernel `write` into the first `len` elements of `out`: directly when `out` is
    /// f32, else (bf16 activations: a matmul input, `qkv` or `fch`) into `work.f32` and rounded
    /// once into the bf16 tensor.
    fn produce(&self, out: BufId, len: usize, write: impl FnOnce(&mut [f32])) {
        match self.model.head.work_f32 {
            Some(work) if self.model.policy.bf16_matmul_inputs => {
                let mut work = self.arena.f32_mut(work);
                write(&mut work[..len]);
                convert::f32_to_bf16(&mut self.arena.bf16_mut(out)[..len], &work[..len]);
            }
            _ => write(&mut self.arena.f32_mut(out)[..len]),
        }
    }

    /// out (N,OC) = x (N,IC) W (+ b), where `x` is bf16 under bf16 matmul inputs: then the
    /// GEMM is `gemm_bf16` (AVX-512 BF16 when the CPU has it) on W rounded to bf16, exact
    /// because the f32 weights were widened from the bf16 working copy.
    fn linear(&self, out: &mut [f32], x: BufId, roles: (Role, Role), n: usize, ic: usize) {
        let oc = out.len() / n;
        let (w, b) = (self.w(roles.0), self.bias(roles.1));
        match self.model.head.work_w_bf16 {
            Some(wb) if self.model.policy.bf16_matmul_inputs => {
                let mut wb = self.arena.bf16_mut(wb);
                let wb = &mut wb[..w.len()];
                convert::f32_to_bf16(wb, w);
                let x = self.arena.bf16(x);
                gemm_bf16::forward(out, &x[..n * ic], wb, b, n, ic, oc);
            }
            _ => matmul::forward(out, &self.arena.f32(x)[..n * ic], w, b, n, ic, oc),
        }
    }

    fn norm1(&self, inp: BufId, a: &BlockActs) {
        let stats = NormBufs {
            mean: a.ln1_mean,
            rstd: a.ln1_rstd,
        };
        self.norm(inp, a.ln1, stats, true);
    }

    fn norm2(&self, a: &BlockActs) {
        let stats = NormBufs {
            mean: a.ln2_mean,
            rstd: a.ln2_rstd,
        };
        self.norm(a.res2, a.ln2, stats, false);
    }

    /// qkv = ln1 Wqkv (+ b), then RoPE on q and k for Llama.
    fn qkv(&self, a: &BlockActs) {
        let s = &self.model.config.shape;
        let (n, c, qkv_w) = (self.d.n as usize, self.d.c as usize, self.d.qkv as usize);
        self.produce(a.qkv, n * qkv_w, |qkv| {
            self.linear(qkv, a.ln1, (Role::QkvWeight, Role::QkvBias), n, c);
            if !self.model.is_gpt2() {
                let (heads, hd) = ((s.n_heads + s.n_kv_heads) as usize, s.d_head as usize);
                let theta = self.model.config.rope_theta;
                rope::forward_rows(qkv, self.b, self.t, heads, hd, qkv_w, theta);
            }
        });
    }

    /// The attention core: atty from qkv, keeping `att` (materialised) or `lse` (flash).
    fn attention_core(&self, a: &BlockActs) {
        let s = &self.model.config.shape;
        let (nh, nkv, hd) = (s.n_heads as usize, s.n_kv_heads as usize, s.d_head as usize);
        let (n, b, t) = (self.d.n as usize, self.b, self.t);
        let qkv = backward::matmul_output(self.model, self.arena, a.qkv, n * self.d.qkv as usize);
        let qkv = &qkv[..n * self.d.qkv as usize];
        self.produce(a.atty, n * self.d.atty as usize, |atty| {
            match (a.att, a.lse) {
                (Some(att), _) => {
                    let mut att = self.arena.f32_mut(att);
                    let att = &mut att[..self.d.att as usize];
                    attention::forward(atty, att, qkv, b, t, nh, nkv, hd);
                }
                (None, Some(lse)) => {
                    let mut lse = self.arena.f32_mut(lse);
                    let lse = &mut lse[..self.d.lse as usize];
                    flash::forward(atty, lse, qkv, b, t, nh, nkv, hd);
                }
                (None, None) => panic!("the plan keeps neither att nor lse"),
            }
        });
    }

    /// out = inp + x W (+ b): the projections back into the residual stream.
    fn project(&self, x: BufId, width: usize, inp: BufId, out: BufId, roles: (Role, Role)) {
        let (n, nc) = (self.d.n as usize, self.nc());
        let mut out = self.arena.f32_mut(out);
        let out = &mut out[..nc];
        self.linear(out, x, roles, n, width);
        residual::accumulate(out, &self.arena.f32(inp)[..nc]);
    }

    /// fch = ln2 Wfc (+ b).
    fn fc(&self, a: &BlockActs) {
        let (n, c, fc_w) = (self.d.n as usize, self.d.c as usize, self.d.fc as usize);
        let roles = (Role::FcWeight, Role::FcBias);
        self.produce(a.fch, n * fc_w, |fch| self.linear(fch, a.ln2, roles, n, c));
    }

    /// fch_act = GELU(fch) or SwiGLU(gate, up).
    fn activation(&self, a: &BlockActs) {
        let (n, fc_w, f) = (
            self.d.n as usize,
            self.d.fc as usize,
            self.d.fc_act as usize,
        );
        let fch = backward::matmul_output(self.model, self.arena, a.fch, n * fc_w);
        let inp = &fch[..n * fc_w];
        let gpt2 = self.model.is_gpt2();
        self.produce(a.fch_act, n * f, |out| {
            if gpt2 {
                gelu::forward(out, inp);
            } else {
                swiglu::forward(out, inp, n, f);
            }
        });
    }
}

/// Transformer block `layer` forward in the forward pass: writes what the plan has it write.
pub fn block(model: &Model, arena: &Arena, layer: usize, batch: usize, seq: usize) {
    let pass = BlockPass {
        inp: forward_input(model, layer),
        acts: model.forward_blocks[layer],
        write_out: true,
    };
    block_with(model, arena, layer, batch, seq, &pass);
}

/// Block `layer` forward into the buffers of `pass`.
pub fn block_with(
    model: &Model,
    arena: &Arena,
    layer: usize,
    batch: usize,
    seq: usize,
    pass: &BlockPass,
) {
    let cx = Ctx::new(model, arena, layer, batch, seq);
    let a = &pass.acts;
    cx.norm1(pass.inp, a);
    cx.qkv(a);
    cx.attention_core(a);
    let atty_w = cx.d.atty as usize;
    let proj = (Role::AttnProjWeight, Role::AttnProjBias);
    cx.project(a.atty, atty_w, pass.inp, a.res2, proj);
    cx.norm2(a);
    cx.fc(a);
    cx.activation(a);
    if pass.write_out {
        let f = cx.d.fc_act as usize;
        let proj = (Role::FcProjWeight, Role::FcProjBias);
        cx.project(a.fch_act, f, a.res2, a.out, proj);
    }
}

/// Megatron's selective recompute of block `layer`: the attention core again from the kept `qkv`
/// (the kept `atty` is written with the same bits), so the probabilities `att` exist only from
/// the block's backward on. A no-op under flash attention, which keeps no probabilities.
pub fn recompute_attention_core(
    model: &Model,
    arena: &Arena,
    layer: usize,
    batch: usize,
    seq: usize,
) {
    let a = &model.blocks[layer];
    if a.att.is_none() {
        return;
    }
    Ctx::new(model, arena, layer, batch, seq).attention_core(a);
}

/// keep-matmuls recompute of block `layer`: the norms, the attention core and the activation,
/// from the kept block input, `res2`, `qkv` and `fch`, into the buffers the backward reads.
pub fn recompute_cheap(model: &Model, arena: &Arena, layer: usize, batch: usize, seq: usize) {
    let cx = Ctx::new(model, arena, layer, batch, seq);
    let a = &model.blocks[layer];
    cx.norm1(block_input(model, layer), a);
    cx.attention_core(a);
    cx.norm2(a);
    cx.activation(a);
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
