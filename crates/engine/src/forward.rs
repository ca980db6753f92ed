//! The forward pass, block by block, as backend ops: embedding, a transformer block of the
//! model's family design, final norm, and the pieces of a block the backward recomputes. Every
//! tensor lives in the arena; this file only names which ops run on which tensors.
//!
//! A pass may cover fewer rows than the buffers were planned for (`batch` ≤ micro-batch,
//! `seq` ≤ planned sequence: sampling runs one row of a growing prefix), so every tensor is cut
//! to the pass's length. A block is a fixed sequence of steps (norm1, qkv (+ RoPE), attention
//! core, projection, norm2, fc, activation, fc projection), whatever the family: the design
//! says which norm, positions and MLP activation; latent attention (`mla`) builds the q|k|v rows
//! its own way and a mixture of experts (`moe`) replaces fc..fc projection. Attention is materialised (`att`, B·NH·T·T) or
//! flash (`lse`, B·NH·T), as the plan chose. Recompute (see `recompute`) reruns all or some of
//! the steps into the buffers the backward reads, with the same ops, so the values are
//! bit-identical. Under bf16 a step that produces a bf16 tensor writes f32 into `work.f32` and
//! rounds once; a bf16 `qkv`/`fch` is widened into `work.f32_in` for the f32 kernels. The
//! residual stream is saved in bf16 too: a block widens its input into `work.resid_in`, adds
//! `res2` in `work.resid_mid` and its output over its input's rows, rounding each once into
//! its saved tensor and keeping the rounded values (`settle`), so the forward, a recompute
//! and the backward all read the same.
//!
//! Example: `forward::embed(model, arena, b, t); for l in 0..L { forward::block(model, arena, l, b, t) }`
//! inside the arena's `Embed` and `Forward(l)` phases.

use crate::arena::Arena;
use crate::backend::ops::*;
use crate::backend::{Backend, DType, Tensor};
use crate::model::{BlockActs, Model};
use plan_frugal::acts::BlockDims;
use plan_frugal::family::Positions;
use plan_frugal::units::{Role, UnitKind};

mod rows;
pub use rows::{attn_shape, norm_kind, rope_shape, widened};
use rows::{residual_target, settle};

/// Token (and position) embedding into `act.encoded`.
pub fn embed<B: Backend>(model: &Model, arena: &Arena<B>, batch: usize, seq: usize) {
    let (n, c) = (batch * seq, model.config.shape.d_model as usize);
    let h = &model.head;
    // Tensor parallelism: each rank embeds the tokens of its vocabulary slice, rank 0 adds the
    // positions, and the sum over the ranks is the embedding.
    let (first, replicated) = model.vocab_first();
    // 2-byte tables (bf16 units) are read where they lie, or at stage 3 as gathered.
    let table = |role| model.weight(arena, UnitKind::Embed, role);
    // Under bf16 the sum lands in f32 and is rounded once into the saved residual stream.
    let local = crate::sp::rows(model, n).1 * c;
    let encoded = residual_target(h.encoded, local, model.work.resid_in);
    let op = Embedding {
        out: crate::sp::partial_target(model, encoded, n * c),
        tokens: h.tokens.prefix(n),
        wte: table(Role::TokenEmbedding),
        wpe: (model.design.positions == Positions::Learned && replicated)
            .then(|| table(Role::PositionEmbedding)),
        batch,
        seq,
        c,
        shard: model.tp.as_ref().map(|_| first),
    };
    arena.backend().embedding(arena, &op);
    crate::sp::sum_partial(model, arena, encoded, n * c);
    settle(arena, h.encoded.prefix(local), encoded);
    if let Some(moe) = model.moe {
        // A new pass: its load-balancing statistics start from zero.
        arena.backend().fill(arena, moe.aux, 0.0);
    }
}

/// The residual stream entering block `layer` as `blocks` hold it: `act.encoded`, or the
/// previous block's output.
pub fn block_input(model: &Model, blocks: &[BlockActs], layer: usize) -> Tensor {
    if layer == 0 {
        model.head.encoded
    } else {
        blocks[layer - 1].out
    }
}

/// The buffers one run of a block reads and writes.
pub struct BlockPass {
    /// The block's input (the residual stream).
    pub inp: Tensor,
    /// Where its tensors go.
    pub acts: BlockActs,
    /// Whether to compute the output (not when recomputing a segment's last block, whose output
    /// the forward pass kept).
    pub write_out: bool,
    /// Whether this is the forward pass (a recompute adds nothing to the load-balancing
    /// statistics).
    pub forward_pass: bool,
}

