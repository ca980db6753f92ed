//! Parameter units: the flat per-layer buffers the engine keeps its weights (and their gradients
//! and optimizer state) in, with a named view for every tensor and its Hugging Face name.
//!
//! A model has one embedding unit, one unit per transformer block and one head unit (final norm,
//! plus the output projection when it is not tied to the token embedding). Each unit is a single
//! contiguous f32 buffer, padded to a multiple of the data-parallel world size so ZeRO can split it
//! into equal shards. Views use `nn.Linear` layout (out, in); GPT-2's HF `Conv1D` weights are stored
//! (in, out), which [`HfPart::transposed`] records so IO transposes them. Llama's q/k/v and
//! gate/up projections are fused into one view each, as row ranges of several HF tensors.
//!
//! This module holds no values and does no IO; the engine reads and writes safetensors from it.
//! Example: GPT-2's block unit 0 holds `Role::QkvWeight` with one part
//! `transformer.h.0.attn.c_attn.weight`, shape (768, 2304) in HF, (2304, 768) here.

use super::family::arch;
pub use plan::roles::{Role, UnitKind};
use plan::{ModelShape, PlanError};
use std::ops::Range;

/// One Hugging Face tensor that fills some rows of a view.
#[derive(Clone, Debug, PartialEq)]
pub struct HfPart {
    /// Full HF name, e.g. `model.layers.0.self_attn.k_proj.weight`.
    pub name: String,
    /// First row of the view this tensor fills (rows in the engine's (out, in) layout).
    pub row_offset: u64,
    /// Shape of the tensor as HF stores it.
    pub hf_shape: Vec<u64>,
    /// HF stores it (in, out) (GPT-2 `Conv1D`): transpose on load and save.
    pub transposed: bool,
}

/// A named tensor inside a unit.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamView {
    pub role: Role,
    /// Offset in elements from the start of the unit.
    pub offset: u64,
    /// Shape in the engine's layout: `[rows, cols]` for matrices, `[n]` for vectors.
    pub shape: Vec<u64>,
    pub parts: Vec<HfPart>,
}

impl ParamView {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// One flat parameter buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub kind: UnitKind,
    /// Stable short name: `embed`, `h.3`, `head`.
    pub name: String,
    pub views: Vec<ParamView>,
    /// Elements the views cover.
    pub numel: u64,
    /// `numel` rounded up to a multiple of the world size (zero padding at the end).
    pub padded_numel: u64,
}

impl Unit {
    /// The view playing `role`; panics when the unit has none (a programmer error).
    pub fn view(&self, role: Role) -> &ParamView {
        self.views
            .iter()
            .find(|v| v.role == role)
            .unwrap_or_else(|| panic!("unit {} has no {role:?}", self.name))
    }

    pub fn has(&self, role: Role) -> bool {
        self.views.iter().any(|v| v.role == role)
    }

    /// The views only fp32 kernels read (norm weights and biases: one dimension), in order:
    /// what a 2-byte unit widens (`ActPolicy`'s `bf16_units`), laid out one after another.
    pub fn vectors(&self) -> impl Iterator<Item = &ParamView> {
        self.views.iter().filter(|v| v.shape.len() == 1)
    }

    /// Elements of [`Unit::vectors`].
    pub fn vector_numel(&self) -> u64 {
        self.vectors().map(ParamView::numel).sum()
    }

    /// Each vector with its range in the unit and its range among the vectors laid out one
    /// after another (`gather.*.vectors`, `grads.<u>.vectors`).
    pub fn vector_layout(&self) -> impl Iterator<Item = (Role, Range<u64>, Range<u64>)> + '_ {
        self.vectors().scan(0, |at, v| {
            let n = v.numel();
            *at += n;
            Some((v.role, v.offset..v.offset + n, *at - n..*at))
        })
    }

    /// Where `role` sits among the unit's vectors laid out one after another, if it is one.
    pub fn vector_range(&self, role: Role) -> Option<Range<u64>> {
        self.vector_layout().find(|v| v.0 == role).map(|v| v.2)
    }
}

/// A view as [`UnitBuilder::view`] takes it: role, shape, parts as (HF name, rows, transposed).
pub type ViewSpec = (Role, Vec<u64>, Vec<(String, u64, bool)>);

/// Builds a unit's views one after another (the family modules fill it).
pub struct UnitBuilder {
    views: Vec<ParamView>,
    numel: u64,
}

impl UnitBuilder {
    fn new() -> UnitBuilder {
        UnitBuilder {
            views: Vec::new(),
            numel: 0,
        }
    }

    /// A builder whose views a family reuses inside another's (Qwen2 extends Llama's block).
    pub fn scratch() -> UnitBuilder {
        UnitBuilder::new()
    }

