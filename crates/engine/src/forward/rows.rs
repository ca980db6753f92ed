//! The row plumbing of the forward pass: where a residual-stream value is computed and how it
//! is rounded into its saved bf16 tensor (`residual_target`, `settle`), widening a saved bf16
//! tensor for an f32 kernel (`widened`), and the op shapes of a block's norm, attention and
//! RoPE.
//!
//! Example: `widened(arena, a.res2, nc, model.work.resid_mid)` is `res2` as f32 rows.

use crate::arena::Arena;
use crate::backend::ops::*;
use crate::backend::{Backend, DType, Tensor};
use crate::model::Model;
use plan_frugal::family::Norm;
use plan_frugal::units::UnitKind;

/// Where the f32 value of a residual-stream tensor is computed: `t` itself (f32), or (a saved
/// bf16 tensor) its `scratch`.
pub(super) fn residual_target(t: Tensor, len: usize, scratch: Option<Tensor>) -> Tensor {
    match t.dtype {
        DType::F32 => t.prefix(len),
        _ => scratch
            .expect("a bf16 residual stream has f32 rows")
            .prefix(len),
    }
}

/// Rounds the f32 `value` once into the saved bf16 `t` and `value` to the same bits, the values
/// every later reader of `t` sees; nothing for an f32 `t` (which `value` is).
pub(super) fn settle<B: Backend>(arena: &Arena<B>, t: Tensor, value: Tensor) {
    if t.dtype == DType::F32 {
        return;
    }
    arena.backend().convert(arena, t, value);
    arena.backend().convert(arena, value, t);
}

/// A bf16 tensor widened into `scratch` (its first `len` elements), or the f32 tensor itself.
pub fn widened<B: Backend>(
    arena: &Arena<B>,
    t: Tensor,
    len: usize,
    scratch: Option<Tensor>,
) -> Tensor {
    if t.dtype == DType::F32 {
        return t.prefix(len);
    }
    let work = scratch
        .expect("a bf16 tensor has an f32 workspace")
        .prefix(len);
    arena.backend().convert(arena, work, t.prefix(len));
    work
}

/// The family's norm, with LayerNorm's saved mean and bias.
pub fn norm_kind(model: &Model, mean: Option<Tensor>, bias: Option<Tensor>) -> NormKind {
    match model.design.norm {
        Norm::LayerNorm => NormKind::Layer {
            mean: mean.expect("LayerNorm keeps a mean"),
            bias: bias.expect("LayerNorm has a bias"),
        },
        Norm::RmsNorm => NormKind::Rms {
            eps: model.config.norm_eps,
        },
    }
}

/// Attention's shape in block `kind` (its sliding window, if the layer has one).
pub fn attn_shape(model: &Model, kind: UnitKind, batch: usize, seq: usize) -> AttnShape {
    let s = &model.config.shape;
    let layer = match kind {
        UnitKind::Block(l) => l,
        _ => 0,
    };
    // Latent attention: every head its own key and value, nope + rope wide.
    let (n_kv_heads, head_dim) = match &s.mla {
        Some(a) => (s.n_heads, a.qk_nope_head_dim + a.qk_rope_head_dim),
        None => (s.n_kv_heads, s.d_head),
    };
    AttnShape {
        batch,
        seq,
        n_heads: s.n_heads as usize,
        n_kv_heads: n_kv_heads as usize,
        head_dim: head_dim as usize,
        window: s.window_of(layer).map_or(usize::MAX, |w| w as usize),
    }
}

pub fn rope_shape(model: &Model, batch: usize, seq: usize) -> RopeShape {
    let s = &model.config.shape;
    RopeShape {
        batch,
        seq,
        heads: (s.n_heads + s.n_kv_heads) as usize,
        head_dim: s.d_head as usize,
        row_width: ((s.n_heads + 2 * s.n_kv_heads) as u64 * s.d_head) as usize,
        theta: model.config.rope_theta,
    }
}
