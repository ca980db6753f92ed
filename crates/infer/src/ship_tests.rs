//! A sequence's KV shipped from one worker to another (prefill/decode disaggregation): the
//! receiving worker decodes exactly as the one that ran the prompt, for every KV format, latent
//! attention and a sliding window; the bytes are the plan's; refusals change nothing.

use super::tests::max_abs;
use super::*;
use engine::testkit::{deepseek_tiny, llama_tiny, tokens};
use plan::ModelShape;

/// A prefill worker (long chunks, a pool for one prompt) and a decode worker (a larger pool,
/// short chunks), the same weights.
fn pair(shape: &ModelShape, kv: KvFormat) -> (Worker, Worker) {
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let base = ServeSetup::generation(shape, 1, 48, WeightFormat::F32, kv, 4, 2);
    let prefill = ServeSetup {
        prefill_chunk: 32,
        ..base
    };
    let decode = ServeSetup {
        prefill_chunk: 1,
        kv_blocks: 3 * base.kv_blocks,
        max_seqs: 3,
        ..base
    };
    let mut p = Worker::new(config.clone(), prefill).unwrap();
    let mut d = Worker::new(config, decode).unwrap();
    p.fill_random(11);
    d.fill_random(11);
    (p, d)
}

#[test]
fn a_shipped_sequence_decodes_as_where_it_was_prefilled() {
    let window = ModelShape {
        sliding_window: Some(plan::model::SlidingWindow {
            window: 6,
            first_layer: 0,
        }),
        ..llama_tiny()
    };
    let cases = [
        (llama_tiny(), KvFormat::F32),
        (llama_tiny(), KvFormat::Int8),
        (llama_tiny(), KvFormat::Fp8),
        (llama_tiny(), KvFormat::Bf16),
        (deepseek_tiny(), KvFormat::F32),
        (window, KvFormat::F32),
    ];
    for (shape, kv) in cases {
        let (mut p, mut d) = pair(&shape, kv);
        let prompt = tokens(21, shape.vocab, 3);
        let (mut here, mut there) = (Vec::new(), Vec::new());
        let a = p.new_sequence();
        p.prefill(a, &prompt, &mut here).unwrap();
        let mut bytes = Vec::new();
        p.export_kv(a, &mut bytes);
        let live = p
            .blocks
            .seq(a)
            .blocks
            .iter()
            .filter(|&&b| b != blocks::FREED);
        assert_eq!(
            bytes.len() as u64,
            p.kv_ship_bytes(live.count()),
            "{}",
            shape.name
        );
        // Another sequence first, so the shipped one lands in other blocks.
        let other = d.new_sequence();
        d.prefill(other, &tokens(5, shape.vocab, 9), &mut there)
            .unwrap();
        let b = d.import_kv(prompt.len(), &bytes).unwrap();
        assert_eq!(d.seq_len(b), prompt.len());
        for step in 0..6 {
            let next = sample::argmax(&here);
            p.decode(&[a], &[next], &mut here).unwrap();
            d.decode(&[b], &[next], &mut there).unwrap();
            let diff = max_abs(&here, &there);
            assert!(diff == 0.0, "{} {kv:?} step {step}: {diff}", shape.name);
        }
        for w in [&p, &d] {
            let m = w.measured();
            assert_eq!(m.peak_bytes, w.plan.peak_bytes(plan::buffer::Device::Gpu));
        }
    }
}

#[test]
fn a_shipment_that_does_not_fit_is_refused_changing_nothing() {
    let shape = llama_tiny();
    let (mut p, mut d) = pair(&shape, KvFormat::F32);
    let a = p.new_sequence();
    p.prefill(a, &tokens(9, shape.vocab, 1), &mut Vec::new())
        .unwrap();
    let mut bytes = Vec::new();
    p.export_kv(a, &mut bytes);
    let free = d.free_blocks();
    let short = d.import_kv(9, &bytes[1..]).unwrap_err();
    assert!(short.to_string().contains("bytes of KV shipped"), "{short}");
    let long = d.import_kv(4096, &bytes).unwrap_err();
    assert!(long.to_string().contains("4096 tokens"), "{long}");
    assert_eq!(d.free_blocks(), free);
}
