//! Inference memory per device: weights in a storage format (scales included), the KV cache
//! (MHA/GQA/MQA/MLA, contiguous or paged) for batch × context, and the activations of the prefill
//! and of one decode step, whichever peaks higher.
//!
//! The formula runtime's choices: linear layers (experts included, routers not) take the weight
//! format with one scale per group (or per output row) as the `formats` crate sizes them;
//! embeddings, the output head and norms stay 16-bit (fp32 when the weights are fp32), as GPTQ/AWQ
//! checkpoints store them. The prefill processes the whole context at once (no chunking) and keeps
//! the last position's logits in fp32 (HF `generate`). Int8 KV caches carry one fp16 scale per
//! token and head; fp8 ones a per-tensor scale (negligible). A sliding-window layer caches at most
//! its window (HF's sliding cache layers, vLLM's freed blocks). Not here: PyTorch's allocator (the
//! `pytorch` profile). Example: llama2-7b in bf16 caches 524,288 bytes per token.

use crate::params::TensorKind;
use crate::setup::{Attention, Dtype, InferSetup};
use crate::{Category, ModelShape, PlanError};
use formats::quant::{stored_bytes, Scheme, StorageSpec, Symmetry};
use formats::Format;
use serde::Serialize;

/// The CUDA context the formula runtime assumes (the usual 0.5-1 GB).
pub const CONTEXT_BYTES: u64 = crate::formula::CONTEXT_BYTES;

/// A runtime profile's answer for an inference setup on one device (one TP rank).
#[derive(Clone, Debug, Serialize)]
pub struct InferEstimate {
    pub weights_bytes: u64,
    /// KV cache bytes held, paged waste included.
    pub kv_cache_bytes: u64,
    /// Bytes of the last, partly filled page of each sequence (0 when contiguous).
    pub kv_waste_bytes: u64,
    /// KV bytes per token of context over all layers on this device.
    pub kv_bytes_per_token: u64,
    /// Live bytes by category ([`Category`] order) at the prefill's peak.
    pub prefill: [u64; 6],
    /// Live bytes by category at a decode step's peak (full context).
    pub decode: [u64; 6],
    /// Peak of live tensors: the larger of prefill and decode.
    pub peak_bytes: u64,
    pub reserved_bytes: u64,
    pub context_bytes: u64,
}

impl InferEstimate {
    pub fn total_bytes(&self) -> u64 {
        self.reserved_bytes + self.context_bytes
    }

    /// Categories at the peak (the prefill's or the decode step's, whichever is larger).
    pub fn at_peak(&self) -> [u64; 6] {
        if self.prefill.iter().sum::<u64>() >= self.decode.iter().sum::<u64>() {
            self.prefill
        } else {
            self.decode
        }
    }
}

/// GPTQ's and AWQ's default int4 group.
pub const INT4_DEFAULT_GROUP: u64 = 128;

/// Bytes of `numel` weights in rows of `d_in` stored as `dtype` with groups of `group` (`None`:
/// int8 one scale per row, int4 groups of [`INT4_DEFAULT_GROUP`], nf4 blocks of 64), scales in
/// fp16 (fp32 for nf4's absmax and fp8's tensor scale; nf4 with `double_quant`: a uint8 absmax
/// per block and an fp32 scale per 256 blocks, as bitsandbytes).
pub fn weight_bytes(
    numel: u64,
    d_in: u64,
    dtype: Dtype,
    group: Option<u64>,
    double_quant: bool,
) -> u64 {
    if dtype == Dtype::Nf4 && double_quant {
        let blocks = numel.div_ceil(group.unwrap_or(64));
        return numel.div_ceil(2) + blocks + 4 * blocks.div_ceil(256);
    }
    let spec = |scheme, group_size, scale_format| StorageSpec {
        scheme,
        group_size,
        scale_format,
        symmetry: Symmetry::Symmetric,
    };
    let row = d_in.max(1);
    match dtype {
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 => numel * dtype.bits() / 8,
        Dtype::Fp8 => stored_bytes(numel, &spec(Scheme::Fp8E4M3, numel.max(1), Format::F32)),
        Dtype::Int8 => stored_bytes(
            numel,
            &spec(Scheme::Int8, group.unwrap_or(row), Format::F16),
        ),
        Dtype::Int4 => stored_bytes(
            numel,
            &spec(
                Scheme::Int4,
                group.unwrap_or(INT4_DEFAULT_GROUP).min(row),
                Format::F16,
            ),
        ),
        Dtype::Nf4 => stored_bytes(numel, &spec(Scheme::Nf4, group.unwrap_or(64), Format::F32)),
        Dtype::Ggml => numel + 8 * numel.div_ceil(group.unwrap_or(32)),
    }
}

/// The classic weights-only estimate for a bare parameter count: Ψ × bits / 8, no scales.
pub fn weights_only_bytes(n_params: u64, dtype: Dtype) -> u64 {
    n_params * dtype.bits() / 8
}

/// Bytes of `tensors` on one of `setup.tp` ranks: linear layers in the weight format,
/// embeddings (and the head) and vectors in 16 bits (fp32 when the weights are fp32).
pub fn tensors_bytes(tensors: &[crate::params::Tensor], setup: &InferSetup) -> u64 {
    let tp = setup.tp as u64;
    let keep = if setup.weights == Dtype::F32 { 4 } else { 2 };
    tensors
        .iter()
        .map(|t| {
            let n = if t.tp_split {
                t.numel().div_ceil(tp)
            } else {
                t.numel()
            };
            if t.kind == TensorKind::Linear {
                weight_bytes(
                    n,
                    t.d_in,
                    setup.weights,
                    setup.weight_group,
                    setup.double_quant,
                )
            } else {
                keep * n
            }
        })
        .sum()
}

