//! The CPU backend's forward and backward ops: each borrows its tensors as slices and calls the
//! `kernels` crate, exactly as the engine's model code did before the backend seam.
//!
//! Example: `linear(arena, &op)` runs `matmul::forward` on an f32 input and `gemm_bf16::forward`
//! on a bf16 one.

use super::Cpu;
use crate::{Elem, Views};
use engine::arena::Arena;
use engine::backend::ops::*;
use engine::backend::{DType, Tensor};
use half::{bf16, f16};
use kernels::classifier::{Io, VocabShard};
use kernels::{
    attention, classifier, convert, embedding, flash, gelu, gemm_bf16, layernorm, matmul, residual,
    rmsnorm, rope, swiglu,
};
use plan_frugal::family::Mlp;

type A = Arena<Cpu>;

pub fn embedding_forward(a: &A, op: &Embedding) {
    let tokens = a.view::<u32>(op.tokens);
    if op.wte.dtype == DType::Bf16 {
        let (wte, wpe) = (a.view::<bf16>(op.wte), op.wpe.map(|t| a.view::<bf16>(t)));
        let mut out = a.view_mut::<f32>(op.out);
        let shape = (op.batch, op.seq, op.c);
        let first = op.shard.unwrap_or(0);
        return embedding::forward_bf16(&mut out, &tokens, &wte, wpe.as_deref(), shape, first);
    }
    let wte = a.view::<f32>(op.wte);
    let wpe = op.wpe.map(|t| a.view::<f32>(t));
    let mut out = a.view_mut::<f32>(op.out);
    let (b, t, c) = (op.batch, op.seq, op.c);
    match op.shard {
        Some(first) => {
            embedding::forward_shard(&mut out, &tokens, &wte, wpe.as_deref(), (b, t, c), first)
        }
        None => embedding::forward(&mut out, &tokens, &wte, wpe.as_deref(), b, t, c),
    }
}

pub fn norm(a: &A, op: &NormOp) {
    let inp = a.view::<f32>(op.inp);
    let weight = a.view::<f32>(op.weight);
    let mut out = a.view_mut::<f32>(op.out);
    let mut rstd = a.view_mut::<f32>(op.rstd);
    let (n, c) = (op.n, op.c);
    match op.kind {
        NormKind::Layer { mean, bias } => {
            let mut mean = a.view_mut::<f32>(mean);
            let bias = a.view::<f32>(bias);
            layernorm::forward(&mut out, &mut mean, &mut rstd, &inp, &weight, &bias, n, c);
        }
        NormKind::Rms { eps } => rmsnorm::forward(&mut out, &mut rstd, &inp, &weight, n, c, eps),
    }
}

pub fn linear(a: &A, op: &Linear) {
    let LinearKind::Dense = op.kind;
    let s = op.shape;
    let bias = op.bias.map(|t| a.view::<f32>(t));
    let mut out = a.view_mut::<f32>(op.out);
    match op.inp.dtype {
        DType::Bf16 => {
            let (x, w) = (a.view::<bf16>(op.inp), a.view::<bf16>(op.weight));
            gemm_bf16::forward(&mut out, &x, &w, bias.as_deref(), s.n, s.ic, s.oc);
        }
        _ => {
            let (x, w) = (a.view::<f32>(op.inp), a.view::<f32>(op.weight));
            matmul::forward(&mut out, &x, &w, bias.as_deref(), (s.n, s.ic, s.oc));
        }
    }
}

pub fn rope_rows(a: &A, qkv: Tensor, s: RopeShape, backward: bool) {
    let mut x = a.view_mut::<f32>(qkv);
    let (b, t, h, hd, w) = (s.batch, s.seq, s.heads, s.head_dim, s.row_width);
    if backward {
        rope::backward_rows(&mut x, (b, t), (h, hd, w), s.theta);
    } else {
        rope::forward_rows(&mut x, (b, t), (h, hd, w), s.theta);
    }
}

