//! The `formula` runtime's model states for a bare parameter count (`--params 7B`), and the
//! fp32 gradient copy DeepSpeed's mixed-precision step makes, under either [`Convention`].
//! Example: `model_states_estimate(7_000_000_000, &setup)?.peak_bytes`.

use super::{estimate_of, Policy};
use crate::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use crate::setup::{Convention, Offload, TrainSetup, ZeroStage};
use crate::{Estimate, PlanError};

/// Elements of the fp32 gradient copy a mixed-precision step makes on the device from a
/// gradient partition of `partition` elements, under the setup's convention: DeepSpeed's ZeRO 0-2
/// upcast the whole partition, ZeRO-3 one sub-group at a time; the paper counts none.
pub(super) fn fp32_grad_elems(setup: &TrainSetup, partition: u64) -> Option<u64> {
    let p = Policy::of(setup.precision);
    if setup.convention == Convention::Paper || p.master == 0 || p.grad >= 4 {
        return None;
    }
    Some(if setup.zero == ZeroStage::Zero3 {
        partition.min(setup.zero_buffers.sub_group)
    } else {
        partition
    })
}

/// The classic model-states formulas for a bare parameter count (`--params 7B`): parameters,
/// gradients and optimizer state only, all persistent, split evenly over TP × PP and sharded by
/// ZeRO. Activations need a shape, so there are none. Under [`Convention::Paper`] it reproduces
/// the classic ZeRO table.s 112 / 38.5 / 26.25 / 14 GB for Ψ = 7×10^9 under `bf16` + AdamW on 8 GPUs; under
/// [`Convention::Deepspeed`] it adds the step's fp32 gradient partition (4Ψ/N, ZeRO-3 capped at
/// one sub-group). Either way ZeRO 2-3 with the optimizer offloaded keep no gradient partition
/// on the device (DeepSpeed's 2 bytes per parameter for ZeRO-2 + optimizer offload on one GPU).
pub fn model_states_estimate(n_params: u64, setup: &TrainSetup) -> Result<Estimate, PlanError> {
    setup.validate_alone()?;
    if setup.lora.is_some() {
        return Err(PlanError::Unsupported {
            runtime: "formula",
            what: "LoRA with a bare parameter count: pass --model to know the linear layers".into(),
        });
    }
    let p = Policy::of(setup.precision);
    let local = n_params.div_ceil(setup.tp as u64 * setup.pp as u64);
    let shard = local.div_ceil(setup.dp as u64);
    let zero = setup.zero as u8;
    let pick = |sharded: bool| if sharded { shard } else { local };
    let host = |on_host: bool| if on_host { Device::Host } else { Device::Gpu };
    let mut plan = MemoryPlan::new(1);
    let persistent = |name: &str, category, device, bytes| {
        Buffer::named(name, category, device, bytes, Lifetime::Persistent)
    };
    let params_on_host = setup.offload == Offload::Params;
    let opt_on_host = setup.offload != Offload::None;
    plan.push(persistent(
        "params",
        Category::Params,
        host(params_on_host),
        p.weight * pick(zero >= 3),
    ));
    // ZeRO 2-3 with the optimizer offloaded reduce each gradient straight into the host's fp32
    // partition (DeepSpeed's `copy_grads_in_partition`; ZeRO-3 allocates the partition's flat
    // buffer on the CPU): no gradient partition stays on the device.
    if !(opt_on_host && zero >= 2) {
        plan.push(persistent(
            "grads",
            Category::Grads,
            Device::Gpu,
            p.grad * pick(zero >= 2),
        ));
    }
    let opt = p.optimizer_bytes(setup.optimizer, pick(zero >= 1));
    plan.push(persistent(
        "optimizer",
        Category::Optimizer,
        host(opt_on_host),
        opt,
    ));
    if opt_on_host {
        plan.push(persistent(
            "grads.fp32",
            Category::Grads,
            Device::Host,
            4 * pick(zero >= 1),
        ));
    } else if let Some(elems) = fp32_grad_elems(setup, pick(zero >= 1)) {
        plan.push(Buffer::named(
            "grads.fp32",
            Category::Grads,
            Device::Gpu,
            4 * elems,
            Lifetime::Span {
                born: Phase::Optimizer,
                dies: Phase::Optimizer,
            },
        ));
    }
    Ok(estimate_of(plan))
}
