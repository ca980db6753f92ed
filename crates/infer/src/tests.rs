//! The inference engine against the forward-only reference (recomputing the whole prefix each
//! token), its bytes against the plan, and its pieces: quantized weights and KV, forks with
//! copy-on-write, refusals, speculative decoding and continuous batching.

use super::*;
use crate::runner::Runner;
use engine::eval;
use engine::testkit::{gpt2_tiny, llama_tiny, tokens};
use plan::ModelShape;
use plan_frugal::ForwardSetup;

pub(super) fn reference(shape: &ModelShape, seed: u64) -> Runner {
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ForwardSetup {
        batch: 1,
        seq: shape.max_positions,
        attention: plan::setup::Attention::Flash,
    };
    let mut r = Runner::new(config, setup).unwrap();
    r.init_weights(seed);
    r
}

fn worker(shape: &ModelShape, w: WeightFormat, kv: KvFormat, batch: u64, block: u64) -> Worker {
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup::generation(shape, batch, shape.max_positions, w, kv, block, 4);
    Worker::new(config, setup).unwrap()
}

pub(super) fn last_row(r: &mut Runner, prefix: &[u32]) -> Vec<f32> {
    let v = r.model.config.shape.vocab as usize;
    let all = eval::logits(r, prefix, 1, prefix.len()).unwrap();
    all[all.len() - v..].to_vec()
}

pub(super) fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// KL(p ‖ q) of two rows of logits.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let soft = |x: &[f32]| {
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = x.iter().map(|v| f64::from(v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<_>>()
    };
    let (p, q) = (soft(p), soft(q));
    p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum()
}

fn gqa_variants() -> Vec<ModelShape> {
    let mqa = ModelShape {
        n_kv_heads: 1,
        ..llama_tiny()
    };
    let mha = ModelShape {
        n_kv_heads: 4,
        ..llama_tiny()
    };
    vec![gpt2_tiny(), llama_tiny(), mqa, mha]
}

#[test]
fn kv_cached_decoding_matches_recomputing_the_prefix() {
    for shape in gqa_variants() {
        let mut r = reference(&shape, 3);
        for block in [4, 16] {
            let mut s = worker(&shape, WeightFormat::F32, KvFormat::F32, 1, block);
            s.load_units(&r.unit_values()).unwrap();
            let mut prefix = tokens(5, shape.vocab, 9);
            let seq = s.new_sequence();
            let mut logits = Vec::new();
            s.prefill(seq, &prefix, &mut logits).unwrap();
            for step in 0..8 {
                let want = last_row(&mut r, &prefix);
                let d = max_abs(&logits, &want);
                assert!(d < 1e-4, "{} block {block} step {step}: {d}", shape.name);
                let next = sample::argmax(&logits);
                prefix.push(next);
                s.decode(&[seq], &[next], &mut logits).unwrap();
            }
            let m = s.measured();
            let plan = s.plan.category_peaks(plan::buffer::Device::Gpu);
            assert_eq!(m.category_peak_bytes, plan, "{} per category", shape.name);
            assert_eq!(m.peak_bytes, s.plan.peak_bytes(plan::buffer::Device::Gpu));
        }
    }
}

#[test]
fn quantized_weights_and_kv_stay_close_to_fp32() {
    let shape = llama_tiny();
    let mut r = reference(&shape, 5);
    let prompt = tokens(12, shape.vocab, 2);
    let want = last_row(&mut r, &prompt);
    let cases = [
        (WeightFormat::Bf16, KvFormat::F32, 1e-4),
        (WeightFormat::Int8, KvFormat::F32, 1e-3),
        (
            WeightFormat::Int4 {
                group: 32,
                asym: false,
            },
            KvFormat::F32,
            0.05,
        ),
        (
            WeightFormat::Int4 {
                group: 32,
                asym: true,
            },
            KvFormat::F32,
            0.05,
        ),
        (WeightFormat::Nf4 { group: 32 }, KvFormat::F32, 0.05),
        (WeightFormat::F32, KvFormat::Bf16, 1e-4),
        (WeightFormat::F32, KvFormat::Int8, 1e-3),
        (WeightFormat::F32, KvFormat::Fp8, 0.01),
    ];
    for (w, kv, bound) in cases {
        let mut s = worker(&shape, w, kv, 1, 16);
        s.load_units(&r.unit_values()).unwrap();
        let seq = s.new_sequence();
        let mut logits = Vec::new();
        s.prefill(seq, &prompt[..11], &mut logits).unwrap();
        s.decode(&[seq], &prompt[11..], &mut logits).unwrap();
        let d = kl(&want, &logits);
        assert!(d.is_finite() && d < bound, "{w:?} {kv:?}: KL {d}");
    }
}

