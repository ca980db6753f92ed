//! The model: its config and family design, its parameter units, where its weights are and
//! where its forward pass writes, resolved once from the plan's keys. No gradient or optimizer
//! state lives here (that is `train::TrainState`), so the same `Model` runs a forward-only arena
//! (`Runner`: export, logits, generation) or a training one.
//!
//! The forward pass itself is `forward.rs`; this file only knows where things are. Weight views
//! are ranges of a unit's flat buffer ([`Model::weight`]).
//!
//! Example: `model.weight(&arena, UnitKind::Block(0), Role::QkvWeight)` is the fused q|k|v weight
//! inside `params.h.0`.

use crate::arena::{Arena, BufId};
use crate::backend::{Backend, DType, Tensor};
use crate::config::ModelConfig;
use plan_frugal::acts::{ActPolicy, BlockDims, BlockTensor};
use plan_frugal::family::BlockDesign;
use plan_frugal::key::Work;
use plan_frugal::units::{ParamView, Role, Unit, UnitKind};
use plan_frugal::{ActShape, Key};
use std::ops::Range;

/// One block's tensors (saved for the backward, recomputed, or the forward's scratch).
#[derive(Clone, Copy, Debug)]
pub struct BlockActs {
    pub ln1: Tensor,
    pub ln1_mean: Option<Tensor>,
    pub ln1_rstd: Tensor,
    pub qkv: Tensor,
    /// Attention probabilities (materialised attention) or flash attention's log-sum-exp.
    pub att: Option<Tensor>,
    pub lse: Option<Tensor>,
    pub atty: Tensor,
    pub res2: Tensor,
    pub ln2: Tensor,
    pub ln2_mean: Option<Tensor>,
    pub ln2_rstd: Tensor,
    pub fch: Tensor,
    pub fch_act: Tensor,
    /// Mixture of experts: the router's probabilities, routing tables (u32) and gates.
    pub probs: Option<Tensor>,
    pub route: Option<Tensor>,
    pub gates: Option<Tensor>,
    /// The shared experts' gate|up output and activation (DeepSeek).
    pub shared_fch: Option<Tensor>,
    pub shared_fch_act: Option<Tensor>,
    /// Multi-head latent attention: the query bottleneck, its norm and rstd (with q LoRA), the
    /// key/value latent, its norm and rstd, and the kernels' padded output.
    pub qa: Option<Tensor>,
    pub qa_norm: Option<Tensor>,
    pub qa_rstd: Option<Tensor>,
    pub kv_latent: Option<Tensor>,
    pub kv_norm: Option<Tensor>,
    pub kv_rstd: Option<Tensor>,
    pub atty_pad: Option<Tensor>,
    pub out: Tensor,
    /// LoRA: each block matrix's adapter output u (in `adapters::MATRICES` order), where targeted.
    pub lora_u: [Option<Tensor>; 4],
}

/// The embedding's and the head's forward tensors.
#[derive(Clone, Copy, Debug)]
pub struct HeadActs {
    pub tokens: Tensor,
    pub encoded: Tensor,
    pub lnf: Tensor,
    pub lnf_mean: Option<Tensor>,
    pub lnf_rstd: Tensor,
    /// The fused classifier's chunk of logits.
    pub classifier: Tensor,
}

/// The bf16 forward's workspaces (`None` under fp32).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bf16Work {
    /// f32 output of a kernel before it is rounded into a bf16 tensor (and where the backward
    /// widens a bf16 matmul input back).
    pub f32: Option<Tensor>,
    /// Where a saved bf16 `qkv` or `fch` is widened for the f32 attention/activation kernel.
    pub f32_in: Option<Tensor>,
    /// The residual stream's f32 rows while a block adds into them (`work.resid_in`: its input,
    /// then its output; `work.resid_mid`: `res2`), before each is rounded into its bf16 tensor.
    pub resid_in: Option<Tensor>,
    pub resid_mid: Option<Tensor>,
}

