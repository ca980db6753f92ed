//! How an inference command stores its weights and KV cache (`--weights`, `--weight-group`,
//! `--kv-dtype`): the flags `generate`, `serve` and `perplexity` share, and the weight format
//! they ask of a model.

use anyhow::bail;
use plan_frugal::{KvFormat, WeightFormat};

/// How the weights and the KV cache are stored (generate, serve, perplexity).
#[derive(clap::Args, Clone, Debug)]
pub struct Storage {
    /// Weight storage: f32, bf16, int8 (per row), int4, int4-asym (zero points), nf4, or ggml (a
    /// GGUF file's own blocks, exactly: int8 codes with an fp32 scale and minimum per 32, or 16
    /// in a file with Q6_K).
    /// Default: the model's stored format (ggml for a quantized GGUF, f32 for an fp32 model).
    #[arg(long)]
    pub weights: Option<String>,
    /// Group size of int4/nf4 weights: 32, 64 or 128 [default: 32] (ggml takes a GGUF file's
    /// own).
    #[arg(long)]
    pub weight_group: Option<u64>,
    /// KV cache storage: f32, bf16, int8 or fp8 (e4m3; per token and head scales) [default: f32]
    #[arg(long)]
    pub kv_dtype: Option<String>,
}

impl Storage {
    /// The weight and KV formats these flags ask of `source`.
    pub fn formats(&self, source: &models::Loaded) -> anyhow::Result<(WeightFormat, KvFormat)> {
        let weights = weight_format(self.weights.as_deref(), self.weight_group, source)?;
        match (self.weight_group, weights.group()) {
            (Some(g), None) => bail!(
                "--weight-group {g}: groups are int4's, nf4's and a GGUF file's blocks'; the \
                 weights run as {}, which has none",
                weights.name()
            ),
            (Some(g), Some(own)) if g != own => bail!(
                "--weight-group {g}: the weights run as {} in their own groups of {own}; drop \
                 --weight-group, or pass an fp32 model with --weights int4 or nf4 to choose one",
                weights.name()
            ),
            _ => {}
        }
        Ok((
            weights,
            KvFormat::parse(self.kv_dtype.as_deref().unwrap_or("f32"))?,
        ))
    }
}

/// The weight format asked for, or the source's default (its stored one, a GGUF file's blocks).
pub fn weight_format(
    flag: Option<&str>,
    group: Option<u64>,
    source: &models::Loaded,
) -> anyhow::Result<WeightFormat> {
    let asked = flag
        .map(|f| WeightFormat::parse(f, Some(group.unwrap_or(32))))
        .transpose()?;
    match (asked, source.stored_format()) {
        (Some(a), Some(s)) if a != s => bail!(
            "--weights {}: the model is stored as {}{}; pass its fp32 folder to quantize it \
             another way",
            a.name(),
            s.name(),
            s.group()
                .map_or_else(String::new, |g| format!(" in groups of {g}"))
        ),
        (Some(a), _) => Ok(a),
        (None, _) => source.default_format(),
    }
}
