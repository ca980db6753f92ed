//! The `frugal` runtime profile: the exact buffer list of this project's engine.
//!
//! Owned by the engine: the engine carves its arena from this list (through [`layout`]) and
//! finds each buffer by its typed [`Key`], so the two agree to the byte. Parameters, their
//! gradients and the optimizer state live in flat per-layer units laid out by each model
//! family's module ([`units`], [`family`]); activations follow llm.c's layout ([`acts`]), under
//! any recompute policy and either attention kernel; what each ZeRO stage × precision × offload
//! keeps where is one rule ([`shards::StateRule`]). Mixed precision (bf16, fp16 with master
//! weights), optimizer offload, LoRA/QLoRA (a frozen base and trainable adapters,
//! [`adapters`]) and tensor, sequence and pipeline parallelism (each rank's own plan, [`place`],
//! [`tp`], [`pp`]) are planned; a setup the engine cannot run (parameter offload, 8-bit Adam,
//! LoRA with TP/PP, ...) is refused with `PlanError::Unsupported`, never silently
//! planned as something else. A forward-only model (export, evaluation) is [`forward_plan`].
//!
//! Example: `training_plan(&gpt2_tiny, &setup)?.peak_bytes(Device::Gpu)` is the engine's measured
//! peak for that setup, and `training_estimate` adds the slab the arena reserves.

pub mod acts;
pub mod adapters;
pub mod device;
pub mod family;
pub mod forward;
pub mod key;
pub mod layout;
pub mod place;
pub mod pp;
pub mod serve;
pub mod shards;
pub mod tp;
pub mod units;

pub use acts::{classifier_row_bytes, ActPolicy, ActShape, CLASSIFIER_CHUNK_ROWS};
pub use forward::{forward_plan, ForwardSetup};
pub use key::{Key, StepAct, StepKind};
pub use layout::{assign_offsets, assign_offsets_aligned, SlabLayout};
use plan::buffer::Device;
use plan::setup::{Offload, Optimizer, Precision, Recompute};
use plan::{Estimate, MemoryPlan, ModelShape, PlanError, TrainSetup};
pub use serve::{serve_plan, serve_plan_rank, KvFormat, Roles, ServeSetup, WeightFormat};
pub use shards::StateRule;
pub use units::{param_units, Role, Unit, UnitKind};

fn unsupported(what: &str) -> PlanError {
    PlanError::Unsupported {
        runtime: "frugal",
        what: what.into(),
    }
}

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

/// Refuses what the engine cannot run (yet) and values out of range, naming the flag at fault.
pub fn check_setup(model: &ModelShape, setup: &TrainSetup) -> Result<(), PlanError> {
    units::check_buildable(model)?;
    if !matches!(
        setup.precision,
        Precision::Fp32 | Precision::Bf16 | Precision::Fp16
    ) {
        return Err(unsupported(
            "this precision policy (use --precision fp32, bf16 or fp16)",
        ));
    }
    if setup.precision != Precision::Fp32 && setup.optimizer != Optimizer::AdamW {
        return Err(unsupported(
            "bf16/fp16 with an optimizer other than adamw (fp32 master weights are stepped \
             by AdamW; use --optimizer adamw or --precision fp32)",
        ));
    }
    if setup.optimizer == Optimizer::AdamW8bit {
        return Err(unsupported("8-bit Adam (use adamw or sgd)"));
    }
    pp::check(model, setup.pp)?;
    if setup.pp > 1 {
        check_pipeline(model, setup)?;
    }
    if setup.sp && setup.tp < 2 {
        return Err(invalid(
            "--sp",
            "sequence parallelism splits the norms' rows over the tensor-parallel ranks: use it \
             with --tp 2 or more"
                .into(),
        ));
    }
    if setup.sp && setup.seq % u64::from(setup.tp) != 0 {
        let reason = format!(
            "sequence parallelism splits the micro-batch's rows over the tensor-parallel ranks: \
             --seq {} must be a multiple of --tp {}",
            setup.seq, setup.tp
        );
        return Err(invalid("--sp", reason));
    }
    tp::check(model, setup.tp)?;
    if setup.tp > 1 && (model.moe.is_some() || model.mla.is_some()) {
        return Err(unsupported(
            "training with tensor parallelism over mixture-of-experts or latent-attention layers \
             (use --tp 1; inference splits them)",
        ));
    }
    if setup.tp > 1 && setup.lora.is_some() {
        return Err(unsupported("LoRA with tensor parallelism (use --tp 1)"));
    }
    if setup.tp > 1 && setup.precision == Precision::Fp16 {
        return Err(unsupported(
            "fp16 with tensor parallelism (its overflow checks are per data-parallel group: \
             use --precision bf16)",
        ));
    }
    if setup.recompute == Recompute::Every(0) {
        return Err(invalid(
            "--recompute",
            "every:0 keeps no block input; use every:K with K >= 1".into(),
        ));
    }
    match (setup.offload, setup.precision) {
        (Offload::None, _) => {}
        (Offload::Optimizer, Precision::Bf16 | Precision::Fp16) => {}
        (Offload::Optimizer, _) => {
            return Err(unsupported(
                "optimizer offload with fp32 weights (the host steps fp32 master weights: use \
                 --precision bf16 or fp16 with --offload optimizer)",
            ))
        }
        (Offload::Params, _) => {
            return Err(unsupported(
                "parameter offload (use --offload none or optimizer)",
            ))
        }
    }
    if let Some(lora) = &setup.lora {
        adapters::check(model, lora)?;
    }
    if setup.dp == 0 {
        return Err(invalid(
            "dp",
            "at least one data-parallel rank is needed".into(),
        ));
    }
    if setup.micro_batch == 0 || setup.seq == 0 || setup.grad_accum == 0 {
        return Err(invalid(
            "--batch",
            "batch, sequence and grad-accum must be positive".into(),
        ));
    }
    plan::validate::check_positions(model, setup.seq)
}

