//! Activation buffers of one micro-step, llm.c style: what each block saves for its backward, what
//! the backward recomputes instead (and when), the gradient-of-activation scratch, the fused
//! classifier's chunk scratch and the token batch.
//!
//! Names are stable: the engine asks its arena for `act.h.3.qkv` and gets the very buffer listed
//! here, so the sizes below ARE the engine's allocation sizes. Lifetimes follow the step timeline.
//! Without recompute, block `l` saves its tensors in `Forward(l)` and frees them after
//! `Backward(l)`; its output is the next block's input and lives until `Backward(l + 1)` (or the
//! head). With a segment policy (`full` = `every:1`, `every:K`, `sqrt`) the blocks form segments
//! of K from block 0; only each segment's input is kept (the previous segment's last output, or
//! `act.encoded`). The backward of a segment's last block recomputes the whole segment at once, so
//! all its tensors are born in that `Backward(last)` and each dies after its own block's backward.
//! `keep-matmuls` keeps the matmul outputs (`qkv`, `res2`, `fch`) and recomputes the norms, the
//! attention core and the MLP activation in each block's own backward; `selective` (Megatron's)
//! recomputes only the attention probabilities `att`, so under flash attention it keeps what
//! `none` keeps (see `plan::recompute`). In the forward pass a
//! block writes the tensors that will be recomputed into `act.h.l.fwd.*`, live in `Forward(l)`
//! only, and an output inside a segment into `act.h.l.out_fwd`, live until the next block has
//! read it. Flash attention keeps `lse` (B, NH, T) instead of the probabilities `att` (B, NH, T, T),
//! and its backward needs no `dact.att`.
//!
//! This module does not decide offsets (see `layout`) nor parameter buffers (see `units`).
//!
//! Example: GPT-2 tiny at batch 2, seq 8 saves `act.h.0.att` of 2·NH·8·8 f32; under
//! `every:2` on 4 blocks, `act.h.0.qkv` lives from `Backward(1)` to `Backward(0)`.

use super::key::{DAct, Key, Work};
use plan::buffer::{Buffer, Category, Device, Lifetime, Phase};
use plan::recompute::{Kept, RecomputePlan};
use plan::setup::{Attention, Precision, Recompute, TrainSetup};
use plan::ModelShape;

/// Rows of logits the fused classifier materialises at a time: enough rows for both cores to
/// share a GEMM, few enough that chunk × V stays a few MiB even for a 128k vocabulary. The loss
/// never holds more logits than this (no B×T×V tensor exists in any plan).
pub const CLASSIFIER_CHUNK_ROWS: u64 = 64;

/// The sizes the activation plan depends on.
#[derive(Clone, Copy, Debug)]
pub struct ActShape {
    pub batch: u64,
    pub seq: u64,
}

/// What the activation plan keeps and recomputes: the recompute policy and the attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActPolicy {
    pub recompute: Recompute,
    pub attention: Attention,
    /// Whether the tensors that feed a matmul (`ln1`, `atty`, `ln2`, `fch_act`) and the matmul
    /// outputs the backward re-reads (`qkv`, `fch`) are stored as bf16 (`--precision bf16`):
    /// 2 bytes each, written through the f32 scratch `work.f32` and widened back into
    /// `work.f32_in` for the f32 attention and activation kernels. The residual stream (block
    /// outputs, `res2`) is saved in bf16 too, as Megatron does ([`ActPolicy::residual_bytes`]):
    /// each add runs in f32 (`work.resid_in`, `work.resid_mid`) and rounds once.
    pub bf16_matmul_inputs: bool,
    /// Sequence parallelism (Megatron): the tensor-parallel degree the norms' region (the
    /// residual stream, the norms' outputs and statistics) is split over along the rows; 1
    /// without it.
    pub seq_shards: u64,
    /// The 2-byte weights are the working copy, whole on every rank (`bf16_units` below ZeRO
    /// stage 3); at stage 3 the kernels read each unit's bits as gathered.
    pub bf16_in_place: bool,
    /// The classifier runs on bf16 operands (`kernels::classifier::bf16`; vocab-parallel under
    /// tensor parallelism), reading its weight's 2-byte working copy in place
    /// (`bf16_in_place`), or at stage 3 the 2-byte bits gathered, never widened (the tied
    /// embedding's `gather.head.embed`, or the untied head unit's `gather.fwd.head` with its
    /// final-norm vectors widened into `gather.head.vectors`): `--precision bf16` without LoRA,
    /// at every stage alike. The chunk scratch is [`classifier_row_bytes`] a row. The tables
    /// (the embedding, an untied head) are then read and written in 2 bytes only: the embedding
    /// forward reads the working copy (stage 3: its bits gathered), and their gradients are
    /// 2-byte, written directly (`shards::direct_grads`).
    pub bf16_units: bool,
}

