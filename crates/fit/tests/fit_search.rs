//! `fit`: the search finds what the classic rules predict (ZeRO needed for 7B on 8 × 80 GB, offload
//! for 13B on one GPU, LoRA or recompute on a 24 GiB card), keeps the global batch, breaks ties
//! in the usual order, counts the ZeRO paper's 2Ψ/3Ψ, and refuses bad requests with the fix.

use fit::{self, FitRequest, Hardware, LoraChoice, Remedy};
use plan::setup::{Offload, Recompute, ZeroStage};
use plan::{presets, ModelShape, PlanError};

const GIB: u64 = 1 << 30;

fn model(name: &str) -> ModelShape {
    presets::by_name(name).unwrap()
}

/// TP/PP pinned to 1 and the user's precision and optimizer kept: the classic ZeRO/offload cases.
fn pinned(mut r: FitRequest) -> FitRequest {
    r.bounds.tp = Some(1);
    r.bounds.pp = Some(1);
    r.keep_states = true;
    r
}

#[test]
fn llama2_7b_on_8x80gb_needs_zero() {
    let m = model("llama2-7b");
    let r = pinned(FitRequest::new(32, 2048, 8, 80_000_000_000));
    let res = fit::search(&m, &r).unwrap();
    assert!(res.candidates_weighed > 100);
    for stage in [ZeroStage::Zero1, ZeroStage::Zero2, ZeroStage::Zero3] {
        assert!(res
            .fitting
            .iter()
            .any(|w| w.setup.zero == stage && w.setup.offload == Offload::None));
    }
    assert!(res.fitting.iter().all(|w| w.setup.zero != ZeroStage::Zero0));
    // Stage 0 keeps the classic 2 + 2 + 12 bytes per parameter; at the peak (early in backward)
    // the weights and optimizer state alone are 14 bytes each, ~94 GB for 6.74B.
    let groups = fit::why_not(&m, &r, &res);
    let plain = groups
        .iter()
        .find(|g| g.remedies.is_empty())
        .expect("the baseline misses");
    let states = plain.at_peak.params_bytes + plain.at_peak.optimizer_bytes;
    assert!(states >= 14 * m.param_count(), "{states}");
    assert!(plain.closest_total_bytes > r.capacity_bytes);
    assert_eq!(plain.largest.0, "optimizer_bytes");
    // Equal step times: the usual order prefers one remedy (ZeRO-1) to more, and lower stages.
    let best = res.best().unwrap();
    assert_eq!(best.remedies, vec![Remedy::Zero]);
    assert_eq!(best.setup.zero, ZeroStage::Zero1);
}

#[test]
fn llama2_13b_on_8x40gib_fits_only_with_zero3_without_offload() {
    let m = model("llama2-13b");
    let mut r = pinned(FitRequest::new(32, 2048, 8, 40 * GIB));
    r.hardware = Hardware::of(fit::gpu_by_name("a100-40g").unwrap());
    let res = fit::search(&m, &r).unwrap();
    let no_offload: Vec<_> = res
        .fitting
        .iter()
        .filter(|w| w.setup.offload == Offload::None)
        .collect();
    assert!(!no_offload.is_empty());
    assert!(no_offload.iter().all(|w| w.setup.zero == ZeroStage::Zero3));
}

#[test]
fn llama2_13b_on_one_80gib_gpu_fits_only_with_offload() {
    let m = model("llama2-13b");
    let mut r = FitRequest::new(8, 2048, 1, 80 * GIB);
    r.keep_states = true;
    let res = fit::search(&m, &r).unwrap();
    assert!(!res.fitting.is_empty());
    assert!(res.fitting.iter().all(|w| w.setup.offload != Offload::None));
    let best = res.best().unwrap();
    // On one GPU the ZeRO stage only carries the offload: it is not a remedy of its own.
    assert!(best.remedies.contains(&Remedy::Offload));
    assert!(
        !best.remedies.contains(&Remedy::Zero),
        "{:?}",
        best.remedies
    );
}