#[test]
fn a_fork_shares_the_prompt_and_copies_the_partial_block_on_write() {
    let shape = llama_tiny();
    let r = reference(&shape, 8);
    let mut s = worker(&shape, WeightFormat::F32, KvFormat::F32, 2, 4);
    s.load_units(&r.unit_values()).unwrap();
    let prompt = tokens(6, shape.vocab, 4);
    let (a, mut logits) = (s.new_sequence(), Vec::new());
    s.prefill(a, &prompt, &mut logits).unwrap();
    let used = s.blocks.used_blocks();
    let b = s.fork(a);
    assert_eq!(s.blocks.used_blocks(), used, "a fork allocates nothing");
    // a and b diverge: the shared half-full block is copied for the first writer.
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    s.decode(&[a, b], &[1, 2], &mut logits).unwrap();
    assert_eq!(
        s.blocks.used_blocks(),
        used + 1,
        "one copy of the shared partial block"
    );
    let v = shape.vocab as usize;
    la.extend_from_slice(&logits[..v]);
    lb.extend_from_slice(&logits[v..]);
    // The same as two sequences prefilled on their own.
    let mut fresh = worker(&shape, WeightFormat::F32, KvFormat::F32, 1, 4);
    fresh.load_units(&r.unit_values()).unwrap();
    for (tok, got) in [(1u32, &la), (2u32, &lb)] {
        let seq = fresh.new_sequence();
        let mut all = prompt.clone();
        all.push(tok);
        fresh.prefill(seq, &all, &mut logits).unwrap();
        assert!(max_abs(&logits, got) < 1e-5, "fork diverging with {tok}");
        fresh.free(seq);
    }
    s.free(a);
    s.free(b);
    assert_eq!(s.free_blocks(), s.setup.kv_blocks as usize);
}

#[test]
fn requests_past_the_context_or_the_pool_are_refused_before_running() {
    let shape = gpt2_tiny();
    let mut s = worker(&shape, WeightFormat::F32, KvFormat::F32, 1, 16);
    let seq = s.new_sequence();
    let mut logits = Vec::new();
    let long = tokens(33, shape.vocab, 1);
    let e = s.prefill(seq, &long, &mut logits).unwrap_err().to_string();
    assert!(e.contains("context of 32"), "{e}");
    assert_eq!(s.seq_len(seq), 0, "nothing ran");
    let bad = s.prefill(seq, &[96], &mut logits).unwrap_err().to_string();
    assert!(bad.contains("vocabulary"), "{bad}");
    // A bad token anywhere in a step changes no sequence.
    let (a, b) = (s.new_sequence(), s.new_sequence());
    s.free(a);
    s.free(b);
    // A second sequence finds the pool (2 blocks of 16) full.
    s.prefill(seq, &tokens(32, shape.vocab, 1), &mut logits)
        .unwrap();
    let other = s.new_sequence();
    let e = s.prefill(other, &[1], &mut logits).unwrap_err().to_string();
    assert!(e.contains("KV pool"), "{e}");
}

#[test]
fn a_refused_step_changes_no_sequence() {
    let shape = gpt2_tiny();
    let mut s = worker(&shape, WeightFormat::F32, KvFormat::F32, 2, 4);
    let (a, b) = (s.new_sequence(), s.new_sequence());
    let mut logits = Vec::new();
    s.prefill(a, &[1, 2, 3], &mut logits).unwrap();
    s.prefill(b, &[1, 2], &mut logits).unwrap();
    let used = s.blocks.used_blocks();
    assert!(s.decode(&[a, b], &[1, 96], &mut logits).is_err());
    assert_eq!(
        (s.seq_len(a), s.seq_len(b), s.blocks.used_blocks()),
        (3, 2, used)
    );
    // A prefill whose second chunk holds a bad token changes nothing either.
    let mut long = tokens(20, shape.vocab, 1);
    long[19] = 96;
    assert!(s.prefill(a, &long, &mut logits).is_err());
    assert_eq!(s.seq_len(a), 3);
    s.decode(&[], &[], &mut logits).unwrap();
    let e = schedule::simulate(
        &[schedule::Request {
            prompt: vec![1; 16],
            max_new: 0,
        }],
        &ServeSetup {
            kv_blocks: 1,
            ..ServeSetup::generation(&shape, 1, 32, WeightFormat::F32, KvFormat::F32, 16, 1)
        },
        None,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("at least one new token"), "{e}");
}

