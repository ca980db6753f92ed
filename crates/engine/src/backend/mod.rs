//! The device seam: a [`Backend`] owns one slab of device memory per arena and runs every
//! operation the engine performs on tensors in it, from kernels (a block's linear layers,
//! attention, norms) to the bookkeeping loops of training (zeroing, gradient norms, AdamW on
//! master weights, ZeRO's copies and collectives). The engine above speaks only in [`Tensor`]s
//! (a buffer, an element type, an element range) and op descriptors ([`LinearShape`],
//! [`AttnShape`], ...), never in slices, so a CUDA backend implements this trait and nothing
//! above it changes. The CPU backend (`crates/cpu`) is the kernels crate, unchanged in numerics.
//!
//! What it does not do: decide what exists or when (the plan and the arena), or which op follows
//! which (the model's forward and backward).
//!
//! Example: `arena.backend().linear(&arena, &Linear { out, inp, weight, bias, shape })`.

pub mod infer_ops;
pub mod lora_ops;
pub mod moe_ops;
pub mod ops;

pub use infer_ops::*;
pub use lora_ops::*;
pub use moe_ops::*;
pub use ops::*;

use crate::arena::{Arena, BufId};
use crate::error::EngineError;
use std::ops::Range;

/// Element types a tensor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
    F16,
    /// Token ids.
    U32,
    /// Raw bytes: packed 4-bit codes, fp8 codes, zero points.
    U8,
    /// Signed 8-bit codes (int8 weights and KV).
    I8,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::U8 | DType::I8 => 1,
        }
    }

    /// The 2-byte format of a precision's weights and gradients (`None` for fp32).
    pub fn half_of(precision: plan::setup::Precision) -> Option<DType> {
        match precision {
            plan::setup::Precision::Bf16 => Some(DType::Bf16),
            plan::setup::Precision::Fp16 => Some(DType::F16),
            _ => None,
        }
    }
}

/// Elements `offset .. offset + len` of one arena buffer, read as `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub buf: BufId,
    pub dtype: DType,
    pub offset: usize,
    pub len: usize,
}

impl Tensor {
    /// The first `len` elements (a pass shorter than the planned shape).
    pub fn prefix(self, len: usize) -> Tensor {
        assert!(len <= self.len, "prefix of {len} > {} elements", self.len);
        Tensor { len, ..self }
    }

    /// Elements `r` of this tensor.
    pub fn slice(self, r: Range<usize>) -> Tensor {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "slice {r:?} of {}",
            self.len
        );
        Tensor {
            offset: self.offset + r.start,
            len: r.len(),
            ..self
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What a backend may lack beyond the forward pass, named in the one error a set-up gives
/// ([`require`]) when a run needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// LoRA adapters over a frozen (possibly quantized) base: [`LoraOps`].
    Lora,
    /// Mixture-of-experts MLPs: [`MoeOps`].
    MixtureOfExperts,
    /// Multi-head latent attention: [`MoeOps::mla`].
    LatentAttention,
    /// Tensor-parallel shards of every block and the vocabulary: [`TensorParallelOps`].
    TensorParallel,
    /// The materialised (eager) attention kernel, besides flash.
    EagerAttention,
    /// fp32 master weights and Adam moments in host memory or a file.
    OptimizerOffload,
    /// Several ranks of one run talking through [`Backend::collective`] (data, tensor or
    /// pipeline parallelism).
    Ranks,
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::Lora => "LoRA",
            Feature::MixtureOfExperts => "mixture-of-experts layers",
            Feature::LatentAttention => "latent-attention layers",
            Feature::TensorParallel => "tensor parallelism",
            Feature::EagerAttention => "the eager attention kernel",
            Feature::OptimizerOffload => "optimizer offload",
            Feature::Ranks => "several ranks",
        })
    }
}

/// Refuses, before anything is allocated, a run that needs a feature backend `B` lacks: the one
/// typed error ([`EngineError::Unsupported`]) that names the feature and the backend.
pub fn require<B: Backend>(needs: impl IntoIterator<Item = Feature>) -> Result<(), EngineError> {
    match needs.into_iter().find(|&f| !B::supports(f)) {
        Some(feature) => Err(EngineError::Unsupported {
            backend: B::NAME,
            feature,
        }),
        None => Ok(()),
    }
}

/// The features a model needs on any backend (its layers), beside a run's own.
pub fn model_needs(shape: &plan::ModelShape) -> Vec<Feature> {
    let mut needs = Vec::new();
    if shape.mla.is_some() {
        needs.push(Feature::LatentAttention);
    }
    if shape.moe.is_some() {
        needs.push(Feature::MixtureOfExperts);
    }
    needs
}

