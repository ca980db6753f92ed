//! The model's wiring: which arena buffers hold each unit's weights, gradients and optimizer
//! state, and each block's saved activations, resolved once at start-up from the plan's names.
//!
//! The forward and backward passes live in `forward.rs` and `backward.rs`; this file only knows
//! where things are. Parameter views are ranges into a unit's flat buffer ([`Unit`]).
//!
//! Example: `model.unit_range(UnitKind::Block(0), Role::QkvWeight)` is the fused q|k|v weight's
//! element range inside `params.h.0`.

use crate::arena::{Arena, BufId};
use crate::config::ModelConfig;
use plan::frugal::acts::{ActPolicy, BlockDims};
use plan::frugal::shards;
use plan::frugal::units::{ParamView, Role, Unit, UnitKind};
use plan::frugal::ActShape;
use plan::model::Family;
use std::ops::Range;

/// Arena ids of one block's saved activations.
#[derive(Clone, Copy, Debug)]
pub struct BlockActs {
    pub ln1: BufId,
    pub ln1_mean: Option<BufId>,
    pub ln1_rstd: BufId,
    pub qkv: BufId,
    /// Attention probabilities (materialised attention) or flash attention's log-sum-exp.
    pub att: Option<BufId>,
    pub lse: Option<BufId>,
    pub atty: BufId,
    pub res2: BufId,
    pub ln2: BufId,
    pub ln2_mean: Option<BufId>,
    pub ln2_rstd: BufId,
    pub fch: BufId,
    pub fch_act: BufId,
    pub out: BufId,
}

/// Arena ids of the head's buffers and the shared backward scratch.
#[derive(Clone, Copy, Debug)]
pub struct HeadActs {
    pub tokens: BufId,
    pub targets: BufId,
    pub encoded: BufId,
    pub lnf: BufId,
    pub lnf_mean: Option<BufId>,
    pub lnf_rstd: BufId,
    pub losses: BufId,
    pub dlnf: BufId,
    pub classifier: BufId,
    pub dresidual: BufId,
    pub dln: BufId,
    pub dqkv: BufId,
    /// Materialised attention only.
    pub datt: Option<BufId>,
    pub datty: BufId,
    pub dfch: BufId,
    pub dfch_act: BufId,
    /// With bf16 matmul inputs: the f32 scratch their producers write before rounding, and
    /// where the backward widens one back.
    pub work_f32: Option<BufId>,
    /// With bf16 activations: where a saved bf16 `qkv` or `fch` is widened for the f32
    /// attention or activation kernel (which writes `work_f32` meanwhile).
    pub work_f32_in: Option<BufId>,
    /// With bf16 matmul inputs: a block weight rounded to bf16 for `gemm_bf16`.
    pub work_w_bf16: Option<BufId>,
    /// With bf16 matmul inputs: the backward GEMMs' bf16 operands.
    pub work_bw: Option<BwScratch>,
}

/// Arena ids of the bf16 backward GEMMs' operands (`work.bw.*` in the plan).
#[derive(Clone, Copy, Debug)]
pub struct BwScratch {
    /// A matmul's output gradient (N,OC) rounded to bf16.
    pub dout: BufId,
    /// Its transpose (OC,N).
    pub dout_t: BufId,
    /// The saved bf16 input transposed (IC,N).
    pub inp_t: BufId,
    /// The bf16 weight transposed (IC,OC).
    pub w_t: BufId,
}

/// Where everything of the model lives in the arena.
pub struct Model {
    pub config: ModelConfig,
    pub units: Vec<Unit>,
    /// Each unit's full weights as the kernels read them: `params.<u>` at ZeRO stages 0-2, the
    /// unit's gather buffer of the current phase at stage 3.
    pub params: Vec<BufId>,
    /// Each unit's full gradient (live only while the backward writes it at stages 2-3).
    pub grads: Vec<BufId>,
    /// What each block's backward reads (saved by the forward or recomputed, per `policy`).
    pub blocks: Vec<BlockActs>,
    /// Where each block's forward writes (the same as `blocks` without recompute).
    pub forward_blocks: Vec<BlockActs>,
    pub policy: ActPolicy,
    pub head: HeadActs,
    /// Micro-batch rows and sequence length the activation buffers are sized for.
    pub shape: ActShape,
}

