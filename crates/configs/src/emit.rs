//! A training setup written as the config a user hands DeepSpeed or accelerate, which
//! [`super::deepspeed`] and [`super::accelerate`] read back to the same setup.
//!
//! What neither config holds (the sequence length, the attention kernel; for accelerate also the
//! micro-batch and gradient checkpointing, which live in the training script) stays a flag of
//! the `frugal plan` command [`read_back`] spells out. Example:
//! `emit::deepspeed(&setup)` → the ds_config.json's JSON.

use plan::setup::{Offload, Optimizer, Precision, Recompute, TrainSetup, ZeroStage};
use serde_json::{json, Value};

/// The config formats `fit --emit` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// DeepSpeed's ds_config.json.
    Deepspeed,
    /// accelerate's config YAML (FSDP or DeepSpeed).
    Accelerate,
}

impl Target {
    pub fn flag(self) -> &'static str {
        match self {
            Target::Deepspeed => "--deepspeed",
            Target::Accelerate => "--accelerate",
        }
    }
}

/// Whether `target` can express `s`: one data-parallel group (no TP/PP), no LoRA (PEFT is the
/// script's), AdamW or SGD, no recompute or HF's full gradient checkpointing, and a precision
/// the target runs (accelerate: DeepSpeed's bf16/fp16, or autocast under FSDP/DDP).
pub fn expresses(target: Target, s: &TrainSetup) -> bool {
    let common = s.tp == 1
        && s.pp == 1
        && s.lora.is_none()
        && matches!(s.optimizer, Optimizer::AdamW | Optimizer::Sgd)
        && matches!(s.recompute, Recompute::None | Recompute::Full)
        && s.precision != Precision::PureBf16;
    common
        && match target {
            Target::Deepspeed => true,
            Target::Accelerate => deepspeed_under_accelerate(s) || fsdp_expresses(s),
        }
}

/// accelerate hands DeepSpeed's own precisions (fp32 master copies) to DeepSpeed.
fn deepspeed_under_accelerate(s: &TrainSetup) -> bool {
    matches!(s.precision, Precision::Bf16 | Precision::Fp16)
        || (s.precision == Precision::Fp32 && !fsdp_expresses(s))
}

/// FSDP's strategies: NO_SHARD, SHARD_GRAD_OP, FULL_SHARD (with its all-or-nothing offload).
fn fsdp_expresses(s: &TrainSetup) -> bool {
    matches!(
        s.precision,
        Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16
    ) && matches!(
        (s.zero, s.offload),
        (ZeroStage::Zero0, Offload::None)
            | (ZeroStage::Zero2, Offload::None)
            | (ZeroStage::Zero3, Offload::None | Offload::Params)
    )
}

fn offload_device(on: bool) -> Value {
    if on {
        json!({ "device": "cpu", "pin_memory": true })
    } else {
        json!({ "device": "none" })
    }
}