fn checked_at_setup(feature: Feature) -> String {
    format!("{feature}: a backend without it is refused at set-up (backend::require)")
}

/// A backend on a device with memory of its own (a GPU): what `frugal train --device NAME` opens.
/// The arena's slab is checked against [`Accelerator::capacity_bytes`], and the report adds what
/// the device's driver says was taken next to the planned and measured peak.
pub trait Accelerator: TrainOps {
    /// Why the device could not be opened or asked (missing driver or library, no such device).
    type Error: std::error::Error + Send + Sync + 'static;
    /// The backend's own allocation beside the slabs (library workspaces, reduction partials).
    const SCRATCH_BYTES: u64;

    /// Opens device `ordinal` with everything the ops need (context, kernels, library handles);
    /// the error names what is missing and where it comes from.
    fn open(ordinal: usize) -> Result<Self, Self::Error>;
    /// The device's name and model, for reports.
    fn describe(&self) -> String;
    /// Bytes an arena may take: free once the context was up, less the backend's scratch.
    fn capacity_bytes(&self) -> u64;
    /// Bytes the context took before any allocation (driver, modules, library handles).
    fn context_bytes(&self) -> u64;
    /// Device bytes taken since the context was made (the backend's scratch and the slabs),
    /// as the driver counts them.
    fn bytes_in_use(&self) -> Result<u64, Self::Error>;
}

/// `be`'s LoRA ops; the set-up refused a backend without them ([`require`]).
pub fn lora_ops<B: Backend>(be: &B) -> &dyn LoraOps<B> {
    be.lora_ops()
        .unwrap_or_else(|| panic!("{}", checked_at_setup(Feature::Lora)))
}

/// `be`'s mixture-of-experts and latent-attention ops; refused at set-up without them.
pub fn moe_ops<B: Backend>(be: &B) -> &dyn MoeOps<B> {
    be.moe_ops()
        .unwrap_or_else(|| panic!("{}", checked_at_setup(Feature::MixtureOfExperts)))
}

/// `be`'s tensor-parallel ops; refused at set-up without them.
pub fn tp_ops<B: Backend>(be: &B) -> &dyn TensorParallelOps<B> {
    be.tp_ops()
        .unwrap_or_else(|| panic!("{}", checked_at_setup(Feature::TensorParallel)))
}