pub fn attention_forward(a: &A, op: &Attention) {
    let s = op.shape;
    let qkv = a.view::<f32>(op.qkv);
    let mut out = a.view_mut::<f32>(op.out);
    match op.kernel {
        AttnKernel::Materialised { att } => {
            let mut att = a.view_mut::<f32>(att);
            attention::forward(&mut out, &mut att, &qkv, s);
        }
        AttnKernel::Flash { lse } => {
            let mut lse = a.view_mut::<f32>(lse);
            flash::forward(&mut out, &mut lse, &qkv, s);
        }
    }
}

pub fn activation_forward(a: &A, op: &Activation) {
    let inp = a.view::<f32>(op.inp);
    let mut out = a.view_mut::<f32>(op.out);
    match op.kind {
        Mlp::Gelu => gelu::forward(&mut out, &inp),
        Mlp::SwiGlu => swiglu::forward(&mut out, &inp, op.n, op.width),
    }
}

pub fn residual_add(a: &A, out: Tensor, inp: Tensor) {
    let inp = a.view::<f32>(inp);
    residual::accumulate(&mut a.view_mut::<f32>(out), &inp);
}

pub fn convert(a: &A, dst: Tensor, src: Tensor) {
    assert_eq!(dst.len, src.len, "convert keeps the element count");
    match (dst.dtype, src.dtype) {
        (DType::Bf16, DType::F32) => {
            let src = a.view::<f32>(src);
            convert::f32_to_bf16(&mut a.view_mut::<bf16>(dst), &src);
        }
        (DType::F16, DType::F32) => {
            let src = a.view::<f32>(src);
            convert::f32_to_f16(&mut a.view_mut::<f16>(dst), &src);
        }
        (DType::F32, DType::Bf16) => {
            let src = a.view::<bf16>(src);
            convert::bf16_to_f32(&mut a.view_mut::<f32>(dst), &src);
        }
        (DType::F32, DType::F16) => {
            let src = a.view::<f16>(src);
            convert::f16_to_f32(&mut a.view_mut::<f32>(dst), &src);
        }
        // A copy (a pipeline's exchange and stash: f32 rows, raw bytes).
        (DType::F32, DType::F32) => {
            let src = a.view::<f32>(src);
            a.view_mut::<f32>(dst).copy_from_slice(&src);
        }
        (DType::U8, DType::U8) => {
            let src = a.view::<u8>(src);
            a.view_mut::<u8>(dst).copy_from_slice(&src);
        }
        (d, s) => panic!("no conversion from {s:?} to {d:?}"),
    }
}

/// The whole `work.classifier` buffer as bf16 elements (the bf16 classifier carves it).
fn raw_scratch(a: &A, scratch: Tensor) -> Tensor {
    a.tensor(scratch.buf, DType::Bf16)
}

pub fn classifier_logits(a: &A, op: &ClassifierLogits) {
    let (lnf, weight) = (a.view::<f32>(op.lnf), a.view::<bf16>(op.weight));
    let mut raw = a.view_mut::<bf16>(raw_scratch(a, op.scratch));
    let (rows, c, v) = (op.rows, op.c, op.v);
    classifier::bf16::logits(&mut raw, &lnf[..rows * c], &weight, rows, c, v);
}

