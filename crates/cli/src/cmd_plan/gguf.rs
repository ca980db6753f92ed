//! `plan` of a GGUF file: the file `--model` names, and what its blocks mean for the plan.

use super::Args;
use plan::setup::Dtype;
use plan_frugal::WeightFormat;
use std::path::Path;

/// `--lora-base ggml` over a quantized GGUF file: the layout of the file's blocks (`None`
/// otherwise: the plan then says what the base needs).
pub(super) fn ggml_base(args: &Args) -> Option<plan_frugal::adapters::GgmlBase> {
    let file = gguf_file(args).filter(|_| args.lora_base == Dtype::Ggml)?;
    match file.own_format().ok().flatten()? {
        WeightFormat::Ggml { group, nibbles } => {
            Some(plan_frugal::adapters::GgmlBase { group, nibbles })
        }
        _ => None,
    }
}

/// The GGUF file `--model` names (`None` for every other model, and for a pasted config).
pub(super) fn gguf_file(args: &Args) -> Option<models::ModelSource> {
    let m = args.model.as_ref().filter(|_| args.config_text.is_none())?;
    models::ModelSource::at(Path::new(m))
        .ok()
        .filter(|s| matches!(s, models::ModelSource::Gguf(_)))
}

/// Whether `--infer` plans a quantized GGUF file in its own blocks: no `--weights` but ggml.
pub(super) fn gguf_blocks(args: &Args) -> bool {
    matches!(args.weights, None | Some(Dtype::Ggml))
        && gguf_file(args).is_some_and(|s| s.ggml_file().is_ok_and(|f| f.is_some()))
}