impl ActPolicy {
    /// No recompute, materialised attention.
    pub const PLAIN: ActPolicy = ActPolicy {
        recompute: Recompute::None,
        attention: Attention::Eager,
        bf16_matmul_inputs: false,
        seq_shards: 1,
        bf16_in_place: false,
        bf16_units: false,
    };

    pub fn of(setup: &TrainSetup) -> ActPolicy {
        // LoRA keeps its activations f32 (the frozen GEMMs run in f32 on dequantized tiles);
        // bf16 there means 2-byte adapters with fp32 masters.
        let bf16 = setup.precision == Precision::Bf16 && setup.lora.is_none();
        let in_place = bf16 && setup.zero != plan::setup::ZeroStage::Zero3;
        ActPolicy {
            recompute: setup.recompute,
            attention: setup.attention,
            bf16_matmul_inputs: bf16,
            seq_shards: if setup.sp { u64::from(setup.tp) } else { 1 },
            bf16_in_place: in_place,
            bf16_units: bf16,
        }
    }

    /// Bytes per element of block tensor `t` under this policy: the matmul inputs and outputs
    /// the backward reads and the residual stream's `res2` in bf16, as Megatron saves them.
    pub fn elem_bytes(self, t: BlockTensor) -> u64 {
        let saved_bf16 = t.is_matmul_input() || t.is_matmul_output() || t == BlockTensor::Res2;
        if self.bf16_matmul_inputs && saved_bf16 {
            2
        } else {
            4
        }
    }

    /// Bytes per element of the residual stream as saved between blocks (`act.encoded`, each
    /// block's output): 2 under bf16 (each block's adds run in f32 and round once).
    pub fn residual_bytes(self) -> u64 {
        match self.bf16_matmul_inputs {
            true => 2,
            false => 4,
        }
    }

    /// First and last block of the recompute segment holding `layer`, for the segment policies
    /// (`full`, `every:K`, `sqrt`); `None` for `none`, `selective` and `keep-matmuls`.
    pub fn segment(self, n_layers: u32, layer: u32) -> Option<(u32, u32)> {
        RecomputePlan::of(self.recompute, n_layers).segment(layer)
    }

    /// Whether the backward recomputes `tensor` rather than reading what the forward saved.
    pub fn recomputes(self, tensor: BlockTensor) -> bool {
        let plan = RecomputePlan::of(self.recompute, 1);
        if plan.reruns_blocks() {
            return true;
        }
        match plan.kept {
            Kept::Everything => false,
            Kept::AllButAttentionCore => tensor == BlockTensor::Att,
            Kept::MatmulOutputs => tensor.keep_matmuls_recomputes(),
        }
    }
}

fn span(born: Phase, dies: Phase) -> Lifetime {
    Lifetime::Span { born, dies }
}

/// Bytes of the classifier's scratch per row of its chunk: V f32 logits (under
/// [`ActPolicy::bf16_units`] later both layouts of the bf16 logit gradient, over the dead
/// logits), and under `bf16_units` C bf16 inputs too.
pub fn classifier_row_bytes(m: &ModelShape, policy: ActPolicy) -> u64 {
    match policy.bf16_units {
        true => 4 * m.vocab + 2 * m.d_model,
        false => 4 * m.vocab,
    }
}

fn f32_buffer(key: Key, category: Category, numel: u64, lifetime: Lifetime) -> Buffer {
    sized_buffer(key, category, 4 * numel, lifetime)
}

fn sized_buffer(key: Key, category: Category, bytes: u64, lifetime: Lifetime) -> Buffer {
    Buffer::keyed(key, category, Device::Gpu, bytes, lifetime)
}

