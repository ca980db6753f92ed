//! The typed contract between this runtime's plan and the engine: every buffer of a `frugal`
//! plan carries a [`Key`], and the engine's arena is indexed by it, so the engine asks for
//! `Key::Act(3, BlockTensor::Qkv)` and gets the very buffer the plan sized. A key the plan does
//! not hold is a programmer error the engine reports with the key; there are no string names to
//! mistype. `Display` gives the stable names reports, snapshots and timelines print
//! (`act.h.3.qkv`, `params.h.0`, `gather.fwd.embed`).
//!
//! Example: `Key::OptM(UnitKind::Block(0)).to_string()` is `"opt.m.h.0"`.

use crate::roles::{Role, UnitKind};
use crate::tensors::BlockTensor;
use std::fmt;

/// Gradient-of-activation scratch shared by every block's backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DAct {
    Ln,
    Qkv,
    /// Materialised attention only.
    Att,
    Atty,
    Fch,
    FchAct,
    /// Mixture of experts: the router logits' gradient (N, E).
    Probs,
    /// The gates' gradient (N·k).
    Gates,
    /// Multi-head latent attention: a latent's gradient after and before its norm (N·rank).
    LatentA,
    LatentB,
}

/// Workspaces of the bf16 path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// f32 output of a kernel before it is rounded into a bf16 tensor, or a bf16 input widened.
    F32,
    /// A saved bf16 matmul output (`qkv`, `fch`) widened for the f32 attention/activation kernel.
    F32In,
    /// The residual stream's f32 working rows under bf16 (`work.resid_in`: a block's input,
    /// then its output; `work.resid_mid`: `res2`).
    ResidIn,
    ResidMid,
    /// The bf16 embedding's backward: the micro-batch's positions sorted by token (u32), so
    /// each table row's part is summed in f32 and rounded once into its 2-byte gradient.
    EmbedOrder,
    /// LoRA: one frozen HF linear dequantized to f32 for its GEMM (forward and backward).
    Dequant,
    /// LoRA: the gradient of an adapter's rank-sized output, `du` (N, r·parts).
    LoraDu,
    /// LoRA dropout: an adapter's dropped input (N, IC), rebuilt from its seed in the backward.
    LoraDropped,
    /// LoRA dropout: the adapter's input gradient before the mask (N, IC).
    LoraDx,
    /// The backward GEMMs' bf16 output gradient and its transpose (the weight and the saved
    /// input are read where they lie).
    BwDout,
    BwDoutT,
    /// Mixture of experts: a matmul input (or output gradient) gathered into expert order
    /// (N·k, C), in the matmul inputs' type.
    MoeIn,
    /// The experts' outputs (and, in the backward, their input gradients) in expert order
    /// (N·k, C), f32.
    MoeOut,
    /// The load-balancing loss's statistics over one micro-step's forward: per expert the
    /// selection count, the probability sum and the probabilities' gradient (3E).
    MoeAux,
    /// Multi-head latent attention's queries (N, NH·(nope + rope)) before they join the fused
    /// rows, and their gradient.
    MlaQ,
    /// The key/value expansion (N, NH·(nope + v)) and its gradient.
    MlaKv,
    /// `kv_a_proj_with_mqa`'s output (N, kv_rank + rope) and its gradient.
    MlaCkv,
    /// Tensor parallelism: the vocab-parallel cross-entropy's per-row statistics over a chunk
    /// of logits (the row maximum, the sum of exponentials, the target's logit), reduced over
    /// the tensor-parallel ranks.
    TpStats,
    /// Sequence parallelism: a norm's output gathered whole (the matmul inputs' type), a
    /// projection's partial sum or a gathered gradient (f32, N × C), and a norm's weight and
    /// bias gradient before the ranks' sum (2C).
    SpGather,
    SpFull,
    SpDnorm,
    /// Tensor parallelism with fewer key/value heads than ranks: a block's replicated key and
    /// value rows' gradient (weights, then biases) set aside while one micro-step's is summed
    /// over the ranks that share the head.
    TpKv,
    /// Pipeline parallelism: both halves of one exchange with a neighbouring stage (what this
    /// stage sends and what it receives: a boundary activation or its gradient).
    PpExchange,
}

