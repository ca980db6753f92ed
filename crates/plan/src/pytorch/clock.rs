//! The step time of the replayed step: every kernel the tape launched ([`Kernel`]) timed on the
//! GPU by roofline, and dispatched by the host at eager PyTorch's per-op cost, the two
//! overlapping as eager execution overlaps them: the host runs ahead queueing kernels, a kernel
//! starts when it is queued and the one before it has finished, and the step ends when both are
//! done (the loss is read back).
//!
//! The constants, each with where it comes from:
//! - matmuls at the GPU's dense peak for their input dtype (bf16/fp16, TF32 or fp32 CUDA cores;
//!   datasheet) × `Hardware::mfu` (cuBLAS's share of the peak, 0.6 by default);
//! - other kernels at `Costs::hbm_efficiency` of the datasheet bandwidth (STREAM-like copies reach
//!   80-90% on H100/H200), each at least `kernel_floor_s` (a launch's latency and tail);
//! - host time per forward op from Python, per backward node in autograd's C++ engine and per
//!   parameter in the optimizer's Python loop: fitted to the calibration file's small GPT-2 steps (batch 1-2,
//!   which the host bounds), the only constants measured rather than published.
//!
//! Example: `clock::step_seconds(&sim.tape.kernels, &hardware)`.

use super::tape::{Dispatch, Kernel};
use crate::fit::Hardware;

/// The clock's constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Share of the HBM bandwidth memory-bound kernels reach.
    pub hbm_efficiency: f64,
    /// The least time a kernel holds the GPU, seconds.
    pub kernel_floor_s: f64,
    /// Host time to dispatch one forward op from Python (module call, autocast, dispatcher), s.
    pub python_op_s: f64,
    /// Host time of one backward node in the autograd engine, s.
    pub autograd_op_s: f64,
    /// Host time per parameter of the optimizer's Python loop, s.
    pub optimizer_param_s: f64,
}

impl Costs {
    pub const DEFAULT: Costs = Costs {
        hbm_efficiency: 0.8,
        kernel_floor_s: 4e-6,
        python_op_s: 20e-6,
        autograd_op_s: 8e-6,
        optimizer_param_s: 4e-6,
    };
}

/// Where a step's time goes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    pub step_s: f64,
    /// The GPU's busy time (kernels back to back).
    pub device_s: f64,
    /// The host's dispatch time.
    pub host_s: f64,
    pub kernels: usize,
    pub matmul_flops: f64,
}

/// Seconds `k` holds the GPU.
fn device_seconds(k: &Kernel, hw: &Hardware, c: &Costs) -> f64 {
    let memory = k.bytes / (hw.gpu.hbm_bytes_per_s * c.hbm_efficiency);
    let compute = if k.gemm {
        let peak = match k.es {
            4 if hw.tf32 => hw.gpu.bf16_flops / 2.0,
            4 => hw.gpu.fp32_flops,
            _ => hw.gpu.bf16_flops,
        };
        k.flops / (peak * hw.mfu)
    } else {
        0.0
    };
    memory.max(compute).max(c.kernel_floor_s)
}

fn host_seconds(by: Dispatch, c: &Costs) -> f64 {
    match by {
        Dispatch::Python => c.python_op_s,
        Dispatch::Autograd | Dispatch::Optimizer => c.autograd_op_s,
        Dispatch::OptimizerParam => c.optimizer_param_s,
    }
}

/// The step time of `kernels` in launch order on `hw`.
pub fn simulate(kernels: &[Kernel], hw: &Hardware, c: &Costs) -> Timing {
    let (mut host, mut done, mut busy, mut flops, mut count) = (0.0f64, 0.0f64, 0.0, 0.0, 0);
    for k in kernels {
        host += host_seconds(k.by, c);
        if k.by == Dispatch::OptimizerParam {
            continue;
        }
        let d = device_seconds(k, hw, c);
        done = done.max(host) + d;
        busy += d;
        count += 1;
        if k.gemm {
            flops += k.flops;
        }
    }
    Timing {
        step_s: done.max(host),
        device_s: busy,
        host_s: host,
        kernels: count,
        matmul_flops: flops,
    }
}