/// What the pipeline does not run yet, named.
fn check_pipeline(model: &ModelShape, setup: &TrainSetup) -> Result<(), PlanError> {
    if model.moe.is_some() {
        return Err(unsupported(
            "pipeline parallelism over mixture-of-experts layers (their load-balancing \
             statistics span every stage; use --pp 1)",
        ));
    }
    if setup.lora.is_some() {
        return Err(unsupported("LoRA with pipeline parallelism (use --pp 1)"));
    }
    if setup.precision == Precision::Fp16 {
        return Err(unsupported(
            "fp16 with pipeline parallelism (its overflow checks are per data-parallel group: \
             use --precision bf16)",
        ));
    }
    let tied = model.tied_embeddings;
    if tied && (setup.precision != Precision::Fp32 || setup.zero as u8 >= 2) {
        return Err(unsupported(
            "a tied embedding (GPT-2) over pipeline stages with 2-byte weights or ZeRO 2-3: the \
             first and last stages' copies are summed as whole fp32 gradients (use \
             --precision fp32 with --zero 0 or 1, or an untied model)",
        ));
    }
    Ok(())
}

pub use place::{rank_units, stage_plans, stage_units, training_plan_of, training_plan_rank};

/// Every buffer the engine allocates for one training step of `model` under `setup`, per rank
/// (tensor parallelism: on tensor-parallel rank 0, which holds the widest vocabulary slice;
/// pipeline parallelism: on the stage with the largest peak, see [`place`]).
pub fn training_plan(model: &ModelShape, setup: &TrainSetup) -> Result<MemoryPlan, PlanError> {
    training_plan_rank(model, setup, 0)
}

/// Chunks of logits the fused classifier may take instead of [`acts::CLASSIFIER_CHUNK_ROWS`],
/// widest first: its GEMMs run faster on more rows (GPT-2 124M at B4 T256 on a 2-core Zen 5, the
/// head took 813 ms per step at 64 rows, 622-630 ms at 256).
pub(crate) const WIDER_CHUNK_ROWS: [u64; 2] = [256, 128];

/// A wider classifier chunk may grow the slab by at most 1/1000 of the step's peak (layout
/// fragmentation; the peak itself never moves): GPT-2 124M at B4 T256 in bf16 gets 128 rows
/// for 381 KB more slab (0.016%), where 64 rows left its head about 1.4x slower (2-core Zen 5).
pub(crate) const WIDEN_SLAB_SLACK: u64 = 1000;

/// Widens the classifier's chunk into room the step already has: the widest of
/// [`WIDER_CHUNK_ROWS`] that leaves the device peak exactly as it is (the head is not the step's
/// peak) and grows the slab by at most 1/[`WIDEN_SLAB_SLACK`] of the peak (the layout's first
/// fit may place the wider chunk a little higher than the peak needs), else the chunk stays at
/// [`acts::CLASSIFIER_CHUNK_ROWS`] rows. The engine reads the chunk's rows from this buffer's
/// size.
pub(crate) fn widen_classifier_chunk(plan: &mut MemoryPlan, row_bytes: u64, rows: u64) {
    let Some(at) = plan
        .buffers
        .iter()
        .position(|b| b.key == Some(Key::Classifier))
    else {
        return;
    };
    let (peak, slab) = (
        plan.peak_bytes(Device::Gpu),
        assign_offsets(plan, Device::Gpu).slab_bytes,
    );
    let narrow = plan.buffers[at].bytes;
    for wide in WIDER_CHUNK_ROWS {
        let bytes = wide.min(rows) * row_bytes;
        if bytes <= narrow {
            continue;
        }
        plan.buffers[at].bytes = bytes;
        let slack = peak / WIDEN_SLAB_SLACK;
        let same = plan.peak_bytes(Device::Gpu) == peak
            && assign_offsets(plan, Device::Gpu).slab_bytes <= slab + slack;
        if same {
            return;
        }
        plan.buffers[at].bytes = narrow;
    }
}

