//! The linear layers' GEMMs on cuBLAS (`cublasGemmEx`): row-major tensors read as column-major
//! transposes, f32 or bf16 operands, always f32 accumulation (`CUBLAS_COMPUTE_32F`, so no TF32)
//! and an f32 output that is written (`beta` 0) or accumulated into (`beta` 1), as the CPU's
//! `matmul` and `gemm_bf16` do.
//!
//! Example: `gemm::forward(gpu, out, inp, w, Operand::F32, (n, ic, oc))` is out = inp · wᵀ.

use crate::device::Cuda;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t as Op, cudaDataType,
};
use std::ffi::c_void;

/// The operands' format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    F32,
    Bf16,
}

impl Operand {
    fn data_type(self) -> cudaDataType {
        match self {
            Operand::F32 => cudaDataType::CUDA_R_32F,
            Operand::Bf16 => cudaDataType::CUDA_R_16BF,
        }
    }
}

fn int(x: usize) -> i32 {
    i32::try_from(x).expect("a GEMM dimension beyond i32 (cuBLAS's int)")
}

/// Column-major `C (m, n) = beta·C + op(A) · op(B)`, C f32.
#[allow(clippy::too_many_arguments)]
fn gemm(
    gpu: &Cuda,
    ops: (Op, Op),
    mnk: (usize, usize, usize),
    a: (u64, usize),
    b: (u64, usize),
    c: (u64, usize),
    operand: Operand,
    accumulate: bool,
) {
    gemm_into(gpu, ops, mnk, (a, b, c), operand, Operand::F32, accumulate);
}

/// [`gemm`] with C of type `out` (f32, or bf16: each element added in f32 and rounded once).
fn gemm_into(
    gpu: &Cuda,
    (op_a, op_b): (Op, Op),
    (m, n, k): (usize, usize, usize),
    ((a, lda), (b, ldb), (c, ldc)): ((u64, usize), (u64, usize), (u64, usize)),
    operand: Operand,
    out: Operand,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
    gpu.ctx.bind_to_thread().expect("CUDA context");
    let t = operand.data_type();
    // SAFETY: the pointers address live arena tensors of the sizes the shapes imply (checked by
    // `Arena::byte_offset` at each call site); alpha and beta are host scalars (the handle's
    // default pointer mode).
    unsafe {
        cudarc::cublas::result::gemm_ex(
            gpu.blas.0,
            op_a,
            op_b,
            int(m),
            int(n),
            int(k),
            &alpha as *const f32 as *const c_void,
            a as *const c_void,
            t,
            int(lda),
            b as *const c_void,
            t,
            int(ldb),
            &beta as *const f32 as *const c_void,
            c as *mut c_void,
            out.data_type(),
            int(ldc),
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .unwrap_or_else(|e| panic!("cublasGemmEx ({m} x {n} x {k}): {e:?}"));
}

/// out (n, oc) = inp (n, ic) · w (oc, ic)ᵀ, or `+=` with `accumulate`.
pub fn forward(
    gpu: &Cuda,
    (out, inp, w): (u64, u64, u64),
    operand: Operand,
    (n, ic, oc): (usize, usize, usize),
    accumulate: bool,
) {
    gemm(
        gpu,
        (Op::CUBLAS_OP_T, Op::CUBLAS_OP_N),
        (oc, n, ic),
        (w, ic),
        (inp, ic),
        (out, oc),
        operand,
        accumulate,
    );
}

/// dinp (n, ic) += dout (n, oc) · w (oc, ic).
pub fn input_grad(
    gpu: &Cuda,
    (dinp, dout, w): (u64, u64, u64),
    operand: Operand,
    (n, ic, oc): (usize, usize, usize),
) {
    gemm(
        gpu,
        (Op::CUBLAS_OP_N, Op::CUBLAS_OP_N),
        (ic, n, oc),
        (w, ic),
        (dout, oc),
        (dinp, ic),
        operand,
        true,
    );
}

/// dw (oc, ic) bf16 += dout (n, oc)ᵀ · inp (n, ic), bf16 operands: each element of the 2-byte
/// gradient widened, the product added in f32 and rounded once (cuBLAS, C in bf16).
pub fn weight_grad_bf16(
    gpu: &Cuda,
    (dw, dout, inp): (u64, u64, u64),
    (n, ic, oc): (usize, usize, usize),
) {
    let ops = (Op::CUBLAS_OP_N, Op::CUBLAS_OP_T);
    let abc = ((inp, ic), (dout, oc), (dw, ic));
    gemm_into(
        gpu,
        ops,
        (ic, oc, n),
        abc,
        Operand::Bf16,
        Operand::Bf16,
        true,
    );
}

/// dw (oc, ic) += dout (n, oc)ᵀ · inp (n, ic).
pub fn weight_grad(
    gpu: &Cuda,
    (dw, dout, inp): (u64, u64, u64),
    operand: Operand,
    (n, ic, oc): (usize, usize, usize),
) {
    gemm(
        gpu,
        (Op::CUBLAS_OP_N, Op::CUBLAS_OP_T),
        (ic, oc, n),
        (inp, ic),
        (dout, oc),
        (dw, ic),
        operand,
        true,
    );
}
