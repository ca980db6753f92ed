//! The inference plan of this engine: weights in a storage format, a paged KV cache pool, and the
//! scratch of a prefill step and of a decode step, every buffer keyed, so the engine's arena
//! carves exactly this list and its measured bytes equal the plan's per category.
//!
//! - **Weights.** Every matrix (token embedding, q|k|v, attention output, MLP up/gate|up and down,
//!   an untied head) is stored in the weight format (`Key::QWeight`), with its scales
//!   (`Key::QScales`: fp16 per row for int8 and per group for int4, fp32 per group for nf4) and,
//!   for asymmetric int4, one zero-point byte per group (`Key::QZeros`); the embedding is looked
//!   up by dequantizing one row. Norm weights, biases and GPT-2's learned positions stay fp32, one
//!   `Key::Vectors` buffer per unit.
//! - **KV cache.** Per layer, keys and values of `kv_blocks` blocks of `kv_block` tokens for every
//!   KV head (`Key::KvK`/`Key::KvV`), in the KV format; int8 and fp8 add one fp32 scale per token
//!   and head (`Key::KvKScales`/`Key::KvVScales`). Contiguous caches are the case of one block
//!   per sequence of the whole context.
//! - **Scratch.** A prefill step runs up to `prefill_chunk` tokens of one sequence (its logits:
//!   `prefill_logit_rows` rows, 1 unless speculative verification needs more); a decode step runs
//!   one token of each of up to `max_seqs` sequences, with split-K partials for `split_k` splits.
//!   The two steps' scratch share bytes (phases `Prefill` and `Decode`), and every block reuses
//!   the step's scratch, so activations are one block's worth at the largest step.
//!
//! Example: `serve_plan(&llama_tiny, &ServeSetup::generation(&llama_tiny, 1, 64, w, kv, 16)?)`.

use super::family;
use super::key::{Key, StepAct, StepKind};
use super::units::{build_units, check_buildable, param_units};
use plan::buffer::{Buffer, Category, Device, Lifetime, MemoryPlan, Phase};
use plan::{ModelShape, PlanError};

mod estimate;
mod formats;

pub use estimate::{inference_estimate, rank_peaks};
pub use formats::{KvFormat, Roles, WeightFormat};

/// Rows of a prefill step unless told otherwise.
pub const DEFAULT_PREFILL_CHUNK: u64 = 256;

/// Tokens per KV block when none is asked for (`frugal generate`'s default, vLLM's).
pub const DEFAULT_KV_BLOCK: u64 = 16;

/// What a serving engine is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeSetup {
    pub weights: WeightFormat,
    pub kv: KvFormat,
    /// Tokens per KV block.
    pub kv_block: u64,
    /// Blocks in the pool (shared by every sequence).
    pub kv_blocks: u64,
    /// Most tokens one sequence holds (prompt + generated), at most the model's positions.
    pub context: u64,
    /// Sequences a decode step runs at once.
    pub max_seqs: u64,
    /// Tokens a prefill step runs.
    pub prefill_chunk: u64,
    /// Rows of logits a prefill step returns (1; K + 1 to verify K draft tokens).
    pub prefill_logit_rows: u64,
    /// KV splits of a decode step's attention (1: head-parallel only).
    pub split_k: u64,
}

impl ServeSetup {
    /// `batch` sequences of up to `context` tokens with a pool that holds them all (the
    /// contiguous equivalent when `kv_block` is `context`), prefill in chunks of
    /// [`DEFAULT_PREFILL_CHUNK`], split-K over `split_k` splits.
    pub fn generation(
        model: &ModelShape,
        batch: u64,
        context: u64,
        weights: WeightFormat,
        kv: KvFormat,
        kv_block: u64,
        split_k: u64,
    ) -> ServeSetup {
        let block = kv_block.clamp(1, context.max(1));
        let chunk = DEFAULT_PREFILL_CHUNK.min(context);
        // Under a sliding window on every layer a sequence holds a ring: the window, a prefill
        // chunk written before it attends, and two blocks of slack (a partly filled first block,
        // speculative decoding's rollback); the engine frees the blocks behind it.
        let per_seq = match model.sliding_window {
            Some(w) if w.first_layer == 0 => context
                .div_ceil(block)
                .min((w.window + chunk + 2 * block).div_ceil(block)),
            _ => context.div_ceil(block),
        };
        ServeSetup {
            weights,
            kv,
            kv_block: block,
            kv_blocks: batch * per_seq,
            context: context.min(model.max_positions),
            max_seqs: batch,
            prefill_chunk: chunk,
            prefill_logit_rows: 1,
            split_k: split_k.max(1),
        }
    }