/// Every activation-side buffer of one micro-step under `policy`, on the device.
pub fn activation_buffers(m: &ModelShape, s: ActShape, policy: ActPolicy) -> Vec<Buffer> {
    let d = BlockDims::new(m, s).sequence_parallel(policy.seq_shards);
    let act = Category::Activations;
    let mut out = vec![
        // Token ids are u32: the same 4 bytes as an f32.
        f32_buffer(Key::Tokens, act, d.n, Lifetime::Persistent),
        f32_buffer(Key::Targets, act, d.n, Lifetime::Persistent),
        // Block 0's input: the first recompute segment's kept input too.
        sized_buffer(
            Key::Encoded,
            act,
            policy.residual_bytes() * d.local * d.c,
            span(Phase::Embed, Phase::Backward(0)),
        ),
    ];
    if policy.seq_shards > 1 {
        out.extend(sp_scratch(&d, policy));
    }
    for layer in 0..m.n_layers {
        let own = BlockDims::layer(m, s, layer).sequence_parallel(policy.seq_shards);
        out.extend(block_buffers(m, &own, policy, layer));
        out.extend(forward_scratch(&own, policy, layer));
    }
    out.extend(head_buffers(m, &d, policy));
    out.extend(backward_scratch(m, &d, policy.attention));
    let moe_life = span(Phase::Forward(0), Phase::Backward(0));
    out.extend(moe_scratch(
        &d,
        policy,
        moe_life,
        span(Phase::Embed, Phase::Backward(0)),
    ));
    out.extend(mla_scratch(&d, moe_life));
    if policy.bf16_matmul_inputs {
        out.extend(bf16_scratch(&d));
        out.extend(bf16_backward_scratch(m, &d));
    }
    if policy.bf16_units {
        // The 2-byte embedding gradient's sort of the positions by token (u32).
        let key = Key::Work(Work::EmbedOrder);
        let life = span(Phase::EmbedBackward, Phase::EmbedBackward);
        out.push(f32_buffer(key, Category::Other, d.n, life));
    }
    out
}

/// Sequence parallelism's workspaces: `work.sp_gather`, a norm's output gathered whole for the
/// column-parallel GEMM (and again for its backward), in the matmul inputs' type; `work.sp_full`
/// (f32), a row-parallel projection's partial sum before its reduce-scatter, the embedding's
/// before its own, and in the backward the residual gradient gathered whole; `work.sp_dnorm`
/// (2C), a norm's weight and bias gradient over this rank's rows, summed over the ranks before
/// it joins the gradient.
fn sp_scratch(d: &BlockDims, policy: ActPolicy) -> [Buffer; 3] {
    let life = span(Phase::Embed, Phase::EmbedBackward);
    let other = Category::Other;
    let gather = policy.elem_bytes(BlockTensor::Ln1) * d.n * d.c;
    let dnorm = span(Phase::Head, Phase::Backward(0));
    [
        sized_buffer(Key::Work(Work::SpGather), other, gather, life),
        f32_buffer(Key::Work(Work::SpFull), other, d.n * d.c, life),
        f32_buffer(Key::Work(Work::SpDnorm), other, 2 * d.c, dnorm),
    ]
}

/// With bf16 activations: `work.f32`, where the f32 kernels producing a bf16 tensor write it
/// before it is rounded (and where the backward widens a matmul input back for an f32 kernel),
/// `work.f32_in`, where a saved bf16 `qkv` or `fch` is widened for the f32 attention or
/// activation kernel while that kernel writes `work.f32`, and the residual stream's two f32
/// working rows (`work.resid_in`: a block's input, then its output; `work.resid_mid`: `res2`),
/// where the adds and norms run before each is rounded into its saved bf16 tensor. All live
/// from the embedding to its backward (recompute runs block forwards inside the backward; the
/// norms' backwards widen their saved input there). No weight is ever rounded: the GEMMs read
/// the 2-byte weights where they lie (`ActPolicy::bf16_units`).
fn bf16_scratch(d: &BlockDims) -> Vec<Buffer> {
    let life = span(Phase::Embed, Phase::EmbedBackward);
    let outputs = d.qkv.max(d.fc).max(2 * d.shared);
    // Latent attention's normed latents are matmul inputs too.
    let latents = d.mla.map_or(0, |a| a.kv_rank.max(a.q_rank.unwrap_or(0)));
    // The MLP's activation (and the gates' gradient) runs on all routed rows at once.
    let widest = d.c.max(d.atty).max(d.fc_act).max(outputs).max(latents);
    let rows = (d.n * widest).max(d.routed() * d.fc_act);
    let widened = (d.n * outputs).max(d.routed() * d.fc);
    vec![
        f32_buffer(Key::Work(Work::F32), Category::Other, rows, life),
        f32_buffer(Key::Work(Work::F32In), Category::Other, widened, life),
        f32_buffer(
            Key::Work(Work::ResidIn),
            Category::Other,
            d.local * d.c,
            life,
        ),
        f32_buffer(
            Key::Work(Work::ResidMid),
            Category::Other,
            d.local * d.c,
            life,
        ),
    ]
}