/// One block's weights and the pass's sizes, shared by the steps below.
pub struct Ctx<'a, B: Backend> {
    pub model: &'a Model,
    pub arena: &'a Arena<B>,
    pub be: &'a B,
    pub kind: UnitKind,
    b: usize,
    t: usize,
    pub d: BlockDims,
    /// LoRA: where this pass keeps each matrix's adapter output.
    lora_u: [Option<Tensor>; 4],
}

impl<'a, B: Backend> Ctx<'a, B> {
    pub fn new(
        model: &'a Model,
        arena: &'a Arena<B>,
        layer: usize,
        b: usize,
        t: usize,
    ) -> Ctx<'a, B> {
        Ctx {
            model,
            arena,
            be: arena.backend(),
            kind: UnitKind::Block(layer as u32),
            b,
            t,
            d: model.dims(layer, b, t),
            lora_u: [None; 4],
        }
    }

    pub fn w(&self, role: Role) -> Tensor {
        self.model.weight(self.arena, self.kind, role)
    }

    fn bias(&self, role: Role) -> Option<Tensor> {
        self.model.try_weight(self.arena, self.kind, role)
    }

    /// The norms' region: rows × d_model (this rank's rows under sequence parallelism).
    fn nc(&self) -> usize {
        (self.d.local * self.d.c) as usize
    }

    fn n(&self) -> usize {
        self.d.n as usize
    }

    /// The pass's (batch, seq).
    pub fn pass(&self) -> (usize, usize) {
        (self.b, self.t)
    }

    /// Norm of `inp` into `out` (with its statistics); `first` picks norm1 or norm2's weights.
    fn norm(&self, inp: Tensor, out: Tensor, mean: Option<Tensor>, rstd: Tensor, first: bool) {
        let (weight, bias) = match first {
            true => (Role::Norm1Weight, Role::Norm1Bias),
            false => (Role::Norm2Weight, Role::Norm2Bias),
        };
        let (n, c, nc) = (self.d.local as usize, self.d.c as usize, self.nc());
        let kind = norm_kind(self.model, mean.map(|m| m.prefix(n)), self.bias(bias));
        let weight = self.w(weight);
        self.produce(out, nc, |dst| {
            let op = NormOp {
                out: dst,
                rstd: rstd.prefix(n),
                inp: inp.prefix(nc),
                weight,
                kind,
                n,
                c,
            };
            self.be.norm(self.arena, &op);
        });
    }

    /// Runs the f32 op `write` into the first `len` elements of `out`: directly when `out` is
    /// f32, else (a bf16 matmul input, `qkv` or `fch`) into `work.f32` and rounded once.
    pub fn produce(&self, out: Tensor, len: usize, write: impl FnOnce(Tensor)) {
        if out.dtype == DType::F32 {
            return write(out.prefix(len));
        }
        let work = self
            .model
            .work
            .f32
            .expect("bf16 tensors have an f32 workspace");
        write(work.prefix(len));
        self.be
            .convert(self.arena, out.prefix(len), work.prefix(len));
    }

    /// A saved matmul output (`qkv`, `fch`) as f32: itself, or widened into `work.f32_in`.
    fn matmul_output(&self, t: Tensor, len: usize) -> Tensor {
        widened(self.arena, t, len, self.model.work.f32_in)
    }

    /// out (N,OC) = x (N,IC) W (+ b): the one choke point of the block's projections (under LoRA
    /// the frozen matrix part by part and its adapters, `lora::LoraModel::linear`). A bf16
    /// `x` runs the bf16 GEMM on W's 2-byte weights where they lie (`ActPolicy::bf16_units`).
    fn linear(&self, out: Tensor, x: Tensor, roles: (Role, Role), ic: usize) {
        let n = self.n();
        if let (Some(lora), UnitKind::Block(layer)) = (&self.model.lora, self.kind) {
            let u = self.lora_u[crate::lora::matrix_index(roles.0)];
            let io = (out, x, self.bias(roles.1));
            return lora.linear(self.model, self.arena, layer as usize, roles.0, io, u, n);
        }
        self.dense(out, x, self.w(roles.0), self.bias(roles.1), (n, ic));
    }

    /// out (rows, OC) = x (rows, IC) `weight`ᵀ (+ b) for a plain weight tensor (an expert's
    /// rows of a fused view): the bf16 GEMM when both are bf16, else fp32.
    pub fn dense(
        &self,
        out: Tensor,
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        (n, ic): (usize, usize),
    ) {
        let shape = LinearShape {
            n,
            ic,
            oc: out.len / n,
        };
        assert_eq!(
            x.dtype, w.dtype,
            "a GEMM's input and weight share their type"
        );
        let op = Linear {
            kind: LinearKind::Dense,
            out,
            inp: x.prefix(n * ic),
            weight: w,
            bias,
            shape,
        };
        self.be.linear(self.arena, &op);
    }

    fn norm1(&self, inp: Tensor, a: &BlockActs) {
        self.norm(inp, a.ln1, a.ln1_mean, a.ln1_rstd, true);
    }

    /// norm2 of `res2` (f32: the saved tensor, or its widened rows).
    pub fn norm2(&self, res2: Tensor, a: &BlockActs) {
        self.norm(res2, a.ln2, a.ln2_mean, a.ln2_rstd, false);
    }

    /// qkv = ln1 Wqkv (+ b), then RoPE on q and k where the family rotates positions.
    fn qkv(&self, a: &BlockActs) {
        let (n, c, qkv_w) = (self.n(), self.d.c as usize, self.d.qkv as usize);
        self.produce(a.qkv, n * qkv_w, |qkv| {
            let ln1 = crate::sp::gathered(self.model, self.arena, a.ln1, self.nc());
            self.linear(qkv, ln1, (Role::QkvWeight, Role::QkvBias), c);
            if self.model.design.positions == Positions::Rope {
                self.be
                    .rope(self.arena, qkv, rope_shape(self.model, self.b, self.t));
            }
        });
    }

    /// The attention core: atty from qkv, keeping `att` (materialised) or `lse` (flash).
    pub fn attention_core(&self, a: &BlockActs) {
        let n = self.n();
        let qkv = self.matmul_output(a.qkv, n * self.d.qkv as usize);
        let kernel = match (a.att, a.lse) {
            (Some(att), _) => AttnKernel::Materialised {
                att: att.prefix(self.d.att as usize),
            },
            (None, Some(lse)) => AttnKernel::Flash {
                lse: lse.prefix(self.d.lse as usize),
            },
            (None, None) => panic!("the plan keeps neither att nor lse"),
        };
        let shape = attn_shape(self.model, self.kind, self.b, self.t);
        // Latent attention's kernel output has each head's value padded to the head size.
        let (target, width) = match a.atty_pad {
            Some(pad) => (pad, shape.n_heads * shape.head_dim),
            None => (a.atty, self.d.atty as usize),
        };
        self.produce(target, n * width, |out| {
            let op = Attention {
                out,
                qkv,
                kernel,
                shape,
            };
            self.be.attention(self.arena, &op);
        });
        if a.atty_pad.is_some() {
            crate::mla::take_values(self, a);
        }
    }

    /// out = inp + x W (+ b): the projections back into the residual stream.
    /// Tensor parallelism: a row-parallel projection of this rank's columns, summed over the
    /// ranks (rank 0 adds the bias) before the residual.
    fn project(&self, x: Tensor, width: usize, inp: Tensor, out: Tensor, roles: (Role, Role)) {
        let (nc, all) = (self.nc(), self.n() * self.d.c as usize);
        match &self.model.tp {
            Some(tp) => {
                let bias = self.bias(roles.1).filter(|_| tp.rank == 0);
                let target = crate::sp::partial_target(self.model, out, all);
                self.dense(target, x, self.w(roles.0), bias, (self.n(), width));
                crate::sp::sum_partial(self.model, self.arena, out, all);
            }
            None => self.linear(out.prefix(nc), x, roles, width),
        }
        self.be
            .residual_add(self.arena, out.prefix(nc), inp.prefix(nc));
    }

    /// fch = ln2 Wfc (+ b).
    fn fc(&self, a: &BlockActs) {
        let (n, c, fc_w) = (self.n(), self.d.c as usize, self.d.fc as usize);
        let roles = (Role::FcWeight, Role::FcBias);
        let ln2 = crate::sp::gathered(self.model, self.arena, a.ln2, self.nc());
        self.produce(a.fch, n * fc_w, |fch| self.linear(fch, ln2, roles, c));
    }

    /// fch_act = GELU(fch) or SwiGLU(gate, up), as the family's MLP says (over all N·k routed
    /// rows of a mixture of experts).
    pub fn activation(&self, a: &BlockActs) {
        let n = self.d.routed() as usize;
        let (fc_w, f) = (self.d.fc as usize, self.d.fc_act as usize);
        let inp = self.matmul_output(a.fch, n * fc_w);
        self.produce(a.fch_act, n * f, |out| {
            let op = Activation {
                out,
                inp,
                kind: self.model.design.mlp,
                n,
                width: f,
            };
            self.be.activation(self.arena, &op);
        });
    }
}

