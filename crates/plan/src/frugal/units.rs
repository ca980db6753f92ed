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

use crate::model::Family;
use crate::{ModelShape, PlanError};

/// What a parameter tensor is for, as the engine's kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Token embedding (V, C); also the output projection when tied.
    TokenEmbedding,
    /// Learned positions (maxT, C), GPT-2 only.
    PositionEmbedding,
    Norm1Weight,
    Norm1Bias,
    /// Fused q|k|v projection ((NH + 2 NKV) HD, C).
    QkvWeight,
    QkvBias,
    /// Attention output projection (C, NH HD).
    AttnProjWeight,
    AttnProjBias,
    Norm2Weight,
    Norm2Bias,
    /// MLP up projection: (4C, C) for GPT-2, fused gate|up (2F, C) for Llama.
    FcWeight,
    FcBias,
    /// MLP down projection (C, F).
    FcProjWeight,
    FcProjBias,
    FinalNormWeight,
    FinalNormBias,
    /// Untied output projection (V, C).
    LmHead,
}

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

/// Which part of the model a unit holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitKind {
    Embed,
    Block(u32),
    Head,
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
}

/// Builds a unit's views one after another.
struct UnitBuilder {
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

    /// A view of `shape` filled by `parts` as (name, rows, transposed).
    fn view(&mut self, role: Role, shape: &[u64], parts: &[(String, u64, bool)]) {
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
    fn one(&mut self, role: Role, shape: &[u64], name: String, transposed: bool) {
        self.view(role, shape, &[(name, shape[0], transposed)]);
    }

    fn finish(self, kind: UnitKind, name: &str, world: u32) -> Unit {
        let world = u64::from(world.max(1));
        Unit {
            kind,
            name: name.into(),
            padded_numel: self.numel.div_ceil(world) * world,
            numel: self.numel,
            views: self.views,
        }
    }
}

/// Checks that the engine can build `model`; the reason names the field at fault.
pub fn check_buildable(model: &ModelShape) -> Result<(), PlanError> {
    let unsupported = |what: String| {
        Err(PlanError::Unsupported {
            runtime: "frugal",
            what,
        })
    };
    match model.family {
        Family::Gpt2 | Family::Llama => {}
        other => return unsupported(format!("the {other:?} model family (GPT-2 and Llama only)")),
    }
    if model.moe.is_some() || model.mla.is_some() {
        return unsupported("mixture-of-experts or latent-attention layers".into());
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
    if model.d_head == 0 || model.d_head % 2 != 0 && model.family == Family::Llama {
        return invalid(
            "d_head",
            format!("{} must be positive and even for RoPE", model.d_head),
        );
    }
    if model.family == Family::Gpt2 {
        if u64::from(model.n_heads) * model.d_head != model.d_model {
            return invalid("d_head", "GPT-2 needs n_heads * d_head == d_model".into());
        }
        if model.n_kv_heads != model.n_heads || !model.tied_embeddings {
            return invalid("model", "GPT-2 has no GQA and ties its embeddings".into());
        }
    }
    Ok(())
}

/// The parameter units of `model`, padded for a data-parallel world of `world` ranks.
pub fn param_units(model: &ModelShape, world: u32) -> Result<Vec<Unit>, PlanError> {
    check_buildable(model)?;
    let mut units = vec![embed_unit(model, world)];
    for layer in 0..model.n_layers {
        units.push(match model.family {
            Family::Gpt2 => gpt2_block(model, layer, world),
            _ => llama_block(model, layer, world),
        });
    }
    units.push(head_unit(model, world));
    Ok(units)
}

fn embed_unit(m: &ModelShape, world: u32) -> Unit {
    let mut u = UnitBuilder::new();
    let (v, c) = (m.vocab, m.d_model);
    if m.family == Family::Gpt2 {
        u.one(
            Role::TokenEmbedding,
            &[v, c],
            "transformer.wte.weight".into(),
            false,
        );
        let wpe = "transformer.wpe.weight".to_string();
        u.one(Role::PositionEmbedding, &[m.max_positions, c], wpe, false);
    } else {
        u.one(
            Role::TokenEmbedding,
            &[v, c],
            "model.embed_tokens.weight".into(),
            false,
        );
    }
    u.finish(UnitKind::Embed, "embed", world)
}

fn gpt2_block(m: &ModelShape, layer: u32, world: u32) -> Unit {
    let c = m.d_model;
    let f = m.d_ff;
    let p = |s: &str| format!("transformer.h.{layer}.{s}");
    let mut u = UnitBuilder::new();
    u.one(Role::Norm1Weight, &[c], p("ln_1.weight"), false);
    u.one(Role::Norm1Bias, &[c], p("ln_1.bias"), false);
    u.one(Role::QkvWeight, &[3 * c, c], p("attn.c_attn.weight"), true);
    u.one(Role::QkvBias, &[3 * c], p("attn.c_attn.bias"), false);
    u.one(Role::AttnProjWeight, &[c, c], p("attn.c_proj.weight"), true);
    u.one(Role::AttnProjBias, &[c], p("attn.c_proj.bias"), false);
    u.one(Role::Norm2Weight, &[c], p("ln_2.weight"), false);
    u.one(Role::Norm2Bias, &[c], p("ln_2.bias"), false);
    u.one(Role::FcWeight, &[f, c], p("mlp.c_fc.weight"), true);
    u.one(Role::FcBias, &[f], p("mlp.c_fc.bias"), false);
    u.one(Role::FcProjWeight, &[c, f], p("mlp.c_proj.weight"), true);
    u.one(Role::FcProjBias, &[c], p("mlp.c_proj.bias"), false);
    u.finish(UnitKind::Block(layer), &format!("h.{layer}"), world)
}

fn llama_block(m: &ModelShape, layer: u32, world: u32) -> Unit {
    let c = m.d_model;
    let f = m.d_ff;
    let q_rows = u64::from(m.n_heads) * m.d_head;
    let kv_rows = u64::from(m.n_kv_heads) * m.d_head;
    let p = |s: &str| format!("model.layers.{layer}.{s}");
    let mut u = UnitBuilder::new();
    u.one(Role::Norm1Weight, &[c], p("input_layernorm.weight"), false);
    let qkv = [
        (p("self_attn.q_proj.weight"), q_rows, false),
        (p("self_attn.k_proj.weight"), kv_rows, false),
        (p("self_attn.v_proj.weight"), kv_rows, false),
    ];
    u.view(Role::QkvWeight, &[q_rows + 2 * kv_rows, c], &qkv);
    u.one(
        Role::AttnProjWeight,
        &[c, q_rows],
        p("self_attn.o_proj.weight"),
        false,
    );
    u.one(
        Role::Norm2Weight,
        &[c],
        p("post_attention_layernorm.weight"),
        false,
    );
    let gate_up = [
        (p("mlp.gate_proj.weight"), f, false),
        (p("mlp.up_proj.weight"), f, false),
    ];
    u.view(Role::FcWeight, &[2 * f, c], &gate_up);
    u.one(
        Role::FcProjWeight,
        &[c, f],
        p("mlp.down_proj.weight"),
        false,
    );
    u.finish(UnitKind::Block(layer), &format!("h.{layer}"), world)
}

fn head_unit(m: &ModelShape, world: u32) -> Unit {
    let c = m.d_model;
    let mut u = UnitBuilder::new();
    if m.family == Family::Gpt2 {
        u.one(
            Role::FinalNormWeight,
            &[c],
            "transformer.ln_f.weight".into(),
            false,
        );
        u.one(
            Role::FinalNormBias,
            &[c],
            "transformer.ln_f.bias".into(),
            false,
        );
    } else {
        u.one(
            Role::FinalNormWeight,
            &[c],
            "model.norm.weight".into(),
            false,
        );
    }
    if !m.tied_embeddings {
        u.one(Role::LmHead, &[m.vocab, c], "lm_head.weight".into(), false);
    }
    u.finish(UnitKind::Head, "head", world)
}
