//! Tests of `acts`.
use super::*;
use crate::{assign_offsets, training_plan};
use plan::buffer::MemoryPlan;
use plan::presets;
use plan::setup::Precision;

const POLICIES: [Recompute; 7] = [
    Recompute::None,
    Recompute::Full,
    Recompute::Every(2),
    Recompute::Every(3),
    Recompute::Sqrt,
    Recompute::Selective,
    Recompute::KeepMatmuls,
];

fn setup(batch: u64, seq: u64, recompute: Recompute, attention: Attention) -> TrainSetup {
    TrainSetup {
        precision: Precision::Fp32,
        recompute,
        attention,
        ..TrainSetup::new(batch, seq)
    }
}

fn life(plan: &MemoryPlan, name: &str) -> Lifetime {
    let b = plan.buffers.iter().find(|b| b.name == name);
    b.unwrap_or_else(|| panic!("no {name}")).lifetime
}

#[test]
fn a_segment_is_recomputed_in_its_last_blocks_backward() {
    let mut model = presets::by_name("gpt2-tiny").unwrap();
    model.n_layers = 5;
    let plan = training_plan(&model, &setup(2, 16, Recompute::Every(2), Attention::Eager));
    let plan = plan.unwrap();
    let bwd = |b, d| span(Phase::Backward(b), Phase::Backward(d));
    assert_eq!(life(&plan, "act.h.0.qkv"), bwd(1, 0));
    assert_eq!(life(&plan, "act.h.1.qkv"), bwd(1, 1));
    assert_eq!(life(&plan, "act.h.0.out"), bwd(1, 1));
    assert_eq!(life(&plan, "act.h.4.qkv"), bwd(4, 4));
    let kept = span(Phase::Forward(1), Phase::Backward(2));
    assert_eq!(life(&plan, "act.h.1.out"), kept);
    let fwd = span(Phase::Forward(2), Phase::Forward(3));
    assert_eq!(life(&plan, "act.h.2.out_fwd"), fwd);
    assert_eq!(
        life(&plan, "act.h.4.out"),
        span(Phase::Forward(4), Phase::Head)
    );
    let scratch = span(Phase::Forward(3), Phase::Forward(3));
    assert_eq!(life(&plan, "act.h.3.fwd.att"), scratch);
    let sel = training_plan(
        &model,
        &setup(2, 16, Recompute::KeepMatmuls, Attention::Flash),
    );
    let sel = sel.unwrap();
    assert_eq!(life(&sel, "act.h.3.lse"), bwd(3, 3));
    let saved = span(Phase::Forward(3), Phase::Backward(3));
    assert_eq!(life(&sel, "act.h.3.fch"), saved);
    assert!(sel.buffers.iter().all(|b| !b.name.ends_with("att")));
    // Megatron's selective: only the probabilities are rebuilt, in the block's backward.
    let megatron = training_plan(
        &model,
        &setup(2, 16, Recompute::Selective, Attention::Eager),
    );
    let megatron = megatron.unwrap();
    assert_eq!(life(&megatron, "act.h.3.att"), bwd(3, 3));
    assert_eq!(life(&megatron, "act.h.3.ln1"), saved);
    assert_eq!(life(&megatron, "act.h.3.fwd.att"), scratch);
}

#[test]
fn every_policy_packs_to_its_peak_and_saves_memory() {
    for name in ["gpt2-124m", "gpt2-tiny", "llama-tiny"] {
        let mut model = presets::by_name(name).unwrap();
        // Enough blocks that every:3 and sqrt form more than one segment.
        model.n_layers = model.n_layers.max(6);
        for attention in [Attention::Eager, Attention::Flash] {
            let peak = |r| {
                let plan = training_plan(&model, &setup(2, 64, r, attention)).unwrap();
                let slab = assign_offsets(&plan, Device::Gpu).slab_bytes;
                let peak = plan.peak_bytes(Device::Gpu);
                assert_eq!(slab, peak, "{name} {r:?} {attention:?}");
                plan.category_peaks(Device::Gpu)[Category::Activations as usize]
            };
            let none = peak(Recompute::None);
            for r in POLICIES[1..].iter() {
                // Megatron's selective drops only the T×T probabilities, which flash never
                // keeps.
                if *r == Recompute::Selective && attention == Attention::Flash {
                    assert_eq!(peak(*r), none, "{name}");
                    continue;
                }
                assert!(peak(*r) < none, "{name} {r:?} {attention:?}");
            }
        }
    }
}

