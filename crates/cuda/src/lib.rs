//! The CUDA backend: [`Cuda`] implements `engine::Backend` and `engine::backend::TrainOps` on one NVIDIA GPU, so the same
//! trainer (`train::Trainer::on(Cuda::new(0)?, config, comm)`) runs there with every tensor in
//! one device allocation carved from the plan (ARCHITECTURE.md's code map).
//!
//! What runs where: kernels are CUDA C in `crates/cuda/kernels/*.cu`, compiled at run time by
//! NVRTC to PTX and cached on disk ([`ptx`]); GEMMs are cuBLAS `GemmEx` calls (f32, or bf16
//! operands with f32 accumulation and output) on a planned 32 MiB workspace ([`gemm`]).
//! Everything is loaded with `dlopen` by `cudarc` (CUDA 13.0 API), so this crate builds and links
//! on a machine with no CUDA at all; [`available`] says whether the libraries are there before
//! anything calls into them (`cudarc` panics on a missing library).
//!
//! What it does not do it says through `Backend::supports` (`engine::backend::Feature`), and
//! `engine::backend::require` refuses such a run by name before step one: inference (it does not
//! implement `InferOps`), LoRA, mixture-of-experts and latent-attention layers, tensor
//! parallelism, the materialised attention, optimizer offload. Collectives stage through host
//! memory into the CPU's `comm` (NCCL is not built).
//!
//! Status: compiled to PTX and type-checked here; never yet run on a GPU (`dev/gpu_check.sh`
//! is the check to run on one).

mod backend;
pub mod device;
pub mod gemm;
mod ops;
pub mod ptx;
mod state;

pub use device::{available, Cuda, CudaError, CudaSlab};