/// Which inference step a scratch buffer serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Up to a prefill chunk of one sequence's tokens.
    Prefill,
    /// One token of each running sequence.
    Decode,
}

/// The scratch tensors of one inference step (every block reuses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepAct {
    Tokens,
    /// The residual stream.
    Residual,
    Ln,
    Rstd,
    Mean,
    Qkv,
    Atty,
    /// A projection's output before it joins the residual stream.
    Proj,
    Fch,
    FchAct,
    Logits,
    /// Split-K attention's partial (max, sum, accumulator) triples.
    Partials,
    /// Mixture of experts: the router's probabilities, routing tables (u32), gates, and the
    /// rows in expert order (inputs, outputs).
    Probs,
    Route,
    Gates,
    MoeIn,
    MoeOut,
    /// Latent attention: `kv_a_proj_with_mqa`'s rows (latent | RoPE key), and the query
    /// bottleneck's (or the latent's, for its norm).
    Latent,
    QLatent,
}

impl StepAct {
    pub const ALL: [StepAct; 19] = [
        StepAct::Tokens,
        StepAct::Residual,
        StepAct::Ln,
        StepAct::Rstd,
        StepAct::Mean,
        StepAct::Qkv,
        StepAct::Atty,
        StepAct::Proj,
        StepAct::Fch,
        StepAct::FchAct,
        StepAct::Logits,
        StepAct::Partials,
        StepAct::Probs,
        StepAct::Route,
        StepAct::Gates,
        StepAct::MoeIn,
        StepAct::MoeOut,
        StepAct::Latent,
        StepAct::QLatent,
    ];

    fn suffix(self) -> &'static str {
        match self {
            StepAct::Tokens => "tokens",
            StepAct::Residual => "residual",
            StepAct::Ln => "ln",
            StepAct::Rstd => "rstd",
            StepAct::Mean => "mean",
            StepAct::Qkv => "qkv",
            StepAct::Atty => "atty",
            StepAct::Proj => "proj",
            StepAct::Fch => "fch",
            StepAct::FchAct => "fch_act",
            StepAct::Logits => "logits",
            StepAct::Partials => "partials",
            StepAct::Probs => "probs",
            StepAct::Route => "route",
            StepAct::Gates => "gates",
            StepAct::MoeIn => "moe_in",
            StepAct::MoeOut => "moe_out",
            StepAct::Latent => "latent",
            StepAct::QLatent => "q_latent",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::TokenEmbedding => "wte",
            Role::PositionEmbedding => "wpe",
            Role::Norm1Weight => "ln1_w",
            Role::Norm1Bias => "ln1_b",
            Role::QkvWeight => "qkv_w",
            Role::QkvBias => "qkv_b",
            Role::AttnProjWeight => "attn_proj_w",
            Role::AttnProjBias => "attn_proj_b",
            Role::Norm2Weight => "ln2_w",
            Role::Norm2Bias => "ln2_b",
            Role::FcWeight => "fc_w",
            Role::FcBias => "fc_b",
            Role::FcProjWeight => "fc_proj_w",
            Role::FcProjBias => "fc_proj_b",
            Role::FinalNormWeight => "lnf_w",
            Role::FinalNormBias => "lnf_b",
            Role::LmHead => "lm_head",
            Role::RouterWeight => "router_w",
            Role::ExpertsFcWeight => "experts_fc_w",
            Role::ExpertsProjWeight => "experts_proj_w",
            Role::SharedFcWeight => "shared_fc_w",
            Role::SharedProjWeight => "shared_proj_w",
            Role::MlaQ => "q_w",
            Role::MlaQa => "q_a_w",
            Role::MlaQaNorm => "q_a_norm_w",
            Role::MlaQb => "q_b_w",
            Role::MlaKva => "kv_a_w",
            Role::MlaKvNorm => "kv_a_norm_w",
            Role::MlaKvb => "kv_b_w",
            Role::LoraA(i) => return write!(f, "lora_a.{i}"),
            Role::LoraB(i) => return write!(f, "lora_b.{i}"),
        })
    }
}

