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
}

impl Estimate {
    /// What `nvidia-smi` would show for the process.
    pub fn total_bytes(&self) -> u64 {
        self.reserved_bytes + self.context_bytes
    }
}
