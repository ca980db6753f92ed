//! Model shapes: the architecture facts the memory model needs, nothing about weights' values.
//!
//! One struct covers GPT-2, Llama (1/2/3), Mistral, Qwen2, Mixtral (MoE) and DeepSeek-V2/V3 (MLA +
//! MoE). Presets, HF `config.json` parsing and exact parameter counting build on it.
//! Example: GPT-2 124M is 12 layers, d_model 768, 12 heads, vocab 50257, 1024 positions, tied
//! embeddings, 124,439,808 parameters.

use crate::PlanError;
use serde::Serialize;

/// Which block design the model uses; decides norms, MLP, positions and attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Learned positions, LayerNorm with bias, GELU (tanh) MLP, biases everywhere, tied head.
    Gpt2,
    /// RoPE, RMSNorm, SwiGLU MLP, no biases, GQA (Llama, Mistral, TinyLlama).
    Llama,
    /// Llama with q/k/v biases (Qwen2, Qwen2.5).
    Qwen2,
    /// Llama blocks with a mixture-of-experts MLP (Mixtral).
    Mixtral,
    /// DeepSeek-V2/V3: multi-head latent attention and a mixture-of-experts MLP.
    Deepseek,
}

impl Family {
    /// Every family, in the order messages list them.
    pub const ALL: [Family; 5] = [
        Family::Gpt2,
        Family::Llama,
        Family::Qwen2,
        Family::Mixtral,
        Family::Deepseek,
    ];

    /// The HF `model_type`s read as this family (`plan::hf_config`).
    pub fn model_types(self) -> &'static [&'static str] {
        match self {
            Family::Gpt2 => &["gpt2"],
            Family::Llama => &["llama", "mistral"],
            Family::Qwen2 => &["qwen2"],
            Family::Mixtral => &["mixtral"],
            Family::Deepseek => &["deepseek_v2", "deepseek_v3"],
        }
    }

    /// The family an HF `model_type` names.
    pub fn of_model_type(model_type: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.model_types().contains(&model_type))
    }
}

/// How the chosen probabilities become gates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Gating {
    /// Divided by their sum (Mixtral; DeepSeek with `norm_topk_prob`).
    Renormalise,
    /// Multiplied by a constant (DeepSeek-V2's `routed_scaling_factor`).
    Scaled(f32),
}

/// How a router picks and weighs its experts (the kernels' `kernels::moe::route` follows it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub gating: Gating,
    /// Group-limited greedy (DeepSeek-V2): (groups, groups kept): each token first keeps the
    /// groups of E / groups experts with the highest best probability, then picks its top k
    /// among their experts.
    pub groups: Option<(usize, usize)>,
}

impl Routing {
    /// Mixtral's: top-k over all experts, renormalised.
    pub const RENORMALISED: Routing = Routing {
        gating: Gating::Renormalise,
        groups: None,
    };
}

/// Mixture-of-experts MLP shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub n_experts: u32,
    /// Experts each token is routed to (top-k).
    pub n_active: u32,
    /// Always-on shared experts (DeepSeek); 0 for Mixtral.
    pub n_shared: u32,
    /// Hidden size of one expert's MLP.
    pub d_ff_expert: u64,
    /// The first `first_dense` layers use a dense MLP of `ModelShape::d_ff` (DeepSeek).
    pub first_dense: u32,
    /// The router has a learned score-correction bias per expert (DeepSeek-V3).
    pub router_bias: bool,
}

/// Multi-head latent attention shape (DeepSeek-V2/V3).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Mla {
    /// Rank of the query compression; `None` projects queries directly (V2-Lite).
    pub q_lora_rank: Option<u64>,
    /// Rank of the joint key/value compression: the cached latent `d_c` (512 in V2/V3).
    pub kv_lora_rank: u64,
    /// Per-head dimension of the decoupled RoPE key, cached once per token (64).
    pub qk_rope_head_dim: u64,
    pub qk_nope_head_dim: u64,
    pub v_head_dim: u64,
}

/// Sliding-window attention (Mistral v0.1, Qwen2 with `use_sliding_window`): each query sees
/// only the last `window` positions, so a layer's KV cache never holds more than `window` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    /// Positions a query attends to, itself included (`sliding_window`).
    pub window: u64,
    /// Layers from this index on use the window; earlier ones attend to everything (Qwen2's
    /// `max_window_layers`; 0 for Mistral).
    pub first_layer: u32,
}

/// The shape of a transformer language model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelShape {
    /// Preset name or the path it came from.
    pub name: String,
    pub family: Family,
    pub n_layers: u32,
    /// Hidden size (C, `hidden_size`, `n_embd`).
    pub d_model: u64,
    pub n_heads: u32,
    /// Key/value heads: `n_heads` for MHA, fewer for GQA, 1 for MQA.
    pub n_kv_heads: u32,
    pub d_head: u64,
    /// Dense MLP hidden size (`intermediate_size`, 4C for GPT-2).
    pub d_ff: u64,
    pub vocab: u64,
    pub max_positions: u64,
    /// The output projection shares the token embedding matrix.
    pub tied_embeddings: bool,
    pub moe: Option<Moe>,
    pub mla: Option<Mla>,
    pub sliding_window: Option<SlidingWindow>,
}