/// A mixture-of-experts model's workspaces (`None` for a dense one).
#[derive(Clone, Copy, Debug)]
pub struct MoeWork {
    /// `work.moe_in`: matmul inputs (or output gradients) in expert order, the inputs' type.
    pub rows_in: Tensor,
    /// `work.moe_out`: expert outputs (and input gradients) in expert order, f32.
    pub rows_out: Tensor,
    /// `work.moe_aux` (3E): selection counts, probability sums and the probabilities' gradient.
    pub aux: Tensor,
}

/// A latent-attention model's row buffers (`None` otherwise): the queries, the key/value
/// expansion and `kv_a_proj_with_mqa`'s output, each also their gradient in the backward.
#[derive(Clone, Copy, Debug)]
pub struct MlaWork {
    pub q: Tensor,
    pub kv: Tensor,
    pub ckv: Tensor,
}

/// Where the kernels read each unit's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// The persistent fp32 `params.<u>`.
    Params,
    /// Each phase's gathered copy (ZeRO-3, 2-byte weights: widened to fp32, or under
    /// `ActPolicy::bf16_units` the bits, the working copy below stage 3): `Model::params` is
    /// repointed as phases begin.
    Gathers,
}

/// Where everything of the model lives in the arena.
pub struct Model {
    pub config: ModelConfig,
    pub design: BlockDesign,
    pub units: Vec<Unit>,
    /// Each unit's full weights as the kernels read them now: fp32, or the 2-byte working copy
    /// or bits gathered under `ActPolicy::bf16_units`.
    pub params: Vec<BufId>,
    /// `ActPolicy::bf16_units`: each unit's vectors widened to fp32 as the kernels read them
    /// now (`gather.*.vectors`, repointed by `zero::Sharding`); `None` for a unit without.
    pub vectors: Vec<Option<BufId>>,
    /// Where each block's forward writes.
    pub forward_blocks: Vec<BlockActs>,
    pub head: HeadActs,
    pub work: Bf16Work,
    pub moe: Option<MoeWork>,
    pub mla: Option<MlaWork>,
    pub policy: ActPolicy,
    /// Micro-batch rows and sequence length the activation buffers are sized for.
    pub shape: ActShape,
    /// LoRA: the frozen base; `units` and `params` are then the adapters.
    pub lora: Option<Box<crate::lora::LoraModel>>,
    /// Tensor parallelism: this rank's group (`config` is then this rank's share of the model).
    pub tp: Option<Box<crate::tp::TensorParallel>>,
    /// Sequence parallelism's workspaces (`None` without it).
    pub sp: Option<crate::sp::SpWork>,
    /// Pipeline parallelism: this rank's stage and its links to the neighbouring stages.
    pub pp: Option<Box<crate::pp::Pipeline>>,
    /// Tensor or pipeline parallelism: where this rank's units sit in the whole model.
    pub share: Option<Box<crate::share::Share>>,
}

