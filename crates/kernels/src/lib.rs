//! CPU kernels for frugal: forward/backward pairs on f32 slices, row-major, llm.c style.
//!
//! One module per op family. Each fast kernel (faer GEMM, rayon over rows or heads) keeps a plain
//! reference beside it in a `reference` module, generic over [`Real`] so the same loops run in f32
//! (held against the fast kernel) and in f64 (held against central finite differences).
//!
//! Conventions every kernel follows:
//! - shapes in comments use B batch, T sequence, C channels, NH query heads, NKV key/value heads,
//!   HD head dim, V vocab, N rows (B*T);
//! - **backward kernels accumulate (`+=`) into every gradient they write**, parameter gradients and
//!   `dinp` alike, so the caller zeroes gradients only when it must;
//! - weights use `nn.Linear` layout: weight (OC, IC), `out = inp @ weight^T + bias`;
//! - kernels never allocate on the hot path (scratch buffers are parameters), except what faer
//!   needs internally; shape mismatches are programmer errors and panic through `assert!`.
//!
//! What this crate does not hold: model wiring, memory arenas, optimiser state ownership (the
//! engine's), and number formats (the `formats` crate).
//!
//! ```
//! // out = inp @ weight^T + bias for a 2x3 input and a 4x3 weight.
//! let inp = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let weight = [1.0f32; 12];
//! let bias = [0.5f32; 4];
//! let mut out = [0.0f32; 8];
//! kernels::matmul::forward(&mut out, &inp, &weight, Some(&bias), (2, 3, 4));
//! assert_eq!(out[0], 6.5);
//! assert_eq!(out[7], 15.5);
//! ```

pub mod adamw;
pub mod attention;
pub mod classifier;
pub mod embedding;
pub mod fastmath;
pub mod flash;
pub mod fp8;
pub mod gelu;
pub mod layernorm;
pub mod lora;
pub mod mla;
pub mod moe;
pub mod paged_attention;
pub mod residual;
pub mod rmsnorm;
pub mod rope;
pub mod sgd;
pub mod stream;
pub mod swiglu;

// The matrix products and the CPU level live in `linalg`; the same paths name them here.
use linalg::par;
pub use linalg::{convert, cpu, dequant, gemm_bf16, matmul, qmatmul, real, warm_threads, Real};

#[cfg(test)]
mod accumulates;
#[cfg(test)]
mod testutil;

/// Every dispatch and the path it takes at the current level, for reports (`bench --json`): the f32
/// GEMM, the bf16 GEMM, the quantized products and the layout a CPU backend made now keeps int4,
/// int8 and nf4 weights in, how far ahead the int4 tiles ask for their weights, the vectorised
/// loops (exp, tanh, softmax, GELU, conversions) and NF4 dequantization.
pub fn paths() -> Vec<(&'static str, &'static str)> {
    use cpu::Level;
    let simd = match fastmath::simd() {
        fastmath::Simd::Avx512 => "avx512",
        fastmath::Simd::Avx2 => "avx2",
        fastmath::Simd::Base => "portable",
    };
    let dequant = match cpu::level() {
        l if l >= Level::Avx512 => "avx512",
        Level::Avx2 | Level::Avx2Vnni => "avx2",
        _ => "portable",
    };
    vec![
        ("gemm_f32", matmul::capped::path().name()),
        ("gemm_bf16", gemm_bf16::best_isa().name()),
        ("qmatmul", qmatmul::best_isa().name()),
        ("int4_layout", qmatmul::layout(qmatmul::best_isa())),
        ("int8_layout", qmatmul::layout(qmatmul::best_isa())),
        ("nf4_layout", qmatmul::layout(qmatmul::best_isa())),
        ("int4_prefetch", qmatmul::int4_prefetch(qmatmul::best_isa())),
        ("vector_loops", simd),
        ("dequant_nf4", dequant),
    ]
}
