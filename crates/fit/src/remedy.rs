//! The usual remedies for a run that does not fit, in their usual order, and how a setup differs from
//! the plain one (the baseline): which remedies it applies and the flags that say so.
//!
//! The order merges the two usual lists (for training and for inference):
//! 1 smaller micro-batch + gradient accumulation, 2 activation recompute, 3 a higher ZeRO stage,
//! 4 ZeRO-Offload, 5 FlashAttention, then the longer list's LoRA/QLoRA and TP+PP. It breaks ties
//! between setups with the same predicted step time: fewer remedies first, then earlier ones, then
//! the lighter form of each (a larger micro-batch, a lower stage, ...). Not here: enumeration
//! ([`super::space`]), costs ([`super::cost`]).
//! Example: `Remedy::of(&baseline, &setup)` lists `[MicroBatch, Zero]` for ZeRO-1 with accumulation.

use plan::setup::{Attention, Offload, Recompute, TrainSetup};
use serde::Serialize;

/// One of the usual remedies, in their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// 调小 Batch Size + 梯度累积: fewer sequences per micro-batch, same global batch.
    MicroBatch,
    /// 开启 Activation Checkpointing.
    Recompute,
    /// 提升 ZeRO 等级.
    Zero,
    /// ZeRO-Offload: optimizer state (and parameters) in host memory.
    Offload,
    /// FlashAttention instead of eager attention.
    Flash,
    /// Leaner optimizer state: pure bf16 (no fp32 master copy, bf16 moments) or 8-bit AdamW
    /// (bitsandbytes). Changes the numerics of the update, not what is trained.
    LeanStates,
    /// LoRA / QLoRA: train adapters on a frozen (possibly quantized) base. Changes what is trained.
    Lora,
    /// Tensor and pipeline parallelism.
    Parallel,
}

impl Remedy {
    pub const ALL: [Remedy; 8] = [
        Remedy::MicroBatch,
        Remedy::Recompute,
        Remedy::Zero,
        Remedy::Offload,
        Remedy::Flash,
        Remedy::LeanStates,
        Remedy::Lora,
        Remedy::Parallel,
    ];

    /// The remedy's name as reports write it.
    pub fn label(self) -> &'static str {
        match self {
            Remedy::MicroBatch => "micro-batch + accumulation",
            Remedy::Recompute => "recompute",
            Remedy::Zero => "ZeRO stage",
            Remedy::Offload => "offload",
            Remedy::Flash => "flash attention",
            Remedy::LeanStates => "pure bf16 / 8-bit Adam",
            Remedy::Lora => "LoRA/QLoRA",
            Remedy::Parallel => "TP/PP",
        }
    }

    /// The remedies `setup` applies relative to `baseline` (same model, GPUs and global batch), in
    /// the usual order.
    pub fn of(baseline: &TrainSetup, setup: &TrainSetup) -> Vec<Remedy> {
        Remedy::ALL
            .into_iter()
            .filter(|r| r.applied(baseline, setup))
            .collect()
    }

    fn applied(self, base: &TrainSetup, s: &TrainSetup) -> bool {
        match self {
            // Candidates keep micro-batch × accumulation = the rank's share of the global batch,
            // so more accumulation steps means smaller micro-batches.
            Remedy::MicroBatch => s.grad_accum > base.grad_accum,
            Remedy::Recompute => s.recompute != base.recompute,
            // On one data-parallel rank a ZeRO stage shards nothing: it only says how offload
            // runs, so it is not a remedy of its own there.
            Remedy::Zero => (s.zero as u8) > (base.zero as u8) && s.dp > 1,
            Remedy::Offload => s.offload != base.offload,
            Remedy::Flash => s.attention == Attention::Flash && base.attention == Attention::Eager,
            Remedy::LeanStates => (s.precision, s.optimizer) != (base.precision, base.optimizer),
            Remedy::Lora => s.lora != base.lora,
            Remedy::Parallel => (s.tp, s.pp) != (base.tp, base.pp),
        }
    }
}