impl Model {
    /// Resolves every buffer of the plan the forward pass uses; panics if the plan lacks one.
    pub fn new<B: Backend>(
        config: ModelConfig,
        units: Vec<Unit>,
        arena: &Arena<B>,
        shape: ActShape,
        policy: ActPolicy,
        weights: WeightSource,
    ) -> Model {
        let kinds: Vec<UnitKind> = units.iter().map(|u| u.kind).collect();
        let params = units
            .iter()
            .map(|u| match weights {
                WeightSource::Params => arena.id(Key::Params(u.kind)),
                // 2-byte units below stage 3: their working copy (nothing is gathered).
                WeightSource::Gathers => match arena.try_id(Key::GatherFwd(u.kind)) {
                    Some(id) => id,
                    None => arena.id(Key::Params(u.kind)),
                },
            })
            .collect();
        let forward_blocks = (0..config.shape.n_layers)
            .map(|l| {
                let written = |t: BlockTensor| {
                    let key = match policy.recomputes(t) {
                        true => Key::ActFwd(l, t),
                        false => Key::Act(l, t),
                    };
                    act_tensor(arena, policy, key, t)
                };
                let out = arena
                    .try_id(Key::BlockOutFwd(l))
                    .unwrap_or_else(|| arena.id(Key::BlockOut(l)));
                block_acts(&written, arena.tensor(out, residual_type(policy)))
            })
            .collect();
        // A pipeline stage holds the ids and the head only where it runs them.
        let held = |key: Key| arena.held_tensor(key, DType::F32);
        let head = HeadActs {
            tokens: arena.held_tensor(Key::Tokens, DType::U32),
            encoded: arena.key_tensor(Key::Encoded, residual_type(policy)),
            lnf: held(Key::Lnf),
            lnf_mean: arena.try_tensor(Key::LnfMean, DType::F32),
            lnf_rstd: held(Key::LnfRstd),
            classifier: held(Key::Classifier),
        };
        let work = Bf16Work {
            f32: arena.try_tensor(Key::Work(Work::F32), DType::F32),
            f32_in: arena.try_tensor(Key::Work(Work::F32In), DType::F32),
            resid_in: arena.try_tensor(Key::Work(Work::ResidIn), DType::F32),
            resid_mid: arena.try_tensor(Key::Work(Work::ResidMid), DType::F32),
        };
        let moe_in = arena.try_id(Key::Work(Work::MoeIn));
        let moe = moe_in.map(|id| {
            let in_type = match policy.elem_bytes(BlockTensor::Ln2) {
                2 => DType::Bf16,
                _ => DType::F32,
            };
            MoeWork {
                rows_in: arena.tensor(id, in_type),
                rows_out: arena.key_tensor(Key::Work(Work::MoeOut), DType::F32),
                aux: arena.key_tensor(Key::Work(Work::MoeAux), DType::F32),
            }
        });
        let mla = arena.try_id(Key::Work(Work::MlaQ)).map(|q| MlaWork {
            q: arena.tensor(q, DType::F32),
            kv: arena.key_tensor(Key::Work(Work::MlaKv), DType::F32),
            ckv: arena.key_tensor(Key::Work(Work::MlaCkv), DType::F32),
        });
        Model {
            design: plan_frugal::family::design(&config.shape),
            config,
            units,
            params,
            vectors: (kinds.iter())
                .map(|&kind| arena.try_id(Key::VectorsFwd(kind)))
                .collect(),
            forward_blocks,
            head,
            work,
            moe,
            mla,
            policy,
            shape,
            lora: None,
            tp: None,
            pp: None,
            share: None,
            sp: arena.try_id(Key::Work(Work::SpGather)).map(|gather| {
                let in_type = match policy.elem_bytes(BlockTensor::Ln1) {
                    2 => DType::Bf16,
                    _ => DType::F32,
                };
                crate::sp::SpWork {
                    gather: arena.tensor(gather, in_type),
                    full: arena.key_tensor(Key::Work(Work::SpFull), DType::F32),
                    dnorm: arena.key_tensor(Key::Work(Work::SpDnorm), DType::F32),
                }
            }),
        }
    }

    /// Whether this rank runs the embedding (and its backward) and the head: every model but a
    /// pipeline stage other than the first (last).
    pub fn runs_embedding(&self) -> bool {
        self.share.as_ref().is_none_or(|s| s.stage.is_first())
    }

    pub fn runs_head(&self) -> bool {
        self.share.as_ref().is_none_or(|s| s.stage.is_last())
    }

    /// The whole model's vocabulary (a tensor-parallel rank holds a slice of it).
    pub fn vocab(&self) -> u64 {
        match &self.share {
            Some(s) => s.whole.shape.vocab,
            None => self.config.shape.vocab,
        }
    }

    /// The first token id of this rank's vocabulary slice and whether it adds the replicated
    /// terms (row-parallel biases, learned positions): `(0, true)` without tensor parallelism.
    pub fn vocab_first(&self) -> (usize, bool) {
        match &self.tp {
            Some(tp) => (tp.vocab.0 as usize, tp.rank == 0),
            None => (0, true),
        }
    }

