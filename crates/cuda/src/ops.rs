//! The forward and backward ops of `engine::Backend` on the GPU: each resolves its tensors to
//! device addresses (`Arena::byte_offset`, with the arena's lifetime and range checks) and
//! launches the kernel of the same name in `kernels/*.cu`, or a cuBLAS GEMM ([`crate::gemm`]).
//! Same contracts as the CPU backend (`engine::backend::cpu`): gradients are accumulated into.
//!
//! Example: `linear(gpu, arena, &op)` is one `cublasGemmEx` (+ `add_bias`).

use crate::device::{blocks, Arg, Cuda};
use crate::gemm::{self, Operand};
use engine::backend::{
    Activation, ActivationBackward, Attention, AttentionBackward, AttnGradKernel, AttnKernel,
    AttnShape, Classifier, ClassifierLogits, DType, Embedding, EmbeddingBackward, Linear,
    LinearBackward, LinearKind, NormBackward, NormGradKind, NormKind, NormOp, RopeShape, Tensor,
};
use engine::Arena;
use plan_frugal::family::Mlp;

type A = Arena<Cuda>;

/// Threads per block of the element-wise and row kernels (8 warps: 8 rows per block).
pub(crate) const THREADS: u32 = 256;
const WARPS: u64 = (THREADS / 32) as u64;

/// The device address of a live tensor's first element.
pub(crate) fn at(a: &A, t: Tensor) -> u64 {
    a.slab().base + a.byte_offset(t)
}

pub(crate) fn ptr(a: &A, t: Tensor) -> Arg {
    Arg::Ptr(at(a, t))
}

fn opt_ptr(a: &A, t: Option<Tensor>) -> Arg {
    Arg::Ptr(t.map_or(0, |t| at(a, t)))
}

fn u(x: usize) -> Arg {
    Arg::U64(x as u64)
}

/// The `dtype` code of kernels that read several formats (0 f32, 1 bf16, 2 f16).
pub(crate) fn code(d: DType) -> Arg {
    Arg::I32(match d {
        DType::F32 => 0,
        DType::Bf16 => 1,
        DType::F16 => 2,
        other => panic!("no float kernel for {other:?}"),
    })
}

/// Grid of a one-warp-per-row kernel.
fn row_blocks(rows: usize) -> u64 {
    (rows as u64).div_ceil(WARPS)
}

pub(crate) fn elementwise(gpu: &Cuda, name: &str, n: usize, args: &[Arg]) {
    gpu.launch(name, blocks(n as u64, THREADS), THREADS, args);
}

pub fn embedding(gpu: &Cuda, a: &A, op: &Embedding) {
    assert!(op.shard.is_none(), "tensor parallelism is refused on CUDA");
    let rows = op.batch * op.seq;
    let args = [
        ptr(a, op.out),
        ptr(a, op.tokens),
        ptr(a, op.wte),
        opt_ptr(a, op.wpe),
        code(op.wte.dtype),
        u(rows),
        u(op.seq),
        u(op.c),
    ];
    elementwise(gpu, "embedding_forward", rows * op.c, &args);
}

pub fn norm(gpu: &Cuda, a: &A, op: &NormOp) {
    let (n, c) = (op.n, op.c);
    match op.kind {
        NormKind::Layer { mean, bias } => {
            let args = [
                ptr(a, op.out),
                ptr(a, mean),
                ptr(a, op.rstd),
                ptr(a, op.inp),
                ptr(a, op.weight),
                ptr(a, bias),
                u(n),
                u(c),
            ];
            gpu.launch("layernorm_forward", row_blocks(n), THREADS, &args);
        }
        NormKind::Rms { eps } => {
            let args = [
                ptr(a, op.out),
                ptr(a, op.rstd),
                ptr(a, op.inp),
                ptr(a, op.weight),
                u(n),
                u(c),
                Arg::F32(eps),
            ];
            gpu.launch("rmsnorm_forward", row_blocks(n), THREADS, &args);
        }
    }
}