#[test]
fn greedy_speculative_decoding_is_token_identical_to_plain_decoding() {
    let shape = llama_tiny();
    let draft_shape = ModelShape {
        n_layers: 1,
        ..llama_tiny()
    };
    for w in [WeightFormat::F32, WeightFormat::Int8] {
        let (rt, rd) = (reference(&shape, 1), reference(&draft_shape, 2));
        let config = ModelConfig::from_shape(shape.clone()).unwrap();
        let setup = ServeSetup {
            prefill_logit_rows: 5,
            ..ServeSetup::generation(&shape, 1, 32, w, KvFormat::F32, 4, 1)
        };
        let mut target = Worker::new(config, setup).unwrap();
        target.load_units(&rt.unit_values()).unwrap();
        let mut draft = worker(&draft_shape, w, KvFormat::F32, 1, 4);
        draft.load_units(&rd.unit_values()).unwrap();
        let prompt = tokens(6, shape.vocab, 7);
        target.split_k = SplitK::Off;
        let plain =
            spec::generate_plain(&mut target, &prompt, 20, &sample::Sampling::greedy(), 0).unwrap();
        let (fast, stats) = spec::generate(
            &mut target,
            &mut draft,
            &prompt,
            20,
            4,
            &sample::Sampling::greedy(),
            0,
        )
        .unwrap();
        assert_eq!(fast, plain, "{w:?}");
        // An unrelated random draft is rarely right: at most one target step per token.
        assert!(stats.target_steps <= 20 && stats.drafted >= stats.target_steps);
        // A draft with the target's own weights is always right.
        let mut same = Worker::new(
            ModelConfig::from_shape(shape.clone()).unwrap(),
            ServeSetup::generation(&shape, 1, 32, w, KvFormat::F32, 4, 1),
        )
        .unwrap();
        same.load_units(&rt.unit_values()).unwrap();
        let (again, stats) = spec::generate(
            &mut target,
            &mut same,
            &prompt,
            20,
            4,
            &sample::Sampling::greedy(),
            0,
        )
        .unwrap();
        assert_eq!(again, plain);
        assert_eq!(stats.accepted, stats.drafted, "{w:?}");
        // Each target step yields the 4 drafted tokens and one of its own.
        assert_eq!(stats.target_steps, 4, "{w:?}");
    }
}

#[test]
fn batched_continuous_serving_gives_each_request_its_own_greedy_output() {
    let shape = gpt2_tiny();
    let r = reference(&shape, 4);
    let requests: Vec<schedule::Request> = (0..7)
        .map(|i| schedule::Request {
            prompt: tokens(2 + i % 5, shape.vocab, i as u64),
            max_new: 3 + (i * 7) % 11,
        })
        .collect();
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    // A pool of 6 blocks of 4 tokens: not every request fits at once (preemption happens).
    let setup = ServeSetup {
        kv_blocks: 6,
        ..ServeSetup::generation(&shape, 3, 32, WeightFormat::F32, KvFormat::F32, 4, 1)
    };
    let mut s = Worker::new(config, setup).unwrap();
    s.load_units(&r.unit_values()).unwrap();
    s.split_k = SplitK::Off;
    let report = schedule::run(&mut s, &requests, 0, &sample::Sampling::greedy(), 0).unwrap();
    let planned = schedule::simulate(&requests, &s.setup, None, 0).unwrap();
    assert_eq!(
        report.stats, planned,
        "the run follows the planned schedule"
    );
    assert!(report.stats.max_concurrent >= 2 && report.stats.max_concurrent <= 3);
    assert_eq!(s.free_blocks(), 6, "every block returned");
    for (i, req) in requests.iter().enumerate() {
        let mut one = worker(&shape, WeightFormat::F32, KvFormat::F32, 1, 4);
        one.load_units(&r.unit_values()).unwrap();
        one.split_k = SplitK::Off;
        let want = spec::generate_plain(
            &mut one,
            &req.prompt,
            req.max_new,
            &sample::Sampling::greedy(),
            0,
        )
        .unwrap();
        assert_eq!(report.outputs[i], want, "request {i}");
    }
}

