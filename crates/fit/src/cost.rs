//! Predicted step time of a training setup: FLOPs with recompute, communication volume per ZeRO
//! stage, tensor- and pipeline-parallel traffic, the pipeline bubble and offload.
//!
//! The model, stated once:
//! - Compute: 6·N per token for the matmuls (N = parameters a token passes through, the head
//!   included, the embedding lookup not; LoRA: 4·N on the frozen base plus 6 per adapter weight)
//!   plus the attention core, 2·L·s·heads·(d_qk + d_v) per token forward and twice that backward
//!   (PaLM's non-causal count). Recompute adds the forward it repeats: `full`, `every:K` and
//!   `sqrt` rerun every block's forward once, `selective` only the attention core. Divided by
//!   the GPU's peak × `--mfu`. Eager attention adds HBM traffic for its T×T tensors (8 bytes per score
//!   element forward, 12 backward, 8 again when recomputed) and QLoRA its dequantized weight
//!   copies, at the GPU's memory bandwidth.
//! - Data-parallel traffic from the ZeRO paper: stages 0-2 move 2Ψ per step and stage 3 3Ψ;
//!   with accumulation over m micro-batches ZeRO-2 reduce-scatters every micro-batch ((m+1)Ψ) and
//!   ZeRO-3 gathers and reduces every micro-batch (3mΨ). A ring moves (N−1)/N of each volume per
//!   rank. Gradients travel in the gradient dtype, gathered weights in the weight dtype.
//! - Tensor parallelism: 4 all-reduces of b·s·h per layer per micro-batch (6 when the blocks are
//!   recomputed), 2(t−1)/t of each per rank, inside a node. Pipeline: 1F1B's bubble
//!   (p−1)/(m+p−1) of the step, and b·s·h sent each way per micro-batch.
//! - Offload: gradients to the host and updated weights back every step over PCIe (parameters
//!   also fetched twice per micro-batch under `--offload params`), and the host's Adam.
//! - Overlap: data-parallel collectives overlap with compute (bucketed reduce-scatter during
//!   backward, ZeRO-3 prefetch), so the step is `max(compute + bubble, dp_comm)`; tensor- and
//!   pipeline-parallel transfers and offload are on the critical path and add up.
//! - Eager PyTorch's overheads, which dominate small models: element-wise kernels' HBM traffic
//!   (norms, casts, dropout, activations, residual adds; a per-family constant fitted to the H200
//!   calibration), the loss's fp32 passes over the logits, the optimizer's pass over its state
//!   (fused AdamW), a fixed GPU cost per kernel, and the host's dispatch of every kernel, which is
//!   the step's floor when the GPU work is small: compute is `max(GPU time, dispatch time)`.
//!   Matmuls run at the GPU's peak × `--mfu` (the GEMMs' efficiency, 0.6 by default).
//! - Not modelled: GEMM efficiency falling at small shapes, stragglers, network contention,
//!   `torch.compile`'s fusion. Example: `step_time(&model, &setup, &hardware).step_s`.

use super::hardware::Hardware;
use plan::acts::act_bytes;
use plan::formula::Policy;
use plan::params::TensorKind;
use plan::setup::{Attention, Offload, Recompute, TrainSetup, ZeroStage};
use plan::{lora, ModelShape};
use serde::Serialize;

/// Data-parallel traffic per step in multiples of Ψ (the rank's trainable parameters), as the
/// ZeRO paper counts it: `reduce` moves gradients, `gather` moves weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CommVolume {
    pub reduce_psi: u64,
    pub gather_psi: u64,
}

impl CommVolume {
    pub fn total_psi(&self) -> u64 {
        self.reduce_psi + self.gather_psi
    }
}