    /// KV bytes of one block over every layer (scales included).
    pub fn block_bytes(&self, model: &ModelShape) -> u64 {
        // Keys and values, or latent attention's one latent row per token.
        let parts = if model.mla.is_some() { 1 } else { 2 };
        parts * u64::from(model.n_layers) * self.layer_block_bytes(model)
    }

    /// Bytes of one block of keys (or values) in one layer, scales included.
    fn layer_block_bytes(&self, model: &ModelShape) -> u64 {
        if let Some(a) = &model.mla {
            // The latent and the RoPE key, once per token (no values: `KvK` only).
            return self.kv_block * (a.kv_lora_rank + a.qk_rope_head_dim) * self.kv.element_bytes();
        }
        let per_token_head =
            model.d_head * self.kv.element_bytes() + if self.kv.has_scales() { 4 } else { 0 };
        self.kv_block * u64::from(model.n_kv_heads) * per_token_head
    }
}

fn invalid(field: &str, reason: String) -> PlanError {
    PlanError::Invalid {
        field: field.into(),
        reason,
    }
}

/// The largest latent rank the server's latent attention takes (`kernels::mla::MAX_RANK`).
pub const MAX_LATENT_RANK: u64 = 1024;

pub use plan::roles::is_matrix;

/// Checks `setup` against `model`, naming the field at fault.
pub fn check_serve(model: &ModelShape, setup: &ServeSetup) -> Result<(), PlanError> {
    check_buildable(model)?;
    if let Some(a) = model
        .mla
        .as_ref()
        .filter(|a| a.kv_lora_rank > MAX_LATENT_RANK)
    {
        return Err(invalid(
            "kv_lora_rank",
            format!(
                "{}: the cached latent attention takes ranks up to {MAX_LATENT_RANK} (generate \
                 with --kv-cache off)",
                a.kv_lora_rank
            ),
        ));
    }
    if model.mla.is_some() && !matches!(setup.kv, KvFormat::F32 | KvFormat::Bf16) {
        return Err(invalid(
            "--kv-dtype",
            format!(
                "{}: latent attention caches its latents in f32 or bf16 (--kv-dtype f32 or \
                 bf16)",
                setup.kv.name()
            ),
        ));
    }
    let positive = [
        ("kv-block", setup.kv_block),
        ("kv-blocks", setup.kv_blocks),
        ("context", setup.context),
        ("batch", setup.max_seqs),
        ("prefill-chunk", setup.prefill_chunk),
        ("prefill-logit-rows", setup.prefill_logit_rows),
        ("split-k", setup.split_k),
    ];
    for (field, v) in positive {
        if v == 0 {
            return Err(invalid(field, "must be at least 1".into()));
        }
    }
    if setup.context > model.max_positions {
        return Err(invalid(
            "context",
            format!(
                "{} tokens is longer than the model's {} positions",
                setup.context, model.max_positions
            ),
        ));
    }
    if setup.prefill_logit_rows > setup.prefill_chunk {
        return Err(invalid(
            "prefill-logit-rows",
            "cannot exceed the prefill chunk".into(),
        ));
    }
    if setup.split_k > 64 {
        return Err(invalid("split-k", "at most 64 splits".into()));
    }
    if model.n_heads / model.n_kv_heads > 128 || model.d_head > 256 {
        return Err(PlanError::Unsupported {
            runtime: "frugal",
            what: "more than 128 query heads per KV head or heads wider than 256 in decode \
                   attention"
                .into(),
        });
    }
    if let Some(group) = setup.weights.group() {
        // ggml's rows are whole blocks of 32, whatever the group.
        let g = match setup.weights {
            WeightFormat::Ggml { .. } => group.max(32),
            _ => group,
        };
        for unit in param_units(model, 1)? {
            for v in unit.views.iter().filter(|v| is_matrix(v.role)) {
                let (cols, name) = (v.shape[1], &v.parts[0].name);
                if cols % g == 0 {
                    continue;
                }
                return Err(match setup.weights {
                    WeightFormat::Ggml { .. } => invalid(
                        "--weights",
                        format!(
                            "ggml rows are whole blocks of 32, and {name} in {} has {cols} \
                             columns: use f32, bf16, int8 or another group of int4",
                            unit.name
                        ),
                    ),
                    _ => {
                        let fit = fitting_groups(model)?;
                        let fix = match fit.as_slice() {
                            [] => "no group of 32, 64 or 128 divides every matrix's columns \
                                   here: use --weights int8, bf16 or f32"
                                .to_string(),
                            groups => format!(
                                "use --weight-group {}",
                                groups
                                    .iter()
                                    .map(u64::to_string)
                                    .collect::<Vec<_>>()
                                    .join(" or ")
                            ),
                        };
                        invalid(
                            "--weight-group",
                            format!(
                                "groups of {g} do not divide the {cols} columns of {name}: {fix}"
                            ),
                        )
                    }
                });
            }
        }
    }
    Ok(())
}

