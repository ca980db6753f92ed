//! LoRA/QLoRA in the engine: the frozen base (`base.<u>` fp32 pieces and each block matrix in
//! its base format, `plan_frugal::adapters`) and the adapters, which are the model's units (so
//! ZeRO, the optimizer, snapshots and `Model::params` treat them as any trainable unit).
//!
//! A block projection under LoRA (`forward::Ctx::linear`, `backward`'s `Grad::linear`, the one
//! choke point each pass has) runs the frozen matrix part by part (`Backend::frozen_linear`,
//! dequantizing each HF linear into `work.dequant` first unless the base is fp32), then the
//! adapters of its targeted parts (`Backend::adapter`: u = x·A_catᵀ kept, out += s·u·Bᵀ). The
//! backward dequantizes again for the input gradient and gives the base no gradient; norms,
//! embeddings and the head are frozen too.
//!
//! Example: `model.attach_lora(&arena, &lora, 16.0)` after `Model::new` on the adapter units.

pub mod base;

use crate::arena::{Arena, BufId};
use crate::backend::lora_ops::*;
use crate::backend::{Backend, DType, Tensor};
use crate::model::Model;
use plan::setup::Lora;
use plan::ModelShape;
use plan_frugal::adapters::{self, BaseFormat, Matrix, MATRICES};
use plan_frugal::key::Work;
use plan_frugal::units::{Role, Unit, UnitKind};
use plan_frugal::Key;

/// The index of a block matrix `role` in [`MATRICES`].
pub fn matrix_index(role: Role) -> usize {
    MATRICES
        .iter()
        .position(|&r| r == role)
        .unwrap_or_else(|| panic!("{role:?} is not a block matrix"))
}

/// One frozen block matrix: its parts and its buffer.
#[derive(Clone, Debug)]
pub struct FrozenMatrix {
    pub matrix: Matrix,
    pub id: BufId,
}

/// The frozen base and the adapters' wiring.
pub struct LoraModel {
    pub setup: Lora,
    pub format: BaseFormat,
    /// α / r.
    pub scale: f32,
    pub alpha: f32,
    /// The base's fp32 units (no block matrices) and their buffers.
    pub base_units: Vec<Unit>,
    pub base_ids: Vec<BufId>,
    /// Per block, the four matrices in [`MATRICES`] order.
    pub matrices: Vec<Vec<FrozenMatrix>>,
    pub dequant: Option<Tensor>,
    /// `work.lora_du` (only a training arena has it).
    pub du: Option<Tensor>,
    /// Dropout's scratch: the dropped input, the input gradient before the mask.
    pub dropped: Option<Tensor>,
    pub dropped_dx: Option<Tensor>,
    /// The mask's seed for this micro-step (`None`: not training, no dropout); set by the
    /// trainer before each micro-step, so a recompute redraws the forward's mask.
    pub dropout_seed: std::cell::Cell<Option<u64>>,
}

/// The four matrices of every block of `shape` under `lora`.
pub fn all_matrices(shape: &ModelShape, lora: &Lora) -> Vec<Vec<Matrix>> {
    let format = BaseFormat::of(lora).expect("checked by the plan");
    (0..shape.n_layers)
        .map(|l| adapters::matrices(shape, l, lora, format).expect("checked by the plan"))
        .collect()
}

impl LoraModel {
    pub fn new<B: Backend>(
        shape: &ModelShape,
        arena: &Arena<B>,
        lora: &Lora,
        alpha: f32,
    ) -> LoraModel {
        let base_units = adapters::base_units(shape).expect("checked by the plan");
        let base_ids = base_units
            .iter()
            .map(|u| arena.id(Key::Base(u.kind)))
            .collect();
        let matrices = all_matrices(shape, lora)
            .into_iter()
            .enumerate()
            .map(|(l, ms)| {
                ms.into_iter()
                    .map(|m| FrozenMatrix {
                        id: arena.id(Key::Frozen(l as u32, m.role)),
                        matrix: m,
                    })
                    .collect()
            })
            .collect();
        LoraModel {
            setup: lora.clone(),
            format: BaseFormat::of(lora).expect("checked by the plan"),
            scale: alpha / lora.rank as f32,
            alpha,
            base_units,
            base_ids,
            matrices,
            dequant: arena.try_tensor(Key::Work(Work::Dequant), DType::F32),
            du: arena.try_tensor(Key::Work(Work::LoraDu), DType::F32),
            dropped: arena.try_tensor(Key::Work(Work::LoraDropped), DType::F32),
            dropped_dx: arena.try_tensor(Key::Work(Work::LoraDx), DType::F32),
            dropout_seed: std::cell::Cell::new(None),
        }
    }

