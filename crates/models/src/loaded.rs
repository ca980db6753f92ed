//! What an inference run loads: a model's config and where its weights are, and the worker
//! that holds them in the format asked for.

use super::from_gguf;
use anyhow::bail;
use engine::ModelConfig;
use infer::{file, Worker};
use plan_frugal::{ServeSetup, WeightFormat};
use std::path::PathBuf;

/// A model's config and its weights.
pub struct Loaded {
    pub config: ModelConfig,
    pub weights: Weights,
}

/// Where the weights are.
pub enum Weights {
    /// A quantized file in this format.
    Quantized(PathBuf, WeightFormat),
    /// fp32 units, already read.
    Units(Vec<Vec<f32>>),
    /// A GGUF file's values as fp32 units; the `ggml` format takes its blocks exactly.
    Gguf(PathBuf, Vec<Vec<f32>>),
}

impl Loaded {
    /// The format the weights are stored in, if they are quantized already.
    pub fn stored_format(&self) -> Option<WeightFormat> {
        match &self.weights {
            Weights::Quantized(_, f) => Some(*f),
            Weights::Units(_) | Weights::Gguf(..) => None,
        }
    }

    /// A worker of `setup` holding these weights (the `ggml` format in a GGUF file's own
    /// group).
    pub fn worker(&self, mut setup: ServeSetup) -> anyhow::Result<Worker> {
        setup.weights = self.narrow(setup.weights)?;
        let mut worker = Worker::new_in_ram(self.config.clone(), setup)?;
        match &self.weights {
            Weights::Quantized(path, _) => file::load(&mut worker, path)?,
            Weights::Gguf(path, units) if matches!(setup.weights, WeightFormat::Ggml { .. }) => {
                from_gguf::load_exact(&mut worker, path, units, false)?
            }
            Weights::Units(units) | Weights::Gguf(_, units) => worker.load_units(units)?,
        }
        Ok(worker)
    }

    /// Loads a tensor-parallel rank's share of the whole model (of a GGUF file's blocks
    /// themselves, in the `ggml` format).
    pub fn load_whole(&self, w: &mut Worker) -> Result<(), engine::EngineError> {
        match &self.weights {
            Weights::Gguf(path, units) if matches!(w.setup.weights, WeightFormat::Ggml { .. }) => {
                from_gguf::load_exact(w, path, units, true)
            }
            _ => w.load_whole_units(
                self.units()
                    .map_err(|e| engine::EngineError::Infer(format!("{e:#}")))?,
            ),
        }
    }

    /// The format these weights run in when `--weights` is not given: the stored one, a GGUF
    /// file's own blocks, or f32.
    pub fn default_format(&self) -> anyhow::Result<WeightFormat> {
        match &self.weights {
            Weights::Quantized(_, f) => Ok(*f),
            Weights::Gguf(path, _) => from_gguf::default_format(path),
            Weights::Units(_) => Ok(WeightFormat::F32),
        }
    }

    /// `format` as these weights hold it: `ggml` takes a GGUF file's own group.
    pub fn narrow(&self, format: WeightFormat) -> anyhow::Result<WeightFormat> {
        Ok(match (format, &self.weights) {
            (WeightFormat::Ggml { .. }, Weights::Gguf(path, _)) => from_gguf::ggml_format(path)?,
            (f, _) => f,
        })
    }

    /// The fp32 units (the `--kv-cache off` reference needs them).
    pub fn units(&self) -> anyhow::Result<&[Vec<f32>]> {
        match &self.weights {
            Weights::Units(u) | Weights::Gguf(_, u) => Ok(u),
            Weights::Quantized(p, f) => bail!(
                "{} holds {} weights; the recompute-everything reference (--kv-cache off) runs \
                 the fp32 model: pass its fp32 folder",
                p.display(),
                f.name()
            ),
        }
    }
}
