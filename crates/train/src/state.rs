//! Training state, apart from the model: each unit's gradient, what each block's backward reads
//! (saved by the forward or recomputed, per the plan), the backward's scratch, and the
//! optimizer's state (AdamW moments or SGD momentum; fp32 master weights under bf16/fp16). A
//! forward-only model has none of it.
//!
//! Example: `state.grad(&model, &arena, UnitKind::Head, Role::FinalNormWeight)` is the final
//! norm weight's gradient inside `grads.head`.

use engine::arena::{Arena, BufId};
use engine::backend::ops::Bf16Scratch;
use engine::backend::TrainOps;
use engine::backend::{DType, Tensor};
use engine::model::{act_tensor, block_acts, lora_u, residual_type, BlockActs, Model};
use plan::setup::Optimizer;
use plan_frugal::key::{DAct, Work};
use plan_frugal::shards::optimizer_keys;
use plan_frugal::units::{Role, UnitKind};
use plan_frugal::Key;

/// Arena ids of one unit's master weights and Adam moments (2-byte precisions).
#[derive(Clone, Copy, Debug)]
pub struct MasterState {
    pub master: BufId,
    pub m: BufId,
    pub v: BufId,
}

/// The gradients, the backward's tensors and the optimizer state of one rank.
pub struct TrainState {
    /// Each unit's full fp32 gradient (live only while the backward writes it when it is a span),
    /// or for the bf16 tables (`plan_frugal::shards::direct_grads`) the 2-byte tensor the
    /// backward writes directly: the accumulator at stages 0-1, a 2-byte span at 2-3.
    pub grads: Vec<BufId>,
    /// The element type of each of `grads`.
    pub grad_types: Vec<DType>,
    /// `grads.<u>.vectors` of each unit (2-byte units): its vectors' fp32 gradients.
    pub grad_vectors: Vec<Option<BufId>>,
    /// What each block's backward reads.
    pub blocks: Vec<BlockActs>,
    pub targets: Tensor,
    pub losses: Tensor,
    pub dlnf: Tensor,
    /// The residual stream's gradient, carried down through every block.
    pub dresidual: Tensor,
    pub dln: Tensor,
    pub dqkv: Tensor,
    /// Materialised attention only.
    pub datt: Option<Tensor>,
    pub datty: Tensor,
    pub dfch: Tensor,
    pub dfch_act: Tensor,
    /// Mixture of experts: the router logits' and the gates' gradients.
    pub dprobs: Option<Tensor>,
    pub dgates: Option<Tensor>,
    /// Multi-head latent attention: a latent's gradient after and before its norm.
    pub dlatent: Option<(Tensor, Tensor)>,
    /// The last micro-batch's load-balancing loss (0 without one).
    pub balance_loss: std::cell::Cell<f32>,
    /// With bf16 matmul inputs: the backward GEMMs' bf16 operands.
    pub bf16: Option<Bf16Scratch>,
    /// Each unit's optimizer-state buffers in the arena (fp32: AdamW m, v or SGD momentum).
    pub opt: Vec<Vec<BufId>>,
    /// bf16/fp16 without offload: each unit's master weights and moments in the arena.
    pub masters: Vec<MasterState>,
}