#[test]
fn quantized_files_round_trip_and_damage_is_named() {
    let shape = llama_tiny();
    let r = reference(&shape, 6);
    let w = WeightFormat::Int4 {
        group: 32,
        asym: true,
    };
    let mut s = worker(&shape, w, KvFormat::F32, 1, 16);
    s.load_units(&r.unit_values()).unwrap();
    let dir = std::env::temp_dir().join(format!("frugal-qfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file::FILE_NAME);
    file::save(&s, &path).unwrap();
    let (header, _) = file::read_header(&path).unwrap();
    assert_eq!(header.format().unwrap(), w);
    let mut back = Worker::new(header.model_config(&path).unwrap(), s.setup).unwrap();
    file::load(&mut back, &path).unwrap();
    let prompt = tokens(5, shape.vocab, 3);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (sa, sb) = (s.new_sequence(), back.new_sequence());
    s.prefill(sa, &prompt, &mut a).unwrap();
    back.prefill(sb, &prompt, &mut b).unwrap();
    assert_eq!(a, b, "the loaded weights are the saved ones");
    // A flipped payload byte, a wrong magic, a truncation, another format: each named.
    let bytes = std::fs::read(&path).unwrap();
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    let e = file::load(&mut back, &path).unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");
    std::fs::write(&path, b"GGUF\0\0\0\0 not ours at all").unwrap();
    assert!(file::read_header(&path)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert!(file::read_header(&path)
        .unwrap_err()
        .to_string()
        .contains("truncated"));
    std::fs::write(&path, &bytes).unwrap();
    let mut other = worker(&shape, WeightFormat::Int8, KvFormat::F32, 1, 16);
    let e = file::load(&mut other, &path).unwrap_err().to_string();
    assert!(e.contains("int4-asym") && e.contains("int8"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sampled_speculative_decoding_draws_from_the_target_distribution() {
    // Vocabulary of 8: a χ² test over the first token of 3000 seeded runs.
    let shape = ModelShape {
        vocab: 8,
        ..gpt2_tiny()
    };
    let (rt, rd) = (reference(&shape, 11), reference(&shape, 12));
    let sampling = sample::Sampling {
        top_k: Some(8),
        ..sample::Sampling::greedy()
    };
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup {
        prefill_logit_rows: 2,
        ..ServeSetup::generation(&shape, 1, 32, WeightFormat::F32, KvFormat::F32, 4, 1)
    };
    let mut target = Worker::new(config, setup).unwrap();
    target.load_units(&rt.unit_values()).unwrap();
    let mut draft = worker(&shape, WeightFormat::F32, KvFormat::F32, 1, 4);
    draft.load_units(&rd.unit_values()).unwrap();
    let prompt = [1u32, 5, 2];
    let p = {
        let seq = target.new_sequence();
        let mut logits = Vec::new();
        target.prefill(seq, &prompt, &mut logits).unwrap();
        target.free(seq);
        sample::distribution(&logits, &sampling)
    };
    let n = 3000;
    let mut counts = [0u64; 8];
    let mut stats = spec::SpecStats::default();
    for seed in 0..n {
        let (out, s) =
            spec::generate(&mut target, &mut draft, &prompt, 1, 1, &sampling, seed).unwrap();
        counts[out[0] as usize] += 1;
        stats.drafted += s.drafted;
        stats.accepted += s.accepted;
    }
    let chi2: f64 = counts
        .iter()
        .zip(&p)
        .map(|(&c, &pi)| {
            let e = pi * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    // 7 degrees of freedom: P(χ² > 24.3) = 0.001.
    assert!(chi2 < 24.3, "χ² = {chi2}, counts {counts:?}, p {p:?}");
    let rate = stats.acceptance_rate();
    assert!(
        rate > 0.0 && rate < 1.0,
        "a different draft is sometimes rejected: {rate}"
    );
}

#[test]
fn a_shared_prompt_is_cached_once_and_forks_give_each_request_its_own_output() {
    let shape = gpt2_tiny();
    let r = reference(&shape, 9);
    let system = tokens(10, shape.vocab, 77);
    let requests: Vec<schedule::Request> = (0..5)
        .map(|i| schedule::Request {
            prompt: [system.clone(), tokens(1 + i % 3, shape.vocab, i as u64)].concat(),
            max_new: 4 + i,
        })
        .collect();
    let config = ModelConfig::from_shape(shape.clone()).unwrap();
    let setup = ServeSetup {
        kv_blocks: 12,
        ..ServeSetup::generation(&shape, 5, 32, WeightFormat::F32, KvFormat::F32, 4, 1)
    };
    let mut s = Worker::new(config, setup).unwrap();
    s.load_units(&r.unit_values()).unwrap();
    s.split_k = SplitK::Off;
    let shared = schedule::run(&mut s, &requests, 10, &sample::Sampling::greedy(), 0).unwrap();
    assert_eq!(
        s.free_blocks(),
        12,
        "every block returned, the shared prompt's too"
    );
    let planned = schedule::simulate(&requests, &s.setup, None, 10).unwrap();
    assert_eq!(
        shared.stats, planned,
        "the run follows the planned schedule"
    );
    assert!(
        shared.stats.peak_blocks < shared.stats.peak_blocks_unshared,
        "sharing holds fewer blocks: {} vs {}",
        shared.stats.peak_blocks,
        shared.stats.peak_blocks_unshared
    );
    let alone = schedule::run(&mut s, &requests, 0, &sample::Sampling::greedy(), 0).unwrap();
    assert_eq!(
        shared.outputs, alone.outputs,
        "forks decode as whole prompts do"
    );
    let bad = [schedule::Request {
        prompt: vec![1, 2],
        max_new: 1,
    }];
    assert!(
        schedule::simulate(&bad, &s.setup, None, 10).is_err(),
        "a prompt shorter than the prefix"
    );
}
