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
    let mut s = Worker::new(config, setup).unwrap();
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
            s.blocks.used_blocks() <= ring as usize,
            "{} blocks held",
            s.blocks.used_blocks()
        );
        let next = sample::argmax(&logits);
        prefix.push(next);
        s.decode(&[seq], &[next], &mut logits).unwrap();
    }
    // Far past the window (95 positions, 24 blocks), the sequence held no more than the ring.
    assert!(prefix.len() as u64 > 10 * window);
    s.free(seq);
    assert_eq!(s.blocks.used_blocks(), 0);
}

/// The plan's replay of a schedule follows a real run under a sliding window: both release the
/// blocks that fell out of the window through the same block manager, so the same requests fit
/// with more of them running at once than a replay that ignored the window would predict.
#[test]
fn the_replay_of_a_windowed_schedule_equals_the_real_run() {
    let shape = ModelShape {
        sliding_window: Some(plan::model::SlidingWindow {
            window: 6,
            first_layer: 0,
        }),
        max_positions: 96,
        ..llama_tiny()
    };
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let requests: Vec<schedule::Request> = (0..6)
        .map(|i| schedule::Request {
            prompt: tokens(10 + 3 * i, shape.vocab, i as u64),
            max_new: 30 + 5 * i,
        })
        .collect();
    let setup = ServeSetup {
        prefill_chunk: 8,
        kv_blocks: 20,
        ..ServeSetup::generation(&shape, 4, 96, WeightFormat::F32, KvFormat::F32, 4, 1)
    };
    let window = window_everywhere(&config);
    assert_eq!(window, Some(6));
    let planned = schedule::simulate(&requests, &setup, window, 0).unwrap();
    let ignoring = schedule::simulate(&requests, &setup, None, 0).unwrap();
    let mut s = Worker::new(config, setup).unwrap();
    s.fill_random(3);
    s.split_k = SplitK::Off;
    let run = schedule::run(&mut s, &requests, 0, &sample::Sampling::greedy(), 0).unwrap();
    assert_eq!(run.stats, planned, "the run follows the replay");
    assert_ne!(
        run.stats, ignoring,
        "the window changes the schedule, so ignoring it would be caught"
    );
    assert_eq!(s.free_blocks(), 20, "every block returned");
}