/// Transformer block `layer` forward in the forward pass: writes what the plan has it write.
pub fn block<B: Backend>(model: &Model, arena: &Arena<B>, layer: usize, batch: usize, seq: usize) {
    let pass = BlockPass {
        inp: block_input(model, &model.forward_blocks, layer),
        acts: model.forward_blocks[layer],
        write_out: true,
        forward_pass: true,
    };
    block_with(model, arena, layer, batch, seq, &pass);
}

/// Block `layer` forward into the buffers of `pass`.
pub fn block_with<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    layer: usize,
    batch: usize,
    seq: usize,
    pass: &BlockPass,
) {
    let a = &pass.acts;
    let cx = Ctx {
        lora_u: a.lora_u,
        ..Ctx::new(model, arena, layer, batch, seq)
    };
    // The residual stream in f32: the saved input itself, or (bf16) widened into
    // `work.resid_in`; res2 and the output are added in f32 and rounded once into their saved
    // bf16 tensors (`settle`), the f32 rows keeping the rounded values every reader sees.
    let nc = cx.nc();
    let inp = widened(arena, pass.inp, nc, model.work.resid_in);
    cx.norm1(inp, a);
    if model.design.mla {
        crate::mla::qkv(&cx, a);
    } else {
        cx.qkv(a);
    }
    cx.attention_core(a);
    let atty_w = cx.d.atty as usize;
    let proj = (Role::AttnProjWeight, Role::AttnProjBias);
    let res2 = residual_target(a.res2, nc, model.work.resid_mid);
    cx.project(a.atty, atty_w, inp, res2, proj);
    settle(arena, a.res2.prefix(nc), res2);
    cx.norm2(res2, a);
    // The output over the input's rows (no longer read).
    let out = residual_target(a.out, nc, model.work.resid_in);
    if cx.d.experts > 0 {
        crate::moe::forward(&cx, a, (res2, out), pass.write_out, pass.forward_pass);
        if pass.write_out {
            settle(arena, a.out.prefix(nc), out);
        }
        return;
    }
    cx.fc(a);
    cx.activation(a);
    if pass.write_out {
        let f = cx.d.fc_act as usize;
        let proj = (Role::FcProjWeight, Role::FcProjBias);
        cx.project(a.fch_act, f, res2, out, proj);
        settle(arena, a.out.prefix(nc), out);
    } else if let Some(lora) = &model.lora {
        // The output is kept, but the backward reads the projection's adapter output.
        let role = Role::FcProjWeight;
        let u = a.lora_u[crate::lora::matrix_index(role)];
        lora.adapter_u(model, arena, layer, role, a.fch_act, u, cx.n());
    }
}

