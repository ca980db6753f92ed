//! Training semantics: gradient accumulation equals one large batch (loss normalised by the
//! step's tokens), weights round-trip through safetensors with HF names, SGD trains, and bad
//! input (token ids beyond the vocabulary, a diverging loss, configs the engine cannot build,
//! weights of another shape) gives typed errors without changing the weights.

mod common;

use common::{config, gpt2_tiny, llama_tiny, tokens, trainer};
use engine::io::{load_safetensors, to_safetensors, Which};
use engine::{EngineError, ModelConfig};
use train::{OptimizerKind, Schedule, Trainer};

fn feed(x: Vec<u32>, y: Vec<u32>) -> impl FnMut(&mut [u32], &mut [u32]) {
    let mut offset = 0;
    move |i: &mut [u32], o: &mut [u32]| {
        let n = i.len();
        i.copy_from_slice(&x[offset..offset + n]);
        o.copy_from_slice(&y[offset..offset + n]);
        offset = (offset + n) % x.len();
    }
}

#[test]
fn accumulating_four_micro_batches_equals_one_batch_of_four() {
    for shape in [gpt2_tiny(), llama_tiny()] {
        let vocab = shape.vocab;
        let (x, y) = (tokens(4 * 16, vocab, 11), tokens(4 * 16, vocab, 12));
        let mut big = Trainer::new(config(shape.clone(), 4, 16)).unwrap();
        big.init_weights(5);
        let mut cfg = config(shape, 1, 16);
        cfg.grad_accum = 4;
        let mut small = Trainer::new(cfg).unwrap();
        small.init_weights(5);
        for _ in 0..3 {
            let a = big.step(&mut feed(x.clone(), y.clone())).unwrap();
            let b = small.step(&mut feed(x.clone(), y.clone())).unwrap();
            // Same tokens, same normalisation; only the summation order differs.
            assert!(
                (a.loss - b.loss).abs() < 1e-5,
                "loss {} vs {}",
                a.loss,
                b.loss
            );
            assert!((a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm.max(1.0));
        }
        let (pa, pb) = (big.export(Which::Params), small.export(Which::Params));
        for (ta, tb) in pa.iter().zip(&pb) {
            let err = ta
                .data
                .iter()
                .zip(&tb.data)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                err < 1e-5,
                "{}: weights differ by {err:e} after 3 steps",
                ta.name
            );
        }
    }
}

#[test]
fn weights_round_trip_through_safetensors() {
    for shape in [gpt2_tiny(), llama_tiny()] {
        let t = trainer(shape.clone(), 1, 8);
        let bytes = to_safetensors(&t.model, &t.arena);
        let mut other = Trainer::new(config(shape, 1, 8)).unwrap();
        other.init_weights(99);
        load_safetensors(&other.model, &other.arena, &bytes, "mem").unwrap();
        assert_eq!(t.export(Which::Params), other.export(Which::Params));
        let x = tokens(8, 96, 1);
        let mut t = t;
        assert_eq!(t.logits(&x, 1, 8).unwrap(), other.logits(&x, 1, 8).unwrap());
    }
}

