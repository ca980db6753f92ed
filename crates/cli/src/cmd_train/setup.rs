//! From flags to a ready trainer: the model (preset, config.json or a saved folder), the data
//! (shipped corpus or `--data`, tokenized once into a cache), the loaders and the plan-checked
//! arena. Every bad input becomes an error that names the flag and the fix.
//!
//! Example: `setup::prepare(&args)?` then `run.trainer.step(...)`.

use super::Args;
use anyhow::Context;
use std::path::{Path, PathBuf};
use train::{TrainConfig, Trainer};

/// What every rank builds from: the validated config, the tokenized data, the weights to load.
pub struct Shared {
    pub config: TrainConfig,
    pub dataset: data::Dataset,
    pub tokenizer: data::Tokenizer,
    pub weights: Option<PathBuf>,
    /// `--resume`'s snapshot, checked against this run; every rank restores from it.
    pub snapshot: Option<train::snapshot::Snapshot>,
    /// The training data's identity (`Dataset::id`, hashed once), recorded in snapshots.
    pub data_id: u64,
    /// `--out`'s lock, held until the run ends.
    pub _lock: Option<super::guard::Lock>,
}

/// One rank's trainer and data.
pub struct Rank {
    pub trainer: Trainer,
    /// The training data's identity, recorded in snapshots.
    pub data_id: u64,
    pub loader: data::Loader,
    pub val: data::ValBatches,
}

/// `--data`'s text (a file or a folder of .txt files, no larger than a quarter of the free RAM),
/// or the shipped corpus.
pub(crate) fn corpus(path: Option<&Path>) -> anyhow::Result<data::Corpus> {
    Ok(match path {
        Some(p) => {
            // The text and its tokens (about as many bytes) must fit beside the run.
            let max = engine::capacity::host_available().map_or(u64::MAX, |h| h.bytes / 4);
            data::load_text_path_within(p, max)
                .with_context(|| format!("--data {}", p.display()))?
        }
        None => data::shakespeare(),
    })
}

/// Validates `args` into the one run config (refusing a run that does not fit before any data
/// is read), opens `--resume`'s snapshot and loads the data. `owner`: this process owns `--out`
/// (its lock, `--overwrite`): every run but the processes of an MPI job other than rank 0's.
pub fn prepare(args: &Args, owner: bool) -> anyhow::Result<Shared> {
    let super::config::Validated {
        config,
        weights,
        tokenizer,
    } = super::config::validate(args)?;
    let lock = match owner {
        true => super::guard::check_outputs(args, snapshot_bytes(&config), model_bytes(&config))?,
        false => None,
    };
    let snapshot = super::snapshot::open(args, &config)?;
    if let (true, true, Some(out)) = (owner, args.overwrite, &args.out) {
        super::guard::remove_snapshots(out)?;
    }
    let corpus = corpus(args.data.as_deref())?;
    let cache_dir = std::env::temp_dir().join("frugal-token-cache");
    let cached = data::load_or_tokenize(&corpus, &tokenizer, &cache_dir)?;
    let dataset = data::Dataset::new(
        cached.tokens,
        tokenizer.vocab_size(),
        data::DEFAULT_VAL_FRACTION,
    )?;
    let data_id = dataset.id();
    if let Some(snap) = &snapshot {
        // The same data too (older snapshots recorded none and accept any).
        snap.check_run(&config, args.seed, Some(data_id))
            .with_context(|| format!("--resume {} with --data", snap.dir.display()))?;
    }
    Ok(Shared {
        config,
        dataset,
        tokenizer,
        weights,
        snapshot,
        data_id,
        _lock: lock,
    })
}

/// About what one snapshot takes on disk: the fp32 model, every rank's slice of the fp32
/// weights, and the optimizer state (AdamW's m and v, or SGD's momentum).
/// Bytes of the final model `--out` gets: every parameter in f32.
fn model_bytes(config: &TrainConfig) -> u64 {
    plan_frugal::param_units(&config.model.shape, 1)
        .map(|units| units.iter().map(|u| u.numel).sum::<u64>())
        .unwrap_or(0)
        .saturating_mul(4)
}

