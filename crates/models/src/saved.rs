//! The weights a run starts from, whether a Hugging Face folder's safetensors or a GGUF file's
//! tensors (dequantized to f32 as ggml's reference does): read into any unit layout (the whole
//! model's, a LoRA base's), and the files whose fingerprint names them.
//!
//! Example: `let values = saved::read_units(Path::new("model.gguf"), &units)?;`

use super::from_gguf::{is_gguf_file, open_gguf};
use engine::error::EngineError;
use plan_frugal::units::Unit;
use std::path::{Path, PathBuf};

/// Every unit's values (`numel` each) from the weights at `path`: a GGUF file, or an HF folder
/// (`model.safetensors` or its shards). Every tensor is checked before any is returned.
pub fn read_units(path: &Path, units: &[Unit]) -> Result<Vec<Vec<f32>>, EngineError> {
    if !is_gguf_file(path) {
        let data = engine::io::read_hf_folder(path)?;
        return engine::io::read_units(units, &engine::io::file_slices(&data), "");
    }
    let name = path.display().to_string();
    let fail = |e: anyhow::Error| EngineError::Weights {
        path: name.clone(),
        reason: format!("{e:#}"),
    };
    let g = open_gguf(path).map_err(fail)?;
    let model = gguf::hf::Model::new(&g).map_err(|e| fail(e.into()))?;
    engine::io::read_units_by(units, &name, &mut |hf| {
        model.tensor(hf).map_err(|e| e.to_string())
    })
}

/// The files that hold the weights at `path`, in order: the GGUF file itself, or an HF folder's
/// weight files. A LoRA run fingerprints them, so its adapters are merged over the same base.
pub fn weight_files(path: &Path) -> Result<Vec<PathBuf>, EngineError> {
    match is_gguf_file(path) {
        true => Ok(vec![path.to_path_buf()]),
        false => engine::io::hf_weight_files(path),
    }
}