impl Model {
    /// Resolves every buffer of the plan the model uses; panics if the plan lacks one.
    pub fn new(
        config: ModelConfig,
        units: Vec<Unit>,
        arena: &Arena,
        shape: ActShape,
        policy: ActPolicy,
    ) -> Model {
        // At ZeRO stage 3 no full copy persists: a unit's weights are wherever it was gathered
        // for the current phase (`zero::Sharding` repoints `params` as phases begin).
        let params = units
            .iter()
            .map(|u| {
                arena
                    .try_id(&shards::params_name(&u.name))
                    .unwrap_or_else(|| arena.id(&format!("gather.fwd.{}", u.name)))
            })
            .collect();
        let grads = units
            .iter()
            .map(|u| arena.id(&shards::grads_name(&u.name)))
            .collect();
        let (blocks, forward_blocks) = crate::recompute::wire(arena, config.shape.n_layers, policy);
        let head = HeadActs {
            tokens: arena.id("batch.tokens"),
            targets: arena.id("batch.targets"),
            encoded: arena.id("act.encoded"),
            lnf: arena.id("act.lnf"),
            lnf_mean: arena.try_id("act.lnf_mean"),
            lnf_rstd: arena.id("act.lnf_rstd"),
            losses: arena.id("act.losses"),
            dlnf: arena.id("dact.lnf"),
            classifier: arena.id("work.classifier"),
            dresidual: arena.id("dact.residual"),
            dln: arena.id("dact.ln"),
            dqkv: arena.id("dact.qkv"),
            datt: arena.try_id("dact.att"),
            datty: arena.id("dact.atty"),
            dfch: arena.id("dact.fch"),
            dfch_act: arena.id("dact.fch_act"),
            work_f32: arena.try_id("work.f32"),
            work_f32_in: arena.try_id("work.f32_in"),
            work_w_bf16: arena.try_id("work.w_bf16"),
            work_bw: arena.try_id("work.bw.dout").map(|dout| BwScratch {
                dout,
                dout_t: arena.id("work.bw.dout_t"),
                inp_t: arena.id("work.bw.inp_t"),
                w_t: arena.id("work.bw.w_t"),
            }),
        };
        Model {
            config,
            units,
            params,
            grads,
            blocks,
            forward_blocks,
            policy,
            head,
            shape,
        }
    }

    pub fn is_gpt2(&self) -> bool {
        self.config.shape.family == Family::Gpt2
    }

    /// Index of the unit of `kind` in `units`, `params` and `grads`.
    pub fn unit_index(&self, kind: UnitKind) -> usize {
        match kind {
            UnitKind::Embed => 0,
            UnitKind::Block(l) => 1 + l as usize,
            UnitKind::Head => self.units.len() - 1,
        }
    }

    /// Element range of `role` inside the unit of `kind`.
    pub fn unit_range(&self, kind: UnitKind, role: Role) -> Range<usize> {
        view_range(self.units[self.unit_index(kind)].view(role))
    }

    /// The unit and range of the output projection (the token embedding when tied).
    pub fn lm_head(&self) -> (usize, Range<usize>) {
        if self.config.shape.tied_embeddings {
            (0, self.unit_range(UnitKind::Embed, Role::TokenEmbedding))
        } else {
            let head = self.unit_index(UnitKind::Head);
            (head, self.unit_range(UnitKind::Head, Role::LmHead))
        }
    }

    /// Element counts for `batch` rows of `seq` tokens (at most the planned shape).
    pub fn dims(&self, batch: usize, seq: usize) -> BlockDims {
        assert!(batch as u64 <= self.shape.batch && seq as u64 <= self.shape.seq);
        let shape = ActShape {
            batch: batch as u64,
            seq: seq as u64,
        };
        BlockDims::new(&self.config.shape, shape)
    }
}

pub fn view_range(v: &ParamView) -> Range<usize> {
    let start = v.offset as usize;
    start..start + v.numel() as usize
}

/// Splits `buf` into mutable sub-slices for each of `ranges` (sorted, disjoint).
pub fn split_ranges<'a>(mut buf: &'a mut [f32], ranges: &[Range<usize>]) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut consumed = 0;
    for r in ranges {
        assert!(r.start >= consumed, "ranges must be sorted and disjoint");
        let (_, rest) = std::mem::take(&mut buf).split_at_mut(r.start - consumed);
        let (this, rest) = rest.split_at_mut(r.len());
        out.push(this);
        buf = rest;
        consumed = r.end;
    }
    out
}
