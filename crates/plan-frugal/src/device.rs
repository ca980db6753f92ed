//! The devices the frugal runtime's step runs on (`--device` of `frugal plan` and `frugal train`)
//! and what each holds besides the arena's slab: the CPU nothing; the CUDA backend
//! (`crates/cuda`) the cuBLAS workspace (32 MiB, as cuBLAS asks for on Hopper, handed to
//! cuBLAS with `cublasSetWorkspace` so it never allocates its own) and the f64 partials of its
//! reductions, in one allocation; and the driver's 2 MiB granularity.
//!
//! The CUDA context (driver, modules, cuBLAS handle) is not planned from first principles: the
//! backend measures it (`cuMemGetInfo` once the context exists) and reports it apart.
//!
//! Example: `"cuda".parse::<Device>()?.estimate(cpu_estimate)`; `SCRATCH_BYTES` is 33,562,624
//! bytes.

/// Where the frugal runtime's step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend: the slab is host memory, with no context.
    Cpu,
    /// The CUDA backend on GPU 0.
    Cuda,
}

impl Device {
    /// Every device, in the order `--help` lists them.
    pub const ALL: [Device; 2] = [Device::Cpu, Device::Cuda];

    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }

    /// Other names `--device` takes for it.
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Device::Cpu => &[],
            Device::Cuda => &["gpu"],
        }
    }

    /// What runs there and what its plan holds beside the arena's slab, for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            Device::Cpu => "the CPU; the slab is host memory, with no context",
            Device::Cuda => {
                "GPU 0 through the CUDA backend, in a `--features cuda` build: one device, dense \
                 GPT-2/Llama models, flash attention; its plan adds the 32 MiB cuBLAS workspace \
                 in 2 MiB driver pages and a CUDA context, which `frugal train --device cuda` \
                 measures"
            }
        }
    }

    /// `--device`'s help: each device's name and what it is.
    pub fn help() -> String {
        let each: Vec<String> = Device::ALL
            .iter()
            .map(|d| format!("{} ({})", d.name(), d.about()))
            .collect();
        format!(
            "Where the frugal runtime's step runs: {}",
            each.join("; or ")
        )
    }

    /// A `frugal` training estimate on this device: on the CPU as planned, elsewhere with what
    /// the backend holds beside the slab.
    pub fn estimate(self, e: plan::runtime::Estimate) -> plan::runtime::Estimate {
        match self {
            Device::Cpu => e,
            Device::Cuda => on_cuda(e),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let names = || Device::ALL.into_iter().map(Device::name);
        Device::ALL
            .into_iter()
            .find(|d| d.name() == s || d.aliases().contains(&s))
            .ok_or_else(|| format!("use {}", names().collect::<Vec<_>>().join(" or ")))
    }
}

/// The cuBLAS workspace.
pub const BLAS_WORKSPACE_BYTES: u64 = 32 << 20;
/// Blocks of the backend's grid-stride reductions: one f64 partial each.
pub const REDUCE_BLOCKS: u32 = 1024;
/// The backend's own allocation: the workspace, then the partials.
pub const SCRATCH_BYTES: u64 = BLAS_WORKSPACE_BYTES + REDUCE_BLOCKS as u64 * 8;
/// The driver maps device memory in pages of this size.
pub const DRIVER_PAGE_BYTES: u64 = 2 << 20;

/// Device bytes the driver takes for allocations of `sizes` bytes each (whole pages).
pub fn driver_bytes(sizes: &[u64]) -> u64 {
    sizes
        .iter()
        .map(|&b| b.next_multiple_of(DRIVER_PAGE_BYTES))
        .sum()
}

/// A `frugal` training estimate for the CUDA backend: the driver's pages of the arena's slab
/// and of the backend's scratch as what is reserved, and a context. The context is not
/// frugal's own measurement: it is PyTorch's on an H200 (`plan::runtime::cuda_context_bytes`, the
/// same driver and cuBLAS, plus PyTorch's kernels, so an upper estimate) until `frugal train
/// --device cuda` reports the measured one (`context_bytes` in its JSON).
pub fn on_cuda(mut e: plan::runtime::Estimate) -> plan::runtime::Estimate {
    e.reserved_bytes = driver_bytes(&[e.reserved_bytes, SCRATCH_BYTES]);
    e.context_bytes = plan::runtime::cuda_context_bytes();
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_round_up_to_driver_pages() {
        assert_eq!(SCRATCH_BYTES, 33_562_624);
        assert_eq!(driver_bytes(&[SCRATCH_BYTES]), 34 << 20);
        assert_eq!(driver_bytes(&[1, 2 << 20, 0]), 4 << 20);
    }

    #[test]
    fn a_cuda_estimate_adds_the_scratch_pages_and_a_context() {
        let model = plan::presets::by_name("gpt2-124m").unwrap();
        let setup = plan::setup::TrainSetup::new(4, 256);
        let cpu = crate::training_estimate(&model, &setup).unwrap();
        let gpu = Device::Cuda.estimate(cpu.clone());
        let same = Device::Cpu.estimate(cpu.clone());
        assert_eq!(
            (same.reserved_bytes, same.context_bytes),
            (cpu.reserved_bytes, 0)
        );
        assert_eq!("gpu".parse(), Ok(Device::Cuda));
        assert_eq!(gpu.peak_bytes, cpu.peak_bytes);
        let slab_pages = cpu.reserved_bytes.next_multiple_of(DRIVER_PAGE_BYTES);
        assert_eq!(gpu.reserved_bytes, slab_pages + (34 << 20));
        assert!(gpu.context_bytes > 0 && cpu.context_bytes == 0);
    }
}