/// The loss holds `CLASSIFIER_CHUNK_ROWS` × V logits, never B×T×V.
#[test]
fn no_plan_holds_full_logits_or_flash_probabilities() {
    let model = presets::by_name("gpt2-124m").unwrap();
    let (b, t) = (8, 1024);
    let logits_bytes = b * t * model.vocab * 4;
    let probs_bytes = b * u64::from(model.n_heads) * t * t * 4;
    for r in POLICIES {
        for attention in [Attention::Eager, Attention::Flash] {
            let plan = training_plan(&model, &setup(b, t, r, attention)).unwrap();
            let largest = plan.buffers.iter().max_by_key(|b| b.bytes).unwrap();
            assert!(largest.bytes < logits_bytes, "{r:?}: {}", largest.name);
            // The chunk is 64 rows, or widened to 128/256 where the step's peak leaves room.
            let chunk = plan.buffers.iter().find(|b| b.name == "work.classifier");
            let rows = chunk.unwrap().bytes / (model.vocab * 4);
            assert!([CLASSIFIER_CHUNK_ROWS, 128, 256].contains(&rows), "{rows}");
            let acts = plan.buffers.iter().filter(|b| b.name.contains("act"));
            let widest = acts.map(|b| b.bytes).max().unwrap();
            assert_eq!(
                attention == Attention::Eager,
                widest >= probs_bytes,
                "{r:?}"
            );
        }
    }
}

/// Under `--precision bf16` every tensor a block saves takes 2 bytes — the matmul inputs, the
/// matmul outputs the backward re-reads (`qkv`, `fch`) and the residual stream (`res2`, each
/// block's output, `act.encoded`), as Megatron saves them — but the per-row statistics (norms'
/// mean and rstd, flash attention's lse), which stay f32: each saved block tensor is exactly half
/// of fp32's, and the activation peak drops by exactly that; the f32 scratch is `Other`.
#[test]
fn bf16_halves_the_matmul_inputs_and_outputs_and_nothing_else() {
    let model = presets::by_name("gpt2-tiny").unwrap();
    let (b, t) = (2, 64);
    let fp32 = setup(b, t, Recompute::None, Attention::Flash);
    let bf16 = TrainSetup {
        precision: Precision::Bf16,
        ..fp32.clone()
    };
    let peaks = |s: &TrainSetup| {
        let plan = training_plan(&model, s).unwrap();
        let slab = assign_offsets(&plan, Device::Gpu).slab_bytes;
        assert_eq!(slab, plan.peak_bytes(Device::Gpu));
        (plan.category_peaks(Device::Gpu), plan)
    };
    let (p32, plan32) = peaks(&fp32);
    let (p16, plan16) = peaks(&bf16);
    let d = BlockDims::new(&model, ActShape { batch: b, seq: t });
    let per_block = 2 * d.n * (d.c + d.atty + d.c + d.fc_act + d.qkv + d.fc + 2 * d.c);
    // At the activation peak (the last block's backward) L residual tensors live: act.encoded
    // and every block's output but the last.
    let saved = u64::from(model.n_layers) * per_block;
    let act = Category::Activations as usize;
    assert_eq!(p32[act] - p16[act], saved);
    let statistic = |n: &str| n.ends_with("_mean") || n.ends_with("_rstd") || n.ends_with(".lse");
    let block = |n: &str| n.starts_with("act.h.") || n == "act.encoded";
    for b32 in plan32.buffers.iter().filter(|b| block(&b.name)) {
        let b16 = plan16.buffers.iter().find(|b| b.name == b32.name).unwrap();
        let want = if statistic(&b32.name) {
            b32.bytes
        } else {
            b32.bytes / 2
        };
        assert_eq!(b16.bytes, want, "{}", b32.name);
    }
    let bytes = |name: &str| {
        plan16
            .buffers
            .iter()
            .find(|b| b.name == name)
            .unwrap()
            .bytes
    };
    assert_eq!(bytes("act.h.0.qkv"), 2 * d.n * d.qkv);
    assert_eq!(bytes("act.h.0.res2"), 2 * d.n * d.c);
    assert_eq!(bytes("act.h.0.out"), 2 * d.n * d.c);
    assert_eq!(bytes("work.resid_in"), 4 * d.n * d.c);
    assert_eq!(bytes("work.resid_mid"), 4 * d.n * d.c);
    let widest = d.qkv.max(d.fc);
    assert_eq!(bytes("work.f32"), 4 * d.n * d.c.max(d.fc_act).max(widest));
    assert_eq!(bytes("work.f32_in"), 4 * d.n * widest);
    // The backward GEMMs' bf16 operands: the widest output gradient (fc), its transpose.
    let dout = plan16.buffers.iter().find(|b| b.name == "work.bw.dout_t");
    let dout = dout.unwrap();
    assert_eq!(dout.bytes, 2 * d.n * d.fc);
    assert_eq!(dout.category, Category::Other);
    for p in [Precision::Fp32, Precision::Fp16] {
        let s = TrainSetup {
            precision: p,
            ..fp32.clone()
        };
        let plan = training_plan(&model, &s).unwrap();
        let work = |b: &Buffer| b.name.starts_with("work.f32") || b.name.starts_with("work.bw");
        assert!(plan.buffers.iter().all(|b| !work(b)));
    }
}

