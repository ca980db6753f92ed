//! Exact parameter counts of presets and HF configs, and the shape errors users can hit.

use plan::{hf_config, presets, PlanError};

fn count(name: &str) -> u64 {
    presets::by_name(name).unwrap().param_count()
}

#[test]
fn published_parameter_counts_are_exact() {
    assert_eq!(count("llama2-7b"), 6_738_415_616);
    assert_eq!(count("llama3-8b"), 8_030_261_248);
    assert_eq!(count("gpt2-124m"), 124_439_808);
    assert_eq!(count("qwen2.5-0.5b"), 494_032_768);
    // HF num_parameters() of the other presets, from their safetensors index totals.
    assert_eq!(count("gpt2-1.5b"), 1_557_611_200);
    assert_eq!(count("mistral-7b"), 7_241_732_096);
    assert_eq!(count("mixtral-8x7b"), 46_702_792_704);
    assert_eq!(count("tinyllama-1.1b"), 1_100_048_384);
}

#[test]
fn every_preset_is_valid() {
    for name in presets::NAMES {
        let shape = presets::by_name(name).unwrap();
        shape.validate().unwrap();
        assert!(shape.param_count() > 0, "{name}");
        assert!(shape.active_param_count() <= shape.param_count(), "{name}");
    }
}

#[test]
fn moe_and_mla_counts() {
    // DeepSeek-V3's main model (its multi-token-prediction layer is not loaded by HF): 37B active.
    let v3 = presets::by_name("deepseek-v3").unwrap();
    let active = v3.active_param_count() as f64 / 1e9;
    assert!((36.0..38.5).contains(&active), "V3 active {active}B");
    let lite = presets::by_name("deepseek-v2-lite").unwrap();
    assert_eq!(lite.param_count(), 15_706_484_224);
    let mixtral = presets::by_name("mixtral-8x7b").unwrap();
    // Mixtral: "12.9B active parameters" (2 of 8 experts per token).
    let active = mixtral.active_param_count() as f64 / 1e9;
    assert!((12.8..13.0).contains(&active), "Mixtral active {active}B");
}

#[test]
fn unknown_preset_names_the_fix() {
    let err = presets::by_name("llama9-1t").unwrap_err();
    let PlanError::Invalid { field, reason } = err else {
        panic!("wrong error kind")
    };
    assert_eq!(field, "model");
    assert!(
        reason.contains("llama2-7b") && reason.contains("config.json"),
        "{reason}"
    );
}

const LLAMA3_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
  "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
  "tie_word_embeddings": false, "rms_norm_eps": 1e-05, "rope_theta": 500000.0
}"#;

const QWEN_05B: &str = r#"{
  "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": true
}"#;

const GPT2: &str = r#"{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
  "n_positions": 1024, "vocab_size": 50257, "n_inner": null}"#;

const V2_LITE: &str = r#"{
  "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
  "num_hidden_layers": 27, "n_routed_experts": 64, "n_shared_experts": 2,
  "num_experts_per_tok": 6, "first_k_dense_replace": 1, "q_lora_rank": null,
  "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "vocab_size": 102400, "max_position_embeddings": 163840, "tie_word_embeddings": false
}"#;

#[test]
fn hf_configs_match_presets() {
    let parsed = hf_config::parse(LLAMA3_8B, "config.json").unwrap();
    assert_eq!(parsed.param_count(), 8_030_261_248);
    assert_eq!(parsed.name, "config.json");
    assert_eq!(
        hf_config::parse(QWEN_05B, "q").unwrap().param_count(),
        494_032_768
    );
    assert_eq!(
        hf_config::parse(GPT2, "g").unwrap().param_count(),
        124_439_808
    );
    let lite = hf_config::parse(V2_LITE, "d").unwrap();
    assert_eq!(lite.param_count(), count("deepseek-v2-lite"));
}

fn field_of(err: PlanError) -> String {
    match err {
        PlanError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn bad_configs_name_the_field() {
    assert_eq!(
        field_of(hf_config::parse("{not json", "x").unwrap_err()),
        "config.json"
    );
    let missing = LLAMA3_8B.replace("\"intermediate_size\": 14336,", "");
    assert_eq!(
        field_of(hf_config::parse(&missing, "x").unwrap_err()),
        "intermediate_size"
    );
    let odd_heads = LLAMA3_8B.replace("\"num_attention_heads\": 32", "\"num_attention_heads\": 30");
    assert_eq!(
        field_of(hf_config::parse(&odd_heads, "x").unwrap_err()),
        "num_attention_heads"
    );
    let bad_kv = LLAMA3_8B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
    assert_eq!(
        field_of(hf_config::parse(&bad_kv, "x").unwrap_err()),
        "num_key_value_heads"
    );
    let unknown = LLAMA3_8B.replace("\"llama\"", "\"bert\"");
    assert_eq!(
        field_of(hf_config::parse(&unknown, "x").unwrap_err()),
        "model_type"
    );
    let typed = LLAMA3_8B.replace("4096,", "\"4096\",");
    assert_eq!(
        field_of(hf_config::parse(&typed, "x").unwrap_err()),
        "hidden_size"
    );
}

#[test]
fn fields_past_u32_are_refused_not_truncated() {
    for (field, from, to) in [
        (
            "n_shared_experts",
            "\"n_shared_experts\": 2",
            "\"n_shared_experts\": 4294967297",
        ),
        (
            "num_key_value_heads",
            "\"num_key_value_heads\": 16",
            "\"num_key_value_heads\": 4294967304",
        ),
        (
            "first_k_dense_replace",
            "\"first_k_dense_replace\": 1",
            "\"first_k_dense_replace\": 4294967296",
        ),
    ] {
        let json = V2_LITE.replace(from, to);
        match hf_config::parse(&json, "c") {
            Err(PlanError::Invalid { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(
                    reason.contains(&to[to.find(": ").unwrap() + 2..]),
                    "{reason}"
                );
            }
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// A rotary model reaches `max_position_embeddings`, times a linear, dynamic or YaRN
/// `rope_scaling` factor (YaRN's over its original length), as vLLM derives a model's context;
/// Llama 3's scaling is already in `max_position_embeddings`. Past that, `--seq` is refused.
#[test]
fn rope_scaling_extends_the_positions_a_sequence_may_use() {
    let with = |scaling: &str| {
        let text = QWEN_05B.replace(
            "\"tie_word_embeddings\": true",
            &format!("\"tie_word_embeddings\": true, \"rope_scaling\": {scaling}"),
        );
        hf_config::parse(&text, "q").unwrap().max_positions
    };
    assert_eq!(
        hf_config::parse(QWEN_05B, "q").unwrap().max_positions,
        32768
    );
    let yarn = r#"{"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#;
    assert_eq!(with(yarn), 131072);
    assert_eq!(with(r#"{"rope_type": "linear", "factor": 2.0}"#), 65536);
    assert_eq!(with(r#"{"rope_type": "llama3", "factor": 8.0}"#), 32768);
    assert_eq!(with("null"), 32768);
    let shape = hf_config::parse(QWEN_05B, "q").unwrap();
    assert!(plan::validate::check_positions(&shape, 32768).is_ok());
    let err = plan::validate::check_positions(&shape, 32769).unwrap_err();
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");
}