#[test]
fn pure_bf16_and_8bit_adam_fit_8b_on_one_80gib_gpu_without_offload() {
    let m = model("llama3.1-8b");
    let mut r = FitRequest::new(8, 2048, 1, 80 * GIB);
    r.headroom = 0.05;
    r.keep_states = true;
    let kept = fit::search(&m, &r).unwrap();
    let offload = kept.best().expect("offload fits");
    assert_ne!(offload.setup.offload, Offload::None);
    r.keep_states = false;
    let lean = fit::search(&m, &r).unwrap();
    let best = lean.best().unwrap();
    assert_eq!(best.setup.offload, Offload::None);
    assert!(best.remedies.contains(&Remedy::LeanStates));
    let speedup = offload.time().unwrap().step_s / best.time().unwrap().step_s;
    assert!(speedup > 2.0, "{speedup}");
    // Headroom: nothing ranked uses more than 95% of the device.
    for w in &lean.fitting {
        assert!(w.memory().unwrap().total_bytes <= r.usable_bytes());
    }
}

#[test]
fn one_24gib_card_takes_lora_only_when_allowed() {
    let m = model("llama2-7b");
    let mut r = FitRequest::new(8, 1024, 1, 24 * GIB);
    r.hardware = Hardware::of(fit::gpu_by_name("rtx4090").unwrap());
    let without = fit::search(&m, &r).unwrap();
    assert!(without.fitting.iter().all(|w| w.setup.lora.is_none()));
    assert!(without
        .too_big
        .iter()
        .chain(&without.fitting)
        .all(|w| w.setup.lora.is_none()));
    r.lora = Some(LoraChoice {
        rank: 16,
        targets: vec!["all-linear".into()],
    });
    let with = fit::search(&m, &r).unwrap();
    let best = with.best().unwrap();
    assert!(best.setup.lora.is_some() && best.remedies.contains(&Remedy::Lora));
    assert!(with.fitting.len() > without.fitting.len());
}

#[test]
fn long_sequences_on_24gib_need_recompute() {
    // Qwen2.5-0.5B at 8k tokens: even one sequence's activations overflow without recompute.
    let m = model("qwen2.5-0.5b");
    let mut r = FitRequest::new(8, 8192, 1, 24 * GIB);
    r.hardware = Hardware::of(fit::gpu_by_name("rtx4090").unwrap());
    let res = fit::search(&m, &r).unwrap();
    assert!(!res.fitting.is_empty());
    assert!(res
        .fitting
        .iter()
        .all(|w| w.setup.recompute != Recompute::None));
    assert!(res.best().unwrap().remedies.contains(&Remedy::Recompute));
}

#[test]
fn global_batch_is_kept_by_every_candidate() {
    let m = model("llama3-8b");
    let r = FitRequest::new(48, 2048, 8, 80 * GIB);
    let res = fit::search(&m, &r).unwrap();
    let all: Vec<_> = res
        .fitting
        .iter()
        .chain(&res.too_big)
        .chain(&res.unsupported)
        .collect();
    assert_eq!(all.len(), res.candidates_weighed);
    for w in all {
        let s = &w.setup;
        assert_eq!(
            s.dp as u64 * s.micro_batch * s.grad_accum as u64,
            48,
            "{s:?}"
        );
        assert_eq!(s.dp * s.tp * s.pp, 8);
        assert!(s.tp <= 8 && m.n_heads % s.tp == 0);
    }
}

#[test]
fn ties_follow_the_seed_order() {
    let m = model("llama2-7b");
    let res = fit::search(&m, &pinned(FitRequest::new(32, 2048, 8, 80_000_000_000))).unwrap();
    let bucket = |w: &fit::Weighed| (w.time().unwrap().step_s * 1e3).round();
    let top = bucket(res.best().unwrap());
    let tied: Vec<_> = res
        .fitting
        .iter()
        .take_while(|w| bucket(w) == top)
        .collect();
    assert!(tied.len() >= 3, "{}", tied.len());
    for pair in tied.windows(2) {
        let (a, b) = (&pair[0].remedies, &pair[1].remedies);
        assert!((a.len(), a) <= (b.len(), b), "{a:?} before {b:?}");
    }
    // Micro-batch + accumulation (1) comes before recompute (2) at the same time and count.
    let first = |r: Remedy| {
        tied.iter()
            .position(|w| w.remedies == vec![Remedy::Zero, r])
    };
    if let (Some(mb), Some(rc)) = (first(Remedy::MicroBatch), first(Remedy::Recompute)) {
        assert!(mb < rc);
    }
}

