//! accelerate's config YAML (`accelerate config`'s `default_config.yaml`) read into a training
//! setup: `distributed_type` FSDP (sharding strategy → ZeRO stage, `fsdp_offload_params`,
//! `fsdp_activation_checkpointing`, `mixed_precision` as autocast over fp32 sharded states),
//! DEEPSPEED (its `deepspeed_config` keys, or the `deepspeed_config_file` it names, read by
//! [`super::deepspeed`]), MULTI_GPU (DDP) or NO. `num_processes` (over `num_machines` for the
//! hybrid strategies) is the data-parallel degree. Example:
//! `accelerate::read(&yaml, "fsdp.yaml", dir, &flags, Some(4096))?`.

use super::{agree, count, flag, refuse_unknown, text, unknown_keys, Flags, Read, Setting};
use anyhow::{bail, Context};
use plan::setup::{Offload, Precision, Recompute, ZeroStage};
use serde_json::Value;
use std::path::Path;

const TOP: &str = "\
     compute_environment debug distributed_type downcast_bf16 enable_cpu_affinity fsdp_config \
     deepspeed_config machine_rank main_training_function main_process_ip main_process_port \
     mixed_precision num_machines num_processes rdzv_backend same_network tpu_env tpu_use_cluster \
     tpu_use_sudo use_cpu gpu_ids dynamo_config megatron_lm_config ipex_config mpirun_config \
     fp8_config tpu_name tpu_zone commands command_file parallelism_config tpu_vm fp16 \
     dynamo_backend";

const FSDP: &str = "\
     fsdp_activation_checkpointing fsdp_auto_wrap_policy fsdp_backward_prefetch \
     fsdp_backward_prefetch_policy fsdp_cpu_ram_efficient_loading fsdp_forward_prefetch \
     fsdp_offload_params fsdp_sharding_strategy fsdp_reshard_after_forward fsdp_state_dict_type \
     fsdp_sync_module_states fsdp_transformer_layer_cls_to_wrap fsdp_use_orig_params fsdp_version \
     fsdp_min_num_params fsdp_limit_all_gathers";

const DEEPSPEED: &str = "\
     gradient_accumulation_steps gradient_clipping offload_optimizer_device offload_param_device \
     offload_optimizer_nvme_path offload_param_nvme_path zero3_init_flag zero3_save_16bit_model \
     zero_stage deepspeed_config_file deepspeed_hostfile deepspeed_multinode_launcher \
     deepspeed_exclusion_filter deepspeed_inclusion_filter deepspeed_moe_layer_cls_names";