/// One buffer of a `frugal` plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// A unit's full working weights (stages 0-2).
    Params(UnitKind),
    /// A rank's shard of a unit's weights (stage 3).
    ParamsShard(UnitKind),
    /// A unit's full gradient (persistent at stages 0-1 in fp32, a span otherwise).
    Grads(UnitKind),
    /// A unit's gradient accumulator (the shard at stages 2-3, 2-byte and whole at 0-1).
    GradsShard(UnitKind),
    /// fp32 master weights (2-byte precisions).
    Master(UnitKind),
    OptM(UnitKind),
    OptV(UnitKind),
    OptMomentum(UnitKind),
    /// A unit gathered (and widened) for its forward.
    GatherFwd(UnitKind),
    /// Block `l` gathered for its backward (and its segment's recompute).
    GatherBwd(u32),
    /// The tied token embedding gathered for the head.
    GatherHeadEmbed,
    /// 2-byte units (`ActPolicy`'s `bf16_units`): a unit's vectors (`Unit::vectors`, norm
    /// weights and biases) widened to fp32 for its forward, from the working copy or (stage 3)
    /// beside its bits gathered.
    VectorsFwd(UnitKind),
    /// The same for block `l`'s backward.
    VectorsBwd(u32),
    /// 2-byte units: the fp32 gradient of a unit's vectors while the backward writes it,
    /// rounded into the unit's 2-byte gradient at the end of its last phase.
    GradVectors(UnitKind),
    Tokens,
    Targets,
    /// The embedding's output: block 0's input.
    Encoded,
    /// Block `l`'s tensor as its backward reads it.
    Act(u32, BlockTensor),
    /// The forward pass's copy of a tensor the backward recomputes.
    ActFwd(u32, BlockTensor),
    /// Block `l`'s output (block `l + 1`'s input) as the backward reads it.
    BlockOut(u32),
    /// The forward's copy of an output inside a recompute segment.
    BlockOutFwd(u32),
    Lnf,
    LnfMean,
    LnfRstd,
    Losses,
    DLnf,
    /// The fused classifier's chunk of logits.
    Classifier,
    /// The residual stream's gradient, from the head down to the embedding.
    DResidual,
    DAct(DAct),
    Work(Work),
    /// LoRA: a unit's frozen fp32 tensors (embeddings, norms, biases; block matrices apart).
    Base(UnitKind),
    /// LoRA: block `l`'s frozen matrix of `role` in the base format (every HF part in turn).
    Frozen(u32, Role),
    /// LoRA: block `l`'s adapter outputs u = x·Aᵀ (N, r·parts) at the linear of `role`, as
    /// the backward reads them.
    LoraU(u32, Role),
    /// The forward's copy of `LoraU` when the backward recomputes it.
    LoraUFwd(u32, Role),
    /// Inference: a weight matrix in its storage format (codes, or the values themselves).
    QWeight(UnitKind, Role),
    /// Its scales (per row or per group).
    QScales(UnitKind, Role),
    /// Its zero points (asymmetric int4).
    QZeros(UnitKind, Role),
    /// Inference: a unit's fp32 vectors (norms, biases, learned positions), in view order.
    Vectors(UnitKind),
    /// Layer `l`'s paged key cache.
    KvK(u32),
    KvV(u32),
    /// Per token and head scales of a quantized key (value) cache.
    KvKScales(u32),
    KvVScales(u32),
    /// An inference step's scratch.
    Step(StepKind, StepAct),
    /// Pipeline parallelism: slot `k` of a stage's stash of in-flight micro-batches' saved
    /// activations.
    Stash(u32),
}

