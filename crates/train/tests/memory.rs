//! The engine's measured memory equals the plan's, per category, to the byte, and a run that does
//! not fit `--device-memory` is refused before anything is allocated.

mod common;

use common::{config, deepseek_tiny, gpt2_tiny, llama_tiny, mixtral_tiny, tokens, trainer};
use engine::EngineError;
use plan::buffer::{Category, Device};
use plan::ModelShape;
use train::Trainer;

fn check_measured_equals_planned(shape: ModelShape, batch: u64, seq: u64) {
    let name = format!("{} b{batch} t{seq}", shape.name);
    let vocab = shape.vocab;
    let mut t = trainer(shape, batch, seq);
    let n = (batch * seq) as usize;
    let (x, y) = (tokens(n, vocab, 1), tokens(n, vocab, 2));
    t.step(&mut |i, o| {
        i.copy_from_slice(&x);
        o.copy_from_slice(&y);
    })
    .unwrap();
    let measured = t.measured();
    let planned = t.plan.category_peaks(Device::Gpu);
    for c in Category::ALL {
        assert_eq!(
            measured.category_peak_bytes[c as usize], planned[c as usize],
            "{name}: {c:?} measured vs planned"
        );
    }
    assert_eq!(
        measured.peak_bytes,
        t.plan.peak_bytes(Device::Gpu),
        "{name}: peak"
    );
    assert_eq!(
        measured.reserved_bytes, measured.peak_bytes,
        "{name}: slab packs to the peak"
    );
}

#[test]
fn gpt2_measured_peak_equals_plan_per_category() {
    for (b, t) in [(1, 8), (2, 16), (4, 32)] {
        check_measured_equals_planned(gpt2_tiny(), b, t);
    }
}

#[test]
fn llama_measured_peak_equals_plan_per_category() {
    for (b, t) in [(1, 8), (2, 16), (4, 32)] {
        check_measured_equals_planned(llama_tiny(), b, t);
    }
}

#[test]
fn mixtral_measured_peak_equals_plan_per_category() {
    for (b, t) in [(1, 8), (2, 16), (4, 32)] {
        check_measured_equals_planned(mixtral_tiny(), b, t);
        check_measured_equals_planned(deepseek_tiny(), b, t);
    }
}

#[test]
fn a_run_over_capacity_is_refused_with_the_breakdown() {
    let mut cfg = config(gpt2_tiny(), 2, 16);
    let plan = plan_frugal::training_plan(&cfg.model.shape, &cfg.setup()).unwrap();
    let peak = plan.peak_bytes(Device::Gpu);
    cfg.device_memory_bytes = Some(peak - 1);
    match Trainer::new(cfg.clone()) {
        Err(EngineError::DoesNotFit(no)) => {
            assert_eq!((no.needed_bytes, no.capacity_bytes), (peak, peak - 1));
            let (phase, at_peak) = plan.at_peak(Device::Gpu);
            assert_eq!((no.phase, no.at_peak), (phase, at_peak));
            assert_eq!(
                at_peak.iter().sum::<u64>() + no.layout_bytes,
                no.needed_bytes
            );
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a run over capacity was accepted"),
    }
    cfg.device_memory_bytes = Some(peak);
    assert!(
        Trainer::new(cfg).is_ok(),
        "a run at exactly the capacity fits"
    );
}

#[test]
fn overfitting_one_batch_drives_the_loss_down() {
    for shape in [gpt2_tiny(), llama_tiny(), mixtral_tiny(), deepseek_tiny()] {
        let vocab = shape.vocab;
        let mut cfg = config(shape, 2, 16);
        cfg.schedule = train::Schedule::constant(1e-2);
        let mut t = Trainer::new(cfg).unwrap();
        t.init_weights(7);
        let (x, y) = (tokens(32, vocab, 3), tokens(32, vocab, 4));
        let mut losses = Vec::new();
        for _ in 0..30 {
            let s = t
                .step(&mut |i, o| {
                    i.copy_from_slice(&x);
                    o.copy_from_slice(&y);
                })
                .unwrap();
            losses.push(s.loss);
        }
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        assert!(
            (first - (vocab as f32).ln()).abs() < 0.2,
            "initial loss {first} ≈ ln V"
        );
        assert!(
            last < first * 0.5,
            "loss {first} -> {last} after 30 steps on one batch"
        );
    }
}