    /// The views built, to replay into another builder.
    pub fn into_views(self) -> Vec<ViewSpec> {
        self.views
            .into_iter()
            .map(|v| {
                let parts = v
                    .parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let next = v.parts.get(i + 1).map_or(v.shape[0], |n| n.row_offset);
                        (p.name.clone(), next - p.row_offset, p.transposed)
                    })
                    .collect();
                (v.role, v.shape, parts)
            })
            .collect()
    }

    /// A view of `shape` filled by `parts` as (name, rows, transposed).
    pub fn view(&mut self, role: Role, shape: &[u64], parts: &[(String, u64, bool)]) {
        let cols = if shape.len() == 2 { shape[1] } else { 1 };
        let mut row = 0;
        let parts = parts
            .iter()
            .map(|(name, rows, transposed)| {
                let hf_shape = match (shape.len(), transposed) {
                    (1, _) => vec![*rows],
                    (_, false) => vec![*rows, cols],
                    (_, true) => vec![cols, *rows],
                };
                let part = HfPart {
                    name: name.clone(),
                    row_offset: row,
                    hf_shape,
                    transposed: *transposed,
                };
                row += rows;
                part
            })
            .collect::<Vec<_>>();
        assert_eq!(row, shape[0], "parts of {role:?} cover its rows");
        let view = ParamView {
            role,
            offset: self.numel,
            shape: shape.to_vec(),
            parts,
        };
        self.numel += view.numel();
        self.views.push(view);
    }

    /// A view filled by one HF tensor.
    pub fn one(&mut self, role: Role, shape: &[u64], name: &str, transposed: bool) {
        self.view(role, shape, &[(name.to_string(), shape[0], transposed)]);
    }

    /// Replays `view` (its role, shape and HF parts) into this builder at the next offset.
    pub fn copy_view(&mut self, view: &ParamView) {
        let parts: Vec<(String, u64, bool)> = (view.parts.iter().enumerate())
            .map(|(i, p)| {
                let next = view
                    .parts
                    .get(i + 1)
                    .map_or(view.shape[0], |n| n.row_offset);
                (p.name.clone(), next - p.row_offset, p.transposed)
            })
            .collect();
        self.view(view.role, &view.shape, &parts);
    }

    /// The unit of `kind`, padded to a multiple of `world` elements.
    pub fn finish(self, kind: UnitKind, world: u32) -> Unit {
        let world = u64::from(world.max(1));
        Unit {
            kind,
            name: kind.to_string(),
            padded_numel: self.numel.div_ceil(world) * world,
            numel: self.numel,
            views: self.views,
        }
    }
}

/// Checks that the engine can build `model`; the reason names the field at fault.
pub fn check_buildable(model: &ModelShape) -> Result<(), PlanError> {
    let arch = arch(model)?;
    let design = arch.design();
    if (model.moe.is_some() && !design.moe) || (model.mla.is_some() && !design.mla) {
        return Err(PlanError::Unsupported {
            runtime: "frugal",
            what: "mixture-of-experts or latent-attention layers outside Mixtral and DeepSeek-V2"
                .into(),
        });
    }
    let invalid = |field: &str, reason: String| {
        Err(PlanError::Invalid {
            field: field.into(),
            reason,
        })
    };
    if model.n_layers == 0 || model.d_model == 0 || model.vocab == 0 || model.d_ff == 0 {
        return invalid(
            "model",
            "n_layers, d_model, d_ff and vocab must be positive".into(),
        );
    }
    if model.n_heads == 0 || model.n_kv_heads == 0 || model.n_heads % model.n_kv_heads != 0 {
        return invalid(
            "n_kv_heads",
            format!(
                "{} query heads cannot be grouped over {} key/value heads",
                model.n_heads, model.n_kv_heads
            ),
        );
    }
    if model.d_head == 0 {
        return invalid("d_head", "must be positive".into());
    }
    arch.check(model)
}

/// The parameter units of `model`, padded for a data-parallel world of `world` ranks: the
/// embedding, one per block, the head, each laid out by the model's family module.
pub fn param_units(model: &ModelShape, world: u32) -> Result<Vec<Unit>, PlanError> {
    check_buildable(model)?;
    build_units(model, world)
}

/// [`param_units`] without the family's shape checks: one tensor-parallel rank's share of a
/// checked model (`tp::rank_shape`) has fewer heads than its hidden size implies.
pub(crate) fn build_units(model: &ModelShape, world: u32) -> Result<Vec<Unit>, PlanError> {
    let arch = arch(model)?;
    let mut embed = UnitBuilder::new();
    arch.embed(model, &mut embed);
    let mut units = vec![embed.finish(UnitKind::Embed, world)];
    for layer in 0..model.n_layers {
        let mut block = UnitBuilder::new();
        arch.block(model, layer, &mut block);
        units.push(block.finish(UnitKind::Block(layer), world));
    }
    let mut head = UnitBuilder::new();
    arch.head(model, &mut head);
    units.push(head.finish(UnitKind::Head, world));
    Ok(units)
}
