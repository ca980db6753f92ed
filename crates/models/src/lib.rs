//! `--model`, resolved once for every command and the page's API: a preset name, an HF
//! `config.json` (a shape, no weights), a Hugging Face folder (`config.json` +
//! `model.safetensors`, or the shards `model.safetensors.index.json` names, as `frugal export`
//! and `train --out` write), a training `--out` folder or one of its `step-NNNNNN` snapshots, or a
//! quantized folder (`weights.frugal`, written by `generate --save-quantized`), or a GGUF file
//! (llama.cpp's: `llama` and `qwen2` models, dequantized to f32 as ggml's reference does).
//!
//! [`ModelSource::resolve`] says which, from what is on disk; [`ModelSource::shape`] is all the
//! planner needs; [`ModelSource::config`] what the engine builds; [`ModelSource::load`] the
//! weights an inference run starts from ([`Loaded`]; split over tensor-parallel ranks by [`tp`]).
//! [`chat`] renders a model's chat template.
//!
//! Example: `let src = ModelSource::resolve("run1")?; let shape = src.shape()?;`

use anyhow::{bail, Context};
use engine::ModelConfig;
use infer::{file, Runner};
use plan::ModelShape;
use plan_frugal::{ForwardSetup, WeightFormat};
use std::path::{Path, PathBuf};
use train::snapshot::Snapshot;

pub mod chat;
mod from_gguf;
mod loaded;
pub use loaded::{Loaded, Weights};
pub mod saved;
pub mod tp;
pub use from_gguf::{ggml_base, put_file_blocks};
use from_gguf::{gguf_config, gguf_vocab, is_gguf_file, open_gguf};

/// Where warnings go (a damaged snapshot passed over): the handler the binary installs with
/// [`on_warning`]; none installed, they are dropped. This crate prints nothing itself.
static WARNINGS: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Sends this crate's warnings to `handler` (the first call wins).
pub fn on_warning(handler: fn(&str)) {
    let _ = WARNINGS.set(handler);
}

fn warn(message: &str) {
    if let Some(handler) = WARNINGS.get() {
        handler(message);
    }
}

/// What `--model` names.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    /// A preset (`plan::presets`).
    Preset(String),
    /// An HF `config.json`: the shape, no weights.
    Config(PathBuf),
    /// A config.json's text (the page's pasted config), named for errors.
    ConfigText { name: String, text: String },
    /// A Hugging Face folder with weights.
    HfFolder(PathBuf),
    /// A training `--out` folder (its newest intact snapshot) or one snapshot.
    Snapshot(PathBuf),
    /// A quantized file (`weights.frugal`, or the folder holding it).
    Quantized(PathBuf),
    /// A GGUF file: config, weights and tokenizer in one.
    Gguf(PathBuf),
}

/// What every error about `--model` ends with.
const KINDS: &str = "an HF config.json, a Hugging Face folder (config.json + \
                     model.safetensors), a training --out folder or one of its step-NNNNNN \
                     snapshots, a quantized folder (weights.frugal) or a GGUF file";

impl ModelSource {
    /// What `spec` names, judged by what is on disk: a path that exists is a file or folder of
    /// one of the kinds above; anything else is a preset name.
    pub fn resolve(spec: &str) -> anyhow::Result<ModelSource> {
        let path = Path::new(spec);
        if path.is_file() {
            if path.file_name() == Some(file::FILE_NAME.as_ref()) {
                return Ok(ModelSource::Quantized(path.to_path_buf()));
            }
            if is_gguf_file(path) {
                return Ok(ModelSource::Gguf(path.to_path_buf()));
            }
            return Ok(ModelSource::Config(path.to_path_buf()));
        }
        if path.is_dir() {
            let has = |name: &str| path.join(name).is_file();
            // A weights or config path of the wrong kind would be read as "no weights".
            let files = [
                "model.safetensors",
                "model.safetensors.index.json",
                "config.json",
            ];
            // (`symlink_metadata`: a link to nothing is there too, and is not a file.)
            let there = |f: &&str| path.join(f).symlink_metadata().is_ok();
            if let Some(name) = files.iter().find(|f| there(f) && !has(f)) {
                bail!(
                    "--model {spec}: {} is not a regular file (a folder, or a link to nothing?); \
                     put the file itself there",
                    path.join(name).display()
                );
            }
            if has(file::FILE_NAME) {
                return Ok(ModelSource::Quantized(path.join(file::FILE_NAME)));
            }
            let weights = has("model.safetensors") || has("model.safetensors.index.json");
            if has("config.json") && weights && !has("manifest.json") {
                return Ok(ModelSource::HfFolder(path.to_path_buf()));
            }
            if has("manifest.json") || has_snapshots(path) {
                return Ok(ModelSource::Snapshot(path.to_path_buf()));
            }
            if has("config.json") {
                return Ok(ModelSource::Config(path.join("config.json")));
            }
            bail!("--model {spec}: the folder holds no model; pass {KINDS}");
        }
        if let Some(id) = hf_id(spec) {
            return ModelSource::from_hf_cache(spec, id);
        }
        if spec.ends_with(".json") || spec.contains(std::path::MAIN_SEPARATOR) {
            bail!("--model {spec}: no such file or folder; pass a preset or {KINDS}");
        }
        match plan::presets::by_name(spec) {
            Ok(_) => Ok(ModelSource::Preset(spec.to_string())),
            Err(_) => bail!(
                "--model {spec}: no such file or folder, and unknown model '{spec}': use one of \
                 {}, or {KINDS}",
                plan::presets::NAMES.join(", ")
            ),
        }
    }