/// How heavy a remedy is within its family, lighter first (the tie-break after the remedy set).
pub fn weight(remedy: Remedy, s: &TrainSetup) -> u64 {
    match remedy {
        Remedy::MicroBatch => s.grad_accum as u64,
        Remedy::Recompute => match s.recompute {
            Recompute::None => 0,
            Recompute::Selective => 1,
            Recompute::KeepMatmuls => 2,
            Recompute::Full => 3,
            Recompute::Sqrt => 4,
            Recompute::Every(k) => 4 + k as u64,
        },
        Remedy::Zero => s.zero as u64,
        // The stage carrying the offload counts too: ZeRO-1 before ZeRO-2 on one GPU.
        Remedy::Offload => {
            let level = match s.offload {
                Offload::None => 0,
                Offload::Optimizer => 1,
                Offload::Params => 2,
            };
            level * 4 + s.zero as u64
        }
        Remedy::Flash => 0,
        Remedy::LeanStates => {
            u64::from(s.precision == plan::setup::Precision::PureBf16)
                + u64::from(s.optimizer == plan::setup::Optimizer::AdamW8bit)
        }
        Remedy::Lora => s.lora.as_ref().map_or(0, |l| 32 - l.base.bits()),
        Remedy::Parallel => (s.tp * s.pp) as u64 * 64 + s.pp as u64,
    }
}

/// The tie-break key after the step time: fewer remedies, earlier remedies, lighter forms.
pub fn tie_key(remedies: &[Remedy], s: &TrainSetup) -> (usize, Vec<u8>, Vec<u64>) {
    let order = remedies.iter().map(|&r| r as u8).collect();
    let weights = Remedy::ALL.iter().map(|&r| weight(r, s)).collect();
    (remedies.len(), order, weights)
}

/// The flags that turn the baseline into `s`, e.g. `--zero 1 --micro-batch 2 --grad-accum 2`.
pub fn flags(s: &TrainSetup, remedies: &[Remedy]) -> String {
    let mut out: Vec<String> = Vec::new();
    for r in remedies {
        match r {
            Remedy::MicroBatch => out.push(format!(
                "--batch {} --grad-accum {}",
                s.micro_batch, s.grad_accum
            )),
            Remedy::Recompute => out.push(format!("--recompute {}", recompute_name(s.recompute))),
            Remedy::Zero => out.push(format!("--zero {}", s.zero as u8)),
            Remedy::Offload => {
                // Offload rides on a ZeRO stage, which on one rank is no remedy of its own.
                if !remedies.contains(&Remedy::Zero) && s.zero as u8 > 0 {
                    out.push(format!("--zero {}", s.zero as u8));
                }
                out.push(format!("--offload {}", offload_name(s.offload)))
            }
            Remedy::Flash => out.push("--attention flash".into()),
            Remedy::LeanStates => out.push(format!(
                "--precision {} --optimizer {}",
                s.precision, s.optimizer
            )),
            Remedy::Lora => {
                if let Some(l) = &s.lora {
                    out.push(format!(
                        "--lora-rank {} --lora-targets {} --lora-base {}",
                        l.rank,
                        l.targets.join(","),
                        crate::dtype_name(l.base)
                    ));
                }
            }
            Remedy::Parallel => out.push(format!("--gpus {} --tp {} --pp {}", s.dp, s.tp, s.pp)),
        }
    }
    out.join(" ")
}

pub fn recompute_name(r: Recompute) -> String {
    r.to_string()
}

pub fn offload_name(o: Offload) -> &'static str {
    match o {
        Offload::None => "none",
        Offload::Optimizer => "optimizer",
        Offload::Params => "params",
    }
}

/// The `frugal plan` command that plans `s` for `model` (a preset name or a config path) with
/// the same runtime the search weighed it with, so it prints the total the search saw.
pub fn plan_command(
    model: &str,
    runtime: crate::Runtime,
    hw: &crate::Hardware,
    s: &TrainSetup,
) -> String {
    format!(
        "frugal plan --model {model} --train --runtime {} --gpu {}{} {}",
        runtime.name(),
        hw.gpu.name,
        if hw.tf32 { " --tf32" } else { "" },
        plan_flags(s)
    )
}

/// Every `frugal plan` flag that describes `s`.
pub fn plan_flags(s: &TrainSetup) -> String {
    let mut out = format!(
        "--precision {} --optimizer {} --gpus {} --tp {} --pp {}{} --zero {} --batch {} --grad-accum {} --seq {} --recompute {} --attention {} --offload {}",
        s.precision,
        s.optimizer,
        s.dp,
        s.tp,
        s.pp,
        if s.sp { " --sp" } else { "" },
        s.zero as u8,
        s.micro_batch,
        s.grad_accum,
        s.seq,
        recompute_name(s.recompute),
        if s.attention == Attention::Flash { "flash" } else { "eager" },
        offload_name(s.offload)
    );
    if let Some(l) = &s.lora {
        out.push_str(&format!(
            " --lora-rank {} --lora-targets {} --lora-base {}",
            l.rank,
            l.targets.join(","),
            crate::dtype_name(l.base)
        ));
    }
    out
}
