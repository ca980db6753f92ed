//! What `model` needs of a GGUF file: the magic check, opening it, its config.json and the
//! tokenizer tables it embeds.

use std::path::Path;

/// A file that starts with GGUF's magic.
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// A file with GGUF's magic or its extension (so a damaged one gets the GGUF reader's error).
pub(super) fn is_gguf_file(path: &Path) -> bool {
    path.is_file() && (is_gguf(path) || path.extension().is_some_and(|e| e == "gguf"))
}

pub(super) fn open_gguf(path: &Path) -> anyhow::Result<gguf::Gguf> {
    Ok(gguf::Gguf::open(path)?)
}

/// The config.json of a GGUF model.
pub(super) fn gguf_config(g: &gguf::Gguf) -> anyhow::Result<String> {
    Ok(gguf::hf::Model::new(g)?.config_json()?)
}

/// The tokenizer tables a GGUF file embeds.
pub(super) fn gguf_vocab(g: &gguf::Gguf) -> anyhow::Result<data::hf_tokenizer::GgufVocab<'_>> {
    let text = |key: &str| g.get(key).ok().and_then(|v| v.as_str());
    let id = |key: &str| g.u64(key).ok().map(|v| v as u32);
    let types = match g.get("tokenizer.ggml.token_type") {
        Ok(v) => v
            .as_array()
            .unwrap_or_default()
            .iter()
            .map(|t| t.as_u64().unwrap_or(1))
            .collect(),
        Err(_) => Vec::new(),
    };
    let scores = match g.get("tokenizer.ggml.scores") {
        Ok(v) => v
            .as_array()
            .unwrap_or_default()
            .iter()
            .map(|s| s.as_f64().unwrap_or(0.0) as f32)
            .collect(),
        Err(_) => Vec::new(),
    };
    let flag = |key: &str| g.get(key).ok().and_then(|v| v.as_bool());
    Ok(data::hf_tokenizer::GgufVocab {
        source: g.path.to_str().unwrap_or("the GGUF file"),
        scores,
        unk: id("tokenizer.ggml.unknown_token_id"),
        // llama.cpp's default for SentencePiece vocabularies: a space before the text.
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix").unwrap_or(true),
        model: text("tokenizer.ggml.model").unwrap_or(""),
        pre: text("tokenizer.ggml.pre").unwrap_or("default"),
        tokens: g.strings("tokenizer.ggml.tokens")?,
        types,
        merges: g.strings("tokenizer.ggml.merges").unwrap_or_default(),
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        // llama.cpp's defaults where the file does not say: BOS first for SentencePiece and
        // Llama 3's vocabularies.
        add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or_else(|| {
            text("tokenizer.ggml.model") == Some("llama")
                || matches!(
                    text("tokenizer.ggml.pre"),
                    Some("llama3" | "llama-v3" | "llama-bpe")
                )
        }),
        chat_template: text("tokenizer.chat_template"),
    })
}

/// What a GGUF file runs in by default: its own blocks (`ggml`) when it holds quantized
/// tensors, as llama.cpp runs them; f32 for a file of floats.
pub(super) fn default_format(path: &Path) -> anyhow::Result<plan_frugal::WeightFormat> {
    let g = open_gguf(path)?;
    match g.tensors.iter().any(|t| t.kind.scale_group().is_some()) {
        true => ggml_format(path),
        false => Ok(plan_frugal::WeightFormat::F32),
    }
}

/// A quantized GGUF file's tensors as it holds them: every tensor's bytes in its own type (what
/// llama.cpp loads) and its `ggml` group; `None` for a file of floats.
pub(super) fn file_weights(path: &Path) -> anyhow::Result<Option<fit::infer::GgmlFile>> {
    let g = open_gguf(path)?;
    if !g.tensors.iter().any(|t| t.kind.scale_group().is_some()) {
        return Ok(None);
    }
    let group = gguf::hf::Model::new(&g)?.group() as u64;
    let bytes = g
        .tensors
        .iter()
        .try_fold(0u64, |sum, t| sum.checked_add(t.bytes()))
        .ok_or_else(|| anyhow::anyhow!("{}: tensor sizes overflow", path.display()))?;
    Ok(Some(fit::infer::GgmlFile { bytes, group }))
}

/// The `ggml` weight format narrowed to what the file at `path` holds: groups of its smallest
/// scale group (16 when a tensor is Q6_K), and two codes a byte for the matrices it holds in
/// 4-bit types in every layer (every part of a fused one: q, k and v; gate and up).
pub(super) fn ggml_format(path: &Path) -> anyhow::Result<plan_frugal::WeightFormat> {
    use plan_frugal::{serve::is_matrix, Roles};
    let g = open_gguf(path)?;
    let model = gguf::hf::Model::new(&g)?;
    let shape = plan::hf_config::parse(&model.config_json()?, &path.display().to_string())?;
    let (mut seen, mut wider) = (Roles::NONE, Roles::NONE);
    for unit in plan_frugal::param_units(&shape, 1)? {
        for v in unit.views.iter().filter(|v| is_matrix(v.role)) {
            seen = seen.with(v.role);
            for part in &v.parts {
                if !model.tensor_kind(&part.name)?.four_bit() {
                    wider = wider.with(v.role);
                }
            }
        }
    }
    Ok(plan_frugal::WeightFormat::Ggml {
        group: model.group() as u64,
        nibbles: seen.difference(wider),
    })
}