    /// A model id (`org/name`) in the local Hugging Face cache, resolved as transformers'
    /// `from_pretrained` does offline: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`; the revision `refs/main` names, else the only snapshot.
    fn from_hf_cache(spec: &str, (org, name): (&str, &str)) -> anyhow::Result<ModelSource> {
        let env = |key: &str| {
            std::env::var_os(key)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let hub = env("HF_HUB_CACHE")
            .or_else(|| env("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| env("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .or_else(|| env("HOME").map(|h| h.join(".cache/huggingface/hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let repo = hub.join(format!("models--{org}--{name}"));
        let snapshots = repo.join("snapshots");
        let revision = std::fs::read_to_string(repo.join("refs/main"))
            .ok()
            .map(|r| r.trim().to_string())
            .filter(|r| snapshots.join(r).is_dir());
        let revision = revision.or_else(|| {
            let mut all: Vec<String> = std::fs::read_dir(&snapshots)
                .ok()?
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            all.sort();
            (all.len() == 1).then(|| all.remove(0))
        });
        match revision {
            Some(rev) => ModelSource::at(&snapshots.join(rev)),
            None => bail!(
                "--model {spec}: no such folder, and not in the local Hugging Face cache (looked \
                 for {}); download it there (huggingface-cli download {spec}) or pass its folder",
                repo.display()
            ),
        }
    }

    /// `resolve` of a path.
    pub fn at(path: &Path) -> anyhow::Result<ModelSource> {
        ModelSource::resolve(&path.display().to_string())
    }

    /// `resolve`, or the page's pasted config.json when there is one.
    pub fn resolve_or_text(spec: &str, text: Option<&str>) -> anyhow::Result<ModelSource> {
        match text {
            Some(text) => Ok(ModelSource::ConfigText {
                name: spec.to_string(),
                text: text.to_string(),
            }),
            None => ModelSource::resolve(spec),
        }
    }

    /// The shape the planner needs. Any architecture the planner knows, not only those the
    /// engine runs.
    pub fn shape(&self) -> anyhow::Result<ModelShape> {
        let parse = |path: &Path| -> anyhow::Result<ModelShape> {
            let text = read(path)?;
            Ok(plan::hf_config::parse(&text, &path.display().to_string())?)
        };
        match self {
            ModelSource::Preset(name) => Ok(plan::presets::by_name(name)?),
            ModelSource::Config(path) => parse(path),
            ModelSource::HfFolder(dir) => parse(&dir.join("config.json")),
            ModelSource::ConfigText { name, text } => Ok(plan::hf_config::parse(text, name)?),
            ModelSource::Snapshot(_) | ModelSource::Quantized(_) => Ok(self.config()?.shape),
            ModelSource::Gguf(path) => {
                let text = gguf_config(&open_gguf(path)?)?;
                Ok(plan::hf_config::parse(&text, &path.display().to_string())?)
            }
        }
    }

    /// The config the engine builds (refused, naming why, for an architecture it does not run).
    pub fn config(&self) -> anyhow::Result<ModelConfig> {
        let from_json = |path: &Path| -> anyhow::Result<ModelConfig> {
            let text = read(path)?;
            Ok(ModelConfig::from_hf_json(
                &text,
                &path.display().to_string(),
            )?)
        };
        match self {
            ModelSource::Preset(name) => {
                Ok(ModelConfig::from_shape(plan::presets::by_name(name)?)?)
            }
            ModelSource::Config(path) => from_json(path),
            ModelSource::HfFolder(dir) => from_json(&dir.join("config.json")),
            ModelSource::ConfigText { name, text } => Ok(ModelConfig::from_hf_json(text, name)?),
            ModelSource::Snapshot(dir) => Ok(open_snapshot(dir)?.model_config()?),
            ModelSource::Quantized(path) => {
                let (header, _) = file::read_header(path)?;
                Ok(header.model_config(path)?)
            }
            ModelSource::Gguf(path) => {
                let text = gguf_config(&open_gguf(path)?)?;
                Ok(ModelConfig::from_hf_json(
                    &text,
                    &path.display().to_string(),
                )?)
            }
        }
    }

    /// The model's own tokenizer (a GGUF's embedded vocabulary, an HF folder's
    /// `tokenizer.json`), or GPT-2's for everything trained here and the presets.
    pub fn tokenizer(&self) -> anyhow::Result<data::Tokenizer> {
        use data::hf_tokenizer::HfTokenizer;
        match self {
            ModelSource::Gguf(path) => {
                let g = open_gguf(path)?;
                Ok(data::Tokenizer::hf(HfTokenizer::from_gguf(&gguf_vocab(
                    &g,
                )?)?))
            }
            ModelSource::HfFolder(dir) if dir.join("tokenizer.json").is_file() => Ok(
                data::Tokenizer::hf(HfTokenizer::from_file(&dir.join("tokenizer.json"))?),
            ),
            _ => Ok(data::Tokenizer::gpt2()),
        }
    }

    /// A quantized GGUF file's own tensors for the advisors (`None` for other sources and for a
    /// GGUF file of floats).
    pub fn ggml_file(&self) -> anyhow::Result<Option<fit::infer::GgmlFile>> {
        match self {
            ModelSource::Gguf(path) => from_gguf::file_weights(path),
            _ => Ok(None),
        }
    }

    /// The format a quantized GGUF file runs in by default (its own blocks); `None` for other
    /// sources.
    pub fn own_format(&self) -> anyhow::Result<Option<WeightFormat>> {
        match self {
            ModelSource::Gguf(path) => Ok(Some(from_gguf::default_format(path)?)),
            _ => Ok(None),
        }
    }

    /// The config and the weights an inference run starts from; a source without weights (a
    /// preset or a config.json) is refused, saying what has them.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        match self {
            ModelSource::Preset(_) | ModelSource::Config(_) | ModelSource::ConfigText { .. } => {
                bail!(
                    "--model {}: a model shape with no weights; pass trained weights: a training \
                     --out folder or snapshot, a Hugging Face folder or a quantized folder",
                    self.name()
                )
            }
            ModelSource::Quantized(path) => {
                let (header, _) = file::read_header(path)?;
                let config = header.model_config(path)?;
                let format = header.format()?;
                if format == WeightFormat::F32 {
                    // fp32 values: read them as units, so any --weights format can be packed.
                    let units = plan_frugal::param_units(&config.shape, 1)?;
                    let weights = Weights::Units(file::read_f32_units(path, &units)?);
                    return Ok(Loaded { config, weights });
                }
                let weights = Weights::Quantized(path.clone(), format);
                Ok(Loaded { config, weights })
            }
            ModelSource::HfFolder(dir) => {
                let config = self.config()?;
                let setup = ForwardSetup {
                    batch: 1,
                    seq: 1,
                    attention: plan::setup::Attention::DEFAULT,
                };
                let runner = Runner::new(config.clone(), setup)?;
                // One file, or the shards an index names.
                engine::io::load_hf_folder(&runner.model, &runner.arena, dir)?;
                let weights = Weights::Units(runner.unit_values());
                Ok(Loaded { config, weights })
            }
            ModelSource::Gguf(path) => {
                let config = self.config()?;
                let units = plan_frugal::param_units(&config.shape, 1)?;
                let weights = Weights::Gguf(path.clone(), saved::read_units(path, &units)?);
                Ok(Loaded { config, weights })
            }
            ModelSource::Snapshot(dir) => {
                let snap = open_snapshot(dir)?;
                let config = snap.model_config()?;
                let units = plan_frugal::param_units(&config.shape, 1)?;
                let weights = Weights::Units(snap.weights(&units)?);
                Ok(Loaded { config, weights })
            }
        }
    }

    /// The saved weights a training run continues from (an HF folder or a GGUF file, read by
    /// [`saved::read_units`]), if `--model` is one; a snapshot or a quantized folder is
    /// refused, saying what to pass instead.
    pub fn training_weights(&self) -> anyhow::Result<Option<PathBuf>> {
        match self {
            ModelSource::HfFolder(dir) => Ok(Some(dir.clone())),
            ModelSource::Snapshot(dir) => bail!(
                "--model {}: a snapshot; continue that run with --resume {0}, or train from its \
                 weights by passing the Hugging Face folder its --out holds",
                dir.display()
            ),
            ModelSource::Gguf(path) => Ok(Some(path.clone())),
            ModelSource::Quantized(path) => bail!(
                "--model {}: quantized weights train only as a frozen LoRA base built from fp32 \
                 weights; pass the fp32 Hugging Face folder",
                path.display()
            ),
            _ => Ok(None),
        }
    }

    /// How `--model` was spelled (a path for files and folders).
    pub fn name(&self) -> String {
        match self {
            ModelSource::Preset(name) | ModelSource::ConfigText { name, .. } => name.clone(),
            ModelSource::Config(p)
            | ModelSource::HfFolder(p)
            | ModelSource::Snapshot(p)
            | ModelSource::Quantized(p)
            | ModelSource::Gguf(p) => p.display().to_string(),
        }
    }
}

/// `org/name` when `spec` is spelled as a Hugging Face model id and is no path on disk.
fn hf_id(spec: &str) -> Option<(&str, &str)> {
    let (org, name) = spec.split_once('/')?;
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (part(org) && part(name) && !spec.ends_with(".json") && !Path::new(spec).exists())
        .then_some((org, name))
}

/// A folder holding `step-NNNNNN` snapshots (a training `--out`).
fn has_snapshots(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("step-") && e.path().is_dir())
    })
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| {
        format!(
            "--model: cannot read {}; pass a preset or {KINDS}",
            path.display()
        )
    })
}