/// Reads `yaml`; a `deepspeed_config_file` it names is read relative to `dir`.
pub fn read(
    yaml: &str,
    origin: &str,
    dir: &Path,
    flags: &Flags,
    hidden: Option<u64>,
) -> anyhow::Result<Read> {
    let v: Value = serde_yaml_ng::from_str(yaml)
        .with_context(|| format!("{origin} is not a YAML mapping of accelerate settings"))?;
    if !v.is_object() {
        bail!("{origin}: an accelerate config is a YAML mapping of settings");
    }
    let mut unknown = Vec::new();
    unknown_keys(&v, "", TOP, &mut unknown);
    unknown_keys(
        section(&v, "fsdp_config"),
        "fsdp_config",
        FSDP,
        &mut unknown,
    );
    unknown_keys(
        section(&v, "deepspeed_config"),
        "deepspeed_config",
        DEEPSPEED,
        &mut unknown,
    );
    refuse_unknown(origin, &unknown, "accelerate")?;
    if matches!(
        flag(origin, v.get("use_cpu"), "use_cpu")?,
        Setting::Is(true)
    ) {
        bail!("{origin}: use_cpu is true: the planner plans GPUs; set it to false");
    }
    let processes = match count(origin, v.get("num_processes"), "num_processes")? {
        Setting::Is(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
        Setting::Absent => 1,
        _ => bail!("{origin}: num_processes must be a count of at least 1"),
    };
    let machines = match count(origin, v.get("num_machines"), "num_machines")? {
        Setting::Is(n) if n >= 1 => u32::try_from(n).unwrap_or(u32::MAX),
        Setting::Absent => 1,
        _ => bail!("{origin}: num_machines must be a count of at least 1"),
    };
    let given_mixed = text(origin, v.get("mixed_precision"), "mixed_precision")?;
    // accelerate's default, and the legacy `fp16: true`.
    let legacy_fp16 = matches!(flag(origin, v.get("fp16"), "fp16")?, Setting::Is(true));
    let mixed = given_mixed.unwrap_or(if legacy_fp16 { "fp16" } else { "no" });
    let parallelism = section(&v, "parallelism_config");
    if let Some((key, n)) = parallelism
        .as_object()
        .into_iter()
        .flatten()
        .find_map(|(k, x)| x.as_u64().filter(|n| *n > 1).map(|n| (k.clone(), n)))
    {
        bail!(
            "{origin}: parallelism_config.{key} is {n}: accelerate's N-D parallelism is not \
             read; plan it with --gpus, --tp and --zero instead"
        );
    }
    let kind = text(origin, v.get("distributed_type"), "distributed_type")?.unwrap_or("NO");
    let (given, default) = (flags.given, flags.default);
    let dp = agree(
        origin,
        "num_processes",
        processes,
        "--gpus",
        given.dp,
        default.dp,
    )?;
    match kind {
        "DEEPSPEED" => deepspeed(&v, origin, dir, given_mixed.map(|_| mixed), dp, flags, hidden),
        "FSDP" => fsdp(section(&v, "fsdp_config"), origin, mixed, dp, machines, flags),
        "MULTI_GPU" | "NO" => {
            let mut s = given.clone();
            s.dp = dp;
            s.zero = agree(origin, "distributed_type", ZeroStage::Zero0, "--zero", given.zero, default.zero)?;
            s.precision = amp(origin, mixed, flags)?;
            let summary = format!("{kind}: DDP over {dp} GPUs, {}", s.precision);
            Ok(Read { setup: s, summary, not_planned: Vec::new() })
        }
        other => bail!(
            "{origin}: distributed_type {other} is not planned: use FSDP, DEEPSPEED, MULTI_GPU or NO"
        ),
    }
}

fn section<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&Value::Null)
}

/// accelerate's `mixed_precision` outside DeepSpeed: autocast over fp32 weights.
fn amp(origin: &str, mixed: &str, flags: &Flags) -> anyhow::Result<Precision> {
    let p = match mixed {
        "no" => Precision::Fp32,
        "bf16" => Precision::AmpBf16,
        "fp16" => Precision::AmpFp16,
        other => bail!("{origin}: mixed_precision {other} is not planned: use no, bf16 or fp16"),
    };
    agree(
        origin,
        "mixed_precision",
        p,
        "--precision",
        flags.given.precision,
        flags.default.precision,
    )
}