/// The ZeRO paper's per-step volume of `zero` with `micro_batches` accumulated.
pub fn zero_comm_volume(zero: ZeroStage, micro_batches: u32) -> CommVolume {
    let m = micro_batches as u64;
    let (reduce_psi, gather_psi) = match zero {
        // All-reduce = reduce-scatter + all-gather of the gradients, once per step (no_sync).
        ZeroStage::Zero0 => (2, 0),
        ZeroStage::Zero1 => (1, 1),
        ZeroStage::Zero2 => (m, 1),
        ZeroStage::Zero3 => (m, 2 * m),
    };
    CommVolume {
        reduce_psi,
        gather_psi,
    }
}

/// Why a step takes as long as it does: the largest term of the step time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    Compute,
    DataParallelComm,
    TensorParallelComm,
    PipelineBubble,
    Offload,
}

impl Bottleneck {
    pub fn label(self) -> &'static str {
        match self {
            Bottleneck::Compute => "compute",
            Bottleneck::DataParallelComm => "dp comm",
            Bottleneck::TensorParallelComm => "tp/pp comm",
            Bottleneck::PipelineBubble => "pp bubble",
            Bottleneck::Offload => "offload",
        }
    }
}

/// A predicted step, per rank, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepTime {
    pub step_s: f64,
    pub compute_s: f64,
    pub flops_per_rank: f64,
    pub bubble_s: f64,
    pub dp_comm_s: f64,
    /// Bytes each rank sends in data-parallel collectives per step.
    pub dp_comm_bytes: f64,
    pub dp_volume: CommVolume,
    pub tp_pp_comm_s: f64,
    pub offload_s: f64,
    pub tokens_per_s: f64,
    pub bottleneck: Bottleneck,
}

/// Per-token FLOP counts and byte counts of one model-parallel replica.
struct Work {
    /// Matmul weights a token passes through, all blocks (active experts only).
    block_mm: f64,
    /// The head's matmul weights.
    head_mm: f64,
    /// Attention core FLOPs per token, forward, all layers.
    attn_fwd: f64,
    /// Trainable parameters (Ψ before TP/PP splits) and the bytes of frozen base weights.
    trainable: f64,
    frozen_bytes: f64,
    /// LoRA adapter parameters (0 without LoRA).
    adapters: f64,
    /// Quantized base weights (QLoRA) dequantized per pass, elements.
    quantized: f64,
}

fn work(model: &ModelShape, setup: &TrainSetup) -> Work {
    let n_layers = model.n_layers as f64;
    let embed = model.embedding_params() as f64;
    let head_mm = (model.vocab * model.d_model) as f64;
    // head_params holds the final norm, and the output matrix unless it is tied.
    let block_mm = model.active_param_count() as f64 - embed - model.head_params() as f64;
    let (d_qk, d_v) = match &model.mla {
        Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim),
        None => (model.d_head, model.d_head),
    };
    let attn_fwd = 2.0 * n_layers * setup.seq as f64 * model.n_heads as f64 * (d_qk + d_v) as f64;
    let mut w = Work {
        block_mm,
        head_mm,
        attn_fwd,
        trainable: model.param_count() as f64,
        frozen_bytes: 0.0,
        adapters: 0.0,
        quantized: 0.0,
    };
    if let Some(l) = &setup.lora {
        let (mut adapters, mut frozen, mut quantized) = (0u64, 0u64, 0u64);
        let mut add = |tensors: Vec<plan::params::Tensor>, times: u64| {
            for t in tensors {
                if lora::is_target(&t, &l.targets) {
                    adapters += times * lora::adapter_numel(&t, l.rank);
                }
                let linear = t.kind == TensorKind::Linear;
                frozen += times
                    * if linear {
                        lora::base_bytes(t.numel(), t.d_in, l.base)
                    } else {
                        2 * t.numel()
                    };
                if linear && l.base.bits() < 16 {
                    quantized += times * t.numel();
                }
            }
        };
        add(model.embedding_tensors(), 1);
        add(model.head_tensors(), 1);
        // Dense blocks first, then the mixture-of-experts ones: two distinct block shapes at most.
        let first_moe = model
            .moe
            .as_ref()
            .map_or(model.n_layers, |m| m.first_dense.min(model.n_layers));
        if first_moe > 0 {
            add(model.block_tensors(0), first_moe as u64);
        }
        if first_moe < model.n_layers {
            add(
                model.block_tensors(first_moe),
                (model.n_layers - first_moe) as u64,
            );
        }
        w.adapters = adapters as f64;
        w.trainable = adapters as f64;
        w.frozen_bytes = frozen as f64;
        w.quantized = quantized as f64;
    }
    w
}