#[test]
fn zero_comm_volumes_are_the_papers() {
    use fit::zero_comm_volume as v;
    assert_eq!(v(ZeroStage::Zero0, 1).total_psi(), 2);
    assert_eq!(v(ZeroStage::Zero1, 1).total_psi(), 2);
    assert_eq!(v(ZeroStage::Zero2, 1).total_psi(), 2);
    assert_eq!(v(ZeroStage::Zero3, 1).total_psi(), 3);
    assert_eq!(v(ZeroStage::Zero3, 4).total_psi(), 12);
    let m = model("llama2-7b");
    let hw = Hardware::of(fit::GPUS[0]);
    let mut s = FitRequest::new(32, 2048, 8, 80 * GIB).baseline();
    let psi = m.param_count() as f64;
    for (stage, k) in [
        (ZeroStage::Zero0, 2.0),
        (ZeroStage::Zero1, 2.0),
        (ZeroStage::Zero2, 2.0),
        (ZeroStage::Zero3, 3.0),
    ] {
        s.zero = stage;
        let t = fit::step_time(&m, &s, &hw);
        let want = 7.0 / 8.0 * k * psi * 2.0; // ring share of kΨ bf16 bytes
        assert!((t.dp_comm_bytes - want).abs() / want < 1e-9, "{stage:?}");
        assert!((t.dp_comm_s - want / 450e9).abs() < 1e-9);
    }
}

#[test]
fn recompute_costs_a_forward() {
    let m = model("llama2-7b");
    let hw = Hardware::of(fit::GPUS[0]);
    let mut s = FitRequest::new(8, 2048, 8, 80 * GIB).baseline();
    let none = fit::step_time(&m, &s, &hw).flops_per_rank;
    s.recompute = Recompute::Full;
    let full = fit::step_time(&m, &s, &hw).flops_per_rank;
    s.recompute = Recompute::Selective;
    let sel = fit::step_time(&m, &s, &hw).flops_per_rank;
    // Full reruns the blocks' forward: about a third more (the head is not rerun).
    assert!((1.28..1.34).contains(&(full / none)), "{}", full / none);
    assert!(sel > none && sel / none < 1.05, "{}", sel / none);
}

#[test]
fn cheapest_fix_takes_the_fewest_earliest_remedies() {
    let m = model("llama2-7b");
    let mut s = FitRequest::new(32, 2048, 8, 80_000_000_000).baseline();
    let fix = fit::cheapest_fix(&m, &s, 80_000_000_000, fit::Runtime::Formula).unwrap();
    assert_eq!(fix.remedies, vec![Remedy::Zero]);
    assert_eq!(fix.setup.zero, ZeroStage::Zero1);
    assert!(
        fix.description.starts_with("use --zero 1: total "),
        "{}",
        fix.description
    );
    assert!(fix.memory.total_bytes <= 80_000_000_000);
    // A setup that fits is its own answer; nothing fits in 1 GiB.
    s.zero = ZeroStage::Zero3;
    assert!(fit::cheapest_fix(&m, &s, 80 * GIB, fit::Runtime::Formula)
        .unwrap()
        .remedies
        .is_empty());
    assert!(fit::cheapest_fix(&m, &s, GIB, fit::Runtime::Formula).is_none());
    // One GPU of 24 GiB for GPT-2 1.5B at batch 16: a micro-batch cut alone is not enough.
    let g = model("gpt2-1.5b");
    let mut one = FitRequest::new(16, 1024, 1, 24 * GIB).baseline();
    one.micro_batch = 16;
    let fix = fit::cheapest_fix(&g, &one, 40 * GIB, fit::Runtime::Formula).unwrap();
    assert!(fix.remedies[0] == Remedy::MicroBatch || fix.remedies[0] == Remedy::Recompute);
    assert_eq!(fix.setup.micro_batch * fix.setup.grad_accum as u64, 16);
}

#[test]
fn unsupported_setups_are_reported_not_dropped() {
    let m = model("gpt2-124m");
    let mut r = FitRequest::new(16, 1024, 1, 8 * GIB);
    r.runtime = fit::Runtime::Pytorch;
    let res = fit::search(&m, &r).unwrap();
    assert!(!res.unsupported.is_empty() && !res.fitting.is_empty());
    let groups = fit::why::unsupported_groups(&res);
    assert_eq!(
        groups.iter().map(|g| g.count).sum::<usize>(),
        res.unsupported.len()
    );
    assert!(groups.iter().all(|g| g.reason.contains("pytorch")));
}