fn fsdp(
    f: &Value,
    origin: &str,
    mixed: &str,
    processes: u32,
    machines: u32,
    flags: &Flags,
) -> anyhow::Result<Read> {
    let (given, default) = (flags.given, flags.default);
    // FSDP1 names the strategy in `fsdp_sharding_strategy` or, as `accelerate config` now
    // writes it, in `fsdp_reshard_after_forward`; FSDP2 (`fsdp_version: 2`) takes a boolean
    // there (false: gradients and optimizer sharded, parameters kept whole).
    let v2 = f.get("fsdp_version").and_then(Value::as_u64) == Some(2);
    let strategy = match (
        f.get("fsdp_sharding_strategy"),
        f.get("fsdp_reshard_after_forward"),
    ) {
        (Some(Value::Number(n)), _) => n.to_string(),
        (Some(x), _) => text(origin, Some(x), "fsdp_config.fsdp_sharding_strategy")?
            .unwrap_or("FULL_SHARD")
            .to_string(),
        (None, Some(Value::Bool(b))) if v2 => {
            if *b { "FULL_SHARD" } else { "SHARD_GRAD_OP" }.into()
        }
        (None, Some(Value::Bool(_))) => bail!(
            "{origin}: fsdp_reshard_after_forward is a boolean only with fsdp_version: 2; \
             FSDP1 takes a strategy name (FULL_SHARD, SHARD_GRAD_OP, ...)"
        ),
        (None, Some(x)) => text(origin, Some(x), "fsdp_config.fsdp_reshard_after_forward")?
            .unwrap_or("FULL_SHARD")
            .to_string(),
        (None, None) => "FULL_SHARD".into(),
    };
    // FSDP's strategies by name or by the number older accelerate versions wrote.
    let (zero, hybrid) = match strategy.as_str() {
        "FULL_SHARD" | "1" => (ZeroStage::Zero3, false),
        "SHARD_GRAD_OP" | "2" => (ZeroStage::Zero2, false),
        "NO_SHARD" | "3" => (ZeroStage::Zero0, false),
        "HYBRID_SHARD" | "4" => (ZeroStage::Zero3, true),
        "HYBRID_SHARD_ZERO2" | "5" => (ZeroStage::Zero2, true),
        other => bail!(
            "{origin}: fsdp_sharding_strategy {other} is not one of FULL_SHARD, SHARD_GRAD_OP, \
             NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2"
        ),
    };
    let mut s = given.clone();
    // The hybrid strategies shard within a machine and replicate across machines.
    if hybrid && processes % machines != 0 {
        bail!("{origin}: {strategy} over {processes} processes on {machines} machines: the processes must divide evenly among the machines");
    }
    s.dp = if hybrid {
        processes / machines
    } else {
        processes
    };
    s.zero = agree(
        origin,
        "fsdp_sharding_strategy",
        zero,
        "--zero",
        given.zero,
        default.zero,
    )?;
    s.precision = amp(origin, mixed, flags)?;
    let offload = match flag(origin, f.get("fsdp_offload_params"), "fsdp_offload_params")? {
        Setting::Is(true) => Offload::Params,
        _ => Offload::None,
    };
    if offload == Offload::Params && zero != ZeroStage::Zero3 {
        bail!("{origin}: fsdp_offload_params with {strategy} is not modelled: the planner offloads parameters with full sharding");
    }
    s.offload = agree(
        origin,
        "fsdp_offload_params",
        offload,
        "--offload",
        given.offload,
        default.offload,
    )?;
    if let Setting::Is(true) = flag(
        origin,
        f.get("fsdp_activation_checkpointing"),
        "fsdp_activation_checkpointing",
    )? {
        s.recompute = agree(
            origin,
            "fsdp_activation_checkpointing",
            Recompute::Full,
            "--recompute",
            given.recompute,
            default.recompute,
        )?;
    }
    let mut summary = format!(
        "FSDP {strategy} over {} GPUs (planned as ZeRO-{} with fp32 sharded states), {}",
        s.dp, s.zero as u8, s.precision
    );
    if s.offload != Offload::None {
        summary.push_str(", parameters and optimizer on cpu");
    }
    if s.recompute != Recompute::None {
        summary.push_str(&format!(", recompute {}", s.recompute));
    }
    let mut not_planned = Vec::new();
    if mixed != "no" {
        not_planned.push(format!(
            "FSDP's mixed precision gathers {mixed} parameters and reduces gradients in {mixed}; \
             planned as autocast over fp32 sharded states"
        ));
    }
    Ok(Read {
        setup: s,
        summary,
        not_planned,
    })
}

/// Keys accelerate refuses beside a `deepspeed_config_file` (the file holds them).
const FILE_CLASHES: [&str; 8] = [
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_optimizer_nvme_path",
    "offload_param_nvme_path",
    "zero3_save_16bit_model",
];

