//! DeepSpeed's `ds_config.json` read into a training setup, resolved as DeepSpeed resolves it:
//! the batch triple (`train_batch_size` = micro-batch × accumulation × data-parallel ranks, any
//! two giving the third), ZeRO's stage and offload rules, bf16/fp16, and HF's `"auto"` values
//! (the flags', and the bucket sizes HF derives from the hidden size: `reduce_bucket_size`
//! hidden², `stage3_prefetch_bucket_size` 0.9 hidden², `stage3_param_persistence_threshold`
//! 10 hidden). Example: `deepspeed::read(&text, "ds_config.json", &flags, Some(4096))?`.

mod sizes;

use super::{agree, count, flag, refuse_unknown, text, unknown_keys, Flags, Read, Setting};
use anyhow::{bail, Context};
use plan::setup::{Offload, Optimizer, Precision, Recompute, ZeroBuffers, ZeroStage};
use serde_json::Value;
use sizes::{batch, buffers};

/// Top-level keys of DeepSpeed's config (docs: deepspeed.ai/docs/config-json).
const TOP: &str = "\
     train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps optimizer \
     scheduler fp16 bf16 amp torch_autocast gradient_clipping prescale_gradients \
     gradient_predivide_factor sparse_gradients zero_optimization zero_allow_untested_optimizer \
     zero_force_ds_cpu_optimizer activation_checkpointing steps_per_print wall_clock_breakdown \
     dump_state flops_profiler tensorboard wandb csv_monitor comet monitor_config comms_logger \
     elasticity autotuning data_efficiency curriculum_learning compression_training checkpoint \
     data_types communication_data_type seq_parallel_communication_data_type aio memory_breakdown \
     sparse_attention pipeline tensor_parallel weight_quantization hybrid_engine nebula \
     eigenvalue progressive_layer_drop quantize_training disable_allgather timers \
     graph_harvesting use_node_local_storage load_universal_checkpoint bfloat16 \
     sequence_parallel_size compile dataloader_drop_last gradient_allreduce_op \
     expert_parallel log_level datastates_ckpt managed_gradient_accumulation";

const ZERO: &str = "\
     stage allgather_partitions allgather_bucket_size overlap_comm reduce_scatter \
     reduce_bucket_size contiguous_gradients offload_param offload_optimizer \
     stage3_max_live_parameters stage3_max_reuse_distance stage3_prefetch_bucket_size \
     stage3_param_persistence_threshold stage3_gather_16bit_weights_on_model_save \
     stage3_gather_fp16_weights_on_model_save sub_group_size elastic_checkpoint \
     round_robin_gradients ignore_unused_parameters load_from_fp32_weights \
     memory_efficient_linear use_multi_rank_bucket_allreduce cpu_offload cpu_offload_param \
     cpu_offload_use_pin_memory log_trace_cache_warnings stage3_module_granularity_threshold \
     module_granularity_threshold use_all_reduce_for_fetch_params pipeline_loading_checkpoint \
     override_module_apply legacy_stage1 zero_hpz_partition_size zero_quantized_weights \
     zero_quantized_nontrainable_weights zero_quantized_gradients zeropp_loco_param \
     mics_shard_size mics_hierarchical_params_gather stage3_model_persistence_threshold \
     stage3_use_all_reduce_for_fetch_params stage3_allgather_sequential zenflow leaf_module \
     enable_sanity_checks prefetch_bucket_size param_persistence_threshold \
     model_persistence_threshold max_live_parameters max_reuse_distance \
     gather_16bit_weights_on_model_save";

const OFFLOAD_OPTIMIZER: &str = "\
     device nvme_path pin_memory buffer_count fast_init ratio pipeline_read pipeline_write \
     super_offload cpuadam_cores_perc";
const OFFLOAD_PARAM: &str = "\
     device nvme_path pin_memory buffer_count buffer_size max_in_cpu";
const BF16: &str = "\
     enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads \
     bf16_optimizer_states";