/// The predicted step of `setup` on `hw` (the setup is assumed valid for `model`).
pub fn step_time(model: &ModelShape, setup: &TrainSetup, hw: &Hardware) -> StepTime {
    let w = work(model, setup);
    let s = setup;
    let (tp, pp, dp) = (s.tp as f64, s.pp as f64, s.dp as f64);
    let m = s.grad_accum as f64;
    let tokens_rank = (s.micro_batch * s.seq) as f64 * m;
    let p = Policy::of(s.precision);

    // Compute of this rank: its 1/(tp·pp) share of the replica's work.
    let mm_factor = if s.lora.is_some() { 4.0 } else { 6.0 };
    let mut flops_tok = mm_factor * (w.block_mm + w.head_mm) + 3.0 * w.attn_fwd + 6.0 * w.adapters;
    let recompute = plan::recompute::RecomputePlan::of(s.recompute, model.n_layers);
    let reruns_blocks = recompute.reruns_blocks();
    if reruns_blocks {
        flops_tok += 2.0 * w.block_mm + w.attn_fwd;
    } else if recompute.recomputes_attention_core() {
        flops_tok += w.attn_fwd;
    }
    let flops_per_rank = flops_tok * tokens_rank / (tp * pp);
    let mut hbm_bytes = 0.0;
    if s.attention == Attention::Eager {
        let per_score = if s.recompute == Recompute::None {
            20.0
        } else {
            28.0
        };
        let scores = model.n_layers as f64 * model.n_heads as f64 * s.seq as f64 * tokens_rank;
        hbm_bytes += per_score * scores / (tp * pp);
    }
    if w.quantized > 0.0 {
        // Each pass reads the packed weights and writes then reads a 16-bit copy.
        let bits = s.lora.as_ref().map_or(16, |l| l.base.bits()) as f64;
        let passes = if reruns_blocks { 3.0 } else { 2.0 };
        hbm_bytes += passes * m * w.quantized * (bits / 8.0 + 4.0) / (tp * pp);
    }
    let eager = eager_overheads(model, s, &w, reruns_blocks);
    hbm_bytes += eager.elementwise_bytes + eager.optimizer_bytes;
    let gpu_s = flops_per_rank / (hw.peak_flops(s.precision) * hw.mfu)
        + hbm_bytes / (hw.gpu.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY)
        + eager.kernels * KERNEL_GAP_S;
    let dispatch_s = eager.kernels * DISPATCH_S;
    let compute_s = gpu_s.max(dispatch_s);
    let bubble_s = compute_s * (pp - 1.0) / m;

    // Data-parallel collectives of this rank's parameter slice.
    let dp_volume = zero_comm_volume(s.zero, s.grad_accum);
    let psi = w.trainable / (tp * pp);
    let gathered_bytes = if s.zero == ZeroStage::Zero3 {
        (w.frozen_bytes + w.trainable * p.weight as f64) / (tp * pp)
    } else {
        psi * p.weight as f64
    };
    let ring = (dp - 1.0) / dp;
    let dp_comm_bytes = ring
        * (dp_volume.reduce_psi as f64 * psi * p.grad as f64
            + dp_volume.gather_psi as f64 * gathered_bytes);
    let per_node = hw.gpus_per_node;
    let dp_bw = if s.tp * s.dp > per_node {
        hw.gpu.inter_node_bytes_per_s
    } else {
        hw.gpu.intra_node_bytes_per_s
    };
    let dp_comm_s = if s.dp > 1 { dp_comm_bytes / dp_bw } else { 0.0 };

    let tp_pp_comm_s = model_parallel_comm_s(model, s, hw);
    let offload_s = offload_s(s, hw, psi, gathered_bytes, p);

    let compute_total = compute_s + bubble_s;
    let step_s = compute_total.max(dp_comm_s) + tp_pp_comm_s + offload_s;
    let terms = [
        (compute_s, Bottleneck::Compute),
        (dp_comm_s, Bottleneck::DataParallelComm),
        (tp_pp_comm_s, Bottleneck::TensorParallelComm),
        (bubble_s, Bottleneck::PipelineBubble),
        (offload_s, Bottleneck::Offload),
    ];
    let bottleneck = terms
        .iter()
        .fold(terms[0], |a, &b| if b.0 > a.0 { b } else { a })
        .1;
    StepTime {
        step_s,
        compute_s,
        flops_per_rank,
        bubble_s,
        dp_comm_s,
        dp_comm_bytes,
        dp_volume,
        tp_pp_comm_s,
        offload_s,
        tokens_per_s: tokens_rank * dp / step_s,
        bottleneck,
    }
}

