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
use engine::{ModelConfig, TrainConfig, Trainer};
use safetensors::SafeTensors;
use std::collections::HashMap;

struct Golden {
    bytes: Vec<u8>,
    meta: HashMap<String, String>,
}

impl Golden {
    fn load(name: &str) -> Golden {
        let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (_, metadata) = SafeTensors::read_metadata(&bytes).expect("golden file is safetensors");
        let meta = metadata
            .metadata()
            .clone()
            .expect("golden file has a JSON header");
        assert_eq!(meta["magic"], "frugal-golden", "{path}: wrong magic");
        assert_eq!(meta["version"], "1", "{path}: unknown version");
        Golden { bytes, meta }
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        engine::testkit::safetensors_f32s(&self.bytes, name)
    }

    fn u32s(&self, name: &str) -> Vec<u32> {
        self.f32s(name).iter().map(|x| x.to_bits()).collect()
    }
}

use engine::testkit::assert_max_abs as assert_close;

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

/// The inference engine against the same HF logits: each row prefilled halfway (every
/// position's logits kept), then decoded token by token from its KV cache, at f32 weights and KV.
fn inference(file: &str) {
    use engine::infer::Server;
    use plan::frugal::{ForwardSetup, KvFormat, ServeSetup, WeightFormat};
    let g = Golden::load(file);
    let model = ModelConfig::from_hf_json(&g.meta["config"], file).unwrap();
    let (batch, seq): (usize, usize) = (
        g.meta["batch"].parse().unwrap(),
        g.meta["seq"].parse().unwrap(),
    );
    let fwd = ForwardSetup {
        batch: 1,
        seq: seq as u64,
        attention: plan::setup::Attention::Flash,
    };
    let runner = engine::Runner::new(model.clone(), fwd).unwrap();
    load_prefixed(&runner.model, &runner.arena, &g.bytes, file, "weights.").unwrap();
    let v = model.shape.vocab as usize;
    let setup = ServeSetup {
        prefill_chunk: seq as u64,
        prefill_logit_rows: seq as u64,
        ..ServeSetup::generation(
            &model.shape,
            1,
            seq as u64,
            WeightFormat::F32,
            KvFormat::F32,
            4,
            1,
        )
    };
    let mut server = Server::new(model, setup).unwrap();
    server.load_units(&runner.unit_values()).unwrap();
    let (x, want) = (g.u32s("input.tokens"), g.f32s("logits"));
    let half = seq / 2;
    let mut logits = Vec::new();
    for b in 0..batch {
        let row = &x[b * seq..(b + 1) * seq];
        let s = server.new_sequence();
        server
            .prefill_rows(s, &row[..half], half, &mut logits)
            .unwrap();
        let expect = &want[b * seq * v..(b * seq + half) * v];
        assert_close(&format!("{file}: prefill row {b}"), &logits, expect, 1e-4);
        for (t, &tok) in row.iter().enumerate().skip(half) {
            server.decode(&[s], &[tok], &mut logits).unwrap();
            let expect = &want[(b * seq + t) * v..(b * seq + t + 1) * v];
            assert_close(
                &format!("{file}: decode row {b} position {t}"),
                &logits,
                expect,
                1e-4,
            );
        }
        server.free(s);
    }
}

#[test]
fn gpt2_inference_with_a_kv_cache_matches_hf_logits() {
    inference("golden_gpt2.safetensors");
}

#[test]
fn llama_inference_with_a_kv_cache_matches_hf_logits() {
    inference("golden_llama.safetensors");
}

#[test]
fn qwen2_matches_pytorch() {
    run("golden_qwen2.safetensors");
}

#[test]
fn qwen2_inference_with_a_kv_cache_matches_hf_logits() {
    inference("golden_qwen2.safetensors");
}

#[test]
fn mistral_with_a_sliding_window_matches_pytorch() {
    // Both kernels: the materialised one masks the window, flash also skips tiles before it.
    run("golden_mistral.safetensors");
    run_with("golden_mistral.safetensors", plan::setup::Attention::Flash);
}

#[test]
fn mistral_inference_with_a_sliding_window_matches_hf_logits() {
    inference("golden_mistral.safetensors");
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

#[test]
fn mixtral_inference_with_a_kv_cache_matches_hf_logits() {
    inference("golden_mixtral.safetensors");
}

#[test]
fn deepseek_inference_with_a_latent_cache_matches_hf_logits() {
    inference("golden_deepseek.safetensors");
    inference("golden_deepseek_lite.safetensors");
}
