//! The op descriptors a [`super::Backend`] runs: plain data naming the tensors and sizes of one
//! operation, instead of long argument lists. Shapes follow the kernels' comments: rows `n` =
//! batch × seq, channels `c`, heads `nh`, key/value heads `nkv`, head size `hd`, vocabulary `v`.
//!
//! Example: `Linear { kind: LinearKind::Dense, out, inp, weight, bias: None, shape: LinearShape
//! { n, ic, oc } }` is `out (n, oc) = inp (n, ic) · weightᵀ`.

use super::Tensor;
use crate::precision::MasterStep;
use plan_frugal::family::Mlp;

/// Token (and learned position) embedding: out (B·T, C).
#[derive(Clone, Copy, Debug)]
pub struct Embedding {
    pub out: Tensor,
    pub tokens: Tensor,
    pub wte: Tensor,
    pub wpe: Option<Tensor>,
    pub batch: usize,
    pub seq: usize,
    pub c: usize,
    /// Tensor parallelism: `wte` holds ids from this one on; others embed as zero.
    pub shard: Option<usize>,
}

/// Which normalisation, with what it keeps besides the reciprocal std.
#[derive(Clone, Copy, Debug)]
pub enum NormKind {
    /// LayerNorm: its mean (saved) and bias.
    Layer { mean: Tensor, bias: Tensor },
    /// RMSNorm with its epsilon.
    Rms { eps: f32 },
}

/// out (N, C) = norm(inp), saving `rstd` (N) (and LayerNorm's mean).
#[derive(Clone, Copy, Debug)]
pub struct NormOp {
    pub out: Tensor,
    pub rstd: Tensor,
    pub inp: Tensor,
    pub weight: Tensor,
    pub kind: NormKind,
    pub n: usize,
    pub c: usize,
}

/// The sizes of one linear layer: `n` rows of `ic` inputs to `oc` outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub n: usize,
    pub ic: usize,
    pub oc: usize,
}

/// What a linear layer's weight is: a plain matrix (a LoRA model's frozen matrices and adapters
/// run as `lora_ops`' `FrozenLinear` and `Adapter` instead, from the same choke point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKind {
    /// A plain weight matrix (OC, IC).
    Dense,
}

/// out (N, OC) = inp (N, IC) · weightᵀ (+ bias). An f32 `inp` runs the f32 GEMM; a bf16 `inp`
/// runs the bf16 GEMM against a bf16 `weight`.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub kind: LinearKind,
    pub out: Tensor,
    pub inp: Tensor,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub shape: LinearShape,
}

/// RoPE over fused q|k|v rows: the first `heads` heads (q and k) of each row of `row_width`.
#[derive(Clone, Copy, Debug)]
pub struct RopeShape {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub row_width: usize,
    pub theta: f32,
}

/// Causal attention over fused q|k|v rows (its sizes and window).
pub use kernels::attention::Shape as AttnShape;

/// The attention kernel and what it keeps for the backward.
#[derive(Clone, Copy, Debug)]
pub enum AttnKernel {
    /// The probabilities (B, NH, T, T).
    Materialised { att: Tensor },
    /// The log-sum-exp per row (B, NH, T).
    Flash { lse: Tensor },
}

/// out (N, NH·HD) = attention(qkv (N, (NH + 2·NKV)·HD)).
#[derive(Clone, Copy, Debug)]
pub struct Attention {
    pub out: Tensor,
    pub qkv: Tensor,
    pub kernel: AttnKernel,
    pub shape: AttnShape,
}

/// out (N, F) = GELU(inp (N, F)) or SwiGLU(inp (N, 2F): gate | up).
#[derive(Clone, Copy, Debug)]
pub struct Activation {
    pub out: Tensor,
    pub inp: Tensor,
    pub kind: Mlp,
    pub n: usize,
    pub width: usize,
}

/// The fused classifier: logits a chunk of rows at a time against `weight` (V, C), the
/// cross-entropy of each row into `losses`, and its gradient, scaled by `dloss`, into `dlnf`
/// and `dweight` (`None`: a frozen head, LoRA).
#[derive(Clone, Copy, Debug)]
pub struct Classifier {
    pub losses: Tensor,
    pub dlnf: Tensor,
    pub dweight: Option<Tensor>,
    pub lnf: Tensor,
    pub weight: Tensor,
    pub targets: Tensor,
    pub scratch: Tensor,
    pub n: usize,
    pub c: usize,
    pub v: usize,
    pub dloss: f32,
}

/// The forward-only head under `ActPolicy::bf16_units`: logits (rows, V) f32 of `rows` rows of
/// `lnf` (f32) against the bf16 `weight` (V, C), written to the first rows·V f32 of the
/// classifier's `scratch` (the rows are rounded to bf16 inside the scratch first).
#[derive(Clone, Copy, Debug)]
pub struct ClassifierLogits {
    pub lnf: Tensor,
    pub weight: Tensor,
    pub scratch: Tensor,
    pub rows: usize,
    pub c: usize,
    pub v: usize,
}

/// The vocab-parallel classifier's part of [`Classifier`]: the first id of this rank's weight
/// rows, the per-row statistics (3 × chunk rows) and how they are reduced over the ranks.
pub struct ClassifierShard<'a> {
    pub first: usize,
    pub stats: Tensor,
    pub reduce: &'a mut dyn FnMut(&mut [f32], kernels::classifier::shard::RowReduce),
}