/// 2-byte units: no buffer holds a unit in fp32. Below stage 3 the kernels read the working
/// copy and only the vectors are widened; at stage 3 every gather holds the bits (2 bytes an
/// element) with the vectors beside them; the gradients are 2-byte (a span only at stages 2-3)
/// with the vectors' in fp32; no weight is rounded for a GEMM and no GEMM operand is
/// transposed but the output gradient. The classifier's chunk rows are `classifier_row_bytes`
/// each.
#[test]
fn bf16_units_stay_in_two_bytes_at_every_stage() {
    use crate::UnitKind;
    use plan::setup::ZeroStage;
    for name in ["gpt2-tiny", "llama-tiny"] {
        let model = presets::by_name(name).unwrap();
        let units = crate::param_units(&model, 2).unwrap();
        let unit = |kind| units.iter().find(|u| u.kind == kind).unwrap();
        let padded = |kind| unit(kind).padded_numel;
        let vectors = |kind| 4 * unit(kind).vector_numel();
        for zero in [ZeroStage::Zero0, ZeroStage::Zero2, ZeroStage::Zero3] {
            let s = TrainSetup {
                precision: Precision::Bf16,
                zero,
                dp: 2,
                ..setup(2, 64, Recompute::None, Attention::Flash)
            };
            let plan = training_plan(&model, &s).unwrap();
            let find = |n: &str| plan.buffers.iter().find(|b| b.name == n).map(|b| b.bytes);
            let what = format!("{name} {zero:?}");
            for gone in ["work.bw.inp_t", "work.bw.w_t", "work.w_bf16"] {
                assert_eq!(find(gone), None, "{what}: {gone}");
            }
            let row = classifier_row_bytes(&model, ActPolicy::of(&s));
            assert_eq!(row, 4 * model.vocab + 2 * model.d_model);
            assert_eq!(find("work.classifier").unwrap() % row, 0, "{what}");
            let stage3 = zero == ZeroStage::Zero3;
            let bits = |kind| stage3.then(|| 2 * padded(kind));
            let span = |kind| (zero as u8 >= 2).then(|| 2 * padded(kind));
            let (b0, head) = (UnitKind::Block(0), UnitKind::Head);
            assert_eq!(find("gather.fwd.embed"), bits(UnitKind::Embed), "{what}");
            assert_eq!(find("gather.fwd.h.0"), bits(b0), "{what}");
            assert_eq!(find("gather.bwd.h.0"), bits(b0), "{what}");
            assert_eq!(find("gather.fwd.head"), bits(head), "{what}");
            assert_eq!(find("gather.fwd.h.0.vectors"), Some(vectors(b0)), "{what}");
            assert_eq!(find("gather.bwd.h.0.vectors"), Some(vectors(b0)), "{what}");
            assert_eq!(
                find("gather.fwd.head.vectors"),
                Some(vectors(head)),
                "{what}"
            );
            assert_eq!(
                find("gather.fwd.embed.vectors"),
                None,
                "{what}: the tables have none"
            );
            let tied = find("gather.head.embed");
            assert_eq!(
                tied,
                bits(UnitKind::Embed).filter(|_| model.tied_embeddings)
            );
            for kind in [UnitKind::Embed, b0, head] {
                let key = crate::Key::Grads(kind).to_string();
                assert_eq!(find(&key), span(kind), "{what}: {key}");
            }
            assert_eq!(find("grads.h.0.vectors"), Some(vectors(b0)), "{what}");
            assert_eq!(find("grads.head.vectors"), Some(vectors(head)), "{what}");
        }
    }
}

/// The rule "BF16 halves weights and activations": with 2-byte tables read and written in
/// place, a bf16 step never peaks above the fp32 step of the same shape, down to models whose
/// parameters are nearly all embedding (gpt2-mini: 89%) and at every ZeRO stage on one rank.
#[test]
fn bf16_never_peaks_above_fp32() {
    use plan::buffer::Device;
    use plan::setup::ZeroStage;
    let shapes = [(1, 16), (4, 64), (4, 128), (8, 256)];
    let models = [
        "gpt2-tiny",
        "gpt2-mini",
        "llama-tiny",
        "gpt2-124m",
        "llama3-8b",
        "mixtral-8x7b",
    ];
    for name in models {
        let model = presets::by_name(name).unwrap();
        for (b, t) in shapes {
            for zero in [
                ZeroStage::Zero0,
                ZeroStage::Zero1,
                ZeroStage::Zero2,
                ZeroStage::Zero3,
            ] {
                let of = |precision| {
                    let s = TrainSetup {
                        precision,
                        zero,
                        ..setup(b, t, Recompute::None, Attention::Flash)
                    };
                    training_plan(&model, &s).unwrap().peak_bytes(Device::Gpu)
                };
                let (fp32, bf16) = (of(Precision::Fp32), of(Precision::Bf16));
                assert!(
                    bf16 <= fp32,
                    "{name} {b}x{t} {zero:?}: bf16 {bf16} > fp32 {fp32}"
                );
            }
        }
    }
}
