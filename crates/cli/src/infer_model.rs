//! Where `frugal generate` finds a model and how it becomes a `Server`: a quantized folder
//! (`weights.frugal`, written by `--save-quantized`), a Hugging Face folder (`config.json` +
//! `model.safetensors`, as `frugal export` writes, or the shards of
//! `model.safetensors.index.json`), or a training `--out` folder / snapshot. fp32
//! weights are quantized to `--weights` on load; a quantized folder is loaded as stored.
//!
//! Example: `let src = Source::open(Path::new("run1"))?; let server = src.server(setup)?;`

use anyhow::{bail, Context};
use engine::ModelConfig;
use infer::Runner;
use infer::{file, Server};
use plan::frugal::{ForwardSetup, ServeSetup, WeightFormat};
use std::path::{Path, PathBuf};
use train::snapshot::Snapshot;

/// A model's config and where its weights are.
pub struct Source {
    pub config: ModelConfig,
    pub weights: Weights,
}

/// Where the weights are.
pub enum Weights {
    /// A quantized file in this format.
    Quantized(PathBuf, WeightFormat),
    /// fp32 units, already read.
    Units(Vec<Vec<f32>>),
}

impl Source {
    pub fn open(path: &Path) -> anyhow::Result<Source> {
        let qfile = if path.is_file() {
            path.to_path_buf()
        } else {
            path.join(file::FILE_NAME)
        };
        if qfile.is_file() {
            let (header, _) = file::read_header(&qfile)?;
            let config = header.model_config(&qfile)?;
            let format = header.format()?;
            if format == WeightFormat::F32 {
                // fp32 values: read them as units, so any --weights format can be packed.
                let units = plan::frugal::param_units(&config.shape, 1)?;
                let weights = Weights::Units(file::read_f32_units(&qfile, &units)?);
                return Ok(Source { config, weights });
            }
            return Ok(Source {
                config,
                weights: Weights::Quantized(qfile, format),
            });
        }
        let config_path = path.join("config.json");
        let hf = path.join("model.safetensors").is_file()
            || path.join("model.safetensors.index.json").is_file();
        if config_path.is_file() && hf && !path.join("manifest.json").exists() {
            let text = std::fs::read_to_string(&config_path)
                .with_context(|| format!("reading {}", config_path.display()))?;
            let config = ModelConfig::from_hf_json(&text, &config_path.display().to_string())?;
            let setup = ForwardSetup {
                batch: 1,
                seq: 1,
                attention: plan::setup::Attention::DEFAULT,
            };
            let runner = Runner::new(config.clone(), setup)?;
            // One file, or the shards an index names.
            engine::io::load_hf_folder(&runner.model, &runner.arena, path)?;
            return Ok(Source {
                config,
                weights: Weights::Units(runner.unit_values()),
            });
        }
        if !path.exists() {
            bail!(
                "--model {}: no such folder; pass a training --out folder, one of its \
                 step-NNNNNN snapshots, a Hugging Face folder (config.json + \
                 model.safetensors) or a quantized folder (weights.frugal)",
                path.display()
            );
        }
        let snap = Snapshot::open(path).with_context(|| format!("--model {}", path.display()))?;
        for (dir, why) in &snap.skipped {
            eprintln!(
                "warning: {} is damaged ({why}); using the newest intact snapshot, {}",
                dir.display(),
                snap.dir.display()
            );
        }
        let config = snap.model_config()?;
        let units = plan::frugal::param_units(&config.shape, 1)?;
        let weights = snap.weights(&units)?;
        Ok(Source {
            config,
            weights: Weights::Units(weights),
        })
    }

    /// The format the weights are stored in, if they are quantized already.
    pub fn stored_format(&self) -> Option<WeightFormat> {
        match &self.weights {
            Weights::Quantized(_, f) => Some(*f),
            Weights::Units(_) => None,
        }
    }

    /// A server of `setup` holding these weights.
    pub fn server(&self, setup: ServeSetup) -> anyhow::Result<Server> {
        let mut server = Server::new_in_ram(self.config.clone(), setup)?;
        match &self.weights {
            Weights::Quantized(path, _) => file::load(&mut server, path)?,
            Weights::Units(units) => server.load_units(units)?,
        }
        Ok(server)
    }

    /// The fp32 units (the `--kv-cache off` reference needs them).
    pub fn units(&self) -> anyhow::Result<&[Vec<f32>]> {
        match &self.weights {
            Weights::Units(u) => Ok(u),
            Weights::Quantized(p, f) => bail!(
                "{} holds {} weights; the recompute-everything reference (--kv-cache off) runs \
                 the fp32 model: pass its fp32 folder",
                p.display(),
                f.name()
            ),
        }
    }
}