const FP16: &str = "\
     enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis \
     consecutive_hysteresis min_loss_scale fp16_master_weights_and_grads";
const CHECKPOINTING: &str = "\
     partition_activations cpu_checkpointing contiguous_memory_optimization number_checkpoints \
     synchronize_checkpoint_boundary profile";
const AUTOCAST: &str = "\
     enabled dtype lower_precision_safe_modules";

/// Sections that change the model or the step in ways the planner does not model.
const REFUSED: &str = "\
     amp sparse_attention compression_training weight_quantization hybrid_engine elasticity \
     quantize_training";

/// Reads `text` (a `ds_config.json`) over the flags; `hidden` resolves HF's `"auto"` buckets.
pub fn read(text_: &str, origin: &str, flags: &Flags, hidden: Option<u64>) -> anyhow::Result<Read> {
    let v: Value = serde_json::from_str(text_)
        .with_context(|| format!("{origin} is not valid JSON: a ds_config.json is one object"))?;
    resolve(&v, origin, flags, hidden)
}

fn section<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&Value::Null)
}

/// Whether a section is on: present and not `{"enabled": false}`.
fn enabled(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Object(m) => m.get("enabled") != Some(&Value::Bool(false)),
        _ => true,
    }
}

/// The setup `v` describes over the flags.
pub fn resolve(
    v: &Value,
    origin: &str,
    flags: &Flags,
    hidden: Option<u64>,
) -> anyhow::Result<Read> {
    if !v.is_object() {
        bail!("{origin}: a ds_config.json is one JSON object of settings");
    }
    let zero = section(v, "zero_optimization");
    let mut unknown = Vec::new();
    unknown_keys(v, "", TOP, &mut unknown);
    unknown_keys(zero, "zero_optimization", ZERO, &mut unknown);
    for (key, known) in [
        ("offload_optimizer", OFFLOAD_OPTIMIZER),
        ("offload_param", OFFLOAD_PARAM),
    ] {
        unknown_keys(
            section(zero, key),
            &format!("zero_optimization.{key}"),
            known,
            &mut unknown,
        );
    }
    for (key, known) in [
        ("bf16", BF16),
        ("bfloat16", BF16),
        ("fp16", FP16),
        ("activation_checkpointing", CHECKPOINTING),
        ("torch_autocast", AUTOCAST),
        ("optimizer", "type params"),
    ] {
        unknown_keys(section(v, key), key, known, &mut unknown);
    }
    refuse_unknown(origin, &unknown, "DeepSpeed")?;
    for key in REFUSED.split_whitespace() {
        if enabled(section(v, key)) {
            bail!(
                "{origin}: {key} is on; the planner does not model it: remove it to plan the rest"
            );
        }
    }
    if let Setting::Is(n) = count(
        origin,
        v.get("sequence_parallel_size"),
        "sequence_parallel_size",
    )? {
        if n > 1 {
            bail!("{origin}: sequence_parallel_size {n} (DeepSpeed-Ulysses) is not modelled: remove it to plan the rest, or plan Megatron's sequence parallelism with --tp and --sp");
        }
    }
    let (given, default) = (flags.given, flags.default);
    let mut s = given.clone();
    let mut summary = Vec::new();
    let mut not_planned = Vec::new();

    s.zero = agree(
        origin,
        "zero_optimization.stage",
        stage(origin, zero)?,
        "--zero",
        given.zero,
        default.zero,
    )?;
    let (offload, nvme) = offload(origin, zero, s.zero)?;
    s.offload = agree(
        origin,
        "the offload",
        offload,
        "--offload",
        given.offload,
        default.offload,
    )?;
    summary.push(format!("ZeRO-{}", s.zero as u8));
    if s.offload != Offload::None {
        summary.push(format!(
            "offload {} to {}",
            s.offload,
            if nvme { "nvme" } else { "cpu" }
        ));
    }
    if nvme {
        not_planned.push(
            "offload to nvme: the host figures are what the drive holds, not host RAM".into(),
        );
    }

    let precision = precision(origin, v, given.precision)?;
    if given.precision != default.precision && !same_precision(precision, given.precision) {
        bail!(
            "{origin} sets the precision to {precision}, but --precision {} was given: drop the \
             flag (the config decides) or change the config",
            given.precision
        );
    }
    s.precision = precision;
    summary.push(precision.to_string());

    if let Some(opt) = optimizer(origin, section(v, "optimizer"))? {
        s.optimizer = agree(
            origin,
            "optimizer.type",
            opt,
            "--optimizer",
            given.optimizer,
            default.optimizer,
        )?;
    }
    summary.push(s.optimizer.to_string());

    let ckpt = section(v, "activation_checkpointing");
    if !ckpt.is_null() {
        for key in ["cpu_checkpointing", "partition_activations"] {
            if let Setting::Is(true) = flag(origin, ckpt.get(key), key)? {
                bail!(
                    "{origin}: activation_checkpointing.{key} is on; the planner does not model \
                     it: set it to false to plan the rest"
                );
            }
        }
        s.recompute = agree(
            origin,
            "activation_checkpointing",
            Recompute::Full,
            "--recompute",
            given.recompute,
            default.recompute,
        )?;
    }
    if s.recompute != Recompute::None {
        summary.push(format!("recompute {}", s.recompute));
    }
    if let Some(tp) = section(v, "tensor_parallel").get("autotp_size") {
        if let Setting::Is(n) = count(origin, Some(tp), "tensor_parallel.autotp_size")? {
            let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
            s.tp = agree(
                origin,
                "tensor_parallel.autotp_size",
                n,
                "--tp",
                given.tp,
                default.tp,
            )?;
        }
    }

    (s.micro_batch, s.grad_accum) =
        batch(origin, v, given.micro_batch, given.grad_accum, given.dp)?;
    s.micro_batch = agree(
        origin,
        "train_micro_batch_size_per_gpu",
        s.micro_batch,
        "--batch",
        given.micro_batch,
        default.micro_batch,
    )?;
    s.grad_accum = agree(
        origin,
        "gradient_accumulation_steps",
        s.grad_accum,
        "--grad-accum",
        given.grad_accum,
        default.grad_accum,
    )?;
    summary.push(format!(
        "micro-batch {} × {} accumulated × {} GPUs",
        s.micro_batch, s.grad_accum, s.dp
    ));

    s.zero_buffers = buffers(origin, zero, hidden)?;
    if s.zero_buffers != ZeroBuffers::DEEPSPEED {
        let b = s.zero_buffers;
        let g = plan::units::group_digits;
        summary.push(format!(
            "reduce bucket {}, prefetch bucket {}, persistence threshold {}, sub-group {} elements",
            g(b.reduce_bucket),
            g(b.prefetch_bucket),
            g(b.persistence_threshold),
            g(b.sub_group)
        ));
    }
    let overlap = matches!(
        flag(origin, zero.get("overlap_comm"), "overlap_comm")?,
        Setting::Is(true)
    );
    let contiguous = !matches!(
        flag(
            origin,
            zero.get("contiguous_gradients"),
            "contiguous_gradients"
        )?,
        Setting::Is(false)
    );
    if overlap && contiguous && matches!(s.zero, ZeroStage::Zero1 | ZeroStage::Zero2) {
        not_planned.push(
            "overlap_comm with contiguous_gradients: DeepSpeed double-buffers the reduce bucket"
                .into(),
        );
    }
    for key in [
        "zero_quantized_weights",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
    ] {
        if let Setting::Is(true) = flag(origin, zero.get(key), key)? {
            bail!("{origin}: zero_optimization.{key} is on; the planner does not model ZeRO++ quantization: set it to false to plan the rest");
        }
    }
    for key in ["zero_hpz_partition_size", "mics_shard_size"] {
        if let Setting::Is(n) = count(origin, zero.get(key), key).unwrap_or(Setting::Absent) {
            if n > 1 {
                bail!("{origin}: zero_optimization.{key} is {n}; the planner does not model hierarchical partitions: remove it to plan the rest");
            }
        }
    }
    Ok(Read {
        setup: s,
        summary: summary.join(", "),
        not_planned,
    })
}