    /// Makes this a LoRA model over the frozen base of `arena`'s plan (`units` must be the
    /// adapter units), wiring where each block's forward keeps its adapter outputs.
    pub fn attach_lora<B: Backend>(
        &mut self,
        arena: &Arena<B>,
        lora: &plan::setup::Lora,
        alpha: f32,
    ) {
        let recomputed = self.policy.recomputes(BlockTensor::Qkv);
        for (l, acts) in self.forward_blocks.iter_mut().enumerate() {
            acts.lora_u = lora_u(arena, l as u32, recomputed);
        }
        let model = crate::lora::LoraModel::new(&self.config.shape, arena, lora, alpha);
        self.lora = Some(Box::new(model));
    }

    /// Index of the unit of `kind` in `units` and `params` (under LoRA the adapter units,
    /// one per block).
    pub fn unit_index(&self, kind: UnitKind) -> usize {
        match (kind, &self.lora) {
            (UnitKind::Block(l), Some(_)) => l as usize,
            (_, Some(_)) => panic!("LoRA trains only block adapters, not {kind:?}"),
            // A pipeline stage holds the embedding (first stage; the last too when tied) and the
            // head (last stage) only where it runs them.
            (UnitKind::Embed, None) => 0,
            (UnitKind::Block(l), None) => {
                usize::from(self.units[0].kind == UnitKind::Embed) + l as usize
            }
            (UnitKind::Head, None) => self.units.len() - 1,
        }
    }

    /// Element range of `role` inside the unit of `kind`.
    pub fn unit_range(&self, kind: UnitKind, role: Role) -> Range<usize> {
        view_range(self.units[self.unit_index(kind)].view(role))
    }

    /// Whether the model has a `role` weight in the unit of `kind` (biases are
    /// family-dependent; under LoRA, the frozen base's).
    pub fn has(&self, kind: UnitKind, role: Role) -> bool {
        match &self.lora {
            Some(l) => l.has_base(kind, role),
            None => self.units[self.unit_index(kind)].has(role),
        }
    }

    /// The fp32 weight `role` of the unit of `kind`, where the kernels read it now (under
    /// LoRA, the frozen base's fp32 tensors; its block matrices go through `lora`).
    pub fn weight<B: Backend>(&self, arena: &Arena<B>, kind: UnitKind, role: Role) -> Tensor {
        match &self.lora {
            Some(l) => l
                .base_weight(arena, kind, role)
                .unwrap_or_else(|| panic!("the frozen base has no {role:?} in {kind:?}")),
            None => self.param(arena, kind, role),
        }
    }

    /// The trainable weight `role` of the unit of `kind` (under LoRA, an adapter): fp32, or
    /// under `ActPolicy::bf16_units` a matrix's 2-byte weights where they lie and a vector's
    /// fp32 copy in the unit's current `gather.*.vectors`.
    pub fn param<B: Backend>(&self, arena: &Arena<B>, kind: UnitKind, role: Role) -> Tensor {
        let u = self.unit_index(kind);
        if !self.policy.bf16_units {
            return (arena.tensor(self.params[u], DType::F32)).slice(self.unit_range(kind, role));
        }
        match self.vector_range(kind, role) {
            Some(r) => {
                let id = self.vectors[u].expect("a unit with vectors has their buffer");
                arena.tensor(id, DType::F32).slice(r)
            }
            None => (arena.tensor(self.params[u], DType::Bf16)).slice(self.unit_range(kind, role)),
        }
    }

    /// Where `role` sits among the vectors of the unit of `kind` (`Unit::vector_range`), if it
    /// is one.
    pub fn vector_range(&self, kind: UnitKind, role: Role) -> Option<Range<usize>> {
        let r = self.units[self.unit_index(kind)].vector_range(role)?;
        Some(r.start as usize..r.end as usize)
    }

    /// The output projection as the classifier reads it (2-byte under `ActPolicy::bf16_units`).
    pub fn lm_weight<B: Backend>(&self, arena: &Arena<B>) -> Tensor {
        let (kind, role) = self.lm_head();
        self.weight(arena, kind, role)
    }

    /// [`Model::weight`] when the unit has that view.
    pub fn try_weight<B: Backend>(
        &self,
        arena: &Arena<B>,
        kind: UnitKind,
        role: Role,
    ) -> Option<Tensor> {
        self.has(kind, role).then(|| self.weight(arena, kind, role))
    }

