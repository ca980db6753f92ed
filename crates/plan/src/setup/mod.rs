//! What the user asks the planner about: a training or an inference setup.
//!
//! These are validated values (ripgrep's LowArgs → HiArgs: the CLI parses flags into these once).
//! Example: `TrainSetup { precision: Precision::AmpBf16, zero: ZeroStage::Three, dp: 8, .. }`.

use serde::Serialize;

mod names;

/// Number formats a tensor can be stored in; bytes per element via [`Dtype::bits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    Fp8,
    Int8,
    Int4,
    Nf4,
    /// A GGUF file's blocks as frugal's engine holds them: an int8 code per weight, an fp32
    /// scale and minimum per group of 32 (16 in files with Q6_K).
    Ggml,
}

impl Dtype {
    pub fn bits(self) -> u64 {
        match self {
            Dtype::F32 => 32,
            Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::Fp8 | Dtype::Int8 => 8,
            Dtype::Int4 | Dtype::Nf4 => 4,
            // 8 bits of code and 64 of scale and minimum per 32.
            Dtype::Ggml => 10,
        }
    }
}

/// Training precision policy (names as the CLI takes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// fp32 weights, gradients, activations, optimizer state.
    Fp32,
    /// fp32 weights and optimizer state; autocast runs matmuls in bf16 (PyTorch AMP).
    AmpBf16,
    /// As `AmpBf16` with fp16 autocast and a loss scaler.
    AmpFp16,
    /// bf16 weights and gradients with fp32 master weights and optimizer state (DeepSpeed, Megatron).
    Bf16,
    /// fp16 weights and gradients, fp32 master and optimizer state, dynamic loss scaling.
    Fp16,
    /// bf16 weights and bf16 optimizer state, no master copy (`model.to(torch.bfloat16)`).
    PureBf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Adam/AdamW: two fp32 moments per parameter.
    AdamW,
    /// 8-bit Adam (bitsandbytes): two int8 moments plus block-wise scales.
    AdamW8bit,
    /// SGD with momentum: one buffer per parameter.
    Sgd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ZeroStage {
    Zero0,
    Zero1,
    Zero2,
    Zero3,
}

/// Activation recomputation ("activation checkpointing").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    None,
    /// Keep each block's input; recompute the whole block in backward.
    Full,
    /// Keep the input of every k-th block; recompute the segments in between.
    Every(u32),
    /// `Every(round(sqrt(L)))`.
    Sqrt,
    /// Megatron's selective recompute (Korthikanti et al. 2022): keep everything but the
    /// attention core's T×T tensors (scores, softmax, dropout), recomputed in each block's
    /// backward. With flash attention there are none, so it keeps what `None` keeps.
    Selective,
    /// Keep only the matmul outputs (and the residual stream); recompute the norms, the
    /// attention core and the MLP activation in each block's backward (PyTorch's selective
    /// checkpointing with a save-matmuls policy).
    KeepMatmuls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attention {
    /// Tiled, online softmax: no T×T matrix kept.
    Flash,
    /// Materialised T×T scores and probabilities (`eager`, also spelled `naive`).
    Eager,
}

impl Attention {
    /// The one default of every command: FlashAttention.s "no cost, always on".
    pub const DEFAULT: Attention = Attention::Flash;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    None,
    /// Master weights and optimizer state in host memory; the step runs on the host.
    Optimizer,
    /// Also the parameters (ZeRO-Infinity style): fetched to the device per unit.
    Params,
}

/// Which accounting of the model states the analytic (`formula`) runtime follows. The replaying
/// profiles (`pytorch`, `frugal`) allocate what the real process allocates and ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Convention {
    /// What DeepSpeed really allocates: the 2 + 2 + 12 bytes per parameter plus the fp32 copy of
    /// the rank's gradient partition its mixed-precision step makes (ZeRO 1-2: the whole
    /// partition; ZeRO-3: one `sub_group_size` group at a time), and no gradient partition on
    /// the device when ZeRO 2-3 offload the optimizer.
    Deepspeed,
    /// The ZeRO paper's Table 1 (Rajbhandari et al. 2020): (2 + 2 + K)Ψ sharded, K = 12 for
    /// mixed-precision Adam, nothing else. The classic ZeRO table.s 112 / 38.5 / 26.25 / 14 GB follow it.
    Paper,
}

/// LoRA / QLoRA: frozen base weights (optionally quantized), trainable low-rank adapters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lora {
    pub rank: u32,
    /// Linear layers that get adapters, by HF name (`q_proj`, `v_proj`, ...).
    pub targets: Vec<String>,
    /// Storage of the frozen base weights: `Bf16`, `Int8` or `Nf4` (`Fp32` and `Ggml` in the
    /// `frugal` runtime too).
    pub base: Dtype,
    /// nf4: bitsandbytes' double quantization of the absmax (the `frugal` runtime plans it as
    /// asked; the `formula` and `pytorch` profiles follow QLoRA's recipe, which has it on).
    pub double_quant: bool,
    /// Dropout on each adapter's input (PEFT's `lora_dropout`; 0: none). The `frugal` runtime
    /// plans the dropped input and its gradient's scratch when it is on.
    pub dropout: f32,
    /// `Ggml` base (the `frugal` runtime, over a GGUF file): the layout of the file's blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ggml: Option<crate::lora::GgmlBase>,
}