fn stage(origin: &str, zero: &Value) -> anyhow::Result<ZeroStage> {
    // DeepSpeed's old boolean form: `"zero_optimization": true` is stage 1.
    if let Value::Bool(on) = zero {
        return Ok(if *on {
            ZeroStage::Zero1
        } else {
            ZeroStage::Zero0
        });
    }
    Ok(
        match count(origin, zero.get("stage"), "zero_optimization.stage")? {
            Setting::Absent => ZeroStage::Zero0,
            Setting::Is(0) => ZeroStage::Zero0,
            Setting::Is(1) => ZeroStage::Zero1,
            Setting::Is(2) => ZeroStage::Zero2,
            Setting::Is(3) => ZeroStage::Zero3,
            Setting::Auto => {
                bail!("{origin}: zero_optimization.stage cannot be \"auto\": give 0, 1, 2 or 3")
            }
            Setting::Is(n) => {
                bail!("{origin}: zero_optimization.stage is {n}: ZeRO has stages 0, 1, 2 and 3")
            }
        },
    )
}

/// The device an offload section names (`None`: no offload), and whether it is nvme.
fn device(origin: &str, zero: &Value, key: &str) -> anyhow::Result<Option<bool>> {
    let sec = section(zero, key);
    let name = format!("zero_optimization.{key}.device");
    Ok(match text(origin, sec.get("device"), &name)? {
        None | Some("none") => None,
        Some("cpu") => Some(false),
        Some("nvme") => Some(true),
        Some(other) => bail!("{origin}: {name} is \"{other}\": use \"cpu\", \"nvme\" or \"none\""),
    })
}