/// Scatters `dout` (B·T, C) into the token (and position) table gradients.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingBackward {
    pub dwte: Tensor,
    pub dwpe: Option<Tensor>,
    pub dout: Tensor,
    pub tokens: Tensor,
    pub batch: usize,
    pub seq: usize,
    pub c: usize,
    /// Tensor parallelism: `dwte` holds ids from this one on; others are skipped.
    pub shard: Option<usize>,
    /// A 2-byte `dwte`: scratch (B·T u32) for the positions sorted by token (`work.embed_order`).
    pub order: Option<Tensor>,
}

/// The normalisation's saved tensors, for its backward.
#[derive(Clone, Copy, Debug)]
pub enum NormGradKind {
    /// `dbias` `None`: a frozen norm (LoRA).
    Layer {
        mean: Tensor,
        dbias: Option<Tensor>,
    },
    Rms,
}

/// dinp, dweight (and LayerNorm's dbias) += the norm's backward of `dout`; `dweight` `None`:
/// a frozen norm (LoRA), dinp only.
#[derive(Clone, Copy, Debug)]
pub struct NormBackward {
    pub dinp: Tensor,
    pub dweight: Option<Tensor>,
    pub dout: Tensor,
    pub inp: Tensor,
    pub weight: Tensor,
    pub rstd: Tensor,
    pub kind: NormGradKind,
    pub n: usize,
    pub c: usize,
}

/// The bf16 backward GEMMs' operands (CPU: `gemm_nt` wants both operands row-major over K).
#[derive(Clone, Copy, Debug)]
pub struct Bf16Scratch {
    /// The output gradient rounded to bf16, and its transpose.
    pub dout: Tensor,
    pub dout_t: Tensor,
}

/// dinp (N, IC) += dout · weight, dweight (OC, IC) += doutᵀ · inp, dbias (OC) += Σ dout. With
/// a bf16 `inp` and `bf16` scratch both GEMMs run in bf16 (dout rounded, f32 accumulation).
#[derive(Clone, Copy, Debug)]
pub struct LinearBackward {
    pub kind: LinearKind,
    pub dinp: Tensor,
    pub dweight: Tensor,
    pub dbias: Option<Tensor>,
    pub dout: Tensor,
    pub inp: Tensor,
    pub weight: Tensor,
    pub shape: LinearShape,
    pub bf16: Option<Bf16Scratch>,
}

/// What the attention backward reads besides q|k|v.
#[derive(Clone, Copy, Debug)]
pub enum AttnGradKernel {
    /// The saved probabilities and their gradient scratch.
    Materialised { att: Tensor, datt: Tensor },
    /// The forward's output and log-sum-exp (probabilities are recomputed tile by tile).
    Flash { out: Tensor, lse: Tensor },
}

/// dqkv += attention's backward of `dout` (N, NH·HD).
#[derive(Clone, Copy, Debug)]
pub struct AttentionBackward {
    pub dqkv: Tensor,
    pub dout: Tensor,
    pub qkv: Tensor,
    pub kernel: AttnGradKernel,
    pub shape: AttnShape,
}

/// dinp += the activation's backward of `dout`.
#[derive(Clone, Copy, Debug)]
pub struct ActivationBackward {
    pub dinp: Tensor,
    pub inp: Tensor,
    pub dout: Tensor,
    pub kind: Mlp,
    pub n: usize,
    pub width: usize,
}

/// One AdamW step of `params` from `grads` (f32), with moments `m`, `v`; `step` counts from 1.
#[derive(Clone, Copy, Debug)]
pub struct AdamW {
    pub params: Tensor,
    pub grads: Tensor,
    pub m: Tensor,
    pub v: Tensor,
    pub opt: kernels::adamw::AdamW,
    pub step: u32,
}

/// One SGD-with-momentum step.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    pub params: Tensor,
    pub grads: Tensor,
    pub momentum: Tensor,
    pub opt: kernels::sgd::Sgd,
}

/// AdamW on fp32 `master`, `m`, `v` from 2-byte `grads` (times `step.grad_multiplier`),
/// rounding the new master weights into the 2-byte `working` copy.
#[derive(Clone, Copy, Debug)]
pub struct MasterAdamW {
    pub master: Tensor,
    pub m: Tensor,
    pub v: Tensor,
    pub grads: Tensor,
    pub working: Tensor,
    pub step: MasterStep,
}

/// [`MasterAdamW`] with the master weights and moments in host memory.
#[derive(Debug)]
pub struct MasterAdamWHost<'a> {
    pub master: &'a mut [f32],
    pub m: &'a mut [f32],
    pub v: &'a mut [f32],
    pub grads: Tensor,
    pub working: Tensor,
    pub step: MasterStep,
}

/// A collective over arena tensors (sums in rank order).
#[derive(Clone, Copy, Debug)]
pub enum CommOp {
    AllReduce(Tensor),
    /// This rank's reduced shard lands in its own slice of the tensor.
    ReduceScatterInPlace(Tensor),
    AllGather {
        src: Tensor,
        dst: Tensor,
    },
    /// This rank's shard is already in its slice; afterwards the tensor holds every rank's.
    AllGatherInPlace(Tensor),
    /// `src` (world × shard, f32) summed over the ranks; this rank's shard of the sum into `dst`.
    ReduceScatter {
        src: Tensor,
        dst: Tensor,
    },
}
