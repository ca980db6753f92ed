//! The op descriptors of a LoRA step (see `plan_frugal::adapters` for the layout): a frozen
//! block matrix run one HF part at a time (dequantized into the planned scratch first unless the
//! base is fp32), and the adapter beside it.
//!
//! Example: `FrozenLinear { out, inp, w: FrozenWeight { parts: [Some(q), Some(k), Some(v)], .. },
//! .. }` writes each part's columns of the fused q|k|v output from its own stored bytes.

use super::Tensor;
use plan_frugal::adapters::BaseFormat;
use plan_frugal::Role;

/// Parts per fused view at most (Llama's q|k|v).
pub const MAX_PARTS: usize = 3;

/// One HF linear of a frozen matrix: its stored bytes (an f32 tensor for an fp32 base, U8
/// otherwise) and the output columns it fills.
#[derive(Clone, Copy, Debug)]
pub struct FrozenPart {
    pub src: Tensor,
    pub col0: usize,
    pub rows: usize,
}

/// A frozen block matrix as a backend reads it: its HF parts' stored bytes, the base's format,
/// the dequant scratch, and the product's shape (N rows of IC in, OC out).
#[derive(Clone, Copy, Debug)]
pub struct FrozenWeight {
    pub parts: [Option<FrozenPart>; MAX_PARTS],
    pub format: BaseFormat,
    /// The block matrix (a `ggml` base keeps some matrices' codes two a byte).
    pub role: Role,
    /// `work.dequant` (none for an fp32 base).
    pub scratch: Option<Tensor>,
    pub n: usize,
    pub ic: usize,
    pub oc: usize,
}

/// out (N, OC) = inp (N, IC) · Wᵀ (+ bias), W frozen, part by part.
#[derive(Clone, Copy, Debug)]
pub struct FrozenLinear {
    pub out: Tensor,
    pub inp: Tensor,
    pub bias: Option<Tensor>,
    pub w: FrozenWeight,
}

/// dinp (N, IC) += dout (N, OC) · W, W frozen (no weight gradient), part by part.
#[derive(Clone, Copy, Debug)]
pub struct FrozenLinearBackward {
    pub dinp: Tensor,
    pub dout: Tensor,
    pub w: FrozenWeight,
}

/// One adapted part: its B (rows, r) and output columns.
#[derive(Clone, Copy, Debug)]
pub struct AdapterPart {
    pub b: Tensor,
    pub col0: usize,
    pub rows: usize,
}

/// LoRA dropout on an adapter's input: the mask of `seed`, the dropped input in `dropped`, and
/// (in the backward) the input gradient before the mask in `dx`.
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    pub p: f32,
    pub seed: u64,
    pub dropped: Tensor,
    pub dx: Option<Tensor>,
}

/// The adapters of one linear: u = inp · A_catᵀ, out[:, p] += scale · uₚ Bₚᵀ (`out` `None`: u
/// only, for a recompute that keeps the block's output); with `dropout`, inp is dropped first.
#[derive(Clone, Copy, Debug)]
pub struct Adapter {
    pub dropout: Option<Dropout>,
    pub out: Option<Tensor>,
    pub u: Tensor,
    pub inp: Tensor,
    pub a_cat: Tensor,
    pub parts: [Option<AdapterPart>; MAX_PARTS],
    pub n: usize,
    pub ic: usize,
    pub oc: usize,
    pub rank: usize,
    pub scale: f32,
}

/// The adapters' backward: dBₚ, dA_cat and dinp accumulate; `du` is scratch.
#[derive(Clone, Copy, Debug)]
pub struct AdapterBackward {
    pub fwd: Adapter,
    pub dinp: Tensor,
    pub dout: Tensor,
    pub da_cat: Tensor,
    pub db: [Option<Tensor>; MAX_PARTS],
    pub du: Tensor,
}