/// With bf16 matmul inputs, the backward GEMMs' 2-byte output gradient: `work.bw.dout` (a
/// matmul's output gradient rounded) and `work.bw.dout_t` (its transpose, the reduction over
/// rows of the weight gradient); the weight and the saved input are read where they lie
/// (`gemm_bf16::gemm_nn`). They live through the block backwards only.
fn bf16_backward_scratch(m: &ModelShape, d: &BlockDims) -> [Buffer; 2] {
    let life = span(Phase::Backward(m.n_layers - 1), Phase::Backward(0));
    // An expert's rows are at most N (a token picks an expert once).
    let out_rows = d.n * d.widest_out();
    let other = Category::Other;
    [
        sized_buffer(Key::Work(Work::BwDout), other, 2 * out_rows, life),
        sized_buffer(Key::Work(Work::BwDoutT), other, 2 * out_rows, life),
    ]
}

/// Block `layer`'s saved (or recomputed) tensors and its output, with their lifetimes.
fn block_buffers(m: &ModelShape, d: &BlockDims, policy: ActPolicy, layer: u32) -> Vec<Buffer> {
    let act = Category::Activations;
    let segment = policy.segment(m.n_layers, layer);
    // A segment's tensors are all recomputed in the backward of its last block.
    let recomputed_at = Phase::Backward(segment.map_or(layer, |(_, last)| last));
    let mut out: Vec<Buffer> = BlockTensor::ALL
        .into_iter()
        .filter_map(|t| {
            let numel = d.numel(t, policy.attention)?;
            let born = if policy.recomputes(t) {
                recomputed_at
            } else {
                Phase::Forward(layer)
            };
            let life = span(born, Phase::Backward(layer));
            let bytes = policy.elem_bytes(t) * numel;
            Some(sized_buffer(Key::Act(layer, t), act, bytes, life))
        })
        .collect();
    // The output feeds the next block, whose backward reads it (norm backward, recompute).
    let read_until = if layer == m.n_layers - 1 {
        Phase::Head
    } else {
        Phase::Backward(layer + 1)
    };
    let key = Key::BlockOut(layer);
    let bytes = policy.residual_bytes() * d.local * d.c;
    match segment {
        Some((_, last)) if last != layer => {
            // Inside a segment: the forward's copy lives until the next block has read it;
            // the backward's is recomputed with the rest of the segment.
            let fwd = span(Phase::Forward(layer), Phase::Forward(layer + 1));
            out.push(sized_buffer(Key::BlockOutFwd(layer), act, bytes, fwd));
            let bwd = span(Phase::Backward(last), read_until);
            out.push(sized_buffer(key, act, bytes, bwd));
        }
        _ => {
            let life = span(Phase::Forward(layer), read_until);
            out.push(sized_buffer(key, act, bytes, life));
        }
    }
    out
}

/// Where block `layer`'s forward pass writes the tensors the backward recomputes: they live only
/// in `Forward(layer)`, so consecutive blocks reuse the same bytes.
fn forward_scratch(d: &BlockDims, policy: ActPolicy, layer: u32) -> Vec<Buffer> {
    let life = span(Phase::Forward(layer), Phase::Forward(layer));
    BlockTensor::ALL
        .into_iter()
        .filter(|&t| policy.recomputes(t))
        .filter_map(|t| {
            let numel = d.numel(t, policy.attention)?;
            let bytes = policy.elem_bytes(t) * numel;
            Some(sized_buffer(
                Key::ActFwd(layer, t),
                Category::Activations,
                bytes,
                life,
            ))
        })
        .collect()
}