/// The int4/nf4 groups (32, 64, 128) that divide every matrix's columns of `model`.
pub fn fitting_groups(model: &ModelShape) -> Result<Vec<u64>, PlanError> {
    let units = param_units(model, 1)?;
    let fits = |g: u64| {
        units
            .iter()
            .flat_map(|u| u.views.iter().filter(|v| is_matrix(v.role)))
            .all(|v| v.shape[1] % g == 0)
    };
    Ok([32, 64, 128].into_iter().filter(|&g| fits(g)).collect())
}

/// Rows of scratch of a step kind.
fn step_rows(setup: &ServeSetup, kind: StepKind) -> (u64, u64) {
    match kind {
        StepKind::Prefill => (setup.prefill_chunk, setup.prefill_logit_rows),
        StepKind::Decode => (setup.max_seqs, setup.max_seqs),
    }
}

/// Elements of one step tensor (f32 unless noted) for `rows` rows.
pub fn step_numel(
    model: &ModelShape,
    setup: &ServeSetup,
    kind: StepKind,
    t: StepAct,
) -> Option<u64> {
    let (rows, logit_rows) = step_rows(setup, kind);
    let design = family::design(model);
    let c = model.d_model;
    let atty = u64::from(model.n_heads) * model.d_head;
    let qkv = atty + 2 * u64::from(model.n_kv_heads) * model.d_head;
    let swiglu = design.mlp == family::Mlp::SwiGlu;
    let fc = if swiglu { 2 * model.d_ff } else { model.d_ff };
    let group = u64::from(model.n_heads / model.n_kv_heads);
    // A mixture of experts runs N·k routed rows of an expert's width, and its shared experts N.
    let (experts, k, f_e, shared) = match &model.moe {
        Some(e) if design.moe => (
            u64::from(e.n_experts),
            u64::from(e.n_active),
            e.d_ff_expert,
            u64::from(e.n_shared) * e.d_ff_expert,
        ),
        _ => (0, 1, 0, 0),
    };
    let dense = if model.moe.as_ref().is_some_and(|e| e.first_dense == 0) {
        0
    } else {
        model.d_ff
    };
    let widest = |x: u64| (rows * x).max(rows * k * f_e).max(rows * shared);
    // Latent attention: queries alone in `qkv`, the latents apart, norms of the bottlenecks.
    let mla = model.mla.as_ref();
    let ranks = mla.map_or(0, |a| a.kv_lora_rank.max(a.q_lora_rank.unwrap_or(0)));
    let qkv = mla.map_or(qkv, |a| {
        u64::from(model.n_heads) * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    });
    Some(match t {
        StepAct::Tokens => rows,
        StepAct::Ln => rows * c.max(ranks),
        StepAct::Residual | StepAct::Proj => rows * c,
        StepAct::Latent | StepAct::QLatent if mla.is_none() => return None,
        StepAct::Latent => rows * mla.map_or(0, |a| a.kv_lora_rank + a.qk_rope_head_dim),
        StepAct::QLatent => rows * ranks,
        StepAct::Rstd => rows,
        StepAct::Mean => {
            if design.norm != family::Norm::LayerNorm {
                return None;
            }
            rows
        }
        StepAct::Qkv => rows * qkv,
        StepAct::Atty => rows * atty,
        StepAct::Fch if experts == 0 => rows * fc,
        StepAct::FchAct if experts == 0 => rows * model.d_ff,
        StepAct::Fch => 2 * widest(dense),
        StepAct::FchAct => widest(dense),
        StepAct::Probs | StepAct::Route | StepAct::Gates | StepAct::MoeIn | StepAct::MoeOut
            if experts == 0 =>
        {
            return None
        }
        StepAct::Probs => rows * experts,
        StepAct::Route => 3 * rows * k + experts + 1,
        StepAct::Gates => rows * k,
        StepAct::MoeIn | StepAct::MoeOut => rows * k * c,
        StepAct::Logits => logit_rows * model.vocab,
        StepAct::Partials => {
            if kind == StepKind::Prefill || setup.split_k <= 1 || mla.is_some() {
                return None;
            }
            rows * u64::from(model.n_kv_heads) * setup.split_k * group * (model.d_head + 2)
        }
    })
}