fn operand(t: Tensor) -> Operand {
    match t.dtype {
        DType::Bf16 => Operand::Bf16,
        DType::F32 => Operand::F32,
        other => panic!("no CUDA GEMM on {other:?} operands"),
    }
}

pub fn linear(gpu: &Cuda, a: &A, op: &Linear) {
    let LinearKind::Dense = op.kind;
    let s = op.shape;
    let (out, inp, w) = (at(a, op.out), at(a, op.inp), at(a, op.weight));
    gemm::forward(
        gpu,
        (out, inp, w),
        operand(op.inp),
        (s.n, s.ic, s.oc),
        false,
    );
    if let Some(bias) = op.bias {
        let args = [Arg::Ptr(out), ptr(a, bias), u(s.n), u(s.oc)];
        elementwise(gpu, "add_bias", s.n * s.oc, &args);
    }
}

pub fn rope(gpu: &Cuda, a: &A, qkv: Tensor, s: RopeShape, sign: f32) {
    assert!(
        s.head_dim % 2 == 0,
        "RoPE needs an even head dim, got {}",
        s.head_dim
    );
    let rows = s.batch * s.seq;
    let args = [
        ptr(a, qkv),
        u(rows),
        u(s.seq),
        u(s.heads),
        u(s.head_dim),
        u(s.row_width),
        Arg::F32(s.theta),
        Arg::F32(sign),
    ];
    elementwise(gpu, "rope", rows * s.heads * s.head_dim / 2, &args);
}

fn window(w: usize) -> Arg {
    Arg::U64(w.min(u64::MAX as usize) as u64)
}

/// The flash kernels' arguments: `ptrs`, then the shape and window.
fn flash_args(s: AttnShape, ptrs: &[Arg]) -> Vec<Arg> {
    assert!(
        s.head_dim <= 256,
        "CUDA flash attention holds at most 256 head elements"
    );
    let (b, t, nh, nkv, hd) = s.dims();
    let shape = [u(b), u(t), u(nh), u(nkv), u(hd), window(s.window)];
    ptrs.iter().copied().chain(shape).collect()
}

pub fn attention(gpu: &Cuda, a: &A, op: &Attention) {
    let s = op.shape;
    let AttnKernel::Flash { lse } = op.kernel else {
        panic!("the materialised attention is refused on CUDA (flash only)");
    };
    let args = flash_args(s, &[ptr(a, op.out), ptr(a, lse), ptr(a, op.qkv)]);
    let rows = s.batch * s.n_heads * s.seq;
    gpu.launch("flash_forward", row_blocks(rows), THREADS, &args);
}

pub fn attention_backward(gpu: &Cuda, a: &A, op: &AttentionBackward) {
    let s = op.shape;
    let AttnGradKernel::Flash { out, lse } = op.kernel else {
        panic!("the materialised attention is refused on CUDA (flash only)");
    };
    let ptrs = [op.dqkv, op.dout, out, lse, op.qkv].map(|t| ptr(a, t));
    let args = flash_args(s, &ptrs);
    let queries = s.batch * s.n_heads * s.seq;
    gpu.launch("flash_backward_dq", row_blocks(queries), THREADS, &args);
    let keys = s.batch * s.n_kv_heads * s.seq;
    gpu.launch("flash_backward_dkv", row_blocks(keys), THREADS, &args);
}

pub fn activation(gpu: &Cuda, a: &A, op: &Activation) {
    match op.kind {
        Mlp::Gelu => {
            let args = [ptr(a, op.out), ptr(a, op.inp), u(op.out.len)];
            elementwise(gpu, "gelu_forward", op.out.len, &args);
        }
        Mlp::SwiGlu => {
            let args = [ptr(a, op.out), ptr(a, op.inp), u(op.n), u(op.width)];
            elementwise(gpu, "swiglu_forward", op.n * op.width, &args);
        }
    }
}

