//! LoRA against PEFT: the same tiny GPT-2 and Llama bases (dev/golden_lora.py), PEFT's adapters
//! over GPT-2's fused c_attn and both c_proj, and over parts of Llama's fused views (q_proj,
//! v_proj of q|k|v, gate_proj of gate|up, down_proj); logits, loss, every adapter gradient and a
//! 10-step AdamW trajectory (adapters only) must match, with the tolerances of `golden.rs` (fp32
//! on both sides, only the summation order differs).

use engine::io::{load_prefixed, Which};
use engine::testkit::Golden;
use engine::ModelConfig;
use plan::setup::{Dtype, Lora};
use train::{LoraConfig, OptimizerKind, Schedule, TrainConfig, Trainer};

use train::testkit::{assert_max_abs as assert_close, safetensors_f32s as f32s};

fn run(file: &str) {
    let Golden { bytes, meta } = Golden::load(file);
    let model = ModelConfig::from_hf_json(&meta["config"], file).unwrap();
    let (batch, seq): (u64, u64) = (meta["batch"].parse().unwrap(), meta["seq"].parse().unwrap());
    let lora = Lora {
        rank: meta["rank"].parse().unwrap(),
        targets: meta["targets"].split(',').map(str::to_string).collect(),
        base: Dtype::F32,
        double_quant: false,
        dropout: 0.0,
        ggml: None,
    };
    let config = TrainConfig {
        attention: plan::setup::Attention::Eager,
        optimizer: OptimizerKind::AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        schedule: Schedule::constant(1e-2),
        lora: Some(LoraConfig {
            plan: lora,
            alpha: meta["alpha"].parse().unwrap(),
            base_weights: None,
        }),
        ..TrainConfig::new(model, batch, seq)
    };
    let mut t = Trainer::new(config).unwrap();
    let files = [(file.to_string(), bytes.as_slice())];
    engine::lora::base::load_files(&t.model, &t.arena, &files, "weights.").unwrap();
    load_prefixed(&t.model, &t.arena, &bytes, file, "adapter.").unwrap();
    let x: Vec<u32> = f32s(&bytes, "input.tokens")
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let y: Vec<u32> = f32s(&bytes, "input.targets")
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let n = x.len();
    let logits = t.logits(&x, batch as usize, seq as usize).unwrap();
    assert_close(
        &format!("{file}: logits"),
        &logits,
        &f32s(&bytes, "logits"),
        1e-4,
    );
    t.zero_grads();
    let loss = t.forward_backward(&x, &y, 1.0 / n as f32).unwrap() / n as f32;
    assert_close(
        &format!("{file}: loss"),
        &[loss],
        &f32s(&bytes, "loss"),
        1e-4,
    );
    let grads = t.export(Which::Grads);
    assert!(!grads.is_empty());
    for grad in grads {
        let want = f32s(&bytes, &format!("grad.{}", grad.name));
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "{}: PEFT's gradient is zero", grad.name);
        let what = format!("{file}: grad {}", grad.name);
        assert_close(&what, &grad.data, &want, 1e-5 + 1e-3 * scale);
    }
    let trajectory = train::testkit::losses_on(&mut t, &x, &y, 10);
    assert_close(
        &format!("{file}: trajectory"),
        &trajectory,
        &f32s(&bytes, "trajectory"),
        1e-3,
    );
}

#[test]
fn gpt2_lora_matches_peft() {
    run("golden_lora_gpt2.safetensors");
}

#[test]
fn llama_lora_on_parts_of_fused_views_matches_peft() {
    run("golden_lora_llama.safetensors");
}