/// Every buffer of an inference engine for `model` under `setup`.
pub fn serve_plan(model: &ModelShape, setup: &ServeSetup) -> Result<MemoryPlan, PlanError> {
    check_serve(model, setup)?;
    plan_shape(model, setup)
}

/// The serving plan of rank `rank` of a tensor-parallel group of `tp` over `model`: the plan of
/// its share (`tp::rank_shape`), after the whole model and the split are checked.
pub fn serve_plan_rank(
    model: &ModelShape,
    setup: &ServeSetup,
    tp: u32,
    rank: u32,
) -> Result<MemoryPlan, PlanError> {
    check_serve(model, setup)?;
    super::tp::check(model, tp)?;
    match setup.weights {
        // ggml's codes are cut in whole blocks of 32, whatever the file's group.
        WeightFormat::Ggml { group, .. } => super::tp::check_groups(model, tp, Some(group.max(32)))
            .map_err(|_| {
                invalid(
                    "--tp",
                    "a rank's share of the attention output or the MLP down projection would \
                     cut a GGUF file's blocks of 32 codes: use a --tp that leaves each rank \
                     whole blocks, or --weights f32, bf16 or int8"
                        .into(),
                )
            })?,
        f => super::tp::check_groups(model, tp, f.group())?,
    }
    plan_shape(&super::tp::rank_shape(model, tp, rank), setup)
}

/// [`serve_plan`] of a checked shape (a whole model, or a rank's share of one).
fn plan_shape(model: &ModelShape, setup: &ServeSetup) -> Result<MemoryPlan, PlanError> {
    let mut plan = MemoryPlan::inference(model.n_layers);
    let dev = Device::Gpu;
    for unit in build_units(model, 1)? {
        let mut vectors = 0;
        for v in &unit.views {
            if !is_matrix(v.role) {
                vectors += v.numel();
                continue;
            }
            let (codes, scales, zeros) = setup.weights.matrix_bytes(v.role, v.shape[0], v.shape[1]);
            let held = Lifetime::Persistent;
            plan.push(Buffer::keyed(
                Key::QWeight(unit.kind, v.role),
                Category::Params,
                dev,
                codes,
                held,
            ));
            if scales > 0 {
                let key = Key::QScales(unit.kind, v.role);
                plan.push(Buffer::keyed(key, Category::Params, dev, scales, held));
            }
            if zeros > 0 {
                let key = Key::QZeros(unit.kind, v.role);
                plan.push(Buffer::keyed(key, Category::Params, dev, zeros, held));
            }
        }
        if vectors > 0 {
            plan.push(Buffer::keyed(
                Key::Vectors(unit.kind),
                Category::Params,
                dev,
                4 * vectors,
                Lifetime::Persistent,
            ));
        }
    }
    let layer = setup.layer_block_bytes(model) * setup.kv_blocks;
    let scales = if setup.kv.has_scales() {
        4 * setup.kv_blocks * setup.kv_block * u64::from(model.n_kv_heads)
    } else {
        0
    };
    for l in 0..model.n_layers {
        let kv = Category::KvCache;
        let held = Lifetime::Persistent;
        plan.push(Buffer::keyed(Key::KvK(l), kv, dev, layer - scales, held));
        if model.mla.is_some() {
            continue;
        }
        plan.push(Buffer::keyed(Key::KvV(l), kv, dev, layer - scales, held));
        if scales > 0 {
            plan.push(Buffer::keyed(Key::KvKScales(l), kv, dev, scales, held));
            plan.push(Buffer::keyed(Key::KvVScales(l), kv, dev, scales, held));
        }
    }
    for (kind, phase) in [
        (StepKind::Prefill, Phase::Prefill),
        (StepKind::Decode, Phase::Decode),
    ] {
        let life = Lifetime::Span {
            born: phase,
            dies: phase,
        };
        for t in StepAct::ALL {
            let Some(numel) = step_numel(model, setup, kind, t) else {
                continue;
            };
            let category = if t == StepAct::Partials {
                Category::Other
            } else {
                Category::Activations
            };
            let key = Key::Step(kind, t);
            plan.push(Buffer::keyed(key, category, dev, 4 * numel, life));
        }
    }
    Ok(plan)
}

/// The weights' bytes of `model` in `format` (what `serve_plan` holds under `Params`).
pub fn weight_bytes(model: &ModelShape, format: WeightFormat) -> Result<u64, PlanError> {
    let mut total = 0;
    for unit in param_units(model, 1)? {
        for v in &unit.views {
            total += if is_matrix(v.role) {
                let (c, s, z) = format.matrix_bytes(v.role, v.shape[0], v.shape[1]);
                c + s + z
            } else {
                4 * v.numel()
            };
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
