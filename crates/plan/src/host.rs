//! Host memory per node: what offload keeps there for every rank of the node, and the load-time
//! peak when every process materialises its copy of the model before moving it to its device.
//!
//! Choices (documented, not measured): a node runs `min(GPUs, gpus_per_node)` ranks; each
//! process loads its tensor/pipeline-local weights in 16 bits (32 for fp32 and AMP) on the host
//! (HF `from_pretrained` with `low_cpu_mem_usage`, one copy per process), except under ZeRO-3,
//! where `zero.Init` partitions while loading, so a node holds its ranks' partitions only. The
//! peak is the larger of the load-time copies and the steady offloaded state (the copies are
//! freed once on the device, before the optimizer state is built). DeepSpeed's estimator
//! multiplies its host figure by 1.5 (`additional_buffer_factor`) for pinned staging; this
//! reports what is allocated and leaves the margin to `fit --host-memory`.
//! Example: `host_per_node(&shape, &setup, &estimate, 8).peak_bytes`.

use crate::policy::Policy;
use crate::setup::{TrainSetup, ZeroStage};
use crate::{Estimate, ModelShape};
use serde::Serialize;

/// Host memory of one node of a training run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostNode {
    /// Ranks (processes) on the node.
    pub ranks: u32,
    /// Offloaded state of one rank (optimizer, fp32 gradients, parameters), steady.
    pub per_rank_bytes: u64,
    /// Every rank's offloaded state.
    pub offload_bytes: u64,
    /// Every process's copy of the model while loading.
    pub load_bytes: u64,
    /// The larger of the two.
    pub peak_bytes: u64,
}

/// Host memory of a node running `setup` on `model`, with `est` the device estimate of one rank.
pub fn host_per_node(
    model: &ModelShape,
    setup: &TrainSetup,
    est: &Estimate,
    gpus_per_node: u32,
) -> HostNode {
    let gpus = setup.dp * setup.tp * setup.pp;
    let ranks = gpus.min(gpus_per_node.max(1));
    // PEFT loads the frozen base in 16 bits and quantizes it on the device.
    let weight = if setup.lora.is_some() {
        2
    } else {
        Policy::of(setup.precision).weight
    };
    let local = model
        .param_count()
        .div_ceil(setup.tp as u64 * setup.pp as u64);
    let per_process = if setup.zero == ZeroStage::Zero3 {
        local.div_ceil(setup.dp as u64)
    } else {
        local
    };
    let load_bytes = ranks as u64 * per_process * weight;
    let offload_bytes = ranks as u64 * est.host_peak_bytes;
    HostNode {
        ranks,
        per_rank_bytes: est.host_peak_bytes,
        offload_bytes,
        load_bytes,
        peak_bytes: offload_bytes.max(load_bytes),
    }
}
