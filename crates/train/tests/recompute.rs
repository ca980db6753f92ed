//! Recompute: every policy gives bit-identical losses, gradients and weights to
//! no recompute in fp32 (the same kernels run in the same order), on GPT-2 and Llama blocks with
//! either attention kernel, and the arena's measured peak equals the plan's per category, to the
//! byte, under every policy. Five blocks so that every:2, every:3 and sqrt (K = 2) end with a
//! shorter segment; two micro-steps per step so phases are re-entered with gradients accumulating.

mod common;

use common::{config, deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny, tokens};
use engine::io::Which;
use plan::buffer::{Category, Device};
use plan::setup::{Attention, Recompute};
use plan::ModelShape;
use train::Trainer;

const POLICIES: [Recompute; 5] = [
    Recompute::Full,
    Recompute::Every(2),
    Recompute::Every(3),
    Recompute::Sqrt,
    Recompute::Selective,
];

/// Losses of two steps, then every gradient and weight, as raw bits.
struct Run {
    losses: Vec<u32>,
    tensors: Vec<(String, Vec<u32>)>,
}

fn five_blocks(mut shape: ModelShape) -> ModelShape {
    shape.n_layers = 5;
    shape
}

fn run(shape: &ModelShape, recompute: Recompute, attention: Attention) -> Run {
    let (batch, seq) = (2, 16);
    let mut cfg = config(shape.clone(), batch, seq);
    cfg.grad_accum = 2;
    cfg.recompute = recompute;
    cfg.attention = attention;
    let mut t = Trainer::new(cfg).unwrap();
    t.init_weights(7);
    let n = (batch * seq) as usize;
    let mut seed = 0;
    let mut losses = Vec::new();
    for _ in 0..2 {
        let stats = t
            .step(&mut |i, o| {
                seed += 1;
                i.copy_from_slice(&tokens(n, shape.vocab, seed));
                o.copy_from_slice(&tokens(n, shape.vocab, seed + 100));
            })
            .unwrap();
        losses.push(stats.loss.to_bits());
    }
    check_measured_equals_planned(&t, &format!("{} {recompute:?} {attention:?}", shape.name));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let tensors = [Which::Grads, Which::Params]
        .into_iter()
        .flat_map(|w| t.export(w))
        .map(|h| (h.name, bits(&h.data)))
        .collect();
    Run { losses, tensors }
}

fn check_measured_equals_planned(t: &Trainer, what: &str) {
    let measured = t.measured();
    let planned = t.plan.category_peaks(Device::Gpu);
    for c in Category::ALL {
        let i = c as usize;
        let (m, p) = (measured.category_peak_bytes[i], planned[i]);
        assert_eq!(m, p, "{what}: {c:?} measured vs planned");
    }
    assert_eq!(
        measured.peak_bytes,
        t.plan.peak_bytes(Device::Gpu),
        "{what}"
    );
    assert_eq!(measured.reserved_bytes, measured.peak_bytes, "{what}: slab");
}

fn check_bit_identical(shape: ModelShape) {
    let shape = five_blocks(shape);
    for attention in [Attention::Eager, Attention::Flash] {
        let plain = run(&shape, Recompute::None, attention);
        for policy in POLICIES {
            let what = format!("{} {policy:?} {attention:?}", shape.name);
            let r = run(&shape, policy, attention);
            assert_eq!(r.losses, plain.losses, "{what}: losses");
            for ((name, got), (_, want)) in r.tensors.iter().zip(&plain.tensors) {
                let diff = got.iter().zip(want).filter(|(a, b)| a != b).count();
                assert_eq!(diff, 0, "{what}: {name} differs in {diff} values");
            }
        }
    }
}

#[test]
fn gpt2_recompute_is_bit_identical_to_none() {
    check_bit_identical(gpt2_tiny());
}

#[test]
fn llama_recompute_is_bit_identical_to_none() {
    check_bit_identical(llama_tiny());
}

#[test]
fn mixtral_recompute_is_bit_identical_to_none() {
    check_bit_identical(mixtral_tiny());
}

#[test]
fn deepseek_recompute_is_bit_identical_to_none() {
    check_bit_identical(deepseek_tiny());
}

#[test]
fn recompute_lowers_the_measured_activation_peak() {
    let shape = five_blocks(gpt2_tiny());
    let peak = |r| {
        let mut cfg = config(shape.clone(), 4, 32);
        cfg.recompute = r;
        let mut t = Trainer::new(cfg).unwrap();
        let n = 4 * 32;
        let (x, y) = (tokens(n, shape.vocab, 1), tokens(n, shape.vocab, 2));
        t.forward_backward(&x, &y, 1.0 / n as f32).unwrap();
        t.measured().category_peak_bytes[Category::Activations as usize]
    };
    let none = peak(Recompute::None);
    for policy in POLICIES {
        let p = peak(policy);
        assert!(p < none, "{policy:?}: {p} bytes vs none {none}");
    }
    // Full keeps one block's tensors at a time; every:2 keeps two: more, but less than none.
    assert!(peak(Recompute::Full) < peak(Recompute::Every(2)));
}

#[test]
fn every_zero_is_refused_with_the_fix() {
    let mut cfg = config(gpt2_tiny(), 1, 8);
    cfg.recompute = Recompute::Every(0);
    let err = Trainer::new(cfg).err().expect("every:0 is refused");
    assert!(err.to_string().contains("every:K with K >= 1"), "{err}");
}