fn snapshot_bytes(config: &TrainConfig) -> u64 {
    let numel: u64 = plan_frugal::param_units(&config.model.shape, 1)
        .map(|units| units.iter().map(|u| u.numel).sum())
        .unwrap_or(0);
    let state_per_param = match config.optimizer {
        train::OptimizerKind::Sgd { .. } => 4,
        _ => 8,
    };
    numel.saturating_mul(8 + state_per_param)
}

/// Rank `rank`'s trainer (same seed, same weights on every rank), its shard of each global
/// batch, and the validation batches (the same on every rank).
pub fn build_rank(
    shared: &Shared,
    args: &Args,
    comm: Box<dyn comm::Collective>,
) -> anyhow::Result<Rank> {
    let (b, t) = (args.batch as usize, args.seq as usize);
    let mut shape = data::BatchShape::single(b, t);
    // The ranks of one replica (its tensor-parallel ranks and pipeline stages) read the same
    // rows: the data-parallel rank's (rank = (stage · dp + dp_rank) · tp + tp_rank).
    let (tp, pp) = (args.tp.max(1) as usize, args.pp.max(1) as usize);
    let dp = (comm.world_size() / (tp * pp)).max(1);
    (shape.rank, shape.world_size) = ((comm.rank() / tp) % dp, dp);
    let loader = shared
        .dataset
        .train_loader(data::LoaderConfig::shuffled(shape, args.seed))?;
    let val = shared.dataset.val_batches(data::BatchShape::single(b, t))?;
    let config = shared.config.clone();
    let mut trainer = Trainer::with_comm(config, comm)?;
    trainer.init_weights(args.seed);
    if let Some(path) = &shared.weights {
        let read = |units: &[_]| models::saved::read_units(path, units);
        match trainer.model.lora.is_some() {
            // The weights are the frozen base; the adapters start as PEFT's.
            true => engine::lora::base::load_with(&trainer.model, &trainer.arena, read),
            false => trainer.load_whole(read),
        }
        .with_context(|| format!("--model {}", path.display()))?;
        // A ggml base: each block matrix as the file's own blocks.
        if let Some(g) = trainer.model.lora.as_ref().and_then(|l| l.setup.ggml) {
            let (model, arena) = (&trainer.model, &trainer.arena);
            models::put_file_blocks(model, arena, path, g)
                .with_context(|| format!("--model {}", path.display()))?;
        }
    }
    let mut loader = loader;
    if let Some(snap) = &shared.snapshot {
        super::snapshot::restore(snap, &mut trainer, &mut loader)?;
    }
    Ok(Rank {
        trainer,
        data_id: shared.data_id,
        loader,
        val,
    })
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

/// A sample continuing a fixed prompt, decoded to text. `interruptible`: a signal ends it early
/// (only where one rank samples alone: ranks that sample together must stop together).
pub fn sample(
    trainer: &mut Trainer,
    tok: &data::Tokenizer,
    args: &Args,
    interruptible: bool,
) -> anyhow::Result<String> {
    let prompt = tok.encode("ROMEO:");
    let sampling = engine::Sampling {
        top_k: (args.top_k > 0).then_some(args.top_k),
        temperature: 1.0,
        top_p: 1.0,
        seed: args.seed,
        vocab_limit: Some(tok.vocab_size() as usize),
    };
    // A SIGTERM or Ctrl-C during the sample ends it where it is: the model is already saved.
    let stop = || interruptible && super::guard::stop_requested();
    let new = trainer.generate_until(&prompt, args.sample_tokens, sampling, &stop)?;
    if new.len() < args.sample_tokens {
        eprintln!(
            "stopped by a signal during the sample after {} of {} tokens{}",
            new.len(),
            args.sample_tokens,
            match &args.out {
                Some(out) => format!("; the trained model is saved in {}", out.display()),
                None => String::new(),
            }
        );
    }
    let mut all = prompt;
    all.extend(new);
    Ok(tok.decode_text(&all)?)
}
