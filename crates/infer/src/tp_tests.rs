//! Tensor-parallel inference against one rank: the same logits at every step (up to the order
//! of the sums), every rank's bytes equal to its own plan, and the refusals.

use super::tests::{max_abs, reference};
use super::*;
use engine::testkit::{deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny, tokens};
use engine::world::{comm_failure, launch, DEFAULT_TIMEOUT};
use plan::ModelShape;

/// Prefill then `steps` greedy decode steps on `tp` ranks; every rank's logits per step, and
/// whether its measured bytes equal its plan.
fn run(
    shape: &ModelShape,
    tp: usize,
    w: WeightFormat,
    units: &[Vec<f32>],
    steps: usize,
) -> Vec<(Vec<Vec<f32>>, bool)> {
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup::generation(shape, 1, shape.max_positions, w, KvFormat::F32, 4, 4);
    launch(
        tp,
        DEFAULT_TIMEOUT,
        |comm| {
            let mut worker =
                Worker::tensor_parallel(Cpu::new(), config.clone(), setup, comm, None)?;
            worker.load_whole_units(units)?;
            let seq = worker.new_sequence();
            let mut logits = Vec::new();
            worker.prefill(seq, &tokens(6, shape.vocab, 4), &mut logits)?;
            let mut seen = vec![logits.clone()];
            for _ in 0..steps {
                let next = sample::argmax(&logits);
                worker.decode(&[seq], &[next], &mut logits)?;
                seen.push(logits.clone());
            }
            let m = worker.measured();
            let exact = m.category_peak_bytes == worker.plan.category_peaks(Device::Gpu)
                && m.peak_bytes == worker.plan.peak_bytes(Device::Gpu);
            Ok::<_, EngineError>((seen, exact))
        },
        comm_failure,
    )
    .unwrap()
}

#[test]
fn tensor_parallel_ranks_give_one_ranks_logits_and_measure_their_plans() {
    // GPT-2 (learned positions, biases, tied head), Llama (GQA), Llama with fewer key/value
    // heads than ranks (each replicated on two ranks), Mixtral's experts and DeepSeek's latent
    // attention with routed and shared experts (one head a rank at 4).
    let mqa = ModelShape {
        n_kv_heads: 1,
        ..llama_tiny()
    };
    for (shape, tp) in [
        (gpt2_tiny(), 2),
        (gpt2_tiny(), 4),
        (llama_tiny(), 2),
        (mqa, 2),
        (mixtral_tiny(), 2),
        (deepseek_tiny(), 2),
        (deepseek_tiny(), 4),
    ] {
        let r = reference(&shape, 3);
        let units = r.unit_values();
        let one = run(&shape, 1, WeightFormat::F32, &units, 6);
        let many = run(&shape, tp, WeightFormat::F32, &units, 6);
        for (rank, (steps, exact)) in many.iter().enumerate() {
            assert!(
                exact,
                "{} tp {tp} rank {rank}: measured != plan",
                shape.name
            );
            for (i, (got, want)) in steps.iter().zip(&one[0].0).enumerate() {
                assert_eq!(got.len(), want.len());
                let d = max_abs(got, want);
                assert!(d < 1e-4, "{} tp {tp} rank {rank} step {i}: {d}", shape.name);
                // The same greedy token, so both runs fed the same sequence.
                assert_eq!(sample::argmax(got), sample::argmax(want));
            }
        }
    }
}

#[test]
fn quantized_shares_hold_whole_groups_and_match_one_rank() {
    // int4 groups of 32 along rows: each rank's 32 input columns of the attention output and
    // 64 of the MLP down projection hold whole groups, so the codes are the whole model's.
    let shape = ModelShape {
        d_model: 64,
        n_heads: 8,
        d_ff: 128,
        ..llama_tiny()
    };
    let units = reference(&shape, 5).unit_values();
    let exact = run(&shape, 1, WeightFormat::F32, &units, 4);
    let int4 = WeightFormat::Int4 {
        group: 32,
        asym: false,
    };
    for w in [int4, WeightFormat::Int8] {
        let one = run(&shape, 1, w, &units, 4);
        let two = run(&shape, 2, w, &units, 4);
        // Both runs decode the same tokens; the activations' int8 rounding may flip where the
        // two ranks' sums differ in the last bit, far inside the format's own error.
        for ((got, want), f32s) in two[0].0.iter().zip(&one[0].0).zip(&exact[0].0) {
            let (d, q) = (max_abs(got, want), max_abs(want, f32s));
            assert!(d < 0.1 * q, "{} tp 2 vs 1: {d}; vs f32: {q}", w.name());
            assert_eq!(sample::argmax(got), sample::argmax(want));
        }
        assert!(two.iter().all(|(_, exact)| *exact), "measured != plan");
    }
    // Groups of 64 would cut the 32 columns of the attention output each rank holds.
    let cut = WeightFormat::Int4 {
        group: 64,
        asym: false,
    };
    let err = refusal(&shape, 2, cut);
    assert!(err.contains("--weight-group 64"), "{err}");
}

/// The error every rank of a group of `tp` gets building a worker of `shape` in format `w`.
fn refusal(shape: &ModelShape, tp: usize, w: WeightFormat) -> String {
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup::generation(shape, 1, 16, w, KvFormat::F32, 4, 1);
    let build = |comm| Worker::tensor_parallel(Cpu::new(), config.clone(), setup, comm, None);
    match launch(tp, DEFAULT_TIMEOUT, build, comm_failure) {
        Ok(_) => panic!("{} on {tp} ranks was not refused", shape.name),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_model_the_ranks_cannot_split_is_refused_naming_the_numbers() {
    let err = refusal(&gpt2_tiny(), 3, WeightFormat::F32);
    assert!(err.contains("4 attention heads"), "{err}");
}

#[test]
fn a_group_driven_from_one_thread_batches_as_one_worker_does() {
    // Two sequences decoded together, one forked and one freed midway: the calls a server's
    // engine loop makes, on a group of two and on one worker.
    let shape = llama_tiny();
    let units = std::sync::Arc::new(reference(&shape, 8).unit_values());
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup::generation(&shape, 3, 32, WeightFormat::F32, KvFormat::F32, 4, 2);
    let run = |tp: usize| {
        let u = units.clone();
        let load: group::Load = std::sync::Arc::new(move |w: &mut Worker| w.load_whole_units(&u));
        let mut g = group::Group::start(config.clone(), setup, tp, load).unwrap();
        let mut logits = Vec::new();
        let mut seen = Vec::new();
        let (a, b) = (g.new_sequence(), g.new_sequence());
        g.prefill(a, &tokens(5, shape.vocab, 1), &mut logits)
            .unwrap();
        g.prefill(b, &tokens(7, shape.vocab, 2), &mut logits)
            .unwrap();
        let c = g.fork(a);
        for step in 0..6u32 {
            let ids = if step < 3 { vec![a, b, c] } else { vec![a, c] };
            if step == 3 {
                g.free(b);
            }
            let feed: Vec<u32> = (0..ids.len() as u32).map(|i| (i * 7 + step) % 64).collect();
            g.decode(&ids, &feed, &mut logits).unwrap();
            seen.push(logits.clone());
        }
        let plan = (g.plan.category_peaks(Device::Gpu), g.size());
        (seen, g.finish(), plan)
    };
    let (one, _, _) = run(1);
    let (two, measured, (lead_plan, size)) = run(2);
    assert_eq!((size, measured.len()), (2, 2));
    assert_eq!(measured[0].category_peak_bytes, lead_plan);
    for (got, want) in two.iter().zip(&one) {
        assert!(max_abs(got, want) < 1e-4);
    }
}