/// Loads `units` (the file's values as f32) into `worker`, whose format is `ggml`, taking each
/// quantized matrix's codes, scales and minima from the file's blocks: the values the engine
/// multiplies are ggml's exactly. A matrix the file holds as floats (or a fused one, such as
/// q|k|v, with any part in floats) is quantized Q8_0-like instead.
/// With `whole`, `units` are the whole model's and `worker` a tensor-parallel rank, which keeps
/// its share of each matrix's blocks.
pub(super) fn load_exact(
    worker: &mut infer::Worker,
    path: &Path,
    units: &[Vec<f32>],
    whole: bool,
) -> Result<(), engine::error::EngineError> {
    let name = path.display().to_string();
    let fail = |reason: String| engine::error::EngineError::Weights {
        path: name.clone(),
        reason,
    };
    let format = worker.setup.weights;
    let plan_frugal::WeightFormat::Ggml { group, .. } = format else {
        return Err(fail(
            "the exact GGUF load needs the ggml weight format".into(),
        ));
    };
    let g = open_gguf(path).map_err(|e| fail(format!("{e:#}")))?;
    let model = gguf::hf::Model::new(&g).map_err(|e| fail(e.to_string()))?;
    let mut stored = |_: &plan_frugal::Unit, view: &plan_frugal::units::ParamView| {
        let mut codes = Vec::new();
        let (mut scales, mut minima) = (Vec::new(), Vec::new());
        for part in &view.parts {
            let nibbles = format.nibbles(view.role);
            let Some(t) = blocks(&model, &part.name, group, nibbles).map_err(fail)? else {
                return Ok(None);
            };
            codes.extend(t.codes);
            scales.extend(t.scales);
            minima.extend(t.mins);
        }
        if codes.len() as u64 != view.numel() {
            return Err(fail(format!(
                "{} holds {} values, the model needs {}",
                view.parts[0].name,
                codes.len(),
                view.numel()
            )));
        }
        Ok(Some(infer::weights::Packed::grouped(
            codes, &scales, &minima,
        )))
    };
    match whole {
        true => worker.load_whole_units_with(units, &mut stored),
        false => worker.load_units_with(units, &mut stored),
    }
}

/// The blocks of HF tensor `name` in `model`'s file as the `ggml` layout holds them (groups of
/// `group`; codes 0..15 when `nibbles`); `None` when the file holds it in floats.
fn blocks(
    model: &gguf::hf::Model,
    name: &str,
    group: u64,
    nibbles: bool,
) -> Result<Option<engine::lora::base::Blocks>, String> {
    let Some(mut t) = model
        .tensor_grouped(name, group as usize)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let kind = model.tensor_kind(name).map_err(|e| e.to_string())?;
    if nibbles && kind == gguf::TensorType::Q4_0 {
        // Q4_0's d·(q − 8) as d·q + (−8d), codes 0..15: the same value (both terms are whole
        // multiples of d, and so is their sum, exactly).
        for c in &mut t.codes {
            *c += 8;
        }
        for (m, d) in t.mins.iter_mut().zip(&t.scales) {
            *m = -8.0 * d;
        }
    }
    Ok(Some(engine::lora::base::Blocks {
        codes: t.codes.iter().map(|&c| c as u8).collect(),
        scales: t.scales,
        mins: t.mins,
    }))
}

/// The layout of a `ggml` LoRA base over the GGUF file `weights`: its `ggml` weight format's.
pub fn ggml_base(weights: Option<&Path>) -> anyhow::Result<plan_frugal::adapters::GgmlBase> {
    let Some(path) = weights.filter(|p| is_gguf_file(p)) else {
        anyhow::bail!(
            "a ggml base keeps a GGUF file's own quantized blocks: give a .gguf file as --model \
             (other models: --lora-base nf4, int8, bf16 or fp32)"
        );
    };
    let nibbles = match default_format(path)? {
        plan_frugal::WeightFormat::Ggml { nibbles, .. } => nibbles,
        _ => anyhow::bail!(
            "{} holds floats, not quantized blocks: use --lora-base fp32, bf16, int8 or nf4",
            path.display()
        ),
    };
    // The block matrices' own smallest group (the embedding and head stay fp32 in a base, so
    // a Q6_K output does not narrow it).
    let g = open_gguf(path)?;
    let model = gguf::hf::Model::new(&g)?;
    let shape = plan::hf_config::parse(&model.config_json()?, &path.display().to_string())?;
    let mut group = 32;
    for unit in plan_frugal::param_units(&shape, 1)? {
        let matrices = unit
            .views
            .iter()
            .filter(|v| plan_frugal::serve::is_matrix(v.role));
        for part in matrices.flat_map(|v| &v.parts) {
            if let Some(g) = model.tensor_kind(&part.name)?.scale_group() {
                group = group.min(g as u64);
            }
        }
    }
    Ok(plan_frugal::adapters::GgmlBase { group, nibbles })
}

/// Puts the GGUF file's own blocks into every block matrix of `model`'s `ggml` base.
pub fn put_file_blocks<B: engine::backend::Backend>(
    model: &engine::model::Model,
    arena: &engine::arena::Arena<B>,
    path: &Path,
    base: plan_frugal::adapters::GgmlBase,
) -> anyhow::Result<()> {
    let g = open_gguf(path)?;
    let file = gguf::hf::Model::new(&g)?;
    engine::lora::base::put_blocks(model, arena, |name, nibbles| {
        let fail = |reason: String| engine::error::EngineError::Weights {
            path: path.display().to_string(),
            reason,
        };
        blocks(&file, name, base.group, nibbles)
            .map_err(fail)?
            .ok_or_else(|| {
                fail(format!(
                    "{name} is held in floats: a ggml base needs every block matrix in quantized \
                     blocks; use --lora-base nf4 (or int8, bf16, fp32) for this file"
                ))
            })
    })?;
    Ok(())
}