pub fn activation_backward(gpu: &Cuda, a: &A, op: &ActivationBackward) {
    match op.kind {
        Mlp::Gelu => {
            let args = [
                ptr(a, op.dinp),
                ptr(a, op.inp),
                ptr(a, op.dout),
                u(op.dinp.len),
            ];
            elementwise(gpu, "gelu_backward", op.dinp.len, &args);
        }
        Mlp::SwiGlu => {
            let args = [
                ptr(a, op.dinp),
                ptr(a, op.inp),
                ptr(a, op.dout),
                u(op.n),
                u(op.width),
            ];
            elementwise(gpu, "swiglu_backward", op.n * op.width, &args);
        }
    }
}

pub fn residual_add(gpu: &Cuda, a: &A, out: Tensor, inp: Tensor) {
    assert_eq!(out.len, inp.len, "the residual add keeps the element count");
    let args = [ptr(a, out), ptr(a, inp), u(out.len)];
    elementwise(gpu, "residual_add", out.len, &args);
}

pub fn convert(gpu: &Cuda, a: &A, dst: Tensor, src: Tensor) {
    assert_eq!(dst.len, src.len, "convert keeps the element count");
    if dst.dtype == src.dtype {
        gpu.copy(at(a, dst), at(a, src), dst.len * dst.dtype.size_bytes());
        return;
    }
    let args = [
        ptr(a, dst),
        code(dst.dtype),
        ptr(a, src),
        code(src.dtype),
        u(dst.len),
    ];
    elementwise(gpu, "convert", dst.len, &args);
}

/// The fused classifier: per chunk of rows, logits into the scratch (one GEMM), the softmax
/// cross-entropy and its gradient in place (one block per row), then the two GEMMs back.
pub fn classifier(gpu: &Cuda, a: &A, op: &Classifier) -> f32 {
    if op.weight.dtype == DType::Bf16 {
        return classifier_bf16(gpu, a, op);
    }
    let (n, c, v) = (op.n, op.c, op.v);
    let rows = (op.scratch.len / v).min(n).max(1);
    assert!(
        op.scratch.len >= v,
        "the classifier's scratch holds a row of logits"
    );
    let (lnf, w, dlnf) = (at(a, op.lnf), at(a, op.weight), at(a, op.dlnf));
    let scratch = at(a, op.scratch);
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        let x = lnf + (i0 * c * 4) as u64;
        gemm::forward(gpu, (scratch, x, w), Operand::F32, (cr, c, v), false);
        let args = [
            Arg::Ptr(scratch),
            ptr(a, op.losses.slice(i0..i0 + cr)),
            ptr(a, op.targets.slice(i0..i0 + cr)),
            u(v),
            Arg::F32(op.dloss),
        ];
        gpu.launch("softmax_xent", cr as u64, THREADS, &args);
        let dx = dlnf + (i0 * c * 4) as u64;
        gemm::input_grad(gpu, (dx, scratch, w), Operand::F32, (cr, c, v));
        if let Some(dw) = op.dweight {
            gemm::weight_grad(gpu, (at(a, dw), scratch, x), Operand::F32, (cr, c, v));
        }
    }
    let mut losses = vec![0.0f32; n];
    gpu.download_f32(at(a, op.losses), &mut losses);
    losses.iter().map(|&l| f64::from(l)).sum::<f64>() as f32
}

/// The bf16 head's scratch (`plan_frugal::classifier_row_bytes`, 4V + 2C bytes a row): per
/// chunk of `chunk` rows f32 logits at the start, the rounded rows at byte 4·chunk·V and (`dl`)
/// the bf16 logit gradients after them (one layout: cuBLAS transposes for itself), which fits
/// from half the scratch's rows on. Returns the three addresses.
fn bf16_scratch(
    a: &A,
    scratch: Tensor,
    (c, v): (usize, usize),
    chunk: usize,
    dl: bool,
) -> (u64, u64, u64) {
    let whole = a.tensor(scratch.buf, DType::Bf16);
    let need = chunk * (4 * v + 2 * c + if dl { 2 * v } else { 0 });
    assert!(
        need <= 2 * whole.len,
        "the bf16 classifier's scratch holds the chunk"
    );
    let base = at(a, whole);
    let xb = base + (4 * chunk * v) as u64;
    (base, xb, xb + (2 * chunk * c) as u64)
}