    /// The unit and range of the output projection (the token embedding when tied).
    pub fn lm_head(&self) -> (UnitKind, Role) {
        if self.config.shape.tied_embeddings {
            (UnitKind::Embed, Role::TokenEmbedding)
        } else {
            (UnitKind::Head, Role::LmHead)
        }
    }

    /// Element counts of block `layer` for `batch` rows of `seq` tokens (at most the planned
    /// shape).
    pub fn dims(&self, layer: usize, batch: usize, seq: usize) -> BlockDims {
        assert!(batch as u64 <= self.shape.batch && seq as u64 <= self.shape.seq);
        let shape = ActShape {
            batch: batch as u64,
            seq: seq as u64,
        };
        BlockDims::layer(&self.config.shape, shape, layer as u32)
            .sequence_parallel(self.policy.seq_shards)
    }
}

/// The tensor of block tensor `t` at `key`, in the type the policy stores it in.
/// The element type the residual stream is saved in between blocks (`act.encoded`, block
/// outputs): bf16 under `--precision bf16`.
pub fn residual_type(policy: ActPolicy) -> DType {
    match policy.residual_bytes() {
        2 => DType::Bf16,
        _ => DType::F32,
    }
}

pub fn act_tensor<B: Backend>(
    arena: &Arena<B>,
    policy: ActPolicy,
    key: Key,
    t: BlockTensor,
) -> Option<Tensor> {
    let dtype = match policy.elem_bytes(t) {
        2 => DType::Bf16,
        _ if t == BlockTensor::Route => DType::U32,
        _ => DType::F32,
    };
    arena.try_tensor(key, dtype)
}

/// A block's tensors from `id` (`None` where the model or attention kernel has none).
pub fn block_acts(id: &dyn Fn(BlockTensor) -> Option<Tensor>, out: Tensor) -> BlockActs {
    let must = |t: BlockTensor| id(t).unwrap_or_else(|| panic!("the plan has no {t:?} buffer"));
    BlockActs {
        ln1: must(BlockTensor::Ln1),
        ln1_mean: id(BlockTensor::Ln1Mean),
        ln1_rstd: must(BlockTensor::Ln1Rstd),
        qkv: must(BlockTensor::Qkv),
        att: id(BlockTensor::Att),
        lse: id(BlockTensor::Lse),
        atty: must(BlockTensor::Atty),
        res2: must(BlockTensor::Res2),
        ln2: must(BlockTensor::Ln2),
        ln2_mean: id(BlockTensor::Ln2Mean),
        ln2_rstd: must(BlockTensor::Ln2Rstd),
        fch: must(BlockTensor::Fch),
        fch_act: must(BlockTensor::FchAct),
        probs: id(BlockTensor::Probs),
        route: id(BlockTensor::Route),
        gates: id(BlockTensor::Gates),
        shared_fch: id(BlockTensor::SharedFch),
        shared_fch_act: id(BlockTensor::SharedFchAct),
        qa: id(BlockTensor::Qa),
        qa_norm: id(BlockTensor::QaNorm),
        qa_rstd: id(BlockTensor::QaRstd),
        kv_latent: id(BlockTensor::KvLatent),
        kv_norm: id(BlockTensor::KvNorm),
        kv_rstd: id(BlockTensor::KvRstd),
        atty_pad: id(BlockTensor::AttyPad),
        out,
        lora_u: [None; 4],
    }
}

/// Where block `layer` keeps its adapter outputs: the backward's buffers, or the forward's
/// copies when the backward recomputes them.
pub fn lora_u<B: Backend>(arena: &Arena<B>, layer: u32, forward_copy: bool) -> [Option<Tensor>; 4] {
    plan_frugal::adapters::MATRICES.map(|role| {
        let key = match forward_copy {
            true => Key::LoraUFwd(layer, role),
            false => Key::LoraU(layer, role),
        };
        arena.try_tensor(key, DType::F32)
    })
}

pub fn view_range(v: &ParamView) -> Range<usize> {
    let start = v.offset as usize;
    start..start + v.numel() as usize
}
