//! Every matrix product frugal's CPU path runs, and the instruction-set level they dispatch on.
//!
//! - [`cpu`]: the level the CPU supports and the cap the CLI sets (`FRUGAL_ISA`), once, for all
//!   dispatches.
//! - [`matmul`]: f32 products through faer (and faer's AVX2 kernel, or a plain loop, under a cap),
//!   with a plain reference generic over [`Real`].
//! - [`gemm_bf16`]: bf16 operands with f32 accumulation (AVX-512 BF16, AMX, AVX2 + FMA).
//! - [`qmatmul`] and [`dequant`]: quantized weights (int8, int4, nf4, fp8, ggml blocks) against
//!   f32 activations, and their dequantization.
//! - [`convert`]: the bf16/f16 conversions, with the project's rounding rule.
//!
//! The op kernels (`kernels`) are built on this crate and re-export its modules, so
//! `kernels::matmul` and `linalg::matmul` name the same code. Shapes and conventions follow
//! `kernels`' crate docs: weights in `nn.Linear` layout (OC, IC), no allocation on the hot path.

pub mod convert;
pub mod cpu;
pub mod dequant;
pub mod gemm_bf16;
pub mod matmul;
#[doc(hidden)]
pub mod par;
pub mod qmatmul;
pub mod real;
#[cfg(any(test, feature = "testutil"))]
#[doc(hidden)]
pub mod testutil;

pub use real::Real;

/// Gives every thread of rayon's pool its fixed-size GEMM scratches now (the bf16 kernels' task
/// buffers, the f32 kernel's panel), so a thread that first takes part in a product during a
/// step does not allocate there. A CPU backend calls it once, when it is made.
pub fn warm_threads() {
    rayon::broadcast(|_| {
        gemm_bf16::warm_thread();
        matmul::warm_thread();
    });
}