/// Fraction of the HBM bandwidth element-wise kernels and the optimizer reach (an assumption).
pub const BANDWIDTH_EFFICIENCY: f64 = 0.8;

/// Bytes element-wise kernels move per token, per layer, per element of `4·d_model + d_ff` (the
/// residual-stream tensors and the MLP's inner one) at 2-byte activations, forward and backward:
/// norms, casts, dropout, residual adds, activation functions, each its own eager kernel. Fitted
/// to the H200 calibration's step times (`shared/calibration`): GPT-2's HF block (NewGELU as eight
/// element-wise ops, three dropouts, LayerNorm) moves about twice a Llama block's (RMSNorm,
/// fused SiLU, no dropout).
const ELEMENTWISE_BYTES_GPT2: f64 = 220.0;
const ELEMENTWISE_BYTES_LLAMA: f64 = 106.0;

/// Bytes per token per vocabulary entry of the loss: the fp32 upcast of the logits, log-softmax
/// and its backward, and the cast back (about six fp32 passes).
const LOSS_BYTES_PER_VOCAB: f64 = 24.0;

/// Eager kernels per block per micro-batch, forward and backward (autograd nodes that launch),
/// and per step outside the blocks (embedding, loss, optimizer, zero_grad). Counted from HF's
/// GPT-2 and Llama modules.
const KERNELS_PER_BLOCK_GPT2: f64 = 105.0;
const KERNELS_PER_BLOCK_LLAMA: f64 = 90.0;
const KERNELS_PER_STEP: f64 = 200.0;

/// GPU time a kernel costs beyond its work (launch latency, tail), seconds.
pub const KERNEL_GAP_S: f64 = 5e-6;

/// Host time eager PyTorch spends dispatching one kernel (Python, the dispatcher, autograd),
/// seconds: the floor of small models' steps (GPT-2 124M: ~28 ms on the H200 at any batch up to 4).
pub const DISPATCH_S: f64 = 20e-6;

/// What eager PyTorch adds to the matmuls of one step of this rank.
struct Eager {
    elementwise_bytes: f64,
    optimizer_bytes: f64,
    kernels: f64,
}

