//! `engine::Backend` and `engine::backend::TrainOps` for [`Cuda`]: each method forwards to
//! [`crate::ops`] (forward and backward kernels) or [`crate::state`] (training state, host
//! transfers, collectives). It implements no inference, LoRA, mixture-of-experts or
//! tensor-parallel ops and says so ([`Backend::supports`]): a run that needs them is refused at
//! set-up (`engine::backend::require`), naming the feature.
//!
//! Example: `train::Trainer::on(Cuda::new(0)?, config, Box::new(comm::Solo::new()))?`.

use crate::device::{Cuda, CudaSlab};
use crate::{ops, state};
use engine::backend::*;
use engine::error::EngineError;
use engine::Arena;

impl Backend for Cuda {
    type Slab = CudaSlab;

    const NAME: &'static str = "cuda";

    /// Flash attention, full training on one GPU: LoRA, mixture of experts, latent attention,
    /// tensor parallelism, the eager kernel, optimizer offload and several ranks are not built.
    fn supports(_: Feature) -> bool {
        false
    }

    fn align_bytes(&self) -> u64 {
        // The CPU plan's alignment, so `frugal plan --runtime frugal` prints this device's
        // layout too; the slab itself is cudaMalloc's (256-byte aligned).
        plan_frugal::layout::ALIGN_BYTES
    }

    fn alloc(&self, bytes: u64) -> Result<CudaSlab, EngineError> {
        self.alloc_slab(bytes)
            .map_err(|_| EngineError::OutOfMemory {
                what: "CUDA arena slab".into(),
                bytes,
            })
    }

    fn upload(&self, a: &Arena<Self>, dst: Tensor, src: &[f32]) {
        state::upload(self, a, dst, src)
    }

    fn download(&self, a: &Arena<Self>, src: Tensor, dst: &mut [f32]) {
        state::download(self, a, src, dst)
    }

    fn upload_ids(&self, a: &Arena<Self>, dst: Tensor, src: &[u32]) {
        assert_eq!(dst.len, src.len(), "token ids of the tensor");
        self.write(ops::at(a, dst), src)
    }

    fn upload_bytes(&self, a: &Arena<Self>, dst: Tensor, src: &[u8]) {
        state::write_bytes(self, a, dst, src)
    }

    fn download_bytes(&self, a: &Arena<Self>, src: Tensor, dst: &mut [u8]) {
        dst.copy_from_slice(&state::read_bytes(self, a, src))
    }

    fn embedding(&self, a: &Arena<Self>, op: &Embedding) {
        ops::embedding(self, a, op)
    }

    fn norm(&self, a: &Arena<Self>, op: &NormOp) {
        ops::norm(self, a, op)
    }

    fn linear(&self, a: &Arena<Self>, op: &Linear) {
        ops::linear(self, a, op)
    }

    fn rope(&self, a: &Arena<Self>, qkv: Tensor, shape: RopeShape) {
        ops::rope(self, a, qkv, shape, 1.0)
    }

    fn attention(&self, a: &Arena<Self>, op: &Attention) {
        ops::attention(self, a, op)
    }

    fn activation(&self, a: &Arena<Self>, op: &Activation) {
        ops::activation(self, a, op)
    }

    fn residual_add(&self, a: &Arena<Self>, out: Tensor, inp: Tensor) {
        ops::residual_add(self, a, out, inp)
    }

    fn convert(&self, a: &Arena<Self>, dst: Tensor, src: Tensor) {
        ops::convert(self, a, dst, src)
    }

    fn classifier_logits(&self, a: &Arena<Self>, op: &ClassifierLogits) {
        ops::classifier_logits(self, a, op)
    }

    fn fill(&self, a: &Arena<Self>, t: Tensor, value: f32) {
        state::fill(self, a, t, value)
    }

    fn collective(
        &self,
        a: &Arena<Self>,
        comm: &mut dyn comm::Collective,
        op: CommOp,
    ) -> Result<(), comm::CommError> {
        state::collective(self, a, comm, op)
    }
}

impl TrainOps for Cuda {
    fn classifier(&self, a: &Arena<Self>, op: &Classifier) -> f32 {
        ops::classifier(self, a, op)
    }

    fn embedding_backward(&self, a: &Arena<Self>, op: &EmbeddingBackward) {
        ops::embedding_backward(self, a, op)
    }

    fn norm_backward(&self, a: &Arena<Self>, op: &NormBackward) {
        ops::norm_backward(self, a, op)
    }

    fn linear_backward(&self, a: &Arena<Self>, op: &LinearBackward) {
        ops::linear_backward(self, a, op)
    }

    fn rope_backward(&self, a: &Arena<Self>, dqkv: Tensor, shape: RopeShape) {
        ops::rope(self, a, dqkv, shape, -1.0)
    }

    fn attention_backward(&self, a: &Arena<Self>, op: &AttentionBackward) {
        ops::attention_backward(self, a, op)
    }

    fn activation_backward(&self, a: &Arena<Self>, op: &ActivationBackward) {
        ops::activation_backward(self, a, op)
    }

    fn sum_squares(&self, a: &Arena<Self>, t: Tensor, start: f64) -> (f64, bool) {
        state::sum_squares(self, a, t, start)
    }

    fn scale(&self, a: &Arena<Self>, t: Tensor, factor: f32) {
        state::scale(self, a, t, factor)
    }

    fn accumulate(&self, a: &Arena<Self>, acc: Tensor, x: Tensor) {
        state::accumulate(self, a, acc, x)
    }

    fn adamw(&self, a: &Arena<Self>, op: &AdamW) {
        state::adamw(self, a, op)
    }

    fn sgd(&self, a: &Arena<Self>, op: &Sgd) {
        state::sgd(self, a, op)
    }

    fn master_adamw(&self, a: &Arena<Self>, op: &MasterAdamW) {
        state::master_adamw(self, a, op)
    }

    fn master_adamw_host(&self, a: &Arena<Self>, op: MasterAdamWHost<'_>) {
        state::master_adamw_host(self, a, op)
    }

    fn underflow(&self, a: &Arena<Self>, t: Tensor) -> engine::precision::UnderflowStats {
        state::underflow(self, a, t)
    }

    fn widen_in_place(&self, a: &Arena<Self>, t: Tensor, half: DType) {
        state::widen_in_place(self, a, t, half)
    }
}
