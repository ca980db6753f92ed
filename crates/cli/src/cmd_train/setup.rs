//! From flags to a ready trainer: the model (preset, config.json or a saved folder), the data
//! (shipped corpus or `--data`, tokenized once into a cache), the loaders and the plan-checked
//! arena. Every bad input becomes an error that names the flag and the fix.
//!
//! Example: `setup::prepare(&args)?` then `run.trainer.step(...)`.

use super::Args;
use anyhow::{bail, Context};
use engine::{ModelConfig, OptimizerKind, Schedule, TrainConfig, Trainer};
use plan::ModelShape;
use std::path::{Path, PathBuf};

/// What every rank builds from: the validated config, the tokenized data, the weights to load.
pub struct Shared {
    pub config: TrainConfig,
    pub dataset: data::Dataset,
    pub tokenizer: data::Tokenizer,
    pub weights: Option<PathBuf>,
    /// `--resume`'s snapshot, checked against this run; every rank restores from it.
    pub snapshot: Option<engine::snapshot::Snapshot>,
}

/// One rank's trainer and data.
pub struct Rank {
    pub trainer: Trainer,
    pub loader: data::Loader,
    pub val: data::ValBatches,
}

/// The default training shape: the `gpt2-mini` preset (GPT-2 blocks, 4 layers of width 128, the
/// full GPT-2 vocabulary, 256 positions).
pub fn gpt2_mini() -> ModelShape {
    plan::presets::by_name("gpt2-mini").expect("gpt2-mini is a preset")
}

/// The model config and, for a saved folder, the weights file to start from.
fn resolve_model(spec: &str) -> anyhow::Result<(ModelConfig, Option<PathBuf>)> {
    let path = Path::new(spec);
    if path.is_dir() {
        let config = path.join("config.json");
        let text = std::fs::read_to_string(&config)
            .with_context(|| format!("--model {spec}: reading {}", config.display()))?;
        let model = ModelConfig::from_hf_json(&text, &config.display().to_string())?;
        let weights = path.join("model.safetensors");
        return Ok((model, weights.exists().then_some(weights)));
    }
    if spec.ends_with(".json") || path.exists() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("--model {spec}: reading it"))?;
        return Ok((ModelConfig::from_hf_json(&text, spec)?, None));
    }
    let shape = plan::presets::by_name(spec).context("--model")?;
    Ok((ModelConfig::from_shape(shape)?, None))
}

fn optimizer(name: &str) -> anyhow::Result<OptimizerKind> {
    Ok(match name {
        "adamw" => OptimizerKind::adamw_default(),
        "sgd" => OptimizerKind::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        other => bail!("--optimizer {other}: choose adamw or sgd"),
    })
}

fn corpus(path: Option<&Path>) -> anyhow::Result<data::Corpus> {
    Ok(match path {
        Some(p) => data::load_text_path(p).with_context(|| format!("--data {}", p.display()))?,
        None => data::shakespeare(),
    })
}

/// Validates `args` and loads the data; the plan is checked against `--device-memory` here, so a
/// run that does not fit is refused before any data is read.
pub fn prepare(args: &Args) -> anyhow::Result<Shared> {
    if args.ranks == 0 {
        bail!("--ranks 0: at least one rank is needed");
    }
    let (model, weights) = resolve_model(&args.model)?;
    if args.lr <= 0.0 || !args.lr.is_finite() {
        bail!("--lr {} must be a positive number", args.lr);
    }
    let tokenizer = data::Tokenizer::gpt2();
    if u64::from(tokenizer.vocab_size()) > model.shape.vocab {
        bail!(
            "the model's vocabulary ({}) is smaller than the GPT-2 tokenizer's ({}): token ids \
             would fall outside the embedding; use a model with vocab_size >= {}",
            model.shape.vocab,
            tokenizer.vocab_size(),
            tokenizer.vocab_size()
        );
    }
    if args.seq > model.shape.max_positions {
        bail!(
            "--seq {} is longer than the model's {} positions: use --seq {} or less",
            args.seq,
            model.shape.max_positions,
            model.shape.max_positions
        );
    }
    let device_memory_bytes = match &args.device_memory {
        Some(text) => Some(plan::units::parse_bytes(text, "--device-memory")?),
        None => None,
    };
    let config = TrainConfig {
        model,
        batch: args.batch,
        seq: args.seq,
        grad_accum: args.grad_accum,
        optimizer: optimizer(&args.optimizer)?,
        schedule: Schedule {
            lr: args.lr,
            warmup_steps: args.warmup.min(args.steps),
            total_steps: args.steps,
            min_lr_ratio: 0.1,
        },
        grad_clip: (args.grad_clip > 0.0).then_some(args.grad_clip),
        device_memory_bytes,
        ranks: args.ranks,
        recompute: crate::cmd_plan::parse_recompute(&args.recompute)
            .map_err(|e| anyhow::anyhow!("invalid --recompute {}: {e}", args.recompute))?,
        attention: match args.attention.as_str() {
            "naive" | "eager" => plan::setup::Attention::Eager,
            "flash" => plan::setup::Attention::Flash,
            other => bail!("invalid --attention {other}: use naive (or eager) or flash"),
        },
    };
    // Refuses what does not fit before reading any data.
    let zero = super::zero::stage(args)?;
    engine::train::check_capacity_at(&config, zero)?;
    super::zero::check_weights(zero, weights.as_deref())?;
    super::precision::check_weights(args, weights.as_deref())?;
    let snapshot = super::snapshot::open(args, &config)?;
    let corpus = corpus(args.data.as_deref())?;
    let cache_dir = std::env::temp_dir().join("frugal-token-cache");
    let cached = data::load_or_tokenize(&corpus, &tokenizer, &cache_dir)?;
    let dataset = data::Dataset::new(
        cached.tokens,
        tokenizer.vocab_size(),
        data::DEFAULT_VAL_FRACTION,
    )?;
    Ok(Shared {
        config,
        dataset,
        tokenizer,
        weights,
        snapshot,
    })
}

