//! Named model shapes: the published configs of GPT-2, Llama 2/3.1, Mistral, Mixtral, Qwen2.5,
//! TinyLlama and DeepSeek-V2-Lite/V3, plus small shapes the engine trains: gpt2-tiny and
//! llama-tiny, mixtral-tiny and deepseek-tiny (tests) and gpt2-mini (`frugal train`'s default).
//!
//! Values are copied from each model's HF `config.json`. Not here: weights, tokenizers, parsing
//! (`hf_config`). Example: `presets::by_name("llama3-8b")` is Llama-3.1-8B (aliases resolve).

use crate::model::{Family, Mla, ModelShape, Moe, SlidingWindow};
use crate::PlanError;

/// Canonical preset names, in the order `frugal plan --help` lists them.
pub const NAMES: [&str; 24] = [
    "gpt2-124m",
    "gpt2-355m",
    "gpt2-774m",
    "gpt2-1.5b",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "tinyllama-1.1b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "gpt2-tiny",
    "gpt2-mini",
    "llama-tiny",
    "mixtral-tiny",
    "deepseek-tiny",
];

/// Other spellings users type, mapped to canonical names.
const ALIASES: [(&str, &str); 15] = [
    ("gpt2", "gpt2-124m"),
    ("gpt2-small", "gpt2-124m"),
    ("gpt2-medium", "gpt2-355m"),
    ("gpt2-large", "gpt2-774m"),
    ("gpt2-xl", "gpt2-1.5b"),
    ("llama3-8b", "llama3.1-8b"),
    ("llama3-70b", "llama3.1-70b"),
    ("llama3-405b", "llama3.1-405b"),
    ("llama-3-8b", "llama3.1-8b"),
    ("llama-3.1-8b", "llama3.1-8b"),
    ("llama-2-7b", "llama2-7b"),
    ("llama-2-13b", "llama2-13b"),
    ("llama-2-70b", "llama2-70b"),
    ("deepseek-v2lite", "deepseek-v2-lite"),
    ("mistral-7b-v0.1", "mistral-7b"),
];

/// The shape of the preset `name` (case-insensitive; aliases such as `llama3-8b` accepted).
pub fn by_name(name: &str) -> Result<ModelShape, PlanError> {
    let lower = name.to_ascii_lowercase();
    let canonical = ALIASES
        .iter()
        .find(|(alias, _)| *alias == lower)
        .map_or(lower.as_str(), |(_, c)| c);
    let mut shape = build(canonical).ok_or_else(|| PlanError::Invalid {
        field: "model".into(),
        reason: format!(
            "unknown model '{name}': use one of {}, or a path to an HF config.json",
            NAMES.join(", ")
        ),
    })?;
    shape.name = canonical.to_string();
    Ok(shape)
}

/// Dense-attention fields shared by every non-MLA preset.
struct Dense {
    family: Family,
    n_layers: u32,
    d_model: u64,
    n_heads: u32,
    n_kv_heads: u32,
    d_ff: u64,
    vocab: u64,
    max_positions: u64,
    tied: bool,
}

fn dense(d: Dense) -> ModelShape {
    ModelShape {
        name: String::new(),
        family: d.family,
        n_layers: d.n_layers,
        d_model: d.d_model,
        n_heads: d.n_heads,
        n_kv_heads: d.n_kv_heads,
        d_head: d.d_model / d.n_heads as u64,
        d_ff: d.d_ff,
        vocab: d.vocab,
        max_positions: d.max_positions,
        tied_embeddings: d.tied,
        moe: None,
        mla: None,
        sliding_window: None,
    }
}

fn gpt2(n_layers: u32, d_model: u64, n_heads: u32) -> ModelShape {
    dense(Dense {
        family: Family::Gpt2,
        n_layers,
        d_model,
        n_heads,
        n_kv_heads: n_heads,
        d_ff: 4 * d_model,
        vocab: 50257,
        max_positions: 1024,
        tied: true,
    })
}

#[allow(clippy::too_many_arguments)]
fn llama(
    family: Family,
    n_layers: u32,
    d_model: u64,
    heads: (u32, u32),
    d_ff: u64,
    vocab: u64,
    max_positions: u64,
    tied: bool,
) -> ModelShape {
    dense(Dense {
        family,
        n_layers,
        d_model,
        n_heads: heads.0,
        n_kv_heads: heads.1,
        d_ff,
        vocab,
        max_positions,
        tied,
    })
}