/// The classifier's views, the table in `W`, handed to `run` as one [`Io`].
fn with_io<W: Elem>(
    a: &A,
    op: &Classifier,
    scratch: Tensor,
    run: impl FnOnce(Io<'_, W>) -> f32,
) -> f32 {
    let (lnf, weight, targets) = (
        a.view::<f32>(op.lnf),
        a.view::<W>(op.weight),
        a.view::<u32>(op.targets),
    );
    let (mut losses, mut dlnf) = (a.view_mut::<f32>(op.losses), a.view_mut::<f32>(op.dlnf));
    let mut scratch = a.view_mut::<W>(scratch);
    let mut dweight = op.dweight.map(|d| a.view_mut::<W>(d));
    let dw = dweight.as_deref_mut();
    run(Io::new(
        &mut losses,
        &mut dlnf,
        dw,
        &lnf,
        &weight,
        &targets,
        &mut scratch,
    ))
}

/// The fused classifier over the whole vocabulary, or (`shard`) over this rank's rows of it; on
/// bf16 operands when the weight is the bf16 working copy.
pub fn classifier(a: &A, op: &Classifier, shard: Option<ClassifierShard<'_>>) -> f32 {
    let mut stats = shard.as_ref().map(|s| a.view_mut::<f32>(s.stats));
    let vocab = (shard.zip(stats.as_deref_mut())).map(|(s, stats)| VocabShard {
        first: s.first,
        stats,
        reduce: s.reduce,
    });
    let (shape, dloss) = ((op.n, op.c, op.v), op.dloss);
    if op.weight.dtype == DType::Bf16 {
        let raw = raw_scratch(a, op.scratch);
        return with_io::<bf16>(a, op, raw, |io| {
            classifier::bf16::forward_backward(io, shape, dloss, vocab)
        });
    }
    with_io::<f32>(a, op, op.scratch, |io| match vocab {
        None => classifier::forward_backward(io, shape, dloss),
        Some(vocab) => classifier::shard::forward_backward(io, shape, dloss, vocab),
    })
}

pub fn embedding_backward(a: &A, op: &EmbeddingBackward) {
    let (dout, tokens) = (a.view::<f32>(op.dout), a.view::<u32>(op.tokens));
    if op.dwte.dtype == DType::Bf16 {
        let mut parts = a.parts_mut::<bf16, 2>([Some(op.dwte), op.dwpe]);
        let [dwte, dwpe] = &mut parts.parts;
        let dwte = dwte.as_deref_mut().expect("a token table");
        let (shape, first) = ((op.batch, op.seq, op.c), op.shard.unwrap_or(0));
        let mut order = a.view_mut::<u32>(op.order.expect("work.embed_order"));
        let dwpe = dwpe.as_deref_mut();
        return embedding::backward_bf16(dwte, dwpe, &dout, &tokens, &mut order, shape, first);
    }
    let mut parts = a.parts_mut::<f32, 2>([Some(op.dwte), op.dwpe]);
    let [dwte, dwpe] = &mut parts.parts;
    let dwte = dwte.as_deref_mut().expect("a token table");
    let (b, t, c) = (op.batch, op.seq, op.c);
    match op.shard {
        Some(first) => {
            embedding::backward_shard(dwte, dwpe.as_deref_mut(), &dout, &tokens, (b, t, c), first)
        }
        None => embedding::backward(dwte, dwpe.as_deref_mut(), &dout, &tokens, b, t, c),
    }
}

pub fn norm_backward(a: &A, op: &NormBackward) {
    let (dout, inp, weight, rstd) = (
        a.view::<f32>(op.dout),
        a.view::<f32>(op.inp),
        a.view::<f32>(op.weight),
        a.view::<f32>(op.rstd),
    );
    let mut dinp = a.view_mut::<f32>(op.dinp);
    let (n, c) = (op.n, op.c);
    match op.kind {
        NormGradKind::Layer { mean, dbias } => {
            let mean = a.view::<f32>(mean);
            let mut parts = a.parts_mut::<f32, 2>([op.dweight, dbias]);
            let params = match &mut parts.parts {
                [Some(dw), Some(db)] => Some((&mut **dw, &mut **db)),
                [None, None] => None,
                _ => unreachable!("a LayerNorm's weight and bias train together"),
            };
            layernorm::backward(&mut dinp, params, &dout, &inp, &weight, &mean, &rstd, n, c);
        }
        NormGradKind::Rms => {
            let mut dw = op.dweight.map(|d| a.view_mut::<f32>(d));
            let dw = dw.as_deref_mut();
            rmsnorm::backward(&mut dinp, dw, &dout, &inp, &weight, &rstd, n, c);
        }
    }
}

pub fn linear_backward(a: &A, op: &LinearBackward) {
    let LinearKind::Dense = op.kind;
    let s = op.shape;
    let dout = a.view::<f32>(op.dout);
    let mut dinp = a.view_mut::<f32>(op.dinp);
    let Some(scratch) = op.bf16 else {
        let mut parts = a.parts_mut::<f32, 2>([Some(op.dweight), op.dbias]);
        let [dw, db] = &mut parts.parts;
        let dw = dw.as_deref_mut().expect("a weight gradient");
        let (inp, weight) = (a.view::<f32>(op.inp), a.view::<f32>(op.weight));
        let db = db.as_deref_mut();
        return matmul::backward(&mut dinp, dw, db, &dout, &inp, &weight, (s.n, s.ic, s.oc));
    };
    bf16_linear_backward(
        a,
        &scratch,
        s,
        &mut dinp,
        op.dweight,
        &dout,
        (op.inp, op.weight),
    );
    if let Some(db) = op.dbias {
        let mut db = a.view_mut::<f32>(db);
        for row in dout.chunks_exact(s.oc) {
            for (d, &x) in db.iter_mut().zip(row) {
                *d += x;
            }
        }
    }
}

/// dinp += dout·W and dW += doutᵀ·inp as two `gemm_bf16::gemm_nn` GEMMs (AVX-512 BF16 when the
/// CPU has it) on bf16 operands, as torch autocast does (dout rounded to bf16, f32
/// accumulation). W (OC, IC) and inp (N, IC) are read where they lie (2-byte units); only dout
/// is transposed (the weight gradient reduces over rows). dW is 2-byte (`ActPolicy`'s
/// `bf16_units`) and takes the product with one rounding (`gemm_nn_bf16`).
fn bf16_linear_backward(
    a: &A,
    s: &Bf16Scratch,
    shape: LinearShape,
    dinp: &mut [f32],
    dweight: Tensor,
    dout: &[f32],
    (inp, weight): (Tensor, Tensor),
) {
    let (n, ic, oc) = (shape.n, shape.ic, shape.oc);
    let (mut g, mut gt) = (a.view_mut::<bf16>(s.dout), a.view_mut::<bf16>(s.dout_t));
    let (g, gt) = (&mut g[..n * oc], &mut gt[..oc * n]);
    convert::f32_to_bf16(g, dout);
    let w = a.view::<bf16>(weight);
    gemm_bf16::gemm_nn(
        &mut dinp[..n * ic],
        g,
        &w,
        (n, ic, oc),
        gemm_bf16::Accum::Add,
    );
    gemm_bf16::transpose(gt, g, n, oc);
    let x = a.view::<bf16>(inp);
    let mut dw = a.view_mut::<bf16>(dweight);
    gemm_bf16::gemm_nn_bf16(&mut dw, gt, &x, (oc, ic, n), gemm_bf16::Accum::Add);
}

pub fn attention_backward(a: &A, op: &AttentionBackward) {
    let s = op.shape;
    let (dout, qkv) = (a.view::<f32>(op.dout), a.view::<f32>(op.qkv));
    let mut dqkv = a.view_mut::<f32>(op.dqkv);
    match op.kernel {
        AttnGradKernel::Materialised { att, datt } => {
            let (att, mut datt) = (a.view::<f32>(att), a.view_mut::<f32>(datt));
            attention::backward(&mut dqkv, &mut datt, &dout, &qkv, &att, s);
        }
        AttnGradKernel::Flash { out, lse } => {
            let (out, lse) = (a.view::<f32>(out), a.view::<f32>(lse));
            flash::backward(&mut dqkv, &dout, &out, &lse, &qkv, s);
        }
    }
}

pub fn activation_backward(a: &A, op: &ActivationBackward) {
    let (inp, dout) = (a.view::<f32>(op.inp), a.view::<f32>(op.dout));
    let mut dinp = a.view_mut::<f32>(op.dinp);
    match op.kind {
        Mlp::Gelu => gelu::backward(&mut dinp, &inp, &dout),
        Mlp::SwiGlu => swiglu::backward(&mut dinp, &inp, &dout, op.n, op.width),
    }
}
