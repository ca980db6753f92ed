//! Golden tests against PyTorch + HF transformers, llm.c style: the same tiny GPT-2 and Llama,
//! the same initial weights and batch; logits, loss, every gradient and a 10-step AdamW loss
//! trajectory must match. The files come from dev/golden_gpt2.py, dev/golden_llama.py,
//! dev/golden_qwen2.py, dev/golden_mistral.py (a sliding window of 5 over 16 positions) and
//! dev/golden_mixtral.py (4 experts, top 2, with HF's load-balancing loss in the objective).
//!
//! Tolerances (fp32 on both sides, only the summation order differs): logits and loss within
//! 1e-4 absolute (sums of ≤ 128 products of O(1) values lose ~1e-6 relative each); gradients
//! within 1e-5 + 1e-3 · max|reference| per tensor (they are sums over all 32 tokens and pass
//! through softmax and norm backward, so errors compound more); the trajectory within 1e-3
//! (AdamW divides by sqrt(v), which amplifies differences in tiny gradients over 10 steps).

use engine::io::{load_prefixed, Which};
use engine::testkit::Golden;
use engine::ModelConfig;
use train::{TrainConfig, Trainer};

use train::testkit::assert_max_abs as assert_close;

fn run(file: &str) {
    run_with(file, plan::setup::Attention::Eager);
}

fn run_with(file: &str, attention: plan::setup::Attention) {
    let g = Golden::load(file);
    let model = ModelConfig::from_hf_json(&g.meta["config"], file).unwrap();
    let (batch, seq): (u64, u64) = (
        g.meta["batch"].parse().unwrap(),
        g.meta["seq"].parse().unwrap(),
    );
    let config = TrainConfig {
        attention,
        ..TrainConfig::new(model, batch, seq)
    };
    let mut t = Trainer::new(config).unwrap();
    load_prefixed(&t.model, &t.arena, &g.bytes, file, "weights.").unwrap();
    let (x, y) = (g.u32s("input.tokens"), g.u32s("input.targets"));
    let n = x.len();

    let logits = t.logits(&x, batch as usize, seq as usize).unwrap();
    assert_close(&format!("{file}: logits"), &logits, &g.f32s("logits"), 1e-4);

    t.zero_grads();
    let loss = t.forward_backward(&x, &y, 1.0 / n as f32).unwrap() / n as f32;
    assert_close(&format!("{file}: loss"), &[loss], &g.f32s("loss"), 1e-4);
    if let Some(want) = g.meta.get("balance_loss") {
        let got = t.state.balance_loss.get();
        let want: f32 = want.parse().unwrap();
        assert_close(&format!("{file}: balance loss"), &[got], &[want], 1e-5);
    }
    for grad in t.export(Which::Grads) {
        let want = g.f32s(&format!("grad.{}", grad.name));
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert_close(
            &format!("{file}: grad {}", grad.name),
            &grad.data,
            &want,
            1e-5 + 1e-3 * scale,
        );
    }

    let mut trajectory = Vec::new();
    for _ in 0..10 {
        let s = t
            .step(&mut |i, o| {
                i.copy_from_slice(&x);
                o.copy_from_slice(&y);
            })
            .unwrap();
        trajectory.push(s.loss);
    }
    assert_close(
        &format!("{file}: trajectory"),
        &trajectory,
        &g.f32s("trajectory"),
        1e-3,
    );
}

#[test]
fn gpt2_matches_pytorch() {
    run("golden_gpt2.safetensors");
}

#[test]
fn llama_matches_pytorch() {
    run("golden_llama.safetensors");
}

#[test]
fn qwen2_matches_pytorch() {
    run("golden_qwen2.safetensors");
}

#[test]
fn mistral_with_a_sliding_window_matches_pytorch() {
    // Both kernels: the materialised one masks the window, flash also skips tiles before it.
    run("golden_mistral.safetensors");
    run_with("golden_mistral.safetensors", plan::setup::Attention::Flash);
}

#[test]
fn mixtral_with_its_experts_and_balance_loss_matches_pytorch() {
    run("golden_mixtral.safetensors");
    run_with("golden_mixtral.safetensors", plan::setup::Attention::Flash);
}

#[test]
fn deepseek_v2_with_latent_attention_and_shared_experts_matches_pytorch() {
    for file in [
        "golden_deepseek.safetensors",
        "golden_deepseek_lite.safetensors",
    ] {
        run(file);
        run_with(file, plan::setup::Attention::Flash);
    }
}