/// Rows of the bf16 head's scratch.
fn bf16_rows(a: &A, scratch: Tensor, c: usize, v: usize) -> usize {
    let whole = a.tensor(scratch.buf, DType::Bf16);
    2 * whole.len / (4 * v + 2 * c)
}

/// f32 → bf16 of `n` elements between raw addresses.
fn round_bf16(gpu: &Cuda, dst: u64, src: u64, n: usize) {
    let args = [
        Arg::Ptr(dst),
        code(DType::Bf16),
        Arg::Ptr(src),
        code(DType::F32),
        u(n),
    ];
    elementwise(gpu, "convert", n, &args);
}

/// The fused classifier on bf16 operands (`ActPolicy::bf16_units`): per chunk the rows rounded
/// to bf16, bf16 GEMMs with f32 accumulation, the softmax in f32, its gradient rounded to bf16
/// for the two GEMMs back (as the CPU's `classifier::bf16`).
fn classifier_bf16(gpu: &Cuda, a: &A, op: &Classifier) -> f32 {
    let (n, c, v) = (op.n, op.c, op.v);
    // Chunks of half the scratch's rows: the logit gradients get their own bytes.
    let rows = bf16_rows(a, op.scratch, c, v) / 2;
    assert!(rows >= 1, "the bf16 classifier's scratch holds two rows");
    let (logits, xb, dl) = bf16_scratch(a, op.scratch, (c, v), rows, true);
    let (lnf, w, dlnf) = (at(a, op.lnf), at(a, op.weight), at(a, op.dlnf));
    for i0 in (0..n).step_by(rows) {
        let cr = rows.min(n - i0);
        round_bf16(gpu, xb, lnf + (i0 * c * 4) as u64, cr * c);
        gemm::forward(gpu, (logits, xb, w), Operand::Bf16, (cr, c, v), false);
        let args = [
            Arg::Ptr(logits),
            ptr(a, op.losses.slice(i0..i0 + cr)),
            ptr(a, op.targets.slice(i0..i0 + cr)),
            u(v),
            Arg::F32(op.dloss),
        ];
        gpu.launch("softmax_xent", cr as u64, THREADS, &args);
        round_bf16(gpu, dl, logits, cr * v);
        let dx = dlnf + (i0 * c * 4) as u64;
        gemm::input_grad(gpu, (dx, dl, w), Operand::Bf16, (cr, c, v));
        if let Some(dw) = op.dweight {
            // The 2-byte table gradient, accumulated by cuBLAS (beta 1) and rounded once.
            assert_eq!(
                dw.dtype,
                DType::Bf16,
                "the bf16 head writes a 2-byte gradient"
            );
            gemm::weight_grad_bf16(gpu, (at(a, dw), dl, xb), (cr, c, v));
        }
    }
    let mut losses = vec![0.0f32; n];
    gpu.download_f32(at(a, op.losses), &mut losses);
    losses.iter().map(|&l| f64::from(l)).sum::<f64>() as f32
}

/// The bf16 head's logits of a chunk (forward-only passes), into the scratch's start.
pub fn classifier_logits(gpu: &Cuda, a: &A, op: &ClassifierLogits) {
    let (logits, xb, _) = bf16_scratch(a, op.scratch, (op.c, op.v), op.rows, false);
    round_bf16(gpu, xb, at(a, op.lnf), op.rows * op.c);
    let w = at(a, op.weight);
    gemm::forward(
        gpu,
        (logits, xb, w),
        Operand::Bf16,
        (op.rows, op.c, op.v),
        false,
    );
}