impl fmt::Display for UnitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitKind::Embed => f.write_str("embed"),
            UnitKind::Block(l) => write!(f, "h.{l}"),
            UnitKind::Head => f.write_str("head"),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Params(u) => write!(f, "params.{u}"),
            Key::ParamsShard(u) => write!(f, "params.shard.{u}"),
            Key::Grads(u) => write!(f, "grads.{u}"),
            Key::GradsShard(u) => write!(f, "grads.shard.{u}"),
            Key::Master(u) => write!(f, "master.{u}"),
            Key::OptM(u) => write!(f, "opt.m.{u}"),
            Key::OptV(u) => write!(f, "opt.v.{u}"),
            Key::OptMomentum(u) => write!(f, "opt.momentum.{u}"),
            Key::GatherFwd(u) => write!(f, "gather.fwd.{u}"),
            Key::GatherBwd(l) => write!(f, "gather.bwd.h.{l}"),
            Key::GatherHeadEmbed => f.write_str("gather.head.embed"),
            Key::VectorsFwd(u) => write!(f, "gather.fwd.{u}.vectors"),
            Key::VectorsBwd(l) => write!(f, "gather.bwd.h.{l}.vectors"),
            Key::GradVectors(u) => write!(f, "grads.{u}.vectors"),
            Key::Tokens => f.write_str("batch.tokens"),
            Key::Targets => f.write_str("batch.targets"),
            Key::Encoded => f.write_str("act.encoded"),
            Key::Act(l, t) => write!(f, "act.h.{l}.{}", t.suffix()),
            Key::ActFwd(l, t) => write!(f, "act.h.{l}.fwd.{}", t.suffix()),
            Key::BlockOut(l) => write!(f, "act.h.{l}.out"),
            Key::BlockOutFwd(l) => write!(f, "act.h.{l}.out_fwd"),
            Key::Lnf => f.write_str("act.lnf"),
            Key::LnfMean => f.write_str("act.lnf_mean"),
            Key::LnfRstd => f.write_str("act.lnf_rstd"),
            Key::Losses => f.write_str("act.losses"),
            Key::DLnf => f.write_str("dact.lnf"),
            Key::Classifier => f.write_str("work.classifier"),
            Key::DResidual => f.write_str("dact.residual"),
            Key::Stash(k) => write!(f, "act.stash.{k}"),
            Key::DAct(d) => f.write_str(match d {
                DAct::Ln => "dact.ln",
                DAct::Qkv => "dact.qkv",
                DAct::Att => "dact.att",
                DAct::Atty => "dact.atty",
                DAct::Fch => "dact.fch",
                DAct::FchAct => "dact.fch_act",
                DAct::Probs => "dact.probs",
                DAct::Gates => "dact.gates",
                DAct::LatentA => "dact.latent_a",
                DAct::LatentB => "dact.latent_b",
            }),
            Key::Base(u) => write!(f, "base.{u}"),
            Key::Frozen(l, r) => write!(f, "base.h.{l}.{r}"),
            Key::LoraU(l, r) => write!(f, "act.h.{l}.lora_u.{r}"),
            Key::LoraUFwd(l, r) => write!(f, "act.h.{l}.fwd.lora_u.{r}"),
            Key::QWeight(u, r) => write!(f, "weights.{u}.{r}"),
            Key::QScales(u, r) => write!(f, "weights.{u}.{r}.scales"),
            Key::QZeros(u, r) => write!(f, "weights.{u}.{r}.zeros"),
            Key::Vectors(u) => write!(f, "weights.{u}.vectors"),
            Key::KvK(l) => write!(f, "kv.h.{l}.k"),
            Key::KvV(l) => write!(f, "kv.h.{l}.v"),
            Key::KvKScales(l) => write!(f, "kv.h.{l}.k_scales"),
            Key::KvVScales(l) => write!(f, "kv.h.{l}.v_scales"),
            Key::Step(k, t) => write!(
                f,
                "step.{}.{}",
                match k {
                    StepKind::Prefill => "prefill",
                    StepKind::Decode => "decode",
                },
                t.suffix()
            ),
            Key::Work(w) => f.write_str(match w {
                Work::F32 => "work.f32",
                Work::F32In => "work.f32_in",
                Work::EmbedOrder => "work.embed_order",
                Work::ResidIn => "work.resid_in",
                Work::ResidMid => "work.resid_mid",
                Work::Dequant => "work.dequant",
                Work::LoraDu => "work.lora_du",
                Work::LoraDropped => "work.lora_dropped",
                Work::LoraDx => "work.lora_dx",
                Work::BwDout => "work.bw.dout",
                Work::BwDoutT => "work.bw.dout_t",
                Work::MoeIn => "work.moe_in",
                Work::MoeOut => "work.moe_out",
                Work::MoeAux => "work.moe_aux",
                Work::TpStats => "work.tp_stats",
                Work::SpGather => "work.sp_gather",
                Work::SpFull => "work.sp_full",
                Work::SpDnorm => "work.sp_dnorm",
                Work::PpExchange => "work.pp_exchange",
                Work::TpKv => "work.tp_kv",
                Work::MlaQ => "work.mla_q",
                Work::MlaKv => "work.mla_kv",
                Work::MlaCkv => "work.mla_ckv",
            }),
        }
    }
}