/// The ds_config.json of `s` (which [`expresses`] accepts for DeepSpeed). Its learning rate,
/// weight decay and clipping are `"auto"`: HF's Trainer and accelerate fill them.
pub fn deepspeed(s: &TrainSetup) -> Value {
    let b = s.zero_buffers;
    let mut zero = json!({
        "stage": s.zero as u8,
        "offload_optimizer": offload_device(s.offload != Offload::None),
        "offload_param": offload_device(s.offload == Offload::Params),
        "contiguous_gradients": true,
        "reduce_bucket_size": b.reduce_bucket,
        "sub_group_size": b.sub_group,
    });
    if s.zero == ZeroStage::Zero3 {
        zero["stage3_prefetch_bucket_size"] = json!(b.prefetch_bucket);
        zero["stage3_param_persistence_threshold"] = json!(b.persistence_threshold);
        zero["stage3_gather_16bit_weights_on_model_save"] = json!(true);
    } else {
        // One reduce bucket, as the plan holds (overlap would double-buffer it).
        zero["overlap_comm"] = json!(false);
    }
    let mut v = json!({
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "train_batch_size": s.micro_batch * s.grad_accum as u64 * s.dp as u64,
        "zero_optimization": zero,
        "bf16": { "enabled": s.precision == Precision::Bf16 },
        "fp16": { "enabled": s.precision == Precision::Fp16 },
        "optimizer": {
            "type": if s.optimizer == Optimizer::Sgd { "SGD" } else { "AdamW" },
            "params": { "lr": "auto", "weight_decay": "auto" },
        },
        "gradient_clipping": "auto",
    });
    if s.optimizer == Optimizer::Sgd {
        // DeepSpeed's ZeRO runs SGD only when told it may, and offloads it only as torch's.
        v["zero_allow_untested_optimizer"] = json!(true);
        v["zero_force_ds_cpu_optimizer"] = json!(false);
    }
    if let Precision::AmpBf16 | Precision::AmpFp16 = s.precision {
        let dtype = if s.precision == Precision::AmpBf16 {
            "bfloat16"
        } else {
            "float16"
        };
        v["torch_autocast"] = json!({ "enabled": true, "dtype": dtype });
    }
    if s.precision == Precision::Fp16 {
        v["fp16"] = json!({ "enabled": true, "loss_scale": 0, "initial_scale_power": 16,
                            "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1 });
    }
    if s.recompute == Recompute::Full {
        v["activation_checkpointing"] = json!({
            "partition_activations": false,
            "cpu_checkpointing": false,
            "contiguous_memory_optimization": false,
        });
    }
    v
}

/// accelerate's config YAML of `s` (which [`expresses`] accepts for accelerate).
pub fn accelerate(s: &TrainSetup) -> String {
    let mixed = match s.precision {
        Precision::Bf16 | Precision::AmpBf16 => "bf16",
        Precision::Fp16 | Precision::AmpFp16 => "fp16",
        _ => "no",
    };
    let mut out = format!(
        "compute_environment: LOCAL_MACHINE\nmixed_precision: {mixed}\nnum_machines: 1\n\
         num_processes: {}\nmachine_rank: 0\nuse_cpu: false\n",
        s.dp
    );
    if fsdp_expresses(s) && !deepspeed_under_accelerate(s) {
        if s.zero == ZeroStage::Zero0 {
            let kind = if s.dp > 1 { "MULTI_GPU" } else { "NO" };
            out.push_str(&format!("distributed_type: {kind}\n"));
            return out;
        }
        let strategy = if s.zero == ZeroStage::Zero3 {
            "FULL_SHARD"
        } else {
            "SHARD_GRAD_OP"
        };
        out.push_str(&format!(
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: {strategy}\n  \
             fsdp_offload_params: {}\n  fsdp_activation_checkpointing: {}\n  \
             fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_use_orig_params: true\n",
            s.offload == Offload::Params,
            s.recompute == Recompute::Full,
        ));
        return out;
    }
    let dev = |on: bool| if on { "cpu" } else { "none" };
    out.push_str(&format!(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: {}\n  \
         offload_optimizer_device: {}\n  offload_param_device: {}\n  \
         gradient_accumulation_steps: {}\n  zero3_init_flag: {}\n",
        s.zero as u8,
        dev(s.offload != Offload::None),
        dev(s.offload == Offload::Params),
        s.grad_accum,
        s.zero == ZeroStage::Zero3,
    ));
    out
}

/// Whether `s` recomputes by the training script's gradient checkpointing (HF's
/// `gradient_checkpointing=True`) rather than by the config (FSDP's own checkpointing).
pub fn checkpointing_in_script(target: Target, s: &TrainSetup) -> bool {
    s.recompute != Recompute::None
        && (target == Target::Deepspeed
            || deepspeed_under_accelerate(s)
            || s.zero == ZeroStage::Zero0)
}

/// The `frugal plan` arguments that read `file` back to `s` on `model` (after `--model`).
pub fn read_back(target: Target, s: &TrainSetup, model: &str, file: &str) -> Vec<String> {
    let mut args: Vec<String> = ["plan", "--model", model, target.flag(), file]
        .map(String::from)
        .to_vec();
    let mut add = |flag: &str, value: String| {
        args.push(flag.into());
        args.push(value);
    };
    add("--seq", s.seq.to_string());
    add("--gpus", s.dp.to_string());
    if target == Target::Accelerate {
        // The micro-batch, and outside DeepSpeed the accumulation, are the script's; so is
        // gradient checkpointing, except FSDP's.
        add("--batch", s.micro_batch.to_string());
        let ds = deepspeed_under_accelerate(s);
        if !ds && s.grad_accum > 1 {
            add("--grad-accum", s.grad_accum.to_string());
        }
        if checkpointing_in_script(target, s) {
            add("--recompute", s.recompute.to_string());
        }
    }
    if s.attention != plan::setup::Attention::DEFAULT {
        add("--attention", s.attention.to_string());
    }
    args
}
