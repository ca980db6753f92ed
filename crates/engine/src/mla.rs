//! Multi-head latent attention (DeepSeek-V2) as backend ops, forward and backward: queries
//! directly (`q_proj`) or through a bottleneck with its RMSNorm (`q_a_proj`, `q_a_layernorm`,
//! `q_b_proj`); `kv_a_proj_with_mqa` to a latent and a RoPE key shared by the heads; the
//! latent's RMSNorm and its expansion to each head's key and value (`kv_b_proj`). The queries,
//! keys and values are assembled into the fused q|k|v rows the attention kernels read (head
//! size nope + rope, values zero-padded to it: `kernels::mla`), RoPE turns interleaved pairs of
//! the rope columns, and the projection reads the values' columns of the kernel's output.
//!
//! Saved: `ln1`, the bottleneck and its norm (with q LoRA), the latent and its norm, the fused
//! rows and the attention's `att`/`lse`, its padded output and the values. The latents stay f32
//! under bf16 (their matmuls run in f32); `qkv` and the values follow the bf16 policy.
//!
//! Example: `forward::block_with` runs `mla::qkv(&cx, acts)` in place of the q|k|v projection.

use crate::backend::ops::*;
use crate::backend::{Backend, MlaDims, MlaOp, Tensor};
use crate::forward::Ctx;
use crate::model::{BlockActs, MlaWork, Model};
use plan_frugal::acts::BlockDims;
use plan_frugal::family::LATENT_NORM_EPS;
use plan_frugal::units::Role;

pub fn dims(d: &BlockDims) -> (plan_frugal::acts::MlaDims, MlaDims) {
    let a = d.mla.expect("a latent-attention block");
    (a, kernel_dims(a))
}

/// The kernels' view of a layer's latent-attention sizes.
pub fn kernel_dims(a: plan_frugal::acts::MlaDims) -> MlaDims {
    MlaDims {
        heads: a.heads as usize,
        nope: a.nope as usize,
        rope: a.rope as usize,
        v: a.v as usize,
        rank: a.kv_rank as usize,
    }
}

pub fn work(model: &Model) -> MlaWork {
    model
        .mla
        .expect("a latent-attention model has its row buffers")
}

pub fn must(t: Option<Tensor>) -> Tensor {
    t.expect("the plan keeps this latent-attention tensor")
}

/// RMSNorm of a latent (HF's fixed epsilon).
pub fn latent_norm<B: Backend>(
    cx: &Ctx<'_, B>,
    inp: Tensor,
    out: Tensor,
    rstd: Tensor,
    role: Role,
) {
    let (n, c) = (cx.d.n as usize, inp.len / cx.d.n as usize);
    // A matmul input: bf16 under `--precision bf16`, written through `work.f32`.
    cx.produce(out, n * c, |dst| {
        let op = NormOp {
            out: dst,
            rstd: rstd.prefix(n),
            inp,
            weight: cx.w(role),
            kind: NormKind::Rms {
                eps: LATENT_NORM_EPS,
            },
            n,
            c,
        };
        cx.be.norm(cx.arena, &op);
    });
}

/// qkv from ln1: the query path, the latent path, their assembly and RoPE.
pub fn qkv<B: Backend>(cx: &Ctx<'_, B>, a: &BlockActs) {
    let (model, arena, be) = (cx.model, cx.arena, cx.be);
    let (m, k) = dims(&cx.d);
    let w = work(model);
    let (n, c) = (cx.d.n as usize, cx.d.c as usize);
    let q = w.q.prefix(n * k.heads * k.qk());
    match m.q_rank {
        Some(rq) => {
            let rq = rq as usize;
            let qa = must(a.qa).prefix(n * rq);
            cx.dense(qa, a.ln1, cx.w(Role::MlaQa), None, (n, c));
            let qa_norm = must(a.qa_norm).prefix(n * rq);
            latent_norm(cx, qa, qa_norm, must(a.qa_rstd), Role::MlaQaNorm);
            cx.dense(q, qa_norm, cx.w(Role::MlaQb), None, (n, rq));
        }
        None => cx.dense(q, a.ln1, cx.w(Role::MlaQ), None, (n, c)),
    }
    let ckv = w.ckv.prefix(n * (k.rank + k.rope));
    cx.dense(ckv, a.ln1, cx.w(Role::MlaKva), None, (n, c));
    let latent = must(a.kv_latent).prefix(n * k.rank);
    let op = MlaOp::Latent {
        latent,
        ckv,
        n,
        dims: k,
        back: false,
    };
    crate::backend::moe_ops(be).mla(arena, &op);
    let kv_norm = must(a.kv_norm).prefix(n * k.rank);
    latent_norm(cx, latent, kv_norm, must(a.kv_rstd), Role::MlaKvNorm);
    let kv = w.kv.prefix(n * k.heads * (k.nope + k.v));
    cx.dense(kv, kv_norm, cx.w(Role::MlaKvb), None, (n, k.rank));
    let (b, t) = cx.pass();
    cx.produce(a.qkv, n * cx.d.qkv as usize, |dst| {
        let op = MlaOp::Assemble {
            qkv: dst,
            q,
            kv,
            ckv,
            n,
            dims: k,
        };
        crate::backend::moe_ops(be).mla(arena, &op);
        let rope = MlaOp::Rope {
            qkv: dst,
            batch: b,
            seq: t,
            dims: k,
            theta: model.config.rope_theta,
            inverse: false,
        };
        crate::backend::moe_ops(be).mla(arena, &rope);
    });
}

/// After the attention kernel wrote the padded output: the values' columns into `atty`.
pub fn take_values<B: Backend>(cx: &Ctx<'_, B>, a: &BlockActs) {
    let (_, k) = dims(&cx.d);
    let n = cx.d.n as usize;
    let padded = must(a.atty_pad).prefix(n * k.heads * k.qk());
    cx.produce(a.atty, n * cx.d.atty as usize, |out| {
        let op = MlaOp::TakeValues {
            out,
            padded,
            n,
            dims: k,
        };
        crate::backend::moe_ops(cx.be).mla(cx.arena, &op);
    });
}