/// The DeepSpeed section: its keys become a ds_config (ZeRO stage 2 unless set, as accelerate's
/// default), or the file it names is read, its `"auto"` values and missing bf16/fp16 section
/// filled from the launch's mixed precision (the flags), as accelerate fills them.
fn deepspeed(
    v: &Value,
    origin: &str,
    dir: &Path,
    mixed: Option<&str>,
    dp: u32,
    flags: &Flags,
    hidden: Option<u64>,
) -> anyhow::Result<Read> {
    let d = section(v, "deepspeed_config");
    let file = text(
        origin,
        d.get("deepspeed_config_file"),
        "deepspeed_config_file",
    )?;
    if let Some(file) = file {
        let mut clashes: Vec<&str> = FILE_CLASHES
            .iter()
            .copied()
            .filter(|k| d.get(*k).is_some())
            .collect();
        if mixed.is_some() {
            clashes.push("mixed_precision");
        }
        if !clashes.is_empty() {
            bail!(
                "{origin}: {} beside deepspeed_config_file: accelerate refuses them there (the \
                 file holds them); set them in {file}",
                clashes.join(", ")
            );
        }
        let path = dir.join(file);
        let body = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{origin}: cannot read its deepspeed_config_file {}",
                path.display()
            )
        })?;
        let name = path.display().to_string();
        let mut ds: Value = serde_json::from_str(&body)
            .with_context(|| format!("{name} is not valid JSON: a ds_config.json is one object"))?;
        // accelerate's launch adds the section its mixed precision needs when the file has none.
        let (p, default_p) = (flags.given.precision, flags.default.precision);
        let section_for = match p {
            Precision::Bf16 | Precision::AmpBf16 if p != default_p => Some("bf16"),
            Precision::Fp16 | Precision::AmpFp16 => Some("fp16"),
            _ => None,
        };
        let has_section = ["bf16", "bfloat16", "fp16"]
            .iter()
            .any(|k| ds.get(*k).is_some());
        if let (Some(key), false, Some(obj)) = (section_for, has_section, ds.as_object_mut()) {
            obj.insert(key.to_string(), serde_json::json!({ "enabled": true }));
        }
        let mut given = flags.given.clone();
        given.dp = dp;
        let mut default = flags.default.clone();
        default.dp = dp;
        let inner = Flags {
            given: &given,
            default: &default,
        };
        let mut read = super::deepspeed::resolve(&ds, &name, &inner, hidden)?;
        read.summary = format!("DeepSpeed from {file}: {}", read.summary);
        return Ok(read);
    }
    let mixed = mixed.unwrap_or("no");
    let precision = match mixed {
        "no" => Precision::Fp32,
        "bf16" => Precision::Bf16,
        "fp16" => Precision::Fp16,
        other => bail!(
            "{origin}: mixed_precision {other} is not planned with DeepSpeed: use no, bf16 or fp16"
        ),
    };
    let family = |p: Precision| match p {
        Precision::Fp32 => 0,
        Precision::Bf16 | Precision::AmpBf16 | Precision::PureBf16 => 1,
        Precision::Fp16 | Precision::AmpFp16 => 2,
    };
    let flag_precision = flags.given.precision;
    if flag_precision != flags.default.precision && family(flag_precision) != family(precision) {
        bail!(
            "{origin} sets mixed_precision {mixed}, but --precision {flag_precision} was given: \
             drop the flag (the config decides) or change the config"
        );
    }
    let mut given = flags.given.clone();
    given.dp = dp;
    given.precision = precision;
    if let Setting::Is(n) = count(
        origin,
        d.get("gradient_accumulation_steps"),
        "deepspeed_config.gradient_accumulation_steps",
    )? {
        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let (flag, default) = (flags.given.grad_accum, flags.default.grad_accum);
        given.grad_accum = agree(
            origin,
            "gradient_accumulation_steps",
            n,
            "--grad-accum",
            flag,
            default,
        )?;
    }
    let mut default = flags.default.clone();
    (default.dp, default.precision, default.grad_accum) =
        (given.dp, given.precision, given.grad_accum);
    let inner = Flags {
        given: &given,
        default: &default,
    };
    let device = |key: &str| -> anyhow::Result<Value> {
        let dev = text(origin, d.get(key), key)?.unwrap_or("none");
        Ok(serde_json::json!({ "device": dev }))
    };
    // accelerate's default stage is 2.
    let stage = match count(origin, d.get("zero_stage"), "deepspeed_config.zero_stage")? {
        Setting::Is(n) => n,
        _ => 2,
    };
    let ds = serde_json::json!({
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": device("offload_optimizer_device")?,
            "offload_param": device("offload_param_device")?,
        },
        "bf16": { "enabled": precision == Precision::Bf16 },
        "fp16": { "enabled": precision == Precision::Fp16 },
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    });
    let mut read = super::deepspeed::resolve(&ds, origin, &inner, hidden)?;
    read.summary = format!("DeepSpeed: {}", read.summary);
    Ok(read)
}