    fn base_index(&self, kind: UnitKind) -> usize {
        match kind {
            UnitKind::Embed => 0,
            UnitKind::Block(l) => 1 + l as usize,
            UnitKind::Head => self.base_units.len() - 1,
        }
    }

    /// Whether the base has an fp32 `role` in `kind` (a block matrix counts: it is frozen too).
    pub fn has_base(&self, kind: UnitKind, role: Role) -> bool {
        MATRICES.contains(&role) || self.base_units[self.base_index(kind)].has(role)
    }

    /// A frozen fp32 tensor of the base (embeddings, norms, biases, head).
    pub fn base_weight<B: Backend>(
        &self,
        arena: &Arena<B>,
        kind: UnitKind,
        role: Role,
    ) -> Option<Tensor> {
        let u = self.base_index(kind);
        let unit = &self.base_units[u];
        unit.has(role).then(|| {
            let r = crate::model::view_range(unit.view(role));
            arena.tensor(self.base_ids[u], DType::F32).slice(r)
        })
    }

    /// Block `layer`'s matrix `role` as the frozen ops read it, for `n` rows: its stored parts,
    /// the base's format, the dequant scratch and the shape.
    fn frozen_weight<B: Backend>(
        &self,
        arena: &Arena<B>,
        layer: usize,
        role: Role,
        n: usize,
    ) -> FrozenWeight {
        let fm = &self.matrices[layer][matrix_index(role)];
        let m = &fm.matrix;
        let mut parts = [None; MAX_PARTS];
        assert!(
            m.parts.len() <= MAX_PARTS,
            "at most {MAX_PARTS} HF linears per view"
        );
        for (slot, p) in parts.iter_mut().zip(&m.parts) {
            let bytes = self.format.part_bytes(m.role, p.rows, m.cols) as usize;
            let off = p.byte_offset as usize;
            let src = match self.format {
                BaseFormat::F32 => {
                    let n = (p.rows * m.cols) as usize;
                    arena.tensor(fm.id, DType::F32).slice(off / 4..off / 4 + n)
                }
                _ => arena.tensor(fm.id, DType::U8).slice(off..off + bytes),
            };
            *slot = Some(FrozenPart {
                src,
                col0: p.row_offset as usize,
                rows: p.rows as usize,
            });
        }
        FrozenWeight {
            parts,
            format: self.format,
            role,
            scratch: self.dequant,
            n,
            ic: m.cols as usize,
            oc: m.rows as usize,
        }
    }