/// The plan with the numbers a process shows: the arena reserves exactly its slab, no context.
pub fn training_estimate(model: &ModelShape, setup: &TrainSetup) -> Result<Estimate, PlanError> {
    let plan = training_plan(model, setup)?;
    let peak_bytes = plan.peak_bytes(Device::Gpu);
    let reserved_bytes = assign_offsets(&plan, Device::Gpu).slab_bytes;
    let host_peak_bytes = plan.peak_bytes(Device::Host);
    Ok(Estimate {
        plan,
        peak_bytes,
        reserved_bytes,
        context_bytes: 0,
        host_peak_bytes,
        phase_peaks: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classifier_chunk_widens_only_into_room_the_peak_leaves() {
        let mut widened = 0;
        for (name, b, t) in [
            ("gpt2-124m", 4, 256),
            ("gpt2-mini", 4, 128),
            ("gpt2-124m", 8, 1024),
        ] {
            let model = presets::by_name(name).unwrap();
            let plan = training_plan(&model, &setup(b, t)).unwrap();
            let at = plan
                .buffers
                .iter()
                .position(|x| x.key == Some(Key::Classifier))
                .unwrap();
            let rows = plan.buffers[at].bytes / (model.vocab * 4);
            let mut narrow = plan.clone();
            narrow.buffers[at].bytes = acts::CLASSIFIER_CHUNK_ROWS * model.vocab * 4;
            assert_eq!(plan.peak_bytes(Device::Gpu), narrow.peak_bytes(Device::Gpu));
            assert_eq!(
                assign_offsets(&plan, Device::Gpu).slab_bytes,
                assign_offsets(&narrow, Device::Gpu).slab_bytes
            );
            widened += usize::from(rows > acts::CLASSIFIER_CHUNK_ROWS);
        }
        // Where the head is not the peak (the 124M runs), the chunk does widen.
        assert!(widened >= 1, "{widened}");
    }
    use plan::buffer::{Category, Lifetime};
    use plan::presets;
    use plan::setup::{Attention, Offload, Optimizer, Precision, ZeroStage};

    fn setup(batch: u64, seq: u64) -> TrainSetup {
        TrainSetup {
            precision: Precision::Fp32,
            attention: Attention::Eager,
            ..TrainSetup::new(batch, seq)
        }
    }

    #[test]
    fn slab_packs_to_the_peak_and_live_buffers_never_share_bytes() {
        for (name, batch, seq) in [
            ("gpt2-124m", 4, 256),
            ("gpt2-tiny", 2, 64),
            ("llama-tiny", 3, 32),
        ] {
            let model = presets::by_name(name).unwrap();
            let plan = training_plan(&model, &setup(batch, seq)).unwrap();
            let layout = assign_offsets(&plan, Device::Gpu);
            assert_eq!(layout.slab_bytes, plan.peak_bytes(Device::Gpu), "{name}");
            let span = |i: usize| match plan.buffers[i].lifetime {
                Lifetime::Persistent => (0, u32::MAX),
                Lifetime::Span { born, dies } => {
                    (born.ordinal(plan.n_layers), dies.ordinal(plan.n_layers))
                }
            };
            for (k, &(i, oi)) in layout.offsets.iter().enumerate() {
                for &(j, oj) in &layout.offsets[k + 1..] {
                    let ((bi, di), (bj, dj)) = (span(i), span(j));
                    let in_time = bi <= dj && bj <= di;
                    let in_space =
                        oi < oj + plan.buffers[j].bytes && oj < oi + plan.buffers[i].bytes;
                    assert!(
                        !(in_time && in_space),
                        "{name}: {} and {} overlap",
                        plan.buffers[i].name,
                        plan.buffers[j].name
                    );
                }
            }
        }
    }

    #[test]
    fn gpt2_124m_parameters_are_counted_exactly() {
        let model = presets::by_name("gpt2-124m").unwrap();
        let units = param_units(&model, 1).unwrap();
        assert_eq!(units.iter().map(|u| u.numel).sum::<u64>(), 124_439_808);
        let padded = param_units(&model, 8).unwrap();
        assert!(padded
            .iter()
            .all(|u| u.padded_numel % 8 == 0 && u.padded_numel - u.numel < 8));
    }

    #[test]
    fn setups_the_engine_cannot_run_are_refused() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        let mut s = setup(1, 4096);
        assert!(matches!(
            training_plan(&model, &s),
            Err(PlanError::Invalid { .. })
        ));
        s.seq = 64;
        s.precision = Precision::PureBf16;
        assert!(matches!(
            training_plan(&model, &s),
            Err(PlanError::Unsupported { .. })
        ));
        (s.precision, s.offload) = (Precision::Fp32, Offload::Optimizer);
        let fp32_offload = training_plan(&model, &s).unwrap_err().to_string();
        assert!(fp32_offload.contains("--precision bf16"), "{fp32_offload}");
        s.precision = Precision::Bf16;
        assert!(training_plan(&model, &s).is_ok());
        s.offload = Offload::Params;
        assert!(matches!(
            training_plan(&model, &s),
            Err(PlanError::Unsupported { .. })
        ));
        s.offload = Offload::None;
        s.optimizer = Optimizer::Sgd;
        assert!(matches!(
            training_plan(&model, &s),
            Err(PlanError::Unsupported { .. })
        ));
        let mla = presets::by_name("deepseek-v3").unwrap();
        assert!(training_plan(&mla, &setup(1, 64)).is_err());
    }

    #[test]
    fn bf16_and_fp16_model_state_is_2_2_12_bytes_per_parameter_over_n() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        for precision in [Precision::Bf16, Precision::Fp16] {
            for world in [1u32, 2, 4] {
                let units = param_units(&model, world).unwrap();
                let psi: u64 = units.iter().map(|u| u.padded_numel).sum();
                let n = u64::from(world);
                for (zero, params, grads, opt) in [
                    (ZeroStage::Zero0, 2 * psi, 2 * psi, 12 * psi),
                    (ZeroStage::Zero1, 2 * psi, 2 * psi, 12 * psi / n),
                    (ZeroStage::Zero2, 2 * psi, 2 * psi / n, 12 * psi / n),
                    (ZeroStage::Zero3, 2 * psi / n, 2 * psi / n, 12 * psi / n),
                ] {
                    let mut s = setup(2, 32);
                    (s.precision, s.dp, s.zero) = (precision, world, zero);
                    let plan = training_plan(&model, &s).unwrap();
                    let want = (params, grads, opt);
                    let what = format!("{precision:?} N={world} {zero:?}");
                    assert_eq!(plan.persistent_state(), want, "{what}");
                }
            }
        }
    }

    #[test]
    fn zero_stages_shard_model_state_to_16_psi_over_n_and_pack_to_the_peak() {
        let model = presets::by_name("gpt2-tiny").unwrap();
        for world in [1, 2, 4] {
            let units = param_units(&model, world).unwrap();
            let psi: u64 = units.iter().map(|u| u.padded_numel).sum();
            let mut stage0_peak = 0;
            for zero in [
                ZeroStage::Zero0,
                ZeroStage::Zero1,
                ZeroStage::Zero2,
                ZeroStage::Zero3,
            ] {
                let mut s = setup(2, 32);
                (s.dp, s.zero) = (world, zero);
                let plan = training_plan(&model, &s).unwrap();
                let layout = assign_offsets(&plan, Device::Gpu);
                assert_eq!(layout.slab_bytes, plan.peak_bytes(Device::Gpu), "{zero:?}");
                let persistent = |c: Category| plan.persistent_bytes(c);
                let n = u64::from(world);
                let (p, g, o) = match zero {
                    ZeroStage::Zero0 => (4 * psi, 4 * psi, 8 * psi),
                    ZeroStage::Zero1 => (4 * psi, 4 * psi, 8 * psi / n),
                    ZeroStage::Zero2 => (4 * psi, 4 * psi / n, 8 * psi / n),
                    ZeroStage::Zero3 => (4 * psi / n, 4 * psi / n, 8 * psi / n),
                };
                assert_eq!(persistent(Category::Params), p, "{world} {zero:?}");
                assert_eq!(persistent(Category::Grads), g, "{world} {zero:?}");
                assert_eq!(persistent(Category::Optimizer), o, "{world} {zero:?}");
                // Not monotone in between: with a tied embedding that is most of the model, the
                // stage-2 embedding gradient lives from the head to the embedding backward.
                let peak = plan.peak_bytes(Device::Gpu);
                match zero {
                    ZeroStage::Zero0 => stage0_peak = peak,
                    ZeroStage::Zero3 if world > 1 => assert!(peak < stage0_peak, "{world}"),
                    _ => {}
                }
            }
        }
    }
}