/// keep-matmuls recompute of block `layer`: the norms, the attention core and the activation,
/// from the kept block input, `res2`, `qkv` and `fch`, into the tensors `blocks` hold.
pub fn recompute_cheap<B: Backend>(
    model: &Model,
    arena: &Arena<B>,
    blocks: &[BlockActs],
    layer: usize,
    (batch, seq): (usize, usize),
) {
    let cx = Ctx::new(model, arena, layer, batch, seq);
    let a = &blocks[layer];
    let nc = cx.nc();
    let inp = widened(
        arena,
        block_input(model, blocks, layer),
        nc,
        model.work.resid_in,
    );
    cx.norm1(inp, a);
    cx.attention_core(a);
    cx.norm2(widened(arena, a.res2, nc, model.work.resid_mid), a);
    cx.activation(a);
    if cx.d.shared > 0 {
        crate::moe::shared_activation(&cx, a);
    }
}

/// Final norm of the last block's output into `act.lnf`.
pub fn final_norm<B: Backend>(model: &Model, arena: &Arena<B>, batch: usize, seq: usize) {
    let (n, c) = (batch * seq, model.config.shape.d_model as usize);
    let h = &model.head;
    let weight = model.weight(arena, UnitKind::Head, Role::FinalNormWeight);
    let bias = model.try_weight(arena, UnitKind::Head, Role::FinalNormBias);
    let last = model.forward_blocks[model.forward_blocks.len() - 1].out;
    // Sequence parallelism: this rank's rows into its part of `act.lnf`, then gathered whole.
    let (first, rows) = crate::sp::rows(model, n);
    let op = NormOp {
        out: h.lnf.slice(first * c..(first + rows) * c),
        rstd: h.lnf_rstd.prefix(rows),
        inp: widened(arena, last, rows * c, model.work.resid_in),
        weight,
        kind: norm_kind(model, h.lnf_mean.map(|m| m.prefix(rows)), bias),
        n: rows,
        c,
    };
    arena.backend().norm(arena, &op);
    if model.sp.is_some() {
        let tp = model.tp.as_ref().expect("a tensor-parallel group");
        tp.collective(arena, CommOp::AllGatherInPlace(h.lnf.prefix(n * c)));
    }
}