/// ZeRO's offload as the planner names it, and whether it goes to nvme.
fn offload(origin: &str, zero: &Value, stage: ZeroStage) -> anyhow::Result<(Offload, bool)> {
    let mut opt = device(origin, zero, "offload_optimizer")?;
    if opt.is_none()
        && matches!(
            flag(origin, zero.get("cpu_offload"), "cpu_offload")?,
            Setting::Is(true)
        )
    {
        opt = Some(false);
    }
    let mut param = device(origin, zero, "offload_param")?;
    if param.is_none()
        && matches!(
            flag(origin, zero.get("cpu_offload_param"), "cpu_offload_param")?,
            Setting::Is(true)
        )
    {
        param = Some(false);
    }
    let ratio = section(zero, "offload_optimizer")
        .get("ratio")
        .and_then(Value::as_f64);
    if ratio.is_some_and(|r| r < 1.0) {
        bail!("{origin}: zero_optimization.offload_optimizer.ratio below 1 (a partial offload) is not modelled: remove it to plan a full offload");
    }
    if param.is_some() && stage != ZeroStage::Zero3 {
        bail!("{origin}: offload_param needs zero_optimization.stage 3 (DeepSpeed offloads parameters only at stage 3)");
    }
    if opt.is_some() && stage == ZeroStage::Zero0 {
        bail!("{origin}: offload_optimizer needs zero_optimization.stage 1, 2 or 3");
    }
    Ok(match (opt, param) {
        (None, None) => (Offload::None, false),
        (Some(nvme), None) => (Offload::Optimizer, nvme),
        (Some(a), Some(b)) => (Offload::Params, a || b),
        (None, Some(_)) => bail!(
            "{origin}: offload_param without offload_optimizer is not modelled: the planner \
             offloads parameters together with the optimizer; add offload_optimizer"
        ),
    })
}