/// A device the engine runs on: memory, host transfers, the forward pass and collectives (every
/// command needs them). What else it runs is a trait of its own: training ([`TrainOps`]: the
/// backward pass and optimizers), inference ([`InferOps`]: quantized linears, paged KV), and
/// optional capabilities a model or run may need ([`LoraOps`], [`MoeOps`],
/// [`TensorParallelOps`]), each named by a [`Feature`] that [`Backend::supports`] answers before
/// anything runs. Every op reads and writes tensors of `arena`, which it must only touch inside
/// the tensors' ranges and planned lifetimes (the arena checks both).
pub trait Backend: Sized + Send + 'static {
    /// One arena's device memory.
    type Slab: Send;
    /// `cpu`, `cuda`: for messages.
    const NAME: &'static str;

    /// Whether this backend runs `feature` (asked at set-up, with no device needed).
    fn supports(feature: Feature) -> bool;
    /// The LoRA ops, where [`Feature::Lora`] is supported.
    fn lora_ops(&self) -> Option<&dyn LoraOps<Self>> {
        None
    }
    /// The mixture-of-experts and latent-attention ops, where supported.
    fn moe_ops(&self) -> Option<&dyn MoeOps<Self>> {
        None
    }
    /// The tensor-parallel ops, where supported.
    fn tp_ops(&self) -> Option<&dyn TensorParallelOps<Self>> {
        None
    }

    /// `cpu`, `cuda`: for messages.
    fn name(&self) -> &'static str {
        Self::NAME
    }
    /// Buffer offsets in a slab are multiples of this.
    fn align_bytes(&self) -> u64;
    /// A zeroed slab of `bytes`, or the device's refusal.
    fn alloc(&self, bytes: u64) -> Result<Self::Slab, EngineError>;

    // Host transfers, outside the step (initialisation, IO, snapshots, sampling).
    /// Writes `src` into `dst` (f32, or rounded to a 2-byte `dst`).
    fn upload(&self, a: &Arena<Self>, dst: Tensor, src: &[f32]);
    /// Reads `src` (f32, or widened from 2 bytes) into `dst`.
    fn download(&self, a: &Arena<Self>, src: Tensor, dst: &mut [f32]);
    /// Writes token ids.
    fn upload_ids(&self, a: &Arena<Self>, dst: Tensor, src: &[u32]);
    /// Writes raw bytes into `dst` (a tensor of any type, `src` its bytes, little-endian).
    fn upload_bytes(&self, a: &Arena<Self>, dst: Tensor, src: &[u8]);
    /// Reads `src`'s raw bytes.
    fn download_bytes(&self, a: &Arena<Self>, src: Tensor, dst: &mut [u8]);

    // The forward pass.
    fn embedding(&self, a: &Arena<Self>, op: &Embedding);
    fn norm(&self, a: &Arena<Self>, op: &NormOp);
    fn linear(&self, a: &Arena<Self>, op: &Linear);
    /// Rotary embeddings on the q and k heads of fused q|k|v rows, in place.
    fn rope(&self, a: &Arena<Self>, qkv: Tensor, shape: RopeShape);
    fn attention(&self, a: &Arena<Self>, op: &Attention);
    fn activation(&self, a: &Arena<Self>, op: &Activation);
    /// `out += inp` (the residual stream).
    fn residual_add(&self, a: &Arena<Self>, out: Tensor, inp: Tensor);
    /// Element-wise conversion between `src`'s and `dst`'s types (round to nearest even).
    fn convert(&self, a: &Arena<Self>, dst: Tensor, src: Tensor);
    /// The bf16 head's logits of a chunk of rows, for forward-only passes.
    fn classifier_logits(&self, a: &Arena<Self>, op: &ClassifierLogits);
    /// Every element := `value` (zero is all-zero bits in every type).
    fn fill(&self, a: &Arena<Self>, t: Tensor, value: f32);

    // Ranks (data, tensor and pipeline parallelism; the rank launcher is `world`).
    /// One collective of this rank's `comm` over arena tensors.
    fn collective(
        &self,
        a: &Arena<Self>,
        comm: &mut dyn comm::Collective,
        op: CommOp,
    ) -> Result<(), comm::CommError>;

    /// Starts `op` so that it may still be running when this returns (`comm::Collective::
    /// start_all_gather` for an `AllGather` on the CPU); `comm.wait(ticket)` finishes it. By
    /// default the blocking [`Backend::collective`], returning `Ticket::DONE` (the CUDA
    /// backend stages through the host).
    ///
    /// # Safety
    /// Until the ticket is waited for, nothing reads or writes the destination or writes the
    /// source, and both stay allocated (the plan keeps a gather's buffer alive from its birth
    /// to past its first use; the trainer drops its communicator before its arena).
    unsafe fn start_collective(
        &self,
        a: &Arena<Self>,
        comm: &mut dyn comm::Collective,
        op: CommOp,
    ) -> Result<comm::Ticket, comm::CommError> {
        self.collective(a, comm, op).map(|()| comm::Ticket::DONE)
    }
}

/// Training: the fused loss, the backward pass (every gradient is accumulated into: `+=`),
/// gradient norms and optimizer steps.
pub trait TrainOps: Backend {
    /// The fused classifier and cross-entropy, forward and backward; returns the loss sum.
    fn classifier(&self, a: &Arena<Self>, op: &Classifier) -> f32;
    fn embedding_backward(&self, a: &Arena<Self>, op: &EmbeddingBackward);
    fn norm_backward(&self, a: &Arena<Self>, op: &NormBackward);
    fn linear_backward(&self, a: &Arena<Self>, op: &LinearBackward);
    fn rope_backward(&self, a: &Arena<Self>, dqkv: Tensor, shape: RopeShape);
    fn attention_backward(&self, a: &Arena<Self>, op: &AttentionBackward);
    fn activation_backward(&self, a: &Arena<Self>, op: &ActivationBackward);

