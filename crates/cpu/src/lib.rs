//! The CPU backend: the slab is host memory, tensors are borrowed as slices, and every op is a
//! call into the `kernels` crate (or, for the training loop's bookkeeping, the same loops the
//! engine ran before this seam existed), so numerics are exactly those of the kernels.
//!
//! Views (`Arena<Cpu>::view`, `view_mut`, `parts_mut`, and whole-buffer shorthands such as
//! `f32_mut(id)`) are how this backend, tests and host-side code touch bytes; nothing generic in
//! the engine does. Ops are split by family: forward/backward kernels (`kernels_ops`), optimizer,
//! state and collectives (`state_ops`).
//!
//! Example: `let arena = Arena::new(Cpu::new(), &plan, Device::Gpu, None)?;`

mod infer_ops;
mod kernels_ops;
mod lora_ops;
mod moe_ops;
mod state_ops;
mod tiles;
mod views;

pub use views::{Elem, PartsMut, View, ViewMut, Views};

use engine::error::EngineError;
use std::cell::UnsafeCell;
use std::sync::Mutex;

/// The CPU backend; holds reusable host scratch so no op allocates inside a step.
#[derive(Debug)]
pub struct Cpu {
    /// Per-chunk partial sums of a parallel sum of squares.
    partials: Mutex<Vec<f64>>,
    /// Per-chunk partial sums of squares of 2-byte values, and whether the chunk held a
    /// non-finite one.
    half_partials: Mutex<Vec<(f64, bool)>>,
    /// The quantized products' path when the backend was made: it decides the layout int4 and
    /// int8 weights are kept in for the backend's life ([`tiles`]).
    qmatmul_isa: kernels::qmatmul::Isa,
}

impl Default for Cpu {
    fn default() -> Cpu {
        Cpu::new()
    }
}

impl Cpu {
    /// A CPU backend; every thread of rayon's pool gets its GEMM scratches now, so none is
    /// allocated inside a step (`kernels::warm_threads`).
    pub fn new() -> Cpu {
        kernels::warm_threads();
        Cpu {
            partials: Mutex::default(),
            half_partials: Mutex::default(),
            qmatmul_isa: kernels::qmatmul::best_isa(),
        }
    }
}

/// Host memory of one arena: 4-byte aligned words.
pub struct CpuSlab(UnsafeCell<Vec<f32>>);

// SAFETY: the slab is only reached through its arena, whose borrow flags keep mutable views of
// one buffer exclusive; the arena itself is used by one thread at a time (it is not Sync).
unsafe impl Send for CpuSlab {}

impl CpuSlab {
    fn base(&self) -> *mut u8 {
        // SAFETY: the vector is never resized after construction, so the pointer stays valid
        // for the slab's life.
        unsafe { (*self.0.get()).as_mut_ptr() as *mut u8 }
    }
}

impl Cpu {
    fn alloc_slab(bytes: u64) -> Result<CpuSlab, EngineError> {
        // Fallible: an OS refusal is an error naming the size, not an abort.
        let oom = || EngineError::OutOfMemory {
            what: "arena slab".into(),
            bytes,
        };
        let n = usize::try_from(bytes / 4).map_err(|_| oom())?;
        let mut v: Vec<f32> = Vec::new();
        v.try_reserve_exact(n).map_err(|_| oom())?;
        v.resize(n, 0.0);
        Ok(CpuSlab(UnsafeCell::new(v)))
    }
}

use engine::arena::Arena;
use engine::backend::infer_ops::*;
use engine::backend::lora_ops::*;
use engine::backend::moe_ops::{MlaOp, MoeOp};
use engine::backend::ops::*;
use engine::backend::{
    Backend, DType, Feature, InferOps, LoraOps, MoeOps, Tensor, TensorParallelOps, TrainOps,
};

impl Backend for Cpu {
    type Slab = CpuSlab;

    const NAME: &'static str = "cpu";

    fn supports(_: Feature) -> bool {
        true
    }

    fn lora_ops(&self) -> Option<&dyn LoraOps<Self>> {
        Some(self)
    }

    fn moe_ops(&self) -> Option<&dyn MoeOps<Self>> {
        Some(self)
    }