/// Rank `rank`'s trainer (same seed, same weights on every rank), its shard of each global
/// batch, and the validation batches (the same on every rank).
pub fn build_rank(
    shared: &Shared,
    args: &Args,
    comm: Option<Box<dyn comm::Collective>>,
) -> anyhow::Result<Rank> {
    let (b, t) = (args.batch as usize, args.seq as usize);
    let mut shape = data::BatchShape::single(b, t);
    if let Some(c) = &comm {
        (shape.rank, shape.world_size) = (c.rank(), c.world_size());
    }
    let loader = shared
        .dataset
        .train_loader(data::LoaderConfig::shuffled(shape, args.seed))
        .context("the training split is too short for one batch: lower --batch or --seq")?;
    let val = shared
        .dataset
        .val_batches(data::BatchShape::single(b, t))
        .context("the validation split is too short for one batch: lower --batch or --seq")?;
    let config = shared.config.clone();
    let mixed = super::precision::mixed(args, comm.as_ref().map_or(0, |c| c.rank()))?;
    let mut trainer = Trainer::mixed(config, comm, super::zero::stage(args)?, mixed)?;
    trainer.init_weights(args.seed);
    if let Some(path) = &shared.weights {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path.display().to_string();
        engine::io::load_safetensors(&trainer.model, &trainer.arena, &bytes, &name)?;
    }
    let mut loader = loader;
    if let Some(snap) = &shared.snapshot {
        super::snapshot::restore(snap, &mut trainer, &mut loader)?;
    }
    Ok(Rank {
        trainer,
        loader,
        val,
    })
}

/// Mean validation loss over up to `max_batches` fixed batches.
pub fn val_loss(
    trainer: &mut Trainer,
    val: &data::ValBatches,
    max_batches: usize,
) -> anyhow::Result<f32> {
    let n = trainer.micro_tokens();
    let (mut x, mut y) = (vec![0u32; n], vec![0u32; n]);
    let batches = val.n_batches().min(max_batches.max(1));
    let mut sum = 0.0f64;
    for i in 0..batches {
        val.fill_batch(i, &mut x, &mut y);
        sum += f64::from(trainer.eval_loss(&x, &y)?);
    }
    Ok((sum / batches as f64) as f32)
}

/// Writes validation batch 0 (`tokens`, int32 (B, T)) and the model's `logits` (B, T, V) on it.
pub fn save_val_logits(
    trainer: &mut Trainer,
    val: &data::ValBatches,
    path: &Path,
) -> anyhow::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let (b, t) = (trainer.config.batch as usize, trainer.config.seq as usize);
    let (mut x, mut y) = (vec![0u32; b * t], vec![0u32; b * t]);
    val.fill_batch(0, &mut x, &mut y);
    let logits = trainer.logits(&x, b, t)?;
    let v = trainer.config.model.shape.vocab as usize;
    let tokens: Vec<u8> = x.iter().flat_map(|&id| (id as i32).to_le_bytes()).collect();
    let logits: Vec<u8> = logits.iter().flat_map(|l| l.to_le_bytes()).collect();
    let views = vec![
        ("tokens", TensorView::new(Dtype::I32, vec![b, t], &tokens)?),
        (
            "logits",
            TensorView::new(Dtype::F32, vec![b, t, v], &logits)?,
        ),
    ];
    safetensors::serialize_to_file(views, None, path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