pub fn embedding_backward(gpu: &Cuda, a: &A, op: &EmbeddingBackward) {
    assert!(op.shard.is_none(), "tensor parallelism is refused on CUDA");
    let rows = op.batch * op.seq;
    if op.dwte.dtype == DType::Bf16 {
        let args = [
            ptr(a, op.dwte),
            ptr(a, op.dout),
            ptr(a, op.tokens),
            u(rows),
            u(op.c),
        ];
        gpu.launch("embedding_backward_bf16", rows as u64, THREADS, &args);
        if let Some(dwpe) = op.dwpe {
            let args = [ptr(a, dwpe), ptr(a, op.dout), u(rows), u(op.seq), u(op.c)];
            elementwise(gpu, "position_backward_bf16", op.seq * op.c, &args);
        }
        return;
    }
    let args = [
        ptr(a, op.dwte),
        opt_ptr(a, op.dwpe),
        ptr(a, op.dout),
        ptr(a, op.tokens),
        u(rows),
        u(op.seq),
        u(op.c),
    ];
    elementwise(gpu, "embedding_backward", rows * op.c, &args);
}

pub fn norm_backward(gpu: &Cuda, a: &A, op: &NormBackward) {
    let (n, c) = (op.n, op.c);
    let (mean, dbias) = match op.kind {
        NormGradKind::Layer { mean, dbias } => (Some(mean), dbias),
        NormGradKind::Rms => (None, None),
    };
    let args = [
        ptr(a, op.dinp),
        ptr(a, op.dout),
        ptr(a, op.inp),
        ptr(a, op.weight),
        opt_ptr(a, mean),
        ptr(a, op.rstd),
        u(n),
        u(c),
    ];
    gpu.launch("norm_backward_input", row_blocks(n), THREADS, &args);
    if let Some(dw) = op.dweight {
        let args = [
            ptr(a, dw),
            opt_ptr(a, dbias),
            ptr(a, op.dout),
            ptr(a, op.inp),
            opt_ptr(a, mean),
            ptr(a, op.rstd),
            u(n),
            u(c),
        ];
        elementwise(gpu, "norm_backward_params", c, &args);
    }
}

/// dinp += dout · W, dW += doutᵀ · inp, dbias += Σ dout. A bf16 input runs both GEMMs in bf16
/// as the CPU does (dout and W rounded into the planned scratch; cuBLAS needs no transposes).
pub fn linear_backward(gpu: &Cuda, a: &A, op: &LinearBackward) {
    let LinearKind::Dense = op.kind;
    let s = op.shape;
    let shape = (s.n, s.ic, s.oc);
    let (dinp, dw) = (at(a, op.dinp), at(a, op.dweight));
    match op.bf16 {
        None => {
            let (dout, w, inp) = (at(a, op.dout), at(a, op.weight), at(a, op.inp));
            gemm::input_grad(gpu, (dinp, dout, w), Operand::F32, shape);
            gemm::weight_grad(gpu, (dw, dout, inp), Operand::F32, shape);
        }
        Some(scratch) => {
            let g = scratch.dout.prefix(s.n * s.oc);
            convert(gpu, a, g, op.dout);
            // The 2-byte weights where they lie; the 2-byte gradient takes the product rounded
            // once (`ActPolicy`'s `bf16_units`).
            assert_eq!(
                op.weight.dtype,
                DType::Bf16,
                "bf16 GEMMs read 2-byte weights"
            );
            assert_eq!(
                op.dweight.dtype,
                DType::Bf16,
                "bf16 GEMMs write 2-byte gradients"
            );
            let (g, w, inp) = (at(a, g), at(a, op.weight), at(a, op.inp));
            gemm::input_grad(gpu, (dinp, g, w), Operand::Bf16, shape);
            gemm::weight_grad_bf16(gpu, (dw, g, inp), shape);
        }
    }
    if let Some(db) = op.dbias {
        let args = [ptr(a, db), ptr(a, op.dout), u(s.n), u(s.oc)];
        elementwise(gpu, "bias_grad", s.oc, &args);
    }
}