/// bf16 → DeepSpeed's bf16 (fp32 master), fp16 likewise, torch_autocast → amp, neither → fp32.
fn precision(origin: &str, v: &Value, given: Precision) -> anyhow::Result<Precision> {
    let bf16_given = matches!(
        given,
        Precision::Bf16 | Precision::AmpBf16 | Precision::PureBf16
    );
    let fp16_given = matches!(given, Precision::Fp16 | Precision::AmpFp16);
    let on = |key: &str, auto: bool| -> anyhow::Result<bool> {
        let k = format!("{key}.enabled");
        let sec = section(v, key);
        Ok(match flag(origin, sec.get("enabled"), &k)? {
            Setting::Is(b) => b,
            Setting::Auto => auto,
            // DeepSpeed's sections are off unless `enabled` says otherwise.
            Setting::Absent => false,
        })
    };
    // `bfloat16` is DeepSpeed's older name of the section.
    let bf16 = on("bf16", bf16_given)? || on("bfloat16", bf16_given)?;
    let fp16 = on("fp16", fp16_given)?;
    if bf16 && fp16 {
        bail!("{origin}: bf16 and fp16 are both enabled: DeepSpeed runs one; disable the other");
    }
    let bf16_sec = match section(v, "bf16") {
        Value::Null => section(v, "bfloat16"),
        sec => sec,
    };
    let pure = ["bf16_master_weights_and_grads", "bf16_optimizer_states"]
        .map(|k| matches!(flag(origin, bf16_sec.get(k), k), Ok(Setting::Is(true))));
    if fp16
        && matches!(
            flag(
                origin,
                section(v, "fp16").get("fp16_master_weights_and_grads"),
                "fp16_master_weights_and_grads"
            )?,
            Setting::Is(true)
        )
    {
        bail!("{origin}: fp16.fp16_master_weights_and_grads is not modelled: remove it to plan fp16 with fp32 master weights");
    }
    Ok(if bf16 {
        match pure {
            [false, false] => Precision::Bf16,
            [true, true] => Precision::PureBf16,
            _ => bail!("{origin}: bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states are planned together (pure bf16): set both or neither"),
        }
    } else if fp16 {
        Precision::Fp16
    } else if on("torch_autocast", false)? {
        match text(
            origin,
            section(v, "torch_autocast").get("dtype"),
            "torch_autocast.dtype",
        )? {
            // Without a dtype DeepSpeed calls `torch.autocast` with none: fp16 on CUDA.
            Some("bfloat16" | "torch.bfloat16" | "bf16") => Precision::AmpBf16,
            None | Some("float16" | "torch.float16" | "fp16" | "half") => Precision::AmpFp16,
            Some(other) => {
                bail!("{origin}: torch_autocast.dtype \"{other}\": use bfloat16 or float16")
            }
        }
    } else {
        Precision::Fp32
    })
}

/// HF's `--bf16` means autocast outside DeepSpeed and DeepSpeed's bf16 inside it: the same ask.
fn same_precision(config: Precision, flag: Precision) -> bool {
    config == flag
        || matches!(
            (config, flag),
            (Precision::Bf16, Precision::AmpBf16) | (Precision::Fp16, Precision::AmpFp16)
        )
}

fn optimizer(origin: &str, sec: &Value) -> anyhow::Result<Option<Optimizer>> {
    if sec.is_null() {
        return Ok(None);
    }
    let Some(kind) = text(origin, sec.get("type"), "optimizer.type")? else {
        bail!("{origin}: the optimizer section has no type: give e.g. \"AdamW\"");
    };
    let params = section(sec, "params");
    if matches!(
        flag(origin, params.get("amsgrad"), "amsgrad")?,
        Setting::Is(true)
    ) {
        bail!("{origin}: optimizer.params.amsgrad keeps a third state the planner does not model: set it to false");
    }
    Ok(Some(match kind.to_ascii_lowercase().as_str() {
        "adam" | "adamw" | "fusedadam" | "cpuadam" | "deepspeedcpuadam" => Optimizer::AdamW,
        "sgd" => Optimizer::Sgd,
        other => bail!(
            "{origin}: optimizer type \"{other}\" is not planned: the planner plans Adam/AdamW \
             and SGD (remove the section to plan --optimizer)"
        ),
    }))
}