fn eager_overheads(model: &ModelShape, s: &TrainSetup, w: &Work, reruns_blocks: bool) -> Eager {
    let gpt2 = model.family == plan::model::Family::Gpt2;
    let (per_elem, per_block) = if gpt2 {
        (ELEMENTWISE_BYTES_GPT2, KERNELS_PER_BLOCK_GPT2)
    } else {
        (ELEMENTWISE_BYTES_LLAMA, KERNELS_PER_BLOCK_LLAMA)
    };
    let split = (s.tp * s.pp) as f64;
    let m = s.grad_accum as f64;
    let tokens = (s.micro_batch * s.seq) as f64 * m;
    let layers = model.n_layers as f64;
    let rerun = if reruns_blocks { 4.0 / 3.0 } else { 1.0 };
    let d_ff = model
        .moe
        .as_ref()
        .map_or(model.d_ff, |x| x.d_ff_expert * x.n_active as u64);
    let width = (4 * model.d_model + d_ff) as f64;
    let es = act_bytes(s.precision) as f64 / 2.0;
    let elementwise = tokens * layers * per_elem * width * es * rerun
        + tokens * LOSS_BYTES_PER_VOCAB * model.vocab as f64;
    // The step reads weights, gradients, master copy and moments and writes all but the
    // gradients, over this rank's partition; on the host under offload.
    let p = Policy::of(s.precision);
    let moments = match s.optimizer {
        plan::setup::Optimizer::AdamW => 2.0 * p.moment as f64,
        plan::setup::Optimizer::AdamW8bit => 2.0,
        plan::setup::Optimizer::Sgd => p.moment as f64,
    };
    let per_param = 2.0 * (p.weight as f64 + p.master as f64 + moments) + p.grad as f64;
    let shard = if s.zero == ZeroStage::Zero0 {
        1.0
    } else {
        s.dp as f64
    };
    let optimizer = if s.offload == Offload::None {
        per_param * w.trainable / split / shard
    } else {
        0.0
    };
    Eager {
        elementwise_bytes: elementwise / split,
        optimizer_bytes: optimizer,
        kernels: m * (layers / s.pp as f64).ceil() * per_block * rerun + KERNELS_PER_STEP,
    }
}

/// Tensor-parallel all-reduces and pipeline sends of one step, seconds.
fn model_parallel_comm_s(model: &ModelShape, s: &TrainSetup, hw: &Hardware) -> f64 {
    let m = s.grad_accum as f64;
    let bsh = (s.micro_batch * s.seq * model.d_model * act_bytes(s.precision)) as f64;
    let mut secs = 0.0;
    if s.tp > 1 {
        let t = s.tp as f64;
        let reruns = plan::recompute::RecomputePlan::of(s.recompute, model.n_layers);
        let per_layer = if reruns.reruns_blocks() { 6.0 } else { 4.0 };
        let layers = (model.n_layers as f64 / s.pp as f64).ceil();
        let bytes = per_layer * layers * m * 2.0 * (t - 1.0) / t * bsh;
        secs += bytes / hw.gpu.intra_node_bytes_per_s;
    }
    if s.pp > 1 {
        let bw = if s.dp * s.tp * s.pp > hw.gpus_per_node {
            hw.gpu.inter_node_bytes_per_s
        } else {
            hw.gpu.intra_node_bytes_per_s
        };
        let split = if s.sp { s.tp as f64 } else { 1.0 };
        secs += 2.0 * m * bsh / split / bw;
    }
    secs
}

/// PCIe transfers and the host's Adam of one step (ZeRO-Offload, ZeRO-Infinity), seconds.
/// `psi` is the rank's trainable parameters, `weight_bytes` all its weights' bytes (frozen too).
fn offload_s(s: &TrainSetup, hw: &Hardware, psi: f64, weight_bytes: f64, p: Policy) -> f64 {
    if s.offload == Offload::None {
        return 0.0;
    }
    let dp = s.dp as f64;
    let shard = psi / dp;
    let mut bytes = shard * (p.grad + p.weight) as f64;
    if s.offload == Offload::Params {
        // Each rank fetches its weight shard for every forward and backward (then all-gathers).
        bytes += 2.0 * s.grad_accum as f64 * weight_bytes / dp;
    }
    let ranks_per_node = (s.dp * s.tp * s.pp).min(hw.gpus_per_node) as f64;
    let adam_s = shard * ranks_per_node / hw.host_adam_elems_per_s;
    bytes / hw.gpu.host_link_bytes_per_s + adam_s
}
