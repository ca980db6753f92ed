//! Sliding-window inference against the forward-only reference (which recomputes the windowed
//! attention over the whole prefix), and the ring of blocks a windowed sequence keeps.

use super::tests::{last_row, max_abs, reference};
use super::*;
use engine::testkit::{llama_tiny, tokens};
use plan::ModelShape;

#[test]
fn sliding_window_decoding_matches_recomputing_and_keeps_a_ring_of_blocks() {
    let window = 6;
    let shape = ModelShape {
        sliding_window: Some(plan::model::SlidingWindow {
            window,
            first_layer: 0,
        }),
        max_positions: 96,
        ..llama_tiny()
    };
    let mut r = reference(&shape, 5);
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let (block, chunk) = (4u64, 8u64);
    let generation = ServeSetup::generation(
        &shape,
        1,
        shape.max_positions,
        WeightFormat::F32,
        KvFormat::F32,
        block,
        4,
    );
    // The window, one prefill chunk written before it attends, two blocks of slack.
    let ring = (window + chunk + 2 * block).div_ceil(block);
    assert!(ring < shape.max_positions.div_ceil(block));
    let setup = ServeSetup {
        prefill_chunk: chunk,
        kv_blocks: ring,
        ..generation
    };
    let mut s = Server::new(config, setup).unwrap();
    s.load_units(&r.unit_values()).unwrap();
    let mut prefix = tokens(20, shape.vocab, 13);
    let seq = s.new_sequence();
    let mut logits = Vec::new();
    s.prefill(seq, &prefix, &mut logits).unwrap();
    let steps = shape.max_positions as usize - prefix.len() - 1;
    for step in 0..steps {
        let want = last_row(&mut r, &prefix);
        let d = max_abs(&logits, &want);
        assert!(d < 1e-4, "step {step} at {}: {d}", prefix.len());
        assert!(
            s.pool.used() <= ring as usize,
            "{} blocks held",
            s.pool.used()
        );
        let next = sample::argmax(&logits);
        prefix.push(next);
        s.decode(&[seq], &[next], &mut logits).unwrap();
    }
    // Far past the window (95 positions, 24 blocks), the sequence held no more than the ring.
    assert!(prefix.len() as u64 > 10 * window);
    s.free(seq);
    assert_eq!(s.pool.used(), 0);
}
