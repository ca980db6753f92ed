//! LoRA/QLoRA: a frozen base in every format trains its adapters with planned == measured to
//! the byte, leaves the base's bytes untouched, gives the adapters the gradients of finite
//! differences, and is the same under recompute and ZeRO 1-2.

mod common;

use common::{assert_measured_equals_planned, config, gpt2_tiny, llama_tiny, on_ranks, tokens};
use engine::backend::{Backend, DType};
use plan::setup::{Dtype, Lora, Recompute, ZeroStage};
use plan::ModelShape;
use plan_frugal::Key;
use train::{LoraConfig, TrainConfig, Trainer};

fn lora(base: Dtype, double_quant: bool, targets: &str) -> LoraConfig {
    LoraConfig {
        plan: Lora {
            rank: 4,
            targets: targets.split(',').map(str::to_string).collect(),
            base,
            double_quant,
            dropout: 0.0,
            ggml: None,
        },
        alpha: 8.0,
        base_weights: None,
    }
}

fn lora_config(shape: ModelShape, l: LoraConfig) -> TrainConfig {
    TrainConfig {
        lora: Some(l),
        ..config(shape, 2, 16)
    }
}

/// Every byte of the frozen base.
fn base_bytes(t: &Trainer) -> Vec<u8> {
    let mut out = Vec::new();
    for b in &t.plan.buffers {
        if let Some(key @ (Key::Base(_) | Key::Frozen(..))) = b.key {
            let tensor = t.arena.key_tensor(key, DType::U8);
            let mut bytes = vec![0u8; tensor.len];
            t.arena
                .backend()
                .download_bytes(&t.arena, tensor, &mut bytes);
            out.extend(bytes);
        }
    }
    out
}

fn losses(t: &mut Trainer, steps: usize) -> Vec<f32> {
    let vocab = t.config.model.shape.vocab;
    let n = t.micro_tokens();
    let (x, y) = (tokens(n, vocab, 1), tokens(n, vocab, 2));
    common::losses_on(t, &x, &y, steps)
}

#[test]
fn every_base_format_trains_its_adapters_with_the_planned_bytes_and_a_frozen_base() {
    let bases = [
        (Dtype::F32, false),
        (Dtype::Bf16, false),
        (Dtype::Int8, false),
        (Dtype::Nf4, false),
        (Dtype::Nf4, true),
    ];
    // Qwen2's frozen q|k|v bias and Mistral's sliding window ride along with Llama's views.
    let qwen2 = ModelShape {
        family: plan::model::Family::Qwen2,
        ..llama_tiny()
    };
    let mistral = ModelShape {
        sliding_window: Some(plan::model::SlidingWindow {
            window: 5,
            first_layer: 0,
        }),
        ..llama_tiny()
    };
    for shape in [gpt2_tiny(), llama_tiny(), qwen2, mistral] {
        for (base, dq) in bases {
            let what = format!(
                "{:?} {:?} {base:?} dq={dq}",
                shape.family, shape.sliding_window
            );
            let mut cfg = lora_config(shape.clone(), lora(base, dq, "all-linear"));
            cfg.schedule = train::Schedule::constant(1e-2);
            let mut t = Trainer::new(cfg).unwrap();
            t.init_weights(1337);
            let before = base_bytes(&t);
            let l = losses(&mut t, 12);
            assert!(l[11] < l[0] - 0.3, "{what}: {l:?}");
            assert_eq!(base_bytes(&t), before, "{what}: the base changed");
            assert_measured_equals_planned(&t, &what);
            // No gradient or optimizer state exists for the base: only the adapter units.
            let trained: u64 = t.model.units.iter().map(|u| u.numel).sum();
            assert!(
                trained > 0 && t.model.units.len() == shape.n_layers as usize,
                "{what}"
            );
        }
    }
}

