//! The inference op descriptors a [`super::Backend`] runs: a weight matrix in its storage format
//! ([`QMatrix`]), the layer's paged KV cache ([`KvCache`]), and the ops that use them. Host-side
//! metadata (positions, cache slots, block tables) rides in the descriptors as slices; a device
//! backend uploads it with the op.
//!
//! Example: `QLinear { out, inp, weight: QMatrix { format: WeightFormat::Int4 { group: 32, asym:
//! false }, codes, scales: Some(s), zeros: None, rows: oc, cols: ic, row_block: oc }, bias: None,
//! n }`.

use super::Tensor;
use plan_frugal::{KvFormat, WeightFormat};

/// A (rows, cols) weight matrix as stored: codes (or values), scales, zero points.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix {
    /// This matrix's own format (`WeightFormat::of` its role).
    pub format: WeightFormat,
    pub codes: Tensor,
    pub scales: Option<Tensor>,
    pub zeros: Option<Tensor>,
    pub rows: usize,
    pub cols: usize,
    /// The rows are multiplied in ranges of this many from row 0 (an expert's in a stack of
    /// experts' matrices; else `rows`): a backend keeps a layout of its own only where each
    /// range is one too.
    pub row_block: usize,
}

/// out (N, rows) = inp (N, cols) · Wᵀ (+ bias (rows)).
#[derive(Clone, Copy, Debug)]
pub struct QLinear {
    pub out: Tensor,
    pub inp: Tensor,
    pub weight: QMatrix,
    pub bias: Option<Tensor>,
    pub n: usize,
}

/// out (N, C) = table row tokens[r] (+ wpe row positions[r]).
#[derive(Clone, Copy, Debug)]
pub struct EmbedRows<'a> {
    pub out: Tensor,
    pub tokens: Tensor,
    pub table: QMatrix,
    /// GPT-2's learned positions (maxT, C), fp32.
    pub wpe: Option<Tensor>,
    pub positions: &'a [u32],
    /// Tensor parallelism: `table` holds the vocabulary rows from this first id on; a token
    /// outside them gets a zero row (the group's sum is the embedding).
    pub shard: Option<usize>,
}

/// One layer's paged cache: keys and values of every block, scales when quantized.
#[derive(Clone, Copy, Debug)]
pub struct KvCache {
    pub format: KvFormat,
    pub k: Tensor,
    pub v: Tensor,
    pub k_scales: Option<Tensor>,
    pub v_scales: Option<Tensor>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block.
    pub block: usize,
}

/// Stores row r's keys and values (from its fused q|k|v row) at `slots[r]` = (block, slot).
#[derive(Clone, Copy, Debug)]
pub struct KvWrite<'a> {
    pub cache: KvCache,
    pub qkv: Tensor,
    pub slots: &'a [(u32, u32)],
}

/// A query row's sequence: its block table and the cached tokens it sees, `start..len` (`start`
/// is past 0 only under a sliding window).
#[derive(Clone, Copy, Debug)]
pub struct SeqRow<'a> {
    pub blocks: &'a [u32],
    pub start: usize,
    pub len: usize,
}

/// out (N, NH·HD) = attention of each row's query heads (in its fused q|k|v row) over its
/// sequence's cached keys and values; `splits` > 1 splits each row's range (split-K) and
/// merges through `partials`.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttention<'a> {
    pub out: Tensor,
    pub qkv: Tensor,
    pub cache: KvCache,
    pub rows: &'a [SeqRow<'a>],
    pub splits: usize,
    pub partials: Option<Tensor>,
}

/// Multi-head latent attention in an inference step: one layer's paged cache of latents
/// (normed latent and rotated RoPE key per token, f32 or bf16) and its ops.
#[derive(Clone, Copy, Debug)]
pub enum LatentOp<'a> {
    /// RoPE at each row's position on the `rope` columns after `offset` of `heads` heads
    /// `stride` apart in rows `row_width` wide.
    RopeAt {
        x: Tensor,
        positions: &'a [u32],
        row_width: usize,
        heads: usize,
        stride: usize,
        offset: usize,
        rope: usize,
        theta: f32,
    },
    /// Row r of `ckv` (N, rank + rope) into the cache at `slots[r]`.
    Write {
        cache: Tensor,
        ckv: Tensor,
        slots: &'a [(u32, u32)],
        block: usize,
    },
    /// out (N, H·v) = each row's queries `q` (N, H·(nope + rope)) over its sequence's latents,
    /// the key/value expansion `w_kvb` (fp32) absorbed.
    Attention {
        out: Tensor,
        q: Tensor,
        cache: Tensor,
        rows: &'a [SeqRow<'a>],
        block: usize,
        w_kvb: Tensor,
        dims: super::MlaDims,
        scale: f32,
    },
}