/// The largest value of each dimension the planner takes: far past every published model (the
/// largest have under 200 layers, hidden sizes near 2^15, vocabularies near 2^18 and contexts
/// near 2^24), and small enough that per-layer lists stay small and byte counts of sane setups
/// stay far from `u64::MAX`.
type Get = fn(&ModelShape) -> u64;
const LIMITS: [(&str, Get, u64); 10] = [
    ("num_hidden_layers", |m| m.n_layers.into(), 1_000),
    ("hidden_size", |m| m.d_model, 1 << 24),
    ("num_attention_heads", |m| m.n_heads.into(), 1 << 20),
    ("num_key_value_heads", |m| m.n_kv_heads.into(), 1 << 20),
    ("head_dim", |m| m.d_head, 1 << 20),
    ("intermediate_size", |m| m.d_ff, 1 << 26),
    ("vocab_size", |m| m.vocab, 1 << 30),
    ("max_position_embeddings", |m| m.max_positions, 1 << 40),
    (
        "n_routed_experts",
        |m| m.moe.as_ref().map_or(0, |e| e.n_experts.into()),
        1 << 20,
    ),
    (
        "moe_intermediate_size",
        |m| m.moe.as_ref().map_or(0, |e| e.d_ff_expert),
        1 << 26,
    ),
];

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

impl ModelShape {
    /// The sliding window of layer `layer`, if it has one.
    pub fn window_of(&self, layer: u32) -> Option<u64> {
        self.sliding_window
            .filter(|w| layer >= w.first_layer)
            .map(|w| w.window)
    }

    /// Tokens layer `layer` keeps in its KV cache for a context of `seq` tokens.
    pub fn kv_tokens(&self, layer: u32, seq: u64) -> u64 {
        match self.sliding_window {
            Some(w) if layer >= w.first_layer => seq.min(w.window),
            _ => seq,
        }
    }

    /// KV-cache tokens summed over the layers for a context of `seq` tokens.
    pub fn kv_tokens_all_layers(&self, seq: u64) -> u64 {
        (0..self.n_layers).map(|l| self.kv_tokens(l, seq)).sum()
    }

    /// Checks that the shape is one a real model could have; errors name the field and the fix.
    pub fn validate(&self) -> Result<(), PlanError> {
        let positive = [
            ("num_hidden_layers", self.n_layers as u64),
            ("hidden_size", self.d_model),
            ("num_attention_heads", self.n_heads as u64),
            ("num_key_value_heads", self.n_kv_heads as u64),
            ("head_dim", self.d_head),
            ("intermediate_size", self.d_ff),
            ("vocab_size", self.vocab),
            ("max_position_embeddings", self.max_positions),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(invalid(field, "must be at least 1".into()));
            }
        }
        for (field, value, max) in LIMITS.iter().map(|&(f, get, max)| (f, get(self), max)) {
            if value > max {
                return Err(invalid(
                    field,
                    format!(
                        "{value} is beyond any real model (at most {max} here): check the config"
                    ),
                ));
            }
        }
        if self.n_heads % self.n_kv_heads != 0 {
            return Err(invalid(
                "num_key_value_heads",
                format!(
                    "{} key/value heads do not divide {} attention heads: use a divisor of {}",
                    self.n_kv_heads, self.n_heads, self.n_heads
                ),
            ));
        }
        // GPT-2 splits the hidden state into heads, so heads must divide it; Llama-style configs
        // may set head_dim explicitly, and MLA sets its own head sizes.
        if self.family == Family::Gpt2 && self.d_model % self.n_heads as u64 != 0 {
            return Err(invalid(
                "num_attention_heads",
                format!(
                    "{} heads do not divide hidden size {}: pick a head count that divides it",
                    self.n_heads, self.d_model
                ),
            ));
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0 || m.n_active == 0 || m.n_active > m.n_experts {
                return Err(invalid(
                    "num_experts_per_tok",
                    format!(
                        "{} active of {} experts: need 1 <= active <= experts",
                        m.n_active, m.n_experts
                    ),
                ));
            }
            if m.d_ff_expert == 0 {
                return Err(invalid(
                    "moe_intermediate_size",
                    "must be at least 1".into(),
                ));
            }
        }
        if let Some(m) = &self.mla {
            if m.kv_lora_rank == 0 || m.qk_rope_head_dim == 0 || m.v_head_dim == 0 {
                return Err(invalid(
                    "kv_lora_rank",
                    "MLA needs kv_lora_rank, qk_rope_head_dim and v_head_dim of at least 1".into(),
                ));
            }
        }
        Ok(())
    }
}