fn build(name: &str) -> Option<ModelShape> {
    use Family::{Llama, Qwen2};
    let shape = match name {
        "gpt2-124m" => gpt2(12, 768, 12),
        "gpt2-355m" => gpt2(24, 1024, 16),
        "gpt2-774m" => gpt2(36, 1280, 20),
        "gpt2-1.5b" => gpt2(48, 1600, 25),
        "gpt2-tiny" => ModelShape {
            max_positions: 256,
            ..gpt2(2, 64, 4)
        },
        // `frugal train`'s default: GPT-2 blocks with the full vocabulary (the classifier
        // dominates its step), small enough to train on a laptop CPU.
        "gpt2-mini" => ModelShape {
            max_positions: 256,
            ..gpt2(4, 128, 4)
        },
        "llama2-7b" => llama(Llama, 32, 4096, (32, 32), 11008, 32000, 4096, false),
        "llama2-13b" => llama(Llama, 40, 5120, (40, 40), 13824, 32000, 4096, false),
        "llama2-70b" => llama(Llama, 80, 8192, (64, 8), 28672, 32000, 4096, false),
        "llama3.1-8b" => llama(Llama, 32, 4096, (32, 8), 14336, 128256, 131072, false),
        "llama3.1-70b" => llama(Llama, 80, 8192, (64, 8), 28672, 128256, 131072, false),
        "llama3.1-405b" => llama(Llama, 126, 16384, (128, 8), 53248, 128256, 131072, false),
        // Mistral-7B-v0.1: every layer attends to the last 4096 positions.
        "mistral-7b" => ModelShape {
            sliding_window: Some(SlidingWindow {
                window: 4096,
                first_layer: 0,
            }),
            ..llama(Llama, 32, 4096, (32, 8), 14336, 32000, 32768, false)
        },
        "tinyllama-1.1b" => llama(Llama, 22, 2048, (32, 4), 5632, 32000, 2048, false),
        "llama-tiny" => llama(Llama, 2, 64, (4, 2), 176, 50257, 256, false),
        // Mixtral blocks at llama-tiny's size: 4 experts of 96, top 2 (tests).
        "mixtral-tiny" => ModelShape {
            family: Family::Mixtral,
            moe: Some(Moe {
                n_experts: 4,
                n_active: 2,
                n_shared: 0,
                d_ff_expert: 96,
                first_dense: 0,
                router_bias: false,
            }),
            ..llama(Llama, 2, 64, (4, 2), 96, 50257, 256, false)
        },
        "qwen2.5-0.5b" => llama(Qwen2, 24, 896, (14, 2), 4864, 151936, 32768, true),
        "qwen2.5-1.5b" => llama(Qwen2, 28, 1536, (12, 2), 8960, 151936, 32768, true),
        "qwen2.5-7b" => llama(Qwen2, 28, 3584, (28, 4), 18944, 152064, 131072, false),
        "qwen2.5-72b" => llama(Qwen2, 80, 8192, (64, 8), 29568, 152064, 131072, false),
        "mixtral-8x7b" => ModelShape {
            family: Family::Mixtral,
            moe: Some(Moe {
                n_experts: 8,
                n_active: 2,
                n_shared: 0,
                d_ff_expert: 14336,
                first_dense: 0,
                router_bias: false,
            }),
            ..llama(Llama, 32, 4096, (32, 8), 14336, 32000, 32768, false)
        },
        // DeepSeek-V2's design at toy size (tests): latent attention with a query bottleneck, a
        // dense first layer, then 4 routed experts of 32 (top 2) and one shared expert.
        "deepseek-tiny" => ModelShape {
            d_head: 16,
            max_positions: 256,
            mla: Some(Mla {
                q_lora_rank: Some(32),
                kv_lora_rank: 32,
                qk_rope_head_dim: 8,
                qk_nope_head_dim: 16,
                v_head_dim: 16,
            }),
            ..deepseek(DeepseekDims {
                n_layers: 3,
                d_model: 64,
                n_heads: 4,
                d_ff: 128,
                vocab: 50257,
                q_lora_rank: Some(32),
                moe: (4, 2, 1, 32, 1),
                router_bias: false,
            })
        },
        "deepseek-v2-lite" => deepseek(DeepseekDims {
            n_layers: 27,
            d_model: 2048,
            n_heads: 16,
            d_ff: 10944,
            vocab: 102400,
            q_lora_rank: None,
            moe: (64, 6, 2, 1408, 1),
            router_bias: false,
        }),
        "deepseek-v3" => deepseek(DeepseekDims {
            n_layers: 61,
            d_model: 7168,
            n_heads: 128,
            d_ff: 18432,
            vocab: 129280,
            q_lora_rank: Some(1536),
            moe: (256, 8, 1, 2048, 3),
            router_bias: true,
        }),
        _ => return None,
    };
    Some(shape)
}

struct DeepseekDims {
    n_layers: u32,
    d_model: u64,
    n_heads: u32,
    d_ff: u64,
    vocab: u64,
    q_lora_rank: Option<u64>,
    /// (routed experts, active, shared, expert hidden size, leading dense layers)
    moe: (u32, u32, u32, u64, u32),
    router_bias: bool,
}

fn deepseek(d: DeepseekDims) -> ModelShape {
    let (n_experts, n_active, n_shared, d_ff_expert, first_dense) = d.moe;
    ModelShape {
        name: String::new(),
        family: Family::Deepseek,
        n_layers: d.n_layers,
        d_model: d.d_model,
        n_heads: d.n_heads,
        n_kv_heads: d.n_heads,
        // The value head size; query/key heads are qk_nope + qk_rope = 192.
        d_head: 128,
        d_ff: d.d_ff,
        vocab: d.vocab,
        max_positions: 163840,
        tied_embeddings: false,
        moe: Some(Moe {
            n_experts,
            n_active,
            n_shared,
            d_ff_expert,
            first_dense,
            router_bias: d.router_bias,
        }),
        mla: Some(Mla {
            q_lora_rank: d.q_lora_rank,
            kv_lora_rank: 512,
            qk_rope_head_dim: 64,
            qk_nope_head_dim: 128,
            v_head_dim: 128,
        }),
        sliding_window: None,
    }
}