/// Weights of the largest block of `model` on one of `setup.tp` ranks.
pub fn largest_block_weight_bytes(model: &ModelShape, setup: &InferSetup) -> u64 {
    let dense = tensors_bytes(&model.block_tensors(0), setup);
    match &model.moe {
        Some(m) => dense.max(tensors_bytes(&model.block_tensors(m.first_dense), setup)),
        None => dense,
    }
}

/// Weights of `model` on one of `setup.tp` ranks.
pub fn model_weight_bytes(model: &ModelShape, setup: &InferSetup) -> u64 {
    if let (Dtype::Ggml, Some(bytes)) = (setup.weights, setup.ggml_file_bytes) {
        return bytes.div_ceil(setup.tp.max(1) as u64);
    }
    let bytes_of = |tensors: Vec<crate::params::Tensor>| tensors_bytes(&tensors, setup);
    let mut total = bytes_of(model.embedding_tensors()) + bytes_of(model.head_tensors());
    let dense = bytes_of(model.block_tensors(0));
    match &model.moe {
        Some(m) => {
            let moe = bytes_of(model.block_tensors(m.first_dense));
            let dense_layers = m.first_dense.min(model.n_layers) as u64;
            total += dense_layers * dense + (model.n_layers as u64 - dense_layers) * moe;
        }
        None => total += model.n_layers as u64 * dense,
    }
    total
}

/// KV-cache bytes per token per layer on one TP rank: keys and values of each KV head (MHA,
/// GQA, MQA), or MLA's compressed latent plus the shared RoPE key (replicated over TP).
pub fn kv_bytes_per_token_layer(model: &ModelShape, kv_dtype: Dtype, tp: u32) -> u64 {
    let elem = kv_dtype.bits() / 8;
    match &model.mla {
        Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim) * elem,
        None => {
            let heads = (model.n_kv_heads / tp.max(1)).max(1) as u64;
            let scales = if kv_dtype == Dtype::Int8 {
                2 * 2 * heads
            } else {
                0
            };
            2 * heads * model.d_head * elem + scales
        }
    }
}

/// The formula runtime's inference estimate.
pub fn inference_estimate(
    model: &ModelShape,
    setup: &InferSetup,
) -> Result<InferEstimate, PlanError> {
    setup.validate(model)?;
    let weights = model_weight_bytes(model, setup);
    let per_layer = kv_bytes_per_token_layer(model, setup.kv_dtype, setup.tp);
    let per_token = per_layer * model.n_layers as u64;
    // A sliding-window layer caches at most its window; a paged cache rounds up to blocks.
    let (mut slots, mut waste_tokens) = (0, 0);
    for layer in 0..model.n_layers {
        let tokens = model.kv_tokens(layer, setup.seq);
        let held = setup.kv_block.map_or(tokens, |b| tokens.div_ceil(b) * b);
        slots += held;
        waste_tokens += held - tokens;
    }
    let kv = setup.batch * slots * per_layer;
    let mut prefill = [0u64; 6];
    prefill[Category::Params as usize] = weights;
    prefill[Category::KvCache as usize] = kv;
    let mut decode = prefill;
    prefill[Category::Activations as usize] = step_activations(model, setup, setup.seq);
    decode[Category::Activations as usize] = step_activations(model, setup, 1);
    let peak = prefill.iter().sum::<u64>().max(decode.iter().sum());
    Ok(InferEstimate {
        weights_bytes: weights,
        kv_cache_bytes: kv,
        kv_waste_bytes: setup.batch * waste_tokens * per_layer,
        kv_bytes_per_token: per_token,
        prefill,
        decode,
        peak_bytes: peak,
        reserved_bytes: peak,
        context_bytes: CONTEXT_BYTES,
    })
}

/// Live activations while one block runs on `new_tokens` tokens per sequence attending over the
/// whole context: the residual stream and its normed copy, then the larger of the attention part
/// (q, k, v, output, and with eager attention the scores and probabilities) and the MLP's inner
/// tensors; plus the last position's fp32 logits.
fn step_activations(model: &ModelShape, setup: &InferSetup, new_tokens: u64) -> u64 {
    let a = if setup.weights == Dtype::F32 { 4 } else { 2 };
    let t = setup.tp as u64;
    let rows = setup.batch * new_tokens;
    let heads = model.n_heads as u64 / t;
    let qkv = (model.n_heads as u64 + 2 * model.n_kv_heads as u64) * model.d_head / t;
    let mut attention = a * rows * (qkv + heads * model.d_head);
    if setup.attention == Attention::Eager {
        attention += 2 * a * setup.batch * heads * new_tokens * setup.seq;
    }
    let d_ff = match &model.moe {
        Some(m) => m.d_ff_expert * m.n_active.max(1) as u64,
        None => model.d_ff,
    };
    let mlp = 3 * a * rows * d_ff / t;
    let residual = 2 * a * rows * model.d_model;
    residual + attention.max(mlp) + 4 * setup.batch * model.vocab.div_ceil(t)
}

/// The classic estimate for a bare parameter count: weights only (no shape, so no KV cache or
/// activations), with the formula runtime's context.
pub fn weights_only_estimate(n_params: u64, weights: Dtype) -> InferEstimate {
    let bytes = weights_only_bytes(n_params, weights);
    let mut at = [0u64; 6];
    at[Category::Params as usize] = bytes;
    InferEstimate {
        weights_bytes: bytes,
        kv_cache_bytes: 0,
        kv_waste_bytes: 0,
        kv_bytes_per_token: 0,
        prefill: at,
        decode: at,
        peak_bytes: bytes,
        reserved_bytes: bytes,
        context_bytes: CONTEXT_BYTES,
    }
}