    // Optimizer and model state.
    /// `start` plus the sum of squares of `t` (f64), and whether any element is inf or NaN;
    /// chunked in a fixed order, so the result does not depend on the thread count.
    fn sum_squares(&self, a: &Arena<Self>, t: Tensor, start: f64) -> (f64, bool);
    /// `t *= factor`.
    fn scale(&self, a: &Arena<Self>, t: Tensor, factor: f32);
    /// `acc += x`, `x` f32 (or bf16 into bf16: a 2-byte gradient span), rounded once into a
    /// 2-byte `acc`.
    fn accumulate(&self, a: &Arena<Self>, acc: Tensor, x: Tensor);
    fn adamw(&self, a: &Arena<Self>, op: &AdamW);
    fn sgd(&self, a: &Arena<Self>, op: &Sgd);
    /// AdamW on fp32 master weights in the arena, fed 2-byte gradients, writing the working copy.
    fn master_adamw(&self, a: &Arena<Self>, op: &MasterAdamW);
    /// The same with the master weights and moments in host memory (optimizer offload).
    fn master_adamw_host(&self, a: &Arena<Self>, op: MasterAdamWHost<'_>);
    /// fp16's view of f32 gradients about to be rounded: flushed, subnormal, overflowing.
    fn underflow(&self, a: &Arena<Self>, t: Tensor) -> crate::precision::UnderflowStats;
    /// The first `t.len` 2-byte elements stored at `t`'s start, widened in place to f32.
    fn widen_in_place(&self, a: &Arena<Self>, t: Tensor, half: DType);
}

/// Inference (`infer_ops`): weights in a storage format, the paged KV cache.
pub trait InferOps: Backend {
    /// out = inp · Wᵀ (+ bias) with W in its storage format.
    fn qlinear(&self, a: &Arena<Self>, op: &QLinear);
    /// out[r] = the embedding row of token r, dequantized (+ its learned position's row).
    fn embed_rows(&self, a: &Arena<Self>, op: &EmbedRows);
    /// RoPE on the q and k heads of each row at its own position, in place.
    fn rope_at(&self, a: &Arena<Self>, qkv: Tensor, positions: &[u32], shape: RopeShape);
    /// Stores each row's keys and values in its cache slot (quantizing).
    fn kv_write(&self, a: &Arena<Self>, op: &KvWrite);
    /// Attention of each row's queries over its sequence's cached tokens.
    fn paged_attention(&self, a: &Arena<Self>, op: &PagedAttention);
    /// Latent attention's cache writes, RoPE at positions and absorbed attention.
    fn latent(&self, a: &Arena<Self>, op: &LatentOp);
    /// Copies one KV block to another in every layer's cache (copy-on-write).
    fn kv_copy_block(&self, a: &Arena<Self>, cache: &KvCache, from: usize, to: usize);
    /// Whether this backend keeps `m` in a layout of its own, not the packer's (the CPU's int4,
    /// int8 and nf4 in tiles of eight rows where its integer kernel reads them so): the same bytes
    /// in another order.
    fn own_layout(&self, m: &QMatrix) -> bool {
        let _ = m;
        false
    }
    /// Writes one matrix's codes, scales and zero points (`parts`), given in the packer's layout
    /// (a part `m` lacks takes an empty slice), in the layout this backend keeps it in.
    fn upload_matrix(&self, a: &Arena<Self>, m: &QMatrix, parts: [&[u8]; 3]) {
        let [codes, scales, zeros] = parts;
        self.upload_bytes(a, m.codes, codes);
        if let Some(s) = m.scales {
            self.upload_bytes(a, s, scales);
        }
        if let Some(z) = m.zeros {
            self.upload_bytes(a, z, zeros);
        }
    }
    /// Reads one matrix back in the packer's layout (the inverse of `upload_matrix`).
    fn download_matrix(&self, a: &Arena<Self>, m: &QMatrix, parts: [&mut [u8]; 3]) {
        let [codes, scales, zeros] = parts;
        self.download_bytes(a, m.codes, codes);
        if let Some(s) = m.scales {
            self.download_bytes(a, s, scales);
        }
        if let Some(z) = m.zeros {
            self.download_bytes(a, z, zeros);
        }
    }
}

/// LoRA (`lora_ops`): a frozen matrix part by part, and the adapters beside it.
pub trait LoraOps<B: Backend> {
    fn frozen_linear(&self, a: &Arena<B>, op: &FrozenLinear);
    fn frozen_linear_backward(&self, a: &Arena<B>, op: &FrozenLinearBackward);
    fn adapter(&self, a: &Arena<B>, op: &Adapter);
    fn adapter_backward(&self, a: &Arena<B>, op: &AdapterBackward);
}

/// Mixture of experts (`moe_ops`): routing, expert-order gathers and combines; and multi-head
/// latent attention's row plumbing.
pub trait MoeOps<B: Backend> {
    fn moe(&self, a: &Arena<B>, op: &MoeOp);
    fn mla(&self, a: &Arena<B>, op: &MlaOp);
}

/// Tensor parallelism's vocabulary-sharded head.
pub trait TensorParallelOps<B: Backend> {
    /// The fused classifier over this rank's vocabulary rows: `op.v` is its slice, the loss the
    /// whole vocabulary's; `op.dlnf` gets this rank's partial input gradient.
    fn classifier_shard(&self, a: &Arena<B>, op: &Classifier, shard: ClassifierShard<'_>) -> f32;
}