#[test]
fn weights_of_another_shape_are_refused_and_change_nothing() {
    let t = trainer(gpt2_tiny(), 1, 8);
    let before = t.export(Which::Params);
    let mut wider = gpt2_tiny();
    wider.d_model = 64;
    wider.d_head = 16;
    let other = trainer(wider, 1, 8);
    let bytes = to_safetensors(&other.model, &other.arena);
    match load_safetensors(&t.model, &t.arena, &bytes, "wider.safetensors") {
        Err(EngineError::Weights { path, reason }) => {
            assert_eq!(path, "wider.safetensors");
            assert!(reason.contains("has shape"), "{reason}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    assert_eq!(before, t.export(Which::Params), "weights untouched");
    let err = load_safetensors(&t.model, &t.arena, b"not safetensors", "junk").unwrap_err();
    assert!(err.to_string().contains("not safetensors"), "{err}");
}

#[test]
fn sgd_with_momentum_trains() {
    let mut cfg = config(gpt2_tiny(), 2, 16);
    cfg.optimizer = OptimizerKind::Sgd {
        momentum: 0.9,
        weight_decay: 0.0,
    };
    cfg.schedule = Schedule::constant(0.5);
    let mut t = Trainer::new(cfg).unwrap();
    t.init_weights(3);
    let (x, y) = (tokens(32, 96, 3), tokens(32, 96, 4));
    let first = t.step(&mut feed(x.clone(), y.clone())).unwrap().loss;
    let mut last = first;
    for _ in 0..20 {
        last = t.step(&mut feed(x.clone(), y.clone())).unwrap().loss;
    }
    assert!(last < first - 0.3, "SGD loss {first} -> {last}");
}

#[test]
fn token_ids_beyond_the_vocabulary_are_refused() {
    let mut t = trainer(llama_tiny(), 1, 8);
    let mut x = tokens(8, 96, 1);
    x[5] = 96;
    let err = t.step(&mut feed(x, tokens(8, 96, 2))).unwrap_err();
    assert!(
        err.to_string().contains("token id 96 (at position 5)"),
        "{err}"
    );
}

#[test]
fn a_diverging_loss_stops_before_the_update_with_the_step() {
    let mut cfg = config(gpt2_tiny(), 1, 8);
    cfg.schedule = Schedule::constant(1e30);
    cfg.grad_clip = None;
    let mut t = Trainer::new(cfg).unwrap();
    t.init_weights(1);
    let (x, y) = (tokens(8, 96, 1), tokens(8, 96, 2));
    let mut result = Ok(());
    for _ in 0..10 {
        let before = t.export(Which::Params);
        match t.step(&mut feed(x.clone(), y.clone())) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(before, t.export(Which::Params), "no update after NaN");
                result = Err(e);
                break;
            }
        }
    }
    match result {
        Err(EngineError::NonFiniteLoss {
            step, suggested_lr, ..
        }) => {
            assert!(step >= 1 && suggested_lr < 1e30);
        }
        other => panic!("expected NonFiniteLoss, got {other:?}"),
    }
}

#[test]
fn configs_the_engine_cannot_build_are_refused() {
    let cases = [
        (r#"{"model_type": "bert"}"#, "not built by this engine"),
        (r#"not json"#, "not JSON"),
        (
            r#"{"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 96,
               "max_position_embeddings": 32, "rope_scaling": {"type": "linear", "factor": 2.0}}"#,
            "rope_scaling",
        ),
        (
            r#"{"model_type": "gpt2", "vocab_size": 96, "n_positions": 32, "n_embd": 32,
               "n_layer": 1, "n_head": 4, "activation_function": "relu"}"#,
            "activation_function",
        ),
    ];
    for (json, needle) in cases {
        let err = ModelConfig::from_hf_json(json, "config.json").unwrap_err();
        assert!(err.to_string().contains(needle), "{json}: {err}");
    }
    let ok = ModelConfig::from_hf_json(
        &ModelConfig::from_shape(llama_tiny()).unwrap().to_hf_json(),
        "rt",
    );
    assert_eq!(ok.unwrap().shape.n_kv_heads, 2, "config.json round-trips");
}

#[test]
fn generation_is_seeded_and_stays_below_the_vocab_limit() {
    let mut t = trainer(gpt2_tiny(), 2, 16);
    let greedy = engine::Sampling {
        top_k: None,
        temperature: 1.0,
        top_p: 1.0,
        seed: 1,
        vocab_limit: None,
    };
    let a = t.generate(&[1, 2, 3], 20, greedy).unwrap();
    assert_eq!(
        a,
        t.generate(&[1, 2, 3], 20, greedy).unwrap(),
        "greedy is deterministic"
    );
    assert_eq!(
        a.len(),
        20,
        "longer than the planned 16 positions: the context is cropped"
    );
    let top_k = engine::Sampling {
        top_k: Some(10),
        seed: 9,
        vocab_limit: Some(50),
        ..greedy
    };
    let b = t.generate(&[4], 12, top_k).unwrap();
    assert_eq!(
        b,
        t.generate(&[4], 12, top_k).unwrap(),
        "same seed, same sample"
    );
    assert!(b.iter().all(|&id| id < 50), "{b:?}");
    assert!(
        t.generate(&[], 3, greedy).is_err(),
        "an empty prompt is refused"
    );
    assert!(
        t.generate(&[96], 3, greedy).is_err(),
        "a prompt id beyond the vocabulary is refused"
    );
}