#[test]
fn recompute_and_zero_leave_a_lora_run_bit_identical() {
    let run = |recompute: Recompute, zero: ZeroStage, ranks: u32| -> Vec<Vec<f32>> {
        on_ranks(ranks as usize, |comm| {
            let mut cfg = lora_config(
                llama_tiny(),
                lora(Dtype::Nf4, true, "q_proj,v_proj,down_proj"),
            );
            cfg.recompute = recompute;
            cfg.zero = zero;
            cfg.ranks = ranks;
            let mut t = Trainer::with_comm(cfg, comm).unwrap();
            t.init_weights(7);
            losses(&mut t, 5)
        })
    };
    let plain = run(Recompute::None, ZeroStage::Zero0, 1);
    assert_eq!(
        run(Recompute::Full, ZeroStage::Zero0, 1),
        plain,
        "full recompute"
    );
    assert_eq!(
        run(Recompute::Every(2), ZeroStage::Zero0, 1),
        plain,
        "every:2"
    );
    let dp = run(Recompute::None, ZeroStage::Zero0, 2);
    for zero in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        assert_eq!(run(Recompute::Full, zero, 2), dp, "{zero:?} over 2 ranks");
    }
}

/// 2-byte adapters with fp32 master weights (bf16, fp16 with loss scaling, bf16 with the
/// masters and moments offloaded), alone and at ZeRO-3 over 2 ranks: the loss falls and every
/// rank measures its plan.
#[test]
fn two_byte_adapters_with_fp32_masters_train_at_every_stage() {
    use plan::setup::{Offload, Precision};
    use train::Mixed;
    let cases = [
        (Precision::Bf16, Offload::None, ZeroStage::Zero0, 1),
        (Precision::Fp16, Offload::None, ZeroStage::Zero0, 1),
        (Precision::Bf16, Offload::Optimizer, ZeroStage::Zero1, 1),
        (Precision::Bf16, Offload::None, ZeroStage::Zero3, 2),
    ];
    for (precision, offload, zero, ranks) in cases {
        let what = format!("{precision:?} {offload:?} {zero:?} x{ranks}");
        let results = on_ranks(ranks, |comm| {
            let mut cfg = lora_config(gpt2_tiny(), lora(Dtype::Nf4, true, "all-linear"));
            cfg.schedule = train::Schedule::constant(1e-2);
            cfg.mixed = Mixed {
                precision,
                offload,
                ..Mixed::fp32()
            };
            (cfg.zero, cfg.ranks) = (zero, ranks as u32);
            let mut t = Trainer::with_comm(cfg, comm).unwrap();
            t.init_weights(11);
            let l = losses(&mut t, 12);
            assert_measured_equals_planned(&t, &what);
            l
        });
        let l = &results[0];
        assert!(l[11] < l[0] - 0.3, "{what}: {l:?}");
    }
}

/// Parts taller than a dequant tile (gate and up of 1100 rows: tiles of 1024 and 76): the
/// adapted model's logits equal those of its merged weights in a plain (full) model, before
/// training (B = 0: the dequantized base) and after (the adapters merged in).
#[test]
fn tiled_dequant_and_merge_give_the_logits_of_the_merged_model() {
    let shape = ModelShape {
        d_model: 64,
        d_ff: 1100,
        ..llama_tiny()
    };
    let mut t = Trainer::new(lora_config(
        shape.clone(),
        lora(Dtype::Nf4, true, "all-linear"),
    ))
    .unwrap();
    t.init_weights(3);
    let runner_logits = |t: &Trainer, x: &[u32]| {
        let bytes = engine::io::tensors_to_safetensors(train::peft::merged_tensors(t, None));
        let mut full = Trainer::new(config(shape.clone(), 2, 16)).unwrap();
        engine::io::load_safetensors(&full.model, &full.arena, &bytes, "merged").unwrap();
        full.logits(x, 2, 16).unwrap()
    };
    let x = tokens(32, shape.vocab, 5);
    for trained in [false, true] {
        if trained {
            let mut cfg_lr = t.config.schedule;
            cfg_lr.lr = 1e-2;
            t.config.schedule = cfg_lr;
            losses(&mut t, 5);
        }
        let got = t.logits(&x, 2, 16).unwrap();
        let want = runner_logits(&t, &x);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-4, "trained {trained}: max |diff| {err}");
    }
    assert_measured_equals_planned(&t, "tiled");
}