/// A training setup, per data-parallel group.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainSetup {
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub zero: ZeroStage,
    /// Data-parallel ranks (the N that ZeRO shards over).
    pub dp: u32,
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Pipeline-parallel degree.
    pub pp: u32,
    /// Sequence parallelism (with tensor parallelism, Megatron style).
    pub sp: bool,
    pub micro_batch: u64,
    pub seq: u64,
    pub grad_accum: u32,
    pub recompute: Recompute,
    pub attention: Attention,
    pub offload: Offload,
    pub lora: Option<Lora>,
    /// The model-state accounting of the `formula` runtime.
    pub convention: Convention,
    /// DeepSpeed's ZeRO buffer sizes (its defaults unless a ds_config sets them).
    #[serde(skip_serializing_if = "ZeroBuffers::is_default")]
    pub zero_buffers: ZeroBuffers,
}

/// The sizes, in elements, of the buffers DeepSpeed's ZeRO keeps on the device, as its config
/// names them. The defaults are DeepSpeed's (`deepspeed/runtime/zero/config.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ZeroBuffers {
    /// `reduce_bucket_size`: the contiguous bucket ZeRO-2/3 reduce gradients through.
    pub reduce_bucket: u64,
    /// `stage3_prefetch_bucket_size`: parameters ZeRO-3 gathers ahead of their use.
    pub prefetch_bucket: u64,
    /// `stage3_param_persistence_threshold`: ZeRO-3 keeps smaller parameters whole on each rank.
    pub persistence_threshold: u64,
    /// `sub_group_size`: ZeRO-3's step upcasts the gradient partition this many at a time.
    pub sub_group: u64,
}

impl ZeroBuffers {
    pub const DEEPSPEED: ZeroBuffers = ZeroBuffers {
        reduce_bucket: 500_000_000,
        prefetch_bucket: 50_000_000,
        persistence_threshold: 100_000,
        sub_group: 1_000_000_000,
    };

    pub fn is_default(&self) -> bool {
        *self == ZeroBuffers::DEEPSPEED
    }
}

impl Default for ZeroBuffers {
    fn default() -> ZeroBuffers {
        ZeroBuffers::DEEPSPEED
    }
}

impl TrainSetup {
    /// `micro_batch` rows of `seq` tokens with the planner's defaults, `frugal plan`'s: bf16 with
    /// fp32 master weights, AdamW, one GPU (ZeRO 0, no TP/PP/SP), no accumulation, no recompute,
    /// flash attention, no offload, no LoRA, DeepSpeed's accounting. Set any field with `..TrainSetup::new(b, s)`.
    pub fn new(micro_batch: u64, seq: u64) -> TrainSetup {
        TrainSetup {
            precision: Precision::Bf16,
            optimizer: Optimizer::AdamW,
            zero: ZeroStage::Zero0,
            dp: 1,
            tp: 1,
            pp: 1,
            sp: false,
            micro_batch,
            seq,
            grad_accum: 1,
            recompute: Recompute::None,
            attention: Attention::DEFAULT,
            offload: Offload::None,
            lora: None,
            convention: Convention::Deepspeed,
            zero_buffers: ZeroBuffers::DEEPSPEED,
        }
    }
}

/// An inference setup.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InferSetup {
    pub weights: Dtype,
    /// Group size of weight quantization (`None`: int8 one scale per output row, int4 groups of
    /// 128 as GPTQ/AWQ, nf4 blocks of 64 as bitsandbytes); scales stored in fp16.
    pub weight_group: Option<u64>,
    /// ggml only: the matrices a GGUF file holds in 4-bit types in every layer, whose codes the
    /// engine keeps two a byte (`WeightFormat::Ggml`'s `nibbles`).
    #[serde(skip_serializing_if = "crate::roles::Roles::is_empty")]
    pub ggml_nibbles: crate::roles::Roles,
    /// ggml only: the bytes of a GGUF file's tensors, each in its own type (what llama.cpp puts
    /// on the device); the `formula` runtime counts these for the weights, split evenly over
    /// `tp` ranks. `None`: its generic ggml estimate (a byte a code and 8 bytes a group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ggml_file_bytes: Option<u64>,
    /// nf4 only: bitsandbytes' double quantization (uint8 absmax per block with an fp32 scale
    /// per 256 blocks; `bnb_4bit_use_double_quant`, off by default in HF, on in QLoRA's recipe).
    pub double_quant: bool,
    pub kv_dtype: Dtype,
    pub batch: u64,
    /// Context length: prompt plus generated tokens.
    pub seq: u64,
    /// Paged KV cache block size in tokens (`None` = contiguous, as HF's DynamicCache).
    pub kv_block: Option<u64>,
    pub tp: u32,
    pub attention: Attention,
}

impl InferSetup {
    /// `batch` sequences of `seq` tokens with `weights` and a `kv_dtype` cache; otherwise the
    /// defaults: no group or double quantization, a contiguous cache, one device, flash attention.
    pub fn new(weights: Dtype, kv_dtype: Dtype, batch: u64, seq: u64) -> InferSetup {
        InferSetup {
            weights,
            weight_group: None,
            ggml_nibbles: crate::roles::Roles::NONE,
            ggml_file_bytes: None,
            double_quant: false,
            kv_dtype,
            batch,
            seq,
            kv_block: None,
            tp: 1,
            attention: Attention::Flash,
        }
    }
}

/// The CLI's name of a dtype (`bf16`, `int8`, `nf4`).
pub fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "fp32",
        Dtype::F16 => "fp16",
        Dtype::Bf16 => "bf16",
        Dtype::Fp8 => "fp8",
        Dtype::Int8 => "int8",
        Dtype::Int4 => "int4",
        Dtype::Nf4 => "nf4",
        Dtype::Ggml => "ggml",
    }
}