    fn tp_ops(&self) -> Option<&dyn TensorParallelOps<Self>> {
        Some(self)
    }

    fn align_bytes(&self) -> u64 {
        plan_frugal::layout::ALIGN_BYTES
    }

    fn alloc(&self, bytes: u64) -> Result<CpuSlab, EngineError> {
        Cpu::alloc_slab(bytes)
    }

    fn upload(&self, a: &Arena<Self>, dst: Tensor, src: &[f32]) {
        state_ops::upload(a, dst, src)
    }

    fn download(&self, a: &Arena<Self>, src: Tensor, dst: &mut [f32]) {
        state_ops::download(a, src, dst)
    }

    fn upload_ids(&self, a: &Arena<Self>, dst: Tensor, src: &[u32]) {
        a.view_mut::<u32>(dst).copy_from_slice(src)
    }

    fn upload_bytes(&self, a: &Arena<Self>, dst: Tensor, src: &[u8]) {
        infer_ops::upload_bytes(a, dst, src)
    }

    fn download_bytes(&self, a: &Arena<Self>, src: Tensor, dst: &mut [u8]) {
        infer_ops::download_bytes(a, src, dst)
    }

    fn embedding(&self, a: &Arena<Self>, op: &Embedding) {
        kernels_ops::embedding_forward(a, op)
    }

    fn norm(&self, a: &Arena<Self>, op: &NormOp) {
        kernels_ops::norm(a, op)
    }

    fn linear(&self, a: &Arena<Self>, op: &Linear) {
        kernels_ops::linear(a, op)
    }

    fn rope(&self, a: &Arena<Self>, qkv: Tensor, shape: RopeShape) {
        kernels_ops::rope_rows(a, qkv, shape, false)
    }

    fn attention(&self, a: &Arena<Self>, op: &Attention) {
        kernels_ops::attention_forward(a, op)
    }

    fn activation(&self, a: &Arena<Self>, op: &Activation) {
        kernels_ops::activation_forward(a, op)
    }

    fn residual_add(&self, a: &Arena<Self>, out: Tensor, inp: Tensor) {
        kernels_ops::residual_add(a, out, inp)
    }

    fn convert(&self, a: &Arena<Self>, dst: Tensor, src: Tensor) {
        kernels_ops::convert(a, dst, src)
    }

    fn classifier_logits(&self, a: &Arena<Self>, op: &ClassifierLogits) {
        kernels_ops::classifier_logits(a, op)
    }

    fn fill(&self, a: &Arena<Self>, t: Tensor, value: f32) {
        state_ops::fill(a, t, value)
    }

    fn collective(
        &self,
        a: &Arena<Self>,
        comm: &mut dyn comm::Collective,
        op: CommOp,
    ) -> Result<(), comm::CommError> {
        state_ops::collective(a, comm, op)
    }

    unsafe fn start_collective(
        &self,
        a: &Arena<Self>,
        comm: &mut dyn comm::Collective,
        op: CommOp,
    ) -> Result<comm::Ticket, comm::CommError> {
        // SAFETY: the caller's promise, passed on.
        unsafe { state_ops::start_collective(a, comm, op) }
    }
}

impl TrainOps for Cpu {
    fn classifier(&self, a: &Arena<Self>, op: &Classifier) -> f32 {
        kernels_ops::classifier(a, op, None)
    }

    fn embedding_backward(&self, a: &Arena<Self>, op: &EmbeddingBackward) {
        kernels_ops::embedding_backward(a, op)
    }

    fn norm_backward(&self, a: &Arena<Self>, op: &NormBackward) {
        kernels_ops::norm_backward(a, op)
    }

    fn linear_backward(&self, a: &Arena<Self>, op: &LinearBackward) {
        kernels_ops::linear_backward(a, op)
    }

    fn rope_backward(&self, a: &Arena<Self>, dqkv: Tensor, shape: RopeShape) {
        kernels_ops::rope_rows(a, dqkv, shape, true)
    }

    fn attention_backward(&self, a: &Arena<Self>, op: &AttentionBackward) {
        kernels_ops::attention_backward(a, op)
    }

    fn activation_backward(&self, a: &Arena<Self>, op: &ActivationBackward) {
        kernels_ops::activation_backward(a, op)
    }