/// Two micro-batches of one row accumulate to the step of one batch of two rows (the loss is
/// normalised by the step's tokens), up to the summation order.
#[test]
fn gradient_accumulation_equals_the_larger_batch() {
    let run = |batch: u64, grad_accum: u32| -> Vec<f32> {
        let mut cfg = TrainConfig {
            lora: Some(lora(Dtype::Int8, false, "all-linear")),
            grad_accum,
            ..config(llama_tiny(), batch, 16)
        };
        cfg.schedule = train::Schedule::constant(1e-2);
        let mut t = Trainer::new(cfg).unwrap();
        t.init_weights(5);
        let all = tokens(2 * 16 * 6 + 1, 96, 9);
        let mut at = 0;
        (0..6)
            .map(|_| {
                t.step(&mut |i, o| {
                    let n = i.len();
                    i.copy_from_slice(&all[at..at + n]);
                    o.copy_from_slice(&all[at + 1..at + 1 + n]);
                    at += n;
                })
                .unwrap()
                .loss
            })
            .collect()
    };
    let (big, accumulated) = (run(2, 1), run(1, 2));
    for (a, b) in big.iter().zip(&accumulated) {
        assert!((a - b).abs() < 1e-4, "{big:?} vs {accumulated:?}");
    }
}

/// Dropout on the adapters' input: a mask per (rank, step, micro-batch, block, matrix) that a
/// recompute redraws (bit-identical with and without recompute), that changes the trajectory,
/// trains, costs exactly its planned scratch, and is off when evaluating.
#[test]
fn lora_dropout_is_redrawn_by_recompute_and_off_in_evaluation() {
    let run = |dropout: f32, recompute: Recompute| -> (Vec<f32>, Trainer) {
        let mut l = lora(Dtype::Nf4, true, "all-linear");
        l.plan.dropout = dropout;
        let mut cfg = lora_config(llama_tiny(), l);
        cfg.recompute = recompute;
        cfg.schedule = train::Schedule::constant(1e-2);
        let mut t = Trainer::new(cfg).unwrap();
        t.init_weights(21);
        let l = losses(&mut t, 12);
        assert_measured_equals_planned(&t, "dropout");
        (l, t)
    };
    let (dropped, mut t) = run(0.1, Recompute::None);
    assert_eq!(
        run(0.1, Recompute::Full).0,
        dropped,
        "recompute redraws the mask"
    );
    assert_ne!(
        run(0.0, Recompute::None).0,
        dropped,
        "dropout changes the trajectory"
    );
    assert!(dropped[11] < dropped[0] - 0.2, "{dropped:?}");
    let x = tokens(32, 96, 4);
    let first = t.logits(&x, 2, 16).unwrap();
    assert_eq!(
        t.logits(&x, 2, 16).unwrap(),
        first,
        "evaluation draws no mask"
    );
    let planned = |p: f32| {
        let mut l = lora(Dtype::Nf4, true, "all-linear");
        l.plan.dropout = p;
        let cfg = lora_config(llama_tiny(), l);
        plan_frugal::training_plan(&cfg.model.shape, &cfg.setup()).unwrap()
    };
    let names = |p: &plan::MemoryPlan| -> Vec<String> {
        p.buffers
            .iter()
            .filter_map(|b| b.key.map(|k| k.to_string()))
            .collect()
    };
    let (with, without) = (names(&planned(0.1)), names(&planned(0.0)));
    assert!(
        with.contains(&"work.lora_dropped".to_string())
            && !without.contains(&"work.lora_dropped".to_string())
    );
}