fn open_snapshot(dir: &Path) -> anyhow::Result<Snapshot> {
    let snap = Snapshot::open(dir).with_context(|| format!("--model {}", dir.display()))?;
    for (skipped, why) in &snap.skipped {
        warn(&format!(
            "{} is damaged ({why}); using the newest intact snapshot, {}",
            skipped.display(),
            snap.dir.display()
        ));
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_told_apart_by_what_is_on_disk() {
        let dir = std::env::temp_dir().join(format!("frugal-model-src-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let make = |sub: &str, files: &[&str]| {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).unwrap();
            for f in files {
                std::fs::write(d.join(f), "{}").unwrap();
            }
            d
        };
        let hf = make("hf", &["config.json", "model.safetensors"]);
        let sharded = make("sharded", &["config.json", "model.safetensors.index.json"]);
        let shape = make("shape", &["config.json"]);
        let quant = make("quant", &[file::FILE_NAME]);
        let out = make("out", &["config.json"]);
        make("out/step-000010", &["manifest.json"]);
        let empty = make("empty", &[]);
        let s = |p: &Path| p.display().to_string();
        let r = |p: &Path| ModelSource::resolve(&s(p)).unwrap();
        assert_eq!(r(&hf), ModelSource::HfFolder(hf.clone()));
        assert_eq!(r(&sharded), ModelSource::HfFolder(sharded.clone()));
        assert_eq!(r(&shape), ModelSource::Config(shape.join("config.json")));
        assert_eq!(
            r(&shape.join("config.json")),
            ModelSource::Config(shape.join("config.json"))
        );
        assert_eq!(
            r(&quant),
            ModelSource::Quantized(quant.join(file::FILE_NAME))
        );
        assert_eq!(r(&out), ModelSource::Snapshot(out.clone()));
        let step = out.join("step-000010");
        assert_eq!(r(&step), ModelSource::Snapshot(step.clone()));
        assert_eq!(
            r(Path::new("llama-tiny")),
            ModelSource::Preset("llama-tiny".into())
        );
        let err = |spec: &str| format!("{:#}", ModelSource::resolve(spec).unwrap_err());
        assert!(
            err(&s(&empty)).contains("holds no model"),
            "{}",
            err(&s(&empty))
        );
        assert!(err("./no/such/dir").contains("no such file or folder"));
        assert!(err("llama-99b").contains("llama-99b"));
        let shapeless = ModelSource::resolve("gpt2-tiny")
            .unwrap()
            .load()
            .err()
            .unwrap();
        assert!(format!("{shapeless:#}").contains("no weights"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