    fn sum_squares(&self, a: &Arena<Self>, t: Tensor, start: f64) -> (f64, bool) {
        state_ops::sum_squares(self, a, t, start)
    }

    fn scale(&self, a: &Arena<Self>, t: Tensor, factor: f32) {
        state_ops::scale(a, t, factor)
    }

    fn accumulate(&self, a: &Arena<Self>, acc: Tensor, x: Tensor) {
        state_ops::accumulate(a, acc, x)
    }

    fn adamw(&self, a: &Arena<Self>, op: &AdamW) {
        state_ops::adamw_step(a, op)
    }

    fn sgd(&self, a: &Arena<Self>, op: &Sgd) {
        state_ops::sgd_step(a, op)
    }

    fn master_adamw(&self, a: &Arena<Self>, op: &MasterAdamW) {
        state_ops::master_adamw(a, op)
    }

    fn master_adamw_host(&self, a: &Arena<Self>, op: MasterAdamWHost<'_>) {
        state_ops::master_adamw_host(a, op)
    }

    fn underflow(&self, a: &Arena<Self>, t: Tensor) -> engine::precision::UnderflowStats {
        state_ops::underflow(a, t)
    }

    fn widen_in_place(&self, a: &Arena<Self>, t: Tensor, half: DType) {
        state_ops::widen_in_place(a, t, half)
    }
}

impl InferOps for Cpu {
    fn qlinear(&self, a: &Arena<Self>, op: &QLinear) {
        infer_ops::qlinear(a, op)
    }

    fn own_layout(&self, m: &QMatrix) -> bool {
        self.tiled(m)
    }

    fn upload_matrix(&self, a: &Arena<Self>, m: &QMatrix, parts: [&[u8]; 3]) {
        tiles::upload_matrix(a, m, parts)
    }

    fn download_matrix(&self, a: &Arena<Self>, m: &QMatrix, parts: [&mut [u8]; 3]) {
        tiles::download_matrix(a, m, parts)
    }

    fn embed_rows(&self, a: &Arena<Self>, op: &EmbedRows) {
        infer_ops::embed_rows(a, op)
    }

    fn rope_at(&self, a: &Arena<Self>, qkv: Tensor, positions: &[u32], shape: RopeShape) {
        infer_ops::rope_at(a, qkv, positions, shape)
    }

    fn kv_write(&self, a: &Arena<Self>, op: &KvWrite) {
        infer_ops::kv_write(a, op)
    }

    fn paged_attention(&self, a: &Arena<Self>, op: &PagedAttention) {
        infer_ops::paged_attention(a, op)
    }

    fn latent(&self, a: &Arena<Self>, op: &LatentOp) {
        moe_ops::latent(a, op)
    }

    fn kv_copy_block(&self, a: &Arena<Self>, cache: &KvCache, from: usize, to: usize) {
        infer_ops::kv_copy_block(a, cache, from, to)
    }
}

impl LoraOps<Cpu> for Cpu {
    fn frozen_linear(&self, a: &Arena<Cpu>, op: &FrozenLinear) {
        lora_ops::frozen_linear(a, op)
    }

    fn frozen_linear_backward(&self, a: &Arena<Cpu>, op: &FrozenLinearBackward) {
        lora_ops::frozen_linear_backward(a, op)
    }

    fn adapter(&self, a: &Arena<Cpu>, op: &Adapter) {
        lora_ops::adapter(a, op)
    }

    fn adapter_backward(&self, a: &Arena<Cpu>, op: &AdapterBackward) {
        lora_ops::adapter_backward(a, op)
    }
}

impl MoeOps<Cpu> for Cpu {
    fn moe(&self, a: &Arena<Cpu>, op: &MoeOp) {
        moe_ops::moe(a, op)
    }

    fn mla(&self, a: &Arena<Cpu>, op: &MlaOp) {
        moe_ops::mla(a, op)
    }
}

impl TensorParallelOps<Cpu> for Cpu {
    fn classifier_shard(&self, a: &Arena<Cpu>, op: &Classifier, shard: ClassifierShard<'_>) -> f32 {
        kernels_ops::classifier(a, op, Some(shard))
    }
}