    /// The adapter op of block `layer`'s matrix `role` (`None` when no part of it is targeted).
    fn adapter_op<B: Backend>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        layer: usize,
        role: Role,
        (out, inp, u): (Option<Tensor>, Tensor, Option<Tensor>),
        n: usize,
    ) -> Option<Adapter> {
        let m = &self.matrices[layer][matrix_index(role)].matrix;
        let first = m.targeted().next()?;
        let u = u.expect("a targeted linear keeps its adapter output");
        let kind = UnitKind::Block(layer as u32);
        let r = self.setup.rank as usize;
        let w = m.u_width(u64::from(self.setup.rank)) as usize;
        let params = |role| model.param(arena, kind, role);
        // The A's of one matrix sit side by side in the unit (`adapters::adapter_units`).
        let a0 = params(Role::LoraA(first.adapter.expect("targeted")));
        let a_cat = Tensor {
            len: w * m.cols as usize,
            ..a0
        };
        let mut parts = [None; MAX_PARTS];
        for (slot, p) in parts.iter_mut().zip(m.targeted()) {
            *slot = Some(AdapterPart {
                b: params(Role::LoraB(p.adapter.expect("targeted"))),
                col0: p.row_offset as usize,
                rows: p.rows as usize,
            });
        }
        let dropout = match (self.dropout_seed.get(), self.dropped) {
            (Some(seed), Some(dropped)) if self.setup.dropout > 0.0 => Some(Dropout {
                p: self.setup.dropout,
                // One mask per (micro-step, block, matrix).
                seed: seed
                    ^ (((layer as u64) << 8) | matrix_index(role) as u64)
                        .wrapping_mul(0xD6E8_FEB8_6659_FD93),
                dropped,
                dx: self.dropped_dx,
            }),
            _ => None,
        };
        Some(Adapter {
            dropout,
            out,
            u: u.prefix(n * w),
            inp,
            a_cat,
            parts,
            n,
            ic: m.cols as usize,
            oc: m.rows as usize,
            rank: r,
            scale: self.scale,
        })
    }

    /// out = inp · Wᵀ (+ bias) + the adapters, for block `layer`'s matrix `role`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear<B: Backend>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        layer: usize,
        role: Role,
        (out, inp, bias): (Tensor, Tensor, Option<Tensor>),
        u: Option<Tensor>,
        n: usize,
    ) {
        let w = self.frozen_weight(arena, layer, role, n);
        let op = FrozenLinear {
            out,
            inp: inp.prefix(n * w.ic),
            bias,
            w,
        };
        crate::backend::lora_ops(arena.backend()).frozen_linear(arena, &op);
        if let Some(op) = self.adapter_op(model, arena, layer, role, (Some(out), op.inp, u), n) {
            crate::backend::lora_ops(arena.backend()).adapter(arena, &op);
        }
    }

    /// Only the adapter outputs u of block `layer`'s matrix `role` (a segment recompute keeps
    /// its last block's output, but the backward still reads that projection's u).
    #[allow(clippy::too_many_arguments)]
    pub fn adapter_u<B: Backend>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        layer: usize,
        role: Role,
        inp: Tensor,
        u: Option<Tensor>,
        n: usize,
    ) {
        let ic = self.matrices[layer][matrix_index(role)].matrix.cols as usize;
        if let Some(op) =
            self.adapter_op(model, arena, layer, role, (None, inp.prefix(n * ic), u), n)
        {
            crate::backend::lora_ops(arena.backend()).adapter(arena, &op);
        }
    }

    /// dinp += dout · W, and the adapters' gradients (into `grads`, the adapter unit's).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_backward<B: Backend>(
        &self,
        model: &Model,
        arena: &Arena<B>,
        layer: usize,
        role: Role,
        (dinp, dout, inp): (Tensor, Tensor, Tensor),
        u: Option<Tensor>,
        grad: &dyn Fn(Role) -> Tensor,
        n: usize,
    ) {
        let m = &self.matrices[layer][matrix_index(role)].matrix;
        let w = self.frozen_weight(arena, layer, role, n);
        let ic = w.ic;
        let op = FrozenLinearBackward { dinp, dout, w };
        crate::backend::lora_ops(arena.backend()).frozen_linear_backward(arena, &op);
        let inp = inp.prefix(n * ic);
        let Some(fwd) = self.adapter_op(model, arena, layer, role, (None, inp, u), n) else {
            return;
        };
        let first = m
            .targeted()
            .next()
            .expect("targeted")
            .adapter
            .expect("targeted");
        let da0 = grad(Role::LoraA(first));
        let da_cat = Tensor {
            len: fwd.a_cat.len,
            ..da0
        };
        let mut db = [None; MAX_PARTS];
        for (slot, p) in db.iter_mut().zip(m.targeted()) {
            *slot = Some(grad(Role::LoraB(p.adapter.expect("targeted"))));
        }
        let op = AdapterBackward {
            fwd,
            dinp,
            dout,
            da_cat,
            db,
            du: self.du.expect("a training arena has work.lora_du"),
        };
        crate::backend::lora_ops(arena.backend()).adapter_backward(arena, &op);
    }
}
