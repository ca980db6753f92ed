//! The typed contract between this runtime's plan and the engine: every buffer of a `frugal`
//! plan carries a [`Key`], and the engine's arena is indexed by it, so the engine asks for
//! `Key::Act(3, BlockTensor::Qkv)` and gets the very buffer the plan sized. A key the plan does
//! not hold is a programmer error the engine reports with the key; there are no string names to
//! mistype. `Display` gives the stable names reports, snapshots and timelines print
//! (`act.h.3.qkv`, `params.h.0`, `gather.fwd.embed`).
//!
//! Example: `Key::OptM(UnitKind::Block(0)).to_string()` is `"opt.m.h.0"`.

use super::acts::BlockTensor;
use super::units::UnitKind;
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
}

/// Workspaces of the bf16 path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// f32 output of a kernel before it is rounded into a bf16 tensor, or a bf16 input widened.
    F32,
    /// A saved bf16 matmul output (`qkv`, `fch`) widened for the f32 attention/activation kernel.
    F32In,
    /// A block weight rounded to bf16 for the bf16 GEMM.
    WeightBf16,
    /// The backward GEMMs' bf16 operands: the output gradient, its transpose, the saved input
    /// transposed, the weight transposed.
    BwDout,
    BwDoutT,
    BwInpT,
    BwWeightT,
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
            Key::DAct(d) => f.write_str(match d {
                DAct::Ln => "dact.ln",
                DAct::Qkv => "dact.qkv",
                DAct::Att => "dact.att",
                DAct::Atty => "dact.atty",
                DAct::Fch => "dact.fch",
                DAct::FchAct => "dact.fch_act",
            }),
            Key::Work(w) => f.write_str(match w {
                Work::F32 => "work.f32",
                Work::F32In => "work.f32_in",
                Work::WeightBf16 => "work.w_bf16",
                Work::BwDout => "work.bw.dout",
                Work::BwDoutT => "work.bw.dout_t",
                Work::BwInpT => "work.bw.inp_t",
                Work::BwWeightT => "work.bw.w_t",
            }),
        }
    }
}