/// The head's forward-and-backward buffers: final norm, losses, its input gradient, the
/// classifier's chunk of logits (at most `CLASSIFIER_CHUNK_ROWS` × V: never B×T×V).
fn head_buffers(m: &ModelShape, d: &BlockDims, policy: ActPolicy) -> Vec<Buffer> {
    let act = Category::Activations;
    let head = span(Phase::Head, Phase::Head);
    let chunk_rows = CLASSIFIER_CHUNK_ROWS.min(d.n);
    let mut out = vec![
        // Sequence parallelism: the final norm runs on this rank's rows, written into its part
        // of `act.lnf`, which is then gathered whole for the classifier.
        f32_buffer(Key::Lnf, act, d.n * d.c, head),
        f32_buffer(Key::LnfRstd, act, d.local, head),
        f32_buffer(Key::Losses, act, d.n, head),
        f32_buffer(Key::DLnf, act, d.n * d.c, head),
        sized_buffer(
            Key::Classifier,
            Category::Other,
            chunk_rows * classifier_row_bytes(m, policy),
            head,
        ),
        // The residual stream's gradient, from the head down to the embedding.
        f32_buffer(
            Key::DResidual,
            act,
            d.local * d.c,
            span(Phase::Head, Phase::EmbedBackward),
        ),
    ];
    if d.has_mean {
        out.push(f32_buffer(Key::LnfMean, act, d.local, head));
    }
    out
}

/// Mixture of experts: the expert-order rows every MoE block's matmuls read and write
/// (`work.moe_in` in the matmul inputs' type, `work.moe_out` f32), live over `rows`, and the
/// load-balancing statistics and their gradient (`work.moe_aux`, 3E), live over `aux`. Nothing for a dense model.
pub fn moe_scratch(d: &BlockDims, policy: ActPolicy, rows: Lifetime, aux: Lifetime) -> Vec<Buffer> {
    if d.experts == 0 {
        return Vec::new();
    }
    let other = Category::Other;
    let in_bytes = policy.elem_bytes(BlockTensor::Ln2);
    vec![
        sized_buffer(
            Key::Work(Work::MoeIn),
            other,
            in_bytes * d.routed() * d.c,
            rows,
        ),
        f32_buffer(Key::Work(Work::MoeOut), other, d.routed() * d.c, rows),
        f32_buffer(Key::Work(Work::MoeAux), other, 3 * d.experts, aux),
    ]
}

/// Multi-head latent attention's row buffers, live over `life`: the queries before they join the
/// fused q|k|v rows (`work.mla_q`, N·NH·(nope + rope); the padded attention output's gradient and
/// the queries' gradient in the backward), the key/value expansion (`work.mla_kv`) and the
/// latent with the shared RoPE key (`work.mla_ckv`), and their gradients. Nothing without MLA.
pub fn mla_scratch(d: &BlockDims, life: Lifetime) -> Vec<Buffer> {
    let Some(a) = d.mla else {
        return Vec::new();
    };
    let other = Category::Other;
    vec![
        f32_buffer(Key::Work(Work::MlaQ), other, d.n * a.heads * a.qk(), life),
        f32_buffer(Key::Work(Work::MlaKv), other, d.n * a.kv(), life),
        f32_buffer(Key::Work(Work::MlaCkv), other, d.n * a.ckv(), life),
    ]
}

/// Gradient-of-activation scratch shared by every block's backward (zeroed before each use).
/// Flash attention's backward recomputes probabilities tile by tile: no `dact.att`.
fn backward_scratch(m: &ModelShape, d: &BlockDims, attention: Attention) -> Vec<Buffer> {
    let act = Category::Activations;
    let life = span(Phase::Backward(m.n_layers - 1), Phase::Backward(0));
    let datt = (attention == Attention::Eager).then_some((DAct::Att, d.att));
    let moe = d.experts > 0;
    let latent = d.mla.map(|a| d.n * a.kv_rank.max(a.q_rank.unwrap_or(0)));
    [
        Some((DAct::Ln, d.n * d.c)),
        Some((DAct::Qkv, d.n * d.qkv)),
        datt,
        Some((DAct::Atty, d.n * d.atty)),
        // The shared experts' MLP runs its backward in the same scratch (N rows).
        Some((DAct::Fch, (d.routed() * d.fc).max(d.n * 2 * d.shared))),
        Some((DAct::FchAct, (d.routed() * d.fc_act).max(d.n * d.shared))),
        moe.then_some((DAct::Probs, d.n * d.experts)),
        moe.then_some((DAct::Gates, d.routed())),
        latent.map(|e| (DAct::LatentA, e)),
        latent.map(|e| (DAct::LatentB, e)),
    ]
    .into_iter()
    .flatten()
    .map(|(k, e)| f32_buffer(Key::DAct(k), act, e, life))
    .collect()
}

mod dims;
mod tensors;
pub use dims::{BlockDims, MlaDims};
pub use tensors::BlockTensor;

#[cfg(test)]
mod tests;