impl TrainState {
    /// Resolves the training buffers of `arena`'s plan for `model`. `fp32_optimizer`: the
    /// optimizer state of fp32 weights lives in the arena; `masters`: 2-byte weights keep fp32
    /// master weights and moments in the arena (neither when offloaded).
    pub fn new<B: TrainOps>(
        model: &Model,
        arena: &Arena<B>,
        optimizer: Optimizer,
        fp32_optimizer: bool,
        masters: bool,
    ) -> TrainState {
        let f32_of = |key: Key| arena.key_tensor(key, DType::F32);
        let blocks = (0..model.config.shape.n_layers)
            .map(|l| {
                let read = |t| act_tensor(arena, model.policy, Key::Act(l, t), t);
                BlockActs {
                    lora_u: lora_u(arena, l, false),
                    ..block_acts(
                        &read,
                        arena.key_tensor(Key::BlockOut(l), residual_type(model.policy)),
                    )
                }
            })
            .collect();
        let bf16 = |w: Work| arena.try_tensor(Key::Work(w), DType::Bf16);
        let bf16_scratch = bf16(Work::BwDout).map(|dout| Bf16Scratch {
            dout,
            dout_t: bf16(Work::BwDoutT).expect("with work.bw.dout"),
        });
        let units = &model.units;
        let opt = match fp32_optimizer {
            true => units
                .iter()
                .map(|u| {
                    let keys = optimizer_keys(optimizer, u.kind);
                    keys.into_iter().map(|k| arena.id(k)).collect()
                })
                .collect(),
            false => Vec::new(),
        };
        let masters = match masters {
            true => units
                .iter()
                .map(|u| MasterState {
                    master: arena.id(Key::Master(u.kind)),
                    m: arena.id(Key::OptM(u.kind)),
                    v: arena.id(Key::OptV(u.kind)),
                })
                .collect(),
            false => Vec::new(),
        };
        let grad_type = match plan_frugal::shards::direct_grads(model.policy) {
            true => DType::Bf16,
            false => DType::F32,
        };
        TrainState {
            grads: (units.iter())
                .map(|u| match arena.try_id(Key::Grads(u.kind)) {
                    Some(id) => id,
                    None => arena.id(Key::GradsShard(u.kind)),
                })
                .collect(),
            grad_types: vec![grad_type; units.len()],
            grad_vectors: (units.iter())
                .map(|u| arena.try_id(Key::GradVectors(u.kind)))
                .collect(),
            blocks,
            // A pipeline stage has targets and the head's tensors only on the last stage.
            targets: arena.held_tensor(Key::Targets, DType::U32),
            losses: arena.held_tensor(Key::Losses, DType::F32),
            dlnf: arena.held_tensor(Key::DLnf, DType::F32),
            dresidual: f32_of(Key::DResidual),
            dln: f32_of(Key::DAct(DAct::Ln)),
            dqkv: f32_of(Key::DAct(DAct::Qkv)),
            datt: arena.try_tensor(Key::DAct(DAct::Att), DType::F32),
            datty: f32_of(Key::DAct(DAct::Atty)),
            dfch: f32_of(Key::DAct(DAct::Fch)),
            dfch_act: f32_of(Key::DAct(DAct::FchAct)),
            dprobs: arena.try_tensor(Key::DAct(DAct::Probs), DType::F32),
            dgates: arena.try_tensor(Key::DAct(DAct::Gates), DType::F32),
            balance_loss: Default::default(),
            dlatent: arena
                .try_tensor(Key::DAct(DAct::LatentA), DType::F32)
                .map(|a| (a, arena.key_tensor(Key::DAct(DAct::LatentB), DType::F32))),
            bf16: bf16_scratch,
            opt,
            masters,
        }
    }

    /// The gradient of `role` in the unit of `kind`: fp32, or under `ActPolicy::bf16_units` a
    /// matrix's 2-byte gradient and a vector's fp32 one in `grads.<u>.vectors`.
    pub fn grad<B: TrainOps>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        kind: UnitKind,
        role: Role,
    ) -> Tensor {
        let u = model.unit_index(kind);
        match (self.grad_vectors[u], model.vector_range(kind, role)) {
            (Some(v), Some(r)) => arena.tensor(v, DType::F32).slice(r),
            _ => (arena.tensor(self.grads[u], self.grad_types[u]))
                .slice(model.unit_range(kind, role)),
        }
    }

    /// [`TrainState::grad`] when the unit has that view.
    pub fn try_grad<B: TrainOps>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        kind: UnitKind,
        role: Role,
    ) -> Option<Tensor> {
        model
            .has(kind, role)
            .then(|| self.grad(model, arena, kind, role))
    }
}
