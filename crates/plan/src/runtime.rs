//! What a runtime profile answers: a buffer plan plus the numbers a real process would show.
//!
//! `frugal` (this engine) is exact: peak == reserved, no context. `pytorch` models the caching
//! allocator's reserve and the CUDA context on top of the live-tensor peak, and may find its peak
//! with a finer simulation than the phase timeline, so the peak is stored, not only derived.

use crate::MemoryPlan;
use serde::Serialize;

/// A runtime profile's estimate of one step on one device (one rank).
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    /// Buffers over the phase timeline: the breakdown by category and the memory-over-step plot.
    pub plan: MemoryPlan,
    /// Peak of live tensors on the device (`torch.cuda.max_memory_allocated` for `pytorch`).
    pub peak_bytes: u64,
    /// Peak held by the allocator, cache included (`max_memory_reserved`); equals `peak_bytes` for
    /// an arena that reserves exactly what it uses.
    pub reserved_bytes: u64,
    /// CUDA context, cuBLAS/cuDNN and other libraries' memory outside the allocator.
    pub context_bytes: u64,
    /// Peak of live bytes in host memory (offload).
    pub host_peak_bytes: u64,
    /// Live device bytes by category at each phase's own highest moment, when the profile
    /// simulates more finely than phases (`pytorch`); `None` reads them off `plan`'s phases.
    #[serde(skip)]
    pub phase_peaks: Option<Vec<(crate::Phase, [u64; 6])>>,
}

impl Estimate {
    /// What `nvidia-smi` would show for the process.
    pub fn total_bytes(&self) -> u64 {
        self.reserved_bytes + self.context_bytes
    }

    /// Device bytes by category at each phase of the step: the report's timeline and plot.
    pub fn timeline(&self) -> Vec<(crate::Phase, [u64; 6])> {
        match &self.phase_peaks {
            Some(p) => p.clone(),
            None => self.plan.timeline(crate::Device::Gpu),
        }
    }

    /// The phase of the device peak and the categories then (the first such phase on a tie).
    pub fn at_peak(&self) -> (crate::Phase, [u64; 6]) {
        match &self.phase_peaks {
            Some(p) => {
                let mut best = p[0];
                for &x in p {
                    if x.1.iter().sum::<u64>() > best.1.iter().sum::<u64>() {
                        best = x;
                    }
                }
                best
            }
            None => self.plan.at_peak(crate::Device::Gpu),
        }
    }
}

/// CUDA context, kernels and library handles outside the allocator's pool (PyTorch's, or the
/// CUDA backend's slab). Measured on an H200 with PyTorch 2.11 / CUDA 13 (`shared/calibration`):
/// the process held 738.8 MiB of which 54 MiB was PyTorch's pool (cuBLAS workspace and two test
/// tensors).
pub fn cuda_context_bytes() -> u64 {
    const MIB: u64 = 1 << 20;
    (738.8125 * MIB as f64) as u64 - 54 * MIB
}

/// One rank of a tensor/pipeline-parallel plan: its stage, its layers and tensor-parallel rank,
/// and its peak.
#[derive(Clone, Debug, Serialize)]
pub struct RankPeak {
    pub stage: u32,
    pub first_layer: u32,
    pub layers: u32,
    pub tp_rank: u32,
    pub peak_bytes: u64,
}