#[test]
fn bad_requests_name_the_fix() {
    let m = model("llama2-7b");
    let field = |r: FitRequest| match fit::search(&m, &r) {
        Err(PlanError::Invalid { field, reason }) => format!("{field}: {reason}"),
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(field(FitRequest::new(8, 2048, 0, GIB)).starts_with("--gpus"));
    assert!(field(FitRequest::new(8, 2048, 8, 0)).starts_with("--device-memory"));
    assert!(field(FitRequest::new(0, 2048, 8, GIB)).starts_with("--batch"));
    let odd = field(pinned(FitRequest::new(30, 2048, 8, GIB)));
    assert!(
        odd.starts_with("--batch") && odd.contains("multiple of 8"),
        "{odd}"
    );
    let mut r = FitRequest::new(8, 2048, 8, GIB);
    r.bounds.tp = Some(3);
    assert!(field(r).starts_with("--tp"));
    let mut r = FitRequest::new(8, 2048, 8, GIB);
    r.hardware.mfu = 0.0;
    assert!(field(r).starts_with("--mfu"));
    assert!(matches!(
        fit::gpu_by_name("v99"),
        Err(PlanError::Invalid { .. })
    ));
}

#[test]
fn flash_is_a_remedy_only_for_eager_users() {
    let m = model("gpt2-124m");
    let mut r = FitRequest::new(16, 1024, 1, 16 * GIB);
    let flash_users = fit::search(&m, &r).unwrap();
    assert!(flash_users
        .fitting
        .iter()
        .all(|w| !w.remedies.contains(&Remedy::Flash)));
    r.attention = plan::setup::Attention::Eager;
    let eager_users = fit::search(&m, &r).unwrap();
    let flash = |w: &&fit::Weighed| w.setup.attention == plan::setup::Attention::Flash;
    assert!(eager_users
        .fitting
        .iter()
        .filter(flash)
        .all(|w| w.remedies.contains(&Remedy::Flash)));
    // Eager attention moves its T×T tensors through memory: never faster than flash.
    let best = eager_users.best().unwrap();
    assert_eq!(best.setup.attention, plan::setup::Attention::Flash);
}

#[test]
fn host_memory_is_counted_and_limits_the_search() {
    let m = model("llama2-70b");
    let mut r = FitRequest::new(4, 1024, 1, 24 * GIB);
    r.hardware = Hardware::of(fit::gpu_by_name("rtx4090").unwrap());
    r.keep_states = true;
    let free = fit::search(&m, &r).unwrap();
    let best = free.best().expect("parameter offload fits the device");
    // Master weights, moments, fp32 gradients and the 16-bit parameters on the host: 18 bytes
    // per parameter, past a terabyte.
    let host = best.memory().unwrap().host_node_bytes;
    assert!(host > 1_000_000_000_000, "{host}");
    assert!(
        free.lora_hint.is_none(),
        "full fine-tuning fits and is not 10x slower"
    );
    r.host_capacity_bytes = Some(512 * GIB);
    let capped = fit::search(&m, &r).unwrap();
    assert!(capped.fitting.is_empty());
    let hint = capped
        .lora_hint
        .expect("QLoRA fits where full fine-tuning cannot");
    assert!(hint.setup.lora.is_some());
    assert!(hint.memory().unwrap().host_node_bytes <= 512 * GIB);
}

#[test]
fn loading_copies_one_model_per_process() {
    let m = model("llama2-7b");
    let s = plan::TrainSetup {
        dp: 8,
        zero: ZeroStage::Zero1,
        ..plan::TrainSetup::new(1, 512)
    };
    let e = plan::formula::training_estimate(&m, &s).unwrap();
    let h = plan::host::host_per_node(&m, &s, &e, 8);
    assert_eq!((h.ranks, h.offload_bytes), (8, 0));
    assert_eq!(h.load_bytes, 8 * 2 * m.param_count());
    // ZeRO-3 partitions while loading (zero.Init): one model per node.
    let z3 = plan::TrainSetup {
        zero: ZeroStage::Zero3,
        ..s
    };
    let h = plan::host::host_per_node(&m, &z3, &e, 8);
    assert_eq!(h.load_bytes, 8 * 2 * m.param_count().div_ceil(8));
}
