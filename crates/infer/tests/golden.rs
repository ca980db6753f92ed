//! Golden tests of the inference engine against PyTorch + HF transformers: the tiny models of
//! the training goldens (`engine::testkit::GOLDEN_DIR`, from dev/golden_*.py), each row prefilled
//! halfway (every position's logits kept), then decoded token by token from its KV cache, against
//! HF's logits within 1e-4 (fp32 on both sides, only the summation order differs).

use engine::io::load_prefixed;
use engine::testkit::{assert_max_abs as assert_close, Golden};
use engine::ModelConfig;
use infer::Worker;
use plan_frugal::{ForwardSetup, KvFormat, ServeSetup, WeightFormat};

/// The inference engine against the same HF logits: each row prefilled halfway (every
/// position's logits kept), then decoded token by token from its KV cache, at f32 weights and KV.
fn inference(file: &str) {
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
    let runner = infer::Runner::new(model.clone(), fwd).unwrap();
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
    let mut worker = Worker::new(model, setup).unwrap();
    worker.load_units(&runner.unit_values()).unwrap();
    let (x, want) = (g.u32s("input.tokens"), g.f32s("logits"));
    let half = seq / 2;
    let mut logits = Vec::new();
    for b in 0..batch {
        let row = &x[b * seq..(b + 1) * seq];
        let s = worker.new_sequence();
        worker
            .prefill_rows(s, &row[..half], half, &mut logits)
            .unwrap();
        let expect = &want[b * seq * v..(b * seq + half) * v];
        assert_close(&format!("{file}: prefill row {b}"), &logits, expect, 1e-4);
        for (t, &tok) in row.iter().enumerate().skip(half) {
            worker.decode(&[s], &[tok], &mut logits).unwrap();
            let expect = &want[(b * seq + t) * v..(b * seq + t + 1) * v];
            assert_close(
                &format!("{file}: decode row {b} position {t}"),
                &logits,
                expect,
                1e-4,
            );
        }
        worker.free(s);
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
fn qwen2_inference_with_a_kv_cache_matches_hf_logits() {
    inference("golden_qwen2.safetensors");
}

#[test]
fn mistral_inference_with_a_sliding_window_matches_hf_logits() {
    inference("golden_mistral.safetensors");
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
